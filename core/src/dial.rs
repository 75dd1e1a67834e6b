//! Finding a coordinator to talk to, for the worker and the client alike: which address to dial
//! next (the configured list in turn, or the leader a `NOT_LEADER` answer named), the number of
//! each connection attempt ([`ConnectAttempt`]), and how long to wait after a failed one.
//!
//! The two machines share these mechanics but not every rule, and [`Dialer`] keeps each rule as
//! its machine has it:
//!
//! - **Redirects.** The worker keeps dialing a named leader until it forgets it (a failed or
//!   timed-out connect, or a `NOT_LEADER` that names no leader): [`RedirectRule::Sticky`]. The
//!   client dials a named leader once, then goes back to the list: [`RedirectRule::Once`].
//! - **Backoff.** The worker waits a full-jitter delay after every failure
//!   ([`Dialer::jittered_backoff`], one draw from the machine's seeded RNG). The client dials the
//!   next address straight away within a pass over the list, pauses (without jitter, without a
//!   draw) after a whole pass fails, and gives up after its configured number of passes
//!   ([`Dialer::pass_failed`]).
//!
//! Both rotate to the next configured address on every dial that does not go to a named leader,
//! starting from the first. The connection state itself (idle, connecting, connected) and its
//! timers stay with each machine; this module only decides where and when to dial.
//!
//! A member of a replicated coordinator group answers with the leader it knows and the group's
//! addresses: [`Dialer::not_leader`] takes the first as a redirect, [`Dialer::learn`] adds the
//! second to the list, so one known address is enough to find every member.

use std::time::Duration;

use rand_chacha::rand_core::RngCore;

use crate::limits::DIAL_ADDRESSES_MAX;
use crate::protocol::LeaderHint;
use crate::time::as_millis_u64;

/// Names one connection attempt, so reports about an abandoned socket can be told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnectAttempt(pub u64);

/// How long a leader named by a `NOT_LEADER` answer is dialed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedirectRule {
    /// Every dial goes to the named leader until [`Dialer::forget_redirect`], or a `NOT_LEADER`
    /// naming no leader, sends the dialer back to the list (the worker).
    Sticky,
    /// The next dial goes to the named leader, the ones after it to the list again (the client).
    Once,
}

/// What a caller that makes full passes over the address list does after a failed connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterFailure {
    /// Dial the next address now.
    Next,
    /// A whole pass failed: wait this long before the next pass.
    Pause(Duration),
    /// Every pass failed: stop dialing. The failure count starts over.
    GiveUp,
}

/// Where a machine dials next, and how long it waits after a failure. See the module
/// documentation for the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dialer {
    /// Coordinator addresses, dialed in turn. Never empty when [`Dialer::dial`] is called: both
    /// machines refuse an empty list before they dial.
    addresses: Vec<String>,
    /// Index into `addresses` of the address dialed last.
    index: usize,
    /// Address the leader redirect named, dialed before the list.
    redirect: Option<String>,
    rule: RedirectRule,
    /// Number of the last connection attempt; the first is 1.
    last_attempt: u64,
    /// Consecutive failed connection attempts (drives the backoff).
    failures: u32,
}

impl Dialer {
    /// A dialer whose first dial goes to `addresses[0]`.
    pub fn new(addresses: Vec<String>, rule: RedirectRule) -> Dialer {
        let index = addresses.len().saturating_sub(1);
        Dialer {
            addresses,
            index,
            redirect: None,
            rule,
            last_attempt: 0,
            failures: 0,
        }
    }

    /// The addresses dialed in turn.
    pub fn addresses(&self) -> &[String] {
        &self.addresses
    }

    /// Picks the address for a new connection attempt and numbers the attempt: the named leader
    /// if there is one (taking it, under [`RedirectRule::Once`]), else the next address in the
    /// list.
    pub fn dial(&mut self) -> (ConnectAttempt, String) {
        let address = match self.rule {
            RedirectRule::Sticky => {
                if self.redirect.is_none() {
                    self.rotate();
                }
                self.current_address()
            }
            RedirectRule::Once => match self.redirect.take() {
                Some(address) => address,
                None => {
                    self.rotate();
                    self.addresses[self.index].clone()
                }
            },
        };
        self.last_attempt += 1;
        (ConnectAttempt(self.last_attempt), address)
    }

    fn rotate(&mut self) {
        self.index = (self.index + 1) % self.addresses.len();
    }

    /// The named leader if there is one, else the list address dialed last.
    pub fn current_address(&self) -> String {
        self.redirect
            .clone()
            .or_else(|| self.addresses.get(self.index).cloned())
            .unwrap_or_default()
    }

    /// A coordinator answered `NOT_LEADER`, naming the leader it knows (if any). Under
    /// [`RedirectRule::Sticky`] the answer replaces any earlier redirect, so naming no leader
    /// sends the dialer back to the list; under [`RedirectRule::Once`] an answer naming no leader
    /// leaves an earlier one in place.
    pub fn not_leader(&mut self, leader: Option<LeaderHint>) {
        match self.rule {
            RedirectRule::Sticky => self.redirect = leader.map(|hint| hint.address),
            RedirectRule::Once => {
                if let Some(hint) = leader {
                    self.redirect = Some(hint.address);
                }
            }
        }
    }

    /// Adds member addresses a coordinator told us about (discovery): joining through one known
    /// address is enough to learn the others. At most [`DIAL_ADDRESSES_MAX`] are kept.
    pub fn learn(&mut self, members: Vec<String>) {
        for address in members {
            if self.addresses.len() >= DIAL_ADDRESSES_MAX {
                break;
            }
            if !address.is_empty() && !self.addresses.contains(&address) {
                self.addresses.push(address);
            }
        }
    }

    /// Dial the list again, not the named leader.
    pub fn forget_redirect(&mut self) {
        self.redirect = None;
    }

    /// The backoff starts over (a connection succeeded, or a redirect is being followed).
    pub fn reset_failures(&mut self) {
        self.failures = 0;
    }

    /// Counts a failed attempt and draws the wait before the next one: full jitter for the n-th
    /// consecutive failure (see [`full_jitter`]), exactly one draw from `rng`.
    pub fn jittered_backoff(
        &mut self,
        rng: &mut impl RngCore,
        base: Duration,
        max: Duration,
    ) -> Duration {
        self.failures = self.failures.saturating_add(1);
        full_jitter(rng, base, max, self.failures)
    }

    /// Counts a failed attempt for a caller that makes full passes over the list: within a pass
    /// the next address is dialed at once; once every address of a pass has failed it pauses
    /// `base * 2^(pass-1)`, capped at `max` (no jitter); after `rounds` passes (at least one) it
    /// gives up, and the count starts over.
    pub fn pass_failed(&mut self, rounds: u32, base: Duration, max: Duration) -> AfterFailure {
        self.failures = self.failures.saturating_add(1);
        let budget = self.addresses.len().saturating_mul(rounds.max(1) as usize);
        if self.failures as usize >= budget {
            self.failures = 0;
            return AfterFailure::GiveUp;
        }
        let addresses = self.addresses.len().max(1);
        if self.failures as usize % addresses == 0 {
            // A whole pass failed: give the group a moment before the next one.
            let pass = self.failures / addresses as u32;
            let delay = base
                .saturating_mul(1u32 << pass.saturating_sub(1).min(16))
                .min(max);
            return AfterFailure::Pause(delay);
        }
        AfterFailure::Next
    }
}

/// Full-jitter backoff before the `n`-th retry (n >= 1): uniform in `[0, min(cap, base * 2^(n-1))]`.
pub fn full_jitter(rng: &mut impl RngCore, base: Duration, cap: Duration, n: u32) -> Duration {
    let base = as_millis_u64(base);
    let cap = as_millis_u64(cap);
    let exponent = n.saturating_sub(1).min(63);
    let ceiling = base.saturating_mul(1u64 << exponent).min(cap);
    Duration::from_millis(rng.next_u64() % (ceiling + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::NodeId;
    use rand_chacha::rand_core::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn addresses() -> Vec<String> {
        vec!["a".into(), "b".into(), "c".into()]
    }

    fn hint(address: &str) -> Option<LeaderHint> {
        Some(LeaderHint {
            node_id: NodeId("n".into()),
            address: address.into(),
        })
    }

    #[test]
    fn dials_the_list_in_turn_from_the_first_and_numbers_every_attempt() {
        let mut dialer = Dialer::new(addresses(), RedirectRule::Once);
        let dialed: Vec<(u64, String)> = (0..4)
            .map(|_| {
                let (attempt, address) = dialer.dial();
                (attempt.0, address)
            })
            .collect();
        assert_eq!(
            dialed,
            [
                (1, "a".to_string()),
                (2, "b".to_string()),
                (3, "c".to_string()),
                (4, "a".to_string())
            ]
        );
    }

    #[test]
    fn a_sticky_redirect_is_dialed_until_forgotten_then_the_list_resumes() {
        let mut dialer = Dialer::new(addresses(), RedirectRule::Sticky);
        assert_eq!(dialer.dial().1, "a");
        dialer.not_leader(hint("leader"));
        assert_eq!(dialer.dial().1, "leader");
        assert_eq!(dialer.dial().1, "leader");
        assert_eq!(dialer.current_address(), "leader");
        dialer.forget_redirect();
        assert_eq!(dialer.dial().1, "b");
        dialer.not_leader(hint("leader"));
        dialer.not_leader(None);
        assert_eq!(
            dialer.dial().1,
            "c",
            "naming no leader goes back to the list"
        );
        assert_eq!(dialer.current_address(), "c");
    }

    #[test]
    fn a_once_redirect_is_dialed_once_and_not_cleared_by_an_answer_naming_no_leader() {
        let mut dialer = Dialer::new(addresses(), RedirectRule::Once);
        assert_eq!(dialer.dial().1, "a");
        dialer.not_leader(hint("leader"));
        dialer.not_leader(None);
        assert_eq!(dialer.dial().1, "leader");
        assert_eq!(dialer.dial().1, "b");
    }

    #[test]
    fn passes_pause_between_them_and_give_up_after_the_last() {
        let mut dialer = Dialer::new(vec!["a".into(), "b".into()], RedirectRule::Once);
        let base = Duration::from_millis(100);
        let max = Duration::from_millis(250);
        let outcomes: Vec<AfterFailure> =
            (0..6).map(|_| dialer.pass_failed(3, base, max)).collect();
        assert_eq!(
            outcomes,
            [
                AfterFailure::Next,
                AfterFailure::Pause(Duration::from_millis(100)),
                AfterFailure::Next,
                AfterFailure::Pause(Duration::from_millis(200)),
                AfterFailure::Next,
                AfterFailure::GiveUp,
            ]
        );
        assert_eq!(dialer.pass_failed(3, base, max), AfterFailure::Next);
    }

    #[test]
    fn jittered_backoff_draws_once_per_failure_and_starts_over_on_reset() {
        let (base, max) = (Duration::from_millis(100), Duration::from_millis(5_000));
        let mut dialer = Dialer::new(addresses(), RedirectRule::Sticky);
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut reference = ChaCha8Rng::seed_from_u64(3);
        for n in 1..=3 {
            let delay = dialer.jittered_backoff(&mut rng, base, max);
            assert_eq!(delay, full_jitter(&mut reference, base, max, n));
        }
        dialer.reset_failures();
        let delay = dialer.jittered_backoff(&mut rng, base, max);
        assert_eq!(delay, full_jitter(&mut reference, base, max, 1));
        assert_eq!(
            rng.next_u64(),
            reference.next_u64(),
            "the same number of draws"
        );
    }

    #[test]
    fn full_jitter_stays_within_its_ceiling() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for n in 1..=20 {
            let delay = full_jitter(
                &mut rng,
                Duration::from_millis(200),
                Duration::from_millis(5000),
                n,
            );
            let ceiling = (200u64 << (n - 1).min(20)).min(5000);
            assert!(delay <= Duration::from_millis(ceiling));
        }
    }
}
