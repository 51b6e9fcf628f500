//! The integrity guard: finds, in the commands and tool calls an agent produced, the ones that read the
//! answer from the repository's future (history beyond `HEAD`, reflogs and unreachable objects, objects
//! named by hash, remote-tracking refs, upstream fetches, code hosts over the network).
//!
//! Rules are data ([`RuleSpec`]): the built-in ones ([`DEFAULT_RULES_YAML`]) and a run's own, compiled
//! into a [`RuleSet`]. A [`Scanner`] scans one trajectory's shell commands, argument vectors, tool calls
//! and assistant text in order, unwrapping what hides a command (shell `-c` strings, `env`, `sudo` and
//! other wrappers, here-documents, pipes into a shell, aliases, variables, git's global options and
//! aliases, Python and Node subprocess calls) and reports each [`Hit`] with its rule and the command it
//! matched. Scanning is linear in the text: one lexing pass per nesting level (at most
//! [`scan::MAX_DEPTH`]), a work budget proportional to the input, and `regex` sets, which are linear.
//!
//! What it deliberately does not do: it runs nothing and reads no repository, so it judges text alone; it
//! does not know which refs or objects an image holds, nor whether a command succeeded (see
//! `docs/integrity-guard.md` for what follows from that). It holds no policy: what a hit costs is the caller's
//! setting. It depends on no other workspace crate, so the proxy, the config loader and the command line
//! all use the same rules.
//!
//! Entry points: [`RuleSet::builtin`], [`RuleSet::assemble`] (built-ins less disabled ones plus user
//! rules, every problem reported at once), [`Scanner::new`], then [`Scanner::scan_command`],
//! [`Scanner::scan_argv`], [`Scanner::scan_tool_call`] and [`Scanner::scan_text`]; [`corpus`] scores a
//! rule set on a labelled corpus.

mod code;
pub mod corpus;
mod error;
mod rules;
pub mod scan;
mod shell;

pub use error::{Error, Problem, Result};
pub use rules::{DEFAULT_RULES_YAML, RuleSet, RuleSpec, default_rule_specs};
pub use scan::{Hit, Scanner};
