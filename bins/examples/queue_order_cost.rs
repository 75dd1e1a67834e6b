//! What one scheduling step costs in the queue index as keys multiply: a pick (the next job of
//! a queue), its start, and a new job queued in its place, so the queue stays as deep.
//!
//! `cargo run --release -p herder --example queue_order_cost`
//!
//! Prints nanoseconds per step for a queue of 100,000 jobs held by 1 key, by 10,000 keys, by
//! 100,000 keys (plus one heavy key), and with 64 assignments in flight the pick must pass;
//! then with 90,000 of the 100,000 keys out of rate tokens, their lanes parked (as the table
//! parks them) against the same lanes left in the order and passed over one by one.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use herder_core::ids::JobId;
use herder_core::queues::{Ageing, JobQueue, Placement};
use herder_core::time::UnixMillis;

const JOBS: u64 = 100_000;
const STEPS: u64 = 200_000;

struct Bench {
    queue: JobQueue,
    keys: Vec<String>,
    placed: BTreeMap<JobId, (u64, usize)>,
    next: u64,
}

impl Bench {
    fn new(keys: usize) -> Bench {
        Bench {
            queue: JobQueue::default(),
            keys: (0..keys).map(|k| format!("tenant-{k}")).collect(),
            placed: BTreeMap::new(),
            next: 0,
        }
    }

    fn push(&mut self, key: usize) {
        self.next += 1;
        let job: JobId = format!("00000000-0000-4000-8000-{:012}", self.next)
            .parse()
            .expect("a valid id");
        let place = place(&self.keys, key);
        let tag = self.queue.next_tag(&place);
        assert!(self.queue.insert(self.next, job, &place, tag));
        self.placed.insert(job, (self.next, key));
    }

    /// The next job of the queue, passing over `in_flight` (counted by lane in `lane_counts`).
    fn pick(&self, in_flight: &HashSet<JobId>, lane_counts: &BTreeMap<String, usize>) -> JobId {
        self.pick_past(in_flight, lane_counts, &HashSet::new())
    }

    /// [`Bench::pick`], passing over the lanes of the keys in `held` too.
    fn pick_past(
        &self,
        in_flight: &HashSet<JobId>,
        lane_counts: &BTreeMap<String, usize>,
        held: &HashSet<String>,
    ) -> JobId {
        self.queue
            .pick(
                "sleep",
                "default",
                Ageing {
                    now: UnixMillis(0),
                    bound_millis: u64::MAX,
                },
                |key| lane_counts.get(key).copied().unwrap_or(0),
                |key| held.contains(key),
                |job| in_flight.contains(&job),
            )
            .expect("jobs are queued")
    }

    /// One step: pick past `in_flight` jobs of the first lanes (and the lanes of `held`
    /// keys), start the pick, queue another.
    fn step(
        &mut self,
        in_flight: &HashSet<JobId>,
        lane_counts: &BTreeMap<String, usize>,
        held: &HashSet<String>,
    ) {
        let job = self.pick_past(in_flight, lane_counts, held);
        let (seq, key) = self.placed.remove(&job).expect("placed");
        self.queue
            .start(seq, &place(&self.keys, key))
            .expect("queued");
        self.push(key);
    }
}

/// Where a job of `key` is ordered (priorities vary with the key).
fn place(keys: &[String], key: usize) -> Placement<'_> {
    Placement {
        kind: "sleep",
        queue: "default",
        key: &keys[key],
        priority: (key % 3) as u8,
        queued_at: UnixMillis(0),
    }
}

fn measure(name: &str, keys: usize, heavy: bool, in_flight: usize) {
    let mut bench = Bench::new(keys.max(1));
    if heavy {
        for _ in 0..JOBS {
            bench.push(0);
        }
    }
    for n in 0..JOBS as usize {
        bench.push(n % keys.max(1));
    }
    // Assignments in flight: the first jobs the table would start, counted by lane.
    let mut flying = HashSet::new();
    let mut lane_counts: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..in_flight {
        let job = bench.pick(&flying, &lane_counts);
        let key = bench.placed[&job].1;
        *lane_counts.entry(bench.keys[key].clone()).or_default() += 1;
        flying.insert(job);
    }
    let started = Instant::now();
    for _ in 0..STEPS {
        bench.step(&flying, &lane_counts, &HashSet::new());
    }
    let per_step = started.elapsed().as_nanos() as f64 / STEPS as f64;
    println!(
        "{name:<44} {:>8} queued  {per_step:>8.0} ns per pick, start and queue",
        bench.queue.len()
    );
}

/// 100,000 keys with one job each, `waiting` of them out of rate tokens: parked (as the table
/// parks a key whose bucket is empty) or, for comparison, left in the order and passed over.
fn measure_rate_waits(name: &str, waiting: usize, parked: bool, steps: u64) {
    let keys = 100_000;
    let mut bench = Bench::new(keys);
    for n in 0..keys {
        bench.push(n);
    }
    let mut held = HashSet::new();
    for key in &bench.keys[..waiting] {
        if parked {
            bench
                .queue
                .park("sleep", "default", key, UnixMillis(u64::MAX));
        } else {
            held.insert(key.clone());
        }
    }
    let none = (HashSet::new(), BTreeMap::new());
    let started = Instant::now();
    for _ in 0..steps {
        bench.step(&none.0, &none.1, &held);
    }
    let per_step = started.elapsed().as_nanos() as f64 / steps as f64;
    println!(
        "{name:<44} {:>8} queued  {per_step:>8.0} ns per pick, start and queue",
        bench.queue.len()
    );
}

fn main() {
    measure("1 key", 1, false, 0);
    measure("10,000 keys", 10_000, false, 0);
    measure("100,000 keys", 100_000, false, 0);
    measure(
        "100,000 keys and one heavy key of 100,000",
        100_000,
        true,
        0,
    );
    measure("100,000 keys, 64 assignments in flight", 100_000, false, 64);
    measure_rate_waits(
        "100,000 keys, 90,000 waiting for rate, parked",
        90_000,
        true,
        STEPS,
    );
    measure_rate_waits("the same, passed over instead", 90_000, false, 2_000);
}
