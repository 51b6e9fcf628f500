//! `arena-rl eval`: a checkpoint evaluated on Arena tasks, with pass rates, Wilson intervals, pass@k and a
//! comparison against a baseline checkpoint.
//!
//! [`stats`] holds the figures and nothing else.

pub mod stats;
