//! Key paths into a config tree, displayed as `econfig.arena_streams[1].name`.

use std::fmt;

/// One step of a key path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Seg {
    Key(String),
    Index(usize),
}

/// A path from the root of a config tree to one value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct KeyPath(Vec<Seg>);

impl KeyPath {
    pub(crate) fn root() -> Self {
        Self(Vec::new())
    }

    /// A path of mapping keys, e.g. `["econfig", "arena_streams"]`.
    pub(crate) fn keys<'a>(keys: impl IntoIterator<Item = &'a str>) -> Self {
        Self(keys.into_iter().map(|k| Seg::Key(k.to_string())).collect())
    }

    /// Parses a dotted reference (`a.b.0.c`): all-digit segments are list indices.
    pub(crate) fn parse_dotted(s: &str) -> Option<Self> {
        let mut path = Self::root();
        for part in s.split('.') {
            let part = part.trim();
            if part.is_empty()
                || !part
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return None;
            }
            match part.parse::<usize>() {
                Ok(i) if part.bytes().all(|b| b.is_ascii_digit()) => path.push_index(i),
                _ => path.push_key(part),
            }
        }
        Some(path)
    }

    pub(crate) fn push_key(&mut self, key: &str) {
        self.0.push(Seg::Key(key.to_string()));
    }

    pub(crate) fn push_index(&mut self, i: usize) {
        self.0.push(Seg::Index(i));
    }

    pub(crate) fn pop(&mut self) -> Option<Seg> {
        self.0.pop()
    }

    pub(crate) fn key(&self, key: &str) -> Self {
        let mut p = self.clone();
        p.push_key(key);
        p
    }

    pub(crate) fn index(&self, i: usize) -> Self {
        let mut p = self.clone();
        p.push_index(i);
        p
    }

    pub(crate) fn segments(&self) -> &[Seg] {
        &self.0
    }

    /// The last mapping key of the path, if the path ends in one.
    pub(crate) fn last_key(&self) -> Option<&str> {
        match self.0.last() {
            Some(Seg::Key(k)) => Some(k),
            _ => None,
        }
    }

    pub(crate) fn is_root(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.0.iter().enumerate() {
            match seg {
                Seg::Key(k) if i == 0 => write!(f, "{k}")?,
                Seg::Key(k) => write!(f, ".{k}")?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

impl KeyPath {
    /// Parses the display form (`econfig.arena_streams[1].name`) back into a path.
    pub(crate) fn parse_display(s: &str) -> Self {
        let mut path = Self::root();
        for part in s.split('.') {
            let (key, mut rest) = match part.find('[') {
                Some(i) => (&part[..i], &part[i..]),
                None => (part, ""),
            };
            if !key.is_empty() {
                path.push_key(key);
            }
            while let Some(stripped) = rest.strip_prefix('[') {
                let Some(end) = stripped.find(']') else { break };
                if let Ok(i) = stripped[..end].parse() {
                    path.push_index(i);
                }
                rest = &stripped[end + 1..];
            }
        }
        path
    }
}
