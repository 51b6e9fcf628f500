//! `arena-rl preflight`: checks a run's Arena Streams against the live Arena (reference section 3) and prints
//! `{"streams": [...]}`, the summary records, writing them to `--output` too when given.
//!
//! The token comes from `ARENA_OPENAPI_TOKEN`; proxy variables are ignored; HTTP timeouts come from
//! `ARENA_PREFLIGHT_HTTP_TIMEOUT` (default 180 s) and `ARENA_PREFLIGHT_CONNECT_TIMEOUT` (default 10 s).

use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use arena_client::{ArenaClient, ClientConfig, PreflightOptions, RetryPolicy, preflight};
use clap::ArgGroup;
use secrecy::SecretString;
use stream_config::{EConfig, Env, Seconds, load_stream_configs_with_env};

#[derive(clap::Args)]
#[command(group(ArgGroup::new("source").required(true).args(["streams_file", "streams_env_b64"])))]
pub(crate) struct Args {
    /// A YAML (or JSON) file of Stream definitions: `streams: [...]` or a bare list.
    #[arg(long, value_name = "PATH")]
    streams_file: Option<PathBuf>,
    /// The name of an environment variable holding base64 of such a YAML document.
    #[arg(long, value_name = "NAME")]
    streams_env_b64: Option<String>,
    /// Arena's control-plane URL (`/openapi/v1` is appended unless present).
    #[arg(long, value_name = "URL")]
    base_url: String,
    /// Harness `key@version` for streams that name none (the run-level `arena_harness`).
    #[arg(long, default_value = "")]
    default_harness: String,
    /// Retries after a failed request.
    #[arg(long, default_value_t = 3)]
    retries: u32,
    /// Recent tasks to inspect per stream.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    recent_tasks: u32,
    /// Fewer recent terminal tasks than this fails the health check.
    #[arg(long, default_value_t = 1)]
    min_terminal_tasks: u64,
    /// A recent failure rate at or above this fails the health check (within [0, 1]).
    #[arg(long, default_value_t = 0.8)]
    max_failure_rate: f64,
    /// Report a stream that fails the health check instead of failing.
    #[arg(long)]
    allow_unhealthy: bool,
    /// Also write the JSON to this file (with a trailing newline).
    #[arg(long, value_name = "PATH")]
    output: Option<PathBuf>,
}

fn seconds(env: &Env, name: &str, default: f64) -> Result<Duration> {
    let Some(text) = env.get(name).filter(|v| !v.trim().is_empty()) else {
        return Ok(Duration::from_secs_f64(default));
    };
    match text.trim().parse::<f64>().ok().and_then(Seconds::new) {
        Some(s) => Ok(s.duration()),
        None => bail!(
            "{name} must be a positive number of seconds, at most {:e}, got {text:?}",
            Seconds::MAX
        ),
    }
}

pub(crate) fn run(args: Args) -> Result<()> {
    let env = Env::from_process();
    let options = PreflightOptions {
        recent_tasks: args.recent_tasks,
        min_terminal_tasks: args.min_terminal_tasks,
        max_failure_rate: args.max_failure_rate,
        allow_unhealthy: args.allow_unhealthy,
    };
    options.validate()?;
    let mut econfig = EConfig {
        arena_harness: args.default_harness.clone(),
        ..EConfig::default()
    };
    match (&args.streams_file, &args.streams_env_b64) {
        (Some(file), _) => econfig.arena_streams_file = file.display().to_string(),
        (None, Some(name)) => {
            let value = env.get(name).unwrap_or_default();
            if value.trim().is_empty() {
                bail!("--streams-env-b64 names {name}, which is unset or empty");
            }
            econfig.arena_streams_yaml_b64 = value.to_string();
        }
        (None, None) => bail!("one of --streams-file and --streams-env-b64 is required"),
    }
    let streams = load_stream_configs_with_env(&econfig, &env).context("loading the Streams")?;
    let token = env
        .get("ARENA_OPENAPI_TOKEN")
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| anyhow!("ARENA_OPENAPI_TOKEN is required"))?;
    let mut config = ClientConfig::new(&args.base_url, SecretString::from(token.to_string()))?;
    config.timeout = seconds(&env, "ARENA_PREFLIGHT_HTTP_TIMEOUT", 180.0)?;
    config.connect_timeout = Some(seconds(&env, "ARENA_PREFLIGHT_CONNECT_TIMEOUT", 10.0)?);
    config.use_env_proxy = false;
    config.retry = RetryPolicy {
        retries: args.retries,
        ..RetryPolicy::default()
    };
    let client = ArenaClient::new(config)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let summaries = runtime.block_on(preflight(&client, &streams, &options))?;
    let text = serde_json::to_string_pretty(&serde_json::json!({ "streams": summaries }))?;
    if let Some(path) = &args.output {
        std::fs::write(path, format!("{text}\n")).with_context(|| format!("writing {}", path.display()))?;
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()?;
    Ok(())
}
