//! Tests of how the run's sampling values meet a harness's, and of refusing bad run values.

use super::*;

fn check(
    requested: (Option<f32>, Option<f32>, Option<u32>),
    run: SamplingDefaults,
    mode: HarnessSampling,
    expect: (f32, f32, Option<u32>),
) {
    let r = resolve(requested, &run, mode);
    assert_eq!(
        (r.temperature, r.top_p, r.top_k),
        expect,
        "{requested:?} under {run:?} ({mode:?})"
    );
}

#[test]
fn the_harness_wins_under_honour_and_the_run_under_override() {
    let run = SamplingDefaults {
        temperature: Some(0.8),
        top_p: Some(0.95),
        top_k: Some(40),
    };
    let nothing = (None, None, None);
    let harness = (Some(1.3), Some(0.5), Some(7));
    use HarnessSampling::{Honour, Override};
    check(nothing, SamplingDefaults::default(), Honour, (1.0, 1.0, None));
    check(nothing, SamplingDefaults::default(), Override, (1.0, 1.0, None));
    check(nothing, run, Honour, (0.8, 0.95, Some(40)));
    check(harness, run, Honour, (1.3, 0.5, Some(7)));
    check((Some(0.6), None, None), run, Honour, (0.6, 0.95, Some(40)));
    check(harness, run, Override, (0.8, 0.95, Some(40)));
    check(harness, SamplingDefaults::default(), Override, (1.0, 1.0, None));
    check(
        harness,
        SamplingDefaults {
            temperature: Some(0.0),
            ..SamplingDefaults::default()
        },
        Override,
        (0.0, 1.0, None),
    );
}

#[test]
fn bad_run_values_are_refused_by_name() {
    for (defaults, field) in [
        (
            SamplingDefaults {
                temperature: Some(f32::NAN),
                ..Default::default()
            },
            "sampling.temperature",
        ),
        (
            SamplingDefaults {
                temperature: Some(-0.1),
                ..Default::default()
            },
            "sampling.temperature",
        ),
        (
            SamplingDefaults {
                top_p: Some(0.0),
                ..Default::default()
            },
            "sampling.top_p",
        ),
        (
            SamplingDefaults {
                top_p: Some(1.5),
                ..Default::default()
            },
            "sampling.top_p",
        ),
        (
            SamplingDefaults {
                top_k: Some(0),
                ..Default::default()
            },
            "sampling.top_k",
        ),
    ] {
        let message = defaults.validate().expect_err("refused").to_string();
        assert!(message.contains(field), "{message}");
    }
    SamplingDefaults {
        temperature: Some(0.0),
        top_p: Some(1.0),
        top_k: Some(1),
    }
    .validate()
    .expect("valid");
}
