//! Worker failures (heartbeat silence, abrupt disconnect, a killed worker) and stale results
//! (from a worker declared dead, after deadline expiry, after client cancellation), injected
//! precisely with a protocol-level fake worker.

mod common;

use std::time::Duration;

use common::*;
use herder_core::coordinator::CoordinatorConfig;
use herder_core::job::JobState;
use herder_core::protocol::{
    AttemptOutcome, CancelReason, CoordinatorToWorker, RegisterRejection, RunningAttempt,
    WorkerToCoordinator,
};
use herder_core::tasks::{TaskOutput, TaskSpec};

/// The fake worker gets the job, then stops heartbeating while keeping its socket open (a
/// SIGSTOPped process). The job is retried and completes on a real worker, on attempt 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_worker_is_declared_dead_and_its_job_completes_elsewhere() {
    let dir = TestDir::new("silent");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let mut fake = FakeWorker::start(coordinator.worker_addr(), "paused", 1).await;

    let job_id = submit(
        &client,
        TaskSpec::Sha256 {
            text: "hello world".into(),
        },
    )
    .await;
    let assignment = fake.expect_assign().await;
    assert_eq!(assignment.job_id, job_id);
    assert_eq!(assignment.attempt.0, 1);

    let real = start_worker("real", 1, coordinator.worker_addr());
    wait_alive(&client, &["real"]).await;
    fake.set_heartbeating(false);

    let job = wait_terminal(&client, job_id).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.attempt, 2);
    assert_eq!(job.worker.as_ref().map(|w| w.as_str()), Some("real"));
    assert_eq!(
        job.result,
        Some(TaskOutput::Sha256 {
            hex: sha256_hex("hello world")
        })
    );
    let workers = client.workers().await.expect("workers");
    let paused = workers
        .iter()
        .find(|w| w.id.as_str() == "paused")
        .expect("still listed");
    assert!(
        !paused.alive,
        "the silent worker is declared dead: {paused:?}"
    );

    real.shutdown().await;
    coordinator.shutdown().await.expect("clean shutdown");
}

/// The fake worker gets the job, then drops its socket. Same outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disconnected_worker_loses_its_job_to_another_worker() {
    let dir = TestDir::new("disconnect");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let mut fake = FakeWorker::start(coordinator.worker_addr(), "crashing", 1).await;

    let job_id = submit(
        &client,
        TaskSpec::WordCount {
            text: "one two three".into(),
        },
    )
    .await;
    let assignment = fake.expect_assign().await;
    assert_eq!(assignment.job_id, job_id);

    let real = start_worker("real", 1, coordinator.worker_addr());
    wait_alive(&client, &["real"]).await;
    fake.disconnect().await;

    let job = wait_terminal(&client, job_id).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.attempt, 2);
    assert_eq!(job.worker.as_ref().map(|w| w.as_str()), Some("real"));
    assert_eq!(job.result, Some(TaskOutput::WordCount { words: 3 }));

    real.shutdown().await;
    coordinator.shutdown().await.expect("clean shutdown");
}

/// A real worker is killed in the middle of a sleep; the job finishes on the other worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_mid_task_loses_its_job_to_another_worker() {
    let dir = TestDir::new("kill");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let doomed = start_worker("worker-1", 1, coordinator.worker_addr());
    wait_alive(&client, &["worker-1"]).await;

    let job_id = submit(
        &client,
        TaskSpec::Sleep {
            milliseconds: 1_000,
        },
    )
    .await;
    wait_running(&client, job_id, Some("worker-1")).await;
    let survivor = start_worker("worker-2", 1, coordinator.worker_addr());
    wait_alive(&client, &["worker-2"]).await;
    doomed.kill();

    let job = wait_terminal(&client, job_id).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.attempt, 2);
    assert_eq!(job.worker.as_ref().map(|w| w.as_str()), Some("worker-2"));
    assert_eq!(
        job.result,
        Some(TaskOutput::Slept {
            milliseconds: 1_000
        })
    );
    let workers = client.workers().await.expect("workers");
    assert!(
        workers
            .iter()
            .any(|w| w.id.as_str() == "worker-1" && !w.alive),
        "the killed worker is declared lost: {workers:?}"
    );

    survivor.shutdown().await;
    coordinator.shutdown().await.expect("clean shutdown");
}

/// A worker declared dead (silent) comes back as the same process and resends its result for
/// the old lease: it is acknowledged with accepted=false and the job keeps the other worker's
/// result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_from_a_worker_declared_dead_is_rejected() {
    let dir = TestDir::new("stale-dead");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let mut fake = FakeWorker::start(coordinator.worker_addr(), "zombie", 1).await;
    let incarnation = fake.incarnation;

    let job_id = submit(
        &client,
        TaskSpec::Sleep {
            milliseconds: 1_500,
        },
    )
    .await;
    let old = fake.expect_assign().await;
    assert_eq!(old.job_id, job_id);

    let real = start_worker("real", 1, coordinator.worker_addr());
    wait_alive(&client, &["real"]).await;
    fake.set_heartbeating(false);
    // Declared dead; the retry runs on the real worker under a new lease.
    let running = wait_running(&client, job_id, Some("real")).await;
    assert_eq!(running.attempt, 2);
    assert_ne!(running.lease_id, Some(old.lease_id));
    fake.expect_closed(SHORT).await;
    drop(fake);

    // The same process reconnects, still reporting the attempt as running: the coordinator
    // tells it the lease is no longer current...
    let reported = vec![RunningAttempt {
        job_id,
        lease_id: old.lease_id,
    }];
    let mut zombie = FakeWorker::rejoin(
        coordinator.worker_addr(),
        "zombie",
        incarnation,
        1,
        reported,
    )
    .await;
    assert_eq!(
        zombie.expect_cancel(old.lease_id).await,
        CancelReason::LeaseNotCurrent
    );
    // ...and when it resends its result for the revoked lease, the result is refused.
    zombie
        .succeed(&old, TaskOutput::Slept { milliseconds: 1 })
        .await;
    assert!(
        !zombie.expect_ack(old.lease_id).await,
        "a stale result must be refused"
    );
    let still = status(&client, job_id).await;
    assert_eq!(
        still.state,
        JobState::Running,
        "the stale result changed nothing: {still:?}"
    );
    assert_eq!(still.lease_id, running.lease_id);
    assert_eq!(still.result, None);

    let job = wait_terminal(&client, job_id).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.worker.as_ref().map(|w| w.as_str()), Some("real"));
    assert_eq!(
        job.result,
        Some(TaskOutput::Slept {
            milliseconds: 1_500
        })
    );
    assert_eq!(job.attempt, 2);

    // Resent again after completion: still refused, still the real worker's result.
    zombie
        .succeed(&old, TaskOutput::Slept { milliseconds: 1 })
        .await;
    assert!(!zombie.expect_ack(old.lease_id).await);
    let job = status(&client, job_id).await;
    assert_eq!(
        job.result,
        Some(TaskOutput::Slept {
            milliseconds: 1_500
        })
    );

    real.shutdown().await;
    coordinator.shutdown().await.expect("clean shutdown");
}

/// A healthy, heartbeating worker overruns the deadline: it is sent TASK_CANCEL
/// (DEADLINE_EXPIRED), its late result is refused, and the job is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_after_deadline_expiry_is_rejected() {
    let dir = TestDir::new("stale-deadline");
    let config = CoordinatorConfig {
        task_timeout: Duration::from_millis(300),
        ..fast_config()
    };
    let coordinator = start_coordinator(config, dir.path()).await;
    let client = client(coordinator.client_addr());
    let mut fake = FakeWorker::start(coordinator.worker_addr(), "slowpoke", 1).await;

    let job_id = submit_with(
        &client,
        TaskSpec::Sleep {
            milliseconds: 10_000,
        },
        attempts(3),
    )
    .await;
    let first = fake.expect_assign().await;
    assert_eq!((first.job_id, first.attempt.0), (job_id, 1));
    assert_eq!(first.timeout_millis, 300);

    assert_eq!(
        fake.expect_cancel(first.lease_id).await,
        CancelReason::DeadlineExpired
    );
    let job = status(&client, job_id).await;
    assert_ne!(
        job.lease_id,
        Some(first.lease_id),
        "the lease is revoked: {job:?}"
    );
    let error = job.error.clone().unwrap_or_default();
    assert!(
        error.contains("deadline"),
        "the error mentions the deadline: {job:?}"
    );

    // The late result is refused and changes nothing.
    fake.succeed(&first, TaskOutput::Slept { milliseconds: 1 })
        .await;
    assert!(
        !fake.expect_ack(first.lease_id).await,
        "a late result must be refused"
    );

    // The retry comes back to this (only) worker, whose slot the late report freed.
    let second = fake.expect_assign().await;
    assert_eq!((second.job_id, second.attempt.0), (job_id, 2));
    assert_ne!(second.lease_id, first.lease_id);
    fake.succeed(
        &second,
        TaskOutput::Slept {
            milliseconds: 10_000,
        },
    )
    .await;
    assert!(
        fake.expect_ack(second.lease_id).await,
        "the current lease's result counts"
    );

    let job = wait_terminal(&client, job_id).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.attempt, 2);
    assert_eq!(
        job.result,
        Some(TaskOutput::Slept {
            milliseconds: 10_000
        })
    );

    coordinator.shutdown().await.expect("clean shutdown");
}

/// A client cancels a running job: the worker is sent TASK_CANCEL (JOB_CANCELLED), its late
/// result is refused, and the job stays CANCELLED without a result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_after_client_cancellation_is_rejected() {
    let dir = TestDir::new("stale-cancel");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let mut fake = FakeWorker::start(coordinator.worker_addr(), "busy", 1).await;

    let job_id = submit(
        &client,
        TaskSpec::Sleep {
            milliseconds: 10_000,
        },
    )
    .await;
    let assignment = fake.expect_assign().await;
    assert_eq!(assignment.job_id, job_id);

    let (view, cancelled) = client.cancel(job_id).await.expect("cancel");
    assert!(cancelled);
    assert_eq!(view.state, JobState::Cancelled);
    assert_eq!(
        fake.expect_cancel(assignment.lease_id).await,
        CancelReason::JobCancelled
    );

    fake.succeed(
        &assignment,
        TaskOutput::Slept {
            milliseconds: 10_000,
        },
    )
    .await;
    assert!(
        !fake.expect_ack(assignment.lease_id).await,
        "a result for a cancelled job must be refused"
    );

    let job = wait_terminal(&client, job_id).await;
    assert_eq!(job.state, JobState::Cancelled, "{job:?}");
    assert_eq!(job.result, None);
    // And a failure report for it is refused just the same.
    fake.send_result(
        job_id,
        assignment.lease_id,
        AttemptOutcome::Failed {
            permanent: false,
            error: "late failure".into(),
        },
    )
    .await;
    assert!(!fake.expect_ack(assignment.lease_id).await);
    let job = status(&client, job_id).await;
    assert_eq!(job.state, JobState::Cancelled, "{job:?}");
    assert_eq!(job.result, None);

    coordinator.shutdown().await.expect("clean shutdown");
}

/// A result carrying a current lease, sent by a worker that does not hold it, is refused; the
/// holder's result still counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_from_a_worker_that_does_not_hold_the_lease_is_rejected() {
    let dir = TestDir::new("stale-impostor");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let mut holder = FakeWorker::start(coordinator.worker_addr(), "holder", 1).await;

    let job_id = submit(
        &client,
        TaskSpec::Sha256 {
            text: "mine".into(),
        },
    )
    .await;
    let assignment = holder.expect_assign().await;
    let mut impostor = FakeWorker::start(coordinator.worker_addr(), "impostor", 1).await;
    impostor
        .succeed(
            &assignment,
            TaskOutput::Sha256 {
                hex: sha256_hex("forged"),
            },
        )
        .await;
    assert!(
        !impostor.expect_ack(assignment.lease_id).await,
        "only the lease holder may report"
    );
    let job = status(&client, job_id).await;
    assert_eq!(
        (job.state, job.lease_id),
        (JobState::Running, Some(assignment.lease_id)),
        "{job:?}"
    );

    holder
        .succeed(
            &assignment,
            TaskOutput::Sha256 {
                hex: sha256_hex("mine"),
            },
        )
        .await;
    assert!(holder.expect_ack(assignment.lease_id).await);
    let job = wait_terminal(&client, job_id).await;
    assert_eq!(
        job.result,
        Some(TaskOutput::Sha256 {
            hex: sha256_hex("mine")
        })
    );
    assert_eq!(job.worker.as_ref().map(|w| w.as_str()), Some("holder"));

    coordinator.shutdown().await.expect("clean shutdown");
}

/// A TASK_RESULT that pairs a lease the worker holds with a different job is refused and must
/// change nothing: the worker keeps the slot, and its real result for the lease still counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_naming_the_wrong_job_for_a_held_lease_changes_nothing() {
    let dir = TestDir::new("stale-mismatch");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let mut fake = FakeWorker::start(coordinator.worker_addr(), "confused", 2).await;

    let first = submit(
        &client,
        TaskSpec::Sha256 {
            text: "first".into(),
        },
    )
    .await;
    let a = fake.expect_assign().await;
    let second = submit(
        &client,
        TaskSpec::Sha256 {
            text: "second".into(),
        },
    )
    .await;
    let b = fake.expect_assign().await;
    assert_eq!((a.job_id, b.job_id), (first, second));

    // First job's lease, second job's id: not a result for any current attempt.
    fake.send_result(
        second,
        a.lease_id,
        AttemptOutcome::Succeeded {
            output: TaskOutput::Sha256 {
                hex: sha256_hex("second"),
            },
        },
    )
    .await;
    assert!(
        !fake.expect_ack(a.lease_id).await,
        "a mismatched result is refused"
    );
    for job_id in [first, second] {
        let job = status(&client, job_id).await;
        assert_eq!(
            job.state,
            JobState::Running,
            "the refused result changed nothing: {job:?}"
        );
    }
    let workers = client.workers().await.expect("workers");
    let confused = workers
        .iter()
        .find(|w| w.id.as_str() == "confused")
        .expect("listed");
    assert_eq!(
        confused.running, 2,
        "both attempts still occupy the worker's slots after the refused result: {confused:?}"
    );

    // The genuine results still count.
    fake.succeed(
        &a,
        TaskOutput::Sha256 {
            hex: sha256_hex("first"),
        },
    )
    .await;
    assert!(
        fake.expect_ack(a.lease_id).await,
        "the holder's genuine result for its current lease must be accepted"
    );
    fake.succeed(
        &b,
        TaskOutput::Sha256 {
            hex: sha256_hex("second"),
        },
    )
    .await;
    assert!(fake.expect_ack(b.lease_id).await);
    let job = wait_terminal(&client, first).await;
    assert_eq!(
        job.result,
        Some(TaskOutput::Sha256 {
            hex: sha256_hex("first")
        })
    );
    assert_eq!(job.attempt, 1);

    coordinator.shutdown().await.expect("clean shutdown");
}

/// Worker identity: another live process cannot take a worker id; the same process on a new
/// connection replaces its old connection and keeps its attempts; once the holder is lost a new
/// process may take the id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_ids_belong_to_one_live_process_at_a_time() {
    let dir = TestDir::new("identity");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let mut original = FakeWorker::start(coordinator.worker_addr(), "w", 1).await;
    let incarnation = original.incarnation;
    let job_id = submit(
        &client,
        TaskSpec::Sha256 {
            text: "kept".into(),
        },
    )
    .await;
    let assignment = original.expect_assign().await;

    // Another process with the same id is refused while the first is alive.
    let mut intruder =
        FakeWorker::connect(coordinator.worker_addr(), "w", fresh_incarnation()).await;
    intruder
        .send(&WorkerToCoordinator::Register {
            draining: false,
            tasks: herder_core::protocol::builtin_task_names(),
            worker_id: intruder.id.clone(),
            incarnation: intruder.incarnation,
            capacity: 1,
            prefetch: 0,
            running: Vec::new(),
            finished: Vec::new(),
            queues: None,
        })
        .await;
    let reason = intruder
        .expect("REGISTER_REJECTED", SHORT, |m| match m {
            CoordinatorToWorker::RegisterRejected { reason, .. } => Some(*reason),
            CoordinatorToWorker::Registered { .. } => panic!("a second live process took the id"),
            _ => None,
        })
        .await;
    assert_eq!(reason, RegisterRejection::DuplicateWorkerId);
    intruder.expect_closed(SHORT).await;

    // The same process on a new connection: the old connection is closed, the attempt continues.
    let running = vec![RunningAttempt {
        job_id,
        lease_id: assignment.lease_id,
    }];
    let mut reconnected =
        FakeWorker::rejoin(coordinator.worker_addr(), "w", incarnation, 1, running).await;
    original.expect_closed(SHORT).await;
    drop(original);
    let workers = client.workers().await.expect("workers");
    assert!(
        workers
            .iter()
            .any(|w| w.id.as_str() == "w" && w.alive && w.incarnation == incarnation),
        "{workers:?}"
    );
    reconnected
        .succeed(
            &assignment,
            TaskOutput::Sha256 {
                hex: sha256_hex("kept"),
            },
        )
        .await;
    assert!(
        reconnected.expect_ack(assignment.lease_id).await,
        "the attempt survived the reconnect"
    );
    let job = wait_terminal(&client, job_id).await;
    assert_eq!(
        (job.state, job.attempt),
        (JobState::Completed, 1),
        "{job:?}"
    );

    // Once the holder is lost, a new process may take the id.
    reconnected.disconnect().await;
    wait_workers(&client, "w declared lost", |w| {
        w.iter().any(|w| w.id.as_str() == "w" && !w.alive)
    })
    .await;
    let successor = FakeWorker::start(coordinator.worker_addr(), "w", 1).await;
    let workers = client.workers().await.expect("workers");
    assert!(
        workers
            .iter()
            .any(|w| w.id.as_str() == "w" && w.alive && w.incarnation == successor.incarnation),
        "{workers:?}"
    );

    coordinator.shutdown().await.expect("clean shutdown");
}

/// A cancel racing a successful result: exactly one of them wins, and the outcome is consistent
/// (never CANCELLED with a result, never COMPLETED after a successful cancel).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_racing_a_result_has_exactly_one_winner() {
    let dir = TestDir::new("cancel-race");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let mut fake = FakeWorker::start(coordinator.worker_addr(), "racer", 1).await;

    let (mut cancels_won, mut results_won) = (0, 0);
    for round in 0..20 {
        let text = format!("round-{round}");
        let job_id = submit(&client, TaskSpec::Sha256 { text: text.clone() }).await;
        let assignment = fake.expect_assign().await;
        assert_eq!(assignment.job_id, job_id);
        let output = TaskOutput::Sha256 {
            hex: sha256_hex(&text),
        };
        let ((), cancel) = tokio::join!(
            fake.succeed(&assignment, output.clone()),
            client.cancel(job_id)
        );
        let (_, cancelled) = cancel.expect("cancel");
        let accepted = fake.expect_ack(assignment.lease_id).await;
        assert_ne!(
            accepted, cancelled,
            "round {round}: exactly one of result and cancel wins"
        );
        let job = wait_terminal(&client, job_id).await;
        if cancelled {
            cancels_won += 1;
            assert_eq!(
                (job.state, job.result.clone()),
                (JobState::Cancelled, None),
                "round {round}: {job:?}"
            );
        } else {
            results_won += 1;
            assert_eq!(
                (job.state, job.result.clone()),
                (JobState::Completed, Some(output)),
                "round {round}: {job:?}"
            );
        }
    }
    assert_eq!(cancels_won + results_won, 20);

    coordinator.shutdown().await.expect("clean shutdown");
}
