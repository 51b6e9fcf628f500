//! The crate's errors: each is one line for the user, naming the worker's rank and step when known, and
//! never the key.

use std::path::PathBuf;

use crate::protocol::{ErrorKind, RemoteError};

/// What went wrong talking to, or running, the FSDP2 worker.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The worker answered with a typed error (in an HTTP answer or a failed operation).
    #[error("{0}")]
    Remote(RemoteError),
    /// The worker's process group exited while a call was outstanding.
    #[error(
        "fsdp2 trainer{}{}: a rank was lost: the worker exited ({status}) during {call}{}",
        rank.map(|r| format!(", rank {r}")).unwrap_or_default(),
        step.map(|s| format!(", step {s}")).unwrap_or_default(),
        log.as_ref().map(|l| format!("; see {}", l.display())).unwrap_or_default()
    )]
    RankLost {
        /// The call that was outstanding.
        call: String,
        /// How the process group ended.
        status: String,
        /// The first rank that failed, when torchrun said.
        rank: Option<u32>,
        /// The step that was running, when one was.
        step: Option<u64>,
        /// The worker's log.
        log: Option<PathBuf>,
    },
    /// The worker could not be reached, or its connection broke.
    #[error("fsdp2 trainer at {addr}: {call}: {source}")]
    Transport {
        addr: String,
        call: String,
        #[source]
        source: Box<ureq::Error>,
    },
    /// The worker's answer breaks the protocol (an unreadable body, another version, a wrong step).
    #[error("fsdp2 trainer: protocol error: {0}")]
    Protocol(String),
    /// What the worker reports does not match what this side expects (protocol, model).
    #[error("fsdp2 trainer: {what} differs: the worker has {theirs}, this run expects {ours}")]
    Mismatch {
        what: &'static str,
        ours: String,
        theirs: String,
    },
    /// A batch that cannot be written as given.
    #[error("fsdp2 trainer batch: {0}")]
    Batch(String),
    /// A file could not be read or written.
    #[error("fsdp2 trainer: {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The worker could not be started.
    #[error("fsdp2 trainer: cannot start `{command}`: {source}")]
    Launch {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// A launch setting that cannot work.
    #[error("fsdp2 trainer: {0}")]
    Config(String),
    /// The worker did not become ready in time.
    #[error("fsdp2 trainer: {0}")]
    Timeout(String),
}

impl Error {
    /// The protocol's kind of this error, where it has one.
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            Self::Remote(e) => Some(e.kind),
            Self::RankLost { .. } => Some(ErrorKind::RankLost),
            Self::Protocol(_) | Self::Mismatch { .. } => Some(ErrorKind::Protocol),
            Self::Batch(_) => Some(ErrorKind::Batch),
            _ => None,
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}

/// The crate's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
