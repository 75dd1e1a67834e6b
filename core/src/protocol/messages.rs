//! Message types for every link. Field names are the wire names; enums are tagged by `type`.

use serde::{Deserialize, Serialize};

use super::codec::WireMessage;
use crate::command::LogEntry;
use crate::ids::{
    Attempt, Incarnation, JobId, LeaseId, LogIndex, NodeId, RequestId, Term, WorkerId,
};
use crate::job::{AttemptRecord, JobState, PartitionOf};
use crate::queues::{QueueChange, RateLimit};
pub use crate::tasks::Partitions;
use crate::tasks::{TaskOutput, TaskSpec};

/// Implements `WireMessage` for a `type`-tagged enum by listing its variants once.
macro_rules! wire_message {
    ($name:ident { $($variant:ident => $tag:literal),* $(,)? }) => {
        impl WireMessage for $name {
            fn is_known_type(tag: &str) -> bool {
                matches!(tag, $($tag)|*)
            }
            fn type_name(&self) -> &'static str {
                match self {
                    $($name::$variant { .. } => $tag),*
                }
            }
        }
    };
}

// ---------------------------------------------------------------------------------------------
// Worker link
// ---------------------------------------------------------------------------------------------

/// What a worker sends its coordinator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", deny_unknown_fields)]
pub enum WorkerToCoordinator {
    /// First message on every connection. `running` lists attempts this process holds (executing,
    /// then waiting for a slot), so a restarted coordinator (or a new leader) can re-adopt them; `finished` lists
    /// attempts whose results are not yet acknowledged (they follow right after `REGISTERED`).
    /// Together they tell the coordinator which of its assignments this process really holds.
    ///
    /// `tasks` names the task kinds this worker serves (built-in kinds and user task names);
    /// it is only ever given work of those kinds. Absent, it means the built-in kinds.
    /// `draining` is true when the process is shutting down and wants no new work.
    Register {
        worker_id: WorkerId,
        incarnation: Incarnation,
        capacity: u32,
        /// Assignments it holds beyond `capacity`, waiting for a slot (at most 4 per slot).
        #[serde(default, skip_serializing_if = "is_zero")]
        prefetch: u32,
        #[serde(default)]
        running: Vec<RunningAttempt>,
        #[serde(default)]
        finished: Vec<RunningAttempt>,
        #[serde(default = "builtin_task_names")]
        tasks: Vec<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        draining: bool,
        /// The queues it takes work from; absent means every queue.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queues: Option<Vec<String>>,
    },
    /// "Still alive." The coordinator answers `HEARTBEAT_ACK`.
    Heartbeat {},
    /// The worker is shutting down: assign it nothing more. Its running attempts end as usual
    /// or come back as `released`.
    Draining {},
    /// How far a running attempt has come, in the handler's words. Shown in the job's view
    /// while the attempt runs; not durable.
    Progress {
        job_id: JobId,
        lease_id: LeaseId,
        note: String,
    },
    /// How an attempt ended. Retransmitted (after every re-registration) until `RESULT_ACK`.
    TaskResult {
        job_id: JobId,
        lease_id: LeaseId,
        outcome: AttemptOutcome,
    },
}

wire_message!(WorkerToCoordinator {
    Register => "REGISTER",
    Heartbeat => "HEARTBEAT",
    Draining => "DRAINING",
    Progress => "PROGRESS",
    TaskResult => "TASK_RESULT",
});

/// An attempt a worker is executing, as reported in `REGISTER`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunningAttempt {
    pub job_id: JobId,
    pub lease_id: LeaseId,
}

/// How one attempt ended on the worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum AttemptOutcome {
    Succeeded {
        output: TaskOutput,
    },
    /// The attempt failed. `permanent` says retrying cannot help: the job fails at once.
    Failed {
        error: String,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        permanent: bool,
    },
    /// The worker stopped the task because the coordinator sent `TASK_CANCEL`.
    Cancelled {},
    /// A draining worker handed the attempt back unfinished: the job is queued again and the
    /// attempt is not charged.
    Released {},
}

/// The task kinds a worker that does not list its own serves: the built-in ones.
pub fn builtin_task_names() -> Vec<String> {
    crate::tasks::TASK_KINDS
        .iter()
        .map(|kind| kind.to_string())
        .collect()
}

/// What a coordinator sends a worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", deny_unknown_fields)]
pub enum CoordinatorToWorker {
    /// The leader of `term` accepted the registration. `members` are the worker addresses of
    /// every coordinator of the group this leader knows, for failing over later.
    Registered {
        term: Term,
        heartbeat_interval_millis: u64,
        heartbeat_timeout_millis: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        members: Vec<String>,
    },
    RegisterRejected {
        reason: RegisterRejection,
        message: String,
    },
    HeartbeatAck {
        term: Term,
    },
    /// Run this attempt. Only results carrying `lease_id` will count.
    TaskAssign {
        term: Term,
        job_id: JobId,
        lease_id: LeaseId,
        attempt: Attempt,
        max_attempts: u32,
        task: TaskSpec,
        timeout_millis: u64,
    },
    /// Stop this attempt: its lease was revoked (cancelled, expired or superseded).
    TaskCancel {
        term: Term,
        job_id: JobId,
        lease_id: LeaseId,
        reason: CancelReason,
    },
    /// The result for `lease_id` is durably settled; stop retransmitting it.
    /// `accepted` is false when the lease was no longer current (a stale result).
    ResultAck {
        term: Term,
        job_id: JobId,
        lease_id: LeaseId,
        accepted: bool,
    },
    /// This coordinator is not the leader; reconnect to the one named, if known. `members` are
    /// the worker addresses of the group's coordinators, as far as this one knows them.
    NotLeader {
        leader: Option<LeaderHint>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        members: Vec<String>,
    },
    Error {
        code: ErrorCode,
        message: String,
    },
}

impl CoordinatorToWorker {
    /// The term of the leader that sent it, for the messages that carry one.
    pub fn term(&self) -> Option<Term> {
        match self {
            CoordinatorToWorker::Registered { term, .. }
            | CoordinatorToWorker::HeartbeatAck { term }
            | CoordinatorToWorker::TaskAssign { term, .. }
            | CoordinatorToWorker::TaskCancel { term, .. }
            | CoordinatorToWorker::ResultAck { term, .. } => Some(*term),
            CoordinatorToWorker::RegisterRejected { .. }
            | CoordinatorToWorker::NotLeader { .. }
            | CoordinatorToWorker::Error { .. } => None,
        }
    }
}

wire_message!(CoordinatorToWorker {
    Registered => "REGISTERED",
    RegisterRejected => "REGISTER_REJECTED",
    HeartbeatAck => "HEARTBEAT_ACK",
    TaskAssign => "TASK_ASSIGN",
    TaskCancel => "TASK_CANCEL",
    ResultAck => "RESULT_ACK",
    NotLeader => "NOT_LEADER",
    Error => "ERROR",
});

/// Why a registration was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RegisterRejection {
    /// Another live process (a different incarnation) already holds this worker id.
    DuplicateWorkerId,
    /// Capacity outside `1..=WORKER_CAPACITY_MAX`, or a bad worker id.
    InvalidRegistration,
    /// The registry is full.
    TooManyWorkers,
}

/// Why an attempt's lease was revoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CancelReason {
    /// A client cancelled the job.
    JobCancelled,
    /// The attempt outlived its deadline.
    DeadlineExpired,
    /// The coordinator does not know this lease as current (e.g. reported after a restart).
    LeaseNotCurrent,
}

/// Where the leader can be reached, as far as the sender knows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaderHint {
    pub node_id: NodeId,
    pub address: String,
}

// ---------------------------------------------------------------------------------------------
// Client link
// ---------------------------------------------------------------------------------------------

/// What a client asks. Every request carries a `request_id` the reply echoes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", deny_unknown_fields)]
pub enum ClientRequest {
    /// Create a job. `task` is validated by the coordinator (`TaskSpec::from_json`), so a bad
    /// payload gets a typed `INVALID_TASK` error and leaves the connection open.
    Submit {
        request_id: RequestId,
        task: serde_json::Value,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_attempts: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        idempotency_key: Option<String>,
        /// How many partitions a data-parallel task is split into; absent means `"auto"`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partitions: Option<Partitions>,
        /// Each attempt's deadline; absent means the coordinator's `--task-timeout-millis`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_millis: Option<u64>,
        /// The queue; absent means `default`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queue: Option<String>,
        /// `0..=9`, higher first; absent means 0.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        priority: Option<u8>,
        /// Whom the job is fair to within its queue; absent means no key.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fairness_key: Option<String>,
        /// Not before this wall time (milliseconds since the Unix epoch); at most
        /// `RUN_AT_AHEAD_MILLIS_MAX` ahead of the leader's clock, and not with `delay_millis`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run_at_unix_ms: Option<u64>,
        /// Not before this long after the leader admits it (at most `RUN_AT_AHEAD_MILLIS_MAX`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        delay_millis: Option<u64>,
        /// The job this one retries (a failed or cancelled one resubmitted): a link the new
        /// job's views show, nothing more.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_of: Option<JobId>,
        /// Jobs to wait for (at most `AFTER_JOBS_MAX`): the job is `BLOCKED` until all of them
        /// are terminal, and cancelled if one ends `FAILED` or `CANCELLED`...
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        after: Vec<JobId>,
        /// ...unless this is true: then it runs whatever they ended as.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        after_any_outcome: bool,
    },
    /// Create many jobs in one frame and one durable write: each job as in `SUBMIT`, at most
    /// `SUBMIT_BATCH_JOBS_MAX` of them. A job that fails validation fails the whole batch
    /// (one `ERROR` naming it, nothing created); otherwise one `SUBMIT_BATCH_RESULT` answers
    /// every job in order, once all of them are settled.
    SubmitBatch {
        request_id: RequestId,
        jobs: Vec<JobSubmission>,
    },
    Status {
        request_id: RequestId,
        job_id: JobId,
    },
    /// Answered when the job is terminal, or with `timed_out: true` after `timeout_millis`.
    Wait {
        request_id: RequestId,
        job_id: JobId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_millis: Option<u64>,
    },
    Cancel {
        request_id: RequestId,
        job_id: JobId,
    },
    List {
        request_id: RequestId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state: Option<JobState>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<u32>,
        /// Only jobs submitted before this one: the next page, newest first.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        before: Option<JobId>,
    },
    Workers {
        request_id: RequestId,
    },
    /// Every queue: its settings, its jobs by state and how long its oldest queued job waits.
    Queues {
        request_id: RequestId,
    },
    /// Change a queue's settings (creating it if it is new): the fields given replace the
    /// current ones, the others stay. Answered with the queue once the change is durable.
    SetQueue {
        request_id: RequestId,
        queue: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        weight: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        paused: Option<bool>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        aging_millis: Option<u64>,
        /// The most of its jobs that may run at once; 0 removes the limit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        concurrency: Option<u32>,
        /// The most of its jobs with one fairness key that may run at once; 0 removes it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key_concurrency: Option<u32>,
        /// At most `starts` starts per `per_millis`, from a full bucket; `starts: 0` removes it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rate: Option<RateLimit>,
        /// At most `starts` starts per `per_millis` for each fairness key, every bucket full;
        /// `starts: 0` removes it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key_rate: Option<RateLimit>,
        /// The most of its jobs that may be unfinished at once; 0 removes the limit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_active_jobs: Option<u64>,
    },
    /// The group as the answering coordinator sees it; any member answers.
    Cluster {
        request_id: RequestId,
    },
    /// Ask the leader to hand leadership to `to` (or to the most up-to-date member).
    TransferLeader {
        request_id: RequestId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<NodeId>,
    },
    /// Remove terminal jobs (all terminal states, or only `state`, which must be terminal)
    /// that finished at least `older_than_millis` ago. One request purges at most one batch;
    /// the reply says how many matching jobs remain, to be purged by asking again.
    Purge {
        request_id: RequestId,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state: Option<JobState>,
        older_than_millis: u64,
    },
}

wire_message!(ClientRequest {
    Submit => "SUBMIT",
    SubmitBatch => "SUBMIT_BATCH",
    Status => "STATUS",
    Wait => "WAIT",
    Cancel => "CANCEL",
    List => "LIST",
    Workers => "WORKERS",
    Queues => "QUEUES",
    SetQueue => "SET_QUEUE",
    Cluster => "CLUSTER",
    TransferLeader => "TRANSFER_LEADER",
    Purge => "PURGE",
});

impl ClientRequest {
    /// A `SUBMIT` as its request id and the fields of its job (the inverse of
    /// [`JobSubmission::into_request`]); `None` for any other request.
    pub fn into_submission(self) -> Option<(RequestId, JobSubmission)> {
        match self {
            ClientRequest::Submit {
                request_id,
                task,
                max_attempts,
                idempotency_key,
                partitions,
                timeout_millis,
                queue,
                priority,
                fairness_key,
                run_at_unix_ms,
                delay_millis,
                retry_of,
                after,
                after_any_outcome,
            } => Some((
                request_id,
                JobSubmission {
                    task,
                    max_attempts,
                    idempotency_key,
                    partitions,
                    timeout_millis,
                    queue,
                    priority,
                    fairness_key,
                    run_at_unix_ms,
                    delay_millis,
                    retry_of,
                    after,
                    after_any_outcome,
                },
            )),
            _ => None,
        }
    }

    pub fn request_id(&self) -> RequestId {
        match self {
            ClientRequest::Cluster { request_id }
            | ClientRequest::TransferLeader { request_id, .. } => *request_id,
            ClientRequest::Submit { request_id, .. }
            | ClientRequest::SubmitBatch { request_id, .. }
            | ClientRequest::Status { request_id, .. }
            | ClientRequest::Wait { request_id, .. }
            | ClientRequest::Cancel { request_id, .. }
            | ClientRequest::List { request_id, .. }
            | ClientRequest::Purge { request_id, .. }
            | ClientRequest::SetQueue { request_id, .. }
            | ClientRequest::Queues { request_id }
            | ClientRequest::Workers { request_id } => *request_id,
        }
    }

    /// `SET_QUEUE` carrying `change`.
    pub fn set_queue(request_id: RequestId, queue: String, change: QueueChange) -> ClientRequest {
        let QueueChange {
            weight,
            paused,
            aging_millis,
            concurrency,
            key_concurrency,
            rate,
            key_rate,
            max_active_jobs,
        } = change;
        ClientRequest::SetQueue {
            request_id,
            queue,
            weight,
            paused,
            aging_millis,
            concurrency,
            key_concurrency,
            rate,
            key_rate,
            max_active_jobs,
        }
    }
}

/// One job of a `SUBMIT_BATCH`: the fields of a `SUBMIT`, without a request id.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSubmission {
    pub task: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<Partitions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_millis: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_at_unix_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_millis: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<JobId>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<JobId>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_any_outcome: bool,
}

impl JobSubmission {
    /// The same job as a `SUBMIT` request.
    pub fn into_request(self, request_id: RequestId) -> ClientRequest {
        ClientRequest::Submit {
            request_id,
            task: self.task,
            max_attempts: self.max_attempts,
            idempotency_key: self.idempotency_key,
            partitions: self.partitions,
            timeout_millis: self.timeout_millis,
            queue: self.queue,
            priority: self.priority,
            fairness_key: self.fairness_key,
            run_at_unix_ms: self.run_at_unix_ms,
            delay_millis: self.delay_millis,
            retry_of: self.retry_of,
            after: self.after,
            after_any_outcome: self.after_any_outcome,
        }
    }
}

/// What became of one job of a `SUBMIT_BATCH`: the answer a `SUBMIT` of it alone would have had.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    tag = "outcome",
    rename_all = "SCREAMING_SNAKE_CASE",
    deny_unknown_fields
)]
pub enum SubmitResult {
    /// The job exists durably; `existing` when its idempotency key matched an earlier job.
    Accepted { job_id: JobId, existing: bool },
    /// Admission control refused it; nothing was created for it.
    Rejected {
        retryable: bool,
        active_jobs: u64,
        admitting_jobs: u64,
        max_active_jobs: u64,
        /// Set when the limit reached is this queue's rather than the cluster's; the counts
        /// are then the queue's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queue: Option<String>,
        message: String,
    },
    /// It was refused for another reason (an idempotency conflict, say).
    Error { code: ErrorCode, message: String },
}

/// What a coordinator answers a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", deny_unknown_fields)]
pub enum ClientReply {
    /// The job exists durably. `existing` is true when an idempotency key matched an earlier job.
    SubmitAccepted {
        request_id: RequestId,
        /// The term of the leader that answered.
        term: Term,
        job_id: JobId,
        existing: bool,
    },
    /// Admission control refused the job; nothing was created. Retryable.
    SubmitRejected {
        request_id: RequestId,
        retryable: bool,
        /// Non-terminal jobs in the applied table.
        active_jobs: u64,
        /// Admission slots taken by submissions accepted and still being written.
        #[serde(default)]
        admitting_jobs: u64,
        max_active_jobs: u64,
        /// Set when the limit reached is this queue's rather than the cluster's; the counts
        /// are then the queue's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        queue: Option<String>,
        message: String,
    },
    /// Reply to `SUBMIT_BATCH`: one result per job, in the order they were sent.
    SubmitBatchResult {
        request_id: RequestId,
        /// The term of the leader that answered.
        term: Term,
        results: Vec<SubmitResult>,
    },
    /// Reply to `STATUS`. (Job views are boxed: they are by far the largest reply.)
    Job {
        request_id: RequestId,
        job: Box<JobView>,
    },
    /// Reply to `WAIT`.
    WaitResult {
        request_id: RequestId,
        job: Box<JobView>,
        timed_out: bool,
    },
    /// Reply to `CANCEL`. `cancelled` is false when the job was already terminal.
    CancelResult {
        request_id: RequestId,
        /// The term of the leader that answered.
        term: Term,
        job: Box<JobView>,
        cancelled: bool,
    },
    JobList {
        request_id: RequestId,
        jobs: Vec<JobView>,
    },
    WorkerList {
        request_id: RequestId,
        workers: Vec<WorkerView>,
    },
    /// Reply to `QUEUES`: every queue, by name.
    QueueList {
        request_id: RequestId,
        queues: Vec<QueueView>,
    },
    /// Reply to `SET_QUEUE`: the queue as the change left it.
    QueueSet {
        request_id: RequestId,
        queue: QueueView,
    },
    /// This coordinator is not the leader. When `uncertain` is false the request was not
    /// processed and may be sent anywhere again. When it is true the coordinator lost its
    /// leadership while the request was being made durable: it may or may not have taken
    /// effect, so only a request that is safe to repeat (a keyed submission, a cancel) should
    /// be sent again. `members` are the client addresses of the group's coordinators, as far
    /// as this one knows them.
    NotLeader {
        request_id: RequestId,
        leader: Option<LeaderHint>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        uncertain: bool,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        members: Vec<String>,
    },
    /// Reply to `CLUSTER`.
    Cluster {
        request_id: RequestId,
        cluster: ClusterView,
    },
    /// Reply to `TRANSFER_LEADER`: the hand-over to `to` has started.
    TransferStarted { request_id: RequestId, to: NodeId },
    /// Reply to `PURGE`: `purged` jobs are gone for good; `remaining` more match.
    Purged {
        request_id: RequestId,
        purged: u64,
        remaining: u64,
    },
    Error {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_id: Option<RequestId>,
        code: ErrorCode,
        message: String,
    },
}

wire_message!(ClientReply {
    SubmitAccepted => "SUBMIT_ACCEPTED",
    SubmitRejected => "SUBMIT_REJECTED",
    SubmitBatchResult => "SUBMIT_BATCH_RESULT",
    Job => "JOB",
    WaitResult => "WAIT_RESULT",
    CancelResult => "CANCEL_RESULT",
    JobList => "JOB_LIST",
    WorkerList => "WORKER_LIST",
    QueueList => "QUEUE_LIST",
    QueueSet => "QUEUE_SET",
    NotLeader => "NOT_LEADER",
    Cluster => "CLUSTER",
    TransferStarted => "TRANSFER_STARTED",
    Purged => "PURGED",
    Error => "ERROR",
});

impl ClientReply {
    /// The request this reply answers (`None` for a connection-level error).
    pub fn request_id(&self) -> Option<RequestId> {
        match self {
            ClientReply::SubmitAccepted { request_id, .. }
            | ClientReply::SubmitRejected { request_id, .. }
            | ClientReply::SubmitBatchResult { request_id, .. }
            | ClientReply::Job { request_id, .. }
            | ClientReply::WaitResult { request_id, .. }
            | ClientReply::CancelResult { request_id, .. }
            | ClientReply::JobList { request_id, .. }
            | ClientReply::WorkerList { request_id, .. }
            | ClientReply::QueueList { request_id, .. }
            | ClientReply::QueueSet { request_id, .. }
            | ClientReply::NotLeader { request_id, .. }
            | ClientReply::Cluster { request_id, .. }
            | ClientReply::TransferStarted { request_id, .. }
            | ClientReply::Purged { request_id, .. } => Some(*request_id),
            ClientReply::Error { request_id, .. } => *request_id,
        }
    }
}

/// A job as clients see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobView {
    pub id: JobId,
    pub state: JobState,
    /// Attempts started so far.
    pub attempt: u32,
    pub max_attempts: u32,
    /// The worker running the current attempt, or the last one that ran it.
    pub worker: Option<WorkerId>,
    pub lease_id: Option<LeaseId>,
    pub task: TaskSpec,
    pub result: Option<TaskOutput>,
    pub error: Option<String>,
    pub idempotency_key: Option<String>,
    /// On a partition of a data-parallel job: its parent and position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_of: Option<PartitionOf>,
    /// On a data-parallel parent: how its partitions are doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<PartitionsView>,
    /// When the job was submitted, in milliseconds since the Unix epoch by the leader's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at_unix_ms: Option<u64>,
    /// When its first attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_started_at_unix_ms: Option<u64>,
    /// When it became terminal (absent while it is not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_unix_ms: Option<u64>,
    /// The per-attempt deadline the submission asked for (absent: the coordinator's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_millis: Option<u64>,
    /// True on a waiting (queued, scheduled or blocked) job that no live worker serves.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unserved: bool,
    /// The running attempt's latest progress note, as its worker reported it (leader memory
    /// only: absent after a leader change until the worker reports again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// Its attempts, oldest first (the latest 16): worker, lease, start, end, outcome, error.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<AttemptRecord>,
    /// Older attempts left out of `history`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history_dropped: u32,
    /// The name of the token the job was submitted with (absent: a caller with no token). Its
    /// idempotency key is bound within that name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submitted_by: Option<String>,
    /// The queue it belongs to.
    #[serde(default = "crate::queues::default_queue")]
    pub queue: String,
    /// `0..=9`, higher first.
    #[serde(default)]
    pub priority: u8,
    /// Whom it is fair to within its queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fairness_key: Option<String>,
    /// The wall time it was to wait for, if its submission set one still ahead (it is
    /// `SCHEDULED` until then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_at_unix_ms: Option<u64>,
    /// The job this one retries, if it was submitted as a retry of one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<JobId>,
    /// The jobs it waits for (it is `BLOCKED` until they end).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<JobId>,
    /// It runs whatever the jobs it waits for ended as.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_any_outcome: bool,
    /// The `BLOCKED` jobs waiting for this one (the first `WAITING_SHOWN_MAX` of them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waited_on_by: Vec<JobId>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A queue as clients see it: its settings and its jobs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueView {
    pub name: String,
    pub weight: u32,
    pub paused: bool,
    /// A queued job waiting this long goes before the younger jobs of its fairness key.
    pub aging_millis: u64,
    /// The most of its jobs that run at once (absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// The most of its jobs with one fairness key that run at once (absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_concurrency: Option<u32>,
    /// At most so many starts per period (absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateLimit>,
    /// At most so many starts per period for each fairness key (absent: no limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_rate: Option<RateLimit>,
    /// The most of its jobs unfinished at once; beyond it submissions are refused (absent:
    /// only the cluster's limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_jobs: Option<u64>,
    /// Its jobs by state (partitions counted as jobs).
    #[serde(default)]
    pub blocked: u64,
    #[serde(default)]
    pub scheduled: u64,
    pub queued: u64,
    pub running: u64,
    pub retry_wait: u64,
    pub completed: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// How long its longest-queued job has waited, by the answering leader's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_queued_millis: Option<u64>,
}

/// A data-parallel parent's partitions, as clients see them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionsView {
    /// Partitions `COMPLETED` so far.
    pub done: u32,
    pub total: u32,
    /// Each partition, in order.
    pub pieces: Vec<PartitionView>,
}

/// One partition of a data-parallel job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionView {
    pub index: u32,
    pub job_id: JobId,
    pub state: JobState,
    /// Attempts started so far (more than 1: the partition ran again).
    pub attempt: u32,
    /// The worker running the current attempt, or the last one that ran it.
    pub worker: Option<WorkerId>,
    pub result: Option<TaskOutput>,
}

/// A worker as clients see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerView {
    pub id: WorkerId,
    pub incarnation: Incarnation,
    pub alive: bool,
    pub capacity: u32,
    /// Assignments it may hold beyond its slots, waiting for one.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub prefetch: u32,
    /// Attempts assigned to it and not yet reported finished (running or waiting).
    pub running: u32,
    pub last_heartbeat_millis_ago: u64,
    /// The task kinds it serves.
    #[serde(default)]
    pub tasks: Vec<String>,
    /// Shutting down: it takes no new work.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub draining: bool,
}

/// The coordinator group as one member sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterView {
    /// The member that answered.
    pub node_id: NodeId,
    /// Its role: `leader`, `follower`, `pre-candidate` or `candidate`.
    pub role: String,
    pub term: Term,
    pub leader: Option<NodeId>,
    /// The last entry in its log, the last committed, and the last applied to its job table.
    pub last_index: LogIndex,
    pub commit_index: LogIndex,
    pub applied_index: LogIndex,
    pub members: Vec<MemberView>,
}

/// One member of the group, as the answering member sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberView {
    pub node_id: NodeId,
    /// Where its clients and workers connect, once it has said so.
    pub client_address: Option<String>,
    pub worker_address: Option<String>,
    /// Known only to the leader: the last entry it knows the member holds, and how long ago
    /// the member last answered it (for the leader itself: its own durable index and 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_index: Option<LogIndex>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heard_millis_ago: Option<u64>,
}

/// Stable, typed error codes carried in `ERROR` messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    // Frame-level: the connection is closed after these.
    FrameTooLarge,
    EmptyFrame,
    InvalidUtf8,
    InvalidJson,
    MissingType,
    UnknownType,
    InvalidMessage,
    // Request-level: the connection stays open (except `NOT_REGISTERED`).
    InvalidTask,
    InvalidRequest,
    JobNotFound,
    IdempotencyConflict,
    /// The message is only valid on a registered worker connection; the connection is closed.
    NotRegistered,
    TooManyWaiters,
    /// The answer would not fit in one frame; ask for less (e.g. a smaller list limit).
    ReplyTooLarge,
    /// The port already holds its maximum of open connections; this one is closed at once.
    TooManyConnections,
    /// The port checks credentials and the connection did not present valid ones; it is
    /// closed.
    Unauthenticated,
    /// The caller's token does not allow this request; the connection stays open.
    Forbidden,
    /// The submission names a new queue and the cluster holds its maximum of queues.
    TooManyQueues,
}

impl ErrorCode {
    /// Frame-level codes end the connection.
    pub fn closes_connection(self) -> bool {
        matches!(
            self,
            ErrorCode::FrameTooLarge
                | ErrorCode::EmptyFrame
                | ErrorCode::InvalidUtf8
                | ErrorCode::InvalidJson
                | ErrorCode::MissingType
                | ErrorCode::UnknownType
                | ErrorCode::InvalidMessage
                | ErrorCode::NotRegistered
                | ErrorCode::TooManyConnections
                | ErrorCode::Unauthenticated
        )
    }
}

impl From<&super::codec::FrameError> for ErrorCode {
    fn from(error: &super::codec::FrameError) -> ErrorCode {
        use super::codec::FrameError;
        match error {
            FrameError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            FrameError::EmptyFrame => ErrorCode::EmptyFrame,
            FrameError::InvalidUtf8 { .. } => ErrorCode::InvalidUtf8,
            FrameError::InvalidJson { .. } => ErrorCode::InvalidJson,
            FrameError::MissingType => ErrorCode::MissingType,
            FrameError::UnknownType { .. } => ErrorCode::UnknownType,
            FrameError::InvalidMessage { .. } | FrameError::InvalidBinary { .. } => {
                ErrorCode::InvalidMessage
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Coordinator link
// ---------------------------------------------------------------------------------------------

/// Coordinator-to-coordinator messages: the Raft consensus of the group, plus a greeting that
/// tells a member where the sender's clients and workers connect (so a follower can redirect
/// them to the leader). Section numbers refer to the Raft paper (Ongaro and Ousterhout, 2014)
/// and the Raft dissertation (Ongaro, 2014).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", deny_unknown_fields)]
pub enum PeerMessage {
    /// First message on every peer connection.
    Hello {
        node_id: NodeId,
        /// Where the sender's clients connect (`--client-port`), as other hosts reach it.
        client_address: String,
        /// Where the sender's workers connect (`--worker-port`).
        worker_address: String,
    },
    /// Would you vote for me in `term` (one above my own)? Asking changes no one's term, so a
    /// member cut off from the group cannot disrupt it when it returns (dissertation 9.6).
    PreVote {
        term: Term,
        last_index: LogIndex,
        last_term: Term,
    },
    /// `term` is the term asked about when granted, otherwise the replier's own term.
    /// `last_index` is the last entry of the replier's log (0: it holds nothing), which a
    /// member rejoining after an empty start needs to tell a new group from one with data.
    PreVoteReply {
        term: Term,
        granted: bool,
        last_index: LogIndex,
    },
    /// RequestVote (paper 5.2, 5.4.1). `transfer` is set when the leader handed over
    /// leadership (`TIMEOUT_NOW`): voters then grant although they heard from a leader recently.
    Vote {
        term: Term,
        last_index: LogIndex,
        last_term: Term,
        transfer: bool,
    },
    VoteReply {
        term: Term,
        granted: bool,
    },
    /// AppendEntries (paper 5.3): the entries after `prev_index`, and the leader's commit index.
    /// An empty `entries` is a heartbeat. `seq` is echoed in the reply; the leader uses it to
    /// confirm it still leads before answering a read (dissertation 6.4).
    Append {
        term: Term,
        prev_index: LogIndex,
        prev_term: Term,
        entries: Vec<LogEntry>,
        commit: LogIndex,
        seq: u64,
    },
    /// On success `index` is the last entry the follower now holds durably and matching the
    /// leader's. On a rejection `index` is where the leader should try next, and
    /// `conflict_term` the term the follower holds at `prev_index`, if any (fast backtracking).
    AppendReply {
        term: Term,
        success: bool,
        index: LogIndex,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        conflict_term: Option<Term>,
        seq: u64,
        /// The follower started on an empty disk and has not yet rejoined: what it holds is
        /// real, but it may have forgotten a term it took part in, so it counts towards no
        /// majority (no commit, no read confirmation, no quorum check).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        abstaining: bool,
    },
    /// InstallSnapshot (paper 7): one chunk of the job table as of `index` (whose entry had
    /// `index_term`), `data` starting `offset` bytes into a snapshot of `total` bytes.
    Snapshot {
        term: Term,
        index: LogIndex,
        index_term: Term,
        offset: u64,
        total: u64,
        data: ChunkBytes,
        seq: u64,
    },
    /// The follower holds the first `received` bytes of the snapshot at `index` (all of it,
    /// installed and durable, when `received` equals the snapshot's size).
    SnapshotReply {
        term: Term,
        index: LogIndex,
        received: u64,
        seq: u64,
        /// As in `AppendReply`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        abstaining: bool,
    },
    /// Start an election now (dissertation 3.10): the leader is handing over to the receiver,
    /// whose log it has brought up to date.
    TimeoutNow {
        term: Term,
    },
}

wire_message!(PeerMessage {
    Hello => "HELLO",
    PreVote => "PRE_VOTE",
    PreVoteReply => "PRE_VOTE_REPLY",
    Vote => "VOTE",
    VoteReply => "VOTE_REPLY",
    Append => "APPEND",
    AppendReply => "APPEND_REPLY",
    Snapshot => "SNAPSHOT",
    SnapshotReply => "SNAPSHOT_REPLY",
    TimeoutNow => "TIMEOUT_NOW",
});

/// The bytes of one snapshot chunk: raw bytes in a binary frame (the coordinators' link), base64
/// text where the message is shown as JSON.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ChunkBytes(pub Vec<u8>);

impl std::fmt::Debug for ChunkBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChunkBytes({} bytes)", self.0.len())
    }
}

impl Serialize for ChunkBytes {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use base64::Engine as _;
        if serializer.is_human_readable() {
            serializer.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
        } else {
            serializer.serialize_bytes(&self.0)
        }
    }
}

impl<'de> Deserialize<'de> for ChunkBytes {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // Read by what the value is, not by `is_human_readable`: inside a `type`-tagged message
        // serde buffers the value first, and the buffer reports itself human-readable whatever
        // the format, so a binary frame's bytes would be taken for text.
        deserializer.deserialize_any(ChunkBytesVisitor)
    }
}

struct ChunkBytesVisitor;

impl<'de> serde::de::Visitor<'de> for ChunkBytesVisitor {
    type Value = ChunkBytes;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the bytes of a snapshot chunk, raw or as base64 text")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<ChunkBytes, E> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map(ChunkBytes)
            .map_err(E::custom)
    }

    fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<ChunkBytes, E> {
        Ok(ChunkBytes(bytes.to_vec()))
    }

    fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<ChunkBytes, E> {
        Ok(ChunkBytes(bytes))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<ChunkBytes, A::Error> {
        let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64 * 1024));
        while let Some(byte) = seq.next_element::<u8>()? {
            bytes.push(byte);
        }
        Ok(ChunkBytes(bytes))
    }
}

impl PeerMessage {
    /// The sender's term, for every consensus message (`None` for `HELLO`).
    pub fn term(&self) -> Option<Term> {
        match self {
            PeerMessage::Hello { .. } => None,
            PeerMessage::PreVote { term, .. }
            | PeerMessage::PreVoteReply { term, .. }
            | PeerMessage::Vote { term, .. }
            | PeerMessage::VoteReply { term, .. }
            | PeerMessage::Append { term, .. }
            | PeerMessage::AppendReply { term, .. }
            | PeerMessage::Snapshot { term, .. }
            | PeerMessage::SnapshotReply { term, .. }
            | PeerMessage::TimeoutNow { term } => Some(*term),
        }
    }
}
