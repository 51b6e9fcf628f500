//! The error type of `stream-config`.

/// An error from loading, validating or mixing configuration.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value that parsed but breaks a rule; the message names the field and the value.
    #[error("{0}")]
    Invalid(String),
}

/// The result type of `stream-config`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
