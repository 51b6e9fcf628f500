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

/// Reads every scalar of an event directory with TensorBoard's own `EventAccumulator` (which checks both
/// CRCs of every record) and prints `{tag: [[step, value], ...]}`.
const TENSORBOARD_READ: &str = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}))
"#;

#[test]
fn tensorboards_event_reader_reads_every_scalar() {
    let Some(python) = std::env::var_os("ARENA_RL_PY_READERS") else {
        eprintln!(
            "skipping: ARENA_RL_PY_READERS is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut w = EventWriter::create(dir.path(), "host").unwrap();
    let mut written = Vec::new();
    for step in 0..40i64 {
        // Values whose f32 rounding shows: TensorBoard must read back exactly the f32 written.
        let values = [
            ("rollout/reward".to_string(), 1.0 / (step as f64 + 3.0)),
            ("train/loss".to_string(), -0.1 * step as f64),
        ];
        w.scalars(step * 7, &values).unwrap();
        written.push((step * 7, values));
    }
    drop(w);
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(TENSORBOARD_READ)
        .arg(dir.path())
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "TensorBoard's reader failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the script prints JSON");
    let mut tags: Vec<&str> = read.as_object().unwrap().keys().map(String::as_str).collect();
    tags.sort_unstable();
    assert_eq!(tags, ["rollout/reward", "train/loss"]);
    for (i, tag) in ["rollout/reward", "train/loss"].into_iter().enumerate() {
        let got: Vec<(i64, f32)> = read[tag]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_i64().unwrap(), p[1].as_f64().unwrap() as f32))
            .collect();
        let want: Vec<(i64, f32)> = written.iter().map(|(s, v)| (*s, v[i].1 as f32)).collect();
        assert_eq!(got, want, "{tag}");
    }
}
