//! The quickstart's world: preflight passes on both streams, rows carry their family's tag, and each
//! stream's default harness infers the protocol the quickstart needs.

use arena_client::{PreflightOptions, preflight};
use arena_sim::tasks::TaskFamily;
use arena_sim::{ArenaSim, QUICKSTART_ROWS, RunnerDef, World};
use secrecy::SecretString;
use serde_json::json;
use stream_config::{LlmProtocol, parse_stream_config};

#[tokio::test]
async fn the_quickstart_world_passes_preflight() {
    let world = World::quickstart();
    assert!(matches!(world.runners["claude-sim"], RunnerDef::Anthropic(_)));
    assert!(matches!(world.runners["chat-sim"], RunnerDef::Chat(_)));
    assert!(matches!(world.runners["codex-sim"], RunnerDef::Responses(_)));
    let sim = ArenaSim::start(world).await.expect("sim starts");
    let mut config = arena_client::ClientConfig::new(&sim.base_url(), SecretString::from("arena-sim-token"))
        .expect("config");
    config.poll_interval = std::time::Duration::from_millis(5);
    let client = arena_client::ArenaClient::new(config).expect("client");
    let streams: Vec<_> = [("sim-messages", "max"), ("sim-chat", "min")]
        .iter()
        .map(|(id, _)| {
            parse_stream_config(&json!({
                "name": id, "stream_id": id,
                "expected_reward_ref": {"key": "sim-grader", "version": "1"},
            }))
            .expect("stream config")
        })
        .collect();
    let summaries = preflight(&client, &streams, &PreflightOptions::default())
        .await
        .expect("preflight passes");
    let seen: Vec<(String, LlmProtocol, u64)> = summaries
        .iter()
        .map(|s| (s.harness.clone(), s.llm_protocol, s.dataset_total))
        .collect();
    assert_eq!(
        seen,
        [
            (
                "claude-sim@1".to_string(),
                LlmProtocol::Anthropic,
                QUICKSTART_ROWS
            ),
            (
                "chat-sim@1".to_string(),
                LlmProtocol::ChatCompletions,
                QUICKSTART_ROWS
            ),
        ]
    );
    for ((id, family), protocol) in [("sim-messages", "max"), ("sim-chat", "min")]
        .into_iter()
        .zip([LlmProtocol::Anthropic, LlmProtocol::ChatCompletions])
    {
        let rows = client
            .get_all_dataset_rows(id, protocol)
            .await
            .expect("rows")
            .into_rows();
        assert_eq!(rows.len() as u64, QUICKSTART_ROWS);
        assert!(rows.iter().all(|r| r.arena_task_type == family), "{id}");
    }
    assert_eq!(TaskFamily::Max.domain_tag(), "domain:max");
}
