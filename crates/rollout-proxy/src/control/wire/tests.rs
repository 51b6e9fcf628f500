//! Every wire type round-trips its JSON unchanged, requests reject what the proxy does not know, and keys
//! stay out of `Debug`.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use super::*;

/// Parses `wire` as `T`, writes it back, and checks nothing was renamed, dropped or added.
fn check<T: Serialize + DeserializeOwned>(wire: Value) -> T {
    let parsed: T = serde_json::from_value(wire.clone())
        .unwrap_or_else(|e| panic!("{} does not parse {wire}: {e}", std::any::type_name::<T>()));
    // Through text, as on the wire: `to_value` would widen f32 log-probabilities to f64 digits.
    let text = serde_json::to_string(&parsed).expect("serialises");
    assert_eq!(serde_json::from_str::<Value>(&text).expect("json"), wire);
    parsed
}

#[test]
fn every_type_round_trips_its_json() {
    check::<GrantCapacityRequest>(json!({}));
    check::<GrantCapacityRequest>(json!({"count": 3}));
    check::<GrantCapacityReply>(json!({"capacity": 4}));
    check::<GrantCapacityReply>(json!({"capacity": null}));
    let start = check::<StartSessionRequest>(json!({"task_id": "17:3"}));
    assert!(start.api_key.is_none() && start.metadata.is_none());
    let start = check::<StartSessionRequest>(
        json!({"task_id": "17:3", "api_key": "k-1", "metadata": {"generation_args": {"temperature": 0.5}}}),
    );
    assert_eq!(
        start.api_key.map(|k| k.expose_secret().to_string()),
        Some("k-1".into())
    );
    let started = check::<StartSessionReply>(json!({"session_id": "17:3-ab12", "api_key": "k-2"}));
    assert_eq!(started.api_key.expose_secret(), "k-2");
    check::<SetRewardRequest>(json!({"reward": 0.5}));
    check::<SetRewardRequest>(json!({"session_id": "s-1", "interaction_id": "chatcmpl-1", "reward": -1.0}));
    check::<SetRewardReply>(json!({"message": "success", "interaction_id": "chatcmpl-1"}));
    check::<EndSessionRequest>(json!({}));
    check::<EndSessionRequest>(json!({"session_id": "s-1"}));
    let ended = check::<EndSessionReply>(json!({
        "message": "success", "session_id": "s-1", "interaction_count": 2, "context_overflow": true,
        "context_overflow_message": "prompt is too long", "system_error": false, "system_error_message": null,
    }));
    assert_eq!((ended.interaction_count, ended.context_overflow), (2, true));
    let export = check::<ExportRequest>(json!({"session_id": "s-1", "style": "individual", "discount": 1.0}));
    assert_eq!(export, ExportRequest::new("s-1", ExportStyle::Individual));
    check::<ExportRequest>(json!({
        "session_id": "s-1", "style": "concat", "discount": 0.9, "drop_retry_orphans": true,
        "final_reward": 0.75, "wait_timeout_seconds": 60.0, "supports_shared_tensor_references": false,
        "is_eval": true,
    }));
    check::<ExportReply>(json!({
        "session_id": "s-1", "task_id": "17:3", "style": "concat", "discount": 1.0,
        "context_overflow": false, "system_error": false, "interaction_count": 1,
        "trajectories": [{
            "session_id": "s-1", "interaction_id": "chatcmpl-1", "interaction_ids": ["chatcmpl-1"],
            "token_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "logprobs": [0.0, -0.185, -1.099],
            "versions": [-1, 0, 0], "temperatures": [1.0, 0.6, 0.6], "top_ps": [1.0, 0.9, 0.9],
            "top_ks": [0, 0, 0], "truncated": [0, 1, 1], "prompt_len": 1, "reward": 1.0, "original_reward": 1.0,
            "finish_reason": "stop", "metadata": {"row": 7},
        }],
    }));
    check::<HealthReply>(json!({
        "status": "ok", "initialized": true, "model": "m", "max_context_len": 4096, "live_sessions": 2,
    }));
    check::<ModelList>(json!({
        "object": "list", "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "arena-rl"}],
    }));
}

#[test]
fn requests_take_the_proxy_defaults() {
    let export: ExportRequest = serde_json::from_value(json!({"session_id": "s-1"})).expect("parses");
    assert_eq!(export, ExportRequest::new("s-1", ExportStyle::Individual));
    // The reference's end_session reply has no session_id; the client still reads it.
    let ended: EndSessionReply =
        serde_json::from_value(json!({"message": "success", "interaction_count": 3})).expect("parses");
    assert_eq!(ended.interaction_count, 3);
    assert!(ended.session_id.is_empty() && !ended.system_error);
}

#[test]
fn requests_refuse_unknown_fields_and_replies_accept_them() {
    for (name, result) in [
        (
            "grant_capacity",
            serde_json::from_value::<GrantCapacityRequest>(json!({"counts": 1})).err(),
        ),
        (
            "set_reward",
            serde_json::from_value::<SetRewardRequest>(json!({"reward": 1.0, "rewards": 2})).err(),
        ),
        (
            "end_session",
            serde_json::from_value::<EndSessionRequest>(json!({"session": "s"})).err(),
        ),
        (
            "export",
            serde_json::from_value::<ExportRequest>(json!({"session_id": "s", "styl": "concat"})).err(),
        ),
    ] {
        let e = result.unwrap_or_else(|| panic!("{name} accepted an unknown field"));
        assert!(e.to_string().contains("unknown field"), "{name}: {e}");
    }
    // The reference's processor-cache fields reach start_session and are ignored.
    let start: StartSessionRequest = serde_json::from_value(
        json!({"task_id": "t", "processor_cache_group_id": "g", "processor_cache_group_size": 2}),
    )
    .expect("parses");
    assert_eq!(start.task_id, "t");
    let health: HealthReply = serde_json::from_value(json!({
        "status": "ok", "initialized": true, "model": "m", "max_context_len": 1, "live_sessions": 0,
        "version": "2",
    }))
    .expect("a newer proxy's extra field is ignored");
    assert_eq!(health.live_sessions, 0);
}

#[test]
fn keys_stay_out_of_debug() {
    let started = StartSessionReply {
        session_id: "s-1".into(),
        api_key: SecretString::from("hunter2-key"),
    };
    let mut start = StartSessionRequest::new("t");
    start.api_key = Some(SecretString::from("hunter2-key"));
    for debug in [format!("{started:?}"), format!("{start:?}")] {
        assert!(!debug.contains("hunter2"), "{debug}");
    }
    assert_eq!(
        serde_json::to_value(&started).expect("serialises")["api_key"],
        "hunter2-key"
    );
}
