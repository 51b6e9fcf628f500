//! Integration tests for the trainer crate: parity with transformers, the real SmolLM2 checkpoint, the
//! generation engine's behaviour, and checkpoints that round-trip through transformers.

mod engine;
mod parity;
mod roundtrip;
mod smollm2;
mod support;
