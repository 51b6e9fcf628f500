//! Shared helpers: fixtures, a proxy on a loopback port with a fake engine, and a small HTTP client.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rollout_proxy::{
    ChatModel, ExportedSession, FakeEngine, FakeEngineConfig, ProxyConfig, ProxyServer, ProxyState,
};
use secrecy::SecretString;
use serde_json::{Value, json};

pub(crate) const ADMIN: &str = "it-admin-key";

/// A fixture path from the environment, or a failure that says how to get it.
pub(crate) fn fixture(var: &str) -> PathBuf {
    match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => {
            panic!("{var} is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first")
        }
    }
}

/// Runs `script` in the clients virtualenv's Python with `args`; answers the JSON it prints.
pub(crate) async fn python(script: &str, args: &[&str]) -> Value {
    let python = fixture("ARENA_RL_PY_CLIENTS");
    let mut command = std::process::Command::new(python);
    command.arg("-c").arg(script).args(args);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("joins")
        .expect("python runs");
    assert!(
        output.status.success(),
        "the SDK script failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "the script prints JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

/// The SmolLM2 model folder's tokenizer and template, loaded once.
pub(crate) fn model() -> Arc<ChatModel> {
    static MODEL: OnceLock<Arc<ChatModel>> = OnceLock::new();
    MODEL
        .get_or_init(|| Arc::new(ChatModel::from_dir(fixture("ARENA_RL_SMOLLM2")).expect("SmolLM2 loads")))
        .clone()
}

/// Token ids of `text` under the SmolLM2 tokenizer.
pub(crate) fn tokens(text: &str) -> Vec<u32> {
    model().tokenizer.encode(text).expect("encodes")
}

/// The end-of-turn token SmolLM2 samples.
pub(crate) fn eos() -> u32 {
    model().stop_token_ids[0]
}

/// `text` followed by the end-of-turn token: what a scripted turn samples.
pub(crate) fn turn(text: &str) -> Vec<u32> {
    let mut t = tokens(text);
    t.push(eos());
    t
}

pub(crate) fn engine_config() -> FakeEngineConfig {
    FakeEngineConfig {
        vocab: 200..5000,
        eos_token: Some(eos()),
        max_context_len: 4096,
        ..FakeEngineConfig::default()
    }
}

pub(crate) fn config() -> ProxyConfig {
    let mut c = ProxyConfig::new(SecretString::from(ADMIN));
    c.capacity_grants = true;
    c
}

pub(crate) struct Proxy {
    pub(crate) server: ProxyServer,
    pub(crate) state: ProxyState,
    pub(crate) engine: Arc<FakeEngine>,
}

impl Proxy {
    pub(crate) async fn start(config: ProxyConfig, engine: FakeEngineConfig) -> Self {
        let engine = Arc::new(FakeEngine::new(engine));
        let state = ProxyState::new(config, model(), engine.clone()).expect("state");
        let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let server = ProxyServer::start(addr, state.clone()).await.expect("listens");
        Self {
            server,
            state,
            engine,
        }
    }

    /// A proxy served on `listener`, bound by the caller with its own socket options.
    pub(crate) fn start_on(
        listener: tokio::net::TcpListener,
        config: ProxyConfig,
        engine: FakeEngineConfig,
    ) -> Self {
        let engine = Arc::new(FakeEngine::new(engine));
        let state = ProxyState::new(config, model(), engine.clone()).expect("state");
        let server = ProxyServer::start_on(listener, state.clone()).expect("serves");
        Self {
            server,
            state,
            engine,
        }
    }

    pub(crate) async fn default() -> Self {
        Self::start(config(), engine_config()).await
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.local_addr())
    }

    pub(crate) async fn admin(&self, path: &str, body: Value) -> Response {
        call(
            Method::POST,
            &self.url(path),
            &[("authorization", &format!("Bearer {ADMIN}"))],
            Some(body),
        )
        .await
    }

    /// Grants capacity and starts a session; answers (session id, key).
    pub(crate) async fn session(&self, task: &str) -> (String, String) {
        assert_eq!(
            self.admin("/grant_capacity", json!({})).await.status,
            StatusCode::OK
        );
        let r = self.admin("/rl/start_session", json!({"task_id": task})).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let v = r.json();
        (
            v["session_id"].as_str().expect("id").into(),
            v["api_key"].as_str().expect("key").into(),
        )
    }

    pub(crate) async fn chat(&self, key: &str, body: Value) -> Response {
        call(
            Method::POST,
            &self.url("/v1/chat/completions"),
            &[("authorization", &format!("Bearer {key}"))],
            Some(body),
        )
        .await
    }

    /// `POST /v1/messages` with the session key in `x-api-key`, as the Anthropic SDK sends it.
    pub(crate) async fn messages(&self, key: &str, body: Value) -> Response {
        call(
            Method::POST,
            &self.url("/v1/messages"),
            &[("x-api-key", key), ("anthropic-version", "2023-06-01")],
            Some(body),
        )
        .await
    }

    /// `POST /v1/responses` with the session key as a bearer token.
    pub(crate) async fn responses(&self, key: &str, body: Value) -> Response {
        call(
            Method::POST,
            &self.url("/v1/responses"),
            &[("authorization", &format!("Bearer {key}"))],
            Some(body),
        )
        .await
    }

    pub(crate) async fn end(&self, key: &str) -> Response {
        call(
            Method::POST,
            &self.url("/rl/end_session"),
            &[("authorization", &format!("Bearer {key}"))],
            Some(json!({})),
        )
        .await
    }

    pub(crate) async fn export(&self, session: &str, style: &str) -> ExportedSession {
        let r = self
            .admin(
                "/export_trajectories",
                json!({"session_id": session, "style": style}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        serde_json::from_str(&r.text).expect("export parses")
    }
}

pub(crate) struct Response {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) text: String,
}

impl Response {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// One HTTP request with a JSON body.
pub(crate) async fn call(
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Response {
    let mut request = Request::builder().method(method).uri(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let body = match body {
        Some(b) => {
            request = request.header("content-type", "application/json");
            Bytes::from(b.to_string())
        }
        None => Bytes::new(),
    };
    let response = client()
        .request(request.body(Full::new(body)).expect("request"))
        .await
        .expect("sends");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    Response {
        status,
        headers,
        text: String::from_utf8(bytes.to_vec()).expect("utf-8 body"),
    }
}

/// Replaces ids and timestamps so wire JSON can be snapshotted.
pub(crate) fn redact(text: &str) -> String {
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        let mut l = line.to_string();
        for (field, placeholder) in [
            ("\"id\":\"", "[id]"),
            ("\"created\":", "0"),
            ("\"created_at\":", "0"),
            ("\"item_id\":\"", "[id]"),
            ("\"call_id\":\"", "[id]"),
            ("\"signature\":\"arena-rl:", "[id]"),
        ] {
            let mut from = 0;
            while let Some(pos) = l[from..].find(field) {
                let start = from + pos + field.len();
                let rest = &l[start..];
                let end = rest
                    .find(|c: char| {
                        if placeholder == "0" {
                            !c.is_ascii_digit()
                        } else {
                            c == '"'
                        }
                    })
                    .unwrap_or(rest.len());
                l.replace_range(start..start + end, placeholder);
                from = start + placeholder.len();
            }
        }
        out.push_str(&l);
    }
    out
}

/// The router (no socket) on a fresh fake engine, capacity grants off, pinging after `ping` of silence.
pub(crate) fn oneshot_state(
    engine: FakeEngine,
    ping: Duration,
) -> (ProxyState, Arc<FakeEngine>, axum::Router) {
    oneshot_with(engine, ping, model())
}

/// Like [`oneshot_state`] with another model.
pub(crate) fn oneshot_with(
    engine: FakeEngine,
    ping: Duration,
    model: Arc<rollout_proxy::ChatModel>,
) -> (ProxyState, Arc<FakeEngine>, axum::Router) {
    let mut c = config();
    c.capacity_grants = false;
    c.ping_interval = ping;
    let engine = Arc::new(engine);
    let state = ProxyState::new(c, model, engine.clone()).expect("state");
    let app = rollout_proxy::router(state.clone());
    (state, engine, app)
}

/// One request through the router.
pub(crate) async fn post(
    app: &axum::Router,
    path: &str,
    key: &str,
    body: Value,
) -> http::Response<axum::body::Body> {
    use tower::ServiceExt;
    let request = http::Request::post(path)
        .header("authorization", format!("Bearer {key}"))
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .expect("request");
    app.clone().oneshot(request).await.expect("answers")
}

/// Starts a session through the router; answers its key.
pub(crate) async fn start(app: &axum::Router) -> String {
    let r = post(app, "/rl/start_session", ADMIN, json!({"task_id": "t"})).await;
    let body = http_body_util::BodyExt::collect(r.into_body())
        .await
        .expect("body")
        .to_bytes();
    let v: Value = serde_json::from_slice(&body).expect("json");
    v["api_key"].as_str().expect("key").to_string()
}

/// Reads an SSE body frame by frame, as a client sees it arrive.
pub(crate) async fn frames(response: http::Response<axum::body::Body>) -> Vec<String> {
    use http_body_util::BodyExt;
    let mut body = response.into_body();
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.expect("frame").into_data() {
            out.push(String::from_utf8(data.to_vec()).expect("utf-8 frame"));
        }
    }
    out
}

/// Resident memory of this process, in bytes (the proxy and its clients).
pub(crate) fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reads /proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS in kB")
        * 1024
}
