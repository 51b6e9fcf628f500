//! The Responses module's store: the answers kept for `previous_response_id` and
//! `GET /v1/responses/{id}`, per session, within the byte budgets of [`SessionLimits`].
//!
//! It lives beside the session store (a [`SessionSide`]), under its own lock: the session store keeps
//! only what every protocol needs, and this store forgets a session's answers when the session is
//! exported or expires.

#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use serde_json::Value;

use crate::protocol::bounds;
use crate::session::{SessionLimits, SessionStore};
use crate::state::SessionSide;

/// The most responses one session keeps; the oldest are forgotten first.
pub(crate) const MAX_STORED_RESPONSES: usize = 1024;

/// A stored response: what it added to the conversation, and the object answered.
///
/// The messages are shared (`Arc`), so a continuation takes its chain under the store's lock by
/// reference and copies it after; the response object is kept as the JSON it was answered with, so a
/// `GET` answers those bytes (shared, however many read them at once) and serialises nothing.
#[derive(Debug)]
pub(crate) struct StoredResponse {
    pub(crate) previous: Option<Box<str>>,
    /// The messages its request added, in the core's form (without `instructions`).
    pub(crate) input: Arc<[Value]>,
    /// Its output as one assistant message in the core's form.
    pub(crate) output: Arc<Value>,
    /// The response object as answered (its `instructions`, `tools`, `metadata`, `text` and
    /// `reasoning` included), as JSON.
    pub(crate) response: Bytes,
}

impl StoredResponse {
    /// The memory it holds (what the byte budgets count): its messages as trees, its response's JSON.
    pub(crate) fn bytes(&self) -> usize {
        self.input.iter().map(bounds::tree_bytes).sum::<usize>()
            + bounds::tree_bytes(&self.output)
            + self.response.len()
            + self.previous.as_ref().map_or(0, |p| p.len())
    }
}

/// One session's stored responses.
#[derive(Debug, Default)]
pub(crate) struct SessionResponses {
    responses: HashMap<Box<str>, StoredResponse>,
    order: VecDeque<Box<str>>,
    bytes: usize,
}

impl SessionResponses {
    /// Keeps `response` as `id`, then forgets the oldest while more than [`MAX_STORED_RESPONSES`] are
    /// kept or they take more than `max_bytes` (the new one too, if it alone does).
    pub(crate) fn insert(&mut self, id: &str, response: StoredResponse, max_bytes: usize) {
        self.bytes += response.bytes() + id.len();
        match self.responses.insert(id.into(), response) {
            Some(old) => self.bytes -= old.bytes() + id.len(),
            None => self.order.push_back(id.into()),
        }
        while self.order.len() > MAX_STORED_RESPONSES || self.bytes > max_bytes {
            let Some(old) = self.order.pop_front() else {
                break;
            };
            if let Some(gone) = self.responses.remove(&old) {
                self.bytes -= gone.bytes() + old.len();
            }
        }
    }

    /// The bytes the stored responses take.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The response object of `id`, as JSON.
    pub(crate) fn get(&self, id: &str) -> Option<&Bytes> {
        self.responses.get(id).map(|r| &r.response)
    }

    /// The conversation that response `id` ended: every input and output of its chain, oldest first,
    /// shared with the store (copying them is the caller's, after the lock).
    pub(crate) fn conversation(&self, id: &str) -> Option<Vec<Turn>> {
        let mut chain = Vec::new();
        let mut at = Some(id);
        while let Some(id) = at {
            let stored = self.responses.get(id)?;
            chain.push(stored);
            at = stored.previous.as_deref();
            if chain.len() > self.responses.len() {
                return None;
            }
        }
        Some(
            chain
                .into_iter()
                .rev()
                .map(|stored| (stored.input.clone(), stored.output.clone()))
                .collect(),
        )
    }
}

/// One stored response's part of a conversation: the messages its request added, then its output.
pub(crate) type Turn = (Arc<[Value]>, Arc<Value>);

/// The messages of `turns`, copied (outside the store's lock).
pub(crate) fn messages(turns: &[Turn]) -> Vec<Value> {
    let mut out = Vec::with_capacity(turns.iter().map(|(input, _)| input.len() + 1).sum());
    for (input, output) in turns {
        out.extend(input.iter().cloned());
        out.push(Value::clone(output));
    }
    out
}

/// Every session's stored responses, within a budget per session and one across sessions.
#[derive(Debug)]
pub(crate) struct ResponseStore {
    max_per_session: usize,
    max_total: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<Arc<str>, SessionResponses>,
    /// Bytes of stored answers across sessions.
    bytes: usize,
}

impl ResponseStore {
    /// A store within `limits`' Responses budgets.
    pub(crate) fn new(limits: &SessionLimits) -> Self {
        Self {
            max_per_session: limits.max_response_bytes_per_session,
            max_total: limits.max_response_bytes,
            inner: Mutex::new(Inner::default()),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `response` as `response_id` in session `id` if the session store (whose lock the caller
    /// holds) still holds the session, within the byte budgets: the session's own, and what the other
    /// sessions leave of the total.
    pub(crate) fn insert(
        &self,
        sessions: &SessionStore,
        id: &Arc<str>,
        response_id: &str,
        response: StoredResponse,
    ) {
        if !sessions.holds(id) {
            return;
        }
        let mut inner = self.inner();
        let inner = &mut *inner;
        let stored = inner.sessions.entry(id.clone()).or_default();
        let before = stored.bytes();
        let others = inner.bytes - before;
        let budget = self.max_per_session.min(self.max_total.saturating_sub(others));
        stored.insert(response_id, response, budget);
        inner.bytes = others + stored.bytes();
    }

    /// The response object `response_id` of session `id`, as JSON (shared, not copied).
    pub(crate) fn get(&self, id: &str, response_id: &str) -> Option<Bytes> {
        self.inner()
            .sessions
            .get(id)
            .and_then(|s| s.get(response_id).cloned())
    }

    /// A stored response object of any session, by id (for the admin), as JSON.
    pub(crate) fn find(&self, response_id: &str) -> Option<Bytes> {
        self.inner()
            .sessions
            .values()
            .find_map(|s| s.get(response_id).cloned())
    }

    /// The conversation response `response_id` of session `id` ended (see
    /// [`SessionResponses::conversation`]).
    pub(crate) fn conversation(&self, id: &str, response_id: &str) -> Option<Vec<Turn>> {
        self.inner().sessions.get(id)?.conversation(response_id)
    }
}

impl SessionSide for ResponseStore {
    fn forget(&self, session: &str) {
        let mut inner = self.inner();
        if let Some(gone) = inner.sessions.remove(session) {
            inner.bytes = inner.bytes.saturating_sub(gone.bytes());
        }
    }

    fn bytes(&self) -> usize {
        self.inner().bytes
    }
}
