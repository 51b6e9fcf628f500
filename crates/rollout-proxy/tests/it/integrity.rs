//! The integrity guard on the generation path: a command that reads the repository's future, emitted as a
//! tool call in each of the three protocols or as a command block in text, is recorded on its interaction,
//! counted by `end_session`, exported on its trajectory and counted in `/metrics`; a session picks its
//! rules and base commit at `start_session`.

use std::collections::BTreeMap;
use std::sync::Arc;

use http::{Method, StatusCode};
use integrity_guard::RuleSet;
use rollout_proxy::IntegrityConfig;
use serde_json::{Value, json};

use crate::common::{Proxy, call, config, engine_config, turn};

const BASH_CALL: &str = "<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"cd /testbed && git --no-pager log --all --oneline | head\"}}\n</tool_call>";

fn bash_schema() -> Value {
    json!({"type": "object", "properties": {"command": {"type": "string"}}})
}

/// One generation that calls the bash tool in `protocol`'s own request shape.
async fn call_bash(p: &Proxy, key: &str, protocol: &str) {
    p.engine.push_script(turn(BASH_CALL));
    let r = match protocol {
        "chat" => {
            let tools =
                json!([{"type": "function", "function": {"name": "bash", "parameters": bash_schema()}}]);
            p.chat(key, json!({"model": "smol", "messages": [{"role": "user", "content": "Fix the bug"}], "tools": tools}))
                .await
        }
        "messages" => {
            let tools = json!([{"name": "bash", "input_schema": bash_schema()}]);
            p.messages(
                key,
                json!({"model": "smol", "max_tokens": 256, "tools": tools,
                                   "messages": [{"role": "user", "content": "Fix the bug"}]}),
            )
            .await
        }
        _ => {
            let tools = json!([{"type": "function", "name": "bash", "parameters": bash_schema()}]);
            p.responses(
                key,
                json!({"model": "smol", "input": "Fix the bug", "tools": tools, "max_output_tokens": 256}),
            )
            .await
        }
    };
    assert_eq!(r.status, StatusCode::OK, "{protocol}: {}", r.text);
    assert!(
        r.text.contains("git --no-pager log --all"),
        "{protocol}: the call reached the harness: {}",
        r.text
    );
}

async fn start(p: &Proxy, selection: Value) -> (String, String) {
    assert_eq!(p.admin("/grant_capacity", json!({})).await.status, StatusCode::OK);
    let r = p
        .admin(
            "/rl/start_session",
            json!({"task_id": "t", "integrity": selection}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    (
        v["session_id"].as_str().expect("id").into(),
        v["api_key"].as_str().expect("key").into(),
    )
}

#[tokio::test]
async fn a_hit_is_recorded_counted_and_exported_in_every_protocol() {
    let p = Proxy::default().await;
    for protocol in ["chat", "messages", "responses"] {
        let (session, key) = p.session("t").await;
        call_bash(&p, &key, protocol).await;
        let end = p.end(&key).await.json();
        assert_eq!(
            end["integrity_hits"],
            json!({"git-log-all-refs": 1}),
            "{protocol}"
        );
        let export = p.export(&session, "individual").await;
        assert_eq!(
            export.integrity_hits,
            BTreeMap::from([("git-log-all-refs".to_string(), 1)])
        );
        let hits = &export.trajectories[0].integrity_hits;
        assert_eq!(hits.len(), 1, "{protocol}");
        assert_eq!(hits[0].rule, "git-log-all-refs");
        assert_eq!(hits[0].category, "history");
        assert_eq!(hits[0].matched, "git log --all --oneline");
        assert_eq!(hits[0].interaction_id, export.trajectories[0].interaction_id);
    }
    let metrics = call(Method::GET, &p.url("/metrics"), &[], None).await.text;
    assert!(
        metrics.contains("rollout_proxy_integrity_hits_total{rule=\"git-log-all-refs\"} 3"),
        "{metrics}"
    );
}

#[tokio::test]
async fn commands_in_text_blocks_count_and_prose_does_not() {
    let p = Proxy::default().await;
    let (session, key) = p.session("t").await;
    p.engine.push_script(turn(
        "I will not run git reflog here. Let me look:\n```bash\ngit fetch origin && git diff HEAD origin/main\n```",
    ));
    let r = p
        .chat(
            &key,
            json!({"model": "smol", "messages": [{"role": "user", "content": "Fix it"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let end = p.end(&key).await.json();
    assert_eq!(
        end["integrity_hits"],
        json!({"git-fetch": 1, "git-remote-ref": 1})
    );
    let export = p.export(&session, "concat").await;
    let rules: Vec<&str> = export.trajectories[0]
        .integrity_hits
        .iter()
        .map(|h| h.rule.as_str())
        .collect();
    assert_eq!(rules, ["git-fetch", "git-remote-ref"]);
}

#[tokio::test]
async fn a_clean_session_reports_no_hits_field() {
    let p = Proxy::default().await;
    let (session, key) = p.session("t").await;
    p.engine.push_script(turn("<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"git status && pytest -q\"}}\n</tool_call>"));
    let tools = json!([{"type": "function", "function": {"name": "bash", "parameters": bash_schema()}}]);
    let r = p
        .chat(
            &key,
            json!({"model": "smol", "messages": [{"role": "user", "content": "x"}], "tools": tools}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let end = p.end(&key).await;
    assert!(!end.text.contains("integrity_hits"), "{}", end.text);
    let export = p.export(&session, "individual").await;
    assert!(export.integrity_hits.is_empty());
    assert!(export.trajectories[0].integrity_hits.is_empty());
}

#[tokio::test]
async fn a_session_chooses_its_rules_and_base_commit() {
    let mut c = config();
    c.integrity = IntegrityConfig {
        default: None,
        profiles: BTreeMap::from([
            ("swe".to_string(), RuleSet::shared_builtin()),
            (
                "off".to_string(),
                Arc::new(RuleSet::assemble(false, &[], vec![]).expect("empty rules")),
            ),
        ]),
    };
    let p = Proxy::start(c, engine_config()).await;
    let base = "9c1e5b7a3d2f4e6a8b0c1d3e5f7a9b2c4d6e8f01";
    let show = |hash: &str| {
        format!(
            "<tool_call>\n{{\"name\": \"bash\", \"arguments\": {{\"command\": \"git show {hash}\"}}}}\n</tool_call>"
        )
    };
    let tools = json!([{"type": "function", "function": {"name": "bash", "parameters": bash_schema()}}]);
    let body = json!({"model": "smol", "messages": [{"role": "user", "content": "x"}], "tools": tools});
    for (selection, expected) in [
        (json!(null), json!(null)),
        (json!({"profile": "off"}), json!(null)),
        (
            json!({"profile": "swe", "base_commit": base}),
            json!({"git-object-by-hash": 1}),
        ),
    ] {
        let (_, key) = start(&p, selection.clone()).await;
        p.engine.push_script(turn(&show("9c1e5b7")));
        assert_eq!(p.chat(&key, body.clone()).await.status, StatusCode::OK);
        p.engine.push_script(turn(&show("4f1c2e9")));
        assert_eq!(p.chat(&key, body.clone()).await.status, StatusCode::OK);
        let end = p.end(&key).await.json();
        assert_eq!(
            end.get("integrity_hits").cloned().unwrap_or(json!(null)),
            expected,
            "{selection}"
        );
    }
    assert_eq!(p.admin("/grant_capacity", json!({})).await.status, StatusCode::OK);
    let r = p
        .admin(
            "/rl/start_session",
            json!({"task_id": "t", "integrity": {"profile": "nope"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    insta::assert_json_snapshot!(r.json());
    let r = p
        .admin(
            "/rl/start_session",
            json!({"task_id": "t", "integrity": {"profiles": "swe"}}),
        )
        .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
}
