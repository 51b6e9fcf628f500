//! Several SGLang-protocol policy servers (`rollout.policy_servers`) as one engine: generations go round-robin
//! to the server with the fewest generations in flight, and weight updates and cache flushes go to every
//! server (all must succeed).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt as _;
use futures::future::BoxFuture;
use rollout_proxy::{EngineError, GenerateRequest, InferenceEngine, TokenStream, WeightUpdate};

/// The servers, each with its count of generations in flight.
pub struct EnginePool {
    engines: Vec<(Arc<dyn InferenceEngine>, Arc<AtomicUsize>)>,
    next: AtomicUsize,
}

impl EnginePool {
    /// A pool over `engines` (at least one).
    pub fn new(engines: Vec<Arc<dyn InferenceEngine>>) -> Self {
        Self {
            engines: engines
                .into_iter()
                .map(|e| (e, Arc::new(AtomicUsize::new(0))))
                .collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// How many servers the pool holds.
    pub fn len(&self) -> usize {
        self.engines.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }
}

struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl InferenceEngine for EnginePool {
    fn generate(&self, request: GenerateRequest) -> TokenStream {
        let n = self.engines.len();
        if n == 0 {
            return Box::pin(futures::stream::once(async {
                Err(EngineError::Internal(
                    "no policy server is configured".to_string(),
                ))
            }));
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let (engine, load) = (0..n)
            .map(|i| &self.engines[(start + i) % n])
            .min_by_key(|(_, load)| load.load(Ordering::Relaxed))
            .expect("the pool is not empty");
        load.fetch_add(1, Ordering::Relaxed);
        let guard = InFlight(load.clone());
        Box::pin(engine.generate(request).map(move |event| {
            let _ = &guard;
            event
        }))
    }

    fn max_context_len(&self) -> usize {
        self.engines
            .iter()
            .map(|(e, _)| e.max_context_len())
            .min()
            .unwrap_or(0)
    }

    fn update_weights_from_disk(&self, update: WeightUpdate) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async move {
            let results = futures::future::join_all(
                self.engines
                    .iter()
                    .map(|(e, _)| e.update_weights_from_disk(update.clone())),
            )
            .await;
            results.into_iter().collect()
        })
    }

    fn flush_cache(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async move {
            let results = futures::future::join_all(self.engines.iter().map(|(e, _)| e.flush_cache())).await;
            results.into_iter().collect()
        })
    }
}
