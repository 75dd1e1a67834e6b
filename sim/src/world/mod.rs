//! The simulated world: virtual time, one event queue, nodes with their own clocks, a TCP-like
//! network, coordinator disks, faults and a workload, all drawn from one seed.
//!
//! Every step takes the earliest of (a) the head of the event queue, ordered by (time, sequence),
//! and (b) the earliest due timer of a running node (from its `poll_timeout`, mapped from the
//! node's clock to virtual time). After every step the checker runs.
//!
//! Each part of the world has its own module, and each adds its share of `impl World`:
//!
//! - `events`: the event queue and how an event reaches its handler.
//! - `timers`: node timers, mapped from each node's clock to virtual time.
//! - `network`: connections, what travels on them and when, partitions.
//! - `disk`: the coordinators' simulated disks.
//! - `faults`: the fault tick and every fault action.
//! - `workload`: what clients ask, and when.
//! - `handlers`: the simulated handlers of user tasks.
//! - `nodes`: coordinators, workers and clients, and the drivers that drain their outputs.
//!
//! This module holds the world itself, its construction, the run loop, the checks made after
//! every step and the liveness phase once faults stop.

pub(super) mod answers;
mod disk;
mod events;
mod faults;
mod handlers;
mod impostors;
mod network;
mod nodes;
mod script;
mod timers;
mod workload;

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, VecDeque};
use std::fmt::{self, Write as _};

use herder_core::client::{Client, ClientConfig};
use herder_core::coordinator::Coordinator;
use herder_core::ids::{Incarnation, JobId, LeaseId, LogIndex, RequestId, WorkerId};
use herder_core::job::JobState;
use herder_core::protocol::{CoordinatorToWorker, JobSubmission, WorkerToCoordinator};
use herder_core::tasks::TaskSpec;
use herder_core::time::{Instant, UnixMillis};
use herder_core::worker::{Worker, WorkerConfig};

use crate::budget::{
    self, Sabotage, IN_FLIGHT_EVERY, IN_FLIGHT_MAX, STEPS_AT_ONE_INSTANT_MAX, STEPS_MAX,
    TAIL_LINES, TRACE_LINES_MAX,
};
use crate::checker::{Check, Checker, Disk, Floor, ReadMark};
use crate::rng::{Fnv, SimRng};
use crate::scenario::Scenario;
use crate::submission::Rules;

use events::{Ev, Queued};
use faults::COORDINATOR_DOWN_MAX_US;
use network::{Conn, Down, Partition, Peer, Up};
use nodes::{
    clock_for, coordinator_address, coordinator_config, ClientNode, CoordNode, WorkerNode,
};
use workload::WAIT_MILLIS_MAX;

pub use nodes::{Clock, NodeRef, WORLD_WALL_EPOCH};

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
    /// For every crash of the acting leader while every member was up (and no second crash
    /// before it ended): the time until a member acted as leader again
    /// (its first entry of its term applied), in microseconds.
    pub failovers_us: Vec<u64>,
    /// Problems that break no invariant of docs/SIMULATION.md but are bugs all the same (e.g. a
    /// timer that stays due after `handle_timeout`, which makes a real driver spin).
    pub findings: Vec<String>,
    /// How often each interesting thing happened (coordinator events, faults), to show what a
    /// batch of seeds reached.
    pub coverage: BTreeMap<&'static str, u64>,
    pub trace: Vec<String>,
    /// The most work in flight seen at once (see `budget::IN_FLIGHT_MAX`), counted every
    /// `budget::IN_FLIGHT_EVERY` steps.
    pub peak_in_flight: usize,
    /// The most steps taken at one instant of virtual time (see
    /// `budget::STEPS_AT_ONE_INSTANT_MAX`).
    pub peak_instant_steps: u64,
    /// Each term some member led, with that member, in term order (as the checker saw leaders'
    /// messages leave; a group of one sends none).
    pub leaders: Vec<(u64, usize)>,
    /// For each step of the scenario's script, in order: the member it struck (none: it was
    /// aimed at the leader and no member led then).
    pub script_targets: Vec<Option<usize>>,
}

/// What the checker needs of a `SUBMIT_BATCH`, noted when it reached a coordinator: what that
/// coordinator had applied, how far the committed log went then, its jobs, and of each job its
/// key (with that committed index) and the fewest admission slots it can take.
pub(crate) struct SubmittedBatch {
    pub(crate) arrived: LogIndex,
    pub(crate) committed: LogIndex,
    pub(crate) jobs: Vec<JobSubmission>,
    pub(crate) items: Vec<(Option<(String, LogIndex)>, u64)>,
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
    /// When the acting leader crashed (virtual time), until a member acts as leader again.
    failover_from: Option<u64>,
    failovers_us: Vec<u64>,
    partitions: Vec<Partition>,
    next_partition: u64,
    next_token: u64,
    /// Keyed submissions: the key, and how far the committed log went when the request reached
    /// a coordinator.
    submit_keys: HashMap<(usize, RequestId), (String, LogIndex)>,
    /// (connection, request id) -> the fewest admission slots that submission can take.
    submit_dp: HashMap<(usize, RequestId), u64>,
    /// (connection, request id) of a `SUBMIT` -> what it asked, and how far the committed log
    /// went when it reached a coordinator.
    submit_jobs: HashMap<(usize, RequestId), (JobSubmission, LogIndex)>,
    /// (connection, request id) of a `SUBMIT_BATCH` -> the same of each of its jobs.
    submit_batches: HashMap<(usize, RequestId), SubmittedBatch>,
    /// (connection, request id) of a read -> what the committed log said of what it reads
    /// when the request reached a coordinator: the answer may be newer, never older.
    read_floors: HashMap<(usize, RequestId), Floor>,
    /// Requests other than submissions, as they reached a coordinator: (connection, request)
    /// -> what was asked, to judge the answer (removed as it leaves).
    asked: HashMap<(usize, RequestId), answers::Asked>,
    /// The member each scripted step struck, in order (see `RunReport::script_targets`).
    script_targets: Vec<Option<usize>>,
    /// (connection, request id) of a read a leader must confirm -> that leader, and what it
    /// had sent when the read reached it.
    read_marks: HashMap<(usize, RequestId), (usize, ReadMark)>,
    /// Coordinators that restarted from an empty disk so far.
    wiped: usize,
    /// Workers that crashed for good.
    left: BTreeSet<usize>,
    /// (worker, process) -> that process's incarnation.
    incarnations: HashMap<(usize, u64), Incarnation>,
    /// Lease -> when its first `TASK_ASSIGN` left, and the deadline it carried (ms).
    assign_sent: HashMap<LeaseId, (u64, u64)>,
    /// When every call was first seen answered (the quiet phase before the last checks).
    quiet_from: Option<u64>,
    /// Since when every job has been terminal, in the quiet phase.
    all_terminal_from: Option<u64>,
    /// (client, request id, job of the batch) -> the job that submission created: one
    /// operation, one job (a `SUBMIT` is job 0 of its request).
    created_by: HashMap<(usize, RequestId, usize), JobId>,
    /// Results an acting leader found stale on arrival: (coordinator, process, lease).
    stale_results: HashSet<(usize, u64, LeaseId)>,
    /// What each idempotency key was first used for: the task and its deadline.
    key_specs: BTreeMap<String, (TaskSpec, Option<u64>)>,
    /// The last honest handshake's words, for an impostor to replay.
    last_handshake: Option<Vec<herder_core::auth::AuthRequest>>,
    /// Writes a reader client asked for: (connection, request). Each must be answered
    /// `FORBIDDEN`.
    reader_writes: HashSet<(usize, RequestId)>,
    /// The clients that hold a reader's token (the scenario's last `reader_clients`).
    readers: BTreeSet<usize>,
    hash: Fnv,
    trace: Option<Vec<String>>,
    steps: u64,
    findings: Vec<String>,
    coverage: BTreeMap<&'static str, u64>,
    /// A bug planted on purpose (see `budget::Sabotage`), and when it strikes.
    sabotage: Sabotage,
    sabotage_at: u64,
    /// The most trace lines kept when tracing; the oldest go first.
    trace_keep: usize,
    /// The most work in flight counted so far.
    peak_in_flight: usize,
    /// Set when the seed ran out of a budget or panicked: its failure then shows the last
    /// events.
    runaway: bool,
    /// Trace lines dropped to keep at most `trace_keep`.
    trace_dropped: u64,
    /// Steps taken since virtual time last moved on, and the most of any instant so far.
    instant_steps: u64,
    peak_instant_steps: u64,
}

/// The partition id of the event a planted runaway or flood keeps scheduling. Partitions are
/// numbered from 0, so no real partition has it, and healing it would change nothing.
const SABOTAGE_EVENT: u64 = u64::MAX;

/// The longest the world waits, once every call is answered, for every job to end before the
/// last checks (a job nobody was told about may still be running a long sleep).
const QUIET_WAIT_MAX_US: u64 = 30_000_000;

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

impl World {
    pub fn new(seed: u64, scenario: Scenario, trace: bool) -> Result<World, String> {
        let addresses: Vec<String> = (0..scenario.coordinators)
            .map(coordinator_address)
            .collect();
        let mut coords = Vec::new();
        for c in 0..scenario.coordinators {
            let mut seeds = SimRng::new(seed, "coordinator-process", c as u64);
            let clock = clock_for(seed, NodeRef::Coordinator(c), 0, 0, &scenario);
            let config = coordinator_config(&scenario, c, &clock, 0);
            let machine = Coordinator::new(config, seeds.next_u64())
                .map_err(|e| format!("bad coordinator config: {e}"))?;
            coords.push(CoordNode {
                machine: Some(machine),
                gen: 0,
                clock,
                disk: Disk::default(),
                pending: VecDeque::new(),
                last_durable_at: 0,
                seeds,
                timer_floor: 0,
                stuck: None,
                paused: false,
                stalled: Vec::new(),
                wall_step_ms: 0,
            });
        }
        let mut checker = Checker::new(scenario.coordinators);
        checker.set_members(
            addresses
                .iter()
                .map(|a| herder_core::ids::NodeId(a.clone()))
                .collect(),
        );
        checker.model.fairness = crate::fairness::Fairness::new(scenario.leases());
        checker.set_default_timeout(
            u64::try_from(scenario.coordinator.task_timeout.as_millis()).unwrap_or(u64::MAX),
        );
        checker.set_rules(Rules {
            max_active_jobs: scenario.coordinator.max_active_jobs,
            default_max_attempts: scenario.coordinator.default_max_attempts,
            max_frame_bytes: scenario.coordinator.max_frame_bytes,
        });
        let mut workers = Vec::new();
        let mut incarnations = HashMap::new();
        for w in 0..scenario.workers {
            let id = WorkerId::parse(&format!("w{w}")).map_err(|e| e.to_string())?;
            let mut config = WorkerConfig::new(id, scenario.worker_capacity[w], addresses.clone());
            if let Some(tasks) = scenario.worker_tasks.get(w) {
                config.tasks = tasks.clone();
            }
            if let Some(&prefetch) = scenario.worker_prefetch.get(w) {
                config.prefetch = prefetch;
            }
            let mut seeds = SimRng::new(seed, "worker-process", w as u64);
            let clock = clock_for(seed, NodeRef::Worker(w), 0, 0, &scenario);
            let machine = Worker::new(config.clone(), seeds.next_u64(), clock.local(0))
                .map_err(|e| format!("bad worker config: {e}"))?;
            checker.worker_process(&config.worker_id, machine.incarnation(), &config.tasks);
            incarnations.insert((w, 0), machine.incarnation());
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
                drain: None,
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
            checker,
            faults_active: scenario.faults.any(),
            fault_end,
            deadline,
            call_bound_us,
            slowest_call_us: 0,
            failover_from: None,
            failovers_us: Vec::new(),
            partitions: Vec::new(),
            next_partition: 0,
            next_token: 0,
            submit_keys: HashMap::new(),
            submit_dp: HashMap::new(),
            submit_jobs: HashMap::new(),
            submit_batches: HashMap::new(),
            read_floors: HashMap::new(),
            asked: HashMap::new(),
            script_targets: Vec::new(),
            read_marks: HashMap::new(),
            wiped: 0,
            left: BTreeSet::new(),
            incarnations,
            assign_sent: HashMap::new(),
            quiet_from: None,
            all_terminal_from: None,
            created_by: HashMap::new(),
            stale_results: HashSet::new(),
            key_specs: BTreeMap::new(),
            last_handshake: None,
            reader_writes: HashSet::new(),
            readers: (scenario.clients.saturating_sub(scenario.reader_clients)..scenario.clients)
                .collect(),
            hash: Fnv::new(),
            trace: trace.then(Vec::new),
            steps: 0,
            findings: Vec::new(),
            coverage: BTreeMap::new(),
            sabotage: Sabotage::None,
            sabotage_at: u64::MAX,
            trace_keep: TRACE_LINES_MAX,
            peak_in_flight: 0,
            runaway: false,
            trace_dropped: 0,
            instant_steps: 0,
            peak_instant_steps: 0,
            scenario,
        })
    }

    pub fn scenario(&self) -> &Scenario {
        &self.scenario
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

    /// Plants a bug in this seed on purpose (see `budget::Sabotage`). It strikes halfway
    /// through the fault span, so the seed has done real work by then.
    pub fn sabotage(&mut self, sabotage: Sabotage) {
        self.sabotage = sabotage;
        self.sabotage_at = match sabotage {
            Sabotage::None => u64::MAX,
            _ => self.fault_end / 2,
        };
    }

    /// Runs the seed to the end; returns the report.
    pub fn run(mut self) -> RunReport {
        let mut failure = self.run_caught().err();
        if let Some(failure) = &mut failure {
            if self.runaway {
                failure.push_str("\n  last events:");
                for line in self.last_events() {
                    failure.push_str("\n    ");
                    failure.push_str(&line);
                }
            }
            let failure = failure.clone();
            self.note(NodeRef::World, format_args!("FAILURE: {failure}"));
        }
        let mut trace = self.trace.take().unwrap_or_default();
        if self.trace_dropped > 0 {
            trace.insert(
                0,
                format!(
                    "({} earlier trace lines dropped: a trace keeps at most {})",
                    self.trace_dropped, self.trace_keep
                ),
            );
        }
        if self.checker.elections_judged > 0 {
            self.coverage.insert(
                "consensus: a leader's election judged from the votes delivered to it",
                self.checker.elections_judged,
            );
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
            failovers_us: std::mem::take(&mut self.failovers_us),
            findings: std::mem::take(&mut self.findings),
            coverage: std::mem::take(&mut self.coverage),
            trace,
            peak_in_flight: self.peak_in_flight,
            peak_instant_steps: self.peak_instant_steps.max(self.instant_steps),
            leaders: self.checker.leaders(),
            script_targets: std::mem::take(&mut self.script_targets),
        }
    }

    /// Runs the seed; a panic inside it becomes the seed's failure.
    fn run_caught(&mut self) -> Check {
        match budget::catch(|| self.run_inner()) {
            Ok(check) => check,
            Err(panic) => {
                self.runaway = true;
                Err(format!("panic {panic}"))
            }
        }
    }

    /// The last trace lines before the seed stopped. A run without a trace formats none
    /// (formatting would slow every seed down), so it runs the seed again from the start with
    /// the trace on, keeping only the last lines. The seed is deterministic: the second run
    /// stops at the same step, after the same events. Only a failing seed pays for this.
    fn last_events(&self) -> Vec<String> {
        let tail = |lines: &[String]| lines[lines.len().saturating_sub(TAIL_LINES)..].to_vec();
        if let Some(lines) = &self.trace {
            return tail(lines);
        }
        let Ok(mut again) = World::new(self.seed, self.scenario.clone(), true) else {
            return Vec::new();
        };
        again.sabotage(self.sabotage);
        again.trace_keep = TAIL_LINES;
        let _ = again.run_caught();
        tail(again.trace.as_deref().unwrap_or_default())
    }

    /// Ends a seed that ran out of a budget (see `budget`). Most steps this costs a few
    /// comparisons; the work in flight is counted in full only every `IN_FLIGHT_EVERY` steps.
    fn within_budgets(&mut self) -> Check {
        let instant_steps = self.instant_steps;
        if instant_steps > STEPS_AT_ONE_INSTANT_MAX {
            return self.livelock(format_args!(
                "steps at one instant: limit {STEPS_AT_ONE_INSTANT_MAX}, reached {instant_steps} (time stands still)"
            ));
        }
        let steps = self.steps;
        if steps > STEPS_MAX {
            return self.livelock(format_args!("steps: limit {STEPS_MAX}, reached {steps}"));
        }
        if self.queue.len() > IN_FLIGHT_MAX || self.steps % IN_FLIGHT_EVERY == 0 {
            let queued = self.queue.len();
            let held: usize = self
                .conns
                .iter()
                .map(|c| c.held_up.len() + c.held_down.len())
                .sum();
            let waiting: usize = self.coords.iter().map(|c| c.stalled.len()).sum::<usize>()
                + self.workers.iter().map(|w| w.stalled.len()).sum::<usize>();
            let pending: usize = self.coords.iter().map(|c| c.pending.len()).sum();
            let total = queued + held + waiting + pending;
            self.peak_in_flight = self.peak_in_flight.max(total);
            if total > IN_FLIGHT_MAX {
                return self.livelock(format_args!(
                    "work in flight: limit {IN_FLIGHT_MAX}, reached {total} ({queued} events queued, {held} messages held by partitions, {waiting} events waiting at paused nodes, {pending} disk batches pending)"
                ));
            }
        }
        Ok(())
    }

    fn livelock(&mut self, what: fmt::Arguments<'_>) -> Check {
        self.runaway = true;
        Err(format!(
            "livelock: budget exceeded: {what}, at t={} after {} steps",
            Instant::from_micros(self.now),
            self.steps
        ))
    }

    /// The planted bug strikes (see `budget::Sabotage`).
    fn plant(&mut self) {
        self.sabotage_at = u64::MAX;
        match self.sabotage {
            Sabotage::None => {}
            Sabotage::Panic => panic!(
                "sabotage: a panic planted in seed {} at t={}",
                self.seed,
                Instant::from_micros(self.now)
            ),
            Sabotage::Runaway | Sabotage::Flood => {
                self.push(self.now, Ev::Heal { id: SABOTAGE_EVENT });
            }
        }
    }

    /// The planted runaway or flood event comes due and schedules itself again.
    fn sabotage_again(&mut self) -> Check {
        self.note(
            NodeRef::World,
            format_args!("sabotage: a planted event schedules itself again"),
        );
        if self.sabotage == Sabotage::Flood {
            self.push(self.now + 1_000, Ev::Heal { id: SABOTAGE_EVENT });
            self.push(self.now + 1_000, Ev::Heal { id: SABOTAGE_EVENT });
        } else {
            self.push(self.now, Ev::Heal { id: SABOTAGE_EVENT });
        }
        Ok(())
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
        self.schedule_script();
        for c in 0..self.coords.len() {
            if let Some(machine) = &self.coords[c].machine {
                self.checker.process_started(c, LogIndex(0), machine);
            }
            self.greet_peers(c);
            self.drain_coord(c)?;
        }
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
            if at > self.now {
                self.now = at;
                self.peak_instant_steps = self.peak_instant_steps.max(self.instant_steps);
                self.instant_steps = 0;
            }
            if self.now >= self.sabotage_at {
                self.plant();
            }
            let (node, result) = if take_queue {
                let ev = self.queue.pop().map(|q| q.ev);
                match ev {
                    Some(Ev::Heal { id: SABOTAGE_EVENT }) => {
                        (NodeRef::World, self.sabotage_again())
                    }
                    Some(ev) => self.process(ev),
                    None => continue,
                }
            } else {
                let node = timer.map(|(_, n)| n).unwrap_or(NodeRef::World);
                (node, self.fire_timer(node))
            };
            self.steps += 1;
            self.instant_steps += 1;
            result
                .and_then(|()| self.check_state())
                .map_err(|e| format!("t={} {node}: {e}", Instant::from_micros(self.now)))?;
            self.within_budgets()?;
            if let Some(lines) = &mut self.trace {
                // A traced run keeps only its last lines (all of them, for an honest seed).
                if lines.len() > self.trace_keep + self.trace_keep / 2 + 1_024 {
                    let drop = lines.len() - self.trace_keep;
                    lines.drain(..drop);
                    self.trace_dropped += drop as u64;
                }
            }
            if self.now >= self.fault_end && self.all_done() {
                let answered = *self.quiet_from.get_or_insert(self.now);
                // Quiet: every job has been terminal for a while (what its end set in motion
                // has landed), but for those left queued because no worker serves their kind.
                let unsettled = self.unsettled_jobs();
                if unsettled > 0 {
                    self.all_terminal_from = None;
                }
                let terminal = unsettled == 0;
                let since = *self.all_terminal_from.get_or_insert(self.now);
                let quiet = terminal && self.now >= since + self.quiet_span_us();
                let waited_enough = self.now >= answered + QUIET_WAIT_MAX_US;
                // The slot check judges a still picture: it waits while a message that moves a
                // lease between a worker and a coordinator is on its way.
                let settled = quiet && !self.lease_traffic_in_flight();
                if settled || waited_enough {
                    self.check_disk_matches()?;
                    if settled {
                        self.check_worker_slots()?;
                    }
                    let acked = self.checker.acked().len();
                    let waiting = self
                        .checker
                        .model
                        .jobs
                        .values()
                        .filter(|j| !j.state.is_terminal() && j.parent.is_none())
                        .count();
                    let scheduled = self
                        .checker
                        .model
                        .jobs
                        .values()
                        .filter(|j| j.state == JobState::Scheduled)
                        .count();
                    if waiting > scheduled {
                        self.count("liveness: a job waits queued, no worker serves its kind");
                    }
                    if scheduled > 0 {
                        self.count(
                            "liveness: a job waits scheduled, its time ahead of the leader's clock",
                        );
                    }
                    self.note(
                        NodeRef::World,
                        format_args!("liveness reached: {acked} acknowledged jobs terminal, waiting for a worker that serves them or for their time ({waiting} waiting, {scheduled} of them for their time), every operation done"),
                    );
                    return Ok(());
                }
            }
        }
    }

    /// Once everything is terminal and the network has been quiet a while, the leader's slot
    /// accounting must match what each worker really holds: the attempts it runs and the
    /// results it still waits to have acknowledged.
    fn check_worker_slots(&self) -> Check {
        let Some(leader) = self.acting_leader() else {
            return Ok(());
        };
        for entry in leader.workers().filter(|w| w.alive) {
            let Some(w) = self
                .workers
                .iter()
                .position(|node| node.config.worker_id == entry.id)
            else {
                continue;
            };
            let Some(machine) = &self.workers[w].machine else {
                continue;
            };
            if machine.incarnation() != entry.incarnation {
                continue;
            }
            let held: BTreeSet<_> = machine
                .running()
                .chain(machine.waiting())
                .map(|(lease, _)| lease)
                .chain(machine.unacknowledged_leases())
                .collect();
            let counted: BTreeSet<_> = entry.leases.keys().copied().collect();
            if held != counted {
                return Err(format!(
                    "quiet: the leader counts {} slots of worker {} as taken ({counted:?}), but the worker holds {held:?}",
                    counted.len(),
                    entry.id
                ));
            }
        }
        Ok(())
    }

    /// Whether a message that hands out, reports or settles an attempt is queued or held on
    /// some worker connection (heartbeats do not count: they never change who holds what).
    fn lease_traffic_in_flight(&self) -> bool {
        let moves_a_lease = |ev: &Ev| match ev {
            Ev::Up { msg, .. } | Ev::ResendUp { msg, .. } => {
                matches!(msg, Up::Worker(m) if !matches!(m, WorkerToCoordinator::Heartbeat {}))
            }
            Ev::Down { msg, .. } => matches!(
                msg,
                Down::Worker(m) if !matches!(m, CoordinatorToWorker::HeartbeatAck { .. })
            ),
            Ev::ConnectDone { peer, .. } => matches!(peer, Peer::Worker(_)),
            _ => false,
        };
        self.queue.iter().any(|q| moves_a_lease(&q.ev))
            || self.conns.iter().any(|c| {
                c.held_up
                    .iter()
                    .chain(c.held_down.iter())
                    .any(moves_a_lease)
            })
    }

    /// How long the world runs on after every call is answered, before the slot check: long
    /// enough for everything in flight to land and for a lost worker to be noticed.
    fn quiet_span_us(&self) -> u64 {
        let micros = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(0);
        2 * micros(self.scenario.coordinator.heartbeat_timeout) + 500_000
    }

    fn check_state(&mut self) -> Check {
        for (c, coord) in self.coords.iter().enumerate() {
            if let Some(machine) = &coord.machine {
                self.checker
                    .observe(c, machine)
                    .map_err(|e| format!("coord-{c}: {e}"))?;
                self.checker
                    .check_state(c, machine.table(), machine.workers())
                    .map_err(|e| format!("coord-{c}: {e}"))?;
            }
        }
        Ok(())
    }

    /// The member acting as leader (caught up with its term), if any.
    /// The member acting as leader (of the highest term, should two think they do).
    fn acting_leader_index(&self) -> Option<usize> {
        self.coords
            .iter()
            .enumerate()
            .filter_map(|(c, node)| Some((c, node.machine.as_ref()?)))
            .filter(|(_, m)| m.is_acting_leader())
            .max_by_key(|(_, m)| m.replica().term())
            .map(|(c, _)| c)
    }

    /// The wall clock of the member acting as leader, now (what its `Due` entries are
    /// stamped with).
    fn leader_wall_now(&self) -> Option<UnixMillis> {
        let node = &self.coords[self.acting_leader_index()?];
        let machine = node.machine.as_ref()?;
        Some(
            machine
                .config()
                .wall_clock_at_epoch
                .at(node.clock.local(self.now)),
        )
    }

    fn acting_leader(&self) -> Option<&Coordinator> {
        self.coords[self.acting_leader_index()?].machine.as_ref()
    }

    fn all_done(&self) -> bool {
        if self
            .clients
            .iter()
            .any(|c| c.ops_left > 0 || c.machine.pending() > 0)
        {
            return false;
        }
        let Some(machine) = self.acting_leader() else {
            return false;
        };
        self.checker.acked().iter().all(|id| {
            self.at_rest(id)
                && match machine.job(id) {
                    Some(job) => {
                        job.state.is_terminal()
                            || self.checker.model.jobs.get(id).map(|j| j.state) == Some(job.state)
                    }
                    None => self.checker.purged(id),
                }
        })
    }

    /// Whether no worker that stays serves `kind`. A job of that kind, once queued, waits for
    /// good (it is never assigned), and the liveness phase accepts that.
    fn stranded(&self, kind: &str) -> bool {
        !(0..self.workers.len())
            .filter(|w| !self.left.contains(w))
            .any(|w| self.workers[w].config.tasks.iter().any(|k| k == kind))
    }

    /// Whether a job is at rest by the committed log: terminal, or queued (a data-parallel
    /// parent: each unfinished partition queued) with a kind no staying worker serves.
    fn at_rest(&self, id: &JobId) -> bool {
        let model = &self.checker.model;
        let Some(job) = model.job_ever(id) else {
            return false;
        };
        if job.state.is_terminal() {
            return true;
        }
        // A job waiting for others rests while every one it still waits for rests (the graph
        // has no cycles: a job waits only for jobs submitted before it).
        if job.state == JobState::Blocked {
            return job.after.iter().all(|parent| {
                model
                    .job_ever(parent)
                    .is_none_or(|p| p.state.is_terminal() || self.at_rest(parent))
            });
        }
        // A job waiting for a time the leader's clock has not reached is not late: members'
        // clocks disagree (and are stepped), and it waits for the leader's.
        if job.state == JobState::Scheduled {
            let run_at = job.run_at.unwrap_or(0);
            return self.leader_wall_now().is_some_and(|now| now.0 < run_at);
        }
        // A paused queue starts nothing: its queued jobs wait for an operator, for good.
        let paused = model.rules_of(&job.queue, model.applied).paused;
        if !self.stranded(job.task.kind()) && !paused {
            return false;
        }
        match job.state {
            JobState::Queued => true,
            JobState::Running if !job.partitions.is_empty() => job.partitions.iter().all(|p| {
                model
                    .jobs
                    .get(p)
                    .is_some_and(|j| j.state.is_terminal() || j.state == JobState::Queued)
            }),
            _ => false,
        }
    }

    /// Jobs of the committed log that are not at rest yet.
    fn unsettled_jobs(&self) -> usize {
        self.checker
            .model
            .jobs
            .keys()
            .filter(|id| !self.at_rest(id))
            .count()
    }

    fn liveness_failure(&mut self, why: &str) -> Check {
        let mut problems = Vec::new();
        match self.acting_leader() {
            None => {
                let roles: Vec<String> = self
                    .coords
                    .iter()
                    .enumerate()
                    .map(|(c, node)| match &node.machine {
                        Some(m) => format!(
                            "coord-{c} {} in term {}{}",
                            m.replica().role_kind(),
                            m.replica().term().0,
                            if m.replica().is_abstaining() {
                                " (abstaining)"
                            } else {
                                ""
                            }
                        ),
                        None => format!("coord-{c} down"),
                    })
                    .collect();
                problems.push(format!("no acting leader: {}", roles.join(", ")))
            }
            Some(machine) => {
                for id in self.checker.acked() {
                    match machine.job(id) {
                        Some(job) if !job.state.is_terminal() && !self.at_rest(id) => problems
                            .push(format!(
                                "acknowledged job {id} is still {} (attempt {}, lease {:?})",
                                job.state,
                                job.attempt,
                                job.lease.as_ref().map(|l| (l.id, l.worker.clone()))
                            )),
                        Some(_) => {}
                        None if self.checker.purged(id) => {}
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
}

/// Runs one seed with the scenario it draws.
pub fn run_seed(seed: u64, trace: bool) -> RunReport {
    run_scenario(seed, Scenario::draw(seed), trace)
}

/// Runs one seed with a given scenario.
pub fn run_scenario(seed: u64, scenario: Scenario, trace: bool) -> RunReport {
    run_scenario_with(seed, scenario, trace, Sabotage::None)
}

/// Runs one seed with a given scenario, and perhaps a bug planted on purpose. Never panics:
/// a panic inside the seed, even while its world is built, is the seed's failure.
pub fn run_scenario_with(
    seed: u64,
    scenario: Scenario,
    trace: bool,
    sabotage: Sabotage,
) -> RunReport {
    let failure = match budget::catch(|| World::new(seed, scenario, trace)) {
        Ok(Ok(mut world)) => {
            world.sabotage(sabotage);
            return world.run();
        }
        Ok(Err(error)) => format!("setup: {error}"),
        Err(panic) => format!("panic {panic} (while the world was built)"),
    };
    // No world ran: the failure text is the whole outcome, so it is what the hash covers.
    let mut hash = Fnv::new();
    let _ = hash.write_str(&failure);
    RunReport {
        seed,
        hash: hash.finish(),
        failure: Some(failure),
        simulated_us: 0,
        steps: 0,
        assignments: 0,
        completions: 0,
        acknowledged: 0,
        slowest_call_us: 0,
        failovers_us: Vec::new(),
        findings: Vec::new(),
        coverage: BTreeMap::new(),
        trace: Vec::new(),
        peak_in_flight: 0,
        peak_instant_steps: 0,
        leaders: Vec::new(),
        script_targets: Vec::new(),
    }
}
