//! Context wrapping keeps the typed error underneath and reads as one line.

use super::*;

#[test]
fn context_wraps_and_root_unwraps() {
    let io: std::io::Result<()> = Err(std::io::Error::other("disk full"));
    let err = io.context("cannot write metrics.jsonl").unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert_eq!(err.to_string(), "cannot write metrics.jsonl: disk full");
    let outer: Result<()> = Err(err);
    let wrapped = outer.with_context(|| "step 3").unwrap_err();
    assert_eq!(
        wrapped.to_string(),
        "step 3: cannot write metrics.jsonl: disk full"
    );
    assert!(matches!(wrapped.root(), Error::Io { .. }));
}

#[test]
fn the_user_facing_failures_are_one_line() {
    let err = Error::NoHealthyStream(vec!["a (paused)".into(), "b (no reward ref)".into()]);
    assert_eq!(
        err.to_string(),
        "every stream is unhealthy: a (paused); b (no reward ref)"
    );
    let err = Error::ProxyPort {
        addr: "127.0.0.1:9".parse().unwrap(),
        reason: "address in use".into(),
    };
    assert!(!err.to_string().contains('\n'));
}
