//! YAML worlds: every section parses, and mistakes are reported all at once with their field.

use arena_sim::tasks::TaskFamily;
use arena_sim::{
    CancelEndpoint, Endpoint, EndpointSelector, Envelope, FaultKind, LaunchReply, RunnerDef, World,
};

pub(crate) const WORLD: &str = r#"
token: yaml-token
llm_api_key: gw-key
seed: 7
cancel_endpoint: not_found
route_gc_idle_ms: 60000
task_id_prefix: "job/"
streams:
  - stream_id: team/swe
    default_harness_ref: {key: claude-code, version: "3"}
    default_reward_ref: {key: grader, version: "2"}
    rows:
      - {data_id: r1, tags: ["domain:swe"]}
      - {data_id: r2, tags: {not: a list}}
    generated_rows: 3
    task_family: max
    recent_tasks:
      - {status: DONE, harness_ref: {key: claude-code, version: "3"}, reward_ref: {key: grader, version: "2"}}
  - stream_id: paused
    status: PAUSED
harnesses:
  - {key: claude-code, version: "3"}
  - {key: old, version: "1", status: DRAFT}
routes:
  - {model_name: stream-areal-preexisting, deployment_id: d0}
  - model_name: external
    upstream: {base_url: "http://127.0.0.1:9/v1", api_key: up-key, inbound_protos: [chat, responses]}
runners:
  claude-code: {kind: anthropic, max_turns: 2, max_tokens: 64}
  chat-sim: {kind: chat, faults: [{status: EVAL_FAILED, probability: 0.1}]}
  codex: {kind: command, argv: [codex, exec, "{prompt}"], env: {A: b}, timeout_ms: 1000}
scripted:
  default: {status: DONE, score: 1.0}
  by_data_id:
    r1:
      status: HARNESS_FAILED
      score: 0
      raw: {error: "harness: agent phase error"}
      reply: final
      envelope: result_output
    r2:
      score: 0.5
      reply: {pending: {placeholder_score: 0}}
      progress: [AGENT_RUNNING]
      gate: g
faults:
  - {endpoint: all, fault: {status: 503}, probability: 0.1}
  - {endpoint: dataset, fault: change_total, after: 1, times: 1}
  - {endpoint: [get_model, renew_model], fault: gc_route}
  - {endpoint: launch_one_task, fault: {delay_ms: 1500}}
  - {endpoint: gateway_chat, fault: {status: 429}, probability: 0.2}
"#;

#[test]
fn every_section_parses() {
    let world = World::from_yaml(WORLD).unwrap();
    assert_eq!(world.token, "yaml-token");
    assert_eq!(world.cancel_endpoint, CancelEndpoint::NotFound);
    assert_eq!(world.streams[0].all_rows().len(), 5);
    assert_eq!(world.streams[0].all_rows()[2].data_id, "team/swe-row-0");
    assert_eq!(
        world.streams[0].all_rows()[2].tags,
        serde_json::json!(["domain:max"])
    );
    assert_eq!(world.streams[0].task_family, Some(TaskFamily::Max));
    assert!(matches!(&world.runners["claude-code"], RunnerDef::Anthropic(d) if d.max_turns == 2));
    assert!(matches!(&world.runners["codex"], RunnerDef::Command(d) if d.inherit_env == ["PATH"]));
    assert_eq!(
        world.faults[4].endpoint,
        EndpointSelector::One(Endpoint::GatewayChat)
    );
    let external = world.routes[1].upstream.as_ref().expect("an upstream");
    assert!(!format!("{external:?}").contains("up-key"), "the key is redacted");
    assert_eq!(world.streams[1].status.as_deref(), Some("PAUSED"));
    assert_eq!(world.harnesses[0].status, "PUBLISHED");
    let r1 = &world.scripted.by_data_id["r1"];
    assert_eq!(
        (r1.reply, r1.envelope),
        (LaunchReply::Final, Envelope::ResultOutput)
    );
    assert_eq!(
        world.scripted.by_data_id["r2"].reply,
        LaunchReply::Pending {
            placeholder_score: Some(0.0)
        }
    );
    assert!(matches!(world.faults[0].endpoint, EndpointSelector::All(_)));
    assert_eq!(world.faults[0].fault, FaultKind::Status(503));
    assert_eq!(world.faults[1].endpoint, EndpointSelector::One(Endpoint::Dataset));
    assert_eq!(
        world.faults[2].endpoint,
        EndpointSelector::Some(vec![Endpoint::GetModel, Endpoint::RenewModel])
    );
    assert_eq!(world.faults[3].fault, FaultKind::DelayMs(1500));
}

#[test]
fn mistakes_are_named() {
    let unknown = World::from_yaml("streams: [{stream_id: s, colour: red}]").unwrap_err();
    assert!(unknown.to_string().contains("colour"), "{unknown}");
    let rules = World::from_yaml(
        "streams: [{stream_id: a}, {stream_id: a, rows: [{data_id: x}, {data_id: x}]}]\n\
         faults: [{endpoint: all, fault: drop, probability: 1.5}]\n\
         routes: [{model_name: m, upstream: {base_url: u, api_key: k, inbound_protos: [grpc]}}]\n\
         runners: {a: {kind: chat, max_turns: 0, faults: [{status: DONE}]}, b: {kind: command, argv: []}}\n",
    )
    .unwrap_err();
    insta::assert_snapshot!("world_rule_errors", rules.to_string());
    let kind = World::from_yaml("runners: {a: {kind: telepathy}}").unwrap_err();
    assert!(kind.to_string().contains("telepathy"), "{kind}");
    let field = World::from_yaml("runners: {a: {kind: chat, max_turn: 2}}").unwrap_err();
    assert!(field.to_string().contains("max_turn"), "{field}");
}
