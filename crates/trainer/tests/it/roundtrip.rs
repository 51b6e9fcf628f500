//! Checkpoints written here load into transformers and give the same logits there.

use anyhow::Result;
use serde_json::json;
use trainer::backend::Cpu;
use trainer::model::CausalLm;
use trainer::{Architecture, HostTensor, ModelConfig, SaveDtype, Weights, save_pretrained};

use crate::support::{load, max_diff_valid, read_f32, run_oracle, tempdir};

#[test]
fn a_checkpoint_saved_here_loads_into_transformers() -> Result<()> {
    let mut config = ModelConfig::new(Architecture::Qwen2, 128, 64, 96, 2, 4, 2);
    config.eos_token_ids = vec![2];
    config.rope_theta = 1e6;
    let model = CausalLm::<Cpu>::init(&config, 0.2, 21, &Default::default());
    // Give norms and biases non-trivial values, so a misplaced one would show.
    let exported = Weights::from_model(&model);
    let mut weights = Weights::default();
    let mut rng = trainer::sampling::SplitMix64::new(5);
    for name in exported.names() {
        let mut t: HostTensor = exported.get(name).expect("listed").clone();
        if t.shape.len() == 1 {
            for x in &mut t.data {
                *x += 0.2 * rng.next_normal() as f32;
            }
        }
        weights.insert(name, t);
    }
    let tmp = tempdir();
    let rows = vec![vec![5u32, 9, 100, 3, 44, 127, 0, 18], vec![77, 1, 2]];
    for (dtype, shard) in [(SaveDtype::F32, Some(40_000)), (SaveDtype::Bf16, None)] {
        let dir = tmp.path().join(format!("{dtype:?}"));
        save_pretrained(&dir, &config, &weights, dtype, shard)?;
        let out = tmp.path().join(format!("{dtype:?}-out"));
        std::fs::create_dir_all(&out)?;
        run_oracle(
            &json!({"model": dir, "logits": [{"name": "l", "rows": rows, "padding": "right"}]}),
            &out,
        )?;
        let theirs = read_f32(&out.join("l.f32"))?;
        let ours = load(&dir)?.logits(&rows, false);
        let diff = max_diff_valid(&ours, &theirs, &rows, false, config.vocab_size);
        assert!(diff < 1e-4, "{dtype:?}: transformers' logits differ by {diff}");
    }
    Ok(())
}
