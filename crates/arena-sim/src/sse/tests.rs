//! Tests of the SSE parser: any split of the bytes gives the same events.

use super::*;

fn ev(event: &str, data: &str) -> SseEvent {
    SseEvent {
        event: event.to_string(),
        data: data.to_string(),
    }
}

/// Parses `text` fed in pieces of `size` bytes and at once; both must give `want`.
fn check(text: &str, want: &[SseEvent]) {
    for size in [1, 2, 3, 7, text.len().max(1)] {
        let mut parser = SseParser::default();
        let mut got = Vec::new();
        for chunk in text.as_bytes().chunks(size) {
            got.extend(parser.push(chunk));
        }
        got.extend(parser.finish());
        assert_eq!(got, want, "pieces of {size} bytes of {text:?}");
    }
}

#[test]
fn events_split_anywhere_parse_the_same() {
    check(
        "event: message_start\ndata: {\"a\":1}\n\nevent: ping\ndata: {}\n\n",
        &[ev("message_start", "{\"a\":1}"), ev("ping", "{}")],
    );
    check("data: one\r\ndata: two\r\n\r\n", &[ev("", "one\ntwo")]);
    check("data:x\r\rdata: y\n\n", &[ev("", "x"), ev("", "y")]);
    check(": ping\n\ndata: [DONE]\n\n", &[ev("", "[DONE]")]);
    check("event: only-name\n\n", &[]);
    check(
        "data: no blank line at the end",
        &[ev("", "no blank line at the end")],
    );
    check("data: é ü\n\n", &[ev("", "é ü")]);
    check("id: 3\nretry: 10\ndata\n\n", &[ev("", "")]);
}
