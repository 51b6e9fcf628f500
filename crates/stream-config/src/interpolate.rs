//! `${env:NAME}`, `${env:NAME,default}` and `${path.to.key}` inside string values, resolved after merging.
//!
//! A string that is exactly one `${path}` takes the referenced value with its type (a number, a list, a
//! mapping); inside longer text a reference must be a scalar. `\${` is a literal `${`. Unknown variables,
//! unknown keys and reference cycles are errors naming the key path that holds the `${`.

use std::collections::BTreeSet;

use figment::value::{Dict, Tag, Value};

use crate::env::Env;
use crate::path::{KeyPath, Seg};

/// One problem found while interpolating: the key path holding the `${`, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct InterpError {
    pub(crate) path: KeyPath,
    pub(crate) message: String,
}

impl PartialOrd for KeyPath {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for KeyPath {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.to_string().cmp(&other.to_string())
    }
}

/// Resolves every interpolation in `root`; returns the resolved tree or every problem found.
pub(crate) fn interpolate(root: &Dict, env: &Env) -> Result<Dict, Vec<InterpError>> {
    let root_value = Value::Dict(Tag::Default, root.clone());
    let mut interp = Interp {
        root: &root_value,
        env,
        stack: Vec::new(),
        errors: BTreeSet::new(),
    };
    let resolved = interp.resolve_value(&KeyPath::root(), &root_value);
    if interp.errors.is_empty() {
        match resolved {
            Value::Dict(_, d) => Ok(d),
            _ => Ok(Dict::new()),
        }
    } else {
        Err(interp.errors.into_iter().collect())
    }
}

enum Part {
    Literal(String),
    Env { name: String, default: Option<String> },
    Ref(KeyPath),
}

struct Interp<'a> {
    root: &'a Value,
    env: &'a Env,
    stack: Vec<KeyPath>,
    errors: BTreeSet<InterpError>,
}

/// The value at `path` in the mapping `root`.
pub(crate) fn lookup_in<'v>(root: &'v Dict, path: &KeyPath) -> Option<&'v Value> {
    let (Seg::Key(first), rest) = path.segments().split_first()? else {
        return None;
    };
    walk(root.get(first)?, rest)
}

/// The value at `path` below `root`.
pub(crate) fn lookup<'v>(root: &'v Value, path: &KeyPath) -> Option<&'v Value> {
    walk(root, path.segments())
}

fn walk<'v>(root: &'v Value, segments: &[Seg]) -> Option<&'v Value> {
    let mut at = root;
    for seg in segments {
        at = match (seg, at) {
            (Seg::Key(k), Value::Dict(_, d)) => d.get(k)?,
            (Seg::Index(i), Value::Array(_, a)) => a.get(*i)?,
            (Seg::Index(i), Value::Dict(_, d)) => d.get(&i.to_string())?,
            _ => return None,
        };
    }
    Some(at)
}

impl Interp<'_> {
    fn fail(&mut self, path: &KeyPath, message: String) -> Value {
        self.errors.insert(InterpError {
            path: path.clone(),
            message,
        });
        Value::from(String::new())
    }

    fn resolve_value(&mut self, path: &KeyPath, value: &Value) -> Value {
        match value {
            Value::String(tag, s) if s.contains("${") => self.resolve_string(path, *tag, s),
            Value::Dict(tag, d) => Value::Dict(
                *tag,
                d.iter()
                    .map(|(k, v)| (k.clone(), self.resolve_value(&path.key(k), v)))
                    .collect(),
            ),
            Value::Array(tag, a) => Value::Array(
                *tag,
                a.iter()
                    .enumerate()
                    .map(|(i, v)| self.resolve_value(&path.index(i), v))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    fn resolve_string(&mut self, path: &KeyPath, tag: Tag, s: &str) -> Value {
        if let Some(start) = self.stack.iter().position(|p| p == path) {
            let cycle: Vec<String> = self.stack[start..]
                .iter()
                .chain(std::iter::once(path))
                .map(ToString::to_string)
                .collect();
            return self.fail(path, format!("reference cycle: {}", cycle.join(" -> ")));
        }
        let parts = match parse_template(s) {
            Ok(parts) => parts,
            Err(message) => return self.fail(path, message),
        };
        self.stack.push(path.clone());
        let result = match parts.as_slice() {
            [Part::Ref(target)] => self
                .resolve_ref(path, target)
                .unwrap_or_else(|| Value::from(String::new())),
            _ => {
                let mut out = String::new();
                for part in &parts {
                    match part {
                        Part::Literal(text) => out.push_str(text),
                        Part::Env { name, default } => match (self.env.get(name), default) {
                            (Some(v), _) => out.push_str(v),
                            (None, Some(d)) => out.push_str(d),
                            (None, None) => {
                                self.fail(
                                        path,
                                        format!(
                                            "environment variable {name} is not set (referenced by ${{env:{name}}}; give a default with ${{env:{name},default}})"
                                        ),
                                    );
                            }
                        },
                        Part::Ref(target) => {
                            if let Some(v) = self.resolve_ref(path, target) {
                                match scalar_text(&v) {
                                    Some(text) => out.push_str(&text),
                                    None => {
                                        self.fail(
                                            path,
                                            format!(
                                                "${{{}}} is not a scalar and cannot be part of a longer string",
                                                dotted(target)
                                            ),
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
                Value::String(tag, out)
            }
        };
        self.stack.pop();
        result
    }

    fn resolve_ref(&mut self, from: &KeyPath, target: &KeyPath) -> Option<Value> {
        match lookup(self.root, target) {
            Some(v) => {
                let v = v.clone();
                Some(self.resolve_value(target, &v))
            }
            None => {
                self.fail(
                    from,
                    format!("${{{}}} refers to the unknown key {target}", dotted(target)),
                );
                None
            }
        }
    }
}

fn dotted(path: &KeyPath) -> String {
    path.segments()
        .iter()
        .map(|s| match s {
            Seg::Key(k) => k.clone(),
            Seg::Index(i) => i.to_string(),
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn scalar_text(v: &Value) -> Option<String> {
    match v {
        Value::String(_, s) => Some(s.clone()),
        Value::Char(_, c) => Some(c.to_string()),
        Value::Bool(_, b) => Some(b.to_string()),
        Value::Num(..) => v.deserialize::<serde_json::Value>().ok().map(|n| n.to_string()),
        Value::Empty(..) | Value::Dict(..) | Value::Array(..) => None,
    }
}

fn parse_template(s: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        if rest[..i].ends_with('\\') {
            literal.push_str(&rest[..i - 1]);
            literal.push_str("${");
            rest = &rest[i + 2..];
            continue;
        }
        literal.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let Some(end) = after.find('}') else {
            return Err(
                "unterminated `${` (close it with `}`, or write `\\${` for a literal `${`)".to_string(),
            );
        };
        let inner = after[..end].trim();
        if !literal.is_empty() {
            parts.push(Part::Literal(std::mem::take(&mut literal)));
        }
        parts.push(parse_reference(inner)?);
        rest = &after[end + 1..];
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        parts.push(Part::Literal(literal));
    }
    Ok(parts)
}

fn parse_reference(inner: &str) -> Result<Part, String> {
    if let Some(spec) = inner.strip_prefix("env:") {
        let (name, default) = match spec.split_once(',') {
            Some((name, default)) => (name.trim(), Some(default.trim().to_string())),
            None => (spec.trim(), None),
        };
        if name.is_empty() {
            return Err(format!("${{{inner}}} names no environment variable"));
        }
        return Ok(Part::Env {
            name: name.to_string(),
            default,
        });
    }
    KeyPath::parse_dotted(inner)
        .map(Part::Ref)
        .ok_or_else(|| format!("${{{inner}}} is not a key path such as econfig.timeout or env:NAME"))
}

#[cfg(test)]
mod tests;
