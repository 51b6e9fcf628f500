//! Integration tests of `arena-sim` over real sockets: YAML worlds and the binary, the LLM gateway, the
//! harnesses that call a model or run a CLI (the real Claude Code CLI among them), and the quickstart's world.
//!
//! The control plane's contract is tested at length in `arena-client`'s tests, which run against this sim.

mod agent_cli;
mod binary;
mod command;
mod gateway;
mod harnesses;
mod hostile;
mod preset;
mod support;
mod world;
