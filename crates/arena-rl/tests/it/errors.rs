//! Setup failures are one clear line each, and nothing already journaled is lost.

use arena_rl::journal::{Entry, Journal};
use arena_rl::run::{Plugins, train};
use arena_rl::train::FrozenPolicy;
use arena_sim::{ArenaSim, World};

use crate::support::{OracleEngine, config, env, model_folder};

async fn failure(base: &str, root: &std::path::Path, extra: &[&str]) -> (arena_rl::Error, String) {
    let model = model_folder(root);
    let config = config(base, root, &model, extra);
    let err = train(
        config,
        &env(),
        Plugins {
            engine: Some(OracleEngine::new(&model, 0).handle()),
            step: Box::new(FrozenPolicy::default()),
        },
    )
    .await
    .expect_err("the run fails");
    let line = format!("{err:#}");
    assert!(!line.contains('\n'), "one line: {line}");
    (err, line)
}

fn sim_world() -> World {
    let mut w = World::quickstart();
    w.token = "sim-token".into();
    w
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_arena_keeps_the_journal() {
    let root = tempfile::tempdir().unwrap();
    let journal = root.path().join("quickstart/local/journal/journal-w0.jsonl");
    let (j, _) = Journal::open(&journal).unwrap();
    j.append(&Entry::Step { step: 0, version: 1 }).unwrap();
    drop(j);
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (err, line) = failure(
        &format!("http://{free}"),
        root.path(),
        &["econfig.arena_request_retries=0"],
    )
    .await;
    assert!(matches!(err, arena_rl::Error::ArenaUnreachable { .. }), "{err:?}");
    assert!(
        line.contains(&format!("cannot reach Arena at http://{free}")),
        "{line}"
    );
    let (_, state) = Journal::open(&journal).unwrap();
    assert_eq!(state.last_step, Some(0), "the journal survives");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_unhealthy() {
    let sim = ArenaSim::start(sim_world()).await.unwrap();
    sim.set_stream_status("sim-chat", Some("PAUSED"));
    let root = tempfile::tempdir().unwrap();
    let (err, line) = failure(&sim.base_url(), root.path(), &[]).await;
    assert!(matches!(err, arena_rl::Error::NoHealthyStream(_)), "{err:?}");
    assert!(
        line.contains("every stream is unhealthy: sim-chat (stream sim-chat is PAUSED, not ACTIVE)"),
        "{line}"
    );
}

/// Both quickstart Streams, so that one can be refused while the other is healthy.
const TWO_STREAMS: &str = "econfig.arena_streams=[{name: sim-chat, stream_id: sim-chat, harness: chat-sim@1, llm_protocol: chat_completions, expected_reward_ref: {key: sim-grader, version: \"1\"}}, {name: sim-messages, stream_id: sim-messages, harness: claude-sim@1, llm_protocol: anthropic, expected_reward_ref: {key: sim-grader, version: \"1\"}}]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_stops_the_run_unless_refused_streams_are_skipped() {
    let sim = ArenaSim::start(sim_world()).await.unwrap();
    sim.set_stream_status("sim-messages", Some("PAUSED"));
    let root = tempfile::tempdir().unwrap();
    let (_, line) = failure(&sim.base_url(), root.path(), &[TWO_STREAMS]).await;
    assert!(
        line.contains("Arena refused stream sim-messages (stream sim-messages is PAUSED, not ACTIVE)")
            && line.contains("econfig.arena_skip_refused_streams"),
        "{line}"
    );

    // Asked to skip: the run trains on sim-chat alone.
    let root = tempfile::tempdir().unwrap();
    let model = model_folder(root.path());
    let extra = [
        TWO_STREAMS,
        "econfig.arena_skip_refused_streams=true",
        "actor.total_train_steps=1",
    ];
    let config = config(&sim.base_url(), root.path(), &model, &extra);
    let summary = train(
        config,
        &env(),
        Plugins {
            engine: Some(OracleEngine::new(&model, 0).handle()),
            step: Box::new(FrozenPolicy::default()),
        },
    )
    .await
    .expect("the run trains on the stream Arena accepted");
    assert_eq!(summary.steps_trained, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_port_taken() {
    let sim = ArenaSim::start(sim_world()).await.unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let root = tempfile::tempdir().unwrap();
    let (err, line) = failure(&sim.base_url(), root.path(), &[&format!("proxy.port={port}")]).await;
    assert!(matches!(err, arena_rl::Error::ProxyPort { .. }), "{err:?}");
    assert!(
        line.contains(&format!(
            "cannot start the rollout proxy on 127.0.0.1:{port} (proxy.host, proxy.port)"
        )),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_from_another_model() {
    let sim = ArenaSim::start(sim_world()).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let meta = arena_rl::run::CheckpointMeta {
        steps: 3,
        version: 3,
        model_path: "/models/other".into(),
        model_fingerprint: "0000000000000001".into(),
        data_cursor: 3,
        journal_bytes: 0,
        journal_segment: 0,
    };
    trainer::Checkpoints::new(root.path().join("quickstart/local/checkpoints"))
        .save(3, &serde_json::to_vec(&meta).unwrap(), 1, |_| Ok(()))
        .unwrap();
    let (err, line) = failure(&sim.base_url(), root.path(), &[]).await;
    assert!(
        matches!(err, arena_rl::Error::CheckpointOfAnotherModel { .. }),
        "{err:?}"
    );
    assert!(
        line.contains("was saved from another model (/models/other) than model.path"),
        "{line}"
    );
    assert_eq!(sim.counters().live_routes, 0);
}

/// Every mistake in the config is reported at once, each naming its field and value, before the run acts:
/// no journal folder, no request to Arena. The config is changed after loading, as a program that builds
/// its own may do, so `setup` checks the config's own rules again (`model.dtype`) along with what only the
/// run's components check (`proxy.host`); `model.dtype` is reported once, though the policy's engine
/// would refuse it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_typo_is_reported_at_once_before_the_run_acts() {
    let sim = ArenaSim::start(sim_world()).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = model_folder(root.path());
    let mut config = config(&sim.base_url(), root.path(), &model, &["model.engine=burn"]);
    config.model.dtype = "bf61".into();
    config.proxy.host = "127.0.0.l".into();
    let err = train(
        config,
        &env(),
        Plugins {
            engine: None,
            step: Box::new(FrozenPolicy::default()),
        },
    )
    .await
    .expect_err("the run fails");
    let line = format!("{err:#}");
    assert!(!line.contains('\n'), "one line: {line}");
    assert!(line.starts_with("2 problems: "), "{line}");
    assert!(
        line.contains("model.dtype: \"bf61\" is not a dtype: expected f32 or bf16"),
        "{line}"
    );
    assert!(
        line.contains("proxy.host \"127.0.0.l\" is not an IP address"),
        "{line}"
    );
    assert_eq!(line.matches("bf61").count(), 1, "reported once: {line}");
    assert!(
        !root.path().join("quickstart/local/journal").exists(),
        "no journal folder"
    );
    assert!(sim.requests().is_empty(), "Arena saw {:?}", sim.requests());
}
