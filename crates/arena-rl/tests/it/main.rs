//! The `arena-rl` binary, run as a user runs it.

mod config;
mod model;
mod preflight;
mod proxy;
