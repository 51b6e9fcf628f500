//! Tests of one session's stored responses: chains rebuilt oldest first, and the count and byte budgets
//! forgetting the oldest first.

use serde_json::json;

use super::*;

fn stored(previous: Option<&str>, input: &str, output: &str) -> StoredResponse {
    StoredResponse {
        previous: previous.map(Into::into),
        input: vec![json!({"role": "user", "content": input})].into(),
        output: json!({"role": "assistant", "content": output}).into(),
        response: Bytes::from(json!({"id": output}).to_string()),
    }
}

#[test]
fn a_chain_is_rebuilt_oldest_first_and_forgotten_oldest_first() {
    let mut store = SessionResponses::default();
    store.insert("r1", stored(None, "q1", "a1"), usize::MAX);
    store.insert("r2", stored(Some("r1"), "q2", "a2"), usize::MAX);
    store.insert("r3", stored(Some("r1"), "q3", "a3"), usize::MAX);
    let text = |c: Vec<Turn>| {
        messages(&c)
            .iter()
            .map(|m| m["content"].as_str().expect("text").to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        text(store.conversation("r2").expect("chain")),
        ["q1", "a1", "q2", "a2"]
    );
    assert_eq!(
        text(store.conversation("r3").expect("branch")),
        ["q1", "a1", "q3", "a3"]
    );
    assert_eq!(store.get("r3"), Some(&Bytes::from(r#"{"id":"a3"}"#)));
    assert!(store.conversation("nope").is_none());
    for i in 0..MAX_STORED_RESPONSES {
        store.insert(&format!("x{i}"), stored(None, "q", "a"), usize::MAX);
    }
    assert!(store.get("r1").is_none(), "the oldest went first");
    assert!(store.conversation("r2").is_none());
    assert_eq!(store.responses.len(), MAX_STORED_RESPONSES);
}

#[test]
fn stored_responses_are_forgotten_oldest_first_past_the_byte_budget() {
    let mut store = SessionResponses::default();
    let one = stored(None, &"q".repeat(1000), "a").bytes() + 2;
    let budget = 3 * one;
    for i in 0..5 {
        store.insert(&format!("r{i}"), stored(None, &"q".repeat(1000), "a"), budget);
        assert!(store.bytes() <= budget, "{} > {budget}", store.bytes());
    }
    assert_eq!(store.responses.len(), 3);
    assert!(store.get("r1").is_none() && store.get("r2").is_some() && store.get("r4").is_some());
    assert_eq!(store.bytes(), 3 * one);
    // Replacing an id counts its new size only.
    store.insert("r4", stored(None, "q", "a"), budget);
    assert_eq!(store.responses.len(), 3);
    assert_eq!(store.bytes(), 2 * one + stored(None, "q", "a").bytes() + 2);
    // One larger than the whole budget is not kept, and takes nothing with it but what it must.
    store.insert("huge", stored(None, &"q".repeat(10 * one), "a"), budget);
    assert!(store.get("huge").is_none());
    assert!(store.bytes() <= budget);
}

#[test]
fn the_budget_counts_the_memory_a_tree_takes_not_its_json() {
    let parts: Vec<Value> = (0..10_000).map(|_| json!({"t": 0})).collect();
    let response = StoredResponse {
        previous: None,
        input: vec![json!({"role": "user", "content": parts})].into(),
        output: json!({"role": "assistant", "content": "a"}).into(),
        response: Bytes::from_static(b"{}"),
    };
    let json = bounds::json_size(&response.input[0], usize::MAX);
    assert!(
        response.bytes() > 10 * json,
        "{} bytes held for {json} bytes of JSON",
        response.bytes()
    );
}
