//! The bounded pool on which generation requests (those with a body of 8 KiB or more; see
//! `protocol::prepare_off_thread`) are parsed, rendered with the chat template and tokenised, off the
//! async threads, with admission: a request finds room at once or is refused at once
//! (503 with `Retry-After`, in its protocol's error body). A flood of large prompts therefore holds at
//! most [`PoolLimits::threads`] threads busy and [`PoolLimits::queue`] requests waiting, while `/health`,
//! the control endpoints and the streams already running keep the async threads to themselves.

#[cfg(test)]
mod tests;

use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::error::{ApiError, ApiErrorKind};

/// How much preparation work (parsing, rendering, tokenising) the proxy takes on at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLimits {
    /// Requests prepared at once, each on a blocking thread of its own (default: the cores this process may
    /// use).
    pub threads: usize,
    /// Requests that may wait for a thread; one more is answered 503 at once (default 1024).
    pub queue: usize,
}

impl Default for PoolLimits {
    fn default() -> Self {
        Self {
            threads: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            queue: 1024,
        }
    }
}

impl PoolLimits {
    /// Checks that the pool has a thread (a queue of 0 is allowed: nothing waits).
    pub fn validate(&self) -> Result<(), String> {
        if self.threads == 0 {
            return Err("the preparation pool needs at least 1 thread, got 0".into());
        }
        Ok(())
    }
}

/// The pool: admission (threads plus queue) and the threads running.
pub(crate) struct WorkPool {
    limits: PoolLimits,
    admitted: Arc<Semaphore>,
    running: Arc<Semaphore>,
}

impl std::fmt::Debug for WorkPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkPool")
            .field("limits", &self.limits)
            .field("held", &self.held())
            .finish()
    }
}

impl WorkPool {
    pub(crate) fn new(limits: PoolLimits) -> Self {
        Self {
            admitted: Arc::new(Semaphore::new(limits.threads.saturating_add(limits.queue))),
            running: Arc::new(Semaphore::new(limits.threads)),
            limits,
        }
    }

    /// Requests running or waiting.
    pub(crate) fn held(&self) -> usize {
        (self.limits.threads.saturating_add(self.limits.queue))
            .saturating_sub(self.admitted.available_permits())
    }

    /// Runs `work` on a blocking thread once one is free, or refuses at once when the pool and its queue are
    /// full. A panic in `work` is a 500 for this request, never the process's end. When the caller goes
    /// away, work already running finishes (and drops what it built) before its thread counts as free.
    pub(crate) async fn run<T, F>(&self, work: F) -> Result<T, ApiError>
    where
        T: Send + 'static,
        F: FnOnce() -> Result<T, ApiError> + Send + 'static,
    {
        let Ok(admitted) = Arc::clone(&self.admitted).try_acquire_owned() else {
            return Err(ApiError::new(
                ApiErrorKind::Overloaded,
                format!(
                    "the proxy is preparing {} requests and has {} waiting, its limit; retry shortly",
                    self.limits.threads, self.limits.queue
                ),
            )
            .with_retry_after(1));
        };
        let running = Arc::clone(&self.running)
            .acquire_owned()
            .await
            .expect("the pool's semaphore is never closed");
        let task = tokio::task::spawn_blocking(move || {
            let _held = (admitted, running);
            work()
        });
        match task.await {
            Ok(result) => result,
            Err(e) => {
                tracing::error!(error = %e, "preparing a request failed");
                Err(ApiError::internal(
                    "preparing the request failed inside the proxy",
                ))
            }
        }
    }
}
