//! Run-config loading: `extends:`, environment, overrides, interpolation, and where errors point.

use std::path::{Path, PathBuf};

use super::*;
use crate::{DatasetSource, RouteMode};

struct Dir(tempfile::TempDir);

impl Dir {
    fn new(files: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        Self(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    /// An error message with the temporary directory replaced by `<dir>`.
    fn err(&self, r: Result<RunConfig>) -> String {
        r.expect_err("config should be rejected")
            .to_string()
            .replace(&self.0.path().display().to_string(), "<dir>")
    }
}

fn no_env() -> Env {
    Env::from_pairs::<&str, &str>([])
}

fn load(path: &Path, overrides: &[&str], env: &Env) -> Result<RunConfig> {
    let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    load_run_config(path, &overrides, env)
}

const NAMES: &str = "experiment_name: exp\ntrial_name: t1\n";

#[test]
fn defaults_follow_the_reference() {
    let dir = Dir::new(&[("c.yaml", NAMES)]);
    let c = load(&dir.path("c.yaml"), &[], &no_env()).unwrap();
    let e = &c.econfig;
    assert_eq!(e.dataset_source, DatasetSource::Arena);
    assert_eq!(e.arena_mixture_epoch_size, 0);
    assert_eq!(e.arena_result_dump_max_bytes, 1_000_000);
    assert_eq!(
        (
            e.arena_request_timeout.get(),
            e.arena_request_retries,
            e.arena_poll_interval.get()
        ),
        (60.0, 3, 5.0)
    );
    assert_eq!(
        (
            e.arena_registration_timeout.get(),
            e.arena_registration_probe_interval.get(),
            e.timeout.get()
        ),
        (180.0, 60.0, 1800.0)
    );
    assert_eq!(e.arena_llm_route_mode, RouteMode::Gateway);
    assert_eq!(e.arena_inbound_protos, ["chat"]);
    assert!(!e.arena_idempotent_launch);
    assert!(!e.arena_cancel_tasks);
    assert_eq!(e.arena_reward_threshold, None);
    assert_eq!((c.gconfig.n_samples, c.gconfig.max_new_tokens), (1, 16384));
    assert_eq!((c.gconfig.temperature, c.gconfig.top_p), (1.0, 1.0));
    assert_eq!((c.actor.lr, c.actor.eps_clip), (1e-3, 0.2));
    assert_eq!(c.actor.reward_norm, None);
    assert_eq!(
        (
            c.train_dataset.batch_size,
            c.train_dataset.shuffle,
            c.train_dataset.drop_last
        ),
        (1, true, true)
    );
    assert_eq!((c.cluster.n_nodes, c.cluster.n_gpus_per_node), (32, 8));
    assert_eq!(c.valid_dataset, None);
}

#[test]
fn extends_merges_depth_first_and_later_keys_win() {
    let dir = Dir::new(&[
        (
            "base.yaml",
            "experiment_name: base\ntrial_name: t\ncluster: {n_nodes: 4, n_gpus_per_node: 2}\necontig_unused: null\n",
        ),
        (
            "mid.yaml",
            "extends: base.yaml\ncluster: {n_nodes: 8}\ngconfig: {n_samples: 4}\n",
        ),
        ("other.yaml", "gconfig: {n_samples: 6, temperature: 0.5}\n"),
        (
            "top.yaml",
            "extends: [mid.yaml, other.yaml]\nexperiment_name: top\n",
        ),
    ]);
    // `econtig_unused` is a typo the schema must catch, naming the base file it came from.
    let err = dir.err(load(&dir.path("top.yaml"), &[], &no_env()));
    insta::assert_snapshot!(err, @"<dir>/base.yaml:4:1: econtig_unused: unknown field: found `econtig_unused`, expected `one of `experiment_name`, `trial_name`, `cluster`, `econfig`, `gconfig`, `actor`, `train_dataset`, `valid_dataset`, `eval_every`, `proxy`, `rollout`, `model`, `checkpoint`, `metrics`, `guard``");

    std::fs::write(
        dir.path("base.yaml"),
        "experiment_name: base\ntrial_name: t\ncluster: {n_nodes: 4, n_gpus_per_node: 2}\n",
    )
    .unwrap();
    let c = load(&dir.path("top.yaml"), &[], &no_env()).unwrap();
    assert_eq!(c.experiment_name, "top");
    assert_eq!(c.trial_name, "t");
    assert_eq!((c.cluster.n_nodes, c.cluster.n_gpus_per_node), (8, 2));
    assert_eq!((c.gconfig.n_samples, c.gconfig.temperature), (6, 0.5));
}

#[test]
fn extends_cycles_are_an_error() {
    let dir = Dir::new(&[
        ("a.yaml", "extends: b.yaml\n"),
        ("b.yaml", "extends: [c.yaml]\n"),
        ("c.yaml", "extends: a.yaml\n"),
    ]);
    let err = dir.err(load(&dir.path("a.yaml"), &[], &no_env()));
    assert!(err.starts_with("`extends:` cycle: "), "{err}");
    assert!(err.ends_with("a.yaml"), "{err}");
    assert!(err.contains("b.yaml -> ") && err.contains("c.yaml -> "), "{err}");
    let dir = Dir::new(&[("a.yaml", "extends: missing.yaml\n")]);
    let err = dir.err(load(&dir.path("a.yaml"), &[], &no_env()));
    assert!(err.starts_with("<dir>/missing.yaml: cannot read:"), "{err}");
}

#[test]
fn environment_then_overrides_win_over_files() {
    let dir = Dir::new(&[(
        "c.yaml",
        "experiment_name: exp\ntrial_name: t\neconfig:\n  arena_base_url: http://from-file\n  arena_mixture_epoch_size: 4\ntrain_dataset: {batch_size: 2}\n",
    )]);
    let env = Env::from_pairs([
        ("ARENA_OPENAPI_BASE", "http://from-reference-var"),
        ("ARENA_RL_ECONFIG__ARENA_MIXTURE_EPOCH_SIZE", "8"),
        ("ARENA_RL_CLUSTER__N_NODES", "3"),
        ("ARENA_RL_TRIAL_NAME", "123"),
        ("ARENA_RL_ECONFIG__ARENA_TASK_ENVS", "{A: x, B: 'y z'}"),
        // Fixture variables share the prefix and must be left alone.
        ("ARENA_RL_CACHE", "/tmp/cache"),
        ("ARENA_RL_SMOLLM2", "/tmp/model"),
        ("ARENA_STREAM_ID", "legacy-stream"),
    ]);
    let c = load(&dir.path("c.yaml"), &[], &env).unwrap();
    assert_eq!(c.econfig.arena_base_url, "http://from-reference-var");
    assert_eq!(c.econfig.arena_mixture_epoch_size, 8);
    assert_eq!(c.cluster.n_nodes, 3);
    assert_eq!(c.trial_name, "123", "a string field keeps digits as text");
    assert_eq!(c.econfig.stream_id, "legacy-stream");
    assert_eq!(
        c.econfig.arena_task_envs.get("B").map(String::as_str),
        Some("y z")
    );

    let mut env = env;
    env.set("ARENA_RL_ECONFIG__ARENA_BASE_URL", "http://from-prefixed-var");
    let c = load(
        &dir.path("c.yaml"),
        &[
            "econfig.arena_mixture_epoch_size=12",
            "cluster.n_nodes=2",
            "econfig.arena_inbound_protos=[chat, responses]",
            "econfig.arena_llm_route_mode=session_gateway",
            "econfig.arena_reward_threshold=0.9",
            "gconfig.reward_normalization=true",
            "valid_dataset={batch_size: 4, shuffle: false}",
        ],
        &env,
    )
    .unwrap();
    assert_eq!(c.econfig.arena_base_url, "http://from-prefixed-var");
    assert_eq!(c.econfig.arena_mixture_epoch_size, 12);
    assert_eq!(c.cluster.n_nodes, 2);
    assert_eq!(c.econfig.arena_inbound_protos, ["chat", "responses"]);
    assert_eq!(c.econfig.arena_llm_route_mode, RouteMode::SessionGateway);
    assert_eq!(c.econfig.arena_reward_threshold, Some(0.9));
    assert!(c.gconfig.reward_normalization);
    let valid = c.valid_dataset.unwrap();
    assert_eq!(
        (valid.batch_size, valid.shuffle, valid.drop_last),
        (4, false, true)
    );
}

#[test]
fn interpolation_resolves_env_and_keys_after_merging() {
    let dir = Dir::new(&[(
        "c.yaml",
        concat!(
            "experiment_name: exp\n",
            "trial_name: ${env:TRIAL,trial-default}\n",
            "cluster:\n  fileroot: ${env:ROOT}\n",
            "econfig:\n",
            "  arena_result_dump_dir: ${cluster.fileroot}/${experiment_name}/${trial_name}/arena_results\n",
            "  timeout: ${gconfig.max_new_tokens}\n",
            "  arena_task_envs:\n    LITERAL: \\${not.a.ref}\n    EMPTY: ${env:UNSET,}\n",
            "  arena_inbound_protos: ${train_dataset.protos}\n",
            "gconfig: {max_new_tokens: 900}\n",
        ),
    )]);
    let env = Env::from_pairs([("ROOT", "/data")]);
    // `train_dataset.protos` does not exist: the error names the key holding the reference.
    let err = dir.err(load(&dir.path("c.yaml"), &[], &env));
    insta::assert_snapshot!(err, @"<dir>/c.yaml:11:3: econfig.arena_inbound_protos: ${train_dataset.protos} refers to the unknown key train_dataset.protos");

    let c = load(
        &dir.path("c.yaml"),
        &[
            "econfig.arena_inbound_protos=${econfig.extra}",
            "econfig.extra=[chat]",
            "cluster.fileroot=/override",
        ],
        &env,
    );
    // An override may add a key only if the schema knows it.
    let err = dir.err(c);
    assert!(err.contains("econfig.extra: unknown field"), "{err}");
    assert!(err.starts_with("override `econfig.extra=[chat]`"), "{err}");

    let c = load(
        &dir.path("c.yaml"),
        &["econfig.arena_inbound_protos=[chat, '${experiment_name}']"],
        &env,
    )
    .unwrap();
    assert_eq!(c.trial_name, "trial-default");
    assert_eq!(c.cluster.fileroot, "/data");
    assert_eq!(
        c.econfig.arena_result_dump_dir,
        "/data/exp/trial-default/arena_results"
    );
    assert_eq!(
        c.econfig.timeout.get(),
        900.0,
        "a whole-string reference keeps its type"
    );
    assert_eq!(c.econfig.arena_task_envs["LITERAL"], "${not.a.ref}");
    assert_eq!(c.econfig.arena_task_envs["EMPTY"], "");
    assert_eq!(c.econfig.arena_inbound_protos, ["chat", "exp"]);
}

#[test]
fn interpolation_errors_name_the_key_path() {
    let dir = Dir::new(&[(
        "c.yaml",
        "experiment_name: ${trial_name}\ntrial_name: ${experiment_name}\ncluster:\n  fileroot: ${env:NOPE}\n  n_nodes: ${gconfig}x\neconfig: {arena_harness: '${unterminated'}\n",
    )]);
    let err = dir.err(load(&dir.path("c.yaml"), &[], &no_env()));
    insta::assert_snapshot!(err.replace("; (", ";\n("));
}

#[test]
fn syntax_and_type_errors_name_file_line_and_key_path() {
    let dir = Dir::new(&[
        ("syntax.yaml", "experiment_name: exp\necontig:\n  a: [1, 2\n"),
        (
            "type.yaml",
            "experiment_name: exp\ntrial_name: t\neconfig:\n  arena_request_retries: many\n",
        ),
        (
            "nested.yaml",
            "experiment_name: exp\ntrial_name: t\neconfig:\n  arena_streams:\n    - name: a\n      stream_id: s\n  arena_llm_route_mode: tunnel\n",
        ),
        (
            "unknown.yaml",
            "experiment_name: exp\ntrial_name: t\ngconfig:\n  n_samples: 2\n  topp: 0.9\n",
        ),
        ("list.yaml", "- a\n- b\n"),
        (
            "secret.yaml",
            "experiment_name: exp\ntrial_name: t\neconfig:\n  arena_task_envs:\n    MY_API_KEY: [sk-very-secret]\n",
        ),
    ]);
    let err = |name: &str| dir.err(load(&dir.path(name), &[], &no_env()));
    insta::assert_snapshot!(err("syntax.yaml"), @"<dir>/syntax.yaml:3:6: unclosed bracket '[' at line 3, column 6 (near key econtig.a)");
    insta::assert_snapshot!(err("type.yaml"), @r#"<dir>/type.yaml:4:3: econfig.arena_request_retries: invalid type: found string "many", expected u32"#);
    insta::assert_snapshot!(err("nested.yaml"), @"<dir>/nested.yaml:7:3: econfig.arena_llm_route_mode: unknown variant: found `tunnel`, expected `one of `gateway`, `session_gateway`, `direct``");
    insta::assert_snapshot!(err("unknown.yaml"), @"<dir>/unknown.yaml:5:3: gconfig.topp: unknown field: found `topp`, expected `one of `n_samples`, `max_new_tokens`, `temperature`, `top_p`, `top_k`, `harness_sampling`, `reward_normalization`, `drop_incomplete_group`, `reward_normalization_use_std`, `min_usable_group_size`, `reject_terminal_task_failures``");
    insta::assert_snapshot!(err("list.yaml"), @"<dir>/list.yaml: a run config must be a mapping, got a list");
    let secret = err("secret.yaml");
    assert!(!secret.contains("sk-very-secret"), "{secret}");
    insta::assert_snapshot!(secret, @"<dir>/secret.yaml:5:5: econfig.arena_task_envs.MY_API_KEY: invalid value (not shown: the field may hold a secret)");

    let e = load(&dir.path("unknown.yaml"), &["gconfig.topp=0.5"], &no_env())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("override `gconfig.topp=0.5`: gconfig.topp: unknown field"),
        "{e}"
    );
    let env = Env::from_pairs([("ARENA_RL_GCONFIG__N_SAMPLES", "lots")]);
    let dir2 = Dir::new(&[("ok.yaml", NAMES)]);
    let e = dir2.err(load(&dir2.path("ok.yaml"), &[], &env));
    insta::assert_snapshot!(e, @r#"environment variable ARENA_RL_GCONFIG__N_SAMPLES: gconfig.n_samples: invalid type: found string "lots", expected u32"#);
    let e = dir2.err(load(&dir2.path("ok.yaml"), &["gconfig.n_samples=[1"], &no_env()));
    assert!(
        e.starts_with("override `gconfig.n_samples=[1`: not a YAML flow value"),
        "{e}"
    );
    let e = dir2.err(load(&dir2.path("ok.yaml"), &["gconfig"], &no_env()));
    insta::assert_snapshot!(e, @r#"override "gconfig" must look like section.field=value"#);
}

#[test]
fn five_validation_mistakes_are_reported_at_once() {
    let dir = Dir::new(&[(
        "c.yaml",
        concat!(
            "experiment_name: exp\n",
            "trial_name: t\n",
            "train_dataset: {batch_size: 4}\n",
            "gconfig: {top_p: 1.5}\n",
            "econfig:\n",
            "  arena_mixture_epoch_size: 10\n",
            "  arena_registration_probe_interval: 0\n",
            "  arena_streams:\n",
            "    - name: a/b\n",
            "      stream_id: s1\n",
            "    - name: ok\n",
            "      stream_id: s2\n",
            "      sampling_weight: -1\n",
        ),
    )]);
    let err = dir.err(load(&dir.path("c.yaml"), &[], &no_env()));
    insta::assert_snapshot!(err.replace("; (", ";\n("));
    assert!(err.starts_with("5 problems: "), "{err}");
}

#[test]
fn legacy_string_threshold_is_accepted() {
    // Spec 8.2 item 18: the legacy single stream keeps its stream id, and "0.98" is a number.
    let dir = Dir::new(&[(
        "c.yaml",
        "experiment_name: exp\ntrial_name: t\neconfig:\n  stream_id: legacy\n  arena_reward_threshold: \"0.98\"\n",
    )]);
    let c = load(&dir.path("c.yaml"), &[], &no_env()).unwrap();
    assert_eq!(c.econfig.arena_reward_threshold, Some(0.98));
    let streams = crate::load_stream_configs_with_env(&c.econfig, &no_env()).unwrap();
    assert_eq!(streams.len(), 1);
    assert_eq!(
        (streams[0].name.as_str(), streams[0].stream_id.as_str()),
        ("default", "legacy")
    );
    assert_eq!(streams[0].reward_threshold, Some(0.98));
    let err = dir.err(load(
        &dir.path("c.yaml"),
        &["econfig.arena_reward_threshold=high"],
        &no_env(),
    ));
    assert!(err.contains("econfig.arena_reward_threshold"), "{err}");
}

#[test]
fn embedded_text_loads_without_extends() {
    let c = load_run_config_str("inline.yaml", NAMES, &["trial_name=t2".into()], &no_env()).unwrap();
    assert_eq!(c.trial_name, "t2");
    let err = load_run_config_str("inline.yaml", "extends: base.yaml\n", &[], &no_env())
        .unwrap_err()
        .to_string();
    assert!(err.contains("`extends:` is not supported"), "{err}");
}

// The loader takes text from outside (a user's file, `--set` overrides, the environment): whatever it is
// given, it answers a config or an error, never a panic. Inputs are bounded in size; the properties run
// to completion however long each case takes.
mod arbitrary_input {
    use proptest::prelude::*;
    use proptest::sample::Index;

    use super::*;

    /// The example configs, each mutated in turn; `extends:` resolves against an unmutated `base.yaml`.
    const EXAMPLES: [(&str, &str); 8] = [
        (
            "base.yaml",
            include_str!("../../../../examples/configs/base.yaml"),
        ),
        (
            "flash_v3.yaml",
            include_str!("../../../../examples/configs/flash_v3.yaml"),
        ),
        (
            "flash_v3_streams.yaml",
            include_str!("../../../../examples/configs/flash_v3_streams.yaml"),
        ),
        (
            "grpo.yaml",
            include_str!("../../../../examples/configs/grpo.yaml"),
        ),
        (
            "local.yaml",
            include_str!("../../../../examples/configs/local.yaml"),
        ),
        (
            "multi_stream.yaml",
            include_str!("../../../../examples/configs/multi_stream.yaml"),
        ),
        (
            "quickstart.yaml",
            include_str!("../../../../examples/configs/quickstart.yaml"),
        ),
        (
            "smollm2.yaml",
            include_str!("../../../../examples/configs/smollm2.yaml"),
        ),
    ];

    /// One edit of a text, at a place chosen by an [`Index`].
    #[derive(Debug, Clone)]
    enum Edit {
        /// Deletes up to this many characters.
        Delete(Index, usize),
        /// Inserts text.
        Insert(Index, String),
        /// Replaces what follows the `:` of a line with text.
        Value(Index, String),
        /// Repeats a line.
        Duplicate(Index),
        /// Changes a line's indentation.
        Indent(Index, usize),
    }

    /// Text that YAML gives meaning to, so that mutations reach the parser's corners.
    const YAMLISH: &str = "[ -~\\n\\t]{0,24}|(&a|\\*a|<<|---|\\.\\.\\.|!!str|!!int|\\?|\\|-|>|%YAML|\\$\\{[A-Z_]{0,8}\\}|~|null|\\[|\\]|\\{|\\}|, |: |- |#|\"|'|1e999|-0x1|0o7|\\.nan|\\.inf|18446744073709551616|é|\\u{0}){1,4}";

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (any::<Index>(), 0..40usize).prop_map(|(i, n)| Edit::Delete(i, n)),
            (any::<Index>(), YAMLISH).prop_map(|(i, s)| Edit::Insert(i, s)),
            (any::<Index>(), YAMLISH).prop_map(|(i, s)| Edit::Value(i, s)),
            any::<Index>().prop_map(Edit::Duplicate),
            (any::<Index>(), 0..9usize).prop_map(|(i, n)| Edit::Indent(i, n)),
        ]
    }

    fn apply(text: &str, edits: &[Edit]) -> String {
        let mut chars: Vec<char> = text.chars().collect();
        for edit in edits {
            let lines = String::from_iter(&chars)
                .split('\n')
                .map(str::to_string)
                .collect::<Vec<_>>();
            match edit {
                Edit::Delete(at, n) if !chars.is_empty() => {
                    let start = at.index(chars.len());
                    let end = (start + n).min(chars.len());
                    chars.drain(start..end);
                }
                Edit::Insert(at, s) => {
                    let at = at.index(chars.len() + 1);
                    chars.splice(at..at, s.chars());
                }
                Edit::Value(at, s) => {
                    let mut lines = lines;
                    let i = at.index(lines.len());
                    if let Some(colon) = lines[i].find(':') {
                        lines[i] = format!("{}: {s}", &lines[i][..colon]);
                    }
                    chars = lines.join("\n").chars().collect();
                }
                Edit::Duplicate(at) => {
                    let mut lines = lines;
                    let i = at.index(lines.len());
                    let line = lines[i].clone();
                    lines.insert(i, line);
                    chars = lines.join("\n").chars().collect();
                }
                Edit::Indent(at, n) => {
                    let mut lines = lines;
                    let i = at.index(lines.len());
                    lines[i] = format!("{}{}", " ".repeat(*n), lines[i].trim_start());
                    chars = lines.join("\n").chars().collect();
                }
                Edit::Delete(..) => {}
            }
        }
        chars.into_iter().collect()
    }

    /// `--set` overrides: known keys and made-up ones, with values of every shape.
    fn overrides() -> impl Strategy<Value = Vec<String>> {
        let key = prop_oneof![
            Just("proxy.pool_threads".to_string()),
            Just("proxy.max_body_bytes".to_string()),
            Just("gconfig.temperature".to_string()),
            Just("gconfig.top_k".to_string()),
            Just("rollout.max_concurrent_rollouts".to_string()),
            Just("train_dataset.batch_size".to_string()),
            Just("econfig.streams".to_string()),
            Just("experiment_name".to_string()),
            "[a-z_.\\[\\]0-9]{0,24}",
        ];
        prop::collection::vec((key, YAMLISH).prop_map(|(k, v)| format!("{k}={v}")), 0..4)
    }

    fn env() -> impl Strategy<Value = Env> {
        prop::collection::vec(("[A-Z_]{1,8}", YAMLISH), 0..3)
            .prop_map(|pairs| Env::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))))
    }

    /// Nine levels of aliases, each nine of the one before: 387 million strings from 600 bytes.
    #[test]
    fn an_alias_bomb_is_refused_within_the_parser_s_budget() {
        let mut text = String::from("experiment_name: e\ntrial_name: t\nx0: &x0 [");
        text.push_str(&["\"lol\""; 9].join(","));
        text.push_str("]\n");
        for i in 1..9 {
            let refs = vec![format!("*x{}", i - 1); 9].join(",");
            text.push_str(&format!("x{i}: &x{i} [{refs}]\n"));
        }
        let err = load_run_config_str("run.yaml", &text, &[], &no_env())
            .expect_err("refused")
            .to_string();
        assert!(err.contains("run.yaml:") && err.contains("budget"), "{err}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn mutated_examples_load_or_are_refused(
            example in 0..EXAMPLES.len(),
            edits in prop::collection::vec(edit(), 1..4),
            overrides in overrides(),
            env in env(),
        ) {
            let (name, text) = EXAMPLES[example];
            let mut files: Vec<(&str, String)> = vec![("base.yaml", EXAMPLES[0].1.to_string())];
            let mutated = apply(text, &edits);
            if name == "base.yaml" {
                files[0].1 = mutated;
            } else {
                files.push((name, mutated));
            }
            let dir = tempfile::tempdir().expect("a temporary directory");
            for (file, text) in &files {
                std::fs::write(dir.path().join(file), text).expect("writes");
            }
            let overrides: Vec<&str> = overrides.iter().map(String::as_str).collect();
            if let Err(e) = load(&dir.path().join(name), &overrides, &env) {
                prop_assert!(!e.to_string().is_empty());
            }
        }

        #[test]
        fn arbitrary_text_loads_or_is_refused(
            text in prop_oneof!["\\PC{0,400}", prop::collection::vec(YAMLISH, 0..40).prop_map(|p| p.concat())],
            overrides in overrides(),
            env in env(),
        ) {
            let overrides: Vec<String> = overrides.clone();
            if let Err(e) = load_run_config_str("run.yaml", &text, &overrides, &env) {
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }
}

#[test]
fn user_sets_tells_a_key_the_user_chose_from_a_schema_default() {
    let dir = Dir::new(&[
        (
            "base.yaml",
            "experiment_name: e\ntrial_name: t\nactor: {lr: 2.0e-6}\n",
        ),
        ("top.yaml", "extends: base.yaml\ngconfig: {n_samples: 4}\n"),
        ("bare.yaml", NAMES),
    ]);
    let sets = |file: &str, overrides: &[&str], env: &Env, key: &str| {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        user_sets(&dir.path(file), &overrides, env, key).unwrap()
    };
    // Through `extends:`, one level down and in a sibling section.
    assert!(sets("top.yaml", &[], &no_env(), "actor.lr"));
    assert!(!sets("top.yaml", &[], &no_env(), "checkpoint.save_every"));
    assert!(!sets("top.yaml", &[], &no_env(), "actor.lr.deeper"));
    // The schema's defaults are not the user's choice; an override or an ARENA_RL_ variable is.
    assert!(!sets("bare.yaml", &[], &no_env(), "actor.lr"));
    assert!(sets("bare.yaml", &["actor.lr=1e-6"], &no_env(), "actor.lr"));
    let env = Env::from_pairs([("ARENA_RL_CHECKPOINT__SAVE_EVERY", "5")]);
    assert!(sets("bare.yaml", &[], &env, "checkpoint.save_every"));
    assert!(!sets("bare.yaml", &[], &env, "actor.lr"));
}
