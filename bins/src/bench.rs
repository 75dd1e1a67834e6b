//! `herder bench`: the load generator. N jobs over C independent connections; waits for
//! every accepted job to be terminal (or, with `--no-wait`, only for its acknowledgement);
//! reports throughput and latency percentiles. It never retries a rejection, so
//! accepted/rejected counts show raw admission shedding.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use herder_core::client::{ClientConfig, ClientError};
use herder_core::job::JobState;
use herder_core::limits::SUBMIT_BATCH_JOBS_MAX;
use herder_core::protocol::{JobSubmission, SubmitResult};
use herder_core::tasks::TaskSpec;
use herder_runtime::client::{CallError, HerderClient, SubmitOptions};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::cli::BenchArgs;
use crate::exit;
use crate::output::{report_error, usage_error};

/// What happened to one job.
enum Outcome {
    Terminal {
        ack: Duration,
        end_to_end: Duration,
        state: JobState,
    },
    /// Accepted, and not waited on (`--no-wait`).
    Acknowledged {
        ack: Duration,
    },
    Rejected {
        ack: Duration,
    },
    Error(CallError),
}

/// Jobs one connection has submitted and still waits on: the coordinator's default bound on
/// waits per connection, so that a queue that backs up slows the bench down instead of
/// failing its waits.
const WAITS_PER_CONNECTION: usize = herder_core::limits::WAITERS_PER_CONNECTION_DEFAULT;

#[derive(Default)]
struct Progress {
    done: AtomicU64,
}

pub async fn run(args: BenchArgs) -> u8 {
    let as_json = args.client.json;
    if args.jobs == 0 || args.concurrency == 0 || args.pipeline == 0 || args.batch == 0 {
        return usage_error(
            "--jobs, --concurrency, --pipeline and --batch must be at least 1",
            as_json,
        );
    }
    if args.batch as usize > SUBMIT_BATCH_JOBS_MAX {
        return usage_error(
            &format!("--batch is at most {SUBMIT_BATCH_JOBS_MAX}"),
            as_json,
        );
    }
    if args.rate == Some(0) {
        return usage_error("--rate must be at least 1 job per second", as_json);
    }
    if args.batch > 1 && args.pipeline > 1 {
        return usage_error(
            "with --batch, each connection sends one batch at a time; raise --concurrency for more in flight",
            as_json,
        );
    }
    let payload = match (args.task_json.as_deref(), args.task.as_str()) {
        (Some(raw), _) => match serde_json::from_str(raw) {
            Ok(task) => task,
            Err(error) => {
                return usage_error(&format!("--task-json is not valid JSON: {error}"), as_json)
            }
        },
        (None, task) => match task {
        "sleep" => json!({"kind": "sleep", "milliseconds": args.milliseconds}),
        "word-count" => json!({"kind": "word-count", "text": args.text}),
        "sha256" => json!({"kind": "sha256", "text": args.text}),
        "prime-count" => json!({"kind": "prime-count", "limit": args.limit}),
        "fail" => json!({"kind": "fail", "fail_until_attempt": args.fail_until_attempt}),
        other => {
            return usage_error(
                &format!(
                    "unknown task {other:?}; use sleep, word-count, sha256, prime-count or fail, or --task-json"
                ),
                as_json,
            )
        }
        },
    };
    let task = match TaskSpec::from_json(&payload) {
        Ok(task) => task,
        Err(error) => return usage_error(&error.to_string(), as_json),
    };

    let progress = Arc::new(Progress::default());
    let ticker = std::io::stderr()
        .is_terminal()
        .then(|| spawn_progress_bar(progress.clone(), args.jobs));
    let started = Instant::now();
    let mut connections = JoinSet::new();
    let mut first_job = 0;
    for c in 0..u64::from(args.concurrency) {
        let share = args.jobs / u64::from(args.concurrency)
            + u64::from(c < args.jobs % u64::from(args.concurrency));
        let client = crate::verbs::new_client(
            &args.client,
            ClientConfig::new(args.client.coordinator.clone()),
        );
        let task = task.clone();
        let progress = progress.clone();
        // Paced: this connection's jobs one interval apart, the connections staggered.
        let pace = args.rate.map(|rate| {
            let interval = Duration::from_secs_f64(f64::from(args.concurrency) / f64::from(rate));
            let offset = Duration::from_secs_f64(c as f64 / f64::from(rate));
            (started + offset, interval)
        });
        let load = Load {
            jobs: share,
            pipeline: args.pipeline as usize,
            batch: args.batch as usize,
            max_attempts: args.max_attempts,
            pace,
            wait: !args.no_wait,
            spread: Spread {
                queues: args.queues,
                keys: args.fairness_keys,
            },
            first_job,
        };
        first_job += share;
        connections.spawn(async move { run_connection(client, task, load, progress).await });
    }
    let mut outcomes = Vec::new();
    while let Some(joined) = connections.join_next().await {
        if let Ok(mut part) = joined {
            outcomes.append(&mut part);
        }
    }
    let elapsed = started.elapsed();
    if let Some(ticker) = ticker {
        ticker.abort();
        eprintln!();
    }
    summarize(&args, &outcomes, elapsed)
}

/// The task's kind, as the JSON summary names it.
fn task_label(args: &BenchArgs) -> String {
    args.task_json
        .as_deref()
        .and_then(|raw| serde_json::from_str::<serde_json::Value>(raw).ok())
        .and_then(|task| task.get("kind").and_then(|k| k.as_str()).map(str::to_owned))
        .unwrap_or_else(|| args.task.clone())
}

/// What one connection sends.
struct Load {
    jobs: u64,
    /// `SUBMIT`s in flight (with `batch` > 1, one `SUBMIT_BATCH` at a time).
    pipeline: usize,
    batch: usize,
    max_attempts: Option<u32>,
    /// When the first job is due, and the interval between jobs: submit on that schedule
    /// instead of as fast as the pipeline allows.
    pace: Option<(Instant, Duration)>,
    /// Wait for each accepted job to be terminal (otherwise it counts once acknowledged).
    wait: bool,
    /// Where the jobs go, and the number of this connection's first job (jobs are numbered
    /// across connections, so the spread covers every queue and key).
    spread: Spread,
    first_job: u64,
}

/// Jobs spread round-robin over `queues` queues (`bench-0`, `bench-1`, ...) and `keys`
/// fairness keys (`tenant-0`, ...); 0 queues is the default queue, 0 keys no key.
#[derive(Clone, Copy, Debug)]
struct Spread {
    queues: u32,
    keys: u32,
}

impl Spread {
    fn place(self, job: u64, submission: &mut JobSubmission) {
        submission.queue =
            (self.queues > 0).then(|| format!("bench-{}", job % u64::from(self.queues)));
        submission.fairness_key =
            (self.keys > 0).then(|| format!("tenant-{}", job % u64::from(self.keys)));
    }
}

async fn run_connection(
    client: HerderClient,
    task: TaskSpec,
    load: Load,
    progress: Arc<Progress>,
) -> Vec<Outcome> {
    if load.batch > 1 {
        return run_batches(client, task, load, progress).await;
    }
    let Load {
        jobs,
        pipeline,
        max_attempts,
        pace,
        wait,
        ..
    } = load;
    // Paced, a submission never waits for the one before it.
    let in_flight = Arc::new(Semaphore::new(if pace.is_some() {
        WAITS_PER_CONNECTION
    } else {
        pipeline
    }));
    let waiting = Arc::new(Semaphore::new(WAITS_PER_CONNECTION));
    let mut jobs_set = JoinSet::new();
    for i in 0..jobs {
        if let Some((first, interval)) = pace {
            tokio::time::sleep_until((first + interval.mul_f64(i as f64)).into()).await;
        }
        // A job holds its wait slot from submission until it is terminal.
        let Ok(wait_slot) = waiting.clone().acquire_owned().await else {
            break;
        };
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            break;
        };
        let client = client.clone();
        let task = task.clone();
        let progress = progress.clone();
        let mut placed = JobSubmission::default();
        load.spread.place(load.first_job + i, &mut placed);
        jobs_set.spawn(async move {
            let t0 = Instant::now();
            let options = SubmitOptions {
                timeout_millis: None,
                partitions: None,
                max_attempts,
                idempotency_key: None,
                fairness_key: placed.fairness_key,
                priority: None,
                queue: placed.queue,
                delay_millis: None,
                run_at_unix_ms: None,
                retry_of: None,
                after: Vec::new(),
                after_any_outcome: false,
            };
            let submitted = client.submit(&task, options).await;
            let ack = t0.elapsed();
            drop(permit);
            let outcome = match submitted {
                Ok(_) if !wait => Outcome::Acknowledged { ack },
                Ok(job) => match client.wait(job.job_id, None).await {
                    Ok((view, _)) => Outcome::Terminal {
                        ack,
                        end_to_end: t0.elapsed(),
                        state: view.state,
                    },
                    Err(error) => Outcome::Error(error),
                },
                Err(CallError::Client(ClientError::Rejected { .. })) => Outcome::Rejected { ack },
                Err(error) => Outcome::Error(error),
            };
            drop(wait_slot);
            progress.done.fetch_add(1, Ordering::Relaxed);
            outcome
        });
    }
    let mut outcomes = Vec::with_capacity(jobs as usize);
    while let Some(joined) = jobs_set.join_next().await {
        if let Ok(outcome) = joined {
            outcomes.push(outcome);
        }
    }
    outcomes
}

/// The connection's jobs in `SUBMIT_BATCH`es of `load.batch`, one batch at a time: each batch
/// is sent, then every accepted job of it waited on (unless `load.wait` is off), then the next
/// is sent (more batches in flight means more connections). A job's acknowledgement is its
/// batch's, and its end to end runs from its batch's sending.
async fn run_batches(
    client: HerderClient,
    task: TaskSpec,
    load: Load,
    progress: Arc<Progress>,
) -> Vec<Outcome> {
    let submission = JobSubmission {
        task: task.to_json(),
        max_attempts: load.max_attempts,
        idempotency_key: None,
        partitions: None,
        timeout_millis: None,
        fairness_key: None,
        priority: None,
        queue: None,
        delay_millis: None,
        run_at_unix_ms: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    };
    let mut outcomes = Vec::with_capacity(load.jobs as usize);
    let mut left = load.jobs as usize;
    let mut next = load.first_job;
    while left > 0 {
        let size = left.min(load.batch);
        left -= size;
        let batch: Vec<JobSubmission> = (0..size as u64)
            .map(|k| {
                let mut job = submission.clone();
                load.spread.place(next + k, &mut job);
                job
            })
            .collect();
        next += size as u64;
        let t0 = Instant::now();
        let submitted = client.submit_batch(batch).await;
        let ack = t0.elapsed();
        let results = match submitted {
            Ok(results) => results,
            Err(error) => {
                outcomes.push(Outcome::Error(error));
                progress.done.fetch_add(size as u64, Ordering::Relaxed);
                continue;
            }
        };
        let mut waits = JoinSet::new();
        for result in results {
            match result {
                SubmitResult::Accepted { .. } if !load.wait => {
                    outcomes.push(Outcome::Acknowledged { ack })
                }
                SubmitResult::Accepted { job_id, .. } => {
                    let client = client.clone();
                    waits.spawn(async move {
                        match client.wait(job_id, None).await {
                            Ok((view, _)) => Outcome::Terminal {
                                ack,
                                end_to_end: t0.elapsed(),
                                state: view.state,
                            },
                            Err(error) => Outcome::Error(error),
                        }
                    });
                }
                SubmitResult::Rejected { .. } => outcomes.push(Outcome::Rejected { ack }),
                SubmitResult::Error { code, message } => {
                    outcomes.push(Outcome::Error(CallError::Client(ClientError::Server {
                        code,
                        message,
                    })))
                }
            }
        }
        while let Some(joined) = waits.join_next().await {
            if let Ok(outcome) = joined {
                outcomes.push(outcome);
            }
        }
        progress.done.fetch_add(size as u64, Ordering::Relaxed);
    }
    outcomes
}

fn spawn_progress_bar(progress: Arc<Progress>, total: u64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let width = 40u64;
        loop {
            let done = progress.done.load(Ordering::Relaxed).min(total);
            let filled = (done * width / total.max(1)) as usize;
            eprint!(
                "\r[{}{}] {done}/{total} jobs settled",
                "#".repeat(filled),
                " ".repeat(width as usize - filled)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Nearest-rank percentile in milliseconds.
fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    let index = rank.min(sorted.len()) - 1;
    sorted.get(index).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

fn summarize(args: &BenchArgs, outcomes: &[Outcome], elapsed: Duration) -> u8 {
    let mut acks = Vec::new();
    let mut end_to_end = Vec::new();
    let (mut completed, mut failed, mut cancelled, mut rejected) = (0u64, 0u64, 0u64, 0u64);
    let mut acknowledged = 0u64;
    let mut errors = Vec::new();
    for outcome in outcomes {
        match outcome {
            Outcome::Terminal {
                ack,
                end_to_end: e2e,
                state,
            } => {
                acks.push(*ack);
                end_to_end.push(*e2e);
                match state {
                    JobState::Completed => completed += 1,
                    JobState::Failed => failed += 1,
                    _ => cancelled += 1,
                }
            }
            Outcome::Acknowledged { ack } => {
                acks.push(*ack);
                acknowledged += 1;
            }
            Outcome::Rejected { ack } => {
                acks.push(*ack);
                rejected += 1;
            }
            Outcome::Error(error) => errors.push(error),
        }
    }
    if !errors.is_empty() && errors.len() == outcomes.len() {
        return report_error(errors[0], args.client.json);
    }
    acks.sort();
    end_to_end.sort();
    // Not waited on (`--no-wait`): counted at their acknowledgement.
    let accepted = completed + failed + cancelled + acknowledged;
    let seconds = elapsed.as_secs_f64();
    let throughput = if seconds > 0.0 {
        accepted as f64 / seconds
    } else {
        0.0
    };
    let stats = |v: &[Duration]| json!({ "p50": percentile(v, 50.0), "p95": percentile(v, 95.0), "p99": percentile(v, 99.0) });
    if args.client.json {
        println!(
            "{}",
            json!({
                "jobs": args.jobs,
                "concurrency": args.concurrency,
                "pipeline": args.pipeline,
                "batch": args.batch,
                "rate": args.rate,
                "queues": args.queues,
                "fairness_keys": args.fairness_keys,
                "task": task_label(args),
                "accepted": accepted,
                "waited": !args.no_wait,
                "rejected": rejected,
                "errors": errors.len(),
                "completed": completed,
                "failed": failed,
                "cancelled": cancelled,
                "elapsed_seconds": seconds,
                "throughput_jobs_per_second": throughput,
                "submit_ack_millis": stats(&acks),
                "end_to_end_millis": stats(&end_to_end),
            })
        );
    } else {
        println!(
            "Jobs:            {} over {} connections (pipeline {}, batch {})",
            args.jobs, args.concurrency, args.pipeline, args.batch
        );
        println!(
            "Accepted:        {accepted}   rejected: {rejected}   errors: {}",
            errors.len()
        );
        println!("Terminal:        {completed} completed, {failed} failed, {cancelled} cancelled");
        println!("Elapsed:         {seconds:.3} s");
        let counted = if args.no_wait {
            "accepted jobs to their acknowledgement, not waited on"
        } else {
            "accepted jobs to terminal"
        };
        println!("Throughput:      {throughput:.1} jobs/s ({counted})");
        println!(
            "Submit ack:      p50 {:.2} ms   p95 {:.2} ms   p99 {:.2} ms",
            percentile(&acks, 50.0),
            percentile(&acks, 95.0),
            percentile(&acks, 99.0)
        );
        println!(
            "End to end:      p50 {:.2} ms   p95 {:.2} ms   p99 {:.2} ms",
            percentile(&end_to_end, 50.0),
            percentile(&end_to_end, 95.0),
            percentile(&end_to_end, 99.0)
        );
        if let Some(first) = errors.first() {
            eprintln!("herder: {} calls failed; first: {first}", errors.len());
        }
    }
    if accepted == 0 && rejected > 0 {
        if !args.client.json {
            eprintln!("herder: every submission was rejected by admission control");
        }
        return exit::REJECTED;
    }
    exit::OK
}
