//! The loop end to end: arena-sim in-process (quickstart world), the real proxy on a socket, the real chat
//! harness calling it through the sim's gateway, and an engine that answers the tasks.

use std::path::Path;

use arena_rl::observe::tfevents::read_events;
use arena_rl::run::{Plugins, RunSummary, rollout_only, train};
use arena_rl::train::FrozenPolicy;
use arena_sim::{ArenaSim, Endpoint, FaultKind, FaultRule, RunnerDef, RunnerFault, World};
use serde_json::Value;

use crate::support::{OracleEngine, config, env, model_folder};

fn world() -> World {
    let mut w = World::quickstart();
    w.token = "sim-token".into();
    w
}

fn metrics_lines(summary: &RunSummary) -> Vec<Value> {
    std::fs::read_to_string(summary.metrics_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn rollout(sim: &ArenaSim, root: &Path, extra: &[&str]) -> RunSummary {
    let model = model_folder(root);
    let mut all = vec![
        "actor.total_train_steps=1",
        "train_dataset.batch_size=1",
        "gconfig.n_samples=1",
    ];
    all.extend_from_slice(extra);
    let config = config(&sim.base_url(), root, &model, &all);
    rollout_only(config, &env(), Some(OracleEngine::new(&model, 0).handle()))
        .await
        .unwrap()
}

/// A run of one step of one one-sample group, set up but not started.
async fn one_sample_run(sim: &ArenaSim, root: &Path) -> arena_rl::run::Run {
    let model = model_folder(root);
    let config = config(
        &sim.base_url(),
        root,
        &model,
        &[
            "actor.total_train_steps=1",
            "train_dataset.batch_size=1",
            "gconfig.n_samples=1",
        ],
    );
    arena_rl::run::setup(config, &env(), Some(OracleEngine::new(&model, 0).handle()))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_loop_trains_on_the_sim_and_leaves_nothing_behind() {
    let sim = ArenaSim::start(world()).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = model_folder(root.path());
    let config = config(
        &sim.base_url(),
        root.path(),
        &model,
        &[
            "actor.total_train_steps=3",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=4",
            "rollout.max_head_offpolicyness=1",
            "eval_every=2",
            "valid_dataset={batch_size: 1}",
        ],
    );
    let summary = train(
        config,
        &env(),
        Plugins {
            engine: Some(OracleEngine::new(&model, 3).handle()),
            step: Box::new(FrozenPolicy::default()),
        },
    )
    .await
    .unwrap();
    assert_eq!(summary.steps_trained, 3);
    let lines = metrics_lines(&summary);
    assert_eq!(lines.len(), 3);
    for (k, line) in lines.iter().enumerate() {
        assert_eq!(line["step"], k as u64);
        let reward = line["rollout/reward"]
            .as_f64()
            .expect("rollout/reward every step");
        assert!((0.0..=1.0).contains(&reward), "{reward}");
        assert_eq!(line["rollout/arena/session_gateway_route"], 1.0);
        assert_eq!(line["rollout/arena/launch_success"], 1.0);
        assert_eq!(line["policy/version"], (k + 1) as f64);
        // The oracle samples every token at log-probability -0.5; without dynamic sampling a step draws its
        // batch only.
        assert_eq!(line["rollout/sampled_nll"], 0.5, "{line}");
        assert_eq!(line["rollout/groups_drawn"], 2.0);
        assert_eq!(line["rollout/draw_rounds"], 1.0);
    }
    // Evaluation after step 1 (eval_every=2), recorded once under eval-rollout/ with the row's domain.
    assert!(lines[1]["eval-rollout/reward"].is_number(), "{}", lines[1]);
    assert!(lines[1]["eval-rollout/min/reward"].is_number(), "{}", lines[1]);
    assert!(lines[0].get("eval-rollout/reward").is_none());
    // Every group trained or was rejected with a counted reason.
    let rejected: u64 = summary.rejected_groups.values().sum();
    assert_eq!(
        summary.accepted_groups + rejected,
        6,
        "{:?}",
        summary.rejected_groups
    );
    assert!(summary.accepted_groups > 0);
    // TensorBoard reads the same scalars.
    let tb_dir = summary.metrics_dir.join("tensorboard");
    let file = std::fs::read_dir(&tb_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let events = read_events(&file).unwrap();
    let tb_rewards: Vec<(i64, f32)> = events
        .iter()
        .flat_map(|e| {
            e.scalars
                .iter()
                .filter(|(t, _)| t == "rollout/reward")
                .map(move |(_, v)| (e.step, *v))
        })
        .collect();
    assert_eq!(tb_rewards.len(), 3);
    for (k, line) in lines.iter().enumerate() {
        assert_eq!(tb_rewards[k].0, k as i64);
        assert!((f64::from(tb_rewards[k].1) - line["rollout/reward"].as_f64().unwrap()).abs() < 1e-6);
    }
    let png = summary.reward_curve.clone().unwrap();
    assert_eq!(&std::fs::read(&png).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
    let saved = std::fs::read_to_string(summary.run_dir.join("config.yaml")).unwrap();
    assert!(saved.contains("experiment_name: quickstart"));
    // The loop's state rides in the checkpoint's caller blob.
    let ckpt = summary.checkpoint.as_ref().unwrap();
    assert!(ckpt.ends_with("step-3"), "{}", ckpt.display());
    let (dir, meta) = arena_rl::run::latest_checkpoint(ckpt.parent().unwrap())
        .unwrap()
        .unwrap();
    assert_eq!(&dir, ckpt);
    assert_eq!((meta.steps, meta.version, meta.data_cursor), (3, 3, 3));
    // The checkpoint started journal segment 1, which carries what resuming needs, and retired segment 0.
    assert_eq!(meta.journal_segment, 1);
    let journal_files: Vec<String> = std::fs::read_dir(summary.run_dir.join("journal"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(journal_files, ["journal-w0.000001.jsonl"], "segment 0 is retired");
    let journal = summary.run_dir.join("journal/journal-w0.000001.jsonl");
    assert!(meta.journal_bytes > 0 && meta.journal_bytes <= std::fs::metadata(&journal).unwrap().len());
    let (_, replayed) =
        arena_rl::journal::Journal::open(&journal.with_file_name("journal-w0.jsonl")).unwrap();
    assert!(
        replayed.rollouts.is_empty(),
        "segment 1 carries the rollouts of step 3 on, and the run ends at 3: {:?}",
        replayed.rollouts.keys().collect::<Vec<_>>()
    );
    assert!(replayed.open_routes.is_empty() && replayed.open_tasks.is_empty());
    // Audit shards as reward-routing writes them.
    let audit = summary.run_dir.join("arena_results");
    let shards: Vec<_> = std::fs::read_dir(&audit).unwrap().flatten().collect();
    assert!(!shards.is_empty());
    // Nothing leaked: no route left in Arena.
    let c = sim.counters();
    assert_eq!(c.live_routes, 0, "{c:?}");
    assert_eq!(c.registrations, 1, "one session-gateway route for the whole run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn injected_faults_end_in_trained_or_counted_groups_and_nothing_leaks() {
    let mut w = world();
    w.seed = 7;
    if let Some(RunnerDef::Chat(def)) = w.runners.get_mut("chat-sim") {
        def.faults = vec![
            RunnerFault {
                status: "HARNESS_FAILED".into(),
                probability: 0.1,
                ..Default::default()
            },
            RunnerFault {
                status: "EVAL_FAILED".into(),
                probability: 0.05,
                ..Default::default()
            },
        ];
    }
    w.faults = vec![
        FaultRule::on(Endpoint::TaskResult, FaultKind::Status(429)).probability(0.2),
        FaultRule::on(Endpoint::TaskResult, FaultKind::Status(503)).probability(0.1),
        FaultRule::on(Endpoint::LaunchOneTask, FaultKind::Drop).probability(0.1),
        FaultRule::on(Endpoint::GatewayChat, FaultKind::Status(502)).probability(0.05),
        FaultRule::on(Endpoint::LaunchOneTask, FaultKind::GcRoute).probability(0.15),
    ];
    let sim = ArenaSim::start(w).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = model_folder(root.path());
    let config = config(
        &sim.base_url(),
        root.path(),
        &model,
        &[
            "actor.total_train_steps=3",
            "train_dataset.batch_size=3",
            "gconfig.n_samples=3",
            "econfig.arena_request_retries=2",
            "econfig.arena_registration_probe_interval=0.01",
        ],
    );
    let summary = train(
        config,
        &env(),
        Plugins {
            engine: Some(OracleEngine::new(&model, 2).handle()),
            step: Box::new(FrozenPolicy::default()),
        },
    )
    .await
    .unwrap();
    let rejected: u64 = summary.rejected_groups.values().sum();
    assert_eq!(
        summary.accepted_groups + rejected,
        9,
        "{:?}",
        summary.rejected_groups
    );
    let c = sim.counters();
    assert!(c.faults.values().sum::<u64>() > 0, "{c:?}");
    assert_eq!(c.live_routes, 0, "{c:?}");
    // Every rejection is counted in the metrics under its reason.
    let lines = metrics_lines(&summary);
    let counted: f64 = lines
        .iter()
        .flat_map(|l| l.as_object().unwrap().iter())
        .filter(|(k, _)| k.starts_with("rollout/group_rejected/"))
        .map(|(_, v)| v.as_f64().unwrap())
        .sum();
    assert_eq!(counted as u64, rejected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_mode_end_to_end_8_1_21() {
    let sim = ArenaSim::start(world()).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let summary = rollout(&sim, root.path(), &["econfig.arena_llm_route_mode=gateway"]).await;
    let line = &metrics_lines(&summary)[0];
    for m in [
        "registration_success",
        "launch_success",
        "terminal_success",
        "call_success",
        "cleanup_success",
        "result_processing_success",
    ] {
        assert_eq!(line[format!("rollout/arena/{m}")], 1.0, "{m}: {line}");
    }
    assert_eq!(line["rollout/reward"], 1.0, "{line}");
    let launch = &sim.requests_to(Endpoint::LaunchOneTask)[0];
    let body: Value = launch.body.clone().unwrap();
    assert_eq!(body["base_url"], sim.gateway_url());
    assert_eq!(body["api_key"], "sim-llm-key");
    assert_eq!(body["harness"], "chat-sim@1");
    assert!(body["model_name"].as_str().unwrap().starts_with("stream-areal-"));
    let c = sim.counters();
    assert_eq!((c.registrations, c.deletions, c.live_routes), (1, 1, 0));
    let out = std::fs::read_to_string(summary.run_dir.join("rollouts.jsonl")).unwrap();
    let rec: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(rec["verdict"]["kind"], "reward");
    assert!(!rec["trajectories"].as_array().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_registration_response_deletes_the_name_8_1_33() {
    let mut w = world();
    w.faults = vec![FaultRule::on(Endpoint::RegisterModel, FaultKind::Drop).times(1)];
    let sim = ArenaSim::start(w).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let summary = rollout(
        &sim,
        root.path(),
        &[
            "econfig.arena_llm_route_mode=gateway",
            "econfig.arena_request_retries=0",
            "econfig.arena_registration_timeout=2",
        ],
    )
    .await;
    let line = &metrics_lines(&summary)[0];
    assert_eq!(line["rollout/arena/registration_success"], 0.0, "{line}");
    assert_eq!(line["rollout/arena/cleanup_success"], 1.0, "{line}");
    assert_eq!(sim.requests_to(Endpoint::DeleteModel).len(), 1);
    assert_eq!(sim.requests_to(Endpoint::LaunchOneTask).len(), 0);
    assert_eq!(sim.counters().live_routes, 0);
    assert_eq!(
        summary.rejected_groups.get("sample_arena_error"),
        Some(&1),
        "{:?}",
        summary.rejected_groups
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_failed_is_a_typed_failure_8_1_54() {
    let mut w = world();
    if let Some(RunnerDef::Chat(def)) = w.runners.get_mut("chat-sim") {
        def.faults = vec![RunnerFault {
            status: "COLLECT_FAILED".into(),
            probability: 1.0,
            ..Default::default()
        }];
    }
    let sim = ArenaSim::start(w).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let summary = rollout(&sim, root.path(), &["econfig.arena_llm_route_mode=gateway"]).await;
    let line = &metrics_lines(&summary)[0];
    for (m, v) in [
        ("call_success", 0.0),
        ("terminal_success", 0.0),
        ("registration_success", 1.0),
        ("launch_success", 1.0),
        ("cleanup_success", 1.0),
    ] {
        assert_eq!(line[format!("rollout/arena/{m}")], v, "{m}: {line}");
    }
    assert_eq!(
        summary.rejected_groups.get("sample_system_failure"),
        Some(&1),
        "{:?}",
        summary.rejected_groups
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_failure_survives_a_cleanup_failure_8_1_56() {
    let mut w = world();
    w.faults = vec![
        FaultRule::on(Endpoint::RegisterModel, FaultKind::Status(500)),
        FaultRule::on(Endpoint::DeleteModel, FaultKind::Status(500)),
    ];
    let sim = ArenaSim::start(w).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let summary = rollout(
        &sim,
        root.path(),
        &[
            "econfig.arena_llm_route_mode=gateway",
            "econfig.arena_request_retries=0",
        ],
    )
    .await;
    let line = &metrics_lines(&summary)[0];
    assert_eq!(line["rollout/arena/registration_success"], 0.0, "{line}");
    assert_eq!(line["rollout/arena/cleanup_success"], 0.0, "{line}");
    assert_eq!(
        sim.requests_to(Endpoint::DeleteModel).len(),
        1,
        "cleanup attempted once"
    );
    let out = std::fs::read_to_string(summary.run_dir.join("rollouts.jsonl")).unwrap();
    let rec: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert!(
        rec["verdict"]["message"].as_str().unwrap().contains("500"),
        "the registration error survives: {rec}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanup_failure_keeps_a_valid_reward_8_1_57() {
    let mut w = world();
    w.faults = vec![FaultRule::on(Endpoint::DeleteModel, FaultKind::Status(500))];
    let sim = ArenaSim::start(w).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let summary = rollout(
        &sim,
        root.path(),
        &[
            "econfig.arena_llm_route_mode=gateway",
            "econfig.arena_request_retries=0",
        ],
    )
    .await;
    let line = &metrics_lines(&summary)[0];
    assert_eq!(line["rollout/arena/cleanup_success"], 0.0, "{line}");
    assert_eq!(line["rollout/reward"], 1.0, "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_route_through_their_stream_and_audit_0600_8_2_21() {
    let sim = ArenaSim::start(world()).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let summary = rollout(
        &sim,
        root.path(),
        &[
            "econfig.arena_streams=[{name: b, stream_id: sim-chat, harness: chat-sim@1, task_envs: {MY_FLAG: \"on\", GITHUB_PAT: ghp_0123456789}, reward_threshold: 0.98, reward_transform_fn: astra_partial_reward, expected_reward_ref: {key: sim-grader, version: \"1\"}}]",
            // A credential that ends up in another field (as `${env:ARENA_LLM_API_KEY}` would put it).
            "trial_name=t-sim-llm-key",
        ],
    )
    .await;
    let launch = &sim.requests_to(Endpoint::LaunchOneTask)[0];
    let body: Value = launch.body.clone().unwrap();
    assert_eq!(body["envs"]["MY_FLAG"], "on");
    assert_eq!(body["envs"]["GITHUB_PAT"], "ghp_0123456789");
    // Issue 30 item 8: the saved config is private and withholds every Harness environment value and every
    // known secret by value (before: mode 0644, `ghp_0123456789` and `sim-llm-key` in clear).
    use std::os::unix::fs::PermissionsExt as _;
    let saved_path = summary.run_dir.join("config.yaml");
    assert_eq!(
        std::fs::metadata(&saved_path).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let saved = std::fs::read_to_string(&saved_path).unwrap();
    for secret in ["ghp_0123456789", "sim-llm-key", "sim-token", ": on"] {
        assert!(!saved.contains(secret), "{secret} in the saved config:\n{saved}");
    }
    assert!(saved.contains("trial_name: t-<redacted>"), "{saved}");
    assert_eq!(body["harness"], "chat-sim@1");
    // The live reward-ref check before the launch.
    assert!(!sim.requests_to(Endpoint::GetStream).is_empty());
    let line = &metrics_lines(&summary)[0];
    assert_eq!(line["rollout/arena/reward_ref_validation_success"], 1.0, "{line}");
    assert_eq!(line["rollout/stream/b/training_score"], 1.0, "{line}");
    let audit = summary.run_dir.join("arena_results");
    let shard = std::fs::read_dir(&audit).unwrap().next().unwrap().unwrap().path();
    assert_eq!(
        std::fs::metadata(&shard).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let record: Value =
        serde_json::from_str(std::fs::read_to_string(&shard).unwrap().lines().next().unwrap()).unwrap();
    assert_eq!(record["arena_stream_name"], "b");
    assert_eq!(record["expected_reward_ref"]["key"], "sim-grader");
    assert_eq!(record["training_score"], 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_reward_ref_drift_rejects_before_launch_8_2_23() {
    let sim = ArenaSim::start(world()).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let run = one_sample_run(&sim, root.path()).await;
    // The grader rolls out after the rows were loaded.
    sim.set_reward_ref("sim-chat", Some(arena_sim::RefDef::new("sim-grader", "2")));
    let collected = run
        .collect(0, reward_routing::Scope::Rollout, &Default::default())
        .await
        .expect("the journal is writable");
    let record = &collected.groups[0].records[0];
    match &record.verdict {
        arena_rl::journal::Verdict::Rejected { message, .. } => {
            assert!(message.contains("drifted before launch"), "{message}")
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    assert!(sim.requests_to(Endpoint::LaunchOneTask).is_empty());
    run.workflow.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_loaded_under_another_reward_ref_is_rejected_before_launch_8_2_22() {
    let sim = ArenaSim::start(world()).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let run = one_sample_run(&sim, root.path()).await;
    // A row that was loaded under another grader than the one its stream pins.
    let mut row = run
        .rows
        .iter()
        .find(|r| r.stream == "sim-chat")
        .expect("a sim-chat row")
        .clone();
    row.reward_ref = stream_config::RewardRef {
        key: "sim-grader".into(),
        version: "0".into(),
    };
    let key = arena_rl::journal::SampleKey {
        eval: false,
        step: 0,
        group: 0,
        sample: 0,
    };
    let (record, _) = run
        .workflow
        .run_sample(key, &row, reward_routing::Scope::Rollout)
        .await
        .expect("the journal is writable");
    match &record.verdict {
        arena_rl::journal::Verdict::Rejected { message, .. } => {
            assert!(message.contains("reward_ref mismatch for row"), "{message}");
            assert!(message.contains("sim-grader@0"), "{message}");
            assert!(message.contains("expects sim-grader@1"), "{message}");
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    // Nothing reached Arena for it: no route, no launch.
    assert!(sim.requests_to(Endpoint::LaunchOneTask).is_empty());
    assert!(run.workflow.close().await.unwrap().is_empty());
}

/// `train_dataset.drop_last` reaches the run: without it, an epoch's last step rolls out the short tail and
/// an epoch takes one step more; with it, the tail is left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_last_decides_whether_the_tail_is_rolled_out() {
    let sim = ArenaSim::start(world()).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let rows = one_sample_run(&sim, root.path()).await.rows.len();
    assert!(rows >= 3, "the world has {rows} rows");
    let batch = rows - 1;
    for drop_last in [true, false] {
        let root = tempfile::tempdir().unwrap();
        let model = model_folder(root.path());
        let config = config(
            &sim.base_url(),
            root.path(),
            &model,
            &[
                &format!("train_dataset.batch_size={batch}"),
                &format!("train_dataset.drop_last={drop_last}"),
                "train_dataset.shuffle=false",
                "gconfig.n_samples=1",
            ],
        );
        let run = arena_rl::run::setup(config, &env(), Some(OracleEngine::new(&model, 0).handle()))
            .await
            .unwrap();
        let (steps, last) = if drop_last { (1, batch) } else { (2, 1) };
        // One pass over the rows (the default of `actor.total_train_steps`, which the quickstart config sets).
        assert_eq!(
            run.train_cursor().batches_per_epoch(),
            steps,
            "drop_last={drop_last}"
        );
        let collected = run
            .collect(steps - 1, reward_routing::Scope::Rollout, &Default::default())
            .await
            .unwrap();
        assert_eq!(collected.groups.len(), last, "drop_last={drop_last}");
        run.workflow.close().await.unwrap();
    }
}

/// What this Arena can do in [`killed_launch`]: dedupe repeated `Idempotency-Key`s, cancel tasks.
#[derive(Clone, Copy)]
struct Can {
    dedupe: bool,
    cancel: bool,
}

/// A launch that a killed process sent without hearing back (a journaled `launch`, no `task`) is sent again
/// by the resumed run under the same `Idempotency-Key`: an Arena that honours the key
/// (`econfig.arena_idempotent_launch=true`) answers with the task it already started, so no second task
/// starts and the first is collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_launch_a_kill_left_unanswered_finds_its_task_where_arena_dedupes() {
    killed_launch(
        false,
        Can {
            dedupe: true,
            cancel: false,
        },
    )
    .await;
}

/// The same launch against an Arena that ignores the key: a second task starts, and the first, whose id
/// never reached the journal, cannot be cancelled even where Arena has the endpoint (the window the
/// resumed run names in its warning).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_launch_a_kill_left_unanswered_is_launched_again_where_arena_does_not_dedupe() {
    killed_launch(
        false,
        Can {
            dedupe: false,
            cancel: true,
        },
    )
    .await;
}

/// A launch Arena had answered before the kill (its task id journaled), where Arena can cancel: the resumed
/// run cancels that task as a leftover, and the sample's new launch carries a fresh key (`-r1`), so that
/// Arena starts a new task instead of answering with the cancelled one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_launch_answered_before_the_kill_is_cancelled_and_launched_afresh() {
    killed_launch(
        true,
        Can {
            dedupe: true,
            cancel: true,
        },
    )
    .await;
}

/// The same where Arena can cancel but ignores the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_launch_answered_before_the_kill_is_cancelled_where_arena_does_not_dedupe() {
    killed_launch(
        true,
        Can {
            dedupe: false,
            cancel: true,
        },
    )
    .await;
}

/// Where Arena dedupes but has no cancel endpoint (`econfig.arena_cancel_tasks=false`), the answered task
/// is not cancelled: the sample is relaunched under the key that started it, and the run collects it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_launch_answered_before_the_kill_is_collected_where_arena_dedupes_but_cannot_cancel() {
    killed_launch(
        true,
        Can {
            dedupe: true,
            cancel: false,
        },
    )
    .await;
}

/// Where Arena can do neither, the answered task is left to Arena (journaled as no longer ours, named in
/// the resume's warning), no cancel is sent, and the sample runs a task of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_launch_answered_before_the_kill_is_left_to_arena_where_it_can_do_neither() {
    killed_launch(
        true,
        Can {
            dedupe: false,
            cancel: false,
        },
    )
    .await;
}

async fn killed_launch(answered: bool, can: Can) {
    use arena_client::{ArenaClient, ClientConfig, LaunchRequest};
    use arena_rl::journal::{Entry, Journal, SampleKey};

    let mut world = world();
    world.dedupe_launches = can.dedupe;
    if !can.cancel {
        world.cancel_endpoint = arena_sim::CancelEndpoint::NotFound;
    }
    let sim = ArenaSim::start(world).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = model_folder(root.path());
    // The killed process's journal: its nonce, and the launch of s0g0:0 it was sending.
    let path = root.path().join("quickstart/local/journal/journal-w0.jsonl");
    let (journal, state) = Journal::open(&path).unwrap();
    let key = SampleKey {
        eval: false,
        step: 0,
        group: 0,
        sample: 0,
    };
    let idempotency_key = format!("quickstart-local-{}-{key}", state.nonce.unwrap());
    journal
        .append(&Entry::Launch {
            key,
            idempotency_key: Some(idempotency_key.clone()),
        })
        .unwrap();
    drop(journal);
    // The task that launch started in Arena before the kill; its harness talks to the dead process.
    let client =
        ArenaClient::new(ClientConfig::new(&sim.base_url(), "sim-token".to_string().into()).unwrap())
            .unwrap();
    let request = LaunchRequest {
        data_id: "sim-chat-row-0".to_string(),
        model_name: "killed-route".to_string(),
        base_url: "http://127.0.0.1:9/v1".to_string(),
        api_key: "killed-key".to_string().into(),
        envs: Default::default(),
        session_id: Some("killed-session".to_string()),
        harness: None,
    };
    let arena_client::Launched::Running { task_id: first } = client
        .launch_keyed("sim-chat", &request, Some(&idempotency_key), true)
        .await
        .unwrap()
    else {
        panic!("the sim answers a launch with a running task")
    };
    assert_eq!(sim.counters().launches, 1);
    if answered {
        let (journal, _) = Journal::open(&path).unwrap();
        journal
            .append(&Entry::Task {
                key,
                task_id: first.clone(),
            })
            .unwrap();
    }

    let config = config(
        &sim.base_url(),
        root.path(),
        &model,
        &[
            "actor.total_train_steps=1",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=2",
            // No checkpoint, so no journal segment retires the rollouts checked below.
            "checkpoint.save_every=0",
            &format!("econfig.arena_idempotent_launch={}", can.dedupe),
            &format!("econfig.arena_cancel_tasks={}", can.cancel),
        ],
    );
    let summary = train(
        config,
        &env(),
        Plugins {
            engine: Some(OracleEngine::new(&model, 2).handle()),
            step: Box::new(FrozenPolicy::default()),
        },
    )
    .await
    .unwrap();
    assert_eq!(summary.steps_trained, 1);
    let counters = sim.counters();
    let (_, state) = Journal::open(&path).unwrap();
    let record = &state.rollouts[&key];
    let cancels = counters.requests_to(Endpoint::CancelTask);
    let collected = record.task_id.as_deref() == Some(first.as_str());
    if answered && can.cancel {
        assert_eq!(
            cancels, 1,
            "the leftover task is cancelled (it may have ended already): {counters:?}"
        );
    } else {
        assert_eq!(
            cancels, 0,
            "no cancel is sent where it cannot help or Arena has none: {counters:?}"
        );
    }
    if can.dedupe && !(answered && can.cancel) {
        assert_eq!(counters.idempotent_replays, 1, "{counters:?}");
        assert_eq!(
            counters.launches, 4,
            "three new tasks and the killed launch's one: {counters:?}"
        );
        assert!(collected, "s0g0:0 collected its first task");
    } else {
        assert_eq!(counters.idempotent_replays, 0, "{counters:?}");
        assert_eq!(
            counters.launches, 5,
            "four new tasks besides the killed launch's one: {counters:?}"
        );
        assert!(!collected, "s0g0:0 ran a task of its own");
    }
    assert!(
        state.open_tasks.is_empty(),
        "every task collected: {:?}",
        state.open_tasks
    );
    assert!(
        state.launches_in_flight.is_empty(),
        "{:?}",
        state.launches_in_flight
    );
}
