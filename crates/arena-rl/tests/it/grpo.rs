//! The GRPO step in the loop: `GrpoStep` on a tiny model with SmolLM2's tokenizer, alone (in-memory weights
//! that the burn policy swaps in, state saved and restored) and driven by the loop against arena-sim (weights
//! published on disk for policy servers, the trainer's state in the loop's checkpoints, resumed by a second
//! run).

use std::path::{Path, PathBuf};

use arena_rl::engine::PolicyEngine;
use arena_rl::journal::SampleKey;
use arena_rl::run::{Plugins, latest_checkpoint, train};
use arena_rl::train::{GrpoStep, NewWeights, TrainBatch, TrainSample, TrainStep};
use arena_sim::{ArenaSim, World};
use trainer::backend::Cpu;
use trainer::model::CausalLm;
use trainer::{Architecture, ModelConfig, ModelFolder, SaveDtype, Weights, save_pretrained};

use crate::support::{OracleEngine, config, env, model_folder, smollm2};

/// A model folder with SmolLM2's tokenizer and template and a tiny random Llama of the same vocabulary.
pub(crate) fn tiny_model(dir: &Path) -> (PathBuf, Weights) {
    let out = model_folder(dir);
    let mut c = ModelConfig::new(Architecture::Llama, 49152, 16, 32, 1, 2, 1);
    c.tie_word_embeddings = true;
    c.max_position_embeddings = 4096;
    c.eos_token_ids = ModelFolder::open(&smollm2()).unwrap().config.eos_token_ids;
    let w = Weights::from_model(&CausalLm::<Cpu>::init(&c, 0.02, 3, &Default::default()));
    save_pretrained(&out, &c, &w, SaveDtype::F32, None).unwrap();
    (out, w)
}

fn sample(i: u32, advantage: f64) -> TrainSample {
    let tokens: Vec<u32> = (0..12).map(|t| 100 + i * 17 + t).collect();
    TrainSample {
        key: SampleKey {
            eval: false,
            step: 0,
            group: 0,
            sample: i,
        },
        loss_mask: (0..12).map(|t| u8::from(t >= 6)).collect(),
        logprobs: (0..12).map(|t| if t >= 6 { -10.8 } else { 0.0 }).collect(),
        versions: (0..12).map(|t| if t >= 6 { 0 } else { -1 }).collect(),
        token_ids: tokens,
        advantage,
        raw_reward: advantage.max(0.0),
        temperatures: Vec::new(),
        truncated: Vec::new(),
    }
}

fn in_memory(w: NewWeights) -> Weights {
    match w {
        NewWeights::InMemory(w) => w,
        other => panic!("expected weights in memory, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpo_step_trains_swaps_into_the_policy_and_restores() {
    let root = tempfile::tempdir().unwrap();
    let (model, initial) = tiny_model(root.path());
    let run = config("http://127.0.0.1:9", root.path(), &model, &["actor.lr=0.01"]);
    let mut step = GrpoStep::from_run_config(&run, root.path()).unwrap();
    step.begin(4).unwrap();
    let batch = TrainBatch {
        samples: (0..4)
            .map(|i| sample(i, if i % 2 == 0 { 1.0 } else { -1.0 }))
            .collect(),
        group_sizes: vec![4],
        policy_version: 0,
    };
    let out = step.train(0, &batch).unwrap();
    let metric = |name: &str| {
        out.metrics
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", out.metrics))
            .1
    };
    assert_eq!(metric("train/trained_tokens"), 24.0);
    assert_eq!(metric("train/sequences"), 4.0);
    assert!(metric("train/grad_norm") > 0.0 && metric("train/loss").is_finite());
    let trained = in_memory(out.weights);
    assert_ne!(trained, initial, "one step moved the weights");
    // The in-process policy takes them as the next version.
    let policy = tokio::task::spawn_blocking({
        let model = model.clone();
        move || PolicyEngine::load(&model, 4, trainer::DeviceKind::Cpu).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(policy.swap(trained.clone(), 1).await.unwrap(), 1);
    // Its state in a checkpoint directory: a complete Hugging Face folder plus the optimiser.
    let ckpt = root.path().join("state");
    std::fs::create_dir_all(&ckpt).unwrap();
    step.save(&ckpt).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(ckpt.join(f).is_file(), "{f} missing from the saved state");
    }
    let mut again = GrpoStep::from_run_config(&run, root.path()).unwrap();
    again.begin(4).unwrap();
    assert_eq!(in_memory(again.load(&ckpt).unwrap()), trained);
    // An empty batch (every group rejected) trains nothing.
    let skipped = again.train(1, &TrainBatch::default()).unwrap();
    assert!(matches!(skipped.weights, NewWeights::Unchanged));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_loop_trains_with_grpo_publishes_to_disk_and_resumes_from_its_checkpoint() {
    let mut world = World::quickstart();
    world.token = "sim-token".into();
    let sim = ArenaSim::start(world).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let (model, initial) = tiny_model(root.path());
    let overrides = |steps: &str| {
        vec![
            format!("actor.total_train_steps={steps}"),
            "train_dataset.batch_size=2".to_string(),
            "gconfig.n_samples=4".to_string(),
            "actor.lr=0.01".to_string(),
            // A checkpoint every step, each starting a journal segment and retiring the older ones.
            "checkpoint.save_every=1".to_string(),
            // Weights go to disk for policy servers; the oracle engine stands in for them.
            "rollout.policy_servers=[http://127.0.0.1:9]".to_string(),
        ]
    };
    let run = |steps: &'static str, extra: &[&str]| {
        let mut o = overrides(steps);
        o.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = o.iter().map(String::as_str).collect();
        config(&sim.base_url(), root.path(), &model, &refs)
    };
    let first = run("2", &[]);
    let run_dir = arena_rl::run::RunPaths::of(&first).run_dir;
    let summary = train(
        first.clone(),
        &env(),
        Plugins {
            engine: Some(OracleEngine::new(&model, 3).handle()),
            step: Box::new(GrpoStep::from_run_config(&first, &run_dir).unwrap()),
        },
    )
    .await
    .unwrap();
    assert_eq!(summary.steps_trained, 2);
    let metrics = std::fs::read_to_string(summary.metrics_dir.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let trained: f64 = lines
        .iter()
        .filter_map(|l| l["train/trained_tokens"].as_f64())
        .sum();
    assert!(
        trained > 0.0,
        "GRPO trained on the oracle's trajectories: {metrics}"
    );
    assert!(lines.iter().all(|l| l["policy/version"].is_number()));
    // Published for the policy servers, and different from the initial weights.
    let published = std::fs::read_dir(run_dir.join("weights"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("step-"))
        .max()
        .expect("weights were published");
    assert_ne!(Weights::load_dir(&published).unwrap(), initial);
    // The checkpoint holds the trainer's state and the loop's state.
    let (ckpt, meta) = latest_checkpoint(&run_dir.join("checkpoints")).unwrap().unwrap();
    assert_eq!((meta.steps, meta.data_cursor), (2, 2));
    assert!(ckpt.join("optimizer.safetensors").is_file());
    let saved_steps = |dir: &Path| -> u64 {
        let state: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("trainer_state.json")).unwrap()).unwrap();
        state["steps"].as_u64().unwrap()
    };
    let optimiser_steps = saved_steps(&ckpt);
    assert!(optimiser_steps >= 1);
    // Two checkpoints, two journal segments started; the older ones are gone (deleted, not kept aside).
    let journal_files = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(run_dir.join("journal"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(meta.journal_segment, 2);
    assert_eq!(journal_files(), ["journal-w0.000002.jsonl"]);

    // A second run with more steps resumes from it and continues the same optimiser, and publishes as the GPU
    // profiles do: bf16, in shards with an index (1 MiB here: the tied embedding alone is 1.5 MiB in bf16).
    let second = run(
        "3",
        &[
            "rollout.weights_dtype=bf16",
            "rollout.weights_shard_bytes=1048576",
        ],
    );
    let summary = train(
        second.clone(),
        &env(),
        Plugins {
            engine: Some(OracleEngine::new(&model, 3).handle()),
            step: Box::new(GrpoStep::from_run_config(&second, &run_dir).unwrap()),
        },
    )
    .await
    .unwrap();
    assert_eq!((summary.resumed_at, summary.steps_trained), (2, 1));
    let (ckpt, meta) = latest_checkpoint(&run_dir.join("checkpoints")).unwrap().unwrap();
    assert_eq!(meta.steps, 3);
    // The resumed run read segment 2 alone, and its checkpoint retired it in turn.
    assert_eq!(journal_files(), ["journal-w0.000003.jsonl"]);
    assert!(
        saved_steps(&ckpt) >= optimiser_steps,
        "the optimiser continued from the checkpoint"
    );
    let newest = std::fs::read_dir(run_dir.join("weights"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let n = e
                .file_name()
                .to_string_lossy()
                .strip_prefix("step-")?
                .parse::<u64>()
                .ok()?;
            Some((n, e.path()))
        })
        .max()
        .expect("weights were published")
        .1;
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(newest.join("model.safetensors.index.json")).unwrap()).unwrap();
    let shards: std::collections::BTreeSet<&str> = index["weight_map"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        shards.into_iter().collect::<Vec<_>>(),
        [
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors"
        ]
    );
    assert!(!newest.join("model.safetensors").exists());
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(newest.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["dtype"], "bfloat16");
    let loaded = Weights::load_dir(&newest).unwrap();
    assert_eq!(loaded.len(), initial.len());
    for name in loaded.names() {
        let data = &loaded.get(name).unwrap().data;
        assert!(
            // A bf16 value is an f32 whose low 16 bits are zero.
            data.iter().all(|x| x.to_bits() & 0xffff == 0),
            "{name} holds values bf16 cannot"
        );
    }
    assert_eq!(sim.counters().live_routes, 0);
}

/// Issue 15's end to end: the in-process policy samples through the real proxy in each protocol (Chat
/// Completions at 0.6, Anthropic Messages at 1.3, Responses at the default), each at the temperature its
/// request asks for; the export records every token's temperature; and the GRPO step, under
/// `gconfig.temperature` 1.0, scores each trained token at its own temperature: the behaviour-to-proximal
/// drift of the first step is at f32 rounding, not the tenths that scoring 0.6 or 1.3 tokens at 1 would give.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tokens_sampled_at_each_protocols_temperature_train_without_drift() {
    use std::sync::Arc;

    use arena_rl::proxy_control::ProxyControl;
    use rollout_proxy::{ChatModel, ExportStyle, ProxyConfig, ProxyServer, ProxyState};
    use secrecy::{ExposeSecret as _, SecretString};
    use serde_json::json;

    let root = tempfile::tempdir().unwrap();
    let (model, _) = tiny_model(root.path());
    let engine = tokio::task::spawn_blocking({
        let model = model.clone();
        move || PolicyEngine::load(&model, 8, trainer::DeviceKind::Cpu).unwrap()
    })
    .await
    .unwrap();
    let mut proxy = ProxyConfig::new(SecretString::from("e2e-admin-key"));
    proxy.capacity_grants = false;
    let chat_model = Arc::new(ChatModel::from_dir(&model).unwrap());
    let state = ProxyState::new(proxy, chat_model, Arc::new(engine)).unwrap();
    let server = ProxyServer::start("127.0.0.1:0".parse().unwrap(), state)
        .await
        .unwrap();
    let base = format!("http://{}", server.local_addr());
    let control = ProxyControl::new(&base, SecretString::from("e2e-admin-key")).unwrap();
    let http = reqwest::Client::new();
    let user = json!([{"role": "user", "content": "What is the largest digit under key q3?"}]);
    let requests = [
        (
            "/v1/chat/completions",
            0.6,
            json!({"model": "m", "messages": user, "max_tokens": 16, "temperature": 0.6}),
        ),
        (
            "/v1/messages",
            1.3,
            json!({"model": "m", "messages": user, "max_tokens": 16, "temperature": 1.3}),
        ),
        (
            "/v1/responses",
            1.0,
            json!({"model": "m", "input": "What is the largest digit?", "max_output_tokens": 16}),
        ),
        // Truncated: the recorded log-probability is of the nucleus the token was drawn from.
        (
            "/v1/chat/completions",
            1.3,
            json!({"model": "m", "messages": user, "max_tokens": 16, "temperature": 1.3, "top_p": 0.8}),
        ),
    ];
    let mut samples = Vec::new();
    for round in 0..2u32 {
        for (i, (path, temperature, body)) in requests.iter().enumerate() {
            let session = control.start(&format!("e2e-{round}-{i}")).await.unwrap();
            let key = session.api_key.expose_secret().to_string();
            let reply = http
                .post(format!("{base}{path}"))
                .bearer_auth(&key)
                .header("x-api-key", &key)
                .json(body)
                .send()
                .await
                .unwrap();
            assert!(
                reply.status().is_success(),
                "{path}: {}",
                reply.text().await.unwrap()
            );
            control.end(&session.session_id).await.unwrap();
            let export = control
                .export(&session.session_id, ExportStyle::Concat, 1.0, Some(1.0), None)
                .await
                .unwrap();
            for t in export.trajectories {
                let trained: Vec<f32> = t
                    .loss_mask
                    .iter()
                    .zip(&t.temperatures)
                    .filter(|(m, _)| **m != 0)
                    .map(|(_, t)| *t)
                    .collect();
                assert!(!trained.is_empty(), "{path} sampled tokens");
                assert!(
                    trained.iter().all(|t| (t - temperature).abs() < 1e-6),
                    "{path} recorded {trained:?}, asked {temperature}"
                );
                let n = samples.len() as u32;
                samples.push(TrainSample {
                    key: SampleKey {
                        eval: false,
                        step: 0,
                        group: 0,
                        sample: n,
                    },
                    token_ids: t.token_ids,
                    loss_mask: t.loss_mask,
                    logprobs: t.logprobs,
                    versions: t.versions,
                    temperatures: t.temperatures,
                    truncated: t.truncated,
                    advantage: if n.is_multiple_of(2) { 1.0 } else { -1.0 },
                    raw_reward: f64::from(n % 2),
                });
            }
        }
    }
    server.shutdown().await.unwrap();
    let run = config(
        "http://127.0.0.1:9",
        root.path(),
        &model,
        &["gconfig.temperature=1.0"],
    );
    let mut step = GrpoStep::from_run_config(&run, root.path()).unwrap();
    step.begin(1).unwrap();
    let batch = TrainBatch {
        group_sizes: vec![samples.len()],
        samples,
        policy_version: 0,
    };
    let out = tokio::task::spawn_blocking(move || step.train(0, &batch).unwrap())
        .await
        .unwrap();
    let metric = |name: &str| {
        out.metrics
            .iter()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", out.metrics))
            .1
    };
    let drift = metric("train/behave_logprob_drift/max");
    let mean = metric("train/behave_logprob_drift/mean");
    eprintln!(
        "behaviour-to-proximal drift through three protocols, untruncated: max {drift:.3e}, mean {mean:.3e}"
    );
    assert!(drift < 1e-5, "max drift {drift}");
    // Truncated tokens (top-p 0.8) are recorded under the nucleus they came from, whose mass is at least
    // 0.8: their drift is -ln(kept mass), in (0, -ln 0.8], which the behaviour weight corrects.
    let (t_mean, t_max) = (
        metric("train/behave_logprob_drift_truncated/mean"),
        metric("train/behave_logprob_drift_truncated/max"),
    );
    eprintln!("truncated (top-p 0.8): mean {t_mean:.3e}, max {t_max:.3e}");
    assert!(
        t_mean > 1e-3 && t_max <= -(0.8f64.ln()) + 1e-5,
        "truncated drift: mean {t_mean}, max {t_max}"
    );
    // Six of the eight sessions sampled at another temperature than gconfig.temperature.
    let off = metric("train/off_temperature_tokens");
    assert!(
        off > 0.5 && off < 0.9,
        "share of tokens sampled off gconfig.temperature: {off}"
    );
}
