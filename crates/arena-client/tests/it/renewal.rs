//! A `gateway`-mode route's lease (`arena-2026.md` 2.12 and 3.3): renewed while its task is in flight,
//! registered again under the same name when Arena lost it, never touched after its delete; first on a
//! simulated clock with a task held open by a gate, then in real time against an Arena that expires idle
//! routes.

use std::sync::Arc;
use std::time::Duration;

use arena_client::{GatewayRenewal, ManualClock, ModelRegistration, RenewalStats, RouteSetup, SystemClock};
use arena_sim::{Endpoint, FaultKind, FaultRule, ScriptedOutcome};
use secrecy::SecretString;

use crate::lifecycle::{LLM_KEY, spec};
use crate::support::{client, start, world};

fn gateway_with(renewal: Option<GatewayRenewal>) -> RouteSetup {
    RouteSetup::Gateway {
        llm_api_key: SecretString::from(LLM_KEY),
        inbound_protos: vec!["chat".to_string()],
        registration_timeout: Duration::from_secs(10),
        renewal,
    }
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for {what}");
}

/// 3.3 test 1: a renewal is a PATCH with body `{}`; 200 naming the route is true, 404 false, a reply naming
/// another route or a 403 an error.
#[tokio::test]
async fn a_renewal_is_a_patch_whose_answer_is_checked() {
    let sim = start(world()).await;
    let client = client(&sim);
    let registration = ModelRegistration {
        model_name: "stream-areal-test".to_string(),
        deployment_id: "original-deployment".to_string(),
        upstream_base_url: "http://proxy".to_string(),
        upstream_api_key: SecretString::from("test-session-key"),
        inbound_protos: vec!["chat".to_string()],
    };
    client
        .register_model(&registration, None)
        .await
        .expect("registers");
    assert!(
        client
            .renew_model("stream-areal-test", None)
            .await
            .expect("renews")
    );
    let patch = &sim.requests_to(Endpoint::RenewModel)[0];
    assert_eq!(
        (patch.method.as_str(), patch.path.as_str()),
        ("PATCH", "/openapi/v1/llm/models/stream-areal-test")
    );
    assert_eq!(patch.body, Some(serde_json::json!({})));
    assert!(
        !client
            .renew_model("stream-areal-gone", None)
            .await
            .expect("a 404 is an answer")
    );
    sim.add_fault(FaultRule::on(Endpoint::RenewModel, FaultKind::WrongId).times(1));
    client
        .renew_model("stream-areal-test", None)
        .await
        .expect_err("another route's name");
    sim.add_fault(FaultRule::on(Endpoint::RenewModel, FaultKind::Status(403)).times(1));
    client
        .renew_model("stream-areal-test", None)
        .await
        .expect_err("a plain 403");
}

/// 3.3 test 2 through a whole rollout: renewals every interval while the task runs; the route Arena lost is
/// registered again exactly once, with the same name, deployment id and key; the task's end stops renewal
/// before the delete.
#[tokio::test]
async fn a_gateway_route_is_renewed_restored_and_left_alone_after_its_delete_on_a_simulated_clock() {
    let mut w = world();
    w.scripted.default = ScriptedOutcome {
        gate: Some("finish".into()),
        ..ScriptedOutcome::done(1.0)
    };
    let sim = start(w).await;
    let client = client(&sim);
    let clock = Arc::new(ManualClock::new());
    let setup = gateway_with(Some(GatewayRenewal {
        interval: Duration::from_secs(60),
        clock: clock.clone(),
    }));
    let rollout = {
        let client = client.clone();
        tokio::spawn(async move { client.run_rollout(&setup, &spec("r1", None)).await })
    };
    until("the launch", || {
        sim.requests_to(Endpoint::LaunchOneTask).len() == 1
    })
    .await;
    clock.wait_for_sleepers(1).await;
    assert!(
        sim.requests_to(Endpoint::RenewModel).is_empty(),
        "nothing before the interval"
    );
    clock.advance(Duration::from_secs(60));
    clock.wait_for_sleepers(1).await;
    assert_eq!(sim.requests_to(Endpoint::RenewModel).len(), 1);
    let path = sim.requests_to(Endpoint::RenewModel)[0].path.clone();
    let name = path.rsplit('/').next().expect("a name");
    assert!(name.starts_with("stream-areal-"), "{path}");
    assert!(sim.gc_route(name), "Arena collects the route");
    clock.advance(Duration::from_secs(60));
    clock.wait_for_sleepers(1).await;
    let registrations = sim.requests_to(Endpoint::RegisterModel);
    assert_eq!(registrations.len(), 2, "registered again exactly once");
    assert_eq!(
        registrations[0].body, registrations[1].body,
        "same name, deployment id, upstream and key"
    );
    clock.advance(Duration::from_secs(60));
    clock.wait_for_sleepers(1).await;
    assert_eq!(sim.requests_to(Endpoint::RenewModel).len(), 3);
    sim.scripted().open_gate("finish");
    let report = rollout.await.expect("the rollout task");
    report.result.expect("the task succeeds");
    assert_eq!(
        report.renewal,
        Some(RenewalStats {
            renewed: 2,
            failed: 1,
            reregistered: 1,
            reregister_failed: 0
        })
    );
    assert_eq!(report.cleanup, Some(true));
    // Nothing touches the route after its delete, however far the clock moves.
    clock.advance(Duration::from_secs(600));
    let log = sim.requests();
    let deleted = log
        .iter()
        .position(|r| r.endpoint == Endpoint::DeleteModel)
        .expect("a delete");
    assert!(
        log[deleted..]
            .iter()
            .all(|r| !matches!(r.endpoint, Endpoint::RenewModel | Endpoint::RegisterModel)),
        "renewal stopped before the delete"
    );
    assert_eq!(sim.counters().live_routes, 0);
}

/// Against an Arena that collects routes idle for 300 ms, a task that runs 1.2 s keeps its route only when
/// the run renews it.
#[tokio::test]
async fn a_route_that_would_expire_survives_a_long_task_only_with_renewal() {
    for renew in [true, false] {
        let mut w = world();
        w.route_gc_idle_ms = Some(300);
        w.scripted.default = ScriptedOutcome {
            delay_ms: 1200,
            ..ScriptedOutcome::done(1.0)
        };
        let sim = start(w).await;
        let renewal = renew.then(|| GatewayRenewal {
            interval: Duration::from_millis(50),
            clock: Arc::new(SystemClock::default()),
        });
        let report = client(&sim)
            .run_rollout(&gateway_with(renewal), &spec("r1", None))
            .await;
        report.result.expect("the task succeeds");
        let c = sim.counters();
        if renew {
            assert_eq!(c.gc_removals, 0, "renewed routes are never collected: {c:?}");
            let stats = report.renewal.expect("renewal ran");
            assert!(stats.renewed >= 3 && stats.failed == 0, "{stats:?}");
        } else {
            assert_eq!(c.gc_removals, 1, "the idle route was collected: {c:?}");
            assert!(sim.requests_to(Endpoint::RenewModel).is_empty());
        }
        assert_eq!(c.live_routes, 0);
    }
}
