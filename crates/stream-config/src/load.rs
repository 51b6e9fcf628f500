//! Loading a run config: YAML files with `extends:`, then the environment, then dotted overrides, merged with
//! figment, then interpolation, then the typed schema, then validation.
//!
//! Every error names where the offending value was written: `file:line:column` for YAML, the variable for
//! the environment, the override text for the command line.

use std::path::{Path, PathBuf};

use figment::value::{Dict, Empty, Num, Tag, Value};
use figment::{Figment, Metadata, Profile, Provider};

use crate::env::Env;
use crate::error::{Error, Problem, Problems, Result};
use crate::interpolate::{self, interpolate};
use crate::path::KeyPath;
use crate::redact::is_sensitive_key;
use crate::schema::{RunConfig, struct_fields};
use crate::yaml::{self, LineMap, Node};

/// Environment variables of the reference that set config fields, lowest precedence first.
///
/// `ARENA_RL_<SECTION>__<FIELD>` variables are applied after these and win over them.
pub const REFERENCE_ENV_VARS: &[(&str, &str)] = &[
    ("ARENA_OPENAPI_BASE", "econfig.arena_base_url"),
    ("ARENA_STREAM_ID", "econfig.stream_id"),
    ("ARENA_LLM_ROUTE_MODE", "econfig.arena_llm_route_mode"),
    ("ARENA_TASK_WAIT_TIMEOUT", "econfig.timeout"),
    ("MODEL_PATH", "model.path"),
];

/// The prefix of config environment variables: `ARENA_RL_ECONFIG__ARENA_MIXTURE_EPOCH_SIZE=12`.
pub const ENV_PREFIX: &str = "ARENA_RL_";

/// Loads, merges, interpolates, types and validates the run config at `path`.
///
/// Layers, later winning: `path` with the files it `extends:` (bases first, depth-first, relative paths
/// resolved against the extending file), then the environment ([`REFERENCE_ENV_VARS`], then
/// `ARENA_RL_<SECTION>__<FIELD>`), then `overrides` (`econfig.arena_mixture_epoch_size=12`; list and mapping
/// values in YAML flow syntax). Mappings merge key by key; lists and scalars are replaced. Interpolation runs
/// on the merged tree. Syntax and type errors stop at the first; validation reports every problem.
pub fn load_run_config(path: &Path, overrides: &[String], env: &Env) -> Result<RunConfig> {
    let layers = file_layers(path)?;
    finish(layers, overrides, env)
}

/// As [`load_run_config`], for YAML text that is not in a file (e.g. an embedded example); `name` is used in
/// messages, and the text may not use `extends:`.
pub fn load_run_config_str(name: &str, text: &str, overrides: &[String], env: &Env) -> Result<RunConfig> {
    let layer = parse_file_layer(name, text)?;
    if layer.extends.is_some() {
        return Err(Error::Invalid(format!(
            "{name}: `extends:` is not supported in a config that is not read from a file"
        )));
    }
    finish(vec![layer.layer], overrides, env)
}

/// Whether the user chose `key` (dotted, `actor.lr`): the config at `path` or a file it `extends:`, the
/// environment or `overrides` sets it, as opposed to the schema's default. Launchers use it to apply a default
/// of their own only where the user set nothing.
pub fn user_sets(path: &Path, overrides: &[String], env: &Env, key: &str) -> Result<bool> {
    let mut layers = file_layers(path)?;
    layers.push(env_layer(env)?);
    layers.push(override_layer(overrides)?);
    let figment = layers
        .iter()
        .fold(Figment::new(), |f, l| f.merge(LayerProvider(l)));
    let dict = default_dict(&figment)?;
    let mut parts = key.split('.');
    let Some(first) = parts.next() else {
        return Ok(false);
    };
    let mut at = match dict.get(first) {
        Some(v) => v,
        None => return Ok(false),
    };
    for part in parts {
        match at {
            Value::Dict(_, inner) => match inner.get(part) {
                Some(v) => at = v,
                None => return Ok(false),
            },
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// The files' merged tree, with `extends:` resolved and nothing else applied (for projection).
pub(crate) fn merged_files(path: &Path) -> Result<(Dict, Vec<Layer>)> {
    let layers = file_layers(path)?;
    let figment = layers
        .iter()
        .fold(Figment::new(), |f, l| f.merge(LayerProvider(l)));
    let dict = default_dict(&figment)?;
    Ok((dict, layers))
}

fn finish(files: Vec<Layer>, overrides: &[String], env: &Env) -> Result<RunConfig> {
    let mut layers = vec![defaults_layer()?];
    layers.extend(files);
    layers.push(env_layer(env)?);
    layers.push(override_layer(overrides)?);
    let figment = layers
        .iter()
        .fold(Figment::new(), |f, l| f.merge(LayerProvider(l)));
    let merged = default_dict(&figment)?;
    let resolved = interpolate(&merged, env).map_err(|errors| {
        Error::Problems(Problems(
            errors
                .into_iter()
                .map(|e| Problem {
                    origin: origin_of(&layers, &e.path),
                    path: e.path.to_string(),
                    message: e.message,
                })
                .collect(),
        ))
    })?;
    let config = extract(resolved, &layers)?;
    let mut problems = config.problems(env);
    for p in &mut problems {
        if p.origin.is_none() && !p.path.is_empty() {
            p.origin = origin_of(&layers, &KeyPath::parse_display(&p.path));
        }
    }
    if problems.is_empty() {
        Ok(config)
    } else {
        Err(Error::Problems(Problems(problems)))
    }
}

/// Types the resolved tree. Text where the schema wants a number or a boolean (environment variables,
/// overrides, quoted YAML such as the reference's `arena_reward_threshold: "0.98"`) is parsed exactly and
/// the extraction retried, so numbers never pass through a lossy float.
fn extract(mut dict: Dict, layers: &[Layer]) -> Result<RunConfig> {
    loop {
        match Figment::from(Resolved(dict.clone())).extract::<RunConfig>() {
            Ok(config) => return Ok(config),
            Err(e) => {
                if !coerce_text(&mut dict, &e) {
                    return Err(type_error(layers, e));
                }
            }
        }
    }
}

/// Replaces the text at the error's path by the number or boolean it spells, if the schema wanted one and
/// the text is one. Returns whether anything changed.
fn coerce_text(dict: &mut Dict, e: &figment::Error) -> bool {
    use figment::error::{Actual, Kind};
    let Kind::InvalidType(Actual::Str(text), expected) = &e.kind else {
        return false;
    };
    let Some((last, parents)) = e.path.split_last() else {
        return false;
    };
    let mut at = &mut *dict;
    for key in parents {
        match at.get_mut(key) {
            Some(Value::Dict(_, inner)) => at = inner,
            _ => return false,
        }
    }
    let Some(Value::String(tag, current)) = at.get(last) else {
        return false;
    };
    if current != text {
        return false;
    }
    let tag = *tag;
    let t = text.trim();
    let replacement = if expected.contains("bool") {
        match t.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(tag, true),
            "false" => Value::Bool(tag, false),
            _ => return false,
        }
    } else if ["u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64", "f32", "f64"]
        .iter()
        .any(|n| expected.contains(n))
    {
        if let Ok(u) = t.parse::<u64>() {
            Value::Num(tag, Num::U64(u))
        } else if let Ok(i) = t.parse::<i64>() {
            Value::Num(tag, Num::I64(i))
        } else if let Ok(f) = t.parse::<f64>() {
            Value::Num(tag, Num::F64(f))
        } else {
            return false;
        }
    } else {
        return false;
    };
    at.insert(last.clone(), replacement);
    true
}

fn default_dict(figment: &Figment) -> Result<Dict> {
    let mut data = figment.data().map_err(|e| Error::Invalid(e.to_string()))?;
    Ok(data.remove(&Profile::Default).unwrap_or_default())
}

/// One source of config values and how to say where each of its values was written.
pub(crate) struct Layer {
    pub(crate) name: String,
    pub(crate) dict: Dict,
    /// For a YAML file: its tree in document order (without `extends:`).
    node: Option<Node>,
    where_: Where,
}

enum Where {
    /// The schema's defaults: written nowhere.
    Defaults,
    /// A YAML file: line and column of each key path.
    File(LineMap),
    /// Environment variables or overrides: the key path each one set, and its label.
    Labels(Vec<(KeyPath, String)>),
}

impl Layer {
    /// The YAML node at `path`, for file layers.
    pub(crate) fn node_at(&self, path: &KeyPath) -> Option<Node> {
        let mut at = self.node.as_ref()?;
        for seg in path.segments() {
            at = match (seg, at) {
                (crate::path::Seg::Key(k), Node::Map(entries)) => {
                    &entries.iter().find(|(key, _)| &key.value == k)?.1.value
                }
                (crate::path::Seg::Index(i), Node::Seq(items)) => &items.get(*i)?.value,
                _ => return None,
            };
        }
        Some(at.clone())
    }

    fn has(&self, path: &KeyPath) -> bool {
        !matches!(self.where_, Where::Defaults) && interpolate::lookup_in(&self.dict, path).is_some()
    }

    fn origin(&self, path: &KeyPath) -> String {
        match &self.where_ {
            Where::File(lines) => match lines.locate(path) {
                Some(at) => format!("{}:{}:{}", self.name, at.line, at.column),
                None => self.name.clone(),
            },
            Where::Defaults => self.name.clone(),
            Where::Labels(labels) => labels
                .iter()
                .rev()
                .filter(|(p, _)| path.segments().starts_with(p.segments()))
                .max_by_key(|(p, _)| p.segments().len())
                .map_or_else(|| self.name.clone(), |(_, l)| l.clone()),
        }
    }
}

/// Where the value at `path` came from: the last layer that sets exactly it, else the last that sets its
/// closest ancestor.
fn origin_of(layers: &[Layer], path: &KeyPath) -> Option<String> {
    let mut probe = path.clone();
    loop {
        if let Some(layer) = layers.iter().rev().find(|l| l.has(&probe)) {
            return Some(layer.origin(path));
        }
        probe.pop()?;
        if probe.is_root() {
            return None;
        }
    }
}

struct LayerProvider<'a>(&'a Layer);

impl Provider for LayerProvider<'_> {
    fn metadata(&self) -> Metadata {
        Metadata::named(self.0.name.clone())
    }

    fn data(&self) -> std::result::Result<figment::value::Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.0.dict.clone()))
    }
}

/// The interpolated tree, as the one provider of the typed extraction.
struct Resolved(Dict);

impl Provider for Resolved {
    fn metadata(&self) -> Metadata {
        Metadata::named("resolved run config")
    }

    fn data(&self) -> std::result::Result<figment::value::Map<Profile, Dict>, figment::Error> {
        Ok(Profile::Default.collect(self.0.clone()))
    }
}

fn type_error(layers: &[Layer], e: figment::Error) -> Error {
    let mut path = KeyPath::root();
    for seg in &e.path {
        match seg.parse::<usize>() {
            Ok(i) if seg.bytes().all(|b| b.is_ascii_digit()) => path.push_index(i),
            _ => path.push_key(seg),
        }
    }
    let mut message = e.kind.to_string();
    if path.last_key().is_some_and(is_sensitive_key) {
        message = "invalid value (not shown: the field may hold a secret)".to_string();
    }
    if let figment::error::Kind::UnknownField(field, _) = &e.kind
        && path.last_key() != Some(field.as_str())
    {
        path.push_key(field);
    }
    Error::Type {
        origin: origin_of(layers, &path).unwrap_or_else(|| "run config".to_string()),
        path: if path.is_root() {
            "(root)".to_string()
        } else {
            path.to_string()
        },
        message,
    }
}

/// The schema's defaults as the lowest layer, so that `${path}` can refer to a value nobody wrote.
fn defaults_layer() -> Result<Layer> {
    let dict = match Value::serialize(RunConfig::default()) {
        Ok(Value::Dict(_, dict)) => dict,
        Ok(_) => Dict::new(),
        Err(e) => return Err(Error::Invalid(format!("cannot serialise the defaults: {e}"))),
    };
    Ok(Layer {
        name: "defaults".to_string(),
        dict,
        node: None,
        where_: Where::Defaults,
    })
}

struct FileLayer {
    layer: Layer,
    extends: Option<Vec<String>>,
}

fn parse_file_layer(name: &str, text: &str) -> Result<FileLayer> {
    let (root, lines) = yaml::parse(text).map_err(|e| {
        let near = e.at.and_then(|at| yaml::key_path_near(text, at.line));
        Error::Syntax {
            origin: match e.at {
                Some(at) => format!("{name}:{}:{}", at.line, at.column),
                None => name.to_string(),
            },
            message: match near {
                Some(path) => format!("{} (near key {path})", e.message),
                None => e.message,
            },
        }
    })?;
    let entries = match root {
        Node::Null => Vec::new(),
        Node::Map(entries) => entries,
        other => {
            return Err(Error::Syntax {
                origin: name.to_string(),
                message: format!("a run config must be a mapping, got {}", other.kind()),
            });
        }
    };
    let mut extends = None;
    let mut dict = Dict::new();
    let mut kept = Vec::new();
    for (key, value) in entries {
        if key.value == "extends" {
            let at = lines.get(&KeyPath::keys(["extends"]));
            let origin = at.map_or_else(
                || name.to_string(),
                |at| format!("{name}:{}:{}", at.line, at.column),
            );
            let bad = || Error::Type {
                origin: origin.clone(),
                path: "extends".to_string(),
                message: "must be a path or a list of paths".to_string(),
            };
            extends = Some(match value.value {
                Node::Str(s) => vec![s],
                Node::Seq(items) => items
                    .into_iter()
                    .map(|i| match i.value {
                        Node::Str(s) => Ok(s),
                        _ => Err(bad()),
                    })
                    .collect::<Result<_>>()?,
                _ => return Err(bad()),
            });
        } else {
            dict.insert(key.value.clone(), to_figment(&value.value));
            kept.push((key, value));
        }
    }
    Ok(FileLayer {
        layer: Layer {
            name: name.to_string(),
            dict,
            node: Some(Node::Map(kept)),
            where_: Where::File(lines),
        },
        extends,
    })
}

fn file_layers(path: &Path) -> Result<Vec<Layer>> {
    let mut layers = Vec::new();
    let mut stack = Vec::new();
    load_file(path, &mut stack, &mut layers)?;
    Ok(layers)
}

fn load_file(path: &Path, stack: &mut Vec<PathBuf>, out: &mut Vec<Layer>) -> Result<()> {
    let canonical = path.canonicalize().map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    if let Some(start) = stack.iter().position(|p| p == &canonical) {
        let cycle: Vec<String> = stack[start..]
            .iter()
            .chain(std::iter::once(&canonical))
            .map(|p| p.display().to_string())
            .collect();
        return Err(Error::Invalid(format!(
            "`extends:` cycle: {}",
            cycle.join(" -> ")
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let parsed = parse_file_layer(&path.display().to_string(), &text)?;
    stack.push(canonical);
    let dir = path.parent().unwrap_or(Path::new("."));
    for base in parsed.extends.iter().flatten() {
        load_file(&dir.join(base), stack, out)?;
    }
    stack.pop();
    out.push(parsed.layer);
    Ok(())
}

/// Converts a parsed YAML node into a figment value.
fn to_figment(node: &Node) -> Value {
    match node {
        Node::Null => Value::Empty(Tag::Default, Empty::None),
        Node::Bool(b) => Value::Bool(Tag::Default, *b),
        Node::Int(i) => Value::Num(Tag::Default, Num::I64(*i)),
        Node::UInt(u) => Value::Num(Tag::Default, Num::U64(*u)),
        Node::Float(f) => Value::Num(Tag::Default, Num::F64(*f)),
        Node::Str(s) => Value::String(Tag::Default, s.clone()),
        Node::Seq(items) => Value::Array(Tag::Default, items.iter().map(|i| to_figment(&i.value)).collect()),
        Node::Map(entries) => Value::Dict(
            Tag::Default,
            entries
                .iter()
                .map(|(k, v)| (k.value.clone(), to_figment(&v.value)))
                .collect(),
        ),
    }
}

/// A value from an environment variable or an override: `[..]`, `{..}` and quoted text are YAML flow
/// values; `null` and `~` are null; anything else is a string (numbers and booleans are converted by the
/// schema, so `trial_name=123` stays the string "123").
fn scalar_or_flow(text: &str, origin: &str) -> Result<Value> {
    let trimmed = text.trim();
    if trimmed.starts_with(['[', '{', '"', '\'']) {
        let node = yaml::parse_flow(trimmed).map_err(|e| Error::Syntax {
            origin: origin.to_string(),
            message: format!("not a YAML flow value: {}", e.message),
        })?;
        Ok(to_figment(&node))
    } else if trimmed == "null" || trimmed == "~" {
        Ok(Value::Empty(Tag::Default, Empty::None))
    } else {
        Ok(Value::String(Tag::Default, text.to_string()))
    }
}

fn insert(dict: &mut Dict, path: &[String], value: Value) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    if rest.is_empty() {
        dict.insert(first.clone(), value);
        return;
    }
    let entry = dict
        .entry(first.clone())
        .or_insert_with(|| Value::Dict(Tag::Default, Dict::new()));
    if !matches!(entry, Value::Dict(..)) {
        *entry = Value::Dict(Tag::Default, Dict::new());
    }
    if let Value::Dict(_, inner) = entry {
        insert(inner, rest, value);
    }
}

fn env_layer(env: &Env) -> Result<Layer> {
    let sections = struct_fields::<RunConfig>();
    let mut dict = Dict::new();
    let mut labels = Vec::new();
    let mut set = |name: &str, path: Vec<String>, raw: &str| -> Result<()> {
        let origin = format!("environment variable {name}");
        let value = scalar_or_flow(raw, &origin)?;
        labels.push((KeyPath::keys(path.iter().map(String::as_str)), origin));
        insert(&mut dict, &path, value);
        Ok(())
    };
    for (name, target) in REFERENCE_ENV_VARS {
        if let Some(raw) = env.get(name) {
            set(name, target.split('.').map(str::to_string).collect(), raw)?;
        }
    }
    for (name, raw) in env.iter() {
        let Some(rest) = name.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        let path: Vec<String> = rest.split("__").map(str::to_lowercase).collect();
        // Other tools' variables share the prefix (ARENA_RL_CACHE, ARENA_RL_SMOLLM2): only section names count.
        if !sections.contains(&path[0].as_str()) {
            continue;
        }
        if path.iter().any(String::is_empty) {
            return Err(Error::Invalid(format!(
                "environment variable {name}: expected {ENV_PREFIX}<SECTION>__<FIELD> with no empty part"
            )));
        }
        set(name, path, raw)?;
    }
    Ok(Layer {
        name: "environment".to_string(),
        dict,
        node: None,
        where_: Where::Labels(labels),
    })
}

fn override_layer(overrides: &[String]) -> Result<Layer> {
    let mut dict = Dict::new();
    let mut labels = Vec::new();
    for raw in overrides {
        let origin = format!("override `{raw}`");
        let Some((key, value)) = raw.split_once('=') else {
            return Err(Error::Invalid(format!(
                "override {raw:?} must look like section.field=value"
            )));
        };
        let path: Vec<String> = key.trim().split('.').map(str::to_string).collect();
        if path.iter().any(|p| p.trim().is_empty()) {
            return Err(Error::Invalid(format!(
                "override {raw:?} has an empty key segment; expected section.field=value"
            )));
        }
        let value = scalar_or_flow(value, &origin)?;
        labels.push((KeyPath::keys(path.iter().map(String::as_str)), origin));
        insert(&mut dict, &path, value);
    }
    Ok(Layer {
        name: "command-line overrides".to_string(),
        dict,
        node: None,
        where_: Where::Labels(labels),
    })
}

#[cfg(test)]
mod tests;
