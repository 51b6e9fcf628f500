//! The policy that arena-rl serves and trains, in burn.
//!
//! This crate will hold the Llama-family model that loads Hugging Face checkpoints, batched generation with a
//! KV cache, the GRPO training step, the optimizer and checkpoints.
//! It is the only crate that depends on burn, and it depends on no other workspace crate.
