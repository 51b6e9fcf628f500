//! The loop's checkpoints: [`CheckpointMeta`] as the caller blob of `trainer::Checkpoints`, finding the
//! newest one, writing one, and the checks a resumed run makes before it trusts one.

use std::path::{Path, PathBuf};

use crate::error::{Context as _, Error, Result};
use crate::journal::Journal;
use crate::resolve::seed_of;
use crate::train::TrainStep;

/// The loop's own state in a checkpoint: the caller blob of the trainer's checkpoint (JSON in
/// `caller_state.bin`; the directory layout, atomic publication and pruning are `trainer::Checkpoints`').
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CheckpointMeta {
    /// Training steps done.
    pub steps: u64,
    /// The policy version of its weights.
    pub version: u64,
    /// The model folder it belongs to.
    pub model_path: String,
    /// [`model_fingerprint`] of that folder.
    pub model_fingerprint: String,
    /// The data cursor: the next step whose rows the run rolls out (rows are a function of the step).
    pub data_cursor: u64,
    /// Bytes of this worker's journal segment `journal_segment` when the checkpoint was written; a resumed
    /// run refuses a segment that is now shorter or gone (truncated or replaced), since the rollouts the
    /// checkpoint resumes with would be lost.
    pub journal_bytes: u64,
    /// The journal segment started for this checkpoint (0 in checkpoints written before segments): it
    /// carries everything a run resumed from here needs, so older segments can be retired.
    #[serde(default)]
    pub journal_segment: u32,
}

/// A fingerprint of the model folder's architecture (`config.json`), stored in checkpoints. An unreadable
/// `config.json` is an error, never the fingerprint of an empty file.
pub fn model_fingerprint(dir: &Path) -> Result<String> {
    let path = dir.join("config.json");
    let text = std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(format!("{:016x}", seed_of(&String::from_utf8_lossy(&text))))
}

/// The newest complete checkpoint under `dir` and the loop's state in it.
pub fn latest_checkpoint(dir: &Path) -> Result<Option<(PathBuf, CheckpointMeta)>> {
    let listed = trainer::Checkpoints::new(dir)
        .latest()
        .with_context(|| format!("cannot list the checkpoints in {}", dir.display()))?;
    let Some(ckpt) = listed else {
        return Ok(None);
    };
    let blob = ckpt
        .caller_state()
        .with_context(|| format!("cannot read checkpoint {}", ckpt.dir.display()))?;
    let meta: CheckpointMeta = serde_json::from_slice(&blob).with_context(|| {
        format!(
            "checkpoint {} holds no loop state this version reads",
            ckpt.dir.display()
        )
    })?;
    Ok(Some((ckpt.dir, meta)))
}

/// Writes the checkpoint of `meta.steps` under `dir`: the step's own state, then the loop's state as the
/// caller blob, published atomically, keeping the newest `keep_last`.
pub(crate) fn save_checkpoint(
    dir: &Path,
    meta: &CheckpointMeta,
    step: &mut dyn TrainStep,
    keep_last: usize,
) -> Result<PathBuf> {
    let staged = trainer::Checkpoints::new(dir)
        .begin(meta.steps)
        .with_context(|| format!("cannot stage a checkpoint in {}", dir.display()))?;
    step.save(staged.dir())?;
    crate::failpoint::reach(crate::failpoint::CHECKPOINT_WRITING);
    let blob = serde_json::to_vec_pretty(meta).context("serialising the loop state")?;
    let ckpt = staged
        .commit(&blob, keep_last)
        .with_context(|| format!("cannot publish the checkpoint of step {}", meta.steps))?;
    crate::failpoint::reach(crate::failpoint::CHECKPOINT_PUBLISHED);
    Ok(ckpt.dir)
}

/// The checks before resuming from `checkpoint`: the same model, and a journal at least as long as the one
/// the checkpoint saw.
pub(crate) fn check_resume(
    checkpoint: &Path,
    meta: &CheckpointMeta,
    model_dir: &Path,
    fingerprint: &str,
    journal: &Journal,
) -> Result<()> {
    if meta.model_fingerprint != fingerprint {
        return Err(Error::CheckpointOfAnotherModel {
            checkpoint: checkpoint.to_path_buf(),
            saved_from: meta.model_path.clone(),
            model: model_dir.to_path_buf(),
        });
    }
    let now = journal.segment_len(meta.journal_segment)?.unwrap_or(0);
    if now < meta.journal_bytes || (meta.journal_segment > 0 && now == 0) {
        return Err(Error::JournalTruncated {
            path: journal.path().to_path_buf(),
            segment: meta.journal_segment,
            now,
            saved: meta.journal_bytes,
            checkpoint: checkpoint.to_path_buf(),
        });
    }
    Ok(())
}

/// The oldest journal segment a checkpoint kept under `dir` needs (one it cannot read needs all).
pub(crate) fn oldest_needed_segment(dir: &Path) -> Result<u32> {
    let kept = trainer::Checkpoints::new(dir)
        .list()
        .with_context(|| format!("cannot list the checkpoints in {}", dir.display()))?;
    let mut oldest = u32::MAX;
    for ckpt in kept {
        let meta = ckpt
            .caller_state()
            .ok()
            .and_then(|blob| serde_json::from_slice::<CheckpointMeta>(&blob).ok());
        oldest = oldest.min(meta.map_or(0, |m| m.journal_segment));
    }
    Ok(oldest)
}

#[cfg(test)]
mod tests;
