//! The Rust side of the FSDP2 trainer: the `arena-rl-trainer/1` protocol (`docs/trainer-protocol.md`), a
//! blocking client for it, the batch file each step reads, and the launcher that starts the Python worker
//! (`worker/`, package `arena_rl_fsdp2`) under `torchrun --standalone` on one machine.
//!
//! It knows nothing of Arena, rewards or the burn trainer: a batch arrives with its advantages and
//! aggregation weights computed, and the training settings travel as the caller's JSON. `arena-rl` adapts
//! it to its training seam. It deliberately does no training itself, serves nothing, and holds no async
//! runtime: every call blocks the calling thread until the worker answers.
//!
//! Entry points: [`Worker::launch`] (start the worker and own its process group) or [`Client::new`]
//! (attach to a running one), then [`Client::hello`], [`Client::init`], [`Client::step`],
//! [`Client::publish`], [`Client::save`] and [`Client::load`]; [`Batch::write`] writes a step's input.

mod batch;
mod client;
mod error;
mod launch;
pub mod protocol;

pub use batch::{Batch, Sequence, sha256_hex};
pub use client::{Attached, Client, Watch, model_info};
pub use error::{Error, Result};
pub use launch::{API_KEY_ENV, Group, LaunchConfig, Worker, api_key};
pub use protocol::{ErrorKind, PROTOCOL, Range, RemoteError, Stats, StepKind};
