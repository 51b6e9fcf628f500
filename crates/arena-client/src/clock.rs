//! Time for the route registry, injectable so tests drive probes and throttling without sleeping.
//!
//! [`SystemClock`] is tokio's clock; [`ManualClock`] only moves when a test calls [`ManualClock::advance`],
//! which wakes every sleeper whose deadline has come.

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::sync::{oneshot, watch};

/// A monotonic clock with sleeping.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Time since the clock's origin.
    fn now(&self) -> Duration;
    /// Resolves once `duration` has passed on this clock.
    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()>;
}

/// The real clock (tokio's, so it also follows tokio's paused time).
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    origin: tokio::time::Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        Box::pin(tokio::time::sleep(duration))
    }
}

/// A clock that moves only when told to.
pub struct ManualClock {
    state: Mutex<ManualState>,
    changed: watch::Sender<u64>,
}

struct ManualState {
    now: Duration,
    sleepers: Vec<(Duration, oneshot::Sender<()>)>,
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &self.lock().now)
            .finish()
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self {
            state: Mutex::new(ManualState {
                now: Duration::ZERO,
                sleepers: Vec::new(),
            }),
            changed: watch::channel(0).0,
        }
    }
}

impl ManualClock {
    /// A clock at zero.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ManualState> {
        // The state is a time and a list of senders; a panic elsewhere cannot leave it half-updated.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Moves time forward and wakes every sleeper whose deadline has come.
    pub fn advance(&self, by: Duration) {
        let due = {
            let mut state = self.lock();
            state.now += by;
            let now = state.now;
            let (due, pending): (Vec<_>, Vec<_>) = state.sleepers.drain(..).partition(|(at, _)| *at <= now);
            state.sleepers = pending;
            due
        };
        for (_, tx) in due {
            let _ = tx.send(());
        }
        self.changed.send_modify(|v| *v += 1);
    }

    /// Sleepers still waiting.
    pub fn sleepers(&self) -> usize {
        let mut state = self.lock();
        state.sleepers.retain(|(_, tx)| !tx.is_closed());
        state.sleepers.len()
    }

    /// Waits until at least `n` sleepers wait, so a test advances only once a background task sleeps.
    pub async fn wait_for_sleepers(&self, n: usize) {
        let mut rx = self.changed.subscribe();
        while self.sleepers() < n {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        self.lock().now
    }

    fn sleep(&self, duration: Duration) -> BoxFuture<'static, ()> {
        let (tx, rx) = oneshot::channel();
        {
            let mut state = self.lock();
            if duration.is_zero() {
                return Box::pin(async {});
            }
            let at = state.now + duration;
            state.sleepers.push((at, tx));
        }
        self.changed.send_modify(|v| *v += 1);
        Box::pin(async move {
            // A dropped sender means the clock is gone; nothing will ever wake us, so never resolve.
            if rx.await.is_err() {
                futures::future::pending::<()>().await;
            }
        })
    }
}

#[cfg(test)]
mod tests;
