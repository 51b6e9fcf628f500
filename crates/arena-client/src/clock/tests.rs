//! Tests of the manual clock.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use super::*;

#[tokio::test]
async fn advance_wakes_exactly_the_due_sleepers() {
    let clock = Arc::new(ManualClock::new());
    let mut short = clock.sleep(Duration::from_secs(5));
    let mut long = clock.sleep(Duration::from_secs(60));
    assert_eq!(clock.sleepers(), 2);
    clock.advance(Duration::from_secs(4));
    assert!((&mut short).now_or_never().is_none());
    clock.advance(Duration::from_secs(1));
    assert!((&mut short).now_or_never().is_some());
    assert!((&mut long).now_or_never().is_none());
    assert_eq!(clock.now(), Duration::from_secs(5));
    assert_eq!(clock.sleepers(), 1);
    drop(long);
    assert_eq!(clock.sleepers(), 0);
    assert!(clock.sleep(Duration::ZERO).now_or_never().is_some());
}

#[tokio::test]
async fn wait_for_sleepers_returns_once_a_task_sleeps() {
    let clock = Arc::new(ManualClock::new());
    let c = clock.clone();
    let task = tokio::spawn(async move { c.sleep(Duration::from_secs(1)).await });
    clock.wait_for_sleepers(1).await;
    clock.advance(Duration::from_secs(1));
    task.await.unwrap();
}
