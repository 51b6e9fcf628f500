//! Arena's current contract through the loop (`arena-2026.md` 2.4, 2.8): harness outcome codes from
//! arena-sim's harness reach the metrics, the exported trajectories' metadata and the audit shards, and
//! the failure policy decides what they mean for training.

use std::path::Path;

use arena_rl::run::{RunSummary, rollout_only};
use arena_sim::{ArenaSim, Receipt, RunnerDef, RunnerFault, World};
use serde_json::Value;

use crate::support::{OracleEngine, config, env, model_folder};

/// The quickstart world with every LLM runner ending its tasks with `fault`.
fn world_failing_with(fault: RunnerFault) -> World {
    let mut w = World::quickstart();
    w.token = "sim-token".into();
    for runner in w.runners.values_mut() {
        if let RunnerDef::Chat(d) | RunnerDef::Anthropic(d) | RunnerDef::Responses(d) = runner {
            d.faults = vec![fault.clone()];
        }
    }
    w
}

async fn rollout(sim: &ArenaSim, root: &Path, extra: &[&str]) -> RunSummary {
    let model = model_folder(root);
    let mut all = vec![
        "actor.total_train_steps=1",
        "train_dataset.batch_size=1",
        "gconfig.n_samples=2",
    ];
    all.extend_from_slice(extra);
    let config = config(&sim.base_url(), root, &model, &all);
    rollout_only(config, &env(), Some(OracleEngine::new(&model, 0).handle()))
        .await
        .expect("the rollout runs")
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn audit_lines(summary: &RunSummary) -> Vec<Value> {
    let dir = summary.run_dir.join("arena_results");
    std::fs::read_dir(&dir)
        .expect("audit shards")
        .flat_map(|e| jsonl(&e.expect("entry").path()))
        .collect()
}

/// A harness that failed with `AGENT_MAX_TURNS_EXCEEDED` after talking to the model: merged main trains it
/// at reward 0 and stamps the code on every exported trajectory; #1547's rules reject it; both count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_code_is_counted_stamped_and_audited_and_the_policy_decides_its_fate() {
    let fault = RunnerFault {
        outcome_code: Some("AGENT_MAX_TURNS_EXCEEDED".into()),
        after_run: true,
        ..RunnerFault::always("HARNESS_FAILED")
    };
    let sim = ArenaSim::start(world_failing_with(fault)).await.expect("sim");

    let root = tempfile::tempdir().expect("tempdir");
    let summary = rollout(&sim, root.path(), &[]).await;
    let metrics = &jsonl(&summary.metrics_dir.join("metrics.jsonl"))[0];
    assert_eq!(
        metrics["rollout/harness_error/AGENT_MAX_TURNS_EXCEEDED"], 1.0,
        "{metrics}"
    );
    assert_eq!(metrics["rollout/harness_error/OTHER"], 0.0, "{metrics}");
    assert_eq!(metrics["rollout/harness_success"], 0.0, "{metrics}");
    assert_eq!(metrics["rollout/decision/zero_reward"], 1.0, "{metrics}");
    assert!(
        metrics["rollout/num_turns_harness_err/AGENT_MAX_TURNS_EXCEEDED"]
            .as_f64()
            .unwrap()
            >= 1.0
    );
    assert_eq!(metrics["rollout/all_wrong"], 1.0, "{metrics}");
    let records = jsonl(&summary.run_dir.join("rollouts.jsonl"));
    assert_eq!(records.len(), 2);
    for rec in &records {
        assert_eq!(rec["verdict"]["kind"], "reward", "{rec}");
        let trajectories = rec["trajectories"].as_array().expect("trajectories");
        assert!(!trajectories.is_empty());
        for t in trajectories {
            let meta = &t["metadata"];
            assert_eq!(meta["harness_outcome_code"], "AGENT_MAX_TURNS_EXCEEDED", "{meta}");
            assert_eq!(meta["arena_status"], "HARNESS_FAILED", "{meta}");
            assert_eq!(meta["arena_task_id"], rec["task_id"], "{meta}");
            assert_eq!(meta["session_id"], t["session_id"], "{meta}");
        }
    }
    let audit = audit_lines(&summary);
    assert_eq!(audit.len(), 2);
    for line in &audit {
        assert_eq!(line["harness_outcome_code"], "AGENT_MAX_TURNS_EXCEEDED", "{line}");
        assert_eq!(line["training_score"], 0.0, "{line}");
        assert_eq!(line["arena_task_id"], line["task_id"], "{line}");
        assert!(
            line["session_id"].as_str().is_some_and(|s| !s.is_empty()),
            "{line}"
        );
    }

    let root = tempfile::tempdir().expect("tempdir");
    let summary = rollout(&sim, root.path(), &["econfig.arena_failure_policy=pr1547"]).await;
    let metrics = &jsonl(&summary.metrics_dir.join("metrics.jsonl"))[0];
    assert_eq!(
        metrics["rollout/harness_error/AGENT_MAX_TURNS_EXCEEDED"], 1.0,
        "{metrics}"
    );
    assert_eq!(metrics["rollout/decision/reject"], 1.0, "{metrics}");
    assert_eq!(metrics["rollout/reject/unknown_failure"], 1.0, "{metrics}");
    for line in audit_lines(&summary) {
        assert_eq!(line["training_score"], Value::Null, "{line}");
        assert_eq!(line["harness_outcome_code"], "AGENT_MAX_TURNS_EXCEEDED", "{line}");
    }
}

/// Receipts from arena-sim's harness (`arena-2026.md` 2.2, 2.4): under `strict_receipt` only the healthy one
/// makes a `HARNESS_FAILED` task a zero-reward model failure, and the audit line says what was wrong with the
/// others; merged main does not read receipts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_decide_harness_failures_under_the_strict_policy_only() {
    for (receipt, policy, trained, problem) in [
        (Receipt::Healthy, "strict_receipt", true, None),
        (
            Receipt::Incomplete,
            "strict_receipt",
            false,
            Some("nativeExportHealthy"),
        ),
        (
            Receipt::WrongVersion,
            "strict_receipt",
            false,
            Some("nativeRlReceiptVersion"),
        ),
        (
            Receipt::Vetoed,
            "strict_receipt",
            false,
            Some("GameAgent outcome"),
        ),
        (Receipt::Healthy, "merged_main", false, None),
    ] {
        let fault = RunnerFault {
            receipt: Some(receipt),
            after_run: true,
            ..RunnerFault::always("HARNESS_FAILED")
        };
        let sim = ArenaSim::start(world_failing_with(fault)).await.expect("sim");
        let root = tempfile::tempdir().expect("tempdir");
        let policy_override = format!("econfig.arena_failure_policy={policy}");
        let summary = rollout(&sim, root.path(), &[&policy_override]).await;
        let what = format!("{receipt:?} under {policy}");
        let metrics = &jsonl(&summary.metrics_dir.join("metrics.jsonl"))[0];
        let decision = if trained { "zero_reward" } else { "reject" };
        assert_eq!(
            metrics[format!("rollout/decision/{decision}")],
            1.0,
            "{what}: {metrics}"
        );
        for line in audit_lines(&summary) {
            let expected_score = if trained { Value::from(0.0) } else { Value::Null };
            assert_eq!(line["training_score"], expected_score, "{what}: {line}");
            let reason = if trained {
                Value::Null
            } else {
                Value::from("unknown_failure")
            };
            assert_eq!(line["rejection_reason"], reason, "{what}: {line}");
            match problem {
                Some(p) => assert!(
                    line["receipt_problem"].as_str().is_some_and(|s| s.contains(p)),
                    "{what}: {line}"
                ),
                None => assert_eq!(line["receipt_problem"], Value::Null, "{what}: {line}"),
            }
        }
    }
}

/// `arena-2026.md` 2.7, 2.9 and 2.13 through the loop: with `gconfig.reject_terminal_task_failures` an
/// unattributed `HARNESS_FAILED` drops only its sample and its group trains on the rest (down to
/// `gconfig.min_usable_group_size`); training launches carry `DSH_LLM_REQUEST_TIMEOUT_SECONDS=7200` unless
/// the run sets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unattributed_failures_drop_only_their_sample_down_to_the_usable_minimum() {
    let fault = RunnerFault {
        probability: 0.4,
        ..RunnerFault::always("HARNESS_FAILED")
    };
    let mut w = world_failing_with(fault);
    w.seed = 11;
    let sim = ArenaSim::start(w).await.expect("sim");
    let common = [
        "train_dataset.batch_size=3",
        "gconfig.n_samples=4",
        "gconfig.reward_normalization=true",
        "actor.reward_norm=null",
        "gconfig.reward_normalization_use_std=false",
        "gconfig.reject_terminal_task_failures=true",
    ];

    let root = tempfile::tempdir().expect("tempdir");
    let summary = rollout(&sim, root.path(), &common).await;
    let records = jsonl(&summary.run_dir.join("rollouts.jsonl"));
    let dropped = records
        .iter()
        .filter(|r| r["verdict"]["kind"] == "dropped" && r["verdict"]["reason"] == "unknown_failure")
        .count();
    assert!(dropped > 0, "some samples failed: {records:?}");
    assert!(
        !summary.rejected_groups.keys().any(|k| k.starts_with("sample_")),
        "no group fails for one sample: {:?}",
        summary.rejected_groups
    );
    let metrics = &jsonl(&summary.metrics_dir.join("metrics.jsonl"))[0];
    assert!(
        metrics["rollout/sample_level_rejection"].as_f64().unwrap() > 0.0,
        "{metrics}"
    );
    for launch in sim.requests_to(arena_sim::Endpoint::LaunchOneTask) {
        let body = launch.body.expect("a body");
        assert_eq!(body["envs"]["DSH_LLM_REQUEST_TIMEOUT_SECONDS"], "7200", "{body}");
    }

    // Every sample of a group must be usable now: groups that lost one are rejected (as too small, or with
    // nothing left), and an explicit harness timeout wins. The seed fixes how many of the 12 task ids fail.
    let root = tempfile::tempdir().expect("tempdir");
    let before = sim.requests_to(arena_sim::Endpoint::LaunchOneTask).len();
    let mut strict = common.to_vec();
    strict.extend([
        "gconfig.min_usable_group_size=4",
        "econfig.arena_task_envs={DSH_LLM_REQUEST_TIMEOUT_SECONDS: '60'}",
    ]);
    let summary = rollout(&sim, root.path(), &strict).await;
    // Which row a failing task belongs to depends on launch order, so a group may lose all four.
    let count = |k: &str| summary.rejected_groups.get(k).copied().unwrap_or(0);
    let rejected = count("too_few_usable") + count("all_dropped");
    let records = jsonl(&summary.run_dir.join("rollouts.jsonl"));
    let groups_with_a_drop: std::collections::BTreeSet<_> = records
        .iter()
        .filter(|r| r["verdict"]["kind"] == "dropped")
        .map(|r| r["data_id"].clone().to_string())
        .collect();
    assert!(
        !groups_with_a_drop.is_empty() && rejected as usize == groups_with_a_drop.len(),
        "{:?}",
        summary.rejected_groups
    );
    for launch in &sim.requests_to(arena_sim::Endpoint::LaunchOneTask)[before..] {
        let body = launch.body.clone().expect("a body");
        assert_eq!(body["envs"]["DSH_LLM_REQUEST_TIMEOUT_SECONDS"], "60", "{body}");
    }
}
