//! The log's vocabulary: the entries of the replicated log and the job-state changes they carry.
//!
//! A `Command` is decided by the leader and applied by every member to its job table (see
//! [`crate::table`]); the leader draws whatever is random or read from a clock (a retry delay, a
//! fresh id, the entry's wall-time stamp) and it travels inside the entry. This module knows
//! nothing of the wire or of how a command is applied.

use serde::{Deserialize, Serialize};

use crate::ids::{JobId, LeaseId, LogIndex, NodeId, Term};
use crate::job::{FailureKind, Lease};
use crate::queues::{default_queue, is_default_queue, QueueChange};
use crate::tasks::{Partitions, TaskOutput, TaskSpec};
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
        /// The queue (created by this entry if it is new), the priority and the fairness key;
        /// a data-parallel job's partitions share them.
        #[serde(default = "default_queue", skip_serializing_if = "is_default_queue")]
        queue: String,
        #[serde(default, skip_serializing_if = "is_zero")]
        priority: u8,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fairness_key: Option<String>,
        /// Not before this wall time: the job is `SCHEDULED` until a `Due` entry stamped at or
        /// after it queues it (queued at once if the entry's own stamp has reached it). The
        /// leader resolved a relative delay against its clock.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run_at: Option<UnixMillis>,
        /// The job this one retries, as its submission said.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_of: Option<JobId>,
        /// Jobs it waits for (each must exist when this applies): `BLOCKED` until all are
        /// terminal; cancelled if one ends `FAILED` or `CANCELLED`, unless `after_any_outcome`.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        after: Vec<JobId>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        after_any_outcome: bool,
    },
    /// Scheduled jobs whose `run_at` the leader's clock has reached: each one still
    /// `SCHEDULED` whose `run_at` is at or before this entry's stamp is queued; any other is
    /// left as it is (cancelled meanwhile, or not due by this stamp).
    Due { job_ids: Vec<JobId> },
    /// Start an attempt: `QUEUED -> RUNNING` under a fresh lease. `as_of` is the last entry
    /// the leader's table had applied when it picked the job: what the pick could see, so the
    /// log says on what it was decided (0 on entries written before it was recorded).
    Assign {
        job_id: JobId,
        lease: Lease,
        #[serde(default, skip_serializing_if = "LogIndex::is_zero")]
        as_of: LogIndex,
    },
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
    /// Change a queue's settings (creating the queue if it is new).
    SetQueue { queue: String, change: QueueChange },
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
            Command::NewLeader { .. }
            | Command::Purge { .. }
            | Command::SetQueue { .. }
            | Command::Due { .. } => None,
        }
    }
}

fn is_zero(n: &u8) -> bool {
    *n == 0
}
