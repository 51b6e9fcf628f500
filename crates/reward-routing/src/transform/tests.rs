//! Tests of the built-in transforms and the registry (reference section 8.1 items 36-38, 43).

use super::*;

fn row() -> RowMeta {
    RowMeta {
        data_id: "row-1".into(),
        stream_name: "astra".into(),
        stream_id: "stream-a".into(),
        task_type: "swe".into(),
        ..RowMeta::default()
    }
}

fn check(transform: &dyn RewardTransform, threshold: Option<f64>, cases: &[(f64, f64)]) {
    for &(score, expected) in cases {
        let got = transform
            .transform(score, &row(), threshold)
            .unwrap_or_else(|e| panic!("score {score}: {e}"));
        assert!(
            (got - expected).abs() < 1e-12,
            "score {score} with threshold {threshold:?}: got {got}, expected {expected}"
        );
    }
}

#[test]
fn astra_keeps_partial_scores_at_one_tenth_below_the_default_threshold() {
    check(
        &AstraPartialReward,
        None,
        &[
            (0.0, 0.0),
            (0.2, 0.02),
            (0.75, 0.075),
            (0.9799, 0.09799),
            (0.98, 1.0),
            (1.0, 1.0),
        ],
    );
}

#[test]
fn astra_uses_a_configured_threshold() {
    check(
        &AstraPartialReward,
        Some(0.9),
        &[(0.8999, 0.08999), (0.9, 1.0), (0.95, 1.0)],
    );
}

#[test]
fn builtins_refuse_scores_outside_the_unit_interval() {
    for (transform, what) in [
        (&AstraPartialReward as &dyn RewardTransform, "Astra"),
        (&IdentityReward, "Arena"),
    ] {
        for score in [-0.01, 1.01, f64::NAN, f64::INFINITY] {
            let error = transform
                .transform(score, &row(), None)
                .expect_err("out of range");
            let message = error.to_string();
            assert!(message.contains("within [0, 1]"), "{message}");
            assert!(message.starts_with(what), "{message}");
        }
    }
}

#[test]
fn identity_ignores_the_threshold() {
    check(
        &IdentityReward,
        Some(0.98),
        &[(0.0, 0.0), (0.5, 0.5), (0.9799, 0.9799), (1.0, 1.0)],
    );
}

#[test]
fn reference_import_paths_resolve_to_the_builtins() {
    let registry = TransformRegistry::with_builtins();
    for (configured, name) in [
        ("identity_reward", IDENTITY_REWARD),
        ("astra_partial_reward", ASTRA_PARTIAL_REWARD),
        ("examples.swe.reward_transforms.identity_reward", IDENTITY_REWARD),
        (
            "  examples.swe.reward_transforms.astra_partial_reward ",
            ASTRA_PARTIAL_REWARD,
        ),
    ] {
        let resolved = registry.get(configured).expect(configured);
        assert_eq!(resolved.name(), name);
    }
    let astra = registry
        .get("examples.swe.reward_transforms.astra_partial_reward")
        .expect("astra");
    assert!((astra.transform(0.75, &row(), None).expect("in range") - 0.075).abs() < 1e-12);
}

#[test]
fn unknown_names_are_refused_with_the_known_ones() {
    let registry = TransformRegistry::with_builtins();
    for name in [
        "examples.swe.reward_transforms.nope",
        "examples.swe.reward_transformsidentity_reward",
        "other.module.identity_reward",
        "",
    ] {
        assert!(registry.get(name).is_none(), "{name:?} resolved");
    }
    let error = registry.resolve("astra", "my.module.fn").expect_err("unknown");
    assert_eq!(
        error.to_string(),
        "stream \"astra\": unknown reward_transform_fn \"my.module.fn\"; registered transforms: \
         astra_partial_reward, identity_reward"
    );
}

#[test]
fn user_transforms_register_by_name_once() {
    let mut registry = TransformRegistry::with_builtins();
    registry
        .register(
            "tests.custom_transform",
            |score: f64, _row: &RowMeta, threshold: Option<f64>| -> Result<f64, TransformError> {
                Ok(score * 2.0 + threshold.unwrap_or(0.0))
            },
        )
        .expect("first registration");
    let resolved = registry.get("tests.custom_transform").expect("registered");
    assert_eq!(resolved.transform(0.25, &row(), Some(1.0)).expect("ok"), 1.5);

    let again = registry.register("tests.custom_transform", IdentityReward);
    assert!(matches!(again, Err(Error::DuplicateTransform { .. })));
    let builtin = registry.register(IDENTITY_REWARD, IdentityReward);
    assert!(matches!(builtin, Err(Error::DuplicateTransform { .. })));
    for bad in ["", "has space"] {
        assert!(matches!(
            registry.register(bad, IdentityReward),
            Err(Error::InvalidTransformName { .. })
        ));
    }
    assert_eq!(
        registry.names().collect::<Vec<_>>(),
        [
            "astra_partial_reward",
            "identity_reward",
            "tests.custom_transform"
        ]
    );
    assert!(TransformRegistry::empty().get(IDENTITY_REWARD).is_none());
}
