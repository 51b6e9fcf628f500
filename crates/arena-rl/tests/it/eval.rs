//! `arena-rl eval` against arena-sim over real sockets: a manifest of `env:key@version` references run `k`
//! times by two checkpoints and compared; the manifest's validation; an evaluation stopped part way and run
//! again, which launches no task twice; and the binary as a user runs it.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use arena_rl::eval::manifest::{ABSENT_ENVS, DUPLICATE_IDS, NOT_ENV_REF, ONE_STREAM};
use arena_rl::eval::results::ResultLine;
use arena_rl::eval::stats::{GroupKey, difference, wilson};
use arena_rl::run::{EvalEngines, EvalOptions, EvalSummary, evaluate};
use arena_sim::tasks::TaskFamily;
use arena_sim::{ArenaSim, StreamDef, World};

use crate::support::{OracleEngine, config, env, model_folder};

/// The stream of `env:` rows every test evaluates.
pub(crate) const STREAM: &str = "sim-env";

/// The quickstart world plus `sim-env`: `n` rows `env:min-<i>@v1` (the `min` family, Chat Completions).
pub(crate) fn world(n: usize) -> World {
    let mut w = World::quickstart();
    w.token = "sim-token".into();
    let mut s = StreamDef::new(STREAM)
        .harness("chat-sim", "1")
        .reward("sim-grader", "1")
        .family(TaskFamily::Min);
    for i in 0..n {
        s = s.row(&format!("env:min-{i:02}@v1"), &["domain:min"]);
    }
    w.streams.push(s);
    w
}

pub(crate) fn stream_override(streams: &[&str]) -> String {
    let defs: Vec<String> = streams
        .iter()
        .map(|s| {
            format!(
                "{{name: {s}, stream_id: {s}, harness: chat-sim@1, llm_protocol: chat_completions, \
                 reward_threshold: 1.0, expected_reward_ref: {{key: sim-grader, version: \"1\"}}}}"
            )
        })
        .collect();
    format!("econfig.arena_streams=[{}]", defs.join(", "))
}

pub(crate) fn options(
    root: &Path,
    model: &Path,
    manifest: &str,
    samples: u32,
    baseline: bool,
) -> EvalOptions {
    let path = root.join("manifest.json");
    std::fs::write(&path, manifest).unwrap();
    EvalOptions {
        checkpoint: model.to_path_buf(),
        baseline: baseline.then(|| model.to_path_buf()),
        samples,
        out: root.join("eval"),
        manifest: Some(path),
        streams: Vec::new(),
    }
}

fn results(out: &Path, label: &str) -> Vec<ResultLine> {
    std::fs::read_to_string(out.join(label).join("results.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

async fn run_eval(
    sim: &ArenaSim,
    root: &Path,
    model: &Path,
    streams: &[&str],
    options: &EvalOptions,
    engines: EvalEngines,
) -> arena_rl::Result<EvalSummary> {
    let cfg = config(&sim.base_url(), root, model, &[&stream_override(streams)]);
    evaluate(cfg, &env(), options, engines).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eval_compares_two_checkpoints_on_a_manifest_k_times_each() {
    let sim = ArenaSim::start(world(6)).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = model_folder(root.path());
    // Manifest order, and an older version of a listed environment.
    let manifest = r#"["env:min-03@v1", "env:min-01@old", "env:min-05@v1", "env:min-00@v1"]"#;
    let opts = options(root.path(), &model, manifest, 3, true);
    let engines = EvalEngines {
        // The checkpoint always answers right; the baseline every second answer wrong.
        candidate: Some(OracleEngine::new(&model, 0).handle()),
        baseline: Some(OracleEngine::new(&model, 2).handle()),
    };
    let summary = run_eval(&sim, root.path(), &model, &[STREAM], &opts, engines)
        .await
        .unwrap();
    let cand = results(&opts.out, "candidate");
    assert_eq!(cand.len(), 12, "4 tasks x 3 samples");
    let tasks: Vec<&str> = cand
        .iter()
        .map(|l| l.task_id.as_str())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(
        tasks,
        [
            "env:min-00@v1",
            "env:min-01@old",
            "env:min-03@v1",
            "env:min-05@v1"
        ]
    );
    for l in &cand {
        assert_eq!((l.stream.as_str(), l.domain.as_str()), (STREAM, "min"), "{l:?}");
        assert_eq!(l.status.as_deref(), Some("DONE"), "{l:?}");
        assert_eq!(
            (l.reward, l.passed, l.disposition.as_str()),
            (Some(1.0), Some(true), "success"),
            "{l:?}"
        );
    }
    let base = results(&opts.out, "baseline");
    let base_passed = base.iter().filter(|l| l.passed == Some(true)).count() as u64;
    assert_eq!(base.len(), 12);
    assert!(base_passed < 12, "the baseline fails some: {base:?}");
    // Evaluation leaves the harness's model timeout to the harness (arena-2026.md 2.13).
    for launch in sim.requests_to(arena_sim::Endpoint::LaunchOneTask) {
        let body = launch.body.expect("a launch body");
        assert!(
            body["envs"].get("DSH_LLM_REQUEST_TIMEOUT_SECONDS").is_none(),
            "{body}"
        );
    }
    // Every manifest task was launched k times per checkpoint, the old version included.
    let launches = sim.counters().launches_by_data_id;
    for id in &tasks {
        assert_eq!(launches.get(*id), Some(&6), "{id}: {launches:?}");
    }
    let f = &summary.figures;
    let (key, all) = &f.candidate[0];
    assert_eq!(*key, GroupKey::All);
    assert_eq!((all.tasks, all.n, all.passed, all.excluded), (4, 12, 12, 0));
    assert_eq!(all.interval, wilson(12, 12));
    assert_eq!(all.pass_at_k, Some(1.0));
    let diff = f.differences[0].1.expect("both sides scored");
    assert_eq!(Some(diff), difference((12, 12), (base_passed, 12)));
    assert!(
        summary.table.contains("stream/sim-env") && summary.table.contains("domain/min"),
        "{}",
        summary.table
    );
    assert!(
        summary.table.contains(&format!("{:+.3}", diff.estimate)),
        "{}",
        summary.table
    );
    assert_eq!(
        std::fs::read(&summary.png).unwrap()[..4],
        [0x89, b'P', b'N', b'G']
    );
    let metrics = std::fs::read_to_string(opts.out.join("metrics/metrics.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(metrics.lines().last().unwrap()).unwrap();
    assert_eq!(line["eval/all/pass_rate"], 1.0);
    assert_eq!(line["eval/stream/sim-env/diff"].as_f64(), Some(diff.estimate));
    assert!(line["eval-rollout/pass@k"].is_number(), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eval_refuses_manifests_the_reference_refuses() {
    let sim = ArenaSim::start(world(3)).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = model_folder(root.path());
    for (streams, manifest, phrase) in [
        (
            &[STREAM][..],
            r#"["env:min-00@v1", "env:min-09@v1"]"#,
            ABSENT_ENVS,
        ),
        (
            &[STREAM][..],
            r#"["env:min-00@v1", "env:min-00@v1"]"#,
            DUPLICATE_IDS,
        ),
        (&[STREAM][..], r#"["min-00"]"#, NOT_ENV_REF),
        // sim-chat's rows are not env refs, and a list names no stream.
        (&[STREAM, "sim-chat"][..], r#"["env:min-00@v1"]"#, ONE_STREAM),
        (
            &["sim-chat"][..],
            r#"{"stream": "sim-chat", "tasks": ["env:min-00@v1"]}"#,
            NOT_ENV_REF,
        ),
    ] {
        let opts = options(root.path(), &model, manifest, 1, false);
        let engines = EvalEngines {
            candidate: Some(OracleEngine::new(&model, 0).handle()),
            baseline: None,
        };
        let e = run_eval(&sim, root.path(), &model, streams, &opts, engines)
            .await
            .err()
            .unwrap_or_else(|| panic!("{manifest} was accepted"))
            .to_string();
        assert!(
            e.contains(phrase) && e.contains("manifest.json"),
            "{manifest}: {e}"
        );
    }
    assert_eq!(sim.counters().launches, 0, "nothing was launched");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_eval_stopped_part_way_resumes_without_running_a_task_twice() {
    let sim = ArenaSim::start(world(8)).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = model_folder(root.path());
    let manifest: Vec<String> = (0..8).map(|i| format!("env:min-{i:02}@v1")).collect();
    let opts = options(
        root.path(),
        &model,
        &serde_json::to_string(&manifest).unwrap(),
        2,
        false,
    );
    let cfg = config(
        &sim.base_url(),
        root.path(),
        &model,
        &[
            &stream_override(&[STREAM]),
            // Arena answers a repeated launch key with its task, so a relaunch collects it.
            "econfig.arena_idempotent_launch=true",
            "rollout.max_concurrent_rollouts=2",
        ],
    );
    let engine = OracleEngine::new(&model, 0).handle();
    let (first_cfg, first_opts) = (cfg.clone(), opts.clone());
    let first = tokio::spawn(async move {
        let engines = EvalEngines {
            candidate: Some(engine),
            baseline: None,
        };
        evaluate(first_cfg, &env(), &first_opts, engines).await
    });
    let lines = opts.out.join("candidate/results.jsonl");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&lines).map_or(0, |t| t.lines().count()) < 4 {
        assert!(tokio::time::Instant::now() < deadline, "no results after 60 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let before = results(&opts.out, "candidate");
    let recorded = before.len();
    assert!(recorded < 16, "stopped part way: {recorded}");
    let engines = EvalEngines {
        candidate: Some(OracleEngine::new(&model, 0).handle()),
        baseline: None,
    };
    let summary = evaluate(cfg, &env(), &opts, engines).await.unwrap();
    let all = results(&opts.out, "candidate");
    let keys: BTreeSet<&str> = all.iter().map(|l| l.key.as_str()).collect();
    assert_eq!((all.len(), keys.len()), (16, 16), "each sample once: {all:?}");
    assert!(
        summary.ran.0 <= 16 - recorded,
        "reused the journal: ran {}",
        summary.ran.0
    );
    // A task that finished before the stop is collected, never run again. The stop aborts the samples in
    // flight with the proxy their harnesses call, as a kill would: such a task may fail on the dead proxy
    // and be launched once more, so at most `max_concurrent_rollouts` (2) launches are added.
    let launches = sim.counters().launches_by_data_id;
    for id in &manifest {
        let n = launches.get(id).copied().unwrap_or(0);
        let finished = before.iter().filter(|l| l.task_id == *id).count();
        assert!(
            (2..=4).contains(&n) && (finished < 2 || n == 2),
            "{id} launched {n} times with {finished} samples finished before the stop: {launches:?} {:?}",
            all.iter().filter(|l| l.task_id == *id).collect::<Vec<_>>()
        );
    }
    let total: u64 = launches.values().sum();
    assert!(
        total <= 16 + 2,
        "at most the 2 samples in flight ran again: {launches:?}"
    );
    assert_eq!(
        summary.figures.candidate[0].1.n + summary.figures.candidate[0].1.excluded,
        16
    );
}

/// The binary with the fake engine (a model folder with no weights to load): the table on stdout, the files,
/// and a bad manifest as one line naming the reference's message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_prints_the_table_and_refuses_a_bad_manifest_in_one_line() {
    let sim = ArenaSim::start(world(2)).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = model_folder(root.path());
    let cfg = root.path().join("eval.yaml");
    std::fs::write(
        &cfg,
        format!(
            "extends: {}\nmodel: {{engine: fake}}\n",
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../examples/configs/quickstart.yaml")
                .display()
        ),
    )
    .unwrap();
    let run = |manifest: &str| {
        let manifest_path = root.path().join("m.json");
        std::fs::write(&manifest_path, manifest).unwrap();
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_arena-rl"));
        command
            .args(["eval", "--config"])
            .arg(&cfg)
            .arg("--checkpoint")
            .arg(&model)
            .arg("--manifest")
            .arg(&manifest_path)
            .arg("--out")
            .arg(root.path().join("out"))
            .args(["--samples", "2"])
            .arg(format!("econfig.arena_base_url={}", sim.base_url()))
            .arg("econfig.arena_poll_interval=0.05")
            .arg(stream_override(&[STREAM]))
            .env("ARENA_OPENAPI_TOKEN", "sim-token")
            .env("ARENA_LLM_API_KEY", "sim-llm-key")
            .env("RUST_LOG", "warn");
        command.output()
    };
    let out = run(r#"["env:min-00@v1", "env:min-01@v1"]"#).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("pass rate [95% CI]") && stdout.contains("stream/sim-env"),
        "{stdout}"
    );
    let lines = results(&root.path().join("out"), "candidate");
    assert_eq!(lines.len(), 4);
    assert!(root.path().join("out/eval.png").is_file() && root.path().join("out/report.txt").is_file());
    let out = run(r#"["env:min-00@v1", "env:min-07@v1"]"#).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(!out.status.success());
    assert!(
        last.starts_with("error: ") && last.contains(ABSENT_ENVS) && last.contains("env:min-07@v1"),
        "{stderr}"
    );
}
