//! The workload: when each client starts its next operation and what it asks for — a
//! submission of a random task (sometimes keyed, sometimes data-parallel, sometimes a user task
//! whose payload decides how each attempt ends, sometimes with its own deadline), or the status
//! of, a wait for, or the cancellation of a job it knows, or a list of jobs.

use herder_core::client::Operation;
use herder_core::job::JobState;
use herder_core::protocol::{JobSubmission, Partitions};
use herder_core::tasks::{TaskSpec, UserTask};
use serde_json::json;

use super::events::Ev;
use super::{NodeRef, World};
use crate::checker::Check;
use crate::rng::SimRng;

/// The longest `WAIT` timeout the workload asks for.
pub(super) const WAIT_MILLIS_MAX: u64 = 3_000;

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

impl World {
    pub(super) fn start_op(&mut self, c: usize) -> Check {
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
            // Now and then a batch of a few jobs, each drawn as a submission alone is.
            (0..=9, _) if batch_submits => {
                let jobs = (0..rng.range(1, 5))
                    .map(|_| self.next_submission(c))
                    .collect();
                Operation::SubmitBatch { jobs }
            }
            _ => {
                let JobSubmission {
                    task,
                    max_attempts,
                    idempotency_key,
                    partitions,
                    timeout_millis,
                } = self.next_submission(c);
                Operation::Submit {
                    timeout_millis,
                    task,
                    max_attempts,
                    idempotency_key,
                    partitions,
                }
            }
        }
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
        JobSubmission {
            timeout_millis,
            task: spec.to_json(),
            max_attempts: rng.chance(0.5).then(|| rng.range(1, 4) as u32),
            idempotency_key: key,
            partitions,
        }
    }
}
