//! YAML text to a value tree that remembers where every key and item came from.
//!
//! serde-saphyr parses; this module keeps the tree generic (so `extends:`, merging and interpolation can work on
//! it before the typed schema sees it) and records the line and column of each key path, so that later errors
//! can name the file and line of the value they are about.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use crate::path::KeyPath;

/// A YAML value with the source location of each child.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<Node>>),
    /// Keys in document order, each with the location of the key itself.
    Map(Vec<(Spanned<String>, Spanned<Node>)>),
}

/// Where a key path sits in one YAML text: 1-based line and column of its key (or of the item, in a list).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LineCol {
    pub(crate) line: u64,
    pub(crate) column: u64,
}

/// Locations of every key path of one parsed YAML text.
#[derive(Debug, Clone, Default)]
pub(crate) struct LineMap {
    lines: HashMap<String, LineCol>,
}

impl LineMap {
    /// The location of `path`, or of its closest ancestor that has one.
    pub(crate) fn locate(&self, path: &KeyPath) -> Option<LineCol> {
        let mut path = path.clone();
        loop {
            if let Some(at) = self.lines.get(&path.to_string()) {
                return Some(*at);
            }
            path.pop()?;
        }
    }

    /// The location of exactly `path`.
    pub(crate) fn get(&self, path: &KeyPath) -> Option<LineCol> {
        self.lines.get(&path.to_string()).copied()
    }

    fn record(&mut self, path: &KeyPath, loc: &serde_saphyr::Location) {
        if loc.line() > 0 {
            self.lines.insert(
                path.to_string(),
                LineCol {
                    line: loc.line(),
                    column: loc.column(),
                },
            );
        }
    }
}

/// A YAML syntax error: message and, when known, where.
#[derive(Debug, Clone)]
pub(crate) struct SyntaxError {
    pub(crate) message: String,
    pub(crate) at: Option<LineCol>,
}

/// Parses one YAML document into a [`Node`] and the locations of its key paths.
///
/// An empty document is `Node::Null`.
pub(crate) fn parse(text: &str) -> Result<(Node, LineMap), SyntaxError> {
    if text.trim().is_empty() {
        return Ok((Node::Null, LineMap::default()));
    }
    let mut options = serde_saphyr::Options::default();
    options.with_snippet = false;
    // `.inf` and `.nan` reach validation, which names the field and the rule, instead of failing the parse.
    options.non_finite_float_policy = serde_saphyr::NonFiniteFloatPolicy::PassThrough;
    let root: Spanned<Node> = serde_saphyr::from_str_with_options(text, options).map_err(|e| {
        let at = e.location().filter(|l| l.line() > 0).map(|l| LineCol {
            line: l.line(),
            column: l.column(),
        });
        SyntaxError {
            message: first_line(&e.without_snippet().to_string()),
            at,
        }
    })?;
    let mut lines = LineMap::default();
    collect_lines(&root.value, &mut KeyPath::root(), &mut lines);
    Ok((root.value, lines))
}

/// Parses a YAML flow value used on a command line or in an environment variable (`[a, b]`, `{k: v}`, `"x"`).
pub(crate) fn parse_flow(text: &str) -> Result<Node, SyntaxError> {
    parse(text).map(|(node, _)| node)
}

/// The key path around `line` (1-based), read from indentation alone: a best effort for syntax errors, which
/// stop before a tree exists. List items add no index.
pub(crate) fn key_path_near(text: &str, line: u64) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let last = usize::try_from(line).ok()?.min(lines.len()).checked_sub(1)?;
    let mut keys = Vec::new();
    let mut limit = usize::MAX;
    for l in lines[..=last].iter().rev() {
        let trimmed = l.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let item = trimmed.strip_prefix("- ").map_or(trimmed, str::trim_start);
        let indent = l.len() - item.len();
        if indent >= limit {
            continue;
        }
        let Some((key, _)) = item.split_once(':') else {
            continue;
        };
        let key = key.trim().trim_matches(['"', '\'']);
        if key.is_empty() || key.contains([' ', '{', '[', ',']) {
            continue;
        }
        keys.push(key.to_string());
        limit = indent;
        if indent == 0 {
            break;
        }
    }
    keys.reverse();
    (!keys.is_empty()).then(|| keys.join("."))
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().trim().to_string()
}

fn collect_lines(node: &Node, path: &mut KeyPath, lines: &mut LineMap) {
    match node {
        Node::Map(entries) => {
            for (key, value) in entries {
                path.push_key(&key.value);
                lines.record(path, &key.referenced);
                collect_lines(&value.value, path, lines);
                path.pop();
            }
        }
        Node::Seq(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push_index(i);
                lines.record(path, &item.referenced);
                collect_lines(&item.value, path, lines);
                path.pop();
            }
        }
        _ => {}
    }
}

impl Node {
    /// A short name of the value's type for error messages.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Int(_) | Node::UInt(_) | Node::Float(_) => "a number",
            Node::Str(_) => "a string",
            Node::Seq(_) => "a list",
            Node::Map(_) => "a mapping",
        }
    }

    /// Converts to JSON, keeping key order. Non-finite floats, which JSON cannot hold, become the strings
    /// `.inf`, `-.inf` and `.nan`, so that validation can name them instead of seeing a silent null.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        use serde_json::Value;
        match self {
            Node::Null => Value::Null,
            Node::Bool(b) => Value::Bool(*b),
            Node::Int(i) => Value::from(*i),
            Node::UInt(u) => Value::from(*u),
            Node::Float(f) => serde_json::Number::from_f64(*f)
                .map(Value::Number)
                .unwrap_or_else(|| Value::String(non_finite_label(*f).to_string())),
            Node::Str(s) => Value::String(s.clone()),
            Node::Seq(items) => Value::Array(items.iter().map(|i| i.value.to_json()).collect()),
            Node::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| (k.value.clone(), v.value.to_json()))
                    .collect(),
            ),
        }
    }
}

/// The YAML spelling of a non-finite float.
pub(crate) fn non_finite_label(f: f64) -> &'static str {
    if f.is_nan() {
        ".nan"
    } else if f > 0.0 {
        ".inf"
    } else {
        "-.inf"
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        Ok(i64::try_from(v).map_or(Node::UInt(v), Node::Int))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_string()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        Ok(Node::Str(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Spanned<Node>>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<Spanned<KeyString>>()? {
            let value = map.next_value::<Spanned<Node>>()?;
            let key = Spanned::new(key.value.0, key.referenced, key.defined);
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}

/// A mapping key: YAML allows numbers and booleans as keys, config keys are their text.
struct KeyString(String);

impl<'de> Deserialize<'de> for KeyString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = KeyString;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a scalar mapping key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<KeyString, E> {
                Ok(KeyString(v.to_string()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<KeyString, E> {
                Ok(KeyString("null".to_string()))
            }
        }
        deserializer.deserialize_any(KeyVisitor)
    }
}

#[cfg(test)]
mod tests;
