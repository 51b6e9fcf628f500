//! A real Arena on loopback, for tests, examples and benches.
//!
//! This crate will serve Arena's OpenAPI control plane and LLM gateway over real sockets, run harnesses and
//! graders, and inject faults, so that every test drives the real client over real HTTP.
