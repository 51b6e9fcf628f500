//! The generation engine through the public `Policy` handle: continuous batching gives the same tokens as
//! running alone, log-probabilities match scoring, stop tokens, limits, aborts, weight swaps, and a
//! key/value cache kept within its budget.

use anyhow::Result;
use trainer::backend::Cpu;
use trainer::model::CausalLm;
use trainer::{
    Architecture, Completion, Error, FinishReason, GenerationEvent, GenerationRequest, ModelConfig, Policy,
    PolicyOptions, SamplingParams, Weights, kv_cache_bytes_per_token,
};

fn config() -> ModelConfig {
    let mut c = ModelConfig::new(Architecture::Qwen3, 97, 32, 64, 2, 4, 2);
    c.head_dim = 16;
    c.max_position_embeddings = 128;
    c
}

fn weights(config: &ModelConfig, seed: u64) -> Weights {
    Weights::from_model(&CausalLm::<Cpu>::init(config, 0.3, seed, &Default::default()))
}

fn policy(seed: u64) -> Result<Policy> {
    let c = config();
    Ok(Policy::from_weights(
        c.clone(),
        &weights(&c, seed),
        PolicyOptions::default(),
    )?)
}

fn request(prompt: &[u32], sampling: SamplingParams, max_new_tokens: usize) -> GenerationRequest {
    GenerationRequest {
        input_ids: prompt.to_vec(),
        sampling,
        stop_token_ids: vec![],
        max_new_tokens,
    }
}

fn seeded(seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        seed: Some(seed),
        ..SamplingParams::default()
    }
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 2, 3, 4, 5, 6, 7],
        vec![50],
        vec![9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12, 13, 14, 15, 16, 17, 18, 19],
        vec![33, 44, 55],
    ]
}

fn params(i: usize) -> SamplingParams {
    if i.is_multiple_of(2) {
        SamplingParams::greedy()
    } else {
        seeded(i as u64)
    }
}

#[test]
fn sequences_joining_mid_flight_get_the_tokens_they_would_get_alone() -> Result<()> {
    let alone: Vec<Vec<u32>> = prompts()
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let policy = policy(1)?;
            Ok(policy
                .submit(request(p, params(i), 24 + i))?
                .collect_blocking()?
                .token_ids)
        })
        .collect::<Result<_>>()?;

    let policy = policy(1)?;
    let mut first = policy.submit(request(&prompts()[0], params(0), 24))?;
    let mut head = Vec::new();
    // Let the first sequence decode a few steps before the others join.
    for _ in 0..5 {
        match first.blocking_recv() {
            Some(GenerationEvent::Token { token_id, .. }) => head.push(token_id),
            other => panic!("expected a token, got {other:?}"),
        }
    }
    let others: Vec<_> = prompts()
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, p)| policy.submit(request(p, params(i), 24 + i)))
        .collect::<Result<_, _>>()?;
    let rest = first.collect_blocking()?;
    head.extend(rest.token_ids);
    assert_eq!(head, alone[0]);
    for (i, stream) in others.into_iter().enumerate() {
        let got = stream.collect_blocking()?;
        assert_eq!(got.finish_reason, Some(FinishReason::Length));
        assert_eq!(
            got.token_ids,
            alone[i + 1],
            "prompt {} differs when batched",
            i + 1
        );
    }
    Ok(())
}

#[test]
fn logprobs_are_those_of_the_sampled_distribution() -> Result<()> {
    let policy = policy(2)?;
    let prompt = vec![3, 1, 4, 1, 5, 9, 2, 6];
    for (temperature, top_k) in [(1.0f32, 0usize), (0.7, 0), (1.0, 5)] {
        let sampling = SamplingParams {
            temperature,
            top_k,
            seed: Some(77),
            ..SamplingParams::default()
        };
        let out = policy
            .submit(request(&prompt, sampling, 12))?
            .collect_blocking()?;
        let mut full = prompt.clone();
        full.extend(&out.token_ids);
        let logits = policy.score(&full)?;
        for (j, (&tok, &lp)) in out.token_ids.iter().zip(&out.logprobs).enumerate() {
            let row = logits.row(prompt.len() - 1 + j);
            let t = f64::from(temperature);
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let mut scaled: Vec<f64> = row.iter().map(|&l| (l as f64 - max) / t).collect();
            if top_k > 0 {
                let mut sorted = scaled.clone();
                sorted.sort_by(|a, b| b.total_cmp(a));
                let cut = sorted[top_k - 1];
                for s in &mut scaled {
                    if *s < cut {
                        *s = f64::NEG_INFINITY;
                    }
                }
            }
            let lse = scaled.iter().map(|s| s.exp()).sum::<f64>().ln();
            let expected = scaled[tok as usize] - lse;
            assert!(
                (f64::from(lp) - expected).abs() < 1e-4,
                "t={temperature} k={top_k} token {j}: {lp} vs {expected}"
            );
        }
    }
    Ok(())
}

#[test]
fn stop_tokens_and_limits_end_sequences() -> Result<()> {
    let policy = policy(3)?;
    let prompt = vec![10, 20, 30];
    let free = policy
        .submit(request(&prompt, SamplingParams::greedy(), 10))?
        .collect_blocking()?;
    assert_eq!(free.token_ids.len(), 10);
    assert_eq!(free.finish_reason, Some(FinishReason::Length));
    let stop = free.token_ids[4];
    let first_stop = free.token_ids.iter().position(|&t| t == stop).expect("present");
    let mut req = request(&prompt, SamplingParams::greedy(), 10);
    req.stop_token_ids = vec![stop];
    let stopped = policy.submit(req)?.collect_blocking()?;
    assert_eq!(stopped.token_ids, free.token_ids[..=first_stop].to_vec());
    assert_eq!(stopped.finish_reason, Some(FinishReason::Stop));

    let none = policy
        .submit(request(&prompt, SamplingParams::greedy(), 0))?
        .collect_blocking()?;
    assert!(none.token_ids.is_empty());
    assert_eq!(none.finish_reason, Some(FinishReason::Length));

    // The sequence never outgrows the model's positions: 120 prompt tokens + 8 = 128.
    let long: Vec<u32> = (0..120).map(|i| i % 97).collect();
    let capped = policy
        .submit(request(&long, SamplingParams::greedy(), 100))?
        .collect_blocking()?;
    assert_eq!(capped.token_ids.len(), 8);
    assert_eq!(capped.finish_reason, Some(FinishReason::Length));
    Ok(())
}

#[test]
fn dropping_the_stream_aborts_the_sequence() -> Result<()> {
    let policy = policy(4)?;
    let mut stream = policy.submit(request(&[1, 2, 3], seeded(1), 100))?;
    for _ in 0..3 {
        assert!(matches!(
            stream.blocking_recv(),
            Some(GenerationEvent::Token { .. })
        ));
    }
    drop(stream);
    let other = policy
        .submit(request(&[4, 5], SamplingParams::greedy(), 5))?
        .collect_blocking()?;
    assert_eq!(other.token_ids.len(), 5);
    // A score is answered between steps, after the engine published its count for the previous step.
    policy.score(&[1])?;
    assert_eq!(policy.in_flight(), 0, "the abandoned sequence is still decoding");
    Ok(())
}

#[test]
fn a_weight_swap_lands_between_steps_without_dropping_sequences() -> Result<()> {
    let c = config();
    let policy = policy(5)?;
    assert_eq!(policy.version(), 0);
    // The prefill gives the first token and four decode steps the next four; then the engine holds, so
    // the swap lands after exactly five tokens however fast the engine runs.
    policy.limit_decode_steps(Some(4))?;
    let mut stream = policy.submit(request(&[7, 7, 7], SamplingParams::greedy(), 40))?;
    let mut versions = Vec::new();
    for _ in 0..5 {
        match stream.blocking_recv() {
            Some(GenerationEvent::Token { version, .. }) => versions.push(version),
            other => panic!("expected a token, got {other:?}"),
        }
    }
    assert_eq!(policy.in_flight(), 1, "the held sequence is still in flight");
    let installed = policy.swap_weights(weights(&c, 6), 1)?.wait()?;
    assert_eq!(installed, 1);
    assert_eq!(policy.version(), 1);
    policy.limit_decode_steps(None)?;
    let rest = stream.collect_blocking()?;
    versions.extend(rest.versions);
    assert_eq!(versions.len(), 40, "the in-flight sequence was cut short");
    assert_eq!(rest.finish_reason, Some(FinishReason::Length));
    assert_eq!(versions[..5], [0; 5], "tokens before the swap");
    assert_eq!(versions[5..], [1; 35], "tokens after the swap");

    // New sequences use the new weights: same tokens as a policy started on them.
    let fresh = Policy::from_weights(c.clone(), &weights(&c, 6), PolicyOptions::default())?;
    let a = policy
        .submit(request(&[9, 9], SamplingParams::greedy(), 12))?
        .collect_blocking()?;
    let b = fresh
        .submit(request(&[9, 9], SamplingParams::greedy(), 12))?
        .collect_blocking()?;
    assert_eq!(a.token_ids, b.token_ids);

    // Weights of another shape are refused and change nothing.
    let mut other = config();
    other.intermediate_size = 48;
    let err = policy
        .swap_weights(weights(&other, 7), 2)?
        .wait()
        .expect_err("refused");
    assert!(matches!(err, Error::WeightMismatch(_)), "{err}");
    assert_eq!(policy.version(), 1);
    Ok(())
}

/// A pause holds the engine between steps whatever the step budget says: a request submitted while paused
/// is not admitted, and one in flight samples nothing, until the resume; a swap made meanwhile is what both
/// sample with.
#[test]
fn a_pause_holds_generation_until_the_resume() -> Result<()> {
    let c = config();
    let policy = policy(5)?;
    policy.limit_decode_steps(Some(2))?;
    let mut running = policy.submit(request(&[7, 7, 7], SamplingParams::greedy(), 20))?;
    let mut versions = Vec::new();
    for _ in 0..3 {
        match running.blocking_recv() {
            Some(GenerationEvent::Token { version, .. }) => versions.push(version),
            other => panic!("expected a token, got {other:?}"),
        }
    }
    policy.pause()?;
    // Lifting the budget does not lift the pause.
    policy.limit_decode_steps(None)?;
    let waiting = policy.submit(request(&[8, 8], SamplingParams::greedy(), 6))?;
    assert_eq!(policy.swap_weights(weights(&c, 6), 1)?.wait()?, 1);
    policy.score(&[1])?;
    assert_eq!(
        policy.in_flight(),
        2,
        "both sequences wait: one held, one not admitted"
    );
    policy.resume()?;
    versions.extend(running.collect_blocking()?.versions);
    assert_eq!(versions.len(), 20);
    assert_eq!(versions[..3], [0; 3], "tokens before the pause");
    assert_eq!(versions[3..], [1; 17], "tokens after the resume");
    assert_eq!(waiting.collect_blocking()?.versions, vec![1; 6]);
    Ok(())
}

#[test]
fn bad_requests_are_refused_up_front() -> Result<()> {
    let policy = policy(8)?;
    let cases = [
        (request(&[], SamplingParams::greedy(), 3), "input_ids is empty"),
        (
            request(&[97], SamplingParams::greedy(), 3),
            "token id 97 is out of range",
        ),
        (
            request(
                &[1],
                SamplingParams {
                    top_p: 0.0,
                    ..SamplingParams::default()
                },
                3,
            ),
            "top_p",
        ),
        (
            request(&vec![1; 128], SamplingParams::greedy(), 3),
            "max_position_embeddings",
        ),
    ];
    for (req, needle) in cases {
        let err = policy.submit(req).expect_err("refused");
        assert!(err.to_string().contains(needle), "{err}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handle_is_usable_from_async_code() -> Result<()> {
    let c = config();
    let policy = policy(9)?;
    let mut stream = policy.submit(request(&[5, 6, 7], SamplingParams::greedy(), 6))?;
    let mut tokens = Vec::new();
    while let Some(event) = stream.recv().await {
        match event {
            GenerationEvent::Token { token_id, .. } => tokens.push(token_id),
            GenerationEvent::Finished {
                reason,
                completion_tokens,
                ..
            } => {
                assert_eq!(reason, FinishReason::Length);
                assert_eq!(completion_tokens, 6);
            }
        }
    }
    assert_eq!(tokens.len(), 6);
    let logits = policy.score_async(&[5, 6, 7]).await?;
    assert_eq!((logits.len, logits.vocab), (3, c.vocab_size));
    assert_eq!(policy.swap_weights(weights(&c, 10), 3)?.installed().await?, 3);
    Ok(())
}

/// Options whose key/value cache holds `tokens` slots of [`config`]'s model.
fn cache_of(tokens: u64) -> PolicyOptions {
    PolicyOptions {
        kv_cache_bytes: tokens * kv_cache_bytes_per_token(&config()),
        ..PolicyOptions::default()
    }
}

#[test]
fn a_cache_budget_sets_the_newest_sequences_aside_and_they_resume_unchanged() -> Result<()> {
    let c = config();
    let w = weights(&c, 11);
    // Six sequences of 1 to 19 prompt tokens and 40 new ones: decoding together, the batch outgrows 160
    // slots (six rows of up to 59 columns) long before any sequence ends.
    let requests: Vec<_> = (0..6)
        .map(|i| request(&prompts()[i % 4], params(i), 40))
        .collect();
    let run = |options: PolicyOptions| -> Result<(Vec<Completion>, trainer::CacheStats)> {
        let policy = Policy::from_weights(c.clone(), &w, options)?;
        let streams: Vec<_> = requests
            .iter()
            .map(|r| policy.submit(r.clone()))
            .collect::<Result<_, _>>()?;
        let done = streams
            .into_iter()
            .map(|s| s.collect_blocking())
            .collect::<Result<_, _>>()?;
        // The engine frees the rows just after it sends their last events.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while policy.cache_stats().tokens > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        Ok((done, policy.cache_stats()))
    };
    let (free, free_stats) = run(PolicyOptions::default())?;
    let (bounded, stats) = run(cache_of(160))?;
    assert_eq!(stats.budget_tokens, 160);
    assert!(
        free_stats.peak_tokens > 160 && free_stats.retractions == 0,
        "without a tight budget the batch takes more than 160 slots: {free_stats:?}"
    );
    assert!(stats.peak_tokens <= 160, "{stats:?}");
    assert!(stats.retractions >= 1, "nothing was set aside: {stats:?}");
    assert_eq!(stats.tokens, 0, "the cache is freed once every sequence ends");
    for (i, (a, b)) in free.iter().zip(&bounded).enumerate() {
        assert_eq!(a.token_ids, b.token_ids, "sequence {i}'s tokens");
        assert_eq!(a.finish_reason, Some(FinishReason::Length));
        assert_eq!(b.finish_reason, Some(FinishReason::Length));
        for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-4, "sequence {i}'s logprobs {x} and {y}");
        }
    }
    Ok(())
}

#[test]
fn a_sequence_alone_ends_when_it_fills_the_cache_and_longer_prompts_are_refused() -> Result<()> {
    let c = config();
    let policy = Policy::from_weights(c.clone(), &weights(&c, 12), cache_of(30))?;
    let done = policy
        .submit(request(&prompts()[0], SamplingParams::greedy(), 100))?
        .collect_blocking()?;
    assert_eq!(done.finish_reason, Some(FinishReason::Length));
    // Seven prompt tokens and 23 sampled ones fill the 30 slots; the 24th sampled token needs none.
    assert_eq!(done.token_ids.len(), 24);
    assert!(policy.cache_stats().peak_tokens <= 30);

    let err = policy
        .submit(request(&[1; 30], SamplingParams::greedy(), 3))
        .expect_err("refused");
    assert!(err.to_string().contains("kv_cache_bytes"), "{err}");
    let err = Policy::from_weights(c.clone(), &weights(&c, 12), cache_of(1)).expect_err("refused");
    assert!(err.to_string().contains("kv_cache_bytes"), "{err}");
    Ok(())
}
