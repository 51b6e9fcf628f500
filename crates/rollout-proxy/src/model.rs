//! A model folder as the proxy needs it: tokenizer, chat template and the token ids that end a turn.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::template::ChatTemplate;
use crate::tokenizer::Tokenizer;

/// The tokenizer, chat template and stop tokens of a Hugging Face model folder.
#[derive(Debug)]
pub struct ChatModel {
    /// The model's name as clients see it (the folder name unless set).
    pub name: String,
    /// `tokenizer.json`.
    pub tokenizer: Tokenizer,
    /// The chat template.
    pub template: ChatTemplate,
    /// Token ids that end an assistant turn: the template's `eos_token` and `generation_config.json`'s
    /// `eos_token_id` (a number or a list).
    pub stop_token_ids: Vec<u32>,
}

impl ChatModel {
    /// Loads `dir` (it needs `tokenizer.json` and a chat template; `generation_config.json` is optional).
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let tokenizer = Tokenizer::from_model_dir(dir)?;
        let template = ChatTemplate::from_model_dir(dir)?;
        let mut stop_token_ids = Vec::new();
        if let Some(id) = template.eos_token().and_then(|t| tokenizer.token_to_id(t)) {
            stop_token_ids.push(id);
        }
        let generation = dir.join("generation_config.json");
        if let Ok(bytes) = std::fs::read(&generation) {
            let config: Value = serde_json::from_slice(&bytes)
                .map_err(|e| Error::Config(format!("{} is not valid JSON: {e}", generation.display())))?;
            let ids = match config.get("eos_token_id") {
                Some(Value::Number(n)) => vec![n.clone()],
                Some(Value::Array(items)) => items.iter().filter_map(|v| v.as_number().cloned()).collect(),
                _ => Vec::new(),
            };
            for id in ids
                .iter()
                .filter_map(|n| n.as_u64())
                .filter_map(|n| u32::try_from(n).ok())
            {
                if !stop_token_ids.contains(&id) {
                    stop_token_ids.push(id);
                }
            }
        }
        if stop_token_ids.is_empty() {
            return Err(Error::Config(format!(
                "{}: no stop token (set eos_token in tokenizer_config.json or eos_token_id in generation_config.json)",
                dir.display()
            )));
        }
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        Ok(Self {
            name,
            tokenizer,
            template,
            stop_token_ids,
        })
    }
}
