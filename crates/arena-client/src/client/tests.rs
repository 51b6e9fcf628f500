//! Tests of path encoding.

use super::*;

#[test]
fn segments_are_encoded_with_no_safe_characters() {
    let cases = [
        ("stream/a", "stream%2Fa"),
        ("claude/code", "claude%2Fcode"),
        ("a b?c#d", "a%20b%3Fc%23d"),
        ("keep_.-~", "keep_.-~"),
        ("é", "%C3%A9"),
    ];
    for (input, want) in cases {
        assert_eq!(encode_segment(input), want, "{input}");
    }
}
