//! The one place that reads the process environment.
//!
//! Everything else takes an [`Env`], so tests pass a map instead of mutating the process environment.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

/// A snapshot of environment variables.
///
/// `Debug` shows variable names only: values may be credentials.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Env {
    vars: BTreeMap<String, String>,
}

impl Env {
    /// Snapshots the process environment (variables that are not valid UTF-8 are skipped).
    pub fn from_process() -> Self {
        Self {
            vars: std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect(),
        }
    }

    /// An environment with exactly these variables.
    pub fn from_pairs<K: Into<String>, V: Into<String>>(pairs: impl IntoIterator<Item = (K, V)>) -> Self {
        Self {
            vars: pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
        }
    }

    /// The value of `name`, if set.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }

    /// Every variable, in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Sets a variable (for tests and for callers composing an environment).
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.vars.insert(name.into(), value.into());
    }

    /// The home directory (`HOME`), used for `~` expansion.
    pub fn home_dir(&self) -> Option<PathBuf> {
        self.get("HOME").filter(|h| !h.is_empty()).map(PathBuf::from)
    }

    /// Expands a leading `~` or `~/` to the home directory; other paths are returned as they are.
    pub fn expand_tilde(&self, path: &str) -> PathBuf {
        let rest = if path == "~" {
            Some("")
        } else {
            path.strip_prefix("~/")
        };
        match (rest, self.home_dir()) {
            (Some(""), Some(home)) => home,
            (Some(rest), Some(home)) => home.join(rest),
            _ => PathBuf::from(path),
        }
    }
}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Env")
            .field("names", &self.vars.keys().collect::<Vec<_>>())
            .finish()
    }
}
