//! The journal's segment files: their names, finding them, the lines a new segment carries over from the
//! live ones, and retiring the segments no kept checkpoint needs.
//!
//! Segment 0 is the journal's own path (`journal-w0.jsonl`, so a journal written before segments is
//! segment 0), segment `n` is `journal-w0.<n, six digits>.jsonl` beside it. Only the newest segment is
//! appended to; the others are sealed.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::path::Path;

use serde::Deserialize;

use super::SampleKey;

/// The file name of segment `n` of the journal named `base`.
pub(super) fn name(base: &str, n: u32) -> String {
    if n == 0 {
        return base.to_string();
    }
    let stem = base.strip_suffix(".jsonl").unwrap_or(base);
    format!("{stem}.{n:06}.jsonl")
}

/// The segment number a file name in the journal's directory stands for, if it is one of `base`'s.
fn number(base: &str, file: &str) -> Option<u32> {
    if file == base {
        return Some(0);
    }
    let stem = base.strip_suffix(".jsonl").unwrap_or(base);
    let digits = file
        .strip_prefix(stem)?
        .strip_prefix('.')?
        .strip_suffix(".jsonl")?;
    if digits.len() != 6 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|n| *n > 0)
}

/// The segments of `base` in `dir`, oldest first (empty when there are none, or no directory yet).
pub(super) fn list(dir: &Path, base: &str) -> std::io::Result<Vec<u32>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        if let Some(n) = entry.file_name().to_str().and_then(|f| number(base, f)) {
            found.push(n);
        }
    }
    found.sort_unstable();
    Ok(found)
}

/// What a line says about itself, read without decoding its trajectories.
#[derive(Deserialize)]
struct Head {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    key: Option<SampleKey>,
    #[serde(default)]
    step: Option<u64>,
    #[serde(default)]
    group: Option<u32>,
    #[serde(default)]
    at: Option<At>,
    #[serde(default)]
    entry: Option<Box<Head>>,
}

/// Where an audit line says its record went.
#[derive(Deserialize)]
struct At {
    stem: String,
    index: u64,
    offset: u64,
}

/// What a carried line is, for keeping the first of each.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Carried {
    Rollout(SampleKey),
    /// A rollout's audit record and where it went: a record a resumed run appended again has a second line.
    Audit(SampleKey, String, u64, u64),
    Draw(u64, u32),
}

impl Head {
    /// The rollout or draw this line holds (itself or as a carried copy), if any.
    fn carried(&self) -> Option<(Carried, u64)> {
        match self.kind.as_str() {
            "rollout" => self.key.map(|k| (Carried::Rollout(k), k.step)),
            "audit" => {
                let (key, at) = (self.key?, self.at.as_ref()?);
                Some((
                    Carried::Audit(key, at.stem.clone(), at.index, at.offset),
                    key.step,
                ))
            }
            "draw" => Some((Carried::Draw(self.step?, self.group?), self.step?)),
            "carried" => self.entry.as_ref()?.carried(),
            _ => None,
        }
    }
}

/// Appends to `out` every rollout, audit and draw line of `file` for step `from_step` or later that `seen` does not
/// hold yet, each as a `carried` entry; complete lines only (a torn tail is the live segment's to cut).
pub(super) fn carry_lines(
    file: &File,
    from_step: u64,
    seen: &mut BTreeSet<Carried>,
    out: &mut Vec<u8>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line)? == 0 || !line.ends_with(b"\n") {
            return Ok(());
        }
        let Ok(head) = serde_json::from_slice::<Head>(&line) else {
            continue;
        };
        let Some((what, step)) = head.carried() else {
            continue;
        };
        if step < from_step || !seen.insert(what) {
            continue;
        }
        if head.kind == "carried" {
            out.extend_from_slice(&line);
        } else {
            out.extend_from_slice(br#"{"type":"carried","entry":"#);
            out.extend_from_slice(line.trim_ascii_end());
            out.extend_from_slice(b"}\n");
        }
    }
}

/// Deletes the segments `numbers` of `base` in `dir`, or moves them into `dir/retired/` when `keep`, then
/// syncs the directory.
pub(super) fn retire(dir: &Path, base: &str, numbers: &[u32], keep: bool) -> std::io::Result<()> {
    if numbers.is_empty() {
        return Ok(());
    }
    let retired = dir.join("retired");
    if keep {
        use std::os::unix::fs::DirBuilderExt as _;
        match std::fs::symlink_metadata(&retired) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(std::io::Error::other(format!(
                    "{} is not a directory",
                    retired.display()
                )));
            }
            Err(_) => std::fs::DirBuilder::new().mode(0o700).create(&retired)?,
        }
    }
    for n in numbers {
        let file = dir.join(name(base, *n));
        if keep {
            std::fs::rename(&file, retired.join(name(base, *n)))?;
        } else {
            std::fs::remove_file(&file)?;
        }
    }
    File::open(dir)?.sync_all()
}
