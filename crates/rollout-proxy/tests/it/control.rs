//! The control endpoints' wire JSON over a real socket: one snapshot of every reply, so a change to the wire
//! types shows up as a snapshot diff, and every reply parses into its `control::wire` type and writes back
//! unchanged.

use http::{Method, StatusCode};
use rollout_proxy::control::wire::{
    EndSessionReply, ExportReply, GrantCapacityReply, HealthReply, ModelList, SetRewardReply,
    StartSessionReply,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::common::{Proxy, call};

/// Session, interaction ids and keys are random; token arrays are long and covered elsewhere: keep their
/// lengths.
fn stable(mut v: Value) -> Value {
    if let Some(obj) = v.as_object_mut() {
        for (k, field) in obj.iter_mut() {
            match (k.as_str(), &*field) {
                ("session_id" | "api_key" | "interaction_id", Value::String(_)) => *field = json!("[random]"),
                ("interaction_ids", Value::Array(a)) => *field = json!(vec!["[random]"; a.len()]),
                ("token_ids" | "loss_mask" | "logprobs" | "versions", Value::Array(a)) => {
                    *field = json!(format!("[{} items]", a.len()));
                }
                _ => *field = stable(field.take()),
            }
        }
    } else if let Some(items) = v.as_array_mut() {
        for item in items {
            *item = stable(item.take());
        }
    }
    v
}

/// `reply` parses as `T`, and `T` writes it back with nothing renamed, dropped or added.
fn parses_as<T: Serialize + DeserializeOwned>(replies: &serde_json::Map<String, Value>, name: &str) {
    let reply = &replies[name];
    let typed: T = serde_json::from_value(reply.clone()).unwrap_or_else(|e| panic!("{name}: {e}: {reply}"));
    // Through text, as on the wire: `to_value` would widen f32 log-probabilities to f64 digits.
    let text = serde_json::to_string(&typed).expect("serialises");
    assert_eq!(
        &serde_json::from_str::<Value>(&text).expect("json"),
        reply,
        "{name}"
    );
}

#[tokio::test]
async fn every_control_reply_keeps_its_json() {
    let p = Proxy::default().await;
    let mut replies = serde_json::Map::new();
    let mut admin = async |name: &str, path: &str, body: Value| {
        let r = p.admin(path, body).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text);
        replies.insert(name.to_string(), r.json());
        r.json()
    };
    admin("grant_capacity", "/grant_capacity", json!({"count": 2})).await;
    let started = admin(
        "start_session",
        "/rl/start_session",
        json!({"task_id": "17:3", "metadata": {"row": 7}}),
    )
    .await;
    let (id, key) = (
        started["session_id"].as_str().expect("id").to_string(),
        started["api_key"].as_str().expect("key").to_string(),
    );
    let hello = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    assert_eq!(p.chat(&key, hello).await.status, StatusCode::OK);
    admin(
        "set_reward",
        "/rl/set_reward",
        json!({"session_id": id, "reward": 0.5}),
    )
    .await;
    admin("end_session", "/rl/end_session", json!({"session_id": id})).await;
    let exported = admin(
        "export_trajectories",
        "/export_trajectories",
        json!({"session_id": id, "style": "concat", "discount": 0.9, "final_reward": 1.0}),
    )
    .await;
    assert_eq!(exported["trajectories"].as_array().map(Vec::len), Some(1));
    for (name, path) in [("health", "/health"), ("models", "/v1/models")] {
        let r = call(Method::GET, &p.url(path), &[], None).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text);
        replies.insert(name.to_string(), r.json());
    }
    parses_as::<GrantCapacityReply>(&replies, "grant_capacity");
    parses_as::<StartSessionReply>(&replies, "start_session");
    parses_as::<SetRewardReply>(&replies, "set_reward");
    parses_as::<EndSessionReply>(&replies, "end_session");
    parses_as::<ExportReply>(&replies, "export_trajectories");
    parses_as::<HealthReply>(&replies, "health");
    parses_as::<ModelList>(&replies, "models");
    insta::assert_json_snapshot!(stable(Value::Object(replies)));
}
