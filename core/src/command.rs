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
//! - the attempt budget and the final-attempt rule,
//! - data-parallel jobs: a parent and its partitions are created by one `Submit`; the parent
//!   completes with the aggregate when its last partition completes, fails (cancelling the
//!   rest) when one fails for good, and a cancel of either cancels the whole job.
//!
//! One command can change several jobs (a parent and its partitions), so applying returns an
//! [`Outcome`]: what happened to the job the command names, then what followed from it.
//!
//! Expected refusals (a stale result, a cancel that lost a race with completion) are ordinary
//! `Applied` outcomes and change nothing. A broken invariant is a bug and panics.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::ids::{Attempt, JobId, LeaseId, LogIndex, NodeId, Term};
use crate::job::{AttemptEnd, AttemptRecord, FailureKind, Job, JobState, Lease, PartitionOf};
use crate::job_queue::JobQueue;
use crate::limits::{
    ATTEMPT_HISTORY_ERROR_BYTES_MAX, ATTEMPT_HISTORY_MAX, QUEUE_POSITIONS_PER_ENTRY,
};
use crate::protocol::Partitions;
use crate::tasks::{aggregate, TaskOutput, TaskSpec};
use crate::text::prefix_within;
use crate::time::UnixMillis;

/// One entry of the replicated log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub index: LogIndex,
    pub term: Term,
    /// The wall time the proposing leader stamped (unstamped on a leader's first entry).
    #[serde(default, skip_serializing_if = "UnixMillis::is_unstamped")]
    pub at: UnixMillis,
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
        /// For a data-parallel task: the ids of its partition jobs, one per piece of
        /// `task.split(partitions.len())` (the leader resolved the partition count and drew
        /// the ids). Empty for any other task, and for a list with no numbers.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        partitions: Vec<JobId>,
        /// For a data-parallel task: the partition count the client asked for (`auto` when it
        /// named none), which a keyed resend must repeat. `None` for any other task.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partitions_asked: Option<Partitions>,
        /// Each attempt's deadline, if the submission chose one (else the leader's default).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_millis: Option<u64>,
        /// The name of the token the submission came with (`None`: a caller with no token).
        /// Its idempotency key is bound within that name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        submitted_by: Option<String>,
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
    /// Retried after `retry_delay_millis` if attempts remain and the failure is not
    /// `permanent`, otherwise `FAILED`.
    AttemptFailed {
        job_id: JobId,
        lease_id: LeaseId,
        cause: String,
        retry_delay_millis: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        permanent: bool,
        /// What kind of failure it was, for the job's history and for operators.
        #[serde(default, skip_serializing_if = "FailureKind::is_default")]
        kind: FailureKind,
    },
    /// A draining worker handed back the attempt holding `lease_id` unfinished: the job is
    /// queued again at once and the attempt is not charged.
    Release { job_id: JobId, lease_id: LeaseId },
    /// Backoff elapsed: `RETRY_WAIT -> QUEUED`.
    Requeue { job_id: JobId },
    /// A client cancelled the job.
    Cancel { job_id: JobId },
    /// After a restart or leader change, the attempt holding `lease_id` could not be re-adopted:
    /// its outcome is unknown, it still counts, and the job is requeued (or `FAILED` if that was
    /// the final attempt).
    Abandon { job_id: JobId, lease_id: LeaseId },
    /// The first entry of a leader's term (Raft's no-op entry, paper 8): it changes no job.
    /// Committing it commits everything before it, and tells the new leader that its table
    /// holds everything committed before it took over.
    NewLeader { leader: NodeId },
    /// Retention: remove these terminal jobs (each with its partitions), their results and
    /// their idempotency keys. An id that is unknown, not terminal or a partition is skipped.
    Purge { job_ids: Vec<JobId> },
}

impl Command {
    /// The job the command names (`None` for `NewLeader`).
    pub fn job_id(&self) -> Option<JobId> {
        match self {
            Command::Submit { job_id, .. }
            | Command::Assign { job_id, .. }
            | Command::Complete { job_id, .. }
            | Command::AttemptFailed { job_id, .. }
            | Command::Requeue { job_id }
            | Command::Cancel { job_id }
            | Command::Release { job_id, .. }
            | Command::Abandon { job_id, .. } => Some(*job_id),
            Command::NewLeader { .. } | Command::Purge { .. } => None,
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
            | Applied::Removed { job_id } => Some(*job_id),
            Applied::IdempotentReplay { .. }
            | Applied::IdempotencyConflict { .. }
            | Applied::AdmissionRejected { .. }
            | Applied::AssignSkipped { .. }
            | Applied::CancelTooLate { .. }
            | Applied::Stale { .. }
            | Applied::RequeueSkipped { .. }
            | Applied::UnknownJob { .. }
            | Applied::SubmitInvalid { .. }
            | Applied::NewLeader { .. }
            | Applied::Purged { .. } => None,
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
    /// `QUEUED` jobs in FIFO order, keyed by `Job::queue_seq`, and split by task kind.
    queue: JobQueue,
    /// Jobs enqueued so far by the entry being applied. A queue position is the entry's index
    /// times `QUEUE_POSITIONS_PER_ENTRY` plus this: a function of the log alone, so a table
    /// rebuilt from rows (whatever was purged) hands out exactly the positions a table that
    /// applied every entry does.
    enqueued_in_entry: u64,
    /// The wall-time stamp of the entry being applied, for the attempt history.
    entry_at: UnixMillis,
    /// Idempotency key, within its submitter -> job, for the job's whole life.
    idempotency: BTreeMap<ScopedKey, JobId>,
    /// Jobs in submission order (for listing).
    by_submission: BTreeMap<LogIndex, JobId>,
    /// Non-terminal jobs: the admission counter.
    active: u64,
    /// Terminal jobs that are not partitions, by when they finished: what retention purges,
    /// oldest first.
    finished: BTreeSet<(UnixMillis, JobId)>,
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
            if let Some(key) = ScopedKey::of(&job) {
                if let Some(&first) = table.idempotency.get(&key) {
                    return Err(TableError::DuplicateIdempotencyKey {
                        key: key.to_string(),
                        first,
                        second: id,
                    });
                }
                table.idempotency.insert(key, id);
            }
            if job.state == JobState::Queued
                && !table.queue.insert(job.queue_seq, id, job.task.kind())
            {
                return Err(TableError::InconsistentJob {
                    job_id: id,
                    detail: format!("queue position {} is held by two jobs", job.queue_seq),
                });
            }
            if !job.state.is_terminal() {
                table.active += 1;
            }
            if job.partition_of.is_none() {
                table.by_submission.insert(job.submitted_at, id);
                if job.state.is_terminal() {
                    table
                        .finished
                        .insert((job.finished_at.unwrap_or_default(), id));
                }
            }
            if table.jobs.insert(id, job).is_some() {
                return Err(TableError::DuplicateJob(id));
            }
        }
        // A parent and its partitions name each other.
        for job in table.jobs.values() {
            for (index, child) in job.partitions.iter().enumerate() {
                let named_back = table.jobs.get(child).and_then(|c| c.partition_of);
                if named_back.is_none_or(|of| of.parent != job.id || of.index as usize != index) {
                    return Err(TableError::InconsistentJob {
                        job_id: job.id,
                        detail: format!(
                            "partition {index} ({child}) is missing or does not name this job as its parent"
                        ),
                    });
                }
            }
            if let Some(of) = job.partition_of {
                let listed = table
                    .jobs
                    .get(&of.parent)
                    .and_then(|p| p.partitions.get(of.index as usize));
                if listed != Some(&job.id) {
                    return Err(TableError::InconsistentJob {
                        job_id: job.id,
                        detail: format!(
                            "a partition of {} (at {}) that its parent does not list",
                            of.parent, of.index
                        ),
                    });
                }
            }
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

    /// Terminal jobs that retention may purge (partitions go with their job), oldest first:
    /// when each finished, and its id.
    pub fn finished_oldest_first(&self) -> impl Iterator<Item = (UnixMillis, JobId)> + '_ {
        self.finished.iter().copied()
    }

    /// How many terminal jobs retention counts (partitions are not counted on their own).
    pub fn finished_jobs(&self) -> u64 {
        self.finished.len() as u64
    }

    pub fn applied_index(&self) -> LogIndex {
        self.applied
    }

    /// `QUEUED` jobs, oldest first.
    pub fn queued(&self) -> impl Iterator<Item = JobId> + '_ {
        self.queue.iter()
    }

    /// `QUEUED` jobs of one task kind, oldest first, with their queue positions.
    pub fn queued_of_kind<'a>(&'a self, kind: &str) -> impl Iterator<Item = (u64, JobId)> + 'a {
        self.queue.of_kind(kind)
    }

    /// The task kinds with a queued job.
    pub fn queued_kinds(&self) -> impl Iterator<Item = &str> + '_ {
        self.queue.kinds()
    }

    /// Jobs in submission order, newest first.
    pub fn newest_first(&self) -> impl Iterator<Item = &Job> {
        self.newest_first_before(None)
    }

    /// Jobs submitted before log index `before` (all of them for `None`), newest first.
    pub fn newest_first_before(&self, before: Option<LogIndex>) -> impl Iterator<Item = &Job> {
        let end = before.unwrap_or(LogIndex(u64::MAX));
        self.by_submission
            .range(..end)
            .rev()
            .filter_map(|(_, id)| self.jobs.get(id))
    }

    /// What clients see of a job; a data-parallel parent's view lists its partitions.
    pub fn view(&self, job_id: &JobId) -> Option<crate::protocol::JobView> {
        let job = self.jobs.get(job_id)?;
        let mut view = job.view();
        if job.is_parent() {
            let pieces: Vec<crate::protocol::PartitionView> = job
                .partitions
                .iter()
                .enumerate()
                .filter_map(|(index, id)| {
                    let part = self.jobs.get(id)?;
                    Some(crate::protocol::PartitionView {
                        index: u32::try_from(index).unwrap_or(u32::MAX),
                        job_id: *id,
                        state: part.state,
                        attempt: part.attempt.0,
                        worker: part.last_worker.clone(),
                        result: part.result.clone(),
                    })
                })
                .collect();
            let done = pieces
                .iter()
                .filter(|p| p.state == JobState::Completed)
                .count();
            view.partitions = Some(crate::protocol::PartitionsView {
                done: u32::try_from(done).unwrap_or(u32::MAX),
                total: u32::try_from(pieces.len()).unwrap_or(u32::MAX),
                pieces,
            });
        }
        Some(view)
    }

    /// The job an idempotency key names, and whether the submission matches it: the same
    /// task, attempts, timeout and (for a data-parallel task) partition request. A row written
    /// before the partition request was recorded matches any.
    /// `Some(Ok(id))`: replay; `Some(Err(id))`: conflict; `None`: the key is new.
    pub fn check_idempotency(
        &self,
        key: &ScopedKey,
        asked: &SubmitOptions<'_>,
    ) -> Option<Result<JobId, JobId>> {
        let &job_id = self.idempotency.get(key)?;
        let job = self.jobs.get(&job_id)?;
        let same_split =
            job.partitions_asked.is_none() || job.partitions_asked == asked.partitions_asked;
        if job.task == *asked.task
            && job.max_attempts == asked.max_attempts
            && job.timeout_millis == asked.timeout_millis
            && same_split
        {
            Some(Ok(job_id))
        } else {
            Some(Err(job_id))
        }
    }

    /// Applies the entry at `index`, stamped `at` by its leader. Entries must be applied in
    /// order, each exactly once.
    pub fn apply(&mut self, index: LogIndex, at: UnixMillis, command: &Command) -> Outcome {
        assert_eq!(
            index,
            self.applied.next(),
            "log entries must be applied in order, once"
        );
        self.applied = index;
        self.enqueued_in_entry = 0;
        self.entry_at = at;
        let mut follow_on = Vec::new();
        let applied = self.apply_command(index, at, command, &mut follow_on);
        let outcome = Outcome { applied, follow_on };
        self.stamp_finished(at, &outcome);
        if cfg!(debug_assertions) {
            for job_id in outcome.changed_jobs() {
                if let Some(job) = self.jobs.get(&job_id) {
                    if let Err(detail) = check_row(job) {
                        panic!("apply broke job {job_id}: {detail}");
                    }
                }
            }
        }
        outcome
    }

    fn apply_command(
        &mut self,
        index: LogIndex,
        at: UnixMillis,
        command: &Command,
        follow_on: &mut Vec<Applied>,
    ) -> Applied {
        let applied = match command {
            Command::Submit {
                job_id,
                task,
                max_attempts,
                idempotency_key,
                max_active_jobs,
                partitions,
                partitions_asked,
                timeout_millis,
                submitted_by,
            } => {
                return self.apply_submit(
                    (index, at),
                    Submission {
                        submitted_by,
                        job_id: *job_id,
                        options: SubmitOptions {
                            task,
                            max_attempts: *max_attempts,
                            partitions_asked: *partitions_asked,
                            timeout_millis: *timeout_millis,
                        },
                        idempotency_key,
                        max_active_jobs: *max_active_jobs,
                        partitions,
                    },
                    follow_on,
                )
            }
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
                permanent,
                kind,
            } => self.apply_attempt_failed(
                (*job_id, *lease_id),
                (*kind, cause),
                (!permanent).then_some(*retry_delay_millis),
            ),
            Command::Release { job_id, lease_id } => self.apply_release(*job_id, *lease_id),
            Command::Requeue { job_id } => self.apply_requeue(*job_id),
            Command::Cancel { job_id } => {
                // A partition is cancelled by cancelling its whole job.
                let target = match self.jobs.get(job_id).and_then(|j| j.partition_of) {
                    Some(of) => of.parent,
                    None => *job_id,
                };
                self.apply_cancel(target, follow_on)
            }
            Command::Abandon { job_id, lease_id } => self.apply_abandon(*job_id, *lease_id),
            Command::NewLeader { leader } => Applied::NewLeader {
                leader: leader.clone(),
            },
            Command::Purge { job_ids } => self.apply_purge(job_ids, follow_on),
        };
        // What a partition's fate means for its parent.
        match &applied {
            Applied::Completed { job_id, .. } => self.partition_completed(*job_id, follow_on),
            Applied::FailedPermanently { job_id, error, .. } => {
                let error = error.clone();
                self.partition_failed(*job_id, &error, follow_on);
            }
            _ => {}
        }
        applied
    }

    fn apply_submit(
        &mut self,
        (index, at): (LogIndex, UnixMillis),
        submission: Submission<'_>,
        follow_on: &mut Vec<Applied>,
    ) -> Applied {
        let Submission {
            submitted_by,
            job_id,
            options,
            idempotency_key,
            max_active_jobs,
            partitions,
        } = submission;
        let scoped = idempotency_key.as_ref().map(|key| ScopedKey {
            owner: submitted_by.clone(),
            key: key.clone(),
        });
        let SubmitOptions {
            task,
            max_attempts,
            partitions_asked,
            timeout_millis,
        } = options;
        // Idempotency first: a known key never consumes an admission slot.
        if let Some(key) = &scoped {
            match self.check_idempotency(key, &options) {
                Some(Ok(existing)) => return Applied::IdempotentReplay { job_id: existing },
                Some(Err(existing)) => return Applied::IdempotencyConflict { existing },
                None => {}
            }
        }
        let pieces = if task.is_data_parallel() {
            task.split(u32::try_from(partitions.len()).unwrap_or(u32::MAX))
        } else {
            Vec::new()
        };
        if pieces.len() != partitions.len() {
            return Applied::SubmitInvalid {
                job_id,
                reason: format!(
                    "{} partition ids for a {} task that splits into {} pieces",
                    partitions.len(),
                    task.kind(),
                    pieces.len()
                ),
            };
        }
        let mut distinct = BTreeSet::new();
        if !partitions
            .iter()
            .all(|id| *id != job_id && distinct.insert(*id))
        {
            return Applied::SubmitInvalid {
                job_id,
                reason: "a partition id repeats another partition's or the job's own id".into(),
            };
        }
        // A data-parallel job takes a slot for the parent and one per partition; each frees its
        // own slot when it becomes terminal.
        let slots = 1 + partitions.len() as u64;
        if self.active.saturating_add(slots) > max_active_jobs {
            return Applied::AdmissionRejected {
                active_jobs: self.active,
                max_active_jobs,
            };
        }
        if let Some(taken) = std::iter::once(&job_id)
            .chain(partitions)
            .find(|id| self.jobs.contains_key(id))
        {
            return Applied::SubmitInvalid {
                job_id,
                reason: format!("job id {taken} is already taken"),
            };
        }
        let new_job = |id: JobId, task: TaskSpec, queue_seq: u64| Job {
            id,
            task,
            max_attempts,
            idempotency_key: None,
            state: JobState::Queued,
            attempt: Attempt(0),
            lease: None,
            last_worker: None,
            result: None,
            error: None,
            retry_delay_millis: 0,
            submitted_at: index,
            queue_seq,
            partition_of: None,
            partitions: Vec::new(),
            partitions_asked: None,
            created_at: at,
            finished_at: None,
            timeout_millis,
            first_started_at: None,
            history: Vec::new(),
            history_dropped: 0,
            submitted_by: submitted_by.clone(),
        };
        let queue_seq = self.take_queue_seq();
        let mut job = new_job(job_id, task.clone(), queue_seq);
        job.idempotency_key = idempotency_key.clone();
        if let Some(key) = scoped {
            self.idempotency.insert(key, job_id);
        }
        self.by_submission.insert(index, job_id);
        self.active += 1;
        if task.is_data_parallel() {
            // The parent never queues: it runs while its partitions do.
            transition(&mut job, JobState::Running);
            job.partitions = partitions.to_vec();
            job.partitions_asked = partitions_asked;
            self.jobs.insert(job_id, job);
            for (index, (&child, piece)) in partitions.iter().zip(pieces).enumerate() {
                let index = u32::try_from(index).unwrap_or(u32::MAX);
                let seq = self.take_queue_seq();
                let mut partition = new_job(child, piece, seq);
                partition.partition_of = Some(PartitionOf {
                    parent: job_id,
                    index,
                });
                self.queue_insert(seq, child, partition.task.kind());
                self.jobs.insert(child, partition);
                self.active += 1;
                follow_on.push(Applied::PartitionCreated {
                    job_id: child,
                    parent: job_id,
                    index,
                });
            }
            if partitions.is_empty() {
                // Nothing to split (an empty list): the answer is the empty aggregate.
                self.finish_parent(job_id, follow_on);
            }
        } else {
            self.queue_insert(queue_seq, job_id, job.task.kind());
            self.jobs.insert(job_id, job);
        }
        Applied::Submitted { job_id }
    }

    /// Stamps every job this entry made terminal with the entry's wall time, and enters those
    /// that retention counts into the finished index. Leaders' clocks may disagree, so a stamp
    /// earlier than the job's creation is raised to it: a job never finishes before it began.
    /// The stamp depends only on the entry and the row, so every member computes the same.
    fn stamp_finished(&mut self, at: UnixMillis, outcome: &Outcome) {
        for job_id in outcome.changed_jobs() {
            let Some(job) = self.jobs.get_mut(&job_id) else {
                continue; // removed by a purge
            };
            if job.state.is_terminal() && job.finished_at.is_none() {
                let finished_at = at.max(job.created_at);
                job.finished_at = Some(finished_at);
                if job.partition_of.is_none() {
                    self.finished.insert((finished_at, job_id));
                }
            }
        }
    }

    /// Removes each named job that is terminal and not a partition, with its partitions.
    fn apply_purge(&mut self, job_ids: &[JobId], follow_on: &mut Vec<Applied>) -> Applied {
        let (mut purged, mut skipped) = (0, 0);
        for job_id in job_ids {
            let purgeable = self
                .jobs
                .get(job_id)
                .is_some_and(|j| j.state.is_terminal() && j.partition_of.is_none());
            if !purgeable {
                skipped += 1;
                continue;
            }
            let job = self
                .jobs
                .remove(job_id)
                .unwrap_or_else(|| panic!("job {job_id} vanished during purge"));
            let removed = self
                .finished
                .remove(&(job.finished_at.unwrap_or_default(), *job_id));
            assert!(
                removed,
                "terminal job {job_id} was missing from the finished index"
            );
            self.by_submission.remove(&job.submitted_at);
            if let Some(key) = ScopedKey::of(&job) {
                self.idempotency.remove(&key);
            }
            for part in &job.partitions {
                let row = self.jobs.remove(part);
                assert!(
                    row.is_some_and(|r| r.state.is_terminal()),
                    "terminal job {job_id} had a missing or live partition {part}"
                );
                follow_on.push(Applied::Removed { job_id: *part });
            }
            follow_on.push(Applied::Removed { job_id: *job_id });
            purged += 1;
        }
        Applied::Purged { purged, skipped }
    }

    /// A partition completed: if it was its parent's last, the parent completes.
    fn partition_completed(&mut self, job_id: JobId, follow_on: &mut Vec<Applied>) {
        let Some(parent) = self.jobs.get(&job_id).and_then(|j| j.partition_of) else {
            return;
        };
        let all_done = self.jobs.get(&parent.parent).is_some_and(|p| {
            p.state == JobState::Running
                && p.partitions.iter().all(|id| {
                    self.jobs
                        .get(id)
                        .is_some_and(|j| j.state == JobState::Completed)
                })
        });
        if all_done {
            self.finish_parent(parent.parent, follow_on);
        }
    }

    /// Completes a running parent with the aggregate of its partitions' results, in order;
    /// fails it if the results cannot be combined (a worker reported the wrong kind).
    fn finish_parent(&mut self, parent: JobId, follow_on: &mut Vec<Applied>) {
        let Some(job) = self.jobs.get(&parent) else {
            return;
        };
        let results: Vec<&TaskOutput> = job
            .partitions
            .iter()
            .filter_map(|id| self.jobs.get(id).and_then(|j| j.result.as_ref()))
            .collect();
        let combined = if results.len() == job.partitions.len() {
            aggregate(&job.task, &results)
        } else {
            Err("a partition has no result".to_string())
        };
        match combined {
            Ok(output) => {
                let job = self.job_mut(parent);
                transition(job, JobState::Completed);
                job.result = Some(output);
                job.error = None;
                self.active -= 1;
                follow_on.push(Applied::ParentCompleted { job_id: parent });
            }
            Err(error) => self.fail_parent(parent, error, follow_on),
        }
    }

    /// A partition failed for good: its parent fails, and its other partitions are cancelled.
    fn partition_failed(&mut self, job_id: JobId, error: &str, follow_on: &mut Vec<Applied>) {
        let Some(of) = self.jobs.get(&job_id).and_then(|j| j.partition_of) else {
            return;
        };
        let error = format!("partition {} (job {job_id}) failed: {error}", of.index);
        self.fail_parent(of.parent, error, follow_on);
    }

    fn fail_parent(&mut self, parent: JobId, error: String, follow_on: &mut Vec<Applied>) {
        if self
            .jobs
            .get(&parent)
            .is_none_or(|p| p.state != JobState::Running)
        {
            return;
        }
        let job = self.job_mut(parent);
        transition(job, JobState::Failed);
        job.error = Some(error.clone());
        self.active -= 1;
        follow_on.push(Applied::ParentFailed {
            job_id: parent,
            error,
        });
        self.cancel_partitions(parent, "its job failed", follow_on);
    }

    /// Cancels every non-terminal partition of `parent`, each a follow-on of its own.
    fn cancel_partitions(&mut self, parent: JobId, why: &str, follow_on: &mut Vec<Applied>) {
        let partitions = self
            .jobs
            .get(&parent)
            .map(|p| p.partitions.clone())
            .unwrap_or_default();
        for id in partitions {
            if let Some(cancelled) = self.cancel_one(id, why) {
                follow_on.push(cancelled);
            }
        }
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
        let removed = self.queue.remove(job.queue_seq, job.task.kind());
        assert_eq!(
            removed,
            Some(job_id),
            "queued job {job_id} was not at its queue position"
        );
        transition(job, JobState::Running);
        job.attempt = Attempt(job.attempt.0 + 1);
        job.lease = Some(lease.clone());
        if job.history.is_empty() {
            // A row from before jobs kept a history: its earlier attempts went unrecorded.
            job.history_dropped = job.attempt.0 - 1;
        }
        let started = self.entry_at.max(job.created_at);
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

    fn apply_complete(&mut self, job_id: JobId, lease_id: LeaseId, output: &TaskOutput) -> Applied {
        let lease = match self.lease_to_settle(job_id, lease_id) {
            Ok(lease) => lease,
            Err(stale) => return stale,
        };
        let at = self.entry_at;
        let job = self.job_mut(job_id);
        close_attempt(job, lease.id, at, AttemptEnd::Completed, None);
        transition(job, JobState::Completed);
        job.lease = None;
        job.result = Some(output.clone());
        job.error = None;
        self.active -= 1;
        Applied::Completed { job_id, lease }
    }

    /// `retry_delay_millis` is `None` for a permanent failure, which ends the job whatever
    /// attempts remain.
    fn apply_attempt_failed(
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
            self.active -= 1;
            Applied::FailedPermanently {
                job_id,
                lease,
                error: cause.to_owned(),
            }
        }
    }

    fn apply_release(&mut self, job_id: JobId, lease_id: LeaseId) -> Applied {
        let lease = match self.lease_to_settle(job_id, lease_id) {
            Ok(lease) => lease,
            Err(stale) => return stale,
        };
        let at = self.entry_at;
        let job = self.job_mut(job_id);
        assert!(job.attempt.0 >= 1, "running job {job_id} with attempt 0");
        close_attempt(job, lease_id, at, AttemptEnd::Released, None);
        job.lease = None;
        // Not charged: the attempt it handed back never happened as far as the budget goes.
        job.attempt = Attempt(job.attempt.0 - 1);
        self.enqueue(job_id);
        Applied::Released { job_id, lease }
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

    fn apply_cancel(&mut self, job_id: JobId, follow_on: &mut Vec<Applied>) -> Applied {
        let Some(job) = self.jobs.get(&job_id) else {
            return Applied::UnknownJob { job_id };
        };
        if job.state.is_terminal() {
            return Applied::CancelTooLate {
                job_id,
                state: job.state,
            };
        }
        let cancelled = self.cancel_one(job_id, "cancelled by client");
        self.cancel_partitions(job_id, "its job was cancelled", follow_on);
        cancelled.unwrap_or(Applied::UnknownJob { job_id })
    }

    /// Cancels one non-terminal job (revoking its lease); `None` if it is terminal or unknown.
    fn cancel_one(&mut self, job_id: JobId, why: &str) -> Option<Applied> {
        let job = self.jobs.get_mut(&job_id)?;
        let previous = job.state;
        if previous.is_terminal() {
            return None;
        }
        if previous == JobState::Queued {
            let removed = self.queue.remove(job.queue_seq, job.task.kind());
            assert_eq!(
                removed,
                Some(job_id),
                "queued job {job_id} was not at its queue position"
            );
        }
        transition(job, JobState::Cancelled);
        let revoked = job.lease.take();
        if let Some(lease) = &revoked {
            close_attempt(job, lease.id, self.entry_at, AttemptEnd::Cancelled, None);
        }
        job.error = Some(why.to_owned());
        self.active -= 1;
        Some(Applied::Cancelled {
            job_id,
            previous,
            revoked,
        })
    }

    fn apply_abandon(&mut self, job_id: JobId, lease_id: LeaseId) -> Applied {
        let lease = match self.lease_to_settle(job_id, lease_id) {
            Ok(lease) => lease,
            Err(stale) => return stale,
        };
        let at = self.entry_at;
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
        let job = self
            .jobs
            .get_mut(&job_id)
            .unwrap_or_else(|| panic!("job {job_id} vanished during apply"));
        transition(job, JobState::Queued);
        job.queue_seq = queue_seq;
        Self::queue_into(&mut self.queue, queue_seq, job_id, job.task.kind());
    }

    fn queue_insert(&mut self, seq: u64, job_id: JobId, kind: &str) {
        Self::queue_into(&mut self.queue, seq, job_id, kind);
    }

    fn queue_into(queue: &mut JobQueue, seq: u64, job_id: JobId, kind: &str) {
        assert!(
            queue.insert(seq, job_id, kind),
            "queue position {seq} handed out twice"
        );
    }

    fn take_queue_seq(&mut self) -> u64 {
        assert!(
            self.enqueued_in_entry < QUEUE_POSITIONS_PER_ENTRY,
            "one entry enqueued more jobs than it has queue positions"
        );
        let seq = self.applied.0.saturating_mul(QUEUE_POSITIONS_PER_ENTRY) + self.enqueued_in_entry;
        self.enqueued_in_entry += 1;
        seq
    }

    fn job_mut(&mut self, job_id: JobId) -> &mut Job {
        self.jobs
            .get_mut(&job_id)
            .unwrap_or_else(|| panic!("job {job_id} vanished during apply"))
    }

    /// Checks every invariant the table promises (2, 4, 5, 6 of docs/SIMULATION.md). Used by
    /// tests and the simulator after every step; `Err` names the first violation.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut active = 0;
        let mut queued = BTreeSet::new();
        let mut finished = BTreeSet::new();
        for job in self.jobs.values() {
            check_row(job).map_err(|detail| format!("job {}: {detail}", job.id))?;
            if !job.state.is_terminal() {
                active += 1;
            } else if job.partition_of.is_none() {
                finished.insert((job.finished_at.unwrap_or_default(), job.id));
            }
            if job.state == JobState::Queued {
                queued.insert(job.id);
                if !self.queue.holds(job.queue_seq, job.id, job.task.kind()) {
                    return Err(format!("queued job {} is missing from the queue", job.id));
                }
            }
            self.check_partitions(job)?;
            if let Some(key) = ScopedKey::of(job) {
                if self.idempotency.get(&key) != Some(&job.id) {
                    return Err(format!(
                        "job {} has key {key} but the index disagrees",
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
        self.queue.check()?;
        let in_queue: BTreeSet<JobId> = self.queue.iter().collect();
        if in_queue != queued || self.queue.len() != queued.len() {
            return Err(format!(
                "queue holds {} entries but {} jobs are QUEUED",
                self.queue.len(),
                queued.len()
            ));
        }
        if finished != self.finished {
            return Err(format!(
                "the finished index holds {} jobs but {} top-level jobs are terminal",
                self.finished.len(),
                finished.len()
            ));
        }
        for (key, job_id) in &self.idempotency {
            match self.jobs.get(job_id) {
                Some(job) if ScopedKey::of(job).as_ref() == Some(key) => {}
                _ => {
                    return Err(format!(
                        "idempotency key {key} points at job {job_id} without it"
                    ))
                }
            }
        }
        Ok(())
    }
}

impl JobTable {
    /// A partition and its parent point at each other; a partition runs only while its parent
    /// does; a completed parent has every partition completed, a failed or cancelled one none
    /// still running; a running parent still has a partition to wait for.
    fn check_partitions(&self, job: &Job) -> Result<(), String> {
        if let Some(of) = job.partition_of {
            let parent = self.jobs.get(&of.parent).ok_or_else(|| {
                format!("partition {} names a missing parent {}", job.id, of.parent)
            })?;
            if parent.partitions.get(of.index as usize) != Some(&job.id) {
                return Err(format!(
                    "partition {} claims index {} of job {}, which does not list it there",
                    job.id, of.index, of.parent
                ));
            }
            if !job.state.is_terminal() && parent.state != JobState::Running {
                return Err(format!(
                    "partition {} is {} but its job {} is {}",
                    job.id, job.state, of.parent, parent.state
                ));
            }
        }
        if !job.is_parent() {
            return Ok(());
        }
        let mut completed = 0;
        for (index, id) in job.partitions.iter().enumerate() {
            let part = self
                .jobs
                .get(id)
                .ok_or_else(|| format!("job {} lists a missing partition {id}", job.id))?;
            if part.partition_of
                != Some(PartitionOf {
                    parent: job.id,
                    index: index as u32,
                })
            {
                return Err(format!(
                    "job {} lists {id} as partition {index}, which says {:?}",
                    job.id, part.partition_of
                ));
            }
            if part.state == JobState::Completed {
                completed += 1;
            }
            if job.state.is_terminal() && !part.state.is_terminal() {
                return Err(format!(
                    "job {} is {} while its partition {index} ({id}) is {}",
                    job.id, job.state, part.state
                ));
            }
        }
        let all = job.partitions.len();
        match job.state {
            JobState::Completed if completed != all => Err(format!(
                "job {} is COMPLETED with {completed} of {all} partitions completed",
                job.id
            )),
            JobState::Running if completed == all => Err(format!(
                "job {} is still RUNNING although all {all} partitions completed",
                job.id
            )),
            _ => Ok(()),
        }
    }
}

fn transition(job: &mut Job, to: JobState) {
    if let Err(illegal) = job.transition(to) {
        panic!("job {}: {illegal} (apply checked the state first)", job.id);
    }
}

/// What a submission asks for, which a keyed resend must repeat exactly.
#[derive(Clone, Copy, Debug)]
pub struct SubmitOptions<'a> {
    pub task: &'a TaskSpec,
    pub max_attempts: u32,
    pub partitions_asked: Option<Partitions>,
    pub timeout_millis: Option<u64>,
}

/// The fields of a `Submit`, borrowed.
struct Submission<'a> {
    submitted_by: &'a Option<String>,
    job_id: JobId,
    options: SubmitOptions<'a>,
    idempotency_key: &'a Option<String>,
    max_active_jobs: u64,
    partitions: &'a [JobId],
}

/// An idempotency key as the table binds it: within the name of the token that submitted it
/// (`None`: a caller with no token), so one caller's keys never name another's jobs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ScopedKey {
    pub owner: Option<String>,
    pub key: String,
}

impl ScopedKey {
    /// The key `job` is bound under, if it has one.
    pub fn of(job: &Job) -> Option<ScopedKey> {
        job.idempotency_key.as_ref().map(|key| ScopedKey {
            owner: job.submitted_by.clone(),
            key: key.clone(),
        })
    }
}

impl std::fmt::Display for ScopedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.owner {
            Some(owner) => write!(f, "{:?} of {owner:?}", self.key),
            None => write!(f, "{:?}", self.key),
        }
    }
}

/// The per-row invariants: lease exactly while running, attempt within budget, a result exactly
/// when completed. A data-parallel parent never holds a lease or starts an attempt.
/// Ends the running attempt's history record: the one `lease_id` opened, which is the last.
/// A row written before jobs kept a history has none to end.
fn close_attempt(
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

/// A job's history agrees with its state: only the last record may be open, and it is open
/// exactly while the job runs under that record's lease; no record ends before it starts.
/// (A row written before jobs kept a history has none, and is not checked.)
fn check_history(job: &Job) -> Result<(), String> {
    if job.history.len() > ATTEMPT_HISTORY_MAX {
        return Err(format!("{} history records", job.history.len()));
    }
    let Some(last) = job.history.last() else {
        return Ok(());
    };
    for record in &job.history[..job.history.len() - 1] {
        if record.outcome.is_none() {
            return Err(format!(
                "attempt {} is open but not the latest",
                record.lease_id
            ));
        }
    }
    for record in &job.history {
        if record.outcome.is_some() != record.ended_at_unix_ms.is_some()
            || record
                .ended_at_unix_ms
                .is_some_and(|end| end < record.started_at_unix_ms)
        {
            return Err(format!(
                "attempt {} ends at {:?} with outcome {:?}",
                record.lease_id, record.ended_at_unix_ms, record.outcome
            ));
        }
    }
    match (&job.lease, last.outcome) {
        (Some(lease), None) if lease.id == last.lease_id && lease.worker == last.worker => {}
        (None, Some(_)) => {}
        (lease, outcome) => {
            return Err(format!(
                "lease {:?} but the latest record is {} ({outcome:?})",
                lease.as_ref().map(|l| l.id),
                last.lease_id
            ))
        }
    }
    // Every charged attempt has a record (released ones have records too, uncharged).
    let records = job.history.len() + job.history_dropped as usize;
    if (job.attempt.0 as usize) > records {
        return Err(format!(
            "attempt {} with only {records} attempts recorded",
            job.attempt
        ));
    }
    if job.first_started_at.is_none() {
        return Err("attempts recorded but no first start".into());
    }
    Ok(())
}

fn check_row(job: &Job) -> Result<(), String> {
    check_history(job)?;
    if job.max_attempts == 0 {
        return Err("max_attempts is 0".into());
    }
    if !job.state.is_terminal() && job.finished_at.is_some() {
        return Err(format!("{} with a finish time", job.state));
    }
    if job.is_parent() {
        if job.lease.is_some() || job.attempt.0 != 0 || job.state == JobState::Queued {
            return Err(format!(
                "data-parallel parent {} with attempt {} and lease {:?}",
                job.state,
                job.attempt,
                job.lease.as_ref().map(|l| l.id)
            ));
        }
        if (job.state == JobState::Completed) != job.result.is_some() {
            return Err(format!(
                "parent {} with result present = {}",
                job.state,
                job.result.is_some()
            ));
        }
        return Ok(());
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
    // A job waiting for another attempt must have one left (the last failure ends it).
    if matches!(job.state, JobState::Queued | JobState::RetryWait)
        && job.attempt.0 >= job.max_attempts
    {
        return Err(format!(
            "{} with every attempt used ({} of {})",
            job.state, job.attempt, job.max_attempts
        ));
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
