//! Tests of key derivation (against values computed with Python's `hmac`, as the reference does) and
//! credential extraction.

use axum::http::{HeaderMap, HeaderValue};
use secrecy::{ExposeSecret, SecretString};

use super::*;

#[test]
fn gateway_key_and_session_token_match_the_reference_derivation() {
    let admin = SecretString::from("test-admin");
    let gateway = gateway_key(&admin);
    assert_eq!(
        gateway.expose_secret(),
        "areal-gateway-c9c401c07a18bacaf1788de881f236537f08f30743fc3bc52641012dc412bae9"
    );
    assert_eq!(
        session_token(&gateway, "17:3-0").expose_secret(),
        "areal-session-f1a6636e71ed4d1d0c8f929bbb96f07673adce89b2e92bb6f8e60f231d8f709e"
    );
}

fn check(headers: &[(&'static str, &str)], expected: &[&str]) {
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        map.append(*k, HeaderValue::from_str(v).expect("valid header"));
    }
    let got: Vec<String> = credentials(&map)
        .iter()
        .map(|c| c.expose_secret().to_string())
        .collect();
    assert_eq!(got, expected, "headers {headers:?}");
}

#[test]
fn credentials_are_bearer_then_api_key_without_duplicates() {
    check(&[], &[]);
    check(&[("authorization", "Bearer abc")], &["abc"]);
    check(&[("authorization", "bearer  abc ")], &["abc"]);
    check(&[("authorization", "Basic abc")], &[]);
    check(&[("x-api-key", "k1")], &["k1"]);
    check(&[("authorization", "Bearer a"), ("x-api-key", "b")], &["a", "b"]);
    check(&[("authorization", "Bearer a"), ("x-api-key", "a")], &["a"]);
}

#[test]
fn random_keys_are_long_distinct_and_url_safe() {
    let a = random_key();
    let b = random_key();
    assert_eq!(a.expose_secret().len(), 43);
    assert_ne!(a.expose_secret(), b.expose_secret());
    assert!(
        a.expose_secret()
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    );
    assert!(secrets_equal(&a, &a.clone()));
    assert!(!secrets_equal(&a, &b));
}
