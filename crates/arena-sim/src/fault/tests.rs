//! Tests of the fault plan: rule order, `after`, `times`, and seeded replay.

use super::*;

fn draws(plan: &mut FaultPlan, endpoint: Endpoint, n: usize) -> Vec<bool> {
    (0..n).map(|_| plan.decide(endpoint).is_some()).collect()
}

#[test]
fn after_and_times_bound_a_rule() {
    let mut plan = FaultPlan::new(
        vec![
            FaultRule::on(Endpoint::GetStream, FaultKind::Status(504))
                .after(1)
                .times(2),
        ],
        0,
    );
    assert_eq!(
        draws(&mut plan, Endpoint::GetStream, 5),
        [false, true, true, false, false]
    );
    assert_eq!(plan.decide(Endpoint::Dataset), None);
}

#[test]
fn first_firing_rule_wins_and_all_matches_every_endpoint() {
    let mut plan = FaultPlan::new(
        vec![
            FaultRule::on(Endpoint::Dataset, FaultKind::ChangeTotal).times(1),
            FaultRule::everywhere(FaultKind::Marker403),
        ],
        0,
    );
    assert_eq!(plan.decide(Endpoint::Dataset), Some(FaultKind::ChangeTotal));
    assert_eq!(plan.decide(Endpoint::Dataset), Some(FaultKind::Marker403));
    assert_eq!(plan.decide(Endpoint::CancelTask), Some(FaultKind::Marker403));
}

#[test]
fn the_same_seed_replays_the_same_faults() {
    let rules = vec![FaultRule::everywhere(FaultKind::Drop).probability(0.3)];
    let a = draws(&mut FaultPlan::new(rules.clone(), 42), Endpoint::GetModel, 200);
    let b = draws(&mut FaultPlan::new(rules.clone(), 42), Endpoint::GetModel, 200);
    let c = draws(&mut FaultPlan::new(rules, 43), Endpoint::GetModel, 200);
    assert_eq!(a, b);
    assert_ne!(a, c);
    let hits = a.iter().filter(|h| **h).count();
    assert!((30..=90).contains(&hits), "{hits} hits of 200 at p=0.3");
}
