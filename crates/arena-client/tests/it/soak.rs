//! The soak: 200 concurrent session-gateway lifecycles against an Arena that misbehaves on one request in
//! five, on every endpoint.

use std::collections::BTreeMap;
use std::time::Duration;

use arena_client::{ArenaClient, RegistryOptions, RouteRegistry, RouteSetup, RunOptions};
use arena_sim::{FaultKind, FaultRule, ScriptedOutcome, StreamDef, World};
use secrecy::SecretString;

use crate::lifecycle::{LLM_KEY, spec};
use crate::support::{TOKEN, config, start};

const LIFECYCLES: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_lifecycles_with_twenty_percent_faults() {
    let mut stream = StreamDef::new("s1").harness("claude-code", "1");
    for i in 0..LIFECYCLES {
        stream = stream.row(&format!("row-{i}"), &["domain:swe"]);
    }
    // Five fault kinds at 4.4% each: about 20% of all requests, on every endpoint.
    let kinds = [
        FaultKind::Status(429),
        FaultKind::Status(503),
        FaultKind::Marker403,
        FaultKind::Drop,
        FaultKind::DelayMs(700),
    ];
    let world = World {
        token: TOKEN.to_string(),
        seed: 20_240_901,
        faults: kinds
            .iter()
            .map(|k| FaultRule::everywhere(k.clone()).probability(0.044))
            .collect(),
        ..World::default()
    }
    .stream(stream);
    let sim = start(world).await;
    for i in 0..LIFECYCLES {
        let outcome = match i % 5 {
            0 => ScriptedOutcome::status("HARNESS_FAILED", Some(0.0)),
            _ => ScriptedOutcome::done(i as f64 / LIFECYCLES as f64),
        };
        sim.scripted().set_outcome(
            &format!("row-{i}"),
            outcome
                .delay(Duration::from_millis(20))
                .progress(&["AGENT_RUNNING"]),
        );
    }
    let mut cfg = config(&sim);
    cfg.timeout = Duration::from_millis(400);
    let client = ArenaClient::new(cfg).unwrap();
    let mut options = RegistryOptions::new(0.05).unwrap();
    options.registration_timeout = Duration::from_secs(5);
    let registry = RouteRegistry::new(client.clone(), options);
    let setup = RouteSetup::SessionGateway {
        registry: registry.clone(),
        llm_api_key: SecretString::from(LLM_KEY),
    };
    let mut handles = Vec::new();
    for i in 0..LIFECYCLES {
        let (client, setup) = (client.clone(), setup.clone());
        let mut spec = spec(&format!("row-{i}"), Some(&format!("{i}:0-0")));
        // Twenty rollout proxies, so the registry registers, probes and deletes twenty routes.
        spec.proxy_base_url = format!("http://rollout-proxy-{}:8000", i % 20);
        spec.run = RunOptions {
            timeout: Duration::from_secs(60),
            // Half the lifecycles may retry their launch, under a key the sim de-duplicates on.
            idempotency_key: (i % 2 == 0).then(|| format!("launch-{i}")),
            key_honoured: true,
        };
        handles.push(tokio::spawn(
            async move { client.run_rollout(&setup, &spec).await },
        ));
    }
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for h in handles {
        let report = h.await.expect("no lifecycle panics");
        let label = match &report.result {
            Ok(r) => {
                assert!(r.score.is_some());
                "reward".to_string()
            }
            Err(e) if e.task_failed().is_some() => "task failed".to_string(),
            Err(e) => format!("{:?} error", e.party()),
        };
        *outcomes.entry(label).or_default() += 1;
    }
    let closed = registry.close().await;
    let counters = sim.counters();
    eprintln!(
        "outcomes {outcomes:?}; close {closed:?}; requests {:?}; faults {:?}; registrations {}",
        counters.requests, counters.faults, counters.registrations
    );
    assert_eq!(outcomes.values().sum::<usize>(), LIFECYCLES);
    assert!(
        outcomes.get("reward").copied().unwrap_or(0) >= LIFECYCLES / 2,
        "{outcomes:?}"
    );
    assert!(
        outcomes.get("task failed").copied().unwrap_or(0) >= 20,
        "{outcomes:?}"
    );
    assert!(closed.failed.is_empty(), "{closed:?}");
    assert_eq!(counters.live_routes, 0, "no route left registered after close");
    assert!(
        counters.max_launches_per_session() <= 1,
        "a task was launched twice"
    );
    let requests: u64 = counters.requests.values().sum();
    let faults: u64 = counters.faults.values().sum();
    let rate = faults as f64 / requests as f64;
    assert!(
        (0.15..0.26).contains(&rate),
        "fault rate {rate} of {requests} requests"
    );
    for endpoint in counters.requests.keys() {
        if counters.requests_to(*endpoint) >= 30 {
            assert!(
                counters.faults.get(endpoint).copied().unwrap_or(0) > 0,
                "{endpoint} saw no fault"
            );
        }
    }
}
