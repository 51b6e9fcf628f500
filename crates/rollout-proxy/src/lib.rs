//! The rollout proxy that harnesses talk to instead of a model provider.
//!
//! This crate will hold the session store and keys, the Chat Completions, Anthropic Messages and Responses
//! protocols, chat templates, tool-call parsing, token-exact trajectory recording, and the `InferenceEngine`
//! trait that the policy is served through.
//! It depends on no other workspace crate.
