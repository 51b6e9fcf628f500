//! Shared helpers: a sim with a registered route, the real rollout proxy on a fake engine, and a minimal
//! protocol-correct model server ("upstream") that records what it receives and answers scripted turns in
//! Anthropic Messages, Responses or Chat Completions, streamed as server-sent events when asked.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use arena_client::{ArenaClient, ClientConfig, RetryPolicy};
use arena_sim::{ArenaSim, World};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use futures::channel::mpsc;
use rollout_proxy::{ChatModel, FakeEngine, FakeEngineConfig, ProxyConfig, ProxyServer, ProxyState};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

pub(crate) const TOKEN: &str = "sim-it-token";
pub(crate) const LLM_KEY: &str = "sim-it-llm-key-5b2e";
pub(crate) const UPSTREAM_KEY: &str = "sim-it-upstream-key-91c4";
pub(crate) const ADMIN: &str = "sim-it-proxy-admin";

/// A world with the test token and LLM key.
pub(crate) fn world() -> World {
    World {
        token: TOKEN.to_string(),
        llm_api_key: Some(LLM_KEY.to_string()),
        ..World::default()
    }
}

/// A client with millisecond polling.
pub(crate) fn client(sim: &ArenaSim) -> ArenaClient {
    let mut config = ClientConfig::new(&sim.base_url(), SecretString::from(TOKEN)).expect("valid base URL");
    config.retry = RetryPolicy {
        retries: 0,
        base_delay: std::time::Duration::from_millis(1),
        max_delay: std::time::Duration::from_millis(2),
        jitter: true,
    };
    config.poll_interval = std::time::Duration::from_millis(5);
    ArenaClient::new(config).expect("client builds")
}

pub(crate) fn http() -> reqwest::Client {
    // The sim and the client install this too; a test may call the proxy before starting either.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client builds")
}

/// Registers a route on the sim's control plane, as arena-client does.
pub(crate) async fn register(sim: &ArenaSim, name: &str, base_url: &str, key: &str, protos: &[&str]) {
    let body = json!({
        "model_name": name,
        "endpoints": [{
            "endpoint_id": "d1", "upstream_model": name, "base_url": base_url, "api_key": key,
            "inbound_protos": protos, "enabled": true,
        }],
        "enabled": true,
        "metadata": {"deployment_id": "d1"},
    });
    let r = http()
        .post(format!("{}/openapi/v1/llm/models", sim.base_url()))
        .bearer_auth(TOKEN)
        .json(&body)
        .send()
        .await
        .expect("registration sent");
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap_or_default());
}

/// A fixture path from the environment, or a failure that says how to get it.
pub(crate) fn fixture(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => {
            panic!("{var} is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first")
        }
    }
}

/// The SmolLM2 fixture's tokenizer and chat template, loaded once.
pub(crate) fn model() -> Arc<ChatModel> {
    static MODEL: OnceLock<Arc<ChatModel>> = OnceLock::new();
    MODEL
        .get_or_init(|| Arc::new(ChatModel::from_dir(fixture("ARENA_RL_SMOLLM2")).expect("SmolLM2 loads")))
        .clone()
}

/// The real rollout proxy on a loopback port, generating with a scripted fake engine.
pub(crate) struct Proxy {
    pub(crate) server: ProxyServer,
    pub(crate) state: ProxyState,
    pub(crate) engine: Arc<FakeEngine>,
}

impl Proxy {
    pub(crate) async fn start() -> Self {
        Self::with_context(4096).await
    }

    /// A proxy whose engine takes prompts of up to `max_context_len` tokens.
    pub(crate) async fn with_context(max_context_len: usize) -> Self {
        Self::with_engine(FakeEngineConfig {
            max_context_len,
            ..FakeEngineConfig::default()
        })
        .await
    }

    /// A proxy on a fake engine of `config` (its vocabulary and end-of-turn token set to the model's).
    pub(crate) async fn with_engine(config: FakeEngineConfig) -> Self {
        let model = model();
        let engine = Arc::new(FakeEngine::new(FakeEngineConfig {
            vocab: 200..5000,
            eos_token: model.stop_token_ids.first().copied(),
            ..config
        }));
        let state = ProxyState::new(ProxyConfig::new(SecretString::from(ADMIN)), model, engine.clone())
            .expect("state");
        let server = ProxyServer::start("127.0.0.1:0".parse().expect("addr"), state.clone())
            .await
            .expect("proxy listens");
        Self {
            server,
            state,
            engine,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.server.local_addr())
    }

    /// The next generation samples exactly `text` and the end-of-turn token.
    pub(crate) fn script(&self, text: &str) {
        let model = model();
        let mut tokens = model.tokenizer.encode(text).expect("encodes");
        tokens.extend(model.stop_token_ids.first());
        self.engine.push_script(tokens);
    }

    /// Scripts a Hermes-style `lookup` call.
    pub(crate) fn script_lookup(&self, key: &str) {
        self.script(&format!(
            "<tool_call>\n{{\"name\": \"lookup\", \"arguments\": {{\"key\": \"{key}\"}}}}\n</tool_call>"
        ));
    }

    async fn admin(&self, path: &str, body: Value) -> Value {
        let r = http()
            .post(format!("{}{path}", self.url()))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .await
            .expect("admin call");
        assert!(r.status().is_success(), "{path}: {}", r.status());
        r.json().await.expect("admin JSON")
    }

    /// Grants capacity and starts a session: (session id, session key).
    pub(crate) async fn session(&self, task: &str) -> (String, SecretString) {
        self.admin("/grant_capacity", json!({})).await;
        let v = self.admin("/rl/start_session", json!({"task_id": task})).await;
        (
            v["session_id"].as_str().expect("id").to_string(),
            SecretString::from(v["api_key"].as_str().expect("key").to_string()),
        )
    }

    /// Ends a session; its interaction count.
    pub(crate) async fn end(&self, key: &SecretString) -> u64 {
        self.end_reply(key).await["interaction_count"]
            .as_u64()
            .expect("interaction_count")
    }

    /// Ends a session; `end_session`'s reply.
    pub(crate) async fn end_reply(&self, key: &SecretString) -> Value {
        let r = http()
            .post(format!("{}/rl/end_session", self.url()))
            .bearer_auth(key.expose_secret())
            .json(&json!({}))
            .send()
            .await
            .expect("end_session");
        r.json().await.expect("end JSON")
    }
}

/// One scripted model turn.
#[derive(Debug, Clone)]
pub(crate) enum Reply {
    /// Final text.
    Text(String),
    /// A `lookup` call with this key.
    Lookup(String),
    /// An HTTP error with this body.
    Error(u16, Value),
    /// Never answer.
    Hang,
}

/// A request the upstream received.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) path: String,
    pub(crate) query: Option<String>,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Value,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

#[derive(Default)]
struct UpState {
    replies: Mutex<VecDeque<Reply>>,
    seen: Mutex<Vec<Seen>>,
    /// When set, streams stop after their first event until a permit is added.
    gate: Option<Arc<Semaphore>>,
}

/// A minimal, protocol-correct model server on loopback.
pub(crate) struct Upstream {
    pub(crate) addr: SocketAddr,
    state: Arc<UpState>,
    _server: tokio::task::JoinHandle<()>,
}

impl Upstream {
    pub(crate) async fn start() -> Self {
        Self::with_gate(None).await
    }

    /// An upstream whose streams pause after their first event until `gate` gets a permit.
    pub(crate) async fn gated(gate: Arc<Semaphore>) -> Self {
        Self::with_gate(Some(gate)).await
    }

    async fn with_gate(gate: Option<Arc<Semaphore>>) -> Self {
        let state = Arc::new(UpState {
            gate,
            ..UpState::default()
        });
        let app = Router::new().fallback(answer).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.expect("upstream serves");
        });
        Self {
            addr,
            state,
            _server: server,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn push(&self, reply: Reply) {
        self.state.replies.lock().expect("lock").push_back(reply);
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().expect("lock").clone()
    }
}

async fn answer(State(state): State<Arc<UpState>>, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state.seen.lock().expect("lock").push(Seen {
        path: uri.path().to_string(),
        query: uri.query().map(str::to_string),
        headers,
        body: body.clone(),
    });
    let path = uri.path();
    if path.ends_with("/count_tokens") {
        return axum::Json(json!({"input_tokens": 12})).into_response();
    }
    let reply = state
        .replies
        .lock()
        .expect("lock")
        .pop_front()
        .unwrap_or(Reply::Text("0".to_string()));
    let model = body["model"].as_str().unwrap_or_default().to_string();
    let events = match reply {
        Reply::Hang => {
            futures::future::pending::<()>().await;
            unreachable!("pending never resolves")
        }
        Reply::Error(status, body) => {
            let status = StatusCode::from_u16(status).expect("status");
            return (status, axum::Json(body)).into_response();
        }
        reply if path.ends_with("/messages") => anthropic(&reply, &model),
        reply if path.ends_with("/responses") => responses(&reply),
        reply => return axum::Json(chat(&reply, &model)).into_response(),
    };
    if body["stream"] != json!(true) {
        return (StatusCode::BAD_REQUEST, "this upstream only streams").into_response();
    }
    let (tx, rx) = mpsc::unbounded::<Result<Bytes, std::io::Error>>();
    let gate = state.gate.clone();
    tokio::spawn(async move {
        for (i, (name, data)) in events.into_iter().enumerate() {
            if i == 1
                && let Some(gate) = &gate
            {
                gate.acquire().await.expect("gate open").forget();
            }
            let chunk = format!("event: {name}\ndata: {data}\n\n");
            if tx.unbounded_send(Ok(Bytes::from(chunk))).is_err() {
                return;
            }
        }
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(rx))
        .expect("response")
}

fn anthropic(reply: &Reply, model: &str) -> Vec<(&'static str, Value)> {
    let mut events = vec![(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "usage": {"input_tokens": 10, "output_tokens": 0},
        }}),
    )];
    let stop = match reply {
        Reply::Text(text) => {
            let (a, b) = text.split_at(text.len() / 2);
            events.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
            events.push(("ping", json!({"type": "ping"})));
            for part in [a, b] {
                events.push((
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": part}}),
                ));
            }
            "end_turn"
        }
        Reply::Lookup(key) => {
            events.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": 0, "content_block": {
                    "type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {},
                }}),
            ));
            for part in ["{\"key\": ".to_string(), format!("\"{key}\"}}")] {
                events.push((
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "input_json_delta", "partial_json": part}}),
                ));
            }
            "tool_use"
        }
        Reply::Error(..) | Reply::Hang => unreachable!("answered before"),
    };
    events.push((
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    events.push((
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 5}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events
}

fn responses(reply: &Reply) -> Vec<(&'static str, Value)> {
    let item = match reply {
        Reply::Text(text) => json!({
            "type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }),
        Reply::Lookup(key) => json!({
            "type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "lookup",
            "arguments": format!("{{\"key\":\"{key}\"}}"), "status": "completed",
        }),
        Reply::Error(..) | Reply::Hang => unreachable!("answered before"),
    };
    let mut events = vec![(
        "response.created",
        json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
    )];
    events.push((
        "response.output_item.added",
        json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
    ));
    if let Reply::Text(text) = reply {
        events.push((
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "output_index": 0, "delta": text}),
        ));
    }
    events.push((
        "response.output_item.done",
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
    ));
    events.push((
        "response.completed",
        json!({"type": "response.completed", "response": {
            "id": "resp_1", "status": "completed", "output": [item],
        }}),
    ));
    events
}

fn chat(reply: &Reply, model: &str) -> Value {
    let (message, finish) = match reply {
        Reply::Text(text) => (json!({"role": "assistant", "content": text}), "stop"),
        Reply::Lookup(key) => (
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "lookup", "arguments": format!("{{\"key\": \"{key}\"}}")},
            }]}),
            "tool_calls",
        ),
        Reply::Error(..) | Reply::Hang => unreachable!("answered before"),
    };
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    })
}
