//! Stream definitions: spec 8.2 items 1, 2, 4, 7, 8 and 18, every rule of 2.3, the three sources and the
//! legacy fallback.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::json;

use super::*;

fn b64(text: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(text)
}

fn load(econfig: &EConfig) -> Result<Vec<StreamConfig>> {
    load_stream_configs_with_env(econfig, &Env::from_pairs([("HOME", "/nonexistent-home")]))
}

fn inline(entries: Vec<Value>) -> EConfig {
    EConfig {
        arena_streams: entries,
        ..EConfig::default()
    }
}

fn error_of(econfig: &EConfig) -> String {
    load(econfig).expect_err("config should be rejected").to_string()
}

fn envs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const TWO_STREAMS: &str = r#"
streams:
  - name: astra
    stream_id: stream/a
    sampling_weight: 3
    harness: claude-code@1
    task_envs:
      SHARED: from-stream
      ONLY_A: "1"
    expected_reward_ref: {key: astra-grader, version: "2"}
  - name: tbench
    stream_id: stream/b
    expected_reward_ref:
      key: tb-grader
      version: 7
    reward_threshold: 0.98
"#;

#[test]
fn file_backed_streams_parse_reward_refs_and_merge_common_task_envs() {
    // Spec 8.2 item 1.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("streams.yaml");
    std::fs::write(&file, TWO_STREAMS).unwrap();
    let econfig = EConfig {
        arena_streams_file: file.display().to_string(),
        arena_harness: "codex@3".into(),
        arena_task_envs: envs(&[("SHARED", "from-run"), ("COMMON", "yes")]),
        arena_reward_transform_fn: "ignored.in.multi_stream".into(),
        arena_reward_threshold: Some(0.5),
        ..EConfig::default()
    };
    let streams = load(&econfig).unwrap();
    assert_eq!(streams.len(), 2);
    let (a, b) = (&streams[0], &streams[1]);
    assert_eq!(a.name, "astra");
    assert_eq!(a.stream_id, "stream/a");
    assert_eq!(a.sampling_weight, 3.0);
    assert_eq!(a.harness, "claude-code@1");
    assert_eq!(a.expected_reward_ref, RewardRef::new("astra-grader", "2"));
    assert_eq!(
        a.task_envs,
        envs(&[("COMMON", "yes"), ("ONLY_A", "1"), ("SHARED", "from-stream")])
    );
    assert_eq!(a.reward_transform_fn, "");
    assert_eq!(a.reward_threshold, None);
    assert_eq!(b.harness, "codex@3", "run-level harness fills an empty one");
    assert_eq!(b.expected_reward_ref, RewardRef::new("tb-grader", "7"));
    assert_eq!(b.task_envs, envs(&[("COMMON", "yes"), ("SHARED", "from-run")]));
    assert_eq!(b.reward_threshold, Some(0.98));
    assert_eq!(b.reward_transform_fn, "", "run-level transform is not applied");
    assert_eq!(b.llm_protocol, None);
}

#[test]
fn base64_inline_yaml_parses() {
    // Spec 8.2 item 2.
    let yaml = "streams:\n  - name: s1\n    stream_id: id-1\n    sampling_weight: 3.0\n    expected_reward_ref: {key: k, version: v1}\n";
    let econfig = EConfig {
        arena_streams_yaml_b64: b64(yaml),
        ..EConfig::default()
    };
    let streams = load(&econfig).unwrap();
    assert_eq!(streams.len(), 1);
    assert_eq!(streams[0].sampling_weight, 3.0);
    assert_eq!(streams[0].expected_reward_ref, RewardRef::new("k", "v1"));

    let bare_list = "- {name: s1, stream_id: id-1}\n- {name: s2, stream_id: id-2, llm_protocol: responses}\n";
    let econfig = EConfig {
        arena_streams_yaml_b64: b64(bare_list),
        ..EConfig::default()
    };
    let streams = load(&econfig).unwrap();
    assert_eq!(streams[1].llm_protocol, Some(LlmProtocol::Responses));
    assert_eq!(streams[0].sampling_weight, 1.0);
}

#[test]
fn invalid_base64_or_utf8_is_rejected() {
    // Spec 8.2 item 4: strict alphabet and padding, then UTF-8.
    for bad in [
        "not base64!".to_string(),
        "c3RyZWFtczo".to_string(),
        "c3Ry ZWFt".to_string(),
        base64::engine::general_purpose::STANDARD.encode([0xff, 0xfe, 0x00]),
    ] {
        let econfig = EConfig {
            arena_streams_yaml_b64: bad.clone(),
            ..EConfig::default()
        };
        let err = error_of(&econfig);
        assert!(err.contains("not valid base64 UTF-8"), "{bad:?}: {err}");
        assert!(err.starts_with("econfig.arena_streams_yaml_b64: "), "{err}");
    }
}

#[test]
fn stream_name_with_slash_is_rejected() {
    // Spec 8.2 item 7.
    let err = error_of(&inline(vec![json!({"name": "a/b", "stream_id": "s"})]));
    insta::assert_snapshot!(err, @r#"econfig.arena_streams[0].name: Arena Stream "a/b": name "a/b" may only contain letters, digits, '.', '_', and '-'"#);
}

#[test]
fn duplicate_stream_ids_and_names_are_rejected() {
    // Spec 8.2 item 8, and unique names.
    let err = error_of(&inline(vec![
        json!({"name": "a", "stream_id": "same"}),
        json!({"name": "b", "stream_id": "same"}),
        json!({"name": "a", "stream_id": "other"}),
    ]));
    insta::assert_snapshot!(err, @r#"2 problems: (1) econfig.arena_streams[1].stream_id: Arena Stream ids must be unique: streams "a" and "b" both use stream_id "same"; (2) econfig.arena_streams[2].name: Arena Stream names must be unique: "a" is also the name of econfig.arena_streams[0]"#);
    assert!(err.contains("ids must be unique") && err.contains("names must be unique"));
}

#[test]
fn duplicates_are_reported_with_the_other_problems_of_either_entry() {
    // The first entry is invalid (a bad weight), the second duplicates its name and id, the third and
    // fourth are both invalid and share an id: every problem appears, the duplicates included.
    let err = error_of(&inline(vec![
        json!({"name": "a", "stream_id": "s1", "sampling_weight": -1}),
        json!({"name": "a", "stream_id": "s1"}),
        json!({"name": "b", "stream_id": "s2", "llm_protocol": "gemini"}),
        json!({"name": "c", "stream_id": "s2", "task_envs": []}),
    ]));
    insta::assert_snapshot!(err.replace("; (", ";\n("), @r#"
    6 problems: (1) econfig.arena_streams[0].sampling_weight: Arena Stream "a": sampling_weight must be finite and positive, got -1;
    (2) econfig.arena_streams[2].llm_protocol: Arena Stream "b": unsupported llm_protocol "gemini": expected one of anthropic, responses, chat_completions;
    (3) econfig.arena_streams[3].task_envs: Arena Stream "c": task_envs must be a mapping of strings to strings, got a list;
    (4) econfig.arena_streams[1].name: Arena Stream names must be unique: "a" is also the name of econfig.arena_streams[0];
    (5) econfig.arena_streams[1].stream_id: Arena Stream ids must be unique: streams "a" and "a" both use stream_id "s1";
    (6) econfig.arena_streams[3].stream_id: Arena Stream ids must be unique: streams "b" and "c" both use stream_id "s2"
    "#);
}

#[test]
fn every_per_entry_rule_names_its_stream_field_and_value() {
    // Spec 2.3, rules 1-10, all reported at once.
    let err = error_of(&inline(vec![
        json!(["not", "an", "object"]),
        json!({"name": "ok", "stream_id": "s0", "colour": 1, "alpha": 2}),
        json!({"name": " ", "stream_id": ""}),
        json!({"name": "w1", "stream_id": "s1", "sampling_weight": true}),
        json!({"name": "w2", "stream_id": "s2", "sampling_weight": 0}),
        json!({"name": "w3", "stream_id": "s3", "sampling_weight": ".inf"}),
        json!({"name": "p", "stream_id": "s4", "llm_protocol": "gemini"}),
        json!({"name": "e", "stream_id": "s5", "task_envs": {"A": 1, "": "x"}}),
        json!({"name": "t", "stream_id": "s6", "reward_threshold": "high"}),
        json!({"name": "r1", "stream_id": "s7", "expected_reward_ref": "k@v"}),
        json!({"name": "r2", "stream_id": "s8", "expected_reward_ref": {"key": "k", "extra": 1}}),
    ]));
    insta::assert_snapshot!(err.replace("; (", ";\n("));
}

#[test]
fn entry_values_are_trimmed_and_nulls_are_defaults() {
    let streams = load(&inline(vec![json!({
        "name": " a ",
        "stream_id": " s ",
        "harness": " claude@1 ",
        "llm_protocol": " anthropic ",
        "task_envs": null,
        "reward_threshold": null,
        "expected_reward_ref": "",
        "reward_transform_fn": " m.f ",
    })]))
    .unwrap();
    let s = &streams[0];
    assert_eq!(
        (s.name.as_str(), s.stream_id.as_str(), s.harness.as_str()),
        ("a", "s", "claude@1")
    );
    assert_eq!(s.llm_protocol, Some(LlmProtocol::Anthropic));
    assert!(s.task_envs.is_empty() && s.expected_reward_ref.is_empty());
    assert_eq!(s.reward_transform_fn, "m.f");
}

#[test]
fn sources_are_mutually_exclusive() {
    let econfig = EConfig {
        arena_streams: vec![json!({"name": "a", "stream_id": "s"})],
        arena_streams_file: "/x.yaml".into(),
        ..EConfig::default()
    };
    let err = error_of(&econfig);
    assert!(err.contains("are mutually exclusive"), "{err}");
    assert!(err.contains("arena_streams and arena_streams_file"), "{err}");
}

#[test]
fn documents_must_be_a_streams_mapping_or_a_non_empty_list() {
    let check = |yaml: &str, want: &str| {
        let econfig = EConfig {
            arena_streams_yaml_b64: b64(yaml),
            ..EConfig::default()
        };
        let err = error_of(&econfig);
        assert!(err.contains(want), "{yaml:?}: {err}");
    };
    check(
        "streams: []\nextra: 1\nalso: 2\n",
        r#"unknown top-level fields: ["also", "extra"]"#,
    );
    check("streams: []\n", "must be non-empty");
    check("[]\n", "must be non-empty");
    check("streams: {a: 1}\n", "`streams` must be a list, got a mapping");
    check("just text\n", "must be a `streams:` mapping or a list");
    check("other: 1\n", "unknown top-level fields");
    check("streams: [\n", "not valid");
}

#[test]
fn streams_file_must_exist_and_tilde_is_expanded() {
    let econfig = EConfig {
        arena_streams_file: "/definitely/not/here.yaml".into(),
        ..EConfig::default()
    };
    assert!(error_of(&econfig).contains("Arena Streams file not found: /definitely/not/here.yaml"));

    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("s.json"), r#"[{"name": "j", "stream_id": "x"}]"#).unwrap();
    let econfig = EConfig {
        arena_streams_file: "~/s.json".into(),
        ..EConfig::default()
    };
    let env = Env::from_pairs([("HOME", home.path().display().to_string())]);
    let streams = load_stream_configs_with_env(&econfig, &env).unwrap();
    assert_eq!(streams[0].name, "j", "JSON is YAML");
}

#[test]
fn problems_in_a_streams_file_name_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("streams.yaml");
    std::fs::write(
        &file,
        "streams:\n  - name: ok\n    stream_id: a\n  - name: bad\n    stream_id: b\n    sampling_weight: -2\n",
    )
    .unwrap();
    let econfig = EConfig {
        arena_streams_file: file.display().to_string(),
        ..EConfig::default()
    };
    let err = error_of(&econfig).replace(&dir.path().display().to_string(), "<dir>");
    insta::assert_snapshot!(err, @r#"<dir>/streams.yaml:6:5: streams[1].sampling_weight: Arena Stream "bad": sampling_weight must be finite and positive, got -2"#);
}

#[test]
fn legacy_single_stream_fallback() {
    // Spec 2.2 legacy mode and 8.2 item 18 (the config loader's test covers the string threshold).
    let econfig = EConfig {
        stream_id: " legacy-id ".into(),
        arena_harness: "openai-codex@2".into(),
        arena_task_envs: envs(&[("K", "v")]),
        arena_reward_threshold: Some(0.98),
        arena_reward_transform_fn: "pkg.fn".into(),
        ..EConfig::default()
    };
    let streams = load(&econfig).unwrap();
    assert_eq!(
        streams,
        vec![StreamConfig {
            name: "default".into(),
            stream_id: "legacy-id".into(),
            sampling_weight: 1.0,
            harness: "openai-codex@2".into(),
            llm_protocol: None,
            task_envs: envs(&[("K", "v")]),
            expected_reward_ref: RewardRef::default(),
            reward_threshold: Some(0.98),
            reward_transform_fn: "pkg.fn".into(),
        }]
    );
    assert_eq!(streams[0].resolved_protocol(None), LlmProtocol::Responses);

    // An empty stream id is allowed (Arena's first ACTIVE stream is used).
    assert_eq!(load(&EConfig::default()).unwrap()[0].stream_id, "");

    let bad = EConfig {
        arena_llm_protocol: "gemini".into(),
        arena_reward_threshold: Some(f64::INFINITY),
        ..EConfig::default()
    };
    let err = error_of(&bad);
    assert!(err.contains("Unsupported Arena LLM protocol override"), "{err}");
    assert!(
        err.contains("econfig.arena_reward_threshold: must be finite"),
        "{err}"
    );
}

#[test]
fn protocol_resolution_follows_spec_2_5() {
    let mut s = parse_stream_config(&json!({"name": "a", "stream_id": "s"})).unwrap();
    assert_eq!(
        s.resolved_protocol(Some("Claude-Code-With-Skills")),
        LlmProtocol::Anthropic
    );
    assert_eq!(s.resolved_protocol(None), LlmProtocol::ChatCompletions);
    s.harness = "openai-codex@1".into();
    assert_eq!(
        s.resolved_protocol(Some("claude")),
        LlmProtocol::Responses,
        "the configured harness beats the stream default"
    );
    s.llm_protocol = Some(LlmProtocol::ChatCompletions);
    assert_eq!(s.resolved_protocol(Some("claude")), LlmProtocol::ChatCompletions);
    assert_eq!(s.harness_ref(), Some(("openai-codex", "1")));
}

#[test]
fn stream_config_serialises_with_reference_field_names() {
    let s = parse_stream_config(&json!({"name": "a", "stream_id": "s", "task_envs": {"B": "2"}})).unwrap();
    insta::assert_json_snapshot!(s, @r#"
    {
      "name": "a",
      "stream_id": "s",
      "sampling_weight": 1.0,
      "harness": "",
      "llm_protocol": "",
      "task_envs": {
        "B": "2"
      },
      "expected_reward_ref": {
        "key": "",
        "version": ""
      },
      "reward_threshold": null,
      "reward_transform_fn": ""
    }
    "#);
    let back: StreamConfig = serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
    assert_eq!(back, s);
}

#[test]
fn debug_output_withholds_task_env_values() {
    let s = parse_stream_config(
        &json!({"name": "a", "stream_id": "s", "task_envs": {"HEADERS": "x-session-token: abc123"}}),
    )
    .unwrap();
    let shown = format!("{s:?}");
    assert!(shown.contains("HEADERS") && !shown.contains("abc123"), "{shown}");
    let econfig = EConfig {
        arena_task_envs: envs(&[("PLAIN", "hunter2")]),
        arena_streams: vec![json!({"name": "a", "stream_id": "s", "task_envs": {"X": "sk-inline"}})],
        ..EConfig::default()
    };
    let shown = format!("{econfig:?}");
    assert!(
        !shown.contains("hunter2") && !shown.contains("sk-inline"),
        "{shown}"
    );
    assert!(shown.contains("arena_request_timeout"), "{shown}");
}

#[test]
fn references_parse_at_the_first_at_sign() {
    assert_eq!(
        ArenaRef::parse("claude-code@1@beta"),
        Some(ArenaRef::new("claude-code", "1@beta"))
    );
    assert_eq!(ArenaRef::parse("claude-code"), None);
    assert_eq!(ArenaRef::parse("@1"), None);
    assert_eq!(ArenaRef::parse("claude-code@"), None);
    let json = serde_json::json!({"key": "g", "version": "2"});
    assert_eq!(ArenaRef::from_json(Some(&json)), Some(ArenaRef::new("g", "2")));
    let blank = serde_json::json!({"key": "g", "version": ""});
    assert_eq!(ArenaRef::from_json(Some(&blank)), None);
    assert_eq!(ArenaRef::new("g", "2").to_string(), "g@2");
}

#[test]
fn drift_is_only_a_pin_that_the_live_ref_does_not_match() {
    let pin = RewardRef::new("grader", "1");
    assert_eq!(reward_ref_drift(&RewardRef::default(), None), None);
    assert_eq!(reward_ref_drift(&RewardRef::default(), Some(&pin)), None);
    assert_eq!(reward_ref_drift(&pin, Some(&pin)), None);
    let moved = reward_ref_drift(&pin, Some(&RewardRef::new("grader", "2"))).expect("drifted");
    assert_eq!(moved.to_string(), "pinned grader@1, live grader@2");
    let gone = reward_ref_drift(&pin, None).expect("drifted");
    assert_eq!(gone.to_string(), "pinned grader@1, live none");
}
