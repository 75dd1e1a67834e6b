//! Swarm testing: every seed draws its own world (sizes, timeouts, fault kinds and rates,
//! workload) from its own "scenario" stream.

use std::time::Duration;

use herder_core::coordinator::{CoordinatorConfig, Retention};
use herder_core::ids::NodeId;
use herder_core::protocol::builtin_task_names;

use crate::rng::SimRng;

/// The user task names a seed's workload may submit; the simulated workers serve them with a
/// handler of the world's (see `world::handlers`).
pub const USER_TASKS: [&str; 3] = ["resize", "encode", "thumbnail"];

/// Which faults a seed injects, and how often.
#[derive(Clone, Debug, PartialEq)]
pub struct Faults {
    /// Mean gap between fault ticks (microseconds); each tick picks one enabled kind.
    pub tick_mean_us: u64,
    pub coordinator_crash: bool,
    /// SIGSTOP-style: the coordinator processes nothing (its disk completions, messages and
    /// timers wait) and then resumes on a stale view.
    pub coordinator_pause: bool,
    pub worker_crash: bool,
    pub worker_pause: bool,
    pub connection_reset: bool,
    /// A connection carries bytes the coordinator cannot decode (a buggy or hostile peer):
    /// the coordinator must answer, close it, and go on serving everyone else.
    pub malformed: bool,
    /// A worker or client stops reading its connection (it still sends): what the coordinator
    /// writes to it piles up until the coordinator's driver gives up on the stalled write and
    /// closes the connection, telling the core.
    pub stalled_reader: bool,
    /// Probability that a task hangs past its lease (its result arrives long after expiry).
    pub task_hang: f64,
    /// Probability that a connect attempt fails although the coordinator is up.
    pub connect_fail: f64,
    /// Probability that one message takes a slow path (tail latency).
    pub slow_message: f64,
    /// Probability that a crash lets some written-but-unreported batches reach the disk.
    pub torn_tail: f64,
    /// Network partitions (isolate one node, cut a pair both ways or one way, split the nodes
    /// in two) that start on fault ticks and heal after a while.
    pub partition: bool,
    /// Probability that a message's segment is lost: TCP retransmits it after a timeout that
    /// doubles on every further loss, so the connection stalls behind it (head-of-line delay).
    pub loss: f64,
    /// Probability that a message the protocol allows to be repeated (results, heartbeats,
    /// acknowledgements, replies, keyed submissions, queries) is sent again a while later.
    pub duplicate: f64,
    /// In a group: crashes, pauses and partitions aim at the leader half of the time, and
    /// partitions may split the coordinators into a minority and a majority.
    pub leader_faults: bool,
    /// In a group: a member restarts from an empty disk (never more than a minority at once).
    pub disk_loss: bool,
    /// A worker crashes and never comes back (at least one worker always stays).
    pub worker_leave: bool,
    /// A worker drains: it tells the coordinator it takes no new work, hands back what still
    /// runs when its drain timeout ends, stops once drained (or after a bound), and usually
    /// comes back later as a new process serving the same task kinds.
    pub drain: bool,
    /// Strangers knock: a worker or a member that tries to authenticate with the wrong
    /// secret, a guessed proof, a replayed or reflected handshake, or another port's
    /// credential. The handshake's two machines must refuse every one, and accept the honest
    /// handshake they are drawn beside.
    pub impostors: bool,
    /// In a group: probability that a peer message (or a second copy of it) arrives seconds
    /// late, after terms may have changed, so that an old vote or append reply, or a deposed
    /// leader's append, lands among newer ones.
    pub peer_straggle: f64,
    /// In a group: probability that a member crashes right after it grants a vote or
    /// acknowledges part of a snapshot it is installing, and restarts within a few hundred
    /// milliseconds: in the middle of an election (it must not vote again in that term) or of
    /// a snapshot install (it must not take the part it holds for the whole).
    pub crash_mid_consensus: f64,
    /// A coordinator's wall clock steps forwards or back (seconds to a minute), its monotonic
    /// clock steady: the coordinator is handed the stepped reading, as the runtime's once-a-
    /// second read hands it one, and keeps it across its restarts (the host's clock stays
    /// stepped).
    pub clock_step: bool,
}

impl Faults {
    pub fn none() -> Faults {
        Faults {
            tick_mean_us: 1_000_000,
            coordinator_crash: false,
            coordinator_pause: false,
            worker_crash: false,
            worker_pause: false,
            connection_reset: false,
            malformed: false,
            stalled_reader: false,
            task_hang: 0.0,
            connect_fail: 0.0,
            slow_message: 0.0,
            torn_tail: 0.0,
            partition: false,
            loss: 0.0,
            duplicate: 0.0,
            leader_faults: false,
            disk_loss: false,
            worker_leave: false,
            drain: false,
            impostors: false,
            peer_straggle: 0.0,
            crash_mid_consensus: 0.0,
            clock_step: false,
        }
    }

    pub fn any(&self) -> bool {
        self.coordinator_crash
            || self.coordinator_pause
            || self.worker_crash
            || self.worker_pause
            || self.connection_reset
            || self.partition
            || self.disk_loss
            || self.worker_leave
            || self.drain
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Coordinators in the group: 1, 3 or 5.
    pub coordinators: usize,
    pub workers: usize,
    pub worker_capacity: Vec<u32>,
    /// Assignments each worker holds beyond its slots (none when empty).
    pub worker_prefetch: Vec<u32>,
    pub clients: usize,
    pub ops_per_client: usize,
    pub submit_retries: u32,
    pub coordinator: CoordinatorConfig,
    /// Faults are injected during `[0, fault_span_us)`; afterwards the liveness phase runs for at
    /// most `liveness_span_us`.
    pub fault_span_us: u64,
    pub liveness_span_us: u64,
    /// One-way message latency, uniform in this range (microseconds); the slow path adds up to
    /// `slow_extra_us`.
    pub latency_us: (u64, u64),
    pub slow_extra_us: u64,
    /// Time for a persistence batch to become durable (microseconds).
    pub disk_us: (u64, u64),
    /// Clock offsets and drifts of nodes.
    pub max_offset_us: u64,
    pub max_drift_ppm: i64,
    /// Pass every message through the real frame codec (encode, then decode) on the wire.
    pub codec: bool,
    pub faults: Faults,
    /// Clients sometimes send `PURGE` (with a retention policy drawn for the coordinators).
    pub purge_ops: bool,
    /// Clients sometimes submit a few jobs in one `SUBMIT_BATCH`.
    pub batch_submits: bool,
    /// The task kinds each worker serves (built-in kinds and user task names), fixed for every
    /// process of that worker.
    pub worker_tasks: Vec<Vec<String>>,
    /// The user task names the workload submits (none: built-in tasks only).
    pub user_tasks: Vec<String>,
    /// Some submissions carry their own per-attempt deadline (`timeout_millis`).
    pub job_timeouts: bool,
    /// The last this many clients hold a `reader` token: every write they ask for (a
    /// submission, a batch, a cancel, a purge, a leadership transfer) must be answered
    /// `FORBIDDEN` and change nothing.
    pub reader_clients: usize,
    /// Clients also ask for the workers (`WORKERS`), for the group as a member sees it
    /// (`CLUSTER`) and now and then for a leadership hand-over (`TRANSFER_LEADER`); and each
    /// fault aimed at the leader, and each hand-over, sets off a burst of reads from every
    /// client while leadership changes hands.
    pub group_ops: bool,
    /// Jobs go to several queues, with priorities and hot and cold fairness keys, and an
    /// operator pauses, resumes and re-tunes the queues while they run.
    pub queues: bool,
    /// Some submissions wait for a time (a delay or a wall time, a few seconds ahead at most),
    /// so jobs are `SCHEDULED` through crashes, leader changes and clock steps.
    pub delayed_jobs: bool,
    /// Some submissions wait for jobs the client knows (`after`), now and then whatever
    /// they end as, so chains and fan-ins form, and failures and cancels spread downstream.
    pub dependencies: bool,
    /// Faults at set times (milliseconds of simulated time), beside any drawn ones: how a
    /// test stages the situation a safety argument is about and lets the checker judge what
    /// follows. Empty in every drawn scenario.
    pub script: Vec<(u64, Scripted)>,
}

/// A fault a scripted scenario puts at a set time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scripted {
    /// The member acting as leader then crashes with its host (nothing it had buffered is
    /// sent any more), and restarts after `down_ms`.
    CrashLeader { down_ms: u64 },
    /// Member `coord` crashes with its host, and restarts after `down_ms`.
    Crash { coord: usize, down_ms: u64 },
    /// The member acting as leader then is cut off from every other node for `for_ms`.
    IsolateLeader { for_ms: u64 },
    /// The member acting as leader then is cut off from the other members only (its workers
    /// and clients still reach it) for `for_ms`.
    CutLeaderFromPeers { for_ms: u64 },
    /// Member `coord` is cut off from every other node for `for_ms`.
    Isolate { coord: usize, for_ms: u64 },
    /// The member acting as leader then takes no step for `for_ms` (a stalled process).
    PauseLeader { for_ms: u64 },
}

/// Which kinds each of `workers` workers serves, and which user tasks the workload submits,
/// from the seed's own stream (so drawing them shifts nothing else). In two seeds of five every
/// worker serves every kind; otherwise each worker serves all of them or a random subset, and
/// in a quarter of those seeds one kind (built in or a user task) is served by no worker at all.
pub fn draw_task_sets(seed: u64, workers: usize) -> (Vec<Vec<String>>, Vec<String>) {
    let mut rng = SimRng::new(seed, "task-sets", 0);
    let user: Vec<String> = if rng.chance(0.6) {
        let n = rng.range(1, USER_TASKS.len() as u64) as usize;
        USER_TASKS[..n].iter().map(|s| s.to_string()).collect()
    } else {
        Vec::new()
    };
    let mut kinds = builtin_task_names();
    kinds.extend(user.iter().cloned());
    if rng.below(5) < 2 {
        return (vec![kinds; workers], user);
    }
    let nobody = if rng.chance(0.25) {
        rng.pick(&kinds).cloned()
    } else {
        None
    };
    let mut sets = Vec::new();
    for _ in 0..workers {
        let all = rng.chance(0.3);
        let mut set = Vec::new();
        for kind in &kinds {
            if (all || rng.chance(0.6)) && Some(kind) != nobody.as_ref() {
                set.push(kind.clone());
            }
        }
        if set.is_empty() {
            let first = kinds.iter().find(|k| Some(*k) != nobody.as_ref());
            set.extend(first.cloned());
        }
        sets.push(set);
    }
    (sets, user)
}

impl Scenario {
    /// The named standard scenario used to measure speed: one coordinator, 3 workers of
    /// capacity 2, 2 clients with 20 operations each, every fault kind on, 10 simulated seconds
    /// of faults (then the liveness phase, which ends as soon as everything is done).
    /// The leases every worker can hold at once: its slots and its prefetch.
    pub fn leases(&self) -> u64 {
        self.worker_capacity
            .iter()
            .enumerate()
            .map(|(w, slots)| {
                u64::from(*slots) + u64::from(self.worker_prefetch.get(w).copied().unwrap_or(0))
            })
            .sum()
    }

    pub fn standard(seed: u64) -> Scenario {
        let mut scenario = Scenario::draw(seed);
        scenario.workers = 3;
        scenario.worker_capacity = vec![2; 3];
        // No prefetch: the workers stay as they were measured.
        scenario.worker_prefetch = Vec::new();
        scenario.clients = 2;
        scenario.ops_per_client = 20;
        scenario.fault_span_us = 10_000_000;
        scenario.coordinator.max_active_jobs = 8;
        // The group's own requests and a short log window are the swarm's: this scenario
        // stays as it was measured.
        scenario.coordinator.log_retained_entries =
            CoordinatorConfig::default().log_retained_entries;
        scenario.group_ops = false;
        (scenario.worker_tasks, scenario.user_tasks) = draw_task_sets(seed, 3);
        scenario.faults = Faults {
            tick_mean_us: 500_000,
            coordinator_crash: true,
            coordinator_pause: true,
            worker_crash: true,
            worker_pause: true,
            connection_reset: true,
            task_hang: 0.05,
            connect_fail: 0.1,
            slow_message: 0.05,
            torn_tail: 0.5,
            partition: true,
            loss: 0.02,
            duplicate: 0.02,
            leader_faults: false,
            disk_loss: false,
            worker_leave: false,
            // Swarm seeds send undecodable bytes; this scenario stays as it was measured.
            malformed: false,
            stalled_reader: false,
            drain: true,
            impostors: false,
            peer_straggle: 0.0,
            crash_mid_consensus: 0.0,
            clock_step: false,
        };
        scenario
    }

    /// The named standard scenario of a replicated group: the standard scenario with three
    /// coordinators, and the faults aimed at consensus on as well (leader crashes, pauses and
    /// isolation, minority/majority splits, a member restarting from an empty disk, a worker
    /// leaving for good).
    pub fn standard_group(seed: u64) -> Scenario {
        let mut scenario = Scenario::standard(seed);
        scenario.coordinators = 3;
        // The default consensus timings, so failover times are those of a default deployment.
        let defaults = CoordinatorConfig::default();
        scenario.coordinator.election_timeout_min = defaults.election_timeout_min;
        scenario.coordinator.election_timeout_max = defaults.election_timeout_max;
        scenario.coordinator.replication_heartbeat = defaults.replication_heartbeat;
        scenario.coordinator.peers = (1..3).map(|c| NodeId(format!("coord-{c}"))).collect();
        scenario.faults.leader_faults = true;
        scenario.faults.disk_loss = true;
        scenario.faults.worker_leave = true;
        scenario
    }

    /// Leader crashes alone: the group of the standard group scenario, with no fault but
    /// coordinator crashes (half of them aimed at the leader), about one every 3 s for 30 s, so
    /// the time without a leader after each one is what a clean crash costs (the figure the
    /// Raft paper's Figure 16 measures), not what overlapping faults add.
    pub fn leader_crashes(seed: u64) -> Scenario {
        let mut scenario = Scenario::standard_group(seed);
        scenario.fault_span_us = 30_000_000;
        scenario.faults = Faults {
            tick_mean_us: 3_000_000,
            coordinator_crash: true,
            leader_faults: true,
            ..Faults::none()
        };
        scenario
    }

    /// The scenario seed `seed` draws, with a single coordinator (as seeds drew before groups
    /// existed: regression seeds found then replay this way).
    pub fn single(seed: u64) -> Scenario {
        let mut scenario = Scenario::draw(seed);
        scenario.coordinators = 1;
        scenario.coordinator.peers.clear();
        scenario.faults.leader_faults = false;
        scenario.faults.disk_loss = false;
        scenario.group_ops = false;
        scenario
    }

    /// The scenario seed `seed` draws.
    pub fn draw(seed: u64) -> Scenario {
        let mut rng = SimRng::new(seed, "scenario", 0);
        let workers = rng.range(1, 5) as usize;
        let worker_capacity = (0..workers).map(|_| rng.range(1, 3) as u32).collect();
        let clients = rng.range(1, 3) as usize;
        let heartbeat_interval = rng.range(50, 300);
        let heartbeat_timeout = heartbeat_interval * rng.range(2, 4);
        let retry_base = rng.range(10, 200);
        let coordinator = CoordinatorConfig {
            task_timeout: Duration::from_millis(rng.range(300, 3_000)),
            heartbeat_interval: Duration::from_millis(heartbeat_interval),
            heartbeat_timeout: Duration::from_millis(heartbeat_timeout),
            default_max_attempts: rng.range(1, 4) as u32,
            retry_base: Duration::from_millis(retry_base),
            retry_max: Duration::from_millis(retry_base * rng.range(1, 10)),
            max_active_jobs: rng.range(2, 12),
            ..CoordinatorConfig::default()
        };
        // Swarm: a fifth of the seeds run without faults; the rest enable each kind by a coin.
        let faults = if rng.chance(0.2) {
            Faults::none()
        } else {
            Faults {
                tick_mean_us: rng.range(100, 2_000) * 1_000,
                coordinator_crash: rng.chance(0.5),
                coordinator_pause: rng.chance(0.3),
                worker_crash: rng.chance(0.5),
                worker_pause: rng.chance(0.5),
                connection_reset: rng.chance(0.5),
                task_hang: if rng.chance(0.4) {
                    rng.unit() * 0.2
                } else {
                    0.0
                },
                connect_fail: if rng.chance(0.4) {
                    rng.unit() * 0.3
                } else {
                    0.0
                },
                slow_message: if rng.chance(0.5) {
                    rng.unit() * 0.1
                } else {
                    0.0
                },
                torn_tail: rng.unit(),
                ..Faults::none()
            }
        };
        let mut scenario = Scenario {
            coordinators: 1,
            workers,
            worker_capacity,
            worker_prefetch: Vec::new(),
            clients,
            ops_per_client: rng.range(3, 25) as usize,
            submit_retries: rng.range(0, 3) as u32,
            coordinator,
            fault_span_us: rng.range(5, 20) * 1_000_000,
            liveness_span_us: 120 * 1_000_000,
            latency_us: (rng.range(50, 500), rng.range(500, 5_000)),
            slow_extra_us: rng.range(1, 200) * 1_000,
            disk_us: (rng.range(50, 500), rng.range(500, 20_000)),
            max_offset_us: rng.range(0, 10_000_000),
            max_drift_ppm: rng.range(0, 500) as i64,
            codec: rng.chance(0.3),
            faults,
            purge_ops: false,
            batch_submits: false,
            worker_tasks: Vec::new(),
            user_tasks: Vec::new(),
            job_timeouts: false,
            reader_clients: 0,
            group_ops: false,
            queues: false,
            delayed_jobs: false,
            dependencies: false,
            script: Vec::new(),
        };
        // Network faults are drawn last so adding them did not reshuffle the draws above.
        if scenario.faults != Faults::none() {
            scenario.faults.partition = rng.chance(0.5);
            scenario.faults.loss = if rng.chance(0.4) {
                rng.unit() * 0.05
            } else {
                0.0
            };
            scenario.faults.duplicate = if rng.chance(0.4) {
                rng.unit() * 0.1
            } else {
                0.0
            };
        }
        // Groups are drawn last, so the draws above stay what they were.
        let election_min = rng.range(150, 600);
        scenario.coordinator.election_timeout_min = Duration::from_millis(election_min);
        scenario.coordinator.election_timeout_max = Duration::from_millis(2 * election_min);
        scenario.coordinator.replication_heartbeat = Duration::from_millis(election_min / 4);
        scenario.coordinators = match rng.below(10) {
            0..=3 => 1,
            4..=7 => 3,
            _ => 5,
        };
        scenario.coordinator.peers = (1..scenario.coordinators)
            .map(|c| NodeId(format!("coord-{c}")))
            .collect();
        if scenario.faults != Faults::none() {
            scenario.faults.leader_faults = scenario.coordinators > 1 && rng.chance(0.6);
            scenario.faults.disk_loss = scenario.coordinators > 1 && rng.chance(0.3);
            scenario.faults.worker_leave = scenario.workers > 1 && rng.chance(0.3);
            // Drawn last of all, so every earlier draw stays what it was.
            scenario.faults.malformed = rng.chance(0.3);
        }
        // Retention, drawn after everything else: a tight policy purges jobs while clients
        // still ask about them, wait for them and resend their keys.
        if rng.chance(0.4) {
            let max_age = rng
                .chance(0.5)
                .then(|| Duration::from_millis(rng.range(50, 3_000)));
            let max_count = rng.chance(0.7).then(|| rng.range(1, 8));
            let min_age = Duration::from_millis(rng.range(0, 2_000));
            scenario.coordinator.retention = Retention {
                max_age,
                max_count,
                min_age,
            };
            scenario.purge_ops = rng.chance(0.5);
        }
        // Drawn after everything else, so every earlier draw stays what it was.
        if scenario.faults != Faults::none() {
            scenario.faults.stalled_reader = rng.chance(0.3);
        }
        // Task sets, user tasks, drains and per-job deadlines, drawn after everything else.
        (scenario.worker_tasks, scenario.user_tasks) = draw_task_sets(seed, scenario.workers);
        if scenario.faults != Faults::none() {
            scenario.faults.drain = rng.chance(0.4);
        }
        scenario.job_timeouts = rng.chance(0.4);
        scenario.batch_submits = rng.chance(0.5);
        // Drawn last of all, so every earlier draw stays what it was.
        if rng.chance(0.5) {
            scenario.worker_prefetch = scenario
                .worker_capacity
                .iter()
                .map(|&capacity| rng.range(0, 4 * u64::from(capacity)) as u32)
                .collect();
        }
        // Credentials, drawn after everything else: a reader among several clients, and
        // strangers knocking.
        if scenario.clients > 1 && rng.chance(0.4) {
            scenario.reader_clients = 1;
        }
        if scenario.faults != Faults::none() {
            scenario.faults.impostors = rng.chance(0.3);
        }
        // Stragglers on the peer link, drawn last of all.
        if scenario.faults != Faults::none() && scenario.coordinators > 1 && rng.chance(0.5) {
            scenario.faults.peer_straggle = 0.005 + rng.unit() * 0.045;
        }
        if scenario.faults != Faults::none() && scenario.coordinators > 1 && rng.chance(0.4) {
            scenario.faults.crash_mid_consensus = 0.1 + rng.unit() * 0.4;
        }
        // Aimed at consensus too, drawn last of all: a short log window, so a member that
        // falls behind (paused, cut off, restarted empty) catches up from a snapshot while
        // appends and reads go on; and the group's own requests in the workload.
        if scenario.coordinators > 1 && rng.chance(0.4) {
            scenario.coordinator.log_retained_entries = rng.range(2, 64);
        }
        scenario.group_ops = scenario.coordinators > 1 && rng.chance(0.5);
        // Queues, drawn last of all; half of those seeds admit enough jobs for a tenant's
        // burst to queue up behind the workers (the fairness rule needs a backlog to judge).
        scenario.queues = rng.chance(0.5);
        if scenario.queues && rng.chance(0.5) {
            scenario.coordinator.max_active_jobs = rng.range(100, 400);
        }
        // Delayed jobs and clock steps, drawn last of all.
        scenario.delayed_jobs = rng.chance(0.5);
        scenario.faults.clock_step = scenario.faults != Faults::none() && rng.chance(0.4);
        // Dependencies, drawn last of all.
        scenario.dependencies = rng.chance(0.5);
        scenario
    }
}
