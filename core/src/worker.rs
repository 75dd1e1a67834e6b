//! The worker state machine: connect, register, heartbeat, accept attempts, report results until
//! they are acknowledged, obey cancels. It never runs a task itself: it asks its driver to
//! (`StartTask`), and the driver reports back (`handle_task_finished`).
//!
//! ```text
//!         ┌──────── backoff (full jitter) <──────────────┐
//!         v                                              │ connect failed / closed /
//!     Idle ──timer──> Connecting ──connected──> Registering ──REGISTERED──> Registered
//!                                                   │                          │
//!                                                   └── coordinator silent ────┘
//! ```
//!
//! Calling order for a driver:
//!
//! 1. Create with `Worker::new`, then drain `poll_output`: the first output is a `Connect`.
//! 2. Report what happened to that connection attempt with `handle_connected`,
//!    `handle_connect_failed` or `handle_disconnected`, always passing the `ConnectAttempt` the
//!    `Connect` carried; reports about an older attempt are ignored, so a late "closed" for a
//!    socket the machine already gave up on can never tear down the new one.
//! 3. Feed coordinator messages with `handle_message`, task completions with
//!    `handle_task_finished`, and call `handle_timeout` when `poll_timeout` is due.
//! 4. After every input, drain `poll_output`.
//!
//! Results survive a coordinator restart: each result is kept until `RESULT_ACK` names its lease,
//! and all unacknowledged results are sent again right after every successful registration.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use crate::dial::ConnectAttempt;
use crate::dial::{Dialer, RedirectRule};
use crate::ids::{Attempt, Incarnation, JobId, LeaseId, Term, WorkerId};
use crate::limits::{
    ATTEMPT_ERROR_BYTES_MAX, PREFETCH_PER_SLOT_MAX, PROGRESS_NOTE_BYTES_MAX, TASKS_PER_WORKER_MAX,
    WORKER_CAPACITY_MAX,
};
use crate::protocol::{
    builtin_task_names, AttemptOutcome, CoordinatorToWorker, ErrorCode, RunningAttempt,
    WorkerToCoordinator,
};
use crate::tasks::{check_served_name, TaskSpec};
use crate::text::cut_within;
use crate::time::{as_millis_u64, Instant};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    pub worker_id: WorkerId,
    pub capacity: u32,
    /// Assignments it may hold beyond `capacity`, waiting in order for a slot (at most
    /// [`PREFETCH_PER_SLOT_MAX`] per slot). The next job is then already here when a slot frees, instead of a round
    /// trip and a commit away.
    pub prefetch: u32,
    /// Coordinator worker-port addresses, tried in turn.
    pub coordinators: Vec<String>,
    /// Reconnect backoff: full jitter in `[0, min(reconnect_max, reconnect_base * 2^n)]`.
    pub reconnect_base: Duration,
    pub reconnect_max: Duration,
    /// How long to wait for a connection to open and registration to be answered.
    pub connect_timeout: Duration,
    /// The task kinds this worker serves: built-in kinds and user task names. It is given
    /// work of these kinds only.
    pub tasks: Vec<String>,
}

impl WorkerConfig {
    pub fn new(worker_id: WorkerId, capacity: u32, coordinators: Vec<String>) -> WorkerConfig {
        WorkerConfig {
            worker_id,
            capacity,
            prefetch: 0,
            coordinators,
            reconnect_base: Duration::from_millis(100),
            reconnect_max: Duration::from_millis(5_000),
            connect_timeout: Duration::from_millis(5_000),
            tasks: builtin_task_names(),
        }
    }

    pub fn validate(&self) -> Result<(), WorkerConfigError> {
        if !(1..=WORKER_CAPACITY_MAX).contains(&self.capacity) {
            return Err(WorkerConfigError::Capacity(self.capacity));
        }
        if self.prefetch > self.capacity.saturating_mul(PREFETCH_PER_SLOT_MAX) {
            return Err(WorkerConfigError::Prefetch {
                prefetch: self.prefetch,
                capacity: self.capacity,
            });
        }
        if self.coordinators.is_empty() {
            return Err(WorkerConfigError::NoCoordinators);
        }
        if self.reconnect_base.is_zero() || self.reconnect_base > self.reconnect_max {
            return Err(WorkerConfigError::Backoff);
        }
        if self.connect_timeout.is_zero() {
            return Err(WorkerConfigError::ConnectTimeout);
        }
        if self.tasks.is_empty() || self.tasks.len() > TASKS_PER_WORKER_MAX {
            return Err(WorkerConfigError::TaskCount(self.tasks.len()));
        }
        for name in &self.tasks {
            check_served_name(name)
                .map_err(|error| WorkerConfigError::TaskName(error.to_string()))?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkerConfigError {
    #[error("capacity must be between 1 and {WORKER_CAPACITY_MAX} (got {0})")]
    Capacity(u32),
    #[error("prefetch may be at most {PREFETCH_PER_SLOT_MAX} per slot ({} with capacity {capacity}), got {prefetch}", capacity.saturating_mul(PREFETCH_PER_SLOT_MAX))]
    Prefetch { prefetch: u32, capacity: u32 },
    #[error("at least one coordinator address is needed")]
    NoCoordinators,
    #[error("reconnect backoff base must be positive and not above its maximum")]
    Backoff,
    #[error("connect timeout must be positive")]
    ConnectTimeout,
    #[error("a worker serves 1 to {TASKS_PER_WORKER_MAX} task kinds (got {0})")]
    TaskCount(usize),
    #[error("{0}")]
    TaskName(String),
}

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
    StartTask {
        job_id: JobId,
        lease_id: LeaseId,
        attempt: Attempt,
        max_attempts: u32,
        task: TaskSpec,
        timeout: Duration,
    },
    /// Stop this attempt as soon as possible, then report it finished (`Cancelled` if stopped).
    /// After a drain handed the attempt back, its report is no longer needed (it is ignored).
    CancelTask {
        lease_id: LeaseId,
    },
    Event(WorkerEvent),
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

#[derive(Clone, Debug)]
struct RunningTask {
    job_id: JobId,
    cancel_requested: bool,
    /// A drain asked it to stop: unless it succeeds after all, it is reported `released`.
    releasing: bool,
    /// When the assignment arrived, by the driver's clock (for the log's run time).
    started: Instant,
}

/// An assignment held beyond the slots, waiting for one to free.
#[derive(Clone, Debug)]
struct WaitingTask {
    job_id: JobId,
    lease_id: LeaseId,
    attempt: Attempt,
    max_attempts: u32,
    task: TaskSpec,
    timeout: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Link {
    /// Not connected; try again at `retry_at`.
    Idle { retry_at: Instant },
    /// Waiting for the driver to open the connection, or for `REGISTERED`.
    Connecting {
        attempt: ConnectAttempt,
        opened: bool,
        give_up_at: Instant,
    },
    Registered {
        attempt: ConnectAttempt,
        heartbeat_interval: Duration,
        heartbeat_timeout: Duration,
        next_heartbeat: Instant,
        last_heard: Instant,
    },
}

/// The worker. See the module documentation for the calling order.
pub struct Worker {
    config: WorkerConfig,
    incarnation: Incarnation,
    rng: ChaCha8Rng,
    link: Link,
    /// Where to connect next, and the reconnect backoff. A leader redirect is kept until a
    /// connect fails or times out, or a `NOT_LEADER` names no leader.
    dialer: Dialer,
    running: BTreeMap<LeaseId, RunningTask>,
    /// Prefetched assignments in arrival order, each started as a slot frees (at most
    /// `config.prefetch`, and only while every slot is taken).
    waiting: VecDeque<WaitingTask>,
    /// Finished attempts whose results await `RESULT_ACK`.
    unacked: BTreeMap<LeaseId, (JobId, AttemptOutcome)>,
    /// The highest coordinator term heard from. Anything from an older term comes from a
    /// deposed leader and is ignored (its view of leases may be stale).
    highest_term: Term,
    /// Shutting down: no new work is accepted, and the coordinator is told so.
    draining: bool,
    /// A result went out since the last heartbeat was due: it shows the coordinator this worker
    /// is alive, so the next heartbeat is folded into it (not sent) if the coordinator was heard
    /// meanwhile too.
    result_since_heartbeat: bool,
    outputs: VecDeque<WorkerOutput>,
}

impl Worker {
    /// A worker process starting at `now`. Its incarnation is drawn from `seed`, so a restarted
    /// process (given a new seed) is told apart from a reconnecting one.
    pub fn new(config: WorkerConfig, seed: u64, now: Instant) -> Result<Worker, WorkerConfigError> {
        config.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let incarnation = Incarnation(rng.next_u64());
        let dialer = Dialer::new(config.coordinators.clone(), RedirectRule::Sticky);
        let mut worker = Worker {
            config,
            incarnation,
            rng,
            link: Link::Idle { retry_at: now },
            dialer,
            running: BTreeMap::new(),
            waiting: VecDeque::new(),
            unacked: BTreeMap::new(),
            highest_term: Term(0),
            draining: false,
            result_since_heartbeat: false,
            outputs: VecDeque::new(),
        };
        worker.connect(now);
        Ok(worker)
    }

    pub fn id(&self) -> &WorkerId {
        &self.config.worker_id
    }

    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    pub fn is_registered(&self) -> bool {
        matches!(self.link, Link::Registered { .. })
    }

    /// Attempts executing now.
    pub fn running(&self) -> impl Iterator<Item = (LeaseId, JobId)> + '_ {
        self.running
            .iter()
            .map(|(lease, task)| (*lease, task.job_id))
    }

    /// Prefetched attempts waiting for a slot, in the order they will start.
    pub fn waiting(&self) -> impl Iterator<Item = (LeaseId, JobId)> + '_ {
        self.waiting.iter().map(|w| (w.lease_id, w.job_id))
    }

    /// The task slots: at most this many attempts run at once.
    pub fn capacity(&self) -> u32 {
        self.config.capacity
    }

    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Draining, with nothing left running and every result acknowledged: the process can
    /// exit without costing any job an attempt.
    pub fn is_drained(&self) -> bool {
        self.draining
            && self.running.is_empty()
            && self.waiting.is_empty()
            && self.unacked.is_empty()
    }

    /// Begins a graceful shutdown: take no new work and tell the coordinator, so it assigns
    /// this worker nothing more. Running attempts go on; [`Worker::release_running`] hands
    /// back whatever is still running when the driver's drain timeout ends.
    pub fn begin_drain(&mut self, _now: Instant) {
        if self.draining {
            return;
        }
        self.draining = true;
        self.event(WorkerEvent::Draining {
            running: self.running.len(),
        });
        if self.is_registered() {
            self.send(WorkerToCoordinator::Draining {});
        }
        // What never started goes straight back: it costs its job no attempt.
        while let Some(waiting) = self.waiting.pop_front() {
            self.release(waiting.job_id, waiting.lease_id);
        }
    }

    /// The drain timeout passed: every attempt still running is asked to stop (`CancelTask`).
    /// Each is reported `released` once its driver says it stopped (or its result if it
    /// succeeded meanwhile), so no job runs on two workers because of a drain.
    pub fn stop_running(&mut self, _now: Instant) {
        assert!(self.draining, "attempts are stopped only by a drain");
        let mut stopping = Vec::new();
        for (lease_id, task) in &mut self.running {
            if !task.releasing {
                task.releasing = true;
                stopping.push(*lease_id);
            }
        }
        for lease_id in stopping {
            self.outputs
                .push_back(WorkerOutput::CancelTask { lease_id });
        }
    }

    /// Ends a drain: every attempt still running (one that ignored being stopped) is reported
    /// `released` at once, so the coordinator queues its job again without charging the
    /// attempt; the driver is about to exit, which ends it.
    pub fn release_running(&mut self, _now: Instant) {
        assert!(self.draining, "attempts are released only by a drain");
        let leases: Vec<LeaseId> = self.running.keys().copied().collect();
        for lease_id in leases {
            if let Some(task) = self.running.remove(&lease_id) {
                self.outputs
                    .push_back(WorkerOutput::CancelTask { lease_id });
                self.release(task.job_id, lease_id);
            }
        }
    }

    /// Records and sends a `released` result for an attempt this worker will not run.
    fn release(&mut self, job_id: JobId, lease_id: LeaseId) {
        self.event(WorkerEvent::TaskReleased { job_id, lease_id });
        self.record_result(job_id, lease_id, AttemptOutcome::Released {});
    }

    /// Reports how far a running attempt has come (sent only while registered; a note for an
    /// attempt that is not running here is dropped).
    pub fn report_progress(&mut self, lease_id: LeaseId, note: &str) {
        let Some(task) = self.running.get(&lease_id) else {
            return;
        };
        if self.is_registered() {
            let job_id = task.job_id;
            self.send(WorkerToCoordinator::Progress {
                job_id,
                lease_id,
                note: cut_within(note.to_owned(), PROGRESS_NOTE_BYTES_MAX),
            });
        }
    }

    /// Results not yet acknowledged.
    pub fn unacknowledged(&self) -> usize {
        self.unacked.len()
    }

    /// The attempts whose results await `RESULT_ACK`.
    pub fn unacknowledged_leases(&self) -> impl Iterator<Item = LeaseId> + '_ {
        self.unacked.keys().copied()
    }

    pub fn poll_output(&mut self) -> Option<WorkerOutput> {
        self.outputs.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.link {
            Link::Idle { retry_at } => Some(*retry_at),
            Link::Connecting { give_up_at, .. } => Some(*give_up_at),
            Link::Registered {
                next_heartbeat,
                last_heard,
                heartbeat_timeout,
                ..
            } => Some((*next_heartbeat).min(last_heard.saturating_add(*heartbeat_timeout))),
        }
    }

    fn current_attempt(&self) -> Option<ConnectAttempt> {
        match &self.link {
            Link::Idle { .. } => None,
            Link::Connecting { attempt, .. } | Link::Registered { attempt, .. } => Some(*attempt),
        }
    }

    fn event(&mut self, event: WorkerEvent) {
        self.outputs.push_back(WorkerOutput::Event(event));
    }

    fn send(&mut self, message: WorkerToCoordinator) {
        if matches!(message, WorkerToCoordinator::TaskResult { .. }) {
            self.result_since_heartbeat = true;
        }
        self.outputs.push_back(WorkerOutput::Send(message));
    }

    fn connect(&mut self, now: Instant) {
        let (attempt, address) = self.dialer.dial();
        self.link = Link::Connecting {
            attempt,
            opened: false,
            give_up_at: now.saturating_add(self.config.connect_timeout),
        };
        self.event(WorkerEvent::Connecting {
            address: address.clone(),
        });
        self.outputs
            .push_back(WorkerOutput::Connect { attempt, address });
    }

    /// Drops the connection (if any) and schedules the next attempt with backoff.
    fn back_off(&mut self, now: Instant, reason: String, close: bool) {
        if close {
            self.outputs.push_back(WorkerOutput::Close);
        }
        let delay = self.dialer.jittered_backoff(
            &mut self.rng,
            self.config.reconnect_base,
            self.config.reconnect_max,
        );
        self.link = Link::Idle {
            retry_at: now.saturating_add(delay),
        };
        self.event(WorkerEvent::Disconnected {
            reason,
            retry_in_millis: as_millis_u64(delay),
        });
    }

    pub fn handle_connected(&mut self, now: Instant, attempt: ConnectAttempt) {
        let Link::Connecting {
            attempt: current,
            opened,
            ..
        } = &mut self.link
        else {
            return;
        };
        if *current != attempt {
            return;
        }
        *opened = true;
        let _ = now;
        // Waiting attempts are held too; listed after the running ones, in the order they start.
        let running = self
            .running()
            .chain(self.waiting())
            .map(|(lease_id, job_id)| RunningAttempt { job_id, lease_id })
            .collect();
        let finished = self
            .unacked
            .iter()
            .map(|(lease_id, (job_id, _))| RunningAttempt {
                job_id: *job_id,
                lease_id: *lease_id,
            })
            .collect();
        self.send(WorkerToCoordinator::Register {
            worker_id: self.config.worker_id.clone(),
            incarnation: self.incarnation,
            capacity: self.config.capacity,
            prefetch: self.config.prefetch,
            running,
            finished,
            tasks: self.config.tasks.clone(),
            draining: self.draining,
        });
    }

    pub fn handle_connect_failed(&mut self, now: Instant, attempt: ConnectAttempt, reason: &str) {
        if self.current_attempt() != Some(attempt) {
            return;
        }
        self.dialer.forget_redirect();
        self.back_off(now, format!("connect failed: {reason}"), false);
    }

    pub fn handle_disconnected(&mut self, now: Instant, attempt: ConnectAttempt, reason: &str) {
        if self.current_attempt() != Some(attempt) {
            return;
        }
        self.back_off(now, format!("connection closed: {reason}"), false);
    }

    pub fn handle_message(
        &mut self,
        now: Instant,
        attempt: ConnectAttempt,
        message: CoordinatorToWorker,
    ) {
        if self.current_attempt() != Some(attempt) {
            return;
        }
        if let Some(term) = message.term() {
            if term < self.highest_term {
                let seen = self.highest_term;
                self.event(WorkerEvent::DeposedCoordinator { term, seen });
                self.dialer.forget_redirect();
                return self.back_off(now, "the coordinator was deposed".into(), true);
            }
            self.highest_term = term;
        }
        if let Link::Registered { last_heard, .. } = &mut self.link {
            *last_heard = now;
        }
        match message {
            CoordinatorToWorker::Registered {
                heartbeat_interval_millis,
                heartbeat_timeout_millis,
                members,
                ..
            } => {
                self.dialer.learn(members);
                self.on_registered(
                    now,
                    attempt,
                    heartbeat_interval_millis,
                    heartbeat_timeout_millis,
                )
            }
            CoordinatorToWorker::RegisterRejected { message, .. } => {
                self.event(WorkerEvent::RegistrationRejected {
                    message: message.clone(),
                });
                self.back_off(now, format!("registration rejected: {message}"), true);
            }
            CoordinatorToWorker::HeartbeatAck { .. } => {}
            CoordinatorToWorker::TaskAssign {
                job_id,
                lease_id,
                attempt,
                task,
                timeout_millis,
                max_attempts,
                ..
            } => self.on_assign(
                now,
                job_id,
                (lease_id, attempt, max_attempts),
                task,
                timeout_millis,
            ),
            CoordinatorToWorker::TaskCancel {
                job_id, lease_id, ..
            } => {
                if let Some(at) = self.waiting.iter().position(|w| w.lease_id == lease_id) {
                    // Never started: nothing to stop, only to report.
                    self.waiting.remove(at);
                    self.event(WorkerEvent::CancelRequested { job_id, lease_id });
                    return self.record_result(job_id, lease_id, AttemptOutcome::Cancelled {});
                }
                if let Some(task) = self.running.get_mut(&lease_id) {
                    if !task.cancel_requested {
                        task.cancel_requested = true;
                        self.event(WorkerEvent::CancelRequested { job_id, lease_id });
                        self.outputs
                            .push_back(WorkerOutput::CancelTask { lease_id });
                    }
                }
            }
            CoordinatorToWorker::ResultAck {
                job_id,
                lease_id,
                accepted,
                ..
            } => {
                if self.unacked.remove(&lease_id).is_some() {
                    self.event(WorkerEvent::ResultAcknowledged {
                        job_id,
                        lease_id,
                        accepted,
                    });
                }
            }
            CoordinatorToWorker::NotLeader { leader, members } => {
                self.dialer.learn(members);
                self.dialer.not_leader(leader);
                self.dialer.reset_failures();
                self.back_off(now, "coordinator is not the leader".into(), true);
            }
            CoordinatorToWorker::Error { code, message } => {
                self.event(WorkerEvent::CoordinatorError {
                    code,
                    message: message.clone(),
                });
                if code.closes_connection() || code == ErrorCode::NotRegistered {
                    self.back_off(now, format!("coordinator error {code:?}"), true);
                }
            }
        }
    }

    fn on_registered(
        &mut self,
        now: Instant,
        attempt: ConnectAttempt,
        interval_millis: u64,
        timeout_millis: u64,
    ) {
        // Never heartbeat slower than a third of the timeout, whatever the coordinator says.
        let heartbeat_timeout = Duration::from_millis(timeout_millis.max(1));
        let heartbeat_interval = Duration::from_millis(interval_millis.max(1))
            .min(heartbeat_timeout / 3)
            .max(Duration::from_millis(1));
        let address = self.dialer.current_address();
        self.link = Link::Registered {
            attempt,
            heartbeat_interval,
            heartbeat_timeout,
            next_heartbeat: now.saturating_add(heartbeat_interval),
            last_heard: now,
        };
        self.dialer.reset_failures();
        // A result sent on an earlier connection says nothing about this one.
        self.result_since_heartbeat = false;
        self.event(WorkerEvent::Registered { address });
        if self.draining {
            // A drain that began while `REGISTER` (saying otherwise) was on its way.
            self.send(WorkerToCoordinator::Draining {});
        }
        let results: Vec<_> = self
            .unacked
            .iter()
            .map(
                |(lease_id, (job_id, outcome))| WorkerToCoordinator::TaskResult {
                    job_id: *job_id,
                    lease_id: *lease_id,
                    outcome: outcome.clone(),
                },
            )
            .collect();
        for result in results {
            self.send(result);
        }
    }

    fn on_assign(
        &mut self,
        now: Instant,
        job_id: JobId,
        (lease_id, attempt, max_attempts): (LeaseId, Attempt, u32),
        task: TaskSpec,
        timeout_millis: u64,
    ) {
        if self.holds(lease_id) || self.unacked.contains_key(&lease_id) {
            return; // Already have it.
        }
        if self.draining {
            // Sent before the coordinator heard of the drain: hand it straight back.
            return self.release(job_id, lease_id);
        }
        let assignment = WaitingTask {
            job_id,
            lease_id,
            attempt,
            max_attempts,
            task,
            timeout: Duration::from_millis(timeout_millis),
        };
        let capacity = usize::try_from(self.config.capacity).unwrap_or(usize::MAX);
        let prefetch = usize::try_from(self.config.prefetch).unwrap_or(usize::MAX);
        if self.running.len() < capacity {
            return self.start(now, assignment);
        }
        if self.waiting.len() < prefetch {
            self.waiting.push_back(assignment);
            return;
        }
        // The coordinator counts slots too, so this means its view and ours disagree; refuse
        // rather than overcommit, and let the attempt be retried elsewhere.
        let reason = format!(
            "worker at capacity ({} of {} running, {} of {} waiting)",
            self.running.len(),
            capacity,
            self.waiting.len(),
            prefetch
        );
        self.event(WorkerEvent::TaskRefused {
            job_id,
            lease_id,
            reason: reason.clone(),
        });
        let outcome = AttemptOutcome::Failed {
            error: reason,
            permanent: false,
        };
        self.record_result(job_id, lease_id, outcome);
    }

    /// Whether `lease_id` is running or waiting here.
    fn holds(&self, lease_id: LeaseId) -> bool {
        self.running.contains_key(&lease_id) || self.waiting.iter().any(|w| w.lease_id == lease_id)
    }

    fn start(&mut self, now: Instant, assignment: WaitingTask) {
        let WaitingTask {
            job_id,
            lease_id,
            attempt,
            max_attempts,
            task,
            timeout,
        } = assignment;
        self.running.insert(
            lease_id,
            RunningTask {
                job_id,
                cancel_requested: false,
                releasing: false,
                started: now,
            },
        );
        assert!(
            self.running.len() <= self.config.capacity as usize,
            "worker {} runs {} attempts with {} slots",
            self.config.worker_id,
            self.running.len(),
            self.config.capacity
        );
        self.event(WorkerEvent::TaskStarted {
            job_id,
            lease_id,
            attempt,
            kind: task.kind().to_owned(),
        });
        self.outputs.push_back(WorkerOutput::StartTask {
            job_id,
            lease_id,
            attempt,
            max_attempts,
            task,
            timeout,
        });
    }

    /// Starts waiting attempts, oldest first, while slots are free.
    fn start_waiting(&mut self, now: Instant) {
        while self.running.len() < self.config.capacity as usize {
            let Some(next) = self.waiting.pop_front() else {
                return;
            };
            self.start(now, next);
        }
    }

    /// Keeps `outcome` until it is acknowledged, and sends it if registered (else it goes out
    /// after the next registration).
    fn record_result(&mut self, job_id: JobId, lease_id: LeaseId, outcome: AttemptOutcome) {
        self.unacked.insert(lease_id, (job_id, outcome.clone()));
        if self.is_registered() {
            self.send(WorkerToCoordinator::TaskResult {
                job_id,
                lease_id,
                outcome,
            });
        }
    }

    /// The driver finished (or stopped) an attempt.
    pub fn handle_task_finished(
        &mut self,
        now: Instant,
        lease_id: LeaseId,
        outcome: AttemptOutcome,
    ) {
        let Some(task) = self.running.remove(&lease_id) else {
            return;
        };
        let outcome = match outcome {
            // Stopped by a drain: handed back, whatever the handler made of being stopped.
            outcome if task.releasing && !matches!(outcome, AttemptOutcome::Succeeded { .. }) => {
                return self.release(task.job_id, lease_id);
            }
            AttemptOutcome::Succeeded { output } if output.oversize().is_some() => {
                // Sending it would only fail the job at the coordinator; fail it here, saying
                // why, and keep the frame small.
                let (bytes, max) = output.oversize().unwrap_or_default();
                AttemptOutcome::Failed {
                    error: format!(
                        "the result is {bytes} bytes as JSON; at most {max} bytes are kept (store large results elsewhere and return a reference)"
                    ),
                    permanent: true,
                }
            }
            AttemptOutcome::Failed { error, permanent } => AttemptOutcome::Failed {
                error: cut_within(error, ATTEMPT_ERROR_BYTES_MAX),
                permanent,
            },
            other => other,
        };
        let job_id = task.job_id;
        let summary = match &outcome {
            AttemptOutcome::Succeeded { output } => output.to_string(),
            AttemptOutcome::Failed {
                error,
                permanent: true,
            } => format!("failed permanently: {error}"),
            AttemptOutcome::Failed { error, .. } => format!("failed: {error}"),
            AttemptOutcome::Cancelled {} => "cancelled".to_owned(),
            AttemptOutcome::Released {} => "released".to_owned(),
        };
        self.event(WorkerEvent::TaskFinished {
            job_id,
            lease_id,
            outcome: summary,
            ran_millis: as_millis_u64(now.saturating_since(task.started)),
        });
        self.record_result(job_id, lease_id, outcome);
        self.start_waiting(now);
    }

    /// Handles every timer due at `now`. Afterwards `poll_timeout` lies strictly after `now`
    /// (handling one timer can arm another for the same instant, e.g. a reconnect backoff of
    /// zero), so a driver never has to call this twice for one instant.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Each pass moves the link forward (idle -> connecting, or re-arms a heartbeat), so a few
        // passes always suffice; the bound keeps a bug from becoming a hang.
        for _ in 0..8 {
            if self.poll_timeout().is_none_or(|at| at > now) {
                return;
            }
            self.handle_timeout_once(now);
        }
    }

    fn handle_timeout_once(&mut self, now: Instant) {
        match self.link.clone() {
            Link::Idle { retry_at } if retry_at <= now => self.connect(now),
            Link::Connecting {
                give_up_at, opened, ..
            } if give_up_at <= now => {
                self.dialer.forget_redirect();
                let reason = if opened {
                    "no answer to REGISTER"
                } else {
                    "connect timed out"
                };
                self.back_off(now, reason.into(), true);
            }
            Link::Registered {
                attempt,
                heartbeat_interval,
                heartbeat_timeout,
                next_heartbeat,
                last_heard,
            } => {
                if last_heard.saturating_add(heartbeat_timeout) <= now {
                    let silent = as_millis_u64(now.saturating_since(last_heard));
                    self.back_off(now, format!("coordinator silent for {silent} ms"), true);
                } else if next_heartbeat <= now {
                    // Folded into the traffic that flows anyway: a result sent during the
                    // interval stands for the heartbeat, but only if the coordinator was heard
                    // in it too. It answers a result only once the result is durable, so while
                    // its disk is behind, the heartbeat's immediate answer is what keeps this
                    // worker from taking it for silent.
                    let heard_in_interval =
                        last_heard.saturating_add(heartbeat_interval) >= next_heartbeat;
                    let result_sent = std::mem::take(&mut self.result_since_heartbeat);
                    if !(result_sent && heard_in_interval) {
                        self.send(WorkerToCoordinator::Heartbeat {});
                    }
                    self.link = Link::Registered {
                        attempt,
                        heartbeat_interval,
                        heartbeat_timeout,
                        next_heartbeat: now.saturating_add(heartbeat_interval),
                        last_heard,
                    };
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tasks::TaskOutput;
    use uuid::Uuid;

    fn worker() -> Worker {
        worker_with(0)
    }

    /// Worker w1 with two slots and `prefetch`, dialing a:1 then b:1.
    fn worker_with(prefetch: u32) -> Worker {
        let config = WorkerConfig {
            prefetch,
            ..WorkerConfig::new(
                WorkerId::parse("w1").expect("valid id"),
                2,
                vec!["a:1".into(), "b:1".into()],
            )
        };
        Worker::new(config, 9, Instant::ZERO).expect("valid config")
    }

    fn drain(worker: &mut Worker) -> Vec<WorkerOutput> {
        std::iter::from_fn(|| worker.poll_output())
            .filter(|o| !matches!(o, WorkerOutput::Event(_)))
            .collect()
    }

    fn connect_attempt(outputs: &[WorkerOutput]) -> (ConnectAttempt, String) {
        outputs
            .iter()
            .find_map(|o| match o {
                WorkerOutput::Connect { attempt, address } => Some((*attempt, address.clone())),
                _ => None,
            })
            .expect("a Connect output")
    }

    fn registered(worker: &mut Worker) -> ConnectAttempt {
        let (attempt, _) = connect_attempt(&drain(worker));
        worker.handle_connected(Instant::ZERO, attempt);
        drain(worker);
        worker.handle_message(
            Instant::ZERO,
            attempt,
            CoordinatorToWorker::Registered {
                term: Term(1),
                members: Vec::new(),
                heartbeat_interval_millis: 100,
                heartbeat_timeout_millis: 300,
            },
        );
        drain(worker);
        attempt
    }

    fn ids(n: u128) -> (JobId, LeaseId) {
        (
            JobId(Uuid::from_u128(n)),
            LeaseId(Uuid::from_u128(1000 + n)),
        )
    }

    fn assign(n: u128) -> CoordinatorToWorker {
        let (job_id, lease_id) = ids(n);
        CoordinatorToWorker::TaskAssign {
            term: Term(1),
            job_id,
            lease_id,
            attempt: Attempt(1),
            max_attempts: 3,
            task: TaskSpec::Sha256 { text: "abc".into() },
            timeout_millis: 1000,
        }
    }

    #[test]
    fn registers_with_its_incarnation_and_running_attempts() {
        let mut w = worker();
        let (attempt, address) = connect_attempt(&drain(&mut w));
        assert_eq!(address, "a:1");
        w.handle_connected(Instant::ZERO, attempt);
        match drain(&mut w).as_slice() {
            [WorkerOutput::Send(WorkerToCoordinator::Register {
                tasks: _,
                draining: _,
                worker_id,
                incarnation,
                capacity,
                prefetch: _,
                running,
                finished,
            })] => {
                assert!(finished.is_empty());
                assert_eq!(worker_id.as_str(), "w1");
                assert_eq!(*incarnation, w.incarnation());
                assert_eq!(*capacity, 2);
                assert!(running.is_empty());
            }
            other => panic!("expected one REGISTER, got {other:?}"),
        }
    }

    #[test]
    fn heartbeats_on_schedule_and_reconnects_when_the_coordinator_goes_silent() {
        let mut w = worker();
        let attempt = registered(&mut w);
        assert_eq!(w.poll_timeout(), Some(Instant::from_millis(100)));
        w.handle_timeout(Instant::from_millis(100));
        assert_eq!(
            drain(&mut w),
            vec![WorkerOutput::Send(WorkerToCoordinator::Heartbeat {})]
        );
        w.handle_message(
            Instant::from_millis(150),
            attempt,
            CoordinatorToWorker::HeartbeatAck { term: Term(1) },
        );
        w.handle_timeout(Instant::from_millis(200));
        assert_eq!(
            drain(&mut w),
            vec![WorkerOutput::Send(WorkerToCoordinator::Heartbeat {})]
        );
        // Nothing heard since 150 ms; the timeout is 300 ms.
        w.handle_timeout(Instant::from_millis(450));
        assert_eq!(drain(&mut w), vec![WorkerOutput::Close]);
        assert!(!w.is_registered());
        let retry_at = w.poll_timeout().expect("a reconnect timer");
        w.handle_timeout(retry_at);
        let (_, address) = connect_attempt(&drain(&mut w));
        assert_eq!(address, "b:1", "fails over to the next address");
    }

    /// Job `n`'s attempt ends, failed, at `at`; what it sends is drained.
    fn fail_attempt(w: &mut Worker, n: u128, at: u64) -> Vec<WorkerOutput> {
        w.handle_task_finished(
            Instant::from_millis(at),
            ids(n).1,
            AttemptOutcome::Failed {
                error: "boom".into(),
                permanent: false,
            },
        );
        drain(w)
    }

    fn heartbeat() -> Vec<WorkerOutput> {
        vec![WorkerOutput::Send(WorkerToCoordinator::Heartbeat {})]
    }

    #[test]
    fn a_heartbeat_due_after_a_result_is_folded_into_it_and_the_next_is_sent_again() {
        let mut w = worker();
        let attempt = registered(&mut w);
        w.handle_message(Instant::from_millis(10), attempt, assign(1));
        drain(&mut w);
        let (job_id, lease_id) = ids(1);
        let sent = fail_attempt(&mut w, 1, 20);
        assert!(
            sent.iter().any(|o| matches!(
                o,
                WorkerOutput::Send(WorkerToCoordinator::TaskResult { .. })
            )),
            "the result goes out: {sent:?}"
        );
        // The coordinator answers the result within the interval.
        w.handle_message(
            Instant::from_millis(60),
            attempt,
            CoordinatorToWorker::ResultAck {
                term: Term(1),
                job_id,
                lease_id,
                accepted: true,
            },
        );
        drain(&mut w);
        // The heartbeat due at 100 ms stands in the result: nothing is sent, the next is armed.
        w.handle_timeout(Instant::from_millis(100));
        assert_eq!(drain(&mut w), Vec::new());
        assert_eq!(w.poll_timeout(), Some(Instant::from_millis(200)));
        // Nothing went out during this interval: its heartbeat is sent.
        w.handle_timeout(Instant::from_millis(200));
        assert_eq!(drain(&mut w), heartbeat());
    }

    #[test]
    fn a_result_not_yet_answered_does_not_stand_in_for_the_heartbeat() {
        // A coordinator answers a result only once it is durable; while its disk is behind,
        // only the heartbeat's answer shows the worker it is alive.
        let mut w = worker();
        let attempt = registered(&mut w);
        // Last heard at 90 ms; the heartbeat of the first interval goes out unanswered.
        w.handle_message(Instant::from_millis(90), attempt, assign(1));
        drain(&mut w);
        w.handle_timeout(Instant::from_millis(100));
        assert_eq!(drain(&mut w), heartbeat());
        // A result in the second interval, and nothing heard in it.
        fail_attempt(&mut w, 1, 120);
        w.handle_timeout(Instant::from_millis(200));
        assert_eq!(drain(&mut w), heartbeat());
    }

    #[test]
    fn runs_assignments_within_capacity_and_refuses_beyond_it() {
        let mut w = worker();
        let attempt = registered(&mut w);
        for n in 1..=3 {
            w.handle_message(Instant::ZERO, attempt, assign(n));
        }
        let outputs = drain(&mut w);
        assert_eq!(started(&outputs).len(), 2);
        let (job3, lease3) = ids(3);
        assert!(
            outputs.contains(&WorkerOutput::Send(WorkerToCoordinator::TaskResult {
                job_id: job3,
                lease_id: lease3,
                outcome: AttemptOutcome::Failed {
                    permanent: false,
                    error: "worker at capacity (2 of 2 running, 0 of 0 waiting)".into()
                },
            }))
        );
        // A duplicate assignment of a lease already running is ignored.
        w.handle_message(Instant::ZERO, attempt, assign(1));
        assert!(drain(&mut w).is_empty());
    }

    #[test]
    fn results_are_retransmitted_after_reregistration_until_acknowledged() {
        let mut w = worker();
        let attempt = registered(&mut w);
        w.handle_message(Instant::ZERO, attempt, assign(1));
        drain(&mut w);
        let (job_id, lease_id) = ids(1);
        let output = TaskOutput::Sha256 { hex: "x".into() };
        // The connection drops before the task finishes.
        w.handle_disconnected(Instant::from_millis(10), attempt, "reset");
        drain(&mut w);
        w.handle_task_finished(
            Instant::from_millis(20),
            lease_id,
            AttemptOutcome::Succeeded {
                output: output.clone(),
            },
        );
        assert!(
            drain(&mut w).is_empty(),
            "nothing can be sent while disconnected"
        );
        assert_eq!(w.unacknowledged(), 1);
        // Reconnect: the result goes out right after REGISTERED.
        let retry_at = w.poll_timeout().expect("reconnect timer");
        w.handle_timeout(retry_at);
        let (second, _) = connect_attempt(&drain(&mut w));
        w.handle_connected(retry_at, second);
        drain(&mut w);
        w.handle_message(
            retry_at,
            second,
            CoordinatorToWorker::Registered {
                term: Term(1),
                members: Vec::new(),
                heartbeat_interval_millis: 100,
                heartbeat_timeout_millis: 300,
            },
        );
        let result = WorkerToCoordinator::TaskResult {
            job_id,
            lease_id,
            outcome: AttemptOutcome::Succeeded { output },
        };
        assert_eq!(drain(&mut w), vec![WorkerOutput::Send(result)]);
        w.handle_message(
            retry_at,
            second,
            CoordinatorToWorker::ResultAck {
                term: Term(1),
                job_id,
                lease_id,
                accepted: true,
            },
        );
        assert_eq!(w.unacknowledged(), 0);
        // A late report about the first connection is ignored.
        w.handle_disconnected(retry_at, attempt, "late");
        assert!(w.is_registered());
    }

    #[test]
    fn long_failure_messages_are_cut_to_fit_a_frame() {
        let mut w = worker();
        let attempt = registered(&mut w);
        w.handle_message(Instant::ZERO, attempt, assign(1));
        drain(&mut w);
        let (_, lease_id) = ids(1);
        let error = "é".repeat(ATTEMPT_ERROR_BYTES_MAX);
        w.handle_task_finished(
            Instant::ZERO,
            lease_id,
            AttemptOutcome::Failed {
                permanent: false,
                error,
            },
        );
        let sent = drain(&mut w);
        let [WorkerOutput::Send(WorkerToCoordinator::TaskResult {
            outcome:
                AttemptOutcome::Failed {
                    permanent: _,
                    error,
                },
            ..
        })] = sent.as_slice()
        else {
            panic!("one result expected, got {sent:?}")
        };
        assert!(
            error.len() <= ATTEMPT_ERROR_BYTES_MAX && error.len() >= ATTEMPT_ERROR_BYTES_MAX - 1
        );
    }

    #[test]
    fn cancel_stops_a_running_task_once() {
        let mut w = worker();
        let attempt = registered(&mut w);
        w.handle_message(Instant::ZERO, attempt, assign(1));
        drain(&mut w);
        let (job_id, lease_id) = ids(1);
        let cancel = CoordinatorToWorker::TaskCancel {
            term: Term(1),
            job_id,
            lease_id,
            reason: crate::protocol::CancelReason::JobCancelled,
        };
        w.handle_message(Instant::ZERO, attempt, cancel.clone());
        assert_eq!(drain(&mut w), vec![WorkerOutput::CancelTask { lease_id }]);
        w.handle_message(Instant::ZERO, attempt, cancel);
        assert!(drain(&mut w).is_empty(), "a second cancel is not repeated");
        w.handle_task_finished(Instant::ZERO, lease_id, AttemptOutcome::Cancelled {});
        assert_eq!(
            drain(&mut w),
            vec![WorkerOutput::Send(WorkerToCoordinator::TaskResult {
                job_id,
                lease_id,
                outcome: AttemptOutcome::Cancelled {},
            })]
        );
    }

    #[test]
    fn a_drain_hands_back_what_is_still_running_and_refuses_new_work() {
        let mut w = worker();
        let attempt = registered(&mut w);
        w.handle_message(Instant::ZERO, attempt, assign(1));
        w.handle_message(Instant::ZERO, attempt, assign(2));
        drain(&mut w);
        w.begin_drain(Instant::ZERO);
        assert_eq!(
            drain(&mut w),
            vec![WorkerOutput::Send(WorkerToCoordinator::Draining {})]
        );
        assert!(!w.is_drained());
        // Attempt 1 finishes within the drain; an assignment that crossed the drain on the wire
        // is handed straight back without running.
        let (job_1, lease_1) = ids(1);
        let output = crate::tasks::TaskOutput::Sha256 { hex: "ok".into() };
        w.handle_task_finished(Instant::ZERO, lease_1, AttemptOutcome::Succeeded { output });
        drain(&mut w);
        w.handle_message(Instant::ZERO, attempt, assign(3));
        let (job_3, lease_3) = ids(3);
        let released = |job_id, lease_id| {
            WorkerOutput::Send(WorkerToCoordinator::TaskResult {
                job_id,
                lease_id,
                outcome: AttemptOutcome::Released {},
            })
        };
        assert_eq!(drain(&mut w), vec![released(job_3, lease_3)]);
        // The drain timeout ends: attempt 2 is asked to stop, and handed back only once it has
        // (so it never runs on two workers at once because of the drain).
        let (job_2, lease_2) = ids(2);
        w.stop_running(Instant::ZERO);
        assert_eq!(
            drain(&mut w),
            vec![WorkerOutput::CancelTask { lease_id: lease_2 }]
        );
        assert_eq!(w.running().count(), 1);
        w.handle_task_finished(Instant::ZERO, lease_2, AttemptOutcome::Cancelled {});
        assert_eq!(drain(&mut w), vec![released(job_2, lease_2)]);
        // A second stop, or the forced release, finds nothing left to hand back.
        w.stop_running(Instant::ZERO);
        w.release_running(Instant::ZERO);
        assert!(drain(&mut w).is_empty());
        for (job_id, lease_id) in [(job_1, lease_1), (job_2, lease_2), (job_3, lease_3)] {
            assert!(!w.is_drained());
            let ack = CoordinatorToWorker::ResultAck {
                term: Term(1),
                job_id,
                lease_id,
                accepted: true,
            };
            w.handle_message(Instant::ZERO, attempt, ack);
        }
        assert!(w.is_drained());
    }

    #[test]
    fn an_attempt_that_ignores_being_stopped_is_released_when_the_drain_gives_up() {
        let mut w = worker();
        let attempt = registered(&mut w);
        w.handle_message(Instant::ZERO, attempt, assign(1));
        drain(&mut w);
        let (job_id, lease_id) = ids(1);
        w.begin_drain(Instant::ZERO);
        w.stop_running(Instant::ZERO);
        drain(&mut w);
        w.release_running(Instant::ZERO);
        assert_eq!(
            drain(&mut w),
            vec![
                WorkerOutput::CancelTask { lease_id },
                WorkerOutput::Send(WorkerToCoordinator::TaskResult {
                    job_id,
                    lease_id,
                    outcome: AttemptOutcome::Released {},
                })
            ]
        );
        // An assignment that reaches it afterwards is handed straight back, unstarted.
        w.handle_message(Instant::ZERO, attempt, assign(2));
        let (job_2, lease_2) = ids(2);
        assert_eq!(
            drain(&mut w),
            vec![WorkerOutput::Send(WorkerToCoordinator::TaskResult {
                job_id: job_2,
                lease_id: lease_2,
                outcome: AttemptOutcome::Released {},
            })],
            "a draining worker starts nothing new"
        );
    }

    #[test]
    fn a_drain_that_begins_while_registering_is_announced_once_registered() {
        let mut w = worker();
        let (attempt, _) = connect_attempt(&drain(&mut w));
        w.handle_connected(Instant::ZERO, attempt);
        drain(&mut w); // REGISTER, saying it is not draining
        w.begin_drain(Instant::ZERO);
        assert!(
            drain(&mut w).is_empty(),
            "not registered yet: nothing to send"
        );
        w.handle_message(
            Instant::ZERO,
            attempt,
            CoordinatorToWorker::Registered {
                term: Term(1),
                members: Vec::new(),
                heartbeat_interval_millis: 100,
                heartbeat_timeout_millis: 300,
            },
        );
        assert!(drain(&mut w).contains(&WorkerOutput::Send(WorkerToCoordinator::Draining {})));
    }

    #[test]
    fn progress_is_reported_only_for_a_running_attempt_and_cut_to_its_bound() {
        let mut w = worker();
        let attempt = registered(&mut w);
        w.handle_message(Instant::ZERO, attempt, assign(1));
        drain(&mut w);
        let (job_id, lease_id) = ids(1);
        let long = "x".repeat(crate::limits::PROGRESS_NOTE_BYTES_MAX + 10);
        w.report_progress(lease_id, &long);
        match drain(&mut w).as_slice() {
            [WorkerOutput::Send(WorkerToCoordinator::Progress {
                job_id: reported,
                note,
                ..
            })] => {
                assert_eq!(*reported, job_id);
                assert_eq!(note.len(), crate::limits::PROGRESS_NOTE_BYTES_MAX);
            }
            other => panic!("expected one progress report, got {other:?}"),
        }
        let (_, not_running) = ids(2);
        w.report_progress(not_running, "ghost");
        assert!(drain(&mut w).is_empty());
    }

    #[test]
    fn a_worker_that_reconnects_while_draining_says_so_in_its_registration() {
        let mut w = worker();
        w.begin_drain(Instant::ZERO);
        let (attempt, _) = connect_attempt(&drain(&mut w));
        w.handle_connected(Instant::ZERO, attempt);
        match drain(&mut w).as_slice() {
            [WorkerOutput::Send(WorkerToCoordinator::Register { draining, .. })] => {
                assert!(*draining)
            }
            other => panic!("expected a registration, got {other:?}"),
        }
    }

    #[test]
    fn an_oversized_result_is_reported_as_a_permanent_failure() {
        let mut w = worker();
        let attempt = registered(&mut w);
        w.handle_message(Instant::ZERO, attempt, assign(1));
        drain(&mut w);
        let (job_id, lease_id) = ids(1);
        let value = serde_json::json!("x".repeat(crate::limits::TASK_RESULT_BYTES_MAX));
        let output = crate::tasks::TaskOutput::Value { value };
        w.handle_task_finished(
            Instant::ZERO,
            lease_id,
            AttemptOutcome::Succeeded { output },
        );
        match drain(&mut w).as_slice() {
            [WorkerOutput::Send(WorkerToCoordinator::TaskResult {
                job_id: reported,
                outcome: AttemptOutcome::Failed { error, permanent },
                ..
            })] => {
                assert_eq!(*reported, job_id);
                assert!(*permanent);
                assert!(error.contains("reference"), "{error}");
            }
            other => panic!("expected a permanent failure, got {other:?}"),
        }
    }

    #[test]
    fn a_rejected_registration_backs_off_and_tries_again() {
        let mut w = worker();
        let (attempt, _) = connect_attempt(&drain(&mut w));
        w.handle_connected(Instant::ZERO, attempt);
        drain(&mut w);
        w.handle_message(
            Instant::ZERO,
            attempt,
            CoordinatorToWorker::RegisterRejected {
                reason: crate::protocol::RegisterRejection::DuplicateWorkerId,
                message: "taken".into(),
            },
        );
        assert_eq!(drain(&mut w), vec![WorkerOutput::Close]);
        let retry_at = w.poll_timeout().expect("retry timer");
        assert!(
            retry_at <= Instant::from_millis(100),
            "first backoff is at most the base"
        );
        w.handle_timeout(retry_at);
        connect_attempt(&drain(&mut w));
    }

    #[test]
    fn same_seed_same_incarnation_different_seed_different_one() {
        let config = WorkerConfig::new(WorkerId::parse("w").expect("id"), 1, vec!["a".into()]);
        let a = Worker::new(config.clone(), 1, Instant::ZERO).expect("config");
        let b = Worker::new(config.clone(), 1, Instant::ZERO).expect("config");
        let c = Worker::new(config, 2, Instant::ZERO).expect("config");
        assert_eq!(a.incarnation(), b.incarnation());
        assert_ne!(a.incarnation(), c.incarnation());
    }

    fn prefetching_worker() -> Worker {
        worker_with(2)
    }

    fn started(outputs: &[WorkerOutput]) -> Vec<LeaseId> {
        outputs
            .iter()
            .filter_map(|o| match o {
                WorkerOutput::StartTask { lease_id, .. } => Some(*lease_id),
                _ => None,
            })
            .collect()
    }

    fn result_of(outputs: &[WorkerOutput], lease: LeaseId) -> Option<&AttemptOutcome> {
        outputs.iter().find_map(|o| match o {
            WorkerOutput::Send(WorkerToCoordinator::TaskResult {
                lease_id, outcome, ..
            }) if *lease_id == lease => Some(outcome),
            _ => None,
        })
    }

    #[test]
    fn prefetch_is_bounded_per_slot() {
        let config = WorkerConfig {
            prefetch: 9,
            ..WorkerConfig::new(WorkerId::parse("w1").expect("id"), 2, vec!["a:1".into()])
        };
        assert_eq!(
            config.validate(),
            Err(WorkerConfigError::Prefetch {
                prefetch: 9,
                capacity: 2
            })
        );
    }

    #[test]
    fn a_prefetching_worker_holds_assignments_beyond_its_slots_and_starts_them_in_order() {
        let mut w = prefetching_worker();
        let attempt = registered(&mut w);
        for n in 1..=5 {
            w.handle_message(Instant::ZERO, attempt, assign(n));
        }
        let outputs = drain(&mut w);
        assert_eq!(started(&outputs), vec![ids(1).1, ids(2).1]);
        let waiting: Vec<LeaseId> = w.waiting().map(|(lease, _)| lease).collect();
        assert_eq!(waiting, vec![ids(3).1, ids(4).1]);
        assert_eq!(
            result_of(&outputs, ids(5).1),
            Some(&AttemptOutcome::Failed {
                permanent: false,
                error: "worker at capacity (2 of 2 running, 2 of 2 waiting)".into()
            })
        );
        // A lease already waiting is not taken twice.
        w.handle_message(Instant::ZERO, attempt, assign(3));
        assert!(drain(&mut w).is_empty());
        // Each slot that frees starts the oldest waiting attempt, after the result goes out.
        let done = AttemptOutcome::Succeeded {
            output: TaskOutput::Sha256 { hex: "x".into() },
        };
        w.handle_task_finished(Instant::from_millis(5), ids(2).1, done.clone());
        let outputs = drain(&mut w);
        assert_eq!(result_of(&outputs, ids(2).1), Some(&done));
        assert_eq!(started(&outputs), vec![ids(3).1]);
        w.handle_task_finished(Instant::from_millis(6), ids(1).1, done);
        assert_eq!(started(&drain(&mut w)), vec![ids(4).1]);
        assert_eq!(w.waiting().count(), 0);
        assert_eq!(w.running().count(), 2);
    }

    #[test]
    fn a_reconnecting_worker_reports_its_waiting_attempts_after_its_running_ones() {
        let mut w = prefetching_worker();
        let attempt = registered(&mut w);
        for n in [4, 3, 2] {
            w.handle_message(Instant::ZERO, attempt, assign(n));
        }
        drain(&mut w);
        w.handle_disconnected(Instant::ZERO, attempt, "reset");
        w.handle_timeout(Instant::from_millis(10_000));
        let (attempt, _) = connect_attempt(&drain(&mut w));
        w.handle_connected(Instant::from_millis(10_000), attempt);
        match drain(&mut w).as_slice() {
            [WorkerOutput::Send(WorkerToCoordinator::Register {
                prefetch, running, ..
            })] => {
                assert_eq!(*prefetch, 2);
                let leases: Vec<LeaseId> = running.iter().map(|a| a.lease_id).collect();
                // Running ones in lease order, then the waiting one.
                assert_eq!(leases, vec![ids(3).1, ids(4).1, ids(2).1]);
            }
            other => panic!("expected one REGISTER, got {other:?}"),
        }
    }

    #[test]
    fn a_waiting_attempt_is_cancelled_without_running_and_a_drain_hands_the_rest_back() {
        let mut w = prefetching_worker();
        let attempt = registered(&mut w);
        for n in 1..=4 {
            w.handle_message(Instant::ZERO, attempt, assign(n));
        }
        drain(&mut w);
        let (job3, lease3) = ids(3);
        w.handle_message(
            Instant::ZERO,
            attempt,
            CoordinatorToWorker::TaskCancel {
                term: Term(1),
                job_id: job3,
                lease_id: lease3,
                reason: crate::protocol::CancelReason::LeaseNotCurrent,
            },
        );
        let outputs = drain(&mut w);
        // Nothing to stop: it never started. Its report says so at once.
        assert_eq!(
            outputs,
            vec![WorkerOutput::Send(WorkerToCoordinator::TaskResult {
                job_id: job3,
                lease_id: lease3,
                outcome: AttemptOutcome::Cancelled {},
            })]
        );
        w.begin_drain(Instant::ZERO);
        let outputs = drain(&mut w);
        assert_eq!(
            result_of(&outputs, ids(4).1),
            Some(&AttemptOutcome::Released {})
        );
        assert!(started(&outputs).is_empty());
        assert_eq!(w.waiting().count(), 0);
        // What runs goes on; a slot freeing now starts nothing.
        w.handle_task_finished(Instant::ZERO, ids(1).1, AttemptOutcome::Cancelled {});
        assert!(started(&drain(&mut w)).is_empty());
    }
}
