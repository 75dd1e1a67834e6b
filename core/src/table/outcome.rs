//! What applying one command did: the outcome for the job it names and what followed from it,
//! and why a stored table may not load.

use crate::ids::{Attempt, JobId, LeaseId, NodeId};
use crate::job::{JobState, Lease};

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
    /// The job was no longer queued when the assignment applied (e.g. cancelled meanwhile), or
    /// a rule of its queue held it back by then (paused, a limit reached).
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
    /// A released attempt: the job is `QUEUED` again with its attempt count given back.
    Released {
        job_id: JobId,
        lease: Lease,
    },
    /// Attempts exhausted (or a permanent failure): the job is `FAILED`.
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
    /// A `Submit` whose partitions do not match its task (a leader bug): nothing changed.
    SubmitInvalid {
        job_id: JobId,
        reason: String,
    },
    /// A leader's first entry of its term applied; no job changed.
    NewLeader {
        leader: NodeId,
    },
    /// A `Purge` applied: `purged` jobs were removed (each row a `Removed` follow-on), `skipped`
    /// named ids were not purgeable.
    Purged {
        purged: u64,
        skipped: u64,
    },
    /// A job's row was removed by a purge.
    Removed {
        job_id: JobId,
    },
    /// A job started out of its lane's turn order: the queued job that held the lane's smallest
    /// turn took the started job's (a follow-on of `Assigned`).
    Retagged {
        job_id: JobId,
    },
    /// A queue's settings changed (the queue was created if it was new).
    QueueSet {
        queue: String,
    },
    /// A queue change that could not apply (a new queue beyond `QUEUES_MAX`, or a setting out
    /// of bounds): nothing changed.
    QueueRefused {
        queue: String,
        reason: String,
        /// The cause was `QUEUES_MAX` (not a setting out of bounds).
        full: bool,
    },
    /// A `Submit` naming a new queue when the table already holds `QUEUES_MAX`: nothing was
    /// created.
    /// Its queue holds `active_jobs` unfinished jobs and admits at most `max_active_jobs`;
    /// nothing was created.
    QueueAdmissionRejected {
        job_id: JobId,
        queue: String,
        active_jobs: u64,
        max_active_jobs: u64,
    },
    TooManyQueues {
        job_id: JobId,
        queues: u64,
    },
    /// A `Due` entry applied: `queued` of the jobs it named were queued (each a `Due`
    /// follow-on), `skipped` were not `SCHEDULED` or not due by its stamp.
    DueChecked {
        queued: u64,
        skipped: u64,
    },
    /// A `SCHEDULED` job's time came: it is `QUEUED`.
    Due {
        job_id: JobId,
    },
    /// Every job a `BLOCKED` job waited for ended: it is `QUEUED` (or `SCHEDULED`).
    Unblocked {
        job_id: JobId,
    },
    /// A partition job was created with its data-parallel parent (a follow-on of `Submitted`).
    PartitionCreated {
        job_id: JobId,
        parent: JobId,
        index: u32,
    },
    /// Every partition completed: the parent is `COMPLETED` with the aggregate.
    ParentCompleted {
        job_id: JobId,
    },
    /// A partition failed for good (or its results could not be combined): the parent is
    /// `FAILED`; its other partitions are cancelled (follow-ons of their own).
    ParentFailed {
        job_id: JobId,
        error: String,
    },
}

/// What applying one command did: the outcome for the job it names, then every change that
/// followed from it, in order (partitions created, a parent completed or failed, partitions
/// cancelled with their parent).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub applied: Applied,
    pub follow_on: Vec<Applied>,
}

impl Outcome {
    /// Every job whose row changed (so exactly these are persisted).
    pub fn changed_jobs(&self) -> impl Iterator<Item = JobId> + '_ {
        std::iter::once(&self.applied)
            .chain(&self.follow_on)
            .filter_map(Applied::changed_job)
    }
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
            | Applied::Released { job_id, .. }
            | Applied::Requeued { job_id }
            | Applied::Cancelled { job_id, .. }
            | Applied::PartitionCreated { job_id, .. }
            | Applied::ParentCompleted { job_id }
            | Applied::ParentFailed { job_id, .. }
            | Applied::Retagged { job_id }
            | Applied::Due { job_id }
            | Applied::Unblocked { job_id }
            | Applied::Removed { job_id } => Some(*job_id),
            Applied::IdempotentReplay { .. }
            | Applied::IdempotencyConflict { .. }
            | Applied::AdmissionRejected { .. }
            | Applied::QueueAdmissionRejected { .. }
            | Applied::AssignSkipped { .. }
            | Applied::CancelTooLate { .. }
            | Applied::Stale { .. }
            | Applied::RequeueSkipped { .. }
            | Applied::UnknownJob { .. }
            | Applied::SubmitInvalid { .. }
            | Applied::NewLeader { .. }
            | Applied::QueueSet { .. }
            | Applied::QueueRefused { .. }
            | Applied::TooManyQueues { .. }
            | Applied::Purged { .. }
            | Applied::DueChecked { .. } => None,
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
    #[error("stored queue {queue:?} is inconsistent: {detail}")]
    InconsistentQueue { queue: String, detail: String },
    #[error("stored key buckets are inconsistent: {detail}")]
    InconsistentKeyBuckets { detail: String },
}
