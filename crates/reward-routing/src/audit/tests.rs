//! Tests of audit records and the shard writer (reference section 4.6; section 8.2 items 31, 33).

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};

use serde_json::{Value, json};

use super::*;

fn row() -> RowMeta {
    RowMeta {
        data_id: "row-3".into(),
        stream_name: "swe-bench".into(),
        stream_id: "stream-b".into(),
        task_type: "swe".into(),
        expected_reward_ref: RewardRef {
            key: "grader".into(),
            version: "2".into(),
        },
    }
}

fn record(raw: Value) -> AuditRecord {
    let task = TaskOutcome {
        raw,
        artifacts_uri: Some("s3://bucket/a".into()),
        trace_id: Some("trace-9".into()),
        computed_at: Some("2026-01-02T03:04:05Z".into()),
        ..TaskOutcome::new("task-77", TaskStatus::Done, Some(0.5))
    };
    AuditRecord::from_task(&row(), &task, Some(0.75))
}

fn parse(line: &str) -> Value {
    assert!(line.ends_with('\n'), "{line:?}");
    assert_eq!(line.matches('\n').count(), 1, "{line:?}");
    serde_json::from_str(line).expect("a JSON line")
}

fn lines_in(dir: &Path) -> Vec<Value> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .collect();
    names.sort();
    names
        .iter()
        .flat_map(|p| {
            fs::read_to_string(p)
                .expect("shard")
                .lines()
                .map(|l| serde_json::from_str(l).expect("whole JSON line"))
                .collect::<Vec<Value>>()
        })
        .collect()
}

#[test]
fn a_record_is_one_compact_line_with_the_reference_fields_in_order() {
    let line = record(json!({"log": "ünïcode ✓", "n": [1, 2.5, null]})).to_line(DEFAULT_MAX_RAW_BYTES);
    insta::assert_snapshot!(line);
    let value = parse(&line);
    let keys: Vec<&str> = value
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "arena_stream_name",
            "stream_id",
            "data_id",
            "task_id",
            "status",
            "expected_reward_ref",
            "arena_score",
            "training_score",
            "raw",
            "raw_present",
            "raw_size_bytes",
            "raw_truncated",
            "artifacts_uri",
            "trace_id",
            "computed_at",
            "arena_task_id",
            "session_id",
            "harness_outcome_code",
            "rejection_reason",
            "receipt_problem"
        ]
    );
}

#[test]
fn heterogeneous_raw_payloads_are_kept_verbatim_with_their_sizes() {
    let cases = [
        (Value::Null, false, 4),
        (json!({"a": {"b": [1, {"c": null}]}}), true, 26),
        (json!({"é": "ü"}), true, 11),
        (json!([1, "two", [3.5], {}]), true, 18),
        (json!("text"), true, 6),
        (json!(0), true, 1),
    ];
    for (raw, present, size) in cases {
        let value = parse(&record(raw.clone()).to_line(DEFAULT_MAX_RAW_BYTES));
        assert_eq!(value["raw"], raw);
        assert_eq!(value["raw_present"], present, "{raw}");
        assert_eq!(value["raw_size_bytes"], size, "{raw}");
        assert_eq!(value["raw_truncated"], false);
        // Sizes as Python computes them: len(json.dumps(raw, ensure_ascii=False, separators=(",", ":")).encode()).
        assert_eq!(serde_json::to_string(&raw).expect("json").len(), size);
    }
}

#[test]
fn raw_past_the_limit_is_written_as_null() {
    let raw = json!({"log": "x".repeat(100)});
    let size = serde_json::to_string(&raw).expect("json").len() as u64;
    let at_limit = parse(&record(raw.clone()).to_line(size));
    assert_eq!(at_limit["raw"], raw);
    assert_eq!(at_limit["raw_truncated"], false);
    let past = parse(&record(raw).to_line(size - 1));
    assert_eq!(past["raw"], Value::Null);
    assert_eq!(past["raw_present"], true);
    assert_eq!(past["raw_truncated"], true);
    assert_eq!(past["raw_size_bytes"], size);
}

#[test]
fn local_wait_records_carry_their_status_and_no_score() {
    let value = parse(&AuditRecord::local_wait(&row(), "task-1", true).to_line(10));
    assert_eq!(value["status"], "LOCAL_WAIT_CANCELLED");
    assert_eq!(value["arena_score"], Value::Null);
    assert_eq!(value["training_score"], Value::Null);
    assert_eq!(value["raw_present"], false);
    let timeout = parse(&AuditRecord::local_wait(&row(), "task-1", false).to_line(10));
    assert_eq!(timeout["status"], "LOCAL_WAIT_TIMEOUT");
}

#[test]
fn the_writer_creates_a_private_directory_and_shard() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("fileroot/exp/trial/arena_results");
    let writer = AuditWriter::new(AuditConfig::new(&dir)).expect("writer");
    assert!(!dir.exists(), "nothing is touched before the first record");
    assert!(writer.append(&record(json!({"k": 1}))));
    assert!(writer.append(&record(Value::Null)));

    for created in [
        "fileroot",
        "fileroot/exp",
        "fileroot/exp/trial",
        "fileroot/exp/trial/arena_results",
    ] {
        let mode = fs::metadata(root.path().join(created))
            .expect("dir")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700, "{created}");
    }
    let shard = dir.join(writer.shard_name(0));
    assert!(writer.shard_name(0).starts_with("arena_results_"));
    assert!(
        writer
            .shard_name(0)
            .ends_with(&format!("_{}.jsonl", std::process::id()))
    );
    assert_eq!(
        fs::metadata(&shard).expect("shard").permissions().mode() & 0o777,
        0o600
    );
    let lines = lines_in(&dir);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["raw"], json!({"k": 1}));
    assert_eq!(
        writer.stats(),
        AuditStats {
            written: 2,
            failed: 0
        }
    );
}

#[test]
fn existing_directories_and_shards_are_made_private() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("open");
    fs::create_dir(&dir).expect("dir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    let writer = AuditWriter::new(AuditConfig::new(&dir)).expect("writer");
    let shard = dir.join(writer.shard_name(0));
    fs::write(&shard, "{\"earlier\":true}\n").expect("shard");
    fs::set_permissions(&shard, fs::Permissions::from_mode(0o644)).expect("chmod");

    assert!(writer.append(&record(Value::Null)));
    assert_eq!(
        fs::metadata(&dir).expect("dir").permissions().mode() & 0o777,
        0o700
    );
    assert_eq!(
        fs::metadata(&shard).expect("shard").permissions().mode() & 0o777,
        0o600
    );
    let lines = lines_in(&dir);
    assert_eq!(lines.len(), 2, "appended, not truncated");
    assert_eq!(lines[0], json!({"earlier": true}));
}

#[test]
fn a_partial_line_left_behind_is_terminated_before_appending() {
    let root = tempfile::tempdir().expect("tempdir");
    let writer = AuditWriter::new(AuditConfig::new(root.path())).expect("writer");
    let shard = root.path().join(writer.shard_name(0));
    fs::write(&shard, "{\"half\":").expect("partial");
    assert!(writer.append(&record(Value::Null)));
    let text = fs::read_to_string(&shard).expect("shard");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0], "{\"half\":");
    assert_eq!(parse(&format!("{}\n", lines[1]))["task_id"], "task-77");
}

#[test]
fn symlinks_anywhere_on_the_path_are_refused_with_nothing_written() {
    let root = tempfile::tempdir().expect("tempdir");
    let real = root.path().join("real");
    fs::create_dir(&real).expect("real");
    symlink(&real, root.path().join("link")).expect("symlink");

    for dir in [root.path().join("link"), root.path().join("link/nested")] {
        let writer = AuditWriter::new(AuditConfig::new(&dir)).expect("writer");
        assert!(!writer.append(&record(Value::Null)), "{}", dir.display());
        let metric = writer.append_with_metric(&record(Value::Null), Scope::Rollout);
        assert_eq!(metric, Metric::new("rollout/arena/result_dump_success", 0.0));
        assert_eq!(
            writer.stats(),
            AuditStats {
                written: 0,
                failed: 2
            }
        );
        let error = writer.last_error().expect("error kept");
        assert!(error.contains("refusing to follow"), "{error}");
        assert_eq!(
            fs::read_dir(&real).expect("real").count(),
            0,
            "wrote through {}",
            dir.display()
        );
    }
}

#[test]
fn a_symlinked_shard_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("shards");
    fs::create_dir(&dir).expect("dir");
    let target = root.path().join("target.txt");
    fs::write(&target, "untouched").expect("target");
    let writer = AuditWriter::new(AuditConfig::new(&dir)).expect("writer");
    symlink(&target, dir.join(writer.shard_name(0))).expect("symlink");
    assert!(!writer.append(&record(Value::Null)));
    assert_eq!(fs::read_to_string(&target).expect("target"), "untouched");
    assert!(writer.last_error().expect("error").contains("symlink"));
}

#[test]
fn directories_and_shards_owned_by_someone_else_are_refused() {
    let euid = rustix::process::geteuid().as_raw();
    let root = tempfile::tempdir().expect("tempdir");
    // Only root can give a file away; other users test against `/`, which root owns.
    let foreign_dir = if euid == 0 {
        let dir = root.path().join("foreign");
        fs::create_dir(&dir).expect("dir");
        std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).expect("chown");
        dir
    } else {
        PathBuf::from("/")
    };
    let writer = AuditWriter::new(AuditConfig::new(&foreign_dir)).expect("writer");
    assert!(!writer.append(&record(Value::Null)));
    assert!(
        writer
            .last_error()
            .expect("error")
            .contains("must be owned by uid")
    );

    if euid == 0 {
        let dir = root.path().join("mine");
        fs::create_dir(&dir).expect("dir");
        let writer = AuditWriter::new(AuditConfig::new(&dir)).expect("writer");
        let shard = dir.join(writer.shard_name(0));
        fs::write(&shard, "").expect("shard");
        std::os::unix::fs::chown(&shard, Some(65534), Some(65534)).expect("chown");
        assert!(!writer.append(&record(Value::Null)));
        assert!(
            writer
                .last_error()
                .expect("error")
                .contains("must be owned by uid")
        );
        assert_eq!(fs::read_to_string(&shard).expect("shard"), "");
    }
}

#[test]
fn a_shard_that_is_not_a_regular_file_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let writer = AuditWriter::new(AuditConfig::new(root.path())).expect("writer");
    fs::create_dir(root.path().join(writer.shard_name(0))).expect("dir in the way");
    assert!(!writer.append(&record(Value::Null)));
    assert_eq!(writer.stats().failed, 1);
}

#[test]
fn shards_rotate_at_the_configured_size() {
    let root = tempfile::tempdir().expect("tempdir");
    let line_len = record(json!({"i": 0})).to_line(DEFAULT_MAX_RAW_BYTES).len() as u64;
    let config = AuditConfig {
        rotate_bytes: Some(line_len * 3 + 1),
        ..AuditConfig::new(root.path())
    };
    let writer = AuditWriter::new(config).expect("writer");
    for i in 0..10 {
        assert!(writer.append(&record(json!({"i": i}))));
    }
    let mut sizes = Vec::new();
    for index in 0..4 {
        let path = root.path().join(writer.shard_name(index));
        sizes.push(fs::metadata(&path).expect("shard").len() / line_len);
    }
    assert_eq!(sizes, [3, 3, 3, 1]);
    assert!(!root.path().join(writer.shard_name(4)).exists());
    let order: Vec<Value> = lines_in(root.path())
        .iter()
        .map(|l| l["raw"]["i"].clone())
        .collect();
    assert_eq!(order.len(), 10);
    let mut sorted: Vec<i64> = order.iter().map(|v| v.as_i64().expect("int")).collect();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>());

    // A record larger than the rotation size still gets written, alone in a fresh shard.
    let big = record(json!({"log": "y".repeat(2000)}));
    assert!(writer.append(&big));
    let big_shard = fs::read_to_string(root.path().join(writer.shard_name(4))).expect("shard");
    assert_eq!(big_shard.lines().count(), 1);
}

#[test]
fn a_restarted_writer_skips_shards_that_are_already_full() {
    let root = tempfile::tempdir().expect("tempdir");
    let config = AuditConfig {
        rotate_bytes: Some(100),
        ..AuditConfig::new(root.path())
    };
    let writer = AuditWriter::new(config.clone()).expect("writer");
    fs::write(
        root.path().join(writer.shard_name(0)),
        format!("{}\n", "z".repeat(150)),
    )
    .expect("full");
    assert!(writer.append(&record(Value::Null)));
    let next = fs::read_to_string(root.path().join(writer.shard_name(1))).expect("next shard");
    assert_eq!(next.lines().count(), 1);
}

#[test]
fn one_writer_per_directory_is_shared_within_the_process() {
    let root = tempfile::tempdir().expect("tempdir");
    let first = AuditWriter::shared(AuditConfig::new(root.path().join("a"))).expect("first");
    let second = AuditWriter::shared(AuditConfig::new(root.path().join("./a"))).expect("second");
    assert!(Arc::ptr_eq(&first, &second));
    let other = AuditWriter::shared(AuditConfig::new(root.path().join("b"))).expect("other");
    assert!(!Arc::ptr_eq(&first, &other));
    let conflicting = AuditWriter::shared(AuditConfig {
        max_raw_bytes: 5,
        ..AuditConfig::new(root.path().join("a"))
    });
    assert!(matches!(conflicting, Err(Error::InvalidConfig(_))));
    drop((first, second));
    let fresh = AuditWriter::shared(AuditConfig {
        max_raw_bytes: 5,
        ..AuditConfig::new(root.path().join("a"))
    })
    .expect("the old writer is gone");
    assert_eq!(fresh.dir(), root.path().join("a"));
}

#[test]
fn bad_settings_are_reported_together() {
    let config = AuditConfig {
        dir: PathBuf::from("/tmp/../etc"),
        max_raw_bytes: 0,
        rotate_bytes: Some(0),
    };
    insta::assert_snapshot!(AuditWriter::new(config).expect_err("invalid").to_string());
    let empty = AuditWriter::new(AuditConfig::new("")).expect_err("empty");
    assert_eq!(empty.to_string(), "arena_result_dump_dir must not be empty");
}

#[test]
fn task_ids_since_a_position_read_complete_records_on_through_rotation() {
    let root = tempfile::tempdir().expect("tempdir");
    let with_id = |id: &str| {
        let mut r = record(Value::Null);
        r.task_id = id.into();
        r
    };
    let line_len = with_id("t-0").to_line(DEFAULT_MAX_RAW_BYTES).len() as u64;
    let config = AuditConfig {
        rotate_bytes: Some(line_len * 2),
        ..AuditConfig::new(root.path())
    };
    let writer = AuditWriter::new(config).expect("writer");
    assert_eq!(writer.position().offset, 0, "nothing opened yet");
    assert!(writer.append(&with_id("t-0")));
    let at = writer.position();
    assert_eq!((at.index, at.offset), (0, line_len));
    for id in ["t-1", "t-2", "t-3"] {
        assert!(writer.append_line(&writer.line(&with_id(id)), id));
    }
    // A killed write's unfinished line at the end is no record.
    let torn = writer.line(&with_id("t-torn"));
    let last = root.path().join(writer.shard_name(1));
    let mut text = fs::read_to_string(&last).expect("shard");
    text.push_str(&torn[..torn.len() - 1]);
    fs::write(&last, text).expect("write");
    let ids = at.task_ids_since().expect("read");
    assert_eq!(ids.into_iter().collect::<Vec<_>>(), ["t-1", "t-2", "t-3"]);
    let gone = AuditPosition {
        dir: root.path().join("none"),
        ..at
    };
    assert!(
        gone.task_ids_since()
            .expect("a missing shard holds none")
            .is_empty()
    );
}

#[test]
fn integrity_hits_are_on_the_line_only_when_there_are_some() {
    let line = |r: AuditRecord| serde_json::from_str::<Value>(&r.to_line(1000)).unwrap();
    assert_eq!(line(record(Value::Null)).get("integrity_hits"), None);
    let hit = crate::IntegrityFinding {
        rule: "git-reflog".into(),
        matched: "git reflog".into(),
    };
    let with = line(record(Value::Null).with_integrity_hits(vec![hit]));
    assert_eq!(
        with["integrity_hits"],
        serde_json::json!([{"rule": "git-reflog", "matched": "git reflog"}])
    );
}
