//! Checkpoint directories written atomically: `<root>/step-N`, where `root` is usually
//! `<fileroot>/<experiment>/<trial>/checkpoints`.
//!
//! A checkpoint is filled in a hidden temporary directory (`.step-N.tmp-<pid>`), every file and the directory
//! are synced, and one `rename` publishes it; so a directory named `step-N` is always complete, and a
//! process killed while writing leaves only a temporary directory that no reader considers and the next writer
//! removes. Saving a step that already has a checkpoint swaps the two directories in one atomic exchange
//! (`renameat2(RENAME_EXCHANGE)`) and only then removes the old one, so `step-N` never goes missing. Where the
//! file system cannot exchange, the old one is moved aside to `.step-N.old-<pid>` first, and a killed writer's
//! moved-aside checkpoint is moved back by the next [`Checkpoints::list`] or [`Checkpoints::begin`]. Each checkpoint holds `checkpoint.json` (its step, written last) and `caller_state.bin`, an opaque
//! blob the caller supplies (the training loop's data cursor and journal position); the rest is whatever the
//! caller's fill step writes ([`crate::Trainer::save_state`]: the model as a Hugging Face folder, optimiser
//! state, step count). Only the newest `keep_last` checkpoints are kept.
//!
//! One writer per root at a time: a second concurrent writer would delete the first one's temporary directory.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

#[cfg(test)]
mod tests;

/// The marker each complete checkpoint holds, written last.
pub const MARKER_FILE: &str = "checkpoint.json";
/// The caller's opaque state.
pub const CALLER_STATE_FILE: &str = "caller_state.bin";

const FORMAT: u32 = 1;

/// A root directory of checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoints {
    root: PathBuf,
}

/// One complete checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// Its directory, `<root>/step-N`.
    pub dir: PathBuf,
    /// `N`: the training steps it follows.
    pub step: u64,
}

#[derive(Serialize, Deserialize)]
struct Marker {
    format: u32,
    step: u64,
    caller_state_bytes: u64,
}

impl Checkpoint {
    /// The opaque state the caller saved with it.
    pub fn caller_state(&self) -> Result<Vec<u8>> {
        let path = self.dir.join(CALLER_STATE_FILE);
        std::fs::read(&path).map_err(|e| Error::io("reading", &path, e))
    }
}

impl Checkpoints {
    /// Checkpoints under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The checkpoints of a run: `<fileroot>/<experiment>/<trial>/checkpoints`.
    pub fn for_run(fileroot: &Path, experiment: &str, trial: &str) -> Self {
        Self::new(fileroot.join(experiment).join(trial).join("checkpoints"))
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Every complete checkpoint, oldest first. A missing root holds none; entries that are not complete
    /// checkpoints (temporary directories, foreign folders without a valid marker) are skipped. A checkpoint a
    /// killed writer had moved aside to replace it (see the module doc) is moved back first.
    pub fn list(&self) -> Result<Vec<Checkpoint>> {
        self.restore_moved_aside()?;
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io("listing", &self.root, e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io("listing", &self.root, e))?;
            let name = entry.file_name();
            let Some(step) = name
                .to_str()
                .and_then(|n| n.strip_prefix("step-"))
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let dir = entry.path();
            match read_marker(&dir) {
                Some(m) if m.step == step => out.push(Checkpoint { dir, step }),
                _ => {
                    tracing::warn!(dir = %dir.display(), "skipping a folder that is not a complete checkpoint")
                }
            }
        }
        out.sort_by_key(|c| c.step);
        Ok(out)
    }

    /// The newest complete checkpoint.
    pub fn latest(&self) -> Result<Option<Checkpoint>> {
        Ok(self.list()?.pop())
    }

    /// Starts writing the checkpoint of `step`: removes what killed writers left and returns an empty
    /// temporary directory to fill.
    pub fn begin(&self, step: u64) -> Result<Staged> {
        std::fs::create_dir_all(&self.root).map_err(|e| Error::io("creating", &self.root, e))?;
        self.restore_moved_aside()?;
        self.remove_leftovers()?;
        let tmp = self.root.join(format!(".step-{step}.tmp-{}", std::process::id()));
        std::fs::create_dir(&tmp).map_err(|e| Error::io("creating", &tmp, e))?;
        Ok(Staged {
            root: self.root.clone(),
            tmp,
            step,
            done: false,
        })
    }

    /// Writes the checkpoint of `step` in one go: `fill` writes its files into the temporary directory, then
    /// it is published with `caller_state`, keeping the newest `keep_last` (0 keeps all).
    pub fn save(
        &self,
        step: u64,
        caller_state: &[u8],
        keep_last: usize,
        fill: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<Checkpoint> {
        let staged = self.begin(step)?;
        fill(staged.dir())?;
        staged.commit(caller_state, keep_last)
    }

    /// Moves back each complete `.step-N.old-*` whose `step-N` is missing: a writer that replaced step N
    /// without an atomic exchange was killed between moving the old one aside and publishing the new one.
    fn restore_moved_aside(&self) -> Result<()> {
        let entries = match std::fs::read_dir(&self.root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io("listing", &self.root, e)),
        };
        let mut restored = false;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(step) = name
                .to_str()
                .and_then(|n| n.strip_prefix(".step-"))
                .and_then(|n| n.split_once(".old-"))
                .and_then(|(step, _)| step.parse::<u64>().ok())
            else {
                continue;
            };
            let aside = entry.path();
            let dir = self.root.join(format!("step-{step}"));
            if std::fs::symlink_metadata(&dir).is_err() && read_marker(&aside).is_some_and(|m| m.step == step)
            {
                tracing::warn!(dir = %dir.display(), "restoring a checkpoint a killed writer had moved aside");
                std::fs::rename(&aside, &dir).map_err(|e| Error::io("restoring", &dir, e))?;
                restored = true;
            }
        }
        if restored {
            sync_dir(&self.root)?;
        }
        Ok(())
    }

    fn remove_leftovers(&self) -> Result<()> {
        let entries = std::fs::read_dir(&self.root).map_err(|e| Error::io("listing", &self.root, e))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            if name.to_str().is_some_and(|n| n.starts_with(".step-")) {
                let path = entry.path();
                tracing::warn!(dir = %path.display(), "removing an unfinished checkpoint left by a killed writer");
                std::fs::remove_dir_all(&path).map_err(|e| Error::io("removing", &path, e))?;
            }
        }
        Ok(())
    }
}

/// A checkpoint being written; dropping it without [`Staged::commit`] removes it.
#[derive(Debug)]
pub struct Staged {
    root: PathBuf,
    tmp: PathBuf,
    step: u64,
    done: bool,
}

impl Staged {
    /// The temporary directory to fill.
    pub fn dir(&self) -> &Path {
        &self.tmp
    }

    /// Writes the caller's state and the marker, syncs everything, publishes the directory as `step-N`
    /// (replacing an older one of the same step atomically, see the module doc) and prunes all but the newest
    /// `keep_last` (0 keeps all).
    pub fn commit(self, caller_state: &[u8], keep_last: usize) -> Result<Checkpoint> {
        self.commit_with(caller_state, keep_last, true)
    }

    /// [`Staged::commit`], replacing an existing `step-N` by exchange when `exchange` (tests take the other
    /// way too).
    fn commit_with(mut self, caller_state: &[u8], keep_last: usize, exchange: bool) -> Result<Checkpoint> {
        write_file(&self.tmp.join(CALLER_STATE_FILE), caller_state)?;
        let marker = Marker {
            format: FORMAT,
            step: self.step,
            caller_state_bytes: caller_state.len() as u64,
        };
        let text = serde_json::to_vec_pretty(&marker).expect("the marker always serialises");
        write_file(&self.tmp.join(MARKER_FILE), &text)?;
        sync_tree(&self.tmp)?;
        let dir = self.root.join(format!("step-{}", self.step));
        match std::fs::symlink_metadata(&dir) {
            Ok(_) if exchange => self.replace(&dir)?,
            Ok(_) => self.replace_aside(&dir)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::rename(&self.tmp, &dir).map_err(|e| Error::io("publishing", &dir, e))?;
                self.done = true;
                sync_dir(&self.root)?;
            }
            Err(e) => return Err(Error::io("inspecting", &dir, e)),
        }
        let published = Checkpoint { dir, step: self.step };
        if keep_last > 0 {
            let all = Checkpoints::new(&self.root).list()?;
            let excess = all.len().saturating_sub(keep_last);
            for old in all.into_iter().take(excess) {
                if old.step != published.step {
                    std::fs::remove_dir_all(&old.dir).map_err(|e| Error::io("removing", &old.dir, e))?;
                }
            }
        }
        Ok(published)
    }
}

impl Staged {
    /// Publishes over the existing checkpoint `dir`: one atomic exchange, then the old one (now under the
    /// temporary name) is removed; a kill in between leaves the new `step-N` and a leftover the next writer
    /// removes. Without exchange on this file system, [`Staged::replace_aside`].
    fn replace(&mut self, dir: &Path) -> Result<()> {
        use rustix::fs::{CWD, RenameFlags, renameat_with};
        use rustix::io::Errno;
        match renameat_with(CWD, &self.tmp, CWD, dir, RenameFlags::EXCHANGE) {
            Ok(()) => {
                self.done = true;
                sync_dir(&self.root)?;
                std::fs::remove_dir_all(&self.tmp).map_err(|e| Error::io("removing", &self.tmp, e))
            }
            Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => self.replace_aside(dir),
            Err(e) => Err(Error::io("publishing", dir, e.into())),
        }
    }

    /// Publishes over `dir` where the file system cannot exchange: the old one is moved aside to
    /// `.step-N.old-<pid>`, the new one published, the old one removed. A kill between the two renames leaves
    /// no `step-N`, and [`Checkpoints::list`] moves the old one back.
    fn replace_aside(&mut self, dir: &Path) -> Result<()> {
        let old = self
            .root
            .join(format!(".step-{}.old-{}", self.step, std::process::id()));
        std::fs::rename(dir, &old).map_err(|e| Error::io("moving aside", dir, e))?;
        std::fs::rename(&self.tmp, dir).map_err(|e| Error::io("publishing", dir, e))?;
        self.done = true;
        sync_dir(&self.root)?;
        std::fs::remove_dir_all(&old).map_err(|e| Error::io("removing", &old, e))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

fn read_marker(dir: &Path) -> Option<Marker> {
    let text = std::fs::read(dir.join(MARKER_FILE)).ok()?;
    let m: Marker = serde_json::from_slice(&text).ok()?;
    (m.format == FORMAT).then_some(m)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| Error::io("writing", path, e))
}

/// Syncs every file under `dir`, then `dir` itself.
fn sync_tree(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("listing", dir, e))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(|e| Error::io("inspecting", &path, e))?;
        if kind.is_dir() {
            sync_tree(&path)?;
        } else if kind.is_file() {
            let f = std::fs::File::open(&path).map_err(|e| Error::io("opening", &path, e))?;
            f.sync_all().map_err(|e| Error::io("syncing", &path, e))?;
        }
    }
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<()> {
    let f = std::fs::File::open(dir).map_err(|e| Error::io("opening", dir, e))?;
    f.sync_all().map_err(|e| Error::io("syncing", dir, e))
}
