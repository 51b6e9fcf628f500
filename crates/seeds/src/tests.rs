//! Known answers: the published SplitMix64 and FNV-1a test vectors, so that every user's seeds keep
//! meaning what they meant.

use super::*;

#[test]
fn splitmix64_matches_the_reference_sequence() {
    // The first outputs of Vigna's splitmix64.c seeded with 1234567.
    let mut rng = SplitMix64::new(1_234_567);
    let want = [
        6_457_827_717_110_365_317,
        3_203_168_211_198_807_973,
        9_817_491_932_198_370_423,
        4_593_380_528_125_082_431,
        16_408_922_859_458_223_821,
    ];
    for w in want {
        assert_eq!(rng.next_u64(), w);
    }
}

#[test]
fn one_step_is_the_generators_next_output() {
    for seed in [0, 1, 42, u64::MAX] {
        assert_eq!(splitmix(seed), SplitMix64::new(seed).next_u64());
    }
}

#[test]
fn floats_are_in_range_and_normals_are_centred() {
    let mut rng = SplitMix64::new(7);
    let uniform: Vec<f64> = (0..10_000).map(|_| rng.next_f64()).collect();
    assert!(uniform.iter().all(|u| (0.0..1.0).contains(u)));
    let mean = uniform.iter().sum::<f64>() / uniform.len() as f64;
    assert!((mean - 0.5).abs() < 0.02, "{mean}");
    let normal: Vec<f64> = (0..10_000).map(|_| rng.next_normal()).collect();
    let mean = normal.iter().sum::<f64>() / normal.len() as f64;
    let var = normal.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / normal.len() as f64;
    assert!(mean.abs() < 0.05 && (var - 1.0).abs() < 0.05, "{mean} {var}");
}

#[test]
fn fnv1a_matches_the_published_vectors() {
    assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
}
