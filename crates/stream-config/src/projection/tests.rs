//! Projection: spec 2.6, with `extends:` resolved and streams files accepted.

use base64::Engine as _;

use super::*;
use crate::load_stream_configs_with_env;

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn env() -> Env {
    Env::from_pairs([("HOME", "/nonexistent-home")])
}

const BASE: &str = "experiment_name: exp\ntrial_name: t\neconfig:\n  arena_harness: claude-code@1\n  arena_streams:\n    - {name: replaced, stream_id: x}\n";

const STREAMS: &str = concat!(
    "extends: base.yaml\n",
    "econfig:\n",
    "  arena_streams:\n",
    "    - stream_id: stream/a\n",
    "      name: astra\n",
    "      sampling_weight: 3\n",
    "      expected_reward_ref: {version: '2', key: grader}\n",
    "      task_envs: {Z: '1', A: '2'}\n",
    "    - name: tbench\n",
    "      stream_id: '0042'\n",
    "      harness: openai-codex@7\n",
    "      reward_threshold: 0.98\n",
);

#[test]
fn inline_streams_project_with_key_order_after_extends() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "base.yaml", BASE);
    let top = write(dir.path(), "top.yaml", STREAMS);
    let p = project_streams(&top, &env()).unwrap();
    insta::assert_snapshot!(p.yaml, @r#"
    streams:
    - stream_id: stream/a
      name: astra
      sampling_weight: 3
      expected_reward_ref:
        version: "2"
        key: grader
      task_envs:
        Z: "1"
        A: "2"
    - name: tbench
      stream_id: "0042"
      harness: openai-codex@7
      reward_threshold: 0.98
    "#);
    assert!(!p.yaml.ends_with('\n') && !p.base64.ends_with('\n'));
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(&p.base64)
        .unwrap();
    assert_eq!(String::from_utf8(decoded).unwrap(), p.yaml);

    // The projection loads to the same streams as the config itself (run-level harness included).
    let config = crate::load_run_config(&top, &[], &env()).unwrap();
    let from_config = load_stream_configs_with_env(&config.econfig, &env()).unwrap();
    let projected = EConfig {
        arena_streams_yaml_b64: p.base64,
        arena_harness: config.econfig.arena_harness.clone(),
        ..EConfig::default()
    };
    assert_eq!(
        load_stream_configs_with_env(&projected, &env()).unwrap(),
        from_config
    );
    assert_eq!(from_config[1].stream_id, "0042");
}

#[test]
fn interpolation_inside_streams_is_rejected_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let top = write(
        dir.path(),
        "c.yaml",
        "econfig:\n  arena_streams:\n    - name: a\n      stream_id: ${env:STREAM}\n      task_envs: {TOKEN: '${env:TOKEN}', '${k}': v}\n",
    );
    let err = project_streams(&top, &env()).unwrap_err().to_string();
    insta::assert_snapshot!(err.replace("; (", ";\n("), @r"
    3 problems: (1) econfig.arena_streams[0].stream_id: contains `${`, which projection does not resolve (preflight and training could resolve it differently);
    (2) econfig.arena_streams[0].task_envs.TOKEN: contains `${`, which projection does not resolve (preflight and training could resolve it differently);
    (3) econfig.arena_streams[0].task_envs.${k}: the key contains `${`, which projection does not resolve (preflight and training could resolve it differently)
    ");
}

#[test]
fn a_streams_file_is_projected() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "streams.yaml",
        "# comment\nstreams:\n  - {name: s1, stream_id: id1, llm_protocol: anthropic}\n",
    );
    let top = write(
        dir.path(),
        "c.yaml",
        &format!("econfig:\n  arena_streams_file: {}\n", file.display()),
    );
    let p = project_streams(&top, &env()).unwrap();
    insta::assert_snapshot!(p.yaml, @r"
    streams:
    - name: s1
      stream_id: id1
      llm_protocol: anthropic
    ");
    let top = write(
        dir.path(),
        "bad.yaml",
        "econfig:\n  arena_streams_file: ${env:DATASET_CONFIG}\n",
    );
    let err = project_streams(&top, &env()).unwrap_err().to_string();
    assert!(err.contains("contains `${`"), "{err}");
}

#[test]
fn configs_without_exactly_one_source_cannot_be_projected() {
    let dir = tempfile::tempdir().unwrap();
    let neither = write(
        dir.path(),
        "neither.yaml",
        "experiment_name: e\ntrial_name: t\neconfig:\n  arena_harness: h@1\n",
    );
    let err = project_streams(&neither, &env()).unwrap_err().to_string();
    assert!(
        err.contains("nothing to project") && err.contains("ARENA_STREAM_ID"),
        "{err}"
    );
    let both = write(
        dir.path(),
        "both.yaml",
        "econfig:\n  arena_streams: [{name: a, stream_id: s}]\n  arena_streams_file: /x.yaml\n",
    );
    let err = project_streams(&both, &env()).unwrap_err().to_string();
    assert!(err.contains("mutually exclusive"), "{err}");
    let invalid = write(
        dir.path(),
        "invalid.yaml",
        "econfig:\n  arena_streams: [{name: a/b, stream_id: s}]\n",
    );
    let err = project_streams(&invalid, &env()).unwrap_err().to_string();
    assert!(err.contains("may only contain"), "{err}");
}

/// A single-stream config projects as its one Stream, `default`, with the Stream `ARENA_STREAM_ID` names.
#[test]
fn a_single_stream_config_projects_its_one_stream() {
    let dir = tempfile::tempdir().unwrap();
    let single = write(
        dir.path(),
        "single.yaml",
        "experiment_name: e\ntrial_name: t\neconfig:\n  stream_id: from-the-file\n  arena_harness: claude-code@1\n  arena_llm_protocol: anthropic\n",
    );
    let p = project_streams(&single, &env()).unwrap();
    assert_eq!(
        p.yaml,
        "streams:\n- name: default\n  stream_id: from-the-file\n  harness: claude-code@1\n  llm_protocol: anthropic"
    );
    let env = Env::from_pairs([("HOME", "/nonexistent-home"), ("ARENA_STREAM_ID", "stream-9")]);
    let p = project_streams(&single, &env).unwrap();
    assert!(p.yaml.contains("stream_id: stream-9"), "{}", p.yaml);
}
