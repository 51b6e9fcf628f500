//! `arena-rl model score`, `generate` and `estimate`, and the device a run's policy and trainer ask for, run as a user runs them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use trainer::backend::Cpu;
use trainer::model::CausalLm;
use trainer::{Architecture, ModelConfig, Policy, PolicyOptions, SaveDtype, Weights, save_pretrained};

fn arena_rl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_arena-rl"))
        .args(args)
        .output()
        .expect("running arena-rl")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub(crate) fn tiny_model(dir: &Path) -> Weights {
    let mut config = ModelConfig::new(Architecture::Qwen3, 40, 16, 24, 1, 2, 1);
    config.head_dim = 8;
    let weights = Weights::from_model(&CausalLm::<Cpu>::init(&config, 0.3, 3, &Default::default()));
    save_pretrained(dir, &config, &weights, SaveDtype::F32, None).expect("saving the tiny model");
    weights
}

/// Parses a float32 `.npy` file: its shape and data.
fn read_npy(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).expect("npy written");
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!((10 + len) % 64, 0, "header not aligned");
    let header = std::str::from_utf8(&bytes[10..10 + len]).expect("ascii header");
    assert!(header.contains("'descr': '<f4'") && header.contains("'fortran_order': False"));
    let shape_text = header
        .split("'shape': (")
        .nth(1)
        .expect("shape")
        .split(')')
        .next()
        .expect("shape end");
    let shape = shape_text
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let data = bytes[10 + len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    (shape, data)
}

#[test]
fn score_writes_the_policys_logits_as_npy() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("model");
    tiny_model(&dir);
    let npy = tmp.path().join("logits.npy");
    let out = arena_rl(&[
        "model",
        "score",
        "--model",
        dir.to_str().expect("utf-8"),
        "--input-ids",
        "3,1,4,1,5",
        "--output",
        npy.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (shape, data) = read_npy(&npy);
    assert_eq!(shape, vec![5, 40]);
    let policy = Policy::load(&dir, PolicyOptions::default()).expect("loads");
    let expected = policy.score(&[3, 1, 4, 1, 5]).expect("scores");
    assert_eq!(data, expected.data);
}

#[test]
fn numpy_loads_the_scored_logits() {
    let Some(python) = std::env::var_os("ARENA_RL_PY_READERS") else {
        eprintln!(
            "skipping: ARENA_RL_PY_READERS is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        );
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("model");
    tiny_model(&dir);
    let npy = tmp.path().join("logits.npy");
    let npy_arg = npy.to_str().expect("utf-8");
    let out = arena_rl(&[
        "model",
        "score",
        "--model",
        dir.to_str().expect("utf-8"),
        "--input-ids",
        "2,7,1,8",
        "--output",
        npy_arg,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let read = Command::new(python)
        .arg("-c")
        .arg(
            "import json, sys, numpy\n\
             a = numpy.load(sys.argv[1])\n\
             print(json.dumps({'dtype': a.dtype.str, 'shape': list(a.shape), \
             'c_contiguous': bool(a.flags['C_CONTIGUOUS']), 'data': a.astype(float).ravel().tolist()}))",
        )
        .arg(npy_arg)
        .output()
        .expect("python runs");
    assert!(
        read.status.success(),
        "numpy.load failed:\n{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let loaded: serde_json::Value = serde_json::from_slice(&read.stdout).expect("the script prints JSON");
    assert_eq!(loaded["dtype"], "<f4");
    assert_eq!(loaded["shape"], serde_json::json!([4, 40]));
    assert_eq!(loaded["c_contiguous"], true);
    let data: Vec<f32> = loaded["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|v| v.as_f64().expect("a number") as f32)
        .collect();
    let policy = Policy::load(&dir, PolicyOptions::default()).expect("loads");
    let expected = policy.score(&[2, 7, 1, 8]).expect("scores");
    assert_eq!(data, expected.data, "row-major [len, vocab], bit for bit");
}

#[test]
fn bad_folders_and_inputs_fail_with_one_clear_line() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("model");
    tiny_model(&dir);
    let d = dir.to_str().expect("utf-8").to_string();
    let missing = tmp.path().join("absent");
    let broken = tmp.path().join("broken");
    std::fs::create_dir_all(&broken).expect("mkdir");
    std::fs::write(
        broken.join("config.json"),
        r#"{"architectures": ["GPT2LMHeadModel"]}"#,
    )
    .expect("write");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec![d.clone(), "1,x".into()], "`x` is not a token id"),
        (
            vec![d.clone(), "1,40".into()],
            "token id 40 is out of range for vocabulary size 40",
        ),
        (vec![d.clone(), "".into()], "--input-ids is empty"),
        (
            vec![missing.to_str().expect("utf-8").into(), "1".into()],
            "not a directory",
        ),
        (
            vec![broken.to_str().expect("utf-8").into(), "1".into()],
            "unsupported architecture `GPT2LMHeadModel`",
        ),
    ];
    for (args, needle) in cases {
        let out = arena_rl(&[
            "model",
            "score",
            "--model",
            &args[0],
            "--input-ids",
            &args[1],
            "--output",
            "/dev/null",
        ]);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = stderr(&out);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    }
}

#[test]
fn generate_answers_a_chat_prompt_with_smollm2() {
    let dir: PathBuf = std::env::var_os("ARENA_RL_SMOLLM2").map(PathBuf::from).unwrap_or_else(|| {
        panic!("ARENA_RL_SMOLLM2 is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first")
    });
    let out = arena_rl(&[
        "model",
        "generate",
        "--model",
        dir.to_str().expect("utf-8"),
        "--prompt",
        "What is the capital of France?",
        "--max-new-tokens",
        "24",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(answer.contains("Paris"), "answer: {answer}");
}

#[test]
fn estimate_prints_a_published_shape_and_a_model_folder() {
    let out = arena_rl(&["model", "estimate", "--shape", "Qwen3-4B", "--tokens", "8192"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(text.starts_with("Qwen/Qwen3-4B: 4.0"), "{text}");
    assert!(text.contains("AdamW moments"), "{text}");
    assert!(
        text.contains("one step of 8192 tokens") && text.contains("with layer recompute"),
        "{text}"
    );
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let out = arena_rl(&["model", "estimate", "--model", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = arena_rl(&["model", "estimate", "--shape", "gpt-5"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--shape \"gpt-5\" is not one of"),
        "{}",
        stderr(&out)
    );
}

/// A CPU-only build asked for CUDA answers one line naming the setting, before anything is loaded.
#[cfg(not(feature = "cuda"))]
#[test]
fn a_cpu_only_build_asked_for_cuda_says_so_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    tiny_model(dir.path());
    let out = arena_rl(&[
        "serve-policy",
        "--model",
        dir.path().to_str().unwrap(),
        "--port",
        "0",
        "--weights-root",
        dir.path().to_str().unwrap(),
        "--device",
        "cuda:1",
    ]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("--device cuda:1") && err.contains("no `cuda` feature"),
        "{err}"
    );
    let config: stream_config::RunConfig = stream_config::load_run_config_str(
        "run.yaml",
        "experiment_name: e\ntrial_name: t\nmodel:\n  device: cuda\nactor:\n  device: cuda:1\n",
        &[],
        &stream_config::Env::default(),
    )
    .unwrap();
    let policy = arena_rl::run::settings::policy_device(&config)
        .unwrap_err()
        .to_string();
    assert!(
        policy.starts_with("model.device \"cuda\": ") && policy.contains("no `cuda` feature"),
        "{policy}"
    );
    let trainer = arena_rl::run::settings::trainer_options(&config)
        .unwrap_err()
        .to_string();
    assert!(trainer.starts_with("actor.device \"cuda:1\": "), "{trainer}");
    assert!(!policy.contains('\n') && !trainer.contains('\n'));
}
