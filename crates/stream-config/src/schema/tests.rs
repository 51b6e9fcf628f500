//! Schema: field discovery, serde symmetry and redacted saving.

use super::*;

#[test]
fn struct_fields_lists_the_sections() {
    assert_eq!(
        struct_fields::<RunConfig>(),
        [
            "experiment_name",
            "trial_name",
            "cluster",
            "econfig",
            "gconfig",
            "actor",
            "train_dataset",
            "valid_dataset"
        ]
    );
    assert!(struct_fields::<EConfig>().contains(&"arena_idempotent_launch"));
}

#[test]
fn a_saved_config_loads_back_unchanged() {
    let mut config = RunConfig {
        experiment_name: "exp".into(),
        trial_name: "t".into(),
        ..RunConfig::default()
    };
    config.actor.reward_norm = Some(NormConfig {
        mean_level: Some(NormLevel::Group),
        std_level: None,
        ..NormConfig::default()
    });
    config.econfig.arena_reward_threshold = Some(0.98);
    config.econfig.arena_task_envs.insert("K".into(), "v".into());
    config.valid_dataset = Some(DatasetConfig::default());
    let yaml = config.to_redacted_yaml().unwrap();
    let back = crate::load_run_config_str("saved.yaml", &yaml, &[], &Env::default()).unwrap();
    assert_eq!(back, config);
}

#[test]
fn saved_configs_are_redacted() {
    let mut config = RunConfig::default();
    config
        .econfig
        .arena_task_envs
        .insert("OPENAI_API_KEY".into(), "sk-live".into());
    let json = config.to_redacted_json().unwrap();
    assert_eq!(json["econfig"]["arena_task_envs"]["OPENAI_API_KEY"], "<redacted>");
    assert!(!config.to_redacted_yaml().unwrap().contains("sk-live"));
}

#[test]
fn defaults_break_only_the_required_names() {
    let problems: Vec<String> = RunConfig::default()
        .problems(&Env::default())
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        problems,
        ["experiment_name: is required", "trial_name: is required"]
    );
}

#[test]
fn normalising_rewards_twice_is_a_config_error() {
    let mut config = RunConfig {
        experiment_name: "e".into(),
        trial_name: "t".into(),
        ..RunConfig::default()
    };
    config.gconfig.reward_normalization = true;
    config.actor.reward_norm = Some(NormConfig::default());
    let problems = config.problems(&Env::default());
    assert_eq!(problems.len(), 1);
    assert!(problems[0].message.contains("normalise rewards twice"));
}
