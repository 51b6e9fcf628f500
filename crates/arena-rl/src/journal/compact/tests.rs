//! The compact trajectory form: bit-exact round trips, old journals still read, corrupt blobs refused.

use super::*;

fn trajectory(n: usize) -> ExportedTrajectory {
    // Half prompt, then turns: 128 sampled tokens, then 128 tokens of tool output; a few odd single tokens
    // inside turns keep the runs honest.
    let prompt = n / 2;
    let sampled = |i: usize| i >= prompt && (i - prompt) % 256 < 128 && i % 97 != 5;
    ExportedTrajectory {
        session_id: "s".into(),
        interaction_id: "i".into(),
        interaction_ids: vec!["i".into()],
        token_ids: (0..n).map(|i| (i as u32 * 7919) % 49_152).collect(),
        loss_mask: (0..n).map(|i| u8::from(sampled(i))).collect(),
        logprobs: (0..n)
            .map(|i| {
                if sampled(i) {
                    -(i as f32).sqrt() / 10.0
                } else {
                    0.0
                }
            })
            .collect(),
        versions: (0..n)
            .map(|i| if sampled(i) { (i / 1000) as i64 } else { -1 })
            .collect(),
        temperatures: (0..n).map(|i| if sampled(i) { 0.7 } else { 1.0 }).collect(),
        top_ps: vec![1.0; n],
        top_ks: vec![0; n],
        truncated: vec![0; n],
        prompt_len: prompt,
        reward: 0.75,
        original_reward: 0.75,
        finish_reason: "stop".into(),
        metadata: serde_json::json!({"task": "t"}),
        // One trajectory of the round trip carries an integrity hit, which the journal keeps as it is.
        integrity_hits: if n == 1 {
            vec![IntegrityHit {
                interaction_id: "i".into(),
                rule: "git-reflog".into(),
                category: "reflog-objects".into(),
                matched: "git reflog".into(),
            }]
        } else {
            Vec::new()
        },
    }
}

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Holder {
    #[serde(with = "super")]
    trajectories: Vec<ExportedTrajectory>,
}

#[test]
fn trajectories_round_trip_bit_for_bit() {
    let mut odd = trajectory(300);
    odd.logprobs[200] = -0.0; // a negative zero is a value, not an absent one
    odd.logprobs[201] = f32::MIN_POSITIVE;
    odd.versions[202] = i64::MIN;
    let old = ExportedTrajectory {
        temperatures: Vec::new(),
        top_ps: Vec::new(),
        top_ks: Vec::new(),
        truncated: Vec::new(),
        ..trajectory(10)
    };
    let holder = Holder {
        trajectories: vec![trajectory(0), trajectory(1), odd, old],
    };
    let line = serde_json::to_string(&holder).unwrap();
    let back: Holder = serde_json::from_str(&line).unwrap();
    for (a, b) in holder.trajectories.iter().zip(&back.trajectories) {
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.logprobs), bits(&b.logprobs));
        assert_eq!(a, b);
    }
}

#[test]
fn journals_written_before_the_compact_form_still_read() {
    let t = trajectory(20);
    let plain = serde_json::json!({ "trajectories": [t] }).to_string();
    let back: Holder = serde_json::from_str(&plain).unwrap();
    assert_eq!(back.trajectories, vec![t]);
}

#[test]
fn the_compact_form_is_a_fraction_of_the_plain_one() {
    // An agent-length trajectory: 32k tokens, half prompt, the rest sampled over several turns.
    let t = trajectory(32_768);
    let compact = serde_json::to_vec(&Holder {
        trajectories: vec![t.clone()],
    })
    .unwrap()
    .len();
    let plain = serde_json::to_vec(&serde_json::json!({ "trajectories": [t] }))
        .unwrap()
        .len();
    let per_token = compact as f64 / 32_768.0;
    eprintln!(
        "journal bytes per token: compact {per_token:.2}, plain {:.2}",
        plain as f64 / 32_768.0
    );
    assert!(
        per_token < 8.0,
        "{per_token:.2} bytes per token (plain: {:.2})",
        plain as f64 / 32_768.0
    );
    assert!(compact * 3 < plain, "compact {compact} bytes, plain {plain}");
}

#[test]
fn corrupt_blobs_and_misaligned_arrays_are_refused() {
    let blob = encode(&trajectory(50));
    let mut t = trajectory(0);
    for cut in [1, 5, blob.len() / 2, blob.len() - 1] {
        assert!(decode(&blob[..cut], &mut t).is_err(), "cut at {cut}");
    }
    let mut longer = blob.clone();
    longer.push(0);
    assert!(decode(&longer, &mut t).unwrap_err().contains("after"));
    // A huge claimed token count allocates nothing.
    let mut huge = vec![FORMAT];
    varint(&mut huge, u64::MAX / 2);
    assert!(decode(&huge, &mut t).unwrap_err().contains("claims"));
    // An array that does not match the tokens is refused when journaled, never written unreadable.
    let mut bad = trajectory(5);
    bad.logprobs.pop();
    let err = serde_json::to_string(&Holder {
        trajectories: vec![bad],
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("4 logprobs for 5 tokens"), "{err}");
}
