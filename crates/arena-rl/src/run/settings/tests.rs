//! The trainer keeps its own copies of the `actor` section's settings (it depends on no workspace crate):
//! their defaults are the config's.

use stream_config::{NormConfig, RunConfig};

use super::{adv_norm, memory_config, train_config};

#[test]
fn the_trainers_defaults_are_the_configs() {
    let config = RunConfig::default();
    assert_eq!(
        train_config(&config),
        trainer::TrainConfig::default(),
        "the trainer's TrainConfig (its PPO objective included) defaults as the actor section does"
    );
    assert_eq!(memory_config(&config), trainer::MemoryConfig::default());
    assert_eq!(
        adv_norm(&NormConfig::default()),
        trainer::AdvNorm::default(),
        "trainer::AdvNorm defaults as actor.adv_norm's NormConfig does"
    );
}
