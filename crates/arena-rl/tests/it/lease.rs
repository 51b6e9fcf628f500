//! The route lease through the loop (`arena-2026.md` 2.12): in `gateway` mode a task that waits in Arena's
//! queue longer than Arena keeps an idle route still reaches the model, because the run renews its route.

use arena_rl::run::rollout_only;
use arena_sim::{ArenaSim, RunnerDef, World};
use serde_json::Value;

use crate::support::{OracleEngine, config, env, model_folder};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_route_outlives_a_queue_longer_than_arenas_idle_limit() {
    let mut w = World::quickstart();
    w.token = "sim-token".into();
    w.route_gc_idle_ms = Some(300);
    for runner in w.runners.values_mut() {
        if let RunnerDef::Chat(d) | RunnerDef::Anthropic(d) | RunnerDef::Responses(d) = runner {
            d.start_delay_ms = 1000;
        }
    }
    let sim = ArenaSim::start(w).await.expect("sim");
    let root = tempfile::tempdir().expect("tempdir");
    let model = model_folder(root.path());
    let config = config(
        &sim.base_url(),
        root.path(),
        &model,
        &[
            "actor.total_train_steps=1",
            "train_dataset.batch_size=1",
            "gconfig.n_samples=1",
            "econfig.arena_llm_route_mode=gateway",
            "econfig.arena_registration_probe_interval=0.05",
        ],
    );
    let summary = rollout_only(config, &env(), Some(OracleEngine::new(&model, 0).handle()))
        .await
        .expect("the rollout runs");
    let line: Value = serde_json::from_str(
        std::fs::read_to_string(summary.metrics_dir.join("metrics.jsonl"))
            .expect("metrics")
            .lines()
            .next()
            .expect("a line"),
    )
    .expect("json");
    assert_eq!(line["rollout/arena/registration_renew_success"], 1.0, "{line}");
    assert_eq!(
        line["rollout/harness_success"], 1.0,
        "the harness reached the model: {line}"
    );
    let c = sim.counters();
    assert_eq!((c.gc_removals, c.live_routes), (0, 0), "{c:?}");
}
