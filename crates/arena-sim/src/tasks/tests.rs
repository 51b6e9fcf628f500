//! Tests of the task family: determinism, prompts, the tool, the grader and the canonical transcripts.

use serde_json::json;

use super::*;

fn instance(family: TaskFamily) -> TaskInstance {
    TaskInstance {
        family,
        data_id: "row".to_string(),
        key: "q3".to_string(),
        digits: [4, 9, 1, 7, 5, 2],
    }
}

fn lookup(key: &str) -> ToolCall {
    ToolCall::from_text("c1", LOOKUP, &format!("{{\"key\": \"{key}\"}}"))
}

#[test]
fn instances_are_deterministic_and_stable() {
    let a = TaskInstance::from_data_id(TaskFamily::Max, "sim-messages-row-7");
    let b = TaskInstance::from_data_id(TaskFamily::Max, "sim-messages-row-7");
    assert_eq!(a, b);
    // Pinned so that a change of the generator (which would change every dataset) is noticed.
    assert_eq!((a.key.as_str(), a.digits), ("d5", [3, 8, 8, 7, 9, 8]));
    let keys: std::collections::BTreeSet<String> = (0..200)
        .map(|n| TaskInstance::from_data_id(TaskFamily::Min, &format!("r{n}")).key)
        .collect();
    assert!(keys.len() > 100, "keys vary across rows: {}", keys.len());
    assert!(keys.iter().all(|k| k.len() == 2), "{keys:?}");
}

#[test]
fn prompts_are_short_and_name_the_key() {
    assert_eq!(instance(TaskFamily::Max).prompt(), "largest digit under key q3?");
    assert_eq!(instance(TaskFamily::Min).prompt(), "smallest digit under key q3?");
    assert_eq!(instance(TaskFamily::Max).target(), 9);
    assert_eq!(instance(TaskFamily::Min).target(), 1);
}

#[test]
fn families_come_from_domain_tags() {
    let check = |tags: serde_json::Value, want: Option<TaskFamily>| {
        assert_eq!(TaskFamily::from_tags(&tags), want, "{tags}");
    };
    check(json!(["domain:max"]), Some(TaskFamily::Max));
    check(json!(["lang:en", "domain:min"]), Some(TaskFamily::Min));
    check(json!(["domain:swe", "domain:max"]), Some(TaskFamily::Max));
    check(json!(["domain:swe"]), None);
    check(json!({"domain": "max"}), None);
    assert_eq!(TaskFamily::Min.domain_tag(), "domain:min");
}

#[test]
fn the_tool_answers_the_right_key_only() {
    let task = instance(TaskFamily::Max);
    let check = |call: ToolCall, content: &str, is_error: bool| {
        let r = task.tool_result(&call);
        assert_eq!((r.content.as_str(), r.is_error), (content, is_error), "{call:?}");
    };
    check(lookup("q3"), "4 9 1 7 5 2", false);
    check(lookup(" q3 "), "4 9 1 7 5 2", false);
    check(lookup("q4"), "no key q4", true);
    check(ToolCall::from_text("c", LOOKUP, ""), "key is required", true);
    check(
        ToolCall::from_text("c", LOOKUP, "{\"key\": 3}"),
        "key is required",
        true,
    );
    check(
        ToolCall::from_text("c", LOOKUP, "not json"),
        "key is required",
        true,
    );
    check(ToolCall::from_text("c", "bash", "{}"), "unknown tool bash", true);
}

#[test]
fn the_grader_gives_partial_credit() {
    let max = instance(TaskFamily::Max);
    let min = instance(TaskFamily::Min);
    let check = |task: &TaskInstance, answer: Option<&str>, calls: &[ToolCall], score: f64| {
        let g = task.grade(answer, calls);
        assert!((g.score - score).abs() < 1e-12, "{answer:?} {calls:?}: {g:?}");
    };
    let right = [lookup("q3")];
    check(&max, Some("9"), &right, 1.0);
    check(&max, Some(" 9\n"), &right, 1.0);
    check(&max, Some("8"), &right, 0.75);
    check(&max, Some("7"), &right, 0.5);
    check(&max, Some("5"), &right, 0.0);
    check(&max, Some("0"), &right, 0.0);
    check(&min, Some("1"), &right, 1.0);
    check(&min, Some("3"), &right, 0.5);
    // No valid lookup, or no single digit: nothing.
    check(&max, Some("9"), &[], 0.0);
    check(&max, Some("9"), &[lookup("q4")], 0.0);
    check(&max, Some("9"), &[lookup("q4"), lookup("q3")], 1.0);
    check(&max, Some("99"), &right, 0.0);
    check(&max, Some("9."), &right, 0.0);
    check(&max, Some("nine"), &right, 0.0);
    check(&max, None, &right, 0.0);
    let g = max.grade(Some("8"), &right);
    assert_eq!((g.lookup_ok, g.answer, g.target), (true, Some(8), 9));
}

#[test]
fn transcripts_are_what_a_perfect_run_sends() {
    let task = instance(TaskFamily::Max);
    insta::assert_json_snapshot!("transcript_chat", task.transcript(LlmProtocol::ChatCompletions));
    insta::assert_json_snapshot!("transcript_anthropic", task.transcript(LlmProtocol::Anthropic));
    insta::assert_json_snapshot!("transcript_responses", task.transcript(LlmProtocol::Responses));
    insta::assert_json_snapshot!(
        "tools",
        LlmProtocol::ALL.map(|p| (p.as_str(), TaskInstance::tools(p)))
    );
}

/// The scale of the quickstart's task, pinned on its own rows (both streams of `World::quickstart`): a policy
/// that answers uniformly random digits scores about 0.31, one that answers the best constant per question
/// (8 to "largest", 1 to "smallest") about 0.77, and one that reads the digits the tool returns 1.0. The
/// quickstart's reward curve is read against these numbers.
#[test]
fn the_quickstart_task_scale_is_pinned() {
    let world = crate::World::quickstart();
    let mut tasks = Vec::new();
    for stream in &world.streams {
        let family = stream.task_family.expect("quickstart streams have a family");
        for row in stream.all_rows() {
            tasks.push(TaskInstance::from_data_id(family, &row.data_id));
        }
    }
    assert_eq!(tasks.len(), 2 * crate::QUICKSTART_ROWS as usize);
    let mean = |answer: &dyn Fn(&TaskInstance) -> String| -> f64 {
        let total: f64 = tasks
            .iter()
            .map(|t| t.grade(Some(&answer(t)), &[lookup(&t.key)]).score)
            .sum();
        total / tasks.len() as f64
    };
    let reading = mean(&|t| t.target().to_string());
    let constant = mean(&|t| match t.family {
        TaskFamily::Max => "8".to_string(),
        TaskFamily::Min => "1".to_string(),
        TaskFamily::Sum => unreachable!("the quickstart has no sums"),
    });
    let uniform = (0..10u8).map(|d| mean(&|_| d.to_string())).sum::<f64>() / 10.0;
    assert_eq!(reading, 1.0);
    assert!(
        (constant - 0.77).abs() < 0.02,
        "the per-question constant scores {constant:.3}"
    );
    assert!((uniform - 0.31).abs() < 0.02, "uniform digits score {uniform:.3}");
    // The constant is the best one: no other pair of digits scores more.
    for (hi, lo) in [(9, 0), (7, 2), (9, 1), (8, 0)] {
        let other = mean(&|t| match t.family {
            TaskFamily::Max => format!("{hi}"),
            TaskFamily::Min => format!("{lo}"),
            TaskFamily::Sum => unreachable!("the quickstart has no sums"),
        });
        assert!(
            other <= constant,
            "({hi}, {lo}) scores {other:.3} > {constant:.3}"
        );
    }
}

/// The `sum` family's grade: closeness over a span of 3, full credit only for the number alone (3/4 inside
/// text); and its
/// scale: no constant answer pays (the best, 10, scores about 0.30 on the SmolLM2 run's rows).
#[test]
fn sums_are_graded_for_closeness_and_for_the_bare_number() {
    let task = TaskInstance::from_data_id(TaskFamily::Sum, "sum-row-7");
    let (a, b) = task.operands();
    assert!((1..=9).contains(&a) && (1..=9).contains(&b), "{a} + {b}");
    assert_eq!(task.sum_target(), a + b);
    assert_eq!(
        task.prompt(),
        format!("What is {a} + {b}? Answer with the number only.")
    );
    assert_eq!(
        task.offered_tools(LlmProtocol::ChatCompletions),
        serde_json::json!([])
    );
    let t = task.sum_target();
    let score = |reply: &str| task.grade(Some(reply), &[]).score;
    assert_eq!(score(&t.to_string()), 1.0);
    assert_eq!(score(&format!(" {t}.\n")), 1.0);
    assert_eq!(score(&format!("The answer is {t}.")), 0.75);
    assert!((score(&(t + 1).to_string()) - 2.0 / 3.0).abs() < 1e-12);
    assert!((score(&format!("{a} + {b} = {}", t - 1)) - 0.5).abs() < 1e-12);
    assert_eq!(score(&(t + 3).to_string()), 0.0);
    assert_eq!(score("I don't know"), 0.0);
    assert_eq!(task.grade(None, &[]).score, 0.0);
    assert_eq!(
        score("99999999999999999999"),
        0.0,
        "an integer past u32 is no answer"
    );
    // A number after a character of several bytes is read, not a grader crash.
    assert_eq!(score(&format!("→{t}")), 0.75);
    assert_eq!(score(&format!("é ü{t}")), 0.75);
    // The transcript of a perfect run is the prompt and the bare sum, no tool.
    let transcript = task.transcript(LlmProtocol::ChatCompletions);
    assert_eq!(transcript.len(), 2);
    assert_eq!(transcript[1]["content"], serde_json::json!(t.to_string()));
    // On the SmolLM2 run's rows, the best constant answer scores about 0.30, and reading the sum 1.0.
    let world = crate::World::sums();
    let rows = world.streams[0].all_rows();
    let tasks: Vec<TaskInstance> = rows
        .iter()
        .map(|r| TaskInstance::from_data_id(TaskFamily::Sum, &r.data_id))
        .collect();
    let mean = |answer: &dyn Fn(&TaskInstance) -> String| -> f64 {
        tasks
            .iter()
            .map(|t| t.grade(Some(&answer(t)), &[]).score)
            .sum::<f64>()
            / tasks.len() as f64
    };
    assert_eq!(mean(&|t| t.sum_target().to_string()), 1.0);
    let best = (2..=18u32)
        .map(|c| mean(&|_| c.to_string()))
        .fold(0.0f64, f64::max);
    assert!((best - 0.30).abs() < 0.03, "the best constant scores {best:.3}");
    // Rows tagged `domain:sum` are sums.
    assert_eq!(
        TaskFamily::from_tags(&serde_json::json!(["domain:sum"])),
        Some(TaskFamily::Sum)
    );
}
