//! Stream discovery and checks (8.1 items 1-8) and authentication.

use arena_client::{ClientConfig, Error, Party, llm_api_key, resolve_protocol};
use arena_sim::{Endpoint, FaultKind, FaultRule, StreamDef};
use stream_config::LlmProtocol;

use crate::support::{TOKEN, client, client_with, start, world};

#[tokio::test]
async fn item_1_no_stream_id_takes_the_first_active_stream() {
    let world = world()
        .stream(StreamDef {
            status: Some("PAUSED".into()),
            ..StreamDef::new("paused")
        })
        .stream(StreamDef::new("s2"));
    let mut world = world;
    world.streams.rotate_right(2);
    let sim = start(world).await;
    let stream = client(&sim).resolve_stream("").await.unwrap();
    assert_eq!(stream.stream_id, "s2");
    let list = sim.requests_to(Endpoint::ListStreams);
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].query_param("status").as_deref(), Some("ACTIVE"));
    assert!(list[0].authorized, "the list call carries the bearer token");
    assert_eq!(sim.counters().requests_to(Endpoint::GetStream), 0);
}

#[tokio::test]
async fn item_2_discovery_needs_no_llm_key_but_reading_it_does() {
    let sim = start(world()).await;
    let env = stream_config::Env::from_pairs([
        ("ARENA_OPENAPI_BASE".to_string(), format!("{}/", sim.base_url())),
        ("ARENA_OPENAPI_TOKEN".to_string(), TOKEN.to_string()),
    ]);
    let client = arena_client::ArenaClient::new(ClientConfig::from_env(&env).unwrap()).unwrap();
    assert_eq!(client.resolve_stream("").await.unwrap().stream_id, "s1");
    let err = llm_api_key(&env).unwrap_err();
    assert!(err.to_string().contains("ARENA_LLM_API_KEY"), "{err}");
}

#[tokio::test]
async fn items_3_and_5_explicit_id_uses_the_direct_get_without_status_query() {
    let sim = start(world()).await;
    let stream = client(&sim).resolve_stream("s1").await.unwrap();
    assert_eq!(stream.stream_id, "s1");
    assert_eq!(stream.status.as_deref(), Some("ACTIVE"));
    assert_eq!(stream.default_harness().as_deref(), Some("claude-code@1"));
    let reward = stream.live_reward_ref().unwrap().unwrap();
    assert_eq!((reward.key.as_str(), reward.version.as_str()), ("grader", "1"));
    let gets = sim.requests_to(Endpoint::GetStream);
    assert_eq!(gets.len(), 1);
    assert_eq!(gets[0].path, "/openapi/v1/streams/s1");
    assert_eq!(gets[0].query, None);
    assert_eq!(sim.counters().requests_to(Endpoint::ListStreams), 0);
}

#[tokio::test]
async fn item_4_a_different_returned_id_is_rejected() {
    let sim = start(world()).await;
    sim.add_fault(FaultRule::on(Endpoint::GetStream, FaultKind::WrongId));
    let err = client(&sim).get_stream("s1").await.unwrap_err();
    assert!(err.to_string().contains("returned id"), "{err}");
    assert_eq!(err.party(), Party::MalformedResponse);
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn a_stream_that_is_not_active_is_refused_and_ids_are_encoded() {
    let world = world().stream(StreamDef {
        status: Some("PAUSED".into()),
        ..StreamDef::new("team/paused")
    });
    let sim = start(world).await;
    let err = client(&sim).get_stream("team/paused").await.unwrap_err();
    assert!(err.to_string().contains("PAUSED, not ACTIVE"), "{err}");
    assert_eq!(
        sim.requests_to(Endpoint::GetStream)[0].path,
        "/openapi/v1/streams/team%2Fpaused"
    );
    let err = client(&sim).get_stream("missing").await.unwrap_err();
    assert_eq!(err.http_status(), Some(404));
}

#[tokio::test]
async fn items_6_to_8_protocol_resolution() {
    let cases = [
        (None, Some("Claude-Code-With-Skills"), LlmProtocol::Anthropic),
        (None, Some("openai-codex@2"), LlmProtocol::Responses),
        (None, Some("swe-agent"), LlmProtocol::ChatCompletions),
        (None, None, LlmProtocol::ChatCompletions),
        (Some("responses"), Some("claude@1"), LlmProtocol::Responses),
        (
            Some(" chat_completions "),
            Some("codex"),
            LlmProtocol::ChatCompletions,
        ),
    ];
    for (override_label, harness, want) in cases {
        assert_eq!(
            resolve_protocol(override_label, harness, None).unwrap(),
            want,
            "{override_label:?} {harness:?}"
        );
    }
    let sim = start(world()).await;
    let stream = client(&sim).get_stream("s1").await.unwrap();
    assert_eq!(
        resolve_protocol(Some(""), None, Some(&stream)).unwrap(),
        LlmProtocol::Anthropic,
        "the stream's default harness claude-code decides"
    );
    let err = resolve_protocol(Some("grpc"), None, None).unwrap_err();
    assert!(
        err.to_string()
            .to_lowercase()
            .contains("unsupported arena llm protocol override"),
        "{err}"
    );
}

#[tokio::test]
async fn a_wrong_token_is_an_arena_refusal_and_not_retried() {
    let sim = start(world()).await;
    let client = client_with(&sim, |c| c.token = "wrong".to_string().into());
    let err = client.get_stream("s1").await.unwrap_err();
    assert!(matches!(err, Error::Http { status: 401, .. }), "{err}");
    assert_eq!(err.party(), Party::Arena);
    assert!(!err.is_retryable());
    assert_eq!(sim.counters().unauthorized, 1);
}
