//! Unit tests for `weights`: safetensors round trips in every dtype, sharding, and the checks that
//! refuse weights which do not fit.

use super::*;
use crate::backend::Cpu;
use crate::config::Architecture;

fn tiny(arch: Architecture, tied: bool) -> ModelConfig {
    let mut c = ModelConfig::new(arch, 50, 16, 24, 2, 4, 2);
    c.tie_word_embeddings = tied;
    c
}

fn random_weights(config: &ModelConfig, seed: u64) -> Weights {
    Weights::from_model(&CausalLm::<Cpu>::init(config, 0.5, seed, &Default::default()))
}

#[test]
fn exported_names_are_the_hugging_face_ones() {
    for arch in [Architecture::Llama, Architecture::Qwen2, Architecture::Qwen3] {
        for tied in [false, true] {
            let config = tiny(arch, tied);
            let w = random_weights(&config, 1);
            let names: Vec<&str> = w.names().collect();
            let expected = expected_shapes(&config);
            assert_eq!(
                names,
                expected.keys().map(String::as_str).collect::<Vec<_>>(),
                "{arch:?}"
            );
            for (name, shape) in &expected {
                assert_eq!(&w.get(name).expect("present").shape, shape, "{name}");
            }
            assert_eq!(w.num_elements(), config.num_parameters(), "{arch:?} tied={tied}");
        }
    }
}

#[test]
fn f32_round_trip_is_exact_and_half_types_round() {
    let config = tiny(Architecture::Qwen2, false);
    let w = random_weights(&config, 2);
    let dir = tempfile::tempdir().expect("tempdir");
    w.save_dir(dir.path(), SaveDtype::F32, None).expect("save");
    assert_eq!(Weights::load_dir(dir.path()).expect("load"), w);
    for (dtype, tol) in [
        (SaveDtype::Bf16, 2.0f32.powi(-8)),
        (SaveDtype::F16, 2.0f32.powi(-11)),
    ] {
        w.save_dir(dir.path(), dtype, None).expect("save");
        let back = Weights::load_dir(dir.path()).expect("load");
        for name in w.names() {
            let (a, b) = (&w.get(name).expect("a").data, &back.get(name).expect("b").data);
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= tol * x.abs().max(1e-3),
                    "{dtype:?} {name}: {x} vs {y}"
                );
            }
        }
    }
}

#[test]
fn sharded_save_writes_an_index_and_loads_back() {
    let config = tiny(Architecture::Qwen3, true);
    let w = random_weights(&config, 3);
    let dir = tempfile::tempdir().expect("tempdir");
    w.save_dir(dir.path(), SaveDtype::F32, Some(4096)).expect("save");
    assert!(!dir.path().join(SINGLE_FILE).exists());
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(INDEX_FILE)).expect("index"))
            .expect("json");
    let files: std::collections::BTreeSet<&str> = index["weight_map"]
        .as_object()
        .expect("map")
        .values()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(files.len() > 2, "expected several shards, got {files:?}");
    assert_eq!(
        index["metadata"]["total_size"].as_u64(),
        Some(4 * w.num_elements() as u64)
    );
    assert_eq!(Weights::load_dir(dir.path()).expect("load"), w);
    // Saving unsharded afterwards leaves no stale index behind.
    w.save_dir(dir.path(), SaveDtype::F32, None).expect("save");
    assert!(!dir.path().join(INDEX_FILE).exists());
    assert_eq!(Weights::load_dir(dir.path()).expect("load"), w);
}

#[test]
fn model_round_trips_through_weights_and_keeps_ids_on_reload() {
    let config = tiny(Architecture::Llama, false);
    let device = Default::default();
    let a = CausalLm::<Cpu>::init(&config, 0.5, 4, &device);
    let w = Weights::from_model(&a);
    let b = CausalLm::<Cpu>::from_weights(&config, &w, &device).expect("fits");
    assert_eq!(Weights::from_model(&b), w);
    let other = random_weights(&config, 5);
    let id_before = b.model.layers[0].self_attn.q_proj.weight.id;
    let c = b.load_weights(&config, &other).expect("fits");
    assert_eq!(c.model.layers[0].self_attn.q_proj.weight.id, id_before);
    assert_eq!(Weights::from_model(&c), other);
}

#[test]
fn weights_that_do_not_fit_are_refused_with_names() {
    let config = tiny(Architecture::Llama, false);
    let mut w = random_weights(&config, 6);
    w.tensors.remove("model.layers.1.mlp.up_proj.weight");
    w.insert(
        "model.layers.0.self_attn.q_proj.weight",
        HostTensor {
            shape: vec![3, 3],
            data: vec![0.0; 9],
        },
    );
    w.insert(
        "model.layers.0.self_attn.q_proj.bias",
        HostTensor {
            shape: vec![16],
            data: vec![0.0; 16],
        },
    );
    let err = w.check_against(&config).expect_err("refused");
    insta::assert_snapshot!(err);
    // A leftover lm_head next to tied embeddings is ignored, as transformers does.
    let tied = tiny(Architecture::Llama, true);
    let mut w = random_weights(&tied, 7);
    w.insert(
        "lm_head.weight",
        HostTensor {
            shape: vec![50, 16],
            data: vec![0.0; 800],
        },
    );
    assert_eq!(w.check_against(&tied), Ok(()));
}

#[test]
fn unreadable_folders_say_what_is_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = Weights::load_dir(dir.path()).expect_err("empty folder");
    assert!(
        err.to_string()
            .contains("no model.safetensors or model.safetensors.index.json"),
        "{err}"
    );
    std::fs::write(dir.path().join(SINGLE_FILE), b"not safetensors").expect("write");
    let err = Weights::load_dir(dir.path()).expect_err("garbage");
    assert!(err.to_string().contains("not a valid safetensors file"), "{err}");
    let err = ModelFolder::open(dir.path()).expect_err("no config");
    assert!(err.to_string().contains("config.json"), "{err}");
    let err = ModelFolder::open(&dir.path().join("absent")).expect_err("no folder");
    assert!(err.to_string().contains("not a directory"), "{err}");
}

#[test]
fn save_pretrained_writes_a_folder_that_opens_again() {
    let mut config = tiny(Architecture::Qwen3, false);
    config.eos_token_ids = vec![3, 4];
    config.bos_token_id = Some(1);
    let w = random_weights(&config, 8);
    let dir = tempfile::tempdir().expect("tempdir");
    save_pretrained(dir.path(), &config, &w, SaveDtype::Bf16, None).expect("save");
    let folder = ModelFolder::open(dir.path()).expect("open");
    assert_eq!(folder.config, config);
    assert!(folder.generation_config.is_some());
    assert!(folder.tokenizer_json.is_none());
    assert_eq!(Weights::load_dir(dir.path()).expect("load").len(), w.len());
    // Tokenizer files travel with a checkpoint.
    std::fs::write(dir.path().join("tokenizer.json"), "{}").expect("write");
    std::fs::write(dir.path().join("chat_template.jinja"), "{{ messages }}").expect("write");
    let folder = ModelFolder::open(dir.path()).expect("open");
    let dest = tempfile::tempdir().expect("tempdir");
    folder.copy_tokenizer_files(dest.path()).expect("copy");
    for name in ["tokenizer.json", "chat_template.jinja", "generation_config.json"] {
        assert!(dest.path().join(name).exists(), "{name} not copied");
    }
    assert!(!dest.path().join("tokenizer_config.json").exists());
}
