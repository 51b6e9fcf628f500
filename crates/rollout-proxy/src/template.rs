//! Hugging Face chat templates rendered with minijinja, byte-identical to `transformers`'
//! `apply_chat_template` for the templates models ship: `trim_blocks` and `lstrip_blocks`, loop controls,
//! Python string and dict methods (`minijinja-contrib`'s pycompat), `raise_exception`, `strftime_now`,
//! and a `tojson` that writes JSON the way Python's `json.dumps` does (`", "` and `": "` separators,
//! no HTML escaping, non-ASCII kept).

mod pyjson;
#[cfg(test)]
mod tests;

use std::path::Path;

use minijinja::value::{Kwargs, Value as JinjaValue};
use minijinja::{Environment, ErrorKind};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

const TEMPLATE_NAME: &str = "chat";
const SENTINEL: &str = "\u{E000}arena-rl-sentinel\u{E000}";

/// A model's chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    assistant_turn_end: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("assistant_turn_end", &self.assistant_turn_end)
            .finish_non_exhaustive()
    }
}

/// What to render besides the messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions<'a> {
    /// Tool definitions (OpenAI's `{"type": "function", "function": {...}}` objects), if any.
    pub tools: Option<&'a [Value]>,
    /// Append the opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// Extra template variables (a request's `chat_template_kwargs`, such as `enable_thinking`).
    pub extra: Option<&'a Map<String, Value>>,
}

impl ChatTemplate {
    /// Loads the template of a model folder: `chat_template.jinja` if present, else the `chat_template`
    /// field of `tokenizer_config.json` (a string, or a list of named templates, of which `default` or the
    /// first is used). `bos_token` and `eos_token` come from `tokenizer_config.json`.
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let jinja = dir.join("chat_template.jinja");
        let source = if jinja.exists() {
            std::fs::read_to_string(&jinja).map_err(|source| Error::Io { path: jinja, source })?
        } else {
            match config.as_ref().and_then(|c| c.get("chat_template")) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(named)) => named
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .or_else(|| named.first())
                    .and_then(|t| t.get("template"))
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .ok_or_else(|| {
                        Error::Template(format!("{}: chat_template list has no template", dir.display()))
                    })?,
                _ => {
                    return Err(Error::Template(format!(
                        "{} has neither chat_template.jinja nor a chat_template in tokenizer_config.json",
                        dir.display()
                    )));
                }
            }
        };
        let token = |name: &str| -> Option<String> {
            match config.as_ref()?.get(name)? {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
                _ => None,
            }
        };
        Self::new(source, token("bos_token"), token("eos_token"))
    }

    /// Compiles `source` with the given special tokens.
    pub fn new(
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| Error::Template(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.into())
            .map_err(|e| Error::Template(format!("compiling: {e}")))?;
        let mut template = Self {
            env,
            bos_token,
            eos_token,
            assistant_turn_end: None,
        };
        template.assistant_turn_end = template.probe_assistant_turn_end();
        Ok(template)
    }

    /// Renders `messages` (OpenAI-style message objects).
    pub fn render(&self, messages: &[Value], options: RenderOptions<'_>) -> Result<String> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::Template(e.to_string()))?;
        #[derive(serde::Serialize)]
        struct Context<'a> {
            #[serde(flatten)]
            extra: Option<&'a Map<String, Value>>,
            messages: &'a [Value],
            tools: Option<&'a [Value]>,
            add_generation_prompt: bool,
            bos_token: &'a str,
            eos_token: &'a str,
        }
        let ctx = jv(&Context {
            extra: options.extra,
            messages,
            tools: options.tools,
            add_generation_prompt: options.add_generation_prompt,
            bos_token: self.bos_token.as_deref().unwrap_or_default(),
            eos_token: self.eos_token.as_deref().unwrap_or_default(),
        });
        template
            .render(ctx)
            .map_err(|e| Error::Template(render_error(&e)))
    }

    /// The template's `eos_token`.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// What the template writes after an assistant message's content (for ChatML, `<|im_end|>\n`), found by
    /// rendering a probe conversation; `None` when the probe does not render.
    pub fn assistant_turn_end(&self) -> Option<&str> {
        self.assistant_turn_end.as_deref()
    }

    fn probe_assistant_turn_end(&self) -> Option<String> {
        let probe = [
            serde_json::json!({"role": "user", "content": "hi"}),
            serde_json::json!({"role": "assistant", "content": SENTINEL}),
        ];
        let text = self.render(&probe, RenderOptions::default()).ok()?;
        let at = text.rfind(SENTINEL)?;
        Some(text[at + SENTINEL.len()..].to_string())
    }
}

fn jv<T: serde::Serialize>(value: &T) -> JinjaValue {
    JinjaValue::from(minijinja::value::Serde(value))
}

fn render_error(e: &minijinja::Error) -> String {
    match e.kind() {
        ErrorKind::InvalidOperation => e.detail().unwrap_or("invalid operation").to_string(),
        _ => e.to_string(),
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Error::Template(format!("{} is not valid JSON: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn tojson(value: &JinjaValue, kwargs: Kwargs) -> std::result::Result<JinjaValue, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let mut out = String::new();
    pyjson::write(value, indent, 0, &mut out)?;
    Ok(JinjaValue::from_safe_string(out))
}

fn raise_exception(message: String) -> std::result::Result<JinjaValue, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    pyjson::strftime(secs, &format)
}
