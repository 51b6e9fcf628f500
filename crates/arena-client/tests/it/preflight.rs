//! Preflight as a library (8.2 items 5, 6, 19, 20) and each way it refuses a stream.

use arena_client::{PreflightOptions, StreamSummary, preflight};
use arena_sim::{ArenaSim, Endpoint, FaultKind, FaultRule, RefDef, StreamDef, TaskHistoryDef, World};
use serde_json::{Value, json};
use stream_config::{StreamConfig, parse_stream_config};

use crate::support::{TOKEN, client, start};

fn task(status: &str, harness: (&str, &str), reward: Option<(&str, &str)>) -> TaskHistoryDef {
    TaskHistoryDef {
        status: status.to_string(),
        harness_ref: Some(RefDef::new(harness.0, harness.1)),
        reward_ref: reward.map(|(k, v)| RefDef::new(k, v)),
    }
}

fn healthy(stream: StreamDef) -> StreamDef {
    StreamDef {
        recent_tasks: vec![
            task("DONE", ("claude", "1"), Some(("grader", "2"))),
            task("ok", ("claude", "1"), Some(("grader", "2"))),
        ],
        ..stream
    }
}

fn base_world() -> World {
    World {
        token: TOKEN.to_string(),
        ..World::default()
    }
    .stream(healthy(
        StreamDef::new("s1")
            .harness("claude", "1")
            .reward("grader", "2")
            .row("r1", &[])
            .row("r2", &[]),
    ))
    .harness_version("claude", "1", "PUBLISHED")
}

fn stream(fields: Value) -> StreamConfig {
    parse_stream_config(&fields).expect("a valid stream definition")
}

async fn run(
    sim: &ArenaSim,
    streams: &[StreamConfig],
    options: &PreflightOptions,
) -> arena_client::Result<Vec<StreamSummary>> {
    preflight(&client(sim), streams, options).await
}

#[tokio::test]
async fn item_5_operations_and_encoded_ids() {
    let world = base_world()
        .stream(healthy(
            StreamDef::new("stream/a").reward("grader", "2").row("x", &[]),
        ))
        .harness_version("claude/code", "1", "PUBLISHED");
    let mut world = world;
    world.streams[1].recent_tasks = vec![task("DONE", ("claude/code", "1"), Some(("grader", "2")))];
    let sim = start(world).await;
    let streams = [stream(
        json!({"name": "a", "stream_id": "stream/a", "harness": "claude/code@1"}),
    )];
    run(&sim, &streams, &PreflightOptions::default()).await.unwrap();
    let trail: Vec<(Endpoint, String, Option<String>)> = sim
        .requests()
        .into_iter()
        .map(|r| (r.endpoint, format!("{} {}", r.method, r.path), r.query))
        .collect();
    assert_eq!(
        trail,
        [
            (
                Endpoint::GetStream,
                "GET /openapi/v1/streams/stream%2Fa".into(),
                None
            ),
            (
                Endpoint::HarnessVersion,
                "GET /openapi/v1/harnesses/claude%2Fcode/versions/1".into(),
                None
            ),
            (
                Endpoint::Dataset,
                "POST /openapi/v1/streams/stream%2Fa/dataset".into(),
                Some("limit=1&offset=0".into())
            ),
            (
                Endpoint::StreamTasks,
                "GET /openapi/v1/streams/stream%2Fa/tasks".into(),
                Some("limit=100&offset=0".into())
            ),
        ]
    );
}

#[tokio::test]
async fn item_6_a_marker_403_is_retried() {
    let sim = start(base_world()).await;
    sim.add_fault(FaultRule::on(Endpoint::GetStream, FaultKind::Marker403).times(1));
    let streams = [stream(json!({"name": "a", "stream_id": "s1"}))];
    run(&sim, &streams, &PreflightOptions::default()).await.unwrap();
    assert_eq!(sim.counters().requests_to(Endpoint::GetStream), 2);
}

#[tokio::test]
async fn item_19_the_summary_pins_the_live_ref_and_lists_env_names_only() {
    let sim = start(base_world()).await;
    let streams = [stream(json!({
        "name": "swe",
        "stream_id": "s1",
        "sampling_weight": 3.0,
        "task_envs": {"SECRET_TOKEN": "do-not-print", "A_FLAG": "1"},
        "reward_threshold": 0.98,
    }))];
    let summaries = run(&sim, &streams, &PreflightOptions::default()).await.unwrap();
    let text = serde_json::to_string_pretty(&json!({"streams": summaries})).unwrap();
    assert!(!text.contains("do-not-print"));
    insta::assert_snapshot!("preflight_summary", text);
}

#[tokio::test]
async fn item_20_health_counts_only_exact_provenance() {
    let mut world = base_world();
    world.streams[0].recent_tasks = vec![
        task("DONE", ("claude", "1"), Some(("grader", "2"))),
        task("FAILED", ("claude", "1"), Some(("grader", "2"))),
        task("PENDING", ("claude", "1"), Some(("grader", "2"))),
        task("HARNESS_FAILED", ("claude", "2"), Some(("grader", "2"))),
        task("TIMEOUT", ("claude", "1"), Some(("grader", "1"))),
        task("NO_OUTPUT", ("claude", "1"), None),
        task("SETUP_FAILED", ("codex", "1"), Some(("grader", "2"))),
    ];
    let sim = start(world).await;
    let streams = [stream(json!({"name": "a", "stream_id": "s1"}))];
    let summary = &run(&sim, &streams, &PreflightOptions::default()).await.unwrap()[0];
    assert_eq!(
        (
            summary.recent_terminal_tasks,
            summary.recent_failures,
            summary.recent_failure_rate
        ),
        (2, 1, 0.5)
    );
    assert!(!summary.unhealthy_override);
}

async fn refusal(world: World, streams: Value, options: PreflightOptions) -> String {
    let sim = start(world).await;
    let list: Vec<Value> = serde_json::from_value(streams).unwrap();
    let streams: Vec<StreamConfig> = list.into_iter().map(stream).collect();
    run(&sim, &streams, &options).await.unwrap_err().to_string()
}

#[tokio::test]
async fn each_refusal_names_the_stream_and_the_reason() {
    let one = json!([{"name": "a", "stream_id": "s1"}]);
    let defaults = PreflightOptions::default;
    let cases: Vec<(World, Value, PreflightOptions, &str)> = vec![
        (
            {
                let mut w = base_world();
                w.streams[0].status = None;
                w
            },
            one.clone(),
            defaults(),
            "reports no status; preflight requires ACTIVE",
        ),
        (
            {
                let mut w = base_world();
                w.streams[0].status = Some("PAUSED".into());
                w
            },
            one.clone(),
            defaults(),
            "is PAUSED, not ACTIVE",
        ),
        (
            base_world(),
            json!([{"name": "a", "stream_id": "s1", "expected_reward_ref": {"key": "grader", "version": "1"}}]),
            defaults(),
            "reward_ref drifted: pinned grader@1, live grader@2",
        ),
        (
            {
                let mut w = base_world();
                w.streams[0].default_reward_ref = Some(RefDef::new("grader", ""));
                w
            },
            one.clone(),
            defaults(),
            "default_reward_ref is incomplete",
        ),
        (
            {
                let mut w = base_world();
                w.streams[0].default_harness_ref = None;
                w
            },
            one.clone(),
            defaults(),
            "requires Harness key@version",
        ),
        (
            {
                let mut w = base_world();
                w.harnesses[0].status = "DRAFT".into();
                w
            },
            one.clone(),
            defaults(),
            "harness claude@1 is DRAFT, not PUBLISHED",
        ),
        (
            base_world(),
            json!([{"name": "a", "stream_id": "s1", "harness": "claude@9"}]),
            defaults(),
            "HTTP 404",
        ),
        (
            {
                let mut w = base_world();
                w.streams[0].rows.clear();
                w
            },
            one.clone(),
            defaults(),
            "contains no dataset rows",
        ),
        (
            {
                let mut w = base_world();
                w.streams[0].recent_tasks.clear();
                w
            },
            one.clone(),
            defaults(),
            "failed health check: terminal=0, failures=0, failure_rate=0",
        ),
        (
            {
                let mut w = base_world();
                w.streams[0].recent_tasks[1].status = "EVAL_FAILED".into();
                w
            },
            one.clone(),
            PreflightOptions {
                max_failure_rate: 0.5,
                ..defaults()
            },
            "failed health check: terminal=2, failures=1, failure_rate=0.5",
        ),
    ];
    for (world, streams, options, want) in cases {
        let err = refusal(world, streams, options).await;
        assert!(err.starts_with("preflight of stream a (s1): "), "{err}");
        assert!(err.contains(want), "want {want:?} in {err}");
        assert!(!err.contains('\n'), "{err}");
    }
}

#[tokio::test]
async fn allow_unhealthy_reports_instead_of_failing() {
    let mut world = base_world();
    world.streams[0].recent_tasks.clear();
    let sim = start(world).await;
    let options = PreflightOptions {
        allow_unhealthy: true,
        ..PreflightOptions::default()
    };
    let streams = [stream(json!({"name": "a", "stream_id": "s1"}))];
    let summary = &run(&sim, &streams, &options).await.unwrap()[0];
    assert!(summary.unhealthy_override);
    assert_eq!(summary.recent_terminal_tasks, 0);
}

#[test]
fn options_are_range_checked() {
    let bad = [
        PreflightOptions {
            recent_tasks: 0,
            ..PreflightOptions::default()
        },
        PreflightOptions {
            max_failure_rate: 1.5,
            ..PreflightOptions::default()
        },
        PreflightOptions {
            max_failure_rate: f64::NAN,
            ..PreflightOptions::default()
        },
    ];
    for options in bad {
        assert!(options.validate().is_err(), "{options:?}");
    }
}
