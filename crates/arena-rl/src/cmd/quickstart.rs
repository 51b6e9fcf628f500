//! `arena-rl quickstart`: the main job on this machine, from the embedded `examples/configs/quickstart.yaml`.
//!
//! For now it loads, validates and prints the resolved Streams; the end-to-end issue makes it start
//! arena-sim and run the training loop.

use std::io::Write as _;

use anyhow::{Context as _, Result};
use stream_config::{Env, StreamConfig, load_run_config_str, load_stream_configs_with_env};

/// The quickstart config, embedded so that the command works from any directory.
pub(crate) const QUICKSTART_YAML: &str = include_str!("../../../../examples/configs/quickstart.yaml");

const QUICKSTART_NAME: &str = "examples/configs/quickstart.yaml";

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Dotted overrides of the quickstart config, e.g. `gconfig.n_samples=4` or
    /// `econfig.arena_streams=[{name: a, stream_id: s}]` (values in YAML flow syntax).
    #[arg(value_name = "SECTION.FIELD=VALUE")]
    overrides: Vec<String>,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let env = Env::from_process();
    let config = load_run_config_str(QUICKSTART_NAME, QUICKSTART_YAML, &args.overrides, &env)?;
    let mut streams = load_stream_configs_with_env(&config.econfig, &env)
        .with_context(|| format!("{QUICKSTART_NAME}: the Streams do not load"))?;
    for s in &mut streams {
        s.llm_protocol = Some(s.resolved_protocol(None));
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "# {QUICKSTART_NAME} is valid: experiment {:?}, trial {:?}, Arena at {}, route mode {}",
        config.experiment_name,
        config.trial_name,
        config.econfig.arena_base_url,
        config.econfig.arena_llm_route_mode
    )?;
    writeln!(out, "# {}", summary(&streams))?;
    writeln!(out, "{}", stream_config::render_streams_yaml(&streams)?)?;
    Ok(())
}

fn summary(streams: &[StreamConfig]) -> String {
    let parts: Vec<String> = streams
        .iter()
        .map(|s| {
            format!(
                "{} (weight {}, {})",
                s.name,
                s.sampling_weight,
                s.resolved_protocol(None)
            )
        })
        .collect();
    format!("{} Streams: {}", streams.len(), parts.join(", "))
}
