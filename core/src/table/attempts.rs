//! One attempt's life in the table: assigned under a fresh lease, then settled by exactly one
//! command carrying that lease (completed, failed, released or abandoned), or requeued after
//! its backoff. A settling command whose lease is not current is `Stale` and changes nothing.

use super::{transition, Applied, JobTable, StaleReason};
use crate::ids::{Attempt, JobId, LeaseId};
use crate::job::{AttemptEnd, AttemptRecord, FailureKind, Job, JobState, Lease};
use crate::limits::{ATTEMPT_HISTORY_ERROR_BYTES_MAX, ATTEMPT_HISTORY_MAX};
use crate::queues::HeldBack;
use crate::tasks::TaskOutput;
use crate::text::prefix_within;
use crate::time::UnixMillis;

impl JobTable {
    /// Which of its queue's rules holds `job` back from starting at this entry's stamp, if
    /// one does: the queue's own (`queue_held_back`), or a per-key limit for the job's key.
    /// Every attempt running counts, whichever leader started it: the counts and the limits
    /// are all in the table.
    fn held_back(&self, job: &Job) -> Option<HeldBack> {
        let (queue, key) = (&job.queue, job.fairness_key.as_deref());
        self.queue_held_back(queue, 0, self.entry_at)
            .or_else(|| self.key_held_back(queue, key, 0, self.entry_at))
            .map(|(why, _)| why)
    }

    pub(super) fn apply_assign(
        &mut self,
        job_id: JobId,
        lease: &Lease,
        follow_on: &mut Vec<Applied>,
    ) -> Applied {
        let Some(job) = self.jobs.get(&job_id) else {
            return Applied::UnknownJob { job_id };
        };
        // A queue's rules are checked here, where no leader can skip them: an assignment
        // proposed before a pause or a lower limit applied, and applied after it, is refused.
        if job.state != JobState::Queued || !job.attempts_remain() || self.held_back(job).is_some()
        {
            return Applied::AssignSkipped {
                job_id,
                lease: lease.clone(),
            };
        }
        let job = self
            .jobs
            .get_mut(&job_id)
            .unwrap_or_else(|| panic!("job {job_id} vanished during apply"));
        let started = self.queue.start(job.queue_seq, &job.placement());
        let Some((removed, retag)) = started else {
            panic!("queued job {job_id} was not at its queue position");
        };
        assert_eq!(
            removed, job_id,
            "queued job {job_id} was not at its queue position"
        );
        job.turn = 0;
        // The start advances its queue's share and consumes its lane's smallest turn.
        let queue = self.queues.get_mut(&job.queue).unwrap_or_else(|| {
            panic!(
                "job {job_id} names queue {:?}, which the table does not hold",
                job.queue
            )
        });
        queue.pass = queue.pass.saturating_add(queue.settings.stride());
        if let Some(rate) = queue.settings.rate {
            let Some(tat) = rate.admit(queue.rate_tat_micros, self.entry_at) else {
                panic!("job {job_id} started beyond its queue's rate limit (checked above)");
            };
            queue.rate_tat_micros = tat;
        }
        if !self.queues_changed.contains(&job.queue) {
            self.queues_changed.insert(job.queue.clone());
        }
        self.key_rate_started(job_id);
        if let Some(retag) = retag {
            self.job_mut(retag.job_id).turn = retag.tag;
            follow_on.push(Applied::Retagged {
                job_id: retag.job_id,
            });
        }
        let entry_at = self.entry_at;
        self.attempt_started(job_id);
        let job = self.job_mut(job_id);
        assert!(job.lease.is_none(), "queued job {job_id} holds a lease");
        transition(job, JobState::Running);
        job.attempt = Attempt(job.attempt.0 + 1);
        job.lease = Some(lease.clone());
        if job.history.is_empty() {
            // A row from before jobs kept a history: its earlier attempts went unrecorded.
            job.history_dropped = job.attempt.0 - 1;
        }
        let started = entry_at.max(job.created_at);
        job.first_started_at.get_or_insert(started);
        if job.history.len() >= ATTEMPT_HISTORY_MAX {
            job.history.remove(0);
            job.history_dropped += 1;
        }
        job.history.push(AttemptRecord {
            attempt: job.attempt.0,
            lease_id: lease.id,
            worker: lease.worker.clone(),
            started_at_unix_ms: started,
            ended_at_unix_ms: None,
            outcome: None,
            error: None,
        });
        // The previous attempt's error stays visible while the retry runs.
        job.last_worker = Some(lease.worker.clone());
        Applied::Assigned {
            job_id,
            lease: lease.clone(),
            attempt: job.attempt,
        }
    }

    /// The job's lease if `lease_id` is current, otherwise why not.
    fn current_lease(&self, job_id: JobId, lease_id: LeaseId) -> Result<Lease, StaleReason> {
        let job = self.jobs.get(&job_id).ok_or(StaleReason::UnknownJob)?;
        if job.state.is_terminal() {
            return Err(StaleReason::JobTerminal(job.state));
        }
        match &job.lease {
            Some(lease) if job.state == JobState::Running && lease.id == lease_id => {
                Ok(lease.clone())
            }
            _ => Err(StaleReason::LeaseNotCurrent),
        }
    }

    /// The lease a settling command names, if current; otherwise the `Stale` outcome saying
    /// why, which changes nothing.
    fn lease_to_settle(&self, job_id: JobId, lease_id: LeaseId) -> Result<Lease, Applied> {
        self.current_lease(job_id, lease_id)
            .map_err(|reason| Applied::Stale {
                job_id,
                lease_id,
                reason,
            })
    }

    /// True if `lease_id` is the current lease of `job_id` (a result carrying it would count).
    pub fn is_current_lease(&self, job_id: JobId, lease_id: LeaseId) -> bool {
        self.current_lease(job_id, lease_id).is_ok()
    }

    pub(super) fn apply_complete(
        &mut self,
        job_id: JobId,
        lease_id: LeaseId,
        output: &TaskOutput,
    ) -> Applied {
        let lease = match self.lease_to_settle(job_id, lease_id) {
            Ok(lease) => lease,
            Err(stale) => return stale,
        };
        let at = self.entry_at;
        // The settled attempt gives its lease up, and its queue runs one fewer.
        self.attempt_left(job_id);
        let job = self.job_mut(job_id);
        close_attempt(job, lease.id, at, AttemptEnd::Completed, None);
        transition(job, JobState::Completed);
        job.lease = None;
        job.result = Some(output.clone());
        job.error = None;
        self.job_ended(job_id);
        Applied::Completed { job_id, lease }
    }

    /// `retry_delay_millis` is `None` for a permanent failure, which ends the job whatever
    /// attempts remain.
    pub(super) fn apply_attempt_failed(
        &mut self,
        (job_id, lease_id): (JobId, LeaseId),
        (kind, cause): (FailureKind, &str),
        retry_delay_millis: Option<u64>,
    ) -> Applied {
        let lease = match self.lease_to_settle(job_id, lease_id) {
            Ok(lease) => lease,
            Err(stale) => return stale,
        };
        let at = self.entry_at;
        // The settled attempt gives its lease up, and its queue runs one fewer.
        self.attempt_left(job_id);
        let job = self.job_mut(job_id);
        close_attempt(job, lease_id, at, kind.end(), Some(cause));
        job.lease = None;
        job.error = Some(cause.to_owned());
        if let Some(retry_delay_millis) = retry_delay_millis.filter(|_| job.attempts_remain()) {
            transition(job, JobState::RetryWait);
            job.retry_delay_millis = retry_delay_millis;
            Applied::RetryScheduled {
                job_id,
                lease,
                attempt: job.attempt,
                delay_millis: retry_delay_millis,
                cause: cause.to_owned(),
            }
        } else {
            transition(job, JobState::Failed);
            self.job_ended(job_id);
            Applied::FailedPermanently {
                job_id,
                lease,
                error: cause.to_owned(),
            }
        }
    }

    pub(super) fn apply_release(&mut self, job_id: JobId, lease_id: LeaseId) -> Applied {
        let lease = match self.lease_to_settle(job_id, lease_id) {
            Ok(lease) => lease,
            Err(stale) => return stale,
        };
        let at = self.entry_at;
        // The settled attempt gives its lease up, and its queue runs one fewer.
        self.attempt_left(job_id);
        let job = self.job_mut(job_id);
        assert!(job.attempt.0 >= 1, "running job {job_id} with attempt 0");
        close_attempt(job, lease_id, at, AttemptEnd::Released, None);
        job.lease = None;
        // Not charged: the attempt it handed back never happened as far as the budget goes.
        job.attempt = Attempt(job.attempt.0 - 1);
        self.enqueue(job_id);
        Applied::Released { job_id, lease }
    }

    pub(super) fn apply_requeue(&mut self, job_id: JobId) -> Applied {
        let Some(job) = self.jobs.get(&job_id) else {
            return Applied::UnknownJob { job_id };
        };
        if job.state != JobState::RetryWait {
            return Applied::RequeueSkipped { job_id };
        }
        self.enqueue(job_id);
        Applied::Requeued { job_id }
    }

    pub(super) fn apply_abandon(&mut self, job_id: JobId, lease_id: LeaseId) -> Applied {
        let lease = match self.lease_to_settle(job_id, lease_id) {
            Ok(lease) => lease,
            Err(stale) => return stale,
        };
        let at = self.entry_at;
        // The settled attempt gives its lease up, and its queue runs one fewer.
        self.attempt_left(job_id);
        let job = self.job_mut(job_id);
        let cause = format!(
            "attempt {} on worker {} was interrupted by a coordinator restart and could not be re-adopted",
            job.attempt, lease.worker
        );
        close_attempt(job, lease_id, at, AttemptEnd::Abandoned, Some(&cause));
        job.lease = None;
        job.error = Some(cause.clone());
        if job.attempts_remain() {
            self.enqueue(job_id);
            Applied::Requeued { job_id }
        } else {
            // The final-attempt rule: the interrupted attempt counts, and it was the last one.
            transition(job, JobState::Failed);
            self.job_ended(job_id);
            Applied::FailedPermanently {
                job_id,
                lease,
                error: cause,
            }
        }
    }
}

/// Ends the running attempt's history record: the one `lease_id` opened, which is the last.
/// A row written before jobs kept a history has none to end.
pub(super) fn close_attempt(
    job: &mut Job,
    lease_id: LeaseId,
    at: UnixMillis,
    end: AttemptEnd,
    error: Option<&str>,
) {
    let Some(record) = job.history.last_mut() else {
        assert!(
            job.history_dropped == 0,
            "job {} dropped history records but holds none",
            job.id
        );
        return;
    };
    assert!(
        record.lease_id == lease_id && record.outcome.is_none(),
        "job {}: ending attempt {lease_id}, but its latest record is {} ({:?})",
        job.id,
        record.lease_id,
        record.outcome
    );
    record.ended_at_unix_ms = Some(at.max(record.started_at_unix_ms));
    record.outcome = Some(end);
    record.error = error.map(|e| prefix_within(e, ATTEMPT_HISTORY_ERROR_BYTES_MAX).to_owned());
}
