//! The error type of `stream-config`.
//!
//! Every message names the offending file, key path, stream, field or value, and never a secret.

use std::fmt;
use std::path::PathBuf;

/// An error from loading, validating or mixing configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value that parsed but breaks a rule; the message names the field and the value.
    #[error("{0}")]
    Invalid(String),
    /// Every rule a parsed config breaks, reported at once.
    #[error("{0}")]
    Problems(Problems),
    /// Text that is not YAML (or not base64, or not UTF-8); `origin` is `file:line:column` when known.
    #[error("{origin}: {message}")]
    Syntax {
        /// The file (and line and column) of the mistake.
        origin: String,
        /// What is wrong there.
        message: String,
    },
    /// A value of the wrong type for its field, or a field the schema does not know.
    #[error("{origin}: {path}: {message}")]
    Type {
        /// Where the value came from: `file:line:column`, an environment variable or a command-line override.
        origin: String,
        /// The key path of the value, e.g. `econfig.arena_request_retries`.
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// A file that could not be read.
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl Error {
    /// The individual problems of a [`Error::Problems`]; a one-element list for any other error.
    pub fn problems(&self) -> Vec<Problem> {
        match self {
            Error::Problems(p) => p.0.clone(),
            other => vec![Problem {
                path: String::new(),
                message: other.to_string(),
                origin: None,
            }],
        }
    }
}

/// One broken rule: the key path of the value, what is wrong, and where the value was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// Key path of the offending value, e.g. `econfig.arena_streams[1].sampling_weight`.
    pub path: String,
    /// What is wrong, naming the stream and the value.
    pub message: String,
    /// `file:line:column`, an environment variable or an override, when known.
    pub origin: Option<String>,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(origin) = &self.origin {
            write!(f, "{origin}: ")?;
        }
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// A non-empty list of [`Problem`]s, displayed on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problems(pub Vec<Problem>);

impl Problems {
    /// The problems, in the order they were found.
    pub fn iter(&self) -> impl Iterator<Item = &Problem> {
        self.0.iter()
    }

    /// How many problems there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Never true for a `Problems` inside an [`Error`].
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_slice() {
            [one] => write!(f, "{one}"),
            many => {
                write!(f, "{} problems: ", many.len())?;
                for (i, p) in many.iter().enumerate() {
                    if i > 0 {
                        f.write_str("; ")?;
                    }
                    write!(f, "({}) {p}", i + 1)?;
                }
                Ok(())
            }
        }
    }
}

/// Collects problems while validating, then turns them into one error.
#[derive(Debug, Default)]
pub(crate) struct Collector {
    problems: Vec<Problem>,
}

impl Collector {
    pub(crate) fn push(&mut self, path: impl fmt::Display, message: impl Into<String>) {
        self.problems.push(Problem {
            path: path.to_string(),
            message: message.into(),
            origin: None,
        });
    }

    pub(crate) fn extend(&mut self, problems: impl IntoIterator<Item = Problem>) {
        self.problems.extend(problems);
    }

    pub(crate) fn into_problems(self) -> Vec<Problem> {
        self.problems
    }

    /// `Ok(value)` when nothing was collected, else every problem in one error.
    pub(crate) fn finish<T>(self, value: T) -> Result<T> {
        if self.problems.is_empty() {
            Ok(value)
        } else {
            Err(Error::Problems(Problems(self.problems)))
        }
    }
}

/// The result type of `stream-config`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
