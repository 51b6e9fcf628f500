//! The journal's compact form of a trajectory's per-token arrays: one base64 string per trajectory in place
//! of eight JSON arrays, with every value kept bit for bit (a resumed run trains on exactly what was
//! sampled).
//!
//! The blob is a format byte (1), then each array in a fixed order, each prefixed by its length (an empty
//! array, as old records hold for the sampling settings, stays empty):
//!
//! - `token_ids`: one LEB128 varint per token (1-3 bytes for vocabularies under 2^21);
//! - `loss_mask`, `versions` (zigzag), `temperatures`, `top_ps` (IEEE bits), `top_ks`, `truncated`: runs of
//!   `(value, count)` varint pairs, since they change only at turn boundaries;
//! - `logprobs`: runs of zero / non-zero bit patterns, then the non-zero values as 4 little-endian bytes
//!   each, so that only sampled tokens cost their log-probability.
//!
//! Serialised with `#[serde(with = "compact")]`, the journal writes the compact form and reads both it and the
//! plain arrays of journals written before it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use rollout_proxy::{ExportedTrajectory, IntegrityHit};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

const FORMAT: u8 = 1;

/// A trajectory as the journal stores it: the per-token arrays in `tokens`, everything else as it is.
#[derive(Serialize, Deserialize)]
struct Stored {
    session_id: String,
    interaction_id: String,
    interaction_ids: Vec<String>,
    /// The per-token arrays, base64 of the blob this module describes.
    tokens: String,
    prompt_len: usize,
    reward: f64,
    original_reward: f64,
    finish_reason: String,
    metadata: Value,
    /// The integrity hits on the trajectory, as exported (absent in older records and when none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    integrity_hits: Vec<IntegrityHit>,
}

/// Either form, for reading.
#[derive(Deserialize)]
#[serde(untagged)]
enum Either {
    Compact(Vec<Stored>),
    Plain(Vec<ExportedTrajectory>),
}

/// Serialises trajectories in the compact form.
pub(crate) fn serialize<S: Serializer>(trajectories: &[ExportedTrajectory], s: S) -> Result<S::Ok, S::Error> {
    for t in trajectories {
        aligned(t).map_err(serde::ser::Error::custom)?;
    }
    let stored: Vec<Stored> = trajectories
        .iter()
        .map(|t| Stored {
            session_id: t.session_id.clone(),
            interaction_id: t.interaction_id.clone(),
            interaction_ids: t.interaction_ids.clone(),
            tokens: STANDARD_NO_PAD.encode(encode(t)),
            prompt_len: t.prompt_len,
            reward: t.reward,
            original_reward: t.original_reward,
            finish_reason: t.finish_reason.clone(),
            metadata: t.metadata.clone(),
            integrity_hits: t.integrity_hits.clone(),
        })
        .collect();
    stored.serialize(s)
}

/// Reads trajectories in either form.
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ExportedTrajectory>, D::Error> {
    match Either::deserialize(d)? {
        Either::Plain(plain) => Ok(plain),
        Either::Compact(stored) => stored
            .into_iter()
            .map(|s| {
                let blob = STANDARD_NO_PAD.decode(&s.tokens).map_err(|e| {
                    serde::de::Error::custom(format!("a trajectory's tokens are not base64: {e}"))
                })?;
                let mut t = ExportedTrajectory {
                    session_id: s.session_id,
                    interaction_id: s.interaction_id,
                    interaction_ids: s.interaction_ids,
                    token_ids: Vec::new(),
                    loss_mask: Vec::new(),
                    logprobs: Vec::new(),
                    versions: Vec::new(),
                    temperatures: Vec::new(),
                    top_ps: Vec::new(),
                    top_ks: Vec::new(),
                    truncated: Vec::new(),
                    prompt_len: s.prompt_len,
                    reward: s.reward,
                    original_reward: s.original_reward,
                    finish_reason: s.finish_reason,
                    metadata: s.metadata,
                    integrity_hits: s.integrity_hits,
                };
                decode(&blob, &mut t).map_err(serde::de::Error::custom)?;
                Ok(t)
            })
            .collect(),
    }
}

/// Every per-token array is empty or has one value per token, as the proxy exports them; anything else
/// would not read back.
fn aligned(t: &ExportedTrajectory) -> Result<(), String> {
    let n = t.token_ids.len();
    let lens = [
        ("loss_mask", t.loss_mask.len()),
        ("logprobs", t.logprobs.len()),
        ("versions", t.versions.len()),
        ("temperatures", t.temperatures.len()),
        ("top_ps", t.top_ps.len()),
        ("top_ks", t.top_ks.len()),
        ("truncated", t.truncated.len()),
    ];
    match lens.iter().find(|(_, len)| *len != 0 && *len != n) {
        Some((name, len)) => Err(format!(
            "trajectory {} has {len} {name} for {n} tokens",
            t.interaction_id
        )),
        None => Ok(()),
    }
}

/// The blob of `t`'s per-token arrays.
pub(crate) fn encode(t: &ExportedTrajectory) -> Vec<u8> {
    let mut out = vec![FORMAT];
    varint(&mut out, t.token_ids.len() as u64);
    for &id in &t.token_ids {
        varint(&mut out, u64::from(id));
    }
    runs(
        &mut out,
        t.loss_mask.iter().map(|&m| u64::from(m)),
        t.loss_mask.len(),
    );
    runs(&mut out, t.versions.iter().map(|&v| zigzag(v)), t.versions.len());
    runs(
        &mut out,
        t.temperatures.iter().map(|f| u64::from(f.to_bits())),
        t.temperatures.len(),
    );
    runs(
        &mut out,
        t.top_ps.iter().map(|f| u64::from(f.to_bits())),
        t.top_ps.len(),
    );
    runs(&mut out, t.top_ks.iter().map(|&k| u64::from(k)), t.top_ks.len());
    runs(
        &mut out,
        t.truncated.iter().map(|&x| u64::from(x)),
        t.truncated.len(),
    );
    runs(
        &mut out,
        t.logprobs.iter().map(|f| u64::from(f.to_bits() != 0)),
        t.logprobs.len(),
    );
    for f in t.logprobs.iter().filter(|f| f.to_bits() != 0) {
        out.extend_from_slice(&f.to_le_bytes());
    }
    out
}

/// Fills `t`'s per-token arrays from a blob.
pub(crate) fn decode(blob: &[u8], t: &mut ExportedTrajectory) -> Result<(), String> {
    let mut r = Reader { data: blob, pos: 0 };
    let format = r.byte()?;
    if format != FORMAT {
        return Err(format!(
            "a trajectory's tokens are in format {format}, not {FORMAT}"
        ));
    }
    let n = r.tokens()?;
    t.token_ids = (0..n)
        .map(|_| {
            r.varint()
                .and_then(|v| u32::try_from(v).map_err(|_| "a token id over 2^32".to_string()))
        })
        .collect::<Result<_, _>>()?;
    let narrow = |v: u64, what: &str| u32::try_from(v).map_err(|_| format!("a {what} value over 2^32"));
    t.loss_mask = r.runs(n)?.into_iter().map(|v| v as u8).collect();
    t.versions = r.runs(n)?.into_iter().map(unzigzag).collect();
    t.temperatures = r
        .runs(n)?
        .into_iter()
        .map(|v| narrow(v, "temperature").map(f32::from_bits))
        .collect::<Result<_, _>>()?;
    t.top_ps = r
        .runs(n)?
        .into_iter()
        .map(|v| narrow(v, "top_p").map(f32::from_bits))
        .collect::<Result<_, _>>()?;
    t.top_ks = r
        .runs(n)?
        .into_iter()
        .map(|v| narrow(v, "top_k"))
        .collect::<Result<_, _>>()?;
    t.truncated = r.runs(n)?.into_iter().map(|v| v as u8).collect();
    let present = r.runs(n)?;
    t.logprobs = present
        .into_iter()
        .map(|p| if p == 0 { Ok(0.0) } else { r.f32() })
        .collect::<Result<_, _>>()?;
    if r.pos != blob.len() {
        return Err(format!(
            "{} bytes after a trajectory's tokens",
            blob.len() - r.pos
        ));
    }
    Ok(())
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// `len`, then `(value, count)` pairs covering `len` values.
fn runs(out: &mut Vec<u8>, values: impl Iterator<Item = u64>, len: usize) {
    varint(out, len as u64);
    let mut current: Option<(u64, u64)> = None;
    for v in values {
        match &mut current {
            Some((value, count)) if *value == v => *count += 1,
            _ => {
                if let Some((value, count)) = current {
                    varint(out, value);
                    varint(out, count);
                }
                current = Some((v, 1));
            }
        }
    }
    if let Some((value, count)) = current {
        varint(out, value);
        varint(out, count);
    }
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, String> {
        let b = *self.data.get(self.pos).ok_or("a trajectory's tokens end early")?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a varint of a trajectory's tokens is too long".to_string())
    }

    /// The token count: every token takes at least one byte, so a corrupt count never allocates much.
    fn tokens(&mut self) -> Result<usize, String> {
        let n = self.varint()?;
        let rest = (self.data.len() - self.pos) as u64;
        usize::try_from(n)
            .ok()
            .filter(|_| n <= rest)
            .ok_or_else(|| format!("a trajectory claims {n} tokens in {rest} bytes"))
    }

    /// One run-length array: empty, or one value per token.
    fn runs(&mut self, tokens: usize) -> Result<Vec<u64>, String> {
        let n = usize::try_from(self.varint()?).unwrap_or(usize::MAX);
        if n != 0 && n != tokens {
            return Err(format!("an array of {n} values for {tokens} tokens"));
        }
        let mut values = Vec::with_capacity(n);
        while values.len() < n {
            let value = self.varint()?;
            let count = usize::try_from(self.varint()?).unwrap_or(usize::MAX);
            if count == 0 || count > n - values.len() {
                return Err(format!("a run of {count} past the {n} values of an array"));
            }
            values.extend(std::iter::repeat_n(value, count));
        }
        Ok(values)
    }

    fn f32(&mut self) -> Result<f32, String> {
        let bytes = self
            .data
            .get(self.pos..self.pos + 4)
            .ok_or("a trajectory's log-probabilities end early")?;
        self.pos += 4;
        Ok(f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }
}

#[cfg(test)]
mod tests;
