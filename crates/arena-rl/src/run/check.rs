//! What [`setup`](super::setup()) parses before it acts: the config's own rules again (a caller may have
//! changed a loaded config), then every component config the run builds from it, each checked. Every mistake
//! is reported at once, in one error, before the journal opens, Arena is called or a dataset downloads.
//!
//! A component check that reads a field the config's own rules already flagged is not reported again.

use std::net::IpAddr;
use std::path::PathBuf;

use arena_client::{ClientConfig, RegistryOptions};
use reward_routing::RewardConfig;
use rollout_proxy::IntegrityConfig;
use secrecy::SecretString;
use stream_config::{Env, ModelEngine, Problem, Problems, RouteMode, RunConfig, StreamConfig};

use super::reach::Reach;
use super::settings;
use crate::error::{Error, Result};

/// Every component config of a run, parsed and checked.
pub(crate) struct Checked {
    /// Where the proxy is advertised and what Arena can reach.
    pub reach: Reach,
    /// `model.path`.
    pub model_dir: PathBuf,
    /// The Arena client's config.
    pub client: ClientConfig,
    /// The configured Streams.
    pub streams: Vec<StreamConfig>,
    /// reward-routing's settings.
    pub reward: RewardConfig,
    /// The proxy's integrity rules.
    pub integrity: IntegrityConfig,
    /// `proxy.host`.
    pub proxy_host: IpAddr,
    /// The LLM gateway key and the route registry's options, outside direct route mode.
    pub routes: Option<(SecretString, RegistryOptions)>,
}

/// The problems found so far.
#[derive(Default)]
struct Found {
    /// The config's own rules.
    schema: Vec<Problem>,
    /// The component checks', each with the fields it read.
    components: Vec<(&'static [&'static str], String)>,
}

impl Found {
    /// The value of a component check that reads `fields`, or `None` with its problems noted.
    fn take<T>(&mut self, fields: &'static [&'static str], result: Result<T>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(e) => {
                let messages = match e.root() {
                    Error::Config(stream_config::Error::Problems(p)) => {
                        p.iter().map(ToString::to_string).collect()
                    }
                    _ => vec![e.to_string()],
                };
                self.components.extend(messages.into_iter().map(|m| (fields, m)));
                None
            }
        }
    }

    /// Whether the config's own rules flagged `field` or a field under it.
    fn flagged(&self, field: &str) -> bool {
        self.schema.iter().any(|p| {
            p.path == field
                || p.path
                    .strip_prefix(field)
                    .is_some_and(|rest| rest.starts_with(['.', '[']))
        })
    }

    /// Every problem, once, as one error (`None` when there is none).
    fn into_error(self) -> Option<Error> {
        let mut all = Vec::new();
        for (fields, message) in &self.components {
            if fields.iter().any(|f| self.flagged(f)) {
                continue;
            }
            all.push(Problem {
                path: String::new(),
                message: message.clone(),
                origin: None,
            });
        }
        let mut problems = self.schema;
        problems.extend(all);
        (!problems.is_empty()).then(|| Error::Config(stream_config::Error::Problems(Problems(problems))))
    }
}

impl Checked {
    /// Parses and checks every component config of `config`; `plugged_engine` says the caller brings its own
    /// engine, so the policy's device and dtype are not needed. Reads the Stream files and the environment
    /// and checks that `model.path` is a folder; writes nothing and calls no one. (The folder's tokenizer and
    /// chat template load once the journal is open, as the engine does.)
    pub(crate) fn of(config: &RunConfig, env: &Env, plugged_engine: bool) -> Result<Self> {
        let mut found = Found {
            schema: config.problems(env),
            ..Found::default()
        };
        let reach = found.take(
            &["econfig.arena_base_url", "proxy.host", "proxy.public_url"],
            super::reach::plan(config),
        );
        let model_dir = found.take(&["model.path"], super::setup::model_dir(config));
        let client = found.take(&["econfig.arena_base_url"], settings::client_config(config, env));
        let streams = found.take(
            &["econfig"],
            stream_config::load_stream_configs_with_env(&config.econfig, env).map_err(Error::from),
        );
        let reward = settings::reward_config(config);
        let valid_reward = reward.validate().map_err(|e| Error::Invalid(e.to_string()));
        found.take(
            &[
                "actor.reward_bias",
                "actor.reward_scaling",
                "actor.reward_clip",
                "actor.reward_norm",
                "gconfig.reward_normalization",
            ],
            valid_reward,
        );
        // The trainer's view of the actor section: what a training step would refuse at its first step.
        let train = settings::train_config(config)
            .validate()
            .and_then(|()| settings::memory_config(config).validate())
            .map_err(|e| Error::Invalid(format!("actor: {e}")));
        found.take(&["actor", "gconfig.temperature"], train);
        let integrity = found.take(&["guard"], settings::integrity_config(config));
        let host =
            config.proxy.host.parse::<IpAddr>().map_err(|_| {
                Error::Invalid(format!("proxy.host {:?} is not an IP address", config.proxy.host))
            });
        let proxy_host = found.take(&["proxy.host"], host);
        if !plugged_engine {
            check_engine(config, env, &mut found);
        }
        let routes = if config.econfig.arena_llm_route_mode == RouteMode::Direct {
            Some(None)
        } else {
            let key = arena_client::llm_api_key(env).map_err(|e| Error::Invalid(e.to_string()));
            let key = found.take(&[], key);
            let options = found.take(
                &["econfig.arena_registration_probe_interval"],
                settings::registry_options(config),
            );
            key.zip(options).map(Some)
        };
        match (reach, model_dir, client, streams, integrity, proxy_host, routes) {
            (
                Some(reach),
                Some(model_dir),
                Some(client),
                Some(streams),
                Some(integrity),
                Some(proxy_host),
                Some(routes),
            ) if found.schema.is_empty() && found.components.is_empty() => Ok(Self {
                reach,
                model_dir,
                client,
                streams,
                reward,
                integrity,
                proxy_host,
                routes,
            }),
            _ => Err(found
                .into_error()
                .expect("a check that gave no value noted a problem")),
        }
    }
}

/// The engine the config builds: each policy server's client, or the in-process policy's device and dtype.
fn check_engine(config: &RunConfig, env: &Env, found: &mut Found) {
    if !config.rollout.policy_servers.is_empty() {
        for url in &config.rollout.policy_servers {
            found.take(
                &["rollout.policy_servers", "rollout.policy_server_pause_mode"],
                settings::policy_server_config(config, env, url),
            );
        }
    } else if config.model.engine == ModelEngine::Burn {
        found.take(&["model.device", "model.dtype"], settings::policy_dtype(config));
    }
}
