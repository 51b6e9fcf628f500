//! The native RL receipt, version 1 (`arena-2026.md` 2.2, AReaL #1750): the only evidence the strict receipt
//! policy accepts that a failed task ran and exported healthily and that its failure was the model's.
//!
//! Every check is strict: types are checked exactly (`true` is not `1`, `1.0` is not `1`), the failed runs
//! and their attributed failures must match one to one, and any trace of another result format (a GameAgent
//! outcome, the Claude agent-phase text) vetoes the receipt however healthy it looks.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

use crate::harness::has_outcome_format;

/// Why a `raw` payload is not a valid v1 receipt; [`ReceiptProblem::kind`] is a stable label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiptProblem {
    /// `raw` is not a JSON object.
    NotAnObject,
    /// `raw` also carries a GameAgent outcome or the Claude agent-phase text (a format conflict).
    Vetoed,
    /// A field is missing or has the wrong type or value.
    Field(&'static str),
    /// `runTerminals`, `exportedRunCount` and `runFailures` do not describe the same failed runs.
    Attribution(&'static str),
}

impl ReceiptProblem {
    /// A stable label: `not_an_object`, `vetoed`, `field` or `attribution`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotAnObject => "not_an_object",
            Self::Vetoed => "vetoed",
            Self::Field(_) => "field",
            Self::Attribution(_) => "attribution",
        }
    }
}

impl fmt::Display for ReceiptProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotAnObject => f.write_str("raw is not an object"),
            Self::Vetoed => f.write_str("raw also carries a GameAgent outcome or Claude's error text"),
            Self::Field(field) => write!(f, "receipt field {field} is missing or wrong"),
            Self::Attribution(what) => write!(f, "receipt attribution: {what}"),
        }
    }
}

/// Whether `raw` carries a result format other than the receipt: a GameAgent outcome in any form, or
/// (case-insensitively) `claude reported error` in a string `raw.error`.
pub fn format_conflict(raw: &Value) -> bool {
    let claude = raw
        .get("error")
        .and_then(Value::as_str)
        .is_some_and(|e| e.to_lowercase().contains("claude reported error"));
    claude || has_outcome_format(raw)
}

/// Checks `raw` as a v1 receipt of a healthy run whose failed runs all failed for want of a public answer.
pub fn check_receipt(raw: &Value) -> Result<(), ReceiptProblem> {
    let Value::Object(r) = raw else {
        return Err(ReceiptProblem::NotAnObject);
    };
    if format_conflict(raw) {
        return Err(ReceiptProblem::Vetoed);
    }
    let exact_int = |key: &'static str, want: Option<u64>| -> Result<u64, ReceiptProblem> {
        match r.get(key) {
            Some(Value::Number(n)) if n.is_u64() && want.is_none_or(|w| n.as_u64() == Some(w)) => {
                Ok(n.as_u64().expect("checked is_u64"))
            }
            _ => Err(ReceiptProblem::Field(key)),
        }
    };
    let is = |key: &'static str, want: &Value| -> Result<(), ReceiptProblem> {
        (r.get(key) == Some(want))
            .then_some(())
            .ok_or(ReceiptProblem::Field(key))
    };
    exact_int("nativeRlReceiptVersion", Some(1))?;
    is("nativeExecutionHealthy", &Value::Bool(true))?;
    is("nativeExportHealthy", &Value::Bool(true))?;
    is("status", &Value::from("ERROR"))?;
    is("trajectoryHealth", &Value::from("healthy"))?;
    is("nativeStopReason", &Value::from("completed"))?;
    is("nativeFailure", &Value::Null)?;
    let terminals = match r.get("runTerminals") {
        Some(Value::Object(t)) if !t.is_empty() => t,
        _ => return Err(ReceiptProblem::Field("runTerminals")),
    };
    let mut failed_runs = BTreeSet::new();
    for (run, terminal) in terminals {
        match terminal.as_str() {
            _ if run.is_empty() => return Err(ReceiptProblem::Field("runTerminals")),
            Some("run.failed") => {
                failed_runs.insert(run.as_str());
            }
            Some("run.completed") => {}
            _ => return Err(ReceiptProblem::Field("runTerminals")),
        }
    }
    let count = exact_int("exportedRunCount", None)?;
    if count != terminals.len() as u64 {
        return Err(ReceiptProblem::Attribution(
            "exportedRunCount differs from runTerminals",
        ));
    }
    let failures = match r.get("runFailures") {
        Some(Value::Array(f)) if !f.is_empty() => f,
        _ => return Err(ReceiptProblem::Field("runFailures")),
    };
    let mut attributed = BTreeSet::new();
    for failure in failures {
        let run = attributed_run(failure)?;
        if !failed_runs.contains(run) {
            return Err(ReceiptProblem::Attribution(
                "a failure names a run that did not fail",
            ));
        }
        if !attributed.insert(run) {
            return Err(ReceiptProblem::Attribution("a run has two failures"));
        }
    }
    if attributed != failed_runs {
        return Err(ReceiptProblem::Attribution(
            "a failed run has no attributed failure",
        ));
    }
    Ok(())
}

/// The run a `runFailures` entry attributes to the model's missing public answer.
fn attributed_run(failure: &Value) -> Result<&str, ReceiptProblem> {
    let f: &Map<String, Value> = failure.as_object().ok_or(ReceiptProblem::Field("runFailures"))?;
    let run = f
        .get("runId")
        .and_then(Value::as_str)
        .ok_or(ReceiptProblem::Field("runFailures.runId"))?;
    let error = f.get("error");
    if error.and_then(|e| e.get("code")) != Some(&Value::from("RUNTIME_EXECUTION_FAILED")) {
        return Err(ReceiptProblem::Field("runFailures.error.code"));
    }
    let runtime = error
        .and_then(|e| e.get("details"))
        .and_then(|d| d.get("runtimeFailure"));
    if runtime.and_then(|r| r.get("code")) != Some(&Value::from("DSH_PUBLIC_ANSWER_MISSING")) {
        return Err(ReceiptProblem::Field(
            "runFailures.error.details.runtimeFailure.code",
        ));
    }
    if runtime.and_then(|r| r.get("reason")) != Some(&Value::from("public_answer_missing")) {
        return Err(ReceiptProblem::Field(
            "runFailures.error.details.runtimeFailure.reason",
        ));
    }
    Ok(run)
}

#[cfg(test)]
pub(crate) mod tests;
