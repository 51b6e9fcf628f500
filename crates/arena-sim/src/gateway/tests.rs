//! Tests of the gateway's pure parts: upstream URLs, the headers passed on, error bodies.

use axum::http::HeaderValue;

use super::*;

#[test]
fn upstream_urls_keep_the_callers_path_and_query() {
    let check = |base: &str, rest: &str, query: Option<&str>, want: &str| {
        assert_eq!(upstream_url(base, rest, query), want, "{base} + {rest}");
    };
    check(
        "http://p:1",
        "/v1/messages",
        Some("beta=true"),
        "http://p:1/v1/messages?beta=true",
    );
    check(
        "http://p:1/",
        "/v1/chat/completions",
        None,
        "http://p:1/v1/chat/completions",
    );
    check(
        "http://p:1",
        "/chat/completions",
        Some(""),
        "http://p:1/chat/completions",
    );
    check("http://p:1/v1", "/v1/responses", None, "http://p:1/v1/responses");
    check("http://p:1/v1/", "/responses", None, "http://p:1/v1/responses");
    check(
        "http://p:1/v1",
        "/v1/messages/count_tokens",
        None,
        "http://p:1/v1/messages/count_tokens",
    );
}

#[test]
fn credentials_and_framing_stay_behind() {
    let mut headers = HeaderMap::new();
    for (k, v) in [
        ("authorization", "Bearer caller"),
        ("x-api-key", "caller"),
        ("host", "sim"),
        ("content-length", "10"),
        ("connection", "keep-alive, x-private"),
        ("x-private", "hop"),
        ("keep-alive", "timeout=5"),
        ("transfer-encoding", "chunked"),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "a,b"),
        ("x-session-id", "1:0-0"),
        ("x-session-token", "tok"),
        ("content-type", "application/json"),
        ("user-agent", "claude-cli/2.1"),
    ] {
        headers.append(HeaderName::from_static(k), HeaderValue::from_static(v));
    }
    let kept: Vec<(String, String)> = end_to_end(&headers)
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    let want: Vec<(String, String)> = [
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", "a,b"),
        ("x-session-id", "1:0-0"),
        ("x-session-token", "tok"),
        ("content-type", "application/json"),
        ("user-agent", "claude-cli/2.1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(kept, want);
}

#[test]
fn the_callers_key_is_a_bearer_or_x_api_key() {
    let check = |pairs: &[(&'static str, &'static str)], want: &str| {
        let mut headers = HeaderMap::new();
        for (k, v) in pairs {
            headers.insert(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        assert_eq!(caller_key(&headers), want, "{pairs:?}");
    };
    check(&[("authorization", "Bearer k1")], "k1");
    check(&[("authorization", "bearer  k1 ")], "k1");
    check(&[("x-api-key", "k2")], "k2");
    check(&[("authorization", "Basic x"), ("x-api-key", "k2")], "k2");
    check(&[("authorization", "Bearer ")], "");
    check(&[], "");
}

#[tokio::test]
async fn errors_speak_each_protocol() {
    let mut bodies = Vec::new();
    for protocol in LlmProtocol::ALL {
        for status in [400, 401, 404, 429, 502] {
            let status = StatusCode::from_u16(status).unwrap();
            let response = error(protocol, status, "why");
            assert_eq!(response.status(), status);
            let bytes = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
            let body: Value = serde_json::from_slice(&bytes).unwrap();
            bodies.push(json!({"protocol": protocol, "status": status.as_u16(), "body": body}));
        }
    }
    insta::assert_json_snapshot!("gateway_error_bodies", bodies);
}
