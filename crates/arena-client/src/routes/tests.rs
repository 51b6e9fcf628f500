//! Tests of generated names, the registration payload and the route modes' launch environments.

use std::collections::BTreeMap;

use secrecy::SecretString;

use super::*;

#[test]
fn generated_names_have_the_reference_shapes() {
    let name = rollout_model_name();
    assert_eq!(name.len(), "stream-areal-".len() + 12);
    assert!(
        name["stream-areal-".len()..]
            .chars()
            .all(|c| c.is_ascii_hexdigit())
    );
    assert_ne!(rollout_model_name(), name);
    let (session, deployment) = session_route_name();
    assert_eq!(session, format!("stream-areal-{deployment}"));
    assert_eq!(deployment.len(), "session-".len() + 16);
    let uuid = random_uuid();
    let parts: Vec<usize> = uuid.split('-').map(str::len).collect();
    assert_eq!(parts, [8, 4, 4, 4, 12], "{uuid}");
    assert_eq!(&uuid[14..15], "4", "version 4: {uuid}");
    assert!("89ab".contains(&uuid[19..20]), "RFC 4122 variant: {uuid}");
}

#[test]
fn payload_rules() {
    let registration = ModelRegistration {
        model_name: "stream-areal-x".into(),
        deployment_id: "d".into(),
        upstream_base_url: "http://proxy:1/".into(),
        upstream_api_key: SecretString::from("k"),
        inbound_protos: vec![],
    };
    let err = registration.payload().unwrap_err().to_string();
    assert!(err.contains("arena_inbound_protos"), "{err}");
    assert!(!format!("{registration:?}").contains("\"k\""));
}

fn envs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn session_headers_append_to_existing_ones() {
    let token = SecretString::from("tok");
    let mut fresh = envs(&[]);
    session_gateway_envs(&mut fresh, "1:0-0", &token);
    assert_eq!(
        fresh["ANTHROPIC_CUSTOM_HEADERS"],
        "X-Session-Id: 1:0-0\nX-Session-Token: tok"
    );
    let mut existing = envs(&[("ANTHROPIC_CUSTOM_HEADERS", "a: b")]);
    session_gateway_envs(&mut existing, "s", &token);
    assert_eq!(
        existing["ANTHROPIC_CUSTOM_HEADERS"],
        "a: b\nX-Session-Id: s\nX-Session-Token: tok"
    );
}

#[test]
fn direct_mode_no_proxy_handling() {
    let key = SecretString::from("sk");
    let cases = [
        (envs(&[]), "http://proxy:8000", "proxy"),
        (
            envs(&[("NO_PROXY", "a, b ,")]),
            "http://10.1.2.3:9",
            "a,b,10.1.2.3",
        ),
        (envs(&[("no_proxy", "proxy,c")]), "http://proxy:8000", "proxy,c"),
        (
            envs(&[("NO_PROXY", ""), ("no_proxy", "c")]),
            "http://[::1]:8000",
            "c,::1",
        ),
    ];
    for (mut e, url, want) in cases {
        direct_envs(&mut e, url, &key);
        assert_eq!(
            (e["NO_PROXY"].as_str(), e["no_proxy"].as_str()),
            (want, want),
            "{url}"
        );
        assert_eq!(e["OPENAI_BASE_URL"], url);
        assert_eq!(e["ANTHROPIC_API_KEY"], "sk");
    }
}

/// A registration abandoned in flight may land after the first delete found nothing: the cleanup looks
/// again until the registration deadline and deletes the route that landed late.
#[tokio::test]
async fn an_abandoned_registration_that_lands_late_is_deleted() {
    let world = arena_sim::World {
        token: "t".to_string(),
        ..arena_sim::World::default()
    };
    let sim = arena_sim::ArenaSim::start(world).await.expect("arena-sim starts");
    let config = crate::ClientConfig::new(&sim.base_url(), SecretString::from("t")).expect("valid base URL");
    let client = ArenaClient::new(config).expect("client builds");
    let registration = ModelRegistration {
        model_name: "stream-areal-late".to_string(),
        deployment_id: "d".to_string(),
        upstream_base_url: "http://proxy".to_string(),
        upstream_api_key: SecretString::from("k"),
        inbound_protos: vec!["chat".to_string()],
    };
    let cleanup = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .delete_abandoned_route("stream-areal-late", Duration::from_secs(5))
                .await
        })
    };
    // The first delete has gone out and found nothing; then the abandoned POST lands.
    sim.wait_until(|c| c.requests_to(arena_sim::Endpoint::DeleteModel) >= 1)
        .await;
    client.register_model(&registration, None).await.unwrap();
    assert_eq!(sim.routes().len(), 1);
    tokio::time::timeout(Duration::from_secs(5), sim.wait_until(|c| c.deletions >= 1))
        .await
        .expect("the late registration is deleted");
    assert!(sim.routes().is_empty());
    cleanup.abort();
}
