//! Tests of the renewal schedule on a simulated clock (`arena-2026.md` 3.3).

use std::time::Duration;

use super::*;

const S: Duration = Duration::from_secs(1);
const ZERO: Duration = Duration::ZERO;

#[test]
fn renewals_come_every_interval_and_a_lost_route_is_registered_again_once() {
    let mut lease = Renewal::new(ZERO, 10 * S);
    assert_eq!(lease.poll(ZERO), RenewalStep::Wait(10 * S));
    assert_eq!(lease.poll(7 * S), RenewalStep::Wait(3 * S));
    assert_eq!(lease.poll(10 * S), RenewalStep::Renew);
    // The next interval counts from the answer, not from when the call was due.
    lease.renewed(12 * S, Ok(true));
    assert_eq!(lease.poll(12 * S), RenewalStep::Wait(10 * S));
    assert_eq!(lease.poll(22 * S), RenewalStep::Renew);
    // Arena no longer has it: re-register at once, exactly once, then renew one interval later.
    lease.renewed(22 * S, Ok(false));
    assert_eq!(lease.poll(22 * S), RenewalStep::Reregister);
    lease.reregistered(23 * S, true);
    assert_eq!(lease.poll(23 * S), RenewalStep::Wait(10 * S));
    assert_eq!(lease.poll(33 * S), RenewalStep::Renew);
    assert_eq!(
        lease.stats(),
        RenewalStats {
            renewed: 1,
            failed: 1,
            reregistered: 1,
            reregister_failed: 0
        }
    );
    assert_eq!(lease.stats().success_rate(), Some(0.5));
}

#[test]
fn a_failed_renewal_is_followed_by_another_one_interval_later_and_no_reregistration() {
    let mut lease = Renewal::new(5 * S, 2 * S);
    assert_eq!(lease.poll(7 * S), RenewalStep::Renew);
    lease.renewed(7 * S, Err(()));
    assert_eq!(lease.poll(7 * S), RenewalStep::Wait(2 * S));
    assert_eq!(lease.poll(9 * S), RenewalStep::Renew);
    lease.renewed(9 * S, Ok(true));
    assert_eq!(lease.stats().reregistered + lease.stats().reregister_failed, 0);
    assert_eq!(lease.stats().failed, 1);
    // A failed re-registration is found again by the next renewal, one interval on.
    lease.renewed(11 * S, Ok(false));
    lease.reregistered(11 * S, false);
    assert_eq!(lease.poll(12 * S), RenewalStep::Wait(S));
    assert_eq!(lease.stats().reregister_failed, 1);
}

#[test]
fn a_stopped_lease_does_nothing_more_whatever_is_due() {
    let mut lease = Renewal::new(ZERO, S);
    lease.renewed(S, Ok(false));
    lease.stop();
    for t in [0, 1, 100] {
        assert_eq!(lease.poll(Duration::from_secs(t)), RenewalStep::Stopped);
    }
    assert_eq!(Renewal::new(ZERO, S).stats().success_rate(), None);
}
