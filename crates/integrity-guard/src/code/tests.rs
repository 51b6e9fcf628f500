//! What code runs and fetches.

use super::{Dialect, Findings, scan};

fn check(code: &str, dialect: Dialect, shell: &[&str], argvs: &[&[&str]], urls: &[&str]) {
    let expected = Findings {
        shell: shell.iter().map(|s| (*s).to_string()).collect(),
        argvs: argvs
            .iter()
            .map(|a| a.iter().map(|s| (*s).to_string()).collect())
            .collect(),
        urls: urls.iter().map(|s| (*s).to_string()).collect(),
    };
    assert_eq!(scan(code, dialect), expected, "{code}");
}

#[test]
fn python_subprocess_and_os_calls() {
    let py = Dialect::Python;
    check(
        "import subprocess; subprocess.run(['git', 'log', '--all'])",
        py,
        &[],
        &[&["git", "log", "--all"]],
        &[],
    );
    check(
        "import os; os.system(\"git fetch\")",
        py,
        &["git fetch"],
        &[],
        &[],
    );
    check(
        "subprocess.call('git diff', shell=True)",
        py,
        &["git diff"],
        &[],
        &[],
    );
    check(
        "os.popen(f'git show {h}').read()",
        py,
        &["git show {h}"],
        &[],
        &[],
    );
    check("print('git log --all')  # not run", py, &[], &[], &[]);
    check(
        "x = '''a\n'b'\n'''; run(\"\"\"git reflog\"\"\")",
        py,
        &["git reflog"],
        &[],
        &[],
    );
}

#[test]
fn node_and_script_calls() {
    let js = Dialect::Js;
    check(
        "require('child_process').execSync('git reflog')",
        js,
        &["git reflog"],
        &[],
        &[],
    );
    check(
        "cp.execFileSync('git', ['fetch', '--all'])",
        js,
        &[],
        &[&["git", "fetch", "--all"]],
        &[],
    );
    check("// execSync('git fetch')\nconsole.log(1)", js, &[], &[], &[]);
    check(
        "system(\"git\", \"fetch\", \"origin\")",
        Dialect::Script,
        &[],
        &[&["git", "fetch", "origin"]],
        &[],
    );
    check(
        "print `git log --all`",
        Dialect::Script,
        &["git log --all"],
        &[],
        &[],
    );
}

#[test]
fn urls_count_only_where_the_code_uses_the_network() {
    let url = "https://raw.githubusercontent.com/a/b/main/x.py";
    check(
        &format!("import urllib.request; urllib.request.urlopen('{url}')"),
        Dialect::Python,
        &[],
        &[],
        &[url],
    );
    check(
        &format!("require('https').get('{url}', r => r)"),
        Dialect::Js,
        &[],
        &[],
        &[url],
    );
    check(
        &format!("u = '{url}'; print(u.split('/'))"),
        Dialect::Python,
        &[],
        &[],
        &[],
    );
}
