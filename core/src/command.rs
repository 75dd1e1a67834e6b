//! Replicated commands and the deterministic job table they are applied to.
//!
//! Every job-state change is a `Command` in the log. `JobTable::apply` is a pure function of the
//! table and the command: it draws no randomness and reads no clock (a retry delay or a fresh id
//! is chosen by the leader when it proposes, and travels inside the command). So every replica
//! that applies the same log reaches the same table, and every safety check that matters lives
//! here, where no replica can skip it:
//!
//! - admission control (`Submit` carries the limit in force when it was proposed),
//! - idempotency keys (checked before admission),
//! - the lease check (a `Complete`, `AttemptFailed` or `Abandon` counts only with the current lease),
//! - the attempt budget and the final-attempt rule.
//!
//! Expected refusals (a stale result, a cancel that lost a race with completion) are ordinary
//! `Applied` outcomes and change nothing. A broken invariant is a bug and panics.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::{Attempt, JobId, LeaseId, LogIndex, Term};
use crate::job::{Job, JobState, Lease};
use crate::tasks::{TaskOutput, TaskSpec};

/// One entry of the replicated log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub index: LogIndex,
    pub term: Term,
    pub command: Command,
}

/// A job-state change, decided by the leader and applied everywhere.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum Command {
    /// Create a job (or find the one an idempotency key already names).
    Submit {
        job_id: JobId,
        task: TaskSpec,
        max_attempts: u32,
        idempotency_key: Option<String>,
        /// The admission limit in force when the leader proposed this.
        max_active_jobs: u64,
    },
    /// Start an attempt: `QUEUED -> RUNNING` under a fresh lease.
    Assign { job_id: JobId, lease: Lease },
    /// The attempt holding `lease_id` succeeded.
    Complete {
        job_id: JobId,
        lease_id: LeaseId,
        output: TaskOutput,
    },
    /// The attempt holding `lease_id` ended badly (worker lost, task failed, deadline expired).
    /// Retried after `retry_delay_millis` if attempts remain, otherwise `FAILED`.
    AttemptFailed {
        job_id: JobId,
        lease_id: LeaseId,
        cause: String,
        retry_delay_millis: u64,
    },
    /// Backoff elapsed: `RETRY_WAIT -> QUEUED`.
    Requeue { job_id: JobId },
    /// A client cancelled the job.
    Cancel { job_id: JobId },
    /// After a restart or leader change, the attempt holding `lease_id` could not be re-adopted:
    /// its outcome is unknown, it still counts, and the job is requeued (or `FAILED` if that was
    /// the final attempt).
    Abandon { job_id: JobId, lease_id: LeaseId },
}

impl Command {
    pub fn job_id(&self) -> JobId {
        match self {
            Command::Submit { job_id, .. }
            | Command::Assign { job_id, .. }
            | Command::Complete { job_id, .. }
            | Command::AttemptFailed { job_id, .. }
            | Command::Requeue { job_id }
            | Command::Cancel { job_id }
            | Command::Abandon { job_id, .. } => *job_id,
        }
    }
}

/// Why a lease-carrying command was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StaleReason {
    /// The job is terminal; nothing changes it any more.
    JobTerminal(JobState),
    /// The job runs under another lease, or under none (queued or waiting to retry).
    LeaseNotCurrent,
    /// No such job.
    UnknownJob,
}

impl std::fmt::Display for StaleReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StaleReason::JobTerminal(state) => write!(f, "job is already {state}"),
            StaleReason::LeaseNotCurrent => f.write_str("lease is not the job's current lease"),
            StaleReason::UnknownJob => f.write_str("unknown job"),
        }
    }
}

/// What applying one command did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A new job was created and queued.
    Submitted {
        job_id: JobId,
    },
    /// The idempotency key already named this job (same spec); nothing was created.
    IdempotentReplay {
        job_id: JobId,
    },
    /// The idempotency key names a job with a different spec; nothing changed.
    IdempotencyConflict {
        existing: JobId,
    },
    /// The active-job limit was reached; nothing was created.
    AdmissionRejected {
        active_jobs: u64,
        max_active_jobs: u64,
    },
    Assigned {
        job_id: JobId,
        lease: Lease,
        attempt: Attempt,
    },
    /// The job was no longer queued when the assignment applied (e.g. cancelled meanwhile).
    AssignSkipped {
        job_id: JobId,
        lease: Lease,
    },
    Completed {
        job_id: JobId,
        lease: Lease,
    },
    RetryScheduled {
        job_id: JobId,
        lease: Lease,
        attempt: Attempt,
        delay_millis: u64,
        cause: String,
    },
    /// Attempts exhausted: the job is `FAILED`.
    FailedPermanently {
        job_id: JobId,
        lease: Lease,
        error: String,
    },
    /// `RETRY_WAIT -> QUEUED`, or an abandoned attempt with attempts left.
    Requeued {
        job_id: JobId,
    },
    Cancelled {
        job_id: JobId,
        previous: JobState,
        revoked: Option<Lease>,
    },
    /// The job was terminal before the cancel applied.
    CancelTooLate {
        job_id: JobId,
        state: JobState,
    },
    /// A lease-carrying command whose lease is not current: nothing changed.
    Stale {
        job_id: JobId,
        lease_id: LeaseId,
        reason: StaleReason,
    },
    /// `Requeue` for a job no longer waiting to retry (e.g. cancelled meanwhile).
    RequeueSkipped {
        job_id: JobId,
    },
    UnknownJob {
        job_id: JobId,
    },
}

impl Applied {
    /// The job whose row changed, if any (so only it is persisted).
    pub fn changed_job(&self) -> Option<JobId> {
        match self {
            Applied::Submitted { job_id }
            | Applied::Assigned { job_id, .. }
            | Applied::Completed { job_id, .. }
            | Applied::RetryScheduled { job_id, .. }
            | Applied::FailedPermanently { job_id, .. }
            | Applied::Requeued { job_id }
            | Applied::Cancelled { job_id, .. } => Some(*job_id),
            Applied::IdempotentReplay { .. }
            | Applied::IdempotencyConflict { .. }
            | Applied::AdmissionRejected { .. }
            | Applied::AssignSkipped { .. }
            | Applied::CancelTooLate { .. }
            | Applied::Stale { .. }
            | Applied::RequeueSkipped { .. }
            | Applied::UnknownJob { .. } => None,
        }
    }
}

/// A persisted table that cannot be loaded as it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    #[error("job {0} appears twice in the stored job table")]
    DuplicateJob(JobId),
    #[error("idempotency key {key:?} is bound to two jobs ({first} and {second})")]
    DuplicateIdempotencyKey {
        key: String,
        first: JobId,
        second: JobId,
    },
    #[error("stored job {job_id} is inconsistent: {detail}")]
    InconsistentJob { job_id: JobId, detail: String },
}

/// The job table: the state every coordinator derives from the log.
#[derive(Clone, Debug, Default)]
pub struct JobTable {
    jobs: BTreeMap<JobId, Job>,
    /// `QUEUED` jobs in FIFO order, keyed by `Job::queue_seq`.
    queue: BTreeMap<u64, JobId>,
    next_queue_seq: u64,
    /// Idempotency key -> job, for the job's whole life.
    idempotency: BTreeMap<String, JobId>,
    /// Jobs in submission order (for listing).
    by_submission: BTreeMap<LogIndex, JobId>,
    /// Non-terminal jobs: the admission counter.
    active: u64,
    /// The last log index applied.
    applied: LogIndex,
}

impl JobTable {
    pub fn new() -> JobTable {
        JobTable::default()
    }

    /// Rebuilds a table from persisted rows (the state after applying `applied`).
    /// Every derived index (queue, idempotency keys, the admission counter) is recomputed from the
    /// rows, so nothing derived can disagree with what was stored.
    pub fn from_rows(rows: Vec<Job>, applied: LogIndex) -> Result<JobTable, TableError> {
        let mut table = JobTable {
            applied,
            ..JobTable::default()
        };
        for job in rows {
            let id = job.id;
            check_row(&job).map_err(|detail| TableError::InconsistentJob { job_id: id, detail })?;
            if let Some(key) = &job.idempotency_key {
                if let Some(&first) = table.idempotency.get(key) {
                    return Err(TableError::DuplicateIdempotencyKey {
                        key: key.clone(),
                        first,
                        second: id,
                    });
                }
                table.idempotency.insert(key.clone(), id);
            }
            if job.state == JobState::Queued {
                table.queue.insert(job.queue_seq, id);
            }
            if !job.state.is_terminal() {
                table.active += 1;
            }
            table.next_queue_seq = table.next_queue_seq.max(job.queue_seq + 1);
            table.by_submission.insert(job.submitted_at, id);
            if table.jobs.insert(id, job).is_some() {
                return Err(TableError::DuplicateJob(id));
            }
        }
        if table.queue.len()
            != table
                .jobs
                .values()
                .filter(|j| j.state == JobState::Queued)
                .count()
        {
            return Err(TableError::InconsistentJob {
                job_id: table
                    .queue
                    .values()
                    .next()
                    .copied()
                    .unwrap_or(JobId(uuid::Uuid::nil())),
                detail: "two queued jobs share one queue position".into(),
            });
        }
        Ok(table)
    }

    pub fn get(&self, job_id: &JobId) -> Option<&Job> {
        self.jobs.get(job_id)
    }

    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Non-terminal jobs (the admission counter).
    pub fn active_jobs(&self) -> u64 {
        self.active
    }

    pub fn applied_index(&self) -> LogIndex {
        self.applied
    }

    /// `QUEUED` jobs, oldest first.
    pub fn queued(&self) -> impl Iterator<Item = JobId> + '_ {
        self.queue.values().copied()
    }

    /// Jobs in submission order, newest first.
    pub fn newest_first(&self) -> impl Iterator<Item = &Job> {
        self.by_submission
            .values()
            .rev()
            .filter_map(|id| self.jobs.get(id))
    }

    /// The job an idempotency key names, and whether `spec` matches it.
    /// `Some(Ok(id))`: replay; `Some(Err(id))`: conflict; `None`: the key is new.
    pub fn check_idempotency(
        &self,
        key: &str,
        task: &TaskSpec,
        max_attempts: u32,
    ) -> Option<Result<JobId, JobId>> {
        let &job_id = self.idempotency.get(key)?;
        let job = self.jobs.get(&job_id)?;
        if job.task == *task && job.max_attempts == max_attempts {
            Some(Ok(job_id))
        } else {
            Some(Err(job_id))
        }
    }

    /// Applies the entry at `index`. Entries must be applied in order, each exactly once.
    pub fn apply(&mut self, index: LogIndex, command: &Command) -> Applied {
        assert_eq!(
            index,
            self.applied.next(),
            "log entries must be applied in order, once"
        );
        self.applied = index;
        let applied = self.apply_command(index, command);
        if cfg!(debug_assertions) {
            if let Some(job_id) = applied.changed_job() {
                if let Some(job) = self.jobs.get(&job_id) {
                    if let Err(detail) = check_row(job) {
                        panic!("apply broke job {job_id}: {detail}");
                    }
                }
            }
        }
        applied
    }

    fn apply_command(&mut self, index: LogIndex, command: &Command) -> Applied {
        match command {
            Command::Submit {
                job_id,
                task,
                max_attempts,
                idempotency_key,
                max_active_jobs,
            } => self.apply_submit(
                index,
                *job_id,
                task,
                *max_attempts,
                idempotency_key,
                *max_active_jobs,
            ),
            Command::Assign { job_id, lease } => self.apply_assign(*job_id, lease),
            Command::Complete {
                job_id,
                lease_id,
                output,
            } => self.apply_complete(*job_id, *lease_id, output),
            Command::AttemptFailed {
                job_id,
                lease_id,
                cause,
                retry_delay_millis,
            } => self.apply_attempt_failed(*job_id, *lease_id, cause, *retry_delay_millis),
            Command::Requeue { job_id } => self.apply_requeue(*job_id),
            Command::Cancel { job_id } => self.apply_cancel(*job_id),
            Command::Abandon { job_id, lease_id } => self.apply_abandon(*job_id, *lease_id),
        }
    }

    fn apply_submit(
        &mut self,
        index: LogIndex,
        job_id: JobId,
        task: &TaskSpec,
        max_attempts: u32,
        idempotency_key: &Option<String>,
        max_active_jobs: u64,
    ) -> Applied {
        // Idempotency first: a known key never consumes an admission slot (seed A).
        if let Some(key) = idempotency_key {
            match self.check_idempotency(key, task, max_attempts) {
                Some(Ok(existing)) => return Applied::IdempotentReplay { job_id: existing },
                Some(Err(existing)) => return Applied::IdempotencyConflict { existing },
                None => {}
            }
        }
        if self.active >= max_active_jobs {
            return Applied::AdmissionRejected {
                active_jobs: self.active,
                max_active_jobs,
            };
        }
        assert!(
            !self.jobs.contains_key(&job_id),
            "job id {job_id} proposed twice"
        );
        let queue_seq = self.take_queue_seq();
        let job = Job {
            id: job_id,
            task: task.clone(),
            max_attempts,
            idempotency_key: idempotency_key.clone(),
            state: JobState::Queued,
            attempt: Attempt(0),
            lease: None,
            last_worker: None,
            result: None,
            error: None,
            retry_delay_millis: 0,
            submitted_at: index,
            queue_seq,
        };
        if let Some(key) = idempotency_key {
            self.idempotency.insert(key.clone(), job_id);
        }
        self.queue.insert(queue_seq, job_id);
        self.by_submission.insert(index, job_id);
        self.jobs.insert(job_id, job);
        self.active += 1;
        Applied::Submitted { job_id }
    }

    fn apply_assign(&mut self, job_id: JobId, lease: &Lease) -> Applied {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Applied::UnknownJob { job_id };
        };
        if job.state != JobState::Queued || !job.attempts_remain() {
            return Applied::AssignSkipped {
                job_id,
                lease: lease.clone(),
            };
        }
        self.queue.remove(&job.queue_seq);
        transition(job, JobState::Running);
        job.attempt = Attempt(job.attempt.0 + 1);
        job.lease = Some(lease.clone());
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

    /// True if `lease_id` is the current lease of `job_id` (a result carrying it would count).
    pub fn is_current_lease(&self, job_id: JobId, lease_id: LeaseId) -> bool {
        self.current_lease(job_id, lease_id).is_ok()
    }

    fn apply_complete(&mut self, job_id: JobId, lease_id: LeaseId, output: &TaskOutput) -> Applied {
        let lease = match self.current_lease(job_id, lease_id) {
            Ok(lease) => lease,
            Err(reason) => {
                return Applied::Stale {
                    job_id,
                    lease_id,
                    reason,
                }
            }
        };
        let job = self.job_mut(job_id);
        transition(job, JobState::Completed);
        job.lease = None;
        job.result = Some(output.clone());
        job.error = None;
        self.active -= 1;
        Applied::Completed { job_id, lease }
    }

    fn apply_attempt_failed(
        &mut self,
        job_id: JobId,
        lease_id: LeaseId,
        cause: &str,
        retry_delay_millis: u64,
    ) -> Applied {
        let lease = match self.current_lease(job_id, lease_id) {
            Ok(lease) => lease,
            Err(reason) => {
                return Applied::Stale {
                    job_id,
                    lease_id,
                    reason,
                }
            }
        };
        let job = self.job_mut(job_id);
        job.lease = None;
        job.error = Some(cause.to_owned());
        if job.attempts_remain() {
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
            self.active -= 1;
            Applied::FailedPermanently {
                job_id,
                lease,
                error: cause.to_owned(),
            }
        }
    }

    fn apply_requeue(&mut self, job_id: JobId) -> Applied {
        let Some(job) = self.jobs.get(&job_id) else {
            return Applied::UnknownJob { job_id };
        };
        if job.state != JobState::RetryWait {
            return Applied::RequeueSkipped { job_id };
        }
        self.enqueue(job_id);
        Applied::Requeued { job_id }
    }

    fn apply_cancel(&mut self, job_id: JobId) -> Applied {
        let Some(job) = self.jobs.get_mut(&job_id) else {
            return Applied::UnknownJob { job_id };
        };
        let previous = job.state;
        if previous.is_terminal() {
            return Applied::CancelTooLate {
                job_id,
                state: previous,
            };
        }
        if previous == JobState::Queued {
            self.queue.remove(&job.queue_seq);
        }
        transition(job, JobState::Cancelled);
        let revoked = job.lease.take();
        job.error = Some("cancelled by client".to_owned());
        self.active -= 1;
        Applied::Cancelled {
            job_id,
            previous,
            revoked,
        }
    }

    fn apply_abandon(&mut self, job_id: JobId, lease_id: LeaseId) -> Applied {
        let lease = match self.current_lease(job_id, lease_id) {
            Ok(lease) => lease,
            Err(reason) => {
                return Applied::Stale {
                    job_id,
                    lease_id,
                    reason,
                }
            }
        };
        let job = self.job_mut(job_id);
        let cause = format!(
            "attempt {} on worker {} was interrupted by a coordinator restart and could not be re-adopted",
            job.attempt, lease.worker
        );
        job.lease = None;
        job.error = Some(cause.clone());
        if job.attempts_remain() {
            self.enqueue(job_id);
            Applied::Requeued { job_id }
        } else {
            // The final-attempt rule: the interrupted attempt counts, and it was the last one.
            transition(job, JobState::Failed);
            self.active -= 1;
            Applied::FailedPermanently {
                job_id,
                lease,
                error: cause,
            }
        }
    }

    fn enqueue(&mut self, job_id: JobId) {
        let queue_seq = self.take_queue_seq();
        let job = self.job_mut(job_id);
        transition(job, JobState::Queued);
        job.queue_seq = queue_seq;
        self.queue.insert(queue_seq, job_id);
    }

    fn take_queue_seq(&mut self) -> u64 {
        let seq = self.next_queue_seq;
        self.next_queue_seq += 1;
        seq
    }

    fn job_mut(&mut self, job_id: JobId) -> &mut Job {
        self.jobs
            .get_mut(&job_id)
            .unwrap_or_else(|| panic!("job {job_id} vanished during apply"))
    }

    /// Checks every invariant the table promises (SPEC 4: 2, 4, 5, 6). Used by tests and the
    /// simulator after every step; `Err` names the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut active = 0;
        let mut queued = BTreeSet::new();
        for job in self.jobs.values() {
            check_row(job).map_err(|detail| format!("job {}: {detail}", job.id))?;
            if !job.state.is_terminal() {
                active += 1;
            }
            if job.state == JobState::Queued {
                queued.insert(job.id);
                if self.queue.get(&job.queue_seq) != Some(&job.id) {
                    return Err(format!("queued job {} is missing from the queue", job.id));
                }
            }
            if let Some(key) = &job.idempotency_key {
                if self.idempotency.get(key) != Some(&job.id) {
                    return Err(format!(
                        "job {} has key {key:?} but the index disagrees",
                        job.id
                    ));
                }
            }
        }
        if active != self.active {
            return Err(format!(
                "admission counter is {} but {} jobs are non-terminal",
                self.active, active
            ));
        }
        let in_queue: BTreeSet<JobId> = self.queue.values().copied().collect();
        if in_queue != queued || self.queue.len() != queued.len() {
            return Err(format!(
                "queue holds {} entries but {} jobs are QUEUED",
                self.queue.len(),
                queued.len()
            ));
        }
        for (key, job_id) in &self.idempotency {
            match self.jobs.get(job_id) {
                Some(job) if job.idempotency_key.as_deref() == Some(key) => {}
                _ => {
                    return Err(format!(
                        "idempotency key {key:?} points at job {job_id} without it"
                    ))
                }
            }
        }
        Ok(())
    }
}

fn transition(job: &mut Job, to: JobState) {
    if let Err(illegal) = job.transition(to) {
        panic!("job {}: {illegal} (apply checked the state first)", job.id);
    }
}

/// The per-row invariants: lease exactly while running, attempt within budget, a result exactly
/// when completed.
fn check_row(job: &Job) -> Result<(), String> {
    if job.max_attempts == 0 {
        return Err("max_attempts is 0".into());
    }
    if job.attempt.0 > job.max_attempts {
        return Err(format!(
            "attempt {} exceeds max_attempts {}",
            job.attempt, job.max_attempts
        ));
    }
    if (job.state == JobState::Running) != job.lease.is_some() {
        return Err(format!(
            "state {} with lease {:?}",
            job.state,
            job.lease.as_ref().map(|l| l.id)
        ));
    }
    if job.state == JobState::Running && job.attempt.0 == 0 {
        return Err("running with attempt 0".into());
    }
    if (job.state == JobState::Completed) != job.result.is_some() {
        return Err(format!(
            "state {} with result present = {}",
            job.state,
            job.result.is_some()
        ));
    }
    Ok(())
}
