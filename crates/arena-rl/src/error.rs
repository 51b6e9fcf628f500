//! The failures a run can meet, each one line that names what to fix and never a secret.
//!
//! The variants a user meets at setup or resume have their own names (Arena unreachable, no healthy stream,
//! the proxy port taken, a checkpoint of another model, a journal that cannot be written or was cut); the
//! other crates' errors are carried with what the loop was doing when they happened.

use std::net::SocketAddr;
use std::path::PathBuf;

/// An error of the training loop, the rollout workflow or their set-up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The run config failed to load or validate.
    #[error("{0}")]
    Config(#[from] stream_config::Error),
    /// A setting, input or state that cannot work; the message names the field or value.
    #[error("{0}")]
    Invalid(String),
    /// Arena did not answer at all (connection refused, DNS, every retry a transport failure).
    #[error("cannot reach Arena at {base}: {source}")]
    ArenaUnreachable {
        /// `econfig.arena_base_url`.
        base: String,
        /// The last failure.
        source: arena_client::Error,
    },
    /// Arena refused every configured stream.
    #[error("every stream is unhealthy: {}", .0.join("; "))]
    NoHealthyStream(Vec<String>),
    /// A stream's live reward ref is not the one the config pins (reference section 2.5).
    #[error("stream {stream} ({stream_id}) reward_ref drifted: {drift}")]
    RewardRefDrifted {
        /// The stream's name.
        stream: String,
        /// Its id.
        stream_id: String,
        /// Pinned and live.
        drift: Box<stream_config::RewardRefDrift>,
    },
    /// The rollout proxy could not listen.
    #[error(
        "cannot start the rollout proxy on {addr} (proxy.host, proxy.port): {reason}; is the port taken by another process?"
    )]
    ProxyPort {
        /// The address it tried.
        addr: SocketAddr,
        /// Why it failed.
        reason: String,
    },
    /// The newest checkpoint belongs to another model than `model.path`.
    #[error(
        "checkpoint {} was saved from another model ({saved_from}) than model.path {}; use a new trial_name or checkpoint.dir",
        checkpoint.display(),
        model.display()
    )]
    CheckpointOfAnotherModel {
        /// The checkpoint.
        checkpoint: PathBuf,
        /// The model folder it was saved from.
        saved_from: String,
        /// `model.path`.
        model: PathBuf,
    },
    /// The journal is shorter than when the checkpoint being resumed was written.
    #[error(
        "the journal {} holds {now} bytes in segment {segment}, fewer than the {saved} it held when \
         checkpoint {} was saved: it was truncated, replaced or retired, and the rollouts that checkpoint \
         resumes with are gone",
        path.display(),
        checkpoint.display()
    )]
    JournalTruncated {
        /// The journal.
        path: PathBuf,
        /// The segment the checkpoint names.
        segment: u32,
        /// Its size now.
        now: u64,
        /// Its size when the checkpoint was written.
        saved: u64,
        /// The checkpoint.
        checkpoint: PathBuf,
    },
    /// The journal cannot be read, written or synced: the run cannot promise durability, so it stops.
    #[error("cannot {action} the journal {}: {source}", path.display())]
    Journal {
        /// The journal (or its directory).
        path: PathBuf,
        /// What failed (`open`, `append to`, ...).
        action: &'static str,
        /// The failure.
        source: std::io::Error,
    },
    /// A complete journal line does not parse.
    #[error("the journal {} is corrupt at byte {at}: {message}; refusing to resume from it", path.display())]
    JournalCorrupt {
        /// The journal.
        path: PathBuf,
        /// The offset of the bad line.
        at: u64,
        /// The parse error.
        message: String,
    },
    /// A journaled rollout or draw is of another row than the run draws for it now: the rows, the dataset
    /// settings or the run's name changed since the journal was written.
    #[error(
        "the journal {} holds {what} {key} for row {journaled}, but this run draws row {drawn} there: the \
         dataset, train_dataset or rollout settings changed since it was written; use a new trial_name",
        path.display()
    )]
    JournalMismatch {
        /// The journal.
        path: PathBuf,
        /// `rollout` or `draw`.
        what: &'static str,
        /// The sample or group.
        key: String,
        /// The journaled `stream/data_id`.
        journaled: String,
        /// What the run draws now.
        drawn: String,
    },
    /// The rollout proxy's control endpoints failed.
    #[error("{0}")]
    Control(#[from] crate::proxy_control::ControlError),
    /// A file system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The failure.
        source: std::io::Error,
    },
    /// An Arena call failed.
    #[error("{context}: {source}")]
    Arena {
        /// What was being done.
        context: String,
        /// The failure.
        source: arena_client::Error,
    },
    /// The rollout proxy (or an inference engine behind it) failed.
    #[error("{context}: {source}")]
    Proxy {
        /// What was being done.
        context: String,
        /// The failure.
        source: rollout_proxy::Error,
    },
    /// The trainer failed.
    #[error("{context}: {source}")]
    Trainer {
        /// What was being done.
        context: String,
        /// The failure.
        source: trainer::Error,
    },
    /// The FSDP2 trainer (its worker, or the protocol to it) failed; the message names the rank and step.
    #[error("{context}: {source}")]
    Fsdp2 {
        /// What was being done.
        context: String,
        /// The failure.
        source: fsdp2_trainer::Error,
    },
    /// reward-routing refused its input.
    #[error("{context}: {source}")]
    Reward {
        /// What was being done.
        context: String,
        /// The failure.
        source: reward_routing::Error,
    },
    /// JSON that the loop reads or writes.
    #[error("{context}: {source}")]
    Json {
        /// What was being done.
        context: String,
        /// The failure.
        source: serde_json::Error,
    },
    /// A library without an error type of its own (tokenizers, an HTTP client) failed.
    #[error("{context}: {message}")]
    Failed {
        /// What was being done.
        context: String,
        /// What it reported.
        message: String,
    },
    /// A blocking or spawned task panicked or was cancelled.
    #[error("{0} panicked or was cancelled")]
    Panicked(String),
    /// Another error, with what the loop was doing.
    #[error("{context}: {inner}")]
    Context {
        /// What was being done.
        context: String,
        /// The error.
        inner: Box<Error>,
    },
}

/// The result type of `arena-rl`'s library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The error under any [`Error::Context`] wrappers.
    pub fn root(&self) -> &Error {
        match self {
            Self::Context { inner, .. } => inner.root(),
            other => other,
        }
    }

    /// A library failure without a typed error, with what was being done.
    pub fn failed(context: impl Into<String>, message: impl std::fmt::Display) -> Self {
        Self::Failed {
            context: context.into(),
            message: message.to_string(),
        }
    }
}

/// Errors that can be given the context of what the loop was doing.
pub trait WithContext {
    /// This error, in `context`.
    fn in_context(self, context: String) -> Error;
}

macro_rules! with_context {
    ($($ty:ty => $variant:ident),* $(,)?) => {$(
        impl WithContext for $ty {
            fn in_context(self, context: String) -> Error {
                Error::$variant { context, source: self }
            }
        }
    )*};
}

with_context! {
    std::io::Error => Io,
    arena_client::Error => Arena,
    rollout_proxy::Error => Proxy,
    trainer::Error => Trainer,
    fsdp2_trainer::Error => Fsdp2,
    reward_routing::Error => Reward,
    serde_json::Error => Json,
}

impl WithContext for Error {
    fn in_context(self, context: String) -> Error {
        Error::Context {
            context,
            inner: Box::new(self),
        }
    }
}

impl WithContext for rollout_proxy::EngineError {
    fn in_context(self, context: String) -> Error {
        Error::Proxy {
            context,
            source: rollout_proxy::Error::Engine(self),
        }
    }
}

impl WithContext for reqwest::Error {
    fn in_context(self, context: String) -> Error {
        Error::failed(context, self)
    }
}

impl WithContext for crate::proxy_control::ControlError {
    fn in_context(self, context: String) -> Error {
        Error::from(self).in_context(context)
    }
}

impl WithContext for tokio::task::JoinError {
    fn in_context(self, context: String) -> Error {
        Error::Panicked(context)
    }
}

impl WithContext for stream_config::Error {
    fn in_context(self, context: String) -> Error {
        Error::from(self).in_context(context)
    }
}

/// What was being done, added to a typed result (`.context(..)` and `.with_context(|| ..)`).
pub trait Context<T> {
    /// Adds what was being done.
    fn context(self, context: impl Into<String>) -> Result<T>;
    /// Adds what was being done, computed only on failure.
    fn with_context<C: Into<String>>(self, context: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: WithContext> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl Into<String>) -> Result<T> {
        self.map_err(|e| e.in_context(context.into()))
    }

    fn with_context<C: Into<String>>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| e.in_context(context().into()))
    }
}

#[cfg(test)]
mod tests;
