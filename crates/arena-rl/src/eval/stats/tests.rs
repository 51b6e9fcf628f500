//! Wilson intervals against a reference table, pass@k against exact fractions, aggregation and the
//! difference of two checkpoints against hand-computed values.
//!
//! The reference values were computed outside this crate with statsmodels 0.15.0 (Python 3, a throwaway
//! virtualenv): `statsmodels.stats.proportion.proportion_confint(x, n, alpha=0.05, method="wilson")` and
//! `confint_proportions_2indep(a, na, b, nb, method="newcomb", compare="diff")`; pass@k with exact
//! rationals, `1 - Fraction(math.comb(n - c, k), math.comb(n, k))`. The first Newcombe row is example (a)
//! of Newcombe (1998), Statistics in Medicine 17:873-890, Table II, method 10: 0.0524 to 0.3339.

use super::*;

const TOL: f64 = 1e-9;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < TOL
}

#[test]
fn wilson_matches_the_reference_table() {
    #[rustfmt::skip]
    let table = [
        (0, 10, 0.000000000000, 0.277532799863),
        (1, 10, 0.017876213095, 0.404150026795),
        (5, 10, 0.236593090513, 0.763406909487),
        (10, 10, 0.722467200137, 1.000000000000),
        (0, 1, 0.000000000000, 0.793450685623),
        (1, 1, 0.206549314377, 1.000000000000),
        (3, 7, 0.158219855251, 0.749541635472),
        (81, 263, 0.255288519878, 0.366209576983),
        (56, 70, 0.691833555037, 0.876952607516),
        (48, 80, 0.490454650052, 0.700381724041),
        (1, 1000, 0.000176546371, 0.005642558598),
        (999, 1000, 0.994357441402, 0.999823453629),
        (50, 100, 0.403831530366, 0.596168469634),
        (17, 40, 0.285093925600, 0.578049314580),
    ];
    for (x, n, lo, hi) in table {
        let got = wilson(x, n).expect("n > 0");
        assert!(
            close(got.lo, lo) && close(got.hi, hi),
            "wilson({x}, {n}) = {got:?}, reference [{lo}, {hi}]"
        );
    }
    assert_eq!(wilson(0, 0), None);
    assert_eq!(wilson(3, 2), None);
}

#[test]
fn pass_at_k_matches_exact_fractions() {
    #[rustfmt::skip]
    let table: [(u64, u64, u64, f64); 9] = [
        (10, 3, 1, 0.3),                  // 3/10: pass@1 is the pass rate
        (10, 3, 5, 11.0 / 12.0),          // 1 - C(7,5)/C(10,5) = 1 - 21/252
        (10, 0, 3, 0.0),
        (10, 10, 3, 1.0),
        (5, 2, 5, 1.0),                   // k = n: any pass makes it 1
        (5, 4, 2, 1.0),                   // n - c < k
        (200, 1, 100, 0.5),               // C(199,100)/C(200,100) = 100/200
        (100, 50, 10, 2_969_153.0 / 2_970_916.0), // C(100,10) is 1.7e13: no overflow in the product
        (3, 1, 2, 2.0 / 3.0),
    ];
    for (n, c, k, want) in table {
        let got = pass_at_k(n, c, k).expect("valid");
        assert!(close(got, want), "pass@{k}(n={n}, c={c}) = {got}, want {want}");
    }
    assert_eq!(pass_at_k(3, 1, 0), None);
    assert_eq!(pass_at_k(3, 1, 4), None);
    assert_eq!(pass_at_k(3, 4, 1), None);
    // Far beyond what factorials or u64 binomials could hold.
    let big = pass_at_k(100_000, 1, 50_000).expect("valid");
    assert!(close(big, 0.5), "{big}");
}

#[test]
fn differences_match_newcombe() {
    #[rustfmt::skip]
    let table = [
        ((56, 70), (48, 80), 0.200000000000, 0.052431472402, 0.333872654037),
        ((9, 10), (3, 10), 0.600000000000, 0.170522723935, 0.809017973535),
        ((5, 10), (5, 10), 0.000000000000, -0.372513623820, 0.372513623820),
        ((0, 10), (10, 10), -1.000000000000, -1.000000000000, -0.607509350431),
        ((10, 10), (0, 10), 1.000000000000, 0.607509350431, 1.000000000000),
        ((3, 7), (0, 5), 0.428571428571, -0.083156023693, 0.749541635472),
    ];
    for (a, b, d, lo, hi) in table {
        let got = difference(a, b).expect("trials on both sides");
        assert!(
            close(got.estimate, d) && close(got.interval.lo, lo) && close(got.interval.hi, hi),
            "difference({a:?}, {b:?}) = {got:?}, reference {d} [{lo}, {hi}]"
        );
    }
    assert_eq!(difference((1, 2), (0, 0)), None);
}

fn sample(stream: &str, domain: &str, task: &str, scored: Option<(f64, bool)>) -> Sample {
    Sample {
        stream: stream.into(),
        domain: domain.into(),
        task: task.into(),
        scored,
    }
}

#[test]
fn aggregation_per_stream_and_domain() {
    // Stream a: task t1 passes 1 of 2 (rewards 1.0, 0.2), t2 passes 0 of 2 (0.0, 0.1).
    // Stream b: task t1 (another stream's t1) passes 2 of 2; t3 has one excluded sample and one pass.
    let samples = [
        sample("a", "max", "t1", Some((1.0, true))),
        sample("a", "max", "t1", Some((0.2, false))),
        sample("a", "max", "t2", Some((0.0, false))),
        sample("a", "max", "t2", Some((0.1, false))),
        sample("b", "min", "t1", Some((1.0, true))),
        sample("b", "min", "t1", Some((1.0, true))),
        sample("b", "min", "t3", None),
        sample("b", "min", "t3", Some((1.0, true))),
    ];
    let report = aggregate(&samples, 2);
    let keys: Vec<String> = report.iter().map(|(k, _)| k.to_string()).collect();
    assert_eq!(keys, ["all", "stream/a", "stream/b", "domain/max", "domain/min"]);
    let all = &report[0].1;
    assert_eq!((all.tasks, all.n, all.passed, all.excluded), (4, 7, 4, 1));
    assert!(close(all.mean_reward.expect("scored"), 4.3 / 7.0));
    assert_eq!(all.interval, wilson(4, 7));
    // pass@2 per task with 2 scored samples: a/t1 1, a/t2 0, b/t1 1; b/t3 has one, so it is short.
    assert!(close(all.pass_at_k.expect("tasks"), 2.0 / 3.0));
    assert_eq!(all.tasks_short, 1);
    let a = &report[1].1;
    assert_eq!((a.tasks, a.n, a.passed), (2, 4, 1));
    assert!(close(a.pass_rate.expect("scored"), 0.25));
    assert!(close(a.pass_at_k.expect("tasks"), 0.5));
    let min = &report[4].1;
    assert_eq!((min.n, min.passed, min.excluded, min.tasks_short), (3, 3, 1, 1));
    assert!(close(min.pass_at_k.expect("tasks"), 1.0));
    let none = Summary::of(&[sample("c", "x", "t", None)], 1);
    assert_eq!(
        (none.pass_rate, none.interval, none.pass_at_k),
        (None, None, None)
    );
}

#[test]
fn comparison_pairs_groups_both_sides_have() {
    let cand = [
        sample("a", "max", "t1", Some((1.0, true))),
        sample("a", "max", "t2", Some((1.0, true))),
        sample("b", "min", "t1", Some((0.0, false))),
    ];
    let base = [
        sample("a", "max", "t1", Some((0.0, false))),
        sample("a", "max", "t2", Some((1.0, true))),
    ];
    let diffs = compare(&aggregate(&cand, 1), &aggregate(&base, 1));
    let keys: Vec<String> = diffs.iter().map(|(k, _)| k.to_string()).collect();
    assert_eq!(keys, ["all", "stream/a", "domain/max"]);
    assert_eq!(diffs[1].1, difference((2, 2), (1, 2)));
    assert!(close(diffs[0].1.expect("both").estimate, 2.0 / 3.0 - 0.5));
}
