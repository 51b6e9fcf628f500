//! Arena Stream definitions: the schema (spec 2.1), the three sources and the legacy fallback (2.2), the
//! per-entry rules (2.3), run-level merging and uniqueness.
//!
//! Where the reference stops at the first broken rule, this module reports every problem of every entry at
//! once, each with the path of the offending value and the name of its stream.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use base64::Engine as _;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use crate::env::Env;
use crate::error::{Collector, Error, Problem, Problems, Result};
use crate::path::KeyPath;
use crate::schema::EConfig;
use crate::vocab::LlmProtocol;
use crate::yaml::{self, LineMap, Node};
use serde_saphyr::Spanned;

/// The nine fields a Stream definition may have, in the reference's order.
pub const STREAM_FIELDS: [&str; 9] = [
    "name",
    "stream_id",
    "sampling_weight",
    "harness",
    "llm_protocol",
    "task_envs",
    "expected_reward_ref",
    "reward_threshold",
    "reward_transform_fn",
];

/// A `key@version` reference to a versioned Arena object: a grader (see [`RewardRef`]) or a harness; both
/// parts empty means "none" (for a reward ref: "not pinned").
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ArenaRef {
    /// The object's key.
    pub key: String,
    /// The object's version.
    pub version: String,
}

/// A grader version pinned by `key` and `version`; both empty means "not pinned".
pub type RewardRef = ArenaRef;

impl ArenaRef {
    /// A reference from its parts.
    pub fn new(key: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            version: version.into(),
        }
    }

    /// Splits `key@version` at the first `@`; both parts must be non-empty.
    pub fn parse(text: &str) -> Option<Self> {
        let (key, version) = text.split_once('@')?;
        (!key.is_empty() && !version.is_empty()).then(|| Self::new(key, version))
    }

    /// Reads `{"key": .., "version": ..}` leniently: both non-empty strings, else `None`.
    pub fn from_json(value: Option<&Value>) -> Option<Self> {
        let v = value?;
        let key = v.get("key")?.as_str()?;
        let version = v.get("version")?.as_str()?;
        (!key.is_empty() && !version.is_empty()).then(|| Self::new(key, version))
    }

    /// Neither key nor version is set.
    pub fn is_empty(&self) -> bool {
        self.key.is_empty() && self.version.is_empty()
    }
}

impl fmt::Display for ArenaRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.key, self.version)
    }
}

/// The environment key of a task reference `env:<key>@<version>` (exactly one `@`, both parts nonempty), the
/// form of an evaluation manifest's ids: `None` for anything else.
pub fn env_key(data_id: &str) -> Option<&str> {
    let rest = data_id.strip_prefix("env:")?;
    let mut parts = rest.split('@');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(key), Some(version), None) if !key.is_empty() && !version.is_empty() => Some(key),
        _ => None,
    }
}

/// A pinned reward ref that the stream's live one no longer matches (reference sections 2.5 and 4.1:
/// checked at dataset load, by preflight, and before every launch of a pinned stream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RewardRefDrift {
    /// What the run pinned.
    pub pinned: RewardRef,
    /// What Arena reports as live, if anything.
    pub live: Option<RewardRef>,
}

impl fmt::Display for RewardRefDrift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.live {
            Some(live) if !live.is_empty() => write!(f, "pinned {}, live {live}", self.pinned),
            _ => write!(f, "pinned {}, live none", self.pinned),
        }
    }
}

/// The drift check: `None` when nothing is pinned or the live ref equals the pin.
pub fn reward_ref_drift(pinned: &RewardRef, live: Option<&RewardRef>) -> Option<RewardRefDrift> {
    if pinned.is_empty() || live == Some(pinned) {
        return None;
    }
    Some(RewardRefDrift {
        pinned: pinned.clone(),
        live: live.cloned(),
    })
}

/// One validated Arena Stream (the reference's `ArenaStreamConfig`).
///
/// It serialises with the reference's field names; an unset `llm_protocol` serialises as `""`.
#[derive(Clone, PartialEq, Serialize)]
pub struct StreamConfig {
    /// Mixture key, also used in metric names and audit records (`[A-Za-z0-9_.-]+`).
    pub name: String,
    /// Arena stream id.
    pub stream_id: String,
    /// Relative weight in the mixture (finite, > 0).
    pub sampling_weight: f64,
    /// Harness `key@version` passed to launch; empty means the stream's default Harness.
    pub harness: String,
    /// The Harness's protocol; `None` means inferred (see [`StreamConfig::resolved_protocol`]).
    #[serde(serialize_with = "protocol_or_empty")]
    pub llm_protocol: Option<LlmProtocol>,
    /// Extra Harness environment variables (run-level `arena_task_envs` already merged underneath).
    pub task_envs: BTreeMap<String, String>,
    /// Pinned grader version; empty means "whatever is live".
    pub expected_reward_ref: RewardRef,
    /// Binarisation threshold, or the argument of `reward_transform_fn`.
    pub reward_threshold: Option<f64>,
    /// Name of a reward transform; empty means none.
    pub reward_transform_fn: String,
}

/// `Debug` withholds `task_envs` values: Harness environments carry credentials.
impl fmt::Debug for StreamConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamConfig")
            .field("name", &self.name)
            .field("stream_id", &self.stream_id)
            .field("sampling_weight", &self.sampling_weight)
            .field("harness", &self.harness)
            .field("llm_protocol", &self.llm_protocol)
            .field("task_envs", &EnvNames(&self.task_envs))
            .field("expected_reward_ref", &self.expected_reward_ref)
            .field("reward_threshold", &self.reward_threshold)
            .field("reward_transform_fn", &self.reward_transform_fn)
            .finish()
    }
}

/// Shows environment variable names with their values withheld.
pub(crate) struct EnvNames<'a>(pub(crate) &'a BTreeMap<String, String>);

impl fmt::Debug for EnvNames<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.0.keys().map(|k| (k, crate::REDACTED)))
            .finish()
    }
}

fn protocol_or_empty<S: Serializer>(p: &Option<LlmProtocol>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.map_or("", LlmProtocol::as_str))
}

impl<'de> Deserialize<'de> for StreamConfig {
    /// Deserialises through [`parse_stream_config`], so every rule of spec 2.3 applies.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        parse_stream_config(&value).map_err(serde::de::Error::custom)
    }
}

impl StreamConfig {
    /// The protocol a Harness of this stream speaks (spec 2.5 step 3): the explicit `llm_protocol`, else
    /// inferred from `harness`, else inferred from the stream's default Harness key as Arena reports it.
    pub fn resolved_protocol(&self, default_harness_key: Option<&str>) -> LlmProtocol {
        if let Some(p) = self.llm_protocol {
            p
        } else if !self.harness.is_empty() {
            LlmProtocol::infer_from_harness(&self.harness)
        } else {
            LlmProtocol::infer_from_harness(default_harness_key.unwrap_or_default())
        }
    }

    /// `harness` split at its first `@` into key and version, when it has both.
    pub fn harness_ref(&self) -> Option<(&str, &str)> {
        let (key, version) = self.harness.split_once('@')?;
        (!key.is_empty() && !version.is_empty()).then_some((key, version))
    }
}

/// Parses one Stream definition with every rule of spec 2.3.
///
/// Run-level merging does not apply here; see [`load_stream_configs`]. Problems name paths relative to the
/// entry (`sampling_weight`, `task_envs.KEY`).
pub fn parse_stream_config(entry: &Value) -> Result<StreamConfig> {
    let mut found = Vec::new();
    let stream = parse_entry(entry, 0, &mut found).stream;
    let mut c = Collector::default();
    for (path, message) in found {
        c.push(path, message);
    }
    c.finish(())?;
    stream.ok_or_else(|| Error::Invalid("Arena Stream definition is invalid".into()))
}

/// Loads the run's Streams from `econfig` (spec 2.2), reading the process environment for `~` expansion.
///
/// See [`load_stream_configs_with_env`].
pub fn load_stream_configs(econfig: &EConfig) -> Result<Vec<StreamConfig>> {
    load_stream_configs_with_env(econfig, &Env::from_process())
}

/// Loads the run's Streams from `econfig` (spec 2.2).
///
/// Exactly one of `arena_streams` (inline), `arena_streams_yaml_b64` (base64 YAML) and `arena_streams_file`
/// (a YAML or JSON file, `~` expanded with `env`) may be set; a document is `streams: [...]` or a bare
/// non-empty list. With none set, the legacy fields describe one stream named `default`. Then run-level
/// `arena_harness` fills empty harnesses, run-level `arena_task_envs` are merged under each stream's, and
/// names and ids must be unique. Every problem is reported at once.
pub fn load_stream_configs_with_env(econfig: &EConfig, env: &Env) -> Result<Vec<StreamConfig>> {
    let (streams, problems) = collect_streams(econfig, env);
    if problems.is_empty() {
        Ok(streams)
    } else {
        Err(Error::Problems(Problems(problems)))
    }
}

/// Which of the three stream sources are set.
pub(crate) fn configured_sources(econfig: &EConfig) -> Vec<&'static str> {
    let mut set = Vec::new();
    if !econfig.arena_streams.is_empty() {
        set.push("arena_streams");
    }
    if !econfig.arena_streams_yaml_b64.trim().is_empty() {
        set.push("arena_streams_yaml_b64");
    }
    if !econfig.arena_streams_file.trim().is_empty() {
        set.push("arena_streams_file");
    }
    set
}

/// The streams and every problem found on the way; the streams are meaningful only without problems.
pub(crate) fn collect_streams(econfig: &EConfig, env: &Env) -> (Vec<StreamConfig>, Vec<Problem>) {
    let econfig_path = KeyPath::keys(["econfig"]);
    let sources = configured_sources(econfig);
    if sources.len() > 1 {
        let problem = Problem {
            path: econfig_path.to_string(),
            message: format!(
                "arena_streams, arena_streams_yaml_b64 and arena_streams_file are mutually exclusive, but {} are set",
                sources.join(" and ")
            ),
            origin: None,
        };
        return (Vec::new(), vec![problem]);
    }
    let document = match sources.first().copied() {
        None => return legacy_stream(econfig),
        Some("arena_streams") => Document {
            entries: econfig.arena_streams.clone(),
            list_path: econfig_path.key("arena_streams"),
            origin: None,
        },
        Some(_) => match source_text(econfig, env).and_then(|(name, text)| parse_document(&text, &name)) {
            Ok(raw) => raw.into_document(),
            Err(p) => return (Vec::new(), vec![p]),
        },
    };
    document.into_streams(econfig)
}

/// Stream entries from one source, with what is needed to say where a problem is.
struct Document {
    entries: Vec<Value>,
    /// The path problems are reported under: `econfig.arena_streams` or `streams`.
    list_path: KeyPath,
    /// For a YAML document: its name (file path or `arena_streams_yaml_b64`), its locations, and the path of
    /// the list inside it.
    origin: Option<(String, LineMap, KeyPath)>,
}

impl Document {
    fn problem(&self, index: usize, sub: &KeyPath, message: String) -> Problem {
        let mut path = self.list_path.index(index);
        let mut in_doc = self.origin.as_ref().map(|(_, _, p)| p.index(index));
        for seg in sub.segments() {
            match seg {
                crate::path::Seg::Key(k) => {
                    path.push_key(k);
                    if let Some(p) = in_doc.as_mut() {
                        p.push_key(k);
                    }
                }
                crate::path::Seg::Index(i) => {
                    path.push_index(*i);
                    if let Some(p) = in_doc.as_mut() {
                        p.push_index(*i);
                    }
                }
            }
        }
        let origin = self
            .origin
            .as_ref()
            .zip(in_doc)
            .map(|((name, lines, _), p)| match lines.locate(&p) {
                Some(at) => format!("{name}:{}:{}", at.line, at.column),
                None => name.clone(),
            });
        Problem {
            path: path.to_string(),
            message,
            origin,
        }
    }

    fn into_streams(self, econfig: &EConfig) -> (Vec<StreamConfig>, Vec<Problem>) {
        let mut problems = Vec::new();
        let mut streams: Vec<StreamConfig> = Vec::new();
        let mut identities = Vec::new();
        for (i, entry) in self.entries.iter().enumerate() {
            let mut found = Vec::new();
            let parsed = parse_entry(entry, i, &mut found);
            problems.extend(found.into_iter().map(|(p, m)| self.problem(i, &p, m)));
            identities.push((i, parsed.name, parsed.stream_id));
            streams.extend(parsed.stream);
        }
        let run_harness = econfig.arena_harness.trim();
        for s in &mut streams {
            if s.harness.is_empty() {
                s.harness = run_harness.to_string();
            }
            let mut envs = econfig.arena_task_envs.clone();
            envs.extend(std::mem::take(&mut s.task_envs));
            s.task_envs = envs;
        }
        // Every entry that names itself counts, valid or not, so a duplicate is reported together with the
        // other problems of either entry; empty names and ids are already reported as missing.
        let mut first_name: HashMap<&str, usize> = HashMap::new();
        let mut first_id: HashMap<&str, &str> = HashMap::new();
        for (i, name, stream_id) in &identities {
            if !name.is_empty()
                && let Some(j) = first_name.insert(name, *i)
            {
                let first = self.list_path.index(j);
                problems.push(self.problem(
                    *i,
                    &KeyPath::keys(["name"]),
                    format!("Arena Stream names must be unique: {name:?} is also the name of {first}"),
                ));
            }
            if !stream_id.is_empty()
                && let Some(other) = first_id.insert(stream_id, name)
            {
                problems.push(self.problem(
                    *i,
                    &KeyPath::keys(["stream_id"]),
                    format!(
                        "Arena Stream ids must be unique: streams {other:?} and {name:?} both use stream_id {stream_id:?}"
                    ),
                ));
            }
        }
        (streams, problems)
    }
}

fn legacy_stream(econfig: &EConfig) -> (Vec<StreamConfig>, Vec<Problem>) {
    let mut c = Collector::default();
    let at = KeyPath::keys(["econfig"]);
    let protocol = econfig.arena_llm_protocol.trim();
    let llm_protocol = if protocol.is_empty() {
        None
    } else {
        match protocol.parse::<LlmProtocol>() {
            Ok(p) => Some(p),
            Err(_) => {
                c.push(
                    at.key("arena_llm_protocol"),
                    format!(
                        "Unsupported Arena LLM protocol override {protocol:?}: expected one of anthropic, responses, chat_completions"
                    ),
                );
                None
            }
        }
    };
    if econfig.arena_task_envs.keys().any(|k| k.trim().is_empty()) {
        c.push(
            at.key("arena_task_envs"),
            "environment variable names must be non-empty",
        );
    }
    if let Some(t) = econfig.arena_reward_threshold
        && !t.is_finite()
    {
        c.push(
            at.key("arena_reward_threshold"),
            format!("must be finite, got {t}"),
        );
    }
    let stream = StreamConfig {
        name: "default".to_string(),
        stream_id: econfig.stream_id.trim().to_string(),
        sampling_weight: 1.0,
        harness: econfig.arena_harness.trim().to_string(),
        llm_protocol,
        task_envs: econfig.arena_task_envs.clone(),
        expected_reward_ref: RewardRef::default(),
        reward_threshold: econfig.arena_reward_threshold,
        reward_transform_fn: econfig.arena_reward_transform_fn.trim().to_string(),
    };
    (vec![stream], c.into_problems())
}

/// The name (for messages) and text of the base64 or file source of `econfig`.
pub(crate) fn source_text(econfig: &EConfig, env: &Env) -> Result<(String, String), Problem> {
    if econfig.arena_streams_file.trim().is_empty() {
        decode_b64(&econfig.arena_streams_yaml_b64)
    } else {
        read_streams_file(&econfig.arena_streams_file, env)
    }
}

fn decode_b64(encoded: &str) -> Result<(String, String), Problem> {
    let bad = |why: String| Problem {
        path: "econfig.arena_streams_yaml_b64".to_string(),
        message: format!("arena_streams_yaml_b64 is not valid base64 UTF-8 ({why})"),
        origin: None,
    };
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|e| bad(e.to_string()))?;
    let text = String::from_utf8(bytes).map_err(|e| bad(e.to_string()))?;
    Ok(("arena_streams_yaml_b64".to_string(), text))
}

fn read_streams_file(configured: &str, env: &Env) -> Result<(String, String), Problem> {
    let path = env.expand_tilde(configured.trim());
    let problem = |message: String| Problem {
        path: "econfig.arena_streams_file".to_string(),
        message,
        origin: None,
    };
    if !path.is_file() {
        return Err(problem(format!(
            "Arena Streams file not found: {}",
            path.display()
        )));
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| problem(format!("cannot read Arena Streams file {}: {e}", path.display())))?;
    Ok((path.display().to_string(), text))
}

/// A parsed streams document: its items in source order and where they are.
pub(crate) struct RawDocument {
    name: String,
    pub(crate) items: Vec<Spanned<Node>>,
    lines: LineMap,
    /// The path of the list inside the document: `streams` or the root.
    in_doc: KeyPath,
}

impl RawDocument {
    fn into_document(self) -> Document {
        Document {
            entries: self.items.iter().map(|i| i.value.to_json()).collect(),
            list_path: KeyPath::keys(["streams"]),
            origin: Some((self.name, self.lines, self.in_doc)),
        }
    }
}

/// Parses a streams document: `streams: [...]` (no other top-level key) or a bare non-empty list.
pub(crate) fn parse_document(text: &str, name: &str) -> Result<RawDocument, Problem> {
    let problem = |message: String, at: Option<yaml::LineCol>| Problem {
        path: String::new(),
        message,
        origin: Some(match at {
            Some(at) => format!("{name}:{}:{}", at.line, at.column),
            None => name.to_string(),
        }),
    };
    let (root, lines) = yaml::parse(text)
        .map_err(|e| problem(format!("Arena Streams YAML is not valid: {}", e.message), e.at))?;
    let (items, in_doc) = match root {
        Node::Seq(items) => (items, KeyPath::root()),
        Node::Map(mut entries) => {
            let mut unknown: Vec<&str> = entries
                .iter()
                .map(|(k, _)| k.value.as_str())
                .filter(|k| *k != "streams")
                .collect();
            if !unknown.is_empty() {
                unknown.sort_unstable();
                return Err(problem(
                    format!(
                        "Arena Streams document has unknown top-level fields: {unknown:?} (only `streams` is allowed)"
                    ),
                    None,
                ));
            }
            match entries.pop() {
                Some((_, v)) => match v.value {
                    Node::Seq(items) => (items, KeyPath::keys(["streams"])),
                    other => {
                        return Err(problem(
                            format!("`streams` must be a list, got {}", other.kind()),
                            lines.get(&KeyPath::keys(["streams"])),
                        ));
                    }
                },
                None => {
                    return Err(problem(
                        "Arena Streams document must contain a `streams` list".into(),
                        None,
                    ));
                }
            }
        }
        other => {
            return Err(problem(
                format!(
                    "Arena Streams document must be a `streams:` mapping or a list, got {}",
                    other.kind()
                ),
                None,
            ));
        }
    };
    if items.is_empty() {
        return Err(problem(
            "Arena Streams document defines no streams: the list must be non-empty".into(),
            lines.get(&in_doc),
        ));
    }
    Ok(RawDocument {
        name: name.to_string(),
        items,
        lines,
        in_doc,
    })
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => format!("{s:?}"),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "a mapping".into(),
    }
}

/// A YAML non-finite float as [`yaml::Node::to_json`] spells it.
fn non_finite(v: &Value) -> Option<&str> {
    v.as_str().filter(|s| matches!(*s, ".inf" | "-.inf" | ".nan"))
}

fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Text of a scalar string field: absent or null is empty; strings and numbers are their text, trimmed.
fn text_field(
    obj: &serde_json::Map<String, Value>,
    field: &str,
    found: &mut Vec<(KeyPath, String)>,
) -> String {
    match obj.get(field) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.trim().to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => {
            found.push((
                KeyPath::keys([field]),
                format!("{field} must be a string, got {}", describe(other)),
            ));
            String::new()
        }
    }
}

/// One entry's parse: the stream when it has no problem, and the name and id it gives itself either way
/// (empty when absent or not text), so uniqueness is checked across invalid entries too.
struct ParsedEntry {
    stream: Option<StreamConfig>,
    name: String,
    stream_id: String,
}

/// Parses one entry; pushes (path relative to the entry, message) for every broken rule.
fn parse_entry(entry: &Value, index: usize, out: &mut Vec<(KeyPath, String)>) -> ParsedEntry {
    let Some(obj) = entry.as_object() else {
        out.push((
            KeyPath::root(),
            format!(
                "each Arena Stream definition must be an object, got {}",
                describe(entry)
            ),
        ));
        return ParsedEntry {
            stream: None,
            name: String::new(),
            stream_id: String::new(),
        };
    };
    let mut found = Vec::new();
    let mut unknown: Vec<&str> = obj
        .keys()
        .map(String::as_str)
        .filter(|k| !STREAM_FIELDS.contains(k))
        .collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        found.push((
            KeyPath::root(),
            format!(
                "unknown fields: {unknown:?} (a stream has only {})",
                STREAM_FIELDS.join(", ")
            ),
        ));
    }

    let name = text_field(obj, "name", &mut found);
    if name.is_empty() {
        found.push((KeyPath::keys(["name"]), "name is required".into()));
    } else if !is_valid_name(&name) {
        found.push((
            KeyPath::keys(["name"]),
            format!("name {name:?} may only contain letters, digits, '.', '_', and '-'"),
        ));
    }
    let stream_id = text_field(obj, "stream_id", &mut found);
    if stream_id.is_empty() {
        found.push((KeyPath::keys(["stream_id"]), "stream_id is required".into()));
    }

    let sampling_weight = match obj.get("sampling_weight") {
        None => 1.0,
        Some(Value::Number(n)) => {
            let w = n.as_f64().unwrap_or(f64::NAN);
            if !(w.is_finite() && w > 0.0) {
                found.push((
                    KeyPath::keys(["sampling_weight"]),
                    format!("sampling_weight must be finite and positive, got {n}"),
                ));
            }
            w
        }
        Some(v) if non_finite(v).is_some() => {
            found.push((
                KeyPath::keys(["sampling_weight"]),
                format!(
                    "sampling_weight must be finite and positive, got {}",
                    non_finite(v).unwrap_or_default()
                ),
            ));
            f64::NAN
        }
        Some(other) => {
            found.push((
                KeyPath::keys(["sampling_weight"]),
                format!("sampling_weight must be numeric, got {}", describe(other)),
            ));
            f64::NAN
        }
    };

    let harness = text_field(obj, "harness", &mut found);

    let llm_protocol = match obj.get("llm_protocol") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.trim().is_empty() => None,
        Some(Value::String(s)) => match s.parse::<LlmProtocol>() {
            Ok(p) => Some(p),
            Err(e) => {
                found.push((KeyPath::keys(["llm_protocol"]), e.to_string()));
                None
            }
        },
        Some(other) => {
            found.push((
                KeyPath::keys(["llm_protocol"]),
                format!(
                    "unsupported llm_protocol {}: expected one of anthropic, responses, chat_completions",
                    describe(other)
                ),
            ));
            None
        }
    };

    let mut task_envs = BTreeMap::new();
    match obj.get("task_envs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(envs)) => {
            for (k, v) in envs {
                if k.trim().is_empty() {
                    found.push((
                        KeyPath::keys(["task_envs"]),
                        "task_envs keys must be non-empty strings".into(),
                    ));
                }
                match v {
                    Value::String(s) => {
                        task_envs.insert(k.clone(), s.clone());
                    }
                    other => found.push((
                        KeyPath::keys(["task_envs", k.as_str()]),
                        format!(
                            "task_envs values must be strings, got {}",
                            if crate::redact::is_sensitive_key(k) {
                                "a non-string (not shown: it may be a secret)".to_string()
                            } else {
                                describe(other)
                            }
                        ),
                    )),
                }
            }
        }
        Some(other) => found.push((
            KeyPath::keys(["task_envs"]),
            format!(
                "task_envs must be a mapping of strings to strings, got {}",
                describe(other)
            ),
        )),
    }

    let reward_threshold = match obj.get("reward_threshold") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => n.as_f64(),
        Some(v) if non_finite(v).is_some() => {
            found.push((
                KeyPath::keys(["reward_threshold"]),
                format!(
                    "reward_threshold must be finite, got {}",
                    non_finite(v).unwrap_or_default()
                ),
            ));
            None
        }
        Some(other) => {
            found.push((
                KeyPath::keys(["reward_threshold"]),
                format!(
                    "reward_threshold must be numeric or null, got {}",
                    describe(other)
                ),
            ));
            None
        }
    };

    let expected_reward_ref = parse_reward_ref(obj.get("expected_reward_ref"), &mut found);
    let reward_transform_fn = text_field(obj, "reward_transform_fn", &mut found);

    let label = if name.is_empty() {
        format!("Arena Stream #{index}")
    } else {
        format!("Arena Stream {name:?}")
    };
    let ok = found.is_empty();
    out.extend(found.into_iter().map(|(p, m)| (p, format!("{label}: {m}"))));
    ParsedEntry {
        stream: ok.then(|| StreamConfig {
            name: name.clone(),
            stream_id: stream_id.clone(),
            sampling_weight,
            harness,
            llm_protocol,
            task_envs,
            expected_reward_ref,
            reward_threshold,
            reward_transform_fn,
        }),
        name,
        stream_id,
    }
}

fn parse_reward_ref(value: Option<&Value>, found: &mut Vec<(KeyPath, String)>) -> RewardRef {
    let at = KeyPath::keys(["expected_reward_ref"]);
    let obj = match value {
        None | Some(Value::Null) => return RewardRef::default(),
        Some(Value::String(s)) if s.is_empty() => return RewardRef::default(),
        Some(Value::Object(obj)) => obj,
        Some(other) => {
            found.push((
                at,
                format!(
                    "expected_reward_ref must be an object with key and version, got {}",
                    describe(other)
                ),
            ));
            return RewardRef::default();
        }
    };
    let mut unknown: Vec<&str> = obj
        .keys()
        .map(String::as_str)
        .filter(|k| !matches!(*k, "key" | "version"))
        .collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        found.push((
            at.clone(),
            format!("expected_reward_ref has unknown fields: {unknown:?} (only key and version)"),
        ));
    }
    let mut part = |field: &str| match obj.get(field) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.trim().to_string(),
        Some(v @ (Value::Number(_) | Value::Bool(_))) => v.to_string(),
        Some(other) => {
            found.push((
                at.key(field),
                format!(
                    "expected_reward_ref.{field} must be a string, got {}",
                    describe(other)
                ),
            ));
            String::new()
        }
    };
    let reward_ref = RewardRef {
        key: part("key"),
        version: part("version"),
    };
    if reward_ref.key.is_empty() != reward_ref.version.is_empty() {
        found.push((
            at,
            format!(
                "expected_reward_ref requires both key and version, got key {:?} and version {:?}",
                reward_ref.key, reward_ref.version
            ),
        ));
    }
    reward_ref
}

#[cfg(test)]
mod tests;
