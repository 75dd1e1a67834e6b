//! The coordinator's timers, as data (no clock is read here). Every handler first checks that its
//! timer still matters (the lease is still current, the worker is still the same incarnation...),
//! so a timer that outlived its purpose is harmless. Timers that would otherwise pile up (one
//! lease deadline per attempt, one timeout per parked `WAIT`) are disarmed when settled, so the
//! queue stays as large as the work in flight.

use std::collections::BTreeMap;

use crate::ids::{ConnectionId, JobId, LeaseId, RequestId, WorkerId};
use crate::time::Instant;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Timer {
    /// Has this worker (in this registration) been silent for a whole heartbeat timeout?
    HeartbeatCheck(WorkerId, u64),
    /// The attempt's deadline.
    LeaseDeadline(JobId, LeaseId),
    /// The job's retry backoff is over.
    RetryDue(JobId),
    /// The re-adoption window after a restart is over.
    ReadoptionEnd,
    /// A parked `WAIT` ran out of time.
    WaitTimeout(ConnectionId, RequestId, JobId),
    /// Time to check whether retention has terminal jobs to purge.
    RetentionSweep,
    /// A rate-limited queue's next token is due: schedule again.
    RateDue,
    /// The earliest scheduled job's `run_at` has come, by this leader's clock.
    RunAtDue,
}

/// Names one armed timer so it can be disarmed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimerKey(Instant, u64);

#[derive(Debug, Default)]
pub struct TimerQueue {
    /// Keyed by (deadline, arming order), so equal deadlines fire in the order they were armed.
    queue: BTreeMap<TimerKey, Timer>,
    seq: u64,
}

impl TimerQueue {
    pub fn arm(&mut self, at: Instant, timer: Timer) -> TimerKey {
        self.seq += 1;
        let key = TimerKey(at, self.seq);
        self.queue.insert(key, timer);
        key
    }

    pub fn disarm(&mut self, key: TimerKey) {
        self.queue.remove(&key);
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        self.queue.first_key_value().map(|(key, _)| key.0)
    }

    /// The earliest timer due at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<Timer> {
        match self.queue.first_key_value() {
            Some((key, _)) if key.0 <= now => self.queue.pop_first().map(|(_, timer)| timer),
            _ => None,
        }
    }
}
