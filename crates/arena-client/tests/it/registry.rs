//! The session-gateway route registry on a manual clock (8.1 items 26-32).

use std::sync::Arc;
use std::time::Duration;

use arena_client::{
    ArenaClient, Error, ManualClock, RegistryOptions, RolloutReport, RouteRegistry, RouteSetup,
};
use arena_sim::{ArenaSim, Endpoint, FaultKind, FaultRule, ScriptedOutcome};
use secrecy::SecretString;

use crate::lifecycle::{LLM_KEY, spec};
use crate::support::{client, client_with, start, world};

const INTERVAL: Duration = Duration::from_secs(60);

struct Fixture {
    sim: ArenaSim,
    client: ArenaClient,
    clock: Arc<ManualClock>,
    registry: RouteRegistry,
}

impl Fixture {
    async fn new(persistent: bool) -> Self {
        let sim = start(world()).await;
        let client = client(&sim);
        Self::with_client(sim, client, persistent)
    }

    fn with_client(sim: ArenaSim, client: ArenaClient, persistent: bool) -> Self {
        let clock = Arc::new(ManualClock::new());
        let mut options = RegistryOptions::new(INTERVAL.as_secs_f64()).unwrap();
        options.clock = clock.clone();
        options.persistent = persistent;
        let registry = RouteRegistry::new(client.clone(), options);
        Self {
            sim,
            client,
            clock,
            registry,
        }
    }

    fn setup(&self) -> RouteSetup {
        RouteSetup::SessionGateway {
            registry: self.registry.clone(),
            llm_api_key: SecretString::from(LLM_KEY),
        }
    }

    async fn rollout(&self, row: &str, session: &str) -> RolloutReport {
        self.client
            .run_rollout(&self.setup(), &spec(row, Some(session)))
            .await
    }

    fn route_name(&self) -> String {
        self.sim.routes()[0].model_name.clone()
    }

    /// Endpoints hit since the request log was last cleared, in order.
    fn trail(&self) -> Vec<Endpoint> {
        self.sim.requests().iter().map(|r| r.endpoint).collect()
    }
}

#[tokio::test]
async fn item_26_a_worker_registry_reuses_one_registration_until_close() {
    let f = Fixture::new(true).await;
    for (row, session) in [("r1", "1:0-0"), ("r2", "2:0-0")] {
        let report = f.rollout(row, session).await;
        assert_eq!(report.result.unwrap().score, Some(1.0));
        assert_eq!(report.cleanup, Some(true));
    }
    let counters = f.sim.counters();
    assert_eq!(
        (counters.registrations, counters.deletions, counters.live_routes),
        (1, 0, 1)
    );
    let closed = f.registry.close().await;
    assert_eq!(closed.deleted.len(), 1);
    assert!(closed.failed.is_empty());
    let counters = f.sim.counters();
    assert_eq!((counters.deletions, counters.live_routes), (1, 0));
    let err = f.rollout("r3", "3:0-0").await.result.unwrap_err();
    assert!(matches!(err, Error::Closed), "{err}");
}

#[tokio::test]
async fn item_27_a_collected_route_is_probed_and_restored_before_the_launch() {
    let f = Fixture::new(true).await;
    f.rollout("r1", "1:0-0").await.result.unwrap();
    let name = f.route_name();
    let deployment = f.sim.routes()[0].deployment_id.clone();
    assert!(f.sim.gc_route(&name));
    f.clock.advance(INTERVAL);
    f.sim.clear_requests();
    let report = f.rollout("r2", "2:0-0").await;
    report.result.as_ref().unwrap();
    let trail = f.trail();
    assert_eq!(
        &trail[..3],
        [
            Endpoint::GetModel,
            Endpoint::RegisterModel,
            Endpoint::LaunchOneTask
        ]
    );
    let acquire = report.acquire.unwrap();
    assert_eq!(
        (acquire.probed, acquire.present, acquire.restored),
        (true, Some(false), Some(true))
    );
    let routes = f.sim.routes();
    assert_eq!(
        (routes[0].model_name.as_str(), routes[0].deployment_id.as_str()),
        (name.as_str(), deployment.as_str())
    );
    assert_eq!(routes[0].registrations, 2);
    let restore = f.sim.requests_to(Endpoint::RegisterModel)[0]
        .body
        .clone()
        .unwrap();
    assert_eq!(restore["endpoints"][0]["api_key"], "areal-gateway-abc");
}

#[tokio::test]
async fn a_route_within_the_probe_interval_is_reused_without_a_probe() {
    let f = Fixture::new(true).await;
    f.rollout("r1", "1:0-0").await.result.unwrap();
    f.clock.advance(INTERVAL - Duration::from_secs(1));
    f.rollout("r2", "2:0-0").await.result.unwrap();
    assert_eq!(f.sim.counters().requests_to(Endpoint::GetModel), 0);
}

#[tokio::test]
async fn item_28_thirty_two_concurrent_launches_share_one_probe() {
    let f = Fixture::new(true).await;
    f.rollout("r1", "0:0-0").await.result.unwrap();
    f.clock.advance(INTERVAL + Duration::from_secs(1));
    let mut handles = Vec::new();
    for i in 0..32 {
        let (client, setup) = (f.client.clone(), f.setup());
        let spec = spec(["r1", "r2", "r3"][i % 3], Some(&format!("{i}:1-0")));
        handles.push(tokio::spawn(
            async move { client.run_rollout(&setup, &spec).await },
        ));
    }
    for h in handles {
        h.await.unwrap().result.unwrap();
    }
    let counters = f.sim.counters();
    assert_eq!(counters.requests_to(Endpoint::GetModel), 1);
    assert_eq!(counters.registrations, 1);
    assert_eq!(counters.launches, 33);
}

#[tokio::test]
async fn item_29_a_slow_failing_probe_throttles_from_its_completion() {
    let sim = start(world()).await;
    let client = client_with(&sim, |c| c.retry.retries = 0);
    let mut f = Fixture::with_client(sim, client, true);
    let mut options = f.registry.options().clone();
    options.registration_timeout = Duration::from_secs(1);
    f.registry = RouteRegistry::new(f.client.clone(), options);
    f.rollout("r1", "0:0-0").await.result.unwrap();
    f.sim
        .add_fault(FaultRule::on(Endpoint::GetModel, FaultKind::DelayMs(3000)).times(1));
    f.clock.advance(INTERVAL + Duration::from_secs(1));
    let (client, setup) = (f.client.clone(), f.setup());
    let slow = tokio::spawn(async move { client.run_rollout(&setup, &spec("r2", Some("1:0-0"))).await });
    f.sim.wait_until(|c| c.requests_to(Endpoint::GetModel) == 1).await;
    // The probe is in flight while 50 s pass; it times out and completes at t = 111 s.
    f.clock.advance(Duration::from_secs(50));
    let report = slow.await.unwrap();
    report.result.as_ref().unwrap();
    let acquire = report.acquire.unwrap();
    assert_eq!(
        (acquire.probed, acquire.probe_ok),
        (true, Some(false)),
        "a failed probe is advisory"
    );
    f.rollout("r3", "2:0-0").await.result.unwrap();
    // t = 141 s: 80 s after the probe started but only 30 s after it completed.
    f.clock.advance(Duration::from_secs(30));
    f.rollout("r1", "3:0-0").await.result.unwrap();
    assert_eq!(f.sim.counters().requests_to(Endpoint::GetModel), 1);
    assert_eq!(f.sim.counters().launches, 4);
}

#[tokio::test]
async fn item_30_a_failed_restore_is_raised_then_throttled() {
    let f = Fixture::new(true).await;
    f.rollout("r1", "0:0-0").await.result.unwrap();
    f.sim.gc_route(&f.route_name());
    f.sim
        .add_fault(FaultRule::on(Endpoint::RegisterModel, FaultKind::Status(400)));
    f.clock.advance(INTERVAL);
    let first = f.rollout("r2", "1:0-0").await;
    let err = first.result.unwrap_err();
    assert_eq!(err.http_status(), Some(400), "the restore's own error: {err}");
    assert_eq!(first.registration, Some(false));
    let second = f.rollout("r3", "2:0-0").await.result.unwrap_err();
    assert!(
        second.to_string().contains("restore retries are throttled"),
        "{second}"
    );
    let counters = f.sim.counters();
    assert_eq!(counters.launches, 1, "only the initial launch happened");
    assert_eq!(
        counters.requests_to(Endpoint::GetModel),
        2,
        "probe, then a re-probe after the failed POST"
    );
    // After another interval the restore is tried again and now succeeds.
    f.sim.clear_faults();
    f.clock.advance(INTERVAL);
    f.rollout("r3", "3:0-0").await.result.unwrap();
    assert_eq!(f.sim.counters().launches, 2);
}

#[tokio::test]
async fn a_restore_whose_response_was_lost_is_accepted_when_the_route_exists() {
    let f = Fixture::new(true).await;
    f.rollout("r1", "0:0-0").await.result.unwrap();
    let name = f.route_name();
    f.sim.gc_route(&name);
    // The restore lands but its reply is lost; the retry then meets a 409 for the existing name.
    f.sim
        .add_fault(FaultRule::on(Endpoint::RegisterModel, FaultKind::Drop).times(1));
    f.clock.advance(INTERVAL);
    let report = f.rollout("r2", "1:0-0").await;
    report.result.as_ref().unwrap();
    assert_eq!(report.acquire.unwrap().restored, Some(true));
    let counters = f.sim.counters();
    assert_eq!(
        counters.requests_to(Endpoint::GetModel),
        2,
        "probe, then a re-probe that finds it"
    );
    assert_eq!(counters.registrations_by_name[&name], 2);
    assert_eq!(counters.requests_to(Endpoint::RegisterModel), 3);
}

#[test]
fn item_31_the_probe_interval_must_be_finite_and_positive() {
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let err = RegistryOptions::new(bad).unwrap_err();
        assert!(err.to_string().contains("finite and positive"), "{bad}: {err}");
    }
    assert!(RegistryOptions::new(0.5).is_ok());
}

#[tokio::test]
async fn item_32_the_background_probe_restores_a_route_while_the_task_waits() {
    let f = Fixture::new(false).await;
    f.sim
        .scripted()
        .set_outcome("r1", ScriptedOutcome::done(0.5).gate("queued"));
    let (client, setup) = (f.client.clone(), f.setup());
    let rollout = tokio::spawn(async move { client.run_rollout(&setup, &spec("r1", Some("5:0-0"))).await });
    f.sim.wait_until(|c| c.launches == 1).await;
    let name = f.route_name();
    let deployment = f.sim.routes()[0].deployment_id.clone();
    f.sim.gc_route(&name);
    assert_eq!(f.sim.counters().live_routes, 0);
    f.clock.wait_for_sleepers(1).await;
    f.clock.advance(INTERVAL);
    f.sim
        .wait_until(|c| c.registrations_by_name.get(&name) == Some(&2))
        .await;
    let routes = f.sim.routes();
    assert_eq!(
        (routes[0].model_name.clone(), routes[0].deployment_id.clone()),
        (name, deployment)
    );
    f.sim.scripted().open_gate("queued");
    let report = rollout.await.unwrap();
    assert_eq!(report.result.unwrap().score, Some(0.5));
    assert_eq!(report.cleanup, Some(true));
    assert_eq!(f.sim.counters().live_routes, 0, "the last user deleted the route");
}

#[tokio::test]
async fn a_changed_gateway_key_is_refused() {
    let f = Fixture::new(true).await;
    f.rollout("r1", "0:0-0").await.result.unwrap();
    let mut spec = spec("r2", Some("1:0-0"));
    spec.gateway_key = Some(SecretString::from("areal-gateway-other"));
    let err = f.client.run_rollout(&f.setup(), &spec).await.result.unwrap_err();
    assert!(
        err.to_string()
            .contains("gateway key changed within one rollout worker"),
        "{err}"
    );
}

#[tokio::test]
async fn a_failed_registration_is_deleted_and_a_dropped_registry_cleans_up() {
    let sim = start(world()).await;
    let client = client_with(&sim, |c| c.retry.retries = 0);
    let f = Fixture::with_client(sim, client, true);
    f.sim
        .add_fault(FaultRule::on(Endpoint::RegisterModel, FaultKind::Drop).times(1));
    let report = f.rollout("r1", "0:0-0").await;
    assert!(report.result.is_err());
    assert_eq!(
        f.sim.counters().live_routes,
        0,
        "the landed POST was deleted by name"
    );
    f.rollout("r1", "1:0-0").await.result.unwrap();
    assert_eq!(f.sim.counters().live_routes, 1);
    let Fixture { sim, registry, .. } = f;
    drop(registry);
    sim.wait_until(|c| c.live_routes == 0).await;
}

#[tokio::test]
async fn the_before_register_hook_sees_the_name_before_arena_does_and_can_stop_the_registration() {
    let sim = Arc::new(start(world()).await);
    let client = client(&sim);
    let seen: Arc<std::sync::Mutex<Vec<(String, usize)>>> = Arc::default();
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut options = RegistryOptions::new(INTERVAL.as_secs_f64()).unwrap();
    options.persistent = true;
    let (seen_hook, fail_hook, sim_hook) = (seen.clone(), fail.clone(), sim.clone());
    options.before_register = Some(Arc::new(move |name: &str| {
        // What Arena has received when the hook runs.
        let registrations = sim_hook.requests_to(Endpoint::RegisterModel).len();
        seen_hook.lock().unwrap().push((name.to_string(), registrations));
        if fail_hook.load(std::sync::atomic::Ordering::SeqCst) {
            Err("disk full".to_string())
        } else {
            Ok(())
        }
    }));
    let registry = RouteRegistry::new(client.clone(), options);
    let key = SecretString::from("gateway-key");

    // The hook fails: nothing reaches Arena, and the error names the route and the cause.
    let Err(err) = registry.acquire("http://127.0.0.1:9", &key).await else {
        panic!("the registration is refused");
    };
    let text = err.to_string();
    assert!(text.contains("could not record its name: disk full"), "{text}");
    assert!(sim.requests_to(Endpoint::RegisterModel).is_empty());
    assert!(sim.routes().is_empty());

    // The hook succeeds: it ran before the POST, with the name the route then got.
    fail.store(false, std::sync::atomic::Ordering::SeqCst);
    let lease = registry.acquire("http://127.0.0.1:9", &key).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[1], (lease.model_name.clone(), 0));
    assert_eq!(sim.routes()[0].model_name, lease.model_name);
    lease.release().await.unwrap();
    assert!(registry.close().await.failed.is_empty());
}
