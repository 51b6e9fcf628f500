//! What a snippet of Python, JavaScript, Perl or Ruby code runs or fetches, read from its tokens: strings
//! handed to a shell-running call (`os.system`, `subprocess.run(..., shell=True)`, `execSync`, backticks in
//! Perl and Ruby), lists of strings (an argv: `subprocess.run(["git", "log"])`,
//! `execFileSync("git", ["fetch"])`), and URLs in code that calls a network library.
//!
//! One pass over the code; it does not evaluate anything, so a command built by concatenation or kept
//! in a variable is not seen.

/// The language a snippet is in, for comments and string syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// Python: `#` comments, triple-quoted and prefixed strings.
    Python,
    /// JavaScript: `//` and `/* */` comments, template strings.
    Js,
    /// Perl and Ruby: `#` comments, backticks run a shell.
    Script,
}

/// What a snippet runs or fetches.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Findings {
    /// Shell command texts.
    pub(crate) shell: Vec<String>,
    /// Argument vectors.
    pub(crate) argvs: Vec<Vec<String>>,
    /// URLs it may fetch.
    pub(crate) urls: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Str { text: String, backtick: bool },
    Punct(u8),
}

/// Calls whose string argument is a shell command.
const SHELL_CALLS: &[&str] = &[
    "system",
    "popen",
    "getoutput",
    "getstatusoutput",
    "check_output",
    "check_call",
    "call",
    "run",
    "Popen",
    "exec",
    "execSync",
    "spawn",
    "spawnSync",
    "execFile",
    "execFileSync",
    "execa",
    "execaSync",
    "execaCommand",
    "execaCommandSync",
    "shell",
    "qx",
    "run_command",
    "sh",
    "bash",
    "Command",
    "create_subprocess_shell",
    "create_subprocess_exec",
    "startfile",
];

/// Names whose presence says the code talks to the network.
const NETWORK_NAMES: &[&str] = &[
    "urlopen",
    "urlretrieve",
    "Request",
    "requests",
    "httpx",
    "aiohttp",
    "urllib",
    "urllib2",
    "urllib3",
    "http",
    "https",
    "HTTPConnection",
    "HTTPSConnection",
    "fetch",
    "axios",
    "got",
    "request",
    "wget",
    "curl",
    "download",
    "LWP",
    "HTTP",
    "URI",
    "Faraday",
    "open_uri",
    "pycurl",
    "PoolManager",
];

fn tokens(code: &str, dialect: Dialect) -> Vec<Tok> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b'#' if dialect != Dialect::Js => {
                i = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p);
            }
            b'/' if dialect == Dialect::Js && b.get(i + 1) == Some(&b'/') => {
                i = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |p| i + p);
            }
            b'/' if dialect == Dialect::Js && b.get(i + 1) == Some(&b'*') => {
                i = code[i + 2..].find("*/").map_or(b.len(), |p| i + 2 + p + 2);
            }
            b'\'' | b'"' | b'`' => {
                let (text, end) = string(code, i);
                out.push(Tok::Str {
                    text,
                    backtick: c == b'`',
                });
                i = end;
            }
            c if c.is_ascii_alphabetic() || c == b'_' || c == b'$' => {
                let end = b[i..]
                    .iter()
                    .position(|&c| !(c.is_ascii_alphanumeric() || c == b'_' || c == b'$'))
                    .map_or(b.len(), |p| i + p);
                let ident = &code[i..end];
                let prefix = ident.len() <= 2
                    && ident.chars().all(|c| "rRbBfFuU".contains(c))
                    && matches!(b.get(end), Some(b'\'' | b'"'));
                if !prefix {
                    out.push(Tok::Ident(ident.to_string()));
                }
                i = end;
            }
            c if c.is_ascii_whitespace() => i += 1,
            c if c.is_ascii() => {
                out.push(Tok::Punct(c));
                i += 1;
            }
            _ => i += code[i..].chars().next().map_or(1, char::len_utf8),
        }
    }
    out
}

/// The string literal starting at `start` (a quote), decoded, and the index after it.
fn string(code: &str, start: usize) -> (String, usize) {
    let b = code.as_bytes();
    let quote = b[start];
    let triple = quote != b'`' && b.get(start + 1) == Some(&quote) && b.get(start + 2) == Some(&quote);
    let (open, close): (usize, &[u8]) = if triple {
        (3, &b[start..start + 3])
    } else {
        (1, &b[start..=start])
    };
    let mut text = Vec::new();
    let mut i = start + open;
    while i < b.len() {
        if b[i..].starts_with(close) {
            return (String::from_utf8_lossy(&text).into_owned(), i + close.len());
        }
        if b[i] == b'\\' && i + 1 < b.len() {
            let decoded = match b[i + 1] {
                b'n' => b'\n',
                b't' => b'\t',
                other => other,
            };
            text.push(decoded);
            i += 2;
            continue;
        }
        if b[i] == b'\n' && !triple && quote != b'`' {
            break;
        }
        text.push(b[i]);
        i += 1;
    }
    (String::from_utf8_lossy(&text).into_owned(), i)
}

/// A list literal of strings starting at `at` (a `[`): its strings and the index after its `]`.
fn string_list(toks: &[Tok], at: usize) -> Option<(Vec<String>, usize)> {
    let mut items = Vec::new();
    let mut i = at + 1;
    loop {
        match toks.get(i)? {
            Tok::Punct(b']') => return Some((items, i + 1)),
            Tok::Str { text, .. } => {
                items.push(text.clone());
                i += 1;
                match toks.get(i)? {
                    Tok::Punct(b',') => i += 1,
                    Tok::Punct(b']') => {}
                    _ => return None,
                }
            }
            _ => return None,
        }
    }
}

fn is_shell_call(toks: &[Tok], at: usize) -> bool {
    let name = |t: Option<&Tok>| matches!(t, Some(Tok::Ident(n)) if SHELL_CALLS.contains(&n.as_str()));
    match at.checked_sub(1).map(|k| &toks[k]) {
        Some(Tok::Punct(b'(')) => name(at.checked_sub(2).and_then(|k| toks.get(k))),
        Some(t @ Tok::Ident(_)) => name(Some(t)),
        _ => false,
    }
}

/// What `code` runs or fetches.
pub(crate) fn scan(code: &str, dialect: Dialect) -> Findings {
    let toks = tokens(code, dialect);
    let mut found = Findings::default();
    // A network library named as an identifier (`urllib.request`) or a module string (`require('https')`).
    let network = toks.iter().any(|t| match t {
        Tok::Ident(n) | Tok::Str { text: n, .. } => NETWORK_NAMES.contains(&n.as_str()),
        Tok::Punct(_) => false,
    });
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Str { text, backtick } => {
                let runs_shell = (*backtick && dialect == Dialect::Script) || is_shell_call(&toks, i);
                let argv_head = matches!(toks.get(i + 1), Some(Tok::Punct(b',')))
                    && matches!(toks.get(i + 2), Some(Tok::Punct(b'[')))
                    && is_shell_call(&toks, i);
                if argv_head && let Some((rest, end)) = string_list(&toks, i + 2) {
                    let mut argv = vec![text.clone()];
                    argv.extend(rest);
                    found.argvs.push(argv);
                    i = end;
                    continue;
                }
                if runs_shell {
                    // `system("git", "fetch", "origin")`: several strings are one argument vector.
                    let mut argv = vec![text.clone()];
                    let mut j = i + 1;
                    while let (Some(Tok::Punct(b',')), Some(Tok::Str { text, .. })) =
                        (toks.get(j), toks.get(j + 1))
                    {
                        argv.push(text.clone());
                        j += 2;
                    }
                    if argv.len() > 1 {
                        found.argvs.push(argv);
                        i = j;
                        continue;
                    }
                    found.shell.push(text.clone());
                }
                if network && text.contains("://") {
                    found.urls.push(text.clone());
                }
                i += 1;
            }
            Tok::Punct(b'[') => match string_list(&toks, i) {
                Some((argv, end)) if !argv.is_empty() => {
                    found.argvs.push(argv);
                    i = end;
                }
                _ => i += 1,
            },
            _ => i += 1,
        }
    }
    found
}

#[cfg(test)]
mod tests;
