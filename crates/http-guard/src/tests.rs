//! Tests of the connection watchdog's deadlines on tokio's paused clock, of the limits' validation, and
//! of finding a body refusal inside the errors that wrap it.

use super::*;

fn limits() -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_secs(3),
        body_read_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(10),
        max_body_bytes: 100,
        max_connections: 2,
        write_timeout: Duration::from_secs(7),
        max_head_bytes: 64 * 1024,
    }
}

#[tokio::test(start_paused = true)]
async fn each_phase_has_its_own_deadline() {
    let limits = limits();
    let watch = Arc::new(Watchdog::new());
    let accepted = Instant::now();
    // Fresh: the first request's head is due a header timeout after the accept.
    assert_eq!(
        watch.deadline(&limits),
        Some(accepted + limits.header_read_timeout)
    );

    tokio::time::advance(Duration::from_secs(1)).await;
    let first_byte = Instant::now();
    watch.bytes_arrived();
    assert_eq!(
        watch.deadline(&limits),
        Some(first_byte + limits.header_read_timeout)
    );
    // Later bytes of the same head do not move it.
    tokio::time::advance(Duration::from_secs(1)).await;
    watch.bytes_arrived();
    assert_eq!(
        watch.deadline(&limits),
        Some(first_byte + limits.header_read_timeout)
    );

    // Handling a request (and writing its response) has no connection deadline, bytes or not.
    let busy = watch.begin();
    tokio::time::advance(Duration::from_secs(60)).await;
    watch.bytes_arrived();
    assert_eq!(watch.deadline(&limits), None);

    // Written out: idle, with the idle timeout, until the next head's first byte.
    drop(busy);
    let idle = Instant::now();
    assert_eq!(watch.deadline(&limits), Some(idle + limits.idle_timeout));
    tokio::time::advance(Duration::from_secs(9)).await;
    watch.bytes_arrived();
    assert_eq!(
        watch.deadline(&limits),
        Some(Instant::now() + limits.header_read_timeout)
    );
}

#[tokio::test(start_paused = true)]
async fn a_stalled_write_has_the_write_deadline_in_every_phase() {
    let limits = limits();
    let watch = Arc::new(Watchdog::new());
    let busy = watch.begin();
    assert_eq!(watch.deadline(&limits), None);
    tokio::time::advance(Duration::from_secs(1)).await;
    let stalled = Instant::now();
    watch.write_stalled(true);
    assert_eq!(watch.deadline(&limits), Some(stalled + limits.write_timeout));
    // Bytes written clear it; the next stall starts its own clock.
    tokio::time::advance(Duration::from_secs(5)).await;
    watch.write_stalled(false);
    assert_eq!(watch.deadline(&limits), None);
    tokio::time::advance(Duration::from_secs(5)).await;
    watch.write_stalled(true);
    assert_eq!(
        watch.deadline(&limits),
        Some(Instant::now() + limits.write_timeout)
    );
    // Idle with a stalled write (a response's last bytes in flight): the earlier deadline wins.
    drop(busy);
    assert_eq!(
        watch.deadline(&limits),
        Some(Instant::now() + limits.write_timeout)
    );
}

#[test]
fn limits_default_to_the_documented_values_and_must_be_positive() {
    let d = ConnectionLimits::default();
    assert_eq!(d.header_read_timeout, Duration::from_secs(30));
    assert_eq!(d.body_read_timeout, Duration::from_secs(60));
    assert_eq!(d.idle_timeout, Duration::from_secs(120));
    assert_eq!(d.max_body_bytes, 32 * 1024 * 1024);
    assert_eq!(d.max_connections, 4096);
    assert_eq!(d.write_timeout, Duration::from_secs(60));
    assert_eq!(d.validate(), Ok(()));
    let zero = ConnectionLimits {
        idle_timeout: Duration::ZERO,
        max_connections: 0,
        ..limits()
    };
    assert_eq!(
        zero.validate(),
        Err("connection limits must be positive: idle_timeout, max_connections".to_string())
    );
    assert_eq!(d.max_head_bytes, 64 * 1024);
    let tiny = ConnectionLimits {
        max_head_bytes: 4096,
        ..limits()
    };
    assert_eq!(
        tiny.validate(),
        Err("max_head_bytes must be at least 8192, got 4096".to_string())
    );
}

#[test]
fn a_refusal_is_found_through_the_errors_that_wrap_it() {
    let refused = BodyRefused::TimedOut(Duration::from_millis(1500));
    let boxed: BoxError = Box::new(refused);
    let wrapped = axum::Error::new(boxed);
    assert_eq!(BodyRefused::find(&wrapped), Some(refused));
    assert_eq!(refused.to_string(), "the request body did not arrive within 1.5s");
    assert_eq!(refused.status(), StatusCode::REQUEST_TIMEOUT);
    let other = std::io::Error::other("reset");
    assert_eq!(BodyRefused::find(&other), None);
}
