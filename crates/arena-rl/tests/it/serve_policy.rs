//! Two real `arena-rl serve-policy` processes on loopback, behind an API key, as one `EnginePool`: a weight
//! update pauses both (retract), loads new weights from disk on both, confirms the version on both and
//! continues them, while a generation runs across it with exact per-token versions; a server that is gone
//! is left out of the next update, and the other serves at the new version. And `arena-rl`'s training loop
//! on two such servers as `rollout.policy_servers`, SmolLM2-135M-Instruct answering arena-sim's sums: each
//! step's weights reach both servers under pause and continue, both report the step's version, every
//! trained token's version is known, and when one server is killed mid-run its sessions move to the other
//! and the run goes on. And what `serve-policy` refuses: every interface without a key, and weights from
//! outside its `--weights-root`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use arena_rl::run::{Plugins, RunPaths, train};
use arena_rl::train::{GrpoStep, NewWeights, StepOutput, TrainBatch, TrainStep};
use arena_sim::{ArenaSim, World};
use futures::StreamExt;
use rollout_proxy::{
    EngineEvent, EnginePool, GenerateRequest, InferenceEngine, PauseMode, SamplingParams, SglangConfig,
    SglangEngine, WeightUpdate,
};
use secrecy::SecretString;
use trainer::backend::Cpu;
use trainer::model::CausalLm;
use trainer::{Architecture, ModelConfig, SaveDtype, Weights, save_pretrained};

const KEY: &str = "policy-key-for-tests";

/// A `serve-policy` process, killed when dropped.
struct Served {
    child: Child,
    url: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(model: &std::path::Path, weights_root: &std::path::Path) -> Served {
    serve_adding(model, weights_root, &[])
}

fn serve_adding(model: &std::path::Path, weights_root: &std::path::Path, more: &[&str]) -> Served {
    let mut child = Command::new(env!("CARGO_BIN_EXE_arena-rl"))
        .args([
            "serve-policy",
            "--model",
            model.to_str().expect("utf-8 path"),
            "--port",
            "0",
            "--weights-root",
            weights_root.to_str().expect("utf-8 path"),
        ])
        .args(more)
        .env("ARENA_RL_POLICY_API_KEY", KEY)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting serve-policy");
    let stdout = child.stdout.take().expect("piped stdout");
    let mut lines = BufReader::new(stdout);
    let mut line = String::new();
    lines.read_line(&mut line).expect("a first line");
    // It listens before it loads the model.
    let url = line
        .strip_prefix("policy server listening on ")
        .and_then(|rest| rest.strip_suffix(" (loading the model)\n"))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    // The server goes on writing (once loaded); keep reading, as a launcher's log would.
    std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
    Served { child, url }
}

async fn client(url: &str, key: Option<&str>) -> Result<Arc<SglangEngine>, rollout_proxy::EngineError> {
    let mut config = SglangConfig::new(url);
    config.api_key = key.map(|k| SecretString::from(k.to_string()));
    config.pause_mode = PauseMode::Retract;
    SglangEngine::connect(config).await.map(Arc::new)
}

#[tokio::test]
async fn two_policy_servers_update_under_pause_and_agree() {
    let dir = tempfile::tempdir().expect("temp dir");
    let first = dir.path().join("step-0");
    crate::model::tiny_model(&first);
    let next = dir.path().join("step-1");
    let config = {
        let mut c = ModelConfig::new(Architecture::Qwen3, 40, 16, 24, 1, 2, 1);
        c.head_dim = 8;
        c
    };
    let weights = Weights::from_model(&CausalLm::<Cpu>::init(&config, 0.3, 4, &Default::default()));
    save_pretrained(&next, &config, &weights, SaveDtype::F32, None).expect("saving the next weights");

    let (a, mut b) = (serve(&first, dir.path()), serve(&first, dir.path()));
    let keyless = client(&a.url, None).await.expect_err("the key is required");
    assert!(keyless.to_string().contains("401"), "{keyless}");
    let (ca, cb) = (
        client(&a.url, Some(KEY)).await.expect("connects"),
        client(&b.url, Some(KEY)).await.expect("connects"),
    );
    assert_eq!(
        ca.max_context_len(),
        4095,
        "the model's 4096 positions, less SGLang's reserved token"
    );
    let pool = EnginePool::new(
        vec![
            (a.url.clone(), ca.clone() as Arc<dyn InferenceEngine>),
            (b.url.clone(), cb.clone() as Arc<dyn InferenceEngine>),
        ],
        PauseMode::Retract,
    );
    let mut running = pool.generate(GenerateRequest {
        input_ids: vec![1, 2, 3].into(),
        sampling: SamplingParams {
            max_new_tokens: 3000,
            ..SamplingParams::default()
        },
        images: Vec::new(),
        affinity: None,
    });
    let mut versions = Vec::new();
    match running.next().await {
        Some(Ok(EngineEvent::Token(t))) => versions.push(t.version),
        other => panic!("expected a first token, got {other:?}"),
    }
    pool.update_weights_from_disk(WeightUpdate {
        path: next.clone(),
        version: Some(1),
    })
    .await
    .expect("both servers agree on version 1");
    for engine in [&ca, &cb] {
        assert_eq!(engine.weight_version().await.expect("asks"), 1);
    }
    while let Some(event) = running.next().await {
        match event.expect("no error") {
            EngineEvent::Token(t) => versions.push(t.version),
            EngineEvent::Finished(_) => break,
        }
    }
    assert_eq!(versions.len(), 3000);
    let cut = versions
        .iter()
        .position(|v| *v == 1)
        .expect("tokens sampled after the update carry version 1");
    assert!(cut >= 1 && versions[..cut].iter().all(|v| *v == 0) && versions[cut..].iter().all(|v| *v == 1));

    // A server that is gone is left out of the next update; the other is updated and serves everything.
    let _ = b.child.kill();
    let _ = b.child.wait();
    pool.update_weights_from_disk(WeightUpdate {
        path: first,
        version: Some(2),
    })
    .await
    .expect("the live server updates without the dead one");
    assert_eq!(ca.weight_version().await.expect("asks"), 2);
    for key in ["k1", "k2"] {
        let mut s = pool.generate(GenerateRequest {
            input_ids: vec![4, 5].into(),
            sampling: SamplingParams {
                max_new_tokens: 4,
                ..SamplingParams::default()
            },
            images: Vec::new(),
            affinity: Some(key.into()),
        });
        while let Some(event) = s.next().await {
            match event.expect("served by the live server") {
                EngineEvent::Token(t) => assert_eq!(t.version, 2),
                EngineEvent::Finished(_) => break,
            }
        }
        assert_eq!(pool.server_of(key), Some(0));
    }
}

/// Issue 30 item 13: without `ARENA_RL_POLICY_API_KEY`, `serve-policy` refuses to listen beyond loopback
/// (before, it warned and served: anyone reaching the port could load weights); and it loads weight updates
/// only from folders under `--weights-root`, symlinks resolved (before, from any path it could read).
#[tokio::test]
async fn serve_policy_needs_a_key_beyond_loopback_and_loads_weights_only_under_its_root() {
    let root = tempfile::tempdir().expect("temp dir");
    let model = root.path().join("step-0");
    crate::model::tiny_model(&model);
    let out = Command::new(env!("CARGO_BIN_EXE_arena-rl"))
        .args([
            "serve-policy",
            "--model",
            model.to_str().unwrap(),
            "--host",
            "0.0.0.0",
            "--port",
            "0",
        ])
        .args(["--weights-root", root.path().to_str().unwrap()])
        .env_remove("ARENA_RL_POLICY_API_KEY")
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "it served on every interface without a key: {stderr}"
    );
    assert!(
        stderr.contains("--host 0.0.0.0 is not a loopback address")
            && stderr.contains("ARENA_RL_POLICY_API_KEY is not set"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty(), "it never listened");

    let elsewhere = tempfile::tempdir().expect("temp dir");
    let outside = elsewhere.path().join("weights");
    crate::model::tiny_model(&outside);
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&outside, &link).expect("symlink");
    let served = serve(&model, root.path());
    let client = client(&served.url, Some(KEY)).await.expect("connects");
    for (path, version) in [(&outside, 1), (&link, 2)] {
        let refused = client
            .update_weights_from_disk(WeightUpdate {
                path: path.clone(),
                version: Some(version),
            })
            .await
            .expect_err("weights from outside the root are refused");
        assert!(
            refused
                .to_string()
                .contains("is not a folder under the weights root"),
            "{refused}"
        );
    }
    client
        .update_weights_from_disk(WeightUpdate {
            path: root.path().join("step-0/../step-0"),
            version: Some(3),
        })
        .await
        .expect("weights under the root load");
    assert_eq!(client.weight_version().await.expect("asks"), 3);
}

/// `--kv-cache-bytes` bounds the server's key/value cache: a prompt it cannot hold is refused naming it, and
/// a sequence alone ends with `length` when it fills the cache.
#[tokio::test]
async fn serve_policy_keeps_its_key_value_cache_within_kv_cache_bytes() {
    let root = tempfile::tempdir().expect("temp dir");
    let model = root.path().join("step-0");
    crate::model::tiny_model(&model);
    let config = trainer::ModelFolder::open(&model).expect("the tiny model").config;
    // 20 tokens of the tiny model's cache.
    let bytes = (20 * trainer::kv_cache_bytes_per_token(&config)).to_string();
    let served = serve_adding(&model, root.path(), &["--kv-cache-bytes", &bytes]);
    let client = client(&served.url, Some(KEY)).await.expect("connects");
    let generate = |prompt: Vec<u32>| {
        client.generate(GenerateRequest {
            input_ids: prompt.into(),
            sampling: SamplingParams {
                max_new_tokens: 100,
                ..SamplingParams::default()
            },
            images: Vec::new(),
            affinity: None,
        })
    };
    let mut refused = generate(vec![1; 25]);
    let err = loop {
        match refused.next().await {
            Some(Err(e)) => break e.to_string(),
            Some(Ok(EngineEvent::Finished(f))) => panic!("a 25-token prompt was served: {f:?}"),
            Some(Ok(_)) => {}
            None => panic!("the stream ended without an error"),
        }
    };
    assert!(err.contains("kv_cache_bytes"), "{err}");
    let mut alone = generate(vec![1, 2, 3, 4, 5]);
    let mut tokens = 0;
    let finish = loop {
        match alone.next().await.expect("an event").expect("served") {
            EngineEvent::Token(_) => tokens += 1,
            EngineEvent::Finished(f) => break f,
        }
    };
    // Five prompt tokens and 15 sampled ones fill the 20 slots; the 16th sampled token needs none.
    assert_eq!(tokens, 16, "{finish:?}");
    assert!(
        matches!(finish, rollout_proxy::FinishReason::Length),
        "{finish:?}"
    );
}

/// The run's GRPO step, watched: before each step it asks every live server its weight version (each must
/// be the version the loop last installed) and checks that every token the step trains on carries a known
/// version no newer than the one the step starts from; before the second step it kills the second server.
struct Watched {
    inner: GrpoStep,
    /// The version the loop installed last (a step that trains nothing installs none).
    installed: u64,
    runtime: tokio::runtime::Handle,
    clients: Vec<Arc<SglangEngine>>,
    doomed: Arc<Mutex<Option<Served>>>,
    killed: Arc<AtomicBool>,
    log: Arc<Mutex<Vec<String>>>,
}

impl TrainStep for Watched {
    fn begin(&mut self, total_steps: u64) -> arena_rl::error::Result<()> {
        self.inner.begin(total_steps)
    }

    fn train(&mut self, step: u64, batch: &TrainBatch) -> arena_rl::error::Result<StepOutput> {
        let live = if self.killed.load(Ordering::Relaxed) { 1 } else { 2 };
        for (i, client) in self.clients.iter().take(live).enumerate() {
            let version = self
                .runtime
                .block_on(client.weight_version())
                .expect("a live server answers its version");
            assert_eq!(
                u64::from(version),
                self.installed,
                "server {i} serves the version the loop installed last, before step {step}"
            );
        }
        for sample in &batch.samples {
            for (&mask, &version) in sample.loss_mask.iter().zip(&sample.versions) {
                if mask == 1 {
                    assert!(
                        (0..=i64::try_from(batch.policy_version).unwrap()).contains(&version),
                        "a trained token of step {step} has version {version}"
                    );
                }
            }
        }
        self.log.lock().unwrap().push(format!(
            "step {step}: {live} live servers at version {}, {} samples",
            self.installed,
            batch.samples.len()
        ));
        if step == 1 {
            // Mid-run: the next step's rollouts are running on both servers (one version ahead).
            drop(self.doomed.lock().unwrap().take());
            self.killed.store(true, Ordering::Relaxed);
        }
        let out = self.inner.train(step, batch)?;
        if matches!(out.weights, NewWeights::OnDisk(_)) {
            // The loop installs them as the next version.
            self.installed = batch.policy_version + 1;
        }
        Ok(out)
    }

    fn save(&mut self, dir: &std::path::Path) -> arena_rl::error::Result<()> {
        self.inner.save(dir)
    }

    fn load(&mut self, dir: &std::path::Path) -> arena_rl::error::Result<NewWeights> {
        self.inner.load(dir)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_loop_trains_on_two_policy_servers_and_goes_on_when_one_dies() {
    let model = crate::support::smollm2();
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (serve(&model, root.path()), serve(&model, root.path()));
    let mut world = World::sums();
    world.token = "sim-token".into();
    let sim = ArenaSim::start(world).await.unwrap();
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/configs/smollm2.yaml"),
    )
    .unwrap();
    let overrides = [
        format!("econfig.arena_base_url={}", sim.base_url()),
        format!("cluster.fileroot={}", root.path().display()),
        format!("model.path={}", model.display()),
        format!("rollout.policy_servers=[{}, {}]", a.url, b.url),
        "metrics.progress=false".to_string(),
        "actor.total_train_steps=3".to_string(),
        "train_dataset.batch_size=2".to_string(),
        "gconfig.n_samples=4".to_string(),
        // A learning rate that moves the weights visibly in three steps.
        "actor.lr=1e-4".to_string(),
        "rollout.max_oversample_factor=1".to_string(),
        "checkpoint.save_every=0".to_string(),
        "eval_every=0".to_string(),
    ];
    let env = stream_config::Env::from_pairs([
        ("ARENA_OPENAPI_TOKEN", "sim-token"),
        ("ARENA_LLM_API_KEY", "sim-llm-key"),
        ("ARENA_RL_POLICY_API_KEY", KEY),
    ]);
    let config = stream_config::load_run_config_str("smollm2.yaml", &text, &overrides, &env).unwrap();
    let run_dir = RunPaths::of(&config).run_dir;
    let (ca, cb) = (
        client(&a.url, Some(KEY)).await.expect("connects"),
        client(&b.url, Some(KEY)).await.expect("connects"),
    );
    let killed = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Vec::new()));
    let step = Watched {
        inner: GrpoStep::from_run_config(&config, &run_dir).unwrap(),
        installed: 0,
        runtime: tokio::runtime::Handle::current(),
        clients: vec![ca.clone(), cb],
        doomed: Arc::new(Mutex::new(Some(b))),
        killed: killed.clone(),
        log: log.clone(),
    };
    let summary = train(
        config,
        &env,
        Plugins {
            engine: None,
            step: Box::new(step),
        },
    )
    .await
    .expect("the run goes on without the dead server");
    eprintln!("{}", log.lock().unwrap().join("\n"));
    assert!(
        killed.load(Ordering::Relaxed),
        "the second server was killed mid-run"
    );
    assert_eq!(summary.steps_trained, 3);
    let (metrics, steps) = crate::support::step_metrics(&summary.metrics_dir);
    assert_eq!(steps.len(), 3, "{metrics}");
    // Every rollout of every step finished and was graded, the ones whose server died under them too.
    let launched = sim.requests_to(arena_sim::Endpoint::LaunchOneTask).len();
    assert_eq!(launched, 3 * 2 * 4, "one launch per sample, none relaunched");
    let trained: f64 = steps
        .iter()
        .filter_map(|s| s["train/trained_tokens"].as_f64())
        .sum();
    assert!(trained > 0.0, "the weights moved: {metrics}");
    let published = std::fs::read_dir(run_dir.join("weights")).unwrap().count();
    assert!(published >= 1, "weights were published to disk");
    // The step the server died in ends with it marked down and with generations moved off it: step 2's
    // rollouts were running on both servers when it died, or went to it before the pool knew.
    let gauge =
        |s: &serde_json::Value, name: &str| s[name].as_f64().unwrap_or_else(|| panic!("{name}: {metrics}"));
    assert_eq!(gauge(&steps[0], "policy/servers_down"), 0.0);
    assert_eq!(gauge(&steps[2], "policy/servers_down"), 1.0);
    assert!(gauge(&steps[2], "policy/generations_moved") >= 1.0, "{metrics}");
    eprintln!(
        "generations moved off the dead server: {}",
        gauge(&steps[2], "policy/generations_moved")
    );
}
