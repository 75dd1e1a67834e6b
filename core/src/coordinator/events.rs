//! What the coordinator did, as typed events. Drivers turn them into log lines (the runtime via
//! `tracing`, the simulator into its trace); tests assert on them. Their `Display` tells the
//! story the way an operator reads it.

use std::fmt;

use crate::ids::{
    Attempt, ConnectionId, Incarnation, JobId, LeaseId, LogIndex, NodeId, Term, WorkerId,
};
use crate::job::{AttemptEnd, JobState};

/// Why a worker was declared lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LossReason {
    ConnectionClosed,
    HeartbeatTimeout { silent_millis: u64 },
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::ConnectionClosed => f.write_str("connection lost: connection closed"),
            LossReason::HeartbeatTimeout { silent_millis } => {
                write!(f, "heartbeat timeout: silent for {silent_millis} ms")
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The wall clock stepped (by `step_millis`, negative: backwards) and this member took the
    /// new reading: the stamps it gives and the delayed jobs it queues follow it from now on.
    WallClockStepped {
        step_millis: i64,
    },
    Recovered {
        jobs: usize,
        active: u64,
        awaiting_readoption: usize,
    },
    JobSubmitted {
        job_id: JobId,
        kind: String,
        max_attempts: u32,
    },
    SubmitRejected {
        active_jobs: u64,
        admitting_jobs: u64,
        max_active_jobs: u64,
    },
    /// A queue's admission limit refused a submission.
    QueueSubmitRejected {
        queue: String,
        active_jobs: u64,
        max_active_jobs: u64,
    },
    /// A rule of `queue` began holding its jobs back while work waited (paused, or a limit
    /// reached); once per time it begins.
    QueueHeldBack {
        queue: String,
        rule: crate::queues::HeldBack,
    },
    /// A data-parallel job was split: `partitions` child jobs were queued.
    JobSplit {
        job_id: JobId,
        partitions: usize,
    },
    /// Every partition of a data-parallel job completed; its result is the aggregate.
    ParentCompleted {
        job_id: JobId,
        partitions: usize,
    },
    /// A data-parallel job failed (a partition failed for good); the rest were cancelled.
    ParentFailed {
        job_id: JobId,
        error: String,
    },
    WorkerRegistered {
        worker: WorkerId,
        incarnation: Incarnation,
        capacity: u32,
        reconnect: bool,
    },
    WorkerRejected {
        worker: WorkerId,
        reason: String,
    },
    WorkerLost {
        worker: WorkerId,
        reason: LossReason,
    },
    JobAssigned {
        job_id: JobId,
        worker: WorkerId,
        attempt: Attempt,
        max_attempts: u32,
        lease_id: LeaseId,
        /// How long the job waited for this attempt, by the log's stamps (see `queued_millis`).
        queued_millis: Option<u64>,
        /// The job's queue.
        queue: String,
    },
    LeaseExpired {
        job_id: JobId,
        lease_id: LeaseId,
        worker: WorkerId,
    },
    RetryScheduled {
        job_id: JobId,
        attempt: Attempt,
        max_attempts: u32,
        delay_millis: u64,
        cause: String,
        /// How the attempt that failed ended (the cause's class).
        ended: AttemptEnd,
    },
    JobRequeued {
        job_id: JobId,
        attempt: Attempt,
        max_attempts: u32,
    },
    /// Scheduled jobs whose time came were queued, by one entry.
    ScheduledJobsDue {
        queued: u64,
        /// Still scheduled after it.
        scheduled: u64,
    },
    /// A draining worker handed an attempt back; the job is queued again, uncharged.
    AttemptReleased {
        job_id: JobId,
        worker: WorkerId,
    },
    /// A worker said it is shutting down: it gets no new work.
    WorkerDraining {
        worker: WorkerId,
        running: usize,
    },
    JobCompleted {
        job_id: JobId,
        worker: WorkerId,
        attempts: Attempt,
        /// How long the successful attempt ran, by the log's stamps.
        ran_millis: Option<u64>,
    },
    JobFailed {
        job_id: JobId,
        attempts: Attempt,
        error: String,
    },
    JobCancelled {
        job_id: JobId,
        previous: JobState,
    },
    StaleResultRejected {
        job_id: JobId,
        lease_id: LeaseId,
        worker: WorkerId,
        reason: String,
    },
    AttemptReadopted {
        job_id: JobId,
        lease_id: LeaseId,
        worker: WorkerId,
    },
    AttemptAbandoned {
        job_id: JobId,
        lease_id: LeaseId,
        worker: WorkerId,
    },
    MalformedFrame {
        conn: ConnectionId,
        error: String,
    },
    /// A client asked for something its token's role does not allow; nothing changed.
    Forbidden {
        conn: ConnectionId,
        /// The caller, as `Caller::describe` names it.
        caller: String,
        request: &'static str,
    },
    /// This member won an election.
    LeaderElected {
        term: Term,
    },
    /// This member leads `term` and has caught up: it took over the job table.
    TookOver {
        term: Term,
        jobs: usize,
        active: u64,
        awaiting_readoption: usize,
    },
    /// This member stopped leading.
    SteppedDown {
        term: Term,
        reason: String,
    },
    /// No leader was heard within an election timeout.
    ElectionStarted {
        term: Term,
        pre_vote: bool,
    },
    /// A leader of `term` made itself known.
    LeaderKnown {
        term: Term,
        leader: NodeId,
    },
    /// A leadership transfer to `to` started.
    TransferStarted {
        to: NodeId,
    },
    /// The leader's table replaced this member's (it had fallen too far behind).
    SnapshotInstalled {
        index: LogIndex,
        jobs: usize,
    },
    SnapshotRefused {
        index: LogIndex,
        error: String,
    },
    /// This member started with an empty disk in a group of several: it abstains from
    /// elections until it has heard every member (and caught up, if the group holds data).
    Abstaining,
    /// It has: it takes part in elections again from `term` on.
    Rejoined {
        term: Term,
    },
    /// A follower no longer holds entries it acknowledged (its disk was lost).
    FollowerLostEntries {
        follower: NodeId,
        acknowledged: LogIndex,
        holds: LogIndex,
    },
    /// Retention removed `purged` terminal jobs; `kept` terminal jobs remain.
    JobsPurged {
        purged: u64,
        kept: u64,
    },
    /// A peer message from a node that is not a member of the group.
    PeerIgnored {
        from: NodeId,
    },
    /// A member sent what consensus rules out (a bug somewhere); it was ignored.
    PeerProtocolViolation {
        from: NodeId,
        what: String,
    },
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Recovered {
                jobs,
                active,
                awaiting_readoption,
            } => write!(
                f,
                "Recovered state: jobs={jobs} active={active} awaitingReadoption={awaiting_readoption}"
            ),
            Event::JobSubmitted {
                job_id,
                kind,
                max_attempts,
            } => write!(f, "Job submitted: jobId={job_id} task={kind} maxAttempts={max_attempts}"),
            Event::JobsPurged { purged, kept } => {
                write!(f, "Jobs purged: purged={purged} keptTerminal={kept}")
            }
            Event::SubmitRejected {
                active_jobs,
                admitting_jobs,
                max_active_jobs,
            } => write!(
                f,
                "Submission rejected: active={active_jobs} admitting={admitting_jobs} maxActiveJobs={max_active_jobs}"
            ),
            Event::QueueSubmitRejected {
                queue,
                active_jobs,
                max_active_jobs,
            } => write!(
                f,
                "Submission rejected by its queue: queue={queue} active={active_jobs} maxActiveJobs={max_active_jobs}"
            ),
            Event::QueueHeldBack { queue, rule } => write!(
                f,
                "Queue held back: queue={queue} rule={}",
                rule.label()
            ),
            Event::WorkerRegistered {
                worker,
                incarnation,
                capacity,
                reconnect,
            } => write!(
                f,
                "Worker {}: workerId={worker} incarnation={incarnation} capacity={capacity}",
                if *reconnect { "reconnected" } else { "registered" }
            ),
            Event::WorkerRejected { worker, reason } => {
                write!(f, "Worker registration rejected: workerId={worker} reason=\"{reason}\"")
            }
            Event::WorkerLost { worker, reason } => {
                write!(f, "Worker connection lost: workerId={worker} reason={reason}")
            }
            Event::JobAssigned {
                job_id,
                worker,
                attempt,
                max_attempts,
                lease_id,
                queued_millis,
                queue,
            } => {
                write!(
                    f,
                    "Job assigned: jobId={job_id} workerId={worker} attempt={attempt}/{max_attempts} attemptId={lease_id}"
                )?;
                if !crate::queues::is_default_queue(queue) {
                    write!(f, " queue={queue}")?;
                }
                match queued_millis {
                    Some(ms) => write!(f, " queuedMillis={ms}"),
                    None => Ok(()),
                }
            }
            Event::LeaseExpired {
                job_id,
                lease_id,
                worker,
            } => write!(
                f,
                "Attempt deadline expired: jobId={job_id} workerId={worker} attemptId={lease_id}"
            ),
            Event::RetryScheduled {
                job_id,
                attempt,
                max_attempts,
                delay_millis,
                cause,
                ended,
            } => write!(
                f,
                "Retry scheduled: jobId={job_id} attempt={attempt}/{max_attempts} delayMillis={delay_millis} ended={ended} cause=\"{cause}\""
            ),
            Event::JobRequeued {
                job_id,
                attempt,
                max_attempts,
            } => write!(f, "Job requeued: jobId={job_id} attempt={attempt}/{max_attempts}"),
            Event::WallClockStepped { step_millis } => write!(
                f,
                "Wall clock stepped: stepMillis={step_millis} (stamps and delayed jobs follow the new reading)"
            ),
            Event::ScheduledJobsDue { queued, scheduled } => write!(
                f,
                "Scheduled jobs due: queued={queued} stillScheduled={scheduled}"
            ),
            Event::AttemptReleased { job_id, worker } => write!(
                f,
                "Attempt handed back by a draining worker: jobId={job_id} workerId={worker} (not charged; queued again)"
            ),
            Event::WorkerDraining { worker, running } => write!(
                f,
                "Worker draining: workerId={worker} running={running} (no new work)"
            ),
            Event::JobCompleted {
                job_id,
                worker,
                attempts,
                ran_millis,
            } => {
                write!(f, "Job completed: jobId={job_id} workerId={worker} attempts={attempts}")?;
                match ran_millis {
                    Some(ms) => write!(f, " runMillis={ms}"),
                    None => Ok(()),
                }
            }
            Event::JobSplit {
                job_id,
                partitions,
            } => write!(f, "Job split: jobId={job_id} partitions={partitions}"),
            Event::ParentCompleted {
                job_id,
                partitions,
            } => write!(
                f,
                "Job completed: jobId={job_id} partitions={partitions} (aggregated)"
            ),
            Event::ParentFailed { job_id, error } => {
                write!(f, "Job failed: jobId={job_id} error=\"{error}\"")
            }
            Event::JobFailed {
                job_id,
                attempts,
                error,
            } => write!(f, "Job failed: jobId={job_id} attempts={attempts} error=\"{error}\""),
            Event::JobCancelled { job_id, previous } => {
                write!(f, "Job cancelled: jobId={job_id} previousState={previous}")
            }
            Event::StaleResultRejected {
                job_id,
                lease_id,
                worker,
                reason,
            } => write!(
                f,
                "Stale result rejected: jobId={job_id} workerId={worker} attemptId={lease_id} reason=\"{reason}\""
            ),
            Event::AttemptReadopted {
                job_id,
                lease_id,
                worker,
            } => write!(
                f,
                "Attempt re-adopted after a takeover: jobId={job_id} workerId={worker} attemptId={lease_id}"
            ),
            Event::AttemptAbandoned {
                job_id,
                lease_id,
                worker,
            } => write!(
                f,
                "Attempt not re-adopted: jobId={job_id} workerId={worker} attemptId={lease_id}"
            ),
            Event::MalformedFrame { conn, error } => {
                write!(f, "Malformed frame, closing connection: {conn} error=\"{error}\"")
            }
            Event::Forbidden {
                conn,
                caller,
                request,
            } => write!(f, "Request forbidden: {conn} {request} by {caller}"),
            Event::LeaderElected { term } => write!(f, "Leader elected: term={}", term.0),
            Event::TookOver {
                term,
                jobs,
                active,
                awaiting_readoption,
            } => write!(
                f,
                "Leader took over: term={} jobs={jobs} active={active} awaitingReadoption={awaiting_readoption}",
                term.0
            ),
            Event::SteppedDown { term, reason } => {
                write!(f, "Stepped down: term={} reason=\"{reason}\"", term.0)
            }
            Event::ElectionStarted { term, pre_vote } => write!(
                f,
                "Election started: term={}{}",
                term.0,
                if *pre_vote { " (pre-vote)" } else { "" }
            ),
            Event::LeaderKnown { term, leader } => {
                write!(f, "Following leader: term={} leader={leader}", term.0)
            }
            Event::TransferStarted { to } => write!(f, "Leadership transfer started: to={to}"),
            Event::SnapshotInstalled { index, jobs } => {
                write!(f, "Snapshot installed: index={index} jobs={jobs}")
            }
            Event::SnapshotRefused { index, error } => {
                write!(f, "Snapshot refused: index={index} error=\"{error}\"")
            }
            Event::Abstaining => f.write_str(
                "Empty disk in a group: abstaining from elections until every member has been heard (and, if the group holds data, this member has caught up)"
            ),
            Event::Rejoined { term } => {
                write!(f, "Rejoined the group: takes part in elections again from term {}", term.0)
            }
            Event::FollowerLostEntries {
                follower,
                acknowledged,
                holds,
            } => write!(
                f,
                "Follower lost entries: {follower} had acknowledged up to {acknowledged} and now holds up to {holds}"
            ),
            Event::PeerIgnored { from } => {
                write!(f, "Peer message ignored: from={from} is not a member of the group")
            }
            Event::PeerProtocolViolation { from, what } => {
                write!(f, "Peer protocol violation: from={from} {what}")
            }
        }
    }
}
