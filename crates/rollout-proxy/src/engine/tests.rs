//! Tests of the fake engine: determinism, scripts, limits, stop tokens, failures and weight updates.

use futures::StreamExt;

use super::*;

async fn run(
    engine: &dyn InferenceEngine,
    prompt: &[u32],
    sampling: SamplingParams,
) -> (Vec<SampledToken>, FinishReason) {
    let mut stream = engine.generate(GenerateRequest {
        input_ids: prompt.into(),
        sampling,
        images: Vec::new(),
        affinity: None,
    });
    let mut tokens = Vec::new();
    while let Some(event) = stream.next().await {
        match event.expect("no error") {
            EngineEvent::Token(t) => tokens.push(t),
            EngineEvent::Finished(f) => return (tokens, f),
        }
    }
    panic!("no finish event");
}

fn sampling(max_new_tokens: u32, stop: &[u32]) -> SamplingParams {
    SamplingParams {
        max_new_tokens,
        stop_token_ids: stop.to_vec(),
        ..SamplingParams::default()
    }
}

#[tokio::test]
async fn the_fake_is_deterministic_and_honours_limits_and_stops() {
    let config = FakeEngineConfig {
        output_len: 10,
        eos_token: Some(2),
        vocab: 100..200,
        ..FakeEngineConfig::default()
    };
    let a = FakeEngine::new(config.clone());
    let b = FakeEngine::new(config);
    let (ta, fa) = run(&a, &[1, 2, 3], sampling(64, &[2])).await;
    let (tb, _) = run(&b, &[1, 2, 3], sampling(64, &[2])).await;
    assert_eq!(ta, tb, "same seed and prompt, same tokens");
    assert_eq!(ta.len(), 11);
    assert!(
        ta[..10]
            .iter()
            .all(|t| (100..200).contains(&t.id) && t.logprob < 0.0)
    );
    assert_eq!(fa, FinishReason::Stop { matched: Some(2) });
    let (tc, _) = run(&a, &[1, 2, 4], sampling(64, &[2])).await;
    assert_ne!(ta, tc, "another prompt, other tokens");
    let (td, fd) = run(&a, &[1, 2, 3], sampling(4, &[2])).await;
    assert_eq!((td.len(), fd), (4, FinishReason::Length));
    let (te, fe) = run(&a, &[1, 2, 3], sampling(64, &[])).await;
    assert_eq!(
        (te.len(), fe),
        (11, FinishReason::Stop { matched: None }),
        "eos not listed as a stop token"
    );
    assert_eq!(a.outputs().len(), 4);
}

#[tokio::test]
async fn scripts_failures_context_and_weight_updates() {
    let engine = FakeEngine::new(FakeEngineConfig {
        max_context_len: 5,
        ..FakeEngineConfig::default()
    });
    engine.push_script(vec![7, 8, 9]);
    let (tokens, finish) = run(&engine, &[1], sampling(10, &[9])).await;
    assert_eq!(tokens.iter().map(|t| t.id).collect::<Vec<_>>(), vec![7, 8, 9]);
    assert_eq!(finish, FinishReason::Stop { matched: Some(9) });
    engine.fail_next(EngineError::Internal("boom".into()));
    let mut stream = engine.generate(GenerateRequest {
        input_ids: vec![1].into(),
        sampling: sampling(3, &[]),
        images: Vec::new(),
        affinity: None,
    });
    assert!(matches!(stream.next().await, Some(Err(EngineError::Internal(m))) if m == "boom"));
    let mut stream = engine.generate(GenerateRequest {
        input_ids: vec![1; 5].into(),
        sampling: sampling(3, &[]),
        images: Vec::new(),
        affinity: None,
    });
    assert!(matches!(
        stream.next().await,
        Some(Err(EngineError::ContextLengthExceeded { prompt: 5, max: 5 }))
    ));
    engine
        .update_weights_from_disk(WeightUpdate {
            path: "/w".into(),
            version: None,
        })
        .await
        .expect("updates");
    let (tokens, _) = run(&engine, &[1], sampling(2, &[])).await;
    assert!(tokens.iter().all(|t| t.version == 1));
    assert!(!engine.supports_images());
}

#[tokio::test]
async fn default_weight_sync_is_unsupported() {
    struct Minimal;
    impl InferenceEngine for Minimal {
        fn generate(&self, _request: GenerateRequest) -> TokenStream {
            Box::pin(futures::stream::empty())
        }
        fn max_context_len(&self) -> usize {
            16
        }
    }
    let err = Minimal
        .update_weights_from_disk(WeightUpdate {
            path: "/w".into(),
            version: Some(1),
        })
        .await
        .expect_err("unsupported");
    assert_eq!(
        err.to_string(),
        "the engine does not support update_weights_from_disk"
    );
    assert!(Minimal.flush_cache().await.is_err());
}
