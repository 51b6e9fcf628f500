//! The trainer's error type: what went wrong, with the file, field or tensor it concerns.

use std::path::PathBuf;

/// Everything that can fail in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file of a model folder could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON file (config, index) is not valid JSON or has the wrong shape.
    #[error("{path}: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// `config.json` asks for something this implementation does not compute.
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    /// A safetensors file is malformed, or its tensors do not fit the config.
    #[error("{path}: {message}")]
    Weights { path: PathBuf, message: String },
    /// A set of parameters does not fit the model it is installed into.
    #[error("weights do not fit the model: {0}")]
    WeightMismatch(String),
    /// A generation request is invalid (empty prompt, token out of range, bad sampling parameter).
    #[error("invalid generation request: {0}")]
    Request(String),
    /// A policy option is out of range for the model (the message names the option and the value).
    #[error("invalid policy options: {0}")]
    Options(String),
    /// The inference engine has stopped (its thread ended or panicked).
    #[error("the inference engine has stopped")]
    EngineStopped,
    /// The requested compute device is not available in this build.
    #[error("device {0} is not available: {1}")]
    Device(String, String),
    /// A training setting is out of range (the message names the field and the value).
    #[error("invalid training config: {0}")]
    TrainConfig(String),
    /// A training batch is malformed (the message names the sequence, the field and the value).
    #[error("invalid training batch: {0}")]
    Batch(String),
    /// A checkpoint could not be written or read back.
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: PathBuf, message: String },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            action,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn config(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Config {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn checkpoint(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Checkpoint {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn weights(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Weights {
            path: path.into(),
            message: message.into(),
        }
    }
}
