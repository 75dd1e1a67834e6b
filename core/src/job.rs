//! The job record and its lifecycle (docs/ARCHITECTURE.md, "Job lifecycle"); every attempt
//! runs under a fresh lease:
//!
//! ```text
//!   [submit, after ...] -> BLOCKED --(every job it names ended)--> QUEUED or SCHEDULED
//!                            '--(one it names FAILED or CANCELLED)--> CANCELLED
//!   [submit, run_at ahead] -> SCHEDULED --(its time came)--.
//!                                 |                          v
//!                 assign (new lease)            result accepted
//!   [submit] -> QUEUED ---------------> RUNNING ----------------> COMPLETED
//!                ^  ^                    |  |  \
//!   backoff done |  | recovery: attempt  |  |   \ attempts exhausted
//!                |  | not re-adoptable   |  |    `-----------------> FAILED
//!           RETRY_WAIT <-----------------'  |
//!                |   lost / failed /        |
//!                |   expired, attempts left |
//!                v                          v
//!            CANCELLED <--------------------' (client cancel, from QUEUED, RETRY_WAIT or RUNNING)
//!                ^
//!                '------------------------------ (client cancel, from SCHEDULED)
//! ```
//!
//! Terminal states (`COMPLETED`, `FAILED`, `CANCELLED`) never change. `Job::transition` is the
//! only way to change `state`, and it refuses every edge not drawn above.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{Attempt, Incarnation, JobId, LeaseId, LogIndex, WorkerId};
use crate::queues::{default_queue, is_default_queue, Placement};
use crate::tasks::Partitions;
use crate::tasks::{TaskOutput, TaskSpec};
use crate::time::UnixMillis;

/// Where a job is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    /// Waiting for the jobs it names in `after` to finish.
    Blocked,
    /// Waiting for its `run_at`; it joins its queue then.
    Scheduled,
    Queued,
    Running,
    RetryWait,
    Completed,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 8] = [
        JobState::Blocked,
        JobState::Scheduled,
        JobState::Queued,
        JobState::Running,
        JobState::RetryWait,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Cancelled
        )
    }

    /// The edges of the lifecycle diagram, and nothing else.
    pub fn can_transition_to(self, to: JobState) -> bool {
        use JobState::*;
        matches!(
            (self, to),
            (Blocked, Queued)
                | (Blocked, Scheduled)
                | (Blocked, Cancelled)
                | (Scheduled, Queued)
                | (Scheduled, Cancelled)
                | (Queued, Running)
                | (Running, Completed)
                | (Running, RetryWait)
                | (Running, Failed)
                | (Running, Queued)
                | (RetryWait, Queued)
                | (Queued, Cancelled)
                | (RetryWait, Cancelled)
                | (Running, Cancelled)
        )
    }

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Blocked => "BLOCKED",
            JobState::Scheduled => "SCHEDULED",
            JobState::Queued => "QUEUED",
            JobState::Running => "RUNNING",
            JobState::RetryWait => "RETRY_WAIT",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
        }
    }

    /// Parses the wire/CLI spelling (case-insensitive, `-` or `_`).
    pub fn parse(raw: &str) -> Option<JobState> {
        let normal = raw.trim().to_ascii_uppercase().replace('-', "_");
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == normal)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A transition the lifecycle does not allow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("illegal job transition {from} -> {to}")]
pub struct IllegalTransition {
    pub from: JobState,
    pub to: JobState,
}

/// The lease of the attempt that is running now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub id: LeaseId,
    pub worker: WorkerId,
    /// The worker process the attempt was given to; a re-adoption must come from the same one.
    pub incarnation: Incarnation,
}

/// How an attempt ended, as the job's history records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptEnd {
    /// Its result was accepted.
    Completed,
    /// It ended badly, for a reason `FailureKind` names (see there).
    TaskFailed,
    WorkerLost,
    DeadlineExpired,
    /// A coordinator restart or leader change interrupted it and it could not be re-adopted.
    Abandoned,
    /// A draining worker handed it back unfinished; it was not charged.
    Released,
    /// The job was cancelled while it ran.
    Cancelled,
}

impl AttemptEnd {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptEnd::Completed => "completed",
            AttemptEnd::TaskFailed => "task_failed",
            AttemptEnd::WorkerLost => "worker_lost",
            AttemptEnd::DeadlineExpired => "deadline_expired",
            AttemptEnd::Abandoned => "abandoned",
            AttemptEnd::Released => "released",
            AttemptEnd::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for AttemptEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why an attempt failed, as the leader decided when it proposed the failure. It travels in
/// the log so every member's history (and every operator's metric) says the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The task reported failure, or the worker misbehaved with the attempt (a result too
    /// large, a hand-back without draining, a stop nobody asked for). Entries written before
    /// the kind was recorded read as this.
    #[default]
    TaskFailed,
    /// Its worker was lost (connection closed, heartbeats stopped, or it came back without it).
    WorkerLost,
    /// The attempt's deadline passed.
    DeadlineExpired,
}

impl FailureKind {
    pub fn is_default(&self) -> bool {
        *self == FailureKind::TaskFailed
    }

    pub fn as_str(self) -> &'static str {
        self.end().as_str()
    }

    /// The history's name for an attempt that failed this way.
    pub fn end(self) -> AttemptEnd {
        match self {
            FailureKind::TaskFailed => AttemptEnd::TaskFailed,
            FailureKind::WorkerLost => AttemptEnd::WorkerLost,
            FailureKind::DeadlineExpired => AttemptEnd::DeadlineExpired,
        }
    }
}

/// One attempt of a job: who ran it, under which lease, when, and how it ended. Both times are
/// the wall-clock stamps of the log entries that started and ended it, so every member holds
/// the same history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// The attempt number as charged when it started (a released attempt's number is given
    /// back, so the next attempt carries it again).
    pub attempt: u32,
    pub lease_id: LeaseId,
    pub worker: WorkerId,
    pub started_at_unix_ms: UnixMillis,
    /// Absent while the attempt runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_unix_ms: Option<UnixMillis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<AttemptEnd>,
    /// Why it failed, cut to `ATTEMPT_HISTORY_ERROR_BYTES_MAX` (the job's `error` keeps the
    /// latest in full).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl AttemptRecord {
    /// How long it ran, once it has ended (zero if stamps from two leaders' clocks disagree).
    pub fn ran_millis(&self) -> Option<u64> {
        self.ended_at_unix_ms
            .map(|end| end.0.saturating_sub(self.started_at_unix_ms.0))
    }
}

/// Where a partition job sits in its data-parallel parent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PartitionOf {
    pub parent: JobId,
    /// Position of the partition, from 0; the parent's `partitions[index]` is this job.
    pub index: u32,
}

/// One job, exactly as the replicated job table holds it and as it is persisted.
///
/// Nothing here is a monotonic clock reading: instants are per-process, and a record must mean
/// the same thing on every coordinator and after every restart. Deadlines and backoff timers
/// are leader soft state, re-armed from `retry_delay_millis` and the task timeout when a leader
/// takes over. The two wall times come from the stamps of the entries that created and ended
/// the job, so every member holds the same ones.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    pub task: TaskSpec,
    pub max_attempts: u32,
    pub idempotency_key: Option<String>,
    pub state: JobState,
    /// Attempts started so far (the running one included). Never exceeds `max_attempts`.
    pub attempt: Attempt,
    /// Present exactly while `RUNNING`.
    pub lease: Option<Lease>,
    /// The worker of the current or most recent attempt.
    pub last_worker: Option<WorkerId>,
    pub result: Option<TaskOutput>,
    pub error: Option<String>,
    /// The backoff chosen when the job entered `RETRY_WAIT`.
    pub retry_delay_millis: u64,
    /// Log index of the submission: the job's place in submission order.
    pub submitted_at: LogIndex,
    /// FIFO position while `QUEUED` (larger = later); refreshed on every enqueue.
    pub queue_seq: u64,
    /// The queue it belongs to ([`DEFAULT_QUEUE`] unless its submission named one).
    #[serde(default = "default_queue", skip_serializing_if = "is_default_queue")]
    pub queue: String,
    /// `0..=PRIORITY_MAX`, higher first within its lane.
    #[serde(default, skip_serializing_if = "is_zero_u8")]
    pub priority: u8,
    /// Whom it is fair to: the jobs of one key share their queue equally with other keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness_key: Option<String>,
    /// While `QUEUED`: the turn it holds in its lane (see [`crate::queues`]).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub turn: u64,
    /// While `QUEUED`: the wall-time stamp of the entry that queued it, for ageing.
    #[serde(default, skip_serializing_if = "UnixMillis::is_unstamped")]
    pub queued_at: UnixMillis,
    /// Set on a partition of a data-parallel job: its parent and position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_of: Option<PartitionOf>,
    /// On a data-parallel parent: its partition jobs, in order (empty for an empty list).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub partitions: Vec<JobId>,
    /// On a data-parallel parent: the partition count its submission asked for (`None` on a
    /// row written before this was recorded). A resend under the same key must ask the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions_asked: Option<Partitions>,
    /// The wall time of the submission (unstamped on a row written before jobs carried one).
    #[serde(default, skip_serializing_if = "UnixMillis::is_unstamped")]
    pub created_at: UnixMillis,
    /// The wall time the job became terminal; `None` while it is not (and on a terminal row
    /// written before jobs carried one, which retention treats as the oldest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<UnixMillis>,
    /// Each attempt's deadline, as the submission asked (`None`: the leader's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_millis: Option<u64>,
    /// The wall time before which it may not be queued, if its submission set one that was
    /// still ahead: `SCHEDULED` until an entry stamped at or after it queues the job. Kept
    /// afterwards, so the job shows when it was meant to run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_at: Option<UnixMillis>,
    /// The job this one retries (resubmitted after it failed or was cancelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<JobId>,
    /// The jobs it waits for: `BLOCKED` until every one of them is terminal. If one ends
    /// `FAILED` or `CANCELLED`, it is cancelled too, unless `after_any_outcome`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<JobId>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_any_outcome: bool,
    /// The wall time its first attempt started (`None` until one has).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_started_at: Option<UnixMillis>,
    /// Its attempts, oldest first: the latest `ATTEMPT_HISTORY_MAX` of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<AttemptRecord>,
    /// Older attempts dropped from `history` to keep it within its bound.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history_dropped: u32,
    /// The name of the token its submission came with (`None`: a caller with no token); a
    /// partition carries its parent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u8(n: &u8) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

impl Job {
    /// Moves to `to` if the lifecycle allows it; otherwise changes nothing.
    pub fn transition(&mut self, to: JobState) -> Result<(), IllegalTransition> {
        if !self.state.can_transition_to(to) {
            return Err(IllegalTransition {
                from: self.state,
                to,
            });
        }
        self.state = to;
        Ok(())
    }

    /// A data-parallel parent: it never runs on a worker; it is `RUNNING` while its partitions
    /// run, without a lease or an attempt of its own, and aggregates their results.
    pub fn is_parent(&self) -> bool {
        self.partition_of.is_none() && self.task.is_data_parallel()
    }

    pub fn attempts_remain(&self) -> bool {
        self.attempt.0 < self.max_attempts
    }

    /// Where it sits in the queue index while `QUEUED`.
    pub fn placement(&self) -> Placement<'_> {
        Placement {
            kind: self.task.kind(),
            queue: &self.queue,
            key: self.fairness_key.as_deref().unwrap_or(""),
            priority: self.priority,
            queued_at: self.queued_at,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job_in(state: JobState) -> Job {
        Job {
            id: JobId(uuid::Uuid::nil()),
            task: TaskSpec::Sleep { milliseconds: 1 },
            max_attempts: 3,
            idempotency_key: None,
            state,
            attempt: Attempt(0),
            lease: None,
            last_worker: None,
            result: None,
            error: None,
            retry_delay_millis: 0,
            submitted_at: LogIndex(1),
            queue_seq: 0,
            queue: crate::queues::default_queue(),
            priority: 0,
            fairness_key: None,
            turn: 0,
            queued_at: UnixMillis::UNSTAMPED,
            partition_of: None,
            partitions: Vec::new(),
            partitions_asked: None,
            created_at: UnixMillis::UNSTAMPED,
            finished_at: None,
            timeout_millis: None,
            run_at: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
            first_started_at: None,
            history: Vec::new(),
            history_dropped: 0,
            submitted_by: None,
        }
    }

    #[test]
    fn exactly_the_diagram_edges_are_legal() {
        use JobState::*;
        let legal = [
            (Blocked, Queued),
            (Blocked, Scheduled),
            (Blocked, Cancelled),
            (Scheduled, Queued),
            (Scheduled, Cancelled),
            (Queued, Running),
            (Running, Completed),
            (Running, RetryWait),
            (Running, Failed),
            (Running, Queued),
            (RetryWait, Queued),
            (Queued, Cancelled),
            (RetryWait, Cancelled),
            (Running, Cancelled),
        ];
        for from in JobState::ALL {
            for to in JobState::ALL {
                let mut job = job_in(from);
                let result = job.transition(to);
                if legal.contains(&(from, to)) {
                    assert_eq!(result, Ok(()), "{from} -> {to} should be legal");
                    assert_eq!(job.state, to);
                } else {
                    assert_eq!(result, Err(IllegalTransition { from, to }));
                    assert_eq!(job.state, from, "a refused transition changes nothing");
                }
            }
        }
    }

    #[test]
    fn terminal_states_have_no_way_out() {
        for from in JobState::ALL.into_iter().filter(|s| s.is_terminal()) {
            assert!(JobState::ALL.iter().all(|&to| !from.can_transition_to(to)));
        }
    }

    #[test]
    fn states_parse_in_cli_spellings() {
        assert_eq!(JobState::parse("retry-wait"), Some(JobState::RetryWait));
        assert_eq!(JobState::parse("completed"), Some(JobState::Completed));
        assert_eq!(JobState::parse("done"), None);
    }
}
