//! Integration tests: the real client against `arena-sim` over loopback sockets.
//!
//! Numbers in test names and comments refer to `shared/spec/arena-reference.md` section 8.

mod dataset;
mod lifecycle;
mod preflight;
mod registry;
mod renewal;
mod retries;
mod secrets;
mod soak;
mod streams;
mod support;
mod tasks;
