//! Tests of the session store driven on tokio's paused clock: keys, capacity, admission, end, expiry and
//! tombstones.

use secrecy::{ExposeSecret, SecretString};
use serde_json::json;

use super::*;
use crate::error::ApiErrorKind;

fn store(grants: bool) -> SessionStore {
    SessionStore::new(
        SessionLimits {
            max_sessions: 2,
            max_stored_tokens: 100,
            session_timeout: Duration::from_secs(60),
            max_tombstones: 2,
            retry_after_seconds: 3,
            max_generations_per_session: 2,
            ..SessionLimits::default()
        },
        grants,
    )
}

fn admin() -> SecretString {
    SecretString::from("admin")
}

fn kind<T: std::fmt::Debug>(r: Result<T, ApiError>) -> ApiErrorKind {
    r.expect_err("an error").kind
}

#[tokio::test(start_paused = true)]
async fn keys_capacity_and_conflicts() {
    let now = Instant::now();
    let mut s = store(true);
    let err = s
        .start("t", None, &admin(), json!({}), now)
        .expect_err("no capacity");
    assert_eq!((err.kind, err.retry_after), (ApiErrorKind::RateLimited, Some(3)));
    assert_eq!(s.grant(3), Some(3));
    let (id, key) = s.start("17:3", None, &admin(), json!({}), now).expect("starts");
    assert!(id.starts_with("17:3-") && id.len() == "17:3-".len() + 16, "{id}");
    assert!(key.expose_secret().len() > 10);
    assert_eq!(s.session_for_key(&key).as_deref(), Some(&*id));
    assert_eq!(
        kind(s.start("t", Some(admin()), &admin(), json!({}), now)),
        ApiErrorKind::InvalidRequest
    );
    assert_eq!(
        kind(s.start("t", Some(key.clone()), &admin(), json!({}), now)),
        ApiErrorKind::Conflict
    );
    assert_eq!(
        kind(s.start("bad id", None, &admin(), json!({}), now)),
        ApiErrorKind::InvalidRequest
    );
    let given = SecretString::from("my-key");
    let (id2, _) = s
        .start("t", Some(given.clone()), &admin(), json!({}), now)
        .expect("starts");
    assert_eq!(
        kind(s.start("t", None, &admin(), json!({}), now)),
        ApiErrorKind::RateLimited,
        "max sessions"
    );
    // Ending frees the key at once: it can be reused for a new session.
    let summary = s.end(&id2, now).expect("ends");
    assert_eq!(summary.interaction_count, 0);
    assert!(s.session_for_key(&given).is_none());
    assert_eq!(kind(s.active_mut(&id2, now)), ApiErrorKind::Gone);
    let taken = s.take(&id2).expect("export");
    assert_eq!(taken.id, id2);
    assert_eq!(kind(s.get_mut(&id2)), ApiErrorKind::Gone, "tombstoned");
    let (id3, _) = s
        .start("t", Some(given.clone()), &admin(), json!({}), now)
        .expect("key reusable");
    assert_eq!(s.session_for_key(&given).as_deref(), Some(&*id3));
    assert_eq!(kind(s.get_mut("never")), ApiErrorKind::NotFound);
}

#[tokio::test(start_paused = true)]
async fn admission_reserves_tokens_and_idle_sessions_expire() {
    let mut s = store(false);
    let (id, key) = s
        .start(
            "t",
            None,
            &admin(),
            json!({"generation_args": {"temperature": 0.5}}),
            Instant::now(),
        )
        .expect("starts");
    assert_eq!(
        s.get_mut(&id).expect("live").generation_defaults["temperature"],
        json!(0.5)
    );
    s.admit(&id, 80, Instant::now()).expect("fits");
    assert_eq!(kind(s.admit(&id, 30, Instant::now())), ApiErrorKind::RateLimited);
    tokio::time::advance(Duration::from_secs(120)).await;
    assert!(
        s.sweep(Instant::now()).is_empty(),
        "a running generation keeps its session alive"
    );
    assert!(!s.complete(&id, 80, None, Instant::now()));
    assert_eq!(s.reserved_tokens(), 0);
    tokio::time::advance(Duration::from_secs(59)).await;
    assert!(s.sweep(Instant::now()).is_empty());
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(s.sweep(Instant::now()), vec![id.clone()]);
    assert!(s.session_for_key(&key).is_none());
    let err = s.get_mut(&id).expect_err("gone");
    assert_eq!(err.kind, ApiErrorKind::Gone);
    assert!(err.message.contains("expired"), "{}", err.message);
}

#[tokio::test(start_paused = true)]
async fn tombstones_are_bounded() {
    let mut s = store(false);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let (id, _) = s
            .start("t", None, &admin(), json!({}), Instant::now())
            .expect("starts");
        s.end(&id, Instant::now()).expect("ends");
        s.take(&id).expect("exports");
        ids.push(id);
    }
    assert_eq!(
        kind(s.get_mut(&ids[0])),
        ApiErrorKind::NotFound,
        "the oldest tombstone was dropped"
    );
    assert_eq!(kind(s.get_mut(&ids[2])), ApiErrorKind::Gone);
}

#[tokio::test(start_paused = true)]
async fn a_session_has_at_most_its_limit_of_generations_in_flight() {
    let mut s = store(false);
    let (a, _) = s
        .start("a", None, &admin(), json!({}), Instant::now())
        .expect("starts");
    let (b, _) = s
        .start("b", None, &admin(), json!({}), Instant::now())
        .expect("starts");
    s.admit(&a, 1, Instant::now()).expect("first");
    s.admit(&a, 1, Instant::now()).expect("second");
    let refused = s.admit(&a, 1, Instant::now()).expect_err("third");
    assert_eq!(refused.kind, ApiErrorKind::RateLimited);
    assert!(
        refused.message.contains("2 generations in flight"),
        "{}",
        refused.message
    );
    assert_eq!(s.reserved_tokens(), 2, "the refusal reserves nothing");
    s.admit(&b, 1, Instant::now())
        .expect("another session is not limited by it");
    s.complete(&a, 1, None, Instant::now());
    s.admit(&a, 1, Instant::now())
        .expect("a finished generation frees its slot");
}
