//! The session-gateway route registry (reference section 5.3): one Arena route per (Arena, proxy) pair per
//! rollout worker, shared by every rollout on that worker.
//!
//! Acquirers go through one lock, so concurrent launches share a registration and a probe (single flight).
//! Before each launch the route is probed when the last probe *completed* at least a probe interval ago; a
//! missing route is restored under the same name, deployment id and upstream key; failed restores are
//! throttled. While the route has users a background task re-checks it every interval, because Arena
//! garbage-collects idle routes while tasks sit in its queue. Timing comes from an injected [`Clock`].

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use tokio::task::JoinHandle;

use crate::clock::{Clock, SystemClock};
use crate::routes::{ModelRegistration, session_route_name};
use crate::{ArenaClient, Error, Result};

/// How the registry behaves.
#[derive(Clone)]
pub struct RegistryOptions {
    /// Minimum time between probes of one route, measured from the last probe's completion (default 60 s).
    pub probe_interval: Duration,
    /// HTTP timeout and outer deadline of register, probe and delete calls (default 180 s).
    pub registration_timeout: Duration,
    /// Keep routes when their users drop to zero (a worker-lifetime registry, closed at worker shutdown);
    /// otherwise delete a route when its last user releases it.
    pub persistent: bool,
    /// `inbound_protos` of the registration (default `["chat"]`).
    pub inbound_protos: Vec<String>,
    /// The clock behind probe timing.
    pub clock: Arc<dyn Clock>,
    /// Called with a new route's name before the request that registers it is sent, so a caller can make
    /// the name durable (a journal) and delete it after a crash even when the POST landed; an error aborts
    /// the registration before anything reaches Arena.
    pub before_register: Option<BeforeRegister>,
}

/// See [`RegistryOptions::before_register`].
pub type BeforeRegister = Arc<dyn Fn(&str) -> std::result::Result<(), String> + Send + Sync>;

impl fmt::Debug for RegistryOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryOptions")
            .field("probe_interval", &self.probe_interval)
            .field("registration_timeout", &self.registration_timeout)
            .field("persistent", &self.persistent)
            .field("inbound_protos", &self.inbound_protos)
            .finish_non_exhaustive()
    }
}

impl RegistryOptions {
    /// Options with this probe interval in seconds (`arena_registration_probe_interval`), which must be
    /// finite and positive.
    pub fn new(probe_interval_secs: f64) -> Result<Self> {
        if !probe_interval_secs.is_finite() || probe_interval_secs <= 0.0 {
            return Err(Error::Invalid(format!(
                "arena_registration_probe_interval must be finite and positive, got {probe_interval_secs}"
            )));
        }
        Ok(Self {
            probe_interval: Duration::from_secs_f64(probe_interval_secs),
            registration_timeout: Duration::from_secs(180),
            persistent: false,
            inbound_protos: vec!["chat".to_string()],
            clock: Arc::new(SystemClock::default()),
            before_register: None,
        })
    }
}

/// What one acquire did, for the reference's registration metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AcquireReport {
    /// This acquire created the registration.
    pub registered: bool,
    /// This acquire probed the route.
    pub probed: bool,
    /// The probe got an answer (`registration_probe_success`).
    pub probe_ok: Option<bool>,
    /// The probe found the route (`registration_present`).
    pub present: Option<bool>,
    /// A missing route was restored (`registration_restore_success`).
    pub restored: Option<bool>,
}

/// What `close` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloseReport {
    /// Routes deleted (or already gone).
    pub deleted: Vec<String>,
    /// Routes whose deletion failed every time; they may still exist in Arena.
    pub failed: Vec<String>,
}

type Key = (String, String);

struct Entry {
    id: u64,
    model_name: String,
    deployment_id: String,
    upstream_url: String,
    gateway_key: SecretString,
    users: usize,
    last_probe_done: Duration,
    known_missing: bool,
    probe_task: Option<JoinHandle<()>>,
}

impl Entry {
    fn registration(&self, options: &RegistryOptions) -> ModelRegistration {
        ModelRegistration {
            model_name: self.model_name.clone(),
            deployment_id: self.deployment_id.clone(),
            upstream_base_url: self.upstream_url.clone(),
            upstream_api_key: self.gateway_key.clone(),
            inbound_protos: options.inbound_protos.clone(),
        }
    }
}

#[derive(Default)]
struct State {
    entries: HashMap<Key, Entry>,
    next_id: u64,
}

impl State {
    /// Removes every entry, stopping its probe task, and returns the route names.
    fn take_all(&mut self) -> Vec<String> {
        self.entries
            .drain()
            .map(|(_, mut e)| {
                if let Some(t) = e.probe_task.take() {
                    t.abort();
                }
                e.model_name
            })
            .collect()
    }
}

struct Inner {
    client: ArenaClient,
    options: RegistryOptions,
    state: tokio::sync::Mutex<State>,
    /// Names whose registration may exist in Arena but that no entry owns (failed or abandoned cleanups).
    orphans: Mutex<Vec<String>>,
    closed: AtomicBool,
}

/// The shared route registry of one rollout worker. Cheap to clone.
#[derive(Clone)]
pub struct RouteRegistry {
    inner: Arc<Inner>,
}

impl fmt::Debug for RouteRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteRegistry")
            .field("options", &self.inner.options)
            .field("closed", &self.inner.closed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// One user's hold on a route. Release it with [`RouteLease::release`]; dropping it releases in the
/// background.
pub struct RouteLease {
    inner: Arc<Inner>,
    key: Key,
    entry_id: u64,
    /// The gateway model name to launch with.
    pub model_name: String,
    /// The gateway URL harnesses use.
    pub gateway_url: String,
    /// What acquiring did.
    pub report: AcquireReport,
    released: bool,
}

impl fmt::Debug for RouteLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteLease")
            .field("model_name", &self.model_name)
            .field("gateway_url", &self.gateway_url)
            .field("report", &self.report)
            .finish_non_exhaustive()
    }
}

fn lock_orphans(m: &Mutex<Vec<String>>) -> std::sync::MutexGuard<'_, Vec<String>> {
    // A list of names cannot be left inconsistent by a panic.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Deletes a name whose registration may have landed when dropped armed (the acquire was cancelled).
struct PendingName {
    inner: Arc<Inner>,
    name: Option<String>,
}

impl Drop for PendingName {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            lock_orphans(&self.inner.orphans).push(name.clone());
            let inner = self.inner.clone();
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move { inner.delete_orphan(&name).await });
            }
        }
    }
}

impl Inner {
    async fn with_deadline<T>(&self, what: String, call: impl Future<Output = Result<T>>) -> Result<T> {
        let limit = self.options.registration_timeout;
        match tokio::time::timeout(limit, call).await {
            Ok(r) => r,
            Err(_) => Err(Error::Deadline {
                what,
                seconds: limit.as_secs_f64(),
            }),
        }
    }

    async fn delete(&self, name: &str) -> Result<()> {
        let t = self.options.registration_timeout;
        self.with_deadline(
            format!("delete LLM route {name}"),
            self.client.delete_model(name, Some(t)),
        )
        .await
    }

    async fn delete_orphan(&self, name: &str) {
        self.client
            .delete_abandoned_route(name, self.options.registration_timeout)
            .await;
        if self.delete(name).await.is_ok() {
            lock_orphans(&self.orphans).retain(|n| n != name);
        }
    }

    async fn register(&self, registration: &ModelRegistration) -> Result<String> {
        let t = self.options.registration_timeout;
        self.with_deadline(
            format!("register LLM route {}", registration.model_name),
            self.client.register_model(registration, Some(t)),
        )
        .await
    }

    async fn probe(&self, name: &str) -> Result<bool> {
        let t = self.options.registration_timeout;
        self.with_deadline(
            format!("probe LLM route {name}"),
            self.client.model_exists(name, Some(t)),
        )
        .await
    }

    /// The pre-launch liveness check of section 5.3. Runs under the registry lock.
    async fn ensure(&self, entry: &mut Entry) -> Result<AcquireReport> {
        let clock = &self.options.clock;
        let mut report = AcquireReport::default();
        if clock.now().saturating_sub(entry.last_probe_done) < self.options.probe_interval {
            if entry.known_missing {
                return Err(Error::RestoreThrottled {
                    model_name: entry.model_name.clone(),
                });
            }
            return Ok(report);
        }
        report.probed = true;
        let probe = self.probe(&entry.model_name).await;
        match probe {
            Err(e) => {
                entry.last_probe_done = clock.now();
                report.probe_ok = Some(false);
                tracing::warn!(model_name = %entry.model_name, error = %e, "LLM route probe failed");
                if entry.known_missing {
                    return Err(e);
                }
                Ok(report)
            }
            Ok(true) => {
                entry.last_probe_done = clock.now();
                entry.known_missing = false;
                report.probe_ok = Some(true);
                report.present = Some(true);
                Ok(report)
            }
            Ok(false) => {
                report.probe_ok = Some(true);
                report.present = Some(false);
                entry.known_missing = true;
                tracing::warn!(model_name = %entry.model_name, "LLM route is gone; restoring it under the same name");
                let restored = match self.register(&entry.registration(&self.options)).await {
                    Ok(_) => Ok(()),
                    // The POST may have landed, or a concurrent restore won: accept the route if it exists.
                    Err(e) => match self.probe(&entry.model_name).await {
                        Ok(true) => Ok(()),
                        _ => Err(e),
                    },
                };
                entry.last_probe_done = clock.now();
                match restored {
                    Ok(()) => {
                        entry.known_missing = false;
                        report.restored = Some(true);
                        Ok(report)
                    }
                    Err(e) => Err(e),
                }
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let mut names = self.state.get_mut().take_all();
        names.extend(lock_orphans(&self.orphans).drain(..));
        if names.is_empty() {
            return;
        }
        tracing::warn!(
            routes = names.len(),
            "route registry dropped without close; deleting its routes in the background"
        );
        let client = self.client.clone();
        let timeout = self.options.registration_timeout;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                for name in names {
                    if let Err(e) = client.delete_model(&name, Some(timeout)).await {
                        tracing::warn!(model_name = %name, error = %e, "could not delete LLM route");
                    }
                }
            });
        }
    }
}

async fn background_probe(inner: Weak<Inner>, key: Key, id: u64) {
    loop {
        let (clock, interval) = match inner.upgrade() {
            Some(i) => (i.options.clock.clone(), i.options.probe_interval),
            None => return,
        };
        clock.sleep(interval).await;
        let Some(inner) = inner.upgrade() else { return };
        if inner.closed.load(Ordering::Relaxed) {
            return;
        }
        let mut state = inner.state.lock().await;
        let Some(entry) = state.entries.get_mut(&key) else {
            return;
        };
        if entry.id != id || entry.users == 0 {
            return;
        }
        if let Err(e) = inner.ensure(entry).await {
            tracing::warn!(model_name = %entry.model_name, error = %e, "background LLM route check failed");
        }
    }
}

impl RouteRegistry {
    /// A registry over this client.
    pub fn new(client: ArenaClient, options: RegistryOptions) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                options,
                state: tokio::sync::Mutex::new(State::default()),
                orphans: Mutex::new(Vec::new()),
                closed: AtomicBool::new(false),
            }),
        }
    }

    /// The options.
    pub fn options(&self) -> &RegistryOptions {
        &self.inner.options
    }

    /// Takes a route to `proxy_base_url` keyed by `gateway_key`: registers it for the first user, otherwise
    /// checks it is alive (probing and restoring as needed), then counts one more user.
    pub async fn acquire(&self, proxy_base_url: &str, gateway_key: &SecretString) -> Result<RouteLease> {
        let inner = &self.inner;
        if inner.closed.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        let key = (
            inner.client.base_url().to_string(),
            proxy_base_url.trim_end_matches('/').to_string(),
        );
        let mut state = inner.state.lock().await;
        if inner.closed.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        let report = match state.entries.get_mut(&key) {
            Some(entry) => {
                if entry.gateway_key.expose_secret() != gateway_key.expose_secret() {
                    return Err(Error::Invalid(format!(
                        "gateway key changed within one rollout worker for proxy {}",
                        key.1
                    )));
                }
                inner.ensure(entry).await?
            }
            None => {
                let (model_name, deployment_id) = session_route_name();
                if let Some(hook) = &inner.options.before_register {
                    hook(&model_name).map_err(|e| {
                        Error::Invalid(format!(
                            "route {model_name} was not registered: the caller could not record its name: {e}"
                        ))
                    })?;
                }
                let id = state.next_id;
                state.next_id += 1;
                let entry = Entry {
                    id,
                    model_name: model_name.clone(),
                    deployment_id,
                    upstream_url: key.1.clone(),
                    gateway_key: gateway_key.clone(),
                    users: 0,
                    last_probe_done: inner.options.clock.now(),
                    known_missing: false,
                    probe_task: None,
                };
                // Armed across the POST: if this future is dropped, the name is cleaned up in the background.
                let mut pending = PendingName {
                    inner: inner.clone(),
                    name: Some(model_name.clone()),
                };
                if let Err(e) = inner.register(&entry.registration(&inner.options)).await {
                    pending.name = None;
                    if let Err(cleanup) = inner.delete(&model_name).await {
                        tracing::warn!(%model_name, error = %cleanup, "cleanup of a failed registration failed");
                        lock_orphans(&inner.orphans).push(model_name);
                    }
                    return Err(e);
                }
                pending.name = None;
                let mut entry = entry;
                entry.last_probe_done = inner.options.clock.now();
                state.entries.insert(key.clone(), entry);
                AcquireReport {
                    registered: true,
                    ..AcquireReport::default()
                }
            }
        };
        let entry = state
            .entries
            .get_mut(&key)
            .expect("the entry was found or inserted above under the same lock");
        entry.users += 1;
        if entry.probe_task.is_none() {
            entry.probe_task = Some(tokio::spawn(background_probe(
                Arc::downgrade(inner),
                key.clone(),
                entry.id,
            )));
        }
        Ok(RouteLease {
            inner: inner.clone(),
            key,
            entry_id: entry.id,
            model_name: entry.model_name.clone(),
            gateway_url: inner.client.llm_gateway_url().to_string(),
            report,
            released: false,
        })
    }

    /// Live registrations this registry owns.
    pub async fn routes(&self) -> Vec<String> {
        self.inner
            .state
            .lock()
            .await
            .entries
            .values()
            .map(|e| e.model_name.clone())
            .collect()
    }

    /// Shuts the registry: no more acquires, probe tasks stopped, every registration (and every name whose
    /// cleanup failed earlier) deleted, each retried up to three rounds. Errors are logged, not returned.
    pub async fn close(&self) -> CloseReport {
        let inner = &self.inner;
        inner.closed.store(true, Ordering::Relaxed);
        let mut names = inner.state.lock().await.take_all();
        names.extend(lock_orphans(&inner.orphans).drain(..));
        names.sort();
        names.dedup();
        let mut report = CloseReport::default();
        for round in 0..3 {
            let mut failed = Vec::new();
            for name in names {
                match inner.delete(&name).await {
                    Ok(()) => report.deleted.push(name),
                    Err(e) => {
                        tracing::warn!(model_name = %name, round, error = %e, "could not delete LLM route at close");
                        failed.push(name);
                    }
                }
            }
            names = failed;
            if names.is_empty() {
                break;
            }
        }
        report.failed = names;
        report
    }
}

impl Inner {
    async fn release(&self, key: &Key, entry_id: u64) -> Result<()> {
        let mut state = self.state.lock().await;
        let Some(entry) = state.entries.get_mut(key).filter(|e| e.id == entry_id) else {
            // Closed or replaced: whoever removed the entry owns its cleanup.
            return Ok(());
        };
        if entry.users == 0 {
            tracing::warn!(model_name = %entry.model_name, "LLM route user count underflow");
            return Err(Error::Invalid(format!(
                "LLM route {} was released more often than acquired",
                entry.model_name
            )));
        }
        entry.users -= 1;
        if entry.users > 0 {
            return Ok(());
        }
        if let Some(t) = entry.probe_task.take() {
            t.abort();
        }
        if self.options.persistent {
            return Ok(());
        }
        let name = entry.model_name.clone();
        state.entries.remove(key);
        match self.delete(&name).await {
            Ok(()) => Ok(()),
            Err(e) => {
                lock_orphans(&self.orphans).push(name);
                Err(e)
            }
        }
    }
}

impl RouteLease {
    /// Gives the route back; the last user of a non-persistent registry deletes it. An error is a cleanup
    /// failure: log it, never let it replace the rollout's own outcome.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        self.inner.release(&self.key, self.entry_id).await
    }
}

impl Drop for RouteLease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let inner = self.inner.clone();
        let key = self.key.clone();
        let id = self.entry_id;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = inner.release(&key, id).await {
                    tracing::warn!(error = %e, "background release of an LLM route failed");
                }
            });
        }
    }
}
