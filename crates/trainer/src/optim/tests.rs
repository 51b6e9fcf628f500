//! AdamW against the update written out by hand, schedules at known steps, global-norm clipping, and the
//! moments' round trip through the host.

use std::collections::BTreeMap;

use burn::tensor::{Tensor, TensorData};

use super::*;
use crate::backend::Cpu;

fn t1(v: &[f32]) -> Tensor<Cpu, 1> {
    Tensor::from_data(TensorData::new(v.to_vec(), [v.len()]), &Default::default())
}

/// torch.optim.AdamW's update for one scalar, in f64.
struct Reference {
    p: f64,
    m: f64,
    v: f64,
    t: i32,
}

impl Reference {
    fn step(&mut self, g: f64, lr: f64, c: &AdamWConfig) {
        self.t += 1;
        self.p *= 1.0 - lr * c.weight_decay;
        self.m = c.beta1 * self.m + (1.0 - c.beta1) * g;
        self.v = c.beta2 * self.v + (1.0 - c.beta2) * g * g;
        let bc1 = 1.0 - c.beta1.powi(self.t);
        let bc2 = 1.0 - c.beta2.powi(self.t);
        self.p -= lr / bc1 * self.m / (self.v.sqrt() / bc2.sqrt() + c.eps);
    }
}

#[test]
fn adamw_follows_torch_update_over_three_steps() {
    let config = AdamWConfig {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-6,
        weight_decay: 0.1,
    };
    let mut opt = AdamW::<Cpu>::new(config.clone());
    let start = [1.0f32, -2.0, 0.5, 0.0];
    let grads = [
        [0.5f32, 0.1, -0.3, 0.0],
        [0.2, -0.4, 0.1, 1.0],
        [-1.0, 0.3, 0.0, 0.5],
    ];
    let lrs = [0.1, 0.05, 0.2];
    let mut param = Tensor::<Cpu, 2>::from_data(TensorData::new(start.to_vec(), [2, 2]), &Default::default());
    let mut refs: Vec<Reference> = start
        .iter()
        .map(|&p| Reference {
            p: f64::from(p),
            m: 0.0,
            v: 0.0,
            t: 0,
        })
        .collect();
    for (g, lr) in grads.iter().zip(lrs) {
        param = opt.update("w", param, t1(g), lr);
        opt.finish_step();
        for (r, gi) in refs.iter_mut().zip(g) {
            r.step(f64::from(*gi), lr, &config);
        }
    }
    assert_eq!(opt.steps(), 3);
    assert_eq!(param.dims(), [2, 2]);
    let got = host_vec(param);
    for (g, r) in got.iter().zip(&refs) {
        assert!(
            (f64::from(*g) - r.p).abs() < 1e-6,
            "{got:?} vs {:?}",
            refs.iter().map(|r| r.p).collect::<Vec<_>>()
        );
    }
    // A zero gradient still decays the weight and moves it by the first moment.
    assert!(got[3] != 0.0);
}

#[test]
fn moments_round_trip_through_the_host_exactly() {
    let mut opt = AdamW::<Cpu>::new(AdamWConfig::default());
    let p = Tensor::<Cpu, 2>::from_data(
        TensorData::new(vec![0.3f32, -0.7, 1.1], [1, 3]),
        &Default::default(),
    );
    let p = opt.update("layer.weight", p, t1(&[0.25, -1.5, 3.0]), 0.01);
    opt.finish_step();
    let host = opt.to_host();
    assert_eq!(
        host.keys().collect::<Vec<_>>(),
        ["layer.weight.exp_avg", "layer.weight.exp_avg_sq"]
    );
    let params = BTreeMap::from([("layer.weight".to_string(), vec![1, 3])]);
    let mut restored = AdamW::<Cpu>::new(AdamWConfig::default());
    restored
        .load_host(&host, 1, &params, &Default::default())
        .unwrap();
    assert_eq!(restored.to_host(), host);
    // Both continue identically.
    let g = [0.1f32, 0.2, -0.3];
    let a = host_vec(opt.update("layer.weight", p.clone(), t1(&g), 0.01));
    let b = host_vec(restored.update("layer.weight", p, t1(&g), 0.01));
    assert_eq!(a, b);
}

#[test]
fn moments_of_an_unknown_parameter_are_refused() {
    let host = BTreeMap::from([(
        "ghost.weight.exp_avg".to_string(),
        HostTensor {
            shape: vec![2],
            data: vec![0.0, 0.0],
        },
    )]);
    let params = BTreeMap::from([("layer.weight".to_string(), vec![2])]);
    let err = AdamW::<Cpu>::new(AdamWConfig::default())
        .load_host(&host, 1, &params, &Default::default())
        .unwrap_err();
    insta::assert_snapshot!(err, @"weights do not fit the model: optimizer state `ghost.weight.exp_avg` belongs to no parameter of the model");
}

#[test]
fn schedules_give_the_rate_at_known_steps() {
    let check = |kind, warmup, step, want: f64| {
        let s = LrSchedule {
            lr: 1.0,
            kind,
            warmup_steps: warmup,
            total_steps: 10,
            min_lr_ratio: 0.1,
        };
        let got = s.lr_at(step);
        assert!(
            (got - want).abs() < 1e-12,
            "{kind:?} warmup {warmup} step {step}: {got} != {want}"
        );
    };
    check(ScheduleKind::Constant, 0, 0, 1.0);
    check(ScheduleKind::Constant, 0, 99, 1.0);
    check(ScheduleKind::Constant, 4, 0, 0.0);
    check(ScheduleKind::Constant, 4, 1, 0.25);
    check(ScheduleKind::Constant, 4, 4, 1.0);
    // Linear from 1 at the end of warm-up to 0.1 at step 10: progress (step - 2) / 8.
    check(ScheduleKind::Linear, 2, 2, 1.0);
    check(ScheduleKind::Linear, 2, 6, 0.1 + 0.9 * 0.5);
    check(ScheduleKind::Linear, 2, 10, 0.1);
    check(ScheduleKind::Linear, 2, 50, 0.1);
    // Cosine: half-way is the mid-point of the floor and the base rate.
    check(ScheduleKind::Cosine, 2, 6, 0.1 + 0.9 * 0.5);
    check(
        ScheduleKind::Cosine,
        2,
        4,
        0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * 0.25).cos()),
    );
    check(ScheduleKind::Cosine, 2, 10, 0.1);
}

#[test]
fn clipping_scales_to_the_global_norm() {
    let mut store = GradStore::<Cpu>::default();
    store.add("a", t1(&[3.0]));
    store.add("b", t1(&[2.0, 2.0]));
    store.add("b", t1(&[-2.0, 2.0]));
    // Accumulated b = [0, 4]; global norm sqrt(9 + 16) = 5.
    let norm = store.clip(1.0);
    assert!((norm - 5.0).abs() < 1e-6);
    let factor = 1.0 / (5.0 + 1e-6);
    let a = host_vec(store.remove("a").unwrap());
    let b = host_vec(store.remove("b").unwrap());
    assert!((f64::from(a[0]) - 3.0 * factor).abs() < 1e-6);
    assert_eq!(b[0], 0.0);
    assert!((f64::from(b[1]) - 4.0 * factor).abs() < 1e-6);
    // Below the threshold, or with clipping off, nothing changes.
    let mut small = GradStore::<Cpu>::default();
    small.add("a", t1(&[0.3, 0.4]));
    assert!((small.clip(1.0) - 0.5).abs() < 1e-6);
    assert_eq!(host_vec(small.remove("a").unwrap()), vec![0.3, 0.4]);
    let mut off = GradStore::<Cpu>::default();
    off.add("a", t1(&[30.0, 40.0]));
    assert!((off.clip(0.0) - 50.0).abs() < 1e-4);
    assert_eq!(host_vec(off.remove("a").unwrap()), vec![30.0, 40.0]);
}

#[test]
fn config_problems_name_every_field() {
    let bad = AdamWConfig {
        beta1: 1.0,
        beta2: -0.1,
        eps: 0.0,
        weight_decay: f64::NAN,
    };
    insta::assert_snapshot!(bad.problems().join("\n"), @r"
    beta1 must be in [0, 1), got 1
    beta2 must be in [0, 1), got -0.1
    eps must be finite and positive, got 0
    weight_decay must be finite and >= 0, got NaN
    ");
}

#[test]
fn a_learning_rate_of_zero_leaves_the_weights_bit_for_bit() {
    // `actor.lr=0` is the quickstart's control run: the moments advance, the weights must not.
    let config = AdamWConfig {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut opt = AdamW::<Cpu>::new(config);
    let start = vec![1.0f32, -2.0, 0.5, 3.25];
    let mut param = t1(&start);
    for g in [[0.5f32, 0.1, -0.3, 2.0], [-1.0, 0.3, 0.0, 0.5]] {
        param = opt.update("w", param, t1(&g), 0.0);
        opt.finish_step();
    }
    assert_eq!(opt.steps(), 2);
    assert_eq!(host_vec(param), start);
}
