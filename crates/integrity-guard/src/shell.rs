//! A single-pass lexer for the shell text agents write: words with quotes removed, simple commands split
//! at `;`, `&&`, `||`, `&`, `|`, newlines and parentheses, redirections, here-documents and here-strings,
//! and the text of `$(...)`, backticks and `<(...)` for the caller to lex in turn.
//!
//! It is not a shell: it expands nothing and runs nothing. It exists because word splitters such as
//! `shlex` see `a&&b`, `a;b` and `$(b)` as plain word characters, and telling an operator from a quoted one
//! needs the same quote state a lexer keeps. Every byte is visited once, whatever the input; unbalanced
//! quotes and parentheses end at the end of the text instead of failing.
//!
//! A variable reference (`$NAME`, `${NAME}`) outside single quotes is kept in the word as
//! [`VAR_OPEN`]`NAME`[`VAR_CLOSE`], and a command substitution as [`SUB_OPEN`]`N`[`SUB_CLOSE`], so the
//! caller can substitute the values and outputs it knows.

/// Opens a variable reference inside a word (a private-use character, removed from input first).
pub(crate) const VAR_OPEN: char = '\u{E000}';
/// Closes a variable reference inside a word.
pub(crate) const VAR_CLOSE: char = '\u{E001}';
/// Opens a command substitution inside a word: [`SUB_OPEN`]`N`[`SUB_CLOSE`] stands for the output of the
/// command's `nested[N]`.
pub(crate) const SUB_OPEN: char = '\u{E002}';
/// Closes a command substitution inside a word.
pub(crate) const SUB_CLOSE: char = '\u{E003}';

/// One word of a simple command, with quotes removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Word {
    /// The text, variable references as markers.
    pub(crate) text: String,
    /// Some part of it was quoted or escaped.
    pub(crate) quoted: bool,
}

impl Word {
    /// The word is exactly one unquoted variable reference or command substitution, so its value splits
    /// into words.
    pub(crate) fn is_bare_var(&self) -> bool {
        let one = |open: char, close: char| {
            self.text.starts_with(open) && self.text.ends_with(close) && self.text.matches(open).count() == 1
        };
        !self.quoted && (one(VAR_OPEN, VAR_CLOSE) || one(SUB_OPEN, SUB_CLOSE))
    }
}

/// One simple command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Command {
    /// Its words, redirections removed.
    pub(crate) words: Vec<Word>,
    /// Text on its standard input from a here-document or here-string.
    pub(crate) stdin: Option<String>,
    /// The file `<` reads from.
    pub(crate) stdin_file: Option<String>,
    /// The file `>` or `>>` writes to (the last one).
    pub(crate) stdout_file: Option<String>,
    /// It reads the previous command's output through a pipe.
    pub(crate) piped: bool,
    /// The texts of `$(...)`, backticks and process substitutions in its words.
    pub(crate) nested: Vec<String>,
    heredocs: Vec<(String, bool)>,
}

impl Command {
    /// Its first word was quoted (so it is not an alias).
    pub(crate) fn first_quoted(&self) -> bool {
        self.words.first().is_some_and(|w| w.quoted)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Redirect {
    In,
    Out,
    Dup,
    HereDoc { strip_tabs: bool },
    HereString,
}

struct Lexer<'a> {
    b: &'a [u8],
    i: usize,
    commands: Vec<Command>,
    current: Command,
    word: Vec<u8>,
    word_started: bool,
    quoted: bool,
    redirect: Option<Redirect>,
    next_piped: bool,
    line_start: usize,
}

/// Lexes `text` into simple commands, in order.
pub(crate) fn lex(text: &str) -> Vec<Command> {
    let mut lexer = Lexer {
        b: text.as_bytes(),
        i: 0,
        commands: Vec::new(),
        current: Command::default(),
        word: Vec::new(),
        word_started: false,
        quoted: false,
        redirect: None,
        next_piped: false,
        line_start: 0,
    };
    lexer.run();
    lexer.commands
}

fn is_name_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_'
}

fn is_name(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

impl Lexer<'_> {
    fn peek(&self, ahead: usize) -> Option<u8> {
        self.b.get(self.i + ahead).copied()
    }

    fn run(&mut self) {
        while let Some(c) = self.peek(0) {
            match c {
                b' ' | b'\t' | b'\r' => {
                    self.finish_word();
                    self.i += 1;
                }
                b'\n' => {
                    self.i += 1;
                    self.finish_command();
                    self.read_heredocs();
                }
                b'\\' => match self.peek(1) {
                    Some(b'\n') => self.i += 2,
                    Some(_) => {
                        self.i += 1;
                        self.quoted = true;
                        self.push_char();
                    }
                    None => self.i += 1,
                },
                b'\'' => {
                    self.i += 1;
                    self.quoted = true;
                    self.word_started = true;
                    let end = self.find(b'\'');
                    self.word.extend_from_slice(&self.b[self.i..end]);
                    self.i = (end + 1).min(self.b.len());
                }
                b'"' => {
                    self.i += 1;
                    self.quoted = true;
                    self.word_started = true;
                    self.double_quoted();
                }
                b'`' => self.backtick(),
                b'$' => self.dollar(),
                b'#' if !self.word_started => {
                    self.i = self.find(b'\n');
                }
                b';' => {
                    self.i += 1;
                    self.finish_command();
                }
                b'&' => match self.peek(1) {
                    Some(b'&') => {
                        self.i += 2;
                        self.finish_command();
                    }
                    Some(b'>') => {
                        self.finish_word();
                        self.i += if self.peek(2) == Some(b'>') { 3 } else { 2 };
                        self.redirect = Some(Redirect::Out);
                    }
                    _ => {
                        self.i += 1;
                        self.finish_command();
                    }
                },
                b'|' => match self.peek(1) {
                    Some(b'|') => {
                        self.i += 2;
                        self.finish_command();
                    }
                    Some(b'&') => {
                        self.i += 2;
                        self.finish_command();
                        self.next_piped = true;
                    }
                    _ => {
                        self.i += 1;
                        self.finish_command();
                        self.next_piped = true;
                    }
                },
                b'(' | b')' => {
                    self.i += 1;
                    self.finish_command();
                }
                b'<' | b'>' => self.redirection(c),
                _ => self.push_char(),
            }
        }
        self.finish_command();
    }

    /// Appends the (UTF-8) character at the cursor to the word.
    fn push_char(&mut self) {
        let len = match self.b[self.i] {
            c if c < 0x80 => 1,
            c if c >= 0xF0 => 4,
            c if c >= 0xE0 => 3,
            _ => 2,
        };
        let end = (self.i + len).min(self.b.len());
        self.word.extend_from_slice(&self.b[self.i..end]);
        self.word_started = true;
        self.i = end;
    }

    /// The index of the next `byte` at or after the cursor, or the end.
    fn find(&self, byte: u8) -> usize {
        self.b[self.i..]
            .iter()
            .position(|&c| c == byte)
            .map_or(self.b.len(), |p| self.i + p)
    }

    fn double_quoted(&mut self) {
        while let Some(c) = self.peek(0) {
            match c {
                b'"' => {
                    self.i += 1;
                    return;
                }
                b'\\' => match self.peek(1) {
                    Some(b'\n') => self.i += 2,
                    Some(b'$' | b'`' | b'"' | b'\\') => {
                        self.word.push(self.b[self.i + 1]);
                        self.i += 2;
                    }
                    _ => {
                        self.word.push(b'\\');
                        self.i += 1;
                    }
                },
                b'$' => self.dollar(),
                b'`' => self.backtick(),
                _ => self.push_char(),
            }
        }
    }

    fn backtick(&mut self) {
        let start = self.i + 1;
        let mut j = start;
        while j < self.b.len() && self.b[j] != b'`' {
            j += if self.b[j] == b'\\' { 2 } else { 1 };
        }
        let end = j.min(self.b.len());
        let inner = String::from_utf8_lossy(&self.b[start..end]).replace("\\`", "`");
        self.push_substitution(inner);
        self.i = (end + 1).min(self.b.len());
    }

    /// From just after an opening parenthesis, the index of its matching close (or the end).
    fn matching_paren(&self, from: usize) -> usize {
        let mut depth = 1usize;
        let mut j = from;
        while j < self.b.len() {
            match self.b[j] {
                b'\\' => j += 1,
                b'\'' => {
                    j += 1;
                    while j < self.b.len() && self.b[j] != b'\'' {
                        j += 1;
                    }
                }
                b'"' => {
                    j += 1;
                    while j < self.b.len() && self.b[j] != b'"' {
                        if self.b[j] == b'\\' {
                            j += 1;
                        }
                        j += 1;
                    }
                }
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        return j;
                    }
                }
                _ => {}
            }
            j += 1;
        }
        self.b.len()
    }

    /// A substitution whose text starts at `from` (just after its opening parenthesis).
    fn substitution(&mut self, from: usize) {
        let end = self.matching_paren(from);
        let inner = String::from_utf8_lossy(&self.b[from..end]).into_owned();
        self.push_substitution(inner);
        self.i = (end + 1).min(self.b.len());
    }

    fn push_substitution(&mut self, inner: String) {
        let marker = format!("{SUB_OPEN}{}{SUB_CLOSE}", self.current.nested.len());
        self.current.nested.push(inner);
        self.word.extend_from_slice(marker.as_bytes());
        self.word_started = true;
    }

    fn dollar(&mut self) {
        match self.peek(1) {
            Some(b'(') => self.substitution(self.i + 2),
            Some(b'{') => {
                let start = self.i + 2;
                let end = self.b[start..]
                    .iter()
                    .position(|&c| c == b'}')
                    .map_or(self.b.len(), |p| start + p);
                let name = &self.b[start..end];
                if !name.is_empty() && is_name_start(name[0]) && name.iter().all(|&c| is_name(c)) {
                    self.push_var(start, end);
                } else {
                    self.word
                        .extend_from_slice(&self.b[self.i..end.min(self.b.len())]);
                    self.word.push(b'}');
                }
                self.word_started = true;
                self.i = (end + 1).min(self.b.len());
            }
            Some(b'\'') => {
                self.i += 2;
                self.quoted = true;
                self.word_started = true;
                self.ansi_c();
            }
            Some(c) if is_name_start(c) => {
                let start = self.i + 1;
                let end = self.b[start..]
                    .iter()
                    .position(|&c| !is_name(c))
                    .map_or(self.b.len(), |p| start + p);
                self.push_var(start, end);
                self.word_started = true;
                self.i = end;
            }
            _ => self.push_char(),
        }
    }

    fn push_var(&mut self, start: usize, end: usize) {
        let mut buf = [0u8; 4];
        self.word
            .extend_from_slice(VAR_OPEN.encode_utf8(&mut buf).as_bytes());
        self.word.extend_from_slice(&self.b[start..end]);
        self.word
            .extend_from_slice(VAR_CLOSE.encode_utf8(&mut buf).as_bytes());
    }

    /// `$'...'` with the common escapes decoded.
    fn ansi_c(&mut self) {
        while let Some(c) = self.peek(0) {
            match c {
                b'\'' => {
                    self.i += 1;
                    return;
                }
                b'\\' => {
                    let (byte, used) = match self.peek(1) {
                        Some(b'n') => (b'\n', 2),
                        Some(b't') => (b'\t', 2),
                        Some(b'x') => {
                            let hex: Vec<u8> = (2..4).filter_map(|k| self.peek(k)).collect();
                            let digits = hex.iter().take_while(|c| c.is_ascii_hexdigit()).count();
                            let value = std::str::from_utf8(&hex[..digits])
                                .ok()
                                .and_then(|h| u8::from_str_radix(h, 16).ok());
                            match value {
                                Some(v) if v.is_ascii() => (v, 2 + digits),
                                _ => (b'x', 2),
                            }
                        }
                        Some(other) => (other, 2),
                        None => (b'\\', 1),
                    };
                    self.word.push(byte);
                    self.i += used;
                }
                _ => self.push_char(),
            }
        }
    }

    fn redirection(&mut self, c: u8) {
        if self.peek(1) == Some(b'(') {
            // Process substitution: its command runs.
            self.finish_word();
            self.substitution(self.i + 2);
            self.finish_word();
            return;
        }
        // A word of digits right before the operator is its file descriptor.
        if !self.quoted && !self.word.is_empty() && self.word.iter().all(u8::is_ascii_digit) {
            self.word.clear();
            self.word_started = false;
        }
        self.finish_word();
        let (kind, used) = match (c, self.peek(1), self.peek(2)) {
            (b'<', Some(b'<'), Some(b'<')) => (Redirect::HereString, 3),
            (b'<', Some(b'<'), Some(b'-')) => (Redirect::HereDoc { strip_tabs: true }, 3),
            (b'<', Some(b'<'), _) => (Redirect::HereDoc { strip_tabs: false }, 2),
            (b'<', Some(b'&'), _) => (Redirect::Dup, 2),
            (b'<', Some(b'>'), _) => (Redirect::In, 2),
            (b'<', _, _) => (Redirect::In, 1),
            (b'>', Some(b'&'), _) => (Redirect::Dup, 2),
            (b'>', Some(b'>' | b'|'), _) => (Redirect::Out, 2),
            _ => (Redirect::Out, 1),
        };
        self.i += used;
        self.redirect = Some(kind);
    }

    fn finish_word(&mut self) {
        if !self.word_started && !self.quoted {
            return;
        }
        let text = String::from_utf8_lossy(&self.word).into_owned();
        let quoted = self.quoted;
        self.word.clear();
        self.word_started = false;
        self.quoted = false;
        match self.redirect.take() {
            Some(Redirect::In) => self.current.stdin_file = Some(text),
            Some(Redirect::Out) => self.current.stdout_file = Some(text),
            Some(Redirect::Dup) => {}
            Some(Redirect::HereDoc { strip_tabs }) => self.current.heredocs.push((text, strip_tabs)),
            Some(Redirect::HereString) => self.current.stdin = Some(text),
            None => self.current.words.push(Word { text, quoted }),
        }
    }

    fn finish_command(&mut self) {
        self.finish_word();
        self.redirect = None;
        let mut command = std::mem::take(&mut self.current);
        if command.words.is_empty()
            && command.nested.is_empty()
            && command.heredocs.is_empty()
            && command.stdin.is_none()
        {
            return;
        }
        command.piped = std::mem::take(&mut self.next_piped);
        self.commands.push(command);
    }

    /// Reads the bodies of the here-documents opened on the line that just ended.
    fn read_heredocs(&mut self) {
        for index in self.line_start..self.commands.len() {
            let heredocs = std::mem::take(&mut self.commands[index].heredocs);
            for (delimiter, strip_tabs) in heredocs {
                let mut body = String::new();
                while self.i < self.b.len() {
                    let end = self.find(b'\n');
                    let line = String::from_utf8_lossy(&self.b[self.i..end]);
                    self.i = (end + 1).min(self.b.len());
                    let line = line.trim_end_matches('\r');
                    let bare = if strip_tabs {
                        line.trim_start_matches('\t')
                    } else {
                        line
                    };
                    if bare == delimiter {
                        break;
                    }
                    body.push_str(bare);
                    body.push('\n');
                }
                let stdin = &mut self.commands[index].stdin;
                match stdin {
                    Some(s) => s.push_str(&body),
                    None => *stdin = Some(body),
                }
            }
        }
        self.line_start = self.commands.len();
    }
}

#[cfg(test)]
mod tests;
