//! Tests of sharding.

use super::*;

fn rows(n: usize) -> Dataset {
    Dataset::new(
        (0..n)
            .map(|i| DatasetRow {
                data_id: format!("r{i}"),
                stream_id: "s".into(),
                llm_protocol: LlmProtocol::ChatCompletions,
                arena_task_type: "unknown".into(),
                base_commit: None,
            })
            .collect(),
    )
}

#[test]
fn shards_are_disjoint_complete_balanced_and_deterministic() {
    let data = rows(10);
    let shards: Vec<Vec<String>> = (0..3)
        .map(|i| {
            data.shard(i, 3)
                .unwrap()
                .iter()
                .map(|r| r.data_id.clone())
                .collect()
        })
        .collect();
    assert_eq!(shards[0], ["r0", "r3", "r6", "r9"]);
    assert_eq!(shards[1], ["r1", "r4", "r7"]);
    assert_eq!(shards[2], ["r2", "r5", "r8"]);
    let mut all: Vec<String> = shards.concat();
    all.sort_by_key(|id| id[1..].parse::<u32>().unwrap());
    assert_eq!(all, data.iter().map(|r| r.data_id.clone()).collect::<Vec<_>>());
    assert_eq!(data.shard(1, 3).unwrap(), data.shard(1, 3).unwrap());
    assert_eq!(data.shard(0, 1).unwrap(), data);
    assert!(data.shard(3, 3).is_err());
    assert!(data.shard(0, 0).is_err());
}

#[test]
fn a_base_commit_comes_from_the_item_its_metadata_or_a_tag() {
    let check = |item: serde_json::Value, want: Option<&str>| {
        assert_eq!(base_commit_of_item(Some(&item)).as_deref(), want, "{item}");
    };
    let sha = "0123456789ABCDEF0123456789abcdef01234567";
    let low = sha.to_ascii_lowercase();
    check(serde_json::json!({"base_commit": sha}), Some(&low));
    check(serde_json::json!({"metadata": {"base_commit": sha}}), Some(&low));
    check(
        serde_json::json!({"tags": ["domain:swe", format!("base_commit:{sha}")]}),
        Some(&low),
    );
    check(
        serde_json::json!({"base_commit": "main", "tags": ["base_commit:abc1234"]}),
        Some("abc1234"),
    );
    check(serde_json::json!({"base_commit": "abc12"}), None);
    check(serde_json::json!({"tags": "base_commit:abc1234"}), None);
    assert_eq!(base_commit_of_item(None), None);
}
