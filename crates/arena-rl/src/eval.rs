//! `arena-rl eval`: a checkpoint evaluated on Arena tasks, with pass rates, Wilson intervals, pass@k and a
//! comparison against a baseline checkpoint.
//!
//! [`manifest`] says which tasks run (the reference's selection rules and messages); [`stats`] holds the
//! figures and nothing else.

pub mod manifest;
pub mod stats;
