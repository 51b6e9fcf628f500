//! MLflow over its tracking server's REST API: the experiment (created when missing), one run per trial
//! (its id kept in the run folder, so a resumed run continues it), batched metrics with their step numbers,
//! params from the redacted run config, and the reward curve and run summary as artifacts through the
//! server's artifact proxy (`mlflow-artifacts`).
//!
//! Every request is retried with exponential backoff on transport failures, 429 and 5xx; a request that still
//! fails is given up with a warning and its records stay in `metrics.jsonl`.

use std::path::Path;
use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{Msg, State, now_ms};

/// Most metrics in one `log-batch` request (the server's limit).
const MAX_BATCH_METRICS: usize = 1000;
/// Most params in one `log-batch` request (the server's limit).
const MAX_BATCH_PARAMS: usize = 100;
/// Longest param value the server accepts.
const MAX_PARAM_VALUE: usize = 6000;
/// Longest param key the server accepts.
const MAX_PARAM_KEY: usize = 250;
/// Attempts per request.
const ATTEMPTS: u32 = 5;
/// How long the sink gathers steps into one `log-batch` after the first arrives (at least; longer with
/// `metrics.mlflow.min_interval_seconds`). The server spends tens of milliseconds of CPU on a request whatever
/// it holds, so a run whose steps take a fraction of a second sends one request an interval instead of one a
/// step; a dashboard is at most this much behind the run.
const GATHER: Duration = Duration::from_secs(2);

/// How the run reaches its MLflow server.
#[derive(Clone)]
pub struct Settings {
    /// The server's base URL, without a trailing `/`.
    pub uri: String,
    /// `MLFLOW_TRACKING_TOKEN`, sent as a bearer token.
    pub token: Option<SecretString>,
    /// `MLFLOW_TRACKING_USERNAME` and `MLFLOW_TRACKING_PASSWORD`, sent as basic auth.
    pub basic: Option<(String, SecretString)>,
    /// Experiment name.
    pub experiment: String,
    /// Run name.
    pub run_name: String,
    /// Run tags.
    pub tags: Vec<(String, String)>,
    /// Bound of the queue to the background task.
    pub queue: usize,
    /// Base delay of the retry backoff.
    pub backoff: Duration,
    /// `metrics.mlflow.min_interval_seconds`: at most one value of each metric per interval; zero (null in the
    /// config) sends every step.
    pub min_interval: Duration,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("mlflow::Settings")
            .field("uri", &self.uri)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("experiment", &self.experiment)
            .field("run_name", &self.run_name)
            .field("min_interval", &self.min_interval)
            .finish_non_exhaustive()
    }
}

/// An MLflow metric key for a metric name: characters the server refuses become `_`.
pub fn mlflow_key(name: &str) -> String {
    let key: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_-. /:".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    key.split('/')
        .map(|part| {
            if part.is_empty() || part == "." || part == ".." {
                "_"
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

struct Client {
    http: reqwest::Client,
    settings: Settings,
}

/// Why a request failed; the message never holds a credential.
struct Failure {
    message: String,
    code: Option<String>,
}

impl Client {
    fn url(&self, path: &str) -> String {
        format!("{}/api/2.0/{path}", self.settings.uri)
    }

    fn auth(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        if let Some(token) = &self.settings.token {
            req.bearer_auth(token.expose_secret())
        } else if let Some((user, password)) = &self.settings.basic {
            req.basic_auth(user, Some(password.expose_secret()))
        } else {
            req
        }
    }

    /// Sends a request built by `build`, retrying transient failures; returns the JSON body.
    async fn call(&self, what: &str, build: impl Fn() -> reqwest::RequestBuilder) -> Result<Value, Failure> {
        let mut delay = self.settings.backoff;
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(8));
            }
            match self.auth(build()).send().await {
                Ok(resp) => {
                    let status = resp.status();
                    let body: Value = resp.json().await.unwrap_or(Value::Null);
                    if status.is_success() {
                        return Ok(body);
                    }
                    let code = body["error_code"].as_str().map(str::to_string);
                    let failure = Failure {
                        message: format!(
                            "{what}: MLflow answered {status}: {}",
                            body["message"].as_str().unwrap_or("")
                        ),
                        code,
                    };
                    if !(status.is_server_error() || status.as_u16() == 429) {
                        return Err(failure);
                    }
                    last = Some(failure);
                }
                Err(e) => {
                    // reqwest's error names the URL, which holds no credential (config validation refuses a
                    // user or password in it).
                    last = Some(Failure {
                        message: format!("{what}: cannot reach MLflow at {}: {e}", self.settings.uri),
                        code: None,
                    });
                }
            }
        }
        Err(last.expect("at least one attempt"))
    }

    async fn post(&self, what: &str, path: &str, body: Value) -> Result<Value, Failure> {
        let url = self.url(path);
        self.call(what, || self.http.post(&url).json(&body)).await
    }

    async fn get(&self, what: &str, path: &str, query: &[(&str, &str)]) -> Result<Value, Failure> {
        let url = self.url(path);
        self.call(what, || self.http.get(&url).query(query)).await
    }

    async fn experiment_id(&self) -> Result<String, Failure> {
        let name = self.settings.experiment.as_str();
        let found = self
            .get(
                "finding the experiment",
                "mlflow/experiments/get-by-name",
                &[("experiment_name", name)],
            )
            .await;
        match found {
            Ok(v) => Ok(string(&v["experiment"]["experiment_id"])),
            Err(f) if f.code.as_deref() == Some("RESOURCE_DOES_NOT_EXIST") => {
                match self
                    .post(
                        "creating the experiment",
                        "mlflow/experiments/create",
                        json!({"name": name}),
                    )
                    .await
                {
                    Ok(v) => Ok(string(&v["experiment_id"])),
                    // Another run created it meanwhile.
                    Err(f) if f.code.as_deref() == Some("RESOURCE_ALREADY_EXISTS") => {
                        let v = self
                            .get(
                                "finding the experiment",
                                "mlflow/experiments/get-by-name",
                                &[("experiment_name", name)],
                            )
                            .await?;
                        Ok(string(&v["experiment"]["experiment_id"]))
                    }
                    Err(f) => Err(f),
                }
            }
            Err(f) => Err(f),
        }
    }

    /// Continues the run named in the state file, or creates one; returns `(run id, artifact URI, created)`.
    async fn open_run(&self, state: &State) -> Result<(String, String, bool), Failure> {
        if let Some(id) = state.get("run_id") {
            let v = self
                .get("finding the run", "mlflow/runs/get", &[("run_id", &id)])
                .await;
            if let Ok(v) = v {
                self.post(
                    "reopening the run",
                    "mlflow/runs/update",
                    json!({"run_id": id, "status": "RUNNING"}),
                )
                .await?;
                return Ok((id, string(&v["run"]["info"]["artifact_uri"]), false));
            }
            tracing::warn!(run_id = %id, "MLflow no longer has the run this trial logged to; starting a new one");
        }
        let experiment_id = self.experiment_id().await?;
        let mut tags: Vec<Value> = self
            .settings
            .tags
            .iter()
            .map(|(k, v)| json!({"key": k, "value": v}))
            .collect();
        tags.push(json!({"key": "mlflow.source.name", "value": "arena-rl"}));
        let v = self
            .post(
                "creating the run",
                "mlflow/runs/create",
                json!({
                    "experiment_id": experiment_id,
                    "run_name": self.settings.run_name,
                    "start_time": now_ms(),
                    "tags": tags,
                }),
            )
            .await?;
        let info = &v["run"]["info"];
        Ok((string(&info["run_id"]), string(&info["artifact_uri"]), true))
    }

    async fn log_params(&self, run_id: &str, config: &Value) -> Result<(), Failure> {
        let mut params = Vec::new();
        flatten(config, String::new(), &mut params);
        for chunk in params.chunks(MAX_BATCH_PARAMS) {
            let params: Vec<Value> = chunk.iter().map(|(k, v)| json!({"key": k, "value": v})).collect();
            self.post(
                "logging the run config as params",
                "mlflow/runs/log-batch",
                json!({"run_id": run_id, "params": params}),
            )
            .await?;
        }
        Ok(())
    }

    async fn log_metrics(&self, run_id: &str, points: &[(u64, &str, f64)]) -> Result<(), Failure> {
        let now = now_ms();
        let metrics: Vec<Value> = points
            .iter()
            .map(|(step, k, v)| json!({"key": mlflow_key(k), "value": v, "timestamp": now, "step": step}))
            .collect();
        for chunk in metrics.chunks(MAX_BATCH_METRICS) {
            self.post(
                "logging metrics",
                "mlflow/runs/log-batch",
                json!({"run_id": run_id, "metrics": chunk}),
            )
            .await?;
        }
        Ok(())
    }

    /// Uploads one artifact through the server's artifact proxy.
    async fn upload(&self, artifact_uri: &str, name: &str, data: Vec<u8>) -> Result<(), Failure> {
        let Some(rest) = artifact_uri.strip_prefix("mlflow-artifacts:") else {
            return Err(Failure {
                message: format!(
                    "the server stores this run's artifacts at {artifact_uri:?}, which its REST artifact proxy (mlflow-artifacts) does not serve; {name} is only in the run folder"
                ),
                code: None,
            });
        };
        // `mlflow-artifacts:/1/<run>/artifacts` or `mlflow-artifacts://host:port/1/<run>/artifacts`.
        let rest = match rest.strip_prefix("//") {
            Some(with_host) => with_host.split_once('/').map_or("", |(_, p)| p),
            None => rest.trim_start_matches('/'),
        };
        let url = format!(
            "{}/api/2.0/mlflow-artifacts/artifacts/{}/{name}",
            self.settings.uri,
            rest.trim_end_matches('/')
        );
        self.call(&format!("uploading {name}"), || {
            self.http.put(&url).body(data.clone())
        })
        .await
        .map(|_| ())
    }
}

fn string(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_string()
}

/// Dotted params from a config tree: strings as they are, other leaves as JSON, values cut to the server's
/// limit.
fn flatten(v: &Value, prefix: String, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(map) if !map.is_empty() => {
            for (k, child) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(child, key, out);
            }
        }
        leaf => {
            let mut text = match leaf {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if text.len() > MAX_PARAM_VALUE {
                let mut cut = MAX_PARAM_VALUE;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
            }
            let key = mlflow_key(&prefix);
            if key.len() <= MAX_PARAM_KEY {
                out.push((key, text));
            }
        }
    }
}

/// The steps gathered for one `log-batch` request. Live steps are thinned when `thin`
/// (`metrics.mlflow.min_interval_seconds` set): each metric keeps its newest value with that value's
/// step, so a metric a later step leaves out keeps its own. Steps marked whole (replayed, or released by a
/// checkpoint), and every step when not `thin`, go whole.
#[derive(Debug, Default)]
struct Gathered {
    thin: bool,
    /// Steps sent whole, in order.
    whole: Vec<(u64, Vec<(String, f64)>)>,
    /// Thinned live steps: each metric's newest `(step, value)`.
    newest: std::collections::BTreeMap<String, (u64, f64)>,
    /// Points the request will hold.
    points: usize,
    /// Steps gathered (whole or thinned).
    steps: u64,
    /// The highest step gathered.
    last: Option<u64>,
    /// Values a newer step's replaced.
    replaced: u64,
}

impl Gathered {
    fn new(thin: bool) -> Self {
        Self {
            thin,
            ..Self::default()
        }
    }

    fn add(&mut self, step: u64, metrics: Vec<(String, f64)>, whole: bool) {
        self.steps += 1;
        self.last = Some(self.last.map_or(step, |l| l.max(step)));
        if !self.thin || whole {
            self.points += metrics.len();
            self.whole.push((step, metrics));
            return;
        }
        for (name, value) in metrics {
            match self.newest.entry(name) {
                std::collections::btree_map::Entry::Vacant(e) => {
                    e.insert((step, value));
                    self.points += 1;
                }
                std::collections::btree_map::Entry::Occupied(mut e) => {
                    if e.get().0 <= step {
                        e.insert((step, value));
                    }
                    self.replaced += 1;
                }
            }
        }
    }

    /// Adds the steps that arrive within `window` (until the request is full); returns what ended it early
    /// ([`Msg::Finish`]), to be handled next.
    async fn gather(&mut self, rx: &mut mpsc::Receiver<Msg>, window: Duration) -> Option<Msg> {
        let deadline = tokio::time::Instant::now() + window;
        while self.points < MAX_BATCH_METRICS {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Msg::Step { step, metrics, whole })) => self.add(step, metrics, whole),
                Ok(Some(other)) => return Some(other),
                // The interval is over, or the run is done with the sink.
                Ok(None) | Err(_) => break,
            }
        }
        None
    }

    /// Every point of the request: `(step, metric, value)`.
    fn points(&self) -> Vec<(u64, &str, f64)> {
        let whole = self
            .whole
            .iter()
            .flat_map(|(step, values)| values.iter().map(move |(k, v)| (*step, k.as_str(), *v)));
        let newest = self.newest.iter().map(|(k, (step, v))| (*step, k.as_str(), *v));
        whole.chain(newest).collect()
    }
}

/// The background task: opens the run, then logs what arrives until [`Msg::Finish`] or the channel closes.
pub(super) async fn run(settings: Settings, config: Value, state: State, mut rx: mpsc::Receiver<Msg>) -> u64 {
    let mut lost = 0u64;
    // reqwest is built without a default TLS provider; installing ring twice is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = match reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
    {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(error = %e, "MLflow: cannot build an HTTP client; metrics stay in metrics.jsonl");
            return super::drain(&mut rx).await;
        }
    };
    let client = Client { http, settings };
    let (run_id, artifact_uri) = match client.open_run(&state).await {
        Ok((id, artifacts, created)) => {
            state.set("run_id", &id);
            if created && let Err(f) = client.log_params(&id, &config).await {
                tracing::warn!(error = %f.message, "MLflow: the run config was not logged as params");
            }
            (id, artifacts)
        }
        Err(f) => {
            tracing::warn!(
                error = %f.message,
                "MLflow: cannot open a run; the run goes on and its metrics stay in metrics.jsonl"
            );
            return super::drain(&mut rx).await;
        }
    };
    let mut warned = false;
    let thin = !client.settings.min_interval.is_zero();
    let window = client.settings.min_interval.max(GATHER);
    // Values thinned out so far (`metrics.mlflow.min_interval_seconds`); told once when it starts, and at the end.
    let mut replaced = 0u64;
    let mut pending: Option<Msg> = None;
    loop {
        let msg = match pending.take() {
            Some(m) => m,
            None => match rx.recv().await {
                Some(m) => m,
                None => break,
            },
        };
        match msg {
            Msg::Step { step, metrics, whole } => {
                let mut gathered = Gathered::new(thin);
                gathered.add(step, metrics, whole);
                pending = gathered.gather(&mut rx, window).await;
                if gathered.replaced > 0 && replaced == 0 {
                    tracing::info!(
                        interval_s = client.settings.min_interval.as_secs_f64(),
                        "MLflow: steps come faster than metrics.mlflow.min_interval_seconds; MLflow gets each \
                         metric's newest value per interval (the run's last step always), metrics.jsonl, \
                         TensorBoard and W&B every step (null sends every step to MLflow)"
                    );
                }
                replaced += gathered.replaced;
                match client.log_metrics(&run_id, &gathered.points()).await {
                    Ok(()) => {
                        state.set("last_step", &gathered.last.unwrap_or(0).to_string());
                    }
                    Err(f) => {
                        lost += gathered.steps;
                        if !warned {
                            warned = true;
                            tracing::warn!(
                                error = %f.message,
                                "MLflow: metrics not logged; the run goes on and they stay in metrics.jsonl"
                            );
                        }
                    }
                }
            }
            Msg::Finish { curve, summary } => {
                finish(&client, &run_id, &artifact_uri, curve.as_deref(), &summary).await;
                break;
            }
        }
    }
    if replaced > 0 {
        tracing::info!(
            values = replaced,
            "MLflow: values thinned by metrics.mlflow.min_interval_seconds (every one is in metrics.jsonl)"
        );
    }
    lost
}

async fn finish(client: &Client, run_id: &str, artifact_uri: &str, curve: Option<&Path>, summary: &Value) {
    if let Some(path) = curve {
        // Under its own name: `reward_curve.png` for a run, `eval.png` for an evaluation.
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("reward_curve.png");
        match std::fs::read(path) {
            Ok(data) => {
                if let Err(f) = client.upload(artifact_uri, name, data).await {
                    tracing::warn!(error = %f.message, "MLflow: the reward curve was not uploaded");
                }
            }
            Err(e) => tracing::warn!(error = %e, "MLflow: cannot read the reward curve"),
        }
    }
    let text = serde_json::to_vec_pretty(summary).unwrap_or_default();
    if let Err(f) = client.upload(artifact_uri, "summary.json", text).await {
        tracing::warn!(error = %f.message, "MLflow: the run summary was not uploaded");
    }
    let done = client
        .post(
            "ending the run",
            "mlflow/runs/update",
            json!({"run_id": run_id, "status": "FINISHED", "end_time": now_ms()}),
        )
        .await;
    if let Err(f) = done {
        tracing::warn!(error = %f.message, "MLflow: the run was not marked finished");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(reward: f64, extra: Option<f64>) -> Vec<(String, f64)> {
        let mut m = vec![("rollout/reward".to_string(), reward)];
        if let Some(e) = extra {
            m.push(("eval-rollout/reward".to_string(), e));
        }
        m
    }

    #[test]
    fn a_thinned_request_holds_each_metrics_newest_value_with_its_own_step() {
        let mut g = Gathered::new(true);
        g.add(1, step(0.1, None), false);
        g.add(2, step(0.2, Some(0.7)), false);
        g.add(3, step(0.3, None), false);
        assert_eq!(
            g.points(),
            [(2, "eval-rollout/reward", 0.7), (3, "rollout/reward", 0.3)]
        );
        assert_eq!((g.steps, g.last, g.replaced, g.points), (3, Some(3), 2, 2));
    }

    #[test]
    fn replayed_steps_and_an_unthinned_sink_send_every_step() {
        let mut g = Gathered::new(true);
        g.add(1, step(0.1, None), true);
        g.add(2, step(0.2, None), true);
        g.add(3, step(0.3, None), false);
        g.add(4, step(0.4, None), false);
        assert_eq!(
            g.points(),
            [
                (1, "rollout/reward", 0.1),
                (2, "rollout/reward", 0.2),
                (4, "rollout/reward", 0.4)
            ]
        );
        let mut g = Gathered::new(false);
        for k in 1..=3 {
            g.add(k, step(k as f64, Some(0.5)), false);
        }
        assert_eq!(g.points().len(), 6);
        assert_eq!((g.steps, g.last, g.replaced), (3, Some(3), 0));
    }
}
