//! Workers that prefetch: leases beyond the slots, and deadlines that do not count the wait.

use super::*;

/// `name`'s `REGISTER` (incarnation 1, the built-in kinds) with this room, reporting `running`.
fn registration(
    name: &str,
    (capacity, prefetch): (u32, u32),
    running: Vec<RunningAttempt>,
) -> WorkerToCoordinator {
    WorkerToCoordinator::Register {
        worker_id: WorkerId(name.into()),
        incarnation: Incarnation(1),
        capacity,
        prefetch,
        running,
        finished: Vec::new(),
        tasks: crate::protocol::builtin_task_names(),
        draining: false,
        queues: None,
    }
}

fn register_prefetching(h: &mut Harness, name: &str, capacity: u32, prefetch: u32) {
    h.worker_says(name, registration(name, (capacity, prefetch), Vec::new()));
}

/// `n` attempts a worker may say it runs.
fn attempts(n: u128) -> Vec<RunningAttempt> {
    (1..=n)
        .map(|n| RunningAttempt {
            job_id: JobId(uuid::Uuid::from_u128(n)),
            lease_id: LeaseId(uuid::Uuid::from_u128(100 + n)),
        })
        .collect()
}

fn sleep() -> serde_json::Value {
    json!({"kind": "sleep", "milliseconds": 20_000})
}

#[test]
fn a_prefetching_worker_is_given_its_slots_and_prefetch_and_no_more() {
    let mut h = Harness::new();
    register_prefetching(&mut h, "w1", 2, 1);
    let jobs: Vec<JobId> = (0..4).map(|_| h.submit(sleep(), 3)).collect();
    let assigned: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(assigned, jobs[..3].to_vec());
    assert_eq!(h.state(jobs[3]), JobState::Queued);
    h.check();
}

#[test]
fn a_waiting_lease_is_timed_from_when_a_slot_can_free_for_it() {
    let mut h = Harness::with(CoordinatorConfig {
        task_timeout: Duration::from_millis(1_000),
        ..config()
    });
    register_prefetching(&mut h, "w1", 1, 1);
    let first = h.submit(sleep(), 3);
    h.advance_with_heartbeats(200, &["w1"]);
    let second = h.submit(sleep(), 3);
    assert_eq!(h.assignments("w1").len(), 2);
    // The first runs from its assignment; the second cannot start before the first is due to
    // end (at 1,000 ms), so its own second is counted from there.
    h.advance_with_heartbeats(800, &["w1"]);
    assert_eq!(h.state(first), JobState::RetryWait);
    assert_eq!(h.state(second), JobState::Running);
    h.advance_with_heartbeats(950, &["w1"]);
    assert_eq!(h.state(second), JobState::Running, "timed out for its wait");
    h.advance_with_heartbeats(50, &["w1"]);
    assert_eq!(h.state(second), JobState::RetryWait);
}

#[test]
fn a_lease_that_finds_a_free_slot_is_timed_from_its_assignment() {
    let mut h = Harness::with(CoordinatorConfig {
        task_timeout: Duration::from_millis(1_000),
        ..config()
    });
    register_prefetching(&mut h, "w1", 2, 2);
    let first = h.submit(sleep(), 3);
    h.advance_with_heartbeats(200, &["w1"]);
    let second = h.submit(sleep(), 3);
    h.advance_with_heartbeats(800, &["w1"]);
    assert_eq!(h.state(first), JobState::RetryWait);
    h.advance_with_heartbeats(199, &["w1"]);
    assert_eq!(h.state(second), JobState::Running);
    h.advance_with_heartbeats(1, &["w1"]);
    assert_eq!(h.state(second), JobState::RetryWait);
}

#[test]
fn a_registration_asking_more_prefetch_than_slots_or_holding_more_is_refused() {
    let mut h = Harness::new();
    register_prefetching(&mut h, "w1", 2, 9);
    assert!(matches!(
        h.sent_to_worker("w1")[..],
        [CoordinatorToWorker::RegisterRejected { .. }]
    ));
    let running = attempts(11);
    let holding = |running: Vec<RunningAttempt>| registration("w2", (2, 8), running);
    h.worker_says("w2", holding(running.clone()));
    assert!(matches!(
        h.sent_to_worker("w2")[..],
        [CoordinatorToWorker::RegisterRejected { .. }]
    ));
    // Ten are within two slots and eight prefetched.
    h.worker_says("w2", holding(running[..10].to_vec()));
    assert!(matches!(
        h.sent_to_worker("w2").first(),
        Some(CoordinatorToWorker::Registered { .. })
    ));
}

#[test]
fn nothing_more_is_queued_behind_an_attempt_that_outlived_its_deadline() {
    let mut h = Harness::with(CoordinatorConfig {
        task_timeout: Duration::from_millis(1_000),
        ..config()
    });
    register_prefetching(&mut h, "w1", 1, 2);
    let first = h.submit(sleep(), 3);
    let [(_, first_lease, _)] = h.assignments("w1")[..] else {
        panic!("the first job runs on w1")
    };
    // It ignores its deadline's cancel: its slot stays taken, for how long nobody knows.
    h.advance_with_heartbeats(1_000, &["w1"]);
    assert_eq!(h.state(first), JobState::RetryWait);
    h.sent_to_worker("w1");
    let second = h.submit(sleep(), 3);
    assert!(
        h.assignments("w1").is_empty(),
        "queued behind an attempt that may never end"
    );
    assert_eq!(h.state(second), JobState::Queued);
    // Once it says it stopped, the slot (and the room behind it) is there again.
    h.finish("w1", first, first_lease, AttemptOutcome::Cancelled {});
    let given: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert!(given.contains(&second), "{given:?}");
}

#[test]
fn a_worker_with_a_slot_idle_is_preferred_to_one_that_would_queue_the_job() {
    let mut h = Harness::new();
    register_prefetching(&mut h, "w1", 1, 4);
    register_prefetching(&mut h, "w2", 4, 0);
    for _ in 0..3 {
        h.submit(sleep(), 3);
    }
    assert_eq!(h.assignments("w1").len(), 1);
    assert_eq!(h.assignments("w2").len(), 2);
}

#[test]
fn a_lost_prefetching_worker_takes_its_waiting_attempts_down_with_it() {
    let mut h = Harness::new();
    register_prefetching(&mut h, "w1", 1, 1);
    let jobs = [h.submit(sleep(), 3), h.submit(sleep(), 3)];
    assert_eq!(h.assignments("w1").len(), 2);
    h.d.c.handle_closed(h.d.now, Harness::conn_of("w1"));
    h.pump();
    // Which of them had started is not known: both are failed and retried, each charged.
    for job in jobs {
        assert_eq!(h.state(job), JobState::RetryWait);
        assert_eq!(h.job(job).attempt, Attempt(1));
    }
}

#[test]
fn a_reconnect_is_held_to_the_room_its_process_registered_with() {
    let mut h = Harness::new();
    register_prefetching(&mut h, "w1", 1, 0);
    assert!(matches!(
        h.sent_to_worker("w1")[..],
        [CoordinatorToWorker::Registered { .. }]
    ));
    // The same process claims more room on a new connection, to report more attempts.
    h.worker_says("w1", registration("w1", (2, 8), attempts(3)));
    assert!(matches!(
        h.sent_to_worker("w1")[..],
        [CoordinatorToWorker::RegisterRejected { .. }]
    ));
    h.check();
}
