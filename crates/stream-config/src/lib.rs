//! Everything about an arena-rl run's configuration and its Arena Streams, with no network and no async.
//!
//! This crate owns the one config format of the project and the vocabulary that crates which may not depend
//! on each other must share ([`LlmProtocol`], [`RouteMode`], [`TaskStatus`]).
//! It does not talk to Arena, spawn tasks or read the process environment except through the one place that
//! config loading reads it.

mod error;
mod vocab;

pub use error::{Error, Result};
pub use vocab::{LlmProtocol, RouteMode, TaskStatus};
