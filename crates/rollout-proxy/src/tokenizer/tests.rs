//! Tests of the tokenizer wrapper and incremental detokenisation against SmolLM2's real tokenizer
//! (`ARENA_RL_SMOLLM2`).

use super::*;

fn smollm2_dir() -> std::path::PathBuf {
    let Some(dir) = std::env::var_os("ARENA_RL_SMOLLM2") else {
        panic!(
            "ARENA_RL_SMOLLM2 is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        );
    };
    dir.into()
}

fn smollm2() -> Tokenizer {
    Tokenizer::from_model_dir(smollm2_dir()).expect("loads")
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

/// Pieces random texts are made of: words, numbers, runs of spaces and newlines, contractions, code,
/// non-ASCII letters, emoji, combining marks, special tokens and their fragments.
const PIECES: &[&str] = &[
    "hello",
    "World",
    " the",
    "  ",
    "   ",
    "\n",
    "\n\n",
    "\t",
    " \n ",
    "\r\n",
    "123",
    " 4567",
    "'s",
    "'LL",
    "'ve",
    "don't",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im",
    "|>",
    "<",
    "{\"a\": [1, 2]}",
    "fn main()",
    "    let x = 1;",
    "日本語",
    " 🦀",
    "é",
    "e\u{301}",
    "Ωmega",
    "\u{a0}",
    "\u{3000}",
    "!!",
    " ...",
    "x_y",
    "__init__",
];

fn random_text() -> impl proptest::strategy::Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(PIECES), 0..40).prop_map(|p| p.concat())
}

use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    #[test]
    fn the_fast_encoder_gives_the_reference_ids(text in random_text()) {
        let tokenizer = smollm2_shared();
        prop_assert_eq!(tokenizer.encode(&text).expect("fast"), tokenizer.encode_reference(&text).expect("reference"));
    }

    #[test]
    fn byte_level_decoding_matches_the_reference(ids in proptest::collection::vec(0u32..49_160, 0..60)) {
        let tokenizer = smollm2_shared();
        let mut decoder = IncrementalDecoder::new();
        let mut out = String::new();
        for id in &ids {
            out.push_str(&decoder.push(tokenizer, *id).expect("decodes").unwrap_or_default());
        }
        out.push_str(&decoder.finish(tokenizer).expect("finishes"));
        prop_assert_eq!(out, tokenizer.decode(&ids, true).expect("reference"));
    }
}

fn smollm2_shared() -> &'static Tokenizer {
    static TOKENIZER: std::sync::OnceLock<Tokenizer> = std::sync::OnceLock::new();
    TOKENIZER.get_or_init(smollm2)
}

#[test]
fn smollm2_takes_both_fast_paths_and_long_prompts_agree() {
    let tokenizer = smollm2_shared();
    assert!(tokenizer.has_fast_encoder());
    assert!(tokenizer.has_byte_table());
    let mut prompt = String::new();
    for i in 0..200 {
        prompt.push_str(&format!(
            "<|im_start|>user\nStep {i}: run `ls -la /tmp/{i}` and   report.\n\n    indented\t\ttabs<|im_end|>\n"
        ));
    }
    assert_eq!(
        tokenizer.encode(&prompt).expect("fast"),
        tokenizer.encode_reference(&prompt).expect("reference")
    );
}

/// A small Qwen-style tokenizer: NFC, a `Split` pattern with the look-ahead tail, then `ByteLevel`.
fn qwen_style() -> Tokenizer {
    let chars = fast::byte_chars_for_tests();
    let mut vocab = serde_json::Map::new();
    for (i, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), serde_json::json!(i));
    }
    // Merges on spaces make a difference between where the pattern splits whitespace runs visible.
    let space = chars[b' ' as usize].to_string();
    let merges = [
        (space.as_str(), "h"),
        ("h", "e"),
        ("he", "l"),
        ("hel", "l"),
        ("l", "o"),
        (space.as_str(), "w"),
        (space.as_str(), space.as_str()),
    ];
    let mut merge_list = Vec::new();
    for (next, (a, b)) in (256..).zip(merges) {
        vocab.insert(format!("{a}{b}"), serde_json::json!(next));
        merge_list.push(serde_json::json!([a, b]));
    }
    let config = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [
            {"id": 263, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 264, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        ]},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": merge_list},
    });
    Tokenizer::from_bytes(config.to_string().as_bytes()).expect("a valid tokenizer")
}

#[test]
fn a_qwen_style_split_pattern_takes_the_fast_path_on_ascii() {
    let tokenizer = qwen_style();
    assert!(tokenizer.has_fast_encoder());
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(1500));
    runner
        .run(&random_text(), |text| {
            prop_assert_eq!(
                tokenizer.encode(&text).expect("fast"),
                tokenizer.encode_reference(&text).expect("reference")
            );
            Ok(())
        })
        .expect("the fast path agrees");
    assert_eq!(
        tokenizer.encode("hello w<|im_end|>").expect("encodes"),
        vec![259, u32::from(b'o'), 261, 264],
        "merges and added tokens"
    );
}

#[test]
fn unsupported_configurations_keep_the_general_path() {
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(smollm2_dir().join("tokenizer.json")).expect("reads"))
            .expect("json");
    config["added_tokens"][0]["lstrip"] = serde_json::json!(true);
    let tokenizer = Tokenizer::from_bytes(config.to_string().as_bytes()).expect("loads");
    assert!(
        !tokenizer.has_fast_encoder(),
        "stripping added tokens are not emulated"
    );
    assert!(tokenizer.has_byte_table());
    config["added_tokens"][0]["lstrip"] = serde_json::json!(false);
    config["normalizer"] = serde_json::json!({"type": "Lowercase"});
    config["decoder"] = serde_json::json!({"type": "Fuse"});
    let tokenizer = Tokenizer::from_bytes(config.to_string().as_bytes()).expect("loads");
    assert!(!tokenizer.has_fast_encoder());
    assert!(!tokenizer.has_byte_table());
    assert_eq!(
        tokenizer.encode("Hi").expect("encodes"),
        tokenizer.encode_reference("Hi").expect("encodes")
    );
}

#[test]
fn the_piece_memory_is_bounded_in_bytes_skips_long_pieces_and_keeps_staged_pieces_apart() {
    let tokenizer = smollm2();
    assert!(tokenizer.has_fast_encoder());
    // A piece longer than the limit is encoded right and never remembered.
    let long = "x".repeat(fast::MAX_CACHED_PIECE + 1);
    assert_eq!(
        tokenizer.encode(&long).expect("encodes"),
        tokenizer.encode_reference(&long).expect("encodes")
    );
    assert_eq!(tokenizer.piece_memory(), (0, 0));
    let edge = "y".repeat(fast::MAX_CACHED_PIECE);
    tokenizer.encode(&edge).expect("encodes");
    assert_eq!(
        tokenizer.piece_memory().0,
        1,
        "a piece at the limit is remembered"
    );

    // Staged pieces are used within the request but remembered only when asked.
    let text = "alpha beta beta gamma";
    let mut staged = StagedPieces::default();
    let ids = tokenizer.encode_staged(text, &mut staged).expect("encodes");
    assert_eq!(ids, tokenizer.encode_reference(text).expect("encodes"));
    assert_eq!(staged.len(), 3, "'alpha', ' beta' once and ' gamma': {staged:?}");
    assert_eq!(tokenizer.piece_memory().0, 1, "nothing staged is remembered yet");
    tokenizer.remember(staged);
    assert_eq!(tokenizer.piece_memory().0, 4);

    // Many distinct pieces: the memory's bytes never pass the bound, and ids stay right.
    let mut peak = 0;
    for i in 0..60_000u32 {
        // One letter run per word, so each is one piece of about 200 bytes.
        let letters: String = (0..4)
            .map(|k| char::from(b'a' + ((i / 26u32.pow(k)) % 26) as u8))
            .collect();
        let word = format!(" {letters}{}", "q".repeat(200));
        let ids = tokenizer.encode(&word).expect("encodes");
        if i % 7_500 == 0 {
            assert_eq!(ids, tokenizer.encode_reference(&word).expect("encodes"));
        }
        peak = peak.max(tokenizer.piece_memory().1);
    }
    assert!(peak <= fast::CACHE_BYTES, "{peak}");
    assert!(
        peak > fast::CACHE_BYTES / 2,
        "the bound is what limits it: {peak}"
    );
}
