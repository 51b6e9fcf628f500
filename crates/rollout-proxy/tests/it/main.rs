//! Integration tests of the rollout proxy over real loopback sockets, with the SmolLM2 tokenizer and chat
//! template from the test fixtures (`ARENA_RL_SMOLLM2`), the real `openai` SDK (`ARENA_RL_PY_CLIENTS`) and
//! Prometheus' OpenMetrics parser (`ARENA_RL_PY_READERS`).

mod anthropic_sdk;
mod bounds;
mod chat;
mod common;
mod control;
mod flood;
mod fuzz;
mod harness_cli;
mod hostile;
mod integrity;
mod litellm;
mod memory;
mod messages;
mod multiturn;
mod openai_sdk;
mod openmetrics;
mod responses;
mod sampling;
mod sessions;
mod sglang;
mod sglang_pool;
mod sglang_server;
mod values;
