//! Tests of the preparation pool's admission: a full pool and queue refuse at once with 503, a freed
//! place serves again, and a panic in the work is a 500 that leaves the pool whole.

use std::sync::mpsc;
use std::time::Duration;

use super::*;

fn pool(threads: usize, queue: usize) -> Arc<WorkPool> {
    Arc::new(WorkPool::new(PoolLimits { threads, queue }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_and_queue_refuse_at_once_and_a_freed_place_serves() {
    let pool = pool(1, 1);
    let (release, held) = mpsc::channel::<()>();
    let (started, running) = mpsc::channel::<()>();
    let busy = {
        let pool = Arc::clone(&pool);
        tokio::spawn(async move {
            pool.run(move || {
                started.send(()).expect("the test waits");
                held.recv().expect("the test releases");
                Ok(1)
            })
            .await
        })
    };
    running
        .recv_timeout(Duration::from_secs(10))
        .expect("the work started");
    let waiting = {
        let pool = Arc::clone(&pool);
        tokio::spawn(async move { pool.run(|| Ok(2)).await })
    };
    while pool.held() < 2 {
        tokio::task::yield_now().await;
    }
    let refused = pool.run(|| Ok(3)).await.expect_err("no room");
    assert_eq!(refused.kind, ApiErrorKind::Overloaded);
    assert_eq!(refused.kind.status().as_u16(), 503);
    assert_eq!(refused.retry_after, Some(1));
    release.send(()).expect("the work waits");
    assert_eq!(busy.await.expect("joins").expect("served"), 1);
    assert_eq!(waiting.await.expect("joins").expect("served"), 2);
    assert_eq!(pool.held(), 0);
    assert_eq!(pool.run(|| Ok(4)).await.expect("room again"), 4);
}

#[tokio::test]
async fn a_panic_in_the_work_is_a_500_and_frees_its_place() {
    let pool = pool(1, 0);
    let failed = pool
        .run(|| -> Result<(), ApiError> { panic!("a bug in a parser") })
        .await
        .expect_err("the panic is an error");
    assert_eq!(failed.kind, ApiErrorKind::Internal);
    assert!(!failed.message.contains("a bug"), "{}", failed.message);
    assert_eq!(pool.held(), 0);
    assert_eq!(pool.run(|| Ok(5)).await.expect("served"), 5);
}

#[test]
fn a_pool_without_threads_is_refused() {
    let err = PoolLimits { threads: 0, queue: 4 }
        .validate()
        .expect_err("refused");
    assert!(err.contains("at least 1 thread"), "{err}");
    assert!(PoolLimits { threads: 1, queue: 0 }.validate().is_ok());
    assert!(PoolLimits::default().threads >= 1);
    assert_eq!(PoolLimits::default().queue, 1024);
}
