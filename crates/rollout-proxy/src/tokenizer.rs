//! The model's tokenizer (`tokenizer.json`, loaded with the HF `tokenizers` crate) and incremental
//! detokenisation that never splits a UTF-8 character.

mod fast;
#[cfg(test)]
mod tests;

use std::path::Path;

use crate::error::{Error, Result};
pub use fast::StagedPieces;
use fast::{ByteTable, FastEncoder};

/// A Hugging Face tokenizer, plus the ids of its special tokens and, for byte-level BPE tokenizers, a fast
/// path for encoding and decoding that gives the same ids and text.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special: Vec<bool>,
    fast: Option<FastEncoder>,
    bytes: Option<ByteTable>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json` from a model folder.
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(dir.as_ref().join("tokenizer.json"))
    }

    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes).map_err(|e| match e {
            Error::Tokenizer { message, .. } => Error::Tokenizer {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// Loads a tokenizer from the bytes of a `tokenizer.json`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| Error::Tokenizer {
            path: "tokenizer.json".into(),
            message: e.to_string(),
        })?;
        let size = inner.get_vocab_size(true);
        let mut special = vec![false; size];
        for (id, token) in inner.get_added_tokens_decoder() {
            if token.special
                && let Some(slot) = special.get_mut(id as usize)
            {
                *slot = true;
            }
        }
        let config: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
        let fast = FastEncoder::new(&config, |content| inner.token_to_id(content));
        let bytes = ByteTable::new(&config, size, |id| inner.id_to_token(id));
        Ok(Self {
            inner,
            special,
            fast,
            bytes,
        })
    }

    /// Whether encoding takes the byte-level fast path (see the `fast` module).
    pub fn has_fast_encoder(&self) -> bool {
        self.fast.is_some()
    }

    /// Whether decoding maps ids to bytes directly (a `ByteLevel` decoder).
    pub fn has_byte_table(&self) -> bool {
        self.bytes.is_some()
    }

    /// Encodes with `tokenizers` itself, never the fast path (what the fast path is checked against).
    pub fn encode_reference(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| Error::Tokenizer {
                path: "tokenizer.json".into(),
                message: format!("encoding failed: {e}"),
            })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Encodes `text` without adding special tokens (special tokens written in the text are still
    /// recognised), as `apply_chat_template(tokenize=True)` does.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        if let Some(ids) = self
            .fast
            .as_ref()
            .and_then(|f| f.encode(self.inner.get_model(), text, None))
        {
            return Ok(ids);
        }
        self.encode_reference(text)
    }

    /// Encodes as [`Tokenizer::encode`] does, but keeps the pieces the fast path's memory does not hold
    /// in `staged` instead of remembering them; [`Tokenizer::remember`] remembers them once the caller
    /// knows the text is worth it (the proxy: once the prompt fits the context window).
    pub fn encode_staged(&self, text: &str, staged: &mut StagedPieces) -> Result<Vec<u32>> {
        if let Some(ids) = self
            .fast
            .as_ref()
            .and_then(|f| f.encode(self.inner.get_model(), text, Some(staged)))
        {
            return Ok(ids);
        }
        self.encode_reference(text)
    }

    /// Remembers pieces [`Tokenizer::encode_staged`] held back.
    pub fn remember(&self, staged: StagedPieces) {
        if let Some(fast) = &self.fast
            && !staged.is_empty()
        {
            fast.remember(staged);
        }
    }

    /// How many pieces the fast path remembers and the bytes they take (zeros without a fast path).
    pub fn piece_memory(&self) -> (usize, usize) {
        self.fast.as_ref().map_or((0, 0), FastEncoder::piece_memory)
    }

    /// Decodes `ids`; with `skip_special`, special tokens are left out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| Error::Tokenizer {
                path: "tokenizer.json".into(),
                message: format!("decoding failed: {e}"),
            })
    }

    /// The id of `token` (a vocabulary entry or an added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary entry of `id`.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is a special token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// The vocabulary size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// Turns a growing sequence of token ids into text deltas.
///
/// It decodes a small window of recent tokens twice (with and without the newest ones) and emits the
/// difference once it no longer ends in an incomplete character, so multi-byte characters split across
/// tokens are never cut, and tokenizers that add or drop a leading space are handled. Special tokens are
/// skipped.
#[derive(Debug, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    /// Byte-level tokenizers: bytes of an incomplete character, waiting for the rest.
    pending: Vec<u8>,
}

impl IncrementalDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `id` and returns the text it completes, if any.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<Option<String>> {
        if let Some(table) = &tokenizer.bytes {
            if tokenizer.is_special(id) {
                return Ok(None);
            }
            self.pending.extend_from_slice(table.bytes(id));
            let text = take_utf8(&mut self.pending);
            return Ok((!text.is_empty()).then_some(text));
        }
        self.ids.push(id);
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], true)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') {
            let delta = match full.get(prefix.len()..) {
                Some(delta) if full.starts_with(&prefix) => delta.to_string(),
                // The window decoded differently with the new token; emit what is new after the common
                // prefix rather than nothing.
                _ => {
                    let common = full
                        .char_indices()
                        .zip(prefix.chars())
                        .take_while(|((_, a), b)| a == b)
                        .last()
                        .map(|((i, c), _)| i + c.len_utf8())
                        .unwrap_or(0);
                    full[common..].to_string()
                }
            };
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            return Ok(Some(delta));
        }
        Ok(None)
    }

    /// The text still held back at the end of the sequence (an incomplete character decodes as U+FFFD).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String> {
        if tokenizer.bytes.is_some() {
            let rest = String::from_utf8_lossy(&self.pending).into_owned();
            self.pending.clear();
            return Ok(rest);
        }
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix = tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], true)?;
        let full = tokenizer.decode(&self.ids[self.prefix_offset..], true)?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        Ok(full.get(prefix.len()..).unwrap_or_default().to_string())
    }
}

/// Takes the text at the start of `pending` that is complete: valid UTF-8, with a replacement character
/// for each invalid sequence (as a lossy decoding of the whole would have), leaving an incomplete
/// character at the end in place.
fn take_utf8(pending: &mut Vec<u8>) -> String {
    let mut out = String::new();
    let mut at = 0;
    loop {
        match std::str::from_utf8(&pending[at..]) {
            Ok(text) => {
                out.push_str(text);
                at = pending.len();
                break;
            }
            Err(e) => {
                let valid = at + e.valid_up_to();
                out.push_str(std::str::from_utf8(&pending[at..valid]).expect("checked valid"));
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        at = valid + n;
                    }
                    None => {
                        at = valid;
                        break;
                    }
                }
            }
        }
    }
    pending.drain(..at);
    out
}
