//! Dataset pagination (8.1 items 12-17), concurrency in API order, and sharding.

use arena_client::{DatasetOptions, Error};
use arena_sim::{Endpoint, FaultKind, FaultRule, StreamDef, World};
use serde_json::json;
use stream_config::LlmProtocol;

use crate::support::{TOKEN, client, start, world};

fn paging(sim: &arena_sim::ArenaSim) -> Vec<(u64, u64)> {
    sim.requests_to(Endpoint::Dataset)
        .iter()
        .map(|r| {
            let get = |k| r.query_param(k).unwrap().parse::<u64>().unwrap();
            (get("limit"), get("offset"))
        })
        .collect()
}

fn big(rows: u64) -> World {
    World {
        token: TOKEN.to_string(),
        ..World::default()
    }
    .stream(StreamDef::new("big").generated(rows))
}

#[tokio::test]
async fn item_12_probe_then_one_page_with_protocol_and_task_types() {
    let sim = start(world()).await;
    let rows = client(&sim)
        .get_all_dataset_rows("s1", LlmProtocol::Anthropic)
        .await
        .unwrap();
    assert_eq!(paging(&sim), [(1, 0), (3, 0)]);
    let got: Vec<_> = rows
        .iter()
        .map(|r| {
            (
                r.data_id.as_str(),
                r.stream_id.as_str(),
                r.llm_protocol,
                r.arena_task_type.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("r1", "s1", LlmProtocol::Anthropic, "swe"),
            ("r2", "s1", LlmProtocol::Anthropic, "math"),
            ("r3", "s1", LlmProtocol::Anthropic, "unknown"),
        ]
    );
    insta::assert_json_snapshot!("dataset_row", rows[0]);
}

#[tokio::test]
async fn item_13_ambiguous_or_malformed_tags_are_unknown() {
    let world = World {
        token: TOKEN.to_string(),
        ..World::default()
    }
    .stream(
        StreamDef::new("t")
            .row("two", &["domain:swe", "domain:math"])
            .row_with_tags("number", json!(["domain:swe", 5]))
            .row_with_tags("dict", json!({"domain": "swe"})),
    );
    let sim = start(world).await;
    let rows = client(&sim)
        .get_all_dataset_rows("t", LlmProtocol::ChatCompletions)
        .await
        .unwrap();
    assert!(rows.iter().all(|r| r.arena_task_type == "unknown"), "{rows:?}");
    assert_eq!(rows.len(), 3);
}

#[tokio::test]
async fn item_14_a_thousand_and_one_rows_take_two_pages() {
    let sim = start(big(1001)).await;
    let rows = client(&sim)
        .get_all_dataset_rows("big", LlmProtocol::ChatCompletions)
        .await
        .unwrap();
    let mut requests = paging(&sim);
    assert_eq!(requests[0], (1, 0));
    requests[1..].sort_by_key(|(_, offset)| *offset);
    assert_eq!(requests, [(1, 0), (1000, 0), (1, 1000)]);
    assert_eq!(rows.len(), 1001);
    assert_eq!(rows[0].data_id, "big-row-0");
    assert_eq!(rows[1000].data_id, "big-row-1000");
}

#[tokio::test]
async fn pages_are_fetched_concurrently_but_kept_in_api_order() {
    let sim = start(big(4500)).await;
    sim.add_fault(FaultRule::on(Endpoint::Dataset, FaultKind::DelayMs(400)).after(1));
    let rows = client(&sim)
        .get_all_dataset_rows("big", LlmProtocol::ChatCompletions)
        .await
        .unwrap();
    let ids: Vec<String> = rows.iter().map(|r| r.data_id.clone()).collect();
    let want: Vec<String> = (0..4500).map(|n| format!("big-row-{n}")).collect();
    assert_eq!(ids, want);
    let counters = sim.counters();
    assert_eq!(counters.requests_to(Endpoint::Dataset), 6);
    assert_eq!(
        counters.max_in_flight[&Endpoint::Dataset],
        4,
        "default bound of 4 pages in flight"
    );

    let sim = start(big(2500)).await;
    sim.add_fault(FaultRule::on(Endpoint::Dataset, FaultKind::DelayMs(300)).after(1));
    let options = DatasetOptions {
        page_size: 500,
        concurrency: 2,
        ..DatasetOptions::default()
    };
    let rows = client(&sim)
        .get_all_dataset_rows_with("big", LlmProtocol::ChatCompletions, &options)
        .await
        .unwrap();
    assert_eq!(rows.len(), 2500);
    assert_eq!(sim.counters().max_in_flight[&Endpoint::Dataset], 2);
}

async fn pagination_error(world: World, stream: &str, rule: FaultRule, concurrency: usize) -> Error {
    let sim = start(world).await;
    sim.add_fault(rule);
    let options = DatasetOptions {
        page_size: 1000,
        concurrency,
        ..DatasetOptions::default()
    };
    client(&sim)
        .get_all_dataset_rows_with(stream, LlmProtocol::ChatCompletions, &options)
        .await
        .unwrap_err()
}

#[tokio::test]
async fn items_15_to_17_inconsistent_pages_are_rejected() {
    let cases = [
        (FaultKind::ChangeTotal, "total changed during pagination"),
        (
            FaultKind::WrongOffset,
            "pagination returned offset 1 for requested offset 0",
        ),
        (
            FaultKind::WrongLimit,
            "pagination returned limit 4 for requested limit 3",
        ),
        (
            FaultKind::WrongCount,
            "pagination returned count 4 for 3 data_ids",
        ),
        (FaultKind::DuplicateIds, "pagination returned duplicate ids"),
    ];
    for (fault, want) in cases {
        let rule = FaultRule::on(Endpoint::Dataset, fault.clone()).after(1).times(1);
        let err = pagination_error(world(), "s1", rule, 4).await;
        assert!(err.to_string().contains(want), "{fault:?}: {err}");
        assert!(err.to_string().contains("/streams/s1/dataset"), "{err}");
    }
    // A duplicate across pages: the second page repeats the last id of the first.
    let rule = FaultRule::on(Endpoint::Dataset, FaultKind::DuplicateIds)
        .after(2)
        .times(1);
    let err = pagination_error(big(1001), "big", rule, 1).await;
    assert!(
        err.to_string()
            .contains("pagination returned duplicate ids: \"big-row-999\" appeared on an earlier page"),
        "{err}"
    );
}

#[tokio::test]
async fn empty_and_single_row_datasets() {
    let world = world()
        .stream(StreamDef::new("empty"))
        .stream(StreamDef::new("one").row("only", &["domain:x"]));
    let sim = start(world).await;
    let client = client(&sim);
    let err = client
        .get_all_dataset_rows("empty", LlmProtocol::ChatCompletions)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("contains no dataset rows"), "{err}");
    sim.clear_requests();
    let rows = client
        .get_all_dataset_rows("one", LlmProtocol::Responses)
        .await
        .unwrap();
    assert_eq!(paging(&sim), [(1, 0)], "the probe page is reused");
    assert_eq!(rows[0].arena_task_type, "x");
    assert_eq!(client.dataset_total("s1").await.unwrap(), 3);
}

#[tokio::test]
async fn shards_of_a_downloaded_dataset_partition_it() {
    let sim = start(big(10)).await;
    let rows = client(&sim)
        .get_all_dataset_rows("big", LlmProtocol::ChatCompletions)
        .await
        .unwrap();
    let a = rows.shard(0, 2).unwrap();
    let b = rows.shard(1, 2).unwrap();
    assert_eq!(a.len() + b.len(), 10);
    assert!(a.iter().all(|r| !b.contains(r)));
    assert_eq!(a[0].data_id, "big-row-0");
    assert_eq!(b[0].data_id, "big-row-1");
}

/// Arena's `total` is checked before anything is requested or allocated for it: a stream reporting more rows
/// than `max_rows` is refused after the probe alone.
#[tokio::test]
async fn a_total_over_the_bound_is_refused_before_paging() {
    let sim = start(big(2500)).await;
    let options = DatasetOptions {
        max_rows: 2000,
        ..DatasetOptions::default()
    };
    let err = client(&sim)
        .get_all_dataset_rows_with("big", LlmProtocol::ChatCompletions, &options)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("total 2500") && err.contains("2000"), "{err}");
    assert_eq!(sim.counters().requests_to(Endpoint::Dataset), 1, "only the probe");
}
