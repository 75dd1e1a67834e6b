//! The worker machine driven by hand: exact outputs for each input.

use super::*;
use crate::tasks::TaskOutput;
use uuid::Uuid;

fn worker() -> Worker {
    worker_with(0)
}

/// Worker w1 with two slots and `prefetch`, dialing a:1 then b:1.
fn worker_with(prefetch: u32) -> Worker {
    let config = WorkerConfig {
        prefetch,
        ..WorkerConfig::new(
            WorkerId::parse("w1").expect("valid id"),
            2,
            vec!["a:1".into(), "b:1".into()],
        )
    };
    Worker::new(config, 9, Instant::ZERO).expect("valid config")
}

fn drain(worker: &mut Worker) -> Vec<WorkerOutput> {
    std::iter::from_fn(|| worker.poll_output())
        .filter(|o| !matches!(o, WorkerOutput::Event(_)))
        .collect()
}

fn connect_attempt(outputs: &[WorkerOutput]) -> (ConnectAttempt, String) {
    outputs
        .iter()
        .find_map(|o| match o {
            WorkerOutput::Connect { attempt, address } => Some((*attempt, address.clone())),
            _ => None,
        })
        .expect("a Connect output")
}

fn registered(worker: &mut Worker) -> ConnectAttempt {
    let (attempt, _) = connect_attempt(&drain(worker));
    worker.handle_connected(Instant::ZERO, attempt);
    drain(worker);
    worker.handle_message(
        Instant::ZERO,
        attempt,
        CoordinatorToWorker::Registered {
            term: Term(1),
            members: Vec::new(),
            heartbeat_interval_millis: 100,
            heartbeat_timeout_millis: 300,
        },
    );
    drain(worker);
    attempt
}

fn ids(n: u128) -> (JobId, LeaseId) {
    (
        JobId(Uuid::from_u128(n)),
        LeaseId(Uuid::from_u128(1000 + n)),
    )
}

fn assign(n: u128) -> CoordinatorToWorker {
    let (job_id, lease_id) = ids(n);
    CoordinatorToWorker::TaskAssign {
        term: Term(1),
        job_id,
        lease_id,
        attempt: Attempt(1),
        max_attempts: 3,
        task: TaskSpec::Sha256 { text: "abc".into() },
        timeout_millis: 1000,
    }
}

#[test]
fn registers_with_its_incarnation_and_running_attempts() {
    let mut w = worker();
    let (attempt, address) = connect_attempt(&drain(&mut w));
    assert_eq!(address, "a:1");
    w.handle_connected(Instant::ZERO, attempt);
    match drain(&mut w).as_slice() {
        [WorkerOutput::Send(WorkerToCoordinator::Register {
            tasks: _,
            queues: _,
            draining: _,
            worker_id,
            incarnation,
            capacity,
            prefetch: _,
            running,
            finished,
        })] => {
            assert!(finished.is_empty());
            assert_eq!(worker_id.as_str(), "w1");
            assert_eq!(*incarnation, w.incarnation());
            assert_eq!(*capacity, 2);
            assert!(running.is_empty());
        }
        other => panic!("expected one REGISTER, got {other:?}"),
    }
}

#[test]
fn heartbeats_on_schedule_and_reconnects_when_the_coordinator_goes_silent() {
    let mut w = worker();
    let attempt = registered(&mut w);
    assert_eq!(w.poll_timeout(), Some(Instant::from_millis(100)));
    w.handle_timeout(Instant::from_millis(100));
    assert_eq!(
        drain(&mut w),
        vec![WorkerOutput::Send(WorkerToCoordinator::Heartbeat {})]
    );
    w.handle_message(
        Instant::from_millis(150),
        attempt,
        CoordinatorToWorker::HeartbeatAck { term: Term(1) },
    );
    w.handle_timeout(Instant::from_millis(200));
    assert_eq!(
        drain(&mut w),
        vec![WorkerOutput::Send(WorkerToCoordinator::Heartbeat {})]
    );
    // Nothing heard since 150 ms; the timeout is 300 ms.
    w.handle_timeout(Instant::from_millis(450));
    assert_eq!(drain(&mut w), vec![WorkerOutput::Close]);
    assert!(!w.is_registered());
    let retry_at = w.poll_timeout().expect("a reconnect timer");
    w.handle_timeout(retry_at);
    let (_, address) = connect_attempt(&drain(&mut w));
    assert_eq!(address, "b:1", "fails over to the next address");
}

/// Job `n`'s attempt ends, failed, at `at`; what it sends is drained.
fn fail_attempt(w: &mut Worker, n: u128, at: u64) -> Vec<WorkerOutput> {
    w.handle_task_finished(
        Instant::from_millis(at),
        ids(n).1,
        AttemptOutcome::Failed {
            error: "boom".into(),
            permanent: false,
        },
    );
    drain(w)
}

fn heartbeat() -> Vec<WorkerOutput> {
    vec![WorkerOutput::Send(WorkerToCoordinator::Heartbeat {})]
}

#[test]
fn a_heartbeat_due_after_a_result_is_folded_into_it_and_the_next_is_sent_again() {
    let mut w = worker();
    let attempt = registered(&mut w);
    w.handle_message(Instant::from_millis(10), attempt, assign(1));
    drain(&mut w);
    let (job_id, lease_id) = ids(1);
    let sent = fail_attempt(&mut w, 1, 20);
    assert!(
        sent.iter().any(|o| matches!(
            o,
            WorkerOutput::Send(WorkerToCoordinator::TaskResult { .. })
        )),
        "the result goes out: {sent:?}"
    );
    // The coordinator answers the result within the interval.
    w.handle_message(
        Instant::from_millis(60),
        attempt,
        CoordinatorToWorker::ResultAck {
            term: Term(1),
            job_id,
            lease_id,
            accepted: true,
        },
    );
    drain(&mut w);
    // The heartbeat due at 100 ms stands in the result: nothing is sent, the next is armed.
    w.handle_timeout(Instant::from_millis(100));
    assert_eq!(drain(&mut w), Vec::new());
    assert_eq!(w.poll_timeout(), Some(Instant::from_millis(200)));
    // Nothing went out during this interval: its heartbeat is sent.
    w.handle_timeout(Instant::from_millis(200));
    assert_eq!(drain(&mut w), heartbeat());
}

#[test]
fn a_result_not_yet_answered_does_not_stand_in_for_the_heartbeat() {
    // A coordinator answers a result only once it is durable; while its disk is behind,
    // only the heartbeat's answer shows the worker it is alive.
    let mut w = worker();
    let attempt = registered(&mut w);
    // Last heard at 90 ms; the heartbeat of the first interval goes out unanswered.
    w.handle_message(Instant::from_millis(90), attempt, assign(1));
    drain(&mut w);
    w.handle_timeout(Instant::from_millis(100));
    assert_eq!(drain(&mut w), heartbeat());
    // A result in the second interval, and nothing heard in it.
    fail_attempt(&mut w, 1, 120);
    w.handle_timeout(Instant::from_millis(200));
    assert_eq!(drain(&mut w), heartbeat());
}

#[test]
fn runs_assignments_within_capacity_and_refuses_beyond_it() {
    let mut w = worker();
    let attempt = registered(&mut w);
    for n in 1..=3 {
        w.handle_message(Instant::ZERO, attempt, assign(n));
    }
    let outputs = drain(&mut w);
    assert_eq!(started(&outputs).len(), 2);
    let (job3, lease3) = ids(3);
    assert!(
        outputs.contains(&WorkerOutput::Send(WorkerToCoordinator::TaskResult {
            job_id: job3,
            lease_id: lease3,
            outcome: AttemptOutcome::Failed {
                permanent: false,
                error: "worker at capacity (2 of 2 running, 0 of 0 waiting)".into()
            },
        }))
    );
    // A duplicate assignment of a lease already running is ignored.
    w.handle_message(Instant::ZERO, attempt, assign(1));
    assert!(drain(&mut w).is_empty());
}

#[test]
fn results_are_retransmitted_after_reregistration_until_acknowledged() {
    let mut w = worker();
    let attempt = registered(&mut w);
    w.handle_message(Instant::ZERO, attempt, assign(1));
    drain(&mut w);
    let (job_id, lease_id) = ids(1);
    let output = TaskOutput::Sha256 { hex: "x".into() };
    // The connection drops before the task finishes.
    w.handle_disconnected(Instant::from_millis(10), attempt, "reset");
    drain(&mut w);
    w.handle_task_finished(
        Instant::from_millis(20),
        lease_id,
        AttemptOutcome::Succeeded {
            output: output.clone(),
        },
    );
    assert!(
        drain(&mut w).is_empty(),
        "nothing can be sent while disconnected"
    );
    assert_eq!(w.unacknowledged(), 1);
    // Reconnect: the result goes out right after REGISTERED.
    let retry_at = w.poll_timeout().expect("reconnect timer");
    w.handle_timeout(retry_at);
    let (second, _) = connect_attempt(&drain(&mut w));
    w.handle_connected(retry_at, second);
    drain(&mut w);
    w.handle_message(
        retry_at,
        second,
        CoordinatorToWorker::Registered {
            term: Term(1),
            members: Vec::new(),
            heartbeat_interval_millis: 100,
            heartbeat_timeout_millis: 300,
        },
    );
    let result = WorkerToCoordinator::TaskResult {
        job_id,
        lease_id,
        outcome: AttemptOutcome::Succeeded { output },
    };
    assert_eq!(drain(&mut w), vec![WorkerOutput::Send(result)]);
    w.handle_message(
        retry_at,
        second,
        CoordinatorToWorker::ResultAck {
            term: Term(1),
            job_id,
            lease_id,
            accepted: true,
        },
    );
    assert_eq!(w.unacknowledged(), 0);
    // A late report about the first connection is ignored.
    w.handle_disconnected(retry_at, attempt, "late");
    assert!(w.is_registered());
}

#[test]
fn long_failure_messages_are_cut_to_fit_a_frame() {
    let mut w = worker();
    let attempt = registered(&mut w);
    w.handle_message(Instant::ZERO, attempt, assign(1));
    drain(&mut w);
    let (_, lease_id) = ids(1);
    let error = "é".repeat(ATTEMPT_ERROR_BYTES_MAX);
    w.handle_task_finished(
        Instant::ZERO,
        lease_id,
        AttemptOutcome::Failed {
            permanent: false,
            error,
        },
    );
    let sent = drain(&mut w);
    let [WorkerOutput::Send(WorkerToCoordinator::TaskResult {
        outcome: AttemptOutcome::Failed {
            permanent: _,
            error,
        },
        ..
    })] = sent.as_slice()
    else {
        panic!("one result expected, got {sent:?}")
    };
    assert!(error.len() <= ATTEMPT_ERROR_BYTES_MAX && error.len() >= ATTEMPT_ERROR_BYTES_MAX - 1);
}

#[test]
fn cancel_stops_a_running_task_once() {
    let mut w = worker();
    let attempt = registered(&mut w);
    w.handle_message(Instant::ZERO, attempt, assign(1));
    drain(&mut w);
    let (job_id, lease_id) = ids(1);
    let cancel = CoordinatorToWorker::TaskCancel {
        term: Term(1),
        job_id,
        lease_id,
        reason: crate::protocol::CancelReason::JobCancelled,
    };
    w.handle_message(Instant::ZERO, attempt, cancel.clone());
    assert_eq!(drain(&mut w), vec![WorkerOutput::CancelTask { lease_id }]);
    w.handle_message(Instant::ZERO, attempt, cancel);
    assert!(drain(&mut w).is_empty(), "a second cancel is not repeated");
    w.handle_task_finished(Instant::ZERO, lease_id, AttemptOutcome::Cancelled {});
    assert_eq!(
        drain(&mut w),
        vec![WorkerOutput::Send(WorkerToCoordinator::TaskResult {
            job_id,
            lease_id,
            outcome: AttemptOutcome::Cancelled {},
        })]
    );
}

#[test]
fn a_drain_hands_back_what_is_still_running_and_refuses_new_work() {
    let mut w = worker();
    let attempt = registered(&mut w);
    w.handle_message(Instant::ZERO, attempt, assign(1));
    w.handle_message(Instant::ZERO, attempt, assign(2));
    drain(&mut w);
    w.begin_drain(Instant::ZERO);
    assert_eq!(
        drain(&mut w),
        vec![WorkerOutput::Send(WorkerToCoordinator::Draining {})]
    );
    assert!(!w.is_drained());
    // Attempt 1 finishes within the drain; an assignment that crossed the drain on the wire
    // is handed straight back without running.
    let (job_1, lease_1) = ids(1);
    let output = crate::tasks::TaskOutput::Sha256 { hex: "ok".into() };
    w.handle_task_finished(Instant::ZERO, lease_1, AttemptOutcome::Succeeded { output });
    drain(&mut w);
    w.handle_message(Instant::ZERO, attempt, assign(3));
    let (job_3, lease_3) = ids(3);
    let released = |job_id, lease_id| {
        WorkerOutput::Send(WorkerToCoordinator::TaskResult {
            job_id,
            lease_id,
            outcome: AttemptOutcome::Released {},
        })
    };
    assert_eq!(drain(&mut w), vec![released(job_3, lease_3)]);
    // The drain timeout ends: attempt 2 is asked to stop, and handed back only once it has
    // (so it never runs on two workers at once because of the drain).
    let (job_2, lease_2) = ids(2);
    w.stop_running(Instant::ZERO);
    assert_eq!(
        drain(&mut w),
        vec![WorkerOutput::CancelTask { lease_id: lease_2 }]
    );
    assert_eq!(w.running().count(), 1);
    w.handle_task_finished(Instant::ZERO, lease_2, AttemptOutcome::Cancelled {});
    assert_eq!(drain(&mut w), vec![released(job_2, lease_2)]);
    // A second stop, or the forced release, finds nothing left to hand back.
    w.stop_running(Instant::ZERO);
    w.release_running(Instant::ZERO);
    assert!(drain(&mut w).is_empty());
    for (job_id, lease_id) in [(job_1, lease_1), (job_2, lease_2), (job_3, lease_3)] {
        assert!(!w.is_drained());
        let ack = CoordinatorToWorker::ResultAck {
            term: Term(1),
            job_id,
            lease_id,
            accepted: true,
        };
        w.handle_message(Instant::ZERO, attempt, ack);
    }
    assert!(w.is_drained());
}

#[test]
fn an_attempt_that_ignores_being_stopped_is_released_when_the_drain_gives_up() {
    let mut w = worker();
    let attempt = registered(&mut w);
    w.handle_message(Instant::ZERO, attempt, assign(1));
    drain(&mut w);
    let (job_id, lease_id) = ids(1);
    w.begin_drain(Instant::ZERO);
    w.stop_running(Instant::ZERO);
    drain(&mut w);
    w.release_running(Instant::ZERO);
    assert_eq!(
        drain(&mut w),
        vec![
            WorkerOutput::CancelTask { lease_id },
            WorkerOutput::Send(WorkerToCoordinator::TaskResult {
                job_id,
                lease_id,
                outcome: AttemptOutcome::Released {},
            })
        ]
    );
    // An assignment that reaches it afterwards is handed straight back, unstarted.
    w.handle_message(Instant::ZERO, attempt, assign(2));
    let (job_2, lease_2) = ids(2);
    assert_eq!(
        drain(&mut w),
        vec![WorkerOutput::Send(WorkerToCoordinator::TaskResult {
            job_id: job_2,
            lease_id: lease_2,
            outcome: AttemptOutcome::Released {},
        })],
        "a draining worker starts nothing new"
    );
}

#[test]
fn a_drain_that_begins_while_registering_is_announced_once_registered() {
    let mut w = worker();
    let (attempt, _) = connect_attempt(&drain(&mut w));
    w.handle_connected(Instant::ZERO, attempt);
    drain(&mut w); // REGISTER, saying it is not draining
    w.begin_drain(Instant::ZERO);
    assert!(
        drain(&mut w).is_empty(),
        "not registered yet: nothing to send"
    );
    w.handle_message(
        Instant::ZERO,
        attempt,
        CoordinatorToWorker::Registered {
            term: Term(1),
            members: Vec::new(),
            heartbeat_interval_millis: 100,
            heartbeat_timeout_millis: 300,
        },
    );
    assert!(drain(&mut w).contains(&WorkerOutput::Send(WorkerToCoordinator::Draining {})));
}

#[test]
fn progress_is_reported_only_for_a_running_attempt_and_cut_to_its_bound() {
    let mut w = worker();
    let attempt = registered(&mut w);
    w.handle_message(Instant::ZERO, attempt, assign(1));
    drain(&mut w);
    let (job_id, lease_id) = ids(1);
    let long = "x".repeat(crate::limits::PROGRESS_NOTE_BYTES_MAX + 10);
    w.report_progress(lease_id, &long);
    match drain(&mut w).as_slice() {
        [WorkerOutput::Send(WorkerToCoordinator::Progress {
            job_id: reported,
            note,
            ..
        })] => {
            assert_eq!(*reported, job_id);
            assert_eq!(note.len(), crate::limits::PROGRESS_NOTE_BYTES_MAX);
        }
        other => panic!("expected one progress report, got {other:?}"),
    }
    let (_, not_running) = ids(2);
    w.report_progress(not_running, "ghost");
    assert!(drain(&mut w).is_empty());
}

#[test]
fn a_worker_that_reconnects_while_draining_says_so_in_its_registration() {
    let mut w = worker();
    w.begin_drain(Instant::ZERO);
    let (attempt, _) = connect_attempt(&drain(&mut w));
    w.handle_connected(Instant::ZERO, attempt);
    match drain(&mut w).as_slice() {
        [WorkerOutput::Send(WorkerToCoordinator::Register { draining, .. })] => {
            assert!(*draining)
        }
        other => panic!("expected a registration, got {other:?}"),
    }
}

#[test]
fn an_oversized_result_is_reported_as_a_permanent_failure() {
    let mut w = worker();
    let attempt = registered(&mut w);
    w.handle_message(Instant::ZERO, attempt, assign(1));
    drain(&mut w);
    let (job_id, lease_id) = ids(1);
    let value = serde_json::json!("x".repeat(crate::limits::TASK_RESULT_BYTES_MAX));
    let output = crate::tasks::TaskOutput::Value { value };
    w.handle_task_finished(
        Instant::ZERO,
        lease_id,
        AttemptOutcome::Succeeded { output },
    );
    match drain(&mut w).as_slice() {
        [WorkerOutput::Send(WorkerToCoordinator::TaskResult {
            job_id: reported,
            outcome: AttemptOutcome::Failed { error, permanent },
            ..
        })] => {
            assert_eq!(*reported, job_id);
            assert!(*permanent);
            assert!(error.contains("reference"), "{error}");
        }
        other => panic!("expected a permanent failure, got {other:?}"),
    }
}

#[test]
fn a_rejected_registration_backs_off_and_tries_again() {
    let mut w = worker();
    let (attempt, _) = connect_attempt(&drain(&mut w));
    w.handle_connected(Instant::ZERO, attempt);
    drain(&mut w);
    w.handle_message(
        Instant::ZERO,
        attempt,
        CoordinatorToWorker::RegisterRejected {
            reason: crate::protocol::RegisterRejection::DuplicateWorkerId,
            message: "taken".into(),
        },
    );
    assert_eq!(drain(&mut w), vec![WorkerOutput::Close]);
    let retry_at = w.poll_timeout().expect("retry timer");
    assert!(
        retry_at <= Instant::from_millis(100),
        "first backoff is at most the base"
    );
    w.handle_timeout(retry_at);
    connect_attempt(&drain(&mut w));
}

#[test]
fn same_seed_same_incarnation_different_seed_different_one() {
    let config = WorkerConfig::new(WorkerId::parse("w").expect("id"), 1, vec!["a".into()]);
    let a = Worker::new(config.clone(), 1, Instant::ZERO).expect("config");
    let b = Worker::new(config.clone(), 1, Instant::ZERO).expect("config");
    let c = Worker::new(config, 2, Instant::ZERO).expect("config");
    assert_eq!(a.incarnation(), b.incarnation());
    assert_ne!(a.incarnation(), c.incarnation());
}

fn prefetching_worker() -> Worker {
    worker_with(2)
}

fn started(outputs: &[WorkerOutput]) -> Vec<LeaseId> {
    outputs
        .iter()
        .filter_map(|o| match o {
            WorkerOutput::StartTask(assignment) => Some(assignment.lease_id),
            _ => None,
        })
        .collect()
}

fn result_of(outputs: &[WorkerOutput], lease: LeaseId) -> Option<&AttemptOutcome> {
    outputs.iter().find_map(|o| match o {
        WorkerOutput::Send(WorkerToCoordinator::TaskResult {
            lease_id, outcome, ..
        }) if *lease_id == lease => Some(outcome),
        _ => None,
    })
}

#[test]
fn prefetch_is_bounded_per_slot() {
    let config = WorkerConfig {
        prefetch: 9,
        ..WorkerConfig::new(WorkerId::parse("w1").expect("id"), 2, vec!["a:1".into()])
    };
    assert_eq!(
        config.validate(),
        Err(WorkerConfigError::Prefetch {
            prefetch: 9,
            capacity: 2
        })
    );
}

#[test]
fn a_prefetching_worker_holds_assignments_beyond_its_slots_and_starts_them_in_order() {
    let mut w = prefetching_worker();
    let attempt = registered(&mut w);
    for n in 1..=5 {
        w.handle_message(Instant::ZERO, attempt, assign(n));
    }
    let outputs = drain(&mut w);
    assert_eq!(started(&outputs), vec![ids(1).1, ids(2).1]);
    let waiting: Vec<LeaseId> = w.waiting().map(|(lease, _)| lease).collect();
    assert_eq!(waiting, vec![ids(3).1, ids(4).1]);
    assert_eq!(
        result_of(&outputs, ids(5).1),
        Some(&AttemptOutcome::Failed {
            permanent: false,
            error: "worker at capacity (2 of 2 running, 2 of 2 waiting)".into()
        })
    );
    // A lease already waiting is not taken twice.
    w.handle_message(Instant::ZERO, attempt, assign(3));
    assert!(drain(&mut w).is_empty());
    // Each slot that frees starts the oldest waiting attempt, after the result goes out.
    let done = AttemptOutcome::Succeeded {
        output: TaskOutput::Sha256 { hex: "x".into() },
    };
    w.handle_task_finished(Instant::from_millis(5), ids(2).1, done.clone());
    let outputs = drain(&mut w);
    assert_eq!(result_of(&outputs, ids(2).1), Some(&done));
    assert_eq!(started(&outputs), vec![ids(3).1]);
    w.handle_task_finished(Instant::from_millis(6), ids(1).1, done);
    assert_eq!(started(&drain(&mut w)), vec![ids(4).1]);
    assert_eq!(w.waiting().count(), 0);
    assert_eq!(w.running().count(), 2);
}

#[test]
fn a_reconnecting_worker_reports_its_waiting_attempts_after_its_running_ones() {
    let mut w = prefetching_worker();
    let attempt = registered(&mut w);
    for n in [4, 3, 2] {
        w.handle_message(Instant::ZERO, attempt, assign(n));
    }
    drain(&mut w);
    w.handle_disconnected(Instant::ZERO, attempt, "reset");
    w.handle_timeout(Instant::from_millis(10_000));
    let (attempt, _) = connect_attempt(&drain(&mut w));
    w.handle_connected(Instant::from_millis(10_000), attempt);
    match drain(&mut w).as_slice() {
        [WorkerOutput::Send(WorkerToCoordinator::Register {
            prefetch, running, ..
        })] => {
            assert_eq!(*prefetch, 2);
            let leases: Vec<LeaseId> = running.iter().map(|a| a.lease_id).collect();
            // Running ones in lease order, then the waiting one.
            assert_eq!(leases, vec![ids(3).1, ids(4).1, ids(2).1]);
        }
        other => panic!("expected one REGISTER, got {other:?}"),
    }
}

#[test]
fn a_waiting_attempt_is_cancelled_without_running_and_a_drain_hands_the_rest_back() {
    let mut w = prefetching_worker();
    let attempt = registered(&mut w);
    for n in 1..=4 {
        w.handle_message(Instant::ZERO, attempt, assign(n));
    }
    drain(&mut w);
    let (job3, lease3) = ids(3);
    w.handle_message(
        Instant::ZERO,
        attempt,
        CoordinatorToWorker::TaskCancel {
            term: Term(1),
            job_id: job3,
            lease_id: lease3,
            reason: crate::protocol::CancelReason::LeaseNotCurrent,
        },
    );
    let outputs = drain(&mut w);
    // Nothing to stop: it never started. Its report says so at once.
    assert_eq!(
        outputs,
        vec![WorkerOutput::Send(WorkerToCoordinator::TaskResult {
            job_id: job3,
            lease_id: lease3,
            outcome: AttemptOutcome::Cancelled {},
        })]
    );
    w.begin_drain(Instant::ZERO);
    let outputs = drain(&mut w);
    assert_eq!(
        result_of(&outputs, ids(4).1),
        Some(&AttemptOutcome::Released {})
    );
    assert!(started(&outputs).is_empty());
    assert_eq!(w.waiting().count(), 0);
    // What runs goes on; a slot freeing now starts nothing.
    w.handle_task_finished(Instant::ZERO, ids(1).1, AttemptOutcome::Cancelled {});
    assert!(started(&drain(&mut w)).is_empty());
}
