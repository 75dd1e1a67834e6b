//! A small model checker for the whole coordinator.
//!
//! Proptest generates a sequence of actions (workers registering, beating, disconnecting and
//! reporting results, some stale or from the wrong worker; clients submitting, cancelling,
//! waiting and asking for status; time passing; persistence batches held back and released;
//! crashes that lose whatever was not durable). A driver feeds them to a `Coordinator` exactly as
//! its module documentation prescribes and, after every single output, checks the safety
//! invariants of docs/SIMULATION.md that the coordinator owns. After the actions, a liveness
//! phase stops all faults, keeps healthy workers beating and answering, and checks that every
//! acknowledged job ends.
//!
//! The checks, numbered so that failure messages can name them:
//!
//! - (i)    `table().check_invariants()` holds;
//! - (ii)   no worker entry holds more leases than its capacity;
//! - (iii)  every `TASK_ASSIGN` carries a lease id never sent before, and each (job, attempt) is
//!   assigned at most once over the whole run, restarts included;
//! - (iv)   terminal jobs never change, and survive restarts unchanged;
//! - (v)    every job acknowledged by `SUBMIT_ACCEPTED` still exists, restarts included;
//! - (vi)   a job completes only with a result its current lease's worker reported for that lease;
//! - (vii)  durability before visibility: what `SUBMIT_ACCEPTED`, `TASK_ASSIGN`, `TASK_CANCEL`,
//!   `RESULT_ACK{accepted}`, `CANCEL_RESULT` and `WAIT_RESULT` reveal is on disk when they leave;
//! - (viii) liveness once faults stop;
//! - (ix)   whenever the coordinator is idle, recovering from its disk would rebuild exactly the
//!   table it holds (nothing applied is missing from disk, nothing on disk is unapplied).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::Index;

use herder_core::command::Command;
use herder_core::coordinator::{Coordinator, CoordinatorConfig, DiskImage, Link, Output, Record};
use herder_core::ids::{ConnectionId, Incarnation, JobId, LeaseId, RequestId, Term, WorkerId};
use herder_core::job::{Job, JobState};
use herder_core::protocol::codec::FrameError;
use herder_core::protocol::{
    AttemptOutcome, CancelReason, ClientReply, ClientRequest, CoordinatorToWorker, ErrorCode,
    JobView, RunningAttempt, WorkerToCoordinator,
};
use herder_core::table::JobTable;
use herder_core::tasks::{TaskOutput, TaskSpec};
use herder_core::testing::Driver;
use herder_core::time::Instant;

type Check = Result<(), String>;

/// `ensure!(condition, "format", args...)`: fail the check with a message.
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

const WORKERS: [&str; 3] = ["w1", "w2", "w3"];
const KEYS: [&str; 2] = ["key-1", "key-2"];
const BASE_SEED: u64 = 0x5eed;

fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        task_timeout: Duration::from_millis(1_000),
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(300),
        retry_base: Duration::from_millis(50),
        retry_max: Duration::from_millis(400),
        max_active_jobs: 4,
        default_max_attempts: 3,
        ..CoordinatorConfig::default()
    }
}

fn spec(choice: usize) -> TaskSpec {
    match choice % 3 {
        0 => TaskSpec::Sha256 { text: "x".into() },
        1 => TaskSpec::Sleep { milliseconds: 10 },
        _ => TaskSpec::WordCount { text: "a b".into() },
    }
}

// ---------------------------------------------------------------------------------------------
// Actions
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Outcome {
    Succeeded,
    Failed,
    Cancelled,
}

#[derive(Clone, Copy, Debug)]
enum Sender {
    /// The worker the lease was assigned to, on its current connection.
    Owner,
    /// Another worker (owner + 1 or + 2), on its connection.
    Other(usize),
}

#[derive(Clone, Debug)]
enum Action {
    /// A worker process registers on a fresh connection. Same incarnation as the worker's current
    /// process: a reconnect reporting its running attempts; another one: a new process.
    Register {
        worker: usize,
        incarnation: u64,
        capacity: u32,
    },
    Heartbeat {
        worker: usize,
    },
    /// The worker's connection drops (the process lives on and may reconnect).
    Disconnect {
        worker: usize,
    },
    /// A `TASK_RESULT` for some lease seen in a `TASK_ASSIGN` (often an old one).
    Result {
        pick: Index,
        outcome: Outcome,
        sender: Sender,
    },
    Submit {
        spec: usize,
        key: Option<usize>,
        max_attempts: Option<u32>,
    },
    Cancel {
        job: Index,
    },
    Wait {
        job: Index,
        timeout_millis: Option<u64>,
    },
    Status {
        job: Index,
    },
    /// Time passes; nobody heartbeats.
    Advance {
        millis: u64,
    },
    /// Time passes while every connected worker heartbeats every 50 ms.
    AdvanceBeating {
        millis: u64,
    },
    /// From now on persistence batches are held back (not yet durable).
    Hold,
    /// The oldest held batches become durable, in order; `all` also stops holding.
    Release {
        batches: usize,
        all: bool,
    },
    /// The coordinator process dies. The first `written` held batches reached the disk but were
    /// never reported durable; every other held batch is lost. Then it recovers from its disk.
    Crash {
        written: usize,
    },
    /// A worker's connection delivers a frame that does not decode.
    Garble {
        worker: usize,
    },
    /// The client hangs up (its parked waits die with the connection) and connects again.
    ClientReconnect,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => (0..3usize, 1..=3u64, 1..=3u32).prop_map(|(worker, incarnation, capacity)| {
            Action::Register { worker, incarnation, capacity }
        }),
        2 => (0..3usize).prop_map(|worker| Action::Heartbeat { worker }),
        1 => (0..3usize).prop_map(|worker| Action::Disconnect { worker }),
        5 => (
            any::<Index>(),
            prop_oneof![
                4 => Just(Outcome::Succeeded),
                2 => Just(Outcome::Failed),
                1 => Just(Outcome::Cancelled),
            ],
            prop_oneof![4 => Just(Sender::Owner), 1 => (1..3usize).prop_map(Sender::Other)],
        )
            .prop_map(|(pick, outcome, sender)| Action::Result { pick, outcome, sender }),
        4 => (0..3usize, proptest::option::weighted(0.5, 0..2usize), proptest::option::of(1..=3u32))
            .prop_map(|(spec, key, max_attempts)| Action::Submit { spec, key, max_attempts }),
        1 => any::<Index>().prop_map(|job| Action::Cancel { job }),
        1 => (any::<Index>(), proptest::option::weighted(0.7, 0..1_000u64))
            .prop_map(|(job, timeout_millis)| Action::Wait { job, timeout_millis }),
        1 => any::<Index>().prop_map(|job| Action::Status { job }),
        3 => prop_oneof![3 => 0..150u64, 1 => 150..2_000u64].prop_map(|millis| Action::Advance { millis }),
        2 => (0..1_500u64).prop_map(|millis| Action::AdvanceBeating { millis }),
        1 => Just(Action::Hold),
        2 => (1..4usize, proptest::bool::weighted(0.3))
            .prop_map(|(batches, all)| Action::Release { batches, all }),
        1 => (0..3usize).prop_map(|written| Action::Crash { written }),
        1 => (0..3usize).prop_map(|worker| Action::Garble { worker }),
        1 => Just(Action::ClientReconnect),
    ]
}

// ---------------------------------------------------------------------------------------------
// The disk, and facts about what reached it
// ---------------------------------------------------------------------------------------------

/// Monotone facts about durable log entries (entries are discarded once reflected in rows, so
/// the facts are recorded as batches land).
#[derive(Clone, Debug, Default)]
struct Facts {
    /// Job ids of durable `Submit` commands.
    submits: BTreeSet<JobId>,
    /// Durable `Assign` commands: (job, lease) -> worker.
    assigns: BTreeMap<(JobId, LeaseId), WorkerId>,
    /// Durable settling commands (`Complete`, `AttemptFailed`, `Abandon`).
    settles: BTreeSet<(JobId, LeaseId)>,
    /// Durable `Cancel` commands.
    cancels: BTreeSet<JobId>,
}

impl Facts {
    /// Collects the facts a batch's log entries establish, as the batch becomes durable.
    fn record(&mut self, records: &[Record]) {
        for record in records {
            let Record::Log(entry) = record else { continue };
            match &entry.command {
                Command::Submit { job_id, .. } => {
                    self.submits.insert(*job_id);
                }
                Command::Assign { job_id, lease, .. } => {
                    self.assigns
                        .insert((*job_id, lease.id), lease.worker.clone());
                }
                Command::Complete {
                    job_id, lease_id, ..
                }
                | Command::AttemptFailed {
                    job_id, lease_id, ..
                }
                | Command::Release { job_id, lease_id }
                | Command::Abandon { job_id, lease_id } => {
                    self.settles.insert((*job_id, *lease_id));
                }
                Command::Cancel { job_id } => {
                    self.cancels.insert(*job_id);
                }
                Command::Requeue { .. }
                | Command::NewLeader { .. }
                | Command::SetQueue { .. }
                | Command::Due { .. }
                | Command::Purge { .. } => {}
            }
        }
    }
}

/// The table a recovery from `disk` would rebuild.
fn durable_table(disk: &DiskImage) -> Result<JobTable, String> {
    disk.table()
        .map_err(|error| format!("the disk does not recover: {error}"))
}

fn rows(table: &JobTable) -> BTreeMap<JobId, Job> {
    table.jobs().map(|job| (job.id, job.clone())).collect()
}

// ---------------------------------------------------------------------------------------------
// The world around the coordinator
// ---------------------------------------------------------------------------------------------

/// One worker name's current process, as the driver plays it.
#[derive(Clone, Debug, Default)]
struct WorkerProc {
    /// The incarnation of the process that last registered successfully.
    incarnation: Option<u64>,
    /// Its registered, open connection.
    conn: Option<ConnectionId>,
    /// Attempts it was assigned and has not reported: lease -> job.
    executing: BTreeMap<LeaseId, JobId>,
    /// Of those, the ones the coordinator told it to stop.
    cancelled: BTreeSet<LeaseId>,
    /// Results sent and not yet acknowledged: lease -> (job, outcome, connection last sent on).
    unacked: BTreeMap<LeaseId, (JobId, AttemptOutcome, ConnectionId)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Worker(usize, u64),
    Client,
}

#[derive(Clone, Debug)]
struct AssignRecord {
    job: JobId,
    lease: LeaseId,
    worker: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Pending {
    Submit { key: Option<String> },
    Cancel(JobId),
    Wait(JobId),
    Status(JobId),
}

struct Model {
    /// The coordinator process, its disk and its clock, driven by the shared test driver (a new
    /// process's clock starts from zero: nothing measured on the old one carries over).
    d: Driver,
    restarts: u64,
    /// Client connections that were closed; no `WAIT_RESULT` may go to them afterwards.
    closed_clients: BTreeSet<ConnectionId>,
    facts: Facts,

    next_conn: u64,
    open: BTreeMap<ConnectionId, Owner>,
    closed_pending: Vec<ConnectionId>,
    client: ConnectionId,
    workers: Vec<WorkerProc>,
    /// A process's capacity is fixed for its life: (worker, incarnation) -> capacity.
    capacities: BTreeMap<(usize, u64), u32>,

    next_request: u64,
    pending: BTreeMap<RequestId, Pending>,

    // What the checks remember over the whole run, across restarts.
    acked: BTreeSet<JobId>,
    key_binding: BTreeMap<String, JobId>,
    assigns: Vec<AssignRecord>,
    leases_sent: BTreeSet<LeaseId>,
    attempt_lease: BTreeMap<(JobId, u32), (LeaseId, usize)>,
    /// Succeeded outputs each worker reported for each lease.
    reported: BTreeMap<(LeaseId, usize), Vec<TaskOutput>>,
    next_output: u64,
    terminal: BTreeMap<JobId, Job>,
    /// Every non-event output, for the determinism property.
    outputs: Vec<Output>,
    /// `TASK_CANCEL(LEASE_NOT_CURRENT)`s to verify once the current input is fully handled.
    not_current: Vec<(JobId, LeaseId)>,
}

impl Model {
    fn new() -> Model {
        let c = Coordinator::new(config(), BASE_SEED).expect("the test config is valid");
        let mut d = Driver::around(c, Instant::ZERO);
        d.keep_landed = true;
        let mut model = Model {
            d,
            restarts: 0,
            closed_clients: BTreeSet::new(),
            facts: Facts::default(),
            next_conn: 1,
            open: BTreeMap::new(),
            closed_pending: Vec::new(),
            client: ConnectionId(0),
            workers: vec![WorkerProc::default(); WORKERS.len()],
            capacities: BTreeMap::new(),
            next_request: 0,
            pending: BTreeMap::new(),
            acked: BTreeSet::new(),
            key_binding: BTreeMap::new(),
            assigns: Vec::new(),
            leases_sent: BTreeSet::new(),
            attempt_lease: BTreeMap::new(),
            reported: BTreeMap::new(),
            next_output: 0,
            terminal: BTreeMap::new(),
            outputs: Vec::new(),
            not_current: Vec::new(),
        };
        model.client = model.fresh_conn(Owner::Client);
        model
    }

    fn fresh_conn(&mut self, owner: Owner) -> ConnectionId {
        let conn = ConnectionId(self.next_conn);
        self.next_conn += 1;
        self.open.insert(conn, owner);
        conn
    }

    // -----------------------------------------------------------------------------------------
    // Driving the coordinator
    // -----------------------------------------------------------------------------------------

    /// Drains every output, checking after each one; delivers connection-closed notices for the
    /// connections the coordinator closed; ends with the idle-state checks.
    fn pump(&mut self) -> Check {
        loop {
            while let Some(output) = self.d.next_output() {
                self.record_landed();
                self.observe(output)?;
                self.check_state()?;
            }
            self.record_landed();
            self.check_state()?;
            if self.closed_pending.is_empty() {
                break;
            }
            for conn in std::mem::take(&mut self.closed_pending) {
                self.d.c.handle_closed(self.d.now, conn);
            }
        }
        self.check_not_current()?;
        self.check_idle()
    }

    /// A lease a worker was told is not current must really be dead: not current in the applied
    /// table, or with a settling command already on disk or in a batch on its way there.
    fn check_not_current(&mut self) -> Check {
        for (job_id, lease_id) in std::mem::take(&mut self.not_current) {
            if !self.d.c.table().is_current_lease(job_id, lease_id) {
                continue;
            }
            let settles = |command: &Command| match command {
                Command::Complete {
                    job_id: j,
                    lease_id: l,
                    ..
                }
                | Command::AttemptFailed {
                    job_id: j,
                    lease_id: l,
                    ..
                }
                | Command::Abandon {
                    job_id: j,
                    lease_id: l,
                } => *j == job_id && *l == lease_id,
                _ => false,
            };
            let in_flight = self.d.held.iter().any(|batch| {
                batch
                    .records
                    .iter()
                    .any(|record| matches!(record, Record::Log(entry) if settles(&entry.command)))
            });
            ensure!(
                in_flight || self.facts.settles.contains(&(job_id, lease_id)),
                "TASK_CANCEL(LEASE_NOT_CURRENT) for lease {lease_id} of {job_id}, which is current \
                 and has no settlement on its way"
            );
        }
        Ok(())
    }

    /// Learns the facts of every batch that reached the disk since last asked.
    fn record_landed(&mut self) {
        for batch in std::mem::take(&mut self.d.landed) {
            self.facts.record(&batch.records);
        }
    }

    fn observe(&mut self, output: Output) -> Check {
        if !matches!(output, Output::Event(_) | Output::Persist(_)) {
            self.outputs.push(output.clone());
        }
        match output {
            Output::Persist(_) => return Err("the driver handed a batch to the model".into()),
            Output::ToWorker { conn, message } => {
                self.check_worker_message(conn, &message)?;
                if let Some(Owner::Worker(worker, incarnation)) = self.open.get(&conn).copied() {
                    self.worker_receives(worker, incarnation, conn, message);
                }
            }
            Output::ToClient { conn, message } => {
                ensure!(
                    !(self.closed_clients.contains(&conn)
                        && matches!(message, ClientReply::WaitResult { .. })),
                    "a WAIT_RESULT for a connection that was closed: {message:?}"
                );
                if conn == self.client {
                    self.client_receives(message)?;
                }
            }
            Output::Close { conn } => {
                if let Some(owner) = self.open.remove(&conn) {
                    if let Owner::Worker(worker, _) = owner {
                        if self.workers[worker].conn == Some(conn) {
                            self.workers[worker].conn = None;
                        }
                    }
                    self.closed_pending.push(conn);
                }
            }
            Output::Event(_) => {}
            Output::ToPeer { to, .. } => {
                ensure!(false, "a group of one sent a peer message to {to}");
            }
        }
        Ok(())
    }

    fn worker_receives(
        &mut self,
        worker: usize,
        incarnation: u64,
        conn: ConnectionId,
        message: CoordinatorToWorker,
    ) {
        let proc = &mut self.workers[worker];
        let this_process = proc.incarnation == Some(incarnation);
        match message {
            CoordinatorToWorker::Registered { .. } => {
                if !this_process {
                    // A new process took over the name: the old one's work is gone.
                    *proc = WorkerProc {
                        incarnation: Some(incarnation),
                        ..WorkerProc::default()
                    };
                }
                proc.conn = Some(conn);
            }
            CoordinatorToWorker::TaskAssign {
                term: Term(1),
                job_id,
                lease_id,
                ..
            } if this_process => {
                proc.executing.insert(lease_id, job_id);
            }
            CoordinatorToWorker::TaskCancel { lease_id, .. }
                if this_process && proc.executing.contains_key(&lease_id) =>
            {
                proc.cancelled.insert(lease_id);
            }
            CoordinatorToWorker::ResultAck { lease_id, .. } if this_process => {
                proc.unacked.remove(&lease_id);
            }
            _ => {}
        }
    }

    fn send_worker(&mut self, conn: ConnectionId, message: WorkerToCoordinator) -> Check {
        self.d.c.handle_worker_message(self.d.now, conn, message);
        self.pump()
    }

    fn send_client(&mut self, message: ClientRequest, pending: Pending) -> Check {
        self.pending.insert(message.request_id(), pending);
        self.d.c.handle_client_message(
            self.d.now,
            self.client,
            &herder_core::auth::Caller::anonymous(),
            message,
        );
        self.pump()
    }

    fn request_id(&mut self) -> RequestId {
        self.next_request += 1;
        RequestId(self.next_request)
    }

    /// Moves time forward to `now + millis`, firing every timer on the way, in order.
    fn advance(&mut self, millis: u64) -> Check {
        let target = self.d.now.saturating_add(Duration::from_millis(millis));
        while self.d.fire_next_timer(target) {
            self.pump()?;
        }
        self.d.now = target;
        Ok(())
    }

    fn heartbeat_all(&mut self) -> Check {
        for worker in 0..WORKERS.len() {
            if let Some(conn) = self.workers[worker].conn {
                self.send_worker(conn, WorkerToCoordinator::Heartbeat {})?;
            }
        }
        Ok(())
    }

    fn advance_beating(&mut self, millis: u64) -> Check {
        let mut left = millis;
        while left > 0 {
            let step = left.min(50);
            self.advance(step)?;
            left -= step;
            self.heartbeat_all()?;
        }
        Ok(())
    }

    /// Makes the oldest `count` held batches durable and reports the last one.
    fn release(&mut self, count: usize) -> Check {
        if !self.d.land_held(count) {
            return Ok(());
        }
        self.pump()
    }

    fn register(&mut self, worker: usize, incarnation: u64, capacity: u32) -> Check {
        let capacity = *self
            .capacities
            .entry((worker, incarnation))
            .or_insert(capacity);
        let conn = self.fresh_conn(Owner::Worker(worker, incarnation));
        let proc = &self.workers[worker];
        // An honest process reports what it is executing; a new process executes nothing.
        let running: Vec<RunningAttempt> = if proc.incarnation == Some(incarnation) {
            proc.executing
                .iter()
                .map(|(&lease_id, &job_id)| RunningAttempt { job_id, lease_id })
                .collect()
        } else {
            Vec::new()
        };
        self.send_worker(
            conn,
            WorkerToCoordinator::Register {
                draining: false,
                tasks: herder_core::protocol::builtin_task_names(),
                worker_id: WorkerId(WORKERS[worker].to_owned()),
                incarnation: Incarnation(incarnation),
                capacity,
                prefetch: 0,
                running,
                finished: Vec::new(),
                queues: None,
            },
        )?;
        // Results still waiting for an acknowledgement are sent again after registering.
        if self.workers[worker].conn == Some(conn) {
            self.retransmit(worker)?;
        }
        Ok(())
    }

    fn retransmit(&mut self, worker: usize) -> Check {
        let Some(conn) = self.workers[worker].conn else {
            return Ok(());
        };
        let due: Vec<(LeaseId, JobId, AttemptOutcome)> = self.workers[worker]
            .unacked
            .iter()
            .filter(|(_, (_, _, sent_on))| *sent_on != conn)
            .map(|(&lease, (job, outcome, _))| (lease, *job, outcome.clone()))
            .collect();
        for (lease_id, job_id, outcome) in due {
            if let Some(entry) = self.workers[worker].unacked.get_mut(&lease_id) {
                entry.2 = conn;
            }
            self.send_worker(
                conn,
                WorkerToCoordinator::TaskResult {
                    job_id,
                    lease_id,
                    outcome,
                },
            )?;
            if self.workers[worker].conn != Some(conn) {
                break;
            }
        }
        Ok(())
    }

    fn outcome(&mut self, outcome: Outcome, lease: LeaseId, sender: usize) -> AttemptOutcome {
        match outcome {
            Outcome::Succeeded => {
                // Unique per report, so a completed job's result names the report it came from.
                self.next_output += 1;
                let output = TaskOutput::Sha256 {
                    hex: format!("{lease}/{}/{}", WORKERS[sender], self.next_output),
                };
                self.reported
                    .entry((lease, sender))
                    .or_default()
                    .push(output.clone());
                AttemptOutcome::Succeeded { output }
            }
            Outcome::Failed => AttemptOutcome::Failed {
                permanent: false,
                error: "it broke".into(),
            },
            Outcome::Cancelled => AttemptOutcome::Cancelled {},
        }
    }

    /// `sender` reports `lease` of `job` on its current connection, if it has one.
    fn report(&mut self, sender: usize, job: JobId, lease: LeaseId, outcome: Outcome) -> Check {
        let Some(conn) = self.workers[sender].conn else {
            return Ok(());
        };
        let outcome = self.outcome(outcome, lease, sender);
        let proc = &mut self.workers[sender];
        if proc.executing.remove(&lease).is_some() {
            proc.cancelled.remove(&lease);
            proc.unacked.insert(lease, (job, outcome.clone(), conn));
        }
        self.send_worker(
            conn,
            WorkerToCoordinator::TaskResult {
                job_id: job,
                lease_id: lease,
                outcome,
            },
        )
    }

    fn crash(&mut self, written: usize) -> Check {
        self.d.crash(written);
        self.record_landed();
        // Every connection dies with the process; parked requests go unanswered.
        self.closed_clients.insert(self.client);
        self.open.clear();
        self.closed_pending.clear();
        self.pending.clear();
        for proc in &mut self.workers {
            proc.conn = None;
        }
        self.restarts += 1;
        // A new process draws a new seed (ids drawn by the old one must not come back).
        let seed = BASE_SEED.wrapping_add(self.restarts.wrapping_mul(0x9e37_79b9));
        self.d
            .recover_at(config(), seed, Instant::ZERO)
            .map_err(|error| format!("recovery failed: {error}"))?;
        self.client = self.fresh_conn(Owner::Client);
        self.pump()
    }

    fn known_job(&self, pick: &Index) -> JobId {
        let mut jobs: BTreeSet<JobId> = self.acked.clone();
        jobs.extend(self.d.c.table().jobs().map(|job| job.id));
        if jobs.is_empty() {
            return JobId(uuid::Uuid::from_u128(7));
        }
        let jobs: Vec<JobId> = jobs.into_iter().collect();
        *pick.get(&jobs)
    }

    fn perform(&mut self, action: &Action) -> Check {
        match action {
            Action::Register {
                worker,
                incarnation,
                capacity,
            } => self.register(*worker, *incarnation, *capacity),
            Action::Heartbeat { worker } => match self.workers[*worker].conn {
                Some(conn) => self.send_worker(conn, WorkerToCoordinator::Heartbeat {}),
                None => Ok(()),
            },
            Action::Disconnect { worker } => {
                let Some(conn) = self.workers[*worker].conn.take() else {
                    return Ok(());
                };
                self.open.remove(&conn);
                self.d.c.handle_closed(self.d.now, conn);
                self.pump()
            }
            Action::Result {
                pick,
                outcome,
                sender,
            } => {
                if self.assigns.is_empty() {
                    return Ok(());
                }
                let record = pick.get(&self.assigns).clone();
                let from = match sender {
                    Sender::Owner => record.worker,
                    Sender::Other(k) => (record.worker + k) % WORKERS.len(),
                };
                self.report(from, record.job, record.lease, *outcome)
            }
            Action::Submit {
                spec: choice,
                key,
                max_attempts,
            } => {
                let request_id = self.request_id();
                let key = key.map(|k| KEYS[k].to_owned());
                self.send_client(
                    ClientRequest::Submit {
                        timeout_millis: None,
                        partitions: None,
                        request_id,
                        task: spec(*choice).to_json(),
                        max_attempts: *max_attempts,
                        idempotency_key: key.clone(),
                        fairness_key: None,
                        priority: None,
                        queue: None,
                        delay_millis: None,
                        run_at_unix_ms: None,
                        retry_of: None,
                        after: Vec::new(),
                        after_any_outcome: false,
                    },
                    Pending::Submit { key },
                )
            }
            Action::Cancel { job } => {
                let job_id = self.known_job(job);
                let request_id = self.request_id();
                self.send_client(
                    ClientRequest::Cancel { request_id, job_id },
                    Pending::Cancel(job_id),
                )
            }
            Action::Wait {
                job,
                timeout_millis,
            } => {
                let job_id = self.known_job(job);
                let request_id = self.request_id();
                self.send_client(
                    ClientRequest::Wait {
                        request_id,
                        job_id,
                        timeout_millis: *timeout_millis,
                    },
                    Pending::Wait(job_id),
                )
            }
            Action::Status { job } => {
                let job_id = self.known_job(job);
                let request_id = self.request_id();
                self.send_client(
                    ClientRequest::Status { request_id, job_id },
                    Pending::Status(job_id),
                )
            }
            Action::Advance { millis } => self.advance(*millis),
            Action::AdvanceBeating { millis } => self.advance_beating(*millis),
            Action::Hold => {
                self.d.hold_writes = true;
                Ok(())
            }
            Action::Release { batches, all } => {
                if *all {
                    self.d.hold_writes = false;
                    let count = self.d.held.len();
                    self.release(count)
                } else {
                    self.release(*batches)
                }
            }
            Action::Crash { written } => self.crash(*written),
            Action::Garble { worker } => {
                let Some(conn) = self.workers[*worker].conn else {
                    return Ok(());
                };
                let error = FrameError::InvalidJson {
                    detail: "expected value at line 1 column 1".into(),
                };
                self.d
                    .c
                    .handle_malformed(self.d.now, conn, Link::Worker, &error);
                self.pump()?;
                ensure!(
                    self.workers[*worker].conn.is_none() && !self.open.contains_key(&conn),
                    "a garbled worker connection was not closed"
                );
                Ok(())
            }
            Action::ClientReconnect => {
                let old = self.client;
                self.open.remove(&old);
                self.closed_clients.insert(old);
                self.pending.clear();
                self.d.c.handle_closed(self.d.now, old);
                self.client = self.fresh_conn(Owner::Client);
                self.pump()
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Liveness (viii)
    // -----------------------------------------------------------------------------------------

    fn all_done(&self) -> bool {
        self.d.held.is_empty()
            && self.d.c.table().active_jobs() == 0
            && self
                .acked
                .iter()
                .all(|id| self.d.c.job(id).is_some_and(|job| job.state.is_terminal()))
    }

    /// Faults stop: writes go through, every worker reconnects and stays healthy, answers every
    /// assignment with success (or "cancelled" when told to stop), and time passes.
    fn settle(&mut self) -> Check {
        self.d.hold_writes = false;
        let count = self.d.held.len();
        self.release(count)?;
        let mut bump = [0u64; 3];
        for _round in 0..400 {
            for (worker, extra) in bump.iter_mut().enumerate() {
                if self.workers[worker].conn.is_none() {
                    let incarnation = self.workers[worker].incarnation.unwrap_or(1) + *extra;
                    self.register(worker, incarnation, 2)?;
                    if self.workers[worker].conn.is_none() {
                        // Refused (the name is still held by a process the coordinator thinks
                        // is alive): come back as a new process next round.
                        *extra += 10;
                    }
                }
            }
            for worker in 0..WORKERS.len() {
                self.retransmit(worker)?;
                let executing: Vec<(LeaseId, JobId)> = self.workers[worker]
                    .executing
                    .iter()
                    .map(|(&lease, &job)| (lease, job))
                    .collect();
                for (lease, job) in executing {
                    let outcome = if self.workers[worker].cancelled.contains(&lease) {
                        Outcome::Cancelled
                    } else {
                        Outcome::Succeeded
                    };
                    self.report(worker, job, lease, outcome)?;
                }
            }
            self.heartbeat_all()?;
            if self.all_done() && self.pending.is_empty() {
                ensure!(
                    self.d.c.awaiting_readoption() == 0,
                    "attempts still awaiting re-adoption after everything ended"
                );
                return Ok(());
            }
            self.advance(50)?;
        }
        let stuck: Vec<String> = self
            .d
            .c
            .table()
            .jobs()
            .filter(|job| !job.state.is_terminal())
            .map(|job| {
                format!(
                    "{} {} attempt {}/{}",
                    job.id, job.state, job.attempt, job.max_attempts
                )
            })
            .collect();
        let workers: Vec<String> = self
            .d
            .c
            .workers()
            .map(|w| {
                format!(
                    "{} alive={} cap={} leases={:?}",
                    w.id, w.alive, w.capacity, w.leases
                )
            })
            .collect();
        Err(format!(
            "liveness: not everything ended after 20 s of healthy operation; stuck: {stuck:?}; \
             workers: {workers:?}; awaiting re-adoption: {}; unanswered requests: {:?}",
            self.d.c.awaiting_readoption(),
            self.pending
        ))
    }

    // -----------------------------------------------------------------------------------------
    // Checks
    // -----------------------------------------------------------------------------------------

    /// (vii) and (iii) for messages to workers.
    fn check_worker_message(&mut self, conn: ConnectionId, message: &CoordinatorToWorker) -> Check {
        match message {
            CoordinatorToWorker::TaskAssign {
                term: Term(1),
                job_id,
                lease_id,
                attempt,
                max_attempts,
                ..
            } => {
                ensure!(
                    self.leases_sent.insert(*lease_id),
                    "(iii) lease {lease_id} was sent in a TASK_ASSIGN before"
                );
                ensure!(
                    attempt.0 >= 1 && attempt.0 <= *max_attempts,
                    "(iii) TASK_ASSIGN for attempt {attempt} of {max_attempts}"
                );
                let durable_worker = self.facts.assigns.get(&(*job_id, *lease_id));
                ensure!(
                    durable_worker.is_some(),
                    "(vii) TASK_ASSIGN {job_id}/{lease_id} left before its Assign was durable"
                );
                let worker = match self.open.get(&conn) {
                    Some(Owner::Worker(worker, _)) => *worker,
                    other => return Err(format!("TASK_ASSIGN on a non-worker connection ({other:?})")),
                };
                ensure!(
                    durable_worker.map(WorkerId::as_str) == Some(WORKERS[worker]),
                    "TASK_ASSIGN for a lease of {durable_worker:?} sent to {}",
                    WORKERS[worker]
                );
                let previous = self
                    .attempt_lease
                    .insert((*job_id, attempt.0), (*lease_id, worker));
                ensure!(
                    previous.is_none(),
                    "(iii) attempt {attempt} of job {job_id} was assigned twice: {previous:?} and {lease_id}"
                );
                self.assigns.push(AssignRecord {
                    job: *job_id,
                    lease: *lease_id,
                    worker,
                });
            }
            CoordinatorToWorker::ResultAck {
                term: Term(1),
                job_id,
                lease_id,
                accepted: true,
            } => ensure!(
                self.facts.settles.contains(&(*job_id, *lease_id)),
                "(vii) RESULT_ACK accepted for {job_id}/{lease_id} before its settlement was durable"
            ),
            CoordinatorToWorker::TaskCancel {
                term: Term(1),
                job_id,
                lease_id,
                reason,
            } => match reason {
                CancelReason::JobCancelled => ensure!(
                    self.facts.cancels.contains(job_id),
                    "(vii) TASK_CANCEL(job cancelled) for {job_id} before the cancel was durable"
                ),
                CancelReason::DeadlineExpired => ensure!(
                    self.facts.settles.contains(&(*job_id, *lease_id)),
                    "(vii) TASK_CANCEL(deadline) for {job_id}/{lease_id} before the failure was durable"
                ),
                // Sent while reconciling a registration, not while applying: the lease may still be
                // current in the table with its settlement proposed but not yet durable. Checked
                // once the handler's outputs are drained (see `check_not_current`).
                CancelReason::LeaseNotCurrent => self.not_current.push((*job_id, *lease_id)),
            },
            _ => {}
        }
        Ok(())
    }

    /// A job view a client is shown must agree with what a recovery would find.
    fn check_view_is_durable(&self, what: &str, view: &JobView) -> Check {
        let durable = durable_table(&self.d.disk)?;
        let Some(job) = durable.get(&view.id) else {
            return Err(format!(
                "(vii) {what} shows job {} which is not on disk",
                view.id
            ));
        };
        if view.state.is_terminal() {
            ensure!(
                job.state == view.state && job.result == view.result,
                "(vii) {what} shows {} as {} but the disk has {}",
                view.id,
                view.state,
                job.state
            );
        }
        Ok(())
    }

    fn client_receives(&mut self, reply: ClientReply) -> Check {
        let Some(request_id) = reply.request_id() else {
            return Err(format!(
                "a connection-level error on a healthy client: {reply:?}"
            ));
        };
        let Some(pending) = self.pending.remove(&request_id) else {
            return Err(format!("a reply to no outstanding request: {reply:?}"));
        };
        match (&pending, &reply) {
            (
                Pending::Submit { key },
                ClientReply::SubmitAccepted {
                    term: Term(1),
                    job_id,
                    existing,
                    ..
                },
            ) => {
                ensure!(
                    self.facts.submits.contains(job_id),
                    "(vii) SUBMIT_ACCEPTED for {job_id} before its Submit was durable"
                );
                ensure!(
                    durable_table(&self.d.disk)?.get(job_id).is_some(),
                    "(vii) SUBMIT_ACCEPTED for {job_id}, which a recovery would not find"
                );
                if !existing {
                    ensure!(
                        !self.acked.contains(job_id),
                        "a job acknowledged as new twice: {job_id}"
                    );
                }
                if let Some(key) = key {
                    let bound = self.key_binding.entry(key.clone()).or_insert(*job_id);
                    ensure!(
                        *bound == *job_id,
                        "invariant 5: key {key:?} acknowledged for {bound} and for {job_id}"
                    );
                }
                self.acked.insert(*job_id);
            }
            (
                Pending::Submit { .. },
                ClientReply::SubmitRejected {
                    active_jobs,
                    admitting_jobs,
                    max_active_jobs,
                    retryable,
                    ..
                },
            ) => {
                // Every slot being admitted is a submission still being written: one held back
                // from the disk (a written one has applied; none of these tasks is split).
                let writing = self
                    .d
                    .held
                    .iter()
                    .flat_map(|batch| &batch.records)
                    .filter(|r| {
                        matches!(r, Record::Log(e) if matches!(e.command, Command::Submit { .. }))
                    })
                    .count() as u64;
                ensure!(
                    *admitting_jobs <= writing,
                    "a rejection counts {admitting_jobs} submissions being admitted, but only {writing} are being written: {reply:?}"
                );
                ensure!(
                    *retryable && active_jobs + admitting_jobs >= *max_active_jobs,
                    "a submission rejected below the limit: {reply:?}"
                )
            }
            (
                Pending::Submit { key: Some(_) },
                ClientReply::Error {
                    code: ErrorCode::IdempotencyConflict,
                    ..
                },
            ) => {}
            (Pending::Status(id), ClientReply::Job { job, .. }) => {
                ensure!(job.id == *id, "STATUS answered for another job");
                self.check_view_is_durable("JOB", job)?;
            }
            (Pending::Wait(id), ClientReply::WaitResult { job, timed_out, .. }) => {
                ensure!(job.id == *id, "WAIT answered for another job");
                ensure!(
                    *timed_out || job.state.is_terminal(),
                    "WAIT answered early with a non-terminal job: {reply:?}"
                );
                self.check_view_is_durable("WAIT_RESULT", job)?;
            }
            (Pending::Cancel(id), ClientReply::CancelResult { job, cancelled, .. }) => {
                ensure!(job.id == *id, "CANCEL answered for another job");
                if *cancelled {
                    ensure!(
                        self.facts.cancels.contains(id) && job.state == JobState::Cancelled,
                        "(vii) CANCEL_RESULT(cancelled) for {id} before the cancel was durable"
                    );
                } else {
                    ensure!(
                        job.state.is_terminal(),
                        "CANCEL_RESULT(not cancelled) for a live job: {reply:?}"
                    );
                }
                self.check_view_is_durable("CANCEL_RESULT", job)?;
            }
            (
                Pending::Status(_) | Pending::Wait(_) | Pending::Cancel(_),
                ClientReply::Error {
                    code: ErrorCode::JobNotFound,
                    ..
                },
            ) => {}
            _ => return Err(format!("unexpected reply {reply:?} to {pending:?}")),
        }
        Ok(())
    }

    /// Checks that must hold after every output.
    fn check_state(&mut self) -> Check {
        let table = self.d.c.table();
        // (i)
        table
            .check_invariants()
            .map_err(|violation| format!("(i) {violation}"))?;
        // (ii)
        for worker in self.d.c.workers() {
            ensure!(
                worker.leases.len() <= worker.lease_bound(),
                "(ii) worker {} holds {} leases with capacity {} and prefetch {}",
                worker.id,
                worker.leases.len(),
                worker.capacity,
                worker.prefetch
            );
        }
        // (iv)
        for (id, frozen) in &self.terminal {
            match table.get(id) {
                Some(job) => ensure!(
                    job == frozen,
                    "(iv) terminal job {id} changed from {frozen:?} to {job:?}"
                ),
                None => return Err(format!("(iv) terminal job {id} disappeared")),
            }
        }
        // (v)
        for id in &self.acked {
            ensure!(table.get(id).is_some(), "(v) acknowledged job {id} is gone");
        }
        // (vi), and remember newly terminal jobs for (iv).
        let newly_terminal: Vec<Job> = table
            .jobs()
            .filter(|job| job.state.is_terminal() && !self.terminal.contains_key(&job.id))
            .cloned()
            .collect();
        for job in newly_terminal {
            if job.state == JobState::Completed {
                let Some(&(lease, worker)) = self.attempt_lease.get(&(job.id, job.attempt.0))
                else {
                    return Err(format!(
                        "(vi) job {} completed on attempt {} which was never assigned",
                        job.id, job.attempt
                    ));
                };
                let result = job.result.as_ref().expect("completed jobs have a result");
                let reports = self.reported.get(&(lease, worker));
                ensure!(
                    reports.is_some_and(|list| list.contains(result)),
                    "(vi) job {} completed with {result:?}, which {} never reported for its \
                     current lease {lease} (reports: {reports:?})",
                    job.id,
                    WORKERS[worker]
                );
                ensure!(
                    job.last_worker.as_ref().map(WorkerId::as_str) == Some(WORKERS[worker]),
                    "(vi) job {} completed with last worker {:?}, not {}",
                    job.id,
                    job.last_worker,
                    WORKERS[worker]
                );
            }
            self.terminal.insert(job.id, job);
        }
        Ok(())
    }

    /// (ix): with nothing left to do, the disk rebuilds exactly the applied table. This holds
    /// while batches are held too: nothing in a held batch may have been applied yet.
    fn check_idle(&self) -> Check {
        let durable = durable_table(&self.d.disk)?;
        ensure!(
            rows(&durable) == rows(self.d.c.table()),
            "(ix) recovery from disk would not rebuild the applied table ({} held batches)\n disk: {:?}\n applied: {:?}",
            self.d.held.len(),
            rows(&durable),
            rows(self.d.c.table())
        );
        ensure!(
            durable.applied_index() == self.d.c.table().applied_index(),
            "(ix) the disk reflects index {} but the table applied {}",
            durable.applied_index(),
            self.d.c.table().applied_index()
        );
        Ok(())
    }
}

/// Runs the actions and then the liveness phase; returns the model for further inspection.
fn run(actions: &[Action]) -> Result<Model, String> {
    let mut model = Model::new();
    model.pump()?;
    for (step, action) in actions.iter().enumerate() {
        model
            .perform(action)
            .map_err(|error| format!("at step {step} ({action:?}): {error}"))?;
    }
    model
        .settle()
        .map_err(|error| format!("in the liveness phase: {error}"))?;
    Ok(model)
}

fn actions(max: usize) -> impl Strategy<Value = Vec<Action>> {
    proptest::collection::vec(action(), 1..max)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// Every safety check after every output, then liveness.
    #[test]
    fn the_coordinator_is_safe_under_any_schedule_and_live_once_faults_stop(actions in actions(60)) {
        if let Err(failure) = run(&actions) {
            return Err(TestCaseError::fail(failure));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// The same, over long schedules (many restarts, long-lived workers, jobs on their last
    /// attempts).
    #[test]
    fn long_schedules_stay_safe_and_live(actions in actions(200)) {
        if let Err(failure) = run(&actions) {
            return Err(TestCaseError::fail(failure));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(150))]

    /// Invariant 9: the same seed and the same inputs give the same outputs.
    #[test]
    fn the_same_schedule_gives_the_same_outputs(actions in actions(40)) {
        let first = run(&actions).map_err(TestCaseError::fail)?;
        let second = run(&actions).map_err(TestCaseError::fail)?;
        prop_assert!(first.outputs == second.outputs, "outputs differ between identical runs");
        prop_assert_eq!(rows(first.d.c.table()), rows(second.d.c.table()));
    }
}

/// Guards against a generator that silently stops exercising the coordinator: over a fixed set
/// of schedules, the interesting things all happen somewhere.
#[test]
fn the_schedules_reach_the_interesting_cases() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let mut seen: BTreeSet<&'static str> = BTreeSet::new();
    for _ in 0..120 {
        let actions = actions(60)
            .new_tree(&mut runner)
            .expect("strategy generates")
            .current();
        let model = run(&actions).unwrap_or_else(|failure| panic!("{failure}\n{actions:?}"));
        for output in &model.outputs {
            let name = match output {
                Output::ToWorker { message, .. } => match message {
                    CoordinatorToWorker::TaskAssign { attempt, .. } if attempt.0 > 1 => {
                        "retry assigned"
                    }
                    CoordinatorToWorker::TaskCancel { reason, .. } => match reason {
                        CancelReason::JobCancelled => "cancel: job cancelled",
                        CancelReason::DeadlineExpired => "cancel: deadline",
                        CancelReason::LeaseNotCurrent => "cancel: not current",
                    },
                    CoordinatorToWorker::ResultAck { accepted: true, .. } => "result accepted",
                    CoordinatorToWorker::ResultAck {
                        term: Term(1),
                        accepted: false,
                        ..
                    } => "result rejected",
                    CoordinatorToWorker::RegisterRejected { .. } => "registration refused",
                    _ => "other",
                },
                Output::ToClient { message, .. } => match message {
                    ClientReply::SubmitAccepted { existing: true, .. } => "idempotent replay",
                    ClientReply::SubmitRejected { .. } => "admission refused",
                    ClientReply::Error {
                        code: ErrorCode::IdempotencyConflict,
                        ..
                    } => "idempotency conflict",
                    ClientReply::WaitResult {
                        timed_out: true, ..
                    } => "wait timed out",
                    ClientReply::WaitResult {
                        timed_out: false, ..
                    } => "wait answered",
                    ClientReply::CancelResult {
                        term: Term(1),
                        cancelled: false,
                        ..
                    } => "cancel too late",
                    _ => "other",
                },
                _ => "other",
            };
            seen.insert(name);
        }
        if model.restarts > 0 {
            seen.insert("restart");
        }
        for job in model.terminal.values() {
            seen.insert(match job.state {
                JobState::Completed => "completed",
                JobState::Failed => "failed",
                _ => "cancelled",
            });
        }
    }
    let wanted = [
        "retry assigned",
        "cancel: job cancelled",
        "cancel: deadline",
        "cancel: not current",
        "result accepted",
        "result rejected",
        "registration refused",
        "idempotent replay",
        "admission refused",
        "idempotency conflict",
        "wait timed out",
        "wait answered",
        "cancel too late",
        "restart",
        "completed",
        "failed",
        "cancelled",
    ];
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|w| !seen.contains(w))
        .collect();
    assert!(missing.is_empty(), "never reached: {missing:?}");
}

// ---------------------------------------------------------------------------------------------
// Found while building the model: a recovered coordinator re-draws its ids from the seed alone
// ---------------------------------------------------------------------------------------------

/// `Coordinator::recover` seeds its id generator from the `seed` argument only. A driver that
/// restarts a coordinator with the seed its previous process used (a fixed seed, as
/// `herder_runtime::CoordinatorOptions::seed` allows, or a deterministic simulator restarting a
/// node) makes the new process draw the same job and lease ids again. The first submission after
/// such a restart proposed a job id that already existed, `JobTable::apply` panicked (it now
/// refuses such an entry instead), and because that `Submit` entry was already durable, every
/// later recovery replayed it and panicked again: the disk was poisoned. Every lease must get a
/// fresh id, and no input may crash or corrupt the coordinator.
///
/// Minimal sequence: `new(seed 42)`, SUBMIT (durable, accepted), crash, `recover(seed 42)`,
/// SUBMIT -> panic; `recover(any seed)` from the same disk -> panic.
#[test]
fn recovering_with_the_previous_processes_seed_does_not_reissue_job_ids() {
    use std::panic::{catch_unwind, AssertUnwindSafe};

    fn submit(c: &mut Coordinator, disk: &mut DiskImage, request: u64) -> Vec<ClientReply> {
        c.handle_client_message(
            Instant::ZERO,
            ConnectionId(1),
            &herder_core::auth::Caller::anonymous(),
            ClientRequest::Submit {
                timeout_millis: None,
                partitions: None,
                request_id: RequestId(request),
                task: spec(1).to_json(),
                max_attempts: None,
                idempotency_key: None,
                fairness_key: None,
                priority: None,
                queue: None,
                delay_millis: None,
                run_at_unix_ms: None,
                retry_of: None,
                after: Vec::new(),
                after_any_outcome: false,
            },
        );
        let mut replies = Vec::new();
        let mut facts = Facts::default();
        while let Some(output) = c.poll_output() {
            match output {
                Output::Persist(batch) => {
                    facts.record(&batch.records);
                    disk.write(&batch.records);
                    c.handle_persisted(Instant::ZERO, batch.id);
                }
                Output::ToClient { message, .. } => replies.push(message),
                _ => {}
            }
        }
        replies
    }

    let mut disk = DiskImage::default();
    let mut first = Coordinator::new(config(), 42).expect("valid config");
    let accepted = submit(&mut first, &mut disk, 1);
    let [ClientReply::SubmitAccepted {
        term: Term(1),
        job_id: first_job,
        ..
    }] = accepted[..]
    else {
        panic!("expected one acceptance, got {accepted:?}");
    };
    drop(first);

    let mut second =
        Coordinator::recover(config(), 42, Instant::ZERO, disk.durable_state()).expect("recovers");
    let outcome = catch_unwind(AssertUnwindSafe(|| submit(&mut second, &mut disk, 2)));
    let replies = outcome.unwrap_or_else(|_| {
        panic!(
            "BUG: after recovering with the previous process's seed, a new submission re-drew \
             job id {first_job} and the coordinator panicked applying it"
        )
    });
    assert!(
        replies.iter().all(|reply| !matches!(
            reply,
            ClientReply::SubmitAccepted { job_id, .. } if *job_id == first_job
        )),
        "a second job was acknowledged under the first job's id"
    );
    let again = catch_unwind(AssertUnwindSafe(|| {
        Coordinator::recover(config(), 7, Instant::ZERO, disk.durable_state()).map(|_| ())
    }));
    assert!(
        matches!(again, Ok(Ok(()))),
        "BUG: the disk no longer recovers with any seed"
    );
}
