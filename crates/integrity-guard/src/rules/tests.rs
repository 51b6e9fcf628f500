//! Rule validation, revision parsing and host extraction.

use std::sync::Arc;

use super::{RuleSet, RuleSpec, clean_revision, default_rule_specs, host_of, revisions};
use crate::error::Error;
use crate::scan::Scanner;

fn spec(id: &str) -> RuleSpec {
    RuleSpec {
        id: id.into(),
        category: "custom".into(),
        description: String::new(),
        programs: vec!["curl".into()],
        subcommands: vec![],
        any_arg: vec![],
        and_arg: vec![],
        no_arg: vec![],
        revisions: vec![],
        hash_revision: false,
        hosts: vec!["mirror.example.org".into()],
    }
}

#[test]
fn the_built_in_rules_parse_and_compile() {
    let specs = default_rule_specs();
    assert!(specs.len() >= 17, "{} built-in rules", specs.len());
    let set = RuleSet::builtin();
    assert_eq!(set.len(), specs.len());
    let categories: std::collections::BTreeSet<&str> = specs.iter().map(|s| s.category.as_str()).collect();
    assert_eq!(
        categories.into_iter().collect::<Vec<_>>(),
        [
            "history",
            "network-fetch",
            "object-by-hash",
            "reflog-objects",
            "remote-ref",
            "upstream-fetch"
        ]
    );
}

#[test]
fn every_problem_of_a_rule_list_is_reported_at_once() {
    let mut bad = spec("Bad Id");
    bad.any_arg = vec!["(unclosed".into()];
    bad.hosts = vec!["not a host".into()];
    bad.programs = vec!["/usr/bin/curl".into()];
    let mut any = spec("any");
    any.programs = vec!["*".into()];
    any.hosts.clear();
    let Err(Error::InvalidRules(problems)) = RuleSet::assemble(
        true,
        &["git-reflog".into(), "no-such-rule".into()],
        vec![bad, any, spec("git-fetch")],
    ) else {
        panic!("expected problems");
    };
    let text: Vec<String> = problems.iter().map(ToString::to_string).collect();
    insta::assert_snapshot!(text.join("\n"));
}

#[test]
fn disabling_and_adding_rules_changes_what_hits() {
    let rules =
        Arc::new(RuleSet::assemble(true, &["git-fetch".into()], vec![spec("mirror")]).expect("valid rules"));
    let mut scanner = Scanner::new(rules.clone(), None);
    assert!(scanner.scan_command("git fetch origin").is_empty());
    let hits = scanner.scan_command("curl -s https://mirror.example.org/project.git/info/refs");
    assert_eq!(hits.len(), 1);
    assert_eq!(hits[0].rule, "mirror");
    assert!(rules.specs().iter().all(|s| s.id != "git-fetch"));
    let none = Arc::new(RuleSet::assemble(false, &[], vec![]).expect("valid"));
    assert!(none.is_empty());
    assert!(Scanner::new(none, None).scan_command("git log --all").is_empty());
}

#[test]
fn revision_arguments_are_cut_to_their_objects() {
    let args = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        revisions(&args("-n 5 HEAD~1..a1b2c3d -- a1b2c3e")),
        ["HEAD", "a1b2c3d"]
    );
    assert_eq!(
        revisions(&args("--source=origin/main file")),
        ["origin/main", "file"]
    );
    assert_eq!(revisions(&args("--grep abc1234 --author=x x:y")), ["x"]);
    for (raw, clean) in [
        ("abc1234^", "abc1234"),
        ("abc1234~3", "abc1234"),
        ("abc1234^2", "abc1234"),
        ("abc1234^{tree}", "abc1234"),
        ("abc1234:src/a.py", "abc1234"),
        ("HEAD@{u}", "HEAD@{u}"),
        ("@{upstream}", "@{upstream}"),
    ] {
        assert_eq!(clean_revision(raw), clean, "{raw}");
    }
}

#[test]
fn hosts_come_from_urls_scp_addresses_and_bare_host_paths() {
    for (arg, host) in [
        ("https://user@GitHub.com:443/a/b", Some("github.com")),
        ("git+https://github.com/psf/requests@main", Some("github.com")),
        ("git@gitlab.com:group/project.git", Some("gitlab.com")),
        ("github.com/psf/requests", Some("github.com")),
        ("--url=https://api.github.com/x", Some("api.github.com")),
        ("src/app.py", None),
        ("localhost:8000", None),
        ("-O", None),
    ] {
        assert_eq!(host_of(arg).as_deref(), host, "{arg}");
    }
}

#[test]
fn a_base_commit_and_its_prefixes_are_not_evidence() {
    let base = "9c1e5b7a3d2f4e6a8b0c1d3e5f7a9b2c4d6e8f01";
    let mut scanner = Scanner::new(Arc::new(RuleSet::builtin()), Some(base));
    assert!(scanner.scan_command("git show 9c1e5b7").is_empty());
    assert!(
        scanner
            .scan_command("git diff 9C1E5B7A3D2F4E6A8B0C1D3E5F7A9B2C4D6E8F01 HEAD")
            .is_empty()
    );
    assert_eq!(
        scanner.scan_command("git show 9c1e5b8")[0].rule,
        "git-object-by-hash"
    );
    let mut unknown = Scanner::new(Arc::new(RuleSet::builtin()), Some("not-a-hash"));
    assert_eq!(unknown.scan_command("git show 9c1e5b7").len(), 1);
}
