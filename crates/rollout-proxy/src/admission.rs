//! Admission before work: what a generation request may hold while its body is read and prepared.
//!
//! A request's session is known from its head, so before a byte of its body is read the request claims a
//! place among its session's generations (in flight plus being read or prepared, at most
//! `max_generations_per_session`), and then reserves the bytes it holds against its session's budget and
//! the proxy's: its body as it arrives (all of it at once when `Content-Length` says how much), then an
//! estimate of the parsed JSON tree before the body is parsed. A reservation past a budget is refused at
//! once (429 for the session's, 503 for the proxy's); nothing waits, so a session that holds its budget
//! with unfinished bodies holds only its own. The reservation ends when the request is prepared.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{ApiError, ApiErrorKind};

/// Bytes held against a cap, and (for a session) the requests holding them.
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicUsize,
    cap: usize,
    requests: AtomicUsize,
}

impl Budget {
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            used: AtomicUsize::new(0),
            cap,
            requests: AtomicUsize::new(0),
        })
    }

    fn try_add(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(n).filter(|&v| v <= self.cap)
            })
            .is_ok()
    }

    fn sub(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    /// The bytes held now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// The requests of this session being read or prepared.
    pub(crate) fn requests(&self) -> usize {
        self.requests.load(Ordering::Acquire)
    }

    /// Counts one more request; the caller has checked the session's limit under the store's lock.
    pub(crate) fn enter(&self) {
        self.requests.fetch_add(1, Ordering::AcqRel);
    }
}

/// One request's claim: its place among its session's generations and the bytes it holds.
#[derive(Debug)]
pub(crate) struct Claim {
    session: Arc<Budget>,
    proxy: Arc<Budget>,
    bytes: usize,
    retry_after: u64,
}

impl Claim {
    /// A claim on a session budget whose request count the caller has already raised.
    pub(crate) fn new(session: Arc<Budget>, proxy: Arc<Budget>, retry_after: u64) -> Self {
        Self {
            session,
            proxy,
            bytes: 0,
            retry_after,
        }
    }

    /// Holds `n` more bytes (`what` names them in a refusal).
    pub(crate) fn reserve(&mut self, n: usize, what: &str) -> Result<(), ApiError> {
        if n > self.session.cap {
            return Err(ApiError::new(
                ApiErrorKind::PayloadTooLarge,
                format!(
                    "{what} would hold about {n} bytes, more than a session's {} (max_request_bytes_per_session)",
                    self.session.cap
                ),
            ));
        }
        if !self.session.try_add(n) {
            return Err(ApiError::new(
                ApiErrorKind::RateLimited,
                format!(
                    "{what}: the session's requests being read or prepared would hold more than its {} bytes (max_request_bytes_per_session)",
                    self.session.cap
                ),
            )
            .with_retry_after(self.retry_after));
        }
        if !self.proxy.try_add(n) {
            self.session.sub(n);
            return Err(ApiError::new(
                ApiErrorKind::Overloaded,
                format!(
                    "{what}: the requests being read or prepared would hold more than the proxy's {} bytes (max_request_bytes)",
                    self.proxy.cap
                ),
            ));
        }
        self.bytes += n;
        Ok(())
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.session.sub(self.bytes);
        self.proxy.sub(self.bytes);
        self.session.requests.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An upper estimate of the memory `serde_json` takes to hold `body` parsed as a tree: the body's own
/// bytes (strings and keys) plus a node for each value and map entry, of which there are at most one per
/// `,`, `:`, `[` and `{` (counted inside strings too, which only over-estimates), plus one.
pub(crate) fn tree_estimate(body: &[u8]) -> usize {
    /// A `Value` (32 bytes) plus its share of the `Vec` or map node around it, and a map entry's key.
    const PER_NODE: usize = 80;
    let nodes = body
        .iter()
        .filter(|&&b| matches!(b, b',' | b':' | b'[' | b'{'))
        .count()
        + 1;
    body.len().saturating_add(nodes.saturating_mul(PER_NODE))
}
