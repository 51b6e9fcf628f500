//! The batch file: one safetensors file a step, written here and read by every rank of the worker.
//!
//! Tensors are flat over the batch's sequences in order (the table in `docs/trainer-protocol.md`); the
//! header's metadata names the protocol, the kind, the step and the policy version. The file is written
//! under a temporary name and renamed, and its SHA-256 travels with the step call, so a rank never reads a
//! half-written or stale batch.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::protocol::{PROTOCOL, StepKind};

/// One sequence of a batch, with its per-token arrays aligned with `tokens` (entry `t` describes token
/// `t`, predicted from tokens `0..t`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sequence {
    pub tokens: Vec<u32>,
    /// True on trained tokens; `loss_mask[0]` is false.
    pub loss_mask: Vec<bool>,
    /// The behaviour log-probability of each trained token (anything elsewhere).
    pub logprobs: Vec<f32>,
    /// The policy version that sampled each token, -1 elsewhere.
    pub versions: Vec<i64>,
    /// The temperature each token was sampled at (0 = greedy, scored at 1).
    pub temperatures: Vec<f32>,
    /// True on tokens drawn from a truncated distribution.
    pub truncated: Vec<bool>,
    /// The sequence's advantage, after normalisation (0 for SFT).
    pub advantage: f32,
    /// The aggregation weight of each of its trained tokens.
    pub weight: f32,
}

impl Sequence {
    /// A supervised sequence: no behaviour data, advantage 0.
    pub fn sft(tokens: Vec<u32>, loss_mask: Vec<bool>, weight: f32) -> Self {
        let n = tokens.len();
        Self {
            tokens,
            loss_mask,
            logprobs: vec![0.0; n],
            versions: vec![-1; n],
            temperatures: vec![1.0; n],
            truncated: vec![false; n],
            advantage: 0.0,
            weight,
        }
    }
}

/// One step's input.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    pub kind: StepKind,
    /// Optimiser steps completed before this one.
    pub step: u64,
    /// The version of the weights the step starts from.
    pub policy_version: u64,
    pub sequences: Vec<Sequence>,
    /// Sequences per group, in order (they sum to the number of sequences).
    pub group_sizes: Vec<u64>,
}

/// The SHA-256 of `bytes`, in lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn le_bytes<T: Copy, const N: usize>(values: impl Iterator<Item = T>, f: fn(T) -> [u8; N]) -> Vec<u8> {
    values.flat_map(f).collect()
}

/// The file with its header's metadata in key order: safetensors writes a `HashMap` in its random order, and
/// the same batch must give the same bytes (and hash) each time it is written, so that a replayed step is
/// recognised. Reordering keys keeps the header's length.
fn canonical_header(mut bytes: Vec<u8>) -> Result<Vec<u8>> {
    let bad = |m: String| Error::Batch(format!("cannot canonicalise the header: {m}"));
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = &bytes[8..8 + n];
    let mut value: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(header).map_err(|e| bad(e.to_string()))?;
    if let Some(serde_json::Value::Object(meta)) = value.get_mut("__metadata__") {
        let mut sorted: Vec<_> = std::mem::take(meta).into_iter().collect();
        sorted.sort_by(|a, b| a.0.cmp(&b.0));
        meta.extend(sorted);
    }
    let text = serde_json::to_vec(&value).map_err(|e| bad(e.to_string()))?;
    if text.len() > n {
        return Err(bad(format!("{} bytes for a header of {n}", text.len())));
    }
    bytes[8..8 + text.len()].copy_from_slice(&text);
    bytes[8 + text.len()..8 + n].fill(b' ');
    Ok(bytes)
}

impl Batch {
    /// Checks shapes and values; the error names the sequence and the field.
    pub fn check(&self) -> Result<()> {
        if self.sequences.is_empty() {
            return Err(Error::Batch("the batch has no sequences".into()));
        }
        for (i, s) in self.sequences.iter().enumerate() {
            let n = s.tokens.len();
            if n == 0 {
                return Err(Error::Batch(format!("sequence {i}: tokens is empty")));
            }
            for (field, len) in [
                ("loss_mask", s.loss_mask.len()),
                ("logprobs", s.logprobs.len()),
                ("versions", s.versions.len()),
                ("temperatures", s.temperatures.len()),
                ("truncated", s.truncated.len()),
            ] {
                if len != n {
                    return Err(Error::Batch(format!(
                        "sequence {i}: {field} has {len} entries for {n} tokens"
                    )));
                }
            }
            if s.loss_mask[0] {
                return Err(Error::Batch(format!(
                    "sequence {i}: loss_mask[0] is set, but the first token has no context"
                )));
            }
            if !(s.advantage.is_finite() && s.weight.is_finite() && s.weight >= 0.0) {
                return Err(Error::Batch(format!(
                    "sequence {i}: advantage {} and weight {} must be finite (weight >= 0)",
                    s.advantage, s.weight
                )));
            }
            if i32::try_from(s.tokens.iter().copied().max().unwrap_or(0)).is_err() {
                return Err(Error::Batch(format!(
                    "sequence {i}: a token id does not fit in i32"
                )));
            }
        }
        let total: u64 = self.group_sizes.iter().sum();
        if total != self.sequences.len() as u64 || self.group_sizes.contains(&0) {
            return Err(Error::Batch(format!(
                "group_sizes {:?} do not split {} sequences into non-empty groups",
                self.group_sizes,
                self.sequences.len()
            )));
        }
        Ok(())
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        self.check()?;
        let seqs = &self.sequences;
        let tokens = || seqs.iter().flat_map(|s| s.tokens.iter().copied());
        let t = tokens().count();
        let s = seqs.len();
        let mut offsets = vec![0i64];
        for q in seqs {
            offsets.push(offsets.last().copied().unwrap_or(0) + q.tokens.len() as i64);
        }
        let u8s = |f: fn(&Sequence) -> &Vec<bool>| -> Vec<u8> {
            seqs.iter()
                .flat_map(|q| f(q).iter().map(|&b| u8::from(b)))
                .collect()
        };
        let tensors: Vec<(&str, Dtype, usize, Vec<u8>)> = vec![
            (
                "tokens",
                Dtype::I32,
                t,
                le_bytes(tokens().map(|x| x as i32), i32::to_le_bytes),
            ),
            ("loss_mask", Dtype::U8, t, u8s(|q| &q.loss_mask)),
            (
                "logprobs",
                Dtype::F32,
                t,
                le_bytes(
                    seqs.iter().flat_map(|q| q.logprobs.iter().copied()),
                    f32::to_le_bytes,
                ),
            ),
            (
                "versions",
                Dtype::I64,
                t,
                le_bytes(
                    seqs.iter().flat_map(|q| q.versions.iter().copied()),
                    i64::to_le_bytes,
                ),
            ),
            (
                "temperatures",
                Dtype::F32,
                t,
                le_bytes(
                    seqs.iter().flat_map(|q| q.temperatures.iter().copied()),
                    f32::to_le_bytes,
                ),
            ),
            ("truncated", Dtype::U8, t, u8s(|q| &q.truncated)),
            (
                "offsets",
                Dtype::I64,
                s + 1,
                le_bytes(offsets.into_iter(), i64::to_le_bytes),
            ),
            (
                "advantages",
                Dtype::F32,
                s,
                le_bytes(seqs.iter().map(|q| q.advantage), f32::to_le_bytes),
            ),
            (
                "weights",
                Dtype::F32,
                s,
                le_bytes(seqs.iter().map(|q| q.weight), f32::to_le_bytes),
            ),
            (
                "group_sizes",
                Dtype::I64,
                self.group_sizes.len(),
                le_bytes(self.group_sizes.iter().map(|&g| g as i64), i64::to_le_bytes),
            ),
        ];
        let views = tensors
            .iter()
            .map(|(name, dtype, len, data)| {
                TensorView::new(*dtype, vec![*len], data)
                    .map(|v| (*name, v))
                    .map_err(|e| Error::Batch(format!("{name}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let metadata = HashMap::from([
            ("protocol".to_string(), PROTOCOL.to_string()),
            ("kind".to_string(), self.kind.as_str().to_string()),
            ("step".to_string(), self.step.to_string()),
            ("policy_version".to_string(), self.policy_version.to_string()),
        ]);
        let bytes = safetensors::tensor::serialize(views, Some(metadata))
            .map_err(|e| Error::Batch(format!("cannot serialise: {e}")))?;
        canonical_header(bytes)
    }

    /// Writes the batch to `path` (through a temporary file in the same folder and a rename) and returns
    /// the file's SHA-256 in hex.
    pub fn write(&self, path: &Path) -> Result<String> {
        let bytes = self.to_bytes()?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = std::path::PathBuf::from(tmp);
        std::fs::write(&tmp, &bytes).map_err(Error::io(&tmp))?;
        std::fs::rename(&tmp, path).map_err(Error::io(path))?;
        Ok(sha256_hex(&bytes))
    }

    /// Reads a batch file back (what the worker sees).
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(Error::io(path))?;
        Self::from_bytes(&bytes)
    }

    /// Parses a batch file's bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bad = |m: String| Error::Batch(m);
        let (_, header) = SafeTensors::read_metadata(bytes).map_err(|e| bad(format!("header: {e}")))?;
        let meta = header.metadata().clone().unwrap_or_default();
        let field = |k: &str| {
            meta.get(k)
                .cloned()
                .ok_or_else(|| bad(format!("metadata has no {k}")))
        };
        if field("protocol")? != PROTOCOL {
            return Err(bad(format!(
                "protocol {:?} is not {PROTOCOL}",
                meta.get("protocol")
            )));
        }
        let kind = match field("kind")?.as_str() {
            "grpo" => StepKind::Grpo,
            "sft" => StepKind::Sft,
            other => return Err(bad(format!("kind {other:?} is neither grpo nor sft"))),
        };
        let number =
            |k: &str| -> Result<u64> { field(k)?.parse().map_err(|e| bad(format!("metadata {k}: {e}"))) };
        let st = SafeTensors::deserialize(bytes).map_err(|e| bad(format!("tensors: {e}")))?;
        let raw = |name: &str, dtype: Dtype| -> Result<Vec<u8>> {
            let view = st.tensor(name).map_err(|e| bad(format!("{name}: {e}")))?;
            if view.dtype() != dtype {
                return Err(bad(format!("{name} is {:?}, not {dtype:?}", view.dtype())));
            }
            Ok(view.data().to_vec())
        };
        let f32s = |n| -> Result<Vec<f32>> {
            Ok(raw(n, Dtype::F32)?
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
                .collect())
        };
        let i64s = |n| -> Result<Vec<i64>> {
            Ok(raw(n, Dtype::I64)?
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect())
        };
        let tokens: Vec<u32> = raw("tokens", Dtype::I32)?
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as u32)
            .collect();
        let mask = raw("loss_mask", Dtype::U8)?;
        let truncated = raw("truncated", Dtype::U8)?;
        let (logprobs, versions, temperatures) =
            (f32s("logprobs")?, i64s("versions")?, f32s("temperatures")?);
        let (advantages, weights) = (f32s("advantages")?, f32s("weights")?);
        let offsets = i64s("offsets")?;
        let t = tokens.len();
        if offsets.len() != advantages.len() + 1
            || weights.len() != advantages.len()
            || offsets.first() != Some(&0)
            || offsets.last().copied() != Some(t as i64)
            || offsets.windows(2).any(|w| w[0] > w[1])
        {
            return Err(bad("offsets do not split the tokens into the sequences".into()));
        }
        for (name, len) in [
            ("loss_mask", mask.len()),
            ("truncated", truncated.len()),
            ("logprobs", logprobs.len()),
            ("versions", versions.len()),
            ("temperatures", temperatures.len()),
        ] {
            if len != t {
                return Err(bad(format!("{name} has {len} entries for {t} tokens")));
            }
        }
        let sequences = offsets
            .windows(2)
            .zip(advantages.iter().zip(&weights))
            .map(|(w, (&advantage, &weight))| {
                let r = usize::try_from(w[0]).unwrap_or(0)..usize::try_from(w[1]).unwrap_or(0);
                Sequence {
                    tokens: tokens[r.clone()].to_vec(),
                    loss_mask: mask[r.clone()].iter().map(|&m| m != 0).collect(),
                    logprobs: logprobs[r.clone()].to_vec(),
                    versions: versions[r.clone()].to_vec(),
                    temperatures: temperatures[r.clone()].to_vec(),
                    truncated: truncated[r].iter().map(|&m| m != 0).collect(),
                    advantage,
                    weight,
                }
            })
            .collect();
        Ok(Self {
            kind,
            step: number("step")?,
            policy_version: number("policy_version")?,
            sequences,
            group_sizes: i64s("group_sizes")?.into_iter().map(|g| g as u64).collect(),
        })
    }
}

#[cfg(test)]
mod tests;
