//! The shell task: scripts from tags, the simulated tool, the grade, and the replaying side.

use serde_json::json;

use super::*;

fn call(command: &str) -> ToolCall {
    ToolCall {
        id: String::new(),
        name: SHELL_TOOL.into(),
        arguments: json!({ "command": command }),
    }
}

#[test]
fn a_script_round_trips_from_tags_through_the_prompt_and_its_replay() {
    let commands = [
        "git status",
        "bash -lc \"git log --all\"\n  | head",
        "echo 'done'",
    ];
    let tags = json!(ShellTask::tags(&commands));
    let task = ShellTask::from_tags("r1", &tags).expect("a script");
    assert_eq!(task.commands, commands);
    assert_eq!(ShellTask::from_tags("r2", &json!(["domain:shell"])), None);
    // A rendered conversation: the prompt, then each result, then the end of turn.
    let mut prompt = format!("<|im_start|>user\n{}<|im_end|>\n", task.prompt());
    for (i, c) in commands.iter().enumerate() {
        assert_eq!(next_command(&prompt), Some(Some(c.to_string())), "call {i}");
        let result = ShellTask::tool_result(&call(c));
        assert!(!result.is_error);
        prompt.push_str(&format!("<|im_start|>tool\n{}<|im_end|>\n", result.content));
    }
    assert_eq!(next_command(&prompt), Some(None));
    assert_eq!(next_command("no script here"), None);
}

#[test]
fn only_the_whole_script_in_order_with_an_answer_scores() {
    let task = ShellTask {
        data_id: "r".into(),
        commands: vec!["a".into(), "b".into()],
    };
    let calls = [call("a"), call("b")];
    assert_eq!(task.grade(Some("done"), &calls), 1.0);
    assert_eq!(task.grade(None, &calls), 0.0);
    assert_eq!(task.grade(Some("done"), &[call("b"), call("a")]), 0.0);
    assert_eq!(task.grade(Some("done"), &calls[..1]), 0.0);
    let wrong = ToolCall {
        name: "python".into(),
        ..call("a")
    };
    assert!(ShellTask::tool_result(&wrong).is_error);
}
