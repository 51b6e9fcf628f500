//! Tests of message normalisation (reference 8.4 cases 9-12 in their Rust form), preprocessors and keys.

use serde_json::json;

use super::*;

#[test]
fn text_blocks_flatten_and_images_stay_structured() {
    let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
    let mut messages = vec![
        json!({"role": "system", "content": [{"type": "text", "text": "sys"}, image.clone()]}),
        json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": ""}, {"type": "text", "text": "b"}]}),
        json!({"role": "user", "content": [{"type": "tool_result", "content": [{"type": "text", "text": "nested"}]}, {"k": 2, "a": 1}]}),
        json!({"role": "user", "content": [{"type": "text", "text": "look"}, image.clone()]}),
        json!({"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "shot"}, image.clone()]}),
    ];
    normalize_messages(&mut messages).expect("all objects");
    assert_eq!(
        messages[0]["content"],
        json!(format!("sys\n{}", sorted_json(&image)))
    );
    assert_eq!(messages[1]["content"], json!("a\nb"));
    assert_eq!(messages[2]["content"], json!("nested\n{\"a\":1,\"k\":2}"));
    assert_eq!(
        messages[3]["content"],
        json!([{"type": "text", "text": "look"}, image.clone()])
    );
    assert_eq!(
        messages[4]["content"][1], image,
        "an image in a tool message reaches the engine unmodified"
    );
    assert_eq!(collect_images(&messages), vec![image.clone(), image]);
}

#[test]
fn a_list_with_a_non_object_is_left_untouched() {
    let mut messages = vec![
        json!({"role": "user", "content": [{"type": "text", "text": "a"}]}),
        json!("oops"),
    ];
    let before = messages.clone();
    assert_eq!(normalize_messages(&mut messages), Err(1));
    assert_eq!(messages, before, "nothing is half-normalised");
}

#[test]
fn preprocessors_rewrite_what_they_say() {
    let mut messages = vec![
        json!({"role": "system", "content": "x-anthropic-billing-header: cc_version=1\nYou are Claude.", "cache_control": {"type": "ephemeral"}}),
        json!({"role": "user", "content": "<system-reminder>noise</system-reminder>Fix it.<system-reminder>more"}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": {"b": 1}}}, {"function": {"name": "g", "arguments": "{ \"a\" : 1 }"}}]}),
    ];
    for name in PREPROCESSORS {
        preprocessor(name).expect("known").apply(&mut messages);
    }
    assert!(preprocessor("nope").is_none());
    assert_eq!(
        messages[0],
        json!({"role": "system", "content": "You are Claude."})
    );
    assert_eq!(messages[1]["content"], json!("Fix it."));
    assert_eq!(
        messages[2]["tool_calls"][0]["function"]["arguments"],
        json!("{\"b\":1}")
    );
    assert_eq!(
        messages[2]["tool_calls"][1]["function"]["arguments"],
        json!("{\"a\":1}")
    );
}

#[test]
fn keys_ignore_what_clients_add_when_echoing() {
    let ours = json!({"role": "assistant", "content": "Done.", "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\":1,\"b\":2}"}}]});
    let echoed = json!({"role": "assistant", "content": "Done.\n", "refusal": null, "reasoning_content": "hmm",
        "tool_calls": [{"id": "call_x", "type": "function", "function": {"name": "f", "arguments": "{\"b\": 2, \"a\": 1}"}}]});
    assert_eq!(message_key(&ours), message_key(&echoed));
    let other_args = json!({"role": "assistant", "content": "Done.", "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\":2,\"b\":2}"}}]});
    assert_ne!(message_key(&ours), message_key(&other_args));
    assert_eq!(
        message_key(&json!({"role": "assistant", "content": null})),
        message_key(&json!({"role": "assistant", "content": "", "tool_calls": []}))
    );
    assert_ne!(
        message_key(&json!({"role": "user", "content": "a"})),
        message_key(&json!({"role": "system", "content": "a"}))
    );
    assert_ne!(chain(chain(0, 1), 2), chain(chain(0, 2), 1));
}

#[test]
fn template_preparation_parses_arguments_and_fills_content() {
    let prepared = for_template(&[
        json!({"role": "developer", "content": "d"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"function": {"name": "f", "arguments": "{\"a\":1}"}}, {"function": {"name": "g", "arguments": "not json"}}]}),
    ]);
    assert_eq!(prepared[0]["role"], json!("system"));
    assert_eq!(prepared[1]["content"], json!(""));
    assert_eq!(
        prepared[1]["tool_calls"][0]["function"]["arguments"],
        json!({"a": 1})
    );
    assert_eq!(
        prepared[1]["tool_calls"][1]["function"]["arguments"],
        json!("not json")
    );
}

#[test]
fn system_reminder_spans_are_stripped_in_one_pass() {
    let check = |text: &str, want: Option<&str>| {
        assert_eq!(strip_spans(text, "<r>", "</r>").as_deref(), want, "{text:?}");
    };
    check("plain", None);
    check("<r>x</r>", Some(""));
    check("a<r>x</r>b<r>y</r>c", Some("abc"));
    check("a<r>x</r>b<r>unclosed", Some("ab"));
    check("a</r><r>x</r></r>b", Some("a</r></r>b"));
    check("<r><r>x</r>y</r>", Some("y</r>"));
    // A tag that forms only once a span is gone is text, as a regex substitution leaves it.
    check("<<r>x</r>r>z</r>", Some("<r>z</r>"));
    check("é<r>ü</r>ß", Some("éß"));
    // The quadratic form moved the whole remainder per span: 200,000 spans in 7.4 MB meant about 740 GB
    // of copying.
    let n = 200_000;
    let hostile = "<system-reminder>x</system-reminder>a".repeat(n);
    let mut messages = vec![json!({"role": "user", "content": hostile})];
    preprocessor("strip-system-reminders")
        .expect("known")
        .apply(&mut messages);
    assert_eq!(messages[0]["content"], json!("a".repeat(n)));
    let unclosed = "<system-reminder>".repeat(n);
    let mut messages = vec![json!({"role": "user", "content": format!("keep{unclosed}")})];
    preprocessor("strip-system-reminders")
        .expect("known")
        .apply(&mut messages);
    assert_eq!(messages[0]["content"], json!("keep"));
}
