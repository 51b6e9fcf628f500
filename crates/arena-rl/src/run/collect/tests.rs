//! Dynamic sampling's round sizes.

use super::extra_draws;

#[test]
fn extra_draws_fill_the_batch_within_the_budget() {
    // A full batch of informative groups, or factor 1, draws nothing.
    assert_eq!(extra_draws(8, 8, 8, 4.0), 0);
    assert_eq!(extra_draws(8, 8, 3, 1.0), 0);
    // Half the batch informative: the missing four at the acceptance seen (1 in 2) is eight more.
    assert_eq!(extra_draws(8, 8, 4, 4.0), 8);
    // Nothing informative yet: as much as the budget allows.
    assert_eq!(extra_draws(8, 8, 0, 4.0), 24);
    assert_eq!(extra_draws(8, 8, 0, 1.5), 4);
    // Never fewer than the missing groups, never past the budget.
    assert_eq!(extra_draws(8, 8, 7, 4.0), 2);
    assert_eq!(extra_draws(8, 30, 6, 4.0), 2);
    assert_eq!(extra_draws(8, 32, 6, 4.0), 0);
    // The budget rounds up: a batch of 3 at factor 1.5 may launch 5 groups.
    assert_eq!(extra_draws(3, 3, 0, 1.5), 2);
    assert_eq!(extra_draws(0, 0, 0, 4.0), 0);
}
