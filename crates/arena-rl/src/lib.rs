//! arena-rl's composition root as a library: the rollout workflow, the training loop and their durability
//! and observability, which the `arena-rl` binary drives.
//!
//! What it does: resolves Arena Streams and mixes their rows ([`resolve`]); runs each prompt's group of
//! rollouts through the in-process rollout proxy and Arena, routes every outcome into a reward or a
//! rejection and exports token-exact trajectories ([`workflow`]); journals every route, task and finished
//! rollout before acting on it ([`journal`]); drives training steps with bounded off-policyness, weight
//! publication, checkpoints and evaluation ([`run::train`]), or only exports scored rollouts
//! ([`run::rollout_only`]); writes metrics to JSONL and TensorBoard event files and draws the reward curve
//! ([`observe`]); serves the burn policy as an inference engine ([`engine::PolicyEngine`]).
//!
//! What it does not do: implement protocols, rewards or models itself. Those are the other crates'
//! (`rollout-proxy`, `reward-routing`, `trainer`, `arena-client`, `stream-config`); this crate only composes
//! them. The GRPO update plugs in through [`train::TrainStep`].
//!
//! Entry points: [`run::train`] and [`run::rollout_only`] with a `RunConfig` and [`run::Plugins`];
//! [`train::TrainStep`] and [`train::build_batch`] for the optimisation step; [`engine::PolicyEngine`] for
//! serving the policy.

#![warn(clippy::too_many_lines)]

pub mod engine;
pub mod error;
pub mod eval;
pub mod failpoint;
mod fsutil;
pub mod journal;
pub mod observe;
pub mod proxy_control;
pub mod quickstart;
pub mod resolve;
pub mod run;
pub mod train;
pub mod workflow;

pub use error::{Error, Result};
