//! Projection of a run config's Streams into the `{streams: [...]}` document preflight reads (spec 2.6).
//!
//! Unlike the reference, `extends:` is resolved first, and `arena_streams_file` (or `arena_streams_yaml_b64`)
//! is projected as well as inline `arena_streams`. Neither the environment nor overrides are applied to a
//! streams list, and any `${` inside it is rejected: preflight and training could resolve it differently. A
//! single-stream config (`econfig.stream_id`, which `ARENA_STREAM_ID` sets) is loaded as training loads it,
//! environment included, and projected as its one Stream.

use std::path::Path;

use base64::Engine as _;
use serde_json::Value;

use crate::env::Env;
use crate::error::{Collector, Error, Problems, Result};
use crate::path::KeyPath;
use crate::schema::EConfig;
use crate::stream::{StreamConfig, collect_streams, parse_document, source_text};
use crate::yaml::Node;

/// A projected Streams document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Projection {
    /// The YAML document `streams: [...]`, key order preserved, without a trailing newline.
    pub yaml: String,
    /// Standard base64 of `yaml` (what `arena_streams_yaml_b64` and preflight's `--streams-env-b64` take).
    pub base64: String,
}

/// Projects the Streams of the run config at `path`: `extends:` resolved, then the one configured source
/// (`econfig.arena_streams`, `econfig.arena_streams_file` with `~` expanded through `env`, or
/// `econfig.arena_streams_yaml_b64`) validated by the rules of spec 2.3 and written as `streams: [...]`.
pub fn project_streams(path: &Path, env: &Env) -> Result<Projection> {
    let (_, layers) = crate::load::merged_files(path)?;
    let econfig = KeyPath::keys(["econfig"]);
    let last = |field: &str| {
        layers
            .iter()
            .rev()
            .find_map(|l| l.node_at(&econfig.key(field)).map(|n| (l.name.clone(), n)))
    };
    let inline = last("arena_streams").filter(|(_, n)| !matches!(n, Node::Null));
    let file = last("arena_streams_file").filter(|(_, n)| !is_empty_text(n));
    let b64 = last("arena_streams_yaml_b64").filter(|(_, n)| !is_empty_text(n));
    let set: Vec<&str> = [
        ("arena_streams", inline.is_some()),
        ("arena_streams_file", file.is_some()),
        ("arena_streams_yaml_b64", b64.is_some()),
    ]
    .into_iter()
    .filter_map(|(n, on)| on.then_some(n))
    .collect();
    if set.len() > 1 {
        return Err(Error::Invalid(format!(
            "{}: arena_streams, arena_streams_yaml_b64 and arena_streams_file are mutually exclusive, but {} are set",
            path.display(),
            set.join(" and ")
        )));
    }

    let mut econfig_value = EConfig::default();
    let (items, list_path) = if let Some((_, node)) = inline {
        let Node::Seq(items) = node else {
            return Err(Error::Invalid(format!(
                "{}: econfig.arena_streams must be a list, got {}",
                path.display(),
                node.kind()
            )));
        };
        (items, econfig.key("arena_streams"))
    } else if let Some((name, node)) = file.or(b64.clone()) {
        let Node::Str(text) = &node else {
            return Err(Error::Invalid(format!(
                "{name}: econfig.{} must be a string, got {}",
                set[0],
                node.kind()
            )));
        };
        if text.contains("${") {
            return Err(Error::Invalid(format!(
                "{name}: econfig.{} contains `${{`, which projection does not resolve: {text:?}",
                set[0]
            )));
        }
        if set[0] == "arena_streams_file" {
            econfig_value.arena_streams_file = text.clone();
        } else {
            econfig_value.arena_streams_yaml_b64 = text.clone();
        }
        let items = source_text(&econfig_value, env)
            .and_then(|(name, text)| parse_document(&text, &name))
            .map_err(|p| Error::Problems(Problems(vec![p])))?
            .items;
        (items, KeyPath::keys(["streams"]))
    } else {
        return project_single_stream(path, env);
    };
    if items.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: nothing to project: the streams list is empty",
            path.display()
        )));
    }

    let mut c = Collector::default();
    for (i, item) in items.iter().enumerate() {
        reject_interpolation(&item.value, &list_path.index(i), &mut c);
    }
    c.finish(())?;

    let entries: Vec<Value> = items.iter().map(|i| i.value.to_json()).collect();
    let check = EConfig {
        arena_streams: entries.clone(),
        ..EConfig::default()
    };
    let (_, problems) = collect_streams(&check, env);
    if !problems.is_empty() {
        return Err(Error::Problems(Problems(problems)));
    }
    render(Value::Object(
        [("streams".to_string(), Value::Array(entries))]
            .into_iter()
            .collect(),
    ))
}

/// A single-stream config (no streams list; `econfig.stream_id`, which `ARENA_STREAM_ID` sets, with
/// `econfig.arena_harness`): loaded with the environment, since the environment is how a single-stream run
/// names its Stream, and projected as the one Stream `default` that training will run.
fn project_single_stream(path: &Path, env: &Env) -> Result<Projection> {
    let config = crate::load::load_run_config(path, &[], env)?;
    let e = &config.econfig;
    if e.stream_id.trim().is_empty() {
        return Err(Error::Invalid(format!(
            "{}: nothing to project: set a non-empty econfig.arena_streams list or econfig.arena_streams_file, \
             or econfig.stream_id (ARENA_STREAM_ID) for a single stream",
            path.display()
        )));
    }
    let mut entry = serde_json::Map::new();
    entry.insert("name".into(), Value::from("default"));
    entry.insert("stream_id".into(), Value::from(e.stream_id.trim()));
    if !e.arena_harness.trim().is_empty() {
        entry.insert("harness".into(), Value::from(e.arena_harness.trim()));
    }
    if !e.arena_llm_protocol.trim().is_empty() {
        entry.insert("llm_protocol".into(), Value::from(e.arena_llm_protocol.trim()));
    }
    if !e.arena_task_envs.is_empty() {
        let envs = e
            .arena_task_envs
            .iter()
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        entry.insert("task_envs".into(), Value::Object(envs));
    }
    if let Some(t) = e.arena_reward_threshold {
        entry.insert("reward_threshold".into(), Value::from(t));
    }
    if !e.arena_reward_transform_fn.trim().is_empty() {
        entry.insert(
            "reward_transform_fn".into(),
            Value::from(e.arena_reward_transform_fn.trim()),
        );
    }
    let entries = vec![Value::Object(entry)];
    let check = EConfig {
        arena_streams: entries.clone(),
        ..EConfig::default()
    };
    let (_, problems) = collect_streams(&check, env);
    if !problems.is_empty() {
        return Err(Error::Problems(Problems(problems)));
    }
    render(Value::Object(
        [("streams".to_string(), Value::Array(entries))]
            .into_iter()
            .collect(),
    ))
}

/// Renders streams as the YAML document `streams: [...]` for people to read: every `task_envs` value and
/// any other credential is redacted ([`crate::redact`]).
pub fn render_streams_yaml(streams: &[StreamConfig]) -> Result<String> {
    let value = serde_json::to_value(streams).map_err(|e| Error::Invalid(e.to_string()))?;
    let value = crate::redact(&value, &crate::Secrets::none());
    Ok(render(Value::Object(
        [("streams".to_string(), value)].into_iter().collect(),
    ))?
    .yaml)
}

fn render(doc: Value) -> Result<Projection> {
    let mut yaml = serde_saphyr::to_string(&doc)
        .map_err(|e| Error::Invalid(format!("cannot write the streams as YAML: {e}")))?;
    while yaml.ends_with('\n') {
        yaml.pop();
    }
    let base64 = base64::engine::general_purpose::STANDARD.encode(yaml.as_bytes());
    Ok(Projection { yaml, base64 })
}

fn is_empty_text(node: &Node) -> bool {
    match node {
        Node::Null => true,
        Node::Str(s) => s.trim().is_empty(),
        _ => false,
    }
}

fn reject_interpolation(node: &Node, at: &KeyPath, c: &mut Collector) {
    let message = "contains `${`, which projection does not resolve (preflight and training could resolve it differently)";
    match node {
        Node::Str(s) if s.contains("${") => c.push(at, message),
        Node::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                reject_interpolation(&item.value, &at.index(i), c);
            }
        }
        Node::Map(entries) => {
            for (k, v) in entries {
                if k.value.contains("${") {
                    c.push(at.key(&k.value), format!("the key {message}"));
                }
                reject_interpolation(&v.value, &at.key(&k.value), c);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
