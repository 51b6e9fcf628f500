//! The error type of `integrity-guard`: rules that cannot be compiled, every problem at once.

use std::fmt;

/// One problem with a rule: where (`rules[2].any_arg[0]`, relative to the list the rules came from) and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The path of the offending value, relative to the rule list.
    pub path: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// What can go wrong when building a rule set.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Rules that cannot be used, every problem found.
    #[error("invalid integrity rules: {}", join(.0))]
    InvalidRules(Vec<Problem>),
}

fn join(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
