//! The `guard` section: defaults, per-Stream replacement, and errors that name the field.

use super::*;
use crate::{Env, RunConfig, load_run_config_str};

const HEAD: &str = "experiment_name: exp\ntrial_name: t\neconfig:\n  arena_streams:\n    - name: swe\n      stream_id: s1\n    - name: math\n      stream_id: s2\n";

fn load(guard: &str) -> crate::Result<RunConfig> {
    load_run_config_str("c.yaml", &format!("{HEAD}{guard}"), &[], &Env::default())
}

/// The error of a config with this `guard` section, each problem on its own line.
fn check(guard: &str, expected: &[&str]) {
    let err = load(guard).expect_err("the config should be refused");
    let got: Vec<String> = err.problems().iter().map(ToString::to_string).collect();
    assert_eq!(got, expected, "for guard section:\n{guard}");
}

#[test]
fn the_default_is_the_built_in_rules_recorded() {
    let c = load("").unwrap();
    assert_eq!(c.guard, GuardSection::default());
    assert_eq!(c.guard.policy(Some("swe")), IntegrityPolicy::Record);
    let rules = c.guard.rule_set(None).unwrap();
    assert_eq!(rules.len(), integrity_guard::default_rule_specs().len());
    assert_eq!(c.guard.streams_with_own_rules().count(), 0);
}

#[test]
fn a_stream_replaces_the_run_wide_settings_field_by_field() {
    let c = load(concat!(
        "guard:\n",
        "  on_hit: zero\n",
        "  disable: [git-reflog]\n",
        "  rules:\n",
        "    - id: no-curl\n",
        "      category: network-fetch\n",
        "      programs: [curl]\n",
        "  streams:\n",
        "    swe:\n",
        "      on_hit: reject\n",
        "    math:\n",
        "      builtin: false\n",
    ))
    .unwrap();
    let g = &c.guard;
    assert_eq!(
        (g.policy(Some("swe")), g.policy(Some("math")), g.policy(None)),
        (
            IntegrityPolicy::Reject,
            IntegrityPolicy::Zero,
            IntegrityPolicy::Zero
        )
    );
    assert!(!g.has_own_rules("swe") && g.has_own_rules("math"));
    assert_eq!(g.streams_with_own_rules().collect::<Vec<_>>(), ["math"]);
    let run_wide = g.rule_set(Some("swe")).unwrap();
    let ids: Vec<&str> = run_wide.specs().iter().map(|s| s.id.as_str()).collect();
    assert!(ids.contains(&"no-curl") && !ids.contains(&"git-reflog"));
    assert_eq!(run_wide.len(), integrity_guard::default_rule_specs().len());
    let math = g.rule_set(Some("math")).unwrap();
    assert_eq!(
        math.specs().iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
        ["no-curl"]
    );
}

#[test]
fn each_mistake_names_its_field() {
    check(
        "guard:\n  on_hit: ban\n",
        &[
            "c.yaml:10:3: guard.on_hit: unknown variant: found `ban`, expected `one of `record`, `zero`, `reject``",
        ],
    );
    check(
        concat!(
            "guard:\n",
            "  disable: [git-nope]\n",
            "  rules:\n",
            "    - id: Bad Id\n",
            "      category: x\n",
            "      programs: [git]\n",
            "      any_arg: ['(']\n",
            "  streams:\n",
            "    swe:\n",
            "      rules:\n",
            "        - id: git-reflog\n",
            "          category: x\n",
            "          programs: []\n",
            "    nope:\n",
            "      on_hit: zero\n",
        ),
        &[
            "c.yaml:10:13: guard.disable[0]: \"git-nope\" is not a built-in rule; built-in rules: git-log-all-refs, git-history-viewer-all-refs, git-branch-verbose-all, git-for-each-ref-contents, git-reflog, git-log-walk-reflogs, git-fsck-unreachable, git-all-objects, git-reflog-files, git-object-by-hash, git-remote-ref, git-fetch, git-clone-remote, git-remote-change, git-submodule-remote, fetch-code-host, code-host-cli, pip-download",
            "c.yaml:12:7: guard.rules[0].id: \"Bad Id\" must be 1-64 characters of a-z, 0-9, '_', '.' and '-', starting with a letter or digit",
            "c.yaml:15:17: guard.rules[0].any_arg[0]: invalid regular expression \"(\": error: unclosed group",
            "c.yaml:19:11: guard.streams.swe.rules[0].id: \"git-reflog\" is already the id of another rule",
            "c.yaml:21:11: guard.streams.swe.rules[0].programs: must name at least one program (or \"*\" for any)",
            "c.yaml:22:5: guard.streams.nope: \"nope\" is not a configured stream (the streams are swe, math)",
        ],
    );
    check(
        "guard:\n  rules:\n    - id: a\n      category: b\n      programs: [git]\n      any_args: ['x']\n",
        &[
            "c.yaml:14:7: guard.rules[0].any_args: unknown field: found `any_args`, expected `one of `id`, `category`, `description`, `programs`, `subcommands`, `any_arg`, `and_arg`, `no_arg`, `revisions`, `hash_revision`, `hosts``",
        ],
    );
}
