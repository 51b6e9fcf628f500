//! The scanner: from command text, argument vectors, tool calls and message text to the simple commands
//! they run, unwrapped, each matched against the rules.
//!
//! Unwrapping follows what a shell would run: leading assignments and `env`, `sudo`, `timeout`, `nice`,
//! `nohup` and similar wrappers are skipped; `bash -c`/`sh -lc` strings, `eval`, here-documents and
//! here-strings fed to a shell, `echo ... | sh`, scripts written earlier in the same session and then run,
//! `$(...)`, backticks and `<(...)` are scanned as shell text; `python -c`, `node -e` and friends are read
//! for the commands and URLs their code runs ([`crate::code`]); shell aliases, git aliases (`git config
//! alias.x`, `git -c alias.x=`) and variables defined in the session are expanded; git's global options
//! (`-C`, `--no-pager`, `-c`, `--git-dir`, ...) are removed before its subcommand is matched.
//!
//! Work is bounded: nesting is at most [`MAX_DEPTH`] deep, and a scan spends at most a fixed multiple of
//! its input's length (plus a constant) on text it lexes, expansions included, so a scan is linear in the
//! text whatever it holds.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::code::{self, Dialect};
use crate::rules::{Candidate, RuleSet};
use crate::shell::{self, SUB_CLOSE, SUB_OPEN, VAR_CLOSE, VAR_OPEN, Word};

/// How deep shell strings, aliases, code and substitutions may nest before the scanner stops unwrapping.
pub const MAX_DEPTH: usize = 8;
/// The longest `matched` text a hit reports, in bytes; longer ones are cut with `...`.
pub const MAX_MATCHED_BYTES: usize = 512;
/// Entries the session memory keeps per kind (variables, aliases, git aliases, written files).
const MAX_ENTRIES: usize = 256;
/// The longest value the session memory keeps.
const MAX_VALUE_BYTES: usize = 16 * 1024;
/// A scan lexes at most this many times its input's length (plus [`BUDGET_SLACK`]).
const BUDGET_FACTOR: usize = 16;
const BUDGET_SLACK: usize = 64 * 1024;

/// One rule that matched one command.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Hit {
    /// The rule's id.
    pub rule: String,
    /// The rule's category.
    pub category: String,
    /// The command it matched, unwrapped and shell-quoted (at most [`MAX_MATCHED_BYTES`]).
    pub matched: String,
}

/// What the scanner remembers between the commands of one trajectory: what a shell session, git's config
/// and the file system would remember.
#[derive(Debug, Default, Clone)]
struct Memory {
    vars: HashMap<String, String>,
    aliases: HashMap<String, String>,
    git_aliases: HashMap<String, String>,
    files: HashMap<String, String>,
}

fn remember(map: &mut HashMap<String, String>, key: &str, value: &str) {
    if value.len() > MAX_VALUE_BYTES || (map.len() >= MAX_ENTRIES && !map.contains_key(key)) {
        return;
    }
    map.insert(key.to_string(), value.to_string());
}

/// Scans the commands of one trajectory (one session) in order, remembering aliases, variables and
/// written scripts from one command to the next.
#[derive(Debug, Clone)]
pub struct Scanner {
    rules: Arc<RuleSet>,
    base_commit: Option<String>,
    memory: Memory,
}

/// The state of one scan call.
struct Walk<'a> {
    rules: &'a RuleSet,
    base_commit: Option<&'a str>,
    memory: &'a mut Memory,
    budget: usize,
    hits: Vec<Hit>,
    seen: HashSet<(usize, String)>,
}

impl Scanner {
    /// A scanner with `rules`, for a task whose base commit is `base_commit` when the row gives one (a hex
    /// hash; anything else is ignored).
    pub fn new(rules: Arc<RuleSet>, base_commit: Option<&str>) -> Self {
        let base_commit = base_commit
            .map(str::trim)
            .filter(|b| (7..=64).contains(&b.len()) && b.chars().all(|c| c.is_ascii_hexdigit()))
            .map(str::to_ascii_lowercase);
        Self {
            rules,
            base_commit,
            memory: Memory::default(),
        }
    }

    /// The rules it matches with.
    pub fn rules(&self) -> &Arc<RuleSet> {
        &self.rules
    }

    fn walk<F: FnOnce(&mut Walk<'_>)>(&mut self, input_len: usize, f: F) -> Vec<Hit> {
        let mut walk = Walk {
            rules: &self.rules,
            base_commit: self.base_commit.as_deref(),
            memory: &mut self.memory,
            budget: input_len
                .saturating_mul(BUDGET_FACTOR)
                .saturating_add(BUDGET_SLACK),
            hits: Vec::new(),
            seen: HashSet::new(),
        };
        f(&mut walk);
        walk.hits
    }

    /// Scans shell command text (what a shell tool runs).
    pub fn scan_command(&mut self, text: &str) -> Vec<Hit> {
        let text = sanitize(text);
        self.walk(text.len(), |w| {
            w.script(&text, 0);
        })
    }

    /// Scans an argument vector (what an exec-style tool runs, `["bash", "-lc", "..."]`).
    pub fn scan_argv(&mut self, argv: &[String]) -> Vec<Hit> {
        let argv: Vec<String> = argv.iter().map(|a| sanitize(a)).collect();
        let len = argv.iter().map(String::len).sum();
        self.walk(len, |w| {
            w.dispatch(argv, None, None, 0);
        })
    }

    /// Scans one tool call: `arguments` is its JSON text (or a free-form input, scanned as shell text).
    ///
    /// In a JSON object, command-like keys (`command`, `cmd`, `script`, `code`, `input`, ... and any key it
    /// does not know) are scanned as shell text, or as an argument vector when they hold a list of strings;
    /// path keys (`file_path`, `path`, ...) as a file the tool reads (`(read) PATH`); URL keys as a fetch
    /// (`(fetch) URL`); content keys (`file_text`, `new_str`, `content`, ...) are not scanned, since a file
    /// that mentions a command does not run it. File-editing tools (`apply_patch`, `edit`, `write`, ...) have
    /// only their paths scanned. Code tools (`python`, `ipython`, `execute_code`, ...) have their code read
    /// as Python.
    pub fn scan_tool_call(&mut self, name: &str, arguments: &str) -> Vec<Hit> {
        let arguments = sanitize(arguments);
        let kind = ToolKind::of(name);
        self.walk(arguments.len(), |w| {
            match serde_json::from_str::<Value>(&arguments) {
                Ok(value @ (Value::Object(_) | Value::Array(_))) => w.json(&value, kind, None, 0),
                Ok(Value::String(s)) if kind != ToolKind::Files => w.tool_text(&s, kind, 0),
                Ok(_) => {}
                Err(_) if kind != ToolKind::Files => w.tool_text(&arguments, kind, 0),
                Err(_) => {}
            }
        })
    }

    /// Scans assistant text for the commands a text-driven harness would run: fenced code blocks marked
    /// `bash`, `sh`, `shell`, `zsh`, `console` or unmarked, and `<bash>`, `<execute_bash>`, `<command>`,
    /// `<cmd>` (shell) and `<execute_ipython>` (Python) tags. Prose is not scanned.
    pub fn scan_text(&mut self, text: &str) -> Vec<Hit> {
        let text = sanitize(text);
        self.walk(text.len(), |w| {
            for (block, dialect) in text_blocks(&text) {
                match dialect {
                    None => {
                        w.script(&block, 0);
                    }
                    Some(d) => w.code(&block, d, 0),
                }
            }
        })
    }
}

/// Removes the private-use characters the lexer uses as markers.
fn sanitize(text: &str) -> String {
    text.replace([VAR_OPEN, VAR_CLOSE, SUB_OPEN, SUB_CLOSE], "\u{FFFD}")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ToolKind {
    Shell,
    Python,
    Files,
}

impl ToolKind {
    fn of(name: &str) -> Self {
        let n = name.to_ascii_lowercase();
        const FILES: &[&str] = &[
            "apply_patch",
            "applypatch",
            "edit",
            "write",
            "multiedit",
            "notebookedit",
            "create_file",
            "write_file",
            "edit_file",
            "replace",
            "insert",
            "patch",
            "read",
            "read_file",
            "view",
            "glob",
            "grep",
            "ls",
            "list_dir",
            "todowrite",
            "str_replace_editor",
            "str_replace_based_edit_tool",
        ];
        const PYTHON: &[&str] = &[
            "python",
            "ipython",
            "execute_ipython",
            "execute_ipython_cell",
            "run_python",
            "execute_python",
            "python_interpreter",
            "code_interpreter",
            "jupyter",
            "execute_code",
            "run_code",
        ];
        if FILES.contains(&n.as_str()) {
            Self::Files
        } else if PYTHON.contains(&n.as_str()) {
            Self::Python
        } else {
            Self::Shell
        }
    }
}

const PATH_KEYS: &[&str] = &[
    "file_path",
    "path",
    "filename",
    "file",
    "notebook_path",
    "target_file",
    "absolute_path",
    "filepath",
];
const URL_KEYS: &[&str] = &["url", "uri", "href", "link"];
const CONTENT_KEYS: &[&str] = &[
    "file_text",
    "content",
    "contents",
    "new_str",
    "old_str",
    "old_string",
    "new_string",
    "insert_text",
    "text",
    "patch",
    "diff",
    "description",
    "message",
    "title",
    "query",
    "pattern",
    "prompt",
    "replacement",
    "body",
    "notes",
    "thought",
    "thoughts",
    "reason",
    "reasoning",
    "explanation",
    "summary",
    "todos",
    "plan",
    "glob",
    "include",
    "exclude",
    "edits",
    "view_range",
    "insert_line",
    "old",
    "new",
];

fn text_blocks(text: &str) -> Vec<(String, Option<Dialect>)> {
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let Some(info) = trimmed.strip_prefix("```") else {
            continue;
        };
        let info = info.trim().to_ascii_lowercase();
        let console = matches!(info.as_str(), "console" | "terminal" | "shell-session");
        let shell = info.is_empty()
            || console
            || info.contains("bash")
            || matches!(info.as_str(), "sh" | "shell" | "zsh");
        let mut body = String::new();
        for l in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            if console {
                if let Some(cmd) = l.trim_start().strip_prefix("$ ") {
                    body.push_str(cmd);
                    body.push('\n');
                }
            } else {
                body.push_str(l);
                body.push('\n');
            }
        }
        if shell {
            blocks.push((body, None));
        }
    }
    for (tag, dialect) in [
        ("bash", None),
        ("execute_bash", None),
        ("command", None),
        ("cmd", None),
        ("execute_ipython", Some(Dialect::Python)),
    ] {
        let open = format!("<{tag}>");
        let close = format!("</{tag}>");
        let mut rest = text;
        while let Some(at) = rest.find(&open) {
            let after = &rest[at + open.len()..];
            let end = after.find(&close).unwrap_or(after.len());
            blocks.push((after[..end].to_string(), dialect));
            rest = &after[end..];
        }
    }
    blocks
}

/// A program's base name: directory and `.exe` removed.
fn base_name(word: &str) -> &str {
    let name = word.rsplit('/').next().unwrap_or(word);
    name.strip_suffix(".exe").unwrap_or(name)
}

fn is_assignment(word: &str) -> Option<(&str, &str)> {
    let (name, value) = word.split_once('=')?;
    let mut chars = name.chars();
    let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    valid.then_some((name, value))
}

fn is_python(name: &str) -> bool {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    matches!(stem, "python" | "pypy" | "ipython")
}

/// Shells whose `-c` string, script argument or standard input is shell text.
const SHELLS: &[&str] = &["bash", "sh", "zsh", "dash", "ksh", "ash", "mksh", "busybox"];

/// Words that start or end a compound command and run nothing themselves.
const RESERVED: &[&str] = &[
    "!", "{", "}", "then", "do", "else", "elif", "if", "while", "until", "fi", "done", "esac",
];

impl Walk<'_> {
    fn spend(&mut self, bytes: usize) -> bool {
        if bytes > self.budget {
            self.budget = 0;
            return false;
        }
        self.budget -= bytes;
        true
    }

    /// Matches one unwrapped command against every rule.
    fn emit(&mut self, argv: &[String]) {
        let Some(first) = argv.first() else {
            return;
        };
        let candidate = Candidate {
            program: base_name(first),
            args: &argv[1..],
            base_commit: self.base_commit,
        };
        let mut matched = None;
        for (index, rule) in self.rules.rules.iter().enumerate() {
            if !rule.matches(&candidate) {
                continue;
            }
            let text = matched.get_or_insert_with(|| display(argv)).clone();
            if self.seen.insert((index, text.clone())) {
                self.hits.push(Hit {
                    rule: rule.id.clone(),
                    category: rule.category.clone(),
                    matched: text,
                });
            }
        }
    }

    /// Shell text: each simple command, its substitutions, and what it runs. Returns the last command's
    /// output when the scanner can tell it.
    fn script(&mut self, text: &str, depth: usize) -> Option<String> {
        if depth > MAX_DEPTH || !self.spend(text.len()) {
            return None;
        }
        let mut previous_output: Option<String> = None;
        for command in shell::lex(text) {
            let outputs: Vec<Option<String>> = command
                .nested
                .iter()
                .map(|nested| self.script(nested, depth + 1))
                .collect();
            let piped = if command.piped {
                previous_output.take()
            } else {
                None
            };
            let stdin = command.stdin.clone().or(piped).or_else(|| {
                command
                    .stdin_file
                    .as_ref()
                    .and_then(|f| self.memory.files.get(f).cloned())
            });
            let words = self.expand(&command.words, &outputs);
            previous_output = self.simple(
                words,
                command.first_quoted(),
                stdin,
                command.stdout_file.as_deref(),
                depth,
            );
        }
        previous_output
    }

    /// The words with the variables the session defined and the known outputs of substitutions put in;
    /// an unquoted lone variable or substitution splits.
    fn expand(&self, words: &[Word], outputs: &[Option<String>]) -> Vec<String> {
        let mut out = Vec::with_capacity(words.len());
        for word in words {
            let text = self.substitute(&word.text, outputs);
            if word.is_bare_var() {
                out.extend(text.split_whitespace().map(str::to_string));
            } else {
                out.push(text);
            }
        }
        out
    }

    fn substitute(&self, text: &str, outputs: &[Option<String>]) -> String {
        if !text.contains([VAR_OPEN, SUB_OPEN]) {
            return text.to_string();
        }
        let mut out = String::with_capacity(text.len());
        let mut rest = text;
        while let Some(at) = rest.find([VAR_OPEN, SUB_OPEN]) {
            out.push_str(&rest[..at]);
            let variable = rest[at..].starts_with(VAR_OPEN);
            let close = if variable { VAR_CLOSE } else { SUB_CLOSE };
            let after = &rest[at + VAR_OPEN.len_utf8()..];
            let end = after.find(close).unwrap_or(after.len());
            let name = &after[..end];
            if variable {
                match self.memory.vars.get(name) {
                    Some(value) => out.push_str(value),
                    None => {
                        out.push('$');
                        out.push_str(name);
                    }
                }
            } else {
                let known = name
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| outputs.get(i))
                    .and_then(Option::as_ref);
                match known {
                    Some(value) => out.push_str(value.trim_end_matches('\n')),
                    None => out.push_str("$(...)"),
                }
            }
            rest = after.get(end + close.len_utf8()..).unwrap_or_default();
        }
        out.push_str(rest);
        out
    }

    /// One simple command; returns the text it writes to standard output, when the scanner can tell.
    fn simple(
        &mut self,
        mut argv: Vec<String>,
        first_quoted: bool,
        stdin: Option<String>,
        stdout_file: Option<&str>,
        depth: usize,
    ) -> Option<String> {
        while argv.first().is_some_and(|w| RESERVED.contains(&w.as_str())) {
            argv.remove(0);
        }
        while argv.last().is_some_and(|w| w == "}") {
            argv.pop();
        }
        if argv
            .first()
            .is_some_and(|w| matches!(w.as_str(), "for" | "case" | "select" | "function" | "in"))
        {
            return None;
        }
        let assignments = argv.iter().take_while(|w| is_assignment(w).is_some()).count();
        if assignments == argv.len() {
            for word in &argv {
                if let Some((name, value)) = is_assignment(word) {
                    remember(&mut self.memory.vars, name, value);
                }
            }
            return None;
        }
        argv.drain(..assignments);
        let name = argv[0].as_str();
        if !first_quoted
            && assignments == 0
            && let Some(value) = self.memory.aliases.get(name).cloned()
        {
            let text = format!("{value} {}", quote(&argv[1..]));
            return self.script(&text, depth + 1);
        }
        match name {
            "alias" => {
                for word in &argv[1..] {
                    if let Some((n, v)) = word.split_once('=') {
                        remember(&mut self.memory.aliases, n, v);
                    }
                }
                return None;
            }
            "export" | "declare" | "typeset" | "local" | "readonly" => {
                for word in &argv[1..] {
                    if let Some((n, v)) = is_assignment(word) {
                        remember(&mut self.memory.vars, n, v);
                    }
                }
                return None;
            }
            _ => {}
        }
        self.dispatch(argv, stdin, stdout_file, depth)
    }

    /// Unwraps wrappers and interpreters, then matches what remains; returns the command's output text
    /// when it is an `echo`, `printf` or `cat` the scanner can follow.
    fn dispatch(
        &mut self,
        mut argv: Vec<String>,
        stdin: Option<String>,
        stdout_file: Option<&str>,
        depth: usize,
    ) -> Option<String> {
        if depth > MAX_DEPTH {
            return None;
        }
        for _ in 0..MAX_DEPTH {
            let first = argv.first()?;
            match unwrap_wrapper(base_name(first), &argv) {
                Unwrapped::Rest(rest) => argv = rest,
                Unwrapped::Text(text) => {
                    self.script(&text, depth + 1);
                    return None;
                }
                Unwrapped::NotAWrapper => break,
            }
        }
        let first = argv.first()?;
        let program = base_name(first).to_string();
        if program != "git" {
            // git is matched once its global options and aliases are resolved.
            self.emit(&argv);
        }
        match program.as_str() {
            p if SHELLS.contains(&p) => return self.shell(&argv, stdin, depth),
            "eval" => return self.script(&argv[1..].join(" "), depth + 1),
            "source" | "." => {
                if let Some(text) = argv.get(1).and_then(|f| self.memory.files.get(f).cloned()) {
                    return self.script(&text, depth + 1);
                }
            }
            "git" => return self.git(argv, depth),
            "base64" => return decode_base64(&argv, stdin),
            "find" => self.find_exec(&argv, depth),
            "node" | "nodejs" | "deno" | "bun" => self.interpreter(&argv, stdin, Dialect::Js, depth),
            "perl" | "ruby" | "php" => self.interpreter(&argv, stdin, Dialect::Script, depth),
            p if is_python(p) => return self.python(argv, stdin, stdout_file, depth),
            "echo" | "printf" | "cat" | "tee" => return self.output(&argv, stdin, stdout_file),
            _ => {
                if argv.len() == 1
                    && let Some(text) = self.memory.files.get(first).cloned()
                    && first.contains('/')
                {
                    // `./run.sh` of a script written earlier.
                    self.script(&text, depth + 1);
                }
            }
        }
        None
    }

    /// `bash -c STRING [$0 $1 ...]`, `bash SCRIPT`, or a shell reading its standard input.
    fn shell(&mut self, argv: &[String], stdin: Option<String>, depth: usize) -> Option<String> {
        let mut command_mode = false;
        let mut i = 1;
        while i < argv.len() {
            let a = argv[i].as_str();
            if a == "--" {
                i += 1;
                break;
            }
            if matches!(a, "-o" | "+o" | "--rcfile" | "--init-file" | "-O" | "+O") {
                i += 2;
                continue;
            }
            if let Some(flags) = a.strip_prefix('-').or_else(|| a.strip_prefix('+')) {
                if !a.starts_with("--") && flags.contains('c') {
                    command_mode = true;
                }
                i += 1;
                continue;
            }
            break;
        }
        match argv.get(i) {
            Some(text) if command_mode => {
                let text = positional(text, &argv[i + 1..]);
                self.script(&text, depth + 1)
            }
            Some(file) => {
                let text = self.memory.files.get(file).cloned()?;
                self.script(&text, depth + 1)
            }
            None => self.script(&stdin?, depth + 1),
        }
    }

    fn python(
        &mut self,
        argv: Vec<String>,
        stdin: Option<String>,
        stdout_file: Option<&str>,
        depth: usize,
    ) -> Option<String> {
        let mut i = 1;
        while i < argv.len() {
            let a = argv[i].as_str();
            match a {
                "-c" => {
                    if let Some(code) = argv.get(i + 1) {
                        self.code(code, Dialect::Python, depth + 1);
                    }
                    return None;
                }
                "-m" => {
                    let rest = argv[i + 1..].to_vec();
                    return self.dispatch(rest, stdin, stdout_file, depth + 1);
                }
                "-W" | "-X" => i += 2,
                "-" => break,
                _ if a.starts_with("-c") && a.len() > 2 => {
                    self.code(&a[2..], Dialect::Python, depth + 1);
                    return None;
                }
                _ if a.starts_with('-') => i += 1,
                file => {
                    if let Some(code) = self.memory.files.get(file).cloned() {
                        self.code(&code, Dialect::Python, depth + 1);
                    }
                    return None;
                }
            }
        }
        if let Some(code) = stdin {
            self.code(&code, Dialect::Python, depth + 1);
        }
        None
    }

    fn interpreter(&mut self, argv: &[String], stdin: Option<String>, dialect: Dialect, depth: usize) {
        let mut i = 1;
        while i < argv.len() {
            let a = argv[i].as_str();
            if matches!(a, "-e" | "-E" | "--eval" | "-p" | "--print" | "-r" | "eval") {
                if let Some(code) = argv.get(i + 1) {
                    self.code(code, dialect, depth + 1);
                }
                return;
            }
            if a.starts_with('-') || a == "run" {
                i += 1;
                continue;
            }
            if let Some(code) = self.memory.files.get(a).cloned() {
                self.code(&code, dialect, depth + 1);
            }
            return;
        }
        if let Some(code) = stdin {
            self.code(&code, dialect, depth + 1);
        }
    }

    /// Code in another language: the shell strings and argument vectors it runs, the URLs it fetches.
    fn code(&mut self, code: &str, dialect: Dialect, depth: usize) {
        if depth > MAX_DEPTH || !self.spend(code.len()) {
            return;
        }
        let found = code::scan(code, dialect);
        for text in found.shell {
            self.script(&text, depth + 1);
        }
        for argv in found.argvs {
            self.dispatch(argv, None, None, depth + 1);
        }
        for url in found.urls {
            self.emit(&["(code-fetch)".to_string(), url]);
        }
    }

    /// `find ... -exec CMD {} ;` runs CMD.
    fn find_exec(&mut self, argv: &[String], depth: usize) {
        let mut i = 1;
        while i < argv.len() {
            if matches!(argv[i].as_str(), "-exec" | "-execdir" | "-ok" | "-okdir") {
                let end = argv[i + 1..]
                    .iter()
                    .position(|a| a == ";" || a == "+")
                    .map_or(argv.len(), |p| i + 1 + p);
                self.dispatch(argv[i + 1..end].to_vec(), None, None, depth + 1);
                i = end;
            }
            i += 1;
        }
    }

    /// `echo`, `printf`, `cat` and `tee`: what they write, remembered as a file when redirected.
    fn output(
        &mut self,
        argv: &[String],
        stdin: Option<String>,
        stdout_file: Option<&str>,
    ) -> Option<String> {
        let program = base_name(&argv[0]);
        let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
        let text = match program {
            "echo" => {
                let words: Vec<&str> = args
                    .iter()
                    .copied()
                    .skip_while(|a| matches!(*a, "-n" | "-e" | "-E" | "-ne" | "-en"))
                    .collect();
                let mut text = words.join(" ");
                if args.iter().any(|a| a.contains('e') && a.starts_with('-')) {
                    text = text.replace("\\n", "\n");
                }
                text.push('\n');
                Some(text)
            }
            "printf" => args.first().map(|format| {
                let mut text = format.replace("\\n", "\n").replace("\\t", "\t");
                for value in &args[1..] {
                    text = text.replacen("%s", value, 1);
                }
                text
            }),
            "cat" => {
                let files: Vec<&str> = args.iter().copied().filter(|a| !a.starts_with('-')).collect();
                if files.is_empty() || files == ["-"] {
                    stdin
                } else {
                    let known: Option<Vec<String>> =
                        files.iter().map(|f| self.memory.files.get(*f).cloned()).collect();
                    known.map(|parts| parts.concat())
                }
            }
            _ => {
                // tee FILE...: its input goes to every file and on.
                for file in args.iter().filter(|a| !a.starts_with('-')) {
                    if let Some(text) = &stdin {
                        remember(&mut self.memory.files, file, text);
                    }
                }
                stdin
            }
        };
        if let (Some(file), Some(text)) = (stdout_file, &text) {
            remember(&mut self.memory.files, file, text);
            return None;
        }
        text
    }

    /// git: global options removed, aliases expanded, alias definitions remembered, `submodule foreach`
    /// followed; then the rules see `git SUBCOMMAND ARGS...`.
    fn git(&mut self, argv: Vec<String>, depth: usize) -> Option<String> {
        let mut local: HashMap<String, String> = HashMap::new();
        let mut argv = argv;
        for _ in 0..4 {
            let mut i = 1;
            while i < argv.len() {
                let a = argv[i].as_str();
                match a {
                    "-C" | "--git-dir" | "--work-tree" | "--namespace" | "--super-prefix"
                    | "--config-env" | "--exec-path" | "--list-cmds" => i += 2,
                    "-c" => {
                        if let Some((key, value)) = argv.get(i + 1).and_then(|kv| kv.split_once('='))
                            && let Some(alias) = key.strip_prefix("alias.")
                        {
                            local.insert(alias.to_string(), value.to_string());
                        }
                        i += 2;
                    }
                    _ if a.starts_with('-') => i += 1,
                    _ => break,
                }
            }
            let sub = argv.get(i).cloned()?;
            let rest = argv[i + 1..].to_vec();
            let alias = local
                .get(&sub)
                .or_else(|| self.memory.git_aliases.get(&sub))
                .cloned();
            match alias {
                Some(value) if value.starts_with('!') => {
                    let text = format!("{} {}", &value[1..], quote(&rest));
                    return self.script(&text, depth + 1);
                }
                Some(value) => {
                    let mut expanded = vec![argv[0].clone()];
                    for command in shell::lex(&value).into_iter().take(1) {
                        expanded.extend(command.words.into_iter().map(|w| w.text));
                    }
                    expanded.extend(rest);
                    argv = expanded;
                    continue;
                }
                None => {
                    let mut normal = vec![argv[0].clone(), sub.clone()];
                    normal.extend(rest.iter().cloned());
                    self.emit(&normal);
                    match sub.as_str() {
                        "config" => self.git_config(&rest),
                        "submodule" => {
                            if let Some(at) = rest.iter().position(|a| a == "foreach") {
                                let command: Vec<&String> =
                                    rest[at + 1..].iter().filter(|a| !a.starts_with("--")).collect();
                                let text = command.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" ");
                                self.script(&text, depth + 1);
                            }
                        }
                        // What `git rev-parse` prints names the same objects as its arguments, so
                        // `git show $(git rev-parse origin/main)` is read as `git show origin/main`.
                        "rev-parse" => return Some(rev_parse_output(&rest)),
                        _ => {}
                    }
                    return None;
                }
            }
        }
        None
    }

    /// `git config [scope] alias.NAME VALUE` (also `git config set alias.NAME VALUE`).
    fn git_config(&mut self, args: &[String]) {
        let mut positional = Vec::new();
        let mut i = 0;
        while i < args.len() {
            let a = args[i].as_str();
            if matches!(a, "-f" | "--file" | "--blob" | "--type") {
                i += 2;
                continue;
            }
            let subcommand = positional.is_empty() && a == "set";
            if !a.starts_with('-') && !subcommand {
                positional.push(a);
            }
            i += 1;
        }
        if let [key, value, ..] = positional.as_slice()
            && let Some(alias) = key.strip_prefix("alias.")
        {
            remember(&mut self.memory.git_aliases, alias, value);
        }
    }

    /// A JSON value of a tool call's arguments, under `key` (the key it sits under, when in an object).
    fn json(&mut self, value: &Value, kind: ToolKind, key: Option<&str>, depth: usize) {
        if depth > MAX_DEPTH {
            return;
        }
        let key_lower = key.map(str::to_ascii_lowercase);
        let key = key_lower.as_deref();
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    self.json(v, kind, Some(k), depth + 1);
                }
            }
            Value::Array(items) => {
                let strings: Option<Vec<String>> = items.iter().map(|v| v.as_str().map(sanitize)).collect();
                match strings {
                    // `["bash", "-lc", "..."]` is one argument vector; `["git status", "ls"]` a list of
                    // command lines.
                    Some(argv)
                        if !argv.is_empty()
                            && kind != ToolKind::Files
                            && !is_content(key)
                            && !argv[0].contains(char::is_whitespace) =>
                    {
                        self.dispatch(argv, None, None, depth + 1);
                    }
                    _ => {
                        for item in items {
                            self.json(item, kind, key, depth + 1);
                        }
                    }
                }
            }
            Value::String(s) => match key {
                Some(k) if PATH_KEYS.contains(&k) => {
                    self.emit(&["(read)".to_string(), s.clone()]);
                }
                Some(k) if URL_KEYS.contains(&k) => {
                    self.emit(&["(fetch)".to_string(), s.clone()]);
                }
                _ if kind == ToolKind::Files || is_content(key) => {}
                _ => self.tool_text(s, kind, depth + 1),
            },
            _ => {}
        }
    }

    fn tool_text(&mut self, text: &str, kind: ToolKind, depth: usize) {
        match kind {
            ToolKind::Python => self.code(text, Dialect::Python, depth),
            _ => {
                self.script(text, depth);
            }
        }
    }
}

/// `$0`, `$1`, ... `$9`, `$@` and `$*` of a `sh -c TEXT ARG0 ARG1 ...` replaced by the arguments.
fn positional(text: &str, args: &[String]) -> String {
    if args.is_empty() || !text.contains('$') {
        return text.to_string();
    }
    let mut out = text.to_string();
    let all = quote(args.get(1..).unwrap_or_default());
    out = out.replace("$@", &all).replace("$*", &all);
    for (n, arg) in args.iter().enumerate().take(10).rev() {
        out = out.replace(&format!("${n}"), &quote(std::slice::from_ref(arg)));
    }
    out
}

/// The revisions `git rev-parse ARGS` prints, as arguments that name the same objects.
fn rev_parse_output(args: &[String]) -> String {
    let kept: Vec<String> = args
        .iter()
        .filter(|a| {
            !a.starts_with('-')
                || ["--all", "--branches", "--remotes", "--tags", "--glob"]
                    .iter()
                    .any(|o| a.as_str() == *o || a.starts_with(&format!("{o}=")))
        })
        .cloned()
        .collect();
    kept.join(" ")
}

/// `base64 -d` of its input, when the scanner knows the input and it decodes to text.
fn decode_base64(argv: &[String], stdin: Option<String>) -> Option<String> {
    use base64::Engine as _;
    if !argv[1..]
        .iter()
        .any(|a| matches!(a.as_str(), "-d" | "--decode" | "-D"))
    {
        return None;
    }
    let compact: String = stdin?.split_whitespace().collect();
    let bytes = base64::engine::general_purpose::STANDARD.decode(compact).ok()?;
    String::from_utf8(bytes).ok()
}

fn is_content(key: Option<&str>) -> bool {
    key.is_some_and(|k| CONTENT_KEYS.contains(&k))
}

/// The wrappers the scanner sees through, and what each leaves to run.
enum Unwrapped {
    Rest(Vec<String>),
    Text(String),
    NotAWrapper,
}

fn unwrap_wrapper(program: &str, argv: &[String]) -> Unwrapped {
    // (name, options taking a value, positional arguments before the command)
    let (value_options, positionals): (&[&str], usize) = match program {
        "env" => (&["-u", "--unset", "-C", "--chdir", "-S", "--split-string"], 0),
        "sudo" | "doas" => (&["-u", "-g", "-p", "-C", "-h", "-U", "-r", "-t", "-T", "-D"], 0),
        "command" | "builtin" | "exec" | "nohup" | "time" | "chronic" | "unbuffer" | "setsid"
        | "catchsegv" | "xargs" | "watch" | "strace" | "ltrace" | "caffeinate" | "stdbuf" => (
            &[
                "-a",
                "-n",
                "-I",
                "-L",
                "-P",
                "-d",
                "-E",
                "-s",
                "-i",
                "-o",
                "-e",
                "-p",
                "--max-args",
                "--interval",
                "--delimiter",
                "-f",
            ],
            0,
        ),
        "nice" => (&["-n", "--adjustment"], 0),
        "ionice" => (&["-c", "-n", "-p", "--class", "--classdata"], 0),
        "timeout" => (&["-s", "--signal", "-k", "--kill-after"], 1),
        "taskset" => (&[], 1),
        "flock" => (&["-w", "--timeout", "-E", "--conflict-exit-code"], 1),
        "chroot" => (&["--userspec", "--groups"], 1),
        "runuser" => (&["-u", "-g", "-G", "--user", "--group"], 0),
        "su" | "script" => {
            let at = argv.iter().position(|a| a == "-c" || a == "--command");
            return match at.and_then(|i| argv.get(i + 1)) {
                Some(text) => Unwrapped::Text(text.clone()),
                None => Unwrapped::NotAWrapper,
            };
        }
        _ => return Unwrapped::NotAWrapper,
    };
    let mut i = 1;
    while i < argv.len() {
        let a = argv[i].as_str();
        if a == "--" {
            i += 1;
            break;
        }
        if program == "env" {
            if matches!(a, "-S" | "--split-string") {
                let mut text = argv.get(i + 1).cloned().unwrap_or_default();
                text.push(' ');
                text.push_str(&quote(argv.get(i + 2..).unwrap_or_default()));
                return Unwrapped::Text(text);
            }
            if is_assignment(a).is_some() {
                i += 1;
                continue;
            }
        }
        if program == "flock" && matches!(a, "-c" | "--command") {
            return match argv.get(i + 1) {
                Some(text) => Unwrapped::Text(text.clone()),
                None => Unwrapped::NotAWrapper,
            };
        }
        if a.starts_with('-') && a.len() > 1 {
            i += if value_options.contains(&a) { 2 } else { 1 };
            continue;
        }
        break;
    }
    i += positionals;
    if program == "watch" && argv.len() > i + 1 {
        return Unwrapped::Text(argv[i..].join(" "));
    }
    match argv.get(i..) {
        Some(rest) if !rest.is_empty() => Unwrapped::Rest(rest.to_vec()),
        _ => Unwrapped::Rest(Vec::new()),
    }
}

/// An argument vector as shell text, quoted where needed.
fn quote(argv: &[String]) -> String {
    shlex::try_join(argv.iter().map(String::as_str)).unwrap_or_else(|_| argv.join(" "))
}

/// [`quote`], cut at [`MAX_MATCHED_BYTES`].
fn display(argv: &[String]) -> String {
    let mut text = quote(argv);
    if text.len() > MAX_MATCHED_BYTES {
        let mut cut = MAX_MATCHED_BYTES - 3;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

#[cfg(test)]
mod tests;
