//! A run from its config, in rooms: [`settings`] maps the config onto each component's own config,
//! [`setup`](setup()) builds the run (paths, journal and leftover cleanup, Arena client, streams and rows, the
//! proxy and its engine, routing), [`train`] pipelines the training steps (`pipeline.rs`), [`rollout_only`]
//! only exports scored rollouts, [`evaluate`] evaluates a checkpoint (`eval.rs`), and `checkpoint.rs` holds the loop's checkpoints and resume checks.
//!
//! Setup failures are one line each ([`crate::Error`]): a bad config, an unreachable Arena, every stream
//! unhealthy, the proxy port taken, a checkpoint from another model; every mistake in the config is found
//! before the run acts, and reported at once (`check.rs`). The journal is then opened (and a killed run's
//! routes and tasks cleaned) before anything else can fail; journal segments are retired only once no kept
//! checkpoint needs them.

mod check;
mod checkpoint;
mod collect;
mod eval;
pub mod leftovers;
mod pipeline;
mod reach;
mod rollout_only;
mod serving;
pub mod settings;
mod setup;

pub use checkpoint::{CheckpointMeta, latest_checkpoint, model_fingerprint};
pub use collect::{Collected, RunSummary};
pub use eval::{EvalEngines, EvalOptions, EvalSummary, checkpoint_model, evaluate};
pub use pipeline::train;
pub use rollout_only::rollout_only;
pub use serving::EngineHandle;
pub use settings::reward_config;
pub use setup::{Plugins, Run, RunPaths, setup};

use crate::error::{Context as _, Result};

/// Writes the run's config, redacted by name, place and value ([`stream_config::redact`] with the run's
/// secrets), as `<run dir>/config.yaml`: mode 0600, through a synced temporary file and a rename, so a kill
/// leaves the old file or the new one and no reader on a shared file root ever sees it.
fn save_config(run: &Run) -> Result<()> {
    let dir = &run.paths.run_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let yaml = run.config.to_redacted_yaml(&run.secrets)?;
    crate::fsutil::write_private(&dir.join("config.yaml"), yaml.as_bytes())
        .context("cannot save the redacted run config")
}

/// Starts the run's experiment trackers (none when `metrics.trackers` is empty).
fn start_trackers(run: &Run, resume_at: Option<u64>) -> Result<Option<crate::observe::trackers::Trackers>> {
    if run.trackers.is_empty() {
        return Ok(None);
    }
    crate::observe::trackers::Trackers::start(
        &run.trackers,
        &run.paths.run_dir,
        &run.paths.metrics,
        resume_at,
    )
    .map(Some)
}

/// Closes the session-gateway registry, deleting its routes; failures are logged.
async fn finish(run: &Run) {
    match run.workflow.close().await {
        Ok(failed) if failed.is_empty() => {}
        Ok(failed) => tracing::warn!(routes = ?failed, "some LLM routes could not be deleted at shutdown"),
        Err(e) => tracing::warn!(error = %e, "closing the run's routes"),
    }
}
