//! The integrity guard end to end through the loop: arena-sim's shell rows replay commands as `bash` calls
//! in each protocol through the real proxy, and each Stream's policy (`record`, `zero`, `reject`) is seen
//! down to the reward or rejection, the step metrics and the audit record.

use std::collections::BTreeMap;

use arena_rl::run::rollout_only;
use arena_sim::tasks::shell::ShellTask;
use arena_sim::{ArenaSim, RunnerDef, StreamDef, World};
use serde_json::Value;

use crate::support::{OracleEngine, config, env, model_folder, step_metrics};

const BASE: &str = "c0ffee1234abcdef";

/// The script every shell row replays: one harmless command, one history lookup, one object named by a
/// hash (the row's base commit on one Stream), one upstream fetch hidden in Python.
const SCRIPT: [&str; 4] = [
    "git status",
    "cd /testbed && git --no-pager log --all --oneline | head -5",
    "git show c0ffee1234:src/lib.rs",
    "python3 -c \"import subprocess; subprocess.run(['git', 'fetch', 'origin'])\"",
];

/// The quickstart Arena plus one shell Stream per protocol, each with one row of [`SCRIPT`]; the
/// Responses row gives its base commit.
fn world() -> World {
    let mut w = World::quickstart();
    w.token = "sim-token".into();
    for def in w.runners.values_mut() {
        if let RunnerDef::Anthropic(d) | RunnerDef::Responses(d) | RunnerDef::Chat(d) = def {
            d.max_tokens = None;
        }
    }
    let tags = ShellTask::tags(&SCRIPT);
    for (stream, harness) in [
        ("sh-chat", "chat-sim"),
        ("sh-messages", "claude-sim"),
        ("sh-responses", "codex-sim"),
    ] {
        let mut tags: Vec<&str> = tags.iter().map(String::as_str).collect();
        let base = format!("base_commit:{BASE}");
        if stream == "sh-responses" {
            tags.push(&base);
        }
        w = w.stream(
            StreamDef::new(stream)
                .harness(harness, "1")
                .reward("sim-grader", "1")
                .row(&format!("{stream}-row"), &tags),
        );
    }
    w
}

fn stream(name: &str, harness: &str, protocol: &str) -> String {
    format!(
        "{{name: {name}, stream_id: {name}, harness: {harness}@1, llm_protocol: {protocol}, expected_reward_ref: {{key: sim-grader, version: \"1\"}}}}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_streams_policy_is_applied_to_its_hits_down_to_reward_metrics_and_audit() {
    let sim = ArenaSim::start(world()).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = model_folder(root.path());
    let streams = format!(
        "econfig.arena_streams=[{}, {}, {}]",
        stream("sh-chat", "chat-sim", "chat_completions"),
        stream("sh-messages", "claude-sim", "anthropic"),
        stream("sh-responses", "codex-sim", "responses"),
    );
    let config = config(
        &sim.base_url(),
        root.path(),
        &model,
        &[
            &streams,
            "econfig.arena_inbound_protos=[chat, anthropic, responses]",
            "actor.total_train_steps=1",
            "train_dataset.batch_size=3",
            "train_dataset.shuffle=false",
            "gconfig.n_samples=2",
            "gconfig.max_new_tokens=200",
            // sh-chat records (the run-wide default), sh-messages zeroes, sh-responses rejects and does not
            // scan for upstream fetches (a profile of its own).
            "guard.streams={sh-messages: {on_hit: zero}, sh-responses: {on_hit: reject, disable: [git-fetch]}}",
        ],
    );
    let summary = rollout_only(config, &env(), Some(OracleEngine::new(&model, 0).handle()))
        .await
        .unwrap();

    // Each rollout's verdict, by stream.
    let lines: Vec<Value> = std::fs::read_to_string(summary.run_dir.join("rollouts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut verdicts: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for l in &lines {
        verdicts
            .entry(l["stream"].as_str().unwrap().to_string())
            .or_default()
            .push(l["verdict"].clone());
    }
    let reward = |r: f64| serde_json::json!({"kind": "reward", "reward": r});
    let dropped = serde_json::json!({"kind": "dropped", "reason": "integrity_violation"});
    assert_eq!(verdicts["sh-chat"], [reward(1.0), reward(1.0)], "{lines:?}");
    assert_eq!(verdicts["sh-messages"], [reward(0.0), reward(0.0)], "{lines:?}");
    assert_eq!(verdicts["sh-responses"], [dropped.clone(), dropped], "{lines:?}");
    // The recorded trajectories carry the hits with what they matched.
    let trajectory_hits: std::collections::BTreeSet<String> = lines
        .iter()
        .filter(|l| l["stream"] == "sh-chat")
        .flat_map(|l| l["trajectories"].as_array().unwrap())
        .flat_map(|t| t["integrity_hits"].as_array().cloned().unwrap_or_default())
        .map(|h| h["rule"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        trajectory_hits.iter().map(String::as_str).collect::<Vec<_>>(),
        ["git-fetch", "git-log-all-refs", "git-object-by-hash"]
    );

    // The step's metrics: means over the step's six rollouts, and per Stream over its two.
    let (text, steps) = step_metrics(&summary.metrics_dir);
    let m = &steps[0];
    let metric = |name: &str| {
        m[name]
            .as_f64()
            .unwrap_or_else(|| panic!("{name} missing: {text}"))
    };
    // sh-chat and sh-messages: three hits each; sh-responses: one (its base commit is no evidence and
    // it does not scan for fetches).
    assert_eq!(metric("rollout/stream/sh-chat/integrity_hits"), 3.0);
    assert_eq!(metric("rollout/stream/sh-messages/integrity_hits"), 3.0);
    assert_eq!(metric("rollout/stream/sh-responses/integrity_hits"), 1.0);
    assert!((metric("rollout/reward/integrity_hits") - 7.0 / 3.0).abs() < 1e-9);
    assert_eq!(metric("rollout/reward/integrity_hits/git-log-all-refs"), 1.0);
    assert!((metric("rollout/reward/integrity_hits/git-object-by-hash") - 2.0 / 3.0).abs() < 1e-9);
    assert!((metric("rollout/reject/integrity_violation") - 1.0).abs() < 1e-9);

    // Every audit record names its hits; the rejected ones too.
    let audit = summary.run_dir.join("arena_results");
    let mut audited: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for shard in std::fs::read_dir(&audit).unwrap().flatten() {
        for line in std::fs::read_to_string(shard.path()).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            let hits = v["integrity_hits"].as_array().cloned().unwrap_or_default();
            assert!(
                hits.iter().all(|h| !h["matched"].as_str().unwrap().is_empty()),
                "{v}"
            );
            audited
                .entry(v["arena_stream_name"].as_str().unwrap().to_string())
                .or_default()
                .extend(hits.iter().map(|h| h["rule"].as_str().unwrap().to_string()));
        }
    }
    assert_eq!(audited["sh-responses"], ["git-log-all-refs", "git-log-all-refs"]);
    assert_eq!(audited["sh-chat"].len(), 6, "{audited:?}");

    // `arena-rl guard check` on the run's rollouts.jsonl decodes what the policy sampled and finds, with
    // the built-in rules, what the proxy found (the Responses rows' base commit travels in the metadata).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_arena-rl"))
        .args(["guard", "check", "--model"])
        .arg(&model)
        .stdin(std::fs::File::open(summary.run_dir.join("rollouts.jsonl")).unwrap())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let rules: std::collections::BTreeSet<&str> = v["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["rule"].as_str().unwrap())
            .collect();
        let expected = match v["record"]["stream"].as_str().unwrap() {
            // Rejected samples keep no trajectories in rollouts.jsonl.
            "sh-responses" => vec![],
            _ => vec!["git-fetch", "git-log-all-refs", "git-object-by-hash"],
        };
        assert_eq!(rules.into_iter().collect::<Vec<_>>(), expected, "{v}");
    }
    assert_eq!(sim.counters().live_routes, 0);
}
