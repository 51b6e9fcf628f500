//! Tests of configuration from the environment.

use secrecy::ExposeSecret;

use super::*;

fn env(pairs: &[(&str, &str)]) -> Env {
    Env::from_pairs(pairs.iter().copied())
}

#[test]
fn base_url_is_normalised() {
    let cases = [
        ("http://arena:8080/", "http://arena:8080"),
        ("http://arena:8080/openapi/v1", "http://arena:8080"),
        ("https://arena.example/x/openapi/v1/", "https://arena.example/x"),
    ];
    for (input, want) in cases {
        assert_eq!(normalise_base(input).unwrap(), want, "{input}");
    }
    assert!(normalise_base("arena:8080").is_err());
    assert!(normalise_base("ftp://arena").is_err());
}

#[test]
fn llm_key_is_read_lazily_and_named_when_missing() {
    let vars = env(&[("ARENA_OPENAPI_BASE", "http://a"), ("ARENA_OPENAPI_TOKEN", "t")]);
    let config = ClientConfig::from_env(&vars).unwrap();
    assert_eq!(config.base_url, "http://a");
    let err = llm_api_key(&vars).unwrap_err().to_string();
    assert!(err.contains("ARENA_LLM_API_KEY"), "{err}");
    let with_key = env(&[("ARENA_LLM_API_KEY", "k")]);
    assert_eq!(llm_api_key(&with_key).unwrap().expose_secret(), "k");
}

#[test]
fn missing_token_is_named() {
    let err = ClientConfig::from_env(&env(&[("ARENA_OPENAPI_BASE", "http://a")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("ARENA_OPENAPI_TOKEN"), "{err}");
}

#[test]
fn llm_base_url_override_is_validated_without_echoing() {
    let good = env(&[
        ("ARENA_OPENAPI_BASE", "http://a"),
        ("ARENA_OPENAPI_TOKEN", "t"),
        ("ARENA_LLM_BASE_URL", "https://gw.example:8443/v1/"),
    ]);
    let config = ClientConfig::from_env(&good).unwrap();
    assert_eq!(config.llm_base_url.as_deref(), Some("https://gw.example:8443/v1"));
    assert_eq!(config.base_url, "http://a");
    for bad in [
        "gw.example",
        "ftp://gw.example",
        "https://user:sekrit@gw.example",
        "https://gw.example/?sekrit=1",
        "https://gw.example/#sekrit",
        "https://gw.example:0",
        "https://gw.example:70000",
    ] {
        let err = validate_llm_base_url(bad).unwrap_err().to_string();
        assert!(err.contains("Arena LLM base URL"), "{bad}: {err}");
        assert!(!err.contains("sekrit") && !err.contains(bad), "{bad}: {err}");
    }
}

#[test]
fn debug_hides_the_token() {
    let config = ClientConfig::new("http://a", SecretString::from("tok-very-secret")).unwrap();
    assert!(!format!("{config:?}").contains("tok-very-secret"));
}
