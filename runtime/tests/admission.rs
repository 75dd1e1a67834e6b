//! Admission control (`max_active_jobs`) and idempotency keys, end to end.

mod common;

use std::collections::BTreeSet;

use common::*;
use herder_core::client::ClientError;
use herder_core::coordinator::CoordinatorConfig;
use herder_core::job::JobState;
use herder_core::protocol::{AttemptOutcome, ErrorCode};
use herder_core::tasks::{TaskOutput, TaskSpec};
use herder_runtime::client::{CallError, HerderClient, SubmitOptions, Submitted};

fn limited(max_active_jobs: u64) -> CoordinatorConfig {
    CoordinatorConfig {
        max_active_jobs,
        ..fast_config()
    }
}

/// Asserts a typed admission rejection; returns (active, limit).
fn rejected(result: Result<Submitted, CallError>) -> (u64, u64) {
    match result {
        Err(CallError::Client(ClientError::Rejected {
            active_jobs,
            max_active_jobs,
            ..
        })) => (active_jobs, max_active_jobs),
        other => panic!("expected a SUBMIT_REJECTED, got {other:?}"),
    }
}

async fn try_submit(client: &HerderClient, text: &str) -> Result<Submitted, CallError> {
    client
        .submit(
            &TaskSpec::Sha256 { text: text.into() },
            SubmitOptions::default(),
        )
        .await
}

/// Completes the fake worker's next assignment (a sha256 job) correctly; returns its job.
async fn complete_next(fake: &mut FakeWorker) -> herder_core::ids::JobId {
    let a = fake.expect_assign().await;
    let TaskSpec::Sha256 { text } = &a.task else {
        panic!("unexpected task {:?}", a.task)
    };
    fake.succeed(
        &a,
        TaskOutput::Sha256 {
            hex: sha256_hex(text),
        },
    )
    .await;
    assert!(fake.expect_ack(a.lease_id).await);
    a.job_id
}

fn keyed(key: &str, max_attempts: Option<u32>) -> SubmitOptions {
    SubmitOptions {
        timeout_millis: None,
        partitions: None,
        max_attempts,
        idempotency_key: Some(key.into()),
        fairness_key: None,
        priority: None,
        queue: None,
        delay_millis: None,
        run_at_unix_ms: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    }
}

async fn job_count(client: &HerderClient) -> usize {
    client.list(None, Some(1000)).await.expect("list").len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submissions_beyond_the_limit_get_a_typed_rejection_and_create_nothing() {
    let dir = TestDir::new("admit-limit");
    let coordinator = start_coordinator(limited(3), dir.path()).await;
    let client = client(coordinator.client_addr());

    for n in 0..3 {
        try_submit(&client, &format!("job-{n}"))
            .await
            .expect("under the limit");
    }
    assert_eq!(rejected(try_submit(&client, "one too many").await), (3, 3));
    assert_eq!(
        rejected(try_submit(&client, "still too many").await),
        (3, 3)
    );
    assert_eq!(job_count(&client).await, 3, "a rejection creates nothing");
    let queued = client
        .list(Some(JobState::Queued), None)
        .await
        .expect("list");
    assert_eq!(queued.len(), 3);

    coordinator.shutdown().await.expect("clean shutdown");
}

/// Completion, permanent failure and cancellation each free exactly one slot; a retry keeps its
/// slot and never re-enters admission (it is scheduled even while the table is full).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_terminal_transition_frees_exactly_one_slot_and_retries_keep_theirs() {
    let dir = TestDir::new("admit-slots");
    let coordinator = start_coordinator(limited(2), dir.path()).await;
    let client = client(coordinator.client_addr());
    let mut fake = FakeWorker::start(coordinator.worker_addr(), "controlled", 2).await;

    let completes = submit(&client, TaskSpec::Sha256 { text: "a".into() }).await;
    let retries = submit_with(&client, TaskSpec::Sha256 { text: "b".into() }, attempts(2)).await;
    let a1 = fake.expect_assign().await;
    let b1 = fake.expect_assign().await;
    let (a1, b1) = if a1.job_id == completes {
        (a1, b1)
    } else {
        (b1, a1)
    };
    assert_eq!((a1.job_id, b1.job_id), (completes, retries));
    assert_eq!(rejected(try_submit(&client, "x").await), (2, 2));

    // Completion frees one slot.
    fake.succeed(
        &a1,
        TaskOutput::Sha256 {
            hex: sha256_hex("a"),
        },
    )
    .await;
    assert!(fake.expect_ack(a1.lease_id).await);
    let third = submit(&client, TaskSpec::Sha256 { text: "c".into() }).await;
    assert_eq!(rejected(try_submit(&client, "x").await), (2, 2));
    let c1 = fake.expect_assign().await;
    assert_eq!(c1.job_id, third);

    // A failed attempt with attempts left is retried: its slot stays taken, and the retry is
    // assigned although the table is full.
    fake.send_result(
        retries,
        b1.lease_id,
        AttemptOutcome::Failed {
            permanent: false,
            error: "boom".into(),
        },
    )
    .await;
    assert!(fake.expect_ack(b1.lease_id).await);
    assert_eq!(rejected(try_submit(&client, "x").await), (2, 2));
    let b2 = fake.expect_assign().await;
    assert_eq!((b2.job_id, b2.attempt.0), (retries, 2));
    assert_eq!(rejected(try_submit(&client, "x").await), (2, 2));

    // The final attempt fails: permanent failure frees one slot.
    fake.send_result(
        retries,
        b2.lease_id,
        AttemptOutcome::Failed {
            permanent: false,
            error: "boom again".into(),
        },
    )
    .await;
    assert!(fake.expect_ack(b2.lease_id).await);
    let failed = wait_terminal(&client, retries).await;
    assert_eq!(
        (failed.state, failed.attempt),
        (JobState::Failed, 2),
        "{failed:?}"
    );
    let fourth = submit(
        &client,
        TaskSpec::Sleep {
            milliseconds: 60_000,
        },
    )
    .await;
    assert_eq!(rejected(try_submit(&client, "x").await), (2, 2));

    // Cancelling a job that is already terminal frees nothing...
    let (_, cancelled) = client.cancel(completes).await.expect("cancel terminal");
    assert!(!cancelled);
    assert_eq!(rejected(try_submit(&client, "x").await), (2, 2));
    // ...cancelling an active one frees exactly one.
    let (view, cancelled) = client.cancel(fourth).await.expect("cancel active");
    assert!(cancelled);
    assert_eq!(view.state, JobState::Cancelled);
    let fifth = submit(&client, TaskSpec::Sha256 { text: "e".into() }).await;
    assert_eq!(rejected(try_submit(&client, "x").await), (2, 2));

    let active: BTreeSet<_> = client
        .list(None, None)
        .await
        .expect("list")
        .into_iter()
        .filter(|j| !j.state.is_terminal())
        .map(|j| j.id)
        .collect();
    assert_eq!(active, BTreeSet::from([third, fifth]));

    coordinator.shutdown().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_racing_clients_are_admitted_exactly_up_to_the_limit() {
    let dir = TestDir::new("admit-race");
    let coordinator = start_coordinator(limited(5), dir.path()).await;
    let clients: Vec<HerderClient> = (0..8).map(|_| client(coordinator.client_addr())).collect();
    // Connect everyone first, so the submissions race on the coordinator rather than on connects.
    for c in &clients {
        c.workers().await.expect("connect");
    }

    let mut tasks = Vec::new();
    for (n, c) in clients.iter().enumerate() {
        for k in 0..2 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                try_submit(&c, &format!("race-{n}-{k}")).await
            }));
        }
    }
    let mut accepted = BTreeSet::new();
    let mut refused = 0;
    for task in tasks {
        match task.await.expect("submitter task") {
            Ok(submitted) => {
                assert!(!submitted.existing);
                accepted.insert(submitted.job_id);
            }
            other => {
                let (_, limit) = rejected(other);
                assert_eq!(limit, 5);
                refused += 1;
            }
        }
    }
    assert_eq!(accepted.len(), 5, "exactly the limit is admitted");
    assert_eq!(refused, 11);
    let listed: BTreeSet<_> = clients[0]
        .list(None, None)
        .await
        .expect("list")
        .into_iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(listed, accepted, "exactly the admitted jobs exist");
    assert_eq!(rejected(try_submit(&clients[3], "late").await), (5, 5));

    coordinator.shutdown().await.expect("clean shutdown");
}

/// After a restart with a lower limit the recovered jobs all run to completion; new work is
/// refused until the active count drops below the new limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_count_above_a_lowered_limit_drains_normally() {
    let dir = TestDir::new("admit-lowered");
    let first = start_coordinator(limited(5), dir.path()).await;
    let (worker_addr, client_addr) = (first.worker_addr(), first.client_addr());
    let client1 = client(client_addr);
    let mut recovered = Vec::new();
    for n in 0..4 {
        recovered.push(
            submit(
                &client1,
                TaskSpec::Sha256 {
                    text: format!("old-{n}"),
                },
            )
            .await,
        );
    }
    first.shutdown().await.expect("clean shutdown");

    let second = restart_coordinator(limited(2), dir.path(), worker_addr, client_addr).await;
    let client2 = client(client_addr);
    assert_eq!(rejected(try_submit(&client2, "new").await), (4, 2));

    // Complete the recovered jobs one at a time and watch the count.
    let mut fake = FakeWorker::start(worker_addr, "drain", 1).await;
    let mut completed = BTreeSet::new();
    completed.insert(complete_next(&mut fake).await);
    assert_eq!(rejected(try_submit(&client2, "new").await), (3, 2));
    completed.insert(complete_next(&mut fake).await);
    assert_eq!(rejected(try_submit(&client2, "new").await), (2, 2));
    completed.insert(complete_next(&mut fake).await);
    // Below the new limit at last.
    let fresh = try_submit(&client2, "new")
        .await
        .expect("below the lowered limit")
        .job_id;
    assert_eq!(rejected(try_submit(&client2, "newer").await), (2, 2));
    completed.insert(complete_next(&mut fake).await);
    completed.insert(complete_next(&mut fake).await);

    let mut all = recovered.clone();
    all.push(fresh);
    assert_eq!(completed, all.iter().copied().collect::<BTreeSet<_>>());
    for job_id in all {
        let job = wait_terminal(&client2, job_id).await;
        assert_eq!(job.state, JobState::Completed, "{job:?}");
    }

    second.shutdown().await.expect("clean shutdown");
}

/// Same key + same spec is the same job, for the job's whole life and across a restart; the
/// same key with a different spec is a conflict that creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_names_one_job_for_its_whole_life() {
    let dir = TestDir::new("idempotency");
    let first = start_coordinator(fast_config(), dir.path()).await;
    let (worker_addr, client_addr) = (first.worker_addr(), first.client_addr());
    let client1 = client(client_addr);
    let task = TaskSpec::Sha256 { text: "abc".into() };

    let original = client1
        .submit(&task, keyed("order-42", None))
        .await
        .expect("first submission");
    assert!(!original.existing);
    let again = client1
        .submit(&task, keyed("order-42", None))
        .await
        .expect("replay");
    assert_eq!(
        again,
        Submitted {
            job_id: original.job_id,
            existing: true
        }
    );

    let conflicts = [
        (TaskSpec::Sha256 { text: "abd".into() }, None),
        (TaskSpec::WordCount { text: "abc".into() }, None),
        (task.clone(), Some(7)),
    ];
    for (other, max_attempts) in &conflicts {
        match client1
            .submit(other, keyed("order-42", *max_attempts))
            .await
        {
            Err(CallError::Client(ClientError::Server {
                code: ErrorCode::IdempotencyConflict,
                ..
            })) => {}
            result => panic!(
                "expected IDEMPOTENCY_CONFLICT for {other:?}/{max_attempts:?}, got {result:?}"
            ),
        }
    }
    assert_eq!(job_count(&client1).await, 1, "conflicts create nothing");
    let job = status(&client1, original.job_id).await;
    assert_eq!(
        (job.state, job.task.clone()),
        (JobState::Queued, task.clone()),
        "left untouched"
    );

    first.shutdown().await.expect("clean shutdown");
    let second = restart_coordinator(fast_config(), dir.path(), worker_addr, client_addr).await;
    let client2 = client(client_addr);
    let after_restart = client2
        .submit(&task, keyed("order-42", None))
        .await
        .expect("replay after restart");
    assert_eq!(
        after_restart,
        Submitted {
            job_id: original.job_id,
            existing: true
        }
    );

    let worker = start_worker("worker-1", 1, worker_addr);
    let done = wait_terminal(&client2, original.job_id).await;
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.idempotency_key.as_deref(), Some("order-42"));

    // Terminal: the key still names the job, which is not run again.
    let terminal = client2
        .submit(&task, keyed("order-42", None))
        .await
        .expect("replay of a terminal job");
    assert_eq!(
        terminal,
        Submitted {
            job_id: original.job_id,
            existing: true
        }
    );
    match client2
        .submit(
            &TaskSpec::Sha256 { text: "zzz".into() },
            keyed("order-42", None),
        )
        .await
    {
        Err(CallError::Client(ClientError::Server {
            code: ErrorCode::IdempotencyConflict,
            ..
        })) => {}
        result => panic!("expected IDEMPOTENCY_CONFLICT, got {result:?}"),
    }
    let job = status(&client2, original.job_id).await;
    assert_eq!(job, done, "the terminal job is unchanged");
    assert_eq!(job.attempt, 1);
    assert_eq!(job_count(&client2).await, 1);

    worker.shutdown().await;
    second.shutdown().await.expect("clean shutdown");
}

/// Keys are checked before admission: a known key is answered even when the table is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_key_is_answered_even_at_the_admission_limit() {
    let dir = TestDir::new("idempotency-full");
    let coordinator = start_coordinator(limited(1), dir.path()).await;
    let client = client(coordinator.client_addr());
    let task = TaskSpec::Sleep {
        milliseconds: 60_000,
    };

    let original = client
        .submit(&task, keyed("k-1", Some(2)))
        .await
        .expect("admitted");
    assert_eq!(rejected(try_submit(&client, "unkeyed").await), (1, 1));
    let replay = client
        .submit(&task, keyed("k-1", Some(2)))
        .await
        .expect("known key at the limit");
    assert_eq!(
        replay,
        Submitted {
            job_id: original.job_id,
            existing: true
        }
    );
    match client.submit(&task, keyed("k-1", Some(3))).await {
        Err(CallError::Client(ClientError::Server {
            code: ErrorCode::IdempotencyConflict,
            ..
        })) => {}
        result => panic!("expected IDEMPOTENCY_CONFLICT, got {result:?}"),
    }
    assert_eq!(
        rejected(client.submit(&task, keyed("k-2", Some(2))).await),
        (1, 1)
    );
    assert_eq!(job_count(&client).await, 1);

    coordinator.shutdown().await.expect("clean shutdown");
}
