//! Tests of the streaming output parser and the stop-string matcher, fed in every possible split.

use serde_json::json;

use super::*;

/// Parses `text` fed in pieces of every size from 1 to its length, checks all splits agree, and
/// returns the parsed pieces (adjacent text of one kind merged).
fn check(
    reasoning: ReasoningFormat,
    tools: ToolCallFormat,
    defs: Option<&[Value]>,
    open: bool,
    text: &str,
) -> Vec<Parsed> {
    let mut first: Option<Vec<Parsed>> = None;
    let chars: Vec<char> = text.chars().collect();
    for size in 1..=chars.len().max(1) {
        let mut parser = OutputParser::new(reasoning, tools, defs, open);
        let mut out = Vec::new();
        for piece in chars.chunks(size) {
            parser.push(&piece.iter().collect::<String>(), &mut out);
        }
        parser.finish(&mut out);
        let merged = merge(out);
        match &first {
            None => first = Some(merged),
            Some(f) => assert_eq!(&merged, f, "split size {size} of {text:?}"),
        }
    }
    first.unwrap_or_default()
}

fn merge(parsed: Vec<Parsed>) -> Vec<Parsed> {
    let mut out: Vec<Parsed> = Vec::new();
    for p in parsed {
        match (out.last_mut(), p) {
            (Some(Parsed::Content(a)), Parsed::Content(b)) => a.push_str(&b),
            (Some(Parsed::Reasoning(a)), Parsed::Reasoning(b)) => a.push_str(&b),
            (_, p) => out.push(p),
        }
    }
    out
}

fn content(s: &str) -> Parsed {
    Parsed::Content(s.into())
}

fn call(name: &str, args: &str) -> Parsed {
    Parsed::ToolCall(ParsedToolCall {
        name: name.into(),
        arguments: args.into(),
    })
}

const T: ReasoningFormat = ReasoningFormat::Think;
const H: ToolCallFormat = ToolCallFormat::Hermes;

#[test]
fn plain_text_is_content() {
    assert_eq!(
        check(T, H, None, false, "Hello <b>world</b> <tool"),
        vec![content("Hello <b>world</b> <tool")]
    );
}

#[test]
fn reasoning_then_content() {
    assert_eq!(
        check(T, H, None, false, "<think>\nstep one\n</think>\n\nThe answer."),
        vec![Parsed::Reasoning("step one\n".into()), content("The answer.")]
    );
    assert_eq!(
        check(T, H, None, true, "\nstill thinking</think>done"),
        vec![Parsed::Reasoning("still thinking".into()), content("done")]
    );
    assert_eq!(
        check(ReasoningFormat::None, H, None, false, "<think>x</think>y"),
        vec![content("<think>x</think>y")]
    );
}

#[test]
fn hermes_tool_calls() {
    assert_eq!(
        check(
            T,
            H,
            None,
            false,
            "Let me look.\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {\"path\": \"/tmp\"}}\n</tool_call>\n<tool_call>{\"name\": \"pwd\"}</tool_call>"
        ),
        vec![
            content("Let me look.\n"),
            call("ls", r#"{"path":"/tmp"}"#),
            call("pwd", "{}")
        ]
    );
}

#[test]
fn malformed_tool_calls_stay_content() {
    let text = "<tool_call>{\"name\": broken}</tool_call> after";
    assert_eq!(check(T, H, None, false, text), vec![content(text)]);
    let unterminated = "<tool_call>{\"name\": \"x\", \"arguments\": {";
    assert_eq!(
        check(T, H, None, false, unterminated),
        vec![content(unterminated)]
    );
    assert_eq!(
        check(T, H, None, false, "<tool_call>{\"name\": \"x\"}"),
        vec![call("x", "{}")],
        "a complete call whose closing tag never came is still a call"
    );
}

#[test]
fn qwen3_coder_tool_calls_use_the_schema_for_types() {
    let defs = [
        json!({"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {
            "cmd": {"type": "string"}, "timeout": {"type": "integer"}, "env": {"type": "object"}
        }}}}),
    ];
    let text = "<tool_call>\n<function=run>\n<parameter=cmd>\nls -la\n</parameter>\n<parameter=timeout>\n30\n</parameter>\n<parameter=env>\n{\"A\": \"1\"}\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(
        check(T, ToolCallFormat::Qwen3Coder, Some(&defs), false, text),
        vec![call("run", r#"{"cmd":"ls -la","timeout":30,"env":{"A":"1"}}"#)]
    );
    let bad = "<tool_call><function=run><parameter=cmd>ls</function></tool_call>";
    assert_eq!(
        check(T, ToolCallFormat::Qwen3Coder, Some(&defs), false, bad),
        vec![content(bad)]
    );
}

#[test]
fn stop_strings_cut_the_output_in_any_split() {
    let text = "abc STOP def";
    for size in 1..=text.len() {
        let mut m = StopMatcher::new(vec!["STOP".into(), "zz".into()]);
        let mut out = String::new();
        let mut hit = false;
        for piece in text.as_bytes().chunks(size) {
            let (safe, h) = m.push(std::str::from_utf8(piece).expect("ascii"));
            out.push_str(&safe);
            if h {
                hit = true;
                break;
            }
        }
        assert!(hit, "split {size}");
        assert_eq!(out, "abc ", "split {size}");
        assert_eq!(m.matched(), Some("STOP"), "split {size}");
    }
    let mut m = StopMatcher::new(vec!["STOP".into()]);
    let (safe, hit) = m.push("abc ST");
    assert_eq!((safe.as_str(), hit), ("abc ", false));
    assert_eq!(m.matched(), None);
    assert_eq!(m.finish(), "ST");
}

/// What the matcher held back before it used prefix functions: the longest suffix of `held` that is a
/// proper prefix of a stop string, found by trying every length.
fn held_back_by_trying(held: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .map(|s| {
            (1..s.len())
                .rev()
                .filter(|&k| s.is_char_boundary(k))
                .find(|&k| held.ends_with(&s[..k]))
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

proptest::proptest! {
    #[test]
    fn stop_matching_holds_back_what_trying_every_length_does(
        stops in proptest::collection::vec("[abé]{1,6}", 1..4),
        pieces in proptest::collection::vec("[abéc]{0,5}", 0..12),
    ) {
        let mut m = StopMatcher::new(stops.clone());
        let mut passed = String::new();
        for piece in &pieces {
            let before = format!("{}{piece}", m.held);
            let (safe, hit) = m.push(piece);
            passed.push_str(&safe);
            if hit {
                break;
            }
            let keep = held_back_by_trying(&before, &stops);
            proptest::prop_assert_eq!(&m.held, &before[before.len() - keep..]);
            proptest::prop_assert_eq!(safe.as_str(), &before[..before.len() - keep]);
        }
        // The output ends at the first piece after which the text so far holds a stop string, at the earliest
        // such string there: a longer stop that would begin earlier but complete later never arrives
        // (stops "é" and "aéé" over pieces "aé", "é" pass "a").
        let all: String = pieces.concat();
        let mut so_far = String::new();
        let mut cut = None;
        for piece in &pieces {
            so_far.push_str(piece);
            if let Some(at) = stops.iter().filter_map(|s| so_far.find(s.as_str())).min() {
                cut = Some(at);
                break;
            }
        }
        if let Some(at) = cut {
            proptest::prop_assert_eq!(&passed, &so_far[..at]);
        } else {
            passed.push_str(&m.finish());
            proptest::prop_assert_eq!(&passed, &all);
        }
    }
}

#[test]
fn a_long_self_similar_stop_string_costs_linear_work() {
    // 4 stop strings of 256 bytes that almost match everywhere: trying every length was 4 x 256^2 byte
    // comparisons per token; the prefix functions make it 4 x 256 x 2.
    let stops: Vec<String> = (0..4).map(|i| format!("{}{i}", "a".repeat(255))).collect();
    let mut m = StopMatcher::new(stops);
    let mut passed = 0;
    for _ in 0..20_000 {
        let (safe, hit) = m.push("a");
        assert!(!hit);
        passed += safe.len();
    }
    assert_eq!(passed + m.held.len(), 20_000);
    assert_eq!(m.held.len(), 255);
    let (safe, hit) = m.push("3tail");
    assert!(hit);
    assert_eq!(safe, "");
    assert_eq!(m.matched().map(str::len), Some(256));
}
