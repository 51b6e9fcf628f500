//! Compacted sessions through the loop (`arena-2026.md` 2.10, 3.5): arena-sim's harness compacts its
//! context twice, so the real proxy records one episode as three `concat` chains; with
//! `proxy.episode_reward_for_export` the successful task's reward scores each chain once, and without it
//! only the newest chain carries it as set.

use std::path::Path;

use arena_rl::run::rollout_only;
use arena_sim::tasks::shell::ShellTask;
use arena_sim::{ArenaSim, RunnerDef, StreamDef, World};
use serde_json::Value;

use crate::support::{OracleEngine, config, env, model_folder};

/// Five commands and the answer: six model calls, compacted after the third and the fourth, so the chains
/// hold 3, 1 and 2 turns.
const SCRIPT: [&str; 5] = ["ls", "pwd", "git status", "cat README.md", "echo ok"];
const COMPACT_AFTER: [u32; 2] = [3, 4];

fn world() -> World {
    let mut w = World::quickstart();
    w.token = "sim-token".into();
    if let Some(RunnerDef::Chat(d)) = w.runners.get_mut("chat-sim") {
        d.max_tokens = None;
        d.compact_after_calls = COMPACT_AFTER.to_vec();
    }
    let tags = ShellTask::tags(&SCRIPT);
    let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
    w.stream(
        StreamDef::new("sh-chat")
            .harness("chat-sim", "1")
            .reward("sim-grader", "1")
            .row("sh-chat-row", &tags),
    )
}

/// Each rollout's exported trajectories: (interaction ids, reward, original reward) per chain.
async fn chains(sim: &ArenaSim, root: &Path, extra: &[&str]) -> Vec<Vec<(Vec<String>, f64, f64)>> {
    let model = model_folder(root);
    let mut all = vec![
        "econfig.arena_streams=[{name: sh-chat, stream_id: sh-chat, harness: chat-sim@1, llm_protocol: chat_completions, expected_reward_ref: {key: sim-grader, version: \"1\"}}]",
        "actor.total_train_steps=1",
        "train_dataset.batch_size=1",
        "gconfig.n_samples=2",
        "gconfig.max_new_tokens=200",
        "proxy.turn_discount=0.5",
    ];
    all.extend_from_slice(extra);
    let config = config(&sim.base_url(), root, &model, &all);
    let summary = rollout_only(config, &env(), Some(OracleEngine::new(&model, 0).handle()))
        .await
        .expect("the rollout runs");
    std::fs::read_to_string(summary.run_dir.join("rollouts.jsonl"))
        .expect("rollouts.jsonl")
        .lines()
        .map(|l| {
            let line: Value = serde_json::from_str(l).expect("a JSON line");
            assert_eq!(line["verdict"]["reward"], 1.0, "the script ran: {line}");
            line["trajectories"]
                .as_array()
                .expect("trajectories")
                .iter()
                .map(|t| {
                    let ids = t["interaction_ids"]
                        .as_array()
                        .expect("ids")
                        .iter()
                        .map(|i| i.as_str().expect("an id").to_string())
                        .collect();
                    let number = |k: &str| t[k].as_f64().expect("a number");
                    (ids, number("reward"), number("original_reward"))
                })
                .collect()
        })
        .collect()
}

/// `test_arena_compacted_episode_scores_all_actions_once` and the default that infers nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_compacted_episode_scores_each_chain_once_only_when_asked() {
    let sim = ArenaSim::start(world()).await.expect("sim");
    let root = tempfile::tempdir().expect("tempdir");
    let asked = chains(&sim, root.path(), &["proxy.episode_reward_for_export=true"]).await;
    assert_eq!(asked.len(), 2, "two rollouts");
    for rollout in &asked {
        let sizes: Vec<usize> = rollout.iter().map(|(ids, _, _)| ids.len()).collect();
        assert_eq!(sizes, [3, 1, 2], "three chains: {rollout:?}");
        let mut turns: Vec<&String> = rollout.iter().flat_map(|(ids, _, _)| ids).collect();
        turns.sort();
        turns.dedup();
        assert_eq!(turns.len(), 6, "every turn in exactly one chain: {rollout:?}");
        for (_, reward, original) in rollout {
            assert_eq!((*reward, *original), (1.0, 1.0), "{rollout:?}");
        }
    }

    let root = tempfile::tempdir().expect("tempdir");
    let plain = chains(&sim, root.path(), &[]).await;
    for rollout in &plain {
        let rewards: Vec<(f64, f64)> = rollout.iter().map(|(_, r, o)| (*r, *o)).collect();
        // Discounted over the session's turns newest first (0.5 per turn): the newest chain's 2 turns,
        // then 1, then 3 more.
        assert_eq!(
            rewards,
            [(0.5f64.powi(3), 0.0), (0.5f64.powi(2), 0.0), (1.0, 1.0)],
            "only the newest chain is scored as set: {rollout:?}"
        );
    }
}
