//! A job's attempt history: every attempt gets a record when its `Assign` applies, and the
//! command that ends it closes the record with how it ended and when. Times are the stamps of
//! the entries that started and ended the attempt, so the history is part of the replicated
//! table, equal on every member. Driven through `JobTable::apply` with explicit stamps.

use herder_core::command::Command;
use herder_core::ids::{Incarnation, JobId, LeaseId, LogIndex, WorkerId};
use herder_core::job::{AttemptEnd, FailureKind, JobState, Lease};
use herder_core::limits::{ATTEMPT_HISTORY_ERROR_BYTES_MAX, ATTEMPT_HISTORY_MAX};
use herder_core::table::JobTable;
use herder_core::tasks::{TaskOutput, TaskSpec};
use herder_core::time::UnixMillis;

const T0: u64 = 1_800_000_000_000;

fn job() -> JobId {
    JobId(uuid::Uuid::from_u128(0x4157))
}

fn lease(n: u128, worker: &str) -> Lease {
    Lease {
        id: LeaseId(uuid::Uuid::from_u128(0x1ea5e + n)),
        worker: WorkerId(worker.to_owned()),
        incarnation: Incarnation(1),
    }
}

/// One history record as (attempt, worker, started, ended, outcome), in ms after T0.
type Row = (u32, String, u64, Option<u64>, Option<AttemptEnd>);

/// A table applying commands at consecutive indices, each stamped `at` milliseconds after T0,
/// checking every invariant after each.
struct Table {
    t: JobTable,
    next: u64,
}

impl Table {
    fn new() -> Table {
        Table {
            t: JobTable::new(),
            next: 0,
        }
    }

    fn apply(&mut self, at: u64, command: Command) {
        self.next += 1;
        self.t
            .apply(LogIndex(self.next), UnixMillis(T0 + at), &command);
        if let Err(broken) = self.t.check_invariants() {
            panic!("after {command:?}: {broken}");
        }
    }

    fn submit(&mut self, at: u64, max_attempts: u32) {
        self.apply(
            at,
            Command::Submit {
                job_id: job(),
                task: TaskSpec::Sha256 { text: "abc".into() },
                max_attempts,
                idempotency_key: None,
                max_active_jobs: 100,
                partitions: Vec::new(),
                partitions_asked: None,
                timeout_millis: None,
                submitted_by: None,
                fairness_key: None,
                priority: 0,
                queue: herder_core::queues::default_queue(),
                run_at: None,
                retry_of: None,
                after: Vec::new(),
                after_any_outcome: false,
            },
        );
    }

    fn assign(&mut self, at: u64, lease: &Lease) {
        self.apply(
            at,
            Command::Assign {
                job_id: job(),
                lease: lease.clone(),
                as_of: herder_core::ids::LogIndex(0),
            },
        );
    }

    fn fail(&mut self, at: u64, lease: &Lease, kind: FailureKind, cause: &str) {
        self.apply(
            at,
            Command::AttemptFailed {
                job_id: job(),
                lease_id: lease.id,
                cause: cause.to_owned(),
                retry_delay_millis: 0,
                permanent: false,
                kind,
            },
        );
    }

    fn history(&self) -> Vec<Row> {
        let job = self.t.get(&job()).expect("the job");
        job.history
            .iter()
            .map(|r| {
                (
                    r.attempt,
                    r.worker.0.clone(),
                    r.started_at_unix_ms.0 - T0,
                    r.ended_at_unix_ms.map(|e| e.0 - T0),
                    r.outcome,
                )
            })
            .collect()
    }
}

#[test]
fn every_attempt_is_recorded_with_its_worker_times_and_outcome() {
    let mut t = Table::new();
    t.submit(0, 4);
    let (a, b, c) = (lease(1, "w1"), lease(2, "w2"), lease(3, "w3"));
    t.assign(10, &a);
    t.fail(25, &a, FailureKind::WorkerLost, "worker w1 lost");
    t.apply(30, Command::Requeue { job_id: job() });
    t.assign(40, &b);
    t.fail(90, &b, FailureKind::DeadlineExpired, "deadline");
    t.apply(95, Command::Requeue { job_id: job() });
    t.assign(100, &c);
    assert_eq!(
        t.history().last(),
        Some(&(3, "w3".to_owned(), 100, None, None)),
        "the running attempt's record is open"
    );
    t.apply(
        130,
        Command::Complete {
            job_id: job(),
            lease_id: c.id,
            output: TaskOutput::Sha256 { hex: "00".into() },
        },
    );
    assert_eq!(
        t.history(),
        vec![
            (1, "w1".into(), 10, Some(25), Some(AttemptEnd::WorkerLost)),
            (
                2,
                "w2".into(),
                40,
                Some(90),
                Some(AttemptEnd::DeadlineExpired)
            ),
            (3, "w3".into(), 100, Some(130), Some(AttemptEnd::Completed)),
        ]
    );
    let job = t.t.get(&job()).expect("the job");
    assert_eq!(job.first_started_at, Some(UnixMillis(T0 + 10)));
    assert_eq!(job.history[0].error.as_deref(), Some("worker w1 lost"));
    assert_eq!(job.history[2].error, None);
    assert_eq!(job.history[2].ran_millis(), Some(30));
    let view = job.view();
    assert_eq!(view.first_started_at_unix_ms, Some(T0 + 10));
    assert_eq!(view.history, job.history, "the view carries the history");
}

#[test]
fn a_released_attempt_is_recorded_though_it_is_not_charged() {
    let mut t = Table::new();
    t.submit(0, 1);
    let (a, b) = (lease(1, "w1"), lease(2, "w2"));
    t.assign(5, &a);
    t.apply(
        7,
        Command::Release {
            job_id: job(),
            lease_id: a.id,
        },
    );
    t.assign(9, &b);
    assert_eq!(
        t.history(),
        vec![
            (1, "w1".into(), 5, Some(7), Some(AttemptEnd::Released)),
            (1, "w2".into(), 9, None, None),
        ],
        "the hand-back gave attempt 1 back, so the next attempt is 1 again"
    );
}

#[test]
fn a_cancel_and_an_abandon_close_the_running_record() {
    let mut t = Table::new();
    t.submit(0, 2);
    let a = lease(1, "w1");
    t.assign(5, &a);
    t.apply(
        8,
        Command::Abandon {
            job_id: job(),
            lease_id: a.id,
        },
    );
    let b = lease(2, "w2");
    t.assign(10, &b);
    t.apply(12, Command::Cancel { job_id: job() });
    let history = t.history();
    assert_eq!(history[0].4, Some(AttemptEnd::Abandoned));
    assert_eq!(
        history[1],
        (2, "w2".into(), 10, Some(12), Some(AttemptEnd::Cancelled))
    );
    assert_eq!(t.t.get(&job()).map(|j| j.state), Some(JobState::Cancelled));
}

#[test]
fn a_stale_result_leaves_the_history_alone() {
    let mut t = Table::new();
    t.submit(0, 3);
    let (a, b) = (lease(1, "w1"), lease(2, "w2"));
    t.assign(5, &a);
    t.fail(6, &a, FailureKind::TaskFailed, "boom");
    t.apply(7, Command::Requeue { job_id: job() });
    t.assign(8, &b);
    let before = t.history();
    // The first attempt's lease is no longer current: its late result changes nothing.
    t.apply(
        9,
        Command::Complete {
            job_id: job(),
            lease_id: a.id,
            output: TaskOutput::Sha256 { hex: "00".into() },
        },
    );
    assert_eq!(t.history(), before);
}

#[test]
fn stamps_from_a_slower_clock_never_run_backwards() {
    let mut t = Table::new();
    t.submit(100, 2);
    let a = lease(1, "w1");
    // A new leader whose clock is behind stamps the start before the submission and the end
    // before the start: the history raises both, as the finish time is raised.
    t.assign(50, &a);
    t.fail(20, &a, FailureKind::TaskFailed, "boom");
    assert_eq!(
        t.history(),
        vec![(1, "w1".into(), 100, Some(100), Some(AttemptEnd::TaskFailed))]
    );
}

#[test]
fn the_history_keeps_the_latest_attempts_and_counts_the_rest() {
    let mut t = Table::new();
    t.submit(0, 1);
    let runs = ATTEMPT_HISTORY_MAX as u128 + 5;
    for n in 0..runs {
        let l = lease(n, "w1");
        t.assign(n as u64 * 10, &l);
        t.apply(
            n as u64 * 10 + 1,
            Command::Release {
                job_id: job(),
                lease_id: l.id,
            },
        );
    }
    let job = t.t.get(&job()).expect("the job");
    assert_eq!(job.history.len(), ATTEMPT_HISTORY_MAX);
    assert_eq!(job.history_dropped, 5);
    assert_eq!(
        job.history[0].lease_id,
        lease(5, "w1").id,
        "the oldest records went first"
    );
    assert_eq!(
        job.first_started_at,
        Some(UnixMillis(T0)),
        "the first start stays"
    );
}

#[test]
fn a_long_failure_message_is_cut_in_the_history_but_kept_whole_as_the_error() {
    let mut t = Table::new();
    t.submit(0, 2);
    let a = lease(1, "w1");
    t.assign(1, &a);
    let long = "é".repeat(ATTEMPT_HISTORY_ERROR_BYTES_MAX);
    t.fail(2, &a, FailureKind::TaskFailed, &long);
    let job = t.t.get(&job()).expect("the job");
    let kept = job.history[0].error.as_deref().unwrap_or_default();
    assert!(kept.len() <= ATTEMPT_HISTORY_ERROR_BYTES_MAX && long.starts_with(kept));
    assert!(!kept.is_empty());
    assert_eq!(job.error.as_deref(), Some(long.as_str()));
}
