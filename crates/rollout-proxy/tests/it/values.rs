//! Values a session or an admin may send that would once break an export or sampling: rewards whose
//! discounted sum overflows, temperatures so small that `1 / t` and the log-probabilities leave f32, and
//! the gateway key offered as a session's key. Each is refused with one error naming the field and value.

use http::{Method, StatusCode};
use secrecy::ExposeSecret;
use serde_json::json;

use crate::common::{ADMIN, Proxy, call};

fn hello(text: &str) -> serde_json::Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

#[tokio::test]
async fn discounted_rewards_that_overflow_are_a_400_and_the_session_stays_exportable() {
    let p = Proxy::default().await;
    let (id, key) = p.session("t").await;
    for text in ["one", "two"] {
        assert_eq!(p.chat(&key, hello(text)).await.status, StatusCode::OK);
        // The session's own key may set any finite reward on its newest interaction.
        let r = call(
            Method::POST,
            &p.url("/rl/set_reward"),
            &[("authorization", &format!("Bearer {key}"))],
            Some(json!({"reward": 1.7e308})),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    }
    assert_eq!(p.end(&key).await.status, StatusCode::OK);
    let r = p
        .admin(
            "/export_trajectories",
            json!({"session_id": id, "style": "individual"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let v = r.json();
    let message = v["error"]["message"].as_str().expect("a message");
    assert!(
        message.contains("not finite") && message.contains("interaction"),
        "{message}"
    );
    assert_eq!(v["error"]["param"], json!("discount"));
    assert!(!r.text.contains("null,") && !r.text.contains("\"reward\""));
    // An admin discount of 1e308 overflows as well; a sane discount then exports every reward finite.
    let r = p
        .admin(
            "/export_trajectories",
            json!({"session_id": id, "style": "individual", "discount": 1e308, "final_reward": 1.0}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let r = p
        .admin(
            "/export_trajectories",
            json!({"session_id": id, "style": "individual", "discount": 0.0}),
        )
        .await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "the refused export left the session: {}",
        r.text
    );
    let v = r.json();
    let rewards: Vec<f64> = v["trajectories"]
        .as_array()
        .expect("trajectories")
        .iter()
        .map(|t| t["reward"].as_f64().expect("a number, never null"))
        .collect();
    assert_eq!(rewards, vec![1.7e308, 1.7e308]);
}

#[tokio::test]
async fn temperatures_below_the_floor_are_refused_naming_the_value() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    for (temperature, ok) in [
        (1e-40, false),
        (0.005, false),
        (0.0, true),
        (0.01, true),
        (1.3, true),
    ] {
        let mut body = hello("hi");
        body["temperature"] = json!(temperature);
        let r = p.chat(&key, body).await;
        if ok {
            assert_eq!(r.status, StatusCode::OK, "{temperature}: {}", r.text);
        } else {
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{temperature}: {}", r.text);
            let v = r.json();
            assert_eq!(v["error"]["param"], json!("temperature"));
            let message = v["error"]["message"].as_str().expect("a message");
            assert!(message.contains("at least 0.01"), "{message}");
            let shown = if temperature < 1e-4 { "1e-40" } else { "0.005" };
            assert!(message.contains(shown), "{message}");
        }
    }
    let mut body = hello("hi");
    body["top_p"] = json!(0.0);
    let r = p
        .messages(
            &key,
            json!({"model": "m", "max_tokens": 8, "top_p": 0.0,
        "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("top_p must be in (0, 1], got 0"), "{}", r.text);
    // A session's generation_args count as the harness's own values.
    p.admin("/grant_capacity", json!({})).await;
    let r = p
        .admin(
            "/rl/start_session",
            json!({"task_id": "t", "metadata": {"generation_args": {"temperature": 1e-40}}}),
        )
        .await;
    let key = r.json()["api_key"].as_str().expect("key").to_string();
    let r = p.responses(&key, json!({"model": "m", "input": "hi"})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert!(r.text.contains("1e-40"), "{}", r.text);
}

#[tokio::test]
async fn the_gateway_key_is_refused_as_a_session_key() {
    let p = Proxy::default().await;
    p.admin("/grant_capacity", json!({"count": 2})).await;
    let gateway = p.state.gateway_key();
    for (refused, name) in [(gateway.expose_secret(), "gateway"), (ADMIN, "admin")] {
        let r = p
            .admin("/rl/start_session", json!({"task_id": "t", "api_key": refused}))
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
        assert!(
            r.text.contains(&format!("api_key must not be the {name} key")),
            "{}",
            r.text
        );
        assert!(!r.text.contains(refused), "the error does not echo the key");
    }
}
