//! Unit tests for `sampling`: greedy, filters, seeds, and that log-probabilities are those of the
//! distribution sampled from.

use super::*;

fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits.iter().map(|&l| ((l as f64 - m) / t).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

const LOGITS: [f32; 6] = [1.0, 3.0, 0.5, 2.5, -1.0, 2.9];

/// Draws `n` tokens with `params` and returns the empirical frequencies and the reported log-probabilities.
fn check(params: &SamplingParams, n: usize) -> (Vec<f64>, Vec<Option<f32>>) {
    let mut rng = SplitMix64::new(params.seed.unwrap_or(1));
    let mut counts = vec![0usize; LOGITS.len()];
    let mut reported = vec![None; LOGITS.len()];
    for _ in 0..n {
        let (tok, lp) = sample(&LOGITS, params, &mut rng);
        counts[tok as usize] += 1;
        reported[tok as usize] = Some(lp);
    }
    (counts.iter().map(|&c| c as f64 / n as f64).collect(), reported)
}

#[test]
fn greedy_takes_the_argmax_with_the_untempered_logprob() {
    let mut rng = SplitMix64::new(0);
    let (tok, lp) = sample(&LOGITS, &SamplingParams::greedy(), &mut rng);
    assert_eq!(tok, 1);
    assert!((f64::from(lp) - softmax(&LOGITS, 1.0)[1].ln()).abs() < 1e-6);
}

#[test]
fn plain_sampling_follows_the_tempered_softmax() {
    for t in [1.0f32, 0.5, 2.0] {
        let params = SamplingParams {
            temperature: t,
            seed: Some(3),
            ..SamplingParams::default()
        };
        let p = softmax(&LOGITS, f64::from(t));
        let (freq, reported) = check(&params, 40_000);
        for i in 0..LOGITS.len() {
            assert!(
                (freq[i] - p[i]).abs() < 0.01,
                "t={t} token {i}: {} vs {}",
                freq[i],
                p[i]
            );
            if let Some(lp) = reported[i] {
                assert!(
                    (f64::from(lp) - p[i].ln()).abs() < 1e-5,
                    "t={t} token {i} logprob"
                );
            }
        }
    }
}

#[test]
fn top_k_and_top_p_renormalise_over_what_they_keep() {
    // Tokens by probability: 1 (3.0), 5 (2.9), 3 (2.5), 0, 2, 4.
    let p = softmax(&LOGITS, 1.0);
    let top2 = SamplingParams {
        top_k: 2,
        seed: Some(5),
        ..SamplingParams::default()
    };
    let (freq, reported) = check(&top2, 20_000);
    let mass = p[1] + p[5];
    for i in 0..6 {
        let expected = if i == 1 || i == 5 { p[i] / mass } else { 0.0 };
        assert!((freq[i] - expected).abs() < 0.015, "top_k token {i}");
        if let Some(lp) = reported[i] {
            assert!((f64::from(lp) - expected.ln()).abs() < 1e-5);
        }
    }
    // top_p just above p(1) + p(5) keeps exactly three tokens.
    let top_p = SamplingParams {
        top_p: ((p[1] + p[5]) + 1e-3) as f32,
        seed: Some(9),
        ..SamplingParams::default()
    };
    let (freq, reported) = check(&top_p, 20_000);
    let mass3 = p[1] + p[5] + p[3];
    for i in 0..6 {
        let expected = if [1, 3, 5].contains(&i) { p[i] / mass3 } else { 0.0 };
        assert!((freq[i] - expected).abs() < 0.015, "top_p token {i}");
        if let Some(lp) = reported[i] {
            assert!((f64::from(lp) - expected.ln()).abs() < 1e-5);
        }
    }
    // A tiny top_p keeps only the most likely token, with certainty.
    let tiny = SamplingParams {
        top_p: 1e-3,
        ..SamplingParams::default()
    };
    let (freq, reported) = check(&tiny, 100);
    assert_eq!(freq[1], 1.0);
    assert_eq!(reported[1], Some(0.0));
}

#[test]
fn top_p_over_a_large_vocabulary_matches_a_full_sort() {
    // Many tiny logits force the fallback path; a peaked head takes the fast one.
    let mut rng = SplitMix64::new(11);
    for peaked in [false, true] {
        // Peaked: three tokens hold almost all the mass (fast path). Flat: 200k tokens below the threshold
        // hold 13% of it, so the nucleus at 0.9 reaches into them (full sort).
        let logits: Vec<f32> = (0..200_003)
            .map(|i| {
                let noise = 0.1 * rng.next_normal() as f32;
                match (peaked, i < 3) {
                    (_, true) => noise,
                    (true, false) => -20.0 + noise,
                    (false, false) => -13.0 + noise,
                }
            })
            .collect();
        let probs = softmax(&logits, 1.0);
        let kept = nucleus(&probs, probs.len(), 0.9);
        let mut order: Vec<usize> = (0..probs.len()).collect();
        order.sort_by(|a, b| probs[*b].total_cmp(&probs[*a]));
        let mut cum = 0.0;
        let mut n = 0;
        for &i in &order {
            cum += probs[i];
            n += 1;
            if cum >= 0.9 {
                break;
            }
        }
        assert_eq!(kept, order[..n].to_vec(), "peaked={peaked}");
    }
}

#[test]
fn a_seed_fixes_the_draws() {
    let params = SamplingParams {
        seed: Some(42),
        ..SamplingParams::default()
    };
    let draw = || {
        let mut rng = SplitMix64::new(42);
        (0..50)
            .map(|_| sample(&LOGITS, &params, &mut rng).0)
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(), draw());
    let mut other = SplitMix64::new(43);
    let different: Vec<u32> = (0..50).map(|_| sample(&LOGITS, &params, &mut other).0).collect();
    assert_ne!(draw(), different);
}

#[test]
fn bad_parameters_are_named() {
    let bad = [
        SamplingParams {
            temperature: -1.0,
            ..SamplingParams::default()
        },
        SamplingParams {
            temperature: f32::NAN,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_p: 1.5,
            ..SamplingParams::default()
        },
    ];
    let messages: Vec<String> = bad.iter().map(|p| p.check().expect("refused")).collect();
    assert!(messages[0].contains("temperature") && messages[1].contains("temperature"));
    assert!(messages[2].contains("top_p") && messages[3].contains("top_p"));
    assert_eq!(SamplingParams::default().check(), None);
}

#[test]
fn normal_draws_have_unit_variance() {
    let mut rng = SplitMix64::new(1);
    let xs: Vec<f64> = (0..50_000).map(|_| rng.next_normal()).collect();
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
    assert!(
        mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
        "mean {mean} var {var}"
    );
}
