//! Integration tests for the trainer crate: parity with transformers, the real SmolLM2 checkpoint, the
//! generation engine's behaviour, checkpoints that round-trip through transformers, and training (learning,
//! exact resume, killed checkpoint writers).

mod engine;
mod parity;
mod roundtrip;
mod smollm2;
mod support;
mod train;
