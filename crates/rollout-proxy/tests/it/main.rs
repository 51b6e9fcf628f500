//! Integration tests of the rollout proxy over real loopback sockets, with the SmolLM2 tokenizer and chat
//! template from the test fixtures (`ARENA_RL_SMOLLM2`) and the real `openai` SDK (`ARENA_RL_PY_CLIENTS`).

mod chat;
mod common;
mod messages;
mod multiturn;
mod openai_sdk;
mod responses;
mod sessions;
mod sglang;
