//! Tests of the tokenizer wrapper and incremental detokenisation against SmolLM2's real tokenizer
//! (`ARENA_RL_SMOLLM2`).

use super::*;

fn smollm2() -> Tokenizer {
    let Some(dir) = std::env::var_os("ARENA_RL_SMOLLM2") else {
        panic!(
            "ARENA_RL_SMOLLM2 is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        );
    };
    Tokenizer::from_model_dir(dir).expect("loads")
}

#[test]
fn incremental_decoding_matches_full_decoding_and_never_splits_characters() {
    let tokenizer = smollm2();
    for text in [
        "Hello, world!",
        "crab 🦀 and 日本語 — done",
        "  leading spaces\n\tand tabs",
        "<tool_call>{\"a\": 1}</tool_call>",
    ] {
        let ids = tokenizer.encode(text).expect("encodes");
        let mut decoder = IncrementalDecoder::new();
        let mut out = String::new();
        for id in &ids {
            if let Some(delta) = decoder.push(&tokenizer, *id).expect("decodes") {
                assert!(
                    !delta.contains('\u{FFFD}'),
                    "{text:?}: split character in {delta:?}"
                );
                out.push_str(&delta);
            }
        }
        out.push_str(&decoder.finish(&tokenizer).expect("finishes"));
        assert_eq!(out, text);
        assert_eq!(tokenizer.decode(&ids, true).expect("decodes"), text);
    }
}

#[test]
fn special_tokens_are_known_and_skipped() {
    let tokenizer = smollm2();
    let end = tokenizer.token_to_id("<|im_end|>").expect("ChatML end token");
    assert!(tokenizer.is_special(end));
    assert_eq!(
        tokenizer.encode("<|im_end|>").expect("encodes"),
        vec![end],
        "special tokens in text are recognised"
    );
    let mut ids = tokenizer.encode("ok").expect("encodes");
    ids.push(end);
    assert_eq!(tokenizer.decode(&ids, true).expect("decodes"), "ok");
    assert_eq!(tokenizer.decode(&ids, false).expect("decodes"), "ok<|im_end|>");
    assert!(tokenizer.vocab_size() >= 49_152);
    let err = Tokenizer::from_bytes(b"{not json").expect_err("invalid");
    assert!(err.to_string().contains("tokenizer"), "{err}");
}
