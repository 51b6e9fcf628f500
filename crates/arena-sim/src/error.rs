//! The error type of `arena-sim`: loading a world and binding a socket (serving never fails a caller).

use std::net::SocketAddr;
use std::path::PathBuf;

/// An error starting a sim.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The world file could not be read.
    #[error("cannot read world file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The world does not parse or breaks a rule; the message names every problem.
    #[error("invalid world: {0}")]
    World(String),
    /// The socket could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// The result type of `arena-sim`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
