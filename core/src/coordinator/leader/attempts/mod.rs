//! Attempts at the leader: each running attempt from its assignment to its settlement.
//!
//! An attempt is assigned under a lease, its deadline armed; it ends when exactly one settling
//! command naming that lease applies (`Complete`, `AttemptFailed`, `Release`, `Abandon`). While
//! that command is being written the lease is *settling*: no second settlement is proposed for it,
//! and a result that arrives meanwhile is answered only once the first is durable. After a
//! takeover, attempts the table shows running wait a window for their worker to report them
//! (re-adoption), and are abandoned if it does not.
//!
//! - `mod.rs`: the state, the deadlines, failing and abandoning attempts, re-adoption;
//! - `results.rs`: a worker's result taken in, its settlement proposed, and its acknowledgement;
//! - `settled.rs`: what an applied attempt command makes visible (assignments sent, events,
//!   retries armed, cancels).

mod results;
mod settled;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand_chacha::rand_core::RngCore;

use super::{LeaderState, Pending};
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::coordinator::timers::{Timer, TimerKey};
use crate::coordinator::Event;
use crate::ids::{Incarnation, JobId, LeaseId, WorkerId};
use crate::job::{FailureKind, JobState};
use crate::limits::PROGRESS_NOTE_BYTES_MAX;
use crate::protocol::CancelReason;
use crate::text::prefix_within;
use crate::time::as_millis_u64;

pub(super) use settled::on_requeued;

/// What the leader keeps about attempts, beyond what the table holds.
#[derive(Debug, Default)]
pub(super) struct Attempts {
    /// Leases with a settling command (`Complete`, `AttemptFailed`, `Release`, `Abandon`) in
    /// flight, proposed by this leader.
    settling: BTreeSet<LeaseId>,
    /// Results that arrived while their attempt was settling, answered once it is durable.
    deferred_acks: BTreeMap<LeaseId, (JobId, WorkerId)>,
    /// Deadlines of running attempts, to disarm when they settle.
    lease_deadlines: BTreeMap<LeaseId, TimerKey>,
    /// The latest progress note of each running attempt (dropped when its deadline is, so it
    /// holds at most one note per attempt with an armed deadline).
    progress: BTreeMap<LeaseId, String>,
    /// Running attempts found at takeover, waiting for their worker to report them.
    awaiting_readoption: BTreeMap<LeaseId, JobId>,
}

impl Attempts {
    pub(super) fn is_settling(&self, lease_id: LeaseId) -> bool {
        self.settling.contains(&lease_id)
    }

    /// A settling command for `lease_id` is being proposed: the only one this leader proposes.
    fn begin_settling(&mut self, lease_id: LeaseId) {
        let first = self.settling.insert(lease_id);
        assert!(first, "a second settlement proposed for lease {lease_id}");
    }

    /// The latest progress note of the attempt holding `lease_id`.
    pub(super) fn progress_of(&self, lease_id: LeaseId) -> Option<&String> {
        self.progress.get(&lease_id)
    }

    /// A running attempt found at takeover: its worker has a window to report it.
    pub(super) fn await_readoption(&mut self, lease_id: LeaseId, job_id: JobId) {
        let fresh = self.awaiting_readoption.insert(lease_id, job_id).is_none();
        assert!(fresh, "lease {lease_id} found running twice at takeover");
    }

    pub(super) fn awaiting_readoption(&self) -> usize {
        self.awaiting_readoption.len()
    }

    /// Progress notes are kept only for attempts whose deadline is armed.
    fn debug_check(&self) {
        if cfg!(debug_assertions) {
            let orphan = self
                .progress
                .keys()
                .find(|lease| !self.lease_deadlines.contains_key(lease));
            assert!(
                orphan.is_none(),
                "progress kept for {orphan:?}, which has no deadline"
            );
        }
    }
}

impl LeaderState {
    /// A failed attempt's backoff elapsed: its job is queued again, if it still waits.
    pub(super) fn retry_due(&mut self, m: &mut Member, job_id: JobId) {
        if m.table.get(&job_id).map(|job| job.state) == Some(JobState::RetryWait) {
            self.propose(m, Command::Requeue { job_id }, None);
        }
    }

    /// Re-adopts a recovered running attempt if `worker_id`'s live incarnation is the one the
    /// lease was granted to.
    pub(super) fn try_readopt(
        &mut self,
        m: &mut Member,
        worker_id: &WorkerId,
        job_id: JobId,
        lease_id: LeaseId,
    ) -> bool {
        if self.attempts.awaiting_readoption.get(&lease_id) != Some(&job_id) {
            return false;
        }
        let Some(lease) = m.table.get(&job_id).and_then(|job| job.lease.clone()) else {
            return false;
        };
        let Some(entry) = self.registry.get_mut(worker_id) else {
            return false;
        };
        if lease.id != lease_id
            || lease.worker != *worker_id
            || lease.incarnation != entry.incarnation
            || !entry.alive
        {
            return false;
        }
        self.attempts.awaiting_readoption.remove(&lease_id);
        entry.leases.insert(lease_id, job_id);
        self.arm_lease_deadline(m, worker_id, job_id, lease_id);
        m.event(Event::AttemptReadopted {
            job_id,
            lease_id,
            worker: worker_id.clone(),
        });
        true
    }

    /// A worker id came back as a new process: attempts the old process held cannot be re-adopted.
    pub(super) fn abandon_other_incarnations(
        &mut self,
        m: &mut Member,
        worker_id: &WorkerId,
        incarnation: Incarnation,
    ) {
        let orphans: Vec<(LeaseId, JobId)> = self
            .attempts
            .awaiting_readoption
            .iter()
            .filter(|(_, job_id)| {
                m.table
                    .get(job_id)
                    .and_then(|job| job.lease.as_ref())
                    .is_some_and(|lease| {
                        lease.worker == *worker_id && lease.incarnation != incarnation
                    })
            })
            .map(|(&lease_id, &job_id)| (lease_id, job_id))
            .collect();
        for (lease_id, job_id) in orphans {
            self.abandon(m, job_id, lease_id);
        }
    }

    pub(super) fn abandon(&mut self, m: &mut Member, job_id: JobId, lease_id: LeaseId) {
        self.attempts.awaiting_readoption.remove(&lease_id);
        if self.attempts.is_settling(lease_id) || !m.table.is_current_lease(job_id, lease_id) {
            return;
        }
        let worker = m
            .table
            .get(&job_id)
            .and_then(|job| job.lease.as_ref())
            .map(|lease| lease.worker.clone())
            .unwrap_or_else(|| WorkerId(String::new()));
        m.event(Event::AttemptAbandoned {
            job_id,
            lease_id,
            worker,
        });
        self.attempts.begin_settling(lease_id);
        self.propose(m, Command::Abandon { job_id, lease_id }, None);
    }

    pub(super) fn end_readoption(&mut self, m: &mut Member) {
        let leftovers: Vec<(LeaseId, JobId)> = self
            .attempts
            .awaiting_readoption
            .iter()
            .map(|(&lease_id, &job_id)| (lease_id, job_id))
            .collect();
        for (lease_id, job_id) in leftovers {
            self.abandon(m, job_id, lease_id);
        }
    }

    /// Proposes `AttemptFailed` (retryable) for a current, not-yet-settling lease.
    pub(super) fn fail_attempt(
        &mut self,
        m: &mut Member,
        job_id: JobId,
        lease_id: LeaseId,
        failure: (FailureKind, String),
        pending: Option<Pending>,
    ) -> bool {
        self.propose_failure(m, (job_id, lease_id), failure, false, pending)
    }

    /// Proposes `AttemptFailed` for a current, not-yet-settling lease; a `permanent` failure
    /// ends the job whatever attempts remain.
    pub(super) fn propose_failure(
        &mut self,
        m: &mut Member,
        (job_id, lease_id): (JobId, LeaseId),
        (kind, cause): (FailureKind, String),
        permanent: bool,
        pending: Option<Pending>,
    ) -> bool {
        if self.attempts.is_settling(lease_id) || !m.table.is_current_lease(job_id, lease_id) {
            return false;
        }
        let attempt = m.table.get(&job_id).map_or(1, |job| job.attempt.0);
        let retry_delay_millis = self.retry_delay_millis(m, attempt);
        self.attempts.begin_settling(lease_id);
        self.propose(
            m,
            Command::AttemptFailed {
                job_id,
                lease_id,
                cause,
                retry_delay_millis,
                permanent,
                kind,
            },
            pending,
        );
        true
    }

    /// Full jitter: uniform in `[0, min(retry_max, retry_base * 2^(attempt-1))]`.
    pub(super) fn retry_delay_millis(&mut self, m: &mut Member, attempt: u32) -> u64 {
        let base = as_millis_u64(m.config.retry_base);
        let cap = as_millis_u64(m.config.retry_max);
        let exponent = attempt.saturating_sub(1).min(63);
        let ceiling = base.saturating_mul(1u64 << exponent).min(cap);
        m.rng.next_u64() % (ceiling + 1)
    }

    pub(super) fn expire_lease(&mut self, m: &mut Member, job_id: JobId, lease_id: LeaseId) {
        self.attempts.lease_deadlines.remove(&lease_id);
        let Some(worker) = m
            .table
            .get(&job_id)
            .and_then(|job| job.lease.as_ref())
            .filter(|lease| lease.id == lease_id)
            .map(|lease| lease.worker.clone())
        else {
            return;
        };
        if let Some(entry) = self.registry.get_mut(&worker) {
            if entry.leases.contains_key(&lease_id) {
                // It keeps its slot until the worker says it stopped, and when that will be
                // is no longer known.
                entry.overdue.insert(lease_id);
            }
        }
        let cause = format!(
            "attempt deadline of {} ms expired on worker {worker}",
            as_millis_u64(task_timeout(m, job_id))
        );
        let revoke = Pending::Revoke {
            reason: CancelReason::DeadlineExpired,
        };
        if self.fail_attempt(
            m,
            job_id,
            lease_id,
            (FailureKind::DeadlineExpired, cause),
            Some(revoke),
        ) {
            m.event(Event::LeaseExpired {
                job_id,
                lease_id,
                worker,
            });
        }
    }

    /// Arms the deadline of a lease that is going out to (or was re-adopted from) `worker`: its
    /// attempt's timeout, counted from when the attempt can start at the latest, so time spent
    /// waiting for a slot at a prefetching worker never counts against it.
    pub(super) fn arm_lease_deadline(
        &mut self,
        m: &mut Member,
        worker: &WorkerId,
        job_id: JobId,
        lease_id: LeaseId,
    ) {
        let timeout = task_timeout(m, job_id);
        let at = match self.registry.get_mut(worker) {
            Some(entry) => {
                let at = entry.latest_start(lease_id, m.now).saturating_add(timeout);
                if entry.leases.contains_key(&lease_id) {
                    entry.ends.insert(lease_id, at);
                }
                at
            }
            None => m.now.saturating_add(timeout),
        };
        let key = self.timers.arm(at, Timer::LeaseDeadline(job_id, lease_id));
        let earlier = self.attempts.lease_deadlines.insert(lease_id, key);
        // Armed once per lease (at assignment or re-adoption): a second would leave a timer
        // that nothing disarms.
        assert!(earlier.is_none(), "lease {lease_id} got a second deadline");
    }

    pub(super) fn disarm_lease_deadline(&mut self, lease_id: LeaseId) {
        self.attempts.progress.remove(&lease_id);
        if let Some(key) = self.attempts.lease_deadlines.remove(&lease_id) {
            self.timers.disarm(key);
        }
        self.attempts.debug_check();
    }

    /// Keeps a running attempt's latest progress note, if the attempt is this worker's and its
    /// deadline is armed (it runs); anything else is a stale or mistaken report and ignored.
    pub(super) fn note_progress(
        &mut self,
        worker: &WorkerId,
        job_id: JobId,
        lease_id: LeaseId,
        note: &str,
    ) {
        let holds = self
            .registry
            .get(worker)
            .is_some_and(|w| w.leases.get(&lease_id) == Some(&job_id));
        if holds && self.attempts.lease_deadlines.contains_key(&lease_id) {
            let note = prefix_within(note, PROGRESS_NOTE_BYTES_MAX).to_owned();
            self.attempts.progress.insert(lease_id, note);
            self.attempts.debug_check();
        }
    }
}

/// Each attempt's deadline for `job_id`: the one its submission chose, else the default.
pub(super) fn task_timeout(m: &Member, job_id: JobId) -> Duration {
    m.table
        .get(&job_id)
        .and_then(|job| job.timeout_millis)
        .map_or(m.config.task_timeout, Duration::from_millis)
}
