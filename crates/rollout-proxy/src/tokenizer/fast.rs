//! A fast path for byte-level BPE tokenizers (GPT-2, SmolLM2, Qwen, Llama 3), which the proxy runs on
//! every prompt and every sampled token.
//!
//! Encoding does exactly what `tokenizers` does for these tokenizers, without its offset bookkeeping
//! and per-token strings: split out added tokens (longest first), split the rest with the pre-tokenizer's
//! pattern, map bytes to the byte-level alphabet, and run the tokenizer's own BPE model on each piece,
//! remembering the ids of pieces already seen. The memory is bounded in bytes ([`CACHE_BYTES`], cleared
//! when full), keeps only pieces of at most [`MAX_CACHED_PIECE`] bytes (a longer run is rare in real text
//! and cheap to find again), and a caller may hold back a request's new pieces ([`StagedPieces`]) until
//! it knows the request is served, so that prompts refused for overflow leave nothing behind. The patterns end with `\s+(?!\S)|\s+`, whose look-ahead the
//! `regex` crate lacks; it matches `\s+` and gives back the last whitespace character when the run is
//! followed by text, which is what the look-ahead does. Decoding maps each id to its bytes.
//!
//! Only configurations whose equivalence is certain take the fast path (no normaliser, or NFC on ASCII
//! text; no truncation or padding; added tokens that strip nothing); everything else, and any piece the
//! pattern does not cover, goes through `tokenizers` unchanged. Tests compare both on random text.

use std::collections::HashMap;
use std::sync::Mutex;

use regex::Regex;
use serde_json::Value;
use tokenizers::Model;

/// The GPT-2 pattern of the `ByteLevel` pre-tokenizer with `use_regex`.
const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
const LOOKAHEAD_TAIL: &str = r"|\s+(?!\S)|\s+";
/// The bytes the piece memory may hold (pieces, their ids and a per-entry overhead) before it is cleared.
pub(crate) const CACHE_BYTES: usize = 16 * 1024 * 1024;
/// The longest piece remembered, in bytes.
pub(crate) const MAX_CACHED_PIECE: usize = 256;
/// What one remembered piece costs beyond its bytes and ids: two boxed slices and the table's slot.
const ENTRY_OVERHEAD: usize = 48;

fn entry_bytes(piece: &str, ids: &[u32]) -> usize {
    piece.len() + 4 * ids.len() + ENTRY_OVERHEAD
}

/// The piece memory: pieces to their ids, and the bytes that takes.
#[derive(Default)]
struct PieceCache {
    map: HashMap<Box<str>, Box<[u32]>>,
    bytes: usize,
}

impl PieceCache {
    fn insert(&mut self, piece: Box<str>, ids: Box<[u32]>) {
        let cost = entry_bytes(&piece, &ids);
        if self.bytes + cost > CACHE_BYTES {
            self.map.clear();
            self.bytes = 0;
        }
        let len = piece.len();
        if let Some(old) = self.map.insert(piece, ids) {
            self.bytes -= len + 4 * old.len() + ENTRY_OVERHEAD;
        }
        self.bytes += cost;
    }
}

/// Pieces a request encoded that the memory did not hold, kept apart until the caller decides whether to
/// remember them ([`crate::tokenizer::Tokenizer::remember`]).
#[derive(Debug, Default)]
pub struct StagedPieces {
    pieces: HashMap<Box<str>, Box<[u32]>>,
}

impl StagedPieces {
    /// How many pieces are held back.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }
}

/// The byte-level alphabet: each byte's stand-in character.
fn byte_chars() -> [char; 256] {
    let mut printable: Vec<u8> = (b'!'..=b'~').chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut chars = ['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from(b);
    }
    let mut n = 0u32;
    for b in 0..=255u8 {
        if !printable.contains(&b) {
            printable.push(b);
            chars[b as usize] = char::from_u32(256 + n).expect("256..512 are characters");
            n += 1;
        }
    }
    chars
}

#[cfg(test)]
pub(crate) fn byte_chars_for_tests() -> [char; 256] {
    byte_chars()
}

/// Byte-level encoding of a supported tokenizer.
pub(crate) struct FastEncoder {
    /// Added tokens, longest first, as one alternation; `None` when there are none.
    added: Option<Regex>,
    added_ids: HashMap<String, u32>,
    /// The pattern with its look-ahead alternative removed and the final `\s+` captured.
    split: Regex,
    /// Group index of the final `\s+`.
    tail_group: usize,
    /// The normaliser is NFC: only ASCII text takes the fast path (NFC leaves it unchanged).
    ascii_only: bool,
    chars: [char; 256],
    cache: Mutex<PieceCache>,
}

impl std::fmt::Debug for FastEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FastEncoder")
            .field("split", &self.split.as_str())
            .finish_non_exhaustive()
    }
}

/// The pre-tokenizer pattern of a supported `tokenizer.json`.
fn split_pattern(config: &Value) -> Option<String> {
    let pre = config.get("pre_tokenizer")?;
    let byte_level = |p: &Value, use_regex: bool| {
        p.get("type").and_then(Value::as_str) == Some("ByteLevel")
            && p.get("add_prefix_space").and_then(Value::as_bool) == Some(false)
            && p.get("use_regex").and_then(Value::as_bool).unwrap_or(true) == use_regex
    };
    if byte_level(pre, true) {
        return Some(GPT2_PATTERN.to_string());
    }
    if pre.get("type").and_then(Value::as_str) != Some("Sequence") {
        return None;
    }
    match pre.get("pretokenizers").and_then(Value::as_array)?.as_slice() {
        [split, last] if byte_level(last, false) => {
            let ok = split.get("type").and_then(Value::as_str) == Some("Split")
                && split.get("behavior").and_then(Value::as_str) == Some("Isolated")
                && split.get("invert").and_then(Value::as_bool) == Some(false);
            ok.then(|| split.pointer("/pattern/Regex")?.as_str().map(str::to_string))?
        }
        _ => None,
    }
}

impl FastEncoder {
    /// The fast path for the tokenizer described by `config` (its `tokenizer.json`), if it qualifies.
    pub(crate) fn new(config: &Value, id_of: impl Fn(&str) -> Option<u32>) -> Option<Self> {
        let ascii_only = match config.get("normalizer") {
            None | Some(Value::Null) => false,
            Some(n) if n.get("type").and_then(Value::as_str) == Some("NFC") => true,
            Some(_) => return None,
        };
        if !config.get("truncation").is_none_or(Value::is_null)
            || !config.get("padding").is_none_or(Value::is_null)
        {
            return None;
        }
        if config.pointer("/model/type").and_then(Value::as_str) != Some("BPE") {
            return None;
        }
        let pattern = split_pattern(config)?;
        let head = pattern.strip_suffix(LOOKAHEAD_TAIL)?;
        if head.contains("(?=") || head.contains("(?!") || head.contains("(?<") {
            return None;
        }
        let split = Regex::new(&format!(r"(?:{head})|(\s+)")).ok()?;
        let tail_group = split.captures_len() - 1;
        let mut added_ids = HashMap::new();
        for token in config
            .get("added_tokens")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let strips = ["lstrip", "rstrip", "single_word"]
                .iter()
                .any(|f| token.get(*f).and_then(Value::as_bool) == Some(true));
            if strips {
                return None;
            }
            let content = token.get("content").and_then(Value::as_str)?;
            if !content.is_empty() {
                // The id `tokenizers` gave it, which need not be the one the file says.
                added_ids.insert(content.to_string(), id_of(content)?);
            }
        }
        let added = if added_ids.is_empty() {
            None
        } else {
            let mut contents: Vec<&String> = added_ids.keys().collect();
            contents.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
            let alternation: Vec<String> = contents.iter().map(|c| regex::escape(c)).collect();
            Some(Regex::new(&alternation.join("|")).ok()?)
        };
        Some(Self {
            added,
            added_ids,
            split,
            tail_group,
            ascii_only,
            chars: byte_chars(),
            cache: Mutex::new(PieceCache::default()),
        })
    }

    /// Encodes `text` as `tokenizers` would (no special tokens added); `None` when this text must take the
    /// general path.
    /// general path. New pieces go to `staged` when given, into the memory otherwise.
    pub(crate) fn encode(
        &self,
        model: &impl Model,
        text: &str,
        mut staged: Option<&mut StagedPieces>,
    ) -> Option<Vec<u32>> {
        if self.ascii_only && !text.is_ascii() {
            return None;
        }
        let mut ids = Vec::with_capacity(text.len() / 3 + 8);
        let mut at = 0;
        if let Some(added) = &self.added {
            for m in added.find_iter(text) {
                self.encode_segment(model, &text[at..m.start()], &mut ids, staged.as_deref_mut())?;
                ids.push(*self.added_ids.get(m.as_str())?);
                at = m.end();
            }
        }
        self.encode_segment(model, &text[at..], &mut ids, staged)?;
        Some(ids)
    }

    /// Remembers what `staged` holds.
    pub(crate) fn remember(&self, staged: StagedPieces) {
        let mut cache = self.lock();
        for (piece, ids) in staged.pieces {
            cache.insert(piece, ids);
        }
    }

    /// How many pieces, and how many bytes, the memory holds.
    pub(crate) fn piece_memory(&self) -> (usize, usize) {
        let cache = self.lock();
        (cache.map.len(), cache.bytes)
    }

    fn encode_segment(
        &self,
        model: &impl Model,
        text: &str,
        ids: &mut Vec<u32>,
        mut staged: Option<&mut StagedPieces>,
    ) -> Option<()> {
        let mut at = 0;
        while at < text.len() {
            let Some(m) = self.split.find_at(text, at) else {
                return self.encode_piece(model, &text[at..], ids, staged);
            };
            if m.is_empty() {
                return None;
            }
            if m.start() > at {
                self.encode_piece(model, &text[at..m.start()], ids, staged.as_deref_mut())?;
            }
            let mut end = m.end();
            // `\s+(?!\S)` comes before the final `\s+`: a run of two or more followed by text leaves its last
            // character. Only a whitespace match can be that run, so only then ask which alternative matched.
            let run = m.as_str();
            if end < text.len() && run.chars().nth(1).is_some() && run.chars().all(char::is_whitespace) {
                let caps = self.split.captures_at(text, m.start())?;
                if caps.get(self.tail_group).is_some() {
                    end -= run.chars().next_back()?.len_utf8();
                }
            }
            self.encode_piece(model, &text[m.start()..end], ids, staged.as_deref_mut())?;
            at = end;
        }
        Some(())
    }

    fn encode_piece(
        &self,
        model: &impl Model,
        piece: &str,
        ids: &mut Vec<u32>,
        staged: Option<&mut StagedPieces>,
    ) -> Option<()> {
        let cacheable = piece.len() <= MAX_CACHED_PIECE;
        if cacheable {
            if let Some(known) = self.lock().map.get(piece) {
                ids.extend_from_slice(known);
                return Some(());
            }
            if let Some(known) = staged.as_ref().and_then(|s| s.pieces.get(piece)) {
                ids.extend_from_slice(known);
                return Some(());
            }
        }
        let mapped: String = piece.bytes().map(|b| self.chars[b as usize]).collect();
        let tokens = model.tokenize(&mapped).ok()?;
        let piece_ids: Box<[u32]> = tokens.iter().map(|t| t.id).collect();
        ids.extend_from_slice(&piece_ids);
        if cacheable {
            match staged {
                Some(staged) => {
                    staged.pieces.insert(piece.into(), piece_ids);
                }
                None => self.lock().insert(piece.into(), piece_ids),
            }
        }
        Some(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PieceCache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Each token's bytes, for tokenizers whose decoder is `ByteLevel`: decoding is then the concatenation of
/// the tokens' bytes (special tokens left out), read as UTF-8 with replacement characters.
pub(crate) struct ByteTable {
    bytes: Vec<u8>,
    /// `offsets[id]..offsets[id + 1]` are the bytes of `id`.
    offsets: Vec<u32>,
}

impl std::fmt::Debug for ByteTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteTable")
            .field("tokens", &(self.offsets.len().saturating_sub(1)))
            .finish()
    }
}

impl ByteTable {
    /// The table of a tokenizer whose `decoder` is `ByteLevel`; `token(id)` gives each id's string.
    pub(crate) fn new(config: &Value, size: usize, token: impl Fn(u32) -> Option<String>) -> Option<Self> {
        if config.pointer("/decoder/type").and_then(Value::as_str) != Some("ByteLevel") {
            return None;
        }
        let mut reverse: HashMap<char, u8> = HashMap::with_capacity(256);
        for (b, c) in byte_chars().iter().enumerate() {
            reverse.insert(*c, u8::try_from(b).expect("256 entries"));
        }
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(size + 1);
        offsets.push(0);
        for id in 0..size {
            let text = token(u32::try_from(id).ok()?).unwrap_or_default();
            // As the ByteLevel decoder: every character through the alphabet, or the raw text if one is
            // not in it.
            let mapped: Option<Vec<u8>> = text.chars().map(|c| reverse.get(&c).copied()).collect();
            match mapped {
                Some(m) => bytes.extend_from_slice(&m),
                None => bytes.extend_from_slice(text.as_bytes()),
            }
            offsets.push(u32::try_from(bytes.len()).ok()?);
        }
        Some(Self { bytes, offsets })
    }

    /// The bytes of `id` (none for an unknown id).
    pub(crate) fn bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.bytes[a as usize..b as usize],
            _ => &[],
        }
    }
}
