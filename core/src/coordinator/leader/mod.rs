//! Leader soft state: everything only the leader keeps, none of it replicated or persisted.
//!
//! ```text
//!   worker link ──> workers.rs   (register, heartbeats, results, loss)   ─┐
//!   client link ──> clients.rs   (submit, status, wait, cancel, list)    ─┼─> propose ──> log
//!   timers      ──> this module  (heartbeat checks, deadlines, retries)  ─┘
//!   scheduling.rs: queued jobs onto free slots
//!   effects.rs:    committed entries applied ──> replies, assignments, cancels, acks, events
//! ```
//!
//! A `LeaderState` is built when a member starts leading and dropped when it stops: the worker
//! registry and its slots, the timers, the leases with a settlement in flight, parked waits and
//! the replies owed to clients and workers. It describes the present as measured on this
//! member's clock, so nothing in it can be handed to another member or survive a restart; a new
//! leader rebuilds it conservatively from the job table (`take_over`).

mod clients;
mod effects;
mod scheduling;
mod workers;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::member::Member;
use super::registry::Registry;
use super::timers::{Timer, TimerKey, TimerQueue};
use super::{Event, LossReason, WorkerEntry};
use crate::command::Command;
use crate::ids::{ConnectionId, Incarnation, JobId, LeaseId, LogIndex, RequestId, Term, WorkerId};
use crate::job::JobState;
use crate::protocol::{
    CancelReason, ClientReply, ClientRequest, CoordinatorToWorker, Partitions, RunningAttempt,
    WorkerToCoordinator,
};
use crate::replica::Proposal;
use crate::time::Instant;

/// Whom to tell when a proposed entry applies.
#[derive(Clone, Debug)]
enum Pending {
    Submit {
        conn: ConnectionId,
        request_id: RequestId,
    },
    Cancel {
        conn: ConnectionId,
        request_id: RequestId,
    },
    /// A worker's result: acknowledge it once settled.
    Result { worker: WorkerId },
    /// The leader revoked the lease (deadline): tell the worker once settled.
    Revoke { reason: CancelReason },
}

/// A `SUBMIT` request's fields, as the leader receives them.
struct Submission {
    task: serde_json::Value,
    max_attempts: Option<u32>,
    idempotency_key: Option<String>,
    partitions: Option<Partitions>,
}

/// A `REGISTER` message's fields.
struct Registration {
    worker_id: WorkerId,
    incarnation: Incarnation,
    capacity: u32,
    running: Vec<RunningAttempt>,
    finished: Vec<RunningAttempt>,
}

#[derive(Clone, Debug)]
struct Waiter {
    conn: ConnectionId,
    request_id: RequestId,
    timer: TimerKey,
}

pub(super) struct LeaderState {
    registry: Registry,
    timers: TimerQueue,
    /// Proposal `(term, index)` -> whom to answer when exactly that entry applies. An entry of
    /// another term at the same index is not ours and answers nobody here.
    pending: BTreeMap<(Term, LogIndex), Pending>,
    /// Queued jobs with an `Assign` in flight.
    assigning: BTreeSet<JobId>,
    /// Leases with a settling command (`Complete`, `AttemptFailed`, `Abandon`) in flight.
    settling: BTreeSet<LeaseId>,
    /// Results that arrived while their attempt was settling, answered once it is durable.
    deferred_acks: BTreeMap<LeaseId, (JobId, WorkerId)>,
    /// Deadlines of running attempts, to disarm when they settle.
    lease_deadlines: BTreeMap<LeaseId, TimerKey>,
    /// Running attempts found at takeover, waiting for their worker to report them.
    awaiting_readoption: BTreeMap<LeaseId, JobId>,
    waiters: BTreeMap<JobId, Vec<Waiter>>,
    waiter_count: usize,
    /// Numbers registrations, so a heartbeat check belongs to exactly one of them.
    next_registration: u64,
}

impl LeaderState {
    /// A leader with nothing to take over (an empty table).
    pub(super) fn new() -> LeaderState {
        LeaderState {
            registry: Registry::default(),
            timers: TimerQueue::default(),
            pending: BTreeMap::new(),
            assigning: BTreeSet::new(),
            settling: BTreeSet::new(),
            deferred_acks: BTreeMap::new(),
            lease_deadlines: BTreeMap::new(),
            awaiting_readoption: BTreeMap::new(),
            waiters: BTreeMap::new(),
            waiter_count: 0,
            next_registration: 0,
        }
    }

    /// Leader takeover at `m.now`: rebuild soft state from the table. Every `RUNNING` attempt
    /// gets a re-adoption window (its worker may reconnect and report it), every `RETRY_WAIT`
    /// job restarts its backoff from now. No instant from another process is trusted, because
    /// it was measured on another clock.
    pub(super) fn take_over(m: &mut Member) -> LeaderState {
        let mut leader = LeaderState::new();
        let now = m.now;
        let window_end = now.saturating_add(m.config.readoption_window());
        let mut retry_due = Vec::new();
        for job in m.table.jobs() {
            match (&job.state, &job.lease) {
                (JobState::Running, Some(lease)) => {
                    leader.awaiting_readoption.insert(lease.id, job.id);
                }
                (JobState::RetryWait, _) => {
                    let at = now.saturating_add(Duration::from_millis(job.retry_delay_millis));
                    retry_due.push((at, job.id));
                }
                _ => {}
            }
        }
        for (at, job_id) in retry_due {
            leader.timers.arm(at, Timer::RetryDue(job_id));
        }
        if !leader.awaiting_readoption.is_empty() {
            leader.timers.arm(window_end, Timer::ReadoptionEnd);
        }
        m.event(Event::Recovered {
            jobs: m.table.len(),
            active: m.table.active_jobs(),
            awaiting_readoption: leader.awaiting_readoption.len(),
        });
        leader
    }

    pub(super) fn workers(&self) -> impl Iterator<Item = &WorkerEntry> {
        self.registry.iter()
    }

    pub(super) fn armed_timers(&self) -> usize {
        self.timers.len()
    }

    pub(super) fn awaiting_readoption(&self) -> usize {
        self.awaiting_readoption.len()
    }

    pub(super) fn next_timer(&self) -> Option<Instant> {
        self.timers.next_deadline()
    }

    /// Proposes `command`; `pending` is answered when exactly this entry applies.
    fn propose(&mut self, m: &mut Member, command: Command, pending: Option<Pending>) -> Proposal {
        let proposal = match m.propose(command) {
            Ok(proposal) => proposal,
            // Leader state exists only while consensus says this member leads.
            Err(not_leader) => panic!("a leader's proposal was refused: {not_leader:?}"),
        };
        if let Some(pending) = pending {
            self.pending
                .insert((proposal.term, proposal.index), pending);
        }
        proposal
    }

    /// `conn` is gone: a worker on it is lost, its parked waits are dropped.
    pub(super) fn handle_closed(&mut self, m: &mut Member, conn: ConnectionId) {
        if let Some(worker) = self.registry.worker_on(conn).cloned() {
            self.lose_worker(m, &worker, LossReason::ConnectionClosed);
        }
        self.drop_waiters_of(conn);
        self.schedule(m);
    }

    /// Fires every timer due at `m.now`.
    pub(super) fn handle_timeout(&mut self, m: &mut Member) {
        while let Some(timer) = self.timers.pop_due(m.now) {
            match timer {
                Timer::HeartbeatCheck(worker, registration) => {
                    self.check_heartbeat(m, &worker, registration)
                }
                Timer::LeaseDeadline(job_id, lease_id) => self.expire_lease(m, job_id, lease_id),
                Timer::RetryDue(job_id) => {
                    if m.table.get(&job_id).map(|job| job.state) == Some(JobState::RetryWait) {
                        self.propose(m, Command::Requeue { job_id }, None);
                    }
                }
                Timer::ReadoptionEnd => self.end_readoption(m),
                Timer::WaitTimeout(conn, request_id, job_id) => {
                    self.time_out_waiter(m, conn, request_id, job_id)
                }
            }
        }
        self.schedule(m);
    }

    pub(super) fn handle_worker_message(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        message: WorkerToCoordinator,
    ) {
        // Any message from a registered worker shows it is alive.
        if let Some(worker) = self.registry.worker_on(conn).cloned() {
            if let Some(entry) = self.registry.get_mut(&worker) {
                entry.last_heartbeat = m.now;
            }
        }
        match message {
            WorkerToCoordinator::Register {
                worker_id,
                incarnation,
                capacity,
                running,
                finished,
            } => {
                let registration = Registration {
                    worker_id,
                    incarnation,
                    capacity,
                    running,
                    finished,
                };
                self.register(m, conn, registration)
            }
            WorkerToCoordinator::Heartbeat {} => match self.registry.worker_on(conn) {
                Some(_) => m.send_worker(conn, CoordinatorToWorker::HeartbeatAck {}),
                None => self.reject_unregistered(m, conn),
            },
            WorkerToCoordinator::TaskResult {
                job_id,
                lease_id,
                outcome,
            } => self.receive_result(m, conn, job_id, lease_id, outcome),
        }
        self.schedule(m);
    }

    pub(super) fn handle_client_message(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        message: ClientRequest,
    ) {
        match message {
            ClientRequest::Submit {
                request_id,
                task,
                max_attempts,
                idempotency_key,
                partitions,
            } => {
                let submission = Submission {
                    task,
                    max_attempts,
                    idempotency_key,
                    partitions,
                };
                self.submit(m, conn, request_id, submission)
            }
            ClientRequest::Status { request_id, job_id } => match m.table.view(&job_id) {
                Some(job) => m.send_client(conn, ClientReply::Job { request_id, job }),
                None => self.job_not_found(m, conn, request_id, job_id),
            },
            ClientRequest::Wait {
                request_id,
                job_id,
                timeout_millis,
            } => self.wait(m, conn, request_id, job_id, timeout_millis),
            ClientRequest::Cancel { request_id, job_id } => {
                self.cancel(m, conn, request_id, job_id)
            }
            ClientRequest::List {
                request_id,
                state,
                limit,
            } => self.list(m, conn, request_id, state, limit),
            ClientRequest::Workers { request_id } => {
                let now = m.now;
                let workers = self.registry.iter().map(|w| w.view(now)).collect();
                m.send_client(
                    conn,
                    ClientReply::WorkerList {
                        request_id,
                        workers,
                    },
                );
            }
        }
        self.schedule(m);
    }
}
