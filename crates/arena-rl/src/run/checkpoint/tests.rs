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

#[test]
fn a_checkpoint_whose_journal_segment_is_gone_or_short_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(&dir.path().join("j/journal-w0.jsonl")).unwrap();
    let segment = journal.rotate(0).unwrap();
    let (_, bytes) = journal.position().unwrap();
    let meta = |journal_segment, journal_bytes| CheckpointMeta {
        steps: 1,
        version: 1,
        model_path: "m".into(),
        model_fingerprint: "f".into(),
        data_cursor: 1,
        journal_bytes,
        journal_segment,
    };
    let check = |m: &CheckpointMeta| check_resume(Path::new("ckpt"), m, Path::new("m"), "f", &journal);
    check(&meta(segment, bytes)).unwrap();
    for (segment, bytes) in [(segment, bytes + 1), (segment + 1, 0)] {
        let err = check(&meta(segment, bytes)).unwrap_err();
        assert!(matches!(err, Error::JournalTruncated { .. }), "{err:?}");
        assert!(err.to_string().contains(&format!("segment {segment}")), "{err}");
    }
}
