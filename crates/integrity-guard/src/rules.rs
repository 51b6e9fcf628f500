//! Rules as data: [`RuleSpec`] (what the built-in `defaults.yaml` and a run config's user rules say),
//! compiled into a [`RuleSet`] that matches one unwrapped command at a time.
//!
//! Every pattern of a rule is compiled into one [`regex::RegexSet`] per condition, anchored at both ends,
//! so matching an argument takes time linear in its length whatever the patterns are.

use std::collections::HashSet;
use std::sync::OnceLock;

use regex::{RegexSet, RegexSetBuilder};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Problem, Result};

/// The built-in rules, as shipped (`src/defaults.yaml`).
pub const DEFAULT_RULES_YAML: &str = include_str!("defaults.yaml");

/// A compiled pattern may take at most this much memory (the `regex` crate's size limit).
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// One rule. A command matches when every condition the rule sets holds; a list condition holds when one of
/// its entries does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// The rule's name (`[a-z0-9][a-z0-9_.-]*`, unique in a rule set): hits, metrics
    /// (`reward/integrity_hits/<id>`) and audit records carry it.
    pub id: String,
    /// The group it belongs to (same characters as `id`), for reports: `history`, `reflog-objects`,
    /// `object-by-hash`, `remote-ref`, `upstream-fetch` and `network-fetch` for the built-ins.
    pub category: String,
    /// What it catches, for people.
    #[serde(default)]
    pub description: String,
    /// The programs it applies to, by base name (`git`, `curl`; `*` for any). The guard's own pseudo
    /// programs: `(read)` for a file path a tool call names, `(fetch)` for a URL a tool call names,
    /// `(code-fetch)` for a URL that Python or Node code fetches.
    pub programs: Vec<String>,
    /// Subcommands, one of which the command must have: for `git` the word after its global options (and
    /// after alias expansion), otherwise the first argument that is not an option. Empty: no condition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subcommands: Vec<String>,
    /// Patterns; some argument (the subcommand aside) must match one as a whole. Empty: no condition.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub any_arg: Vec<String>,
    /// A second condition like `any_arg`, which must hold as well (for "`-a` and also `-v`").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub and_arg: Vec<String>,
    /// Patterns no argument may match (`--help`, say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub no_arg: Vec<String>,
    /// Patterns; some revision argument must match one. Revision arguments are the arguments before `--`
    /// that are not options or option values (plus the values of `--source` and `--onto`), each cut into the
    /// sides of `..`/`...`, cut at `:` (`REV:path`), and stripped of `^`, `~N` and `^{type}` suffixes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revisions: Vec<String>,
    /// Some revision argument is an object hash (7 to 64 hex digits, at least one a letter) that is not
    /// the task's base commit (neither a prefix of it nor extended by it) where the row gives one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hash_revision: bool,
    /// Host names (each also covers its subdomains); some argument must be a URL, `user@host:path` or
    /// `host/path` on one of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}

/// The built-in rules' specifications, parsed from [`DEFAULT_RULES_YAML`].
pub fn default_rule_specs() -> &'static [RuleSpec] {
    static SPECS: OnceLock<Vec<RuleSpec>> = OnceLock::new();
    SPECS.get_or_init(|| {
        serde_saphyr::from_str(DEFAULT_RULES_YAML).expect("the built-in rules parse (a unit test checks)")
    })
}

/// One compiled rule.
#[derive(Debug)]
pub(crate) struct Rule {
    pub(crate) id: String,
    pub(crate) category: String,
    any_program: bool,
    programs: HashSet<String>,
    subcommands: HashSet<String>,
    any_arg: Option<RegexSet>,
    and_arg: Option<RegexSet>,
    no_arg: Option<RegexSet>,
    revisions: Option<RegexSet>,
    hash_revision: bool,
    hosts: Vec<String>,
}

/// A compiled, validated list of rules: what the guard matches commands against.
#[derive(Debug)]
pub struct RuleSet {
    pub(crate) rules: Vec<Rule>,
    specs: Vec<RuleSpec>,
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-'))
        && name.len() <= 64
}

fn patterns(problems: &mut Vec<Problem>, path: &str, field: &str, list: &[String]) -> Option<RegexSet> {
    if list.is_empty() {
        return None;
    }
    let mut ok = true;
    for (i, p) in list.iter().enumerate() {
        if let Err(e) = RegexSetBuilder::new([format!("^(?:{p})$")])
            .size_limit(PATTERN_SIZE_LIMIT)
            .build()
        {
            ok = false;
            let detail = e
                .to_string()
                .lines()
                .last()
                .unwrap_or_default()
                .trim()
                .to_string();
            problems.push(Problem {
                path: format!("{path}.{field}[{i}]"),
                message: format!("invalid regular expression {p:?}: {detail}"),
            });
        }
    }
    if !ok {
        return None;
    }
    RegexSetBuilder::new(list.iter().map(|p| format!("^(?:{p})$")))
        .size_limit(PATTERN_SIZE_LIMIT * list.len().max(1))
        .build()
        .map_err(|e| {
            problems.push(Problem {
                path: format!("{path}.{field}"),
                message: format!("the patterns together are too large: {e}"),
            });
        })
        .ok()
}

fn compile(spec: &RuleSpec, path: &str, problems: &mut Vec<Problem>) -> Rule {
    for (field, value) in [("id", &spec.id), ("category", &spec.category)] {
        if !valid_name(value) {
            problems.push(Problem {
                path: format!("{path}.{field}"),
                message: format!(
                    "{value:?} must be 1-64 characters of a-z, 0-9, '_', '.' and '-', starting with a letter or digit"
                ),
            });
        }
    }
    if spec.programs.is_empty() {
        problems.push(Problem {
            path: format!("{path}.programs"),
            message: "must name at least one program (or \"*\" for any)".into(),
        });
    }
    for (i, p) in spec.programs.iter().enumerate() {
        if p.is_empty() || p.contains(['/', ' ']) {
            problems.push(Problem {
                path: format!("{path}.programs[{i}]"),
                message: format!("{p:?} must be a program's base name, without '/' or spaces"),
            });
        }
    }
    let conditions = !spec.subcommands.is_empty()
        || !spec.any_arg.is_empty()
        || !spec.revisions.is_empty()
        || spec.hash_revision
        || !spec.hosts.is_empty();
    if spec.programs.iter().any(|p| p == "*") && !conditions {
        problems.push(Problem {
            path: path.to_string(),
            message: "a rule for any program (\"*\") must also set subcommands, any_arg, revisions, hash_revision or hosts".into(),
        });
    }
    for (i, h) in spec.hosts.iter().enumerate() {
        if h.is_empty()
            || !h
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-'))
        {
            problems.push(Problem {
                path: format!("{path}.hosts[{i}]"),
                message: format!("{h:?} must be a host name (letters, digits, '.' and '-')"),
            });
        }
    }
    Rule {
        id: spec.id.clone(),
        category: spec.category.clone(),
        any_program: spec.programs.iter().any(|p| p == "*"),
        programs: spec.programs.iter().cloned().collect(),
        subcommands: spec.subcommands.iter().cloned().collect(),
        any_arg: patterns(problems, path, "any_arg", &spec.any_arg),
        and_arg: patterns(problems, path, "and_arg", &spec.and_arg),
        no_arg: patterns(problems, path, "no_arg", &spec.no_arg),
        revisions: patterns(problems, path, "revisions", &spec.revisions),
        hash_revision: spec.hash_revision,
        hosts: spec.hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
    }
}

impl RuleSet {
    /// Compiles `specs`; every problem (ids, patterns, hosts, duplicate ids) is reported at once, with
    /// paths `rules[i].field` relative to the list.
    pub fn new(specs: Vec<RuleSpec>) -> Result<Self> {
        Self::with_paths(
            specs
                .into_iter()
                .enumerate()
                .map(|(i, s)| (format!("rules[{i}]"), s)),
        )
    }

    fn with_paths(specs: impl IntoIterator<Item = (String, RuleSpec)>) -> Result<Self> {
        let mut problems = Vec::new();
        let mut rules = Vec::new();
        let mut kept = Vec::new();
        let mut ids = HashSet::new();
        for (path, spec) in specs {
            if !ids.insert(spec.id.clone()) {
                problems.push(Problem {
                    path: format!("{path}.id"),
                    message: format!("{:?} is already the id of another rule", spec.id),
                });
            }
            rules.push(compile(&spec, &path, &mut problems));
            kept.push(spec);
        }
        if problems.is_empty() {
            Ok(Self { rules, specs: kept })
        } else {
            Err(Error::InvalidRules(problems))
        }
    }

    /// The built-in rules, compiled once per process and shared.
    pub fn shared_builtin() -> std::sync::Arc<Self> {
        static SHARED: OnceLock<std::sync::Arc<RuleSet>> = OnceLock::new();
        SHARED
            .get_or_init(|| std::sync::Arc::new(Self::builtin()))
            .clone()
    }

    /// The built-in rules.
    pub fn builtin() -> Self {
        Self::new(default_rule_specs().to_vec()).expect("the built-in rules compile (a unit test checks)")
    }

    /// The built-in rules (unless `builtin` is false) less those `disable` names, then `extra` user rules.
    /// Problems name `disable[i]` and `rules[i]`.
    pub fn assemble(builtin: bool, disable: &[String], extra: Vec<RuleSpec>) -> Result<Self> {
        let mut problems = Vec::new();
        let defaults = default_rule_specs();
        for (i, id) in disable.iter().enumerate() {
            if !defaults.iter().any(|s| &s.id == id) {
                let known: Vec<&str> = defaults.iter().map(|s| s.id.as_str()).collect();
                problems.push(Problem {
                    path: format!("disable[{i}]"),
                    message: format!(
                        "{id:?} is not a built-in rule; built-in rules: {}",
                        known.join(", ")
                    ),
                });
            }
        }
        let base = defaults
            .iter()
            .filter(|s| builtin && !disable.contains(&s.id))
            .map(|s| (format!("built-in rule {}", s.id), s.clone()));
        let user = extra
            .into_iter()
            .enumerate()
            .map(|(i, s)| (format!("rules[{i}]"), s));
        match Self::with_paths(base.chain(user)) {
            Ok(set) if problems.is_empty() => Ok(set),
            Ok(_) => Err(Error::InvalidRules(problems)),
            Err(Error::InvalidRules(more)) => {
                problems.extend(more);
                Err(Error::InvalidRules(problems))
            }
        }
    }

    /// The specifications this set was compiled from, in order.
    pub fn specs(&self) -> &[RuleSpec] {
        &self.specs
    }

    /// How many rules it holds.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Whether it holds none (a guard with no rules finds nothing).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// What a rule looks at in one command.
pub(crate) struct Candidate<'a> {
    pub(crate) program: &'a str,
    pub(crate) args: &'a [String],
    pub(crate) base_commit: Option<&'a str>,
}

/// Options (of git's history commands) whose value is the next word and is not a revision.
const VALUE_OPTIONS: &[&str] = &[
    "-n",
    "-b",
    "-B",
    "-S",
    "-G",
    "-L",
    "-O",
    "-U",
    "-o",
    "--grep",
    "--author",
    "--committer",
    "--format",
    "--pretty",
    "--since",
    "--until",
    "--after",
    "--before",
    "--date",
    "--max-count",
    "--skip",
    "--depth",
    "--branch",
    "--output",
    "--prefix",
    "--remote",
    "--diff-filter",
    "--encoding",
    "--exclude",
    "--min-parents",
    "--max-parents",
    "--orphan",
    "--conflict",
];

/// Options whose value (`--opt=V` or `--opt V`) is a revision.
const REVISION_OPTIONS: &[&str] = &["--source", "--onto"];

impl Rule {
    pub(crate) fn matches(&self, c: &Candidate<'_>) -> bool {
        if !self.any_program && !self.programs.contains(c.program) {
            return false;
        }
        let args: &[String] = c.args;
        let mut skip = None;
        if !self.subcommands.is_empty() {
            let Some(at) = c.args.iter().position(|a| !a.starts_with('-')) else {
                return false;
            };
            if !self.subcommands.contains(&c.args[at]) {
                return false;
            }
            skip = Some(at);
        }
        let rest = || {
            args.iter()
                .enumerate()
                .filter(move |(i, _)| Some(*i) != skip)
                .map(|(_, a)| a.as_str())
        };
        let any = |set: &Option<RegexSet>| set.as_ref().is_none_or(|s| rest().any(|a| s.is_match(a)));
        if !any(&self.any_arg) || !any(&self.and_arg) {
            return false;
        }
        if let Some(no) = &self.no_arg
            && rest().any(|a| no.is_match(a))
        {
            return false;
        }
        if self.revisions.is_some() || self.hash_revision {
            let after_sub = skip.map_or(args, |at| &args[at + 1..]);
            let revs = revisions(after_sub);
            if let Some(set) = &self.revisions
                && !revs.iter().any(|r| set.is_match(r))
            {
                return false;
            }
            if self.hash_revision && !revs.iter().any(|r| is_foreign_hash(r, c.base_commit)) {
                return false;
            }
        }
        if !self.hosts.is_empty() && !rest().any(|a| host_of(a).is_some_and(|h| self.host_matches(&h))) {
            return false;
        }
        true
    }

    fn host_matches(&self, host: &str) -> bool {
        self.hosts
            .iter()
            .any(|h| host == h || host.strip_suffix(h.as_str()).is_some_and(|p| p.ends_with('.')))
    }
}

/// The revision arguments of `args` (see [`RuleSpec::revisions`]).
pub(crate) fn revisions(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        i += 1;
        if a == "--" {
            break;
        }
        if a.starts_with('-') {
            let (name, value) = match a.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (a, None),
            };
            if REVISION_OPTIONS.contains(&name) {
                match value {
                    Some(v) => out.push(v.to_string()),
                    None => {
                        if let Some(v) = args.get(i) {
                            out.push(v.clone());
                        }
                        i += 1;
                    }
                }
            } else if value.is_none() && VALUE_OPTIONS.contains(&name) {
                i += 1;
            }
            continue;
        }
        out.push(a.to_string());
    }
    out.into_iter()
        .flat_map(|a| {
            let sides: Vec<String> = a
                .split("..")
                .map(|s| s.trim_start_matches('.'))
                .map(str::to_string)
                .collect();
            sides
        })
        .map(|side| clean_revision(&side))
        .filter(|r| !r.is_empty())
        .collect()
}

/// `REV:path` to `REV`, and `^`, `~N`, `^N`, `^{type}`, `^!`, `^@` suffixes removed.
fn clean_revision(side: &str) -> String {
    let mut rev = match side.find(':') {
        Some(at) => &side[..at],
        None => side,
    };
    loop {
        let before = rev;
        if let Some(at) = rev.rfind("^{")
            && rev.ends_with('}')
        {
            rev = &rev[..at];
        }
        let trimmed = rev.trim_end_matches(|c: char| c.is_ascii_digit());
        if trimmed.ends_with(['^', '~']) {
            rev = &trimmed[..trimmed.len() - 1];
        } else if rev.ends_with(['^', '~', '!', '@']) && rev.len() > 1 && !rev.ends_with("}") {
            rev = &rev[..rev.len() - 1];
        }
        if rev == before {
            return rev.to_string();
        }
    }
}

/// An object hash that is not (a prefix of, or extended by) the base commit.
fn is_foreign_hash(rev: &str, base: Option<&str>) -> bool {
    let looks = (7..=64).contains(&rev.len())
        && rev.chars().all(|c| c.is_ascii_hexdigit())
        && rev.chars().any(|c| c.is_ascii_alphabetic());
    if !looks {
        return false;
    }
    let rev = rev.to_ascii_lowercase();
    match base {
        Some(base) => !(base.starts_with(&rev) || rev.starts_with(base)),
        None => true,
    }
}

/// The host an argument points at: a URL's, `user@host:path`'s, or `host.tld/path`'s, lower-cased.
pub(crate) fn host_of(arg: &str) -> Option<String> {
    let host_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-');
    let from = |rest: &str| {
        let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
        let host: String = rest.chars().take_while(|&c| host_chars(c)).collect();
        (host.contains('.') && !host.starts_with('.')).then(|| host.to_ascii_lowercase())
    };
    if let Some(at) = arg.find("://") {
        let rest = &arg[at + 3..];
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        return from(&rest[..end]);
    }
    if let Some((user, rest)) = arg.split_once('@')
        && !user.is_empty()
        && !user.contains('/')
        && let Some((host, _)) = rest.split_once(':')
    {
        return from(host);
    }
    let head = arg.split('/').next().unwrap_or_default();
    if head.len() < arg.len() || !arg.contains('/') {
        let candidate = head;
        let tld_ok = candidate
            .rsplit('.')
            .next()
            .is_some_and(|t| t.len() >= 2 && t.chars().all(|c| c.is_ascii_alphabetic()));
        if candidate.chars().all(host_chars) && candidate.contains('.') && tld_ok {
            return from(candidate);
        }
    }
    None
}

#[cfg(test)]
mod tests;
