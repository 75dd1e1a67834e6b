//! What the worker machine asks of its driver, and the events it reports for the log.

use std::fmt;
use std::time::Duration;

use crate::dial::ConnectAttempt;
use crate::ids::{Attempt, JobId, LeaseId, Term};
use crate::protocol::{ErrorCode, WorkerToCoordinator};
use crate::tasks::TaskSpec;

/// What the worker asks its driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerOutput {
    /// Open a connection to `address`; report the outcome with `attempt`.
    Connect {
        attempt: ConnectAttempt,
        address: String,
    },
    /// Send on the current connection.
    Send(WorkerToCoordinator),
    /// Close the current connection (no report is expected back).
    Close,
    /// Run this attempt; call `handle_task_finished` when it ends.
    StartTask(TaskAssignment),
    /// Stop this attempt as soon as possible, then report it finished (`Cancelled` if stopped).
    /// After a drain handed the attempt back, its report is no longer needed (it is ignored).
    CancelTask {
        lease_id: LeaseId,
    },
    Event(WorkerEvent),
}

/// One attempt the coordinator assigned: what a worker runs, or holds until a slot frees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskAssignment {
    pub job_id: JobId,
    pub lease_id: LeaseId,
    pub attempt: Attempt,
    pub max_attempts: u32,
    pub task: TaskSpec,
    pub timeout: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerEvent {
    Connecting {
        address: String,
    },
    Registered {
        address: String,
    },
    RegistrationRejected {
        message: String,
    },
    Disconnected {
        reason: String,
        retry_in_millis: u64,
    },
    TaskStarted {
        job_id: JobId,
        lease_id: LeaseId,
        attempt: Attempt,
        kind: String,
    },
    TaskRefused {
        job_id: JobId,
        lease_id: LeaseId,
        reason: String,
    },
    CancelRequested {
        job_id: JobId,
        lease_id: LeaseId,
    },
    TaskFinished {
        job_id: JobId,
        lease_id: LeaseId,
        outcome: String,
        ran_millis: u64,
    },
    ResultAcknowledged {
        job_id: JobId,
        lease_id: LeaseId,
        accepted: bool,
    },
    CoordinatorError {
        code: ErrorCode,
        message: String,
    },
    /// A coordinator spoke for `term`, older than `seen`: it was deposed; the worker moves on.
    DeposedCoordinator {
        term: Term,
        seen: Term,
    },
    /// The worker began draining: it takes no new work.
    Draining {
        running: usize,
    },
    /// A draining worker handed an unfinished attempt back to the coordinator.
    TaskReleased {
        job_id: JobId,
        lease_id: LeaseId,
    },
}

impl fmt::Display for WorkerEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerEvent::Connecting { address } => {
                write!(f, "Connecting to coordinator at {address}")
            }
            WorkerEvent::Registered { address } => {
                write!(f, "Registered with coordinator at {address}")
            }
            WorkerEvent::RegistrationRejected { message } => {
                write!(f, "Registration rejected: {message}")
            }
            WorkerEvent::Disconnected {
                reason,
                retry_in_millis,
            } => write!(
                f,
                "Disconnected ({reason}); reconnecting in {retry_in_millis} ms"
            ),
            WorkerEvent::TaskStarted {
                job_id,
                lease_id,
                attempt,
                kind,
            } => write!(
                f,
                "Task started: jobId={job_id} task={kind} attempt={attempt} attemptId={lease_id}"
            ),
            WorkerEvent::TaskRefused {
                job_id,
                lease_id,
                reason,
            } => write!(
                f,
                "Task refused: jobId={job_id} attemptId={lease_id} reason=\"{reason}\""
            ),
            WorkerEvent::CancelRequested { job_id, lease_id } => {
                write!(f, "Cancel requested: jobId={job_id} attemptId={lease_id}")
            }
            WorkerEvent::TaskFinished {
                job_id,
                lease_id,
                outcome,
                ran_millis,
            } => write!(
                f,
                "Task finished: jobId={job_id} attemptId={lease_id} runMillis={ran_millis} outcome=\"{outcome}\""
            ),
            WorkerEvent::ResultAcknowledged {
                job_id,
                lease_id,
                accepted,
            } => write!(
                f,
                "Result acknowledged: jobId={job_id} attemptId={lease_id} accepted={accepted}"
            ),
            WorkerEvent::CoordinatorError { code, message } => {
                write!(f, "Coordinator error {code:?}: {message}")
            }
            WorkerEvent::DeposedCoordinator { term, seen } => write!(
                f,
                "Ignoring a deposed coordinator: it speaks for term {} but term {} has begun",
                term.0, seen.0
            ),
            WorkerEvent::Draining { running } => write!(
                f,
                "Draining: taking no new work; {running} attempts still running"
            ),
            WorkerEvent::TaskReleased { job_id, lease_id } => write!(
                f,
                "Task handed back unfinished: jobId={job_id} attemptId={lease_id}"
            ),
        }
    }
}
