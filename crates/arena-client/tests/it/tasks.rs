//! Task launch, polling, typed failures and cancel (8.1 items 55, 58-60; 8.2 item 32's envelopes).

use std::time::Duration;

use arena_client::{ArenaClient, Error, Party, RunOptions};
use arena_sim::{CancelEndpoint, Endpoint, Envelope, FaultKind, FaultRule, LaunchReply, ScriptedOutcome};
use serde_json::json;
use stream_config::TaskStatus;

use crate::retries::launch;
use crate::support::{Logs, client, config, start, world};

fn quick() -> RunOptions {
    RunOptions {
        timeout: Duration::from_secs(20),
        idempotency_key: None,
        key_honoured: false,
    }
}

#[tokio::test]
async fn item_58_a_polled_harness_failure_is_typed_and_keeps_raw() {
    let sim = start(world()).await;
    let raw = json!({"error": "harness: agent phase error", "nested": {"score": 1.0}});
    sim.scripted().set_outcome(
        "r1",
        ScriptedOutcome::status("HARNESS_FAILED", Some(0.0)).raw(raw.clone()),
    );
    let run = client(&sim).run_task("s1", &launch("r1"), &quick()).await;
    assert!(run.launched);
    assert!(!run.terminal);
    let err = run.result.unwrap_err();
    let failed = err.task_failed().expect("a typed task failure");
    assert_eq!(failed.status, TaskStatus::HarnessFailed);
    assert_eq!(failed.task_id, "task-1");
    assert_eq!(failed.result.raw, raw);
    assert_eq!(failed.payload["raw"], raw);
    assert_eq!(err.party(), Party::Arena);
    assert_eq!(
        err.to_string(),
        "arena task task-1 failed with status HARNESS_FAILED"
    );
}

#[tokio::test]
async fn item_59_a_pending_launch_with_a_placeholder_score_is_polled() {
    let sim = start(world()).await;
    sim.scripted().set_outcome(
        "r1",
        ScriptedOutcome::done(1.0).reply(LaunchReply::Pending {
            placeholder_score: Some(0.0),
        }),
    );
    let run = client(&sim).run_task("s1", &launch("r1"), &quick()).await;
    let result = run.result.unwrap();
    assert_eq!(result.score, Some(1.0));
    assert_eq!(result.status, TaskStatus::Done);
    assert_eq!(sim.requests_to(Endpoint::LaunchOneTask).len(), 1);
    assert!(sim.counters().requests_to(Endpoint::TaskResult) >= 1);
    assert!(run.terminal);
}

#[tokio::test]
async fn item_60_a_failed_launch_reply_is_typed_without_polling() {
    let sim = start(world()).await;
    sim.scripted().set_outcome(
        "r1",
        ScriptedOutcome::status("HARNESS_FAILED", Some(0.0)).reply(LaunchReply::Final),
    );
    let run = client(&sim).run_task("s1", &launch("r1"), &quick()).await;
    let err = run.result.unwrap_err();
    assert_eq!(err.task_failed().unwrap().status, TaskStatus::HarnessFailed);
    assert_eq!(sim.counters().requests_to(Endpoint::TaskResult), 0);
    assert!(!run.launched, "a failed launch reply is not a launch success");
    assert_eq!(run.task_id.as_deref(), Some("task-1"));
}

#[tokio::test]
async fn item_55_a_local_timeout_logs_and_cancels_the_task() {
    let sim = start(world()).await;
    sim.scripted()
        .set_outcome("r1", ScriptedOutcome::done(1.0).gate("never"));
    let (logs, _guard) = Logs::capture();
    let options = RunOptions {
        timeout: Duration::from_millis(1500),
        idempotency_key: None,
        key_honoured: false,
    };
    let run = client(&sim).run_task("s1", &launch("r1"), &options).await;
    let err = run.result.unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "timed out: task_id=task-1, data_id=r1, timeout_seconds=1.5"
    );
    assert_eq!(err.party(), Party::Us);
    assert!(
        logs.text()
            .contains("timed out: task_id=task-1, data_id=r1, timeout_seconds=1.5"),
        "{}",
        logs.text()
    );
    assert_eq!(sim.counters().cancels, 1);
    assert_eq!(sim.task_status("task-1").as_deref(), Some("CANCELLED"));
}

#[tokio::test]
async fn a_dropped_wait_cancels_the_task_in_the_background() {
    let sim = start(world()).await;
    sim.scripted()
        .set_outcome("r1", ScriptedOutcome::done(1.0).gate("never"));
    let client = client(&sim);
    let handle = tokio::spawn(async move { client.run_task("s1", &launch("r1"), &quick()).await });
    sim.wait_until(|c| c.requests_to(Endpoint::TaskResult) >= 1).await;
    handle.abort();
    sim.wait_until(|c| c.cancels == 1).await;
    assert_eq!(sim.task_status("task-1").as_deref(), Some("CANCELLED"));
}

#[tokio::test]
async fn an_arena_without_cancel_is_tolerated_and_reported_once() {
    for endpoint in [CancelEndpoint::NotFound, CancelEndpoint::MethodNotAllowed] {
        let mut world = world();
        world.cancel_endpoint = endpoint;
        let sim = start(world).await;
        sim.scripted()
            .set_default(ScriptedOutcome::done(1.0).gate("never"));
        let (logs, _guard) = Logs::capture();
        let client = client(&sim);
        let options = RunOptions {
            timeout: Duration::from_millis(600),
            idempotency_key: None,
            key_honoured: false,
        };
        for row in ["r1", "r2"] {
            let err = client
                .run_task("s1", &launch(row), &options)
                .await
                .result
                .unwrap_err();
            assert!(matches!(err, Error::Timeout { .. }), "{err}");
        }
        assert_eq!(sim.counters().requests_to(Endpoint::CancelTask), 2);
        assert_eq!(
            logs.text().matches("no task cancel endpoint").count(),
            1,
            "{endpoint:?}: {}",
            logs.text()
        );
    }
}

/// `cancel_tasks = false` (an Arena known to have no cancel endpoint, as its published schema): a timed-out
/// task is left running without a request, and the warning names the first one once.
#[tokio::test]
async fn without_cancel_configured_no_cancel_is_sent_and_the_first_abandoned_task_is_named_once() {
    let sim = start(world()).await;
    sim.scripted()
        .set_default(ScriptedOutcome::done(1.0).gate("never"));
    let (logs, _guard) = Logs::capture();
    let mut config = config(&sim);
    config.cancel_tasks = false;
    let client = ArenaClient::new(config).unwrap();
    let options = RunOptions {
        timeout: Duration::from_millis(600),
        idempotency_key: None,
        key_honoured: false,
    };
    for row in ["r1", "r2"] {
        let run = client.run_task("s1", &launch(row), &options).await;
        assert!(matches!(run.result, Err(Error::Timeout { .. })));
    }
    assert_eq!(sim.counters().requests_to(Endpoint::CancelTask), 0);
    assert_eq!(
        sim.task_status("task-1").as_deref(),
        Some("AGENT_RUNNING"),
        "left running"
    );
    let text = logs.text();
    assert_eq!(
        text.matches("no task cancel endpoint (by configuration)").count(),
        1,
        "{text}"
    );
    assert!(text.contains("task_id=task-1"), "{text}");
}

/// arena-sim's `hold_ms` fault: the launch is handled (its task starts) and only its answer is held.
#[tokio::test]
async fn a_held_launch_answer_arrives_after_its_task_started() {
    let sim = start(world()).await;
    sim.add_fault(FaultRule::on(Endpoint::LaunchOneTask, FaultKind::HoldMs(300)).times(1));
    let client = client(&sim);
    let sent = tokio::spawn(async move { client.launch_one_task("s1", &launch("r1"), None).await });
    sim.wait_until(|c| c.held_answers == 1).await;
    assert_eq!(
        sim.tasks().keys().collect::<Vec<_>>(),
        ["task-1"],
        "the task started first"
    );
    assert!(!sent.is_finished(), "the answer is held");
    let launched = sent.await.unwrap().unwrap();
    assert!(matches!(launched, arena_client::Launched::Running { ref task_id } if task_id == "task-1"));
    sim.wait_until(|c| c.held_answers == 0).await;
}

#[tokio::test]
async fn envelopes_old_and_new_are_accepted() {
    let sim = start(world()).await;
    let client = client(&sim);
    for envelope in [
        Envelope::Plain,
        Envelope::Data,
        Envelope::ResultOutput,
        Envelope::Task,
        Envelope::BareNumber,
    ] {
        sim.scripted().set_outcome(
            "r1",
            ScriptedOutcome::done(0.75)
                .envelope(envelope)
                .progress(&["AGENT_RUNNING"]),
        );
        let result = client
            .run_task("s1", &launch("r1"), &quick())
            .await
            .result
            .unwrap();
        assert_eq!(result.score, Some(0.75), "{envelope:?}");
        assert!(result.status.is_success(), "{envelope:?}");
    }
}

#[tokio::test]
async fn only_the_top_level_score_counts_and_raw_is_verbatim() {
    let sim = start(world()).await;
    let raw = json!({"score": 0.1, "reward": 1, "items": [null, {"score": 3}]});
    sim.scripted()
        .set_outcome("r1", ScriptedOutcome::done(0.9).raw(raw.clone()));
    sim.scripted().set_outcome(
        "r2",
        ScriptedOutcome::status("DONE", None).raw(json!({"score": 1.0})),
    );
    let client = client(&sim);
    let result = client
        .run_task("s1", &launch("r1"), &quick())
        .await
        .result
        .unwrap();
    assert_eq!(result.score, Some(0.9));
    assert_eq!(result.raw, raw);
    let err = client
        .run_task("s1", &launch("r2"), &quick())
        .await
        .result
        .unwrap_err();
    assert!(err.to_string().contains("missing top-level 'score'"), "{err}");
}

#[tokio::test]
async fn a_poll_for_another_task_is_rejected() {
    let sim = start(world()).await;
    sim.add_fault(FaultRule::on(Endpoint::TaskResult, FaultKind::WrongId));
    let err = client(&sim)
        .run_task("s1", &launch("r1"), &quick())
        .await
        .result
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("returned task_id \"task-1-other\" while polling \"task-1\""),
        "{err}"
    );
}

#[tokio::test]
async fn task_ids_are_encoded_in_poll_and_cancel_paths() {
    let mut world = world();
    world.task_id_prefix = "run/".to_string();
    let sim = start(world).await;
    sim.scripted().set_default(ScriptedOutcome::done(0.5).gate("g"));
    let client = client(&sim);
    let c = client.clone();
    let run = tokio::spawn(async move { c.run_task("s1", &launch("r1"), &quick()).await });
    sim.wait_until(|c| c.requests_to(Endpoint::TaskResult) >= 1).await;
    sim.scripted().open_gate("g");
    let run = run.await.unwrap();
    assert_eq!(run.result.unwrap().task_id, "run/1");
    assert_eq!(
        sim.requests_to(Endpoint::TaskResult)[0].path,
        "/openapi/v1/tasks/run%2F1/result"
    );
    assert_eq!(
        client.cancel_task("run/1").await.unwrap(),
        arena_client::CancelOutcome::Cancelled
    );
    assert_eq!(
        sim.requests_to(Endpoint::CancelTask)[0].path,
        "/openapi/v1/tasks/run%2F1/cancel"
    );
}

/// A harness that records what it was given and answers with a score derived from it.
struct Recorder(std::sync::Mutex<Vec<arena_sim::HarnessContext>>);

impl arena_sim::Harness for Recorder {
    fn start(&self, ctx: arena_sim::HarnessContext) -> arena_sim::HarnessRun {
        ctx.set_status("AGENT_RUNNING");
        let score = ctx.request.envs.len() as f64;
        self.0.lock().unwrap().push(ctx);
        arena_sim::HarnessRun {
            reply: LaunchReply::default(),
            outcome: Box::pin(async move {
                arena_sim::HarnessOutcome {
                    status: "OK".into(),
                    score: Some(score),
                    raw: json!({"by": "recorder"}),
                    artifacts_uri: None,
                    trace_id: Some("trace-1".into()),
                    computed_at: None,
                    progress: vec![],
                    envelope: Envelope::Plain,
                }
            }),
        }
    }
}

#[tokio::test]
async fn a_pluggable_harness_gets_the_whole_launch_and_the_row() {
    let recorder = std::sync::Arc::new(Recorder(Default::default()));
    let sim = arena_sim::ArenaSim::builder(world())
        .harness("recorder", recorder.clone())
        .start()
        .await
        .unwrap();
    let mut request = launch("r2");
    request.harness = Some("recorder@7".into());
    request.envs.insert("EXTRA".into(), "1".into());
    let result = client(&sim)
        .run_task("s1", &request, &quick())
        .await
        .result
        .unwrap();
    assert_eq!(
        result.score,
        Some(4.0),
        "EXTRA plus MODEL_NAME, BASE_URL and API_KEY"
    );
    assert_eq!(result.trace_id.as_deref(), Some("trace-1"));
    let ctx = recorder.0.lock().unwrap()[0].clone();
    assert_eq!((ctx.task_id.as_str(), ctx.stream_id.as_str()), ("task-1", "s1"));
    assert_eq!(ctx.harness.as_deref(), Some("recorder@7"));
    assert_eq!(ctx.request.session_id.as_deref(), Some("sess-r2"));
    assert_eq!(ctx.request.envs["API_KEY"], "session-key");
    assert_eq!(ctx.tags, json!(["domain:math"]));
    assert_eq!(ctx.gateway_url, format!("{}/api", sim.base_url()));
    // Rows launched with the stream's default harness still go to the scripted one.
    let result = client(&sim)
        .run_task("s1", &launch("r1"), &quick())
        .await
        .result
        .unwrap();
    assert_eq!(result.score, Some(1.0));
    assert_eq!(recorder.0.lock().unwrap().len(), 1);
}
