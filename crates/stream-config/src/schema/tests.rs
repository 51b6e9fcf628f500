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
            "valid_dataset",
            "eval_every",
            "proxy",
            "rollout",
            "model",
            "checkpoint",
            "metrics"
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

fn loop_problems(overrides: &[&str]) -> Vec<String> {
    let mut all = vec!["experiment_name=e".to_string(), "trial_name=t".to_string()];
    all.extend(overrides.iter().map(|o| (*o).to_string()));
    match crate::load_run_config_str("run.yaml", "{}", &all, &Env::default()) {
        Ok(_) => Vec::new(),
        Err(e) => e.problems().iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn loop_sections_have_the_reference_defaults() {
    let config = RunConfig::default();
    assert_eq!(config.proxy.export_style, ExportStyle::Concat);
    assert_eq!(config.proxy.turn_discount, 1.0);
    assert_eq!(config.proxy.session_timeout_seconds, 3600.0);
    assert_eq!(config.proxy.admin_key_env, "SWE_RL_ADMIN_API_KEY");
    assert_eq!(config.rollout.max_head_offpolicyness, 0);
    assert!(config.rollout.policy_servers.is_empty());
    assert_eq!(config.eval_every, 0);
    assert!(loop_problems(&[]).is_empty());
}

#[test]
fn loop_sections_report_every_problem_at_once() {
    let problems = loop_problems(&[
        "proxy.turn_discount=1.5",
        "proxy.session_timeout_seconds=0",
        "rollout.max_concurrent_rollouts=0",
        "rollout.policy_servers=[http://a:1, ftp://b]",
        "rollout.n_workers=2",
        "rollout.worker_index=2",
        "checkpoint.keep_last=0",
        "eval_every=3",
    ]);
    let text = problems.join("\n");
    for needle in [
        "proxy.turn_discount: must be in [0, 1], got 1.5",
        "proxy.session_timeout_seconds: must be finite and positive, got 0",
        "rollout.max_concurrent_rollouts: must be >= 1 or null, got 0",
        "rollout.policy_servers[1]: \"ftp://b\" must be an http:// or https:// URL",
        "rollout.worker_index: must be below rollout.n_workers (2), got 2",
        "checkpoint.keep_last: must be >= 1, got 0",
        "eval_every: is 3 but valid_dataset is not set",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert_eq!(problems.len(), 7, "{text}");
}

#[test]
fn policy_servers_take_the_list_xtask_submit_renders() {
    let config = crate::load_run_config_str(
        "run.yaml",
        "{}",
        &[
            "experiment_name=e".to_string(),
            "trial_name=t".to_string(),
            "rollout.policy_servers=[http://node1:30000,http://node2:30001]".to_string(),
        ],
        &Env::default(),
    )
    .unwrap();
    assert_eq!(
        config.rollout.policy_servers,
        ["http://node1:30000", "http://node2:30001"]
    );
    let empty = crate::load_run_config_str(
        "run.yaml",
        "{}",
        &[
            "experiment_name=e".to_string(),
            "trial_name=t".to_string(),
            "rollout.policy_servers=[]".to_string(),
        ],
        &Env::default(),
    )
    .unwrap();
    assert!(empty.rollout.policy_servers.is_empty());
}

#[test]
fn model_path_comes_from_model_path_and_the_admin_key_is_never_a_value() {
    let env = Env::from_pairs([
        ("MODEL_PATH", "/shared/models/m"),
        ("SWE_RL_ADMIN_API_KEY", "s3cret"),
    ]);
    let config =
        crate::load_run_config_str("run.yaml", "experiment_name: e\ntrial_name: t\n", &[], &env).unwrap();
    assert_eq!(config.model.path, "/shared/models/m");
    assert!(!config.to_redacted_yaml().unwrap().contains("s3cret"));
}

#[test]
fn actor_update_knobs_have_the_reference_defaults_and_load_from_yaml() {
    let a = ActorConfig::default();
    assert_eq!((a.eps_clip, a.eps_clip_higher, a.c_clip), (0.2, None, None));
    assert_eq!(
        (a.weight_decay, a.beta1, a.beta2, a.adam_eps),
        (0.01, 0.9, 0.999, 1e-8)
    );
    assert_eq!(
        (a.gradient_clipping, a.warmup_steps_proportion, a.min_lr_ratio),
        (1.0, 0.001, 0.0)
    );
    assert_eq!(a.lr_scheduler_type, LrSchedulerType::Constant);
    assert_eq!(
        (a.kl_estimator, a.loss_agg_mode),
        (KlEstimator::K1, LossAggMode::TokenMean)
    );
    assert!(!a.use_decoupled_loss && !a.recompute_logprob && a.behav_imp_weight_cap.is_none());
    let yaml = "experiment_name: e\ntrial_name: t\nactor:\n  c_clip: 3.0\n  kl_ctl: 0.05\n  kl_estimator: k3\n  \
                loss_agg_mode: seq-mean-token-mean\n  lr_scheduler_type: cosine\n  use_decoupled_loss: true\n  \
                behav_imp_weight_cap: 5.0\n  device: cuda:1\n  bf16_autocast: true\n";
    let c = crate::load_run_config_str("run.yaml", yaml, &[], &Env::default()).unwrap();
    assert_eq!(c.actor.c_clip, Some(3.0));
    assert_eq!(c.actor.kl_estimator, KlEstimator::K3);
    assert_eq!(c.actor.loss_agg_mode, LossAggMode::SeqMeanTokenMean);
    assert_eq!(c.actor.lr_scheduler_type, LrSchedulerType::Cosine);
    assert_eq!((c.actor.device.as_str(), c.actor.bf16_autocast), ("cuda:1", true));
}

#[test]
fn actor_update_knobs_report_every_problem_at_once() {
    let problems = loop_problems(&[
        "actor.eps_clip_higher=-0.1",
        "actor.c_clip=1.0",
        "actor.behav_imp_weight_cap=0.5",
        "actor.kl_ctl=-1",
        "actor.entropy_coeff=-0.5",
        "actor.beta2=1.0",
        "actor.adam_eps=0",
        "actor.warmup_steps_proportion=1.5",
        "actor.max_tokens_per_mb=0",
        "actor.device=tpu",
        "actor.bf16_autocast=true",
    ]);
    insta::assert_snapshot!(problems.join("\n"), @r#"
    override `actor.eps_clip_higher=-0.1`: actor.eps_clip_higher: must be finite and positive, got -0.1
    override `actor.c_clip=1.0`: actor.c_clip: must be finite and > 1, got 1
    override `actor.behav_imp_weight_cap=0.5`: actor.behav_imp_weight_cap: must be finite and > 1, got 0.5
    override `actor.behav_imp_weight_cap=0.5`: actor.behav_imp_weight_cap: needs actor.use_decoupled_loss: true
    override `actor.kl_ctl=-1`: actor.kl_ctl: must be finite and >= 0, got -1
    override `actor.entropy_coeff=-0.5`: actor.entropy_coeff: must be finite and >= 0, got -0.5
    override `actor.beta2=1.0`: actor.beta2: must be in [0, 1), got 1
    override `actor.adam_eps=0`: actor.adam_eps: must be finite and positive, got 0
    override `actor.warmup_steps_proportion=1.5`: actor.warmup_steps_proportion: must be in [0, 1], got 1.5
    override `actor.max_tokens_per_mb=0`: actor.max_tokens_per_mb: must be >= 1, got 0
    override `actor.device=tpu`: actor.device: "tpu" is not a device: expected cpu, cuda or cuda:N
    override `actor.bf16_autocast=true`: actor.bf16_autocast: needs a CUDA device (actor.device: cuda)
    "#);
}
