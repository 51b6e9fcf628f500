//! Fixtures shared by the unit tests of several modules.

use crate::error::TransformError;
use crate::outcome::RowMeta;
use crate::reward::{RewardRule, RewardSettings};
use crate::transform::TransformRegistry;

/// The rule of `stream` with the given threshold and transform, resolved against the built-ins.
pub(crate) fn rule(stream: &str, threshold: Option<f64>, transform: &str) -> RewardRule {
    let settings = RewardSettings {
        reward_threshold: threshold,
        reward_transform_fn: transform.into(),
    };
    RewardRule::new(stream, &settings, &TransformRegistry::with_builtins()).expect("valid settings")
}

/// The rule of `stream` whose transform, registered as `nan`, returns NaN for every score.
pub(crate) fn nan_rule(stream: &str) -> RewardRule {
    let mut registry = TransformRegistry::with_builtins();
    registry
        .register(
            "nan",
            |_: f64, _: &RowMeta, _: Option<f64>| -> Result<f64, TransformError> { Ok(f64::NAN) },
        )
        .expect("register");
    let settings = RewardSettings {
        reward_threshold: None,
        reward_transform_fn: "nan".into(),
    };
    RewardRule::new(stream, &settings, &registry).expect("resolves")
}
