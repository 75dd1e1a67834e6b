//! A queue's rate limit: at most `starts` starts per `per_millis`, as a token bucket that holds
//! `starts` tokens and refills one every `per_millis / starts`.
//!
//! The bucket is kept as one number, the *theoretical arrival time* (TAT) of the generic cell
//! rate algorithm: the instant the next start would be due if starts had come at exactly the
//! steady rate. A start at `t` conforms while `TAT - t` is within the bucket's slack
//! (`period - interval`); it then moves the TAT to `max(TAT, t) + interval`. One integer,
//! replicated in the queue's row and moved only by applied `Assign` entries at their stamps,
//! so every member and every later leader agrees on it.
//!
//! What it guarantees, over the starts since the limit was last set: for any two of them, the
//! `k`-th and the `j`-th (so `j - k + 1` starts), `(j - k + 1) * interval` is at most
//! `t_j - t_k + period`. With `interval >= period / starts`, any window of length `w` holds
//! at most `starts + w * starts / period` starts: a full bucket's burst, then the refill.
//! Stamps may run backwards across leaders; the bound holds all the same (it only refuses
//! more).

use serde::{Deserialize, Serialize};

use crate::limits::{QUEUE_RATE_PERIOD_MILLIS_MAX, QUEUE_RATE_STARTS_MAX};
use crate::time::UnixMillis;

/// At most `starts` starts per `per_millis`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub starts: u32,
    pub per_millis: u64,
}

impl RateLimit {
    /// Both values within their bounds (`starts == 0` is checked by the caller: in a change it
    /// removes the limit).
    pub fn check(&self) -> Result<(), String> {
        if !(1..=QUEUE_RATE_STARTS_MAX).contains(&self.starts) {
            return Err(format!(
                "a rate limit allows between 1 and {QUEUE_RATE_STARTS_MAX} starts per period (got {})",
                self.starts
            ));
        }
        if !(1..=QUEUE_RATE_PERIOD_MILLIS_MAX).contains(&self.per_millis) {
            return Err(format!(
                "a rate limit's period is between 1 ms and {QUEUE_RATE_PERIOD_MILLIS_MAX} ms (got {})",
                self.per_millis
            ));
        }
        Ok(())
    }

    fn period_micros(&self) -> u64 {
        self.per_millis.saturating_mul(1000)
    }

    /// The spacing of starts at the steady rate, in microseconds, rounded up (so the rate
    /// allowed is never above the one set).
    pub fn interval_micros(&self) -> u64 {
        self.period_micros().div_ceil(u64::from(self.starts.max(1)))
    }

    /// How far ahead of a start's time the TAT may be for it to conform.
    fn slack_micros(&self) -> u64 {
        self.period_micros() - self.interval_micros()
    }

    /// The TAT after a start at `at`, if the start conforms to a bucket at `tat`.
    pub fn admit(&self, tat: u64, at: UnixMillis) -> Option<u64> {
        self.admit_micros(tat, micros(at))
    }

    /// [`RateLimit::admit`] at `at` microseconds.
    pub fn admit_micros(&self, tat: u64, at: u64) -> Option<u64> {
        (tat <= at.saturating_add(self.slack_micros()))
            .then(|| tat.max(at).saturating_add(self.interval_micros()))
    }

    /// Whether a start at `at` would conform after `ahead` more starts, each at or before `at`,
    /// have moved the bucket at `tat` (the leader's starts in flight): `None` if it would, or
    /// the earliest time it would.
    pub fn blocked_until(&self, tat: u64, at: UnixMillis, ahead: u64) -> Option<UnixMillis> {
        self.blocked_until_micros(tat, micros(at), ahead)
    }

    /// [`RateLimit::blocked_until`] at `now` microseconds.
    pub fn blocked_until_micros(&self, tat: u64, now: u64, ahead: u64) -> Option<UnixMillis> {
        // Each start ahead moves the TAT to at most `max(TAT, now) + interval`.
        let tat = if ahead == 0 {
            tat
        } else {
            tat.max(now)
                .saturating_add(ahead.saturating_mul(self.interval_micros()))
        };
        let earliest = tat.saturating_sub(self.slack_micros());
        (earliest > now).then(|| UnixMillis(earliest.div_ceil(1000)))
    }
}

/// `at` in microseconds.
pub fn micros(at: UnixMillis) -> u64 {
    at.0.saturating_mul(1000)
}

/// One fairness key's bucket under its queue's per-key rate limit, as the table persists it.
/// Only buckets that have not refilled by their queue's clock are kept: an absent bucket is a
/// full one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyBucket {
    pub queue: String,
    pub key: String,
    pub tat_micros: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(starts: u32, per_millis: u64) -> RateLimit {
        RateLimit { starts, per_millis }
    }

    /// Runs starts asked at `times` through the bucket; the times that were allowed.
    fn run(rate: RateLimit, times: &[u64]) -> Vec<u64> {
        let mut tat = 0;
        let mut allowed = Vec::new();
        for &t in times {
            if let Some(next) = rate.admit(tat, UnixMillis(t)) {
                tat = next;
                allowed.push(t);
            }
        }
        allowed
    }

    #[test]
    fn a_full_bucket_allows_a_burst_then_the_refill_rate() {
        // 3 per second: three at once, then one every 334 ms (333.3 rounded up).
        let rate = limit(3, 1000);
        let asked: Vec<u64> = (0..40).map(|i| 1_000_000 + i * 50).collect();
        let allowed: Vec<u64> = run(rate, &asked).iter().map(|t| t - 1_000_000).collect();
        // Tokens come back every 333.334 ms: at 333.3, 666.7, 1000.0, 1333.3, 1666.7, and the
        // asks (every 50 ms) take each at the next ask after it.
        assert_eq!(allowed, [0, 50, 100, 350, 700, 1050, 1350, 1700]);
    }

    #[test]
    fn no_window_holds_more_than_a_burst_and_its_refill() {
        let rate = limit(4, 700);
        // Irregular asks, some with stamps running backwards.
        let mut asked = Vec::new();
        let mut t = 5_000_000u64;
        for i in 0..400u64 {
            t = if i % 17 == 0 {
                t - 90
            } else {
                t + (i * 37) % 113
            };
            asked.push(t);
        }
        let allowed = run(rate, &asked);
        assert!(allowed.len() > 10);
        for k in 0..allowed.len() {
            for j in k..allowed.len() {
                let count = (j - k + 1) as u64;
                let window = allowed[j] as i64 - allowed[k] as i64;
                let bound = rate.period_micros() as i64 + window * 1000;
                assert!(
                    (count * rate.interval_micros()) as i64 <= bound,
                    "{count} starts in {window} ms"
                );
            }
        }
    }

    #[test]
    fn the_leader_waits_until_the_bucket_has_a_token() {
        let rate = limit(1, 1000);
        let tat = rate.admit(0, UnixMillis(10_000)).expect("a full bucket");
        assert_eq!(
            rate.blocked_until(tat, UnixMillis(10_400), 0),
            Some(UnixMillis(11_000))
        );
        assert_eq!(rate.blocked_until(tat, UnixMillis(11_000), 0), None);
        assert!(rate.admit(tat, UnixMillis(11_000)).is_some());
        // One start on its way uses the token that would be there at 11 s.
        assert_eq!(
            rate.blocked_until(tat, UnixMillis(11_000), 1),
            Some(UnixMillis(12_000))
        );
        assert_eq!(rate.blocked_until(0, UnixMillis(10_000), 0), None);
    }

    #[test]
    fn limits_are_checked() {
        assert!(limit(1, 1).check().is_ok());
        assert!(limit(0, 1000).check().is_err());
        assert!(limit(1, 0).check().is_err());
        assert!(limit(QUEUE_RATE_STARTS_MAX + 1, 1000).check().is_err());
        assert!(limit(1, QUEUE_RATE_PERIOD_MILLIS_MAX + 1).check().is_err());
    }
}
