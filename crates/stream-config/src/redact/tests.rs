//! Redaction: spec 8.3.

use serde_json::json;

use super::*;
use crate::Env;

#[test]
fn nested_credentials_are_redacted_and_the_input_is_kept() {
    // Spec 8.3 item 1.
    let input = json!({
        "proxy": {"admin_api_key": "sk-admin", "max_tokens": 4096, "tokenizer_path": "/m/tok"},
        "services": [{"name": "a", "access_token": "t0k", "password": "hunter2"}],
        "Authorization": "Bearer x",
        "deploy": {"ssh_private_key_path": "/k", "db_credential": {"user": "u"}, "client_secret": 7},
        "tokens": "kept: a plural is not a credential",
    });
    let before = input.clone();
    let out = redact(&input, &Secrets::none());
    assert_eq!(input, before, "the input is not mutated");
    insta::assert_json_snapshot!(out, @r#"
    {
      "proxy": {
        "admin_api_key": "<redacted>",
        "max_tokens": 4096,
        "tokenizer_path": "/m/tok"
      },
      "services": [
        {
          "name": "a",
          "access_token": "<redacted>",
          "password": "<redacted>"
        }
      ],
      "Authorization": "<redacted>",
      "deploy": {
        "ssh_private_key_path": "<redacted>",
        "db_credential": "<redacted>",
        "client_secret": "<redacted>"
      },
      "tokens": "kept: a plural is not a credential"
    }
    "#);
}

#[test]
fn empty_and_null_credentials_are_left_unchanged() {
    // Spec 8.3 item 2.
    let input = json!({"api_key": "", "token": null, "nested": [{"secret": ""}]});
    assert_eq!(redact(&input, &Secrets::none()), input);
}

#[test]
fn sensitive_key_rules() {
    for key in [
        "authorization",
        "PASSWORD",
        "secret",
        "token",
        "openai_api_key",
        "API_KEY_FILE",
        "my_private_key",
        "db_password",
        "client_secret",
        "refresh_token",
        "aws_credential",
    ] {
        assert!(is_sensitive_key(key), "{key}");
    }
    for key in [
        "max_tokens",
        "tokenizer_path",
        "secrets_dir",
        "token_budget",
        "credentials",
        "name",
    ] {
        assert!(!is_sensitive_key(key), "{key}");
    }
}

#[test]
fn harness_environments_are_withheld_by_place_and_their_values_everywhere() {
    let input = json!({
        "arena_task_envs": {"GITHUB_PAT": "ghp_abcdefgh", "TRACE": "1", "UNSET": ""},
        "arena_streams": [{"name": "a", "task_envs": {"AWS_SECRET_ACCESS_KEY": "aws-secret-value"}}],
        "note": "clone with ghp_abcdefgh and aws-secret-value",
        "flag": "1",
        "version": "v1.1",
        "name": "ghp_abcdefgh",
    });
    insta::assert_json_snapshot!(redact(&input, &Secrets::none()), @r#"
    {
      "arena_task_envs": {
        "GITHUB_PAT": "<redacted>",
        "TRACE": "<redacted>",
        "UNSET": ""
      },
      "arena_streams": [
        {
          "name": "a",
          "task_envs": {
            "AWS_SECRET_ACCESS_KEY": "<redacted>"
          }
        }
      ],
      "note": "clone with <redacted> and <redacted>",
      "flag": "1",
      "version": "v1.1",
      "name": "<redacted>"
    }
    "#);
}

#[test]
fn known_secrets_are_redacted_wherever_they_appear() {
    let env = Env::from_pairs([
        ("ARENA_OPENAPI_TOKEN", "openapi-token-1"),
        ("ARENA_LLM_API_KEY", "k9"),
        ("CUSTOM_ADMIN", "admin-key-0001"),
        ("GITHUB_PAT", "ghp_0000000000"),
        ("ARENA_RL_PROXY__ADMIN_KEY_ENV", "CUSTOM_ADMIN"),
        ("PATH", "/usr/bin:/bin"),
    ]);
    let mut secrets = Secrets::from_env(&env, &["CUSTOM_ADMIN"]);
    secrets.add("generated-session-key");
    secrets.add("");
    assert_eq!(secrets.len(), 5);
    assert_eq!(format!("{secrets:?}"), "Secrets(5 withheld)");
    let input = json!({
        "url": "https://h/?t=openapi-token-1&admin=admin-key-0001",
        "nested": [{"x": "Bearer ghp_0000000000"}, "k9", "k99", "generated-session-key"],
        "admin_key_env": "CUSTOM_ADMIN",
        "path": "/usr/bin:/bin",
    });
    insta::assert_json_snapshot!(redact(&input, &secrets), @r#"
    {
      "url": "https://h/?t=<redacted>&admin=<redacted>",
      "nested": [
        {
          "x": "Bearer <redacted>"
        },
        "<redacted>",
        "k99",
        "<redacted>"
      ],
      "admin_key_env": "CUSTOM_ADMIN",
      "path": "/usr/bin:/bin"
    }
    "#);
    assert_eq!(
        secrets.redact_text("log: openapi-token-1 k9"),
        "log: <redacted> k9"
    );
}

#[test]
fn the_base64_stream_list_is_redacted_inside_or_withheld_whole() {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let decode = |v: &serde_json::Value| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().unwrap())
                .unwrap(),
        )
        .unwrap()
    };
    let streams = "streams:\n  - name: s\n    stream_id: st-1\n    task_envs: {TOKEN_X: tok-in-stream}\n    reward_transform_fn: tok-in-stream\n";
    let input = json!({"econfig": {"arena_streams_yaml_b64": b64(streams), "stream_id": "tok-in-stream"}});
    let out = redact(&input, &Secrets::none());
    insta::assert_snapshot!(decode(&out["econfig"]["arena_streams_yaml_b64"]), @r"
    streams:
    - name: s
      stream_id: st-1
      task_envs:
        TOKEN_X: <redacted>
      reward_transform_fn: <redacted>
    ");
    assert_eq!(
        out["econfig"]["stream_id"], REDACTED,
        "a value found inside the list is redacted outside it"
    );
    let broken = json!({"arena_streams_yaml_b64": "not base64!"});
    assert_eq!(
        redact(&broken, &Secrets::none())["arena_streams_yaml_b64"],
        REDACTED
    );
}

#[test]
fn secret_env_names() {
    for name in [
        "AWS_SECRET_ACCESS_KEY",
        "GITHUB_PAT",
        "HF_TOKEN",
        "WANDB_API_KEY",
        "DB_PASSWORD",
        "SSH_KEY",
        "ARENA_RL_POLICY_API_KEY",
    ] {
        assert!(is_secret_env_name(name), "{name}");
    }
    for name in [
        "PATH",
        "HOME",
        "TOKENIZERS_PARALLELISM",
        "ARENA_RL_PROXY__ADMIN_KEY_ENV",
        "PATTERN",
    ] {
        assert!(!is_secret_env_name(name), "{name}");
    }
}
