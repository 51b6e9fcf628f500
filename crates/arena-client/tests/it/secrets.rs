//! No credential appears in a log line, an error string or a `Debug` rendering.

use std::time::Duration;

use arena_client::{
    ArenaClient, ClientConfig, ModelRegistration, RegistryOptions, RouteRegistry, RouteSetup, RunOptions,
};
use arena_sim::{Endpoint, FaultKind, FaultRule, ScriptedOutcome};
use secrecy::SecretString;
use serde_json::json;

use crate::lifecycle::spec;
use crate::support::{Logs, TOKEN, config, start, world};

const SECRETS: [&str; 5] = [
    "LLMKEY-9f8e7d",
    "SESSIONKEY-1a2b3c",
    "GATEWAYKEY-4d5e6f",
    "SESSIONTOKEN-7a8b9c",
    "WRONGTOKEN-0x0x0x",
];

#[tokio::test(flavor = "current_thread")]
async fn no_secret_leaks_into_logs_errors_or_debug() {
    let (logs, _guard) = Logs::capture();
    let mut world = world();
    world.token = format!("{TOKEN}-OPENAPI-5e5e5e");
    let sim = start(world).await;
    let mut cfg = config(&sim);
    cfg.token = SecretString::from(format!("{TOKEN}-OPENAPI-5e5e5e"));
    cfg.timeout = Duration::from_millis(300);
    let client = ArenaClient::new(cfg.clone()).unwrap();
    let mut captured = vec![format!("{cfg:?}"), format!("{client:?}")];

    let llm = SecretString::from(SECRETS[0]);
    let mut spec = spec("r1", Some("9:0-0"));
    spec.session_key = SecretString::from(SECRETS[1]);
    spec.gateway_key = Some(SecretString::from(SECRETS[2]));
    spec.session_token = Some(SecretString::from(SECRETS[3]));
    spec.run = RunOptions {
        timeout: Duration::from_millis(400),
        idempotency_key: None,
        key_honoured: false,
    };
    captured.push(format!("{spec:?}"));
    let registry = RouteRegistry::new(client.clone(), RegistryOptions::new(60.0).unwrap());
    let setups = [
        RouteSetup::Gateway {
            llm_api_key: llm.clone(),
            inbound_protos: vec!["chat".into()],
            registration_timeout: Duration::from_secs(5),
            renewal: None,
        },
        RouteSetup::SessionGateway {
            registry: registry.clone(),
            llm_api_key: llm.clone(),
        },
        RouteSetup::Direct,
    ];
    // Every path: success, typed failure, local timeout, transport faults, refused registration.
    let scenarios: Vec<(ScriptedOutcome, Option<FaultRule>)> = vec![
        (ScriptedOutcome::done(1.0), None),
        (
            ScriptedOutcome::status("HARNESS_FAILED", Some(0.0)).raw(json!({"error": "boom"})),
            None,
        ),
        (ScriptedOutcome::done(1.0).gate("never"), None),
        (
            ScriptedOutcome::done(1.0),
            Some(FaultRule::everywhere(FaultKind::Drop).times(3)),
        ),
        (
            ScriptedOutcome::done(1.0),
            Some(FaultRule::on(Endpoint::RegisterModel, FaultKind::Status(400))),
        ),
        (
            ScriptedOutcome::done(1.0),
            Some(FaultRule::on(Endpoint::LaunchOneTask, FaultKind::DelayMs(1000))),
        ),
    ];
    for setup in &setups {
        captured.push(format!("{setup:?}"));
        for (outcome, fault) in &scenarios {
            sim.clear_faults();
            sim.scripted().set_default(outcome.clone());
            if let Some(f) = fault {
                sim.add_fault(f.clone());
            }
            let report = client.run_rollout(setup, &spec).await;
            captured.push(format!("{report:?}"));
            if let Err(e) = &report.result {
                captured.push(e.to_string());
                captured.push(format!("{e:#?}"));
                let mut source = std::error::Error::source(e);
                while let Some(s) = source {
                    captured.push(s.to_string());
                    source = s.source();
                }
            }
        }
    }
    sim.clear_faults();
    captured.push(format!("{:?}", registry.close().await));
    let registration = ModelRegistration {
        model_name: "stream-areal-x".into(),
        deployment_id: "d".into(),
        upstream_base_url: "http://p".into(),
        upstream_api_key: SecretString::from(SECRETS[2]),
        inbound_protos: vec!["chat".into()],
    };
    captured.push(format!("{registration:?}"));
    // A wrong token fails with a 401 whose error names neither token.
    let wrong = ArenaClient::new(ClientConfig {
        token: SecretString::from(SECRETS[4]),
        ..cfg
    })
    .unwrap();
    let err = wrong.get_stream("s1").await.unwrap_err();
    captured.push(err.to_string());
    captured.push(format!("{err:?}"));

    let log_text = logs.text();
    assert!(log_text.len() > 1000, "the scenarios produced logs to search");
    assert!(captured.len() > 20);
    let everything = format!("{log_text}\n{}", captured.join("\n"));
    for secret in SECRETS.iter().copied().chain(["OPENAPI-5e5e5e"]) {
        assert!(!everything.contains(secret), "{secret} leaked:\n{everything}");
    }
    // The secrets did reach Arena, where they belong.
    let launches = sim.requests_to(Endpoint::LaunchOneTask);
    assert!(
        launches
            .iter()
            .any(|r| r.body.as_ref().unwrap()["api_key"] == SECRETS[0])
    );
}
