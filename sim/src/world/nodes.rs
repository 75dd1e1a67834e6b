//! The nodes: coordinators, workers and clients, each with its machine, its clock and what its
//! current process holds, and the drivers that drain each machine's outputs into the world —
//! messages onto the network, batches onto the disk, tasks run on a worker — checking on the
//! way what a coordinator says and what each client operation is answered with.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use herder_core::client::{Client, ClientOutput, ConnectAttempt, Operation};
use herder_core::coordinator::{Coordinator, CoordinatorConfig, Event, Output, PersistBatch};
use herder_core::ids::{ConnectionId, JobId, LeaseId, NodeId, RequestId};
use herder_core::protocol::{
    AttemptOutcome, CancelReason, ClientReply, CoordinatorToWorker, ErrorCode, JobSubmission,
    SubmitResult, WorkerToCoordinator,
};
use herder_core::queues::HeldBack;
use herder_core::tasks::{self, TaskSpec};
use herder_core::time::{Instant, UnixMillis};
use herder_core::worker::{TaskAssignment, Worker, WorkerConfig, WorkerEvent, WorkerOutput};

use super::events::Ev;
use super::network::{Close, Down, Peer, Up};
use super::World;
use crate::checker::{Check, ConnOwner, Disk};
use crate::rng::SimRng;
use crate::scenario::Scenario;
use crate::submission::Subject;

/// A node of the world. Indices are stable for the whole run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NodeRef {
    Coordinator(usize),
    Worker(usize),
    Client(usize),
    /// The world itself (faults, phases).
    World,
}

impl fmt::Display for NodeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeRef::Coordinator(i) => write!(f, "coord-{i}"),
            NodeRef::Worker(i) => write!(f, "w{i}"),
            NodeRef::Client(i) => write!(f, "client-{i}"),
            NodeRef::World => f.write_str("world"),
        }
    }
}

/// A process's monotonic clock: `offset + e + drift * e`, where `e` is the virtual time elapsed
/// since the process started (`start_us`). Like a runtime's clock (microseconds since it
/// started), it begins anew, near zero, with every process: nothing carries over a restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Clock {
    pub start_us: u64,
    pub offset_us: u64,
    pub drift_ppm: i64,
    /// What the process's wall clock read when its monotonic clock read zero: the world's wall
    /// time then, off by up to the scenario's clock offset either way (wall clocks of
    /// different machines disagree, and a restarted process may find its wall clock stepped).
    pub wall_at_epoch: UnixMillis,
}

impl Clock {
    pub fn local(&self, t: u64) -> Instant {
        let elapsed = t.saturating_sub(self.start_us);
        // In 64 bits whenever the product fits (any run shorter than about 200 simulated days;
        // a 128-bit division costs several times more), with the same result either way.
        let skew = match i64::try_from(elapsed)
            .ok()
            .and_then(|e| e.checked_mul(self.drift_ppm))
        {
            Some(product) => i128::from(product.div_euclid(1_000_000)),
            None => (i128::from(elapsed) * i128::from(self.drift_ppm)).div_euclid(1_000_000),
        };
        let micros = i128::from(self.offset_us) + i128::from(elapsed) + skew;
        Instant::from_micros(u64::try_from(micros.max(0)).unwrap_or(u64::MAX))
    }

    /// The earliest virtual time, not before `from`, at which this clock reads at least `local`.
    pub fn global_at(&self, local: Instant, from: u64) -> u64 {
        if self.local(from) >= local {
            return from;
        }
        let target = i128::from(local.as_micros()) - i128::from(self.offset_us);
        let estimate = i128::from(self.start_us)
            + target * 1_000_000 / (1_000_000 + i128::from(self.drift_ppm));
        let mut t = u64::try_from(estimate.max(i128::from(from))).unwrap_or(u64::MAX / 2);
        while self.local(t) < local {
            t += 1;
        }
        while t > from && self.local(t - 1) >= local {
            t -= 1;
        }
        t
    }
}

pub(super) struct CoordNode {
    pub(super) machine: Option<Coordinator>,
    pub(super) gen: u64,
    pub(super) clock: Clock,
    pub(super) disk: Disk,
    /// Batches handed out and not yet durable, in order.
    pub(super) pending: VecDeque<PersistBatch>,
    pub(super) last_durable_at: u64,
    /// Seeds of successive processes.
    pub(super) seeds: SimRng,
    pub(super) timer_floor: u64,
    /// A past deadline that `handle_timeout` did not consume (see `fire_timer`).
    pub(super) stuck: Option<Instant>,
    pub(super) paused: bool,
    /// Inputs that reached the node while it was paused, delivered on resume.
    pub(super) stalled: Vec<Ev>,
    /// How far its host's wall clock has been stepped, in all (negative: back); a restarted
    /// process reads the stepped clock.
    pub(super) wall_step_ms: i64,
}

pub(super) struct WorkerNode {
    pub(super) config: WorkerConfig,
    pub(super) machine: Option<Worker>,
    pub(super) gen: u64,
    pub(super) clock: Clock,
    pub(super) conn: Option<usize>,
    pub(super) attempt: Option<ConnectAttempt>,
    pub(super) paused: bool,
    pub(super) stalled: Vec<Ev>,
    /// Attempts executing: lease -> (token of the live completion event, outcome).
    pub(super) tasks: BTreeMap<LeaseId, (u64, AttemptOutcome)>,
    pub(super) rng: SimRng,
    pub(super) seeds: SimRng,
    pub(super) timer_floor: u64,
    pub(super) stuck: Option<Instant>,
    /// A drain of the current process, if one began.
    pub(super) drain: Option<Drain>,
}

/// A drain in progress, driven as the runtime's driver drives one: running attempts may finish
/// until the drain timeout; then they are asked to stop, and each is handed back as it does,
/// for up to `stop_wait`; then whatever still runs is handed back anyway, and the driver waits
/// up to `ack_wait` for the last acknowledgements. The process stops as soon as it is drained
/// (but not before `linger_until`), or when the last wait runs out; then a new process comes
/// back after `restart_after`, unless the worker leaves for good.
#[derive(Clone, Copy, Debug)]
pub(super) struct Drain {
    pub(super) phase: DrainPhase,
    pub(super) linger_until: u64,
    pub(super) stop_wait: u64,
    pub(super) ack_wait: u64,
    pub(super) restart_after: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DrainPhase {
    /// Running attempts may finish (until the drain timeout event).
    Finishing,
    /// They were asked to stop; at `force_at` whatever still runs is handed back anyway.
    Stopping { force_at: u64 },
    /// Everything was handed back; the process stops at `give_up_at` at the latest.
    Acknowledging { give_up_at: u64 },
}

pub(super) struct ClientNode {
    pub(super) machine: Client,
    pub(super) clock: Clock,
    pub(super) conn: Option<usize>,
    pub(super) attempt: Option<ConnectAttempt>,
    pub(super) rng: SimRng,
    pub(super) ops_left: usize,
    pub(super) started: u64,
    pub(super) done: u64,
    /// Operations not yet answered: op id -> virtual time started.
    pub(super) open_ops: BTreeMap<u64, (u64, Operation)>,
    pub(super) known: Vec<JobId>,
    pub(super) timer_floor: u64,
    pub(super) stuck: Option<Instant>,
}

/// The clock of `node`'s `process`-th process, started at virtual time `start_us`.
pub(super) fn clock_for(
    seed: u64,
    node: NodeRef,
    process: u64,
    start_us: u64,
    scenario: &Scenario,
) -> Clock {
    let mut rng = SimRng::new(seed, "clock", node_index(node) * 1_000_000 + process);
    let drift = scenario.max_drift_ppm;
    let offset_us = rng.range(0, scenario.max_offset_us);
    let drift_ppm = rng.range(0, 2 * drift as u64) as i64 - drift;
    // Drawn last, so the draws above stay what they were.
    let wall_error_ms = rng.range(0, 2 * scenario.max_offset_us / 1_000 + 1) as i64
        - (scenario.max_offset_us / 1_000) as i64;
    let wall_ms = WORLD_WALL_EPOCH.0 as i64 + (start_us / 1_000) as i64
        - (offset_us / 1_000) as i64
        + wall_error_ms;
    Clock {
        start_us,
        offset_us,
        drift_ppm,
        wall_at_epoch: UnixMillis(u64::try_from(wall_ms).unwrap_or(0)),
    }
}

/// The world's wall time at virtual time zero (any fixed time will do).
pub const WORLD_WALL_EPOCH: UnixMillis = UnixMillis(1_800_000_000_000);

fn node_index(node: NodeRef) -> u64 {
    match node {
        NodeRef::Coordinator(i) => i as u64,
        NodeRef::Worker(i) => 1_000 + i as u64,
        NodeRef::Client(i) => 2_000 + i as u64,
        NodeRef::World => 3_000,
    }
}

pub(super) fn coordinator_address(coord: usize) -> String {
    format!("coord-{coord}")
}

/// Coordinator `c`'s configuration: the scenario's, with its own id and every other member as
/// a peer. One address per member serves both its worker and its client link here.
/// `clock` is the process's clock (its wall time goes into the configuration).
pub(super) fn coordinator_config(
    scenario: &Scenario,
    c: usize,
    clock: &Clock,
    wall_step_ms: i64,
) -> CoordinatorConfig {
    let mut config = scenario.coordinator.clone();
    config.wall_clock_at_epoch =
        UnixMillis(clock.wall_at_epoch.0.saturating_add_signed(wall_step_ms));
    config.node_id = NodeId(coordinator_address(c));
    config.peers = (0..scenario.coordinators)
        .filter(|&d| d != c)
        .map(|d| NodeId(coordinator_address(d)))
        .collect();
    config.client_address = coordinator_address(c);
    config.worker_address = coordinator_address(c);
    config
}

pub(super) fn address_coordinator(address: &str) -> usize {
    address
        .strip_prefix("coord-")
        .and_then(|i| i.parse().ok())
        .unwrap_or(0)
}

/// A built-in task's outcome on `attempt`.
fn builtin_outcome(task: &TaskSpec, attempt: herder_core::ids::Attempt) -> AttemptOutcome {
    match tasks::execute(task, attempt) {
        Ok(output) => AttemptOutcome::Succeeded { output },
        Err(failure) => AttemptOutcome::Failed {
            permanent: failure.permanent,
            error: failure.message,
        },
    }
}

/// Which answer to a submission an `ERROR` was.
#[derive(Clone, Copy)]
enum Answered {
    /// A `SUBMIT`'s.
    Submit,
    /// A line of a `SUBMIT_BATCH_RESULT`.
    BatchLine,
    /// A whole `SUBMIT_BATCH`'s.
    Batch,
}

/// The count of an `ERROR` with `code` answering a submission as `answered` says.
fn error_label(answered: Answered, code: ErrorCode) -> &'static str {
    use Answered::{Batch, BatchLine, Submit};
    use ErrorCode::{IdempotencyConflict, InvalidRequest, InvalidTask};
    match (answered, code) {
        (Submit, InvalidTask) => "coordinator: a submission answered ERROR INVALID_TASK",
        (Submit, InvalidRequest) => "coordinator: a submission answered ERROR INVALID_REQUEST",
        (Submit, IdempotencyConflict) => {
            "coordinator: a submission answered ERROR IDEMPOTENCY_CONFLICT"
        }
        (Submit, _) => "coordinator: a submission answered another ERROR",
        (BatchLine, InvalidTask) => "coordinator: a job of a batch answered ERROR INVALID_TASK",
        (BatchLine, InvalidRequest) => {
            "coordinator: a job of a batch answered ERROR INVALID_REQUEST"
        }
        (BatchLine, IdempotencyConflict) => {
            "coordinator: a job of a batch answered ERROR IDEMPOTENCY_CONFLICT"
        }
        (BatchLine, _) => "coordinator: a job of a batch answered another ERROR",
        (Batch, InvalidTask) => "coordinator: a batch failed whole, ERROR INVALID_TASK",
        (Batch, InvalidRequest) => "coordinator: a batch failed whole, ERROR INVALID_REQUEST",
        (Batch, _) => "coordinator: a batch failed whole, another ERROR",
    }
}

fn event_name(event: &Event) -> &'static str {
    match event {
        Event::Recovered { .. } => "coordinator: recovered",
        Event::WallClockStepped { .. } => "coordinator: wall clock stepped",
        Event::JobSubmitted { .. } => "coordinator: job submitted",
        Event::JobsPurged { .. } => "coordinator: jobs purged",
        Event::SubmitRejected { .. } => "coordinator: submit rejected (admission)",
        Event::QueueSubmitRejected { .. } => "coordinator: submit rejected (its queue's limit)",
        Event::QueueHeldBack { rule, .. } => match rule {
            HeldBack::Paused => "coordinator: queue held back (paused)",
            HeldBack::Concurrency => "coordinator: queue held back (concurrency limit)",
            HeldBack::KeyConcurrency => "coordinator: queue held back (per-key limit)",
            HeldBack::Rate => "coordinator: queue held back (rate limit)",
            HeldBack::KeyRate => "coordinator: queue held back (per-key rate limit)",
        },
        Event::WorkerRegistered {
            reconnect: true, ..
        } => "coordinator: worker reconnected",
        Event::WorkerRegistered { .. } => "coordinator: worker registered",
        Event::WorkerRejected { .. } => "coordinator: worker rejected",
        Event::WorkerLost { .. } => "coordinator: worker lost",
        Event::JobAssigned { .. } => "coordinator: job assigned",
        Event::LeaseExpired { .. } => "coordinator: lease expired",
        Event::RetryScheduled { .. } => "coordinator: retry scheduled",
        Event::JobRequeued { .. } => "coordinator: job requeued",
        Event::ScheduledJobsDue { .. } => "coordinator: scheduled jobs due",
        Event::AttemptReleased { .. } => "coordinator: drained attempt released",
        Event::WorkerDraining { .. } => "coordinator: worker draining",
        Event::JobCompleted { .. } => "coordinator: job completed",
        Event::JobFailed { .. } => "coordinator: job failed",
        Event::JobCancelled { .. } => "coordinator: job cancelled",
        Event::StaleResultRejected { .. } => "coordinator: stale result rejected",
        Event::AttemptReadopted { .. } => "coordinator: attempt re-adopted",
        Event::AttemptAbandoned { .. } => "coordinator: attempt abandoned",
        Event::MalformedFrame { .. } => "coordinator: malformed frame",
        Event::Forbidden { .. } => "coordinator: request forbidden",
        Event::JobSplit { .. } => "coordinator: data-parallel job split",
        Event::ParentCompleted { .. } => "coordinator: data-parallel job completed",
        Event::ParentFailed { .. } => "coordinator: data-parallel job failed",
        Event::LeaderElected { .. } => "coordinator: leader elected",
        Event::TookOver { .. } => "coordinator: leader took over",
        Event::SteppedDown { .. } => "coordinator: leader stepped down",
        Event::ElectionStarted { pre_vote: true, .. } => "coordinator: pre-vote started",
        Event::ElectionStarted { .. } => "coordinator: election started",
        Event::LeaderKnown { .. } => "coordinator: following a leader",
        Event::TransferStarted { .. } => "coordinator: leadership transfer started",
        Event::SnapshotInstalled { .. } => "coordinator: snapshot installed",
        Event::SnapshotRefused { .. } => "coordinator: snapshot refused",
        Event::PeerIgnored { .. } => "coordinator: peer message ignored",
        Event::PeerProtocolViolation { .. } => "coordinator: peer protocol violation",
        Event::Abstaining => "coordinator: empty disk, abstaining from elections",
        Event::Rejoined { .. } => "coordinator: rejoined after an empty start",
        Event::FollowerLostEntries { .. } => "coordinator: a follower lost entries",
    }
}

impl World {
    fn conn_owner(&self, conn: ConnectionId) -> ConnOwner {
        match self.conns.get(conn.0 as usize).map(|c| c.peer) {
            Some(Peer::Worker(w)) => ConnOwner::Worker(self.workers[w].config.worker_id.clone()),
            Some(Peer::Client(_)) => ConnOwner::Client,
            None => ConnOwner::Unknown,
        }
    }

    pub(super) fn drain_coord(&mut self, c: usize) -> Check {
        let node = NodeRef::Coordinator(c);
        // What it applied joins the committed log (and the model) before its outputs are judged.
        if let Some(machine) = &self.coords[c].machine {
            self.checker.observe(c, machine)?;
            // A crashed leader's successor (or itself, restarted and re-elected) leads again.
            if let Some(crashed_at) = self.failover_from {
                if machine.is_acting_leader() {
                    self.failovers_us.push(self.now - crashed_at);
                    self.failover_from = None;
                }
            }
        }
        loop {
            let Some(output) = self.coords[c]
                .machine
                .as_mut()
                .and_then(Coordinator::poll_output)
            else {
                return Ok(());
            };
            let (owner, keyed, dp) = match &output {
                Output::ToWorker { conn, .. } => (self.conn_owner(*conn), None, 1),
                Output::ToClient { conn, message } => {
                    let request = message.request_id().map(|r| (conn.0 as usize, r));
                    (
                        ConnOwner::Client,
                        request.and_then(|r| self.submit_keys.get(&r).cloned()),
                        request
                            .and_then(|r| self.submit_dp.get(&r).copied())
                            .unwrap_or(1),
                    )
                }
                _ => (ConnOwner::Unknown, None, 1),
            };
            let mut continue_judging = true;
            if let Some(machine) = &self.coords[c].machine {
                let key = keyed.as_ref().map(|(key, floor)| (key.as_str(), *floor));
                self.checker
                    .check_output(c, machine, &output, &owner, key, dp)?;
                if let Output::ToClient { conn, message } = &output {
                    if self.check_reader_answer(conn.0 as usize, message)? {
                        self.count("client: a reader's write refused FORBIDDEN");
                        continue_judging = false;
                    }
                }
                if let (Output::ToClient { conn, message }, true) = (&output, continue_judging) {
                    let counted = self.check_submission_answer(c, conn.0 as usize, message)?;
                    for what in counted {
                        self.count(what);
                    }
                }
            }
            if let Output::ToWorker {
                message:
                    CoordinatorToWorker::ResultAck {
                        job_id,
                        lease_id,
                        accepted: true,
                        ..
                    },
                ..
            } = &output
            {
                if self
                    .stale_results
                    .contains(&(c, self.coords[c].gen, *lease_id))
                {
                    return Err(format!(
                        "RESULT_ACK(accepted) for job {job_id} lease {lease_id}, a result this process had found stale on arrival"
                    ));
                }
            }
            match output {
                Output::ToWorker { conn, message } => {
                    self.note(node, format_args!("-> conn {conn} {message:?}"));
                    self.check_deadline(&message)?;
                    self.check_worker_refusal(conn.0 as usize, &message)?;
                    self.send_down(conn.0 as usize, Down::Worker(message))?;
                }
                Output::ToClient { conn, message } => {
                    self.note(node, format_args!("-> conn {conn} {message:?}"));
                    if let ClientReply::Job { job, .. } | ClientReply::WaitResult { job, .. } =
                        &message
                    {
                        if job.unserved {
                            self.count("client: a job shown unserved");
                        }
                    }
                    self.check_one_job_per_submission(conn, &message)?;
                    self.check_request_answer(c, conn.0 as usize, &message)?;
                    if let Some(request) = message.request_id() {
                        if let Some(floor) = self.read_floors.remove(&(conn.0 as usize, request)) {
                            self.checker.check_floor(floor, &message)?;
                        }
                        if let Some((leader, mark)) =
                            self.read_marks.remove(&(conn.0 as usize, request))
                        {
                            let what = match &message {
                                ClientReply::Job { .. } => Some("a STATUS"),
                                ClientReply::JobList { .. } => Some("a LIST"),
                                ClientReply::WorkerList { .. } => Some("a WORKERS"),
                                _ => None,
                            };
                            if let Some(what) = what {
                                if leader == c {
                                    self.count("client: a read's confirmation judged");
                                    self.checker.check_read_confirmed(c, mark, what)?;
                                }
                            }
                        }
                    }
                    self.send_down(conn.0 as usize, Down::Client(message))?;
                }
                Output::Close { conn } => {
                    self.note(node, format_args!("close conn {conn}"));
                    self.close_conn(conn.0 as usize, Close::ByCoord);
                }
                Output::Persist(batch) => self.persist(c, batch),
                Output::ToPeer { to, message } => {
                    let d = super::nodes::address_coordinator(&to.0);
                    self.send_peer(c, d, message)?;
                }
                Output::Event(event) => {
                    if let Event::TransferStarted { .. } = event {
                        self.leadership_shaken();
                    }
                    self.count(event_name(&event));
                    self.note(node, format_args!("event: {event}"));
                }
            }
        }
    }

    /// Judges a coordinator's answer to a `SUBMIT` or a `SUBMIT_BATCH` against what was sent
    /// (see `Checker::check_submit_reply`, `check_batch_result` and `check_batch_error`), and
    /// names the `ERROR`s in it, to count.
    /// A reader's write must be answered `ERROR FORBIDDEN`, and nothing else answers it.
    /// Returns whether `reply` answered such a write (and so was judged here).
    fn check_reader_answer(&mut self, conn: usize, reply: &ClientReply) -> Result<bool, String> {
        let Some(request) = reply.request_id() else {
            return Ok(false);
        };
        if !self.reader_writes.contains(&(conn, request)) {
            return Ok(false);
        }
        match reply {
            ClientReply::Error {
                code: ErrorCode::Forbidden,
                ..
            } => Ok(true),
            other => Err(format!(
                "credentials: request {request} on connection {conn}, a write by a client holding a reader's token, was answered {other:?}; it must be ERROR FORBIDDEN and change nothing"
            )),
        }
    }

    fn check_submission_answer(
        &mut self,
        c: usize,
        conn: usize,
        reply: &ClientReply,
    ) -> Result<Vec<&'static str>, String> {
        let Some(request) = reply.request_id() else {
            return Ok(Vec::new());
        };
        let Some(machine) = &self.coords[c].machine else {
            return Ok(Vec::new());
        };
        let mut counted = Vec::new();
        if let Some((sent, committed)) = self.submit_jobs.get(&(conn, request)) {
            let subject = Subject::Submit { conn, request };
            self.checker
                .check_submit_reply(subject, sent, *committed, reply)?;
            if let ClientReply::Error { code, .. } = reply {
                counted.push(error_label(Answered::Submit, *code));
            }
            return Ok(counted);
        }
        let batch = (conn, request);
        match reply {
            ClientReply::SubmitBatchResult { results, .. } => {
                let Some(submitted) = self.submit_batches.get(&batch) else {
                    return Err(format!(
                        "SUBMIT_BATCH_RESULT for request {request} on connection {conn}, which sent no such batch"
                    ));
                };
                let items: Vec<_> = submitted
                    .items
                    .iter()
                    .map(|(key, slots)| {
                        (key.as_ref().map(|(k, floor)| (k.as_str(), *floor)), *slots)
                    })
                    .collect();
                self.checker.check_batch_result(
                    c,
                    machine,
                    batch,
                    &submitted.jobs,
                    results,
                    &items,
                    (submitted.arrived, submitted.committed),
                )?;
                for result in results {
                    if let SubmitResult::Error { code, .. } = result {
                        counted.push(error_label(Answered::BatchLine, *code));
                    }
                }
            }
            ClientReply::Error { code, message, .. } => {
                if let Some(submitted) = self.submit_batches.get(&batch) {
                    self.checker
                        .check_batch_error(batch, &submitted.jobs, *code, message)?;
                    counted.push(error_label(Answered::Batch, *code));
                }
            }
            _ => {}
        }
        Ok(counted)
    }

    /// No attempt is revoked for its deadline before that deadline has passed since it was
    /// first assigned: the job's own `timeout_millis`, or the default (less the leader's clock
    /// drift, at most 0.1%).
    fn check_deadline(&mut self, message: &CoordinatorToWorker) -> Check {
        match message {
            CoordinatorToWorker::TaskAssign {
                lease_id,
                timeout_millis,
                ..
            } => {
                self.assign_sent
                    .entry(*lease_id)
                    .or_insert((self.now, *timeout_millis));
            }
            CoordinatorToWorker::TaskCancel {
                job_id,
                lease_id,
                reason: CancelReason::DeadlineExpired,
                ..
            } => {
                if let Some(&(sent, millis)) = self.assign_sent.get(lease_id) {
                    let least = millis * 1_000 - millis;
                    if self.now - sent < least {
                        return Err(format!(
                            "deadline: job {job_id} lease {lease_id} revoked for its deadline {} us after it was assigned, but its deadline is {millis} ms",
                            self.now - sent
                        ));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    pub(super) fn drain_worker(&mut self, w: usize) -> Check {
        let node = NodeRef::Worker(w);
        loop {
            let Some(output) = self.workers[w]
                .machine
                .as_mut()
                .and_then(Worker::poll_output)
            else {
                if let Some(machine) = &self.workers[w].machine {
                    // The worker's own bound, judged from outside: never more running than slots.
                    let running = machine.running().count();
                    if running > machine.capacity() as usize {
                        return Err(format!(
                            "capacity: worker w{w} runs {running} attempts with {} slots",
                            machine.capacity()
                        ));
                    }
                    if machine.waiting().next().is_some() {
                        self.count("worker: a prefetched assignment waits for a slot");
                    }
                }
                return Ok(());
            };
            match output {
                WorkerOutput::Connect { attempt, address } => {
                    self.note(
                        node,
                        format_args!("connect to {address} (attempt {})", attempt.0),
                    );
                    if let Some(old) = self.workers[w].conn.take() {
                        self.close_conn(old, Close::ByPeer);
                    }
                    self.workers[w].attempt = Some(attempt);
                    let gen = self.workers[w].gen;
                    self.schedule_connect(Peer::Worker(w), gen, attempt, &address);
                }
                WorkerOutput::Send(message) => {
                    self.note(node, format_args!("-> {message:?}"));
                    // What the worker says of an attempt: a `Release` or a permanent failure
                    // in the log must come from such a report.
                    if let WorkerToCoordinator::TaskResult {
                        job_id,
                        lease_id,
                        outcome,
                    } = &message
                    {
                        self.checker.worker_reported(*lease_id, outcome);
                        // A drain hands an attempt back only once it has stopped, so the job
                        // never runs on two workers because of a drain; only the forced
                        // hand-back at the end of the stop wait (the process exits right
                        // after, ending it) may release one that still runs.
                        let node = &self.workers[w];
                        let forced = node
                            .drain
                            .is_some_and(|d| matches!(d.phase, DrainPhase::Acknowledging { .. }));
                        if matches!(outcome, AttemptOutcome::Released {})
                            && node.tasks.contains_key(lease_id)
                            && !forced
                        {
                            return Err(format!(
                                "drain: worker w{w} reported job {job_id} lease {lease_id} released while the attempt still runs"
                            ));
                        }
                    }
                    if let Some(conn) = self.workers[w].conn {
                        self.send_up(conn, Up::Worker(message), true)?;
                    }
                }
                WorkerOutput::Close => {
                    self.note(node, format_args!("close"));
                    self.workers[w].attempt = None;
                    if let Some(conn) = self.workers[w].conn.take() {
                        self.close_conn(conn, Close::ByPeer);
                    }
                }
                WorkerOutput::StartTask(TaskAssignment {
                    max_attempts: _,
                    job_id,
                    lease_id,
                    attempt,
                    task,
                    timeout,
                }) => {
                    // Judged on the worker itself: it runs only the kinds it registered.
                    let kind = task.kind();
                    let serves = &self.workers[w].config.tasks;
                    if !serves.iter().any(|k| k == kind) {
                        return Err(format!(
                            "task sets: worker w{w} was started on job {job_id} (lease {lease_id}) of kind {kind:?}, which it does not serve ({serves:?})"
                        ));
                    }
                    // A permanent failure is terminal at once: no attempt is assigned after it
                    // (a late assignment from before it may still arrive, and its result will
                    // not count).
                    let model = &self.checker.model;
                    if let Some(&at) = model.failed_permanently.get(&job_id) {
                        let assigned = model.assigned_at.get(&lease_id).map(|a| a.0);
                        if assigned.is_none_or(|index| index > at) {
                            return Err(format!(
                                "permanent failure: job {job_id} failed permanently at entry {at}, but worker w{w} was started on it again (attempt {attempt}, lease {lease_id}, assigned at {assigned:?})"
                            ));
                        }
                    }
                    let (outcome, runs_us) = match &task {
                        TaskSpec::User(user) => {
                            self.count("task: user task started");
                            super::handlers::run_user_task(user, attempt)
                        }
                        TaskSpec::Sleep { milliseconds } => {
                            (builtin_outcome(&task, attempt), milliseconds * 1_000)
                        }
                        _ => (builtin_outcome(&task, attempt), 0),
                    };
                    if matches!(
                        outcome,
                        AttemptOutcome::Failed {
                            permanent: true,
                            ..
                        }
                    ) {
                        self.count("task: fails permanently");
                    }
                    let hang_p = self.scenario.faults.task_hang;
                    let faults = self.faults_active;
                    let worker = &mut self.workers[w];
                    let mut duration = runs_us + worker.rng.range(100, 20_000);
                    let timeout_us = u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX / 4);
                    let hang = faults && worker.rng.chance(hang_p);
                    if hang {
                        duration += timeout_us + worker.rng.range(0, 2 * timeout_us);
                    }
                    self.next_token += 1;
                    let token = self.next_token;
                    worker.tasks.insert(lease_id, (token, outcome));
                    let gen = worker.gen;
                    if hang {
                        self.count("fault: task hangs past its lease");
                    }
                    self.note(
                        node,
                        format_args!(
                            "start job {job_id} attempt {attempt} lease {lease_id}: runs {duration} us{}",
                            if hang { " (hangs past its lease)" } else { "" }
                        ),
                    );
                    self.push(
                        self.now + duration,
                        Ev::TaskDone {
                            worker: w,
                            gen,
                            lease: lease_id,
                            token,
                        },
                    );
                }
                WorkerOutput::CancelTask { lease_id } => {
                    // A task that does not stop when told (a stuck or careless task): it runs
                    // to its end, and the coordinator must cope with its late result.
                    let stubborn = self.faults_active && {
                        let p = self.scenario.faults.task_hang;
                        p > 0.0 && self.workers[w].rng.chance(p)
                    };
                    if stubborn {
                        self.count("fault: a task keeps running after its cancel");
                        self.note(node, format_args!("cancel lease {lease_id} ignored"));
                        continue;
                    }
                    self.next_token += 1;
                    let token = self.next_token;
                    let worker = &mut self.workers[w];
                    let delay = worker.rng.range(0, 5_000);
                    let gen = worker.gen;
                    if let Some(task) = worker.tasks.get_mut(&lease_id) {
                        *task = (token, AttemptOutcome::Cancelled {});
                        self.note(node, format_args!("cancel lease {lease_id}"));
                        self.push(
                            self.now + delay,
                            Ev::TaskDone {
                                worker: w,
                                gen,
                                lease: lease_id,
                                token,
                            },
                        );
                    }
                }
                WorkerOutput::Event(event) => {
                    self.note(node, format_args!("event: {event}"));
                    match &event {
                        WorkerEvent::Draining { .. } => self.count("worker: draining"),
                        WorkerEvent::TaskReleased { .. } => {
                            self.count("worker: attempt handed back by a drain")
                        }
                        _ => {}
                    }
                    // Judged against the worker itself, not the coordinator's registry: an
                    // assignment it has no free slot for means the leader's count is wrong.
                    if let WorkerEvent::TaskRefused { job_id, reason, .. } = &event {
                        return Err(format!(
                            "capacity: worker w{w} was assigned job {job_id} with no slot free ({reason}); the leader's count of its slots is wrong"
                        ));
                    }
                }
            }
        }
    }

    pub(super) fn drain_client(&mut self, c: usize) -> Check {
        let node = NodeRef::Client(c);
        while let Some(output) = self.clients[c].machine.poll_output() {
            match output {
                ClientOutput::Connect { attempt, address } => {
                    self.note(
                        node,
                        format_args!("connect to {address} (attempt {})", attempt.0),
                    );
                    if let Some(old) = self.clients[c].conn.take() {
                        self.close_conn(old, Close::ByPeer);
                    }
                    self.clients[c].attempt = Some(attempt);
                    self.schedule_connect(Peer::Client(c), 0, attempt, &address);
                }
                ClientOutput::Send(request) => {
                    self.note(node, format_args!("-> {request:?}"));
                    if let Some(conn) = self.clients[c].conn {
                        self.send_up(conn, Up::Client(request), true)?;
                    }
                }
                ClientOutput::Close => {
                    self.note(node, format_args!("close"));
                    self.clients[c].attempt = None;
                    if let Some(conn) = self.clients[c].conn.take() {
                        self.close_conn(conn, Close::ByPeer);
                    }
                }
                ClientOutput::Done { op, result } => {
                    self.note(node, format_args!("op {} done: {result:?}", op.0));
                    let client = &mut self.clients[c];
                    client.done += 1;
                    let Some((started, asked)) = client.open_ops.remove(&op.0) else {
                        return Err(format!(
                            "operation {} finished twice, or was never started",
                            op.0
                        ));
                    };
                    if self.now > self.fault_end {
                        let waited = self.now - started.max(self.fault_end);
                        self.slowest_call_us = self.slowest_call_us.max(waited);
                    }
                    if let Ok(reply) = &result {
                        self.check_answer(op.0, &asked, reply)?;
                    }
                    match result {
                        Ok(ClientReply::SubmitAccepted { job_id, .. }) => {
                            self.clients[c].known.push(job_id)
                        }
                        Ok(ClientReply::SubmitBatchResult { results, .. }) => {
                            self.count("client: a batch answered");
                            for result in results {
                                match result {
                                    SubmitResult::Accepted { job_id, .. } => {
                                        self.clients[c].known.push(job_id)
                                    }
                                    SubmitResult::Rejected { .. } => {
                                        self.count("client: a job of a batch refused for room")
                                    }
                                    SubmitResult::Error { .. } => {
                                        self.count("client: a job of a batch refused otherwise")
                                    }
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// One client submission creates at most one job, however often it is resent: an unkeyed
    /// submission must never be resent blindly, and a keyed one maps to the same job as long
    /// as that job is retained (a key is forgotten with its job: a resend after a committed
    /// purge of the first job creates another, as documented).
    fn check_one_job_per_submission(&mut self, conn: ConnectionId, reply: &ClientReply) -> Check {
        let Some(Peer::Client(c)) = self.conns.get(conn.0 as usize).map(|c| c.peer) else {
            return Ok(());
        };
        match reply {
            ClientReply::SubmitAccepted {
                request_id,
                job_id,
                existing: false,
                ..
            } => self.one_job_per_submission((c, *request_id, 0), *job_id),
            ClientReply::SubmitBatchResult {
                request_id,
                results,
                ..
            } => {
                for (index, result) in results.iter().enumerate() {
                    if let SubmitResult::Accepted {
                        job_id,
                        existing: false,
                    } = result
                    {
                        self.one_job_per_submission((c, *request_id, index), *job_id)?;
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// `submission` (client, request, job of the batch) was answered with a new `job_id`.
    fn one_job_per_submission(
        &mut self,
        submission: (usize, RequestId, usize),
        job_id: JobId,
    ) -> Check {
        let first = *self.created_by.entry(submission).or_insert(job_id);
        if first == job_id {
            Ok(())
        } else if self.checker.purged(&first) {
            self.created_by.insert(submission, job_id);
            Ok(())
        } else {
            let (c, request_id, index) = submission;
            Err(format!(
                "client-{c}'s submission {request_id} (job {index} of it) created two jobs, {first} and {job_id}"
            ))
        }
    }

    /// A client operation must be answered with a reply to that operation: the right kind, about
    /// the job it named, and for a submission the job that holds the submitted task.
    fn check_answer(&self, op: u64, asked: &Operation, reply: &ClientReply) -> Check {
        let fits = match (asked, reply) {
            (
                Operation::Submit(JobSubmission {
                    task,
                    timeout_millis,
                    ..
                }),
                ClientReply::SubmitAccepted { job_id, .. },
            ) => {
                let submitted = TaskSpec::from_json(task).ok();
                // (It may have been purged since, in the same step.) A keyed resend that asks
                // another deadline is a conflict, not this job.
                let committed = self.checker.model.job_ever(job_id);
                committed.is_some_and(|job| {
                    Some(&job.task) == submitted.as_ref() && job.timeout_millis == *timeout_millis
                })
            }
            // A refusal by a queue's limit names the queue the job was sent to.
            (Operation::Submit(submission), ClientReply::SubmitRejected { queue, .. }) => {
                let sent_to = submission
                    .queue
                    .as_deref()
                    .unwrap_or(herder_core::queues::DEFAULT_QUEUE);
                queue.as_deref().is_none_or(|queue| queue == sent_to)
            }
            (Operation::SubmitBatch { jobs }, ClientReply::SubmitBatchResult { results, .. }) => {
                results.len() == jobs.len()
                    && jobs
                        .iter()
                        .zip(results)
                        .all(|(asked, result)| match result {
                            SubmitResult::Accepted { job_id, .. } => {
                                let submitted = TaskSpec::from_json(&asked.task).ok();
                                self.checker.model.job_ever(job_id).is_some_and(|job| {
                                    Some(&job.task) == submitted.as_ref()
                                        && job.timeout_millis == asked.timeout_millis
                                })
                            }
                            SubmitResult::Rejected { .. } | SubmitResult::Error { .. } => true,
                        })
            }
            (Operation::Status { job_id }, ClientReply::Job { job, .. })
            | (Operation::Wait { job_id, .. }, ClientReply::WaitResult { job, .. })
            | (Operation::Cancel { job_id }, ClientReply::CancelResult { job, .. }) => {
                job.id == *job_id
            }
            // A queue change is answered with that queue as the change left it.
            (Operation::SetQueue { queue, change }, ClientReply::QueueSet { queue: view, .. }) => {
                view.name == *queue
                    && change.paused.is_none_or(|paused| view.paused == paused)
                    && change.weight.is_none_or(|weight| view.weight == weight)
                    && change
                        .aging_millis
                        .is_none_or(|aging| view.aging_millis == aging)
                    && change
                        .concurrency
                        .is_none_or(|limit| view.concurrency == (limit > 0).then_some(limit))
                    && change
                        .key_concurrency
                        .is_none_or(|limit| view.key_concurrency == (limit > 0).then_some(limit))
                    && change
                        .max_active_jobs
                        .is_none_or(|limit| view.max_active_jobs == (limit > 0).then_some(limit))
                    && change
                        .rate
                        .is_none_or(|rate| view.rate == (rate.starts > 0).then_some(rate))
                    && change
                        .key_rate
                        .is_none_or(|rate| view.key_rate == (rate.starts > 0).then_some(rate))
            }
            (Operation::List { .. }, ClientReply::JobList { .. })
            | (Operation::Queues, ClientReply::QueueList { .. })
            | (Operation::Workers, ClientReply::WorkerList { .. })
            | (Operation::Cluster, ClientReply::Cluster { .. })
            | (Operation::Purge { .. }, ClientReply::Purged { .. }) => true,
            // A hand-over to a named member is started to that member.
            (
                Operation::TransferLeader { to },
                ClientReply::TransferStarted { to: started, .. },
            ) => to.as_ref().is_none_or(|to| to == started),
            _ => false,
        };
        if fits {
            Ok(())
        } else {
            Err(format!(
                "operation {op} ({asked:?}) was answered with {reply:?}"
            ))
        }
    }

    pub(super) fn task_done(&mut self, w: usize, gen: u64, lease: LeaseId, token: u64) -> Check {
        let node = &mut self.workers[w];
        if node.gen != gen || node.tasks.get(&lease).map(|t| t.0) != Some(token) {
            return Ok(());
        }
        let Some((_, outcome)) = node.tasks.remove(&lease) else {
            return Ok(());
        };
        let local = node.clock.local(self.now);
        if let Some(m) = &mut node.machine {
            m.handle_task_finished(local, lease, outcome.clone());
        }
        self.note(
            NodeRef::Worker(w),
            format_args!("task lease {lease} finished: {outcome:?}"),
        );
        self.drain_worker(w)
    }
}
