//! The tiny policy: template rendering, proxy-exact segments, tokenizer properties, determinism and the
//! folder both the proxy and the trainer read.

use super::*;

#[test]
fn the_template_renders_a_whole_conversation_compactly() {
    let task = TaskInstance::from_data_id(TaskFamily::Max, "row-7");
    let (messages, tools) = conversation(&task, 5, None);
    let text = chat_template()
        .unwrap()
        .render(
            &for_template(&messages),
            RenderOptions {
                tools: Some(&tools),
                add_generation_prompt: false,
                extra: None,
            },
        )
        .unwrap();
    let expected = format!(
        "<|im_start|>system\ntool lookup(key): digits under a key<|im_end|>\n\
         <|im_start|>user\nlargest digit under key {key}?<|im_end|>\n\
         <|im_start|>assistant\n<tool_call>{{\"name\": \"lookup\", \"arguments\": {{\"key\": \"{key}\"}}}}</tool_call><|im_end|>\n\
         <|im_start|>tool\n{digits}<|im_end|>\n\
         <|im_start|>assistant\n5<|im_end|>\n",
        key = task.key,
        digits = task.digits_text()
    );
    assert_eq!(text, expected);
}

#[test]
fn segments_cut_where_the_proxy_cuts() {
    let task = TaskInstance::from_data_id(TaskFamily::Min, "row-3");
    let (messages, tools) = conversation(&task, 2, Some("zz"));
    let template = chat_template().unwrap();
    let got = segments(&template, &messages, Some(&tools)).unwrap();
    let call = |k: &str| {
        format!("<tool_call>{{\"name\": \"lookup\", \"arguments\": {{\"key\": \"{k}\"}}}}</tool_call>")
    };
    let expected = vec![
        Segment::Prompt(format!(
            "<|im_start|>system\ntool lookup(key): digits under a key<|im_end|>\n<|im_start|>user\nsmallest digit under key {}?<|im_end|>\n<|im_start|>assistant\n",
            task.key
        )),
        Segment::Output(call("zz")),
        Segment::Prompt("\n<|im_start|>tool\nno key zz<|im_end|>\n<|im_start|>assistant\n".to_string()),
        Segment::Output(call(&task.key)),
        Segment::Prompt(format!(
            "\n<|im_start|>tool\n{}<|im_end|>\n<|im_start|>assistant\n",
            task.digits_text()
        )),
        Segment::Output("2".to_string()),
    ];
    assert_eq!(got, expected);
}

#[test]
fn the_tokenizer_keeps_digits_whole_and_round_trips() {
    let texts = corpus(1, 200).unwrap();
    let json = train_tokenizer(&texts, 400).unwrap();
    let tok = rollout_proxy::tokenizer::Tokenizer::from_bytes(json.as_bytes()).unwrap();
    assert!(tok.vocab_size() <= 400, "{}", tok.vocab_size());
    for d in 0..10 {
        let ids = tok.encode(&d.to_string()).unwrap();
        assert_eq!(ids.len(), 1, "digit {d} is {ids:?}");
    }
    for special in [IM_START, IM_END, ENDOFTEXT] {
        let id = tok.token_to_id(special).unwrap();
        assert!(tok.is_special(id), "{special}");
        assert_eq!(tok.encode(special).unwrap(), vec![id]);
    }
    for text in &texts[..50] {
        let ids = tok.encode(text).unwrap();
        assert_eq!(&tok.decode(&ids, false).unwrap(), text);
        let digits = text.chars().filter(char::is_ascii_digit).count();
        let digit_tokens = ids
            .iter()
            .filter(|&&id| {
                tok.decode(&[id], false)
                    .unwrap()
                    .chars()
                    .any(|c| c.is_ascii_digit())
            })
            .count();
        assert_eq!(digits, digit_tokens, "a token holds a digit and more: {text:?}");
    }
    // The fixed phrases merged: a whole first prompt is far fewer tokens than bytes.
    let first = &texts[0];
    assert!(tok.encode(first).unwrap().len() * 4 < first.len(), "{first:?}");
    assert_eq!(
        json,
        train_tokenizer(&texts, 400).unwrap(),
        "training is deterministic"
    );
}

#[test]
fn a_built_folder_loads_in_the_proxy_and_the_trainer_and_is_deterministic() {
    let root = tempfile::tempdir().unwrap();
    let spec = small_spec(3);
    let a = build(&spec, &root.path().join("a")).unwrap();
    let b = build(&spec, &root.path().join("b")).unwrap();
    let c = build(&small_spec(4), &root.path().join("c")).unwrap();
    for name in [
        "tokenizer.json",
        "model.safetensors",
        "config.json",
        "chat_template.jinja",
    ] {
        let read = |p: &Path| std::fs::read(p.join(name)).unwrap();
        assert_eq!(
            read(&a.dir),
            read(&b.dir),
            "{name} differs between two builds of one seed"
        );
    }
    let read = |p: &Path| std::fs::read(p.join("model.safetensors")).unwrap();
    assert_ne!(read(&a.dir), read(&c.dir), "another seed gives other weights");

    let model = rollout_proxy::ChatModel::from_dir(&a.dir).unwrap();
    assert_eq!(
        model.stop_token_ids,
        vec![model.tokenizer.token_to_id(IM_END).unwrap()]
    );
    assert_eq!(model.template.assistant_turn_end(), Some("<|im_end|>\n"));
    let policy = trainer::Policy::load(&a.dir, trainer::PolicyOptions::default()).unwrap();
    assert_eq!(policy.config(), &a.config);
    assert_eq!(a.config.vocab_size, model.tokenizer.vocab_size());
    let ids = model
        .tokenizer
        .encode("<|im_start|>user\nlargest digit under key a1?")
        .unwrap();
    let logits = policy.score(&ids).unwrap();
    assert!(logits.row(ids.len() - 1).iter().all(|x| x.is_finite()));
}

#[test]
fn ensure_reuses_a_complete_build_and_rebuilds_another_spec() {
    let root = tempfile::tempdir().unwrap();
    let spec = small_spec(5);
    let first = ensure(&spec, root.path()).unwrap();
    assert!(!first.cached);
    let again = ensure(&spec, root.path()).unwrap();
    assert!(again.cached);
    assert_eq!(first.dir, again.dir);
    let other = ensure(&small_spec(6), root.path()).unwrap();
    assert!(!other.cached);
    assert_ne!(other.dir, first.dir);
    // A folder without its stamp (a build that died) is rebuilt.
    std::fs::remove_file(first.dir.join(STAMP)).unwrap();
    assert!(!ensure(&spec, root.path()).unwrap().cached);
}

#[test]
fn bad_specs_say_what_is_wrong() {
    let spec = PolicySpec {
        vocab_size: 100,
        hidden_size: 30,
        num_heads: 4,
        context: 10,
        ..PolicySpec::default()
    };
    let problems = spec.problems().join("; ");
    assert!(problems.contains("vocab_size 100"), "{problems}");
    assert!(
        problems.contains("hidden_size 30 is not a multiple of num_heads 4"),
        "{problems}"
    );
    assert!(problems.contains("context 10"), "{problems}");
    let err = build(&spec, Path::new("/nonexistent")).unwrap_err().to_string();
    assert!(err.contains("the quickstart policy spec is invalid"), "{err}");
}
