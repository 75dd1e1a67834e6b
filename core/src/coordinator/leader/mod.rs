//! Leader soft state: everything only the leader keeps, none of it replicated or persisted.
//!
//! ```text
//!   worker link ─┐                                  ┌─> propose ──> log ──> committed, applied
//!   client link ─┼─> this module (routers) ──> feature modules                     │
//!   timers      ─┘                                  └── effects.rs (router) <───────┘
//! ```
//!
//! Each feature owns its state, the requests it takes in and the effects of the commands it
//! proposed:
//!
//! | module          | owns |
//! |-----------------|------|
//! | `workers.rs`    | the registry: registration (checked, then reconciled), heartbeats, draining, loss |
//! | `attempts/`     | running attempts: deadlines, progress, settling, re-adoption, retries; results and their acknowledgement |
//! | `scheduling.rs` | queued jobs onto free slots; assignments in flight |
//! | `submissions/`  | `SUBMIT` and `SUBMIT_BATCH` down to one proposal each, and their answers |
//! | `admission.rs`  | submissions proposed and not yet applied: slots they take, keys they bind |
//! | `due.rs`        | delayed jobs: one timer for the earliest `run_at`, `Due` entries queueing them |
//! | `clients.rs`    | `STATUS`, `LIST`, `CANCEL` |
//! | `waits.rs`      | parked `WAIT`s and waking them |
//! | `reads.rs`      | reads waiting for leadership to be confirmed (ReadIndex) |
//! | `queues.rs`     | `QUEUES` and `SET_QUEUE` |
//! | `retention.rs`  | purges, by policy and by request |
//! | `rotation.rs`   | handing leadership over after a number of jobs |
//! | `effects.rs`    | a router from an applied entry's outcome to the feature that owns it |
//!
//! A `LeaderState` is built when a member starts leading and dropped when it stops: the worker
//! registry and its slots, the timers, the leases with a settlement in flight, parked waits and
//! the replies owed to clients and workers. It describes the present as measured on this
//! member's clock, so nothing in it can be handed to another member or survive a restart; a new
//! leader rebuilds it conservatively from the job table (`take_over`).

mod admission;
mod attempts;
mod clients;
mod due;
mod effects;
mod queues;
mod reads;
mod retention;
mod rotation;
mod scheduling;
mod submissions;
mod waits;
mod workers;

use std::collections::BTreeMap;
use std::time::Duration;

use super::member::Member;
use super::registry::Registry;
use super::timers::{Timer, TimerQueue};
use super::{Event, Link, LossReason, WorkerEntry};
use crate::command::Command;
use crate::ids::{ConnectionId, Incarnation, LogIndex, RequestId, Term, WorkerId};
use crate::job::JobState;
use crate::protocol::{
    CancelReason, ClientReply, ClientRequest, CoordinatorToWorker, RunningAttempt,
    WorkerToCoordinator,
};
use crate::queues::QueueChange;
use crate::replica::Proposal;
use crate::time::Instant;
use reads::Read;
use submissions::SubmitTo;

/// Whom to tell when a proposed entry applies.
#[derive(Clone, Debug)]
enum Pending {
    Submit {
        to: SubmitTo,
    },
    Cancel {
        conn: ConnectionId,
        request_id: RequestId,
    },
    /// A worker's result: acknowledge it once settled.
    Result {
        worker: WorkerId,
    },
    /// The leader revoked the lease (deadline): tell the worker once settled.
    Revoke {
        reason: CancelReason,
    },
    /// A purge the retention policy asked for.
    PolicyPurge,
    /// An operator's `SET_QUEUE`: answer with the queue.
    SetQueue {
        conn: ConnectionId,
        request_id: RequestId,
    },
    /// A `Due` entry this leader proposed: the next may go once it applies.
    Due,
    /// A client's `PURGE`: answer with how many it removed and how many more match.
    Purge {
        conn: ConnectionId,
        request_id: RequestId,
        remaining: u64,
    },
}

/// A `REGISTER` message's fields.
struct Registration {
    worker_id: WorkerId,
    incarnation: Incarnation,
    capacity: u32,
    prefetch: u32,
    running: Vec<RunningAttempt>,
    finished: Vec<RunningAttempt>,
    tasks: Vec<String>,
    draining: bool,
    queues: Option<Vec<String>>,
}

/// Why a member takes over as leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::coordinator) enum Takeover {
    /// A group of one restarted on its disk.
    Restart,
    /// This member won an election and its first entry of the term is applied.
    Elected,
}

pub(super) struct LeaderState {
    /// The term this member leads; the state is dropped when the term ends.
    term: Term,
    registry: Registry,
    timers: TimerQueue,
    /// Proposal `(term, index)` -> whom to answer when exactly that entry applies. An entry of
    /// another term at the same index is not ours and answers nobody here.
    pending: BTreeMap<(Term, LogIndex), Pending>,
    /// Assignments in flight, fresh jobs, and what held queues back.
    scheduling: scheduling::Scheduling,
    /// Running attempts: settling, deadlines, progress, re-adoption.
    attempts: attempts::Attempts,
    /// Parked waits for jobs to finish.
    waits: waits::Waits,
    /// Numbers registrations, so a heartbeat check belongs to exactly one of them.
    next_registration: u64,
    /// Reads waiting for leadership to be confirmed.
    reads: reads::Reads,
    /// New jobs accepted this term, for leader rotation.
    rotation: rotation::Rotation,
    /// Submissions proposed and not yet applied, for admission and idempotency.
    admitting: admission::Admitting,
    /// Purges proposed and not yet applied.
    purging: retention::Purging,
    /// Batch submissions not yet answered.
    batches: submissions::Batches,
    /// Delayed jobs: the timer for the next one due, the `Due` entry in flight.
    due: due::DueJobs,
}

impl LeaderState {
    /// A leader of `term` with nothing to take over (an empty table) and no timer armed.
    fn new(term: Term) -> LeaderState {
        LeaderState {
            term,
            registry: Registry::default(),
            timers: TimerQueue::default(),
            pending: BTreeMap::new(),
            scheduling: scheduling::Scheduling::default(),
            attempts: attempts::Attempts::default(),
            waits: waits::Waits::default(),
            next_registration: 0,
            reads: reads::Reads::default(),
            rotation: rotation::Rotation::default(),
            admitting: admission::Admitting::default(),
            purging: retention::Purging::default(),
            batches: submissions::Batches::default(),
            due: due::DueJobs::default(),
        }
    }

    /// The leader of a new group of one: nothing to take over, retention to start.
    pub(super) fn fresh(m: &Member) -> LeaderState {
        let mut leader = LeaderState::new(m.replica.term());
        leader.start_retention(m);
        leader
    }

    pub(super) fn term(&self) -> Term {
        self.term
    }

    /// Leader takeover at `m.now`: rebuild soft state from the table. Every `RUNNING` attempt
    /// gets a re-adoption window (its worker may reconnect and report it), every `RETRY_WAIT`
    /// job restarts its backoff from now. No instant from another process is trusted, because
    /// it was measured on another clock.
    pub(super) fn take_over(m: &mut Member, why: Takeover) -> LeaderState {
        let mut leader = LeaderState::new(m.replica.term());
        let now = m.now;
        let window_end = now.saturating_add(m.config.readoption_window());
        let mut retry_due = Vec::new();
        for job in m.table.jobs() {
            match (&job.state, &job.lease) {
                (JobState::Running, Some(lease)) => {
                    leader.attempts.await_readoption(lease.id, job.id);
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
        if leader.attempts.awaiting_readoption() > 0 {
            leader.timers.arm(window_end, Timer::ReadoptionEnd);
        }
        leader.start_retention(m);
        leader.check_due(m);
        let (jobs, active, awaiting_readoption) = (
            m.table.len(),
            m.table.active_jobs(),
            leader.attempts.awaiting_readoption(),
        );
        m.event(match why {
            Takeover::Restart => Event::Recovered {
                jobs,
                active,
                awaiting_readoption,
            },
            Takeover::Elected => Event::TookOver {
                term: leader.term,
                jobs,
                active,
                awaiting_readoption,
            },
        });
        leader
    }

    /// This member stopped leading: everything it owed is answered with `NOT_LEADER`, and its
    /// workers are sent to the leader it knows. A reply owed for a proposal is `uncertain`: the
    /// entry may still be committed by the next leader.
    pub(super) fn step_down(self, m: &mut Member) {
        let client_hint = m.leader_hint(Link::Client);
        let client_members = m.member_addresses(Link::Client);
        let not_leader = |request_id, uncertain| ClientReply::NotLeader {
            request_id,
            leader: client_hint.clone(),
            uncertain,
            members: client_members.clone(),
        };
        let mut batches = self.batches;
        let mut owed_submission = |m: &mut Member, to| match to {
            SubmitTo::Request { conn, request_id } => {
                m.send_client(conn, not_leader(request_id, true))
            }
            // The whole batch is answered at its first job still owed.
            SubmitTo::BatchItem { batch, .. } => {
                if let Some(open) = batches.close(batch) {
                    m.send_client(open.conn, not_leader(open.request_id, true));
                }
            }
        };
        for pending in self.pending.into_values() {
            match pending {
                Pending::Submit { to } => owed_submission(m, to),
                Pending::Cancel { conn, request_id }
                | Pending::SetQueue { conn, request_id }
                | Pending::Purge {
                    conn, request_id, ..
                } => m.send_client(conn, not_leader(request_id, true)),
                _ => {}
            }
        }
        // A resend's job may yet be created, by the entry it waited for.
        for resend in self.admitting.into_resends() {
            owed_submission(m, resend.to);
        }
        // Every job of an open batch is owed by a proposal or a parked resend.
        if let Some(open) = batches.into_open().next() {
            panic!(
                "batch {} of connection {:?} was open with no job of it owed",
                open.request_id, open.conn
            );
        }
        for waiter in self.waits.into_all() {
            m.send_client(waiter.conn, not_leader(waiter.request_id, false));
        }
        for read in self.reads.into_all() {
            m.send_client(read.conn(), not_leader(read.request_id(), false));
        }
        let worker_hint = m.leader_hint(Link::Worker);
        let worker_members = m.member_addresses(Link::Worker);
        for worker in self.registry.iter() {
            if let Some(conn) = worker.conn.filter(|_| worker.alive) {
                m.send_worker(
                    conn,
                    CoordinatorToWorker::NotLeader {
                        leader: worker_hint.clone(),
                        members: worker_members.clone(),
                    },
                );
                m.close(conn);
            }
        }
    }

    pub(super) fn workers(&self) -> impl Iterator<Item = &WorkerEntry> {
        self.registry.iter()
    }

    pub(super) fn armed_timers(&self) -> usize {
        self.timers.len()
    }

    pub(super) fn awaiting_readoption(&self) -> usize {
        self.attempts.awaiting_readoption()
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
        assert_eq!(
            proposal.term, self.term,
            "a leader of term {:?} proposed in term {:?}",
            self.term, proposal.term
        );
        if let Some(pending) = pending {
            let at = (proposal.term, proposal.index);
            let earlier = self.pending.insert(at, pending);
            assert!(earlier.is_none(), "two proposals owe answers at {at:?}");
        }
        proposal
    }

    /// `conn` is gone: a worker on it is lost, its parked waits and reads are dropped.
    pub(super) fn handle_closed(&mut self, m: &mut Member, conn: ConnectionId) {
        if let Some(worker) = self.registry.worker_on(conn).cloned() {
            self.lose_worker(m, &worker, LossReason::ConnectionClosed);
        }
        self.drop_waiters_of(conn);
        self.admitting.drop_conn(conn);
        self.batches.drop_conn(conn);
        self.reads.drop_conn(conn);
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
                Timer::RetryDue(job_id) => self.retry_due(m, job_id),
                Timer::ReadoptionEnd => self.end_readoption(m),
                Timer::WaitTimeout(conn, request_id, job_id) => {
                    self.time_out_waiter(m, conn, request_id, job_id)
                }
                Timer::RetentionSweep => self.retention_sweep(m),
                Timer::RateDue => self.rate_due(m.now),
                Timer::RunAtDue => self.run_at_due(m),
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
                prefetch,
                running,
                finished,
                tasks,
                draining,
                queues,
            } => {
                let registration = Registration {
                    worker_id,
                    incarnation,
                    capacity,
                    prefetch,
                    running,
                    finished,
                    tasks,
                    draining,
                    queues,
                };
                self.register(m, conn, registration)
            }
            WorkerToCoordinator::Draining {} => match self.registry.worker_on(conn).cloned() {
                Some(worker) => self.worker_draining(m, &worker),
                None => self.reject_unregistered(m, conn),
            },
            WorkerToCoordinator::Progress {
                job_id,
                lease_id,
                note,
            } => match self.registry.worker_on(conn).cloned() {
                Some(worker) => self.note_progress(&worker, job_id, lease_id, &note),
                None => self.reject_unregistered(m, conn),
            },
            WorkerToCoordinator::Heartbeat {} => self.heartbeat(m, conn),
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
        self.answer_request(m, conn, message, false);
        self.schedule(m);
    }

    /// Answers a client request. `confirmed` says leadership was confirmed since it arrived;
    /// until then, an answer that reads the table (rather than proposing) waits for that.
    fn answer_request(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        message: ClientRequest,
        confirmed: bool,
    ) {
        let is_read = matches!(
            message,
            ClientRequest::Status { .. }
                | ClientRequest::Wait { .. }
                | ClientRequest::List { .. }
                | ClientRequest::Workers { .. }
                | ClientRequest::Queues { .. }
                // It picks its jobs from the table: confirm the table is current first.
                | ClientRequest::Purge { .. }
        );
        if is_read && !confirmed && m.reads_need_confirmation() {
            return self.confirm_then(
                m,
                Read::Request {
                    conn,
                    request: Box::new(message),
                },
            );
        }
        match message {
            // It takes the path of any job submitted: as the fields of a job.
            request @ ClientRequest::Submit { .. } => {
                let Some((request_id, submission)) = request.into_submission() else {
                    unreachable!("a SUBMIT holds a submission")
                };
                let to = SubmitTo::Request { conn, request_id };
                self.submit(m, to, submission, confirmed)
            }
            ClientRequest::SubmitBatch { request_id, jobs } => {
                self.submit_batch(m, conn, request_id, jobs, confirmed)
            }
            ClientRequest::Status { request_id, job_id } => match self.job_view(m, &job_id) {
                Some(job) => m.send_client(
                    conn,
                    ClientReply::Job {
                        request_id,
                        job: Box::new(job),
                    },
                ),
                None => self.job_not_found(m, conn, request_id, job_id),
            },
            ClientRequest::Wait {
                request_id,
                job_id,
                timeout_millis,
            } => self.wait(m, conn, request_id, job_id, timeout_millis),
            ClientRequest::Cancel { request_id, job_id } => {
                self.cancel(m, conn, request_id, job_id, confirmed)
            }
            ClientRequest::List {
                request_id,
                state,
                limit,
                before,
            } => self.list(m, conn, request_id, (state, limit), before),
            ClientRequest::Purge {
                request_id,
                state,
                older_than_millis,
            } => self.purge(
                m,
                conn,
                request_id,
                state,
                Duration::from_millis(older_than_millis),
            ),
            ClientRequest::Workers { request_id } => self.list_workers(m, conn, request_id),
            ClientRequest::Queues { request_id } => self.list_queues(m, conn, request_id),
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
            } => {
                let change = QueueChange {
                    weight,
                    paused,
                    aging_millis,
                    concurrency,
                    key_concurrency,
                    rate,
                    key_rate,
                    max_active_jobs,
                };
                self.set_queue(m, (conn, request_id), queue, change)
            }
            // Answered for any member by `Coordinator::client_message`, which never parks them
            // either, so they cannot reach the leader state.
            ClientRequest::Cluster { .. } | ClientRequest::TransferLeader { .. } => {
                unreachable!("group requests are answered before they reach the leader")
            }
        }
    }
}
