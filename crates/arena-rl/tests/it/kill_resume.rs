//! Kill -9 at random (seeded) points, then the same command again: the run resumes from its checkpoint and
//! journal, loses no finished rollout, trains on none twice, and cleans up what the killed process left.
//!
//! The training run is this test binary itself, re-executed as a child process running [`child`] (the loop
//! with the oracle engine and a recording training step), so the kill is a real SIGKILL of a real process.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use arena_rl::Result;
use arena_rl::error::Context as _;
use arena_rl::failpoint;
use arena_rl::journal::{Entry, SampleKey, Verdict};
use arena_rl::run::{Plugins, train};
use arena_rl::train::{GrpoStep, NewWeights, StepOutput, TrainBatch, TrainStep};
use arena_sim::{ArenaSim, Endpoint, FaultKind, FaultRule, World};
use stream_config::TaskStatus;

use crate::support::{OracleEngine, config, env, model_folder};

const STEPS: u64 = 4;

/// Remembers which rollouts each step trained on, its checkpointed state that list; with `grpo`, the run's
/// real GRPO step trains on them (and its state rides in the same checkpoints).
struct Recording {
    consumed: Vec<(u64, String)>,
    grpo: Option<GrpoStep>,
}

impl TrainStep for Recording {
    fn begin(&mut self, total_steps: u64) -> Result<()> {
        self.grpo.as_mut().map_or(Ok(()), |g| g.begin(total_steps))
    }

    fn train(&mut self, step: u64, batch: &TrainBatch) -> Result<StepOutput> {
        let out = match &mut self.grpo {
            Some(g) => g.train(step, batch)?,
            None => StepOutput {
                metrics: vec![],
                weights: NewWeights::Unchanged,
            },
        };
        let keys: BTreeSet<String> = batch.samples.iter().map(|s| s.key.to_string()).collect();
        self.consumed.extend(keys.into_iter().map(|k| (step, k)));
        Ok(out)
    }

    fn save(&mut self, dir: &Path) -> Result<()> {
        if let Some(g) = &mut self.grpo {
            g.save(dir)?;
        }
        let json = serde_json::to_vec(&self.consumed).context("serialising the consumed rollouts")?;
        std::fs::write(dir.join("consumed.json"), json).context("writing consumed.json")
    }

    fn load(&mut self, dir: &Path) -> Result<NewWeights> {
        let json = std::fs::read(dir.join("consumed.json")).context("reading consumed.json")?;
        self.consumed = serde_json::from_slice(&json).context("parsing consumed.json")?;
        self.grpo
            .as_mut()
            .map_or(Ok(NewWeights::Unchanged), |g| g.load(dir))
    }
}

fn child_config(base: &str, root: &Path, model: &Path, run: Child<'_>) -> stream_config::RunConfig {
    let (mode, arena) = (run.mode, run.arena);
    let mut can: Vec<String> = arena
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| format!("econfig.{s}=true"))
        .collect();
    if run.grpo {
        // The real GRPO step publishes weights to disk, as for policy servers; the oracle stands in for them.
        can.push("rollout.policy_servers=[http://127.0.0.1:9]".into());
        can.push("actor.lr=0.01".into());
    }
    let can: Vec<&str> = can.iter().map(String::as_str).collect();
    config(
        base,
        root,
        model,
        &[
            &can[..],
            &[
                &format!("econfig.arena_llm_route_mode={mode}"),
                &format!("actor.total_train_steps={STEPS}"),
                "train_dataset.batch_size=2",
                "gconfig.n_samples=3",
                "rollout.max_head_offpolicyness=1",
                // Dynamic sampling: a batch group whose rewards are all equal makes the step draw more prompts.
                "rollout.max_oversample_factor=3",
                "checkpoint.save_every=1",
                "checkpoint.keep_last=1",
                // Retired journal segments are kept aside, so the test can read the whole history.
                "rollout.journal_keep_retired=true",
            ],
        ]
        .concat(),
    )
}

/// The child: runs the loop when the parent asks for it, otherwise does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn child() {
    let (Ok(base), Ok(root), Ok(mode), Ok(arena)) = (
        std::env::var("ARENA_RL_KILL_BASE"),
        std::env::var("ARENA_RL_KILL_ROOT"),
        std::env::var("ARENA_RL_KILL_MODE"),
        std::env::var("ARENA_RL_KILL_ARENA"),
    ) else {
        return;
    };
    let grpo = std::env::var_os("ARENA_RL_KILL_GRPO").is_some();
    let root = PathBuf::from(root);
    let model = root.join("model");
    let run = Child {
        mode: &mode,
        arena: &arena,
        grpo,
    };
    let config = child_config(&base, &root, &model, run);
    let run_dir = arena_rl::run::RunPaths::of(&config).run_dir;
    let grpo = grpo.then(|| GrpoStep::from_run_config(&config, &run_dir).unwrap());
    let summary = train(
        config,
        &env(),
        Plugins {
            engine: Some(OracleEngine::settled(&model).handle()),
            step: Box::new(Recording {
                consumed: vec![],
                grpo,
            }),
        },
    )
    .await
    .unwrap();
    println!("CHILD-DONE resumed_at={}", summary.resumed_at);
}

/// The child's run: `mode` is the route mode, `arena` the `econfig` flags saying what this Arena can do
/// (`arena_idempotent_launch,arena_cancel_tasks`, either, or empty), `grpo` whether the real GRPO step trains
/// (a tiny model in the root's `model` folder) or only a recording one.
#[derive(Clone, Copy)]
struct Child<'a> {
    mode: &'a str,
    arena: &'a str,
    grpo: bool,
}

fn child_command(base: &str, root: &Path, run: Child<'_>) -> Command {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["kill_resume::child", "--exact", "--nocapture", "--test-threads=1"])
        .env("ARENA_RL_KILL_BASE", base)
        .env("ARENA_RL_KILL_ROOT", root)
        .env("ARENA_RL_KILL_MODE", run.mode)
        .env("ARENA_RL_KILL_ARENA", run.arena)
        .env("RUST_LOG", "warn")
        .env_remove("ARENA_RL_KILL_GRPO")
        .env_remove(failpoint::ENV)
        .stdout(Stdio::piped());
    if run.grpo {
        command.env("ARENA_RL_KILL_GRPO", "1");
    }
    command
}

fn spawn_child(base: &str, root: &Path, run: Child<'_>) -> std::process::Child {
    child_command(base, root, run)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs the child with the fail-point `point` (`name` or `name:n`) armed and kills it with SIGKILL once it
/// says it is holding there. Returns whether it got there (false: the run ended first).
async fn kill_at_failpoint(base: &str, root: &Path, run: Child<'_>, point: &str) -> bool {
    use std::io::BufRead as _;
    let mut child = child_command(base, root, run)
        .env(failpoint::ENV, point)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let reached = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(std::result::Result::ok)
            .any(|line| line.contains(failpoint::REACHED))
    });
    let reached = tokio::time::timeout(Duration::from_secs(120), reached).await;
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    reached
        .unwrap_or_else(|_| panic!("the child neither reached {point} nor ended in 120 s"))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_points_then_resume_loses_nothing_and_trains_nothing_twice() {
    kill_and_resume("session_gateway", 0x5eed).await;
}

/// The same in `gateway` mode, where every rollout registers and deletes its own route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_in_gateway_mode_leaves_no_route_and_trains_nothing_twice() {
    kill_and_resume("gateway", 0x9a7e).await;
}

/// Kill -9 while a launch POST is in flight: arena-sim has started the launch's task and holds its answer
/// (`hold_ms`), so the journal has the launch and no task id. Arena dedupes, so the resumed run's relaunch
/// under the same key finds that task; it has no cancel endpoint, so a task answered before a kill is
/// collected the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_inside_the_launch_post_then_resume_leaves_no_task_behind() {
    kill_inside_launches(
        Child {
            mode: "session_gateway",
            arena: "arena_idempotent_launch",
            grpo: false,
        },
        0x1a0c,
    )
    .await;
}

/// The same in `gateway` mode, against an Arena that can also cancel: answered leftovers are cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_inside_the_launch_post_in_gateway_mode_leaves_no_task_behind() {
    kill_inside_launches(
        Child {
            mode: "gateway",
            arena: "arena_idempotent_launch,arena_cancel_tasks",
            grpo: false,
        },
        0x6a7e,
    )
    .await;
}

/// The same in `direct` mode (harnesses call the proxy with their session key), against an Arena that
/// dedupes and cancels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_inside_the_launch_post_in_direct_mode_leaves_no_task_behind() {
    kill_inside_launches(
        Child {
            mode: "direct",
            arena: "arena_idempotent_launch,arena_cancel_tasks",
            grpo: false,
        },
        0xd1ec,
    )
    .await;
}

async fn kill_inside_launches(run: Child<'static>, kill_seed: u64) {
    // arena-sim can do what the run is told it can, and no more.
    let mut world = sim_world();
    world.dedupe_launches = run.arena.contains("arena_idempotent_launch");
    if !run.arena.contains("arena_cancel_tasks") {
        world.cancel_endpoint = arena_sim::CancelEndpoint::NotFound;
    }
    let sim = ArenaSim::start(world).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    model_folder(root.path());
    let base = sim.base_url();
    let mut seed = kill_seed;
    let mut held_kills = 0;
    for _ in 0..3 {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        // The launch whose answer is held: one of the first dozen this process sends.
        let after = (seed >> 33) % 12;
        sim.add_fault(
            FaultRule::on(Endpoint::LaunchOneTask, FaultKind::HoldMs(5_000))
                .after(after)
                .times(1),
        );
        let mut child = spawn_child(&base, root.path(), run);
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let mut held = false;
        while std::time::Instant::now() < deadline {
            if sim.counters().held_answers > 0 {
                held = true;
                break;
            }
            if child.try_wait().unwrap().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let tasks_started = sim.tasks().len();
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        sim.clear_faults();
        if held {
            held_kills += 1;
            assert!(
                tasks_started > 0,
                "the held launch's task started before the kill"
            );
        }
        tokio::time::timeout(Duration::from_secs(30), sim.wait_until(|c| c.held_answers == 0))
            .await
            .expect("the held answer ends");
    }
    assert!(held_kills > 0, "no kill landed inside a launch");
    finish_run(&base, root.path(), run).await;
    let run_dir = root.path().join("quickstart/local");
    check_resumed_run(&sim, &run_dir);
    let counters = sim.counters();
    assert!(
        counters.idempotent_replays >= held_kills,
        "each launch killed in flight was found again by its relaunch: {held_kills} kills, {counters:?}"
    );
    if !run.arena.contains("arena_cancel_tasks") {
        assert_eq!(counters.requests_to(Endpoint::CancelTask), 0, "{counters:?}");
    }
    // Every task Arena started ended, and the journal says it was collected: by the rollout it fed, or
    // polled to its end or cancelled (`task_done`; its rollout may have been cut by a kill and run again).
    let mut collected = BTreeSet::new();
    for entry in journal_entries(&run_dir) {
        match entry {
            Entry::Rollout(r) => collected.extend(r.task_id),
            Entry::TaskDone { task_id } => {
                collected.insert(task_id);
            }
            _ => {}
        }
    }
    for (task_id, status) in sim.tasks() {
        assert!(
            TaskStatus::parse(&status).is_terminal(),
            "task {task_id} is still {status} in Arena after the run"
        );
        assert!(
            collected.contains(&task_id),
            "task {task_id} ({status}) was started in Arena and nothing collected or cancelled it"
        );
    }
}

/// Issue 30 item 12: kill -9 right after a rollout's journal record, before its audit record reaches the
/// shards. The resumed run appends the record the shards lack; and since the journal record comes first, a
/// rollout that a kill cuts before it runs again and is audited then, once. (Before, the audit record came
/// first, and a kill between the two left a record for a rollout that was run again: audited twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_between_a_rollouts_journal_and_audit_records_audits_it_once() {
    let sim = ArenaSim::start(sim_world()).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    model_folder(root.path());
    let base = sim.base_url();
    let run = Child {
        mode: "session_gateway",
        arena: "",
        grpo: false,
    };
    let point = |n: u32| format!("{}:{n}", failpoint::ROLLOUT_JOURNALED);
    assert!(kill_at_failpoint(&base, root.path(), run, &point(2)).await);
    assert!(kill_at_failpoint(&base, root.path(), run, &point(4)).await);
    finish_run(&base, root.path(), run).await;
    let run_dir = root.path().join("quickstart/local");
    check_resumed_run(&sim, &run_dir);
    // The records the kills cut off were journaled again where the resumed runs appended them (each kill cut
    // off the held rollout's, and may have cut another rollout's between its two writes).
    let mut journaled: BTreeMap<SampleKey, usize> = BTreeMap::new();
    for entry in journal_entries(&run_dir) {
        if let Entry::Audit(a) = entry {
            *journaled.entry(a.key).or_default() += 1;
        }
    }
    let again = journaled.values().filter(|n| **n > 1).count();
    assert!(again >= 2, "{again} records appended again: {journaled:?}");
}

/// Issue 30: kill -9 of the whole loop, with the real GRPO step, at each named fail-point the child reports
/// reaching (a journal segment just rotated, a checkpoint staged, one just published, segments just retired,
/// a rollout journaled before its audit record) and once at a seeded moment, then the run to its end: no
/// journal line that was on disk at a kill is lost or changed (carried copies included), no rollout runs
/// twice, each step has one metrics line, no temporary checkpoint or weights folder is left, nothing is left
/// in Arena, and each rollout is audited once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_named_failpoints_with_grpo_loses_nothing_and_leaves_nothing() {
    let sim = ArenaSim::start(sim_world()).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    crate::grpo::tiny_model(root.path());
    let base = sim.base_url();
    let run = Child {
        mode: "session_gateway",
        arena: "",
        grpo: true,
    };
    let run_dir = root.path().join("quickstart/local");
    let mut on_disk = BTreeSet::new();
    for point in [
        failpoint::JOURNAL_ROTATED,
        failpoint::CHECKPOINT_WRITING,
        failpoint::CHECKPOINT_PUBLISHED,
        failpoint::JOURNAL_RETIRED,
        &format!("{}:3", failpoint::ROLLOUT_JOURNALED),
    ] {
        assert!(
            kill_at_failpoint(&base, root.path(), run, point).await,
            "the run ended before {point}"
        );
        on_disk.extend(journal_lines(&run_dir));
    }
    // And once at a seeded moment.
    let ms = 300 + (0x5eed_u64.wrapping_mul(6_364_136_223_846_793_005) >> 33) % 1500;
    let mut child = spawn_child(&base, root.path(), run);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    let _ = child.kill(); // SIGKILL
    let _ = child.wait();
    on_disk.extend(journal_lines(&run_dir));
    finish_run(&base, root.path(), run).await;
    check_resumed_run(&sim, &run_dir);

    let now = journal_lines(&run_dir);
    let lost: Vec<&String> = on_disk.iter().filter(|l| !now.contains(*l)).collect();
    assert!(
        lost.is_empty(),
        "journal lines on disk at a kill are gone: {lost:?}"
    );
    // A carried copy is its original, unchanged.
    let mut originals = BTreeMap::new();
    let mut copies = Vec::new();
    for line in &now {
        match serde_json::from_str::<Entry>(line).unwrap() {
            Entry::Rollout(r) => {
                originals.insert(r.key, Entry::Rollout(r));
            }
            Entry::Carried { entry } if matches!(*entry, Entry::Rollout(_)) => copies.push(*entry),
            _ => {}
        }
    }
    assert!(!copies.is_empty(), "segments carried rollouts");
    for copy in copies {
        let Entry::Rollout(r) = &copy else { unreachable!() };
        assert_eq!(
            originals.get(&r.key),
            Some(&copy),
            "rollout {} changed when carried",
            r.key
        );
    }
    let (metrics, steps) = crate::support::step_metrics(&run_dir.join("metrics"));
    let trained: f64 = steps
        .iter()
        .filter_map(|l| l["train/trained_tokens"].as_f64())
        .sum();
    assert!(trained > 0.0, "GRPO trained: {metrics}");
    // No temporary checkpoint or weights folder is left, and GRPO published weights.
    for dir in ["checkpoints", "weights"] {
        let names: Vec<String> = std::fs::read_dir(run_dir.join(dir))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            !names.is_empty() && names.iter().all(|n| n.starts_with("step-")),
            "{dir}: {names:?}"
        );
    }
    // Every task Arena started has ended.
    for (task_id, status) in sim.tasks() {
        assert!(
            TaskStatus::parse(&status).is_terminal(),
            "task {task_id} is still {status} in Arena"
        );
    }
}

/// Every complete line of the journal's segments, live and retired.
fn journal_lines(run_dir: &Path) -> BTreeSet<String> {
    let dir = run_dir.join("journal");
    let mut lines = BTreeSet::new();
    for file in segment_files(&dir)
        .iter()
        .chain(&segment_files(&dir.join("retired")))
    {
        let text = std::fs::read_to_string(file).unwrap();
        let complete = text.rfind('\n').map_or("", |end| &text[..end]);
        lines.extend(complete.lines().map(str::to_string));
    }
    lines
}

fn sim_world() -> World {
    let mut world = World::quickstart();
    world.token = "sim-token".into();
    world
}

async fn kill_and_resume(mode: &'static str, kill_seed: u64) {
    let sim = ArenaSim::start(sim_world()).await.unwrap();
    let root = tempfile::tempdir().unwrap();
    model_folder(root.path());
    let base = sim.base_url();
    let run = Child {
        mode,
        arena: "",
        grpo: false,
    };
    // Seeded kill points (ms after start), spread over setup, rollouts, training and checkpoints.
    let mut seed = kill_seed;
    let mut kills = Vec::new();
    for _ in 0..4 {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        kills.push(300 + (seed >> 33) % 2500);
    }
    let mut killed = 0;
    for ms in &kills {
        let mut child = spawn_child(&base, root.path(), run);
        let deadline = std::time::Instant::now() + Duration::from_millis(*ms);
        let mut finished = false;
        while std::time::Instant::now() < deadline {
            if child.try_wait().unwrap().is_some() {
                finished = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if !finished {
            child.kill().unwrap(); // SIGKILL
            killed += 1;
        }
        let _ = child.wait();
    }
    finish_run(&base, root.path(), run).await;
    assert!(killed > 0, "no kill landed before the run finished: {kills:?}");
    check_resumed_run(&sim, &root.path().join("quickstart/local"));
}

/// Runs the child to its end and checks it finished.
async fn finish_run(base: &str, root: &Path, run: Child<'static>) {
    let out = tokio::task::spawn_blocking({
        let base = base.to_string();
        let root = root.to_path_buf();
        move || spawn_child(&base, &root, run).wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE"),
        "final run failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The journal's segment files in `dir`, oldest first.
fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "jsonl"));
    // `journal-w0.jsonl` is segment 0, then `journal-w0.000001.jsonl` and up: the names sort in order
    // once segment 0's is read as `journal-w0.000000.jsonl`.
    files.sort_by_key(|p| {
        p.to_string_lossy()
            .replace("journal-w0.jsonl", "journal-w0.000000.jsonl")
    });
    files
}

/// The journal's entries as they were written, in order: the retired segments, then the live ones, without
/// the copies a new segment carries over from older ones.
fn journal_entries(run_dir: &Path) -> Vec<Entry> {
    let dir = run_dir.join("journal");
    let retired = segment_files(&dir.join("retired"));
    let live = segment_files(&dir);
    assert!(!retired.is_empty(), "checkpoints retired journal segments");
    assert!(
        live.len() <= 2,
        "only the segments a kept checkpoint needs stay: {live:?}"
    );
    retired
        .iter()
        .chain(&live)
        .flat_map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            text.lines()
                .map(|l| serde_json::from_str::<Entry>(l).unwrap())
                .collect::<Vec<_>>()
        })
        .filter(|e| !matches!(e, Entry::Carried { .. }))
        .collect()
}

/// What a run killed any number of times and resumed to its end must hold: every rollout journaled once,
/// every step trained once on its first informative groups, each step's metrics once, no route left.
fn check_resumed_run(sim: &ArenaSim, run_dir: &Path) {
    // The journal: every finished rollout recorded once, never run again after a kill.
    let mut rollouts: BTreeMap<SampleKey, Verdict> = BTreeMap::new();
    let mut tasks: BTreeMap<SampleKey, String> = BTreeMap::new();
    let mut open_routes = BTreeSet::new();
    let mut draws: BTreeMap<(u64, u32), String> = BTreeMap::new();
    for entry in journal_entries(run_dir) {
        match entry {
            Entry::Draw {
                step, group, data_id, ..
            } => {
                assert!(group >= 2, "draw {step}/{group} is inside the batch");
                assert!(
                    draws.insert((step, group), data_id).is_none(),
                    "draw {step}/{group} was journaled twice"
                );
            }
            Entry::Rollout(r) => {
                assert!(
                    r.key.group < 2 || draws.contains_key(&(r.key.step, r.key.group)),
                    "rollout {} of an extra draw finished before its draw was journaled",
                    r.key
                );
                tasks.extend(r.task_id.map(|t| (r.key, t)));
                assert!(
                    rollouts.insert(r.key, r.verdict).is_none(),
                    "rollout {} was journaled twice: it was run again after being finished",
                    r.key
                );
            }
            Entry::Route { name } => {
                open_routes.insert(name);
            }
            Entry::RouteDeleted { name } => {
                open_routes.remove(&name);
            }
            _ => {}
        }
    }
    // Every step's groups: its batch's two, then its extra draws, each with all three samples.
    let mut groups: BTreeMap<u64, u32> = BTreeMap::new();
    for k in rollouts.keys() {
        let n = groups.entry(k.step).or_default();
        *n = (*n).max(k.group + 1);
    }
    assert_eq!(groups.len() as u64, STEPS, "{groups:?}");
    let total: u32 = groups.values().sum();
    assert_eq!(
        rollouts.len(),
        total as usize * 3,
        "every rollout of every group finished once"
    );
    for (step, n) in &groups {
        assert!(
            (2..=6).contains(n),
            "step {step} drew {n} groups; the budget is 3 x 2"
        );
        for g in 2..*n {
            assert!(
                draws.contains_key(&(*step, g)),
                "group {step}/{g} ran without a journaled draw"
            );
        }
    }
    assert!(
        !draws.is_empty(),
        "no step drew an extra prompt: the test does not test dynamic sampling"
    );
    // A step draws again only while it lacks two informative groups, and trains on the first two.
    // As the workflow judges a group: a rejected sample rejects it, a dropped one is left out, and the dynamic
    // filter drops it when the remaining rewards are all equal.
    let informative = |step: u64, g: u32| {
        let mut rewards = Vec::new();
        for sample in 0..3 {
            let key = SampleKey {
                eval: false,
                step,
                group: g,
                sample,
            };
            match &rollouts[&key] {
                Verdict::Reward { reward } => rewards.push(*reward),
                Verdict::Dropped { .. } => {}
                Verdict::Rejected { .. } => return false,
            }
        }
        rewards.iter().any(|r| (r - rewards[0]).abs() > 1e-9)
    };
    assert!(
        open_routes.is_empty(),
        "routes left open in the journal: {open_routes:?}"
    );
    assert_eq!(sim.counters().live_routes, 0, "no route leaked in Arena");

    // The final checkpoint's lineage: each step once, each rollout at most once, only journaled rewards.
    let ckpt = std::fs::read_dir(run_dir.join("checkpoints"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .max()
        .unwrap();
    let consumed: Vec<(u64, String)> =
        serde_json::from_slice(&std::fs::read(ckpt.join("consumed.json")).unwrap()).unwrap();
    let mut seen = BTreeSet::new();
    for (step, key) in &consumed {
        assert!(seen.insert(key.clone()), "rollout {key} was trained on twice");
        assert!(
            key.starts_with(&format!("s{step}g")),
            "{key} trained at step {step}"
        );
        let k = rollouts
            .iter()
            .find(|(k, _)| k.to_string() == *key)
            .unwrap_or_else(|| panic!("trained on {key}, which the journal does not hold"));
        assert!(matches!(k.1, Verdict::Reward { .. }));
    }
    for (step, n) in &groups {
        let wanted: Vec<String> = (0..*n)
            .filter(|g| informative(*step, *g))
            .take(2)
            .map(|g| format!("s{step}g{g}"))
            .collect();
        let trained: BTreeSet<String> = consumed
            .iter()
            .filter(|(s, _)| s == step)
            .map(|(_, key)| key.split(':').next().unwrap().to_string())
            .collect();
        assert_eq!(
            trained.into_iter().collect::<Vec<_>>(),
            wanted,
            "step {step} trains on its first two informative groups; its verdicts: {:?}",
            rollouts
                .iter()
                .filter(|(k, _)| k.step == *step)
                .map(|(k, v)| (k.to_string(), v))
                .collect::<Vec<_>>()
        );
        if *n > 2 {
            let batch = (0..2).filter(|g| informative(*step, *g)).count();
            assert!(
                batch < 2,
                "step {step} drew more although its batch was informative"
            );
        }
    }
    check_audited_once(run_dir, &rollouts, &tasks);
    // Each step's metrics appear once, however often the run was killed and resumed.
    let metrics = std::fs::read_to_string(run_dir.join("metrics/metrics.jsonl")).unwrap();
    let steps: Vec<u64> = metrics
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, (0..STEPS).collect::<Vec<_>>(), "metrics.jsonl:\n{metrics}");
    // Groups train whole: a sample of an accepted group never goes missing.
    let mut per_group: BTreeMap<String, usize> = BTreeMap::new();
    for (_, key) in &consumed {
        *per_group
            .entry(key.split(':').next().unwrap().to_string())
            .or_default() += 1;
    }
    for (group, n) in per_group {
        let rewarded = rollouts
            .iter()
            .filter(|(k, v)| {
                k.to_string().starts_with(&format!("{group}:")) && matches!(v, Verdict::Reward { .. })
            })
            .count();
        assert_eq!(
            n, rewarded,
            "group {group} trained {n} of its {rewarded} rewarded samples"
        );
    }
}

/// Each rollout is audited once: no task twice in the audit shards, none of a rollout the journal does not
/// hold (one run again after a kill), and every rewarded rollout's task there.
fn check_audited_once(
    run_dir: &Path,
    rollouts: &BTreeMap<SampleKey, Verdict>,
    tasks: &BTreeMap<SampleKey, String>,
) {
    let mut audited: BTreeMap<String, usize> = BTreeMap::new();
    for shard in std::fs::read_dir(run_dir.join("arena_results"))
        .unwrap()
        .flatten()
    {
        for line in std::fs::read_to_string(shard.path()).unwrap().lines() {
            let record: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}: {e}: {line}", shard.path().display()));
            *audited
                .entry(record["task_id"].as_str().unwrap().to_string())
                .or_default() += 1;
        }
    }
    let journaled: BTreeSet<&str> = tasks.values().map(String::as_str).collect();
    for (task, n) in &audited {
        assert_eq!(*n, 1, "task {task} was audited {n} times");
        assert!(
            journaled.contains(task.as_str()),
            "task {task} was audited, but no journaled rollout has it: its rollout was run again"
        );
    }
    for (key, verdict) in rollouts {
        if let (Verdict::Reward { .. }, Some(task)) = (verdict, tasks.get(key)) {
            assert!(
                audited.contains_key(task),
                "rollout {key} (task {task}) was never audited"
            );
        }
    }
}
