//! The training step in small pieces: the loss by hand on tiny tensors, the 7.4 advantage examples,
//! packing, the packed forward pass against `CausalLm::forward`, the CPU kernels' gradients against burn's
//! own autodiff, and a finite-difference check of the whole loss in `f64`.

use std::collections::BTreeMap;

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

use super::batch::normalized_advantages;
use super::learner::{AnyLearner, Learner};
use super::loss::{PpoConsts, behaviour_weight, clipped_pg, kl_value, ppo_loss, token_weights};
use super::pack::{Temperatures, effective_len, pack, plan};
use super::*;
use crate::backend::{Cpu, CpuAutodiff};
use crate::kernels::{self, Kernels};
use crate::model::{AttnInput, CausalLm};
use crate::optim::{LrSchedule, host_vec};
use crate::rope::RopeTable;
use crate::sampling::SplitMix64;
use crate::{Architecture, ModelConfig};

type F64 = burn_autodiff::Autodiff<burn_ndarray::NdArray<f64>>;

fn t1<B: burn::tensor::backend::Backend>(v: &[f32]) -> Tensor<B, 1> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol
}

// ---------------------------------------------------------------- the loss by hand

fn ppo(eps: f64, c: Option<f64>) -> PpoConfig {
    PpoConfig {
        eps_clip: eps,
        c_clip: c,
        ..PpoConfig::default()
    }
}

#[test]
fn clip_boundaries_and_dual_clip_by_hand() {
    // (ratio, advantage, expected per-token loss, expected d loss / d logp) with eps 0.2 and dual clip 3.
    let cases: [(f32, f32, f32, f32); 9] = [
        (1.0, 1.0, -1.0, -1.0), // on-policy: -A r, gradient -A r
        (1.5, 1.0, -1.2, 0.0),  // A > 0 above 1 + eps: clipped, no gradient
        (0.5, 1.0, -0.5, -0.5), // A > 0 below 1 - eps: not clipped (pessimistic side)
        (1.1, 1.0, -1.1, -1.1), // inside the range
        (1.5, -1.0, 1.5, 1.5),  // A < 0 above 1 + eps: not clipped
        (0.5, -1.0, 0.8, 0.0),  // A < 0 below 1 - eps: clipped
        (5.0, -1.0, 3.0, 0.0),  // A < 0, ratio 5: dual clip caps at c |A| = 3
        (2.5, -2.0, 5.0, 5.0),  // A < 0, loss 5 below c |A| = 6: not dual-clipped
        (1.0, 0.0, 0.0, 0.0),   // zero advantage: nothing
    ];
    let logp: Vec<f32> = cases.iter().map(|c| c.0.ln()).collect();
    let prox = vec![0.0f32; cases.len()];
    let adv: Vec<f32> = cases.iter().map(|c| c.1).collect();
    let logp_t = t1::<CpuAutodiff>(&logp).require_grad();
    let pg = clipped_pg(logp_t.clone(), t1(&prox), t1(&adv), &ppo(0.2, Some(3.0)));
    let values = host_vec(pg.clone());
    let backward = pg.sum().backward();
    let grads = host_vec(logp_t.grad(&backward).expect("logp has a gradient"));
    for (i, c) in cases.iter().enumerate() {
        assert!(
            close(f64::from(values[i]), f64::from(c.2), 1e-5),
            "case {i} {c:?}: loss {}",
            values[i]
        );
        assert!(
            close(f64::from(grads[i]), f64::from(c.3), 1e-5),
            "case {i} {c:?}: grad {}",
            grads[i]
        );
    }
}

#[test]
fn clip_higher_widens_only_the_upper_side() {
    let cfg = PpoConfig {
        eps_clip: 0.2,
        eps_clip_higher: Some(0.28),
        ..PpoConfig::default()
    };
    let logp = [1.25f32.ln(), 1.4f32.ln(), 0.7f32.ln()];
    let adv = [1.0f32, 1.0, -1.0];
    let got = host_vec(clipped_pg(t1::<Cpu>(&logp), t1(&[0.0; 3]), t1(&adv), &cfg));
    // 1.25 is inside [0.8, 1.28]; 1.4 clips at 1.28; A < 0 with 0.7 clips at 0.8.
    for (g, want) in got.iter().zip([-1.25f32, -1.28, 0.8]) {
        assert!(close(f64::from(*g), f64::from(want), 1e-5), "{got:?}");
    }
}

#[test]
fn masks_weights_kl_and_entropy_by_hand() {
    // Three tokens: r = 1.1 (A = 2), r = 1 (A = -1, behaviour weight 0: dropped), r = 0.9 (A = 1).
    let logp = [1.1f32.ln(), -1.0, 0.9f32.ln()];
    let consts = PpoConsts {
        prox: vec![0.0, -1.0, 0.0],
        behav_weight: vec![0.5, 0.0, 2.0],
        adv: vec![2.0, -1.0, 1.0],
        weight: vec![0.25, 0.25, 0.5],
        ref_logp: Some(vec![0.0, -1.0, 0.0]),
    };
    let entropy = [1.0f32, 2.0, 3.0];
    let cfg = PpoConfig {
        kl_ctl: 0.1,
        kl_estimator: KlEstimator::K1,
        entropy_coeff: 0.01,
        ..PpoConfig::default()
    };
    let loss = host_vec(ppo_loss(t1::<Cpu>(&logp), Some(t1(&entropy)), &consts, &cfg))[0];
    // Per token: pg * behaviour weight + 0.1 * (logp - ref) - 0.01 * H, then weighted.
    let per_token = [
        -2.0 * 1.1 * 0.5 + 0.1 * 1.1f64.ln() - 0.01,
        0.0 + 0.1 * 0.0 - 0.02,
        -0.9 * 2.0 + 0.1 * 0.9f64.ln() - 0.03,
    ];
    let want = 0.25 * per_token[0] + 0.25 * per_token[1] + 0.5 * per_token[2];
    assert!(close(f64::from(loss), want, 1e-5), "{loss} != {want}");
    // Without the KL coefficient the reference is ignored, without the coefficient the entropy too.
    let plain = host_vec(ppo_loss(
        t1::<Cpu>(&logp),
        Some(t1(&entropy)),
        &consts,
        &PpoConfig::default(),
    ))[0];
    let want = 0.25 * (-2.0 * 1.1 * 0.5) + 0.5 * (-0.9 * 2.0);
    assert!(close(f64::from(plain), want, 1e-5), "{plain} != {want}");
}

#[test]
fn kl_estimators_and_behaviour_weights() {
    let d = 2f64.ln();
    assert!(close(kl_value(d, KlEstimator::K1), d, 1e-12));
    assert!(close(kl_value(d, KlEstimator::K2), d * d / 2.0, 1e-12));
    assert!(close(kl_value(d, KlEstimator::K3), 0.5 - 1.0 + d, 1e-12));
    assert!(close(kl_value(0.0, KlEstimator::K3), 0.0, 1e-12));
    assert!(kl_value(-1.3, KlEstimator::K3) > 0.0, "k3 is never negative");
    let est = |e| host_vec(super::loss::kl_estimate(t1::<Cpu>(&[d as f32]), t1(&[0.0]), e))[0];
    assert!(close(f64::from(est(KlEstimator::K3)), 0.5 - 1.0 + d, 1e-6));
    // pi_prox / pi_behave, dropped above the cap.
    assert!(close(
        f64::from(behaviour_weight(0.0, -1.0, Some(5.0))),
        std::f64::consts::E,
        1e-5
    ));
    assert_eq!(behaviour_weight(0.0, -2.0, Some(5.0)), 0.0);
    assert!(close(
        f64::from(behaviour_weight(0.0, -2.0, None)),
        (2.0f64).exp(),
        1e-4
    ));
}

#[test]
fn both_aggregations_weigh_tokens_as_documented() {
    let counts = [2, 0, 3];
    assert_eq!(
        token_weights(&counts, LossAggregation::TokenMean),
        vec![0.2, 0.0, 0.2]
    );
    let seq = token_weights(&counts, LossAggregation::SeqMeanTokenMean);
    assert_eq!(seq, vec![0.25, 0.0, 1.0 / 6.0]);
    // Either way the weights of all trained tokens add up to 1.
    for w in [token_weights(&counts, LossAggregation::TokenMean), seq] {
        let total: f32 = w.iter().zip(counts).map(|(w, c)| w * c as f32).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}

// ---------------------------------------------------------------- advantages (reference 7.4)

fn seq_with(tokens: usize, trained: usize, advantage: f32) -> TrainSequence {
    TrainSequence {
        tokens: (0..tokens as u32).collect(),
        loss_mask: (0..tokens).map(|t| t >= tokens - trained).collect(),
        logprobs: vec![-1.0; tokens],
        versions: vec![0; tokens],
        advantage,
        truncated: Vec::new(),
        temperatures: Vec::new(),
    }
}

#[test]
fn advantages_follow_the_reference_examples() {
    let batch = |advs: &[f32], trained: &[usize], sizes: Vec<usize>| RlBatch {
        sequences: advs
            .iter()
            .zip(trained)
            .map(|(&a, &n)| seq_with(n + 2, n, a))
            .collect(),
        group_sizes: sizes,
        policy_version: 0,
    };
    // Rewards [1, 0] z-scored in their group with the population std: [1, -1]; equal rewards: all 0.
    let zscore = AdvNorm {
        mean_level: Some(NormLevel::Group),
        std_level: Some(NormLevel::Group),
        std_unbiased: false,
        eps: 1e-8,
        ..AdvNorm::default()
    };
    let b = batch(&[1.0, 0.0, 0.5, 0.5, 0.5], &[3, 3, 2, 2, 2], vec![2, 3]);
    let got = normalized_advantages(&b, Some(&zscore)).unwrap();
    let want = [1.0, -1.0, 0.0, 0.0, 0.0];
    for (g, w) in got.iter().zip(want) {
        assert!(close(*g, w, 1e-6), "{got:?}");
    }
    // Advantages computed upstream (reward-routing already gave [1, -1]) pass through untouched.
    assert_eq!(
        normalized_advantages(&b, None).unwrap(),
        vec![1.0, 0.0, 0.5, 0.5, 0.5]
    );
    // Token-level: a sequence weighs by its trained tokens. Values 1 (3 tokens) and -1 (1 token): the
    // token mean is 0.5 and the unbiased token std is sqrt(3 * 0.25 + 2.25) / sqrt(3) = 1.
    let b = batch(&[1.0, -1.0], &[3, 1], vec![]);
    let got = normalized_advantages(&b, Some(&AdvNorm::default())).unwrap();
    assert!(
        close(got[0], 0.5 / (1.0 + 1e-5), 1e-9) && close(got[1], -1.5 / (1.0 + 1e-5), 1e-9),
        "{got:?}"
    );
    // Mean only (std level null): subtract, divide by 1.
    let mean_only = AdvNorm {
        std_level: None,
        ..AdvNorm::default()
    };
    assert_eq!(
        normalized_advantages(&b, Some(&mean_only)).unwrap(),
        vec![0.5, -1.5]
    );
    // Groups of adv_norm.group_size when the batch gives no sizes, and a clear error when they do not fit.
    let grouped = AdvNorm {
        group_size: 2,
        ..zscore.clone()
    };
    let b = batch(&[1.0, 0.0, 0.0, 1.0], &[1, 1, 1, 1], vec![]);
    assert_eq!(
        normalized_advantages(&b, Some(&grouped)).unwrap(),
        vec![
            1.0 / (0.5 + 1e-8) * 0.5,
            -0.5 / (0.5 + 1e-8),
            -0.5 / (0.5 + 1e-8),
            0.5 / (0.5 + 1e-8)
        ]
    );
    let odd = batch(&[1.0, 0.0, 0.0], &[1, 1, 1], vec![]);
    insta::assert_snapshot!(normalized_advantages(&odd, Some(&grouped)).unwrap_err(), @"invalid training batch: 3 sequences do not split into groups of adv_norm.group_size 2");
}

// ---------------------------------------------------------------- packing

#[test]
fn micro_batches_pack_first_fit_decreasing_within_the_budget() {
    // Effective lengths 5, 0 (nothing trained), 9, 3, 4 with a budget of 10.
    let lengths = [5, 0, 9, 3, 4];
    let bins = plan(&lengths, 10);
    assert_eq!(bins, vec![vec![2], vec![0, 4], vec![3]]);
    // A sequence longer than the budget gets a pass of its own.
    assert_eq!(plan(&[12, 2], 10), vec![vec![0], vec![1]]);
    assert!(plan(&[0, 0], 10).is_empty());
}

#[test]
fn packed_rows_restart_positions_and_cut_after_the_last_trained_token() {
    let a: Vec<u32> = vec![10, 11, 12, 13, 14];
    let a_mask = vec![false, false, true, true, false];
    let b: Vec<u32> = vec![20, 21, 22];
    let b_mask = vec![false, true, true];
    assert_eq!(effective_len(&a_mask), 4);
    // `a` records its temperatures (a greedy token at 0), `b` none, so it is scored at the default.
    let a_temps = vec![1.0, 1.0, 0.5, 0.0, 2.0];
    let temperatures = Temperatures {
        per_token: &[&a_temps, &[]],
        default: 0.8,
    };
    let p = pack(&[&a, &b], &[&a_mask, &b_mask], temperatures, &[0, 1]);
    assert_eq!(p.tokens, vec![10, 11, 12, 13, 20, 21, 22]);
    assert_eq!(p.positions, vec![0, 1, 2, 3, 0, 1, 2]);
    // Token t is predicted by row t - 1 of its own segment.
    assert_eq!(p.rows, vec![1, 2, 4, 5]);
    assert_eq!(p.targets, vec![12, 13, 21, 22]);
    assert_eq!(p.origin, vec![(0, 2), (0, 3), (1, 1), (1, 2)]);
    assert_eq!(p.inv_temperatures, vec![2.0, 1.0, 1.25, 1.25]);
    assert_eq!(p.runs.len(), 2);
    let same = pack(
        &[&b, &b],
        &[&b_mask, &b_mask],
        Temperatures::uniform(1.0),
        &[0, 1],
    );
    assert_eq!(
        same.runs,
        vec![super::pack::SegmentRun {
            start: 0,
            len: 3,
            count: 2
        }]
    );
}

// ---------------------------------------------------------------- tiny models

fn tiny_config(arch: Architecture) -> ModelConfig {
    let mut c = ModelConfig::new(arch, 29, 16, 24, 2, 4, 2);
    c.max_position_embeddings = 64;
    c.tie_word_embeddings = arch == Architecture::Llama;
    c
}

/// Random weights with norms and biases moved away from 1 and 0.
fn tiny_weights(c: &ModelConfig, seed: u64) -> Weights {
    let mut w = Weights::from_model(&CausalLm::<Cpu>::init(c, 0.4, seed, &Default::default()));
    let mut rng = SplitMix64::new(seed ^ 0x5eed);
    let names: Vec<String> = w.names().map(String::from).collect();
    for n in names {
        if n.ends_with("norm.weight") || n.ends_with(".bias") {
            let mut t = w.get(&n).expect("listed").clone();
            t.data
                .iter_mut()
                .for_each(|x| *x += (rng.next_normal() * 0.3) as f32);
            w.insert(n, t);
        }
    }
    w
}

fn random_sequence(
    rng: &mut SplitMix64,
    len: usize,
    prompt: usize,
    vocab: usize,
    advantage: f32,
) -> TrainSequence {
    TrainSequence {
        tokens: (0..len).map(|_| (rng.next_u64() % vocab as u64) as u32).collect(),
        loss_mask: (0..len).map(|t| t >= prompt).collect(),
        logprobs: (0..len).map(|_| -(rng.next_f64() * 3.0 + 0.5) as f32).collect(),
        versions: (0..len).map(|t| if t >= prompt { 0 } else { -1 }).collect(),
        advantage,
        truncated: Vec::new(),
        temperatures: Vec::new(),
    }
}

fn random_batch(seed: u64, vocab: usize, lens: &[(usize, usize)]) -> RlBatch {
    let mut rng = SplitMix64::new(seed);
    RlBatch {
        sequences: lens
            .iter()
            .enumerate()
            .map(|(i, &(len, prompt))| {
                random_sequence(&mut rng, len, prompt, vocab, if i % 2 == 0 { 1.0 } else { -0.7 })
            })
            .collect(),
        group_sizes: vec![],
        policy_version: 2,
    }
}

/// Gives the batch's sequences the temperatures of turns sampled apart: tokens at 0.6, 1.0 and 1.3 in turns
/// of three, one greedy trained token (scored at 1) in the first sequence, and the last sequence recording
/// none (scored at `PpoConfig::temperature`).
fn mix_temperatures(batch: &mut RlBatch) {
    let n = batch.sequences.len();
    for s in &mut batch.sequences[..n - 1] {
        s.temperatures = (0..s.tokens.len())
            .map(|t| [0.6, 1.0, 1.3][(t / 3) % 3])
            .collect();
    }
    let first = &mut batch.sequences[0];
    let trained = first.loss_mask.iter().position(|&m| m).expect("a trained token");
    first.temperatures[trained + 1] = 0.0;
}

/// The log-probabilities a step scores `batch`'s tokens with under `learner`'s weights: each token at its
/// recorded temperature, or at `default`.
fn scored<A: burn::tensor::backend::AutodiffBackend + Kernels>(
    learner: &Learner<A>,
    batch: &RlBatch,
    default: f64,
) -> Vec<Vec<f32>>
where
    A::InnerBackend: Kernels,
{
    let seqs: Vec<Vec<u32>> = batch.sequences.iter().map(|s| s.tokens.clone()).collect();
    let per_token: Vec<&[f32]> = batch
        .sequences
        .iter()
        .map(|s| s.temperatures.as_slice())
        .collect();
    let temperatures = Temperatures {
        per_token: &per_token,
        default,
    };
    learner.logprobs_at(&seqs, temperatures).unwrap()
}

/// Per-token log-probabilities of one sequence by `CausalLm::forward` (no packing, no training kernels).
fn reference_logprobs(c: &ModelConfig, w: &Weights, tokens: &[u32]) -> Vec<f32> {
    let model = CausalLm::<Cpu>::from_weights(c, w, &Default::default()).unwrap();
    let rope = RopeTable::new(c);
    let n = tokens.len();
    let input = AttnInput::<Cpu>::padded(&rope, &[n], n, false, &Default::default());
    let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
    let ids: Tensor<Cpu, 2, Int> = Tensor::from_data(TensorData::new(ids, [1, n]), &Default::default());
    let lp = host_vec(log_softmax(model.forward(ids, &input), 2));
    let v = c.vocab_size;
    (0..n)
        .map(|t| {
            if t == 0 {
                0.0
            } else {
                lp[(t - 1) * v + tokens[t] as usize]
            }
        })
        .collect()
}

const ARCHS: [Architecture; 3] = [Architecture::Llama, Architecture::Qwen2, Architecture::Qwen3];

#[test]
fn packed_forward_matches_each_sequence_alone_on_every_backend() {
    for arch in ARCHS {
        let c = tiny_config(arch);
        let w = tiny_weights(&c, 7);
        let batch = random_batch(3, c.vocab_size, &[(9, 3), (5, 1), (9, 4), (12, 6), (3, 1)]);
        let seqs: Vec<Vec<u32>> = batch.sequences.iter().map(|s| s.tokens.clone()).collect();
        // A budget that packs several sequences per row, with equal-length runs inside rows.
        let config = TrainConfig {
            max_tokens_per_mb: 21,
            ..TrainConfig::default()
        };
        let cpu = Learner::<CpuAutodiff>::new(&c, &w, config.clone(), &Default::default(), false).unwrap();
        let f64 = Learner::<F64>::new(&c, &w, config, &Default::default(), false).unwrap();
        let packed_cpu = cpu.logprobs(&seqs, 1.0).unwrap();
        let packed_f64 = f64.logprobs(&seqs, 1.0).unwrap();
        for (i, s) in seqs.iter().enumerate() {
            let alone = reference_logprobs(&c, &w, s);
            for t in 1..s.len() {
                let (a, b, d) = (alone[t], packed_cpu[i][t], packed_f64[i][t]);
                assert!(
                    (a - b).abs() < 2e-5,
                    "{arch:?} seq {i} token {t}: alone {a}, packed cpu {b}"
                );
                assert!(
                    (a - d).abs() < 2e-5,
                    "{arch:?} seq {i} token {t}: alone {a}, packed f64 {d}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------- gradients

fn full_config() -> TrainConfig {
    TrainConfig {
        max_tokens_per_mb: 20,
        ppo: PpoConfig {
            c_clip: Some(3.0),
            kl_ctl: 0.1,
            kl_estimator: KlEstimator::K3,
            entropy_coeff: 0.05,
            temperature: 0.9,
            ..PpoConfig::default()
        },
        ..TrainConfig::default()
    }
}

/// Every gradient of `store` on the host, by name.
fn grads_of<B: burn::tensor::backend::Backend>(
    store: &crate::optim::GradStore<B>,
    names: &[String],
) -> BTreeMap<String, Vec<f64>> {
    names
        .iter()
        .filter_map(|n| {
            store.get(n).map(|g| {
                let v = g.clone().into_data().convert::<f64>().into_vec::<f64>().unwrap();
                (n.clone(), v)
            })
        })
        .collect()
}

/// A policy that has moved away from its reference, so the KL term has a gradient.
fn moved(c: &ModelConfig, w: &Weights) -> Weights {
    let other = tiny_weights(c, 99);
    let mut out = w.clone();
    for n in w.names() {
        let mut t = w.get(n).unwrap().clone();
        for (x, y) in t.data.iter_mut().zip(&other.get(n).unwrap().data) {
            *x += 0.05 * y;
        }
        out.insert(n.to_string(), t);
    }
    out
}

#[test]
fn cpu_kernel_gradients_match_burn_autodiff() {
    for arch in ARCHS {
        let c = tiny_config(arch);
        let w = tiny_weights(&c, 11);
        let policy = moved(&c, &w);
        let mut batch = random_batch(5, c.vocab_size, &[(9, 3), (7, 2), (9, 5), (14, 4)]);
        mix_temperatures(&mut batch);
        for decoupled in [false, true] {
            let mut config = full_config();
            config.ppo.use_decoupled_loss = decoupled;
            config.ppo.behav_imp_weight_cap = decoupled.then_some(8.0);
            let mut cpu =
                Learner::<CpuAutodiff>::new(&c, &w, config.clone(), &Default::default(), false).unwrap();
            let mut f64 = Learner::<F64>::new(&c, &w, config, &Default::default(), false).unwrap();
            cpu.restore(&policy, &BTreeMap::new(), 0).unwrap();
            f64.restore(&policy, &BTreeMap::new(), 0).unwrap();
            let (loss_a, store_a, ..) = cpu.grpo_gradients(&batch).unwrap();
            let (loss_b, store_b, ..) = f64.grpo_gradients(&batch).unwrap();
            assert!(
                (loss_a - loss_b).abs() < 1e-5 * (1.0 + loss_b.abs()),
                "{arch:?}: loss {loss_a} vs {loss_b}"
            );
            let names: Vec<String> = w.names().map(String::from).collect();
            let (ga, gb) = (grads_of(&store_a, &names), grads_of(&store_b, &names));
            assert_eq!(ga.keys().collect::<Vec<_>>(), gb.keys().collect::<Vec<_>>());
            assert_eq!(ga.len(), w.len(), "{arch:?}: every parameter gets a gradient");
            for (n, a) in &ga {
                let b = &gb[n];
                let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-6);
                let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
                assert!(
                    worst <= 1e-3 * scale + 1e-6,
                    "{arch:?} decoupled={decoupled} {n}: max diff {worst} (scale {scale})"
                );
            }
        }
    }
}

#[test]
fn finite_differences_agree_with_the_gradient() {
    for arch in ARCHS {
        let c = tiny_config(arch);
        let reference = tiny_weights(&c, 21);
        let policy = moved(&c, &reference);
        let mut config = full_config();
        config.ppo.c_clip = None;
        let mut learner =
            Learner::<F64>::new(&c, &reference, config.clone(), &Default::default(), false).unwrap();
        learner.restore(&policy, &BTreeMap::new(), 0).unwrap();
        // Behaviour log-probabilities near the policy's, so every ratio sits strictly inside the clip range
        // and the loss is smooth where it is probed.
        let mut batch = random_batch(8, c.vocab_size, &[(8, 3), (10, 4), (6, 2)]);
        mix_temperatures(&mut batch);
        let current = scored(&learner, &batch, config.ppo.temperature);
        let mut rng = SplitMix64::new(4);
        for (s, lp) in batch.sequences.iter_mut().zip(current) {
            for (b, l) in s.logprobs.iter_mut().zip(lp) {
                *b = l + ((rng.next_f64() - 0.5) * 0.1) as f32;
            }
        }
        let (_, store, ..) = learner.grpo_gradients(&batch).unwrap();
        let names: Vec<String> = policy.names().map(String::from).collect();
        let grads = grads_of(&store, &names);
        let loss_at = |weights: &Weights| {
            let mut l =
                Learner::<F64>::new(&c, &reference, config.clone(), &Default::default(), false).unwrap();
            l.restore(weights, &BTreeMap::new(), 0).unwrap();
            l.grpo_gradients(&batch).unwrap().0
        };
        let mut checked = 0;
        for name in &names {
            let len = policy.get(name).unwrap().data.len();
            for k in 0..2 {
                let i = (rng.next_u64() as usize + k * 7) % len;
                let x = policy.get(name).unwrap().data[i];
                let h = 1e-3f32;
                let (mut plus, mut minus) = (policy.clone(), policy.clone());
                let mut tp = plus.get(name).unwrap().clone();
                tp.data[i] = x + h;
                plus.insert(name.clone(), tp);
                let mut tm = minus.get(name).unwrap().clone();
                tm.data[i] = x - h;
                minus.insert(name.clone(), tm);
                let step = f64::from(x + h) - f64::from(x - h);
                let fd = (loss_at(&plus) - loss_at(&minus)) / step;
                let an = grads[name][i];
                assert!(
                    (fd - an).abs() <= 2e-5 + 2e-3 * an.abs(),
                    "{arch:?} {name}[{i}]: finite difference {fd}, gradient {an}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 2 * names.len());
    }
}

// ---------------------------------------------------------------- chunks and blocks

/// Uniform values in `[-scale, scale)`.
fn uniform(rng: &mut SplitMix64, n: usize, scale: f64) -> Vec<f32> {
    (0..n)
        .map(|_| ((rng.next_f64() * 2.0 - 1.0) * scale) as f32)
        .collect()
}

fn host<B: burn::tensor::backend::Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f64> {
    t.into_data().convert::<f64>().into_vec::<f64>().unwrap()
}

/// The largest difference between `a` and `b`, relative to `b`'s largest magnitude.
fn assert_close(what: &str, a: &[f64], b: &[f64], tol: f64) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-6);
    let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    assert!(worst <= tol * scale, "{what}: max diff {worst} (scale {scale})");
}

/// Values and input gradients of the output projection on `B`, row `i` at inverse temperature `inv[i]`,
/// under the upstream gradient `g`; `chunk` `None` is the whole computation of burn's autodiff.
fn logp_case<B: burn::tensor::backend::AutodiffBackend + Kernels>(
    (h, w, g): (&[f32], &[f32], &[f32]),
    (n, hidden, vocab): (usize, usize, usize),
    (targets, inv): (&[i64], &[f32]),
    chunk: Option<usize>,
) -> [Vec<f64>; 3] {
    let device = Default::default();
    let ht = kernels::host_tensor::<B, 2>(h.to_vec(), [n, hidden], &device).require_grad();
    let wt = kernels::host_tensor::<B, 2>(w.to_vec(), [vocab, hidden], &device).require_grad();
    let out = match chunk {
        Some(c) => B::token_logp(ht.clone(), wt.clone(), targets, inv, false, c),
        None => kernels::dense_token_logp(ht.clone(), wt.clone(), targets, inv),
    };
    let gt = kernels::host_tensor::<B, 2>(g.to_vec(), [n, 2], &device);
    let grads = (out.clone() * gt).sum().backward();
    [
        host(out.detach()),
        host(ht.grad(&grads).unwrap()),
        host(wt.grad(&grads).unwrap()),
    ]
}

#[test]
fn the_chunked_output_projection_matches_the_whole_computation() {
    let (n, hidden, vocab) = (11, 8, 13);
    let mut rng = SplitMix64::new(41);
    let h = uniform(&mut rng, n * hidden, 1.5);
    let w = uniform(&mut rng, vocab * hidden, 1.5);
    let g = uniform(&mut rng, n * 2, 1.0);
    let targets: Vec<i64> = (0..n).map(|i| ((i * 5 + 3) % vocab) as i64).collect();
    let inputs = (&h[..], &w[..], &g[..]);
    let dims = (n, hidden, vocab);
    let inverse = |temperatures: &[f32]| -> Vec<f32> { temperatures.iter().map(|t| 1.0 / t).collect() };
    // Every row at 1 (no scaling), every row at 0.9 (one scale per chunk), and rows sampled at their own
    // temperatures: with chunks of 4, the first chunk all at 1.3, the second all at 1, the last mixed.
    let mixed = [1.3, 1.3, 1.3, 1.3, 1.0, 1.0, 1.0, 1.0, 0.6, 1.0, 1.3];
    let cases = [
        ("1", vec![1.0; n]),
        ("0.9", vec![0.9; n]),
        ("mixed", mixed.to_vec()),
    ];
    for (name, temperatures) in cases {
        let inv = inverse(&temperatures);
        let whole = logp_case::<F64>(inputs, dims, (&targets, &inv), None);
        // Chunks of 4 rows: three chunks, the last one ragged; one chunk holds rows of several sequences as
        // the trained rows of a packed row do. Then one chunk of everything.
        for chunk in [4, 1, usize::MAX] {
            let f64 = logp_case::<F64>(inputs, dims, (&targets, &inv), Some(chunk));
            let cpu = logp_case::<CpuAutodiff>(inputs, dims, (&targets, &inv), Some(chunk));
            let inner = logp_forward_only::<Cpu>(inputs, dims, (&targets, &inv), chunk);
            // burn's differentiation of its log-softmax agrees with the closed form to 3e-8 only, in f64.
            for (i, (what, tol)) in [("values", 1e-12), ("dh", 1e-6), ("dw", 1e-6)].iter().enumerate() {
                let at = format!("temperatures {name} chunk {chunk} {what}");
                assert_close(&format!("f64 {at}"), &f64[i], &whole[i], *tol);
                assert_close(&format!("cpu {at}"), &cpu[i], &whole[i], 2e-5);
            }
            assert_close(
                &format!("cpu forward, temperatures {name} chunk {chunk}"),
                &inner,
                &whole[0],
                2e-5,
            );
        }
    }
    // Each mixed row is the row of the run with every row at its temperature.
    let mixed_inv = inverse(&mixed);
    let mixed_out = logp_case::<CpuAutodiff>(inputs, dims, (&targets, &mixed_inv), Some(4))[0].clone();
    for t in [0.6f32, 1.0, 1.3] {
        let inv = inverse(&vec![t; n]);
        let uniform = logp_case::<CpuAutodiff>(inputs, dims, (&targets, &inv), Some(4))[0].clone();
        for (r, _) in mixed.iter().enumerate().filter(|&(_, &m)| m == t) {
            for k in 0..2 {
                let (a, b) = (mixed_out[2 * r + k], uniform[2 * r + k]);
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "row {r} at {t}: {a} vs {b}"
                );
            }
        }
    }
}

/// The output projection's values on the plain (non-autodiff) backend `B`, as the no-grad scoring runs it.
fn logp_forward_only<B: Kernels>(
    (h, w, _): (&[f32], &[f32], &[f32]),
    (n, hidden, vocab): (usize, usize, usize),
    (targets, inv): (&[i64], &[f32]),
    chunk: usize,
) -> Vec<f64> {
    let device = Default::default();
    let ht = kernels::host_tensor::<B, 2>(h.to_vec(), [n, hidden], &device);
    let wt = kernels::host_tensor::<B, 2>(w.to_vec(), [vocab, hidden], &device);
    host(B::token_logp(ht, wt, targets, inv, false, chunk))
}

/// Values and input gradients of attention over the packed `runs` on `B`; `block` `None` is the whole
/// `n x n` computation under burn's autodiff.
fn attention_case<B: burn::tensor::backend::AutodiffBackend + Kernels>(
    (q, k, v, g): (&[f32], &[f32], &[f32], &[f32]),
    (rows, nh, nkv, d): (usize, usize, usize, usize),
    runs: &[pack::SegmentRun],
    block: Option<usize>,
) -> [Vec<f64>; 4] {
    let device = Default::default();
    let qt = kernels::host_tensor::<B, 3>(q.to_vec(), [rows, nh, d], &device).require_grad();
    let kt = kernels::host_tensor::<B, 3>(k.to_vec(), [rows, nkv, d], &device).require_grad();
    let vt = kernels::host_tensor::<B, 3>(v.to_vec(), [rows, nkv, d], &device).require_grad();
    let scale = 1.0 / (d as f64).sqrt();
    let out = match block {
        Some(b) => B::packed_attention(qt.clone(), kt.clone(), vt.clone(), runs, scale, false, b),
        None => kernels::dense_attention(qt.clone(), kt.clone(), vt.clone(), runs, scale),
    };
    let gt = kernels::host_tensor::<B, 2>(g.to_vec(), [rows, nh * d], &device);
    let grads = (out.clone() * gt).sum().backward();
    [
        host(out.detach()),
        host(qt.grad(&grads).unwrap()),
        host(kt.grad(&grads).unwrap()),
        host(vt.grad(&grads).unwrap()),
    ]
}

#[test]
fn blocked_attention_matches_the_whole_computation() {
    // Two sequences of 7 tokens side by side in one run, then one of 5 and one of 3; four query heads share
    // two key/value heads.
    let runs = vec![
        pack::SegmentRun {
            start: 0,
            len: 7,
            count: 2,
        },
        pack::SegmentRun {
            start: 14,
            len: 5,
            count: 1,
        },
        pack::SegmentRun {
            start: 19,
            len: 3,
            count: 1,
        },
    ];
    let (rows, nh, nkv, d) = (22, 4, 2, 6);
    let mut rng = SplitMix64::new(43);
    let q = uniform(&mut rng, rows * nh * d, 1.5);
    let k = uniform(&mut rng, rows * nkv * d, 1.5);
    let v = uniform(&mut rng, rows * nkv * d, 1.0);
    let g = uniform(&mut rng, rows * nh * d, 1.0);
    let inputs = (&q[..], &k[..], &v[..], &g[..]);
    let dims = (rows, nh, nkv, d);
    let whole = attention_case::<F64>(inputs, dims, &runs, None);
    // Blocks of 3 rows: a 7-token sequence takes three blocks, the last one ragged; blocks of 1 and 2; then
    // one block per sequence.
    for block in [3, 1, 2, usize::MAX] {
        let f64 = attention_case::<F64>(inputs, dims, &runs, Some(block));
        let cpu = attention_case::<CpuAutodiff>(inputs, dims, &runs, Some(block));
        for (i, what) in ["values", "dq", "dk", "dv"].iter().enumerate() {
            assert_close(&format!("f64 block {block} {what}"), &f64[i], &whole[i], 1e-12);
            assert_close(&format!("cpu block {block} {what}"), &cpu[i], &whole[i], 2e-5);
        }
    }
}

/// Loss and every gradient of one GRPO step's micro-batches with `memory`.
fn step_with<A: burn::tensor::backend::AutodiffBackend + Kernels>(
    c: &ModelConfig,
    w: &Weights,
    batch: &RlBatch,
    memory: MemoryConfig,
) -> (f64, BTreeMap<String, Vec<f64>>)
where
    A::InnerBackend: Kernels,
{
    let mut learner = Learner::<A>::new(c, w, full_config(), &Default::default(), false).unwrap();
    learner.set_memory(memory).unwrap();
    learner.restore(&moved(c, w), &BTreeMap::new(), 0).unwrap();
    let (loss, store, ..) = learner.grpo_gradients(batch).unwrap();
    let names: Vec<String> = w.names().map(String::from).collect();
    (loss, grads_of(&store, &names))
}

#[test]
fn chunks_blocks_and_layer_recompute_leave_the_step_unchanged() {
    for arch in ARCHS {
        let c = tiny_config(arch);
        let w = tiny_weights(&c, 17);
        // Packed rows of several sequences (a budget of 20 tokens): logits chunks of 5 rows straddle
        // sequence boundaries, attention blocks of 3 rows split every sequence, with a ragged last block.
        let mut batch = random_batch(6, c.vocab_size, &[(9, 3), (7, 2), (9, 5), (14, 4)]);
        mix_temperatures(&mut batch);
        let small = MemoryConfig {
            logits_chunk: 5,
            attention_block: 3,
            recompute_layers: false,
        };
        let recompute = MemoryConfig {
            recompute_layers: true,
            ..small
        };
        let (loss, grads) = step_with::<F64>(&c, &w, &batch, MemoryConfig::unchunked());
        let (loss_f64, grads_f64) = step_with::<F64>(&c, &w, &batch, small);
        assert!(
            (loss - loss_f64).abs() < 1e-12,
            "{arch:?}: f64 loss {loss_f64} vs {loss}"
        );
        for (n, g) in &grads {
            assert_close(&format!("{arch:?} f64 chunked {n}"), &grads_f64[n], g, 1e-10);
        }
        let (cpu_loss, cpu_grads) = step_with::<CpuAutodiff>(&c, &w, &batch, MemoryConfig::unchunked());
        for memory in [small, recompute] {
            let (l, g) = step_with::<CpuAutodiff>(&c, &w, &batch, memory);
            assert!(
                (l - loss).abs() < 1e-5 * (1.0 + loss.abs()),
                "{arch:?} {memory:?}: loss {l} vs {loss}"
            );
            assert!(
                (l - cpu_loss).abs() < 1e-5,
                "{arch:?} {memory:?}: loss {l} vs {cpu_loss}"
            );
            assert_eq!(
                g.len(),
                w.len(),
                "{arch:?} {memory:?}: every parameter gets a gradient"
            );
            for (n, want) in &grads {
                assert_close(&format!("{arch:?} {memory:?} {n} vs f64"), &g[n], want, 1e-3);
                assert_close(
                    &format!("{arch:?} {memory:?} {n} vs cpu"),
                    &g[n],
                    &cpu_grads[n],
                    1e-4,
                );
            }
        }
    }
}

#[test]
fn memory_settings_are_checked() {
    let c = tiny_config(Architecture::Llama);
    let w = tiny_weights(&c, 1);
    let mut f64 = Learner::<F64>::new(&c, &w, TrainConfig::default(), &Default::default(), false).unwrap();
    let err = f64
        .set_memory(MemoryConfig {
            recompute_layers: true,
            ..MemoryConfig::default()
        })
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("recompute_layers is only implemented on the cpu"),
        "{err}"
    );
    let err = f64
        .set_memory(MemoryConfig {
            logits_chunk: 0,
            attention_block: 0,
            recompute_layers: false,
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("memory.logits_chunk must be >= 1, got 0"), "{err}");
    assert!(
        err.contains("memory.attention_block must be >= 1, got 0"),
        "{err}"
    );
    assert_eq!(f64.memory(), MemoryConfig::default());
}

// ---------------------------------------------------------------- whole steps

fn cpu_learner(arch: Architecture, config: TrainConfig) -> (ModelConfig, Weights, Learner<CpuAutodiff>) {
    let c = tiny_config(arch);
    let w = tiny_weights(&c, 31);
    let l = Learner::<CpuAutodiff>::new(&c, &w, config, &Default::default(), false).unwrap();
    (c, w, l)
}

#[test]
fn untrained_positions_do_not_change_the_step() {
    let (c, _, learner) = cpu_learner(Architecture::Llama, TrainConfig::default());
    let batch = random_batch(12, c.vocab_size, &[(10, 3), (8, 2)]);
    let mut other = batch.clone();
    for s in &mut other.sequences {
        // Behaviour log-probabilities and versions of prompt tokens are noise; tokens after the last
        // trained token cannot influence a causal model.
        s.logprobs[0] = -123.0;
        s.versions[1] = 77;
        s.loss_mask.push(false);
        s.tokens.push(5);
        s.logprobs.push(0.5);
        s.versions.push(-1);
    }
    let (l1, g1, ..) = learner.grpo_gradients(&batch).unwrap();
    let (l2, g2, ..) = learner.grpo_gradients(&other).unwrap();
    assert_eq!(l1, l2);
    let names: Vec<String> = tiny_weights(&c, 31).names().map(String::from).collect();
    assert_eq!(grads_of(&g1, &names), grads_of(&g2, &names));
    // The context does matter.
    let mut changed = batch.clone();
    changed.sequences[0].tokens[1] = (changed.sequences[0].tokens[1] + 1) % c.vocab_size as u32;
    assert_ne!(learner.grpo_gradients(&changed).unwrap().0, l1);
}

#[test]
fn micro_batching_does_not_change_the_gradient() {
    let batch = random_batch(13, 29, &[(10, 3), (8, 2), (10, 4), (5, 1), (12, 2)]);
    let mut results = Vec::new();
    for budget in [8, 20, 1000] {
        let config = TrainConfig {
            max_tokens_per_mb: budget,
            ..TrainConfig::default()
        };
        let (c, w, learner) = cpu_learner(Architecture::Qwen3, config);
        let (loss, store, _, shape) = learner.grpo_gradients(&batch).unwrap();
        let names: Vec<String> = w.names().map(String::from).collect();
        results.push((loss, grads_of(&store, &names), shape.micro_batches));
        let _ = c;
    }
    assert_eq!(results.iter().map(|r| r.2).collect::<Vec<_>>(), vec![5, 3, 1]);
    for r in &results[1..] {
        assert!((r.0 - results[0].0).abs() < 1e-6);
        for (n, g) in &r.1 {
            for (a, b) in g.iter().zip(&results[0].1[n]) {
                assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "{n}: {a} vs {b}");
            }
        }
    }
}

#[test]
fn the_decoupled_proximal_policy_is_the_pre_update_policy() {
    let config = TrainConfig {
        ppo: PpoConfig {
            use_decoupled_loss: true,
            behav_imp_weight_cap: Some(2.0),
            ..PpoConfig::default()
        },
        ..TrainConfig::default()
    };
    let (c, _, mut learner) = cpu_learner(Architecture::Qwen2, config);
    let mut batch = random_batch(14, c.vocab_size, &[(9, 3), (9, 3)]);
    let seqs: Vec<Vec<u32>> = batch.sequences.iter().map(|s| s.tokens.clone()).collect();
    // The recomputation: a separate no-grad pass of the weights before the step.
    let prox = learner.logprobs(&seqs, 1.0).unwrap();
    // Behaviour = prox - 0.1 on the first sequence (weight e^0.1, kept) and prox - 1 on the second
    // (weight e > 2: dropped).
    for (i, s) in batch.sequences.iter_mut().enumerate() {
        let shift = if i == 0 { 0.1 } else { 1.0 };
        for (b, p) in s.logprobs.iter_mut().zip(&prox[i]) {
            *b = p - shift;
        }
    }
    let stats = learner.grpo_step(&batch).unwrap();
    assert_eq!(
        stats.clip_fraction, 0.0,
        "the ratio to the proximal policy is 1 in a single update"
    );
    let r = stats.importance_weight.unwrap();
    assert!((r.min - 1.0).abs() < 1e-6 && (r.max - 1.0).abs() < 1e-6, "{r:?}");
    assert!((stats.behave_dropped_fraction - 0.5).abs() < 1e-9);
    let w = stats.behave_imp_weight.unwrap();
    assert!((w.mean - 0.1f64.exp()).abs() < 1e-4, "{w:?}");
    let st = stats.staleness.unwrap();
    assert_eq!((st.min, st.max), (2.0, 2.0));
}

#[test]
fn the_step_moves_probability_towards_positive_advantages_and_away_from_negative_ones() {
    let config = TrainConfig {
        schedule: LrSchedule::constant(1e-2),
        ..TrainConfig::default()
    };
    let (c, _, mut learner) = cpu_learner(Architecture::Llama, config);
    let mut batch = random_batch(15, c.vocab_size, &[(8, 4), (8, 4)]);
    batch.sequences[0].advantage = 1.0;
    batch.sequences[1].advantage = -1.0;
    let seqs: Vec<Vec<u32>> = batch.sequences.iter().map(|s| s.tokens.clone()).collect();
    let before = learner.logprobs(&seqs, 1.0).unwrap();
    for (s, lp) in batch.sequences.iter_mut().zip(&before) {
        s.logprobs.clone_from(lp);
    }
    let stats = learner.grpo_step(&batch).unwrap();
    assert_eq!((stats.step, stats.tokens, stats.sequences), (1, 8, 2));
    assert!(stats.grad_norm > 0.0 && (stats.lr - 1e-2).abs() < 1e-12);
    let after = learner.logprobs(&seqs, 1.0).unwrap();
    let sum = |v: &[f32]| v[4..].iter().map(|&x| f64::from(x)).sum::<f64>();
    assert!(
        sum(&after[0]) > sum(&before[0]),
        "positive advantage: more likely"
    );
    assert!(
        sum(&after[1]) < sum(&before[1]),
        "negative advantage: less likely"
    );
    // Equal advantages of zero give no policy gradient at all.
    let mut zero = batch.clone();
    zero.sequences.iter_mut().for_each(|s| s.advantage = 0.0);
    let (_, store, ..) = learner.grpo_gradients(&zero).unwrap();
    assert_eq!(store.global_norm(), 0.0);
}

#[test]
fn supervised_steps_lower_the_cross_entropy() {
    let config = TrainConfig {
        schedule: LrSchedule::constant(3e-2),
        ..TrainConfig::default()
    };
    let (_, _, mut learner) = cpu_learner(Architecture::Qwen3, config);
    let batch = SftBatch {
        sequences: vec![
            SftSequence {
                tokens: vec![1, 2, 3, 4, 5, 6],
                loss_mask: vec![false, false, false, true, true, true],
            },
            SftSequence {
                tokens: vec![7, 8, 9, 10],
                loss_mask: vec![false, true, true, true],
            },
        ],
    };
    let first = learner.sft_step(&batch).unwrap();
    let mut last = first.clone();
    for _ in 0..30 {
        last = learner.sft_step(&batch).unwrap();
    }
    assert_eq!((first.tokens, first.sequences), (6, 2));
    assert!(
        first.loss > 2.0 && last.loss < 0.1 * first.loss,
        "{} -> {}",
        first.loss,
        last.loss
    );
    assert_eq!(last.step, 31);
}

// ---------------------------------------------------------------- bad input

#[test]
fn malformed_batches_are_named() {
    let good = || random_batch(1, 29, &[(6, 2), (5, 1)]);
    let (_, _, mut learner) = cpu_learner(Architecture::Llama, TrainConfig::default());
    let mut cases: Vec<(&str, RlBatch)> = Vec::new();
    let mut b = good();
    b.sequences[1].loss_mask.pop();
    cases.push(("short mask", b));
    let mut b = good();
    b.sequences[0].tokens[3] = 29;
    cases.push(("token out of range", b));
    let mut b = good();
    b.sequences[0].loss_mask[0] = true;
    cases.push(("first token trained", b));
    let mut b = good();
    b.sequences[1].logprobs[3] = 0.5;
    cases.push(("positive logprob", b));
    let mut b = good();
    b.sequences[1].temperatures = vec![1.0; 4];
    cases.push(("short temperatures", b));
    let mut b = good();
    b.sequences[0].temperatures = vec![1.0; 6];
    b.sequences[0].temperatures[3] = -0.5;
    cases.push(("negative temperature", b));
    let mut b = good();
    b.sequences[1].temperatures = vec![1.0; 5];
    b.sequences[1].temperatures[2] = f32::NAN;
    cases.push(("nan temperature", b));
    let mut b = good();
    b.sequences[0].advantage = f32::NAN;
    cases.push(("nan advantage", b));
    let mut b = good();
    b.group_sizes = vec![3];
    cases.push(("group sizes", b));
    let mut b = good();
    b.sequences.iter_mut().for_each(|s| s.loss_mask.fill(false));
    cases.push(("nothing trained", b));
    cases.push(("empty", RlBatch::default()));
    let report: Vec<String> = cases
        .into_iter()
        .map(|(name, b)| format!("{name}: {}", learner.grpo_step(&b).unwrap_err()))
        .collect();
    insta::assert_snapshot!(report.join("\n"), @r"
    short mask: invalid training batch: sequence 1: loss_mask has 4 entries for 5 tokens
    token out of range: invalid training batch: sequence 0: token 29 is outside the vocabulary of 29
    first token trained: invalid training batch: sequence 0: loss_mask[0] is set, but the first token has no context to be predicted from
    positive logprob: invalid training batch: sequence 1: logprobs[3] = 0.5 is not a log-probability
    short temperatures: invalid training batch: sequence 1: temperatures has 4 entries for 5 tokens
    negative temperature: invalid training batch: sequence 0: temperatures[3] = -0.5 is not a sampling temperature (finite and >= 0)
    nan temperature: invalid training batch: sequence 1: temperatures[2] = NaN is not a sampling temperature (finite and >= 0)
    nan advantage: invalid training batch: sequence 0: advantage NaN is not finite
    group sizes: invalid training batch: group_sizes [3] do not split 2 sequences into non-empty groups
    nothing trained: invalid training batch: no sequence has a trained token
    empty: invalid training batch: the batch has no sequences
    ");
    assert_eq!(learner.steps(), 0, "no failed step moved the optimiser");
}

#[test]
fn every_config_problem_is_reported_at_once() {
    let mut c = TrainConfig::default();
    c.schedule.lr = -1.0;
    c.schedule.min_lr_ratio = 2.0;
    c.adamw.beta2 = 1.5;
    c.gradient_clipping = f64::INFINITY;
    c.max_tokens_per_mb = 0;
    c.ppo.eps_clip = 0.0;
    c.ppo.c_clip = Some(0.5);
    c.ppo.behav_imp_weight_cap = Some(3.0);
    c.ppo.kl_ctl = -0.1;
    c.ppo.temperature = 0.0;
    c.ppo.adv_norm = Some(AdvNorm {
        group_size: 0,
        ..AdvNorm::default()
    });
    insta::assert_snapshot!(c.validate().unwrap_err().to_string().replace("; ", "\n"), @r"
    invalid training config: lr must be finite and >= 0, got -1
    min_lr_ratio must be in [0, 1], got 2
    beta2 must be in [0, 1), got 1.5
    gradient_clipping must be finite and >= 0, got inf
    max_tokens_per_mb must be >= 1, got 0
    eps_clip must be finite and positive, got 0
    temperature must be finite and positive, got 0
    c_clip must be finite and > 1, got 0.5
    behav_imp_weight_cap needs use_decoupled_loss
    kl_ctl must be finite and >= 0, got -0.1
    adv_norm.group_size must be >= 1, got 0
    ");
}

// ---------------------------------------------------------------- behaviour log-probability drift

/// The drift metric compares each trained token's recorded behaviour log-probability with the trainer's
/// proximal one at the same weights: zero when they agree, the largest disagreement otherwise, truncated
/// tokens apart, and tokens of another version left out.
#[test]
fn the_drift_metric_sees_what_the_trainer_disagrees_with() {
    let c = tiny_config(Architecture::Qwen3);
    let w = tiny_weights(&c, 9);
    let mut config = full_config();
    config.ppo.temperature = 0.7;
    let step = |batch: &RlBatch| {
        let mut learner =
            Learner::<CpuAutodiff>::new(&c, &w, config.clone(), &Default::default(), false).unwrap();
        learner.grpo_step(batch).unwrap()
    };
    let mut batch = random_batch(3, c.vocab_size, &[(9, 3), (11, 4), (7, 2)]);
    let seqs: Vec<Vec<u32>> = batch.sequences.iter().map(|s| s.tokens.clone()).collect();
    let learner = Learner::<CpuAutodiff>::new(&c, &w, config.clone(), &Default::default(), false).unwrap();
    let current = learner.logprobs(&seqs, config.ppo.temperature).unwrap();
    for (s, lp) in batch.sequences.iter_mut().zip(current) {
        s.logprobs = lp;
        s.versions = s.loss_mask.iter().map(|&m| if m { 2 } else { -1 }).collect();
    }
    let exact = step(&batch);
    let drift = exact.behave_logprob_drift.expect("tokens of this version");
    eprintln!("untruncated drift at one version, f32 on the CPU: {drift:?}");
    assert!(drift.max < 1e-4, "f32 on the CPU: {drift:?}");
    assert!(exact.behave_logprob_drift_truncated.is_none());
    // One token recorded 0.25 off, the last sequence truncated, the second sampled under another version.
    batch.sequences[0].logprobs[5] += 0.25;
    batch.sequences[2].truncated = vec![true; 7];
    batch.sequences[1].versions = vec![1; 11];
    let off = step(&batch);
    let drift = off.behave_logprob_drift.expect("the first sequence's tokens");
    assert!((drift.max - 0.25).abs() < 1e-3, "{drift:?}");
    let truncated = off
        .behave_logprob_drift_truncated
        .expect("the last sequence's tokens");
    assert!(truncated.max < 1e-4, "{truncated:?}");
    let names: Vec<String> = off.records("train/").into_iter().map(|(n, _)| n).collect();
    assert!(
        names.iter().any(|n| n == "train/behave_logprob_drift/max"),
        "{names:?}"
    );
    assert!(
        names
            .iter()
            .any(|n| n == "train/behave_logprob_drift_truncated/mean"),
        "{names:?}"
    );
}

/// A sequence that records its tokens' temperatures is scored at them, with `PpoConfig::temperature` at 1:
/// recorded all at T, it gets the log-probabilities of scoring it at T; with two temperatures (and a greedy
/// token) mixed within it, each token gets the value of the uniform run at its own temperature; and a step's
/// proximal log-probabilities are those values, so its drift against them is zero.
#[test]
fn each_token_is_scored_at_its_own_temperature() {
    let c = tiny_config(Architecture::Qwen2);
    let w = tiny_weights(&c, 13);
    let mut config = full_config();
    config.max_tokens_per_mb = 24;
    config.ppo.temperature = 1.0;
    let learner = Learner::<CpuAutodiff>::new(&c, &w, config.clone(), &Default::default(), false).unwrap();
    // Two sequences share a micro-batch, the third has one of its own.
    let mut batch = random_batch(4, c.vocab_size, &[(10, 3), (8, 2), (12, 5)]);
    let seqs: Vec<Vec<u32>> = batch.sequences.iter().map(|s| s.tokens.clone()).collect();
    let temperatures = [0.6f32, 1.0, 1.3];
    let uniform: Vec<Vec<Vec<f32>>> = temperatures
        .iter()
        .map(|&t| learner.logprobs(&seqs, f64::from(t)).unwrap())
        .collect();
    for (k, &t) in temperatures.iter().enumerate() {
        for s in &mut batch.sequences {
            s.temperatures = vec![t; s.tokens.len()];
        }
        assert_eq!(scored(&learner, &batch, 1.0), uniform[k], "recorded at {t}");
    }
    assert_ne!(uniform[0], uniform[2], "the temperature matters");
    // The first turn of each output at 0.6, the rest at 1.3, one greedy token scored at 1.
    for s in &mut batch.sequences {
        let start = s.loss_mask.iter().position(|&m| m).unwrap();
        s.temperatures = (0..s.tokens.len())
            .map(|t| if t < start + 3 { 0.6 } else { 1.3 })
            .collect();
    }
    batch.sequences[1].temperatures[4] = 0.0;
    let mixed = scored(&learner, &batch, 1.0);
    let mut worst = 0.0f32;
    for (i, s) in batch.sequences.iter_mut().enumerate() {
        for t in 1..s.tokens.len() {
            // The greedy token is scored at 1.
            let k = temperatures
                .iter()
                .position(|&x| x == s.temperatures[t])
                .unwrap_or(1);
            let want = uniform[k][i][t];
            worst = worst.max((mixed[i][t] - want).abs());
            // The behaviour log-probability the sampler would have recorded at this token's temperature.
            s.logprobs[t] = want;
        }
        s.versions = s.loss_mask.iter().map(|&m| if m { 2 } else { -1 }).collect();
    }
    eprintln!("mixed temperatures against the uniform runs: max difference {worst}");
    assert!(worst < 1e-6, "{worst}");
    let step = |batch: &RlBatch| {
        let mut l = Learner::<CpuAutodiff>::new(&c, &w, config.clone(), &Default::default(), false).unwrap();
        l.grpo_step(batch).unwrap()
    };
    let drift = step(&batch).behave_logprob_drift.expect("tokens of this version");
    eprintln!("proximal at each token's temperature against the uniform runs: drift {drift:?}");
    assert!(drift.max < 1e-6, "{drift:?}");
    // Scored at gconfig.temperature instead, the same tokens drift: the metric would catch it.
    for s in &mut batch.sequences {
        s.temperatures.clear();
    }
    let at_one = step(&batch).behave_logprob_drift.expect("tokens of this version");
    assert!(at_one.max > 1e-2, "{at_one:?}");
}
