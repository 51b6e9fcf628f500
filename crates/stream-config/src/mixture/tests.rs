//! Mixture tests: the reference's worked examples with exact orders, its error cases, and properties checked
//! against a naive transliteration of the reference algorithm.

use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::stream::parse_stream_config;

fn streams(spec: &[(&str, f64, usize)]) -> Vec<MixtureStream<'static>> {
    spec.iter()
        .map(|&(name, weight, rows)| MixtureStream {
            name: Box::leak(name.to_string().into_boxed_str()),
            weight,
            rows,
        })
        .collect()
}

/// The order as a string of stream-name initials.
fn initials(s: &[MixtureStream<'_>], epoch: i64, multiple: usize) -> String {
    mixture_order(s, epoch, multiple)
        .unwrap()
        .into_iter()
        .map(|i| s[i].name.chars().next().unwrap_or('?'))
        .collect()
}

fn err(s: &[MixtureStream<'_>], epoch: i64, multiple: usize) -> String {
    plan(s, epoch, multiple).unwrap_err().to_string()
}

/// The reference's algorithm, transliterated naively: per-step linear argmin over every stream.
fn naive_order(s: &[MixtureStream<'_>], counts: &[usize]) -> Vec<usize> {
    let target: usize = counts.iter().sum();
    let mut emitted = vec![0usize; s.len()];
    let mut out = Vec::with_capacity(target);
    while out.len() < target {
        let mut best: Option<usize> = None;
        for i in 0..s.len() {
            if emitted[i] >= counts[i] {
                continue;
            }
            let key = (emitted[i] + 1) as f64 / s[i].weight;
            best = match best {
                None => Some(i),
                Some(b) => {
                    let bkey = (emitted[b] + 1) as f64 / s[b].weight;
                    if key < bkey || (key == bkey && s[i].name < s[b].name) {
                        Some(i)
                    } else {
                        Some(b)
                    }
                }
            };
        }
        let i = best.expect("a stream with rows left");
        emitted[i] += 1;
        out.push(i);
    }
    out
}

#[test]
fn weights_3_to_1_epoch_12_take_9_and_3_in_exact_order() {
    // Spec 2.4 step 8 and 8.2 item 9.
    let s = streams(&[("astra", 3.0, 9), ("tbench", 1.0, 9)]);
    assert_eq!(plan(&s, 12, 4).unwrap().counts, vec![9, 3]);
    assert_eq!(initials(&s, 12, 4), "aaataaataaat");
    let rows = build_weighted_rows(
        &[stream_named("astra", 3.0), stream_named("tbench", 1.0)],
        vec![
            (0..9).map(|i| format!("a{i}")).collect(),
            (0..9).map(|i| format!("t{i}")).collect(),
        ],
        12,
        4,
    )
    .unwrap();
    assert_eq!(
        rows,
        [
            "a0", "a1", "a2", "t0", "a3", "a4", "a5", "t1", "a6", "a7", "a8", "t2"
        ]
    );
    let unique: std::collections::HashSet<_> = rows.iter().collect();
    assert_eq!(unique.len(), 12);
}

#[test]
fn equal_weights_56_441_20_with_batch_4_take_all_517_rows() {
    // Spec 2.4 step 8 and 8.2 item 11: a, b, c round-robin until c runs out, then a, b, then b alone.
    let s = streams(&[("a", 1.0, 56), ("b", 1.0, 441), ("c", 1.0, 20)]);
    let want = "abc".repeat(20) + &"ab".repeat(36) + &"b".repeat(385);
    assert_eq!(initials(&s, 0, 4), want);
    assert_eq!(want.len(), 517);
    assert_eq!(plan(&s, 0, 4).unwrap().tail_rows(4), 1);
}

#[test]
fn equal_weights_4_and_1_rows_start_large_then_small() {
    // Spec 8.2 item 10.
    let s = streams(&[("small", 1.0, 1), ("large", 1.0, 4)]);
    assert_eq!(initials(&s, 0, 1), "lslll");
}

#[test]
fn epoch_beyond_the_unique_rows_is_rejected() {
    // Spec 8.2 item 12.
    let s = streams(&[("a", 1.0, 2), ("b", 1.0, 3)]);
    insta::assert_snapshot!(err(&s, 6, 1), @"arena_mixture_epoch_size=6 cannot exceed the 5 unique source rows");
}

#[test]
fn default_epoch_never_repeats_rows_whatever_the_weights() {
    // Spec 8.2 item 13.
    let s = streams(&[("a", 100.0, 2), ("b", 0.01, 3)]);
    let order = mixture_order(&s, 0, 1).unwrap();
    assert_eq!(order.iter().filter(|&&i| i == 0).count(), 2);
    assert_eq!(order.iter().filter(|&&i| i == 1).count(), 3);
    assert_eq!(initials(&s, 0, 1), "aabbb");
}

#[test]
fn scaling_all_weights_by_two_changes_nothing() {
    // Spec 8.2 item 14.
    let s = streams(&[("a", 3.0, 9), ("b", 1.0, 9), ("c", 0.5, 7)]);
    let doubled = streams(&[("a", 6.0, 9), ("b", 2.0, 9), ("c", 1.0, 7)]);
    assert_eq!(
        mixture_order(&s, 12, 4).unwrap(),
        mixture_order(&doubled, 12, 4).unwrap()
    );
    assert_eq!(
        mixture_order(&s, 0, 4).unwrap(),
        mixture_order(&doubled, 0, 4).unwrap()
    );
}

#[test]
fn overflowing_weights_are_rejected() {
    // Spec 8.2 item 15.
    let s = streams(&[("a", 1e308, 2), ("b", 1e308, 2)]);
    let e = err(&s, 0, 1);
    assert!(e.contains("overflowed the mixture mass"), "{e}");
    let s = streams(&[("a", 1e308, 1), ("b", 1e308, 1)]);
    insta::assert_snapshot!(err(&s, 0, 1), @"Arena Stream weights overflowed the mixture mass: the total of rows x weight over 2 streams is inf");
}

#[test]
fn default_epoch_is_not_padded_to_the_batch_size() {
    // Spec 8.2 item 16.
    let s = streams(&[("a", 1.0, 4), ("b", 1.0, 3)]);
    let p = plan(&s, 0, 4).unwrap();
    assert_eq!(p.target, 7);
    assert_eq!(p.tail_rows(4), 3);
    assert_eq!(mixture_order(&s, 0, 4).unwrap().len(), 7);
}

/// A row as the trainer builds it: stream, data id, pinned reward ref and protocol (spec 8.2 item 17).
#[derive(Debug, Clone, PartialEq)]
struct Row {
    stream: String,
    data_id: String,
    reward_ref: RewardRef,
    protocol: crate::LlmProtocol,
}

use crate::stream::RewardRef;

fn stream_named(name: &str, weight: f64) -> StreamConfig {
    parse_stream_config(&json!({"name": name, "stream_id": format!("id-{name}"), "sampling_weight": weight}))
        .unwrap()
}

#[test]
fn epoch_9_from_two_6_row_streams_weighted_2_to_1_keeps_row_metadata() {
    // Spec 8.2 item 17.
    let configs = vec![
        parse_stream_config(&json!({
            "name": "claude", "stream_id": "s-a", "sampling_weight": 2, "harness": "claude-code@1",
            "expected_reward_ref": {"key": "ga", "version": "1"}
        }))
        .unwrap(),
        parse_stream_config(&json!({
            "name": "codex", "stream_id": "s-b", "sampling_weight": 1, "harness": "openai-codex@2",
            "expected_reward_ref": {"key": "gb", "version": "2"}
        }))
        .unwrap(),
    ];
    let rows: Vec<Vec<Row>> = configs
        .iter()
        .map(|s| {
            (0..6)
                .map(|i| Row {
                    stream: s.name.clone(),
                    data_id: format!("{}-{i}", s.name),
                    reward_ref: s.expected_reward_ref.clone(),
                    protocol: s.resolved_protocol(None),
                })
                .collect()
        })
        .collect();
    let mixed = build_weighted_rows(&configs, rows, 9, 3).unwrap();
    assert_eq!(mixed.len(), 9);
    let from = |name: &str| mixed.iter().filter(|r| r.stream == name).count();
    assert_eq!((from("claude"), from("codex")), (6, 3));
    for r in &mixed {
        let (key, protocol) = if r.stream == "claude" {
            ("ga", crate::LlmProtocol::Anthropic)
        } else {
            ("gb", crate::LlmProtocol::Responses)
        };
        assert_eq!((r.reward_ref.key.as_str(), r.protocol), (key, protocol));
    }
    // Keys: claude 0.5, 1, 1.5, ...; codex 1, 2, 3: ties go to "claude" (it sorts first).
    let ids: Vec<&str> = mixed.iter().map(|r| r.data_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "claude-0", "claude-1", "codex-0", "claude-2", "claude-3", "codex-1", "claude-4", "claude-5",
            "codex-2"
        ]
    );
}

#[test]
fn input_errors_name_the_stream_and_the_value() {
    insta::assert_snapshot!(err(&streams(&[("a", 1.0, 0)]), 0, 1), @r#"Arena Stream "a" contains no dataset rows"#);
    insta::assert_snapshot!(err(&streams(&[("a", 1.0, 4)]), -1, 1), @"arena_mixture_epoch_size must be >= 0, got -1");
    insta::assert_snapshot!(err(&streams(&[("a", 1.0, 4)]), 3, 2), @"arena_mixture_epoch_size=3 must be divisible by the training batch size 2");
    insta::assert_snapshot!(err(&streams(&[("a", 1.0, 4)]), 0, 0), @"the mixture size multiple (training batch size) must be a positive integer, got 0");
    insta::assert_snapshot!(err(&streams(&[("a", -1.0, 4)]), 0, 1), @r#"Arena Stream "a": sampling_weight must be finite and positive, got -1"#);
    let e = build_weighted_rows(&[stream_named("a", 1.0)], vec![vec![1], vec![2]], 0, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("rows for 2 streams but 1 streams"), "{e}");
}

#[test]
fn water_filling_caps_small_streams_and_shares_the_rest() {
    // Masses are rows x weight: 20, 20, 20. Target 10 gives a share of 3.33 each, which caps "a" at its 2
    // rows; "b" and "c" share the remaining 8.
    let s = streams(&[("a", 10.0, 2), ("b", 1.0, 20), ("c", 1.0, 20)]);
    assert_eq!(plan(&s, 10, 1).unwrap().counts, vec![2, 4, 4]);
    // Equal weights share by size: 10 of 2, 20, 20 gives 0.48, 4.76, 4.76; the two extra rows go to the
    // largest fractions, "b" and "c".
    let s = streams(&[("a", 1.0, 2), ("b", 1.0, 20), ("c", 1.0, 20)]);
    assert_eq!(plan(&s, 10, 1).unwrap().counts, vec![0, 5, 5]);
    // Equal fractions: the extra row goes to the first name, wherever it sits in config order.
    let s = streams(&[("c", 1.0, 10), ("b", 1.0, 10), ("a", 1.0, 10)]);
    assert_eq!(plan(&s, 7, 1).unwrap().counts, vec![2, 2, 3]);
}

fn arb_mixture() -> impl Strategy<Value = (Vec<(String, f64, usize)>, i64, usize)> {
    (1usize..8)
        .prop_flat_map(|n| {
            (
                // Small weights make equal-weight groups and exact cross-group ties (1/1 == 2/2) common.
                prop::collection::vec((prop_oneof![1u32..=4, 1u32..100], 1usize..40), n),
                1usize..5,
                any::<prop::sample::Index>(),
                any::<bool>(),
            )
        })
        .prop_map(|(spec, multiple, pick, full)| {
            let spec: Vec<(String, f64, usize)> = spec
                .into_iter()
                .enumerate()
                .map(|(i, (w, rows))| (format!("s{}", (i * 7) % 10), w as f64, rows))
                .collect();
            let total: usize = spec.iter().map(|s| s.2).sum();
            let epochs = total / multiple;
            let epoch = if full || epochs == 0 {
                0
            } else {
                ((pick.index(epochs) + 1) * multiple) as i64
            };
            (spec, epoch, multiple)
        })
}

fn as_streams(spec: &[(String, f64, usize)]) -> Vec<MixtureStream<'_>> {
    spec.iter()
        .map(|(name, weight, rows)| MixtureStream {
            name,
            weight: *weight,
            rows: *rows,
        })
        .collect()
}

proptest! {
    #[test]
    fn mixture_properties((spec, epoch, multiple) in arb_mixture(), factor in 1u32..1000) {
        let s = as_streams(&spec);
        let p = plan(&s, epoch, multiple).unwrap();
        let total: usize = spec.iter().map(|s| s.2).sum();
        let target = if epoch == 0 { total } else { epoch as usize };

        // Counts never exceed capacities, and the output size equals the target.
        prop_assert!(p.counts.iter().zip(&s).all(|(c, s)| *c <= s.rows));
        prop_assert_eq!(p.target, target);

        // No row appears twice: every stream contributes its first `count` rows exactly once.
        let rows: Vec<Vec<(usize, usize)>> =
            s.iter().enumerate().map(|(i, st)| (0..st.rows).map(|r| (i, r)).collect()).collect();
        let configs: Vec<StreamConfig> = spec.iter().map(|(n, w, _)| stream_named(n, *w)).collect();
        let mixed = build_weighted_rows(&configs, rows, epoch, multiple);
        if let Ok(mixed) = mixed {
            prop_assert_eq!(mixed.len(), target);
            let unique: std::collections::HashSet<_> = mixed.iter().collect();
            prop_assert_eq!(unique.len(), target);
        }

        // The fast interleave is the reference's algorithm.
        let order = mixture_order(&s, epoch, multiple).unwrap();
        prop_assert_eq!(&order, &naive_order(&s, &p.counts));

        // Scaling every weight leaves the output unchanged.
        let scaled: Vec<(String, f64, usize)> =
            spec.iter().map(|(n, w, r)| (n.clone(), w * f64::from(factor), *r)).collect();
        prop_assert_eq!(&order, &mixture_order(&as_streams(&scaled), epoch, multiple).unwrap());
        let halved: Vec<(String, f64, usize)> =
            spec.iter().map(|(n, w, r)| (n.clone(), w / 1024.0, *r)).collect();
        prop_assert_eq!(&order, &mixture_order(&as_streams(&halved), epoch, multiple).unwrap());

        // The output is a deterministic function of its inputs.
        prop_assert_eq!(&order, &mixture_order(&s, epoch, multiple).unwrap());
    }
}
