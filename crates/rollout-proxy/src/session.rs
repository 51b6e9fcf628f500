//! The session store: sessions, their keys, capacity grants and admission, idle expiry and tombstones.
//! It holds what every protocol needs and knows no protocol: what one protocol keeps per session (the
//! Responses module's stored answers) is a [`crate::state::SessionSide`] beside it.
//!
//! It is a plain data structure with no IO and no clock of its own: every operation that depends on time
//! takes `now`, so tests drive it deterministically and the server drives it from a timer.

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;
use serde_json::{Map, Value};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::admission::{Budget, Claim};
use crate::auth;
use crate::error::{ApiError, ApiErrorKind};
use crate::integrity::{self, SessionGuard};
use crate::trajectory::{Interaction, Trajectory};

/// Bounds on what the store holds.
#[derive(Debug, Clone)]
pub struct SessionLimits {
    /// The most sessions held at once (live or ended but not yet exported).
    pub max_sessions: usize,
    /// The most tokens held at once across all sessions, counting tokens reserved by running generations.
    pub max_stored_tokens: u64,
    /// A session idle this long (no request, no generation running) is dropped.
    pub session_timeout: Duration,
    /// How many ended ids are remembered so that late requests get 410 rather than 404.
    pub max_tombstones: usize,
    /// What a 429 tells clients to wait, in seconds.
    pub retry_after_seconds: u64,
    /// The most generations one session may have in flight; one more is answered 429. Claude Code runs
    /// a few at once (the main turn, a title, subagents); a client that opens many and stops reading would
    /// otherwise hold their token reservations.
    pub max_generations_per_session: u32,
    /// The most bytes of JSON one session's stored Responses answers may take (their echoed `metadata`,
    /// `tools`, `text` and `reasoning` included); past it the oldest are forgotten first.
    pub max_response_bytes_per_session: usize,
    /// The most bytes of stored Responses answers across all sessions; a session storing past it forgets
    /// its own oldest first.
    pub max_response_bytes: usize,
    /// The most bytes one session's generation requests may hold while they are read and prepared: their
    /// bodies and an estimate of their parsed JSON (`crate::admission`); past it 429, and a single request
    /// larger than it 413.
    pub max_request_bytes_per_session: usize,
    /// The same across all sessions; past it 503.
    pub max_request_bytes: usize,
    /// A `concat` export writes each leaf's whole chain, so a tree of many branches off one long turn
    /// would repeat that turn once per branch: an export writes at most this many times the tokens the
    /// session stored, keeping the newest leaves and leaving out older ones past it (at least 1).
    pub max_export_amplification: u32,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            max_sessions: 4096,
            max_stored_tokens: 256 * 1024 * 1024,
            session_timeout: Duration::from_secs(7200),
            max_tombstones: 65_536,
            retry_after_seconds: 1,
            max_generations_per_session: 16,
            max_response_bytes_per_session: 64 * 1024 * 1024,
            max_response_bytes: 2 * 1024 * 1024 * 1024,
            max_request_bytes_per_session: 256 * 1024 * 1024,
            max_request_bytes: 1024 * 1024 * 1024,
            max_export_amplification: 4,
        }
    }
}

/// Why a session is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tombstone {
    Exported,
    Expired,
}

/// One session.
#[derive(Debug)]
pub(crate) struct Session {
    pub(crate) id: Arc<str>,
    pub(crate) task_id: String,
    key_digest: [u8; 32],
    pub(crate) ended: bool,
    ended_tx: watch::Sender<bool>,
    pub(crate) trajectory: Trajectory,
    pub(crate) context_overflow: Option<String>,
    pub(crate) system_error: Option<String>,
    pub(crate) last_activity: Instant,
    pub(crate) in_flight: u32,
    pub(crate) metadata: Value,
    pub(crate) generation_defaults: Map<String, Value>,
    pub(crate) stored_tokens: u64,
    pub(crate) requests: u64,
    /// The integrity scanner of the session's generations, when it has rules.
    pub(crate) guard: Option<Arc<SessionGuard>>,
    /// Integrity hits recorded on its interactions, per rule.
    pub(crate) integrity_hits: BTreeMap<String, u64>,
    /// What its generation requests hold while they are read and prepared.
    bodies: Arc<Budget>,
}

/// What ending a session reports.
#[derive(Debug)]
pub(crate) struct EndSummary {
    pub(crate) session_id: Arc<str>,
    pub(crate) interaction_count: u64,
    pub(crate) context_overflow: Option<String>,
    pub(crate) system_error: Option<String>,
    pub(crate) integrity_hits: BTreeMap<String, u64>,
}

/// All sessions.
#[derive(Debug)]
pub(crate) struct SessionStore {
    limits: SessionLimits,
    capacity: Option<i64>,
    sessions: HashMap<Arc<str>, Session>,
    keys: HashMap<[u8; 32], Arc<str>>,
    tombstones: HashMap<Arc<str>, Tombstone>,
    tombstone_order: VecDeque<Arc<str>>,
    stored_tokens: u64,
    reserved_tokens: u64,
}

/// Session ids may only hold these characters, so they survive headers and the agent's id pattern.
fn valid_task_id(task_id: &str) -> bool {
    !task_id.is_empty()
        && task_id.len() <= 160
        && task_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
        && task_id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
}

impl SessionStore {
    /// A store with `limits`; with `grants`, sessions may only start against capacity granted by
    /// `grant_capacity` (the reference's behaviour).
    pub(crate) fn new(limits: SessionLimits, grants: bool) -> Self {
        Self {
            limits,
            capacity: grants.then_some(0),
            sessions: HashMap::new(),
            keys: HashMap::new(),
            tombstones: HashMap::new(),
            tombstone_order: VecDeque::new(),
            stored_tokens: 0,
            reserved_tokens: 0,
        }
    }

    fn rate_limited(&self, message: impl Into<String>) -> ApiError {
        ApiError::new(ApiErrorKind::RateLimited, message).with_retry_after(self.limits.retry_after_seconds)
    }

    /// Adds `count` to the capacity; answers the new capacity (`None` when grants are off).
    pub(crate) fn grant(&mut self, count: i64) -> Option<i64> {
        if let Some(c) = self.capacity.as_mut() {
            *c += count;
        }
        self.capacity
    }

    pub(crate) fn live_sessions(&self) -> usize {
        self.sessions.len()
    }

    pub(crate) fn stored_tokens(&self) -> u64 {
        self.stored_tokens
    }

    pub(crate) fn reserved_tokens(&self) -> u64 {
        self.reserved_tokens
    }

    /// Whether session `id` is held (live, or ended and not yet exported).
    pub(crate) fn holds(&self, id: &str) -> bool {
        self.sessions.contains_key(id)
    }

    /// Starts a session for `task_id` with `api_key` (or a fresh random one).
    pub(crate) fn start(
        &mut self,
        task_id: &str,
        api_key: Option<SecretString>,
        admin_key: &SecretString,
        metadata: Value,
        now: Instant,
    ) -> Result<(Arc<str>, SecretString), ApiError> {
        if !valid_task_id(task_id) {
            return Err(ApiError::invalid(
                "task_id must be 1-160 characters of letters, digits, '_', '.', ':' and '-', starting with a letter or digit",
            )
            .with_param("task_id"));
        }
        if self.capacity.is_some_and(|c| c <= 0) {
            return Err(self.rate_limited("no rollout capacity granted; call /grant_capacity first"));
        }
        if self.sessions.len() >= self.limits.max_sessions {
            return Err(self.rate_limited(format!(
                "the proxy holds its maximum of {} sessions",
                self.limits.max_sessions
            )));
        }
        let key = match api_key {
            Some(key) => {
                if auth::secrets_equal(&key, admin_key) {
                    return Err(ApiError::invalid("api_key must not be the admin key").with_param("api_key"));
                }
                if self.keys.contains_key(&auth::digest(&key)) {
                    return Err(ApiError::new(
                        ApiErrorKind::Conflict,
                        "api_key is bound to a session that has not ended",
                    )
                    .with_param("api_key"));
                }
                key
            }
            None => auth::random_key(),
        };
        let generation_defaults = metadata
            .get("generation_args")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let id: Arc<str> = loop {
            let candidate: Arc<str> = format!("{task_id}-{}", auth::random_hex(8)).into();
            if !self.sessions.contains_key(&candidate) && !self.tombstones.contains_key(&candidate) {
                break candidate;
            }
        };
        let digest = auth::digest(&key);
        let (ended_tx, _) = watch::channel(false);
        self.keys.insert(digest, id.clone());
        self.sessions.insert(
            id.clone(),
            Session {
                id: id.clone(),
                task_id: task_id.to_string(),
                key_digest: digest,
                ended: false,
                ended_tx,
                trajectory: Trajectory::default(),
                context_overflow: None,
                system_error: None,
                last_activity: now,
                in_flight: 0,
                metadata,
                generation_defaults,
                stored_tokens: 0,
                requests: 0,
                guard: None,
                integrity_hits: BTreeMap::new(),
                bodies: Budget::new(self.limits.max_request_bytes_per_session),
            },
        );
        if let Some(c) = self.capacity.as_mut() {
            *c -= 1;
        }
        Ok((id, key))
    }

    /// The live session a session key belongs to (keys stop working at `end_session`).
    pub(crate) fn session_for_key(&self, key: &SecretString) -> Option<Arc<str>> {
        self.keys.get(&auth::digest(key)).cloned()
    }

    /// The session `id`, or 410 when it is gone and 404 when it never existed.
    pub(crate) fn get_mut(&mut self, id: &str) -> Result<&mut Session, ApiError> {
        if let Some(reason) = self.tombstones.get(id) {
            return Err(gone(id, *reason));
        }
        self.sessions
            .get_mut(id)
            .ok_or_else(|| ApiError::new(ApiErrorKind::NotFound, format!("unknown session {id:?}")))
    }

    /// The session `id` if it exists and has not ended (generation needs that).
    pub(crate) fn active_mut(&mut self, id: &str, now: Instant) -> Result<&mut Session, ApiError> {
        let session = self.get_mut(id)?;
        if session.ended {
            return Err(ApiError::new(
                ApiErrorKind::Gone,
                format!("session {id:?} has ended"),
            ));
        }
        session.last_activity = now;
        Ok(session)
    }

    /// Reserves room for a generation of up to `tokens` new tokens in session `id`.
    /// Claims a place for one more generation request of session `id` before its body is read: refused
    /// (429) while the session has its maximum of generations in flight, or of requests being read or
    /// prepared. The claim holds the request's bytes against the session's budget and `proxy`.
    pub(crate) fn claim(&mut self, id: &str, proxy: &Arc<Budget>, now: Instant) -> Result<Claim, ApiError> {
        let limit = self.limits.max_generations_per_session;
        let retry_after = self.limits.retry_after_seconds;
        let session = self.active_mut(id, now)?;
        let (in_flight, reading) = (session.in_flight, session.bodies.requests());
        if in_flight >= limit || reading >= limit as usize {
            let what = if in_flight >= limit {
                "generations in flight"
            } else {
                "requests being read or prepared"
            };
            return Err(self.rate_limited(format!("session {id:?} has its maximum of {limit} {what}")));
        }
        session.bodies.enter();
        Ok(Claim::new(session.bodies.clone(), proxy.clone(), retry_after))
    }

    pub(crate) fn admit(&mut self, id: &str, tokens: u64, now: Instant) -> Result<(), ApiError> {
        let limit = self.limits.max_generations_per_session;
        if self.active_mut(id, now)?.in_flight >= limit {
            return Err(self.rate_limited(format!(
                "session {id:?} has its maximum of {limit} generations in flight"
            )));
        }
        let used = self.stored_tokens + self.reserved_tokens;
        if used + tokens > self.limits.max_stored_tokens {
            return Err(self.rate_limited(format!(
                "the proxy holds {used} of its {} token budget",
                self.limits.max_stored_tokens
            )));
        }
        let session = self.active_mut(id, now)?;
        session.in_flight += 1;
        session.requests += 1;
        self.reserved_tokens += tokens;
        Ok(())
    }

    /// Ends a generation admitted with `reserved` tokens, recording `interaction` when there is one and the
    /// session still exists. Answers whether it was recorded.
    pub(crate) fn complete(
        &mut self,
        id: &str,
        reserved: u64,
        interaction: Option<Interaction>,
        now: Instant,
    ) -> bool {
        self.reserved_tokens = self.reserved_tokens.saturating_sub(reserved);
        let Some(session) = self.sessions.get_mut(id) else {
            return false;
        };
        session.in_flight = session.in_flight.saturating_sub(1);
        session.last_activity = now;
        let Some(interaction) = interaction else {
            return false;
        };
        let tokens = interaction.stored_tokens();
        integrity::count(&mut session.integrity_hits, &interaction.integrity_hits);
        session.stored_tokens += tokens;
        session.trajectory.push(interaction);
        self.stored_tokens += tokens;
        true
    }

    /// Ends session `id`: its key stops working and exports waiting on it go ahead.
    pub(crate) fn end(&mut self, id: &str, now: Instant) -> Result<EndSummary, ApiError> {
        let session = self.get_mut(id)?;
        session.ended = true;
        session.last_activity = now;
        session.ended_tx.send_replace(true);
        let digest = session.key_digest;
        let summary = EndSummary {
            session_id: session.id.clone(),
            interaction_count: session.trajectory.len() as u64,
            context_overflow: session.context_overflow.clone(),
            system_error: session.system_error.clone(),
            integrity_hits: session.integrity_hits.clone(),
        };
        if self.keys.get(&digest).is_some_and(|owner| &**owner == id) {
            self.keys.remove(&digest);
        }
        Ok(summary)
    }

    /// A receiver that turns true when session `id` ends.
    pub(crate) fn ended_watch(&mut self, id: &str) -> Result<watch::Receiver<bool>, ApiError> {
        Ok(self.get_mut(id)?.ended_tx.subscribe())
    }

    /// Removes session `id` for export.
    pub(crate) fn take(&mut self, id: &str) -> Result<Session, ApiError> {
        self.get_mut(id)?;
        let session = self.remove(id, Tombstone::Exported).expect("checked above");
        Ok(session)
    }

    fn remove(&mut self, id: &str, reason: Tombstone) -> Option<Session> {
        let session = self.sessions.remove(id)?;
        if self
            .keys
            .get(&session.key_digest)
            .is_some_and(|owner| &**owner == id)
        {
            self.keys.remove(&session.key_digest);
        }
        self.stored_tokens = self.stored_tokens.saturating_sub(session.stored_tokens);
        session.ended_tx.send_replace(true);
        self.tombstones.insert(session.id.clone(), reason);
        self.tombstone_order.push_back(session.id.clone());
        while self.tombstone_order.len() > self.limits.max_tombstones {
            if let Some(old) = self.tombstone_order.pop_front() {
                self.tombstones.remove(&old);
            }
        }
        Some(session)
    }

    /// Drops sessions idle for longer than the session timeout with no generation running; answers their ids.
    pub(crate) fn sweep(&mut self, now: Instant) -> Vec<Arc<str>> {
        let timeout = self.limits.session_timeout;
        let stale: Vec<Arc<str>> = self
            .sessions
            .values()
            .filter(|s| s.in_flight == 0 && now.saturating_duration_since(s.last_activity) >= timeout)
            .map(|s| s.id.clone())
            .collect();
        for id in &stale {
            self.remove(id, Tombstone::Expired);
        }
        stale
    }
}

fn gone(id: &str, reason: Tombstone) -> ApiError {
    let why = match reason {
        Tombstone::Exported => "was exported",
        Tombstone::Expired => "expired after being idle",
    };
    ApiError::new(ApiErrorKind::Gone, format!("session {id:?} {why}"))
}
