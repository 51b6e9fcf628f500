//! Tests of the backoff and the retry predicate.

use std::time::Duration;

use super::*;

#[test]
fn ceiling_follows_the_reference_schedule() {
    let policy = RetryPolicy::default();
    let secs: Vec<u64> = (0..7).map(|k| policy.ceiling(k).as_secs()).collect();
    assert_eq!(secs, [1, 2, 4, 8, 10, 10, 10]);
    assert_eq!(policy.ceiling(u32::MAX), Duration::from_secs(10));
}

#[test]
fn full_jitter_stays_below_the_ceiling_and_varies() {
    let policy = RetryPolicy::default();
    let draws: Vec<Duration> = (0..200).map(|_| policy.delay(3)).collect();
    assert!(draws.iter().all(|d| *d <= Duration::from_secs(8)));
    let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
    assert!(distinct.len() > 100, "jitter draws look constant");
    let no_jitter = RetryPolicy {
        jitter: false,
        ..RetryPolicy::default()
    };
    assert_eq!(no_jitter.delay(2), Duration::from_secs(4));
}

#[test]
fn transient_statuses() {
    let marker = format!("<html>{TRANSIENT_403_MARKER}</html>");
    let late_marker = format!("{}{TRANSIENT_403_MARKER}", "x".repeat(1000));
    let cases: &[(u16, &str, Delivery, bool)] = &[
        (429, "", Delivery::Repeatable, true),
        (429, "", Delivery::AtMostOnce, true),
        (500, "", Delivery::Repeatable, true),
        (504, "", Delivery::Repeatable, true),
        (503, "", Delivery::AtMostOnce, false),
        (403, &marker, Delivery::Repeatable, true),
        (403, &marker, Delivery::AtMostOnce, true),
        (403, "forbidden", Delivery::Repeatable, false),
        (403, &late_marker, Delivery::Repeatable, false),
        (404, "", Delivery::Repeatable, false),
        (400, "", Delivery::Repeatable, false),
    ];
    for (status, body, delivery, want) in cases {
        assert_eq!(
            retry_status(*status, body.as_bytes(), *delivery),
            *want,
            "{status} {delivery:?} {}",
            &body[..body.len().min(20)]
        );
    }
}
