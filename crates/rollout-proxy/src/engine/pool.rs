//! [`EnginePool`]: several SGLang-protocol policy servers (`rollout.policy_servers`) as one engine.
//!
//! Generations are session-sticky: requests with one [`GenerateRequest::affinity`] key go to the server
//! that served the key before (its prefix cache holds their conversation), a new key to the server with the
//! fewest generations in flight (round-robin among equals). A server whose connection fails is marked down
//! and its keys move to the others; it is tried again once every server is down, or after it answers a
//! weight update. A generation whose server fails (the connection is refused, reset or broken off in the
//! middle of its stream) moves to another server that is up: it is resubmitted there with the tokens
//! produced so far appended to its prompt and the rest of its `max_new_tokens`, as an interrupted turn is
//! (see [`crate::SglangEngine`]), so its caller sees one generation; only when no server is left to try does
//! the caller see the transport error. The key map holds at most [`MAX_AFFINITY_KEYS`] keys (it starts afresh
//! when full), so no number of sessions grows it without bound.
//! A weight update is the sequence SGLang's RL users run around an update (`docs/advanced_features/
//! sglang_for_rl.md`): pause every server (in the pool's [`PauseMode`]), update every server with the loop's
//! version (each update confirmed with `/get_weight_version`, see [`crate::SglangEngine`]), then continue
//! every server. A server whose pause, update or continue fails is asked again, [`POOL_ATTEMPTS`] times in
//! all; a pool that still cannot agree on one version is one error naming each server that failed and
//! what it answered, after the others are continued, so nothing trains on tokens of a version the loop did
//! not install. A server that cannot be reached at all (every attempt a transport error: it died) is left
//! out of the update instead, marked down so it serves nothing, and the others go on; a later update that
//! reaches it again brings it to that update's version and back into routing. Only a pool with no server
//! left to update is an error for that reason. Paused in `retract` or `in_place` mode, generations in flight continue after the update and
//! their later tokens carry the new version.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;

use super::{
    EngineError, EngineEvent, FinishReason, GenerateRequest, InferenceEngine, PauseMode, TokenStream,
    WeightUpdate,
};

/// The most affinity keys the pool remembers.
pub const MAX_AFFINITY_KEYS: usize = 65_536;

/// How many times the pool asks a server to pause, update or continue before it gives up.
pub const POOL_ATTEMPTS: u32 = 3;

/// The pause between two attempts at one server.
const RETRY_DELAY: Duration = Duration::from_millis(200);

/// One server of the pool.
struct Member {
    name: String,
    engine: Arc<dyn InferenceEngine>,
    load: Arc<AtomicUsize>,
    /// Set when a generation's connection to it failed; cleared when it answers an update.
    down: Arc<AtomicBool>,
}

/// The servers, each with its count of generations in flight.
pub struct EnginePool {
    routing: Arc<Routing>,
    pause_mode: PauseMode,
}

/// What routing a generation needs, shared with the generations in flight (which route again when their
/// server fails).
struct Routing {
    members: Vec<Member>,
    next: AtomicUsize,
    affinity: Mutex<HashMap<Arc<str>, usize>>,
    /// Generations resubmitted to another server after theirs failed.
    moved: AtomicUsize,
}

impl EnginePool {
    /// A pool over `engines`, each named (its URL) for error messages, paused in `pause_mode` around
    /// updates.
    pub fn new(engines: Vec<(String, Arc<dyn InferenceEngine>)>, pause_mode: PauseMode) -> Self {
        Self {
            routing: Arc::new(Routing {
                members: engines
                    .into_iter()
                    .map(|(name, engine)| Member {
                        name,
                        engine,
                        load: Arc::new(AtomicUsize::new(0)),
                        down: Arc::new(AtomicBool::new(false)),
                    })
                    .collect(),
                next: AtomicUsize::new(0),
                affinity: Mutex::new(HashMap::new()),
                moved: AtomicUsize::new(0),
            }),
            pause_mode,
        }
    }

    /// The index of the server that serves `key` now (`None` if the pool has not routed it or its server
    /// is down).
    pub fn server_of(&self, key: &str) -> Option<usize> {
        self.routing.server_of(key)
    }

    /// How many generations were resubmitted to another server after theirs failed, since the pool began.
    pub fn generations_moved(&self) -> usize {
        self.routing.moved.load(Ordering::Relaxed)
    }

    /// How many servers are marked down now (their connection failed, and no update has reached them since).
    pub fn servers_down(&self) -> usize {
        self.routing
            .members
            .iter()
            .filter(|m| m.down.load(Ordering::Relaxed))
            .count()
    }

    /// How many servers the pool holds.
    pub fn len(&self) -> usize {
        self.routing.members.len()
    }

    /// Whether the pool is empty.
    pub fn is_empty(&self) -> bool {
        self.routing.members.is_empty()
    }

    /// Runs `op` on every server of `members` at once, each up to [`POOL_ATTEMPTS`] times; answers the
    /// servers that never succeeded, with their last error.
    async fn on_every<'a, F>(members: &[&'a Member], op: F) -> Vec<(&'a str, EngineError)>
    where
        F: Fn(&'a dyn InferenceEngine) -> BoxFuture<'a, Result<(), EngineError>> + Copy,
    {
        let attempts = members.iter().map(|&m| async move {
            let mut last = None;
            for attempt in 0..POOL_ATTEMPTS {
                if attempt > 0 {
                    tokio::time::sleep(RETRY_DELAY * attempt).await;
                }
                match op(&*m.engine).await {
                    Ok(()) => return None,
                    Err(e) => {
                        tracing::warn!(server = %m.name, attempt = attempt + 1, error = %e, "policy server refused");
                        last = Some(e);
                    }
                }
            }
            last.map(|e| (m.name.as_str(), e))
        });
        futures::future::join_all(attempts)
            .await
            .into_iter()
            .flatten()
            .collect()
    }
}

impl Routing {
    /// The index of the server that serves `key` now (`None` if the pool has not routed it or its server
    /// is down).
    fn server_of(&self, key: &str) -> Option<usize> {
        let map = self
            .affinity
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.get(key)
            .copied()
            .filter(|&i| !self.members[i].down.load(Ordering::Relaxed))
    }

    /// Which server a request goes to: its key's server while that one is up, else the least loaded
    /// server that is up (any server when all are down), remembered for the key.
    fn route(&self, key: Option<&Arc<str>>) -> usize {
        if let Some(i) = key.and_then(|k| self.server_of(k)) {
            return i;
        }
        let n = self.members.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let up = |m: &Member| !m.down.load(Ordering::Relaxed);
        let any_up = self.members.iter().any(up);
        let chosen = (0..n)
            .map(|i| (start + i) % n)
            .filter(|&i| !any_up || up(&self.members[i]))
            .min_by_key(|&i| self.members[i].load.load(Ordering::Relaxed))
            .expect("the pool is not empty");
        if let Some(key) = key {
            let mut map = self
                .affinity
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if map.len() >= MAX_AFFINITY_KEYS && !map.contains_key(key) {
                map.clear();
            }
            map.insert(key.clone(), chosen);
        }
        chosen
    }
}

fn pool_error(what: &str, failed: &[(&str, EngineError)]) -> EngineError {
    let each: Vec<String> = failed.iter().map(|(name, e)| format!("{name}: {e}")).collect();
    EngineError::Internal(format!(
        "the policy servers cannot {what} after {POOL_ATTEMPTS} attempts each: {}",
        each.join("; ")
    ))
}

/// One generation in flight on a server, counted in its load while it lives.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn on(member: &Member) -> Self {
        member.load.fetch_add(1, Ordering::Relaxed);
        Self(member.load.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A generation of the pool: its request as the caller sent it, the tokens produced so far on every server
/// it ran on, and the servers it has tried.
struct Failover {
    routing: Arc<Routing>,
    request: GenerateRequest,
    produced: Vec<u32>,
    server: usize,
    tried: Vec<usize>,
    stream: TokenStream,
    _in_flight: InFlight,
    done: bool,
}

impl Failover {
    fn start(routing: Arc<Routing>, request: GenerateRequest, server: usize) -> Self {
        let member = &routing.members[server];
        let in_flight = InFlight::on(member);
        let stream = member.engine.generate(request.clone());
        Self {
            routing,
            request,
            produced: Vec::new(),
            server,
            tried: vec![server],
            stream,
            _in_flight: in_flight,
            done: false,
        }
    }

    async fn next(&mut self) -> Option<Result<EngineEvent, EngineError>> {
        while !self.done {
            let event = self.stream.next().await;
            match &event {
                Some(Ok(EngineEvent::Token(t))) => self.produced.push(t.id),
                Some(Err(EngineError::Transport(e))) => {
                    let member = &self.routing.members[self.server];
                    member.down.store(true, Ordering::Relaxed);
                    tracing::warn!(server = %member.name, error = %e, produced = self.produced.len(), "policy server failed in a generation: marked down");
                    match self.move_on() {
                        Moved::Elsewhere => continue,
                        Moved::Finished(finish) => {
                            self.done = true;
                            return Some(Ok(EngineEvent::Finished(finish)));
                        }
                        Moved::Nowhere => self.done = true,
                    }
                }
                Some(Ok(EngineEvent::Finished(_)) | Err(_)) | None => self.done = true,
            }
            return event;
        }
        None
    }

    /// After the server failed: resubmits the generation to another server that is up, with the tokens
    /// produced so far appended to its prompt and the rest of its budget.
    fn move_on(&mut self) -> Moved {
        let sampling = &self.request.sampling;
        if let Some(&last) = self.produced.last()
            && sampling.stop_token_ids.contains(&last)
        {
            return Moved::Finished(FinishReason::Stop { matched: Some(last) });
        }
        let produced = u32::try_from(self.produced.len()).unwrap_or(u32::MAX);
        let remaining = sampling.max_new_tokens.saturating_sub(produced);
        if remaining == 0 {
            return Moved::Finished(FinishReason::Length);
        }
        let next = self.routing.route(self.request.affinity.as_ref());
        let member = &self.routing.members[next];
        if self.tried.contains(&next) || member.down.load(Ordering::Relaxed) {
            return Moved::Nowhere;
        }
        let mut input = self.request.input_ids.to_vec();
        input.extend_from_slice(&self.produced);
        let mut request = self.request.clone();
        request.input_ids = input.into();
        request.sampling.max_new_tokens = remaining;
        tracing::info!(from = %self.routing.members[self.server].name, to = %member.name, produced, remaining, "generation moved to another policy server");
        self._in_flight = InFlight::on(member);
        self.stream = member.engine.generate(request);
        self.server = next;
        self.tried.push(next);
        self.routing.moved.fetch_add(1, Ordering::Relaxed);
        Moved::Elsewhere
    }
}

/// Where a generation whose server failed goes.
enum Moved {
    /// It was resubmitted to another server.
    Elsewhere,
    /// It had already ended (its budget spent, or a stop token sampled), though its finish never came.
    Finished(FinishReason),
    /// No other server is up: the caller sees the failure.
    Nowhere,
}

impl InferenceEngine for EnginePool {
    fn generate(&self, request: GenerateRequest) -> TokenStream {
        if self.routing.members.is_empty() {
            return Box::pin(futures::stream::once(async {
                Err(EngineError::Internal(
                    "no policy server is configured".to_string(),
                ))
            }));
        }
        let server = self.routing.route(request.affinity.as_ref());
        let state = Failover::start(self.routing.clone(), request, server);
        Box::pin(futures::stream::unfold(state, |mut st| async move {
            let event = st.next().await?;
            Some((event, st))
        }))
    }

    fn max_context_len(&self) -> usize {
        self.routing
            .members
            .iter()
            .map(|m| m.engine.max_context_len())
            .min()
            .unwrap_or(0)
    }

    fn update_weights_from_disk(&self, update: WeightUpdate) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async move {
            let mode = self.pause_mode;
            let all: Vec<&Member> = self.routing.members.iter().collect();
            let failed = Self::on_every(&all, move |e| e.pause(mode)).await;
            let (mut live, refused) = self.leave_out_unreachable(&all, failed);
            if !refused.is_empty() {
                let error = pool_error(&format!("pause ({mode})"), &refused);
                let _ = Self::on_every(&live, |e| e.resume()).await;
                return Err(error);
            }
            if live.is_empty() {
                return Err(EngineError::Transport(
                    "no policy server can be reached to update its weights".into(),
                ));
            }
            let failed = Self::on_every(&live, |e| e.update_weights_from_disk(update.clone())).await;
            let (updated_members, refused) = self.leave_out_unreachable(&live, failed);
            for m in &updated_members {
                if !refused.iter().any(|(name, _)| *name == m.name) {
                    m.down.store(false, Ordering::Relaxed);
                }
            }
            live = updated_members;
            let updated = if refused.is_empty() && !live.is_empty() {
                Ok(())
            } else {
                let version = update
                    .version
                    .map_or_else(|| "the next".into(), |v| v.to_string());
                Err(if refused.is_empty() {
                    EngineError::Transport(format!(
                        "no policy server could be reached to install weight version {version}"
                    ))
                } else {
                    pool_error(&format!("agree on weight version {version}"), &refused)
                })
            };
            let resumed = Self::on_every(&live, |e| e.resume()).await;
            updated?;
            let (_, refused) = self.leave_out_unreachable(&live, resumed);
            if !refused.is_empty() {
                return Err(pool_error("continue", &refused));
            }
            Ok(())
        })
    }
}

impl EnginePool {
    /// Splits the servers of `members` that `failed` names: a server every attempt of which was a transport
    /// error cannot be reached, so it is marked down (it serves nothing until an update reaches it), logged,
    /// and left out; answers the servers still in the update and the failures that were answers (refusals).
    fn leave_out_unreachable<'a>(
        &self,
        members: &[&'a Member],
        failed: Vec<(&'a str, EngineError)>,
    ) -> (Vec<&'a Member>, Vec<(&'a str, EngineError)>) {
        let mut refused = Vec::new();
        let mut gone: Vec<&str> = Vec::new();
        for (name, e) in failed {
            if matches!(e, EngineError::Transport(_)) {
                tracing::warn!(server = %name, error = %e, "policy server unreachable: left out of this weight update, it serves nothing until an update reaches it");
                gone.push(name);
            } else {
                refused.push((name, e));
            }
        }
        let live = members
            .iter()
            .copied()
            .filter(|m| {
                let out = gone.contains(&m.name.as_str());
                if out {
                    m.down.store(true, Ordering::Relaxed);
                }
                !out
            })
            .collect();
        (live, refused)
    }
}
