//! Restart recovery: the final-attempt rule, re-adoption by a worker that reconnects, stale
//! deadlines and backoffs restarted from recovery, and logs that cannot be replayed.

use super::*;

#[test]
fn recovery_requeues_an_interrupted_attempt_and_counts_it() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(json!({"kind": "sleep", "milliseconds": 20_000}), 3);
    assert_eq!(h.assignments("w1").len(), 1);
    h.restart(config());
    assert_eq!(
        h.state(job),
        JobState::Running,
        "kept running during the re-adoption window"
    );
    assert_eq!(h.d.c.awaiting_readoption(), 1);
    h.advance(299);
    assert_eq!(h.state(job), JobState::Running);
    h.advance(1);
    assert_eq!(
        h.state(job),
        JobState::Queued,
        "nobody reported it: requeued"
    );
    assert_eq!(
        h.job(job).attempt,
        Attempt(1),
        "the interrupted attempt still counts"
    );
    h.register("w2", 1);
    let [(_, _, attempt)] = h.assignments("w2")[..] else {
        panic!()
    };
    assert_eq!(attempt, Attempt(2));
}

#[test]
fn recovery_applies_the_final_attempt_rule() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(json!({"kind": "sleep", "milliseconds": 20_000}), 1);
    assert_eq!(h.assignments("w1").len(), 1);
    h.restart(config());
    h.advance(300);
    assert_eq!(
        h.state(job),
        JobState::Failed,
        "its only attempt was interrupted"
    );
    assert!(h
        .job(job)
        .error
        .as_deref()
        .is_some_and(|e| e.contains("restart")));
    assert_eq!(h.d.c.table().active_jobs(), 0);
}

#[test]
fn a_worker_that_reconnects_with_its_lease_is_readopted_and_its_result_counts() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(json!({"kind": "sleep", "milliseconds": 20_000}), 3);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    h.restart(config());
    // The worker process survived and re-registers, reporting the attempt it is running.
    h.register_as(
        "w1",
        1,
        Incarnation(1),
        Harness::conn_of("w1"),
        vec![RunningAttempt {
            job_id: job,
            lease_id: lease,
        }],
    );
    assert!(h
        .events()
        .iter()
        .any(|e| matches!(e, Event::AttemptReadopted { lease_id, .. } if *lease_id == lease)));
    assert_eq!(h.d.c.awaiting_readoption(), 0);
    h.advance_with_heartbeats(1_000, &["w1"]);
    assert_eq!(
        h.state(job),
        JobState::Running,
        "the window's end does not touch a re-adopted attempt"
    );
    h.succeed("w1", job, lease);
    assert_eq!(h.state(job), JobState::Completed);
    assert_eq!(h.job(job).attempt, Attempt(1), "no retry was needed");
}

#[test]
fn a_result_resent_after_restart_is_accepted_within_the_window() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(sha("x"), 3);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    h.restart(config());
    // The task finished while the coordinator was down; the worker resends its result.
    h.register("w1", 1);
    h.succeed("w1", job, lease);
    assert_eq!(h.state(job), JobState::Completed);
    assert_eq!(h.sent_to_worker("w1").last(), Some(&ack(true, job, lease)));
}

#[test]
fn a_restarted_worker_process_cannot_readopt_and_its_old_attempts_are_requeued_at_once() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(json!({"kind": "sleep", "milliseconds": 20_000}), 3);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    h.restart(config());
    // Same id, new incarnation: a new process that cannot be running the old attempt.
    h.register_as("w1", 1, Incarnation(2), Harness::conn_of("w1"), vec![]);
    assert_eq!(
        h.job(job).attempt,
        Attempt(2),
        "requeued at once and reassigned"
    );
    assert_eq!(h.state(job), JobState::Running);
    assert_ne!(h.job(job).lease.as_ref().map(|l| l.id), Some(lease));
}

#[test]
fn a_stale_deadline_is_neither_trusted_nor_ignored_after_restart() {
    // Deadlines are instants on a dead process's clock; recovery re-arms them from takeover.
    let mut h = Harness::with(CoordinatorConfig {
        task_timeout: Duration::from_millis(2_000),
        ..config()
    });
    h.register("w1", 1);
    let job = h.submit(json!({"kind": "sleep", "milliseconds": 60_000}), 3);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    h.advance_with_heartbeats(1_900, &["w1"]); // 100 ms before the old deadline
    let cfg = CoordinatorConfig {
        task_timeout: Duration::from_millis(2_000),
        ..config()
    };
    h.restart(cfg);
    h.register_as(
        "w1",
        1,
        Incarnation(1),
        Harness::conn_of("w1"),
        vec![RunningAttempt {
            job_id: job,
            lease_id: lease,
        }],
    );
    h.advance_with_heartbeats(1_950, &["w1"]);
    assert_eq!(
        h.state(job),
        JobState::Running,
        "the full timeout restarts from recovery"
    );
    h.advance_with_heartbeats(100, &["w1"]);
    assert!(
        !h.d.c.table().is_current_lease(job, lease),
        "but it is enforced"
    );
    assert!(h
        .job(job)
        .error
        .as_deref()
        .is_some_and(|e| e.contains("deadline")));
    assert!(h.sent_to_worker("w1").iter().any(|m| matches!(
        m,
        CoordinatorToWorker::TaskCancel {
            term: Term(1),
            reason: CancelReason::DeadlineExpired,
            ..
        }
    )));
}

#[test]
fn retry_backoff_restarts_from_recovery() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(json!({"kind": "fail", "fail_until_attempt": 2}), 3);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    h.finish(
        "w1",
        job,
        lease,
        AttemptOutcome::Failed {
            permanent: false,
            error: "x".into(),
        },
    );
    let delay = h.job(job).retry_delay_millis;
    h.restart(config());
    assert_eq!(h.state(job), JobState::RetryWait);
    if delay > 0 {
        h.advance(delay - 1);
        assert_eq!(h.state(job), JobState::RetryWait);
    }
    h.advance(1);
    assert_eq!(h.state(job), JobState::Queued);
}

#[test]
fn recovery_replays_durable_log_entries_beyond_the_materialized_rows() {
    let mut h = Harness::new();
    let job = h.submit(sha("x"), 3);
    // Keep only the log: pretend the materialized rows never made it.
    let mut disk = h.disk.clone();
    disk.jobs.clear();
    disk.applied = LogIndex(0);
    disk.log.insert(
        LogIndex(1),
        LogEntry {
            index: LogIndex(1),
            term: Term(1),
            at: crate::time::UnixMillis::UNSTAMPED,
            command: Command::Submit {
                timeout_millis: None,
                partitions: Vec::new(),
                job_id: job,
                task: TaskSpec::Sha256 { text: "x".into() },
                max_attempts: 3,
                idempotency_key: None,
                max_active_jobs: 1_000,
                partitions_asked: None,
                submitted_by: None,
                fairness_key: None,
                priority: 0,
                queue: crate::queues::default_queue(),
                run_at: None,
                retry_of: None,
                after: Vec::new(),
                after_any_outcome: false,
            },
        },
    );
    let recovered =
        Coordinator::recover(config(), 1, Instant::ZERO, disk.durable_state()).expect("recovery");
    assert_eq!(recovered.job(&job).map(|j| j.state), Some(JobState::Queued));
}

#[test]
fn recovery_refuses_a_log_with_a_gap() {
    let entry = |i| LogEntry {
        index: LogIndex(i),
        term: Term(1),
        at: crate::time::UnixMillis::UNSTAMPED,
        command: Command::Cancel {
            job_id: JobId(uuid::Uuid::nil()),
        },
    };
    let durable = DurableState {
        log: vec![entry(1), entry(3)],
        ..DurableState::default()
    };
    assert_eq!(
        Coordinator::recover(config(), 1, Instant::ZERO, durable).err(),
        Some(RecoveryError::LogGap {
            expected: LogIndex(2),
            found: LogIndex(3),
        })
    );
}

#[test]
fn changed_rows_are_written_once_nothing_was_written_for_a_while() {
    let quiet = u64::try_from(crate::limits::MATERIALIZE_QUIET.as_millis()).expect("small");
    let mut h = Harness::new();
    let first = h.submit(sha("a"), 3);
    // Durable in the log and acknowledged, but its row is not given a commit of its own at once:
    // that commit would hold the disk when the next submission arrives.
    assert!(!h.disk.jobs.contains_key(&first));
    h.advance(quiet / 2);
    // Each write moves the quiet moment later, and rows do not ride with it.
    let second = h.submit(sha("b"), 3);
    assert!(!h.disk.jobs.contains_key(&first));
    h.advance(quiet - 1);
    assert!(!h.disk.jobs.contains_key(&first) && !h.disk.jobs.contains_key(&second));
    h.advance(1);
    assert!(
        h.disk.jobs.contains_key(&first) && h.disk.jobs.contains_key(&second),
        "after a quiet moment the rows are written by themselves"
    );
    // And what was written recovers to the same table.
    let recovered =
        Coordinator::recover(config(), 1, h.d.now, h.disk.durable_state()).expect("recovery");
    assert_eq!(
        recovered.job(&first).map(|j| j.state),
        Some(JobState::Queued)
    );
    assert_eq!(
        recovered.job(&second).map(|j| j.state),
        Some(JobState::Queued)
    );
}

#[test]
fn the_quiet_moment_counts_from_when_the_disk_went_idle_not_from_the_last_hand_out() {
    let quiet = u64::try_from(crate::limits::MATERIALIZE_QUIET.as_millis()).expect("small");
    let mut h = Harness::new();
    let first = h.submit(sha("a"), 3);
    // The next submission's commit takes longer than the quiet interval.
    h.hold_writes = true;
    h.send_submit(sha("b"), Some(3), None);
    h.advance(3 * quiet);
    assert!(
        !h.disk.jobs.contains_key(&first),
        "no rows while a write is in flight"
    );
    h.release_writes();
    assert!(
        !h.disk.jobs.contains_key(&first),
        "nor at once when the slow write ends: the next submission may be on its way"
    );
    h.advance(quiet);
    assert!(h.disk.jobs.contains_key(&first));
}
