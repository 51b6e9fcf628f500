//! What an evaluation runs: a manifest of explicit `env:key@version` task references in one Stream, or a
//! subset of the config's Streams (every row of each), and the selection of prompt rows from it.
//!
//! The validation and its messages are the reference's (spec 2026 section 2.14, `select_task_indices` and
//! `select_evaluation_rows`): a manifest is a nonempty JSON list of distinct ids, every id and every source row
//! is an `env:<key>@<version>` reference, keys are unique on both sides and every selected key is in the
//! Stream. The selected rows are the Stream's rows in manifest order with `data_id` replaced by the
//! manifest's reference, so an older version of an environment can be evaluated while the Stream lists a
//! newer one, and the Stream's routing is kept.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use stream_config::env_key;

use crate::error::{Error, Result};
use crate::resolve::PromptRow;

/// The reference's message for a manifest that is not a nonempty JSON list of nonempty strings.
pub const NOT_A_LIST: &str = "Task selection must be a nonempty JSON list of data IDs";
/// The reference's message for a manifest with an id twice.
pub const DUPLICATE_IDS: &str = "Task selection contains duplicate data IDs";
/// The reference's message for a Stream with an id twice.
pub const STREAM_NOT_UNIQUE: &str = "Task selection requires unique data IDs in one stream";
/// The reference's message for ids the Stream does not have.
pub const ABSENT_IDS: &str = "Task selection contains IDs absent from the configured stream";
/// The reference's message for an id (in the manifest or the Stream) that is not `env:key@version`.
pub const NOT_ENV_REF: &str = "Evaluation task IDs must be explicit env:key@version refs";
/// The reference's message for a Stream with an environment key twice.
pub const SOURCE_KEYS_NOT_UNIQUE: &str = "Evaluation source must contain unique environment keys";
/// The reference's message for a manifest with an environment key twice (two versions of one key).
pub const SELECTION_KEYS_NOT_UNIQUE: &str = "Evaluation selection must contain unique environment keys";
/// The reference's message for manifest keys the Stream does not have.
pub const ABSENT_ENVS: &str = "Evaluation selection contains environments absent from stream";
/// The reference's message for a task manifest in a config of several Streams that does not say which.
pub const ONE_STREAM: &str = "Task selection requires exactly one Arena stream";

/// What to evaluate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Manifest {
    /// Explicit `env:key@version` references in one Stream (`None`: the config's only Stream).
    Tasks {
        /// The Stream's name.
        stream: Option<String>,
        /// The references, in the order to report them.
        tasks: Vec<String>,
    },
    /// Every row of these Streams.
    Streams(Vec<String>),
}

fn invalid(origin: &str, message: impl std::fmt::Display) -> Error {
    Error::Invalid(format!("eval manifest {origin}: {message}"))
}

impl Manifest {
    /// Reads a manifest from JSON: the reference's list of references (`["env:a@1", ...]`), or an object
    /// `{"stream": NAME, "tasks": [...]}` or `{"streams": [NAME, ...]}`. `origin` names the file in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Self> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| invalid(origin, format_args!("not JSON: {e}")))?;
        match value {
            Value::Array(_) => Ok(Self::Tasks {
                stream: None,
                tasks: task_list(&value, origin)?,
            }),
            Value::Object(map) => {
                if let Some(key) = map
                    .keys()
                    .find(|k| !["stream", "tasks", "streams"].contains(&k.as_str()))
                {
                    return Err(invalid(
                        origin,
                        format_args!(
                            "unknown field {key:?} (expected tasks with an optional stream, or streams)"
                        ),
                    ));
                }
                match (map.get("tasks"), map.get("streams")) {
                    (Some(tasks), None) => {
                        let stream = match map.get("stream") {
                            None => None,
                            Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
                            Some(other) => {
                                return Err(invalid(
                                    origin,
                                    format_args!("stream must be a stream name, not {other}"),
                                ));
                            }
                        };
                        Ok(Self::Tasks {
                            stream,
                            tasks: task_list(tasks, origin)?,
                        })
                    }
                    (None, Some(streams)) if !map.contains_key("stream") => {
                        Ok(Self::Streams(stream_list(streams, origin)?))
                    }
                    _ => Err(invalid(
                        origin,
                        "give either tasks (with an optional stream) or streams, not both",
                    )),
                }
            }
            _ => Err(invalid(origin, NOT_A_LIST)),
        }
    }

    /// Selects the rows to evaluate from each candidate Stream's rows (`(name, rows in API order)`, in config
    /// order). `origin` names the manifest in errors.
    pub fn select(&self, streams: &[(String, Vec<PromptRow>)], origin: &str) -> Result<Vec<PromptRow>> {
        match self {
            Self::Tasks { stream, tasks } => {
                let rows = match stream {
                    Some(name) => streams
                        .iter()
                        .find(|(n, _)| n == name)
                        .map(|(_, rows)| rows)
                        .ok_or_else(|| {
                            invalid(
                                origin,
                                format_args!("stream {name:?} is not a healthy stream of the config"),
                            )
                        })?,
                    None => match streams {
                        [(_, rows)] => rows,
                        _ => {
                            let names: Vec<&str> = streams.iter().map(|(n, _)| n.as_str()).collect();
                            return Err(invalid(
                                origin,
                                format_args!(
                                    "{ONE_STREAM} (the config has {}; name one with \"stream\")",
                                    names.join(", ")
                                ),
                            ));
                        }
                    },
                };
                select_evaluation_rows(rows, tasks).map_err(|e| invalid(origin, e))
            }
            Self::Streams(names) => {
                let mut out = Vec::new();
                for name in names {
                    let (_, rows) = streams.iter().find(|(n, _)| n == name).ok_or_else(|| {
                        invalid(
                            origin,
                            format_args!("stream {name:?} is not a healthy stream of the config"),
                        )
                    })?;
                    out.extend(rows.iter().cloned());
                }
                Ok(out)
            }
        }
    }
}

/// A nonempty list of nonempty strings, else the reference's [`NOT_A_LIST`].
fn task_list(value: &Value, origin: &str) -> Result<Vec<String>> {
    let items = value
        .as_array()
        .filter(|a| !a.is_empty())
        .ok_or_else(|| invalid(origin, NOT_A_LIST))?;
    items
        .iter()
        .map(|v| match v.as_str() {
            Some(s) if !s.is_empty() => Ok(s.to_string()),
            _ => Err(invalid(origin, format_args!("{NOT_A_LIST} (found {v})"))),
        })
        .collect()
}

fn stream_list(value: &Value, origin: &str) -> Result<Vec<String>> {
    let names: Option<Vec<String>> = value.as_array().filter(|a| !a.is_empty()).and_then(|a| {
        a.iter()
            .map(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_string))
            .collect()
    });
    let names = names.ok_or_else(|| invalid(origin, "streams must be a nonempty list of stream names"))?;
    let distinct: BTreeSet<&String> = names.iter().collect();
    if distinct.len() != names.len() {
        return Err(invalid(origin, "streams names a stream twice"));
    }
    Ok(names)
}

/// A selection's problem: the reference's message and the values that caused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectionError {
    /// The reference's message, verbatim.
    pub message: &'static str,
    /// The offending ids.
    pub ids: Vec<String>,
}

impl std::fmt::Display for SelectionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message)?;
        if !self.ids.is_empty() {
            write!(f, " ({})", self.ids.join(", "))?;
        }
        Ok(())
    }
}

fn fail<T>(message: &'static str, ids: impl IntoIterator<Item = String>) -> Result<T, SelectionError> {
    Err(SelectionError {
        message,
        ids: ids.into_iter().collect(),
    })
}

/// Ids that occur more than once, each once, in order of first repetition.
fn repeated<'a>(ids: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut seen = BTreeSet::new();
    let mut twice = Vec::new();
    for id in ids {
        if !seen.insert(id) && !twice.iter().any(|t| t == id) {
            twice.push(id.to_string());
        }
    }
    twice
}

/// The reference's `select_task_indices`: the positions in `data_ids` of `selected`, in `selected`'s order.
pub fn select_task_indices(data_ids: &[String], selected: &[String]) -> Result<Vec<usize>, SelectionError> {
    if selected.is_empty() || selected.iter().any(String::is_empty) {
        return fail(NOT_A_LIST, []);
    }
    let twice = repeated(selected.iter().map(String::as_str));
    if !twice.is_empty() {
        return fail(DUPLICATE_IDS, twice);
    }
    let twice = repeated(data_ids.iter().map(String::as_str));
    if !twice.is_empty() {
        return fail(STREAM_NOT_UNIQUE, twice);
    }
    let positions: BTreeMap<&str, usize> = data_ids
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let absent: Vec<String> = selected
        .iter()
        .filter(|id| !positions.contains_key(id.as_str()))
        .cloned()
        .collect();
    if !absent.is_empty() {
        return fail(ABSENT_IDS, absent);
    }
    Ok(selected.iter().map(|id| positions[id.as_str()]).collect())
}

/// The reference's `select_evaluation_rows`: the Stream's rows matched by environment key, in `selected`'s
/// order, each with `data_id` replaced by the selected reference.
pub fn select_evaluation_rows(
    rows: &[PromptRow],
    selected: &[String],
) -> Result<Vec<PromptRow>, SelectionError> {
    select_task_indices(selected, selected)?;
    let key = |id: &str| env_key(id).map(str::to_string).ok_or_else(|| id.to_string());
    let mut source: BTreeMap<String, &PromptRow> = BTreeMap::new();
    let mut twice = Vec::new();
    for row in rows {
        let k = match key(&row.row.data_id) {
            Ok(k) => k,
            Err(id) => return fail(NOT_ENV_REF, [format!("stream row {id}")]),
        };
        if source.insert(k.clone(), row).is_some() {
            twice.push(k);
        }
    }
    if !twice.is_empty() {
        return fail(SOURCE_KEYS_NOT_UNIQUE, twice);
    }
    let bad: Vec<String> = selected
        .iter()
        .filter(|id| env_key(id).is_none())
        .cloned()
        .collect();
    if !bad.is_empty() {
        return fail(NOT_ENV_REF, bad);
    }
    let keys: Vec<&str> = selected.iter().filter_map(|id| env_key(id)).collect();
    let twice = repeated(keys.iter().copied());
    if !twice.is_empty() {
        return fail(SELECTION_KEYS_NOT_UNIQUE, twice);
    }
    let absent: Vec<String> = selected
        .iter()
        .filter(|id| env_key(id).is_some_and(|k| !source.contains_key(k)))
        .cloned()
        .collect();
    if !absent.is_empty() {
        return fail(ABSENT_ENVS, absent);
    }
    Ok(selected
        .iter()
        .zip(keys)
        .map(|(id, k)| {
            let mut row = source[k].clone();
            row.row.data_id.clone_from(id);
            row
        })
        .collect())
}

#[cfg(test)]
mod tests;
