//! Shared helpers: a standard world, a fast client, and log capture.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arena_client::{ArenaClient, ClientConfig, RetryPolicy};
use arena_sim::{ArenaSim, StreamDef, World};
use secrecy::SecretString;

pub(crate) const TOKEN: &str = "test-openapi-token";

/// One active stream `s1` (harness `claude-code@1`, grader `grader@1`) with rows `r1`..`r3`, and its
/// harness version published.
pub(crate) fn world() -> World {
    World {
        token: TOKEN.to_string(),
        ..World::default()
    }
    .stream(
        StreamDef::new("s1")
            .harness("claude-code", "1")
            .reward("grader", "1")
            .row("r1", &["domain:swe"])
            .row("r2", &["domain:math"])
            .row("r3", &[]),
    )
    .harness_version("claude-code", "1", "PUBLISHED")
}

pub(crate) async fn start(world: World) -> ArenaSim {
    ArenaSim::start(world).await.expect("arena-sim starts")
}

/// A client with millisecond backoff and polling, so tests never wait on the reference's seconds.
pub(crate) fn config(sim: &ArenaSim) -> ClientConfig {
    let mut config = ClientConfig::new(&sim.base_url(), SecretString::from(TOKEN)).expect("valid base URL");
    config.retry = RetryPolicy {
        retries: 3,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(4),
        jitter: true,
    };
    config.timeout = Duration::from_secs(10);
    config.poll_interval = Duration::from_millis(5);
    config
}

pub(crate) fn client(sim: &ArenaSim) -> ArenaClient {
    ArenaClient::new(config(sim)).expect("client builds")
}

pub(crate) fn client_with(sim: &ArenaSim, edit: impl FnOnce(&mut ClientConfig)) -> ArenaClient {
    let mut config = config(sim);
    edit(&mut config);
    ArenaClient::new(config).expect("client builds")
}

/// Every log line emitted on this thread (all tests run on a current-thread runtime, so spawned tasks log
/// here too) while the guard lives.
#[derive(Clone, Default)]
pub(crate) struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    pub(crate) fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let guard = tracing::subscriber::set_default(subscriber);
        (logs, guard)
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer lock")).into_owned()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer lock").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
