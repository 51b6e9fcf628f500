//! The lease on a `gateway`-mode route (`arena-2026.md` 2.12, AReaL #1751): while its task is in flight the
//! route is renewed (`PATCH`, E11) every probe interval, and re-registered under the same name when Arena
//! answers that it no longer has it; renewal stops before the route is deleted, so it cannot bring back a
//! finished route.
//!
//! [`Renewal`] is the schedule alone, with no IO and no clock of its own (as quinn-proto's connection is):
//! its caller tells it the time and what each call answered, and it says what to do next. [`maintain`]
//! drives it with an [`ArenaClient`] and a [`Clock`] until told to stop.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::Clock;
use crate::routes::ModelRegistration;
use crate::{ArenaClient, Error};

/// What the lease's owner should do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewalStep {
    /// Nothing until this much time has passed.
    Wait(Duration),
    /// Renew the route now, then report with [`Renewal::renewed`].
    Renew,
    /// Arena no longer has the route: register it again under the same name, deployment id, upstream and
    /// key, then report with [`Renewal::reregistered`].
    Reregister,
    /// The lease was stopped: do nothing more.
    Stopped,
}

/// What a lease's renewals came to, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenewalStats {
    /// Renewals Arena confirmed (`arena/registration_renew_success` 1).
    pub renewed: u32,
    /// Renewals that failed: an error, a timeout, or a route Arena no longer had (`... = 0`).
    pub failed: u32,
    /// Re-registrations that succeeded after Arena lost the route.
    pub reregistered: u32,
    /// Re-registrations that failed.
    pub reregister_failed: u32,
}

impl RenewalStats {
    /// The share of renewal attempts Arena confirmed; `None` when none was attempted.
    pub fn success_rate(&self) -> Option<f64> {
        let attempts = self.renewed + self.failed;
        (attempts > 0).then(|| f64::from(self.renewed) / f64::from(attempts))
    }
}

/// The renewal schedule of one route.
#[derive(Debug, Clone)]
pub struct Renewal {
    interval: Duration,
    next_at: Duration,
    lost: bool,
    stopped: bool,
    stats: RenewalStats,
}

impl Renewal {
    /// A lease registered at `now`, renewed every `interval` (`arena_registration_probe_interval`).
    pub fn new(now: Duration, interval: Duration) -> Self {
        Self {
            interval,
            next_at: now + interval,
            lost: false,
            stopped: false,
            stats: RenewalStats::default(),
        }
    }

    /// What to do at `now`.
    pub fn poll(&self, now: Duration) -> RenewalStep {
        if self.stopped {
            RenewalStep::Stopped
        } else if self.lost {
            RenewalStep::Reregister
        } else if now >= self.next_at {
            RenewalStep::Renew
        } else {
            RenewalStep::Wait(self.next_at - now)
        }
    }

    /// A renewal answered at `now`: `Ok(true)` Arena renewed it, `Ok(false)` Arena no longer has it (the
    /// next step re-registers it), `Err(())` it failed (the next renewal comes one interval later).
    pub fn renewed(&mut self, now: Duration, outcome: Result<bool, ()>) {
        match outcome {
            Ok(true) => self.stats.renewed += 1,
            Ok(false) => {
                self.stats.failed += 1;
                self.lost = true;
            }
            Err(()) => self.stats.failed += 1,
        }
        self.next_at = now + self.interval;
    }

    /// A re-registration answered at `now`. Either way the next renewal comes one interval later: a failed
    /// one is found again by that renewal's 404.
    pub fn reregistered(&mut self, now: Duration, ok: bool) {
        if ok {
            self.stats.reregistered += 1;
        } else {
            self.stats.reregister_failed += 1;
        }
        self.lost = false;
        self.next_at = now + self.interval;
    }

    /// Ends the lease: every later poll is [`RenewalStep::Stopped`].
    pub fn stop(&mut self) {
        self.stopped = true;
    }

    /// The counts so far.
    pub fn stats(&self) -> RenewalStats {
        self.stats
    }
}

/// Renews `registration`'s route every `interval` on `clock` until `stop` turns true, then returns what
/// happened. A renewal still waiting for its answer when `stop` turns is abandoned (a renewal changes
/// nothing a delete would not undo); a re-registration is allowed to finish, so the delete that follows the
/// return always comes after it.
pub async fn maintain(
    client: &ArenaClient,
    registration: &ModelRegistration,
    clock: Arc<dyn Clock>,
    interval: Duration,
    timeout: Duration,
    mut stop: watch::Receiver<bool>,
) -> RenewalStats {
    let name = registration.model_name.as_str();
    let mut lease = Renewal::new(clock.now(), interval);
    loop {
        if *stop.borrow() {
            lease.stop();
        }
        match lease.poll(clock.now()) {
            RenewalStep::Stopped => return lease.stats(),
            RenewalStep::Wait(d) => {
                tokio::select! {
                    () = clock.sleep(d) => {}
                    _ = stop.changed() => lease.stop(),
                }
            }
            RenewalStep::Renew => {
                let call = with_deadline("renew", name, timeout, client.renew_model(name, Some(timeout)));
                let outcome = tokio::select! {
                    r = call => r,
                    _ = stop.changed() => {
                        lease.stop();
                        continue;
                    }
                };
                match &outcome {
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(model_name = %name, "active Arena gateway route is gone; re-registering it")
                    }
                    Err(e) => {
                        tracing::warn!(model_name = %name, error = %e, "failed to renew active Arena gateway registration")
                    }
                }
                lease.renewed(clock.now(), outcome.map_err(|_| ()));
            }
            RenewalStep::Reregister => {
                let r = with_deadline(
                    "re-register",
                    name,
                    timeout,
                    client.register_model(registration, Some(timeout)),
                )
                .await;
                if let Err(e) = &r {
                    tracing::warn!(model_name = %name, error = %e, "failed to re-register active Arena gateway route");
                }
                lease.reregistered(clock.now(), r.is_ok());
            }
        }
    }
}

async fn with_deadline<T>(
    verb: &str,
    name: &str,
    limit: Duration,
    call: impl Future<Output = crate::Result<T>>,
) -> crate::Result<T> {
    tokio::time::timeout(limit, call).await.unwrap_or_else(|_| {
        Err(Error::Deadline {
            what: format!("{verb} LLM route {name}"),
            seconds: limit.as_secs_f64(),
        })
    })
}

#[cfg(test)]
mod tests;
