//! tfevents: CRC-32C vectors, record framing, and a written file read back.

use super::*;

#[test]
fn crc32c_matches_the_standard_check_value() {
    // RFC 3720's check value for "123456789".
    assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    assert_eq!(crc32c(b""), 0);
}

#[test]
fn records_frame_length_and_data_with_masked_crcs() {
    let r = record(b"abc");
    assert_eq!(r.len(), 8 + 4 + 3 + 4);
    assert_eq!(&r[..8], &3u64.to_le_bytes());
    assert_eq!(&r[8..12], &masked_crc32c(&3u64.to_le_bytes()).to_le_bytes());
    assert_eq!(&r[12..15], b"abc");
    assert_eq!(&r[15..], &masked_crc32c(b"abc").to_le_bytes());
}

#[test]
fn an_event_file_reads_back_with_its_version_and_scalars() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = EventWriter::create(dir.path(), "host").unwrap();
    w.scalars(3, &[("rollout/reward".into(), 0.25), ("train/loss".into(), -1.5)])
        .unwrap();
    w.scalars(400, &[("rollout/reward".into(), 0.75)]).unwrap();
    let path = w.path().to_path_buf();
    drop(w);
    let name = path.file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("events.out.tfevents.") && name.ends_with(".host"),
        "{name}"
    );
    let events = read_events(&path).unwrap();
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    let scalars: Vec<(i64, String, f32)> = events[1..]
        .iter()
        .flat_map(|e| e.scalars.iter().map(move |(t, v)| (e.step, t.clone(), *v)))
        .collect();
    assert_eq!(
        scalars,
        [
            (3, "rollout/reward".to_string(), 0.25),
            (3, "train/loss".to_string(), -1.5),
            (400, "rollout/reward".to_string(), 0.75)
        ]
    );
}

#[test]
fn a_flipped_byte_fails_the_crc() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = EventWriter::create(dir.path(), "h").unwrap();
    w.scalars(1, &[("x".into(), 1.0)]).unwrap();
    let path = w.path().to_path_buf();
    drop(w);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 6;
    bytes[last] ^= 0x40;
    std::fs::write(&path, bytes).unwrap();
    let err = read_events(&path).unwrap_err().to_string();
    assert!(err.contains("bad data CRC"), "{err}");
}
