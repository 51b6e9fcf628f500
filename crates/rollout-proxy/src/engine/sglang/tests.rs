//! Tests of renormalising SGLang's untruncated log-probabilities over the tokens its sampler kept.

use super::*;

fn lns(probs: &[f64]) -> Vec<f64> {
    probs.iter().map(|p| p.ln()).collect()
}

fn check(probs: &[f64], top_p: f64, top_k: Option<usize>, expect: f64) {
    let got = kept_mass(&lns(probs), Truncation { top_p, top_k });
    assert!(
        (got - expect).abs() < 1e-12,
        "{probs:?} top_p {top_p} top_k {top_k:?}: kept {got}, expected {expect}"
    );
}

#[test]
fn the_kept_mass_follows_sglangs_joint_top_k_top_p_filter() {
    let probs = [0.5, 0.3, 0.1, 0.05, 0.05];
    check(&probs, 1.0, Some(2), 0.8);
    check(&probs, 0.7, None, 0.8);
    check(&probs, 0.45, None, 0.5);
    // SGLang drops a token only when the mass before it exceeds top-p.
    check(&probs, 0.5, None, 0.8);
    check(&probs, 0.7, Some(1), 0.5);
    check(&probs, 0.95, Some(4), 0.95);
    // The list reaches past top-p: exact even though it is short.
    check(&probs[..3], 0.75, None, 0.8);
    check(&probs[..2], 0.75, None, 0.8);
    // The list ends inside the nucleus: between top-p and top-p plus the smallest returned probability.
    check(&[0.2, 0.2], 0.9, None, 0.95);
    // A top-k longer than the list: between what was seen and what the unseen tokens can add.
    check(&[0.4, 0.2], 1.0, Some(4), 0.6 + 0.2);
}

fn decode(truncation: Option<Truncation>, chunks: &[Value]) -> Vec<Result<EngineEvent, EngineError>> {
    let mut decoder = Decoder::new(0, truncation);
    let mut out = VecDeque::new();
    for c in chunks {
        decoder.chunk(c.to_string().as_bytes(), &mut out);
    }
    out.into_iter().collect()
}

fn logprobs(events: &[Result<EngineEvent, EngineError>]) -> Vec<f32> {
    events
        .iter()
        .filter_map(|e| match e {
            Ok(EngineEvent::Token(t)) => Some(t.logprob),
            _ => None,
        })
        .collect()
}

#[test]
fn cumulative_chunks_are_renormalised_per_token() {
    let (a, b) = (0.6f64.ln(), 0.3f64.ln());
    let top = |x: f64, y: f64| serde_json::json!([[x, 5, null], [y, 6, null], [0.1f64.ln(), 7, null]]);
    let chunks = [
        serde_json::json!({"meta_info": {"completion_tokens": 1, "output_token_logprobs": [[a, 5, null]],
            "output_top_logprobs": [top(a, b)]}}),
        serde_json::json!({"meta_info": {"completion_tokens": 2, "finish_reason": {"type": "length"},
            "output_token_logprobs": [[a, 5, null], [b, 6, null]],
            "output_top_logprobs": [top(a, b), top(a, b)]}}),
    ];
    let t = Truncation {
        top_p: 1.0,
        top_k: Some(2),
    };
    let got = logprobs(&decode(Some(t), &chunks));
    let expect = [(0.6f64 / 0.9).ln() as f32, (0.3f64 / 0.9).ln() as f32];
    assert_eq!(got.len(), 2);
    for (g, e) in got.iter().zip(expect) {
        assert!((g - e).abs() < 1e-6, "{got:?} vs {expect:?}");
    }
    assert_eq!(
        logprobs(&decode(None, &chunks)),
        vec![a as f32, b as f32],
        "untruncated requests keep SGLang's values"
    );
}

#[test]
fn sampled_distribution_logprobs_are_kept_and_missing_tops_are_an_error() {
    let t = Some(Truncation {
        top_p: 0.9,
        top_k: None,
    });
    let served = serde_json::json!({"meta_info": {"completion_tokens": 1, "logprob_distribution": "sampled",
        "finish_reason": {"type": "length"}, "output_token_logprobs": [[-0.25, 5, null]]}});
    assert_eq!(logprobs(&decode(t, &[served])), vec![-0.25]);
    let bare = serde_json::json!({"meta_info": {"completion_tokens": 1, "finish_reason": {"type": "length"},
        "output_token_logprobs": [[-0.25, 5, null]]}});
    let events = decode(t, &[bare]);
    assert!(
        matches!(&events[0], Err(EngineError::Protocol(m)) if m.contains("output_top_logprobs")),
        "{events:?}"
    );
}

#[test]
fn a_null_logprob_is_a_protocol_error() {
    let chunk = serde_json::json!({"meta_info": {"completion_tokens": 1, "finish_reason": {"type": "length"},
        "output_token_logprobs": [[null, 5, null]]}});
    let events = decode(None, &[chunk]);
    assert!(
        matches!(&events[..], [Err(EngineError::Protocol(m))] if m.contains("NaN")),
        "{events:?}"
    );
}
