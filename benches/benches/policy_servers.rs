//! Policy servers as a pool (`rollout.policy_servers`): the latency of a weight update across two servers,
//! and rollout throughput on one server and on two, SmolLM2-135M-Instruct (the `ARENA_RL_SMOLLM2` fixture)
//! on the CPU.
//!
//! Each server is a process of this bench in the `server` role running exactly what `arena-rl serve-policy`
//! runs: `rollout_proxy::GenerateServer` in front of `arena_rl::engine::PolicyEngine`, behind an API key,
//! reached through `SglangEngine` clients in an `EnginePool` as the training loop reaches them.
//!
//! - `update`: one weight update as the loop makes it after a step (pause in `retract` mode, load the
//!   checkpoint from disk, confirm the version, continue) on one server and on two; the peer, measured in the
//!   same run, is the floor every update pays: `trainer::Weights::load_dir` of the same checkpoint in this
//!   process. The summary gives each update's time and its ratio to the floor.
//! - `rollouts`: 16 sessions at once (each its own affinity key, a 60-token prompt, 32 new tokens at
//!   temperature 0.7, no stop token) through the pool, with one server and with two; tokens per second and
//!   the two-server rate over the one-server rate. On one CPU machine the servers share its cores, so this
//!   measures what the pool costs and how it spreads sessions, not the scaling separate GPUs give.
//!
//! The summary is printed at the end and written to `<target>/criterion/policy-servers-summary.json`.
//! Needs `ARENA_RL_SMOLLM2` (`eval "$(cargo xtask fixtures)"`).

#[path = "common/summary.rs"]
mod summary;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use futures::StreamExt as _;
use rollout_proxy::{
    ChatModel, EngineEvent, EnginePool, GenerateRequest, GenerateServer, GenerateServerConfig,
    InferenceEngine, PauseMode, ProxyServer, SamplingParams, SglangConfig, SglangEngine, WeightUpdate,
};
use secrecy::SecretString;
use serde_json::json;

const ROLE: &str = "ARENA_RL_POLICY_BENCH_ROLE";
const KEY: &str = "policy-bench-key";
const SESSIONS: usize = 16;
const PROMPT_TOKENS: usize = 60;
const NEW_TOKENS: u32 = 32;

fn smollm2() -> PathBuf {
    std::env::var_os("ARENA_RL_SMOLLM2").map(PathBuf::from).unwrap_or_else(|| {
        panic!("ARENA_RL_SMOLLM2 is not set: run `eval \"$(cargo xtask fixtures)\"` before `cargo bench --bench policy_servers`")
    })
}

/// The server process: `serve-policy`'s server on a free loopback port; prints its URL once loaded.
fn server_role() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let server = GenerateServer::new(GenerateServerConfig {
            api_key: Some(SecretString::from(KEY)),
            ..GenerateServerConfig::default()
        });
        let listening = ProxyServer::serve_router("127.0.0.1:0".parse().expect("addr"), server.router())
            .await
            .expect("listens");
        let model = smollm2();
        let engine = tokio::task::spawn_blocking(move || {
            arena_rl::engine::PolicyEngine::load_as(
                &model,
                SESSIONS,
                trainer::DeviceKind::Cpu,
                trainer::InferenceDtype::F32,
            )?
            .with_weights_root(&model)
        })
        .await
        .expect("joins")
        .expect("SmolLM2 loads");
        server.install(Arc::new(engine));
        println!("http://{}", listening.local_addr());
        std::future::pending::<()>().await;
    });
}

struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn start_server(children: &mut Servers) -> String {
    let mut child = Command::new(std::env::current_exe().expect("own path"))
        .env(ROLE, "server")
        .stdout(Stdio::piped())
        .spawn()
        .expect("server process");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the server's URL");
    children.0.push(child);
    line.trim().to_string()
}

async fn pool(urls: &[String]) -> Arc<EnginePool> {
    let mut engines: Vec<(String, Arc<dyn InferenceEngine>)> = Vec::new();
    for url in urls {
        let mut config = SglangConfig::new(url.clone());
        config.api_key = Some(SecretString::from(KEY));
        config.pause_mode = PauseMode::Retract;
        engines.push((
            url.clone(),
            Arc::new(SglangEngine::connect(config).await.expect("connects")),
        ));
    }
    Arc::new(EnginePool::new(engines, PauseMode::Retract))
}

/// Runs the sessions' generations at once; answers the tokens generated.
async fn rollouts(pool: &Arc<EnginePool>, prompts: &[Arc<[u32]>], round: u32) -> usize {
    let runs = prompts.iter().enumerate().map(|(i, prompt)| {
        let pool = pool.clone();
        let request = GenerateRequest {
            input_ids: prompt.clone(),
            sampling: SamplingParams {
                temperature: 0.7,
                max_new_tokens: NEW_TOKENS,
                seed: Some(u64::from(round) * 1000 + i as u64),
                ..SamplingParams::default()
            },
            images: Vec::new(),
            affinity: Some(format!("session-{round}-{i}").into()),
        };
        tokio::spawn(async move {
            let mut stream = pool.generate(request);
            let mut tokens = 0;
            while let Some(event) = stream.next().await {
                match event.expect("the generation runs") {
                    EngineEvent::Token(_) => tokens += 1,
                    EngineEvent::Finished(_) => break,
                }
            }
            tokens
        })
    });
    let mut total = 0;
    for run in futures::future::join_all(runs).await {
        total += run.expect("joins");
    }
    total
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    if std::env::var(ROLE).as_deref() == Ok("server") {
        server_role();
        return;
    }
    let model_dir = smollm2();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut children = Servers(Vec::new());
    let urls = [start_server(&mut children), start_server(&mut children)];
    let (one, two) = runtime.block_on(async { (pool(&urls[..1]).await, pool(&urls).await) });
    let chat = ChatModel::from_dir(&model_dir).expect("SmolLM2's tokenizer");
    let prompts: Vec<Arc<[u32]>> = (0..SESSIONS)
        .map(|i| {
            let text = format!(
                "Session {i}: please refactor the parser so that every error carries the line and column \
                 where it was found, and explain in one sentence why this helps the people who read it. "
            )
            .repeat(3);
            let mut ids = chat.tokenizer.encode(&text).expect("encodes");
            ids.truncate(PROMPT_TOKENS);
            ids.into()
        })
        .collect();

    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(20));
    let version = AtomicU32::new(0);
    // Installs the checkpoint on every server of `pool` under the next version.
    let update = |pool: &EnginePool| {
        let v = version.fetch_add(1, Ordering::Relaxed) + 1;
        runtime
            .block_on(pool.update_weights_from_disk(WeightUpdate {
                path: model_dir.clone(),
                version: Some(v),
            }))
            .expect("the pool agrees");
    };
    let mut floor = Vec::new();
    let mut updates: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    {
        let mut g = criterion.benchmark_group("update");
        g.bench_function("load_dir_floor", |b| {
            b.iter_custom(|iters| {
                let started = Instant::now();
                for _ in 0..iters {
                    let t = Instant::now();
                    std::hint::black_box(trainer::Weights::load_dir(&model_dir).expect("loads"));
                    floor.push(t.elapsed());
                }
                started.elapsed()
            })
        });
        for (n, pool) in [(1usize, &one), (2, &two)] {
            let times = &mut updates[n - 1];
            g.bench_function(servers(n), |b| {
                b.iter_custom(|iters| {
                    let started = Instant::now();
                    for _ in 0..iters {
                        let t = Instant::now();
                        update(pool);
                        times.push(t.elapsed());
                    }
                    started.elapsed()
                })
            });
        }
        g.finish();
    }
    // The one-server pool leaves the second server behind on versions; bring both to one.
    update(&two);

    let mut rates: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let round = AtomicU32::new(0);
    {
        let mut g = criterion.benchmark_group("rollouts");
        g.throughput(Throughput::Elements(SESSIONS as u64 * u64::from(NEW_TOKENS)));
        g.sample_size(10).measurement_time(Duration::from_secs(30));
        for (n, pool) in [(1usize, &one), (2, &two)] {
            let rate = &mut rates[n - 1];
            g.bench_function(servers(n), |b| {
                b.iter_custom(|iters| {
                    let started = Instant::now();
                    for _ in 0..iters {
                        let t = Instant::now();
                        let r = round.fetch_add(1, Ordering::Relaxed);
                        let tokens = runtime.block_on(rollouts(pool, &prompts, r));
                        rate.push(tokens as f64 / t.elapsed().as_secs_f64());
                    }
                    started.elapsed()
                })
            });
        }
        g.finish();
    }
    criterion.final_summary();

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let floor_ms = ms(median(floor));
    let [u1, u2] = updates.map(|t| ms(median(t)));
    let [r1, r2] = rates.map(|mut r| {
        r.sort_by(f64::total_cmp);
        r[r.len() / 2]
    });
    println!("\npolicy servers, SmolLM2-135M-Instruct on the CPU (medians)");
    println!("  checkpoint load (floor)      {floor_ms:9.1} ms");
    println!(
        "  update, 1 server             {u1:9.1} ms  {:5.2}x the floor",
        u1 / floor_ms
    );
    println!(
        "  update, 2 servers            {u2:9.1} ms  {:5.2}x the floor, {:5.2}x one server",
        u2 / floor_ms,
        u2 / u1
    );
    println!("  rollouts, 1 server           {r1:9.1} tokens/s");
    println!(
        "  rollouts, 2 servers          {r2:9.1} tokens/s  {:5.2}x one server",
        r2 / r1
    );
    let mut report = serde_json::Map::new();
    report.insert(
        "update_ms".into(),
        json!({"load_dir_floor": floor_ms, "one_server": u1, "two_servers": u2,
               "two_over_floor": u2 / floor_ms, "two_over_one": u2 / u1}),
    );
    report.insert(
        "rollout_tokens_per_s".into(),
        json!({"one_server": r1, "two_servers": r2, "two_over_one": r2 / r1,
               "sessions": SESSIONS, "prompt_tokens": PROMPT_TOKENS, "new_tokens": NEW_TOKENS}),
    );
    summary::write_summary(report, "policy-servers-summary.json");
}

/// A bench's name for a pool of `n` servers: `1_server`, `2_servers`.
fn servers(n: usize) -> String {
    format!("{n}_server{}", if n > 1 { "s" } else { "" })
}
