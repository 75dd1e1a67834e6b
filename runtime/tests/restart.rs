//! Coordinator restart recovery: a coordinator is shut down and a new one is started on the same
//! data dir and the same ports.

mod common;

use std::time::Duration;

use common::*;

/// The tests here run one at a time. Several restarting coordinators sharing one test process
/// occasionally saw a first commit after reopening a database stall for about nine seconds (never
/// with one coordinator per process, as in production, and never with these tests run serially).
/// Until that is understood, they do not overlap.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
use herder_core::coordinator::CoordinatorConfig;
use herder_core::job::JobState;
use herder_core::protocol::{AttemptOutcome, CancelReason, Partitions, RunningAttempt};
use herder_core::tasks::{TaskOutput, TaskSpec};
use herder_runtime::client::SubmitOptions;

/// A RUNNING attempt whose worker never comes back is requeued with the attempt counted; if it
/// was the job's final attempt the job fails instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_attempts_of_a_worker_that_never_returns_are_requeued_or_failed() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let dir = TestDir::new("restart-lost");
    let config = fast_config();
    let first = start_coordinator(config.clone(), dir.path()).await;
    let (worker_addr, client_addr) = (first.worker_addr(), first.client_addr());
    let client1 = client(client_addr);
    let mut fake = FakeWorker::start(worker_addr, "gone", 2).await;

    let retried = submit_with(
        &client1,
        TaskSpec::Sha256 {
            text: "retry me".into(),
        },
        attempts(3),
    )
    .await;
    let last_chance = submit_with(
        &client1,
        TaskSpec::Sha256 {
            text: "final".into(),
        },
        attempts(1),
    )
    .await;
    let a = fake.expect_assign().await;
    let b = fake.expect_assign().await;
    let mut assigned = [a.job_id, b.job_id];
    assigned.sort();
    let mut expected = [retried, last_chance];
    expected.sort();
    assert_eq!(assigned, expected);
    wait_running(&client1, retried, Some("gone")).await;
    wait_running(&client1, last_chance, Some("gone")).await;

    first.shutdown().await.expect("clean shutdown");
    drop(fake);

    let second = restart_coordinator(config, dir.path(), worker_addr, client_addr).await;
    let client2 = client(client_addr);
    let real = start_worker("real", 1, worker_addr);

    let job = wait_terminal(&client2, retried).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.attempt, 2, "the interrupted attempt counts: {job:?}");
    assert_eq!(job.worker.as_ref().map(|w| w.as_str()), Some("real"));
    assert_eq!(
        job.result,
        Some(TaskOutput::Sha256 {
            hex: sha256_hex("retry me")
        })
    );

    let job = wait_terminal(&client2, last_chance).await;
    assert_eq!(
        job.state,
        JobState::Failed,
        "the final attempt was lost: {job:?}"
    );
    assert_eq!(job.attempt, 1);
    assert_eq!(job.result, None);
    assert!(job.error.is_some(), "a failed job says why: {job:?}");
    assert_eq!(
        job.worker.as_ref().map(|w| w.as_str()),
        Some("gone"),
        "never run again: {job:?}"
    );

    real.shutdown().await;
    second.shutdown().await.expect("clean shutdown");
}

/// The deadline of a recovered attempt is not measured on the old process's clock: an attempt
/// whose deadline passed while the coordinator was down is re-adopted when its worker comes
/// back reporting the lease, runs for one more task timeout, then expires and is retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_attempt_gets_a_fresh_deadline_after_readoption() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let dir = TestDir::new("restart-deadline");
    let task_timeout = Duration::from_millis(1_000);
    let config = CoordinatorConfig {
        task_timeout,
        readoption_window: Some(Duration::from_secs(5)),
        ..fast_config()
    };
    let first = start_coordinator(config.clone(), dir.path()).await;
    let (worker_addr, client_addr) = (first.worker_addr(), first.client_addr());
    let client1 = client(client_addr);
    let fake = FakeWorker::start(worker_addr, "adoptee", 1).await;
    let incarnation = fake.incarnation;
    let mut fake = fake;

    let job_id = submit_with(
        &client1,
        TaskSpec::Sleep {
            milliseconds: 60_000,
        },
        attempts(3),
    )
    .await;
    let lease = fake.expect_assign().await;
    assert_eq!(lease.job_id, job_id);
    first.shutdown().await.expect("clean shutdown");
    drop(fake);
    // Stay down longer than the task timeout, so the attempt's original deadline has passed.
    tokio::time::sleep(task_timeout + Duration::from_millis(200)).await;

    let second = restart_coordinator(config, dir.path(), worker_addr, client_addr).await;
    let client2 = client(client_addr);
    let recovered = status(&client2, job_id).await;
    assert_eq!(recovered.state, JobState::Running, "{recovered:?}");
    assert_eq!(recovered.lease_id, Some(lease.lease_id));

    // The same process comes back and reports the attempt: it is re-adopted, not expired.
    let running = vec![RunningAttempt {
        job_id,
        lease_id: lease.lease_id,
    }];
    let mut adoptee = FakeWorker::rejoin(worker_addr, "adoptee", incarnation, 1, running).await;
    let adopted = status(&client2, job_id).await;
    assert_eq!(adopted.state, JobState::Running, "{adopted:?}");
    assert_eq!(adopted.lease_id, Some(lease.lease_id));
    assert_eq!(adopted.attempt, 1);

    // It expires one task timeout later (bounded wait), not at once: the coordinator answers
    // several heartbeats of the re-adopted worker first.
    let reason = adoptee.expect_cancel(lease.lease_id).await;
    assert_eq!(
        reason,
        CancelReason::DeadlineExpired,
        "re-adopted, then expired"
    );
    let acks = adoptee.heartbeat_acks();
    assert!(
        acks >= 3,
        "the re-adopted attempt expired right away (only {acks} heartbeats answered before TASK_CANCEL)"
    );
    let job = status(&client2, job_id).await;
    assert!(
        job.error
            .as_deref()
            .unwrap_or_default()
            .contains("deadline"),
        "{job:?}"
    );

    // The worker confirms it stopped; the job is retried (here on the same worker) and completes.
    adoptee
        .send_result(job_id, lease.lease_id, AttemptOutcome::Cancelled {})
        .await;
    let retry = adoptee.expect_assign().await;
    assert_eq!((retry.job_id, retry.attempt.0), (job_id, 2));
    adoptee
        .succeed(
            &retry,
            TaskOutput::Slept {
                milliseconds: 60_000,
            },
        )
        .await;
    assert!(adoptee.expect_ack(retry.lease_id).await);
    let job = wait_terminal(&client2, job_id).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.attempt, 2);

    second.shutdown().await.expect("clean shutdown");
}

/// Real workers reconnect to the restarted coordinator by themselves; a running attempt is
/// re-adopted and finishes, a job queued before the restart runs afterwards, and a completed
/// job keeps its result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_workers_reconnect_and_jobs_from_before_the_restart_complete() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let dir = TestDir::new("restart-real");
    let config = CoordinatorConfig {
        readoption_window: Some(Duration::from_secs(5)),
        ..fast_config()
    };
    let first = start_coordinator(config.clone(), dir.path()).await;
    let (worker_addr, client_addr) = (first.worker_addr(), first.client_addr());
    let client1 = client(client_addr);
    let worker = start_worker("worker-1", 1, worker_addr);

    let done = submit(
        &client1,
        TaskSpec::Sha256 {
            text: "before".into(),
        },
    )
    .await;
    let done_view = wait_terminal(&client1, done).await;
    assert_eq!(done_view.state, JobState::Completed);
    let sleeping = submit(
        &client1,
        TaskSpec::Sleep {
            milliseconds: 1_500,
        },
    )
    .await;
    wait_running(&client1, sleeping, Some("worker-1")).await;
    let queued = submit(
        &client1,
        TaskSpec::WordCount {
            text: "submitted before the restart".into(),
        },
    )
    .await;
    assert_eq!(
        status(&client1, queued).await.state,
        JobState::Queued,
        "the only slot is busy"
    );

    first.shutdown().await.expect("clean shutdown");
    let second = restart_coordinator(config, dir.path(), worker_addr, client_addr).await;
    let client2 = client(client_addr);

    wait_alive(&client2, &["worker-1"]).await;
    let job = wait_terminal(&client2, sleeping).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(
        job.attempt, 1,
        "the running attempt was re-adopted: {job:?}"
    );
    assert_eq!(
        job.result,
        Some(TaskOutput::Slept {
            milliseconds: 1_500
        })
    );

    let job = wait_terminal(&client2, queued).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.result, Some(TaskOutput::WordCount { words: 4 }));
    assert_eq!(job.worker.as_ref().map(|w| w.as_str()), Some("worker-1"));

    let job = status(&client2, done).await;
    assert_eq!(
        job, done_view,
        "a terminal job survives the restart unchanged"
    );
    // A client whose connection the old coordinator closed reconnects on its next call.
    let job = status(&client1, done).await;
    assert_eq!(job, done_view);

    worker.shutdown().await;
    second.shutdown().await.expect("clean shutdown");
}

/// A job waiting out its retry backoff when the coordinator stops is retried after the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_in_retry_backoff_is_retried_after_a_restart() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let dir = TestDir::new("restart-retry-wait");
    let config = CoordinatorConfig {
        retry_base: Duration::from_millis(1_000),
        retry_max: Duration::from_millis(1_000),
        ..fast_config()
    };
    let first = start_coordinator(config.clone(), dir.path()).await;
    let (worker_addr, client_addr) = (first.worker_addr(), first.client_addr());
    let client1 = client(client_addr);
    let mut fake = FakeWorker::start(worker_addr, "flaky", 1).await;

    let job_id = submit_with(
        &client1,
        TaskSpec::WordCount {
            text: "try again".into(),
        },
        attempts(3),
    )
    .await;
    let lease = fake.expect_assign().await;
    fake.send_result(
        job_id,
        lease.lease_id,
        AttemptOutcome::Failed {
            permanent: false,
            error: "transient".into(),
        },
    )
    .await;
    assert!(fake.expect_ack(lease.lease_id).await);
    fake.disconnect().await;
    let before = status(&client1, job_id).await;
    assert!(
        matches!(before.state, JobState::RetryWait | JobState::Queued),
        "{before:?}"
    );
    assert_eq!(before.attempt, 1);
    first.shutdown().await.expect("clean shutdown");

    let second = restart_coordinator(config, dir.path(), worker_addr, client_addr).await;
    let client2 = client(client_addr);
    let recovered = status(&client2, job_id).await;
    assert!(
        matches!(recovered.state, JobState::RetryWait | JobState::Queued),
        "{recovered:?}"
    );
    assert_eq!(recovered.attempt, 1, "{recovered:?}");
    let worker = start_worker("steady", 1, worker_addr);
    let job = wait_terminal(&client2, job_id).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.attempt, 2);
    assert_eq!(job.result, Some(TaskOutput::WordCount { words: 2 }));

    worker.shutdown().await;
    second.shutdown().await.expect("clean shutdown");
}

/// A worker that comes back as a new process (new incarnation) cannot re-adopt its old
/// attempts: they are abandoned at once (well before the long re-adoption window ends), counted,
/// and retried. Restarting twice while waiting does not count the attempt twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_process_does_not_readopt_and_its_old_attempt_is_retried_at_once() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let dir = TestDir::new("restart-new-incarnation");
    let config = CoordinatorConfig {
        // Far longer than any wait below: only the new incarnation can end the wait.
        readoption_window: Some(Duration::from_secs(600)),
        ..fast_config()
    };
    let first = start_coordinator(config.clone(), dir.path()).await;
    let (worker_addr, client_addr) = (first.worker_addr(), first.client_addr());
    let client1 = client(client_addr);
    let mut old_process = FakeWorker::start(worker_addr, "phoenix", 1).await;
    let old_incarnation = old_process.incarnation;
    let job_id = submit(
        &client1,
        TaskSpec::Sha256 {
            text: "rise".into(),
        },
    )
    .await;
    let old = old_process.expect_assign().await;
    first.shutdown().await.expect("clean shutdown");
    drop(old_process);

    // Two restarts in a row while the attempt waits to be re-adopted.
    let second = restart_coordinator(config.clone(), dir.path(), worker_addr, client_addr).await;
    second.shutdown().await.expect("clean shutdown");
    let third = restart_coordinator(config, dir.path(), worker_addr, client_addr).await;
    let client3 = client(client_addr);
    let waiting = status(&client3, job_id).await;
    assert_eq!(
        (waiting.state, waiting.attempt),
        (JobState::Running, 1),
        "{waiting:?}"
    );

    // Same id, new process (nothing running): the old attempt is not re-adoptable, so it is
    // abandoned at once and the retry comes to the new process.
    let mut new_process = FakeWorker::start(worker_addr, "phoenix", 1).await;
    assert_ne!(new_process.incarnation, old_incarnation);
    let retry = new_process.expect_assign().await;
    assert_eq!((retry.job_id, retry.attempt.0), (job_id, 2));
    assert_ne!(retry.lease_id, old.lease_id);
    finish_retry(&mut new_process, &retry, &client3, job_id).await;

    third.shutdown().await.expect("clean shutdown");
}

/// A new worker process that (wrongly) reports an attempt of the previous process in its
/// REGISTER is told that the lease is not current (TASK_CANCEL LEASE_NOT_CURRENT), and once it
/// confirms, the job is retried on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_worker_process_reporting_an_old_attempt_is_told_to_stop_it() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let dir = TestDir::new("restart-stale-report");
    let config = CoordinatorConfig {
        readoption_window: Some(Duration::from_secs(600)),
        ..fast_config()
    };
    let first = start_coordinator(config.clone(), dir.path()).await;
    let (worker_addr, client_addr) = (first.worker_addr(), first.client_addr());
    let client1 = client(client_addr);
    let mut old_process = FakeWorker::start(worker_addr, "phoenix", 1).await;
    let job_id = submit(
        &client1,
        TaskSpec::Sha256 {
            text: "rise".into(),
        },
    )
    .await;
    let old = old_process.expect_assign().await;
    first.shutdown().await.expect("clean shutdown");
    drop(old_process);

    let second = restart_coordinator(config, dir.path(), worker_addr, client_addr).await;
    let client2 = client(client_addr);
    let running = vec![RunningAttempt {
        job_id,
        lease_id: old.lease_id,
    }];
    let mut new_process =
        FakeWorker::rejoin(worker_addr, "phoenix", fresh_incarnation(), 1, running).await;
    assert_eq!(
        new_process.expect_cancel(old.lease_id).await,
        CancelReason::LeaseNotCurrent,
        "the reported attempt belongs to another process and must be stopped"
    );
    new_process
        .send_result(job_id, old.lease_id, AttemptOutcome::Cancelled {})
        .await;
    let retry = new_process.expect_assign().await;
    assert_eq!((retry.job_id, retry.attempt.0), (job_id, 2));
    finish_retry(&mut new_process, &retry, &client2, job_id).await;

    second.shutdown().await.expect("clean shutdown");
}

/// A data-parallel job survives a coordinator restart in the middle: the parent and its
/// partitions come back from disk, running partitions are re-adopted (or retried), the queued one
/// runs afterwards, and the parent still completes with the exact aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_job_completes_exactly_across_a_coordinator_restart() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let dir = TestDir::new("restart-partitioned");
    let config = CoordinatorConfig {
        readoption_window: Some(Duration::from_secs(5)),
        ..fast_config()
    };
    let first = start_coordinator(config.clone(), dir.path()).await;
    let (worker_addr, client_addr) = (first.worker_addr(), first.client_addr());
    let client1 = client(client_addr);
    let w1 = start_worker("worker-1", 1, worker_addr);
    let w2 = start_worker("worker-2", 1, worker_addr);
    wait_alive(&client1, &["worker-1", "worker-2"]).await;

    let job = submit_with(
        &client1,
        TaskSpec::PrimeSum {
            start: 1,
            end: 1_000_000_000,
        },
        SubmitOptions {
            partitions: Some(Partitions::Count(3)),
            ..SubmitOptions::default()
        },
    )
    .await;
    // Two partitions computing (one per worker), the third queued behind them.
    let before = wait_job(&client1, job, "two partitions running", |view| {
        view.partitions.as_ref().is_some_and(|p| {
            p.pieces
                .iter()
                .filter(|piece| piece.state == JobState::Running)
                .count()
                == 2
        })
    })
    .await;
    assert_eq!(before.state, JobState::Running);

    first.shutdown().await.expect("clean shutdown");
    let second = restart_coordinator(config, dir.path(), worker_addr, client_addr).await;
    let client2 = client(client_addr);

    let done = wait_terminal(&client2, job).await;
    assert_eq!(done.state, JobState::Completed, "{done:?}");
    assert_eq!(
        done.result,
        Some(TaskOutput::PrimeSum {
            count: 50_847_534,
            sum: 24_739_512_092_254_535,
        }),
        "the primes up to 10^9"
    );
    let partitions = done.partitions.expect("a parent lists its partitions");
    assert_eq!((partitions.done, partitions.total), (3, 3));
    assert!(partitions
        .pieces
        .iter()
        .all(|piece| piece.state == JobState::Completed));

    w1.shutdown().await;
    w2.shutdown().await;
    second.shutdown().await.expect("clean shutdown");
}

/// The retry of the "rise" job succeeds on `worker`, is acknowledged, and the job completes on
/// attempt 2.
async fn finish_retry(
    worker: &mut FakeWorker,
    retry: &Assignment,
    client: &herder_runtime::client::HerderClient,
    job_id: herder_core::ids::JobId,
) {
    worker
        .succeed(
            retry,
            TaskOutput::Sha256 {
                hex: sha256_hex("rise"),
            },
        )
        .await;
    assert!(worker.expect_ack(retry.lease_id).await);
    let job = wait_terminal(client, job_id).await;
    assert_eq!(
        (job.state, job.attempt),
        (JobState::Completed, 2),
        "{job:?}"
    );
}

/// A delayed job survives a restart of its coordinator in the store, still `SCHEDULED`; it is
/// never started before its time (its first attempt's stamp is at or after `run_at`), and runs
/// once its time comes. A cancelled scheduled job never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_job_waits_across_a_restart_and_runs_at_its_time() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let dir = TestDir::new("restart-delayed");
    let config = fast_config();
    let first = start_coordinator(config.clone(), dir.path()).await;
    let (worker_addr, client_addr) = (first.worker_addr(), first.client_addr());
    let client1 = client(client_addr);
    let worker = start_worker("idle", 2, worker_addr);
    let delayed = |delay_millis| SubmitOptions {
        delay_millis: Some(delay_millis),
        ..attempts(1)
    };
    let task = TaskSpec::Sha256 {
        text: "later".into(),
    };
    let job_id = submit_with(&client1, task.clone(), delayed(3_000)).await;
    let dropped = submit_with(&client1, task, delayed(3_000)).await;
    let before = status(&client1, job_id).await;
    assert_eq!(before.state, JobState::Scheduled, "{before:?}");
    let run_at = before
        .run_at_unix_ms
        .expect("a scheduled job shows its time");
    assert!(client1.cancel(dropped).await.expect("cancel answered").1);
    first.shutdown().await.expect("clean shutdown");

    let second = restart_coordinator(config, dir.path(), worker_addr, client_addr).await;
    let client2 = client(client_addr);
    let recovered = status(&client2, job_id).await;
    assert!(
        matches!(
            recovered.state,
            JobState::Scheduled | JobState::Queued | JobState::Running | JobState::Completed
        ),
        "{recovered:?}"
    );
    assert_eq!(recovered.run_at_unix_ms, Some(run_at));
    let job = wait_terminal(&client2, job_id).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    let started = job.history.first().expect("one attempt").started_at_unix_ms;
    assert!(
        started.0 >= run_at,
        "started at {} before its time {run_at}",
        started.0
    );
    let cancelled = status(&client2, dropped).await;
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert!(cancelled.history.is_empty(), "{cancelled:?}");

    worker.shutdown().await;
    second.shutdown().await.expect("clean shutdown");
}
