//! The proxy's byte-level BPE fast path against the `tokenizers` crate it replaces on the hot path, on
//! SmolLM2's tokenizer, in the same run: encoding a rendered 200-token chat prompt (its pieces remembered
//! from earlier prompts, as in a training run where sessions share system prompts and words recur), a
//! prompt of fresh random words (nothing remembered: the fast path's worst case), and detokenising 32
//! sampled tokens one at a time. After criterion's report the bench prints each ratio of medians.
//!
//! Needs `ARENA_RL_SMOLLM2` (`eval "$(cargo xtask fixtures)"`).

use std::hint::black_box;
use std::time::Duration;

#[path = "common/timing.rs"]
mod timing;
use timing::median;

use criterion::Criterion;
use rollout_proxy::tokenizer::{IncrementalDecoder, Tokenizer};

fn tokenizer() -> Tokenizer {
    let dir = std::env::var("ARENA_RL_SMOLLM2").unwrap_or_else(|_| {
        panic!("ARENA_RL_SMOLLM2 is not set: run `eval \"$(cargo xtask fixtures)\"` first")
    });
    Tokenizer::from_model_dir(dir).expect("SmolLM2's tokenizer loads")
}

fn chat_prompt() -> String {
    let sentence = "Please refactor the parser module so that errors carry the offending line number. ";
    format!(
        "<|im_start|>system\nYou are a careful coding agent.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n",
        sentence.repeat(10)
    )
}

/// Random lowercase words of 3-9 letters (a seeded generator): pieces the cache has not seen.
fn fresh_words(seed: &mut u64, words: usize) -> String {
    let mut out = String::new();
    for _ in 0..words {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let len = 3 + (*seed >> 60) as usize % 7;
        out.push(' ');
        for k in 0..len {
            out.push(char::from(b'a' + ((*seed >> (8 + 5 * k)) % 26) as u8));
        }
    }
    out
}

fn main() {
    let tok = tokenizer();
    assert!(
        tok.has_fast_encoder() && tok.has_byte_table(),
        "SmolLM2 takes the fast path"
    );
    let prompt = chat_prompt();
    assert_eq!(
        tok.encode(&prompt).expect("fast"),
        tok.encode_reference(&prompt).expect("reference")
    );
    let sampled: Vec<u32> = tok
        .encode(" The parser now reports the offending line number with every error it raises.")
        .expect("encodes")
        .into_iter()
        .cycle()
        .take(32)
        .collect();
    let decode_all = |tok: &Tokenizer, reference: bool| {
        if reference {
            // The proxy's previous detokeniser: a window decoded twice per token.
            let mut out = String::new();
            let mut prefix = 0;
            let mut read = 0;
            for end in 1..=sampled.len() {
                let a = tok.decode(&sampled[prefix..read], true).expect("decodes");
                let b = tok.decode(&sampled[prefix..end], true).expect("decodes");
                if b.len() > a.len() && !b.ends_with('\u{FFFD}') {
                    out.push_str(&b[a.len()..]);
                    prefix = read;
                    read = end;
                }
            }
            out
        } else {
            let mut decoder = IncrementalDecoder::new();
            let mut out = String::new();
            for id in &sampled {
                out.push_str(&decoder.push(tok, *id).expect("decodes").unwrap_or_default());
            }
            out.push_str(&decoder.finish(tok).expect("finishes"));
            out
        }
    };
    assert_eq!(decode_all(&tok, false), decode_all(&tok, true));

    let mut criterion = Criterion::default().configure_from_args();
    let mut group = criterion.benchmark_group("proxy_tokenizer");
    group.bench_function("encode_chat_prompt/fast", |b| {
        b.iter(|| tok.encode(black_box(&prompt)))
    });
    group.bench_function("encode_chat_prompt/tokenizers", |b| {
        b.iter(|| tok.encode_reference(black_box(&prompt)))
    });
    let mut seed = 7;
    group.bench_function("encode_fresh_words/fast", |b| {
        b.iter_batched(
            || fresh_words(&mut seed, 150),
            |t| tok.encode(&t),
            criterion::BatchSize::SmallInput,
        )
    });
    group.bench_function("encode_fresh_words/tokenizers", |b| {
        b.iter_batched(
            || fresh_words(&mut seed, 150),
            |t| tok.encode_reference(&t),
            criterion::BatchSize::SmallInput,
        )
    });
    group.bench_function("decode_32_tokens/fast", |b| b.iter(|| decode_all(&tok, false)));
    group.bench_function("decode_32_tokens/tokenizers", |b| {
        b.iter(|| decode_all(&tok, true))
    });
    group.finish();
    criterion.final_summary();

    let runs = 2001;
    let ratio = |fast: Duration, slow: Duration| slow.as_secs_f64() / fast.as_secs_f64();
    let chat = ratio(
        median(runs, || drop(black_box(tok.encode(&prompt)))),
        median(runs, || drop(black_box(tok.encode_reference(&prompt)))),
    );
    let texts: Vec<String> = (0..runs).map(|_| fresh_words(&mut seed, 150)).collect();
    let mut i = 0;
    let fresh_fast = median(runs, || {
        drop(black_box(tok.encode(&texts[i % runs])));
        i += 1;
    });
    let texts: Vec<String> = (0..runs).map(|_| fresh_words(&mut seed, 150)).collect();
    let mut i = 0;
    let fresh_slow = median(runs, || {
        drop(black_box(tok.encode_reference(&texts[i % runs])));
        i += 1;
    });
    let decode = ratio(
        median(runs, || drop(black_box(decode_all(&tok, false)))),
        median(runs, || drop(black_box(decode_all(&tok, true)))),
    );
    println!(
        "fast path speedup (tokenizers / fast, medians): chat prompt {chat:.1}x, fresh words {:.1}x, detokenising 32 tokens {decode:.1}x",
        ratio(fresh_fast, fresh_slow)
    );
}
