//! `arena-rl quickstart --check` and its config errors, `arena-rl streams project`, and the example configs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use stream_config::{EConfig, Env, load_run_config, load_stream_configs_with_env};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/arena-rl sits two levels below the repository root")
        .to_path_buf()
}

fn arena_rl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_arena-rl"))
        .args(args)
        .current_dir(repo_root())
        .env_remove("ARENA_OPENAPI_BASE")
        .env_remove("ARENA_STREAM_ID")
        .output()
        .expect("the arena-rl binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn quickstart_check_prints_the_resolved_streams() {
    let out = arena_rl(&["quickstart", "--check"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("2 Streams: sim-messages (weight 1, anthropic), sim-chat (weight 1, chat_completions)"),
        "{text}"
    );
    assert!(text.contains("route mode session_gateway"), "{text}");
    assert!(text.contains("- name: sim-chat\n"), "{text}");
}

#[test]
fn quickstart_takes_overrides_and_reports_every_problem_on_one_line() {
    let out = arena_rl(&[
        "quickstart",
        "--check",
        "gconfig.n_samples=3",
        "actor.reward_norm=null",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));

    // The full command validates the config before building anything.
    let out = arena_rl(&[
        "quickstart",
        "gconfig.top_p=2",
        "econfig.arena_streams=[{name: a/b, stream_id: x}]",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: 2 problems: "), "{err}");
    assert!(
        err.contains("override `gconfig.top_p=2`: gconfig.top_p: must be in (0, 1], got 2"),
        "{err}"
    );
    assert!(err.contains("may only contain"), "{err}");
}

#[test]
fn streams_project_round_trips_through_base64() {
    let dir = tempfile::tempdir().unwrap();
    let with_file = dir.path().join("flash.yaml");
    let streams_file = repo_root().join("examples/configs/flash_v3_streams.yaml");
    std::fs::write(
        &with_file,
        format!("econfig:\n  arena_streams_file: {}\n", streams_file.display()),
    )
    .unwrap();
    let with_file = with_file.display().to_string();
    for (config, names) in [
        ("examples/configs/multi_stream.yaml", ["swe", "terminal"]),
        (with_file.as_str(), ["flash-v3-swe", "flash-v3-terminal"]),
    ] {
        let out = arena_rl(&["streams", "project", config]);
        assert!(out.status.success(), "{config}: {}", stderr(&out));
        let b64 = stdout(&out);
        assert!(!b64.ends_with('\n') && !b64.is_empty(), "{b64:?}");
        let econfig = EConfig {
            arena_streams_yaml_b64: b64,
            ..EConfig::default()
        };
        let streams = load_stream_configs_with_env(&econfig, &Env::default()).unwrap();
        let got: Vec<&str> = streams.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(got, names, "{config}");
    }
    let out = arena_rl(&[
        "streams",
        "project",
        "examples/configs/multi_stream.yaml",
        "--yaml",
    ]);
    assert!(
        stdout(&out).starts_with("streams:\n- name: swe\n"),
        "{}",
        stdout(&out)
    );

    let out = arena_rl(&["streams", "project", "examples/configs/missing.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).starts_with("error: examples/configs/missing.yaml: cannot read"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn every_example_config_loads_and_validates() {
    let root = repo_root();
    let dir = root.join("examples/configs");
    let streams_file = dir.join("flash_v3_streams.yaml").display().to_string();
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.extension().is_none_or(|e| e != "yaml") || name == "flash_v3_streams.yaml" {
            continue;
        }
        // Relative `arena_streams_file` paths resolve against the working directory (the repository root
        // for users); tests name the file absolutely instead of changing directory.
        let overrides = if name == "flash_v3.yaml" {
            vec![format!("econfig.arena_streams_file={streams_file}")]
        } else {
            Vec::new()
        };
        let config =
            load_run_config(&path, &overrides, &Env::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let streams = load_stream_configs_with_env(&config.econfig, &Env::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!streams.is_empty(), "{name}");
        seen += 1;
    }
    assert!(seen >= 3, "found only {seen} example configs");
}

#[test]
fn help_names_the_commands() {
    let out = arena_rl(&["--help"]);
    let text = stdout(&out);
    assert!(text.contains("quickstart") && text.contains("streams"), "{text}");
    let out = arena_rl(&["streams", "project", "--help"]);
    assert!(stdout(&out).contains("--yaml"), "{}", stdout(&out));
}
