//! [`Client`]: a blocking client of the worker's protocol, one HTTP/1.1 request at a time.
//!
//! Long calls start an operation and poll it (`GET /v1/ops/<id>`), reporting its progress and asking a
//! [`Watch`] between polls whether the worker is still alive, so a rank that dies while a call is
//! outstanding ends the call with a typed error instead of a hang.

use std::path::Path;
use std::time::{Duration, Instant};

use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::protocol::{
    Accepted, Dtype, Health, Hello, InitRequest, InitResult, LoadResult, Op, OpState, PROTOCOL, PathRequest,
    Progress, PublishRequest, PublishResult, RemoteError, SaveResult, StepKind, StepRequest, StepResult,
};

/// What the client asks between polls of an operation: whether the worker still runs (a launched worker
/// checks its process group), and where progress goes.
pub trait Watch {
    /// `Err` ends the call: the worker is gone. `call` names the call and `step` the step it runs.
    fn alive(&mut self, call: &str, step: Option<u64>) -> Result<()>;
    /// The operation's progress, at each poll.
    fn progress(&mut self, call: &str, progress: &Progress) {
        tracing::trace!(call, phase = %progress.phase, done = progress.done, total = progress.total, "fsdp2 trainer");
    }
}

/// A watch for a worker this process did not start: it cannot see ranks exit, so it trusts the worker's own
/// `rank_lost` errors and the connection.
#[derive(Debug, Default)]
pub struct Attached;

impl Watch for Attached {
    fn alive(&mut self, _call: &str, _step: Option<u64>) -> Result<()> {
        Ok(())
    }
}

/// The longest wait between two polls of an operation.
const MAX_POLL: Duration = Duration::from_millis(100);
/// How long polls may fail in a row before a call ends with the transport error: long enough for torchrun
/// to notice a lost rank, stop the others and exit, which the watch then reports as `rank_lost`.
const TRANSPORT_GRACE: Duration = Duration::from_secs(30);

/// A client of one worker's rank 0.
pub struct Client {
    addr: String,
    key: SecretString,
    agent: ureq::Agent,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the worker listening at `addr` (`HOST:PORT`), sending `key` as its bearer key.
    pub fn new(addr: impl Into<String>, key: SecretString) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build();
        Self {
            addr: addr.into(),
            key,
            agent,
        }
    }

    /// The worker's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn transport(&self, call: &str, e: ureq::Error) -> Error {
        Error::Transport {
            addr: self.addr.clone(),
            call: call.to_string(),
            source: Box::new(e),
        }
    }

    /// Turns an answer into `T`, or its typed error.
    fn answer<T: DeserializeOwned>(&self, call: &str, r: Result<ureq::Response, ureq::Error>) -> Result<T> {
        let response = match r {
            Ok(r) => r,
            Err(ureq::Error::Status(code, r)) => {
                let body = r.into_string().unwrap_or_default();
                return Err(match serde_json::from_str::<RemoteError>(&body) {
                    Ok(e) => Error::Remote(e),
                    Err(_) => Error::Protocol(format!(
                        "{call}: http {code} without a typed error: {}",
                        body.chars().take(200).collect::<String>()
                    )),
                });
            }
            Err(e) => return Err(self.transport(call, e)),
        };
        let body = response
            .into_string()
            .map_err(|e| Error::Protocol(format!("{call}: cannot read the answer: {e}")))?;
        let value: serde_json::Value = serde_json::from_str(&body)
            .map_err(|e| Error::Protocol(format!("{call}: the answer is not JSON: {e}")))?;
        match value.get("protocol").and_then(|p| p.as_str()) {
            Some(PROTOCOL) => {}
            other => {
                return Err(Error::Mismatch {
                    what: "the protocol version",
                    ours: PROTOCOL.to_string(),
                    theirs: other.unwrap_or("none").to_string(),
                });
            }
        }
        serde_json::from_value(value).map_err(|e| Error::Protocol(format!("{call}: unexpected answer: {e}")))
    }

    fn get<T: DeserializeOwned>(&self, call: &str, path: &str) -> Result<T> {
        let bearer = format!("Bearer {}", self.key.expose_secret());
        self.answer(
            call,
            self.agent
                .get(&self.url(path))
                .set("Authorization", &bearer)
                .call(),
        )
    }

    /// `GET /v1/health` (no key needed).
    pub fn health(&self) -> Result<Health> {
        self.answer("health", self.agent.get(&self.url("/v1/health")).call())
    }

    /// `GET /v1/hello`.
    pub fn hello(&self) -> Result<Hello> {
        self.get("hello", "/v1/hello")
    }

    /// `GET /v1/ops/<id>`.
    pub fn op(&self, id: &str) -> Result<Op> {
        self.get("op", &format!("/v1/ops/{id}"))
    }

    /// Starts a long call; returns its operation id.
    pub fn start(&self, call: &str, body: &impl Serialize) -> Result<String> {
        let bearer = format!("Bearer {}", self.key.expose_secret());
        let value = serde_json::to_value(body).map_err(|e| Error::Protocol(format!("{call}: {e}")))?;
        let r = self
            .agent
            .post(&self.url(&format!("/v1/{call}")))
            .set("Authorization", &bearer)
            .send_json(value);
        let accepted: Accepted = self.answer(call, r)?;
        Ok(accepted.op)
    }

    /// Polls operation `id` until it ends; returns its result.
    pub fn wait<T: DeserializeOwned>(
        &self,
        call: &str,
        id: &str,
        step: Option<u64>,
        watch: &mut dyn Watch,
    ) -> Result<T> {
        let mut pause = Duration::from_millis(2);
        let mut failing_since: Option<Instant> = None;
        loop {
            watch.alive(call, step)?;
            match self.op(id) {
                Ok(op) => {
                    failing_since = None;
                    match op.state {
                        OpState::Done => {
                            let result = op.result.unwrap_or(serde_json::Value::Null);
                            return serde_json::from_value(result)
                                .map_err(|e| Error::Protocol(format!("{call}: unexpected result: {e}")));
                        }
                        OpState::Failed => {
                            return Err(match op.error {
                                Some(mut e) => {
                                    e.step = e.step.or(step);
                                    Error::Remote(e)
                                }
                                None => {
                                    Error::Protocol(format!("{call}: operation {id} failed without an error"))
                                }
                            });
                        }
                        OpState::Running => {
                            if let Some(p) = &op.progress {
                                watch.progress(call, p);
                            }
                        }
                    }
                }
                Err(e @ Error::Transport { .. }) => {
                    // A rank that died takes rank 0's server down with it: the watch says so first.
                    watch.alive(call, step)?;
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= TRANSPORT_GRACE {
                        return Err(e);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
            std::thread::sleep(pause);
            pause = (pause * 3 / 2).min(MAX_POLL);
        }
    }

    fn call<T: DeserializeOwned>(
        &self,
        call: &str,
        body: &impl Serialize,
        step: Option<u64>,
        watch: &mut dyn Watch,
    ) -> Result<T> {
        let id = self.start(call, body).map_err(|e| with_step(e, step))?;
        self.wait(call, &id, step, watch)
    }

    /// `init`: loads and shards the model; checks nothing (see [`Client::expect_model`]).
    pub fn init(&self, request: &InitRequest, watch: &mut dyn Watch) -> Result<InitResult> {
        self.call("init", request, None, watch)
    }

    /// `step`: writes `batch` under `path` (inside the run folder) and trains on it.
    pub fn step(&self, batch: &Batch, path: &Path, watch: &mut dyn Watch) -> Result<StepResult> {
        self.step_dumping(batch, path, None, watch)
    }

    /// [`Client::step`], with rank 0 writing the summed gradients before clipping to `gradients`.
    pub fn step_dumping(
        &self,
        batch: &Batch,
        path: &Path,
        gradients: Option<&Path>,
        watch: &mut dyn Watch,
    ) -> Result<StepResult> {
        let sha256 = batch.write(path)?;
        let request = StepRequest {
            protocol: PROTOCOL,
            step: batch.step,
            kind: batch.kind,
            batch: path.to_path_buf(),
            sha256,
            dump_gradients: gradients.map(Path::to_path_buf),
        };
        let result: StepResult = self.call("step", &request, Some(batch.step), watch)?;
        if result.step != batch.step + 1 {
            return Err(Error::Protocol(format!(
                "step {} answered as step {}; expected {}",
                batch.step,
                result.step,
                batch.step + 1
            )));
        }
        Ok(result)
    }

    /// `step` on a batch file already written.
    pub fn step_file(
        &self,
        step: u64,
        kind: StepKind,
        path: &Path,
        sha256: String,
        watch: &mut dyn Watch,
    ) -> Result<StepResult> {
        let request = StepRequest {
            protocol: PROTOCOL,
            step,
            kind,
            batch: path.to_path_buf(),
            sha256,
            dump_gradients: None,
        };
        self.call("step", &request, Some(step), watch)
    }

    /// `publish`: the current weights as a Hugging Face folder at `path`.
    pub fn publish(&self, path: &Path, dtype: Dtype, watch: &mut dyn Watch) -> Result<PublishResult> {
        self.publish_sharded(path, dtype, None, watch)
    }

    /// `publish` in shards of at most `max_shard_bytes` (the worker's 4 GiB when `None`).
    pub fn publish_sharded(
        &self,
        path: &Path,
        dtype: Dtype,
        max_shard_bytes: Option<u64>,
        watch: &mut dyn Watch,
    ) -> Result<PublishResult> {
        let request = PublishRequest {
            protocol: PROTOCOL,
            path: path.to_path_buf(),
            dtype,
            max_shard_bytes,
        };
        self.call("publish", &request, None, watch)
    }

    /// `save`: sharded model and optimiser state into `path`.
    pub fn save(&self, path: &Path, watch: &mut dyn Watch) -> Result<SaveResult> {
        let request = PathRequest {
            protocol: PROTOCOL,
            path: path.to_path_buf(),
        };
        self.call("save", &request, None, watch)
    }

    /// `load`: the state [`Client::save`] wrote, at any world size.
    pub fn load(&self, path: &Path, watch: &mut dyn Watch) -> Result<LoadResult> {
        let request = PathRequest {
            protocol: PROTOCOL,
            path: path.to_path_buf(),
        };
        self.call("load", &request, None, watch)
    }

    /// Polls `health` until the worker answers, `deadline` passes or the watch says it died.
    pub fn wait_ready(&self, deadline: Duration, watch: &mut dyn Watch) -> Result<Health> {
        let started = Instant::now();
        loop {
            watch.alive("start", None)?;
            match self.health() {
                Ok(h) => return Ok(h),
                Err(Error::Transport { .. }) if started.elapsed() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(Error::Transport { source, .. }) => {
                    return Err(Error::Timeout(format!(
                        "the worker at {} did not answer within {} s: {source}",
                        self.addr,
                        deadline.as_secs()
                    )));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

fn with_step(e: Error, step: Option<u64>) -> Error {
    match e {
        Error::Remote(mut r) => {
            r.step = r.step.or(step);
            Error::Remote(r)
        }
        e => e,
    }
}

/// Checks `hello` against what this side expects: the protocol, and (after `init`) the model.
pub(crate) fn check_model(
    expected: &crate::protocol::ModelInfo,
    got: &crate::protocol::ModelInfo,
) -> Result<()> {
    if expected.architecture != got.architecture {
        return Err(Error::Mismatch {
            what: "the model's architecture",
            ours: expected.architecture.clone(),
            theirs: got.architecture.clone(),
        });
    }
    if expected.config_sha256 != got.config_sha256 {
        return Err(Error::Mismatch {
            what: "the model's config.json (sha256)",
            ours: expected.config_sha256.clone(),
            theirs: got.config_sha256.clone(),
        });
    }
    Ok(())
}

impl Client {
    /// Checks the model the worker reports against the folder this side trains: the architecture of its
    /// `config.json` and the hash of its bytes.
    pub fn expect_model(&self, model_dir: &Path, got: &crate::protocol::ModelInfo) -> Result<()> {
        check_model(&model_info(model_dir)?, got)
    }
}

/// The architecture and config hash of a Hugging Face folder, as the worker reports them.
pub fn model_info(model_dir: &Path) -> Result<crate::protocol::ModelInfo> {
    let path = model_dir.join("config.json");
    let bytes = std::fs::read(&path).map_err(Error::io(&path))?;
    let config: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| Error::Protocol(format!("{}: {e}", path.display())))?;
    let architecture = config["architectures"][0]
        .as_str()
        .unwrap_or_default()
        .to_string();
    Ok(crate::protocol::ModelInfo {
        architecture,
        config_sha256: crate::batch::sha256_hex(&bytes),
        parameters: 0,
    })
}
