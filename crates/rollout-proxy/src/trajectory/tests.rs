//! Tests of the interaction tree: parent lookup, full sequences, reward discounting, retry-orphan
//! dropping and both export styles.

use serde_json::json;

use super::*;

fn interaction(
    id: &str,
    parent: Option<u32>,
    prompt: &[u32],
    output: &[u32],
    input_key: u64,
    chain_key: u64,
) -> Interaction {
    Interaction {
        id: id.into(),
        parent,
        prompt_delta: prompt.into(),
        output: output.into(),
        logprobs: output.iter().map(|t| -(*t as f32) / 100.0).collect(),
        versions: encode_versions(output.iter().map(|t| t % 2)),
        sampling: TokenSampling::NEUTRAL,
        input_key,
        chain_key,
        stop_token: None,
        finish: Finish::Stop,
        reward: None,
        integrity_hits: Box::default(),
        text: None,
    }
}

/// root(1,2 | 3,4) -> child(5 | 6) -> grandchild(7 | 8,9); plus a retry of the root (same input).
fn tree() -> Trajectory {
    let mut t = Trajectory::default();
    t.push(interaction("a", None, &[1, 2], &[3, 4], 10, 11));
    t.push(interaction("a-retry", None, &[1, 2], &[30, 40], 10, 12));
    t.push(interaction("b", Some(0), &[5], &[6], 20, 21));
    t.push(interaction("c", Some(2), &[7], &[8, 9], 30, 31));
    t
}

#[test]
fn parents_are_found_by_the_longest_covered_prefix() {
    let t = tree();
    let p = t.find_parent(&[99, 21, 77]).expect("b covers two messages");
    assert_eq!((p.index, p.covered), (2, 2));
    assert_eq!(p.tokens, vec![1, 2, 3, 4, 5, 6]);
    let p = t.find_parent(&[11, 21, 31]).expect("c is the longest");
    assert_eq!((p.index, p.covered), (3, 3));
    assert!(t.find_parent(&[1, 2, 3]).is_none());
    assert_eq!(t.full_tokens(3), vec![1, 2, 3, 4, 5, 6, 7, 8, 9]);
}

#[test]
fn concat_exports_leaves_with_every_sampled_token_trained() {
    let mut t = tree();
    t.set_reward(None, Some(1.0)).expect("newest");
    t.set_reward(Some("a-retry"), Some(0.5)).expect("by id");
    assert!(t.set_reward(Some("zzz"), Some(1.0)).is_err());
    let options = ExportOptions {
        style: ExportStyle::Concat,
        discount: 0.5,
        ..ExportOptions::default()
    };
    let out = t.export("s", &json!({"k": 1}), &options).expect("finite rewards");
    let ids: Vec<&str> = out.iter().map(|x| x.interaction_id.as_str()).collect();
    assert_eq!(ids, vec!["a-retry", "c"]);
    let c = &out[1];
    assert_eq!(c.interaction_ids, vec!["a", "b", "c"]);
    assert_eq!(c.token_ids, vec![1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(c.loss_mask, vec![0, 0, 1, 1, 0, 1, 0, 1, 1]);
    assert_eq!(c.versions, vec![-1, -1, 1, 0, -1, 0, -1, 0, 1]);
    assert_eq!(c.logprobs[2], -0.03);
    assert_eq!(c.logprobs[4], 0.0);
    assert_eq!(c.prompt_len, 2);
    assert_eq!((c.reward, c.original_reward), (1.0, 1.0));
    // Discounting runs over all interactions newest first: c=1, b=0+0.5*1, a-retry=0.5+0.5*0.5.
    assert_eq!((out[0].reward, out[0].original_reward), (0.75, 0.5));
    assert_eq!(out[0].metadata, json!({"k": 1}));
}

#[test]
fn individual_exports_every_interaction_training_only_its_own_output() {
    let t = tree();
    let out = t
        .export("s", &json!({}), &ExportOptions::default())
        .expect("finite rewards");
    assert_eq!(out.len(), 4);
    let b = &out[2];
    assert_eq!(b.token_ids, vec![1, 2, 3, 4, 5, 6]);
    assert_eq!(b.loss_mask, vec![0, 0, 0, 0, 0, 1]);
    assert_eq!(b.prompt_len, 5);
    assert_eq!(b.versions, vec![-1, -1, -1, -1, -1, 0]);
}

#[test]
fn retry_orphans_are_dropped() {
    let t = tree();
    let options = ExportOptions {
        drop_retry_orphans: true,
        final_reward: Some(2.0),
        ..ExportOptions::default()
    };
    let out = t.export("s", &json!({}), &options).expect("finite rewards");
    let ids: Vec<&str> = out.iter().map(|x| x.interaction_id.as_str()).collect();
    assert_eq!(
        ids,
        vec!["a", "b", "c"],
        "the childless retry of a consumed entry goes"
    );
    assert!(out.iter().all(|x| x.reward == 2.0));

    let mut t = Trajectory::default();
    t.push(interaction("x1", None, &[1], &[2], 5, 6));
    t.push(interaction("x2", None, &[1], &[3], 5, 7));
    t.push(interaction("x3", None, &[1], &[4], 5, 8));
    let options = ExportOptions {
        drop_retry_orphans: true,
        ..ExportOptions::default()
    };
    let ids: Vec<String> = t
        .export("s", &json!({}), &options)
        .expect("finite rewards")
        .into_iter()
        .map(|x| x.interaction_id)
        .collect();
    assert_eq!(ids, vec!["x3"], "with no children only the newest retry stays");
}

#[test]
fn versions_are_run_length_encoded() {
    let runs = encode_versions([3, 3, 3, 4, 4, 3]);
    assert_eq!(&*runs, &[(0, 3), (3, 4), (5, 3)]);
    let it = Interaction {
        versions: runs,
        ..interaction("v", None, &[], &[0, 0, 0, 0, 0, 0], 0, 0)
    };
    assert_eq!(
        (0..6).map(|i| it.version_at(i)).collect::<Vec<_>>(),
        vec![3, 3, 3, 4, 4, 3]
    );
}

#[test]
fn a_concat_export_carries_each_turns_sampling_per_token() {
    let at = |temperature: f32, top_p: f32, top_k: Option<u32>| {
        TokenSampling::of(&SamplingParams {
            temperature,
            top_p,
            top_k,
            ..SamplingParams::default()
        })
    };
    let mut t = Trajectory::default();
    t.push(Interaction {
        sampling: at(0.6, 1.0, None),
        ..interaction("a", None, &[1, 2], &[3, 4], 10, 11)
    });
    t.push(Interaction {
        sampling: at(1.3, 0.9, Some(20)),
        ..interaction("b", Some(0), &[5], &[6], 20, 21)
    });
    t.push(Interaction {
        sampling: at(0.0, 0.5, Some(3)),
        ..interaction("c", Some(1), &[7], &[8, 9], 30, 31)
    });
    let options = ExportOptions {
        style: ExportStyle::Concat,
        ..ExportOptions::default()
    };
    let out = t.export("s", &json!({}), &options).expect("finite rewards");
    assert_eq!(out.len(), 1);
    let e = &out[0];
    assert_eq!(e.token_ids, vec![1, 2, 3, 4, 5, 6, 7, 8, 9]);
    assert_eq!(e.temperatures, vec![1.0, 1.0, 0.6, 0.6, 1.0, 1.3, 1.0, 1.0, 1.0]);
    assert_eq!(e.top_ps, vec![1.0, 1.0, 1.0, 1.0, 1.0, 0.9, 1.0, 1.0, 1.0]);
    assert_eq!(e.top_ks, vec![0, 0, 0, 0, 0, 20, 0, 0, 0]);
    assert_eq!(
        e.truncated,
        vec![0, 0, 0, 0, 0, 1, 0, 0, 0],
        "greedy tokens are untruncated"
    );
    let individual = t
        .export("s", &json!({}), &ExportOptions::default())
        .expect("finite rewards");
    assert_eq!(
        individual[2].temperatures, e.temperatures,
        "earlier turns keep their values where an individual export does not train on them"
    );
}

#[test]
fn old_records_without_sampling_still_read() {
    let out = tree()
        .export("s", &json!({}), &ExportOptions::default())
        .expect("finite rewards");
    let mut value = serde_json::to_value(&out[0]).expect("serialises");
    let map = value.as_object_mut().expect("an object");
    for field in ["temperatures", "top_ps", "top_ks", "truncated"] {
        assert!(map.remove(field).is_some(), "{field} is written");
    }
    let old: ExportedTrajectory = serde_json::from_value(value).expect("an old record reads");
    assert!(old.temperatures.is_empty() && old.truncated.is_empty());
    assert_eq!(old.token_ids, out[0].token_ids);
}

#[test]
fn discounted_rewards_that_overflow_are_an_error_naming_the_interaction() {
    let mut t = tree();
    t.set_reward(Some("c"), Some(1.7e308)).expect("c");
    t.set_reward(Some("b"), Some(1.7e308)).expect("b");
    let err = t
        .export("s", &json!({}), &ExportOptions::default())
        .expect_err("1.7e308 + 1.7e308 overflows");
    assert!(
        err.contains("interaction b") && err.contains("not finite"),
        "{err}"
    );
    let options = ExportOptions {
        discount: 1e308,
        ..ExportOptions::default()
    };
    let mut t = tree();
    t.set_reward(Some("c"), Some(10.0)).expect("c");
    assert!(
        t.export("s", &json!({}), &options).is_err(),
        "a huge discount overflows too"
    );
}

#[test]
fn a_concat_export_of_many_branches_writes_at_most_its_bound() {
    let mut t = Trajectory::default();
    let long: Vec<u32> = (0..1000).collect();
    t.push(interaction("root", None, &long, &[7; 10], 1, 2));
    for b in 0..50u64 {
        t.push(interaction(
            &format!("b{b}"),
            Some(0),
            &[5; 5],
            &[6; 5],
            10 + b,
            100 + b,
        ));
    }
    let stored: u64 = 1010 + 50 * 10;
    let options = |max_amplification| ExportOptions {
        style: ExportStyle::Concat,
        max_amplification,
        ..ExportOptions::default()
    };
    let (all, dropped) = t
        .export_counting("s", &json!({}), &options(u32::MAX))
        .expect("finite");
    let tokens = |out: &[ExportedTrajectory]| out.iter().map(|x| x.token_ids.len() as u64).sum::<u64>();
    assert_eq!((all.len(), dropped), (50, 0));
    assert_eq!(tokens(&all), 50 * 1020, "each branch repeats the long turn");
    let (bounded, dropped) = t.export_counting("s", &json!({}), &options(4)).expect("finite");
    assert!(
        tokens(&bounded) <= 4 * stored,
        "{} > {}",
        tokens(&bounded),
        4 * stored
    );
    assert_eq!((bounded.len(), dropped), (5, 45));
    let ids: Vec<&str> = bounded.iter().map(|x| x.interaction_id.as_str()).collect();
    assert_eq!(
        ids,
        ["b45", "b46", "b47", "b48", "b49"],
        "the newest leaves, oldest first"
    );
}

/// A compacted session: one chain per entry of `shape`, each a root and its descendants, one output token
/// per turn; turn `j` of chain `c` is `c{c}t{j}`.
fn compacted(shape: &[usize]) -> Trajectory {
    let mut t = Trajectory::default();
    let mut key = 0u64;
    for (c, &turns) in shape.iter().enumerate() {
        let mut parent = None;
        for j in 0..turns {
            key += 2;
            let index = t.len() as u32;
            let token = 100 + index;
            t.push(interaction(
                &format!("c{c}t{j}"),
                parent,
                &[1],
                &[token],
                key,
                key + 1,
            ));
            parent = Some(index);
        }
    }
    t
}

fn concat(final_reward: Option<f64>, episode_reward: Option<f64>) -> ExportOptions {
    ExportOptions {
        style: ExportStyle::Concat,
        final_reward,
        episode_reward,
        ..ExportOptions::default()
    }
}

/// (interaction id, reward, original reward) of each exported leaf.
fn leaf_rewards(out: &[ExportedTrajectory]) -> Vec<(String, f64, f64)> {
    out.iter()
        .map(|x| (x.interaction_id.clone(), x.reward, x.original_reward))
        .collect()
}

/// `arena-2026.md` 3.5 test 1 (`test_arena_compacted_episode_scores_all_actions_once`), at small chain
/// lengths: the episode's reward scores every chain's leaf once, each turn trains once, and without the
/// opt-in the older chains keep no reward of their own.
#[test]
fn the_episode_reward_scores_every_chain_of_a_compacted_session_once() {
    for r in [0.0, 0.5275] {
        for shape in [&[3, 1, 2][..], &[2, 1, 1, 4][..]] {
            let t = compacted(shape);
            let out = t
                .export("s", &json!({}), &concat(Some(r), Some(r)))
                .expect("finite");
            assert_eq!(out.len(), shape.len(), "one trajectory per chain");
            for x in &out {
                assert_eq!((x.reward, x.original_reward), (r, r), "{shape:?}: {x:?}");
            }
            let trained: usize = out
                .iter()
                .map(|x| x.loss_mask.iter().map(|m| usize::from(*m)).sum::<usize>())
                .sum();
            assert_eq!(trained, shape.iter().sum::<usize>(), "each turn trains once");

            // The default infers nothing: only the newest chain is scored as set.
            let plain = t.export("s", &json!({}), &concat(Some(r), None)).expect("finite");
            let originals: Vec<f64> = plain.iter().map(|x| x.original_reward).collect();
            let mut expected = vec![0.0; shape.len()];
            expected[shape.len() - 1] = r;
            assert_eq!(originals, expected, "{shape:?}");
        }
    }
}

/// `arena-2026.md` 3.5 test 2 (`test_arena_episode_reward_leaves_ambiguous_exports_unchanged`): a shared
/// ancestor, a leaf scored otherwise, a scored ancestor and a turn without output each leave the export as
/// it is without the opt-in. (The reference's `reference_conflict`, `token_rewards` and `cycle` cases have no
/// counterpart here: there is no per-rollout reference on a turn, no dense token reward, and a parent is
/// always an older turn.)
#[test]
fn an_ambiguous_graph_leaves_missing_rewards_unchanged() {
    let r = 0.5;
    let mut shared_ancestor = compacted(&[2, 1]);
    shared_ancestor.push(interaction("branch", Some(0), &[1], &[9], 90, 91));
    let mut scalar_conflict = compacted(&[2, 1, 1]);
    scalar_conflict
        .set_reward(Some("c1t0"), Some(0.25))
        .expect("a leaf");
    let mut ancestor_reward = compacted(&[2, 1]);
    ancestor_reward
        .set_reward(Some("c0t0"), Some(r))
        .expect("an ancestor");
    let mut incomplete = compacted(&[1, 1]);
    incomplete.push(interaction("empty", None, &[1], &[], 80, 81));
    incomplete.push(interaction("after", Some(2), &[1], &[7], 82, 83));
    for (case, t) in [
        ("shared_ancestor", shared_ancestor),
        ("scalar_conflict", scalar_conflict),
        ("ancestor_reward", ancestor_reward),
        ("incomplete", incomplete),
    ] {
        let asked = t
            .export("s", &json!({}), &concat(Some(r), Some(r)))
            .expect("finite");
        let plain = t.export("s", &json!({}), &concat(Some(r), None)).expect("finite");
        assert_eq!(leaf_rewards(&asked), leaf_rewards(&plain), "{case}");
        assert!(
            asked.iter().any(|x| x.original_reward != r),
            "{case}: some leaf stays unscored: {:?}",
            leaf_rewards(&asked)
        );
    }
}

/// Every leaf already scored as the episode: nothing to fill, nothing changes; a leaf scored otherwise is
/// never overwritten.
#[test]
fn scored_leaves_are_never_overwritten() {
    let mut t = compacted(&[1, 1]);
    t.set_reward(Some("c0t0"), Some(0.5)).expect("a leaf");
    let out = t
        .export("s", &json!({}), &concat(Some(0.5), Some(0.5)))
        .expect("finite");
    assert_eq!(
        leaf_rewards(&out),
        [("c0t0".to_string(), 1.0, 0.5), ("c1t0".to_string(), 0.5, 0.5)],
        "discounted as before: c0t0 = 0.5 + 1.0 * 0.5"
    );
}

#[test]
fn a_rendering_continues_a_text_print_only_when_it_begins_with_exactly_that_text() {
    let print = TextPrint {
        prompt: TextHash::of("<|im_start|>user\nhé<|im_end|>\n<|im_start|>assistant\n"),
        output: TextHash::of("Answer.<|im_end|>"),
    };
    let begun = "<|im_start|>user\nhé<|im_end|>\n<|im_start|>assistant\nAnswer.<|im_end|>";
    assert_eq!(
        print.rest_of(&format!("{begun}\n<|im_start|>user\nmore")),
        Some("\n<|im_start|>user\nmore")
    );
    assert_eq!(print.rest_of(begun), Some(""));
    for other in [
        begun.replace("Answer.", "Answer!"),
        begun.replace("hé", "he"),
        begun[..begun.len() - 1].to_string(),
        String::new(),
    ] {
        assert_eq!(print.rest_of(&format!("{other}\nmore")), None, "{other:?}");
    }
    // A length that ends inside a character is no match, not a panic.
    let inside = TextPrint {
        prompt: TextHash::of("<|im_start|>user\nh"),
        output: TextHash::of("\u{0}"),
    };
    assert_eq!(inside.rest_of(begun), None);
}
