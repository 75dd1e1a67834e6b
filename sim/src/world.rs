//! The simulated world: virtual time, one event queue, nodes with their own clocks, a TCP-like
//! network, coordinator disks, faults and a workload, all drawn from one seed.
//!
//! Every step takes the earliest of (a) the head of the event queue, ordered by (time, sequence),
//! and (b) the earliest due timer of a running node (from its `poll_timeout`, mapped from the
//! node's clock to virtual time). After every step the checker runs.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::fmt::{self, Write as _};

use herder_core::client::{Client, ClientConfig, ClientOutput, ConnectAttempt, Operation};
use herder_core::coordinator::{BatchId, Coordinator, Event, Output, PersistBatch};
use herder_core::ids::{ConnectionId, JobId, LeaseId, RequestId, WorkerId};
use herder_core::limits::FRAME_BYTES_MAX_DEFAULT;
use herder_core::protocol::codec::{encode_frame, FrameDecoder, WireMessage};
use herder_core::protocol::{
    AttemptOutcome, ClientReply, ClientRequest, CoordinatorToWorker, Partitions,
    WorkerToCoordinator,
};
use herder_core::tasks::{self, TaskSpec};
use herder_core::time::Instant;
use herder_core::worker::{Worker, WorkerConfig, WorkerOutput};

use crate::checker::{Check, Checker, ConnOwner, Disk};
use crate::rng::{Fnv, SimRng};
use crate::scenario::Scenario;

/// How often the simulated driver polls a node whose deadline `handle_timeout` did not consume.
const STUCK_POLL_US: u64 = 5_000;

/// The longest `WAIT` timeout the workload asks for.
const WAIT_MILLIS_MAX: u64 = 3_000;

/// The longest a crashed coordinator stays down.
const COORDINATOR_DOWN_MAX_US: u64 = 3_000_000;

/// TCP's first retransmission timeout for a lost segment; it doubles on each further loss.
const RETRANSMIT_US: u64 = 200_000;

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
}

impl Clock {
    pub fn local(&self, t: u64) -> Instant {
        let elapsed = i128::from(t.saturating_sub(self.start_us));
        let skew = (elapsed * i128::from(self.drift_ppm)).div_euclid(1_000_000);
        let micros = i128::from(self.offset_us) + elapsed + skew;
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peer {
    Worker(usize),
    Client(usize),
}

impl Peer {
    fn node(self) -> NodeRef {
        match self {
            Peer::Worker(w) => NodeRef::Worker(w),
            Peer::Client(c) => NodeRef::Client(c),
        }
    }
}

/// A direction on a connection: `Up` is peer to coordinator, `Down` coordinator to peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Up,
    Down,
}

/// How a connection ends.
#[derive(Clone, Copy, Debug)]
enum Close {
    /// A network fault: data in flight is lost both ways; the chosen ends are told.
    Reset { tell_coord: bool, tell_peer: bool },
    /// The peer closed its socket, or its process died: what it already sent still arrives,
    /// then the coordinator sees the close. Nothing more reaches the peer.
    ByPeer,
    /// The coordinator closed it (or its process died): what it already sent still arrives,
    /// then the peer sees the close; its own runtime reports the close to it as well.
    ByCoord,
}

/// A network partition: the directed node-to-node links it cuts. A message on a cut link is
/// held (TCP keeps retransmitting it) until the partition heals.
struct Partition {
    id: u64,
    cuts: BTreeSet<(NodeRef, NodeRef)>,
}

#[derive(Clone, Debug)]
enum Up {
    Worker(WorkerToCoordinator),
    Client(ClientRequest),
}

#[derive(Clone, Debug)]
enum Down {
    Worker(CoordinatorToWorker),
    Client(ClientReply),
}

#[derive(Clone, Debug)]
enum Ev {
    ConnectDone {
        peer: Peer,
        gen: u64,
        attempt: ConnectAttempt,
        coord: usize,
        ok: bool,
    },
    Up {
        conn: usize,
        msg: Up,
    },
    Down {
        conn: usize,
        msg: Down,
    },
    ClosedAtCoord {
        conn: usize,
    },
    ClosedAtPeer {
        conn: usize,
    },
    Durable {
        coord: usize,
        gen: u64,
        batch: BatchId,
    },
    TaskDone {
        worker: usize,
        gen: u64,
        lease: LeaseId,
        token: u64,
    },
    StartOp {
        client: usize,
    },
    FaultTick,
    CoordRestart {
        coord: usize,
    },
    WorkerRestart {
        worker: usize,
    },
    WorkerResume {
        worker: usize,
    },
    CoordResume {
        coord: usize,
    },
    /// The sender repeats a message (a duplicate the protocol allows).
    ResendUp {
        conn: usize,
        msg: Up,
    },
    Heal {
        id: u64,
    },
    /// Delivers the oldest message a healed partition held on one direction of a connection.
    Flush {
        conn: usize,
        dir: Dir,
    },
    FaultsEnd,
}

struct Queued {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Queued) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Queued) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    // Reversed: `BinaryHeap` is a max-heap and the earliest (time, sequence) must come first.
    fn cmp(&self, other: &Queued) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct Conn {
    coord: usize,
    coord_gen: u64,
    peer: Peer,
    peer_gen: u64,
    attempt: ConnectAttempt,
    /// Neither end has closed or reset it: both may still send.
    open: bool,
    /// Data in this direction is still delivered (after a close, until the receiver has
    /// seen the close; never after a reset).
    up_live: bool,
    down_live: bool,
    /// Last scheduled delivery time in each direction (TCP order within the connection).
    up_at: u64,
    down_at: u64,
    /// Deliveries held by a partition, in order, and whether a flush is scheduled.
    held_up: VecDeque<Ev>,
    held_down: VecDeque<Ev>,
    flushing_up: bool,
    flushing_down: bool,
}

impl Conn {
    fn held(&mut self, dir: Dir) -> &mut VecDeque<Ev> {
        match dir {
            Dir::Up => &mut self.held_up,
            Dir::Down => &mut self.held_down,
        }
    }

    fn flushing(&mut self, dir: Dir) -> &mut bool {
        match dir {
            Dir::Up => &mut self.flushing_up,
            Dir::Down => &mut self.flushing_down,
        }
    }
}

struct CoordNode {
    machine: Option<Coordinator>,
    gen: u64,
    clock: Clock,
    disk: Disk,
    /// Batches handed out and not yet durable, in order.
    pending: VecDeque<PersistBatch>,
    last_durable_at: u64,
    /// Seeds of successive processes.
    seeds: SimRng,
    timer_floor: u64,
    /// A past deadline that `handle_timeout` did not consume (see `fire_timer`).
    stuck: Option<Instant>,
    paused: bool,
    /// Inputs that reached the node while it was paused, delivered on resume.
    stalled: Vec<Ev>,
}

struct WorkerNode {
    config: WorkerConfig,
    machine: Option<Worker>,
    gen: u64,
    clock: Clock,
    conn: Option<usize>,
    attempt: Option<ConnectAttempt>,
    paused: bool,
    stalled: Vec<Ev>,
    /// Attempts executing: lease -> (token of the live completion event, outcome).
    tasks: BTreeMap<LeaseId, (u64, AttemptOutcome)>,
    rng: SimRng,
    seeds: SimRng,
    timer_floor: u64,
    stuck: Option<Instant>,
}

struct ClientNode {
    machine: Client,
    clock: Clock,
    conn: Option<usize>,
    attempt: Option<ConnectAttempt>,
    rng: SimRng,
    ops_left: usize,
    started: u64,
    done: u64,
    /// Operations not yet answered: op id -> virtual time started.
    open_ops: BTreeMap<u64, (u64, Operation)>,
    known: Vec<JobId>,
    timer_floor: u64,
    stuck: Option<Instant>,
}

/// What one seed's run produced.
#[derive(Clone, Debug)]
pub struct RunReport {
    pub seed: u64,
    pub hash: u64,
    pub failure: Option<String>,
    pub simulated_us: u64,
    pub steps: u64,
    pub assignments: u64,
    pub completions: u64,
    pub acknowledged: usize,
    /// The longest any client call stayed unanswered after faults stopped, counted from
    /// `max(started, faults stopped)`.
    pub slowest_call_us: u64,
    /// Problems that break no SPEC 4 invariant but are bugs all the same (e.g. a timer that
    /// stays due after `handle_timeout`, which makes a real driver spin).
    pub findings: Vec<String>,
    /// How often each interesting thing happened (coordinator events, faults), to show what a
    /// batch of seeds reached.
    pub coverage: BTreeMap<&'static str, u64>,
    pub trace: Vec<String>,
}

pub struct World {
    seed: u64,
    scenario: Scenario,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Queued>,
    coords: Vec<CoordNode>,
    workers: Vec<WorkerNode>,
    clients: Vec<ClientNode>,
    conns: Vec<Conn>,
    open_conns: BTreeSet<usize>,
    net: SimRng,
    disk_rng: SimRng,
    fault_rng: SimRng,
    checker: Checker,
    faults_active: bool,
    fault_end: u64,
    deadline: u64,
    /// Once faults stop, every client call must be answered within this long of
    /// `max(started, fault_end)` (see `call_bound_us`).
    call_bound_us: u64,
    /// The longest a client call took once faults stopped (for the report).
    slowest_call_us: u64,
    partitions: Vec<Partition>,
    next_partition: u64,
    next_token: u64,
    submit_keys: HashMap<(usize, RequestId), String>,
    /// (client, request id) -> the job its submission created: one operation, one job.
    created_by: HashMap<(usize, RequestId), JobId>,
    key_specs: BTreeMap<String, TaskSpec>,
    hash: Fnv,
    trace: Option<Vec<String>>,
    steps: u64,
    findings: Vec<String>,
    coverage: BTreeMap<&'static str, u64>,
}

/// The clock of `node`'s `process`-th process, started at virtual time `start_us`.
fn clock_for(seed: u64, node: NodeRef, process: u64, start_us: u64, scenario: &Scenario) -> Clock {
    let mut rng = SimRng::new(seed, "clock", node_index(node) * 1_000_000 + process);
    let drift = scenario.max_drift_ppm;
    Clock {
        start_us,
        offset_us: rng.range(0, scenario.max_offset_us),
        drift_ppm: rng.range(0, 2 * drift as u64) as i64 - drift,
    }
}

fn node_index(node: NodeRef) -> u64 {
    match node {
        NodeRef::Coordinator(i) => i as u64,
        NodeRef::Worker(i) => 1_000 + i as u64,
        NodeRef::Client(i) => 2_000 + i as u64,
        NodeRef::World => 3_000,
    }
}

/// One message through the real frame codec: encoded as the sender's runtime would, decoded as
/// the receiver's would. It must come out exactly as it went in.
fn through_codec<M>(message: M) -> Result<M, String>
where
    M: WireMessage + PartialEq + fmt::Debug,
{
    let mut frame = Vec::new();
    encode_frame(&message, FRAME_BYTES_MAX_DEFAULT, &mut frame)
        .map_err(|e| format!("codec: cannot encode {message:?}: {e}"))?;
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
    decoder.extend(&frame);
    match decoder.next_message::<M>() {
        Ok(Some(decoded)) if decoded == message => Ok(decoded),
        Ok(Some(decoded)) => Err(format!(
            "codec: {message:?} came out of the codec as {decoded:?}"
        )),
        Ok(None) => Err(format!(
            "codec: a whole frame of {message:?} did not decode"
        )),
        Err(e) => Err(format!("codec: {message:?} does not decode: {e}")),
    }
}

fn event_name(event: &Event) -> &'static str {
    match event {
        Event::Recovered { .. } => "coordinator: recovered",
        Event::JobSubmitted { .. } => "coordinator: job submitted",
        Event::SubmitRejected { .. } => "coordinator: submit rejected (admission)",
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
        Event::JobCompleted { .. } => "coordinator: job completed",
        Event::JobFailed { .. } => "coordinator: job failed",
        Event::JobCancelled { .. } => "coordinator: job cancelled",
        Event::StaleResultRejected { .. } => "coordinator: stale result rejected",
        Event::AttemptReadopted { .. } => "coordinator: attempt re-adopted",
        Event::AttemptAbandoned { .. } => "coordinator: attempt abandoned",
        Event::MalformedFrame { .. } => "coordinator: malformed frame",
        Event::JobSplit { .. } => "coordinator: data-parallel job split",
        Event::ParentCompleted { .. } => "coordinator: data-parallel job completed",
        Event::ParentFailed { .. } => "coordinator: data-parallel job failed",
    }
}

fn coordinator_address(coord: usize) -> String {
    format!("coord-{coord}")
}

fn address_coordinator(address: &str) -> usize {
    address
        .strip_prefix("coord-")
        .and_then(|i| i.parse().ok())
        .unwrap_or(0)
}

/// How long after faults stop a client call may stay unanswered: one silently dead
/// connection noticed by the request timeout, the longest `WAIT`, a coordinator still
/// restarting, one connect attempt and the longest pause between attempts, every admission
/// retry at its longest pause, plus a few seconds for messages and disks. (Nothing fails once
/// faults stop, so at most one connection can still die silently on a call's way.)
fn call_bound_us(config: &ClientConfig, scenario: &Scenario) -> u64 {
    let micros = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 16);
    micros(config.request_timeout)
        + WAIT_MILLIS_MAX * 1_000
        + COORDINATOR_DOWN_MAX_US
        + micros(config.connect_timeout)
        + micros(config.connect_backoff_max)
        + u64::from(scenario.submit_retries) * micros(config.submit_retry_max)
        + 5_000_000
}

/// Messages a correct sender may repeat on one connection: a worker reports a finished attempt
/// until a `RESULT_ACK` names its lease, and heartbeats are idempotent. Nothing else is ever
/// sent twice on one connection (a client resends only on a new connection, which its machine
/// does by itself; the coordinator never repeats a reply), so nothing else is repeated here.
fn repeatable_up(msg: &Up) -> bool {
    matches!(
        msg,
        Up::Worker(WorkerToCoordinator::TaskResult { .. } | WorkerToCoordinator::Heartbeat {})
    )
}

/// A small data-parallel task: a list of up to 40 numbers (some empty, some negative, some
/// large primes), or a range of up to 50,000 numbers that may start below zero.
fn random_parallel_spec(rng: &mut SimRng) -> TaskSpec {
    let numbers = |rng: &mut SimRng| {
        let len = rng.below(41) as usize;
        (0..len)
            .map(|_| match rng.below(4) {
                0 => rng.range(0, 200) as i64 - 100,
                1 => 1_000_000_007,
                2 => rng.range(0, 1 << 40) as i64,
                _ => rng.range(0, 1_000) as i64,
            })
            .collect::<Vec<i64>>()
    };
    match rng.below(3) {
        0 => {
            let mut list = numbers(rng);
            if list.is_empty() {
                list.push(-7);
            }
            TaskSpec::Max { numbers: list }
        }
        1 => TaskSpec::PrimeCountList {
            numbers: numbers(rng),
        },
        _ => {
            let start = rng.range(0, 20_000) as i64 - 1_000;
            TaskSpec::PrimeSum {
                start,
                end: start + rng.range(0, 50_000) as i64,
            }
        }
    }
}

fn random_spec(rng: &mut SimRng) -> TaskSpec {
    if rng.chance(0.2) {
        return random_parallel_spec(rng);
    }
    match rng.below(7) {
        0..=2 => TaskSpec::Sleep {
            milliseconds: rng.range(0, 200),
        },
        3 => TaskSpec::Fail {
            fail_until_attempt: rng.range(1, 5) as u32,
        },
        4 => TaskSpec::Sha256 {
            text: format!("text-{}", rng.below(50)),
        },
        5 => TaskSpec::WordCount {
            text: format!("a b {}", rng.below(50)),
        },
        _ => TaskSpec::PrimeCount {
            limit: rng.range(0, 2_000),
        },
    }
}

impl World {
    pub fn new(seed: u64, scenario: Scenario, trace: bool) -> Result<World, String> {
        let addresses: Vec<String> = (0..scenario.coordinators)
            .map(coordinator_address)
            .collect();
        let mut coords = Vec::new();
        for c in 0..scenario.coordinators {
            let mut seeds = SimRng::new(seed, "coordinator-process", c as u64);
            let mut config = scenario.coordinator.clone();
            config.node_id = herder_core::ids::NodeId(coordinator_address(c));
            let machine = Coordinator::new(config, seeds.next_u64())
                .map_err(|e| format!("bad coordinator config: {e}"))?;
            coords.push(CoordNode {
                machine: Some(machine),
                gen: 0,
                clock: clock_for(seed, NodeRef::Coordinator(c), 0, 0, &scenario),
                disk: Disk::default(),
                pending: VecDeque::new(),
                last_durable_at: 0,
                seeds,
                timer_floor: 0,
                stuck: None,
                paused: false,
                stalled: Vec::new(),
            });
        }
        let mut workers = Vec::new();
        for w in 0..scenario.workers {
            let id = WorkerId::parse(&format!("w{w}")).map_err(|e| e.to_string())?;
            let config = WorkerConfig::new(id, scenario.worker_capacity[w], addresses.clone());
            let mut seeds = SimRng::new(seed, "worker-process", w as u64);
            let clock = clock_for(seed, NodeRef::Worker(w), 0, 0, &scenario);
            let machine = Worker::new(config.clone(), seeds.next_u64(), clock.local(0))
                .map_err(|e| format!("bad worker config: {e}"))?;
            workers.push(WorkerNode {
                config,
                machine: Some(machine),
                gen: 0,
                clock,
                conn: None,
                attempt: None,
                paused: false,
                stalled: Vec::new(),
                tasks: BTreeMap::new(),
                rng: SimRng::new(seed, "worker-tasks", w as u64),
                seeds,
                timer_floor: 0,
                stuck: None,
            });
        }
        let mut clients = Vec::new();
        for c in 0..scenario.clients {
            let mut config = ClientConfig::new(addresses.clone());
            config.submit_retries = scenario.submit_retries;
            let mut seeds = SimRng::new(seed, "client-process", c as u64);
            clients.push(ClientNode {
                machine: Client::new(config, seeds.next_u64()),
                clock: clock_for(seed, NodeRef::Client(c), 0, 0, &scenario),
                conn: None,
                attempt: None,
                rng: SimRng::new(seed, "workload", c as u64),
                ops_left: scenario.ops_per_client,
                started: 0,
                done: 0,
                open_ops: BTreeMap::new(),
                known: Vec::new(),
                timer_floor: 0,
                stuck: None,
            });
        }
        let fault_end = scenario.fault_span_us;
        let deadline = fault_end + scenario.liveness_span_us;
        let call_bound_us = call_bound_us(&ClientConfig::new(addresses.clone()), &scenario);
        Ok(World {
            seed,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            coords,
            workers,
            clients,
            conns: Vec::new(),
            open_conns: BTreeSet::new(),
            net: SimRng::new(seed, "network", 0),
            disk_rng: SimRng::new(seed, "disk", 0),
            fault_rng: SimRng::new(seed, "faults", 0),
            checker: Checker::new(),
            faults_active: scenario.faults.any(),
            fault_end,
            deadline,
            call_bound_us,
            slowest_call_us: 0,
            partitions: Vec::new(),
            next_partition: 0,
            next_token: 0,
            submit_keys: HashMap::new(),
            created_by: HashMap::new(),
            key_specs: BTreeMap::new(),
            hash: Fnv::new(),
            trace: trace.then(Vec::new),
            steps: 0,
            findings: Vec::new(),
            coverage: BTreeMap::new(),
            scenario,
        })
    }

    pub fn scenario(&self) -> &Scenario {
        &self.scenario
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Queued {
            at,
            seq: self.seq,
            ev,
        });
    }

    /// Records one trace line: always hashed, kept only when tracing.
    fn note(&mut self, node: NodeRef, args: fmt::Arguments<'_>) {
        self.hash.u64(self.now);
        let _ = write!(self.hash, "{node} {args}");
        if let Some(lines) = &mut self.trace {
            lines.push(format!(
                "{} {node:>9} {args}",
                Instant::from_micros(self.now)
            ));
        }
    }

    fn count(&mut self, what: &'static str) {
        *self.coverage.entry(what).or_default() += 1;
    }

    fn latency(&mut self) -> u64 {
        let (lo, hi) = self.scenario.latency_us;
        let mut latency = self.net.range(lo, hi);
        if self.faults_active && self.net.chance(self.scenario.faults.slow_message) {
            latency += self.net.range(0, self.scenario.slow_extra_us);
        }
        latency
    }

    // -----------------------------------------------------------------------------------------
    // Running
    // -----------------------------------------------------------------------------------------

    /// Runs the seed to the end; returns the report.
    pub fn run(mut self) -> RunReport {
        let failure = self.run_inner().err();
        if let Some(failure) = &failure {
            let failure = failure.clone();
            self.note(NodeRef::World, format_args!("FAILURE: {failure}"));
        }
        RunReport {
            seed: self.seed,
            hash: self.hash.finish(),
            failure,
            simulated_us: self.now,
            steps: self.steps,
            assignments: self.checker.assignments,
            completions: self.checker.completions,
            acknowledged: self.checker.acked().len(),
            slowest_call_us: self.slowest_call_us,
            findings: std::mem::take(&mut self.findings),
            coverage: std::mem::take(&mut self.coverage),
            trace: self.trace.take().unwrap_or_default(),
        }
    }

    fn run_inner(&mut self) -> Check {
        let scenario = format!("{:?}", self.scenario);
        self.note(NodeRef::World, format_args!("scenario {scenario}"));
        for c in 0..self.clients.len() {
            let at = self.clients[c].rng.range(0, 500_000);
            self.push(at, Ev::StartOp { client: c });
        }
        if self.faults_active {
            let at = self
                .fault_rng
                .range(1, 2 * self.scenario.faults.tick_mean_us);
            self.push(at, Ev::FaultTick);
        }
        self.push(self.fault_end, Ev::FaultsEnd);
        for w in 0..self.workers.len() {
            self.drain_worker(w)?;
        }
        loop {
            let queued = self.queue.peek().map(|q| q.at);
            let timer = self.next_timer();
            let take_queue = match (queued, timer) {
                (None, None) => return self.liveness_failure("nothing left to happen"),
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (Some(q), Some((t, _))) => q <= t,
            };
            let at = if take_queue {
                queued.unwrap_or(self.now)
            } else {
                timer.map(|(t, _)| t).unwrap_or(self.now)
            };
            if at > self.deadline {
                self.now = self.deadline;
                return self.liveness_failure("the liveness span ran out");
            }
            if let Some((due, c, op, started)) = self.call_deadline() {
                if at > due {
                    self.now = due;
                    return Err(format!(
                        "t={} liveness: client-{c} operation {op}, started at {}, is still unanswered {} s after faults stopped (bound {} s)",
                        Instant::from_micros(due),
                        Instant::from_micros(started),
                        (due - self.fault_end) / 1_000_000,
                        self.call_bound_us / 1_000_000,
                    ));
                }
            }
            self.now = at.max(self.now);
            let (node, result) = if take_queue {
                let ev = self.queue.pop().map(|q| q.ev);
                match ev {
                    Some(ev) => self.process(ev),
                    None => continue,
                }
            } else {
                let node = timer.map(|(_, n)| n).unwrap_or(NodeRef::World);
                (node, self.fire_timer(node))
            };
            self.steps += 1;
            result
                .and_then(|()| self.check_state())
                .map_err(|e| format!("t={} {node}: {e}", Instant::from_micros(self.now)))?;
            if self.now >= self.fault_end && self.all_done() {
                self.check_disk_matches()?;
                let acked = self.checker.acked().len();
                self.note(
                    NodeRef::World,
                    format_args!("liveness reached: {acked} acknowledged jobs terminal, every operation done"),
                );
                return Ok(());
            }
        }
    }

    /// At the end, with nothing in flight to a disk: recovering from the disk alone must
    /// rebuild exactly the table the live coordinator holds (nothing applied is missing from
    /// disk, nothing on disk is unapplied).
    fn check_disk_matches(&self) -> Check {
        for (c, coord) in self.coords.iter().enumerate() {
            let Some(machine) = &coord.machine else {
                continue;
            };
            if !coord.pending.is_empty() {
                continue;
            }
            let durable = coord
                .disk
                .table()
                .map_err(|e| format!("coord-{c}: the disk does not recover: {e}"))?;
            let live = machine.table();
            if durable.applied_index() != live.applied_index() {
                return Err(format!(
                    "coord-{c}: the disk rebuilds the table at entry {} but the live table is at {}",
                    durable.applied_index(),
                    live.applied_index()
                ));
            }
            for job in live.jobs() {
                if durable.get(&job.id) != Some(job) {
                    return Err(format!(
                        "coord-{c}: job {} on disk is {:?}, live it is {job:?}",
                        job.id,
                        durable.get(&job.id)
                    ));
                }
            }
            if durable.len() != live.len() {
                return Err(format!(
                    "coord-{c}: the disk holds {} jobs, the live table {}",
                    durable.len(),
                    live.len()
                ));
            }
        }
        Ok(())
    }

    fn check_state(&mut self) -> Check {
        for coord in &self.coords {
            if let Some(machine) = &coord.machine {
                self.checker
                    .check_state(machine.table(), machine.workers())?;
            }
        }
        Ok(())
    }

    fn all_done(&self) -> bool {
        if self
            .clients
            .iter()
            .any(|c| c.ops_left > 0 || c.machine.pending() > 0)
        {
            return false;
        }
        let Some(machine) = self.coords.first().and_then(|c| c.machine.as_ref()) else {
            return false;
        };
        self.checker
            .acked()
            .iter()
            .all(|id| machine.job(id).is_some_and(|job| job.state.is_terminal()))
    }

    fn liveness_failure(&mut self, why: &str) -> Check {
        let mut problems = Vec::new();
        match self.coords.first().and_then(|c| c.machine.as_ref()) {
            None => problems.push("the coordinator is down".to_owned()),
            Some(machine) => {
                for id in self.checker.acked() {
                    match machine.job(id) {
                        Some(job) if !job.state.is_terminal() => problems.push(format!(
                            "acknowledged job {id} is still {} (attempt {}, lease {:?})",
                            job.state,
                            job.attempt,
                            job.lease.as_ref().map(|l| (l.id, l.worker.clone()))
                        )),
                        Some(_) => {}
                        None => problems.push(format!("acknowledged job {id} is missing")),
                    }
                }
            }
        }
        for (c, client) in self.clients.iter().enumerate() {
            if client.ops_left > 0 || client.machine.pending() > 0 {
                problems.push(format!(
                    "client-{c}: {} operations not started, {} not done",
                    client.ops_left,
                    client.machine.pending()
                ));
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(format!(
            "t={} liveness: {why}: {}",
            Instant::from_micros(self.now),
            problems.join("; ")
        ))
    }

    /// The earliest per-call deadline among unanswered client operations:
    /// (deadline, client, op, started).
    fn call_deadline(&self) -> Option<(u64, usize, u64, u64)> {
        self.clients
            .iter()
            .enumerate()
            .filter_map(|(c, client)| {
                let (&op, &(started, _)) = client.open_ops.first_key_value()?;
                let due = started.max(self.fault_end) + self.call_bound_us;
                Some((due, c, op, started))
            })
            .min()
    }

    /// The earliest due timer of a running node, in virtual time.
    fn next_timer(&self) -> Option<(u64, NodeRef)> {
        let mut best: Option<(u64, NodeRef)> = None;
        let mut consider = |due: Option<Instant>, clock: &Clock, floor: u64, node: NodeRef| {
            if let Some(due) = due {
                let at = clock.global_at(due, self.now.max(floor));
                if best.is_none_or(|(b, _)| at < b) {
                    best = Some((at, node));
                }
            }
        };
        for (i, c) in self.coords.iter().enumerate() {
            if let (Some(m), false) = (&c.machine, c.paused) {
                consider(
                    m.poll_timeout(),
                    &c.clock,
                    c.timer_floor,
                    NodeRef::Coordinator(i),
                );
            }
        }
        for (i, w) in self.workers.iter().enumerate() {
            if let (Some(m), false) = (&w.machine, w.paused) {
                consider(
                    m.poll_timeout(),
                    &w.clock,
                    w.timer_floor,
                    NodeRef::Worker(i),
                );
            }
        }
        for (i, c) in self.clients.iter().enumerate() {
            consider(
                c.machine.poll_timeout(),
                &c.clock,
                c.timer_floor,
                NodeRef::Client(i),
            );
        }
        best
    }

    fn timeout_of(&self, node: NodeRef) -> Option<Instant> {
        match node {
            NodeRef::Coordinator(c) => self.coords[c].machine.as_ref()?.poll_timeout(),
            NodeRef::Worker(w) => self.workers[w].machine.as_ref()?.poll_timeout(),
            NodeRef::Client(c) => self.clients[c].machine.poll_timeout(),
            NodeRef::World => None,
        }
    }

    fn stuck_mut(&mut self, node: NodeRef) -> Option<&mut Option<Instant>> {
        match node {
            NodeRef::Coordinator(c) => Some(&mut self.coords[c].stuck),
            NodeRef::Worker(w) => Some(&mut self.workers[w].stuck),
            NodeRef::Client(c) => Some(&mut self.clients[c].stuck),
            NodeRef::World => None,
        }
    }

    /// Fires `node`'s due timer. A deadline still reported by `poll_timeout` after
    /// `handle_timeout` ran at or past it was not consumed: a real driver would wake again at
    /// once, over and over. That is recorded as a finding; the simulated driver then keeps
    /// polling that node every `STUCK_POLL_US` (a spinning driver, sampled coarsely) so the
    /// node's other deadlines, hidden behind the stuck one, still fire.
    fn fire_timer(&mut self, node: NodeRef) -> Check {
        let due = self.timeout_of(node);
        self.fire_timer_inner(node)?;
        let after = self.timeout_of(node);
        if due.is_some() && after == due {
            let due = due.unwrap_or(Instant::ZERO);
            if self.stuck_mut(node).is_some_and(|s| s.is_none()) && self.findings.len() < 20 {
                self.findings.push(format!(
                    "t={} {node}: poll_timeout still returns {due} after handle_timeout at or past it (a driver would busy-loop)",
                    Instant::from_micros(self.now)
                ));
            }
            if self.stuck_mut(node).is_some_and(|s| *s != Some(due)) {
                self.note(
                    node,
                    format_args!("timer {due} not consumed by handle_timeout"),
                );
            }
            let floor = self.now + STUCK_POLL_US;
            if let Some(stuck) = self.stuck_mut(node) {
                *stuck = Some(due);
            }
            match node {
                NodeRef::Coordinator(c) => self.coords[c].timer_floor = floor,
                NodeRef::Worker(w) => self.workers[w].timer_floor = floor,
                NodeRef::Client(c) => self.clients[c].timer_floor = floor,
                NodeRef::World => {}
            }
        }
        Ok(())
    }

    fn fire_timer_inner(&mut self, node: NodeRef) -> Check {
        let now = self.now;
        self.note(node, format_args!("timer"));
        match node {
            NodeRef::Coordinator(c) => {
                let coord = &mut self.coords[c];
                coord.timer_floor = now + 1;
                let local = coord.clock.local(now);
                if let Some(m) = &mut coord.machine {
                    m.handle_timeout(local);
                }
                self.drain_coord(c)
            }
            NodeRef::Worker(w) => {
                let worker = &mut self.workers[w];
                worker.timer_floor = now + 1;
                let local = worker.clock.local(now);
                if let Some(m) = &mut worker.machine {
                    m.handle_timeout(local);
                }
                self.drain_worker(w)
            }
            NodeRef::Client(c) => {
                let client = &mut self.clients[c];
                client.timer_floor = now + 1;
                let local = client.clock.local(now);
                client.machine.handle_timeout(local);
                self.drain_client(c)
            }
            NodeRef::World => Ok(()),
        }
    }

    /// The paused node an event is addressed to, if any: it holds the event until it resumes.
    fn paused_target(&self, ev: &Ev) -> Option<NodeRef> {
        let node = match ev {
            Ev::ConnectDone {
                peer: Peer::Worker(w),
                ..
            } => NodeRef::Worker(*w),
            Ev::TaskDone { worker, .. } => NodeRef::Worker(*worker),
            // A paused worker sends nothing, repeats included.
            Ev::ResendUp { conn, .. } => match self.conns[*conn].peer {
                Peer::Worker(w) => NodeRef::Worker(w),
                Peer::Client(_) => return None,
            },
            Ev::Down { conn, .. } | Ev::ClosedAtPeer { conn } => match self.conns[*conn].peer {
                Peer::Worker(w) => NodeRef::Worker(w),
                Peer::Client(_) => return None,
            },
            Ev::Up { conn, .. } | Ev::ClosedAtCoord { conn } => {
                NodeRef::Coordinator(self.conns[*conn].coord)
            }
            Ev::Durable { coord, .. } => NodeRef::Coordinator(*coord),
            _ => return None,
        };
        let paused = match node {
            NodeRef::Worker(w) => self.workers[w].paused,
            NodeRef::Coordinator(c) => self.coords[c].paused,
            _ => false,
        };
        paused.then_some(node)
    }

    /// The connection direction a delivery travels, if it is one.
    fn link_of(ev: &Ev) -> Option<(usize, Dir)> {
        match ev {
            Ev::Up { conn, .. } | Ev::ClosedAtCoord { conn } => Some((*conn, Dir::Up)),
            Ev::Down { conn, .. } | Ev::ClosedAtPeer { conn } => Some((*conn, Dir::Down)),
            _ => None,
        }
    }

    fn is_cut(&self, from: NodeRef, to: NodeRef) -> bool {
        self.partitions.iter().any(|p| p.cuts.contains(&(from, to)))
    }

    fn link_cut(&self, conn: usize, dir: Dir) -> bool {
        let c = &self.conns[conn];
        let (coord, peer) = (NodeRef::Coordinator(c.coord), c.peer.node());
        match dir {
            Dir::Up => self.is_cut(peer, coord),
            Dir::Down => self.is_cut(coord, peer),
        }
    }

    fn process(&mut self, ev: Ev) -> (NodeRef, Check) {
        // A delivery across a partition, or behind one held there, waits for the heal.
        if let Some((conn, dir)) = Self::link_of(&ev) {
            if self.link_cut(conn, dir) || !self.conns[conn].held(dir).is_empty() {
                self.count("net: delivery held by a partition");
                self.note(
                    NodeRef::World,
                    format_args!("conn {conn} {dir:?}: held by a partition"),
                );
                self.conns[conn].held(dir).push_back(ev);
                return (NodeRef::World, Ok(()));
            }
        }
        self.dispatch(ev)
    }

    fn dispatch(&mut self, ev: Ev) -> (NodeRef, Check) {
        match self.paused_target(&ev) {
            Some(NodeRef::Worker(w)) => {
                self.workers[w].stalled.push(ev);
                return (NodeRef::Worker(w), Ok(()));
            }
            Some(NodeRef::Coordinator(c)) => {
                self.coords[c].stalled.push(ev);
                return (NodeRef::Coordinator(c), Ok(()));
            }
            _ => {}
        }
        match ev {
            Ev::ConnectDone {
                peer,
                gen,
                attempt,
                coord,
                ok,
            } => (
                peer.node(),
                self.connect_done(peer, gen, attempt, coord, ok),
            ),
            Ev::Up { conn, msg } => {
                let coord = self.conns[conn].coord;
                (NodeRef::Coordinator(coord), self.deliver_up(conn, msg))
            }
            Ev::Down { conn, msg } => {
                let peer = self.conns[conn].peer;
                (peer.node(), self.deliver_down(conn, msg))
            }
            Ev::ClosedAtCoord { conn } => {
                let coord = self.conns[conn].coord;
                (NodeRef::Coordinator(coord), self.closed_at_coord(conn))
            }
            Ev::ClosedAtPeer { conn } => {
                let peer = self.conns[conn].peer;
                (peer.node(), self.closed_at_peer(conn))
            }
            Ev::Durable { coord, gen, batch } => {
                (NodeRef::Coordinator(coord), self.durable(coord, gen, batch))
            }
            Ev::TaskDone {
                worker,
                gen,
                lease,
                token,
            } => (
                NodeRef::Worker(worker),
                self.task_done(worker, gen, lease, token),
            ),
            Ev::StartOp { client } => (NodeRef::Client(client), self.start_op(client)),
            Ev::FaultTick => (NodeRef::World, self.fault_tick()),
            Ev::CoordRestart { coord } => {
                (NodeRef::Coordinator(coord), self.restart_coordinator(coord))
            }
            Ev::WorkerRestart { worker } => (NodeRef::Worker(worker), self.restart_worker(worker)),
            Ev::WorkerResume { worker } => (NodeRef::Worker(worker), self.resume_worker(worker)),
            Ev::CoordResume { coord } => {
                (NodeRef::Coordinator(coord), self.resume_coordinator(coord))
            }
            Ev::ResendUp { conn, msg } => {
                let peer = self.conns[conn].peer.node();
                self.note(peer, format_args!("-> again (conn {conn}) {msg:?}"));
                (peer, self.send_up(conn, msg, false))
            }
            Ev::Heal { id } => (NodeRef::World, self.heal(Some(id))),
            Ev::Flush { conn, dir } => self.flush(conn, dir),
            Ev::FaultsEnd => (NodeRef::World, self.faults_end()),
        }
    }

    /// Delivers the oldest held message on `conn` in direction `dir`, unless a partition cuts
    /// the link again (the next heal resumes). One message per step, in order.
    fn flush(&mut self, conn: usize, dir: Dir) -> (NodeRef, Check) {
        *self.conns[conn].flushing(dir) = false;
        if self.link_cut(conn, dir) {
            return (NodeRef::World, Ok(()));
        }
        let Some(ev) = self.conns[conn].held(dir).pop_front() else {
            return (NodeRef::World, Ok(()));
        };
        if !self.conns[conn].held(dir).is_empty() {
            *self.conns[conn].flushing(dir) = true;
            self.push(self.now, Ev::Flush { conn, dir });
        }
        self.dispatch(ev)
    }

    // -----------------------------------------------------------------------------------------
    // Network
    // -----------------------------------------------------------------------------------------

    fn open_conn(
        &mut self,
        coord: usize,
        peer: Peer,
        peer_gen: u64,
        attempt: ConnectAttempt,
    ) -> usize {
        let id = self.conns.len();
        self.conns.push(Conn {
            coord,
            coord_gen: self.coords[coord].gen,
            peer,
            peer_gen,
            attempt,
            open: true,
            up_live: true,
            down_live: true,
            up_at: self.now,
            down_at: self.now,
            held_up: VecDeque::new(),
            held_down: VecDeque::new(),
            flushing_up: false,
            flushing_down: false,
        });
        self.open_conns.insert(id);
        id
    }

    /// One-way transit time of a message: latency, plus retransmission timeouts for every
    /// consecutive loss of its segment (TCP hides loss as delay on a live connection).
    fn transit(&mut self) -> u64 {
        let mut transit = self.latency();
        let loss = self.scenario.faults.loss;
        if self.faults_active && loss > 0.0 {
            let mut rto = RETRANSMIT_US;
            while rto <= 16 * RETRANSMIT_US && self.net.chance(loss) {
                self.count("fault: segment lost, retransmitted");
                transit += rto;
                rto *= 2;
            }
        }
        transit
    }

    /// Whether the sender repeats this message later (a duplicate fault).
    fn duplicate_after(&mut self, repeatable: bool) -> Option<u64> {
        let p = self.scenario.faults.duplicate;
        (self.faults_active && repeatable && p > 0.0 && self.net.chance(p)).then(|| {
            self.count("fault: message sent twice");
            self.net.range(0, 2_000_000)
        })
    }

    fn send_up(&mut self, conn: usize, msg: Up, may_repeat: bool) -> Check {
        if !self.conns[conn].open {
            return Ok(());
        }
        if let Some(after) = self.duplicate_after(may_repeat && repeatable_up(&msg)) {
            let copy = msg.clone();
            self.push(self.now + after, Ev::ResendUp { conn, msg: copy });
        }
        let msg = if self.scenario.codec {
            match msg {
                Up::Worker(m) => Up::Worker(through_codec(m)?),
                Up::Client(m) => Up::Client(through_codec(m)?),
            }
        } else {
            msg
        };
        let at = (self.now + self.transit()).max(self.conns[conn].up_at);
        self.conns[conn].up_at = at;
        self.push(at, Ev::Up { conn, msg });
        Ok(())
    }

    fn send_down(&mut self, conn: usize, msg: Down) -> Check {
        if !self.conns.get(conn).is_some_and(|c| c.open) {
            return Ok(());
        }
        let msg = if self.scenario.codec {
            match msg {
                Down::Worker(m) => Down::Worker(through_codec(m)?),
                Down::Client(m) => Down::Client(through_codec(m)?),
            }
        } else {
            msg
        };
        let at = (self.now + self.transit()).max(self.conns[conn].down_at);
        self.conns[conn].down_at = at;
        self.push(at, Ev::Down { conn, msg });
        Ok(())
    }

    /// Ends `conn` as `how` says; the ends told learn of it after whatever is still in
    /// flight towards them.
    fn close_conn(&mut self, conn: usize, how: Close) {
        let Some(c) = self.conns.get_mut(conn) else {
            return;
        };
        if !c.open {
            // Both ends closing at once: the closing side stops reading too.
            match how {
                Close::ByPeer => c.down_live = false,
                Close::ByCoord => c.up_live = false,
                Close::Reset { .. } => {
                    c.up_live = false;
                    c.down_live = false;
                }
            }
            return;
        }
        c.open = false;
        let (tell_coord, tell_peer) = match how {
            Close::Reset {
                tell_coord,
                tell_peer,
            } => {
                c.up_live = false;
                c.down_live = false;
                (tell_coord, tell_peer)
            }
            Close::ByPeer => {
                c.down_live = false;
                (true, false)
            }
            Close::ByCoord => {
                c.up_live = false;
                (true, true)
            }
        };
        self.open_conns.remove(&conn);
        if tell_coord {
            let at = (self.now + self.latency()).max(self.conns[conn].up_at);
            self.push(at, Ev::ClosedAtCoord { conn });
        }
        if tell_peer {
            let at = (self.now + self.latency()).max(self.conns[conn].down_at);
            self.push(at, Ev::ClosedAtPeer { conn });
        }
    }

    fn connect_done(
        &mut self,
        peer: Peer,
        gen: u64,
        attempt: ConnectAttempt,
        coord: usize,
        ok: bool,
    ) -> Check {
        let (current_gen, current_attempt) = match peer {
            Peer::Worker(w) => (self.workers[w].gen, self.workers[w].attempt),
            Peer::Client(c) => (0, self.clients[c].attempt),
        };
        if gen != current_gen || current_attempt != Some(attempt) {
            return Ok(());
        }
        let up = self.coords.get(coord).is_some_and(|c| c.machine.is_some());
        let there = NodeRef::Coordinator(coord);
        if self.is_cut(peer.node(), there) || self.is_cut(there, peer.node()) {
            // The handshake cannot cross: the attempt hangs until the peer's own connect
            // timeout gives up on it.
            self.count("net: connect lost in a partition");
            self.note(
                peer.node(),
                format_args!(
                    "connect to coord-{coord} lost in a partition (attempt {})",
                    attempt.0
                ),
            );
            return Ok(());
        }
        let conn = (ok && up).then(|| self.open_conn(coord, peer, gen, attempt));
        match conn {
            Some(conn) => self.note(
                peer.node(),
                format_args!(
                    "connected to coord-{coord} (conn {conn}, attempt {})",
                    attempt.0
                ),
            ),
            None => self.note(
                peer.node(),
                format_args!("connect to coord-{coord} failed (attempt {})", attempt.0),
            ),
        }
        let reason = if up {
            "connection refused (fault)"
        } else {
            "connection refused"
        };
        match peer {
            Peer::Worker(w) => {
                let node = &mut self.workers[w];
                node.conn = conn;
                let local = node.clock.local(self.now);
                if let Some(m) = &mut node.machine {
                    match conn {
                        Some(_) => m.handle_connected(local, attempt),
                        None => m.handle_connect_failed(local, attempt, reason),
                    }
                }
                self.drain_worker(w)
            }
            Peer::Client(c) => {
                let node = &mut self.clients[c];
                node.conn = conn;
                let local = node.clock.local(self.now);
                match conn {
                    Some(_) => node.machine.handle_connected(local, attempt),
                    None => node.machine.handle_connect_failed(local, attempt, reason),
                }
                self.drain_client(c)
            }
        }
    }

    fn deliver_up(&mut self, conn: usize, msg: Up) -> Check {
        let Conn {
            coord,
            coord_gen,
            open,
            up_live,
            peer,
            ..
        } = self.conns[conn];
        // Data for a coordinator process that has since died died with it: the restarted
        // process never had this connection.
        if !up_live || self.coords[coord].gen != coord_gen {
            return Ok(());
        }
        if !open {
            self.count("net: data delivered after its connection closed");
        }
        self.note(
            NodeRef::Coordinator(coord),
            format_args!("<- {} (conn {conn}) {msg:?}", peer.node()),
        );
        let node = &mut self.coords[coord];
        let local = node.clock.local(self.now);
        let Some(machine) = &mut node.machine else {
            return Ok(());
        };
        let id = ConnectionId(conn as u64);
        // A result for a lease that is not current must change nothing (SPEC 4.3).
        let mut stale = None;
        match msg {
            Up::Worker(message) => {
                if let WorkerToCoordinator::TaskResult {
                    job_id, lease_id, ..
                } = &message
                {
                    if !machine.table().is_current_lease(*job_id, *lease_id) {
                        stale = Some((*job_id, *lease_id, machine.job(job_id).cloned()));
                    }
                }
                machine.handle_worker_message(local, id, message)
            }
            Up::Client(message) => {
                if let ClientRequest::Submit {
                    request_id,
                    idempotency_key: Some(key),
                    ..
                } = &message
                {
                    self.submit_keys.insert((conn, *request_id), key.clone());
                }
                machine.handle_client_message(local, id, message)
            }
        }
        self.drain_coord(coord)?;
        if let Some((job_id, lease_id, before)) = stale {
            let after = self.coords[coord]
                .machine
                .as_ref()
                .and_then(|m| m.job(&job_id).cloned());
            if after != before {
                return Err(format!(
                    "a stale result (job {job_id}, lease {lease_id}) from {} changed the job: {before:?} -> {after:?}",
                    peer.node()
                ));
            }
        }
        Ok(())
    }

    fn deliver_down(&mut self, conn: usize, msg: Down) -> Check {
        let Conn {
            open,
            down_live,
            peer,
            peer_gen,
            attempt,
            ..
        } = self.conns[conn];
        if !down_live {
            return Ok(());
        }
        if !open {
            self.count("net: data delivered after its connection closed");
        }
        self.note(peer.node(), format_args!("<- conn {conn} {msg:?}"));
        match (peer, msg) {
            (Peer::Worker(w), Down::Worker(message)) => {
                let node = &mut self.workers[w];
                if node.gen != peer_gen {
                    return Ok(());
                }
                let local = node.clock.local(self.now);
                if let Some(m) = &mut node.machine {
                    m.handle_message(local, attempt, message);
                }
                self.drain_worker(w)
            }
            (Peer::Client(c), Down::Client(reply)) => {
                let node = &mut self.clients[c];
                let local = node.clock.local(self.now);
                node.machine.handle_message(local, attempt, reply);
                self.drain_client(c)
            }
            (peer, msg) => Err(format!("simulator bug: {msg:?} routed to {}", peer.node())),
        }
    }

    fn closed_at_coord(&mut self, conn: usize) -> Check {
        self.conns[conn].up_live = false;
        let Conn {
            coord, coord_gen, ..
        } = self.conns[conn];
        let node = &mut self.coords[coord];
        if node.gen != coord_gen {
            return Ok(());
        }
        let local = node.clock.local(self.now);
        if let Some(m) = &mut node.machine {
            m.handle_closed(local, ConnectionId(conn as u64));
        }
        self.note(
            NodeRef::Coordinator(coord),
            format_args!("conn {conn} closed"),
        );
        self.drain_coord(coord)
    }

    fn closed_at_peer(&mut self, conn: usize) -> Check {
        self.conns[conn].down_live = false;
        let Conn {
            peer,
            peer_gen,
            attempt,
            ..
        } = self.conns[conn];
        self.note(peer.node(), format_args!("conn {conn} reset"));
        match peer {
            Peer::Worker(w) => {
                let node = &mut self.workers[w];
                if node.gen != peer_gen {
                    return Ok(());
                }
                if node.conn == Some(conn) {
                    node.conn = None;
                }
                let local = node.clock.local(self.now);
                if let Some(m) = &mut node.machine {
                    m.handle_disconnected(local, attempt, "connection reset");
                }
                self.drain_worker(w)
            }
            Peer::Client(c) => {
                let node = &mut self.clients[c];
                if node.conn == Some(conn) {
                    node.conn = None;
                }
                let local = node.clock.local(self.now);
                node.machine
                    .handle_disconnected(local, attempt, "connection reset");
                self.drain_client(c)
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Draining outputs
    // -----------------------------------------------------------------------------------------

    fn conn_owner(&self, conn: ConnectionId) -> ConnOwner {
        match self.conns.get(conn.0 as usize).map(|c| c.peer) {
            Some(Peer::Worker(w)) => ConnOwner::Worker(self.workers[w].config.worker_id.clone()),
            Some(Peer::Client(_)) => ConnOwner::Client,
            None => ConnOwner::Unknown,
        }
    }

    fn drain_coord(&mut self, c: usize) -> Check {
        let node = NodeRef::Coordinator(c);
        loop {
            let Some(output) = self.coords[c]
                .machine
                .as_mut()
                .and_then(Coordinator::poll_output)
            else {
                return Ok(());
            };
            let (owner, key) = match &output {
                Output::ToWorker { conn, .. } => (self.conn_owner(*conn), None),
                Output::ToClient { conn, message } => (
                    ConnOwner::Client,
                    message
                        .request_id()
                        .and_then(|r| self.submit_keys.get(&(conn.0 as usize, r)).cloned()),
                ),
                _ => (ConnOwner::Unknown, None),
            };
            self.checker.check_output(&output, &owner, key.as_deref())?;
            match output {
                Output::ToWorker { conn, message } => {
                    self.note(node, format_args!("-> conn {conn} {message:?}"));
                    self.send_down(conn.0 as usize, Down::Worker(message))?;
                }
                Output::ToClient { conn, message } => {
                    self.note(node, format_args!("-> conn {conn} {message:?}"));
                    self.check_one_job_per_submission(conn, &message)?;
                    self.send_down(conn.0 as usize, Down::Client(message))?;
                }
                Output::Close { conn } => {
                    self.note(node, format_args!("close conn {conn}"));
                    self.close_conn(conn.0 as usize, Close::ByCoord);
                }
                Output::Persist(batch) => {
                    let (lo, hi) = self.scenario.disk_us;
                    let delay = self.disk_rng.range(lo, hi);
                    let coord = &mut self.coords[c];
                    let at = (self.now + delay).max(coord.last_durable_at);
                    coord.last_durable_at = at;
                    let (id, gen, records) = (batch.id, coord.gen, batch.records.len());
                    coord.pending.push_back(batch);
                    self.note(
                        node,
                        format_args!("persist batch {} ({records} records)", id.0),
                    );
                    self.push(
                        at,
                        Ev::Durable {
                            coord: c,
                            gen,
                            batch: id,
                        },
                    );
                }
                Output::Event(event) => {
                    self.count(event_name(&event));
                    self.note(node, format_args!("event: {event}"));
                }
            }
        }
    }

    fn drain_worker(&mut self, w: usize) -> Check {
        let node = NodeRef::Worker(w);
        loop {
            let Some(output) = self.workers[w]
                .machine
                .as_mut()
                .and_then(Worker::poll_output)
            else {
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
                WorkerOutput::StartTask {
                    job_id,
                    lease_id,
                    attempt,
                    task,
                    timeout,
                } => {
                    let outcome = match tasks::execute(&task, attempt) {
                        Ok(output) => AttemptOutcome::Succeeded { output },
                        Err(failure) => AttemptOutcome::Failed {
                            error: failure.message,
                        },
                    };
                    let sleep = match task {
                        TaskSpec::Sleep { milliseconds } => milliseconds * 1_000,
                        _ => 0,
                    };
                    let hang_p = self.scenario.faults.task_hang;
                    let faults = self.faults_active;
                    let worker = &mut self.workers[w];
                    let mut duration = sleep + worker.rng.range(100, 20_000);
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
                WorkerOutput::Event(event) => self.note(node, format_args!("event: {event}")),
            }
        }
    }

    fn drain_client(&mut self, c: usize) -> Check {
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
                    if let Ok(ClientReply::SubmitAccepted { job_id, .. }) = result {
                        self.clients[c].known.push(job_id);
                    }
                }
            }
        }
        Ok(())
    }

    /// One client submission creates at most one job, however often it is resent: an unkeyed
    /// submission must never be resent blindly, and a keyed one maps to the same job.
    fn check_one_job_per_submission(&mut self, conn: ConnectionId, reply: &ClientReply) -> Check {
        let ClientReply::SubmitAccepted {
            request_id,
            job_id,
            existing: false,
        } = reply
        else {
            return Ok(());
        };
        let Some(Peer::Client(c)) = self.conns.get(conn.0 as usize).map(|c| c.peer) else {
            return Ok(());
        };
        let first = *self.created_by.entry((c, *request_id)).or_insert(*job_id);
        if first == *job_id {
            Ok(())
        } else {
            Err(format!(
                "client-{c}'s submission {request_id} created two jobs, {first} and {job_id}"
            ))
        }
    }

    /// A client operation must be answered with a reply to that operation: the right kind, about
    /// the job it named, and for a submission the job that holds the submitted task.
    fn check_answer(&self, op: u64, asked: &Operation, reply: &ClientReply) -> Check {
        let fits = match (asked, reply) {
            (Operation::Submit { task, .. }, ClientReply::SubmitAccepted { job_id, .. }) => {
                let submitted = TaskSpec::from_json(task).ok();
                let durable = self.checker.facts.durable_table.get(job_id);
                durable.is_some_and(|job| Some(&job.task) == submitted.as_ref())
            }
            (Operation::Status { job_id }, ClientReply::Job { job, .. })
            | (Operation::Wait { job_id, .. }, ClientReply::WaitResult { job, .. })
            | (Operation::Cancel { job_id }, ClientReply::CancelResult { job, .. }) => {
                job.id == *job_id
            }
            (Operation::List { .. }, ClientReply::JobList { .. })
            | (Operation::Workers, ClientReply::WorkerList { .. }) => true,
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

    fn schedule_connect(&mut self, peer: Peer, gen: u64, attempt: ConnectAttempt, address: &str) {
        let refuse = self.faults_active && self.net.chance(self.scenario.faults.connect_fail);
        let delay = 2 * self.latency();
        self.push(
            self.now + delay,
            Ev::ConnectDone {
                peer,
                gen,
                attempt,
                coord: address_coordinator(address),
                ok: !refuse,
            },
        );
    }

    // -----------------------------------------------------------------------------------------
    // Disk and tasks
    // -----------------------------------------------------------------------------------------

    fn durable(&mut self, c: usize, gen: u64, batch: BatchId) -> Check {
        let node = &mut self.coords[c];
        if node.gen != gen {
            return Ok(());
        }
        while node.pending.front().is_some_and(|b| b.id <= batch) {
            if let Some(landed) = node.pending.pop_front() {
                node.disk.write(&landed.records);
                self.checker.record_durable(&landed.records);
            }
        }
        let local = node.clock.local(self.now);
        if let Some(m) = &mut node.machine {
            m.handle_persisted(local, batch);
        }
        self.note(
            NodeRef::Coordinator(c),
            format_args!("batch {} durable", batch.0),
        );
        self.drain_coord(c)
    }

    fn task_done(&mut self, w: usize, gen: u64, lease: LeaseId, token: u64) -> Check {
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

    // -----------------------------------------------------------------------------------------
    // Workload
    // -----------------------------------------------------------------------------------------

    fn start_op(&mut self, c: usize) -> Check {
        if self.clients[c].ops_left == 0 {
            return Ok(());
        }
        let op = self.next_op(c);
        let client = &mut self.clients[c];
        client.ops_left -= 1;
        client.started += 1;
        let local = client.clock.local(self.now);
        let id = client.machine.start(local, op.clone());
        client.open_ops.insert(id.0, (self.now, op.clone()));
        if client.ops_left > 0 {
            let span = self.scenario.fault_span_us / self.scenario.ops_per_client.max(1) as u64;
            let gap = client.rng.range(0, 2 * span);
            self.push(self.now + gap, Ev::StartOp { client: c });
        }
        self.note(
            NodeRef::Client(c),
            format_args!("start op {}: {op:?}", id.0),
        );
        self.drain_client(c)
    }

    fn next_op(&mut self, c: usize) -> Operation {
        let client = &mut self.clients[c];
        let rng = &mut client.rng;
        let pick = rng.below(100);
        let known = rng.pick(&client.known).copied();
        match (pick, known) {
            (50..=64, Some(job_id)) => Operation::Cancel { job_id },
            (65..=79, Some(job_id)) => Operation::Status { job_id },
            (80..=97, Some(job_id)) => Operation::Wait {
                job_id,
                timeout_millis: Some(rng.range(0, WAIT_MILLIS_MAX)),
            },
            (98..=99, _) => Operation::List {
                state: None,
                limit: Some(10),
            },
            _ => {
                let key = rng.chance(0.3).then(|| format!("key-{}", rng.below(4)));
                let spec = match &key {
                    Some(key) => match self.key_specs.get(key) {
                        Some(spec) if rng.chance(0.7) => spec.clone(),
                        _ => {
                            let spec = random_spec(rng);
                            self.key_specs
                                .entry(key.clone())
                                .or_insert_with(|| spec.clone());
                            spec
                        }
                    },
                    None => random_spec(rng),
                };
                let partitions = spec.is_data_parallel().then(|| match rng.below(3) {
                    0 => Partitions::Auto,
                    _ => Partitions::Count(rng.range(1, 5) as u32),
                });
                Operation::Submit {
                    task: spec.to_json(),
                    max_attempts: rng.chance(0.5).then(|| rng.range(1, 4) as u32),
                    idempotency_key: key,
                    partitions,
                }
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Faults
    // -----------------------------------------------------------------------------------------

    fn fault_tick(&mut self) -> Check {
        if !self.faults_active {
            return Ok(());
        }
        let faults = self.scenario.faults.clone();
        let mut kinds = Vec::new();
        if faults.coordinator_crash {
            kinds.push(0);
        }
        if faults.worker_crash {
            kinds.push(1);
        }
        if faults.worker_pause {
            kinds.push(2);
        }
        if faults.connection_reset {
            kinds.push(3);
        }
        if faults.coordinator_pause {
            kinds.push(4);
        }
        if faults.partition {
            kinds.push(5);
        }
        let kind = self.fault_rng.pick(&kinds).copied();
        let result = match kind {
            Some(0) => self.crash_coordinator(0),
            Some(1) => {
                let w = self.fault_rng.below(self.workers.len() as u64) as usize;
                self.crash_worker(w)
            }
            Some(2) => {
                let w = self.fault_rng.below(self.workers.len() as u64) as usize;
                self.pause_worker(w)
            }
            Some(3) => {
                let open: Vec<usize> = self.open_conns.iter().copied().collect();
                if let Some(&conn) = self.fault_rng.pick(&open) {
                    // Usually both ends get the reset; sometimes one or neither does (the
                    // connection silently goes dead, and only silence tells).
                    let (coord, peer, what) = match self.fault_rng.below(6) {
                        0 => (
                            true,
                            false,
                            "fault: connection dies, only the coordinator told",
                        ),
                        1 => (false, true, "fault: connection dies, only the peer told"),
                        2 => (false, false, "fault: connection dies silently"),
                        _ => (true, true, "fault: connection reset"),
                    };
                    self.count(what);
                    self.note(NodeRef::World, format_args!("FAULT conn {conn}: {what}"));
                    self.close_conn(
                        conn,
                        Close::Reset {
                            tell_coord: coord,
                            tell_peer: peer,
                        },
                    );
                }
                Ok(())
            }
            Some(4) => self.pause_coordinator(0),
            Some(5) => {
                self.start_partition();
                Ok(())
            }
            _ => Ok(()),
        };
        let gap = self
            .fault_rng
            .range(1, 2 * self.scenario.faults.tick_mean_us);
        self.push(self.now + gap, Ev::FaultTick);
        result
    }

    fn crash_coordinator(&mut self, c: usize) -> Check {
        if self.coords[c].machine.is_none() {
            return Ok(());
        }
        let torn = self.fault_rng.chance(self.scenario.faults.torn_tail);
        let pending = self.coords[c].pending.len() as u64;
        let landed = if torn {
            self.fault_rng.below(pending + 1) as usize
        } else {
            0
        };
        let down = self.fault_rng.range(50_000, 3_000_000);
        let node = &mut self.coords[c];
        node.machine = None;
        node.gen += 1;
        node.paused = false;
        node.stalled.clear();
        let pending: Vec<PersistBatch> = node.pending.drain(..).collect();
        for batch in &pending[..landed] {
            node.disk.write(&batch.records);
            self.checker.record_durable(&batch.records);
        }
        let lost = pending.len() - landed;
        self.count("fault: coordinator crash");
        if landed > 0 {
            self.count("fault: crash with unreported batches on disk");
        }
        self.note(
            NodeRef::Coordinator(c),
            format_args!(
                "FAULT crash: {landed} unreported batches reached the disk, {lost} lost; restart in {down} us"
            ),
        );
        let conns: Vec<usize> = self
            .open_conns
            .iter()
            .copied()
            .filter(|&conn| self.conns[conn].coord == c)
            .collect();
        // A dead process's kernel still sends what it had buffered, then closes; a dead host
        // just goes quiet.
        let how = if self.fault_rng.chance(0.5) {
            Close::ByCoord
        } else {
            Close::Reset {
                tell_coord: false,
                tell_peer: false,
            }
        };
        for conn in conns {
            self.close_conn(conn, how);
        }
        self.push(self.now + down, Ev::CoordRestart { coord: c });
        Ok(())
    }

    fn restart_coordinator(&mut self, c: usize) -> Check {
        let mut config = self.scenario.coordinator.clone();
        config.node_id = herder_core::ids::NodeId(coordinator_address(c));
        if self.coords[c].machine.is_some() {
            return Ok(());
        }
        let process = self.coords[c].gen;
        let clock = clock_for(
            self.seed,
            NodeRef::Coordinator(c),
            process,
            self.now,
            &self.scenario,
        );
        let node = &mut self.coords[c];
        node.clock = clock;
        let seed = node.seeds.next_u64();
        let local = node.clock.local(self.now);
        let machine = Coordinator::recover(config, seed, local, node.disk.durable_state())
            .map_err(|e| format!("recovery from the durable state failed: {e}"))?;
        node.machine = Some(machine);
        node.last_durable_at = self.now;
        node.timer_floor = 0;
        self.note(
            NodeRef::Coordinator(c),
            format_args!("restarted from disk (process seed {seed:#x})"),
        );
        self.drain_coord(c)
    }

    fn crash_worker(&mut self, w: usize) -> Check {
        if self.workers[w].machine.is_none() {
            return Ok(());
        }
        let down = self.fault_rng.range(100_000, 3_000_000);
        let node = &mut self.workers[w];
        node.machine = None;
        node.gen += 1;
        node.paused = false;
        node.stalled.clear();
        node.tasks.clear();
        node.attempt = None;
        let conn = node.conn.take();
        self.count("fault: worker crash");
        self.note(
            NodeRef::Worker(w),
            format_args!("FAULT crash; restart in {down} us"),
        );
        if let Some(conn) = conn {
            let how = match self.fault_rng.below(4) {
                0 | 1 => Close::ByPeer,
                2 => Close::Reset {
                    tell_coord: true,
                    tell_peer: false,
                },
                _ => Close::Reset {
                    tell_coord: false,
                    tell_peer: false,
                },
            };
            self.close_conn(conn, how);
        }
        self.push(self.now + down, Ev::WorkerRestart { worker: w });
        Ok(())
    }

    fn restart_worker(&mut self, w: usize) -> Check {
        if self.workers[w].machine.is_some() {
            return Ok(());
        }
        let process = self.workers[w].gen;
        let clock = clock_for(
            self.seed,
            NodeRef::Worker(w),
            process,
            self.now,
            &self.scenario,
        );
        let node = &mut self.workers[w];
        node.clock = clock;
        let seed = node.seeds.next_u64();
        let local = node.clock.local(self.now);
        let machine = Worker::new(node.config.clone(), seed, local)
            .map_err(|e| format!("worker restart failed: {e}"))?;
        let incarnation = machine.incarnation();
        node.machine = Some(machine);
        node.timer_floor = 0;
        self.note(
            NodeRef::Worker(w),
            format_args!("restarted as a new process (incarnation {incarnation})"),
        );
        self.drain_worker(w)
    }

    fn pause_worker(&mut self, w: usize) -> Check {
        let node = &self.workers[w];
        if node.machine.is_none() || node.paused {
            return Ok(());
        }
        let timeout = self.heartbeat_timeout_micros();
        let span = self.fault_rng.range(timeout / 2, 4 * timeout);
        self.workers[w].paused = true;
        self.count("fault: worker pause");
        self.note(
            NodeRef::Worker(w),
            format_args!("FAULT pause for {span} us"),
        );
        self.push(self.now + span, Ev::WorkerResume { worker: w });
        Ok(())
    }

    fn resume_worker(&mut self, w: usize) -> Check {
        let node = &mut self.workers[w];
        if !node.paused {
            return Ok(());
        }
        node.paused = false;
        let stalled = std::mem::take(&mut node.stalled);
        self.deliver_held(NodeRef::Worker(w), stalled)
    }

    /// A paused node resumes. What reached it meanwhile was already received, in order: it is
    /// handled now, in that order, before anything else, and does not cross the network again.
    fn deliver_held(&mut self, node: NodeRef, stalled: Vec<Ev>) -> Check {
        let count = stalled.len();
        self.note(
            node,
            format_args!("resume ({count} held events handled now)"),
        );
        for ev in stalled {
            self.dispatch(ev).1?;
        }
        Ok(())
    }

    /// Pauses are drawn relative to the heartbeat timeout, so they cross it sometimes.
    fn heartbeat_timeout_micros(&self) -> u64 {
        u64::try_from(self.scenario.coordinator.heartbeat_timeout.as_micros()).unwrap_or(0)
    }

    fn pause_coordinator(&mut self, c: usize) -> Check {
        let node = &self.coords[c];
        if node.machine.is_none() || node.paused {
            return Ok(());
        }
        let timeout = self.heartbeat_timeout_micros();
        let span = self.fault_rng.range(timeout / 4, 3 * timeout);
        self.coords[c].paused = true;
        self.count("fault: coordinator pause");
        self.note(
            NodeRef::Coordinator(c),
            format_args!("FAULT pause for {span} us"),
        );
        self.push(self.now + span, Ev::CoordResume { coord: c });
        Ok(())
    }

    fn resume_coordinator(&mut self, c: usize) -> Check {
        let node = &mut self.coords[c];
        if !node.paused {
            return Ok(());
        }
        node.paused = false;
        let stalled = std::mem::take(&mut node.stalled);
        self.deliver_held(NodeRef::Coordinator(c), stalled)
    }

    /// Starts a partition of a randomly chosen shape; it heals after a span drawn around the
    /// heartbeat timeout, so it sometimes outlasts it.
    fn start_partition(&mut self) {
        let coords: Vec<NodeRef> = (0..self.coords.len()).map(NodeRef::Coordinator).collect();
        let others: Vec<NodeRef> = (0..self.workers.len())
            .map(NodeRef::Worker)
            .chain((0..self.clients.len()).map(NodeRef::Client))
            .collect();
        let all: Vec<NodeRef> = coords.iter().chain(&others).copied().collect();
        let mut cuts = BTreeSet::new();
        let both = |a: NodeRef, b: NodeRef, cuts: &mut BTreeSet<(NodeRef, NodeRef)>| {
            cuts.insert((a, b));
            cuts.insert((b, a));
        };
        let rng = &mut self.fault_rng;
        let (Some(&coord), Some(&other)) = (rng.pick(&coords), rng.pick(&others)) else {
            return;
        };
        let shape = rng.below(4);
        let what = match shape {
            0 => {
                let Some(&lonely) = rng.pick(&all) else {
                    return;
                };
                for &n in all.iter().filter(|&&n| n != lonely) {
                    both(lonely, n, &mut cuts);
                }
                format!("isolate {lonely}")
            }
            1 => {
                both(coord, other, &mut cuts);
                format!("cut {coord} <-> {other}")
            }
            2 => {
                let (from, to) = if rng.chance(0.5) {
                    (coord, other)
                } else {
                    (other, coord)
                };
                cuts.insert((from, to));
                format!("cut {from} -> {to} only")
            }
            _ => {
                // Two sides; in a group, the side with most coordinators is the majority.
                let mut side: Vec<bool> = all.iter().map(|_| rng.chance(0.5)).collect();
                if side.iter().all(|&s| s) || side.iter().all(|&s| !s) {
                    let flip = rng.below(side.len() as u64) as usize;
                    side[flip] = !side[flip];
                }
                for (i, &a) in all.iter().enumerate() {
                    for (j, &b) in all.iter().enumerate() {
                        if side[i] != side[j] {
                            cuts.insert((a, b));
                        }
                    }
                }
                let names = |want: bool| {
                    all.iter()
                        .zip(&side)
                        .filter(|(_, &s)| s == want)
                        .map(|(n, _)| n.to_string())
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                format!("split {{{}}} | {{{}}}", names(true), names(false))
            }
        };
        let timeout = self.heartbeat_timeout_micros();
        let span = self.fault_rng.range(timeout / 2, 6 * timeout);
        self.next_partition += 1;
        let id = self.next_partition;
        self.partitions.push(Partition { id, cuts });
        self.count(match shape {
            0 => "fault: partition isolating one node",
            1 => "fault: partition cutting a pair",
            2 => "fault: one-way partition",
            _ => "fault: partition splitting the nodes",
        });
        self.note(
            NodeRef::World,
            format_args!("FAULT partition {id}: {what}; heals in {span} us"),
        );
        self.push(self.now + span, Ev::Heal { id });
    }

    /// Heals partition `id` (or all of them), then flushes every link no longer cut.
    fn heal(&mut self, id: Option<u64>) -> Check {
        let before = self.partitions.len();
        self.partitions.retain(|p| id.is_some_and(|id| p.id != id));
        if self.partitions.len() == before {
            return Ok(());
        }
        match id {
            Some(id) => self.note(NodeRef::World, format_args!("partition {id} heals")),
            None => self.note(NodeRef::World, format_args!("every partition heals")),
        }
        for conn in 0..self.conns.len() {
            for dir in [Dir::Up, Dir::Down] {
                let c = &mut self.conns[conn];
                if c.held(dir).is_empty() || *c.flushing(dir) || self.link_cut(conn, dir) {
                    continue;
                }
                // TCP's next retransmission gets through.
                let at = self.now + self.latency() + self.net.range(0, RETRANSMIT_US);
                *self.conns[conn].flushing(dir) = true;
                self.push(at, Ev::Flush { conn, dir });
            }
        }
        Ok(())
    }

    fn faults_end(&mut self) -> Check {
        self.faults_active = false;
        self.note(
            NodeRef::World,
            format_args!("faults stop; liveness phase begins"),
        );
        self.heal(None)?;
        for w in 0..self.workers.len() {
            self.resume_worker(w)?;
        }
        for c in 0..self.coords.len() {
            self.resume_coordinator(c)?;
        }
        Ok(())
    }
}

/// Runs one seed with the scenario it draws.
pub fn run_seed(seed: u64, trace: bool) -> RunReport {
    run_scenario(seed, Scenario::draw(seed), trace)
}

/// Runs one seed with a given scenario.
pub fn run_scenario(seed: u64, scenario: Scenario, trace: bool) -> RunReport {
    match World::new(seed, scenario, trace) {
        Ok(world) => world.run(),
        Err(error) => RunReport {
            seed,
            hash: 0,
            failure: Some(format!("setup: {error}")),
            simulated_us: 0,
            steps: 0,
            assignments: 0,
            completions: 0,
            acknowledged: 0,
            slowest_call_us: 0,
            findings: Vec::new(),
            coverage: BTreeMap::new(),
            trace: Vec::new(),
        },
    }
}
