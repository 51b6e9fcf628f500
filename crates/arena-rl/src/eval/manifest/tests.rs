//! The manifest's parsing and the reference's selection rules, message by message.

use arena_client::DatasetRow;
use stream_config::{LlmProtocol, RewardRef};

use super::*;

fn row(stream: &str, data_id: &str, domain: &str) -> PromptRow {
    PromptRow {
        stream: stream.into(),
        row: DatasetRow {
            data_id: data_id.into(),
            stream_id: format!("{stream}-id"),
            llm_protocol: LlmProtocol::Anthropic,
            arena_task_type: domain.into(),
            base_commit: None,
        },
        reward_ref: RewardRef::new("grader", "1"),
    }
}

fn ids(rows: &[&str]) -> Vec<String> {
    rows.iter().map(|s| s.to_string()).collect()
}

/// Selects `selected` from a stream of `source` ids and checks the outcome: the selected data ids, or the
/// reference's message.
fn check(source: &[&str], selected: &[&str], want: Result<&[&str], &str>) {
    let rows: Vec<PromptRow> = source.iter().map(|id| row("s", id, "max")).collect();
    let got = select_evaluation_rows(&rows, &ids(selected));
    match (got, want) {
        (Ok(rows), Ok(want)) => {
            let got: Vec<&str> = rows.iter().map(|r| r.row.data_id.as_str()).collect();
            assert_eq!(got, want, "{source:?} / {selected:?}");
        }
        (Err(e), Err(want)) => assert_eq!(e.message, want, "{source:?} / {selected:?}: {e}"),
        (got, want) => panic!("{source:?} / {selected:?}: got {got:?}, want {want:?}"),
    }
}

#[test]
fn selection_follows_the_reference() {
    let stream = ["env:a@new", "env:b@v1", "env:c@v3"];
    // Manifest order, and an older version of a listed environment pinned (test_evaluation_pins_historical_
    // version_and_preserves_stream_routing).
    check(
        &stream,
        &["env:b@v1", "env:a@old"],
        Ok(&["env:b@v1", "env:a@old"]),
    );
    check(&stream, &[], Err(NOT_A_LIST));
    check(&stream, &[""], Err(NOT_A_LIST));
    check(&stream, &["env:a@1", "env:a@1"], Err(DUPLICATE_IDS));
    check(&stream, &["a@1"], Err(NOT_ENV_REF));
    check(&stream, &["env:a"], Err(NOT_ENV_REF));
    check(&stream, &["env:a@1@2"], Err(NOT_ENV_REF));
    check(&stream, &["env:@1"], Err(NOT_ENV_REF));
    check(&stream, &["env:a@"], Err(NOT_ENV_REF));
    check(&["env:a@1", "plain-row"], &["env:a@1"], Err(NOT_ENV_REF));
    check(&["env:a@1", "env:a@2"], &["env:a@1"], Err(SOURCE_KEYS_NOT_UNIQUE));
    check(&stream, &["env:a@1", "env:a@2"], Err(SELECTION_KEYS_NOT_UNIQUE));
    check(&stream, &["env:a@1", "env:z@1"], Err(ABSENT_ENVS));
}

#[test]
fn selected_rows_keep_their_stream_and_type_and_the_source_is_untouched() {
    let rows = vec![row("s", "env:a@new", "max"), row("s", "env:b@v1", "min")];
    let before = rows.clone();
    let got = select_evaluation_rows(&rows, &ids(&["env:b@v1", "env:a@old"])).expect("valid");
    assert_eq!(rows, before);
    assert_eq!(got[1].row.arena_task_type, "max");
    assert_eq!(got[1].row.stream_id, "s-id");
    assert_eq!(got[1].stream, "s");
    assert_eq!(got[0].row.arena_task_type, "min");
}

#[test]
fn task_indices_follow_the_reference() {
    let stream = ids(&["x", "y", "z"]);
    assert_eq!(select_task_indices(&stream, &ids(&["z", "x"])), Ok(vec![2, 0]));
    let message = |data: &[&str], sel: &[&str]| {
        select_task_indices(&ids(data), &ids(sel))
            .expect_err("invalid")
            .message
    };
    assert_eq!(message(&["x"], &[]), NOT_A_LIST);
    assert_eq!(message(&["x"], &["x", "x"]), DUPLICATE_IDS);
    assert_eq!(message(&["x", "x"], &["x"]), STREAM_NOT_UNIQUE);
    let absent = select_task_indices(&stream, &ids(&["x", "w"])).expect_err("absent");
    assert_eq!(absent.to_string(), format!("{ABSENT_IDS} (w)"));
}

#[test]
fn manifests_parse_from_the_reference_list_or_an_object() {
    let parse = |text: &str| Manifest::from_json(text, "m.json");
    assert_eq!(
        parse(r#"["env:a@1", "env:b@2"]"#).expect("list"),
        Manifest::Tasks {
            stream: None,
            tasks: ids(&["env:a@1", "env:b@2"])
        }
    );
    assert_eq!(
        parse(r#"{"stream": "s", "tasks": ["env:a@1"]}"#).expect("object"),
        Manifest::Tasks {
            stream: Some("s".into()),
            tasks: ids(&["env:a@1"])
        }
    );
    assert_eq!(
        parse(r#"{"streams": ["s", "t"]}"#).expect("streams"),
        Manifest::Streams(ids(&["s", "t"]))
    );
    for (text, phrase) in [
        ("[]", NOT_A_LIST),
        (r#"["env:a@1", 3]"#, NOT_A_LIST),
        (r#"[""]"#, NOT_A_LIST),
        (r#""env:a@1""#, NOT_A_LIST),
        (r#"{"tasks": []}"#, NOT_A_LIST),
        (r#"{"tasks": ["env:a@1"], "streams": ["s"]}"#, "not both"),
        (r#"{"stream": "s", "streams": ["s"]}"#, "not both"),
        (r#"{"task": ["env:a@1"]}"#, "unknown field \"task\""),
        (r#"{"streams": []}"#, "nonempty list of stream names"),
        (r#"{"streams": ["s", "s"]}"#, "twice"),
        ("[", "not JSON"),
    ] {
        let e = parse(text).expect_err(text).to_string();
        assert!(e.starts_with("eval manifest m.json: "), "{text}: {e}");
        assert!(e.contains(phrase), "{text}: {e}");
    }
}

#[test]
fn a_manifest_selects_from_the_streams_it_names() {
    let streams = vec![
        (
            "s".to_string(),
            vec![row("s", "env:a@1", "max"), row("s", "env:b@1", "max")],
        ),
        ("t".to_string(), vec![row("t", "env:a@1", "min")]),
    ];
    let tasks = |stream: Option<&str>| Manifest::Tasks {
        stream: stream.map(str::to_string),
        tasks: ids(&["env:a@1"]),
    };
    let e = tasks(None).select(&streams, "m.json").expect_err("two streams");
    assert!(e.to_string().contains(ONE_STREAM), "{e}");
    let got = tasks(Some("t")).select(&streams, "m.json").expect("named");
    assert_eq!(got, vec![row("t", "env:a@1", "min")]);
    let got = tasks(None).select(&streams[..1], "m.json").expect("one stream");
    assert_eq!(got, vec![row("s", "env:a@1", "max")]);
    let e = tasks(Some("u")).select(&streams, "m.json").expect_err("unknown");
    assert!(e.to_string().contains("\"u\" is not a healthy stream"), "{e}");
    let all = Manifest::Streams(ids(&["t", "s"]))
        .select(&streams, "m.json")
        .expect("streams");
    let got: Vec<(&str, &str)> = all
        .iter()
        .map(|r| (r.stream.as_str(), r.row.data_id.as_str()))
        .collect();
    assert_eq!(got, [("t", "env:a@1"), ("s", "env:a@1"), ("s", "env:b@1")]);
}
