//! `arena-rl proxy`: runs the rollout proxy from the shell, in front of the deterministic fake engine or an
//! SGLang server, until SIGTERM or Ctrl-C.
//!
//! The admin key comes from `SWE_RL_ADMIN_API_KEY` (never from the command line); without it a random key is
//! made for this process and written to a file of mode 0600 (`--admin-key-file`, by default under the
//! system's temporary directory), whose path the log names; the key itself is never printed.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use rollout_proxy::{
    ChatModel, FakeEngine, FakeEngineConfig, InferenceEngine, ProxyConfig, ProxyServer, ProxyState,
    SglangConfig, SglangEngine, ToolCallFormat,
};
use secrecy::SecretString;

/// Where the admin key comes from.
const ADMIN_KEY_ENV: &str = "SWE_RL_ADMIN_API_KEY";

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The inference engine: `fake` (deterministic, for tests and demos) or `sglang=http://HOST:PORT`.
    #[arg(long, default_value = "fake")]
    engine: String,
    /// The model folder: `tokenizer.json` and the chat template (`chat_template.jinja` or
    /// `tokenizer_config.json`).
    #[arg(long)]
    model: PathBuf,
    /// The port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// The context window (the fake engine's; for SGLang, instead of asking the server).
    #[arg(long)]
    max_context_len: Option<usize>,
    /// How tool calls appear in the model's output.
    #[arg(long, default_value = "hermes", value_parser = ["hermes", "qwen3_coder", "none"])]
    tool_calls: String,
    /// Message preprocessors to apply, in order (repeatable).
    #[arg(long = "preprocessor")]
    preprocessors: Vec<String>,
    /// Let sessions start without `/grant_capacity` calls.
    #[arg(long)]
    no_capacity_grants: bool,
    /// Where to write the random admin key made when `SWE_RL_ADMIN_API_KEY` is not set (mode 0600; it must
    /// not exist yet). Default: `arena-rl-proxy-<pid>.admin-key` in the temporary directory.
    #[arg(long)]
    admin_key_file: Option<PathBuf>,
}

pub(crate) fn run(args: Args) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(args))
}

async fn serve(args: Args) -> Result<()> {
    let model = Arc::new(
        ChatModel::from_dir(&args.model)
            .with_context(|| format!("loading the model folder {}", args.model.display()))?,
    );
    let engine: Arc<dyn InferenceEngine> = match args.engine.split_once('=') {
        None if args.engine == "fake" => {
            let vocab_end = u32::try_from(model.tokenizer.vocab_size())
                .unwrap_or(u32::MAX)
                .min(32_000);
            Arc::new(FakeEngine::new(FakeEngineConfig {
                max_context_len: args.max_context_len.unwrap_or(8192),
                vocab: 100.min(vocab_end.saturating_sub(1))..vocab_end,
                eos_token: model.stop_token_ids.first().copied(),
                record: false,
                ..FakeEngineConfig::default()
            }))
        }
        Some(("sglang", url)) => {
            let mut config = SglangConfig::new(url);
            config.max_context_len = args.max_context_len;
            config.api_key = std::env::var(arena_rl::run::settings::POLICY_API_KEY_ENV)
                .ok()
                .filter(|k| !k.is_empty())
                .map(SecretString::from);
            Arc::new(
                SglangEngine::connect(config)
                    .await
                    .with_context(|| format!("connecting to SGLang at {url}"))?,
            )
        }
        _ => bail!(
            "--engine must be `fake` or `sglang=http://HOST:PORT`, got {:?}",
            args.engine
        ),
    };
    let admin_key = match std::env::var(ADMIN_KEY_ENV) {
        Ok(key) if !key.is_empty() => SecretString::from(key),
        _ => random_admin_key(args.admin_key_file.as_deref())?,
    };
    let mut config = ProxyConfig::new(admin_key);
    config.tool_calls = match args.tool_calls.as_str() {
        "qwen3_coder" => ToolCallFormat::Qwen3Coder,
        "none" => ToolCallFormat::None,
        _ => ToolCallFormat::Hermes,
    };
    config.preprocessors = args.preprocessors;
    config.capacity_grants = !args.no_capacity_grants;
    let state = ProxyState::new(config, model, engine)?;
    let server = ProxyServer::start(SocketAddr::new(args.host, args.port), state).await?;
    println!("rollout proxy listening on http://{}", server.local_addr());
    shutdown_signal().await?;
    eprintln!("shutting down");
    server.shutdown().await?;
    Ok(())
}

/// A random admin key, written to a new file of mode 0600 whose path is logged (`create_new` refuses an
/// existing path, a symlink included, so the key never lands in a file someone prepared).
fn random_admin_key(path: Option<&std::path::Path>) -> Result<SecretString> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let path = path.map_or_else(
        || std::env::temp_dir().join(format!("arena-rl-proxy-{}.admin-key", std::process::id())),
        std::path::Path::to_path_buf,
    );
    let key = rollout_proxy::auth::random_hex(24);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| {
            format!(
                "creating the admin key file {} (it must not exist yet)",
                path.display()
            )
        })?;
    file.write_all(key.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing the admin key file {}", path.display()))?;
    eprintln!(
        "{ADMIN_KEY_ENV} is not set: made a random admin key for this proxy and wrote it to {} (mode 0600)",
        path.display()
    );
    Ok(SecretString::from(key))
}

async fn shutdown_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("listening for SIGTERM")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("listening for Ctrl-C"),
        _ = term.recv() => Ok(()),
    }
}
