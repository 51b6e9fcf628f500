//! The run's sampling settings and how they meet a harness's: which temperature, top-p and top-k a
//! generation is sampled at.
//!
//! Three sources can name each value: the request itself, the session's `generation_args` (from
//! `start_session`'s metadata, reference section 6.3), and the run ([`SamplingDefaults`] in
//! [`crate::ProxyConfig`]). With [`HarnessSampling::Honour`] (the default, and the reference's
//! behaviour) the first that names a value wins, in that order. With [`HarnessSampling::Override`] the run
//! decides all three alone, so every token of the run is sampled from the distribution the trainer is told
//! about. A value nobody names falls back to temperature 1, top-p 1 and no top-k.

#[cfg(test)]
mod tests;

use crate::engine::{check_temperature, check_top_p};
use crate::error::{Error, Result};

/// The run's sampling values. `None` leaves a value to the harness (under [`HarnessSampling::Honour`]) or
/// to the fallback (temperature 1, top-p 1, no top-k).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SamplingDefaults {
    /// Softmax temperature: 0 (greedy) or at least [`crate::MIN_TEMPERATURE`].
    pub temperature: Option<f32>,
    /// Nucleus mass, in (0, 1].
    pub top_p: Option<f32>,
    /// Keep only the `top_k` most likely tokens, at least 1.
    pub top_k: Option<u32>,
}

impl SamplingDefaults {
    /// Checks the values; an error names the field and the value.
    pub fn validate(&self) -> Result<()> {
        if let Some(t) = self.temperature {
            check_temperature(t).map_err(|m| Error::Config(format!("sampling.{m}")))?;
        }
        if let Some(p) = self.top_p {
            check_top_p(p).map_err(|m| Error::Config(format!("sampling.{m}")))?;
        }
        if self.top_k == Some(0) {
            return Err(Error::Config(
                "sampling.top_k must be at least 1 (leave it unset to keep every token)".into(),
            ));
        }
        Ok(())
    }
}

/// Whose sampling values win when a harness sends its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HarnessSampling {
    /// The request's values win, then the session's `generation_args`, then the run's.
    #[default]
    Honour,
    /// The run's values always win; a value the run leaves unset is the fallback, never the harness's.
    Override,
}

/// The temperature, top-p and top-k a generation is sampled at.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Resolved {
    pub(crate) temperature: f32,
    pub(crate) top_p: f32,
    pub(crate) top_k: Option<u32>,
}

/// Resolves the values of one request. `requested` holds what the request and then the session's
/// `generation_args` named (already merged, request first).
pub(crate) fn resolve(
    requested: (Option<f32>, Option<f32>, Option<u32>),
    run: &SamplingDefaults,
    mode: HarnessSampling,
) -> Resolved {
    let (temperature, top_p, top_k) = match mode {
        HarnessSampling::Honour => (
            requested.0.or(run.temperature),
            requested.1.or(run.top_p),
            requested.2.or(run.top_k),
        ),
        HarnessSampling::Override => (run.temperature, run.top_p, run.top_k),
    };
    Resolved {
        temperature: temperature.unwrap_or(1.0),
        top_p: top_p.unwrap_or(1.0),
        top_k,
    }
}
