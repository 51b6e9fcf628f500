//! Unit tests for the CPU kernels of generation: each equals burn's generic operations (the kernels every
//! other backend runs), and the SIMD versions agree bit for bit. The training kernels' tests are in
//! `train/tests.rs`.

use burn::tensor::{Tensor, TensorData};

use super::*;
use crate::cpu_math::{QUERY_BLOCK, SMALL_ROWS, dot16};
use crate::sampling::SplitMix64;

/// `x W^T` on the CPU kernels.
fn project(x: &Tensor<Cpu, 2>, w: &Tensor<Cpu, 2>) -> Tensor<Cpu, 2> {
    <Cpu as Kernels>::project(x.clone(), w.clone(), false)
}

fn host_f32<const D: usize>(t: Tensor<Cpu, D>) -> Vec<f32> {
    <Cpu as Kernels>::to_host(t)
}

fn strides(t: &Tensor<Cpu, 2>) -> Vec<isize> {
    match t.clone().into_primitive().tensor() {
        NdArrayTensor::F32(s) => s.view().strides().to_vec(),
        _ => panic!("f32 weights"),
    }
}

fn random<const D: usize>(shape: [usize; D], rng: &mut SplitMix64) -> Tensor<Cpu, D> {
    let data: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| rng.next_normal() as f32)
        .collect();
    Tensor::from_data(TensorData::new(data, shape), &Default::default())
}

#[test]
fn fast_projection_matches_burns_matmul() {
    let mut rng = SplitMix64::new(3);
    for rows in [1, 3, SMALL_ROWS, SMALL_ROWS + 1, 40] {
        for (out_f, in_f) in [(7, 5), (96, 64), (300, 257)] {
            let x = random([rows, in_f], &mut rng);
            let w = random([out_f, in_f], &mut rng);
            let fast = project(&x, &w);
            assert_eq!(fast.dims(), [rows, out_f]);
            let slow = x.matmul(w.transpose());
            let (a, b) = (
                fast.into_data().to_vec::<f32>().expect("f32"),
                slow.into_data().to_vec::<f32>().expect("f32"),
            );
            let worst = a
                .iter()
                .zip(&b)
                .map(|(p, q)| (p - q).abs() / (1.0 + q.abs()))
                .fold(0.0, f32::max);
            assert!(worst < 1e-5, "rows {rows}, [{out_f}, {in_f}]: {worst}");
        }
    }
}

#[test]
fn column_major_weights_project_like_row_major_ones() {
    let mut rng = SplitMix64::new(4);
    let config = {
        let mut c = crate::ModelConfig::new(crate::Architecture::Llama, 50, 16, 24, 1, 4, 2);
        c.tie_word_embeddings = false;
        c
    };
    let model = crate::model::CausalLm::<Cpu>::init(&config, 0.5, 9, &Default::default());
    let w = model.model.layers[0].mlp.gate_proj.weight.val();
    let inference = <Cpu as Kernels>::for_inference(model);
    let wc = inference.model.layers[0].mlp.gate_proj.weight.val();
    assert_eq!(wc.dims(), w.dims());
    // The same matrix, stored transposed.
    assert_eq!(
        wc.clone().into_data().to_vec::<f32>().expect("f32"),
        w.clone().into_data().to_vec::<f32>().expect("f32")
    );
    assert_eq!(strides(&wc)[0], 1, "column-major");
    for rows in [1, SMALL_ROWS, 16, 40] {
        let x = random([rows, 16], &mut rng);
        let a = project(&x, &w);
        let b = project(&x, &wc);
        let (a, b) = (
            a.into_data().to_vec::<f32>().expect("f32"),
            b.into_data().to_vec::<f32>().expect("f32"),
        );
        let worst = a.iter().zip(&b).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
        assert!(worst < 1e-5, "rows {rows}: {worst}");
    }
}

#[test]
fn dot_handles_every_length() {
    for n in [0, 1, 15, 16, 17, 33, 100] {
        let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..n).map(|i| 1.0 - i as f32 * 0.25).collect();
        let expected: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!(
            (dot16(&a, &b) - expected).abs() <= 1e-3 * (1.0 + expected.abs()),
            "n={n}"
        );
    }
}

#[test]
fn fast_attention_matches_burns_ops() {
    // A decode-like shape, and a prefill-like one spanning several query blocks under a causal mask.
    for (len, keys) in [(3, 7), (2 * QUERY_BLOCK + 22, 2 * QUERY_BLOCK + 30)] {
        attention_case(len, keys);
    }
}

fn attention_case(len: usize, keys: usize) {
    let mut rng = SplitMix64::new(5);
    let (batch, heads, kv_heads, d) = (2, 4, 2, 8);
    let q = random([batch, heads, len, d], &mut rng);
    // The whole cache, with free columns after the `keys` in use, the way the engine passes it.
    let k_cache = random([batch, kv_heads, keys + 5, d], &mut rng);
    let v_cache = random([batch, kv_heads, keys + 5, d], &mut rng);
    let used = [0..batch, 0..kv_heads, 0..keys, 0..d];
    let (k, v) = (k_cache.clone().slice(used.clone()), v_cache.clone().slice(used));
    // Query 1 sees its own column alone (a padding query's span); the others see the keys up to their own
    // (causal) from a first one that varies by row.
    let spans: Vec<[u32; 2]> = (0..batch * len)
        .map(|row| {
            let causal_end = row % len + keys - len + 1;
            let first = if row == 1 {
                causal_end - 1
            } else {
                (row * 7) % causal_end
            };
            [first as u32, causal_end as u32]
        })
        .collect();
    let bias: Vec<f32> = spans
        .iter()
        .flat_map(|&[lo, hi]| {
            (0..keys as u32).map(move |k| {
                if (lo..hi).contains(&k) {
                    0.0
                } else {
                    crate::model::MASKED
                }
            })
        })
        .collect();
    let bias = Tensor::<Cpu, 5>::from_data(
        TensorData::new(bias, [batch, 1, 1, len, keys]),
        &Default::default(),
    );
    let spans = KeySpans::new(spans, [batch, len, keys], &Default::default());
    let scale = 0.35f32;
    let fast = <Cpu as Kernels>::cached_attention(q.clone(), k_cache, v_cache, &spans, f64::from(scale));
    // Reference: repeat the key/value heads and use burn's softmax.
    let groups = heads / kv_heads;
    let expand = |t: Tensor<Cpu, 4>| {
        t.unsqueeze_dim::<5>(2)
            .repeat_dim(2, groups)
            .reshape([batch, heads, keys, d])
    };
    let scores = q.matmul(expand(k).swap_dims(2, 3)) * scale + bias.reshape([batch, 1, len, keys]);
    let slow = burn::tensor::activation::softmax(scores, 3).matmul(expand(v));
    let (a, b) = (
        fast.into_data().to_vec::<f32>().expect("f32"),
        slow.into_data().to_vec::<f32>().expect("f32"),
    );
    let worst = a.iter().zip(&b).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
    assert!(
        worst < 1e-5,
        "len {len}, keys {keys}: attention differs by {worst}"
    );
}

#[test]
fn fast_exp_is_within_two_ulp_of_exp_over_its_range() {
    use crate::cpu_math::fast_exp;
    let mut worst = 0.0f64;
    // Above about 88.03, 2^n overflows and the result is infinite, a little before exp itself.
    let mut x = -87.0f32;
    while x < 88.0 {
        let exact = f64::from(x).exp();
        let got = f64::from(fast_exp(x));
        worst = worst.max(((got - exact) / exact).abs());
        x += 0.001_3;
    }
    // f32's ulp is 2^-23 (1.2e-7) relative.
    assert!(worst < 2.5e-7, "worst relative error {worst}");
    assert_eq!(fast_exp(0.0), 1.0);
    assert!(
        fast_exp(-1.0e30) < 1.0e-37,
        "clamped to the smallest normal scale"
    );
    assert!(fast_exp(f32::NAN).is_nan());
}

#[test]
fn simd_versions_give_bit_identical_results() {
    use std::sync::atomic::Ordering;

    use crate::cpu_math::SIMD_LEVEL;
    use crate::sampling::{SamplingParams, log_softmax_at, sample};

    let mut rng = SplitMix64::new(11);
    let (batch, heads, kv_heads, len, keys, d) = (2, 4, 2, 70, 75, 8);
    let q = random([batch, heads, len, d], &mut rng);
    let k = random([batch, kv_heads, keys, d], &mut rng);
    let v = random([batch, kv_heads, keys, d], &mut rng);
    let spans: Vec<[u32; 2]> = (0..batch * len)
        .map(|row| [(row % 3) as u32, (row % len + 6) as u32])
        .collect();
    let spans = KeySpans::new(spans, [batch, len, keys], &Default::default());
    let gate = random([9, 37], &mut rng);
    let up = random([9, 37], &mut rng);
    let norm_w = Tensor::<Cpu, 1>::from_data(
        TensorData::new((0..37).map(|i| 0.5 + i as f32 / 37.0).collect::<Vec<f32>>(), [37]),
        &Default::default(),
    );
    let logits: Vec<f32> = (0..1003).map(|_| 3.0 * rng.next_normal() as f32).collect();

    let run = |level: u8| -> Vec<u32> {
        SIMD_LEVEL.store(level, Ordering::Relaxed);
        let mut bits = Vec::new();
        let mut push = |t: Vec<f32>| bits.extend(t.into_iter().map(f32::to_bits));
        push(host_f32(<Cpu as Kernels>::cached_attention(
            q.clone(),
            k.clone(),
            v.clone(),
            &spans,
            0.3,
        )));
        push(host_f32(<Cpu as Kernels>::swiglu(gate.clone(), up.clone())));
        push(host_f32(<Cpu as Kernels>::rms_norm(
            gate.clone(),
            norm_w.clone(),
            1e-6,
        )));
        push(vec![log_softmax_at(&logits, 0.7, 5)]);
        let params = SamplingParams {
            temperature: 0.9,
            ..SamplingParams::default()
        };
        let mut draws = SplitMix64::new(3);
        for _ in 0..20 {
            let (token, logprob) = sample(&logits, &params, &mut draws);
            push(vec![token as f32, logprob]);
        }
        bits
    };
    let widest = run(2);
    let avx2 = run(1);
    let portable = run(0);
    SIMD_LEVEL.store(2, Ordering::Relaxed);
    assert!(widest == avx2, "AVX-512 and AVX2 versions differ");
    assert!(widest == portable, "AVX-512 and portable versions differ");
}

#[test]
fn assemble_stacks_rows_and_moves_columns_like_burn() {
    let mut rng = SplitMix64::new(8);
    let (a, b) = (random([3, 2, 10, 4], &mut rng), random([2, 2, 6, 4], &mut rng));
    let capacity = 12;
    let device = Default::default();
    let fast = <Cpu as Kernels>::assemble(&[(&a, 2..9, 1), (&b, 0..6, 4)], capacity, &device);
    let place = |t: &Tensor<Cpu, 4>, cols: std::ops::Range<usize>, at: usize| {
        let [n, h, _, d] = t.dims();
        Tensor::<Cpu, 4>::zeros([n, h, capacity, d], &Default::default()).slice_assign(
            [0..n, 0..h, at..at + cols.len(), 0..d],
            t.clone().slice([0..n, 0..h, cols, 0..d]),
        )
    };
    let slow = Tensor::cat(vec![place(&a, 2..9, 1), place(&b, 0..6, 4)], 0);
    assert_eq!(fast.dims(), [5, 2, capacity, 4]);
    assert_eq!(host_f32(fast), host_f32(slow));
    // Parts that do not fit are refused, not truncated.
    let a_view = match a.clone().into_primitive().tensor() {
        NdArrayTensor::F32(s) => s.view().into_dimensionality::<Ix4>().expect("4-D").to_owned(),
        _ => panic!("f32"),
    };
    assert!(crate::cpu_math::assemble(&[(a_view.view(), 0..10, 3)], capacity).is_none());
    let zeros = <Cpu as Kernels>::zeros([2, 3, 4], &device);
    assert_eq!(host_f32(zeros), vec![0.0; 24]);
}
