//! The lexer on the constructs agents use, one expectation per case.

use super::{Command, VAR_CLOSE, VAR_OPEN, lex};

fn words(commands: &[Command]) -> Vec<Vec<String>> {
    commands
        .iter()
        .map(|c| c.words.iter().map(|w| w.text.clone()).collect())
        .collect()
}

fn check(text: &str, expected: &[&[&str]]) {
    let got = words(&lex(text));
    let expected: Vec<Vec<String>> = expected
        .iter()
        .map(|c| c.iter().map(|w| (*w).to_string()).collect())
        .collect();
    assert_eq!(got, expected, "lexing {text:?}");
}

#[test]
fn operators_split_commands_outside_quotes_only() {
    check(
        "git status && git log --all",
        &[&["git", "status"], &["git", "log", "--all"]],
    );
    check("a;b|c||d&e", &[&["a"], &["b"], &["c"], &["d"], &["e"]]);
    check("echo 'a && b; c' \"d | e\"", &[&["echo", "a && b; c", "d | e"]]);
    check("(cd /r && git fetch)", &[&["cd", "/r"], &["git", "fetch"]]);
    check("x\ny", &[&["x"], &["y"]]);
}

#[test]
fn quotes_escapes_and_continuations_are_removed() {
    check("g'i't log --a'll'", &[&["git", "log", "--all"]]);
    check("\"git\" l\\og", &[&["git", "log"]]);
    check("git log \\\n  --all", &[&["git", "log", "--all"]]);
    check("echo \"a \\\"b\\\" \\$c\"", &[&["echo", "a \"b\" $c"]]);
    check("echo $'a\\nb' \"\"", &[&["echo", "a\nb", ""]]);
    check("echo 'unterminated", &[&["echo", "unterminated"]]);
}

#[test]
fn comments_end_at_the_line() {
    check(
        "pip install -e . # see https://x\nls",
        &[&["pip", "install", "-e", "."], &["ls"]],
    );
    check("echo a#b", &[&["echo", "a#b"]]);
}

#[test]
fn substitutions_are_kept_for_the_caller() {
    let c = lex("echo \"$(git log --all | wc -l) n\" `git reflog` <(git show x)");
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].nested, ["git log --all | wc -l", "git reflog", "git show x"]);
    let c = lex("echo $(a $(b) \")\")");
    assert_eq!(c[0].nested, ["a $(b) \")\""]);
}

#[test]
fn variables_become_markers() {
    let c = lex("$G log ${H} \"$X\" ${#y}");
    let expect = |n: &str| format!("{VAR_OPEN}{n}{VAR_CLOSE}");
    let w = &c[0].words;
    assert_eq!(w[0].text, expect("G"));
    assert!(w[0].is_bare_var());
    assert_eq!(w[2].text, expect("H"));
    assert_eq!(w[3].text, expect("X"));
    assert!(!w[3].is_bare_var(), "a quoted variable does not split");
    assert_eq!(w[4].text, "${#y}");
}

#[test]
fn redirections_and_here_documents() {
    let c = lex("cat > /tmp/h.sh <<'EOF'\ngit log --all\nEOF\nbash /tmp/h.sh 2>&1");
    assert_eq!(words(&c), [vec!["cat"], vec!["bash", "/tmp/h.sh"]]);
    assert_eq!(c[0].stdout_file.as_deref(), Some("/tmp/h.sh"));
    assert_eq!(c[0].stdin.as_deref(), Some("git log --all\n"));
    let c = lex("bash <<< 'git fetch'; python3 - <<-X\n\tprint(1)\n\tX\n");
    assert_eq!(c[0].stdin.as_deref(), Some("git fetch"));
    assert_eq!(c[1].stdin.as_deref(), Some("print(1)\n"));
    let c = lex("a <<A; b <<B\n1\nA\n2\nB\nc");
    assert_eq!(c[0].stdin.as_deref(), Some("1\n"));
    assert_eq!(c[1].stdin.as_deref(), Some("2\n"));
    assert_eq!(words(&c)[2], ["c"]);
}

#[test]
fn pipes_are_marked() {
    let c = lex("echo 'git log --all' | sh");
    assert!(!c[0].piped);
    assert!(c[1].piped);
}
