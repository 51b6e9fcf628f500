//! LLM routes and whole rollouts in each route mode (8.1 items 18-20, 22-25, 34, and the client side of
//! 21, 33, 56 and 57).

use std::collections::BTreeMap;
use std::time::Duration;

use arena_client::{
    ArenaClient, ModelRegistration, RegistryOptions, RewardRefCheck, RolloutReport, RolloutSpec,
    RouteRegistry, RouteSetup, RunOptions,
};
use arena_sim::{ArenaSim, Endpoint, FaultKind, FaultRule, ScriptedOutcome, StreamDef};
use secrecy::SecretString;
use serde_json::{Value, json};
use stream_config::RouteMode;

use crate::support::{client, client_with, start, world};

pub(crate) const LLM_KEY: &str = "llm-gateway-key";

pub(crate) fn spec(data_id: &str, session: Option<&str>) -> RolloutSpec {
    RolloutSpec {
        stream_id: "s1".to_string(),
        data_id: data_id.to_string(),
        harness: Some("claude-code@1".to_string()),
        task_envs: BTreeMap::from([("CUSTOM".to_string(), "1".to_string())]),
        proxy_base_url: "http://rollout-proxy-0:8000/".to_string(),
        session_key: SecretString::from(format!("session-key-{data_id}")),
        session_id: session.map(str::to_string),
        gateway_key: Some(SecretString::from("areal-gateway-abc")),
        session_token: session.map(|s| SecretString::from(format!("areal-session-{s}"))),
        run: RunOptions {
            timeout: Duration::from_secs(20),
            idempotency_key: None,
            key_honoured: false,
        },
        reward_ref: RewardRefCheck::default(),
    }
}

pub(crate) fn gateway() -> RouteSetup {
    RouteSetup::Gateway {
        llm_api_key: SecretString::from(LLM_KEY),
        inbound_protos: vec!["chat".to_string()],
        registration_timeout: Duration::from_secs(10),
        renewal: None,
    }
}

pub(crate) fn launches(sim: &ArenaSim) -> Vec<Value> {
    sim.requests_to(Endpoint::LaunchOneTask)
        .into_iter()
        .map(|r| r.body.expect("a launch has a body"))
        .collect()
}

#[tokio::test]
async fn item_18_register_posts_the_exact_payload_and_delete_goes_by_name() {
    let sim = start(world()).await;
    let client = client(&sim);
    let registration = ModelRegistration {
        model_name: "stream-areal-0123456789ab".to_string(),
        deployment_id: "dep-1".to_string(),
        upstream_base_url: "http://proxy:9000/".to_string(),
        upstream_api_key: SecretString::from("upstream-key"),
        inbound_protos: vec!["chat".to_string()],
    };
    let gateway = client.register_model(&registration, None).await.unwrap();
    assert_eq!(gateway, format!("{}/api", sim.base_url()));
    let posted = &sim.requests_to(Endpoint::RegisterModel)[0];
    assert!(posted.authorized, "registration uses the control token");
    insta::assert_json_snapshot!("registration_payload", posted.body);
    client
        .delete_model("stream-areal-0123456789ab", None)
        .await
        .unwrap();
    let delete = &sim.requests_to(Endpoint::DeleteModel)[0];
    assert_eq!(delete.path, "/openapi/v1/llm/models/stream-areal-0123456789ab");
    assert!(delete.authorized);
    assert_eq!(sim.counters().deletions, 1);
    // Deleting again is a 404, which counts as clean.
    client
        .delete_model("stream-areal-0123456789ab", None)
        .await
        .unwrap();
    let bad = ModelRegistration {
        model_name: "other".to_string(),
        ..registration
    };
    let err = client.register_model(&bad, None).await.unwrap_err();
    assert!(
        err.to_string().contains("must start with \"stream-areal-\""),
        "{err}"
    );
}

#[tokio::test]
async fn item_19_existence_probe() {
    let sim = start(world()).await;
    let client = client(&sim);
    let registration = ModelRegistration {
        model_name: "stream-areal-probe".to_string(),
        deployment_id: "d".to_string(),
        upstream_base_url: "http://proxy".to_string(),
        upstream_api_key: SecretString::from("k"),
        inbound_protos: vec!["chat".to_string()],
    };
    assert!(!client.model_exists("stream-areal-probe", None).await.unwrap());
    client.register_model(&registration, None).await.unwrap();
    assert!(client.model_exists("stream-areal-probe", None).await.unwrap());
    assert!(client.renew_model("stream-areal-probe", None).await.unwrap());
    assert!(!client.renew_model("stream-areal-none", None).await.unwrap());
    sim.add_fault(FaultRule::on(Endpoint::GetModel, FaultKind::WrongId));
    let err = client.model_exists("stream-areal-probe", None).await.unwrap_err();
    assert!(err.to_string().contains("unexpected model_name"), "{err}");
}

#[tokio::test]
async fn items_20_21_gateway_rollouts_register_chat_only_launch_and_clean_up() {
    let sim = start(world()).await;
    let client = client(&sim);
    for (i, harness) in ["claude-code@1", "openai-codex@2", "swe-agent@3"]
        .iter()
        .enumerate()
    {
        sim.clear_requests();
        let mut spec = spec("r1", Some(&format!("17:{i}-0")));
        spec.harness = Some(harness.to_string());
        sim.scripted().set_outcome(
            "r1",
            ScriptedOutcome::done(0.75).progress(&["PENDING", "AGENT_RUNNING"]),
        );
        let report = client.run_rollout(&gateway(), &spec).await;
        assert_eq!(report.result.as_ref().unwrap().score, Some(0.75), "{harness}");
        assert_eq!(
            (
                report.registration,
                report.launched,
                report.terminal,
                report.cleanup
            ),
            (Some(true), true, true, Some(true)),
            "{harness}"
        );
        let name = report.model_name.clone().unwrap();
        assert!(
            name.starts_with("stream-areal-") && name.len() == "stream-areal-".len() + 12,
            "{name}"
        );
        let registration = sim.requests_to(Endpoint::RegisterModel)[0].body.clone().unwrap();
        assert_eq!(
            registration["endpoints"][0]["inbound_protos"],
            json!(["chat"]),
            "{harness}"
        );
        assert_eq!(registration["endpoints"][0]["api_key"], json!("session-key-r1"));
        assert_eq!(
            registration["endpoints"][0]["base_url"],
            json!("http://rollout-proxy-0:8000")
        );
        let launch = &launches(&sim)[0];
        assert_eq!(launch["base_url"], json!(format!("{}/api", sim.base_url())));
        assert_eq!(launch["api_key"], json!(LLM_KEY));
        assert_eq!(launch["model_name"], json!(name));
        assert_eq!(launch["harness"], json!(harness));
        assert_eq!(launch["envs"]["CUSTOM"], json!("1"));
        assert_eq!(launch["envs"]["MODEL_NAME"], json!(name));
        assert_eq!(launch["envs"]["API_KEY"], json!(LLM_KEY));
        assert_eq!(
            sim.requests_to(Endpoint::DeleteModel)[0].path,
            format!("/openapi/v1/llm/models/{name}")
        );
    }
    assert_eq!(sim.counters().live_routes, 0);
}

#[tokio::test]
async fn configured_inbound_protocols_are_advertised() {
    let sim = start(world()).await;
    let setup = RouteSetup::Gateway {
        llm_api_key: SecretString::from(LLM_KEY),
        inbound_protos: vec!["chat".into(), "anthropic".into(), "responses".into()],
        registration_timeout: Duration::from_secs(10),
        renewal: None,
    };
    client(&sim)
        .run_rollout(&setup, &spec("r1", None))
        .await
        .result
        .unwrap();
    let body = sim.requests_to(Endpoint::RegisterModel)[0].body.clone().unwrap();
    assert_eq!(
        body["endpoints"][0]["inbound_protos"],
        json!(["chat", "anthropic", "responses"])
    );
}

#[tokio::test]
async fn item_22_direct_mode_launches_once_against_the_proxy() {
    let sim = start(world()).await;
    let mut spec = spec("r1", Some("17:0-0"));
    spec.task_envs
        .insert("ANTHROPIC_BASE_URL".into(), "http://configured".into());
    spec.task_envs
        .insert("OPENAI_API_KEY".into(), "configured-key".into());
    let report = client(&sim).run_rollout(&RouteSetup::Direct, &spec).await;
    report.result.as_ref().unwrap();
    assert_eq!((report.registration, report.cleanup), (None, None));
    assert_eq!(report.mode, RouteMode::Direct);
    let counters = sim.counters();
    assert_eq!(counters.requests_to(Endpoint::RegisterModel), 0);
    assert_eq!(counters.requests_to(Endpoint::LaunchOneTask), 1);
    let launch = &launches(&sim)[0];
    let proxy = "http://rollout-proxy-0:8000/";
    assert_eq!(launch["session_id"], json!("17:0-0"));
    assert_eq!(launch["base_url"], json!(proxy));
    assert_eq!(launch["api_key"], json!("session-key-r1"));
    let envs = &launch["envs"];
    for (k, v) in [
        ("ANTHROPIC_BASE_URL", proxy),
        ("OPENAI_BASE_URL", proxy),
        ("ANTHROPIC_API_KEY", "session-key-r1"),
        ("OPENAI_API_KEY", "session-key-r1"),
        ("NO_PROXY", "rollout-proxy-0"),
        ("no_proxy", "rollout-proxy-0"),
        ("CUSTOM", "1"),
    ] {
        assert_eq!(envs[k], json!(v), "{k}");
    }
    assert!(
        launch["model_name"]
            .as_str()
            .unwrap()
            .starts_with("stream-areal-")
    );
}

#[tokio::test]
async fn item_23_direct_mode_appends_the_proxy_host_to_no_proxy() {
    let sim = start(world()).await;
    let mut spec = spec("r1", Some("s-1"));
    spec.proxy_base_url = "http://10.0.0.5:9000".into();
    spec.task_envs
        .insert("NO_PROXY".into(), "localhost,rollout-proxy".into());
    client(&sim)
        .run_rollout(&RouteSetup::Direct, &spec)
        .await
        .result
        .unwrap();
    let envs = launches(&sim)[0]["envs"].clone();
    assert_eq!(envs["NO_PROXY"], json!("localhost,rollout-proxy,10.0.0.5"));
    assert_eq!(envs["no_proxy"], json!("localhost,rollout-proxy,10.0.0.5"));
    let mut spec = spec.clone();
    spec.task_envs = BTreeMap::from([("no_proxy".into(), "10.0.0.5,other".into())]);
    client(&sim)
        .run_rollout(&RouteSetup::Direct, &spec)
        .await
        .result
        .unwrap();
    assert_eq!(launches(&sim)[1]["envs"]["NO_PROXY"], json!("10.0.0.5,other"));
}

#[tokio::test]
async fn items_24_and_34_missing_session_inputs_are_named() {
    let sim = start(world()).await;
    let client = client(&sim);
    let report = client.run_rollout(&RouteSetup::Direct, &spec("r1", None)).await;
    let err = report.result.unwrap_err();
    assert!(err.to_string().contains("session_id is required"), "{err}");
    let mut bad = spec("r1", Some("bad id with spaces"));
    let err = client
        .run_rollout(&RouteSetup::Direct, &bad)
        .await
        .result
        .unwrap_err();
    assert!(err.to_string().contains("must match"), "{err}");
    bad.session_id = Some("ok-1".into());
    bad.gateway_key = None;
    let registry = RouteRegistry::new(client.clone(), RegistryOptions::new(60.0).unwrap());
    let setup = RouteSetup::SessionGateway {
        registry,
        llm_api_key: SecretString::from(LLM_KEY),
    };
    let err = client.run_rollout(&setup, &bad).await.result.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("proxy_gateway_api_key") && text.contains("proxy_session_token"),
        "{text}"
    );
    assert_eq!(
        sim.counters().requests.values().sum::<u64>(),
        0,
        "nothing reached Arena"
    );
}

#[tokio::test]
async fn item_25_two_sessions_share_one_registration() {
    let sim = start(world()).await;
    sim.scripted()
        .set_default(ScriptedOutcome::done(1.0).gate("both"));
    let client = client(&sim);
    let registry = RouteRegistry::new(client.clone(), RegistryOptions::new(60.0).unwrap());
    let setup = RouteSetup::SessionGateway {
        registry: registry.clone(),
        llm_api_key: SecretString::from(LLM_KEY),
    };
    let mut handles = Vec::new();
    for (row, session) in [("r1", "7:0-0"), ("r2", "7:1-0")] {
        let (client, setup) = (client.clone(), setup.clone());
        let mut spec = spec(row, Some(session));
        spec.task_envs.insert(
            "ANTHROPIC_CUSTOM_HEADERS".into(),
            "x-keepalive-enable: true".into(),
        );
        handles.push(tokio::spawn(
            async move { client.run_rollout(&setup, &spec).await },
        ));
    }
    sim.wait_until(|c| c.launches == 2).await;
    assert_eq!(sim.counters().deletions, 0, "no deletion while both sessions run");
    sim.scripted().open_gate("both");
    let mut reports: Vec<RolloutReport> = Vec::new();
    for h in handles {
        reports.push(h.await.unwrap());
    }
    assert!(
        reports
            .iter()
            .all(|r| r.result.is_ok() && r.cleanup == Some(true))
    );
    let counters = sim.counters();
    assert_eq!(
        (counters.registrations, counters.deletions, counters.live_routes),
        (1, 1, 0)
    );
    let registration = sim.requests_to(Endpoint::RegisterModel)[0].body.clone().unwrap();
    assert_eq!(
        registration["endpoints"][0]["api_key"],
        json!("areal-gateway-abc")
    );
    let name = registration["model_name"].as_str().unwrap().to_string();
    assert!(name.starts_with("stream-areal-session-"), "{name}");
    assert_eq!(
        registration["metadata"]["deployment_id"],
        json!(name.replace("stream-areal-", ""))
    );
    let mut headers: Vec<String> = launches(&sim)
        .iter()
        .map(|l| {
            assert_eq!(l["model_name"], json!(name));
            assert_eq!(l["api_key"], json!(LLM_KEY));
            l["envs"]["ANTHROPIC_CUSTOM_HEADERS"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    headers.sort();
    assert_eq!(
        headers,
        [
            "x-keepalive-enable: true\nX-Session-Id: 7:0-0\nX-Session-Token: areal-session-7:0-0",
            "x-keepalive-enable: true\nX-Session-Id: 7:1-0\nX-Session-Token: areal-session-7:1-0",
        ]
    );
}

#[tokio::test]
async fn item_33_a_lost_registration_response_is_cleaned_up_by_name() {
    let sim = start(world()).await;
    sim.add_fault(FaultRule::on(Endpoint::RegisterModel, FaultKind::Drop).times(1));
    let client = client_with(&sim, |c| c.retry.retries = 0);
    let report = client.run_rollout(&gateway(), &spec("r1", None)).await;
    assert!(report.result.is_err());
    assert_eq!(
        (report.registration, report.launched, report.cleanup),
        (Some(false), false, Some(true))
    );
    let name = report.model_name.unwrap();
    let deletes = sim.requests_to(Endpoint::DeleteModel);
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].path, format!("/openapi/v1/llm/models/{name}"));
    assert_eq!(
        sim.counters().live_routes,
        0,
        "the POST had landed; the DELETE removed it"
    );
    // A registration that never landed is cleaned up too (the DELETE's 404 counts as clean).
    sim.add_fault(FaultRule::on(Endpoint::RegisterModel, FaultKind::Status(400)).times(1));
    let report = client.run_rollout(&gateway(), &spec("r1", None)).await;
    assert_eq!(report.result.unwrap_err().http_status(), Some(400));
    assert_eq!(report.cleanup, Some(true));
}

#[tokio::test]
async fn item_56_a_cleanup_failure_never_masks_the_registration_error() {
    let sim = start(world()).await;
    sim.add_fault(FaultRule::on(Endpoint::RegisterModel, FaultKind::Status(422)));
    sim.add_fault(FaultRule::on(Endpoint::DeleteModel, FaultKind::Status(500)));
    let report = client(&sim).run_rollout(&gateway(), &spec("r1", None)).await;
    assert_eq!(report.result.unwrap_err().http_status(), Some(422));
    assert_eq!((report.registration, report.cleanup), (Some(false), Some(false)));
    assert_eq!(
        sim.counters().requests_to(Endpoint::DeleteModel),
        4,
        "one cleanup, with its retries"
    );
}

#[tokio::test]
async fn item_57_a_cleanup_failure_keeps_a_valid_reward() {
    let sim = start(world()).await;
    sim.add_fault(FaultRule::on(Endpoint::DeleteModel, FaultKind::Status(500)));
    let report = client(&sim).run_rollout(&gateway(), &spec("r1", None)).await;
    assert_eq!(report.result.unwrap().score, Some(1.0));
    assert_eq!((report.terminal, report.cleanup), (true, Some(false)));
}

#[tokio::test]
async fn a_dropped_gateway_rollout_deletes_its_route_and_cancels_its_task() {
    let sim = start(world()).await;
    sim.scripted()
        .set_default(ScriptedOutcome::done(1.0).gate("never"));
    let client: ArenaClient = client(&sim);
    let handle = tokio::spawn(async move { client.run_rollout(&gateway(), &spec("r1", None)).await });
    sim.wait_until(|c| c.requests_to(Endpoint::TaskResult) >= 1).await;
    assert_eq!(sim.counters().live_routes, 1);
    handle.abort();
    sim.wait_until(|c| c.live_routes == 0 && c.cancels == 1).await;
}

#[tokio::test]
async fn an_llm_base_url_override_reaches_launches_but_not_control_calls() {
    let sim = start(world()).await;
    let client = client_with(&sim, |c| c.llm_base_url = Some("https://llm.example/v1".into()));
    let report = client.run_rollout(&gateway(), &spec("r1", None)).await;
    // The sim only accepts its own gateway URL for registered models, so the launch body is what counts.
    let launch = &launches(&sim)[0];
    assert_eq!(launch["base_url"], json!("https://llm.example/v1"));
    assert!(report.registration == Some(true));
}

#[tokio::test]
async fn stream_ids_in_launch_paths_are_encoded() {
    let world = world().stream(
        StreamDef::new("team/a")
            .harness("claude-code", "1")
            .row("x1", &[]),
    );
    let sim = start(world).await;
    let mut spec = spec("x1", Some("s-1"));
    spec.stream_id = "team/a".into();
    client(&sim)
        .run_rollout(&RouteSetup::Direct, &spec)
        .await
        .result
        .unwrap();
    assert_eq!(
        sim.requests_to(Endpoint::LaunchOneTask)[0].path,
        "/openapi/v1/streams/team%2Fa/launch_one_task"
    );
}

#[tokio::test]
async fn arena_collects_idle_routes() {
    let mut world = world();
    world.route_gc_idle_ms = Some(50);
    let sim = start(world).await;
    let client = client(&sim);
    let registration = ModelRegistration {
        model_name: "stream-areal-idle".to_string(),
        deployment_id: "d".to_string(),
        upstream_base_url: "http://proxy".to_string(),
        upstream_api_key: SecretString::from("k"),
        inbound_protos: vec!["chat".to_string()],
    };
    client.register_model(&registration, None).await.unwrap();
    assert!(client.model_exists("stream-areal-idle", None).await.unwrap());
    // Idle for longer than the collection time: the next request finds the route gone.
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(!client.model_exists("stream-areal-idle", None).await.unwrap());
    assert_eq!(sim.counters().gc_removals, 1);
    // A collection fault removes a route at once.
    client.register_model(&registration, None).await.unwrap();
    sim.add_fault(FaultRule::on(Endpoint::RenewModel, FaultKind::GcRoute).times(1));
    assert!(!client.renew_model("stream-areal-idle", None).await.unwrap());
    assert_eq!(sim.counters().gc_removals, 2);
}

fn session_setup(client: &ArenaClient) -> RouteSetup {
    RouteSetup::SessionGateway {
        registry: RouteRegistry::new(client.clone(), RegistryOptions::new(60.0).unwrap()),
        llm_api_key: SecretString::from(LLM_KEY),
    }
}

/// Arena registers the route, then the connection drops before the answer: in both route modes that
/// register, the rollout fails at registration and the route it may have created is deleted.
#[tokio::test]
async fn a_registration_answered_by_a_dropped_connection_leaves_no_route() {
    for mode in [RouteMode::Gateway, RouteMode::SessionGateway] {
        let sim = start(world()).await;
        let client = client(&sim);
        sim.add_fault(FaultRule::on(Endpoint::RegisterModel, FaultKind::Drop));
        let setup = match mode {
            RouteMode::Gateway => gateway(),
            _ => session_setup(&client),
        };
        let report = client.run_rollout(&setup, &spec("r1", Some("9:0-0"))).await;
        assert_eq!(report.registration, Some(false), "{mode}");
        assert!(report.result.is_err(), "{mode}");
        assert!(!report.launch_attempted, "{mode}");
        assert!(
            sim.counters().registrations >= 1,
            "{mode}: the POST reached Arena"
        );
        assert!(sim.counters().deletions >= 1, "{mode}: the guard deleted it");
        assert!(
            sim.routes().is_empty(),
            "{mode}: no route left: {:?}",
            sim.routes()
        );
        assert!(sim.requests_to(Endpoint::LaunchOneTask).is_empty(), "{mode}");
    }
}

/// Records every moment it sees, and fails at one of them (a journal that cannot be written).
struct Journal {
    fail_at: &'static str,
    seen: std::sync::Mutex<Vec<String>>,
}

impl Journal {
    fn failing_at(moment: &'static str) -> Self {
        Self {
            fail_at: moment,
            seen: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn record(&self, moment: &str, what: &str) -> arena_client::HookResult {
        self.seen.lock().unwrap().push(format!("{moment} {what}"));
        if moment == self.fail_at {
            return Err(format!("disk full while journaling {moment}").into());
        }
        Ok(())
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

impl arena_client::RolloutHooks for Journal {
    fn before_register(&self, route: &str) -> arena_client::HookResult {
        self.record("route", route)
    }
    fn before_launch(&self, key: Option<&str>) -> arena_client::HookResult {
        self.record("launch", key.unwrap_or("-"))
    }
    fn task_started(&self, task_id: &str) -> arena_client::HookResult {
        self.record("task", task_id)
    }
    fn task_finished(&self, task_id: &str) -> arena_client::HookResult {
        self.record("task_done", task_id)
    }
    fn route_deleted(&self, route: &str) -> arena_client::HookResult {
        self.record("route_deleted", route)
    }
}

/// Every moment is reported in order, and a hook that fails stops the rollout there: nothing more is sent
/// to Arena, a running task is cancelled, and the route is still deleted.
#[tokio::test]
async fn hooks_see_each_moment_and_a_failing_hook_stops_the_rollout_cleanly() {
    let sim = start(world()).await;
    sim.scripted()
        .set_default(ScriptedOutcome::done(0.5).progress(&["AGENT_RUNNING"]));
    let client = client(&sim);
    let mut spec = spec("r1", None);
    spec.run.idempotency_key = Some("run-s0g0:0".into());
    let all = Journal::failing_at("none");
    let report = client.run_rollout_with(&gateway(), &spec, &all).await;
    assert_eq!(report.result.as_ref().unwrap().score, Some(0.5));
    let kinds: Vec<String> = all
        .seen()
        .iter()
        .map(|s| s.split(' ').next().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["route", "launch", "task", "task_done", "route_deleted"]);
    assert!(all.seen()[1].ends_with("run-s0g0:0"), "{:?}", all.seen());

    for (moment, launches, cancels) in [("route", 0, 0), ("launch", 0, 0), ("task", 1, 1)] {
        let sim = start(world()).await;
        sim.scripted()
            .set_default(ScriptedOutcome::done(0.5).gate("never"));
        let client = crate::support::client(&sim);
        let journal = Journal::failing_at(moment);
        let report = client.run_rollout_with(&gateway(), &spec, &journal).await;
        let err = report.result.unwrap_err();
        assert!(err.is_hook(), "{moment}: {err}");
        assert!(err.to_string().contains("disk full"), "{moment}: {err}");
        assert_eq!(sim.counters().launches, launches, "{moment}");
        if moment == "route" {
            assert_eq!(sim.counters().registrations, 0, "{moment}: nothing registered");
        }
        if cancels > 0 {
            tokio::time::timeout(Duration::from_secs(5), sim.wait_until(|c| c.cancels == cancels))
                .await
                .unwrap_or_else(|_| panic!("{moment}: the running task is cancelled"));
        }
        assert_eq!(sim.counters().live_routes, 0, "{moment}: no route left");
    }
}
