//! Tests of chat template rendering: Python-compatible JSON, HF's whitespace settings, tools, errors.

use minijinja::value::Value as JinjaValue;
use serde_json::json;

use super::*;

fn py(value: serde_json::Value, indent: Option<usize>) -> String {
    let mut out = String::new();
    pyjson::write(
        &JinjaValue::from(minijinja::value::Serde(&value)),
        indent,
        0,
        &mut out,
    )
    .expect("writes");
    out
}

#[test]
fn tojson_writes_what_python_json_dumps_writes() {
    // Expected strings are Python 3.11's json.dumps(..., ensure_ascii=False) output.
    assert_eq!(
        py(
            json!({"a": [1, 2.5, "x<y>&'é\n"], "b": {}, "c": [], "d": null, "e": true, "f": 1e20}),
            None
        ),
        r#"{"a": [1, 2.5, "x<y>&'é\n"], "b": {}, "c": [], "d": null, "e": true, "f": 1e+20}"#
    );
    assert_eq!(
        py(json!({"a": [1, {"b": 2}], "c": []}), Some(2)),
        "{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ],\n  \"c\": []\n}"
    );
}

const CHATML_WITH_TOOLS: &str = r#"{%- if tools %}
<|im_start|>system
Tools:
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
<|im_end|>
{% endif %}
{%- for message in messages %}
    {%- if message.role == "assistant" and message.tool_calls %}
<|im_start|>assistant
{{ message.content }}
        {%- for call in message.tool_calls %}
<tool_call>{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}</tool_call>
        {%- endfor %}
<|im_end|>
    {%- else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
    {%- endif %}
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

#[test]
fn renders_tools_tool_calls_and_the_generation_prompt() {
    let template = ChatTemplate::new(CHATML_WITH_TOOLS, None, Some("<|im_end|>".into())).expect("compiles");
    let tools = [json!({"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}})];
    let messages = crate::messages::for_template(&[
        json!({"role": "user", "content": "list"}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{\"path\": \"/\"}"}}
        ]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": "a b"}),
    ]);
    let text = template
        .render(
            &messages,
            RenderOptions {
                tools: Some(&tools),
                add_generation_prompt: true,
                extra: None,
            },
        )
        .expect("renders");
    // What Python's jinja2 renders with transformers' settings for the same input.
    let python = "<|im_start|>system\nTools:{\"type\": \"function\", \"function\": {\"name\": \"ls\", \"parameters\": {\"type\": \"object\"}}}<|im_end|>\n<|im_start|>user\nlist<|im_end|><|im_start|>assistant\n<tool_call>{\"name\": \"ls\", \"arguments\": {\"path\": \"/\"}}</tool_call><|im_end|><|im_start|>tool\na b<|im_end|><|im_start|>assistant\n";
    assert_eq!(text, python);
    assert_eq!(template.assistant_turn_end(), Some("<|im_end|>"));
}

#[test]
fn raise_exception_becomes_a_template_error_with_its_message() {
    let template = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}",
        None,
        None,
    )
    .expect("compiles");
    let err = template
        .render(
            &[json!({"role": "assistant", "content": "x"})],
            RenderOptions::default(),
        )
        .expect_err("refused");
    assert_eq!(
        err.to_string(),
        "chat template: first message must be from the user"
    );
}

#[test]
fn python_string_methods_and_strftime_work() {
    let template = ChatTemplate::new(
        "{{ messages[0].content.strip().upper() }}|{{ strftime_now('%Y') | length }}",
        None,
        None,
    )
    .expect("compiles");
    let text = template
        .render(
            &[json!({"role": "user", "content": "  hi  "})],
            RenderOptions::default(),
        )
        .expect("renders");
    assert_eq!(text, "HI|4");
    assert_eq!(
        pyjson::strftime(0, "%d %b %Y %H:%M:%S %A"),
        "01 Jan 1970 00:00:00 Thursday"
    );
    assert_eq!(pyjson::strftime(1_700_000_000, "%Y-%m-%d"), "2023-11-14");
}

#[test]
fn model_dir_without_a_template_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("tokenizer_config.json"), "{}").expect("write");
    let err = ChatTemplate::from_model_dir(dir.path()).expect_err("no template");
    assert!(
        err.to_string()
            .contains("neither chat_template.jinja nor a chat_template"),
        "{err}"
    );
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}], "eos_token": {"content": "</s>"}}"#,
    )
    .expect("write");
    let template = ChatTemplate::from_model_dir(dir.path()).expect("loads");
    assert_eq!(
        template.render(&[], RenderOptions::default()).expect("renders"),
        "D"
    );
    assert_eq!(template.eos_token(), Some("</s>"));
}
