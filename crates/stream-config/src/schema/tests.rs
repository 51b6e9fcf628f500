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
            "metrics",
            "guard"
        ]
    );
    assert!(struct_fields::<EConfig>().contains(&"arena_idempotent_launch"));
    assert!(struct_fields::<EConfig>().contains(&"arena_cancel_tasks"));
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
    let yaml = config.to_redacted_yaml(&crate::Secrets::none()).unwrap();
    let back = crate::load_run_config_str("saved.yaml", &yaml, &[], &Env::default()).unwrap();
    // Everything but the withheld Harness environment values comes back.
    config
        .econfig
        .arena_task_envs
        .insert("K".into(), crate::REDACTED.into());
    assert_eq!(back, config);
}

#[test]
fn saved_configs_are_redacted() {
    let mut config = RunConfig::default();
    config
        .econfig
        .arena_task_envs
        .insert("OPENAI_API_KEY".into(), "sk-live".into());
    let json = config.to_redacted_json(&crate::Secrets::none()).unwrap();
    assert_eq!(json["econfig"]["arena_task_envs"]["OPENAI_API_KEY"], "<redacted>");
    assert!(
        !config
            .to_redacted_yaml(&crate::Secrets::none())
            .unwrap()
            .contains("sk-live")
    );
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

/// `arena-2026.md` 2.9: mean-only needs rollout normalisation; the usable minimum lies in 1..=n_samples.
#[test]
fn mean_only_and_usable_group_settings_are_checked() {
    let base = || RunConfig {
        experiment_name: "e".into(),
        trial_name: "t".into(),
        ..RunConfig::default()
    };
    let mut config = base();
    config.gconfig.reward_normalization_use_std = false;
    let problems: Vec<String> = config
        .problems(&Env::default())
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("gconfig.reward_normalization_use_std"),
        "{problems:?}"
    );
    config.gconfig.reward_normalization = true;
    assert!(config.problems(&Env::default()).is_empty());
    for (n, min, ok) in [(4, 4, true), (4, 1, true), (4, 0, false), (4, 5, false)] {
        let mut config = base();
        config.gconfig.n_samples = n;
        config.gconfig.min_usable_group_size = min;
        let problems: Vec<String> = config
            .problems(&Env::default())
            .iter()
            .map(|p| p.to_string())
            .collect();
        assert_eq!(problems.is_empty(), ok, "{n} {min}: {problems:?}");
        if !ok {
            assert!(
                problems[0].contains("gconfig.min_usable_group_size"),
                "{problems:?}"
            );
        }
    }
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
    assert!(
        !config.proxy.episode_reward_for_export,
        "a chain's missing reward is never inferred unless asked"
    );
    assert_eq!(config.proxy.session_timeout_seconds.get(), 3600.0);
    assert_eq!(config.proxy.admin_key_env, "SWE_RL_ADMIN_API_KEY");
    assert_eq!(config.rollout.max_head_offpolicyness, 0);
    assert_eq!(
        config.rollout.max_oversample_factor, 1.0,
        "no extra draws unless asked"
    );
    assert!(config.rollout.policy_servers.is_empty());
    assert_eq!(config.rollout.policy_server_pause_mode, "retract");
    assert_eq!(config.rollout.policy_server_ready_timeout_seconds.get(), 300.0);
    assert_eq!(config.eval_every, 0);
    assert!(loop_problems(&[]).is_empty());
}

#[test]
fn the_proxy_s_limits_default_to_its_own_and_must_be_positive() {
    let p = RunConfig::default().proxy;
    assert_eq!(p.header_read_timeout_seconds.get(), 30.0);
    assert_eq!(p.body_read_timeout_seconds.get(), 60.0);
    assert_eq!(p.idle_timeout_seconds.get(), 120.0);
    assert_eq!(p.write_timeout_seconds.get(), 60.0);
    assert_eq!(p.max_body_bytes, 32 * 1024 * 1024);
    assert_eq!(p.max_connections, 4096);
    assert_eq!(p.max_generations_per_session, 16);
    assert_eq!(p.max_response_bytes_per_session, 64 * 1024 * 1024);
    assert_eq!(p.max_response_bytes, 2 * 1024 * 1024 * 1024);
    assert_eq!((p.pool_threads, p.pool_queue), (None, 1024));
    let problems = loop_problems(&[
        "proxy.pool_threads=0",
        "proxy.max_body_bytes=0",
        "proxy.max_connections=0",
        "proxy.max_generations_per_session=0",
        "proxy.max_response_bytes_per_session=0",
        "proxy.max_response_bytes=0",
        "proxy.write_timeout_seconds=0",
    ]);
    let text = problems.join("\n");
    for key in [
        "max_body_bytes",
        "max_connections",
        "max_generations_per_session",
        "max_response_bytes_per_session",
        "max_response_bytes",
    ] {
        assert!(
            text.contains(&format!("proxy.{key}: must be >= 1, got 0")),
            "{key} in:\n{text}"
        );
    }
    assert!(
        text.contains("proxy.write_timeout_seconds: must be a positive number of seconds"),
        "{text}"
    );
    assert!(
        text.contains("proxy.pool_threads: must be >= 1 or null, got 0"),
        "{text}"
    );
    assert_eq!(problems.len(), 7, "{text}");
    assert!(loop_problems(&["proxy.pool_threads=2", "proxy.pool_queue=0"]).is_empty());
}

#[test]
fn loop_sections_report_every_problem_at_once() {
    let problems = loop_problems(&[
        "proxy.turn_discount=1.5",
        "proxy.export_style=individual",
        "proxy.episode_reward_for_export=true",
        "proxy.session_timeout_seconds=0",
        "rollout.max_concurrent_rollouts=0",
        "rollout.policy_servers=[http://a:1, ftp://b]",
        "rollout.n_workers=2",
        "rollout.worker_index=2",
        "rollout.max_oversample_factor=0.5",
        "rollout.policy_server_pause_mode=drain",
        "checkpoint.keep_last=0",
        "eval_every=3",
    ]);
    let text = problems.join("\n");
    for needle in [
        "proxy.turn_discount: must be in [0, 1], got 1.5",
        "proxy.episode_reward_for_export: needs proxy.export_style: concat",
        "proxy.session_timeout_seconds: must be a positive number of seconds, at most 1e9, got 0",
        "rollout.max_concurrent_rollouts: must be >= 1 or null, got 0",
        "rollout.policy_servers[1]: \"ftp://b\" must be an http:// or https:// URL",
        "rollout.worker_index: must be below rollout.n_workers (2), got 2",
        "rollout.max_oversample_factor: must be a number in [1, 64], got 0.5",
        "rollout.policy_server_pause_mode: must be one of abort, retract, in_place, got \"drain\"",
        "checkpoint.keep_last: must be >= 1, got 0",
        "eval_every: is 3 but valid_dataset is not set",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
    assert_eq!(problems.len(), 10, "{text}");
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
    assert!(
        !config
            .to_redacted_yaml(&config.secrets(&env))
            .unwrap()
            .contains("s3cret")
    );
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

/// Every number in the default config whose key names a duration, by dotted path.
fn duration_paths(value: &serde_json::Value, at: &str, out: &mut Vec<String>) {
    if let Some(obj) = value.as_object() {
        for (k, v) in obj {
            let path = if at.is_empty() {
                k.clone()
            } else {
                format!("{at}.{k}")
            };
            let named = k.contains("timeout") || k.contains("interval") || k.ends_with("_seconds");
            if named && v.is_number() {
                out.push(path);
            } else {
                duration_paths(v, &path, out);
            }
        }
    }
}

#[test]
fn every_duration_setting_is_one_error_naming_it_when_out_of_range() {
    let mut paths = Vec::new();
    duration_paths(
        &serde_json::to_value(RunConfig::default()).unwrap(),
        "",
        &mut paths,
    );
    // The list is found, not written down, so a new duration setting added as a plain float fails here.
    assert_eq!(
        paths,
        [
            "econfig.arena_request_timeout",
            "econfig.arena_poll_interval",
            "econfig.arena_registration_timeout",
            "econfig.arena_registration_probe_interval",
            "econfig.timeout",
            "actor.fsdp2.ready_timeout_seconds",
            "proxy.session_timeout_seconds",
            "proxy.export_wait_timeout_seconds",
            "proxy.header_read_timeout_seconds",
            "proxy.body_read_timeout_seconds",
            "proxy.idle_timeout_seconds",
            "proxy.write_timeout_seconds",
            "rollout.policy_server_ready_timeout_seconds",
            "metrics.mlflow.min_interval_seconds",
        ]
    );
    for path in &paths {
        for bad in ["0", "-1", "1e20", "1000000001", "inf", "nan"] {
            let problems = loop_problems(&[&format!("{path}={bad}")]);
            assert_eq!(problems.len(), 1, "{path}={bad}: {problems:?}");
            assert!(
                problems[0].contains(&format!(
                    "{path}: must be a positive number of seconds, at most 1e9"
                )),
                "{path}={bad}: {}",
                problems[0]
            );
        }
        let ok = crate::load_run_config_str(
            "run.yaml",
            "{}",
            &[
                "experiment_name=e".into(),
                "trial_name=t".into(),
                format!("{path}=0.25"),
            ],
            &Env::default(),
        )
        .unwrap();
        let value = serde_json::to_value(&ok).unwrap();
        let field = path.split('.').fold(&value, |v, k| &v[k]);
        let seconds: Seconds = serde_json::from_value(field.clone()).unwrap();
        assert_eq!(
            seconds.duration(),
            std::time::Duration::from_millis(250),
            "{path}"
        );
    }
}

#[test]
fn durations_keep_their_plain_number_forms() {
    let yaml = "experiment_name: e\ntrial_name: t\neconfig:\n  timeout: 1800\n  arena_poll_interval: 0.5\n";
    let env = Env::from_pairs([
        ("ARENA_RL_PROXY__SESSION_TIMEOUT_SECONDS", "90"),
        ("ARENA_RL_ECONFIG__ARENA_REQUEST_TIMEOUT", "2.5"),
    ]);
    let c = crate::load_run_config_str(
        "run.yaml",
        yaml,
        &["proxy.export_wait_timeout_seconds=7".into()],
        &env,
    )
    .unwrap();
    use std::time::Duration;
    assert_eq!(c.econfig.timeout.duration(), Duration::from_secs(1800));
    assert_eq!(
        c.econfig.arena_poll_interval.duration(),
        Duration::from_millis(500)
    );
    assert_eq!(
        c.proxy.session_timeout_seconds.duration(),
        Duration::from_secs(90)
    );
    assert_eq!(
        c.econfig.arena_request_timeout.duration(),
        Duration::from_millis(2500)
    );
    assert_eq!(
        c.proxy.export_wait_timeout_seconds.duration(),
        Duration::from_secs(7)
    );
    // The reference's own variable still sets the episode deadline.
    let env = Env::from_pairs([("ARENA_TASK_WAIT_TIMEOUT", "7200")]);
    let c = crate::load_run_config_str("run.yaml", "experiment_name: e\ntrial_name: t\n", &[], &env).unwrap();
    assert_eq!(c.econfig.timeout.duration(), Duration::from_secs(7200));
    // Saved as plain numbers.
    assert_eq!(
        c.to_redacted_json(&crate::Secrets::none()).unwrap()["econfig"]["timeout"],
        7200.0
    );
    // YAML's own infinity is one validation problem too.
    let e = crate::load_run_config_str(
        "run.yaml",
        "experiment_name: e\ntrial_name: t\neconfig:\n  timeout: .inf\n",
        &[],
        &Env::default(),
    )
    .unwrap_err();
    let problems = e.problems();
    assert_eq!(problems.len(), 1, "{e}");
    assert_eq!(problems[0].path, "econfig.timeout");
}

#[test]
fn seconds_never_panic_and_accept_only_what_validation_accepts() {
    use std::time::Duration;
    assert_eq!(
        Seconds::new(1.5).map(Seconds::duration),
        Some(Duration::from_millis(1500))
    );
    assert_eq!(Seconds::new(Seconds::MAX).map(Seconds::get), Some(1e9));
    for bad in [0.0, -1.0, 1e20, f64::INFINITY, f64::NAN, Seconds::MAX * 1.000_001] {
        assert!(Seconds::new(bad).is_none(), "{bad}");
    }
    // A value that never passed validation still converts without a panic.
    for (raw, expected) in [
        (1e20, Duration::from_secs(1_000_000_000)),
        (f64::INFINITY, Duration::from_secs(1_000_000_000)),
        (-5.0, Duration::ZERO),
        (f64::NAN, Duration::ZERO),
    ] {
        assert_eq!(Seconds::of(raw).duration(), expected, "{raw}");
    }
}

#[test]
fn run_names_stay_one_directory_under_the_fileroot() {
    for field in ["experiment_name", "trial_name"] {
        for bad in ["..", ".", "a/b", "/abs", "../up", "a\\b"] {
            let problems = loop_problems(&[&format!("{field}={bad}")]);
            assert_eq!(problems.len(), 1, "{field}={bad}: {problems:?}");
            assert!(
                problems[0].contains(&format!("{field}: ")) && problems[0].contains("one directory name"),
                "{field}={bad}: {}",
                problems[0]
            );
        }
        for good in ["run-1", "v1.2", "..x", "a b"] {
            assert_eq!(
                loop_problems(&[&format!("{field}={good}")]),
                Vec::<String>::new(),
                "{good}"
            );
        }
    }
    // NUL cannot be written in an override; set it directly.
    let config = RunConfig {
        experiment_name: "e\0x".into(),
        trial_name: "t".into(),
        ..RunConfig::default()
    };
    let problems = config.problems(&Env::default());
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].path, "experiment_name");
}

#[test]
fn a_jsonl_dataset_source_is_refused() {
    let problems = loop_problems(&["econfig.dataset_source=jsonl"]);
    assert_eq!(
        problems,
        [
            "override `econfig.dataset_source=jsonl`: econfig.dataset_source: jsonl is not supported: every launch needs an Arena Stream, so prompts come only from `arena`"
        ]
    );
}

#[test]
fn top_k_and_harness_sampling_parse_and_validate() {
    let g = GenerationConfig::default();
    assert_eq!((g.top_k, g.top_k_limit()), (None, None));
    assert_eq!(g.harness_sampling, HarnessSampling::Honour);
    let load = |overrides: &[&str]| {
        let mut all = vec!["experiment_name=e".to_string(), "trial_name=t".to_string()];
        all.extend(overrides.iter().map(|o| (*o).to_string()));
        crate::load_run_config_str("run.yaml", "{}", &all, &Env::default()).map(|c| c.gconfig)
    };
    let g = load(&["gconfig.top_k=50", "gconfig.harness_sampling=override"]).unwrap();
    assert_eq!((g.top_k, g.top_k_limit()), (Some(50), Some(50)));
    assert_eq!(g.harness_sampling, HarnessSampling::Override);
    let g = load(&["gconfig.top_k=-1"]).unwrap();
    assert_eq!(g.top_k_limit(), None, "-1 is SGLang's spelling of no top-k");
    assert_eq!(load(&["gconfig.top_k=1"]).unwrap().top_k_limit(), Some(1));
    for bad in ["0", "-2", "4294967296"] {
        let problems = loop_problems(&[&format!("gconfig.top_k={bad}")]);
        assert_eq!(problems.len(), 1, "{bad}: {problems:?}");
        assert!(
            problems[0].ends_with(&format!(
                "gconfig.top_k: must be >= 1 (at most 4294967295), or -1 or null for no top-k, got {bad}"
            )),
            "{}",
            problems[0]
        );
    }
    let e = load(&["gconfig.harness_sampling=ignore"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("gconfig.harness_sampling: unknown variant"), "{e}");
}

#[test]
fn temperature_and_top_p_refuse_what_sampling_cannot_use() {
    assert_eq!(
        loop_problems(&["gconfig.temperature=0", "gconfig.top_p=1"]),
        Vec::<String>::new()
    );
    for (over, needle) in [
        (
            "gconfig.temperature=-0.1",
            "gconfig.temperature: must be finite and >= 0, got -0.1",
        ),
        (
            "gconfig.temperature=inf",
            "gconfig.temperature: must be finite and >= 0, got inf",
        ),
        (
            "gconfig.temperature=nan",
            "gconfig.temperature: must be finite and >= 0, got NaN",
        ),
        ("gconfig.top_p=0", "gconfig.top_p: must be in (0, 1], got 0"),
        ("gconfig.top_p=1.01", "gconfig.top_p: must be in (0, 1], got 1.01"),
        ("gconfig.top_p=nan", "gconfig.top_p: must be in (0, 1], got NaN"),
    ] {
        let problems = loop_problems(&[over]);
        assert_eq!(problems.len(), 1, "{over}: {problems:?}");
        assert!(problems[0].ends_with(needle), "{over}: {}", problems[0]);
    }
}

#[test]
fn model_kv_cache_bytes_defaults_to_8_gib_and_refuses_less_than_1_mib() {
    assert_eq!(RunConfig::default().model.kv_cache_bytes, 8 << 30);
    assert_eq!(
        loop_problems(&["model.kv_cache_bytes=4096"]),
        ["override `model.kv_cache_bytes=4096`: model.kv_cache_bytes: must be >= 1048576 (1 MiB), got 4096"]
    );
    assert!(loop_problems(&["model.kv_cache_bytes=1048576"]).is_empty());
}

#[test]
fn model_dtype_defaults_to_f32_and_bf16_needs_a_cuda_device() {
    let problems = loop_problems(&["model.dtype=fp16"]);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("model.dtype") && p.contains("\"fp16\" is not a dtype: expected f32 or bf16")),
        "{problems:?}"
    );
    let problems = loop_problems(&["model.dtype=bf16"]);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("model.dtype") && p.contains("bf16 needs a CUDA device")),
        "{problems:?}"
    );
    let problems = loop_problems(&["model.dtype=bf16", "model.device=cuda:1"]);
    assert!(
        !problems.iter().any(|p| p.contains("model.dtype")),
        "{problems:?}"
    );
}

#[test]
fn model_device_defaults_to_the_cpu_and_names_a_bad_value() {
    let c = crate::load_run_config_str(
        "run.yaml",
        "experiment_name: e\ntrial_name: t\n",
        &[],
        &Env::default(),
    )
    .unwrap();
    assert_eq!(c.model.device, "cpu");
    let c = crate::load_run_config_str(
        "run.yaml",
        "experiment_name: e\ntrial_name: t\n",
        &["model.device=cuda:2".to_string()],
        &Env::default(),
    )
    .unwrap();
    assert_eq!(c.model.device, "cuda:2");
    let problems = loop_problems(&["model.device=gpu0", "actor.device=cuda:"]);
    assert!(
        problems
            .iter()
            .any(|p| p.contains("model.device") && p.contains("\"gpu0\" is not a device")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("actor.device")),
        "{problems:?}"
    );
}

/// `valid_dataset.streams` holds configured streams out for evaluation: each must be configured, named once,
/// and leave a stream to train on; `train_dataset.streams` is refused.
#[test]
fn held_out_eval_streams_must_be_configured_and_leave_one_to_train_on() {
    let problems = |extra: &str| -> Vec<String> {
        let yaml = format!(
            "experiment_name: e\ntrial_name: t\neconfig:\n  dataset_source: arena\n  arena_streams:\n    \
             - {{name: train, stream_id: s1}}\n    - {{name: held, stream_id: s2}}\n{extra}"
        );
        match crate::load_run_config_str("run.yaml", &yaml, &[], &Env::default()) {
            Ok(config) => {
                assert!(
                    config
                        .valid_dataset
                        .is_none_or(|v| v.streams.iter().all(|s| s == "held")),
                    "loaded what it should refuse"
                );
                Vec::new()
            }
            Err(e) => e.problems().iter().map(ToString::to_string).collect(),
        }
    };
    assert!(problems("valid_dataset: {batch_size: 2, streams: [held]}\n").is_empty());
    let unknown = problems("valid_dataset: {streams: [nope]}\n");
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    assert!(
        unknown[0].contains("valid_dataset.streams")
            && unknown[0].contains("\"nope\" is not a configured stream (the streams are train, held)"),
        "{unknown:?}"
    );
    let all = problems("valid_dataset: {streams: [held, train]}\n");
    assert!(
        all.len() == 1 && all[0].contains("leaves none to train on"),
        "{all:?}"
    );
    let twice = problems("valid_dataset: {streams: [held, held]}\n");
    assert!(
        twice.len() == 1 && twice[0].contains("names \"held\" twice"),
        "{twice:?}"
    );
    let train = problems("train_dataset: {streams: [held]}\n");
    assert!(
        train.len() == 1
            && train[0].contains("train_dataset.streams")
            && train[0].contains("valid_dataset only"),
        "{train:?}"
    );
}

/// Issue 30 item 8: before, the saved config held the values of `arena_task_envs` entries whose names were not
/// credentials (`AWS_SECRET_ACCESS_KEY`, `GITHUB_PAT`), the whole base64 Stream list with the credentials in
/// it, and any secret interpolated into another field; now none of them appear, and the rest still loads.
#[test]
fn saved_configs_withhold_secrets_by_place_and_by_value() {
    use base64::Engine as _;
    let streams =
        "streams:\n  - name: s\n    stream_id: st-1\n    task_envs: {GITHUB_PAT: ghp_streamsecret123}\n";
    let b64 = base64::engine::general_purpose::STANDARD.encode(streams);
    let env = Env::from_pairs([
        ("ARENA_OPENAPI_TOKEN", "tok-openapi-0123456789"),
        ("ARENA_LLM_API_KEY", "llm-key-0123456789"),
        ("MY_ADMIN", "admin-0123456789"),
        ("HF_TOKEN", "hf_0123456789"),
        ("HOME", "/home/someone"),
    ]);
    let yaml = format!(
        "experiment_name: e\ntrial_name: t-${{env:ARENA_LLM_API_KEY}}\nproxy:\n  admin_key_env: MY_ADMIN\n\
         model:\n  path: /m/${{env:HF_TOKEN}}/${{env:MY_ADMIN}}\n\
         econfig:\n  arena_streams_yaml_b64: {b64}\n  arena_task_envs:\n    AWS_SECRET_ACCESS_KEY: aws-secret-0123456789\n\
         \x20   GITHUB_PAT: ghp_0123456789\n    TRACE: '1'\n    EMPTY: ''\n"
    );
    let config = crate::load_run_config_str("run.yaml", &yaml, &[], &env).unwrap();
    let secrets = config.secrets(&env);
    assert_eq!(
        secrets.len(),
        4,
        "the token, the LLM key, the configured admin key and HF_TOKEN; not HOME"
    );
    let saved = config.to_redacted_yaml(&secrets).unwrap();
    for secret in [
        "aws-secret-0123456789",
        "ghp_0123456789",
        "ghp_streamsecret123",
        "llm-key-0123456789",
        "hf_0123456789",
        "admin-0123456789",
        b64.as_str(),
    ] {
        assert!(!saved.contains(secret), "{secret} in the saved config:\n{saved}");
    }
    let back = crate::load_run_config_str("saved.yaml", &saved, &[], &Env::default()).unwrap();
    assert_eq!(back.trial_name, "t-<redacted>");
    assert_eq!(back.model.path, "/m/<redacted>/<redacted>");
    assert_eq!(back.econfig.arena_task_envs["TRACE"], "<redacted>");
    assert_eq!(back.econfig.arena_task_envs["EMPTY"], "", "unset stays unset");
    let streams = crate::load_stream_configs_with_env(&back.econfig, &Env::default()).unwrap();
    assert_eq!(
        streams[0].stream_id, "st-1",
        "the Stream list is still there, its credentials withheld"
    );
    assert_eq!(streams[0].task_envs["GITHUB_PAT"], "<redacted>");
}

fn yaml_problems(yaml: &str, env: &Env) -> Vec<String> {
    let all = ["experiment_name=e".to_string(), "trial_name=t".to_string()];
    match crate::load_run_config_str("run.yaml", yaml, &all, env) {
        Ok(_) => Vec::new(),
        Err(e) => e.problems().iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn trackers_load_from_yaml_and_report_every_problem_without_credentials() {
    let ok = "metrics:\n  trackers: [wandb, mlflow]\n  wandb: {project: p, tags: [a], mode: offline}\n  mlflow: {tracking_uri: 'http://127.0.0.1:5000', tags: {team: rl}}\n";
    assert_eq!(yaml_problems(ok, &Env::default()), Vec::<String>::new());
    let config = crate::load_run_config_str(
        "run.yaml",
        ok,
        &["experiment_name=e".into(), "trial_name=t".into()],
        &Env::default(),
    )
    .expect("valid");
    assert_eq!(config.metrics.trackers, [Tracker::Wandb, Tracker::Mlflow]);
    assert_eq!(config.metrics.wandb.mode, Some(WandbMode::Offline));
    // The URI may come from the environment instead.
    let env = Env::from_pairs([("MLFLOW_TRACKING_URI", "https://mlflow.example")]);
    assert_eq!(
        yaml_problems("metrics: {trackers: [mlflow]}", &env),
        Vec::<String>::new()
    );

    let bad = "metrics:\n  trackers: [wandb, wandb, mlflow]\n  wandb: {project: 'a/b', tags: [''], queue: 0}\n  mlflow: {tracking_uri: 'https://user:hunter2-password@mlflow.example', queue: 0}\n";
    let problems = yaml_problems(bad, &Env::default());
    assert!(!problems.join("\n").contains("hunter2"), "{problems:?}");
    insta::assert_snapshot!(problems.join("\n"), @r#"
    run.yaml:2:3: metrics.trackers: lists "wandb" twice
    run.yaml:3:11: metrics.wandb.project: "a/b" must not contain / \ # ? % or :
    run.yaml:3:27: metrics.wandb.tags: tag 0 must be 1 to 64 characters, got ""
    run.yaml:3:39: metrics.wandb.queue: must be >= 1, got 0
    run.yaml:4:74: metrics.mlflow.queue: must be >= 1, got 0
    run.yaml:4:12: metrics.mlflow.tracking_uri: must not hold a user or password: set MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD
    "#);
    // null sends MLflow every step (the range of a number is checked with every duration setting's).
    assert_eq!(
        yaml_problems("metrics: {mlflow: {min_interval_seconds: null}}", &Env::default()),
        Vec::<String>::new()
    );
    let env = Env::from_pairs([("WANDB_MODE", "sometimes")]);
    insta::assert_snapshot!(yaml_problems("metrics: {trackers: [mlflow, wandb]}", &env).join("\n"), @r#"
    run.yaml:1:1: metrics.wandb.mode: is unset and WANDB_MODE is "sometimes"; set metrics.wandb.mode to online or offline
    run.yaml:1:1: metrics.mlflow.tracking_uri: is required when metrics.trackers lists mlflow (or set MLFLOW_TRACKING_URI)
    "#);
    insta::assert_snapshot!(yaml_problems("metrics: {trackers: [comet]}", &Env::default()).join("\n"), @r#"
    run.yaml:1:22: metrics.trackers[0]: unknown variant: found `comet`, expected ``wandb` or `mlflow``
    "#);
}

#[test]
fn the_fsdp2_backend_refuses_what_it_cannot_honour_by_name() {
    let c = crate::load_run_config_str(
        "run.yaml",
        "experiment_name: e\ntrial_name: t\n",
        &[],
        &Env::default(),
    )
    .unwrap();
    assert_eq!(
        c.actor.backend,
        crate::TrainerBackend::Burn,
        "burn is the default"
    );
    assert!(
        loop_problems(&["actor.device=cuda:1"]).is_empty(),
        "burn trains on any one device"
    );
    let problems = loop_problems(&[
        "actor.backend=fsdp2",
        "actor.device=cuda:1",
        "actor.fsdp2.nproc_per_node=0",
        "actor.fsdp2.logprob_chunk_tokens=0",
        "actor.fsdp2.attach=nowhere",
    ]);
    insta::assert_snapshot!(problems.join("\n"), @r#"
    override `actor.device=cuda:1`: actor.device: backend fsdp2 trains on every GPU of actor.fsdp2.nproc_per_node, not on cuda:1 alone (use device: cuda)
    override `actor.fsdp2.nproc_per_node=0`: actor.fsdp2.nproc_per_node: must be >= 1, got 0
    override `actor.fsdp2.logprob_chunk_tokens=0`: actor.fsdp2.logprob_chunk_tokens: must be >= 1, got 0
    override `actor.fsdp2.attach=nowhere`: actor.fsdp2.attach: must be HOST:PORT, got "nowhere"
    "#);
}

#[test]
fn the_gpus_a_run_names_are_among_its_nodes() {
    // The defaults (8 GPUs a node) take any of the first eight, and a CPU run on a GPU node.
    assert!(loop_problems(&["actor.device=cuda:7", "model.device=cuda"]).is_empty());
    assert!(loop_problems(&["cluster.n_gpus_per_node=0"]).is_empty());
    assert_eq!(
        loop_problems(&["cluster.n_gpus_per_node=0", "actor.device=cuda"]),
        [
            r#"override `actor.device=cuda`: actor.device: "cuda" is not one of the node's GPUs: cluster.n_gpus_per_node is 0 (use cpu)"#
        ]
    );
    assert_eq!(
        loop_problems(&["cluster.n_gpus_per_node=2", "model.device=cuda:2"]),
        [
            r#"override `model.device=cuda:2`: model.device: "cuda:2" is not one of the node's GPUs: cluster.n_gpus_per_node is 2"#
        ]
    );
    // FSDP2 on GPUs runs one rank a GPU; on the CPU any number of ranks share it.
    let fsdp2 = |device: &str, ranks: &str| {
        loop_problems(&[
            "cluster.n_gpus_per_node=4",
            "actor.backend=fsdp2",
            &format!("actor.device={device}"),
            &format!("actor.fsdp2.nproc_per_node={ranks}"),
        ])
    };
    assert!(fsdp2("cuda", "4").is_empty());
    assert!(fsdp2("cpu", "8").is_empty());
    let problems = fsdp2("cuda", "8");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].ends_with("actor.fsdp2.nproc_per_node: 8 ranks of one GPU each do not fit the node's 4 GPUs (cluster.n_gpus_per_node)"),
        "{problems:?}"
    );
}
