//! The model fingerprint: an unreadable config.json is an error, never the fingerprint of an empty file.

use super::*;

#[test]
fn a_fingerprint_needs_a_readable_config() {
    let dir = tempfile::tempdir().unwrap();
    let err = model_fingerprint(dir.path()).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("config.json"), "{err}");
    std::fs::write(dir.path().join("config.json"), "{\"hidden_size\": 8}").unwrap();
    let a = model_fingerprint(dir.path()).unwrap();
    assert_eq!(a.len(), 16);
    std::fs::write(dir.path().join("config.json"), "{\"hidden_size\": 16}").unwrap();
    assert_ne!(
        model_fingerprint(dir.path()).unwrap(),
        a,
        "another architecture, another fingerprint"
    );
}
