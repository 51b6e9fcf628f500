//! The shell task: a row whose tags carry a script (`cmd:<command>`, in order) asks the model to run each
//! command with a `bash` tool, one call each, and then to answer; the LLM harnesses run it in their own
//! protocol. It exists to replay agent-style commands (the integrity guard's corpus, say) as real tool
//! calls through the rollout proxy, so what the proxy records is seen end to end.
//!
//! The tool is a simulated shell: it runs nothing and answers every call with [`RESULT_MARKER`] and the
//! command. The grade is 1.0 when the calls ran the script in order and a final answer came, else 0.0.
//! [`next_command`] is the other side, for engines that play a policy which follows the script: from the
//! prompt as rendered, the command to call next.

use serde_json::{Value, json};
use stream_config::LlmProtocol;

use super::{ToolCall, ToolResult};

/// The tool's name.
pub const SHELL_TOOL: &str = "bash";
/// The tag prefix of a script's commands.
pub const SCRIPT_TAG: &str = "cmd:";
/// What precedes the script, as one JSON list of strings, on the prompt's last line.
pub const SCRIPT_MARKER: &str = "COMMANDS ";
/// What every tool result starts with.
pub const RESULT_MARKER: &str = "[sim-shell] $ ";

/// A shell task: the row and the commands of its script.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellTask {
    /// The row.
    pub data_id: String,
    /// The commands, in order.
    pub commands: Vec<String>,
}

impl ShellTask {
    /// The shell task of a row whose tags hold at least one `cmd:` entry.
    pub fn from_tags(data_id: &str, tags: &Value) -> Option<Self> {
        let commands: Vec<String> = tags
            .as_array()?
            .iter()
            .filter_map(Value::as_str)
            .filter_map(|t| t.strip_prefix(SCRIPT_TAG))
            .map(str::to_string)
            .collect();
        (!commands.is_empty()).then(|| Self {
            data_id: data_id.to_string(),
            commands,
        })
    }

    /// The row's tags for `commands` (`domain:shell` and one `cmd:` tag each).
    pub fn tags(commands: &[&str]) -> Vec<String> {
        std::iter::once("domain:shell".to_string())
            .chain(commands.iter().map(|c| format!("{SCRIPT_TAG}{c}")))
            .collect()
    }

    /// The prompt: the instruction, then the script as one JSON list on the last line.
    pub fn prompt(&self) -> String {
        let script = serde_json::to_string(&self.commands).expect("a list of strings is JSON");
        format!(
            "Run each command with the {SHELL_TOOL} tool, in order, one call each, then answer done.\n{SCRIPT_MARKER}{script}"
        )
    }

    /// The opening conversation in `protocol`'s shape.
    pub fn messages(&self, protocol: LlmProtocol) -> Vec<Value> {
        let prompt = self.prompt();
        match protocol {
            LlmProtocol::Anthropic | LlmProtocol::ChatCompletions => {
                vec![json!({"role": "user", "content": prompt})]
            }
            LlmProtocol::Responses => vec![json!({"type": "message", "role": "user", "content": prompt})],
        }
    }

    /// The `bash` tool in `protocol`'s shape.
    pub fn tools(protocol: LlmProtocol) -> Value {
        let parameters = json!({
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        });
        super::function_tool(protocol, SHELL_TOOL, "runs a shell command", parameters)
    }

    /// What the simulated shell answers: the command after [`RESULT_MARKER`]; nothing runs.
    pub fn tool_result(call: &ToolCall) -> ToolResult {
        match (call.name.as_str(), command_of(call)) {
            (SHELL_TOOL, Some(command)) => ToolResult {
                content: format!("{RESULT_MARKER}{command}\n(simulated: nothing was run)"),
                is_error: false,
            },
            (SHELL_TOOL, None) => ToolResult {
                content: "command is required".to_string(),
                is_error: true,
            },
            (other, _) => ToolResult {
                content: format!("unknown tool {other}"),
                is_error: true,
            },
        }
    }

    /// 1.0 when the calls ran exactly the script, in order, and a final answer came; else 0.0.
    pub fn grade(&self, final_answer: Option<&str>, calls: &[ToolCall]) -> f64 {
        let ran: Vec<Option<String>> = calls.iter().map(command_of).collect();
        let script: Vec<Option<String>> = self.commands.iter().cloned().map(Some).collect();
        let answered = final_answer.is_some_and(|a| !a.trim().is_empty());
        if answered && ran == script { 1.0 } else { 0.0 }
    }
}

/// The `command` argument of a call.
fn command_of(call: &ToolCall) -> Option<String> {
    call.arguments
        .get("command")
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// For an engine that follows the script: `None` when `prompt` (the conversation as rendered) holds no
/// script; else the next command to call, counting the tool results so far, or `Some(None)` when every
/// command ran.
pub fn next_command(prompt: &str) -> Option<Option<String>> {
    let at = prompt.rfind(SCRIPT_MARKER)?;
    let line = prompt[at + SCRIPT_MARKER.len()..].lines().next()?;
    let mut stream = serde_json::Deserializer::from_str(line).into_iter::<Vec<String>>();
    let commands = stream.next()?.ok()?;
    let done = prompt[at..].matches(RESULT_MARKER).count();
    Some(commands.get(done).cloned())
}

#[cfg(test)]
mod tests;
