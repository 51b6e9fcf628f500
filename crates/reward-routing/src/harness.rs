//! Harness outcome codes (`arena-2026.md` 2.8, AReaL #1746): the GameAgent code a failed task's `raw` names,
//! read for metrics, episode metadata and audit records, and by the merged-main failure policy.
//!
//! A code is written three ways: `raw.outcome.code` (the harness's `areal.envarena-outcome.v1` object),
//! `raw.outcome_code`, and a `GAMEAGENT_OUTCOME_CODE=<CODE>` marker in the `raw.error` text, delimited by
//! whitespace or the ends of the text. The first well-formed one of those, in that order, is the code.

use serde_json::Value;

/// The codes that get a metric of their own (`harness_error/<CODE>`); any other code counts as
/// [`OTHER_CODE`].
pub const HARNESS_OUTCOME_METRIC_CODES: [&str; 6] = [
    "AGENT_MAX_TURNS_EXCEEDED",
    "AGENT_RUN_TIMEOUT",
    "AUTONOMOUS_INCOMPLETE_NO_SHIP",
    "GAMEAGENT_RUN_FAILED",
    "LLM_RESPONSE_FAILED",
    "LLM_RESPONSE_TIMEOUT",
];

/// The metric code of a harness failure whose code is not one of [`HARNESS_OUTCOME_METRIC_CODES`], or that
/// names none.
pub const OTHER_CODE: &str = "OTHER";

/// The marker a GameAgent harness writes into its error summary.
pub const OUTCOME_CODE_MARKER: &str = "GAMEAGENT_OUTCOME_CODE=";

/// Whether `code` is well formed: `^[A-Z][A-Z0-9_]{0,127}$`.
pub fn is_well_formed_code(code: &str) -> bool {
    let bytes = code.as_bytes();
    (1..=128).contains(&bytes.len())
        && bytes[0].is_ascii_uppercase()
        && bytes
            .iter()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_')
}

/// The outcome code `raw` names: the first well-formed one of `raw.outcome.code`, `raw.outcome_code` and the
/// markers in `raw.error`, in that order; `None` when there is none.
pub fn outcome_code(raw: &Value) -> Option<&str> {
    let from_object = raw
        .get("outcome")
        .and_then(|o| o.get("code"))
        .and_then(Value::as_str);
    let flat = raw.get("outcome_code").and_then(Value::as_str);
    let markers = raw
        .get("error")
        .and_then(Value::as_str)
        .into_iter()
        .flat_map(markers);
    from_object
        .into_iter()
        .chain(flat)
        .chain(markers)
        .find(|code| is_well_formed_code(code))
}

/// The codes of every `GAMEAGENT_OUTCOME_CODE=` marker in `text` (well formed or not).
fn markers(text: &str) -> impl Iterator<Item = &str> {
    text.split_whitespace()
        .filter_map(|token| token.strip_prefix(OUTCOME_CODE_MARKER))
}

/// Whether `raw` carries a GameAgent outcome in any of its three forms, well formed or not: the presence of
/// an `outcome` or `outcome_code` key, or a marker in `raw.error`.
pub fn has_outcome_format(raw: &Value) -> bool {
    raw.get("outcome").is_some()
        || raw.get("outcome_code").is_some()
        || raw
            .get("error")
            .and_then(Value::as_str)
            .is_some_and(|e| e.contains(OUTCOME_CODE_MARKER))
}

/// The metric code of a `HARNESS_FAILED` task: its outcome code when that is one of
/// [`HARNESS_OUTCOME_METRIC_CODES`], else [`OTHER_CODE`].
pub fn metric_code(raw: &Value) -> &'static str {
    outcome_code(raw)
        .and_then(|code| HARNESS_OUTCOME_METRIC_CODES.iter().find(|c| **c == code).copied())
        .unwrap_or(OTHER_CODE)
}

#[cfg(test)]
mod tests;
