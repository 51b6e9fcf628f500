//! The `arena-rl` binary, run as a user runs it.

mod config;
mod dispositions;
mod episode_reward;
mod errors;
mod eval;
mod fsdp2;
mod grpo;
mod guard;
mod integrity;
mod journal_full;
mod kill_resume;
mod lease;
mod loop_e2e;
mod model;
mod preflight;
mod proxy;
mod quickstart;
mod serve_policy;
mod smollm2;
mod support;
mod trackers;
