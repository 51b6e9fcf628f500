//! Redaction: spec 8.3.

use serde_json::json;

use super::*;

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
    let out = redact(&input);
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
    assert_eq!(redact(&input), input);
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
