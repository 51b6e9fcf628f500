//! The retry policy over real sockets (8.1 items 9-11) and the launch idempotency rule.

use std::time::Duration;

use arena_client::{Error, LaunchRequest, Launched, Party, TransportKind};
use arena_sim::{Endpoint, FaultKind, FaultRule, ScriptedOutcome};
use secrecy::SecretString;

use crate::support::{client, client_with, start, world};

#[tokio::test]
async fn item_9_a_read_timeout_is_retried() {
    let sim = start(world()).await;
    sim.add_fault(FaultRule::on(Endpoint::GetStream, FaultKind::DelayMs(3000)).times(1));
    let client = client_with(&sim, |c| {
        c.timeout = Duration::from_secs(1);
        c.retry.retries = 1;
    });
    assert_eq!(client.get_stream("s1").await.unwrap().stream_id, "s1");
    assert_eq!(sim.counters().requests_to(Endpoint::GetStream), 2);
}

#[tokio::test]
async fn items_10_and_11_a_504_is_retried_on_one_pooled_connection() {
    let sim = start(world()).await;
    sim.add_fault(FaultRule::on(Endpoint::GetStream, FaultKind::Status(504)).times(2));
    let client = client(&sim);
    assert_eq!(client.get_stream("s1").await.unwrap().stream_id, "s1");
    client.get_harness_version("claude-code", "1").await.unwrap();
    let requests = sim.requests();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[0].fault.as_deref(), Some("Status(504)"));
    let peers: std::collections::BTreeSet<_> = requests.iter().map(|r| r.peer).collect();
    assert_eq!(
        peers.len(),
        1,
        "every attempt and call reused one connection: {peers:?}"
    );
}

#[tokio::test]
async fn the_last_retryable_reply_is_returned_as_an_http_error() {
    let sim = start(world()).await;
    sim.add_fault(FaultRule::on(Endpoint::GetStream, FaultKind::Status(503)));
    let err = client(&sim).get_stream("s1").await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("Arena OpenAPI returned HTTP 503: "), "{text}");
    assert!(err.is_retryable());
    assert_eq!(sim.counters().requests_to(Endpoint::GetStream), 4);
}

#[tokio::test]
async fn a_plain_403_is_not_retried_but_the_marker_403_is() {
    let sim = start(world()).await;
    sim.add_fault(FaultRule::on(Endpoint::GetStream, FaultKind::Marker403).times(2));
    client(&sim).get_stream("s1").await.unwrap();
    assert_eq!(sim.counters().requests_to(Endpoint::GetStream), 3);
    sim.clear_faults();
    sim.add_fault(FaultRule::on(Endpoint::GetStream, FaultKind::Status(403)));
    let err = client(&sim).get_stream("s1").await.unwrap_err();
    assert_eq!(err.http_status(), Some(403));
    assert!(!err.is_retryable());
    assert_eq!(sim.counters().requests_to(Endpoint::GetStream), 4);
}

#[tokio::test]
async fn transport_errors_name_the_attempts_and_kind() {
    let sim = start(world()).await;
    let base = sim.base_url();
    sim.shutdown().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let config = {
        let mut c = arena_client::ClientConfig::new(&closed, SecretString::from("t")).unwrap();
        c.retry.base_delay = Duration::from_millis(1);
        c
    };
    let client = arena_client::ArenaClient::new(config).unwrap();
    let err = client.get_stream("s1").await.unwrap_err();
    assert!(
        err.to_string()
            .contains("request failed after 4 attempts: connect error"),
        "{err}"
    );
    assert_eq!(err.party(), Party::Transport);
    assert!(err.is_retryable());
    // A launch is retried on connect errors too: the request never left.
    let err = client
        .launch_one_task("s1", &launch("r1"), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Transport {
                attempts: 4,
                kind: TransportKind::Connect,
                ..
            }
        ),
        "{err}"
    );
    assert!(!base.is_empty());
}

#[tokio::test]
async fn a_non_json_reply_is_named() {
    let sim = start(world()).await;
    sim.add_fault(FaultRule::on(Endpoint::GetStream, FaultKind::NonJson));
    let err = client(&sim).get_stream("s1").await.unwrap_err();
    assert!(err.to_string().contains("returned a non-JSON response"), "{err}");
    assert_eq!(err.party(), Party::MalformedResponse);
}

pub(crate) fn launch(data_id: &str) -> LaunchRequest {
    LaunchRequest {
        data_id: data_id.to_string(),
        model_name: "stream-areal-direct".to_string(),
        base_url: "http://proxy:8000".to_string(),
        api_key: SecretString::from("session-key"),
        envs: Default::default(),
        session_id: Some(format!("sess-{data_id}")),
        harness: None,
    }
}

#[tokio::test]
async fn a_launch_that_may_have_landed_is_never_sent_twice_without_a_key() {
    for fault in [FaultKind::Status(503), FaultKind::Drop, FaultKind::Status(500)] {
        let sim = start(world()).await;
        sim.add_fault(FaultRule::on(Endpoint::LaunchOneTask, fault.clone()).times(1));
        let err = client(&sim)
            .launch_one_task("s1", &launch("r1"), None)
            .await
            .unwrap_err();
        let counters = sim.counters();
        assert_eq!(
            counters.requests_to(Endpoint::LaunchOneTask),
            1,
            "{fault:?}: {err}"
        );
        assert!(counters.max_launches_per_session() <= 1);
        assert!(
            sim.requests_to(Endpoint::LaunchOneTask)[0]
                .idempotency_key
                .is_none()
        );
    }
}

#[tokio::test]
async fn a_launch_refused_before_it_landed_is_retried_without_a_key() {
    for fault in [FaultKind::Status(429), FaultKind::Marker403] {
        let sim = start(world()).await;
        sim.add_fault(FaultRule::on(Endpoint::LaunchOneTask, fault.clone()).times(1));
        let launched = client(&sim)
            .launch_one_task("s1", &launch("r1"), None)
            .await
            .unwrap();
        assert!(matches!(launched, Launched::Running { .. }), "{fault:?}");
        let counters = sim.counters();
        assert_eq!(counters.requests_to(Endpoint::LaunchOneTask), 2, "{fault:?}");
        assert_eq!(counters.launches, 1);
    }
}

#[tokio::test]
async fn with_an_idempotency_key_a_lost_launch_is_retried_and_deduplicated() {
    for fault in [FaultKind::Drop, FaultKind::Status(502)] {
        let sim = start(world()).await;
        sim.scripted()
            .set_default(ScriptedOutcome::done(1.0).gate("later"));
        sim.add_fault(FaultRule::on(Endpoint::LaunchOneTask, fault.clone()).times(1));
        let launched = client(&sim)
            .launch_one_task("s1", &launch("r1"), Some("key-r1-0"))
            .await
            .unwrap();
        let Launched::Running { task_id } = launched else {
            panic!("{fault:?}: expected a running task, got {launched:?}")
        };
        let requests = sim.requests_to(Endpoint::LaunchOneTask);
        assert_eq!(requests.len(), 2, "{fault:?}");
        assert!(
            requests
                .iter()
                .all(|r| r.idempotency_key.as_deref() == Some("key-r1-0"))
        );
        let counters = sim.counters();
        assert_eq!(counters.launches, 1, "{fault:?}");
        let replays = u64::from(fault == FaultKind::Drop);
        assert_eq!(counters.idempotent_replays, replays, "{fault:?}");
        assert_eq!(task_id, "task-1");
    }
}
