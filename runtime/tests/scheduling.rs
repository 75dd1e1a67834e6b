//! A scheduling race: many concurrent clients, many workers, every attempt assigned once.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use herder_core::ids::JobId;
use herder_core::job::JobState;
use herder_core::tasks::{TaskOutput, TaskSpec};

/// 60 jobs from 4 concurrent clients over 5 fake workers that complete every assignment at
/// once: every job completes with the right result, and each (job, attempt) is assigned exactly
/// once across all workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_jobs_from_four_clients_over_five_workers_are_each_assigned_exactly_once() {
    let dir = TestDir::new("race");
    let coordinator = start_coordinator(fast_config(), dir.path()).await;
    let names = ["fast-1", "fast-2", "fast-3", "fast-4", "fast-5"];
    let mut fakes = Vec::new();
    for name in names {
        let fake = FakeWorker::start(coordinator.worker_addr(), name, 2).await;
        fake.set_auto_complete(true);
        fakes.push(fake);
    }
    let observer = client(coordinator.client_addr());
    wait_alive(&observer, &names).await;

    let mut submitters = Vec::new();
    for c in 0..4 {
        let client = client(coordinator.client_addr());
        submitters.push(tokio::spawn(async move {
            let submissions = (0..15).map(|i| {
                let client = client.clone();
                async move {
                    let text = format!("job-{c}-{i}");
                    let job_id = submit(&client, TaskSpec::Sha256 { text: text.clone() }).await;
                    (job_id, text)
                }
            });
            let mut jobs = Vec::new();
            for submission in submissions.collect::<Vec<_>>() {
                jobs.push(tokio::spawn(submission));
            }
            let mut submitted = Vec::new();
            for job in jobs {
                submitted.push(job.await.expect("submission task"));
            }
            let mut finished = Vec::new();
            for (job_id, text) in submitted {
                finished.push((wait_terminal(&client, job_id).await, text));
            }
            finished
        }));
    }
    let mut final_attempts: BTreeMap<JobId, u32> = BTreeMap::new();
    for submitter in submitters {
        for (job, text) in submitter.await.expect("client task") {
            assert_eq!(job.state, JobState::Completed, "{job:?}");
            assert_eq!(
                job.result,
                Some(TaskOutput::Sha256 {
                    hex: sha256_hex(&text)
                })
            );
            final_attempts.insert(job.id, job.attempt);
        }
    }
    assert_eq!(final_attempts.len(), 60, "60 distinct jobs");

    let mut assigned: BTreeMap<(JobId, u32), Vec<String>> = BTreeMap::new();
    for fake in &fakes {
        for a in fake.assignments() {
            assigned
                .entry((a.job_id, a.attempt.0))
                .or_default()
                .push(fake.id.to_string());
        }
    }
    let duplicated: Vec<_> = assigned.iter().filter(|(_, on)| on.len() != 1).collect();
    assert!(
        duplicated.is_empty(),
        "attempts assigned more than once: {duplicated:?}"
    );
    let assigned_jobs: BTreeSet<JobId> = assigned.keys().map(|(job, _)| *job).collect();
    assert_eq!(
        assigned_jobs,
        final_attempts.keys().copied().collect::<BTreeSet<_>>()
    );
    for (job_id, attempts) in &final_attempts {
        let count = assigned.keys().filter(|(j, _)| j == job_id).count();
        assert_eq!(
            count as u32, *attempts,
            "job {job_id}: one assignment per attempt"
        );
    }
    let used: BTreeSet<_> = assigned.values().flatten().collect();
    assert!(
        used.len() > 1,
        "the work was spread over several workers: {used:?}"
    );

    coordinator.shutdown().await.expect("clean shutdown");
}

/// A real worker with one slot that prefetches one more: it is seen holding two attempts, and
/// every job still completes on its first attempt (a waiting one is neither refused by the
/// worker nor timed out for its wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefetching_worker_holds_one_beyond_its_slot_and_every_job_completes_first_time() {
    let dir = TestDir::new("prefetch");
    let config = herder_core::coordinator::CoordinatorConfig {
        task_timeout: std::time::Duration::from_millis(1_500),
        ..fast_config()
    };
    let coordinator = start_coordinator(config, dir.path()).await;
    let mut worker_config = herder_core::worker::WorkerConfig::new(
        worker_id("prefetcher"),
        1,
        vec![coordinator.worker_addr().to_string()],
    );
    worker_config.prefetch = 1;
    let worker =
        herder_runtime::worker::start(herder_runtime::worker::WorkerOptions::new(worker_config))
            .expect("worker starts");
    let client = client(coordinator.client_addr());
    let seen = wait_alive(&client, &["prefetcher"]).await;
    assert_eq!(seen[0].prefetch, 1);
    // Each job takes most of a deadline, so one timed from its assignment while it waited
    // would expire before it ran.
    let mut jobs = Vec::new();
    for _ in 0..4 {
        jobs.push(submit(&client, TaskSpec::Sleep { milliseconds: 900 }).await);
    }
    wait_workers(&client, "the worker holding two attempts", |workers| {
        workers.iter().any(|w| w.running == 2)
    })
    .await;
    for job_id in jobs {
        let view = wait_terminal(&client, job_id).await;
        assert_eq!(view.state, JobState::Completed, "{view:?}");
        assert_eq!(view.attempt, 1, "{view:?}");
    }
    worker.shutdown().await;
    coordinator.shutdown().await.expect("clean shutdown");
}
