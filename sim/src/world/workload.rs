//! The workload: when each client starts its next operation and what it asks for — a
//! submission of a random task (sometimes keyed, sometimes data-parallel, sometimes a user task
//! whose payload decides how each attempt ends, sometimes with its own deadline), a batch of
//! them (now and then a large one, some holding a job that fails the checks), or the status
//! of, a wait for, or the cancellation of a job it knows, or a list of jobs; in some group
//! seeds also the workers, the group as one member sees it, a leadership hand-over, and bursts
//! of reads while leadership changes hands.

use herder_core::client::Operation;
use herder_core::ids::NodeId;
use herder_core::job::JobState;
use herder_core::limits::{
    ATTEMPTS_MAX, IDEMPOTENCY_KEY_BYTES_MAX, JOB_TIMEOUT_MILLIS_MAX, PARTITIONS_MAX,
    RUN_AT_AHEAD_MILLIS_MAX, SUBMIT_BATCH_JOBS_MAX,
};
use herder_core::protocol::{JobSubmission, Partitions};
use herder_core::queues::{QueueChange, RateLimit};
use herder_core::tasks::{TaskSpec, UserTask};
use serde_json::json;

use super::events::Ev;
use super::{NodeRef, World};
use crate::checker::Check;
use crate::rng::SimRng;
use crate::submission::{invalid_tasks, is_data_parallel, TOO_FAR_AHEAD};

/// The longest `WAIT` timeout the workload asks for.
pub(super) const WAIT_MILLIS_MAX: u64 = 3_000;

/// A small data-parallel task: a list of up to 40 numbers (some empty, some negative, some
/// large primes), or a range of up to 50,000 numbers that may start below zero.
/// The queues a seed with queues submits to and changes.
const QUEUES: [&str; 3] = ["default", "emails", "reports"];

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

/// A user task of one of `names`, whose payload says how each attempt ends (see
/// `handlers`): some fail a few times first, some fail permanently from some attempt on
/// (before or after their attempts run out), and each runs up to 150 ms.
fn random_user_spec(rng: &mut SimRng, names: &[String]) -> TaskSpec {
    let name = rng.pick(names).cloned().unwrap_or_else(|| "resize".into());
    let mut payload = json!({
        "n": rng.range(0, 1_000),
        "ms": rng.range(0, 150),
    });
    if rng.chance(0.4) {
        payload["fail_until"] = json!(rng.range(2, 4));
    }
    if rng.chance(0.3) {
        payload["permanent_at"] = json!(rng.range(1, 3));
    }
    TaskSpec::User(UserTask { name, payload })
}

fn random_spec(rng: &mut SimRng, user_tasks: &[String]) -> TaskSpec {
    // (Drawn only when the seed has user tasks, so other seeds draw what they always drew.)
    if !user_tasks.is_empty() && rng.chance(0.35) {
        return random_user_spec(rng, user_tasks);
    }
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

/// How many jobs a batch holds: mostly 1 to 4 (80%), sometimes 5 to 64 (18%), now and then
/// up to the protocol's bound of `SUBMIT_BATCH_JOBS_MAX` (2%), so batches cross the admission
/// limit, repeat keys and carry conflicting reuses of them.
fn batch_len(rng: &mut SimRng) -> u64 {
    match rng.below(100) {
        0..=79 => rng.range(1, 4),
        80..=97 => rng.range(5, 64),
        _ => rng.range(65, SUBMIT_BATCH_JOBS_MAX as u64),
    }
}

/// Makes `job` fail one check of `SUBMIT` (docs/PROTOCOL.md, steps 1 to 6): an invalid task,
/// or a request field out of range (with `timing`, now and then its time).
fn spoil(rng: &mut SimRng, job: &mut JobSubmission, timing: bool) {
    // (Drawn only in seeds with delayed jobs, so other seeds draw what they always drew.)
    if !job.after.is_empty() && rng.chance(0.2) {
        match rng.below(2) {
            0 => job.after.push(job.after[0]),
            _ => {
                job.after.clear();
                job.after_any_outcome = true;
            }
        }
        return;
    }
    if timing && rng.chance(0.25) {
        match rng.below(4) {
            0 => {
                job.delay_millis = Some(rng.range(0, 1_000));
                job.run_at_unix_ms = Some(rng.range(0, 1 << 45));
            }
            1 => job.delay_millis = Some(RUN_AT_AHEAD_MILLIS_MAX + rng.range(1, 1_000_000)),
            2 => job.run_at_unix_ms = Some(TOO_FAR_AHEAD.0 + rng.range(0, 1 << 40)),
            _ => {
                job.task = random_parallel_spec(rng).to_json();
                job.delay_millis = Some(rng.range(1, 1_000));
            }
        }
        return;
    }
    match rng.below(6) {
        0 => {
            if let Some((task, _)) = rng.pick(invalid_tasks()) {
                job.task = task.clone();
            }
        }
        1 => {
            job.max_attempts = Some(match rng.below(2) {
                0 => 0,
                _ => rng.range(u64::from(ATTEMPTS_MAX) + 1, 1_000) as u32,
            })
        }
        2 if !is_data_parallel(&job.task) => job.partitions = Some(Partitions::Count(2)),
        2 => {
            job.partitions = Some(Partitions::Count(match rng.below(2) {
                0 => 0,
                _ => rng.range(u64::from(PARTITIONS_MAX) + 1, 5_000) as u32,
            }))
        }
        3 => {
            job.timeout_millis = Some(match rng.below(2) {
                0 => 0,
                _ => JOB_TIMEOUT_MILLIS_MAX + rng.range(1, 1_000),
            })
        }
        4 => {
            job.idempotency_key = Some(match rng.below(2) {
                0 => String::new(),
                _ => "k".repeat(IDEMPOTENCY_KEY_BYTES_MAX + 1),
            })
        }
        _ => match rng.below(3) {
            0 => job.queue = Some("no spaces allowed".to_owned()),
            1 => job.priority = Some(rng.range(10, 255) as u8),
            _ => job.fairness_key = Some("k".repeat(129)),
        },
    }
}

impl World {
    pub(super) fn start_op(&mut self, c: usize) -> Check {
        if self.clients[c].ops_left == 0 {
            return Ok(());
        }
        let op = self.next_op(c);
        let client = &mut self.clients[c];
        client.ops_left -= 1;
        client.started += 1;
        if client.ops_left > 0 {
            let span = self.scenario.fault_span_us / self.scenario.ops_per_client.max(1) as u64;
            let gap = client.rng.range(0, 2 * span);
            self.push(self.now + gap, Ev::StartOp { client: c });
        }
        self.begin_op(c, op);
        self.drain_client(c)
    }

    /// Client `c` starts `op` (its machine sends it once `drain_client` runs).
    fn begin_op(&mut self, c: usize, op: Operation) {
        let client = &mut self.clients[c];
        let local = client.clock.local(self.now);
        let id = client.machine.start(local, op.clone());
        client.open_ops.insert(id.0, (self.now, op.clone()));
        self.note(
            NodeRef::Client(c),
            format_args!("start op {}: {op:?}", id.0),
        );
    }

    /// Leadership is changing hands (a fault aimed at the leader, or a hand-over started):
    /// in seeds with the group's own requests, every client asks a few reads at once, beside
    /// its own operations, so reads meet the change with writes in flight.
    pub(super) fn leadership_shaken(&mut self) {
        if !self.scenario.group_ops {
            return;
        }
        self.count("fault: a burst of reads as leadership changes");
        for c in 0..self.clients.len() {
            self.push(self.now, Ev::ReadBurst { client: c });
        }
    }

    /// One client's burst of reads: one to three of a status of a job it knows, a listing,
    /// or the workers.
    pub(super) fn read_burst(&mut self, c: usize) -> Check {
        let reads = self.clients[c].rng.range(1, 4);
        for _ in 0..reads {
            let client = &mut self.clients[c];
            let known = client.rng.pick(&client.known).copied();
            let op = match (client.rng.below(3), known) {
                (0, Some(job_id)) => Operation::Status { job_id },
                (1, _) => Operation::Workers,
                _ => Operation::List {
                    state: None,
                    limit: Some(10),
                    before: None,
                },
            };
            self.begin_op(c, op);
        }
        self.drain_client(c)
    }

    /// One of the group's own requests: the workers, the group as the member asked sees it,
    /// or now and then a hand-over of leadership (to any member, or to a named one, which may
    /// be the leader itself or a name that is no member: both must be refused as invalid).
    fn group_op(&mut self, c: usize) -> Operation {
        let members = self.scenario.coordinators as u64;
        let rng = &mut self.clients[c].rng;
        match rng.below(10) {
            0..=3 => Operation::Workers,
            4..=8 => Operation::Cluster,
            _ => Operation::TransferLeader {
                to: match rng.below(4) {
                    0 => None,
                    1 => Some(NodeId("coord-99".to_string())),
                    _ => Some(NodeId(super::nodes::coordinator_address(
                        rng.below(members) as usize,
                    ))),
                },
            },
        }
    }

    fn next_op(&mut self, c: usize) -> Operation {
        // (Drawn only in seeds with the group's requests, so other seeds draw what they
        // always drew.)
        if self.scenario.group_ops && self.clients[c].rng.chance(0.15) {
            return self.group_op(c);
        }
        // (Drawn only in seeds with queues, so other seeds draw what they always drew.)
        if self.scenario.queues && self.clients[c].rng.chance(0.06) {
            return self.queue_op(c);
        }
        if self.scenario.queues && self.clients[c].rng.chance(0.03) {
            return self.tenant_burst(c);
        }
        let purge_ops = self.scenario.purge_ops;
        let batch_submits = self.scenario.batch_submits;
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
            (98..=99, _) if purge_ops && rng.chance(0.5) => Operation::Purge {
                state: rng
                    .pick(&[JobState::Completed, JobState::Failed, JobState::Cancelled])
                    .copied()
                    .filter(|_| rng.chance(0.5)),
                older_than_millis: rng.range(0, 2_000),
            },
            (98..=99, _) => Operation::List {
                state: None,
                limit: Some(10),
                before: None,
            },
            // Now and then a batch, mostly of a few jobs, each drawn as a submission alone is;
            // a fifth of them hold one job that fails the checks.
            (0..=9, _) if batch_submits => {
                let len = batch_len(rng);
                let flawed = rng.chance(0.2).then(|| rng.below(len) as usize);
                let mut jobs: Vec<JobSubmission> =
                    (0..len).map(|_| self.next_submission(c)).collect();
                if let Some(index) = flawed {
                    spoil(
                        &mut self.clients[c].rng,
                        &mut jobs[index],
                        self.scenario.delayed_jobs,
                    );
                }
                self.count(match len {
                    1..=4 => "client: a batch of 1 to 4 jobs sent",
                    5..=64 => "client: a batch of 5 to 64 jobs sent",
                    _ => "client: a batch of over 64 jobs sent",
                });
                if flawed.is_some() {
                    self.count("client: a batch holding a job that fails the checks sent");
                }
                Operation::SubmitBatch { jobs }
            }
            _ => {
                let mut job = self.next_submission(c);
                // (Drawn only in seeds with batches, so other seeds draw what they always drew.)
                if batch_submits && self.clients[c].rng.chance(0.03) {
                    spoil(
                        &mut self.clients[c].rng,
                        &mut job,
                        self.scenario.delayed_jobs,
                    );
                    self.count("client: a submission that fails the checks sent");
                }
                Operation::Submit(job)
            }
        }
    }

    /// An operator's change to one of the workload's queues: mostly a pause or a resume, or a
    /// limit — concurrency or per-key concurrency of 1 or 2 (or none), a rate for the queue or
    /// for each key of 2 to 5 starts per 100 to 400 ms (or none), an admission limit of 1 to 6 unfinished jobs (or none) —
    /// now and then a new weight or a short ageing bound (so ageing happens within a seed).
    fn queue_op(&mut self, c: usize) -> Operation {
        let rng = &mut self.clients[c].rng;
        let queue = (*rng.pick(&QUEUES).unwrap_or(&"default")).to_owned();
        let mut change = QueueChange::default();
        match rng.below(14) {
            0..=1 => change.paused = Some(true),
            2..=3 => change.paused = Some(false),
            4 => change.weight = Some(rng.range(1, 5) as u32),
            5..=6 => change.concurrency = Some(rng.range(0, 3) as u32),
            7..=8 => change.key_concurrency = Some(rng.range(0, 3) as u32),
            9..=10 => {
                // At least 5 starts a second, so a tenant's burst drains within the
                // liveness span.
                let starts = if rng.below(4) == 0 {
                    0
                } else {
                    rng.range(2, 6) as u32
                };
                let rate = Some(RateLimit {
                    starts,
                    per_millis: rng.range(100, 401),
                });
                // The queue's own rate or each key's, alike.
                if rng.below(2) == 0 {
                    change.rate = rate;
                } else {
                    change.key_rate = rate;
                }
            }
            11..=12 => {
                let limit = if rng.below(3) == 0 {
                    0
                } else {
                    rng.range(1, 7)
                };
                change.max_active_jobs = Some(limit);
            }
            _ => change.aging_millis = Some(rng.range(50, 3_000)),
        }
        self.count("client: a queue change sent");
        Operation::SetQueue { queue, change }
    }

    /// A busy tenant's burst: one batch of jobs alike (one task, one queue) for the hot key,
    /// more than the fairness rule's bound, then a few for other keys, which must not wait
    /// for the whole burst.
    fn tenant_burst(&mut self, c: usize) -> Operation {
        let leases = self.scenario.leases();
        let user_tasks = &self.scenario.user_tasks;
        let rng = &mut self.clients[c].rng;
        let task = random_spec(rng, user_tasks).to_json();
        let queue = (*rng.pick(&QUEUES).unwrap_or(&"default")).to_owned();
        let hot = (3 * (leases + 1) + 10).min(SUBMIT_BATCH_JOBS_MAX as u64 - 3);
        let jobs = (0..hot + 3)
            .map(|n| JobSubmission {
                task: task.clone(),
                queue: Some(queue.clone()),
                fairness_key: Some(if n < hot {
                    "tenant-hot".to_owned()
                } else {
                    format!("tenant-{}", n - hot + 1)
                }),
                ..JobSubmission::default()
            })
            .collect();
        self.count("client: a tenant's burst sent");
        Operation::SubmitBatch { jobs }
    }

    /// Where a job of a seed with queues goes: one of the workload's queues, mostly the lowest
    /// priority, and a fairness key that is mostly the one hot tenant.
    fn placement(&mut self, c: usize, job: &mut JobSubmission) {
        if !self.scenario.queues {
            return;
        }
        let rng = &mut self.clients[c].rng;
        job.queue = rng
            .chance(0.7)
            .then(|| (*rng.pick(&QUEUES).unwrap_or(&"default")).to_owned());
        job.priority = rng.chance(0.4).then(|| rng.range(1, 9) as u8);
        job.fairness_key = match rng.below(10) {
            0..=3 => None,
            4..=7 => Some("tenant-hot".to_owned()),
            n => Some(format!("tenant-{n}")),
        };
    }

    /// One job to submit: now and then keyed (with one of four keys, mostly repeating what
    /// the key was first used for), now and then with a deadline of its own.
    fn next_submission(&mut self, c: usize) -> JobSubmission {
        let user_tasks = &self.scenario.user_tasks;
        let job_timeouts = self.scenario.job_timeouts;
        let rng = &mut self.clients[c].rng;
        let key = rng.chance(0.3).then(|| format!("key-{}", rng.below(4)));
        // A deadline of its own, sometimes shorter than the task runs.
        let timeout =
            |rng: &mut SimRng| (job_timeouts && rng.chance(0.4)).then(|| rng.range(100, 2_000));
        let (spec, timeout_millis) = match &key {
            Some(key) => match self.key_specs.get(key) {
                Some(first) if rng.chance(0.7) => first.clone(),
                _ => {
                    let spec = (random_spec(rng, user_tasks), timeout(rng));
                    self.key_specs
                        .entry(key.clone())
                        .or_insert_with(|| spec.clone());
                    spec
                }
            },
            None => (random_spec(rng, user_tasks), timeout(rng)),
        };
        let partitions = spec.is_data_parallel().then(|| match rng.below(3) {
            0 => Partitions::Auto,
            _ => Partitions::Count(rng.range(1, 5) as u32),
        });
        let mut job = JobSubmission {
            timeout_millis,
            task: spec.to_json(),
            max_attempts: rng.chance(0.5).then(|| rng.range(1, 4) as u32),
            idempotency_key: key,
            partitions,
            ..JobSubmission::default()
        };
        self.placement(c, &mut job);
        self.timing(c, &mut job);
        self.waits_for(c, &mut job);
        job
    }

    /// In seeds with dependencies, a quarter of the submissions wait for one to three jobs
    /// the client knows (the newest more often, so chains form), a third of those whatever
    /// the jobs end as.
    fn waits_for(&mut self, c: usize, job: &mut JobSubmission) {
        if !self.scenario.dependencies || is_data_parallel(&job.task) {
            return;
        }
        let client = &mut self.clients[c];
        if client.known.is_empty() || !client.rng.chance(0.25) {
            return;
        }
        let count = client.rng.range(1, 3) as usize;
        for _ in 0..count {
            let known = client.known.len() as u64;
            // Half the picks among the last four jobs it learned of.
            let index = if client.rng.chance(0.5) {
                known - 1 - client.rng.below(known.min(4))
            } else {
                client.rng.below(known)
            };
            let parent = client.known[index as usize];
            if !job.after.contains(&parent) {
                job.after.push(parent);
            }
        }
        job.after_any_outcome = client.rng.chance(0.33);
        self.count("client: a job waiting for others sent");
    }

    /// In seeds with delayed jobs, a third of the submissions wait: for a delay of up to 3 s,
    /// or for a wall time by the client's own clock from 1 s past to 3 s ahead (its clock may
    /// disagree with the leader's by the seed's offsets).
    fn timing(&mut self, c: usize, job: &mut JobSubmission) {
        if !self.scenario.delayed_jobs || is_data_parallel(&job.task) {
            return;
        }
        let client = &mut self.clients[c];
        if !client.rng.chance(0.35) {
            return;
        }
        if client.rng.chance(0.6) {
            job.delay_millis = Some(client.rng.range(0, 3_000));
        } else {
            let wall = client.clock.wall_at_epoch.at(client.clock.local(self.now));
            let at = wall.0 + client.rng.range(0, 4_000);
            job.run_at_unix_ms = Some(at.saturating_sub(1_000));
        }
        self.count("client: a delayed job sent");
    }
}
