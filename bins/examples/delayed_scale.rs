//! What holding delayed jobs costs the job table, and what finding the due ones costs as more
//! are scheduled: the memory per `SCHEDULED` job, and the time to find the earliest time, to
//! pick a batch of due jobs and to queue them with one `Due` entry.
//!
//! `cargo run --release -p herder --example delayed_scale`
//!
//! For 10,000, 100,000 and 1,000,000 scheduled jobs (each a small task, times spread over a
//! day), prints the table's resident memory per scheduled job (the process's RSS growth while
//! they were applied, so it includes the allocator's overhead), then nanoseconds for
//! `next_run_at`, for `due_by` of a batch of 1,024, and per job for applying a `Due` of 1,024.

use std::time::Instant;

use herder_core::command::Command;
use herder_core::ids::{JobId, LogIndex};
use herder_core::limits::DUE_JOBS_PER_ENTRY_MAX;
use herder_core::queues::default_queue;
use herder_core::table::JobTable;
use herder_core::tasks::TaskSpec;
use herder_core::time::UnixMillis;

const START: u64 = 1_800_000_000_000;
const DAY_MS: u64 = 86_400_000;
const LOOKUPS: u32 = 100_000;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

fn job_id(n: u64) -> JobId {
    format!("00000000-0000-7000-8000-{n:012}")
        .parse()
        .expect("a valid id")
}

fn submit(n: u64, count: u64) -> Command {
    Command::Submit {
        job_id: job_id(n),
        task: TaskSpec::Sha256 {
            text: format!("job {n}"),
        },
        max_attempts: 3,
        idempotency_key: None,
        max_active_jobs: count + 1,
        partitions: Vec::new(),
        partitions_asked: None,
        timeout_millis: None,
        submitted_by: None,
        queue: default_queue(),
        priority: 0,
        fairness_key: None,
        // Spread over the day after the first entry, in an order unlike submission's.
        run_at: Some(UnixMillis(START + 1 + (n * 7_919) % DAY_MS)),
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    }
}

fn main() {
    println!("scheduled    bytes/job   next_run_at   due_by(1024)   Due apply per job");
    for count in [10_000u64, 100_000, 1_000_000] {
        let before = rss_bytes();
        let mut table = JobTable::new();
        for n in 1..=count {
            let index = LogIndex(n);
            table.apply(index, UnixMillis(START), &submit(n, count));
        }
        assert_eq!(table.scheduled_jobs(), count);
        let per_job = rss_bytes().saturating_sub(before) / count;

        let started = Instant::now();
        let mut earliest = UnixMillis(0);
        for _ in 0..LOOKUPS {
            earliest = std::hint::black_box(table.next_run_at()).unwrap_or_default();
        }
        let next_ns = started.elapsed().as_nanos() / u128::from(LOOKUPS);

        // A moment by which a batch's worth of jobs is due.
        let now = table
            .scheduled()
            .nth(DUE_JOBS_PER_ENTRY_MAX)
            .map_or(earliest, |(at, _)| at);
        let started = Instant::now();
        let mut due = Vec::new();
        for _ in 0..LOOKUPS / 100 {
            due = std::hint::black_box(table.due_by(now, DUE_JOBS_PER_ENTRY_MAX));
        }
        let due_ns = started.elapsed().as_nanos() / u128::from(LOOKUPS / 100);
        assert_eq!(due.len(), DUE_JOBS_PER_ENTRY_MAX);

        let queued = due.len() as u128;
        let started = Instant::now();
        table.apply(LogIndex(count + 1), now, &Command::Due { job_ids: due });
        let apply_ns = started.elapsed().as_nanos() / queued;
        assert_eq!(table.scheduled_jobs(), count - queued as u64);
        println!("{count:>9} {per_job:>11} {next_ns:>10} ns {due_ns:>11} ns {apply_ns:>14} ns");
    }
}
