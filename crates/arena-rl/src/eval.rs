//! `arena-rl eval`: a checkpoint evaluated on Arena tasks, with pass rates, Wilson intervals, pass@k and a
//! comparison against a baseline checkpoint.
//!
//! [`manifest`] says which tasks run (the reference's selection rules and messages); [`stats`] holds the
//! figures and nothing else; [`results`] is the per-sample `results.jsonl`; [`report`] the terminal table and
//! the metric records; [`plot`] the PNG. The run itself is [`crate::run::evaluate`]: the rollout workflow of
//! training, each task `k` times, journaled, so an interrupted evaluation resumes without running a task
//! twice.

pub mod manifest;
pub mod plot;
pub mod report;
pub mod results;
pub mod stats;
