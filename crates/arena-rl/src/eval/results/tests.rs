//! Appending, reading back, torn lines and repeated samples.

use super::*;

fn line(key: &str, reward: Option<f64>) -> ResultLine {
    ResultLine {
        key: key.into(),
        stream: "s".into(),
        domain: "max".into(),
        task_id: "env:a@1".into(),
        sample: 0,
        arena_task: Some("task-1".into()),
        status: Some("DONE".into()),
        reward,
        passed: reward.map(|r| r > 0.0),
        disposition: "success".into(),
    }
}

#[test]
fn lines_are_appended_once_and_read_back_after_a_torn_tail_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("results.jsonl");
    let mut f = ResultsFile::open(&path).unwrap();
    assert_eq!(
        f.append(vec![line("e0g0:0", Some(1.0)), line("e0g1:0", None)])
            .unwrap(),
        2
    );
    assert_eq!(
        f.append(vec![line("e0g0:0", Some(1.0)), line("e0g2:0", Some(0.0))])
            .unwrap(),
        1
    );
    drop(f);
    // A kill in the middle of a write leaves a fragment without its newline.
    let mut text = std::fs::read_to_string(&path).unwrap();
    let whole = text.len();
    text.push_str("{\"key\":\"e0g3:0\",\"str");
    std::fs::write(&path, &text).unwrap();
    let mut f = ResultsFile::open(&path).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), whole as u64);
    let keys: Vec<&str> = f.lines().iter().map(|l| l.key.as_str()).collect();
    assert_eq!(keys, ["e0g0:0", "e0g1:0", "e0g2:0"]);
    assert!(f.holds("e0g1:0") && !f.holds("e0g3:0"));
    assert_eq!(f.append(vec![line("e0g3:0", Some(1.0))]).unwrap(), 1);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 4);
    assert_eq!(f.lines()[1].sample().scored, None);
    assert_eq!(f.lines()[0].sample().scored, Some((1.0, true)));
}

#[test]
fn a_corrupt_complete_line_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("results.jsonl");
    std::fs::write(&path, "not json\n").unwrap();
    let e = ResultsFile::open(&path).err().expect("corrupt").to_string();
    assert!(e.contains("results.jsonl line 1: not an eval result"), "{e}");
}
