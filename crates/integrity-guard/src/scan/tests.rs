//! The scanner on tool calls, assistant text, session memory and hostile input.

use std::sync::Arc;

use proptest::prelude::*;

use super::{Hit, MAX_MATCHED_BYTES, Scanner};
use crate::rules::RuleSet;

/// The built-in rules, compiled once for all tests (compiling takes longer than scanning).
fn builtin() -> Arc<RuleSet> {
    RuleSet::shared_builtin()
}

fn scanner() -> Scanner {
    Scanner::new(builtin(), None)
}

fn rules(hits: &[Hit]) -> Vec<&str> {
    hits.iter().map(|h| h.rule.as_str()).collect()
}

#[test]
fn a_hit_names_the_rule_and_the_unwrapped_command() {
    let hits =
        scanner().scan_command("bash -lc \"cd /testbed && git --no-pager -C /r log --all --format='%h %s'\"");
    assert_eq!(
        hits,
        [Hit {
            rule: "git-log-all-refs".into(),
            category: "history".into(),
            matched: "git log --all '--format=%h %s'".into(),
        }]
    );
}

#[test]
fn tool_calls_in_the_shapes_harnesses_use() {
    for (name, arguments, expected) in [
        (
            "Bash",
            r#"{"command": "git reflog", "description": "see history"}"#,
            vec!["git-reflog"],
        ),
        (
            "shell",
            r#"{"command": ["bash", "-lc", "git fetch origin"], "workdir": "/r"}"#,
            vec!["git-fetch"],
        ),
        (
            "exec_command",
            r#"{"cmd": "git show 4f1c2e9"}"#,
            vec!["git-object-by-hash"],
        ),
        (
            "run",
            r#"{"commands": ["git status", "git log origin/main"]}"#,
            vec!["git-remote-ref"],
        ),
        (
            "Read",
            r#"{"file_path": "/testbed/.git/logs/HEAD"}"#,
            vec!["git-reflog-files"],
        ),
        (
            "WebFetch",
            r#"{"url": "https://github.com/psf/requests/pull/1", "prompt": "x"}"#,
            vec!["fetch-code-host"],
        ),
        (
            "python",
            r#"{"code": "import subprocess\nsubprocess.run(['git', 'log', '--all'])"}"#,
            vec!["git-log-all-refs"],
        ),
        ("terminal", "git pull --rebase", vec!["git-fetch"]),
        ("terminal", r#""git pull""#, vec!["git-fetch"]),
    ] {
        assert_eq!(
            rules(&scanner().scan_tool_call(name, arguments)),
            expected,
            "{name} {arguments}"
        );
    }
}

#[test]
fn content_and_file_editing_tools_are_not_commands() {
    for (name, arguments) in [
        (
            "str_replace_editor",
            r#"{"command": "create", "path": "/r/sync.sh", "file_text": "git fetch --all\n"}"#,
        ),
        (
            "apply_patch",
            "*** Begin Patch\n*** Add File: sync.sh\n git fetch --all\n*** End Patch",
        ),
        ("Write", r#"{"file_path": "/r/a.sh", "content": "git log --all"}"#),
        (
            "Bash",
            r#"{"command": "git status", "description": "not git log --all"}"#,
        ),
        ("Bash", "{not json"),
        ("Bash", r#"{"command": 7}"#),
    ] {
        assert!(
            scanner().scan_tool_call(name, arguments).is_empty(),
            "{name} {arguments}"
        );
    }
}

#[test]
fn assistant_text_is_scanned_in_command_blocks_only() {
    let text = "I could run `git log --all`, but won't.\n```bash\ncd /r\ngit fetch origin\n```\n\
                ```console\n$ git reflog\nabc1234 HEAD@{0}: git log --all\n```\n```python\nprint('git log --all')\n```\n\
                <execute_bash>git show 4f1c2e9</execute_bash>";
    assert_eq!(
        rules(&scanner().scan_text(text)),
        ["git-fetch", "git-reflog", "git-object-by-hash"]
    );
}

#[test]
fn a_session_remembers_aliases_variables_and_scripts_across_calls() {
    let mut s = scanner();
    assert!(s.scan_command("git config alias.h 'log --all'").is_empty());
    assert!(s.scan_command("alias up='git pull'").is_empty());
    assert!(s.scan_command("REF=origin/main").is_empty());
    assert!(
        s.scan_command("cat > /tmp/x.py <<'EOF'\nimport os\nos.system('git reflog')\nEOF")
            .is_empty()
    );
    assert_eq!(rules(&s.scan_command("git h -n 3")), ["git-log-all-refs"]);
    assert_eq!(rules(&s.scan_command("up")), ["git-fetch"]);
    assert_eq!(rules(&s.scan_command("git diff HEAD $REF")), ["git-remote-ref"]);
    assert_eq!(rules(&s.scan_command("python3 /tmp/x.py")), ["git-reflog"]);
    assert!(
        scanner().scan_command("git h -n 3").is_empty(),
        "another session knows no alias"
    );
}

#[test]
fn one_rule_hit_twice_on_one_command_is_reported_once() {
    let hits = scanner().scan_command("git fetch; git fetch; git fetch origin");
    assert_eq!(hits.len(), 2);
}

#[test]
fn matched_text_is_bounded() {
    let long = format!("git log --all {}", "x".repeat(10_000));
    let hits = scanner().scan_command(&long);
    assert_eq!(hits.len(), 1);
    assert!(hits[0].matched.len() <= MAX_MATCHED_BYTES);
    assert!(hits[0].matched.ends_with("..."));
}

#[test]
fn expansion_bombs_stop_at_the_budget() {
    // Each variable doubles the one before: 2^40 bytes if expanded, cut by the value bound and the budget.
    let mut text = String::from("A=xxxxxxxxxxxxxxxx\n");
    for i in 0..40 {
        text.push_str(&format!("V{}=\"$V{i}$V{i}\"\n", i + 1));
    }
    text.push_str("alias a='a a a a'\na\neval eval eval eval git log --all\n");
    let hits = scanner().scan_command(&text);
    assert_eq!(rules(&hits), ["git-log-all-refs"]);
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(text in ".{0,400}") {
        let mut s = scanner();
        s.scan_command(&text);
        s.scan_text(&text);
        s.scan_tool_call("bash", &text);
        s.scan_tool_call("python", &text);
    }

    #[test]
    fn shell_shaped_text_never_panics(parts in proptest::collection::vec(
        prop_oneof![
            Just("git"), Just("log"), Just("--all"), Just("'"), Just("\""), Just("$("), Just(")"), Just("`"),
            Just("<<EOF\n"), Just("\nEOF\n"), Just("\\"), Just("|"), Just("&&"), Just(";"), Just("$X"),
            Just("X=git"), Just("bash -c"), Just("python -c"), Just("alias g=git"), Just("${"), Just("$'\\x"),
            Just("\n"), Just(" "), Just("é"), Just("\u{E000}"), Just("\u{E002}0"),
        ],
        0..60,
    )) {
        let text: String = parts.concat();
        scanner().scan_command(&text);
    }
}
