//! The warm-up transcripts: written through the real proxy, token-exact, assistant-only loss, random answers.

use super::*;
use crate::quickstart::policy::{IM_END, PolicySpec, build};

fn tiny_policy(dir: &Path) -> std::path::PathBuf {
    let spec = PolicySpec {
        corpus_conversations: 300,
        ..crate::quickstart::policy::small_spec(0)
    };
    build(&spec, &dir.join("policy")).unwrap().dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transcripts_are_the_proxys_tokens_with_the_loss_on_the_assistant_only() {
    let root = tempfile::tempdir().unwrap();
    let dir = tiny_policy(root.path());
    let model = ChatModel::from_dir(&dir).unwrap();
    let spec = TranscriptSpec {
        count: 40,
        seed: 9,
        family_prior: 0.0,
    };
    let got = transcripts(&dir, &spec).await.unwrap();
    assert_eq!(got.len(), 40);
    assert_eq!(
        got,
        transcripts(&dir, &spec).await.unwrap(),
        "deterministic in the seed"
    );
    let stop = model.tokenizer.token_to_id(IM_END).unwrap();
    let mut answers = [0usize; 10];
    let mut seen = std::collections::BTreeSet::new();
    for t in &got {
        seen.insert((t.protocol, t.family));
        answers[t.answer as usize] += 1;
        assert_eq!(t.token_ids.len(), t.loss_mask.len());
        // What the loss covers decodes to the tool call, its stop token, the answer and its stop token.
        let trained: Vec<u32> = t
            .token_ids
            .iter()
            .zip(&t.loss_mask)
            .filter(|(_, m)| **m == 1)
            .map(|(id, _)| *id)
            .collect();
        let text = model.tokenizer.decode(&trained, false).unwrap();
        let (call, answer) = text.split_once(IM_END).unwrap();
        assert!(call.starts_with("<tool_call>{\"name\": \"lookup\""), "{call}");
        assert_eq!(answer, format!("{}{IM_END}", t.answer));
        assert_eq!(trained.last(), Some(&stop));
        // The whole sequence is the conversation the template renders, tokenised turn by turn.
        let whole = model.tokenizer.decode(&t.token_ids, false).unwrap();
        assert!(whole.starts_with("<|im_start|>system\ntool lookup(key): digits under a key<|im_end|>\n"));
        assert!(
            whole.ends_with(&format!("<|im_start|>assistant\n{}<|im_end|>", t.answer)),
            "{whole}"
        );
        // Nothing but assistant output is trained: the prompt and tool result are masked.
        let first_trained = t.loss_mask.iter().position(|&m| m == 1).unwrap();
        let prompt = model
            .tokenizer
            .decode(&t.token_ids[..first_trained], false)
            .unwrap();
        assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");
    }
    assert_eq!(seen.len(), 4, "both protocols and both families: {seen:?}");
    assert!(
        answers.iter().filter(|&&n| n > 0).count() >= 8,
        "answers spread over the digits: {answers:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_protocols_render_the_same_conversation_to_the_same_tokens() {
    // Anthropic Messages and Chat Completions requests reach the template as the same core messages, so a
    // policy trained on either sees one format.
    let root = tempfile::tempdir().unwrap();
    let dir = tiny_policy(root.path());
    let got = transcripts(
        &dir,
        &TranscriptSpec {
            count: 4,
            seed: 1,
            family_prior: 0.0,
        },
    )
    .await
    .unwrap();
    // Conversations 0 (Anthropic, max) and 3 (Chat, max) differ only in task and answer: map both to text and
    // compare their shapes with the task-specific parts blanked out.
    let model = ChatModel::from_dir(&dir).unwrap();
    let shape = |t: &Transcript| {
        let text = model.tokenizer.decode(&t.token_ids, false).unwrap();
        text.chars()
            .map(|c| if c.is_ascii_digit() { '#' } else { c })
            .collect::<String>()
    };
    let blank_key = |s: String| {
        let at = s.find("under key ").unwrap() + "under key ".len();
        let mut s = s;
        s.replace_range(at..at + 1, "_");
        let at = s.find("{\"key\": \"").unwrap() + "{\"key\": \"".len();
        s.replace_range(at..at + 1, "_");
        s
    };
    assert_eq!(got[0].protocol, LlmProtocol::Anthropic);
    assert_eq!(got[3].protocol, LlmProtocol::ChatCompletions);
    assert_eq!(got[0].family, got[3].family);
    assert_eq!(blank_key(shape(&got[0])), blank_key(shape(&got[3])));
}

#[test]
fn the_family_prior_skews_answers_towards_the_families_half_and_nothing_more() {
    let count = |family: TaskFamily, prior: f64| {
        let mut rng = SplitMix64::new(3);
        let mut high = 0usize;
        let mut seen = [false; 10];
        for _ in 0..20_000 {
            let a = teacher_answer(&mut rng, family, prior);
            seen[a as usize] = true;
            high += usize::from(a >= 5);
        }
        if prior < 1.0 {
            assert!(seen.iter().all(|&s| s), "every digit stays possible: {seen:?}");
        }
        high as f64 / 20_000.0
    };
    // No prior: half the answers are high. A prior p moves p/2 of the mass to the family's half.
    assert!((count(TaskFamily::Max, 0.0) - 0.5).abs() < 0.02);
    assert!((count(TaskFamily::Max, 0.3) - 0.65).abs() < 0.02);
    assert!((count(TaskFamily::Min, 0.3) - 0.35).abs() < 0.02);
    assert!((count(TaskFamily::Max, 1.0) - 1.0).abs() < 1e-9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_teacher_without_answers_fails_the_request_instead_of_inventing_one() {
    let teacher = TeacherEngine::new(7, 64);
    let request = GenerateRequest {
        input_ids: vec![1, 2, 3].into(),
        sampling: rollout_proxy::SamplingParams::default(),
        images: Vec::new(),
        affinity: None,
    };
    use futures::StreamExt as _;
    let first = teacher.generate(request.clone()).next().await.unwrap();
    assert!(matches!(first, Err(EngineError::Internal(m)) if m.contains("no scripted answer")));
    teacher.push([vec![4, 5]]);
    let events: Vec<_> = teacher.generate(request).collect().await;
    let ids: Vec<u32> = events
        .iter()
        .filter_map(|e| match e {
            Ok(EngineEvent::Token(t)) => Some(t.id),
            _ => None,
        })
        .collect();
    assert_eq!(ids, vec![4, 5, 7]);
    assert!(matches!(
        events.last(),
        Some(Ok(EngineEvent::Finished(FinishReason::Stop { matched: Some(7) })))
    ));
}
