//! Async client for Arena's OpenAPI control plane.
//!
//! This crate will hold the typed endpoints (streams, datasets, task launch and polling, LLM routes),
//! the retry policy, the session-gateway route registry and preflight.
//! It speaks HTTP as a client only; it never serves, and it knows nothing about models or training.
