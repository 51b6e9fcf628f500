//! `arena-rl streams ...`: Arena Stream definitions.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Result;
use stream_config::{Env, project_streams};

#[derive(clap::Subcommand)]
pub(crate) enum Command {
    /// Print a run config's Streams as base64 of the YAML document `streams: [...]`, for preflight
    /// (`--streams-env-b64`) or `econfig.arena_streams_yaml_b64`.
    ///
    /// `extends:` is resolved first; the Streams come from `econfig.arena_streams` or
    /// `econfig.arena_streams_file` and are validated. The environment and overrides are not applied, and
    /// any `${` inside the Streams is rejected, because preflight and training could resolve it differently.
    /// The output has no trailing newline.
    Project {
        /// The run config (YAML).
        config: PathBuf,
        /// Print the YAML document instead of its base64.
        #[arg(long)]
        yaml: bool,
    },
}

pub(crate) fn run(command: Command) -> Result<()> {
    match command {
        Command::Project { config, yaml } => {
            let projection = project_streams(&config, &Env::from_process())?;
            let text = if yaml { projection.yaml } else { projection.base64 };
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())?;
            out.flush()?;
            Ok(())
        }
    }
}
