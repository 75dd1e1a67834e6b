//! End to end: a real coordinator and real workers on ephemeral ports execute jobs, spread them
//! across workers, retry failures, enforce deadlines and honour cancellation.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use herder_core::job::JobState;
use herder_core::tasks::{TaskOutput, TaskSpec};

const HELLO_WORLD_SHA256: &str = "b94d27b9934d3e08a52e52d7da7dabfac484efe37a5380ee9088f7ace2efcde9";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_in_tasks_produce_their_known_results() {
    let dir = TestDir::new("basic");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let worker = start_worker("worker-1", 2, coordinator.worker_addr());
    let client = client(coordinator.client_addr());

    let sha = submit(
        &client,
        TaskSpec::Sha256 {
            text: "hello world".into(),
        },
    )
    .await;
    let words = submit(
        &client,
        TaskSpec::WordCount {
            text: "the quick brown fox jumps over the lazy dog".into(),
        },
    )
    .await;
    let primes = submit(&client, TaskSpec::PrimeCount { limit: 100_000 }).await;
    let sleep = submit(&client, TaskSpec::Sleep { milliseconds: 20 }).await;

    let job = wait_terminal(&client, sha).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(
        job.result,
        Some(TaskOutput::Sha256 {
            hex: HELLO_WORLD_SHA256.into()
        })
    );
    assert_eq!(job.attempt, 1);
    assert_eq!(job.worker.as_ref().map(|w| w.as_str()), Some("worker-1"));
    assert_eq!(job.error, None);

    let job = wait_terminal(&client, words).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.result, Some(TaskOutput::WordCount { words: 9 }));

    let job = wait_terminal(&client, primes).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(
        job.result,
        Some(TaskOutput::PrimeCount {
            limit: 100_000,
            count: 9592
        })
    );

    let job = wait_terminal(&client, sleep).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.result, Some(TaskOutput::Slept { milliseconds: 20 }));

    // LIST filters by state and honours its limit, newest first.
    let newest = client
        .list(Some(JobState::Completed), Some(2))
        .await
        .expect("list");
    assert_eq!(
        newest.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![sleep, primes]
    );
    assert!(client
        .list(Some(JobState::Queued), None)
        .await
        .expect("list")
        .is_empty());

    // STATUS agrees with WAIT, and LIST knows all four.
    let again = status(&client, sha).await;
    assert_eq!(
        again.result,
        Some(TaskOutput::Sha256 {
            hex: HELLO_WORLD_SHA256.into()
        })
    );
    let listed = client
        .list(Some(JobState::Completed), None)
        .await
        .expect("list");
    let ids: BTreeSet<_> = listed.iter().map(|j| j.id).collect();
    assert_eq!(ids, BTreeSet::from([sha, words, primes, sleep]));

    worker.shutdown().await;
    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_spread_over_workers_and_run_at_the_same_time() {
    let dir = TestDir::new("spread");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let names = ["worker-a", "worker-b", "worker-c"];
    let workers: Vec<_> = names
        .iter()
        .map(|name| start_worker(name, 1, coordinator.worker_addr()))
        .collect();
    let client = client(coordinator.client_addr());
    wait_alive(&client, &names).await;

    let mut jobs = Vec::new();
    for _ in 0..3 {
        jobs.push(submit(&client, TaskSpec::Sleep { milliseconds: 1500 }).await);
    }

    // One WORKERS snapshot in which every worker is busy with exactly one attempt...
    wait_workers(
        &client,
        "all three workers running one attempt each",
        |workers| {
            assert!(
                workers.iter().all(|w| w.running <= w.capacity),
                "a worker holds more attempts than its capacity: {workers:?}"
            );
            names.iter().all(|n| {
                workers
                    .iter()
                    .any(|w| w.id.as_str() == *n && w.alive && w.running == 1)
            })
        },
    )
    .await;
    // ...and one LIST snapshot in which all three jobs run, on three distinct workers.
    eventually(
        "all three jobs RUNNING on distinct workers",
        DEADLINE,
        || {
            let client = &client;
            async move {
                let running = client
                    .list(Some(JobState::Running), None)
                    .await
                    .map_err(|e| e.to_string())?;
                let on: BTreeSet<_> = running.iter().filter_map(|j| j.worker.clone()).collect();
                if running.len() == 3 && on.len() == 3 {
                    Ok(())
                } else {
                    Err(format!("{running:?}"))
                }
            }
        },
    )
    .await;

    let mut finished_on = BTreeSet::new();
    for job_id in jobs {
        let job = wait_terminal(&client, job_id).await;
        assert_eq!(job.state, JobState::Completed, "{job:?}");
        assert_eq!(job.result, Some(TaskOutput::Slept { milliseconds: 1500 }));
        assert_eq!(job.attempt, 1);
        finished_on.insert(job.worker.expect("a completed job names its worker"));
    }
    assert_eq!(
        finished_on.len(),
        3,
        "each job ran on its own worker: {finished_on:?}"
    );

    for worker in workers {
        worker.shutdown().await;
    }
    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_are_retried_until_success_or_exhaustion() {
    let dir = TestDir::new("retries");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let worker = start_worker("worker-1", 2, coordinator.worker_addr());
    let client = client(coordinator.client_addr());

    // Fails on attempts 1 and 2, succeeds on 3 of 3.
    let recovers = submit_with(
        &client,
        TaskSpec::Fail {
            fail_until_attempt: 3,
        },
        attempts(3),
    )
    .await;
    // Would need attempt 5, but only 3 are allowed.
    let exhausted = submit_with(
        &client,
        TaskSpec::Fail {
            fail_until_attempt: 5,
        },
        attempts(3),
    )
    .await;

    let job = wait_terminal(&client, recovers).await;
    assert_eq!(job.state, JobState::Completed, "{job:?}");
    assert_eq!(job.attempt, 3);
    assert_eq!(job.result, Some(TaskOutput::Succeeded { attempt: 3 }));

    let job = wait_terminal(&client, exhausted).await;
    assert_eq!(job.state, JobState::Failed, "{job:?}");
    assert_eq!(job.attempt, 3, "attempts stop at max_attempts: {job:?}");
    assert_eq!(job.max_attempts, 3);
    assert_eq!(job.result, None);
    let error = job.error.expect("a failed job says why");
    assert!(
        error.contains("deliberate failure"),
        "error names the task failure: {error}"
    );

    // Terminal is final: a cancel changes nothing.
    let (view, cancelled) = client.cancel(exhausted).await.expect("cancel");
    assert!(!cancelled);
    assert_eq!(view.state, JobState::Failed);

    worker.shutdown().await;
    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_past_its_deadline_on_a_healthy_worker_is_revoked_and_retried() {
    let dir = TestDir::new("deadline-real");
    let config = herder_core::coordinator::CoordinatorConfig {
        task_timeout: Duration::from_millis(300),
        ..fast_config()
    };
    let coordinator = start_coordinator(config, dir.path()).await;
    let worker = start_worker("worker-1", 1, coordinator.worker_addr());
    let client = client(coordinator.client_addr());

    let job_id = submit_with(
        &client,
        TaskSpec::Sleep {
            milliseconds: 10_000,
        },
        attempts(2),
    )
    .await;
    // Attempt 2 is assigned: attempt 1 expired, and its slot on the (only, capacity-1) worker
    // was given back when the worker stopped the task.
    let second = wait_job(&client, job_id, "attempt 2 assigned", |j| j.attempt == 2).await;
    assert_eq!(second.max_attempts, 2);

    let job = wait_terminal(&client, job_id).await;
    assert_eq!(job.state, JobState::Failed, "{job:?}");
    assert_eq!(job.attempt, 2);
    assert_eq!(job.result, None);
    let error = job.error.expect("a failed job says why");
    assert!(
        error.contains("deadline"),
        "the error mentions the deadline: {error}"
    );

    // The worker was healthy throughout, and its slot is free again.
    let workers = wait_workers(&client, "worker-1 idle", |w| {
        w.iter()
            .any(|w| w.id.as_str() == "worker-1" && w.running == 0)
    })
    .await;
    assert!(workers.iter().all(|w| w.alive), "{workers:?}");
    let next = submit(
        &client,
        TaskSpec::Sha256 {
            text: "hello world".into(),
        },
    )
    .await;
    let next = wait_terminal(&client, next).await;
    assert_eq!(next.state, JobState::Completed, "{next:?}");
    assert_eq!(next.worker.as_ref().map(|w| w.as_str()), Some("worker-1"));

    worker.shutdown().await;
    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_queued_job_and_a_running_job() {
    let dir = TestDir::new("cancel");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());

    // Queued: no worker exists yet.
    let queued = submit(
        &client,
        TaskSpec::Sha256 {
            text: "never".into(),
        },
    )
    .await;
    assert_eq!(status(&client, queued).await.state, JobState::Queued);
    let (view, cancelled) = client.cancel(queued).await.expect("cancel queued");
    assert!(cancelled);
    assert_eq!(view.state, JobState::Cancelled);
    let (view, cancelled) = client.cancel(queued).await.expect("cancel again");
    assert!(!cancelled, "a second cancel finds the job already terminal");
    assert_eq!(view.state, JobState::Cancelled);

    // Running: a long sleep on the only worker, capacity 1.
    let worker = start_worker("worker-1", 1, coordinator.worker_addr());
    let running = submit(
        &client,
        TaskSpec::Sleep {
            milliseconds: 60_000,
        },
    )
    .await;
    wait_running(&client, running, Some("worker-1")).await;
    // A bounded WAIT on a running job times out and says so.
    let (view, timed_out) = client.wait(running, Some(50)).await.expect("short wait");
    assert!(timed_out);
    assert_eq!(view.state, JobState::Running);
    // A WAIT sent (on the same connection) just before the CANCEL is parked, then woken by it.
    let (wait, cancel) = tokio::join!(client.wait(running, Some(20_000)), client.cancel(running));
    let (view, cancelled) = cancel.expect("cancel running");
    assert!(cancelled);
    assert_eq!(view.state, JobState::Cancelled);
    assert_eq!(view.result, None);
    let (woken, timed_out) = wait.expect("parked wait");
    assert!(
        !timed_out,
        "the parked wait is answered by the cancel, not by its timeout"
    );
    assert_eq!(woken.state, JobState::Cancelled);

    // The worker stops the task and its slot becomes free: the next job runs there.
    wait_workers(&client, "worker-1 slot free again", |w| {
        w.iter()
            .any(|w| w.id.as_str() == "worker-1" && w.alive && w.running == 0)
    })
    .await;
    let next = submit(
        &client,
        TaskSpec::Sha256 {
            text: "hello world".into(),
        },
    )
    .await;
    let next = wait_terminal(&client, next).await;
    assert_eq!(next.state, JobState::Completed, "{next:?}");
    assert_eq!(next.worker.as_ref().map(|w| w.as_str()), Some("worker-1"));

    // The queued job was never run, and cancelled jobs stay cancelled without a result.
    for job_id in [queued, running] {
        let job = wait_terminal(&client, job_id).await;
        assert_eq!(job.state, JobState::Cancelled, "{job:?}");
        assert_eq!(job.result, None);
    }
    assert_eq!(status(&client, queued).await.attempt, 0);

    worker.shutdown().await;
    coordinator.shutdown().await.expect("clean shutdown");
}

/// A chain A -> B -> C and a fan-in of ten parents into one child run in order on real
/// workers, and the child reads its parents' results through their views; a failed parent
/// cancels what waits for it, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_and_a_fan_in_run_in_order_and_a_failed_parent_cancels_its_dependents() {
    use herder_runtime::client::SubmitOptions;
    let dir = TestDir::new("dependencies");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let client = client(coordinator.client_addr());
    let after = |parents: Vec<herder_core::ids::JobId>| SubmitOptions {
        after: parents,
        ..attempts(1)
    };
    let sha = |text: &str| TaskSpec::Sha256 { text: text.into() };
    // Submitted before any worker is up, so nothing has run when the graph is built.
    let a = submit_with(&client, sha("a"), attempts(1)).await;
    let b = submit_with(&client, sha("b"), after(vec![a])).await;
    let c = submit_with(&client, sha("c"), after(vec![b])).await;
    let mut parents = Vec::new();
    for i in 0..10 {
        parents.push(
            submit_with(
                &client,
                TaskSpec::PrimeCount {
                    limit: 1_000 * (i + 1),
                },
                attempts(1),
            )
            .await,
        );
    }
    let child = submit_with(&client, sha("child"), after(parents.clone())).await;
    let broken = submit_with(
        &client,
        TaskSpec::Fail {
            fail_until_attempt: 9,
        },
        attempts(1),
    )
    .await;
    let doomed = submit_with(&client, sha("doomed"), after(vec![broken])).await;
    let downstream = submit_with(&client, sha("downstream"), after(vec![doomed])).await;
    assert_eq!(status(&client, c).await.state, JobState::Blocked);

    let worker = start_worker("worker-1", 4, coordinator.worker_addr());
    let started = |job: &herder_core::protocol::JobView| {
        job.history
            .first()
            .expect("an attempt")
            .started_at_unix_ms
            .0
    };
    let ended = |job: &herder_core::protocol::JobView| job.finished_at_unix_ms.expect("ended");
    let (a, b, c) = (
        wait_terminal(&client, a).await,
        wait_terminal(&client, b).await,
        wait_terminal(&client, c).await,
    );
    for job in [&a, &b, &c] {
        assert_eq!(job.state, JobState::Completed, "{job:?}");
    }
    assert!(started(&b) >= ended(&a) && started(&c) >= ended(&b));
    let child = wait_terminal(&client, child).await;
    assert_eq!(child.state, JobState::Completed, "{child:?}");
    assert_eq!(child.after, parents);
    for parent in &child.after {
        let parent = status(&client, *parent).await;
        assert!(started(&child) >= ended(&parent));
        assert!(
            matches!(parent.result, Some(TaskOutput::PrimeCount { .. })),
            "{parent:?}"
        );
    }
    assert_eq!(wait_terminal(&client, broken).await.state, JobState::Failed);
    for job in [doomed, downstream] {
        let job = wait_terminal(&client, job).await;
        assert_eq!(job.state, JobState::Cancelled, "{job:?}");
        assert!(job.history.is_empty(), "it never ran: {job:?}");
        assert!(job
            .error
            .as_deref()
            .is_some_and(|e| e.contains("FAILED") || e.contains("CANCELLED")));
    }
    worker.shutdown().await;
}
