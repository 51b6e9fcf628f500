//! Tests of what the endpoints do under the state lock, without HTTP: launches (idempotent replay, stream,
//! row and route checks, task creation, counters), registrations and cancels.

use std::cell::RefCell;

use serde_json::{Value, json};

use super::*;
use crate::harness::{HarnessContext, LaunchReply, LaunchRequest};
use crate::tasks::TaskFamily;
use crate::world::{RouteDef, StreamDef};

const GATEWAY: &str = "http://127.0.0.1:9/api";

fn world() -> World {
    World {
        llm_api_key: Some("llm-key".into()),
        routes: vec![RouteDef {
            model_name: "policy".into(),
            deployment_id: "d".into(),
            upstream: None,
        }],
        streams: vec![
            StreamDef::new("s")
                .harness("claude-sim", "1")
                .reward("grader", "2")
                .row("r0", &["domain:min"])
                .row("r1", &[])
                .family(TaskFamily::Max),
            StreamDef {
                status: Some("PAUSED".into()),
                ..StreamDef::new("paused").row("p0", &[])
            },
        ],
        task_id_prefix: "t/".into(),
        ..World::default()
    }
}

fn request(data_id: &str, base_url: &str, session: Option<&str>) -> LaunchRequest {
    serde_json::from_value(json!({
        "data_id": data_id,
        "model_name": "policy",
        "base_url": base_url,
        "api_key": "llm-key",
        "session_id": session,
    }))
    .expect("a launch request")
}

/// Launches with a harness that answers `Pending` and records the context it was started with.
fn launch(
    state: &mut ArenaState,
    stream: &str,
    request: &LaunchRequest,
    key: Option<&str>,
) -> (Result<Launched, LaunchRefused>, Option<HarnessContext>) {
    let settings = LaunchSettings {
        task_id_prefix: "t/",
        gateway_url: GATEWAY,
        llm_api_key: Some("llm-key"),
    };
    let started = RefCell::new(None);
    let launched = state.launch(stream, request, key.map(str::to_string), &settings, |ctx| {
        *started.borrow_mut() = Some(ctx);
        (
            LaunchReply::Pending {
                placeholder_score: Some(0.5),
            },
            None,
        )
    });
    (launched, started.into_inner())
}

fn started_id(launched: Result<Launched, LaunchRefused>) -> String {
    match launched {
        Ok(Launched::Started { task_id, .. }) => task_id,
        other => panic!("expected a new task, got {other:?}"),
    }
}

#[test]
fn a_launch_creates_a_task_with_the_rows_context_and_counts_it() {
    let mut state = ArenaState::new(&world());
    let (launched, ctx) = launch(&mut state, "s", &request("r0", GATEWAY, Some("sess")), None);
    let id = started_id(launched);
    assert_eq!(id, "t/1");
    let ctx = ctx.expect("the harness was started");
    assert_eq!(ctx.task_id, "t/1");
    assert_eq!(ctx.harness.as_deref(), Some("claude-sim@1"));
    assert_eq!(
        ctx.task_family,
        Some(TaskFamily::Min),
        "the row's tag beats the stream's family"
    );
    assert_eq!(ctx.tags, json!(["domain:min"]));
    assert_eq!(ctx.gateway_url, GATEWAY);
    let task = &state.tasks[&id];
    assert_eq!(task.harness_ref, Some(RefDef::new("claude-sim", "1")));
    assert_eq!(task.reward_ref, Some(RefDef::new("grader", "2")));
    assert_eq!(
        task.pending_envelope(),
        json!({"task_id": "t/1", "status": "PENDING", "score": 0.5})
    );
    assert_eq!(state.stream("s").expect("stream").launched, vec!["t/1"]);
    assert_eq!(state.counters.launches, 1);
    assert_eq!(state.counters.launches_by_session["sess"], 1);

    let (launched, ctx) = launch(&mut state, "s", &request("r1", "http://direct:1", None), None);
    assert_eq!(started_id(launched), "t/2");
    assert_eq!(ctx.expect("started").task_family, Some(TaskFamily::Max));
    assert_eq!(state.counters.launches_by_session["data:r1"], 1);
    assert_eq!(state.counters.launches, 2);
}

#[test]
fn an_idempotency_key_replays_the_first_launch_without_a_new_task() {
    let mut state = ArenaState::new(&world());
    let req = request("r0", GATEWAY, Some("sess"));
    let first = started_id(launch(&mut state, "s", &req, Some("k")).0);
    let (again, ctx) = launch(&mut state, "s", &req, Some("k"));
    assert!(ctx.is_none(), "no harness starts for a replay");
    match again {
        Ok(Launched::Replayed(envelope)) => {
            assert_eq!(envelope["task_id"], json!(first));
            assert_eq!(envelope["status"], json!("PENDING"));
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    assert_eq!(state.counters.launches, 1);
    assert_eq!(state.counters.idempotent_replays, 1);
    assert_eq!(state.tasks.len(), 1);
    let other = started_id(launch(&mut state, "s", &req, Some("k2")).0);
    assert_ne!(other, first, "another key is another task");
    assert_eq!(state.counters.launches_by_session["sess"], 2);
}

#[test]
fn an_arena_that_ignores_the_key_starts_a_task_per_launch() {
    let mut state = ArenaState::new(&World {
        dedupe_launches: false,
        ..world()
    });
    let req = request("r0", GATEWAY, Some("sess"));
    let first = started_id(launch(&mut state, "s", &req, Some("k")).0);
    let second = started_id(launch(&mut state, "s", &req, Some("k")).0);
    assert_ne!(first, second);
    assert_eq!(
        (state.counters.launches, state.counters.idempotent_replays),
        (2, 0)
    );
}

#[test]
fn refused_launches_create_nothing() {
    let check = |stream: &str, request: LaunchRequest, want: LaunchRefused| {
        let mut state = ArenaState::new(&world());
        let (launched, ctx) = launch(&mut state, stream, &request, Some("k"));
        assert_eq!(launched.expect_err("refused"), want, "{stream} {request:?}");
        assert!(ctx.is_none());
        assert!(state.tasks.is_empty() && state.idempotency.is_empty());
        assert_eq!((state.counters.launches, state.next_task), (0, 1));
    };
    check("nope", request("r0", GATEWAY, None), LaunchRefused::UnknownStream);
    check(
        "paused",
        request("p0", GATEWAY, None),
        LaunchRefused::StreamNotActive,
    );
    check("s", request("zz", GATEWAY, None), LaunchRefused::UnknownRow);
    let mut wrong_key = request("r0", GATEWAY, None);
    wrong_key.api_key = "other".into();
    check("s", wrong_key, LaunchRefused::WrongGatewayKey);
    let mut unknown = request("r0", &format!("{GATEWAY}/"), None);
    unknown.model_name = "gone".into();
    check("s", unknown, LaunchRefused::UnknownRoute);
}

#[test]
fn a_direct_launch_needs_no_route_and_a_gateway_launch_touches_its_route() {
    let mut state = ArenaState::new(&world());
    let mut direct = request("r0", "http://proxy:1/v1", None);
    direct.model_name = "not-a-route".into();
    direct.api_key = "anything".into();
    started_id(launch(&mut state, "s", &direct, None).0);
    let before = state.routes["policy"].last_touch;
    started_id(launch(&mut state, "s", &request("r0", GATEWAY, None), None).0);
    assert!(state.routes["policy"].last_touch >= before);
}

#[test]
fn a_registration_counts_per_name_and_refuses_a_taken_name() {
    let mut state = ArenaState::new(&world());
    assert!(state.register_route("policy", "d".into(), Value::Null).is_none());
    let info = state
        .register_route("new", "d2".into(), json!({"model_name": "new"}))
        .expect("registered");
    assert_eq!((info.registrations, info.deployment_id.as_str()), (1, "d2"));
    assert!(state.remove_route("new", true));
    let again = state
        .register_route("new", "d3".into(), Value::Null)
        .expect("registered again");
    assert_eq!(
        again.registrations, 2,
        "a restore under the same name counts again"
    );
    assert_eq!(state.counters.registrations, 2);
    assert_eq!(state.counters.live_routes, 2);
    assert_eq!(state.counters.gc_removals, 1);
}

#[test]
fn a_cancel_ends_a_running_task_once() {
    let mut state = ArenaState::new(&world());
    let id = started_id(launch(&mut state, "s", &request("r0", GATEWAY, None), None).0);
    assert_eq!(state.cancel(&id).as_deref(), Some("CANCELLED"));
    assert_eq!(state.cancel(&id).as_deref(), Some("CANCELLED"));
    assert_eq!(state.counters.cancels, 1, "only the running task's cancel counts");
    assert_eq!(
        state.tasks.get_mut(&id).expect("task").poll()["status"],
        json!("CANCELLED")
    );
    assert_eq!(state.cancel("t/99"), None);
}

#[test]
fn a_pinned_env_version_runs_as_the_listed_row_of_its_key() {
    let mut w = world();
    w.streams[0] = StreamDef::new("s")
        .harness("claude-sim", "1")
        .row("env:a@new", &["domain:min"])
        .row("plain", &[]);
    let mut state = ArenaState::new(&w);
    let (launched, ctx) = launch(&mut state, "s", &request("env:a@old", GATEWAY, None), None);
    started_id(launched);
    assert_eq!(ctx.expect("started").tags, json!(["domain:min"]));
    assert_eq!(state.counters.launches_by_data_id["env:a@old"], 1);
    for unknown in ["env:b@new", "env:a", "a@new"] {
        let (refused, _) = launch(&mut state, "s", &request(unknown, GATEWAY, None), None);
        assert!(
            matches!(refused, Err(LaunchRefused::UnknownRow)),
            "{unknown}: {refused:?}"
        );
    }
}
