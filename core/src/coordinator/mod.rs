//! The coordinator state machine.
//!
//! ```text
//!  inputs (handle_*)                       Coordinator                          outputs (poll_output)
//!  ─────────────────                ┌───────────────────────────┐               ───────────────────
//!  worker message ───────────┐      │ leader soft state:        │   propose     Persist(batch) ──> disk
//!  client message ───────────┼────> │  registry, timers, waits, ├──> CommandLog
//!  connection closed/garbled ┘      │  in-flight proposals      │       │
//!  timer due (handle_timeout)──────>│                           │       │ handle_persisted(batch)
//!                                   │                           │       v
//!                                   │ JobTable  <── apply ── committed entries
//!                                   └──────────┬────────────────┘
//!                                              └──> ToWorker / ToClient / Close / Event
//! ```
//!
//! Calling order for a driver:
//!
//! 1. Feed one input: `handle_worker_message`, `handle_client_message`, `handle_malformed`,
//!    `handle_closed`, `handle_timeout` (when `poll_timeout` is due) or `handle_persisted`.
//! 2. Drain `poll_output` until it returns `None`. Perform sends and closes in order. Write each
//!    `Persist` batch durably, in order (several may be merged into one transaction), and then
//!    call `handle_persisted` with the highest batch id that is durable.
//! 3. Sleep until `poll_timeout`, the next input, or shutdown.
//!
//! **Durability before visibility.** A state change is only ever revealed to another node by
//! applying a committed log entry, and an entry is committed only once it is durable. Replies to
//! clients, assignments and cancels to workers and result acknowledgements are all produced while
//! applying, so no such output can leave before the records it depends on are on disk. Reads
//! (`STATUS`, `LIST`) are answered from the applied table, which holds only durable state.
//!
//! Leader soft state (worker liveness, slots, deadlines, backoff timers, parked waits) is not
//! persisted. After a restart it is rebuilt conservatively: running attempts get a re-adoption
//! window, backoffs restart from the moment of recovery.

mod disk_image;
mod events;
mod registry;
mod timers;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use disk_image::DiskImage;
pub use events::{Event, LossReason};
pub use registry::WorkerEntry;

use crate::command::{Applied, Command, JobTable, LogEntry, TableError};
use crate::ids::{
    ConnectionId, Incarnation, JobId, LeaseId, LogIndex, NodeId, RequestId, Term, WorkerId,
};
use crate::job::{Job, JobState, Lease};
use crate::limits::{
    ACTIVE_JOBS_CEILING, ASSIGN_ENVELOPE_BYTES, ATTEMPTS_MAX, ATTEMPT_ERROR_BYTES_MAX,
    CONFIG_MILLIS_MAX, FRAME_BYTES_MAX_CEILING, FRAME_BYTES_MAX_DEFAULT, FRAME_BYTES_MIN,
    IDEMPOTENCY_KEY_BYTES_MAX, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, MATERIALIZE_DIRTY_JOBS_MAX,
    MATERIALIZE_LOG_ENTRIES_MAX, PARTITIONS_MAX, PARTITION_VIEW_BYTES_MAX,
    PERSIST_BATCH_RECORDS_MAX, REPORTED_FINISHED_MAX, WAITERS_MAX, WAIT_MILLIS_MAX, WORKERS_MAX,
    WORKER_CAPACITY_MAX,
};
use crate::protocol::codec::FrameError;
use crate::protocol::{
    AttemptOutcome, CancelReason, ClientReply, ClientRequest, CoordinatorToWorker, ErrorCode,
    Partitions, RegisterRejection, RunningAttempt, WorkerToCoordinator,
};
use crate::tasks::TaskSpec;
use crate::time::{as_millis_u64, Instant};
use registry::Registry;
use timers::{Timer, TimerKey, TimerQueue};

/// How a coordinator behaves. Defaults are SPEC section 3's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoordinatorConfig {
    pub node_id: NodeId,
    /// Deadline of one attempt, measured on this coordinator's clock from assignment.
    pub task_timeout: Duration,
    /// How often workers are told to heartbeat.
    pub heartbeat_interval: Duration,
    /// Silence after which a worker is declared lost.
    pub heartbeat_timeout: Duration,
    /// Attempts a job gets when its submission does not say.
    pub default_max_attempts: u32,
    /// Retry backoff: full jitter in `[0, min(retry_max, retry_base * 2^(attempt-1))]`.
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// Admission limit on non-terminal jobs.
    pub max_active_jobs: u64,
    /// After recovery, how long a running attempt waits for its worker to come back and report
    /// it. `None` means one heartbeat timeout.
    pub readoption_window: Option<Duration>,
    /// The frame limit of this coordinator's links: a task whose assignment could not be framed
    /// is refused at submission instead of failing every worker it is sent to.
    pub max_frame_bytes: usize,
}

impl Default for CoordinatorConfig {
    fn default() -> CoordinatorConfig {
        CoordinatorConfig {
            node_id: NodeId("coordinator-1".to_owned()),
            task_timeout: Duration::from_millis(600_000),
            heartbeat_interval: Duration::from_millis(2_000),
            heartbeat_timeout: Duration::from_millis(6_000),
            default_max_attempts: 3,
            retry_base: Duration::from_millis(1_000),
            retry_max: Duration::from_millis(60_000),
            max_active_jobs: 10_000,
            readoption_window: None,
            max_frame_bytes: FRAME_BYTES_MAX_DEFAULT,
        }
    }
}

/// A configuration that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{name} must be between 1 and {CONFIG_MILLIS_MAX} ms (got {millis} ms)")]
    DurationOutOfRange { name: &'static str, millis: u128 },
    #[error("the heartbeat interval ({interval} ms) must be shorter than the heartbeat timeout ({timeout} ms)")]
    HeartbeatIntervalNotBelowTimeout { interval: u128, timeout: u128 },
    #[error("the retry base ({base} ms) must not exceed the retry maximum ({max} ms)")]
    RetryBaseAboveMax { base: u128, max: u128 },
    #[error("max attempts must be between 1 and {ATTEMPTS_MAX} (got {0})")]
    MaxAttemptsOutOfRange(u32),
    #[error("max active jobs must be between 1 and {ACTIVE_JOBS_CEILING} (got {0})")]
    MaxActiveJobsOutOfRange(u64),
    #[error(
        "max frame bytes must be between {FRAME_BYTES_MIN} and {FRAME_BYTES_MAX_CEILING} (got {0})"
    )]
    MaxFrameBytesOutOfRange(usize),
}

impl CoordinatorConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let durations = [
            ("task timeout", self.task_timeout),
            ("heartbeat interval", self.heartbeat_interval),
            ("heartbeat timeout", self.heartbeat_timeout),
            ("retry base", self.retry_base),
            ("retry max", self.retry_max),
            ("re-adoption window", self.readoption_window()),
        ];
        for (name, duration) in durations {
            let millis = duration.as_millis();
            if millis == 0 || millis > u128::from(CONFIG_MILLIS_MAX) {
                return Err(ConfigError::DurationOutOfRange { name, millis });
            }
        }
        if self.heartbeat_interval >= self.heartbeat_timeout {
            return Err(ConfigError::HeartbeatIntervalNotBelowTimeout {
                interval: self.heartbeat_interval.as_millis(),
                timeout: self.heartbeat_timeout.as_millis(),
            });
        }
        if self.retry_base > self.retry_max {
            return Err(ConfigError::RetryBaseAboveMax {
                base: self.retry_base.as_millis(),
                max: self.retry_max.as_millis(),
            });
        }
        if !(1..=ATTEMPTS_MAX).contains(&self.default_max_attempts) {
            return Err(ConfigError::MaxAttemptsOutOfRange(
                self.default_max_attempts,
            ));
        }
        if !(1..=ACTIVE_JOBS_CEILING).contains(&self.max_active_jobs) {
            return Err(ConfigError::MaxActiveJobsOutOfRange(self.max_active_jobs));
        }
        if !(FRAME_BYTES_MIN..=FRAME_BYTES_MAX_CEILING).contains(&self.max_frame_bytes) {
            return Err(ConfigError::MaxFrameBytesOutOfRange(self.max_frame_bytes));
        }
        Ok(())
    }

    pub fn readoption_window(&self) -> Duration {
        self.readoption_window.unwrap_or(self.heartbeat_timeout)
    }
}

/// Which port a connection came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    Worker,
    Client,
}

/// Numbers persistence batches; `handle_persisted` acknowledges every batch up to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchId(pub u64);

/// One durable record. A batch's records must become durable atomically (one transaction).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// Append (or overwrite) a log entry.
    Log(LogEntry),
    /// Upsert a job row of the materialized table.
    Job(Job),
    /// The materialized job rows reflect every entry up to this index.
    Applied(LogIndex),
    /// Log entries up to this index are reflected in the job rows and may be deleted.
    DiscardLogThrough(LogIndex),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistBatch {
    pub id: BatchId,
    pub records: Vec<Record>,
}

/// What the coordinator asks its driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    ToWorker {
        conn: ConnectionId,
        message: CoordinatorToWorker,
    },
    ToClient {
        conn: ConnectionId,
        message: ClientReply,
    },
    /// Close the connection (after sending anything queued before this output).
    Close {
        conn: ConnectionId,
    },
    /// Make these records durable, then call `handle_persisted(id)`.
    Persist(PersistBatch),
    Event(Event),
}

/// What a coordinator finds on its disk at start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DurableState {
    /// The materialized job rows, reflecting every entry up to `applied`.
    pub jobs: Vec<Job>,
    pub applied: LogIndex,
    /// Log entries not yet discarded (those beyond `applied` are replayed).
    pub log: Vec<LogEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    #[error(transparent)]
    Table(#[from] TableError),
    #[error("the stored log has a gap: expected entry {expected}, found {found}")]
    LogGap { expected: LogIndex, found: LogIndex },
    #[error(transparent)]
    Config(#[from] ConfigError),
}

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

#[derive(Clone, Debug)]
struct Waiter {
    conn: ConnectionId,
    request_id: RequestId,
    timer: TimerKey,
}

/// The coordinator. See the module documentation for the calling order.
pub struct Coordinator {
    config: CoordinatorConfig,
    rng: ChaCha8Rng,
    table: JobTable,
    log: CommandLog,
    registry: Registry,
    timers: TimerQueue,
    /// Log index -> whom to answer when it applies.
    pending: BTreeMap<LogIndex, Pending>,
    /// Queued jobs with an `Assign` in flight.
    assigning: BTreeSet<JobId>,
    /// Leases with a settling command (`Complete`, `AttemptFailed`, `Abandon`) in flight.
    settling: BTreeSet<LeaseId>,
    /// Results that arrived while their attempt was settling, answered once it is durable.
    deferred_acks: BTreeMap<LeaseId, (JobId, WorkerId)>,
    /// Deadlines of running attempts, to disarm when they settle.
    lease_deadlines: BTreeMap<LeaseId, TimerKey>,
    /// Running attempts found at recovery, waiting for their worker to report them.
    awaiting_readoption: BTreeMap<LeaseId, JobId>,
    waiters: BTreeMap<JobId, Vec<Waiter>>,
    waiter_count: usize,
    /// Numbers registrations, so a heartbeat check belongs to exactly one of them.
    next_registration: u64,
    outputs: VecDeque<Output>,
    open_batch: Vec<Record>,
    /// Job rows changed by apply and not yet handed out for persistence.
    dirty: BTreeSet<JobId>,
    /// The applied index the last handed-out rows reflect.
    materialized: LogIndex,
    next_batch: u64,
    /// Batches handed out and not yet durable: (id, last log index in it).
    in_flight: VecDeque<(BatchId, LogIndex)>,
    now: Instant,
}

use crate::log::CommandLog;

impl Coordinator {
    /// A coordinator with an empty disk.
    pub fn new(config: CoordinatorConfig, seed: u64) -> Result<Coordinator, ConfigError> {
        config.validate()?;
        Ok(Coordinator {
            config,
            rng: ChaCha8Rng::seed_from_u64(seed),
            table: JobTable::new(),
            log: CommandLog::new(Term(1), LogIndex(0)),
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
            outputs: VecDeque::new(),
            open_batch: Vec::new(),
            dirty: BTreeSet::new(),
            materialized: LogIndex(0),
            next_batch: 1,
            in_flight: VecDeque::new(),
            now: Instant::ZERO,
        })
    }

    /// A coordinator restarted on `durable`, at `now` on the new process's clock.
    ///
    /// Replays the log beyond the materialized rows, then takes over as leader: every `RUNNING`
    /// attempt gets a re-adoption window (its worker may reconnect and report it), every
    /// `RETRY_WAIT` job restarts its backoff from now. No instant from the previous process is
    /// trusted, because it was measured on another clock.
    pub fn recover(
        config: CoordinatorConfig,
        seed: u64,
        now: Instant,
        durable: DurableState,
    ) -> Result<Coordinator, RecoveryError> {
        // A driver should hand every process start a fresh seed. Should it reuse one, mixing in
        // how far the disk has come keeps ids from repeating: anything the previous process
        // revealed was made durable first, so the disk has moved on since it drew its ids.
        let last_on_disk = durable
            .log
            .iter()
            .map(|e| e.index)
            .max()
            .unwrap_or_default()
            .max(durable.applied);
        let mut coordinator = Coordinator::new(config, mix_seed(seed, last_on_disk.0))?;
        coordinator.now = now;
        coordinator.table = JobTable::from_rows(durable.jobs, durable.applied)?;
        coordinator.log = CommandLog::new(Term(1), durable.applied);
        coordinator.materialized = durable.applied;
        let mut expected = durable.applied.next();
        for entry in durable.log {
            if entry.index <= durable.applied {
                continue;
            }
            if entry.index != expected {
                return Err(RecoveryError::LogGap {
                    expected,
                    found: entry.index,
                });
            }
            expected = expected.next();
            coordinator.log.restore(entry);
        }
        while let Some(entry) = coordinator.log.pop_committed() {
            let outcome = coordinator.table.apply(entry.index, &entry.command);
            coordinator.dirty.extend(outcome.changed_jobs());
        }
        coordinator.take_over(now);
        Ok(coordinator)
    }

    /// Leader takeover: rebuild soft state from the table.
    fn take_over(&mut self, now: Instant) {
        let window_end = now.saturating_add(self.config.readoption_window());
        let mut retry_due = Vec::new();
        for job in self.table.jobs() {
            match (&job.state, &job.lease) {
                (JobState::Running, Some(lease)) => {
                    self.awaiting_readoption.insert(lease.id, job.id);
                }
                (JobState::RetryWait, _) => {
                    let at = now.saturating_add(Duration::from_millis(job.retry_delay_millis));
                    retry_due.push((at, job.id));
                }
                _ => {}
            }
        }
        for (at, job_id) in retry_due {
            self.timers.arm(at, Timer::RetryDue(job_id));
        }
        if !self.awaiting_readoption.is_empty() {
            self.timers.arm(window_end, Timer::ReadoptionEnd);
        }
        self.event(Event::Recovered {
            jobs: self.table.len(),
            active: self.table.active_jobs(),
            awaiting_readoption: self.awaiting_readoption.len(),
        });
    }

    // -----------------------------------------------------------------------------------------
    // Read access (for drivers, tests and the simulator's checker)
    // -----------------------------------------------------------------------------------------

    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    pub fn table(&self) -> &JobTable {
        &self.table
    }

    pub fn job(&self, job_id: &JobId) -> Option<&Job> {
        self.table.get(job_id)
    }

    pub fn workers(&self) -> impl Iterator<Item = &WorkerEntry> {
        self.registry.iter()
    }

    /// Timers armed (for tests and the simulator: it must track the work in flight, not grow).
    pub fn armed_timers(&self) -> usize {
        self.timers.len()
    }

    /// Attempts still waiting to be re-adopted after recovery.
    pub fn awaiting_readoption(&self) -> usize {
        self.awaiting_readoption.len()
    }

    // -----------------------------------------------------------------------------------------
    // Outputs
    // -----------------------------------------------------------------------------------------

    /// The next thing to do, or `None` when there is nothing left until the next input.
    pub fn poll_output(&mut self) -> Option<Output> {
        if let Some(output) = self.outputs.pop_front() {
            return Some(output);
        }
        self.flush_batch()
    }

    /// When `handle_timeout` should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next_deadline()
    }

    fn flush_batch(&mut self) -> Option<Output> {
        // The log alone is enough to recover, so the materialized rows are written lazily: when
        // nothing else is being written (no extra latency for anyone), or when enough has piled up
        // that recovery should not replay more. Under load a job's rows are then written once
        // instead of at every transition.
        let idle = self.open_batch.is_empty() && self.in_flight.is_empty();
        let unmaterialized = self.log.last_index().0.saturating_sub(self.materialized.0);
        let due = self.dirty.len() >= MATERIALIZE_DIRTY_JOBS_MAX
            || unmaterialized >= MATERIALIZE_LOG_ENTRIES_MAX;
        if !self.dirty.is_empty() && (idle || due) {
            for job_id in std::mem::take(&mut self.dirty) {
                if let Some(job) = self.table.get(&job_id) {
                    self.open_batch.push(Record::Job(job.clone()));
                }
            }
            let applied = self.table.applied_index();
            self.materialized = applied;
            self.open_batch.push(Record::Applied(applied));
            // A group of one never needs entries it has applied: no follower will ask for them.
            self.open_batch.push(Record::DiscardLogThrough(applied));
        }
        if self.open_batch.is_empty() {
            return None;
        }
        let id = BatchId(self.next_batch);
        self.next_batch += 1;
        self.in_flight.push_back((id, self.log.last_index()));
        Some(Output::Persist(PersistBatch {
            id,
            records: std::mem::take(&mut self.open_batch),
        }))
    }

    fn event(&mut self, event: Event) {
        self.outputs.push_back(Output::Event(event));
    }

    fn send_worker(&mut self, conn: ConnectionId, message: CoordinatorToWorker) {
        self.outputs.push_back(Output::ToWorker { conn, message });
    }

    fn send_client(&mut self, conn: ConnectionId, message: ClientReply) {
        self.outputs.push_back(Output::ToClient { conn, message });
    }

    fn client_error(
        &mut self,
        conn: ConnectionId,
        request_id: RequestId,
        code: ErrorCode,
        message: String,
    ) {
        self.send_client(
            conn,
            ClientReply::Error {
                request_id: Some(request_id),
                code,
                message,
            },
        );
    }

    /// Appends a command to the log; it applies (and its effects leave) once durable.
    fn propose(&mut self, command: Command, pending: Option<Pending>) {
        let entry = self.log.append(command);
        if let Some(pending) = pending {
            self.pending.insert(entry.index, pending);
        }
        self.open_batch.push(Record::Log(entry));
        if self.open_batch.len() >= PERSIST_BATCH_RECORDS_MAX {
            if let Some(batch) = self.flush_batch() {
                self.outputs.push_back(batch);
            }
        }
    }

    fn advance_clock(&mut self, now: Instant) {
        // Drivers hand out monotonic time; tolerate a repeated instant, never go backwards.
        self.now = self.now.max(now);
    }

    // -----------------------------------------------------------------------------------------
    // Inputs
    // -----------------------------------------------------------------------------------------

    /// Every batch up to and including `batch` is durable.
    pub fn handle_persisted(&mut self, now: Instant, batch: BatchId) {
        self.advance_clock(now);
        let mut durable = None;
        while let Some(&(id, last_index)) = self.in_flight.front() {
            if id > batch {
                break;
            }
            self.in_flight.pop_front();
            durable = Some(last_index);
        }
        if let Some(index) = durable {
            self.log.mark_durable(index);
        }
        self.apply_committed();
        self.schedule();
    }

    /// A frame on `conn` could not be decoded: answer with a typed error and hang up.
    pub fn handle_malformed(
        &mut self,
        now: Instant,
        conn: ConnectionId,
        link: Link,
        error: &FrameError,
    ) {
        self.advance_clock(now);
        let code = ErrorCode::from(error);
        let message = error.to_string();
        self.event(Event::MalformedFrame {
            conn,
            error: message.clone(),
        });
        match link {
            Link::Worker => self.send_worker(conn, CoordinatorToWorker::Error { code, message }),
            Link::Client => self.send_client(
                conn,
                ClientReply::Error {
                    request_id: None,
                    code,
                    message,
                },
            ),
        }
        self.outputs.push_back(Output::Close { conn });
        self.handle_closed(now, conn);
    }

    /// `conn` is gone (closed by the peer, reset, or closed by us).
    pub fn handle_closed(&mut self, now: Instant, conn: ConnectionId) {
        self.advance_clock(now);
        if let Some(worker) = self.registry.worker_on(conn).cloned() {
            self.lose_worker(&worker, LossReason::ConnectionClosed);
        }
        self.drop_waiters_of(conn);
        self.schedule();
    }

    /// The earliest timers are due.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance_clock(now);
        while let Some(timer) = self.timers.pop_due(self.now) {
            match timer {
                Timer::HeartbeatCheck(worker, registration) => {
                    self.check_heartbeat(&worker, registration)
                }
                Timer::LeaseDeadline(job_id, lease_id) => self.expire_lease(job_id, lease_id),
                Timer::RetryDue(job_id) => {
                    if self.table.get(&job_id).map(|job| job.state) == Some(JobState::RetryWait) {
                        self.propose(Command::Requeue { job_id }, None);
                    }
                }
                Timer::ReadoptionEnd => self.end_readoption(),
                Timer::WaitTimeout(conn, request_id, job_id) => {
                    self.time_out_waiter(conn, request_id, job_id)
                }
            }
        }
        self.schedule();
    }

    pub fn handle_worker_message(
        &mut self,
        now: Instant,
        conn: ConnectionId,
        message: WorkerToCoordinator,
    ) {
        self.advance_clock(now);
        // Any message from a registered worker shows it is alive.
        if let Some(worker) = self.registry.worker_on(conn).cloned() {
            if let Some(entry) = self.registry.get_mut(&worker) {
                entry.last_heartbeat = self.now;
            }
        }
        match message {
            WorkerToCoordinator::Register {
                worker_id,
                incarnation,
                capacity,
                running,
                finished,
            } => self.register(conn, worker_id, incarnation, capacity, running, finished),
            WorkerToCoordinator::Heartbeat {} => match self.registry.worker_on(conn) {
                Some(_) => self.send_worker(conn, CoordinatorToWorker::HeartbeatAck {}),
                None => self.reject_unregistered(conn),
            },
            WorkerToCoordinator::TaskResult {
                job_id,
                lease_id,
                outcome,
            } => self.receive_result(conn, job_id, lease_id, outcome),
        }
        self.schedule();
    }

    pub fn handle_client_message(
        &mut self,
        now: Instant,
        conn: ConnectionId,
        message: ClientRequest,
    ) {
        self.advance_clock(now);
        match message {
            ClientRequest::Submit {
                request_id,
                task,
                max_attempts,
                idempotency_key,
                partitions,
            } => self.submit(
                conn,
                request_id,
                &task,
                max_attempts,
                idempotency_key,
                partitions,
            ),
            ClientRequest::Status { request_id, job_id } => match self.table.view(&job_id) {
                Some(job) => self.send_client(conn, ClientReply::Job { request_id, job }),
                None => self.job_not_found(conn, request_id, job_id),
            },
            ClientRequest::Wait {
                request_id,
                job_id,
                timeout_millis,
            } => self.wait(conn, request_id, job_id, timeout_millis),
            ClientRequest::Cancel { request_id, job_id } => {
                let terminal = self
                    .table
                    .get(&job_id)
                    .filter(|job| job.state.is_terminal())
                    .and_then(|job| self.table.view(&job.id));
                let partition_of = self.table.get(&job_id).and_then(|job| job.partition_of);
                if let Some(of) = partition_of {
                    self.client_error(
                        conn,
                        request_id,
                        ErrorCode::InvalidRequest,
                        format!(
                            "job {job_id} is partition {} of job {}; cancel that job instead",
                            of.index, of.parent
                        ),
                    );
                } else if self.table.get(&job_id).is_none() {
                    self.job_not_found(conn, request_id, job_id);
                } else if let Some(job) = terminal {
                    // Terminal is final: answer from the durable table without writing anything.
                    self.send_client(
                        conn,
                        ClientReply::CancelResult {
                            request_id,
                            job,
                            cancelled: false,
                        },
                    );
                } else {
                    self.propose(
                        Command::Cancel { job_id },
                        Some(Pending::Cancel { conn, request_id }),
                    );
                }
            }
            ClientRequest::List {
                request_id,
                state,
                limit,
            } => self.list(conn, request_id, state, limit),
            ClientRequest::Workers { request_id } => {
                let now = self.now;
                let workers = self.registry.iter().map(|w| w.view(now)).collect();
                self.send_client(
                    conn,
                    ClientReply::WorkerList {
                        request_id,
                        workers,
                    },
                );
            }
        }
        self.schedule();
    }

    // -----------------------------------------------------------------------------------------
    // Clients
    // -----------------------------------------------------------------------------------------

    fn submit(
        &mut self,
        conn: ConnectionId,
        request_id: RequestId,
        task: &serde_json::Value,
        max_attempts: Option<u32>,
        idempotency_key: Option<String>,
        partitions: Option<Partitions>,
    ) {
        let task = match TaskSpec::from_json(task) {
            Ok(task) => task,
            Err(error) => {
                return self.client_error(
                    conn,
                    request_id,
                    ErrorCode::InvalidTask,
                    error.to_string(),
                )
            }
        };
        let encoded = serde_json::to_vec(&task).map_or(usize::MAX, |bytes| bytes.len());
        if encoded.saturating_add(ASSIGN_ENVELOPE_BYTES) > self.config.max_frame_bytes {
            return self.client_error(
                conn,
                request_id,
                ErrorCode::InvalidTask,
                format!(
                    "the task is {encoded} bytes as JSON; its assignment would not fit the frame limit of {} bytes",
                    self.config.max_frame_bytes
                ),
            );
        }
        let max_attempts = max_attempts.unwrap_or(self.config.default_max_attempts);
        if !(1..=ATTEMPTS_MAX).contains(&max_attempts) {
            return self.client_error(
                conn,
                request_id,
                ErrorCode::InvalidRequest,
                format!("max_attempts must be between 1 and {ATTEMPTS_MAX} (got {max_attempts})"),
            );
        }
        if let Err(message) = check_partitions_request(&task, partitions) {
            return self.client_error(conn, request_id, ErrorCode::InvalidRequest, message);
        }
        if let Some(key) = &idempotency_key {
            if key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
                return self.client_error(
                    conn,
                    request_id,
                    ErrorCode::InvalidRequest,
                    format!(
                        "idempotency key must be 1 to {IDEMPOTENCY_KEY_BYTES_MAX} bytes (got {})",
                        key.len()
                    ),
                );
            }
            // A known key is answered from the applied (durable) table, with apply's own rule.
            match self.table.check_idempotency(key, &task, max_attempts) {
                Some(Ok(job_id)) => {
                    return self.send_client(
                        conn,
                        ClientReply::SubmitAccepted {
                            request_id,
                            job_id,
                            existing: true,
                        },
                    )
                }
                Some(Err(existing)) => {
                    return self.idempotency_conflict(conn, request_id, existing)
                }
                None => {}
            }
        }
        // Shed load without touching the log when the applied table is already full. Apply checks
        // again, so submissions racing in one batch cannot overshoot the limit.
        let pieces = self.resolve_partitions(&task, partitions);
        // Every reply about the job must fit a frame: the parent's view carries the whole task,
        // a line per partition and at most one worker's error.
        let view_bytes = encoded
            .saturating_add(pieces.saturating_mul(PARTITION_VIEW_BYTES_MAX))
            .saturating_add(ATTEMPT_ERROR_BYTES_MAX)
            .saturating_add(idempotency_key.as_ref().map_or(0, String::len))
            .saturating_add(ASSIGN_ENVELOPE_BYTES);
        if task.is_data_parallel() && view_bytes > self.config.max_frame_bytes {
            return self.client_error(
                conn,
                request_id,
                ErrorCode::InvalidTask,
                format!(
                    "the task is {encoded} bytes as JSON; split {pieces} ways, a reply showing the job could need {view_bytes} bytes, over the frame limit of {} bytes; submit a smaller input or fewer partitions",
                    self.config.max_frame_bytes
                ),
            );
        }
        let limit = self.config.max_active_jobs;
        let slots = 1 + pieces as u64;
        if slots > limit {
            return self.client_error(
                conn,
                request_id,
                ErrorCode::InvalidRequest,
                format!(
                    "a job split into {pieces} partitions needs {slots} admission slots (the job and each partition), but --max-active-jobs is {limit}; ask for fewer partitions or raise the limit"
                ),
            );
        }
        if self.table.active_jobs().saturating_add(slots) > limit {
            return self.reject_submission(conn, request_id, self.table.active_jobs(), limit);
        }
        // The job's id first, then one per partition, each unlike any drawn before it.
        let mut ids = Vec::with_capacity(1 + pieces);
        for _ in 0..=pieces {
            let id = self.fresh_job_id(&ids);
            ids.push(id);
        }
        let partitions = ids.split_off(1);
        let job_id = ids[0];
        self.propose(
            Command::Submit {
                job_id,
                task,
                max_attempts,
                idempotency_key,
                max_active_jobs: limit,
                partitions,
            },
            Some(Pending::Submit { conn, request_id }),
        );
    }

    /// A job id no job in the table (nor in `taken`) has.
    fn fresh_job_id(&mut self, taken: &[JobId]) -> JobId {
        loop {
            let id = JobId::random(&mut self.rng);
            if self.table.get(&id).is_none() && !taken.contains(&id) {
                return id;
            }
        }
    }

    /// How many partition jobs a submission becomes: `min(partitions, items)` for a
    /// data-parallel task (`auto`, or no request, means one per live worker, at least one, at
    /// most what admission leaves room for), 0 for any other task. The request was checked by
    /// [`check_partitions_request`].
    fn resolve_partitions(&self, task: &TaskSpec, partitions: Option<Partitions>) -> usize {
        if !task.is_data_parallel() {
            return 0;
        }
        let requested = match partitions.unwrap_or(Partitions::Auto) {
            Partitions::Auto => {
                // One per live worker, but never more than the admission limit leaves room for.
                let live = self.registry.iter().filter(|w| w.alive).count() as u64;
                let room = self.config.max_active_jobs.saturating_sub(1).max(1);
                u32::try_from(live.clamp(1, room)).unwrap_or(PARTITIONS_MAX)
            }
            Partitions::Count(n) => n,
        };
        // `TaskSpec::split` makes exactly `min(partitions, items)` pieces; counting them here
        // spares copying the input, which apply splits once.
        let pieces = u64::from(requested.clamp(1, PARTITIONS_MAX)).min(task.items());
        usize::try_from(pieces).unwrap_or(PARTITIONS_MAX as usize)
    }

    fn reject_submission(
        &mut self,
        conn: ConnectionId,
        request_id: RequestId,
        active_jobs: u64,
        max_active_jobs: u64,
    ) {
        self.event(Event::SubmitRejected {
            active_jobs,
            max_active_jobs,
        });
        self.send_client(
            conn,
            ClientReply::SubmitRejected {
                request_id,
                retryable: true,
                active_jobs,
                max_active_jobs,
                message: format!(
                    "coordinator is at its limit of {max_active_jobs} active jobs; retry later"
                ),
            },
        );
    }

    fn idempotency_conflict(&mut self, conn: ConnectionId, request_id: RequestId, existing: JobId) {
        self.client_error(
            conn,
            request_id,
            ErrorCode::IdempotencyConflict,
            format!(
                "idempotency key is bound to job {existing} with a different task or max attempts; use a new key"
            ),
        );
    }

    fn job_not_found(&mut self, conn: ConnectionId, request_id: RequestId, job_id: JobId) {
        self.client_error(
            conn,
            request_id,
            ErrorCode::JobNotFound,
            format!("no job {job_id}"),
        );
    }

    fn wait(
        &mut self,
        conn: ConnectionId,
        request_id: RequestId,
        job_id: JobId,
        timeout_millis: Option<u64>,
    ) {
        let timeout_millis = timeout_millis.unwrap_or(WAIT_MILLIS_MAX);
        if timeout_millis > WAIT_MILLIS_MAX {
            return self.client_error(
                conn,
                request_id,
                ErrorCode::InvalidRequest,
                format!("wait timeout must be at most {WAIT_MILLIS_MAX} ms (got {timeout_millis})"),
            );
        }
        let Some(job) = self.table.get(&job_id) else {
            return self.job_not_found(conn, request_id, job_id);
        };
        if job.state.is_terminal() {
            let Some(job) = self.table.view(&job_id) else {
                return;
            };
            return self.send_client(
                conn,
                ClientReply::WaitResult {
                    request_id,
                    job,
                    timed_out: false,
                },
            );
        }
        if self.waiter_count >= WAITERS_MAX {
            return self.client_error(
                conn,
                request_id,
                ErrorCode::TooManyWaiters,
                format!("{WAITERS_MAX} waits are already parked; poll with STATUS or retry later"),
            );
        }
        let at = self
            .now
            .saturating_add(Duration::from_millis(timeout_millis));
        let timer = self
            .timers
            .arm(at, Timer::WaitTimeout(conn, request_id, job_id));
        self.waiters.entry(job_id).or_default().push(Waiter {
            conn,
            request_id,
            timer,
        });
        self.waiter_count += 1;
    }

    fn time_out_waiter(&mut self, conn: ConnectionId, request_id: RequestId, job_id: JobId) {
        let Some(list) = self.waiters.get_mut(&job_id) else {
            return;
        };
        let before = list.len();
        list.retain(|w| !(w.conn == conn && w.request_id == request_id));
        let removed = before - list.len();
        if list.is_empty() {
            self.waiters.remove(&job_id);
        }
        if removed == 0 {
            return;
        }
        self.waiter_count -= removed;
        if let Some(job) = self.table.view(&job_id) {
            self.send_client(
                conn,
                ClientReply::WaitResult {
                    request_id,
                    job,
                    timed_out: true,
                },
            );
        }
    }

    fn wake_waiters(&mut self, job_id: JobId) {
        let Some(list) = self.waiters.remove(&job_id) else {
            return;
        };
        let Some(job) = self.table.view(&job_id) else {
            return;
        };
        self.waiter_count -= list.len();
        for waiter in list {
            self.timers.disarm(waiter.timer);
            self.send_client(
                waiter.conn,
                ClientReply::WaitResult {
                    request_id: waiter.request_id,
                    job: job.clone(),
                    timed_out: false,
                },
            );
        }
    }

    fn drop_waiters_of(&mut self, conn: ConnectionId) {
        if self.waiter_count == 0 {
            return;
        }
        let mut dropped = 0;
        let mut timers = Vec::new();
        self.waiters.retain(|_, list| {
            list.retain(|w| {
                let keep = w.conn != conn;
                if !keep {
                    timers.push(w.timer);
                    dropped += 1;
                }
                keep
            });
            !list.is_empty()
        });
        for timer in timers {
            self.timers.disarm(timer);
        }
        self.waiter_count -= dropped;
    }

    fn list(
        &mut self,
        conn: ConnectionId,
        request_id: RequestId,
        state: Option<JobState>,
        limit: Option<u32>,
    ) {
        let limit = limit.unwrap_or(LIST_LIMIT_DEFAULT);
        if limit > LIST_LIMIT_MAX {
            return self.client_error(
                conn,
                request_id,
                ErrorCode::InvalidRequest,
                format!("list limit must be at most {LIST_LIMIT_MAX} (got {limit})"),
            );
        }
        let jobs = self
            .table
            .newest_first()
            .filter(|job| state.is_none_or(|s| job.state == s))
            .take(limit as usize)
            .filter_map(|job| self.table.view(&job.id))
            .collect();
        self.send_client(conn, ClientReply::JobList { request_id, jobs });
    }

    // -----------------------------------------------------------------------------------------
    // Workers
    // -----------------------------------------------------------------------------------------

    fn reject_unregistered(&mut self, conn: ConnectionId) {
        self.send_worker(
            conn,
            CoordinatorToWorker::Error {
                code: ErrorCode::NotRegistered,
                message: "this connection has not registered (or was declared lost); reconnect and REGISTER".into(),
            },
        );
        self.outputs.push_back(Output::Close { conn });
    }

    fn refuse_registration(
        &mut self,
        conn: ConnectionId,
        worker: WorkerId,
        reason: RegisterRejection,
        message: String,
    ) {
        self.event(Event::WorkerRejected {
            worker,
            reason: message.clone(),
        });
        self.send_worker(
            conn,
            CoordinatorToWorker::RegisterRejected { reason, message },
        );
        self.outputs.push_back(Output::Close { conn });
    }

    fn register(
        &mut self,
        conn: ConnectionId,
        worker_id: WorkerId,
        incarnation: Incarnation,
        capacity: u32,
        running: Vec<RunningAttempt>,
        finished: Vec<RunningAttempt>,
    ) {
        if let Err(error) = WorkerId::parse(worker_id.as_str()) {
            return self.refuse_registration(
                conn,
                worker_id,
                RegisterRejection::InvalidRegistration,
                error.to_string(),
            );
        }
        if !(1..=WORKER_CAPACITY_MAX).contains(&capacity) {
            return self.refuse_registration(
                conn,
                worker_id,
                RegisterRejection::InvalidRegistration,
                format!("capacity must be between 1 and {WORKER_CAPACITY_MAX} (got {capacity})"),
            );
        }
        // An honest process cannot be running (or holding results of) more attempts than it has
        // slots plus results waiting; bounding the report bounds what a peer can make us track.
        let reported = running.len().saturating_add(finished.len());
        let reportable = (capacity as usize).saturating_mul(2).max(1);
        if running.len() > capacity as usize || reported > reportable.max(REPORTED_FINISHED_MAX) {
            return self.refuse_registration(
                conn,
                worker_id,
                RegisterRejection::InvalidRegistration,
                format!(
                    "reports {} running attempts with capacity {capacity} (and {} unacknowledged results)",
                    running.len(),
                    finished.len()
                ),
            );
        }
        if let Some(bound) = self.registry.worker_on(conn) {
            if *bound != worker_id {
                let message = format!("this connection is already registered as {bound}");
                return self.refuse_registration(
                    conn,
                    worker_id,
                    RegisterRejection::InvalidRegistration,
                    message,
                );
            }
        }
        let existing = self
            .registry
            .get(&worker_id)
            .map(|w| (w.alive, w.incarnation, w.conn));
        match existing {
            Some((true, known, old_conn)) if known == incarnation => {
                // The same process on a new connection (the old one is half-open or just closing).
                if old_conn != Some(conn) {
                    self.registry.rebind(&worker_id, conn);
                    if let Some(old) = old_conn {
                        self.outputs.push_back(Output::Close { conn: old });
                    }
                }
                // Capacity is fixed for the life of a process; a reconnect cannot change it.
                if let Some(entry) = self.registry.get_mut(&worker_id) {
                    entry.last_heartbeat = self.now;
                }
                self.reconcile_slots(&worker_id, &running, &finished);
                self.event(Event::WorkerRegistered {
                    worker: worker_id.clone(),
                    incarnation,
                    capacity,
                    reconnect: true,
                });
            }
            Some((true, known, _)) => {
                let message = format!(
                    "worker id {worker_id} is held by a live process (incarnation {known}); pick another id or stop that process"
                );
                return self.refuse_registration(
                    conn,
                    worker_id,
                    RegisterRejection::DuplicateWorkerId,
                    message,
                );
            }
            _ => {
                if self.registry.get(&worker_id).is_none() && self.registry.len() >= WORKERS_MAX {
                    self.registry.evict_lost(WORKERS_MAX - 1);
                    if self.registry.len() >= WORKERS_MAX {
                        let message =
                            format!("the registry already tracks {WORKERS_MAX} live workers");
                        return self.refuse_registration(
                            conn,
                            worker_id,
                            RegisterRejection::TooManyWorkers,
                            message,
                        );
                    }
                }
                self.next_registration += 1;
                let registration = self.next_registration;
                self.registry.insert(WorkerEntry {
                    id: worker_id.clone(),
                    incarnation,
                    registration,
                    capacity,
                    conn: Some(conn),
                    alive: true,
                    last_heartbeat: self.now,
                    leases: BTreeMap::new(),
                });
                self.timers.arm(
                    self.now.saturating_add(self.config.heartbeat_timeout),
                    Timer::HeartbeatCheck(worker_id.clone(), registration),
                );
                self.event(Event::WorkerRegistered {
                    worker: worker_id.clone(),
                    incarnation,
                    capacity,
                    reconnect: false,
                });
                self.abandon_other_incarnations(&worker_id, incarnation);
            }
        }
        self.send_worker(
            conn,
            CoordinatorToWorker::Registered {
                heartbeat_interval_millis: as_millis_u64(self.config.heartbeat_interval),
                heartbeat_timeout_millis: as_millis_u64(self.config.heartbeat_timeout),
            },
        );
        for attempt in running {
            self.reconcile_reported(conn, &worker_id, attempt);
        }
    }

    /// The same process came back on a new connection, saying what it holds. Messages on the old
    /// connection may have been lost: an assignment it never got keeps a slot that nothing would
    /// ever free, and its attempt would wait for its deadline. Whatever the worker neither runs
    /// nor has a result for is given up now (the attempt is retried); an assignment still being
    /// made durable is left alone, it goes out on the new connection.
    fn reconcile_slots(
        &mut self,
        worker_id: &WorkerId,
        running: &[RunningAttempt],
        finished: &[RunningAttempt],
    ) {
        let Some(entry) = self.registry.get(worker_id) else {
            return;
        };
        let held: BTreeSet<LeaseId> = running
            .iter()
            .chain(finished)
            .map(|attempt| attempt.lease_id)
            .collect();
        let missing: Vec<(LeaseId, JobId)> = entry
            .leases
            .iter()
            .filter(|(lease_id, job_id)| {
                !held.contains(lease_id) && !self.assigning.contains(job_id)
            })
            .map(|(&lease_id, &job_id)| (lease_id, job_id))
            .collect();
        for (lease_id, job_id) in missing {
            if let Some(entry) = self.registry.get_mut(worker_id) {
                entry.leases.remove(&lease_id);
            }
            let cause = format!(
                "worker {worker_id} reconnected without attempt {lease_id}: its assignment was lost with the old connection"
            );
            self.fail_attempt(job_id, lease_id, cause, None);
        }
    }

    /// A registering worker says it is running `attempt`. Re-adopt it if it is a recovered
    /// attempt of this very process; keep counting the slot of an attempt it already holds;
    /// otherwise it is stale: tell the worker to stop it, and count its slot until it does.
    fn reconcile_reported(
        &mut self,
        conn: ConnectionId,
        worker_id: &WorkerId,
        attempt: RunningAttempt,
    ) {
        if self.try_readopt(worker_id, attempt.job_id, attempt.lease_id) {
            return;
        }
        let still_current = self
            .table
            .is_current_lease(attempt.job_id, attempt.lease_id);
        let Some(entry) = self.registry.get_mut(worker_id) else {
            return;
        };
        if entry.leases.contains_key(&attempt.lease_id) {
            if !still_current && !self.settling.contains(&attempt.lease_id) {
                // Revoked while the old connection carried the cancel; it may have been lost.
                self.send_worker(
                    conn,
                    CoordinatorToWorker::TaskCancel {
                        job_id: attempt.job_id,
                        lease_id: attempt.lease_id,
                        reason: CancelReason::LeaseNotCurrent,
                    },
                );
            }
            return;
        }
        let job_id = attempt.job_id;
        entry.leases.insert(attempt.lease_id, job_id);
        if still_current {
            // Its revocation is proposed but not yet durable; the cancel goes out when it applies
            // (see `settle_effects`), never before.
            return;
        }
        self.send_worker(
            conn,
            CoordinatorToWorker::TaskCancel {
                job_id,
                lease_id: attempt.lease_id,
                reason: CancelReason::LeaseNotCurrent,
            },
        );
    }

    /// Re-adopts a recovered running attempt if `worker_id`'s live incarnation is the one the
    /// lease was granted to.
    fn try_readopt(&mut self, worker_id: &WorkerId, job_id: JobId, lease_id: LeaseId) -> bool {
        if self.awaiting_readoption.get(&lease_id) != Some(&job_id) {
            return false;
        }
        let Some(lease) = self.table.get(&job_id).and_then(|job| job.lease.clone()) else {
            return false;
        };
        let Some(entry) = self.registry.get_mut(worker_id) else {
            return false;
        };
        if lease.id != lease_id
            || lease.worker != *worker_id
            || lease.incarnation != entry.incarnation
            || !entry.alive
        {
            return false;
        }
        self.awaiting_readoption.remove(&lease_id);
        entry.leases.insert(lease_id, job_id);
        self.arm_lease_deadline(job_id, lease_id);
        self.event(Event::AttemptReadopted {
            job_id,
            lease_id,
            worker: worker_id.clone(),
        });
        true
    }

    /// A worker id came back as a new process: attempts the old process held cannot be re-adopted.
    fn abandon_other_incarnations(&mut self, worker_id: &WorkerId, incarnation: Incarnation) {
        let orphans: Vec<(LeaseId, JobId)> = self
            .awaiting_readoption
            .iter()
            .filter(|(_, job_id)| {
                self.table
                    .get(job_id)
                    .and_then(|job| job.lease.as_ref())
                    .is_some_and(|lease| {
                        lease.worker == *worker_id && lease.incarnation != incarnation
                    })
            })
            .map(|(&lease_id, &job_id)| (lease_id, job_id))
            .collect();
        for (lease_id, job_id) in orphans {
            self.abandon(job_id, lease_id);
        }
    }

    fn abandon(&mut self, job_id: JobId, lease_id: LeaseId) {
        self.awaiting_readoption.remove(&lease_id);
        if self.settling.contains(&lease_id) || !self.table.is_current_lease(job_id, lease_id) {
            return;
        }
        let worker = self
            .table
            .get(&job_id)
            .and_then(|job| job.lease.as_ref())
            .map(|lease| lease.worker.clone())
            .unwrap_or_else(|| WorkerId(String::new()));
        self.event(Event::AttemptAbandoned {
            job_id,
            lease_id,
            worker,
        });
        self.settling.insert(lease_id);
        self.propose(Command::Abandon { job_id, lease_id }, None);
    }

    fn end_readoption(&mut self) {
        let leftovers: Vec<(LeaseId, JobId)> = self
            .awaiting_readoption
            .iter()
            .map(|(&lease_id, &job_id)| (lease_id, job_id))
            .collect();
        for (lease_id, job_id) in leftovers {
            self.abandon(job_id, lease_id);
        }
    }

    fn check_heartbeat(&mut self, worker: &WorkerId, registration: u64) {
        let Some(entry) = self.registry.get(worker) else {
            return;
        };
        // A check armed for an earlier registration dies here instead of re-arming forever.
        if !entry.alive || entry.registration != registration {
            return;
        }
        let deadline = entry
            .last_heartbeat
            .saturating_add(self.config.heartbeat_timeout);
        if deadline <= self.now {
            let silent_millis = as_millis_u64(self.now.saturating_since(entry.last_heartbeat));
            self.lose_worker(worker, LossReason::HeartbeatTimeout { silent_millis });
        } else {
            self.timers.arm(
                deadline,
                Timer::HeartbeatCheck(worker.clone(), registration),
            );
        }
    }

    /// Declares `worker` lost: its connection is closed and every attempt it held is failed
    /// (retried if attempts remain).
    fn lose_worker(&mut self, worker: &WorkerId, reason: LossReason) {
        if !self.registry.get(worker).is_some_and(|w| w.alive) {
            return;
        }
        let (conn, leases) = self.registry.mark_lost(worker);
        if let Some(conn) = conn {
            self.outputs.push_back(Output::Close { conn });
        }
        let cause = format!("worker {worker} lost ({reason})");
        self.event(Event::WorkerLost {
            worker: worker.clone(),
            reason,
        });
        for (lease_id, job_id) in leases {
            // Attempts with an `Assign` still in flight are failed when it applies (see `on_assigned`).
            self.fail_attempt(job_id, lease_id, cause.clone(), None);
        }
    }

    /// Proposes `AttemptFailed` for a current, not-yet-settling lease.
    fn fail_attempt(
        &mut self,
        job_id: JobId,
        lease_id: LeaseId,
        cause: String,
        pending: Option<Pending>,
    ) -> bool {
        if self.settling.contains(&lease_id) || !self.table.is_current_lease(job_id, lease_id) {
            return false;
        }
        let attempt = self.table.get(&job_id).map_or(1, |job| job.attempt.0);
        let retry_delay_millis = self.retry_delay_millis(attempt);
        self.settling.insert(lease_id);
        self.propose(
            Command::AttemptFailed {
                job_id,
                lease_id,
                cause,
                retry_delay_millis,
            },
            pending,
        );
        true
    }

    /// Full jitter: uniform in `[0, min(retry_max, retry_base * 2^(attempt-1))]`.
    fn retry_delay_millis(&mut self, attempt: u32) -> u64 {
        let base = as_millis_u64(self.config.retry_base);
        let cap = as_millis_u64(self.config.retry_max);
        let exponent = attempt.saturating_sub(1).min(63);
        let ceiling = base.saturating_mul(1u64 << exponent).min(cap);
        self.rng.next_u64() % (ceiling + 1)
    }

    fn expire_lease(&mut self, job_id: JobId, lease_id: LeaseId) {
        self.lease_deadlines.remove(&lease_id);
        let Some(worker) = self
            .table
            .get(&job_id)
            .and_then(|job| job.lease.as_ref())
            .filter(|lease| lease.id == lease_id)
            .map(|lease| lease.worker.clone())
        else {
            return;
        };
        let cause = format!(
            "attempt deadline of {} ms expired on worker {worker}",
            as_millis_u64(self.config.task_timeout)
        );
        let revoke = Pending::Revoke {
            reason: CancelReason::DeadlineExpired,
        };
        if self.fail_attempt(job_id, lease_id, cause, Some(revoke)) {
            self.event(Event::LeaseExpired {
                job_id,
                lease_id,
                worker,
            });
        }
    }

    fn receive_result(
        &mut self,
        conn: ConnectionId,
        job_id: JobId,
        lease_id: LeaseId,
        outcome: AttemptOutcome,
    ) {
        let Some(worker) = self.registry.worker_on(conn).cloned() else {
            return self.reject_unregistered(conn);
        };
        // A result is as good as a report that the attempt is still ours: re-adopt, then settle.
        self.try_readopt(&worker, job_id, lease_id);
        // The slot is freed only by a report naming both the lease and the job it was granted for;
        // a report that gets the pair wrong changes nothing.
        let held = match self.registry.get_mut(&worker) {
            Some(entry) if entry.leases.get(&lease_id) == Some(&job_id) => {
                entry.leases.remove(&lease_id);
                true
            }
            _ => false,
        };
        let current = self
            .table
            .get(&job_id)
            .and_then(|job| job.lease.as_ref())
            .is_some_and(|lease| lease.id == lease_id && lease.worker == worker);
        if current && self.settling.contains(&lease_id) {
            // The attempt's settlement is proposed but not yet durable. Answering now would reveal
            // an outcome a crash could still undo (and the worker would drop its result); the
            // answer goes out when the settlement applies.
            self.deferred_acks.insert(lease_id, (job_id, worker));
            return;
        }
        if !held || !current {
            let answer = CoordinatorToWorker::ResultAck {
                job_id,
                lease_id,
                accepted: false,
            };
            if held && matches!(outcome, AttemptOutcome::Cancelled {}) {
                // The expected end of a revoked attempt: its slot is free again, nothing to report.
                return self.send_worker(conn, answer);
            }
            // The lease is not current in the durable table, or not this worker's: leases never
            // become current again, so this verdict is final; apply would reach the same one.
            let reason = match self.table.get(&job_id) {
                None => "unknown job".to_owned(),
                Some(job) if job.state.is_terminal() => format!("job is already {}", job.state),
                Some(_) => "lease is not the job's current lease".to_owned(),
            };
            self.event(Event::StaleResultRejected {
                job_id,
                lease_id,
                worker,
                reason,
            });
            return self.send_worker(conn, answer);
        }
        let pending = Some(Pending::Result {
            worker: worker.clone(),
        });
        match outcome {
            AttemptOutcome::Succeeded { output } => {
                self.settling.insert(lease_id);
                self.propose(
                    Command::Complete {
                        job_id,
                        lease_id,
                        output,
                    },
                    pending,
                );
            }
            AttemptOutcome::Failed { error } => {
                // Workers cut their messages; one that does not is cut here, so every job view
                // stays within its bound.
                let error = cut_to(&error, ATTEMPT_ERROR_BYTES_MAX);
                let cause = format!("task failed on worker {worker}: {error}");
                self.fail_attempt(job_id, lease_id, cause, pending);
            }
            AttemptOutcome::Cancelled {} => {
                let cause = format!("worker {worker} stopped the attempt unasked");
                self.fail_attempt(job_id, lease_id, cause, pending);
            }
        }
    }

    fn arm_lease_deadline(&mut self, job_id: JobId, lease_id: LeaseId) {
        let at = self.now.saturating_add(self.config.task_timeout);
        let key = self.timers.arm(at, Timer::LeaseDeadline(job_id, lease_id));
        self.lease_deadlines.insert(lease_id, key);
    }

    fn disarm_lease_deadline(&mut self, lease_id: LeaseId) {
        if let Some(key) = self.lease_deadlines.remove(&lease_id) {
            self.timers.disarm(key);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Scheduling
    // -----------------------------------------------------------------------------------------

    /// FIFO onto the least-loaded live worker, while both queued jobs and free slots remain.
    fn schedule(&mut self) {
        if self.registry.least_loaded().is_none() {
            return;
        }
        let candidates: Vec<JobId> = self
            .table
            .queued()
            .filter(|job_id| !self.assigning.contains(job_id))
            .take(self.registry.iter().map(|w| w.free_slots() as usize).sum())
            .collect();
        for job_id in candidates {
            // Partitions of one job go to distinct workers where capacity allows.
            let parent = self
                .table
                .get(&job_id)
                .and_then(|job| job.partition_of)
                .map(|of| of.parent);
            let table = &self.table;
            let siblings_on = |worker: &WorkerEntry| match parent {
                Some(parent) => worker
                    .leases
                    .values()
                    .filter(|id| {
                        table
                            .get(id)
                            .and_then(|job| job.partition_of)
                            .is_some_and(|of| of.parent == parent)
                    })
                    .count(),
                None => 0,
            };
            let Some(worker) = self.registry.least_loaded_by(siblings_on) else {
                break;
            };
            let worker_id = worker.id.clone();
            let incarnation = worker.incarnation;
            let lease = Lease {
                id: LeaseId::random(&mut self.rng),
                worker: worker_id.clone(),
                incarnation,
            };
            if let Some(entry) = self.registry.get_mut(&worker_id) {
                entry.leases.insert(lease.id, job_id);
            }
            self.assigning.insert(job_id);
            self.propose(Command::Assign { job_id, lease }, None);
        }
    }

    // -----------------------------------------------------------------------------------------
    // Apply and its effects
    // -----------------------------------------------------------------------------------------

    fn apply_committed(&mut self) {
        while let Some(entry) = self.log.pop_committed() {
            let outcome = self.table.apply(entry.index, &entry.command);
            self.dirty.extend(outcome.changed_jobs());
            let pending = self.pending.remove(&entry.index);
            self.on_applied(&entry.command, outcome.applied, pending);
            for follow_on in outcome.follow_on {
                self.on_outcome(follow_on, None);
            }
        }
    }

    fn on_applied(&mut self, command: &Command, applied: Applied, pending: Option<Pending>) {
        if let Command::Assign { job_id, .. } = command {
            self.assigning.remove(job_id);
        }
        match command {
            Command::Complete { lease_id, .. } => {
                self.settling.remove(lease_id);
                self.answer_deferred_ack(*lease_id, pending.as_ref());
            }
            Command::AttemptFailed {
                job_id, lease_id, ..
            }
            | Command::Abandon { job_id, lease_id } => {
                self.settling.remove(lease_id);
                self.answer_deferred_ack(*lease_id, pending.as_ref());
                if pending.is_none() {
                    // Revoked because its worker was lost or a restart interrupted it. If a
                    // process has since reported the attempt, it is told to stop now that the
                    // revocation is durable (never before).
                    self.cancel_wherever_reported(*job_id, *lease_id);
                }
            }
            _ => {}
        }
        self.on_outcome(applied, pending);
    }

    /// The visible effects of one job's change: replies, events, timers, cancels.
    fn on_outcome(&mut self, applied: Applied, pending: Option<Pending>) {
        match applied {
            Applied::Submitted { job_id } => {
                if let Some(job) = self.table.get(&job_id) {
                    let (kind, max_attempts) = (job.task.kind(), job.max_attempts);
                    let partitions = job.is_parent().then_some(job.partitions.len());
                    self.event(Event::JobSubmitted {
                        job_id,
                        kind,
                        max_attempts,
                    });
                    if let Some(partitions) = partitions {
                        self.event(Event::JobSplit { job_id, partitions });
                    }
                }
                self.answer_submit(pending, job_id, false);
            }
            Applied::PartitionCreated { .. } => {}
            Applied::ParentCompleted { job_id } => {
                let partitions = self.table.get(&job_id).map_or(0, |j| j.partitions.len());
                self.event(Event::ParentCompleted { job_id, partitions });
                self.wake_waiters(job_id);
            }
            Applied::ParentFailed { job_id, error } => {
                self.event(Event::ParentFailed { job_id, error });
                self.wake_waiters(job_id);
            }
            Applied::SubmitInvalid { job_id, reason } => {
                if let Some(Pending::Submit { conn, request_id }) = pending {
                    self.client_error(
                        conn,
                        request_id,
                        ErrorCode::InvalidRequest,
                        format!("job {job_id} was not created: {reason}"),
                    );
                }
            }
            Applied::IdempotentReplay { job_id } => self.answer_submit(pending, job_id, true),
            Applied::IdempotencyConflict { existing } => {
                if let Some(Pending::Submit { conn, request_id }) = pending {
                    self.idempotency_conflict(conn, request_id, existing);
                }
            }
            Applied::AdmissionRejected {
                active_jobs,
                max_active_jobs,
            } => {
                if let Some(Pending::Submit { conn, request_id }) = pending {
                    self.reject_submission(conn, request_id, active_jobs, max_active_jobs);
                }
            }
            Applied::Assigned {
                job_id,
                lease,
                attempt,
            } => self.on_assigned(job_id, lease, attempt),
            Applied::AssignSkipped { lease, .. } => {
                if let Some(entry) = self.registry.get_mut(&lease.worker) {
                    entry.leases.remove(&lease.id);
                }
            }
            Applied::Completed { job_id, lease } => {
                self.disarm_lease_deadline(lease.id);
                let attempts = self
                    .table
                    .get(&job_id)
                    .map(|job| job.attempt)
                    .unwrap_or_default();
                self.event(Event::JobCompleted {
                    job_id,
                    worker: lease.worker.clone(),
                    attempts,
                });
                self.ack_result(pending, job_id, lease.id, true);
                self.wake_waiters(job_id);
            }
            Applied::RetryScheduled {
                job_id,
                lease,
                attempt,
                delay_millis,
                cause,
            } => {
                self.disarm_lease_deadline(lease.id);
                let max_attempts = self.table.get(&job_id).map_or(0, |job| job.max_attempts);
                self.event(Event::RetryScheduled {
                    job_id,
                    attempt,
                    max_attempts,
                    delay_millis,
                    cause,
                });
                let at = self.now.saturating_add(Duration::from_millis(delay_millis));
                self.timers.arm(at, Timer::RetryDue(job_id));
                self.settle_effects(pending, job_id, &lease);
            }
            Applied::FailedPermanently {
                job_id,
                lease,
                error,
            } => {
                self.disarm_lease_deadline(lease.id);
                let attempts = self
                    .table
                    .get(&job_id)
                    .map(|job| job.attempt)
                    .unwrap_or_default();
                self.event(Event::JobFailed {
                    job_id,
                    attempts,
                    error,
                });
                self.settle_effects(pending, job_id, &lease);
                self.wake_waiters(job_id);
            }
            Applied::Requeued { job_id } => {
                if let Some(job) = self.table.get(&job_id) {
                    let (attempt, max_attempts) = (job.attempt, job.max_attempts);
                    self.event(Event::JobRequeued {
                        job_id,
                        attempt,
                        max_attempts,
                    });
                }
            }
            Applied::Cancelled {
                job_id,
                previous,
                revoked,
            } => {
                self.event(Event::JobCancelled { job_id, previous });
                if let Some(lease) = revoked {
                    self.disarm_lease_deadline(lease.id);
                    self.awaiting_readoption.remove(&lease.id);
                    self.send_cancel(&lease, job_id, CancelReason::JobCancelled);
                }
                self.answer_cancel(pending, job_id, true);
                self.wake_waiters(job_id);
            }
            Applied::CancelTooLate { job_id, .. } => self.answer_cancel(pending, job_id, false),
            Applied::Stale {
                job_id,
                lease_id,
                reason,
            } => {
                if let Some(Pending::Result { worker }) = &pending {
                    let worker = worker.clone();
                    self.event(Event::StaleResultRejected {
                        job_id,
                        lease_id,
                        worker,
                        reason: reason.to_string(),
                    });
                }
                self.ack_result(pending, job_id, lease_id, false);
            }
            Applied::RequeueSkipped { .. } => {}
            Applied::UnknownJob { job_id } => match pending {
                Some(Pending::Submit { conn, request_id })
                | Some(Pending::Cancel { conn, request_id }) => {
                    self.job_not_found(conn, request_id, job_id)
                }
                _ => {}
            },
        }
    }

    fn on_assigned(&mut self, job_id: JobId, lease: Lease, attempt: crate::ids::Attempt) {
        let conn = self
            .registry
            .get(&lease.worker)
            .filter(|w| {
                w.alive && w.incarnation == lease.incarnation && w.leases.contains_key(&lease.id)
            })
            .and_then(|w| w.conn);
        let Some(conn) = conn else {
            // The worker was lost while the assignment was being made durable.
            let cause = format!(
                "worker {} lost before the assignment reached it",
                lease.worker
            );
            self.fail_attempt(job_id, lease.id, cause, None);
            return;
        };
        let Some(job) = self.table.get(&job_id) else {
            return;
        };
        let message = CoordinatorToWorker::TaskAssign {
            job_id,
            lease_id: lease.id,
            attempt,
            max_attempts: job.max_attempts,
            task: job.task.clone(),
            timeout_millis: as_millis_u64(self.config.task_timeout),
        };
        let max_attempts = job.max_attempts;
        self.arm_lease_deadline(job_id, lease.id);
        self.event(Event::JobAssigned {
            job_id,
            worker: lease.worker.clone(),
            attempt,
            max_attempts,
            lease_id: lease.id,
        });
        self.send_worker(conn, message);
    }

    /// Effects of a failed attempt settling: acknowledge the worker's report, or tell the worker
    /// its lease was revoked.
    fn settle_effects(&mut self, pending: Option<Pending>, job_id: JobId, lease: &Lease) {
        match pending {
            Some(Pending::Revoke { reason }) => self.send_cancel(lease, job_id, reason),
            pending @ Some(Pending::Result { .. }) => {
                self.ack_result(pending, job_id, lease.id, true)
            }
            _ => {}
        }
    }

    /// Tells the worker holding `lease` (whichever process of that id reported it) to stop.
    fn send_cancel(&mut self, lease: &Lease, job_id: JobId, reason: CancelReason) {
        let conn = self
            .registry
            .get(&lease.worker)
            .filter(|w| w.alive && w.leases.contains_key(&lease.id))
            .and_then(|w| w.conn);
        if let Some(conn) = conn {
            self.send_worker(
                conn,
                CoordinatorToWorker::TaskCancel {
                    job_id,
                    lease_id: lease.id,
                    reason,
                },
            );
        }
    }

    /// A result that arrived while its attempt was settling gets its (now durable) answer. The
    /// settlement's own acknowledgement already covers a resend from the worker whose result it
    /// was; anyone else learns their result did not count.
    fn answer_deferred_ack(&mut self, lease_id: LeaseId, pending: Option<&Pending>) {
        let Some((job_id, worker)) = self.deferred_acks.remove(&lease_id) else {
            return;
        };
        if matches!(pending, Some(Pending::Result { worker: w }) if *w == worker) {
            return;
        }
        self.ack_result(Some(Pending::Result { worker }), job_id, lease_id, false);
    }

    /// Sends `TASK_CANCEL` to any live worker that holds `lease_id` (a rare path: recovery only).
    fn cancel_wherever_reported(&mut self, job_id: JobId, lease_id: LeaseId) {
        let conns: Vec<ConnectionId> = self
            .registry
            .iter()
            .filter(|w| w.alive && w.leases.contains_key(&lease_id))
            .filter_map(|w| w.conn)
            .collect();
        for conn in conns {
            self.send_worker(
                conn,
                CoordinatorToWorker::TaskCancel {
                    job_id,
                    lease_id,
                    reason: CancelReason::LeaseNotCurrent,
                },
            );
        }
    }

    /// Acknowledges a worker's result on the worker's current connection (it may have
    /// reconnected while the result was being made durable).
    fn ack_result(
        &mut self,
        pending: Option<Pending>,
        job_id: JobId,
        lease_id: LeaseId,
        accepted: bool,
    ) {
        let Some(Pending::Result { worker }) = pending else {
            return;
        };
        let conn = self
            .registry
            .get(&worker)
            .filter(|w| w.alive)
            .and_then(|w| w.conn);
        if let Some(conn) = conn {
            self.send_worker(
                conn,
                CoordinatorToWorker::ResultAck {
                    job_id,
                    lease_id,
                    accepted,
                },
            );
        }
    }

    fn answer_submit(&mut self, pending: Option<Pending>, job_id: JobId, existing: bool) {
        if let Some(Pending::Submit { conn, request_id }) = pending {
            self.send_client(
                conn,
                ClientReply::SubmitAccepted {
                    request_id,
                    job_id,
                    existing,
                },
            );
        }
    }

    fn answer_cancel(&mut self, pending: Option<Pending>, job_id: JobId, cancelled: bool) {
        if let Some(Pending::Cancel { conn, request_id }) = pending {
            if let Some(job) = self.table.view(&job_id) {
                self.send_client(
                    conn,
                    ClientReply::CancelResult {
                        request_id,
                        job,
                        cancelled,
                    },
                );
            }
        }
    }
}

/// Derives a new seed from `seed` and `salt` (splitmix64 finalizer), so nearby inputs give
/// unrelated streams.
fn mix_seed(seed: u64, salt: u64) -> u64 {
    let mut z = seed ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;

/// A `partitions` request is for a data-parallel task and within `1..=PARTITIONS_MAX`.
fn check_partitions_request(task: &TaskSpec, partitions: Option<Partitions>) -> Result<(), String> {
    match partitions {
        Some(_) if !task.is_data_parallel() => Err(format!(
            "partitions apply only to max, prime-count-list and prime-sum tasks, not {}",
            task.kind()
        )),
        Some(Partitions::Count(n)) if !(1..=PARTITIONS_MAX).contains(&n) => Err(format!(
            "partitions must be between 1 and {PARTITIONS_MAX} (got {n})"
        )),
        _ => Ok(()),
    }
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut_to(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
