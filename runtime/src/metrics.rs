//! A coordinator's metrics, in the Prometheus text format.
//!
//! Counters and histograms follow the core's events as the driver performs them (so they count
//! what this member did, from when its process started, as Prometheus counters do); the store
//! thread times each group commit. Gauges (jobs by state, the consensus indices, each worker's
//! heartbeat age) are read from the coordinator when a scrape asks, as an [`Observation`] the
//! driver takes between two inputs, so they are never stale and cost nothing between scrapes.

use std::sync::Mutex;
use std::time::Duration;

use herder_core::coordinator::Event;
use herder_core::job::{AttemptEnd, JobState};
use herder_core::protocol::QueueView;
use herder_core::queues::HeldBack;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Metric, Registry};

/// Workers a scrape reports one by one; beyond them only the totals (a registry can hold
/// thousands of worker ids, and a scrape must stay small).
pub const WORKERS_REPORTED_MAX: usize = 256;

/// What a scrape reads from the coordinator at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Jobs in each state, in `JobState::ALL` order.
    pub jobs_by_state: [u64; JobState::ALL.len()],
    pub term: u64,
    pub last_index: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    /// Whether this member leads (and has caught up): only a leader tracks workers.
    pub is_leader: bool,
    /// The member this one knows as leader (itself, if it leads), if any.
    pub leader: Option<String>,
    pub workers: Vec<WorkerObservation>,
    /// Every queue: its settings and jobs by state (only a leader's table is current).
    pub queues: Vec<QueueView>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerObservation {
    pub id: String,
    pub alive: bool,
    pub capacity: u32,
    pub running: u32,
    pub heartbeat_age: Duration,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLimitLabel {
    queue: String,
    limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueStateLabel {
    queue: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PortLabel {
    port: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WorkerLabel {
    worker: String,
}

/// Every metric a coordinator exports.
pub struct Metrics {
    registry: Registry,
    /// One scrape at a time sets the gauges and encodes.
    scrape: Mutex<()>,
    jobs: Family<StateLabel, Gauge>,
    /// `submissions{result=...}` and `jobs_finished{state=...}`, resolved once: the hot path
    /// adds to an atomic instead of looking a label up.
    accepted: Counter,
    rejected: Counter,
    assignments: Counter,
    retries: Family<CauseLabel, Counter>,
    rescued: Counter,
    completed: Counter,
    failed: Counter,
    cancelled: Counter,
    stale_results: Counter,
    auth_refusals: Family<PortLabel, Counter>,
    forbidden: Counter,
    lease_expiries: Counter,
    released: Counter,
    workers_lost: Counter,
    queue_wait: Histogram,
    run_time: Histogram,
    term: Gauge,
    last_index: Gauge,
    commit_index: Gauge,
    applied_index: Gauge,
    is_leader: Gauge,
    leader_changes: Counter,
    heartbeat_age: Family<WorkerLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    worker_running: Family<WorkerLabel, Gauge>,
    worker_capacity: Family<WorkerLabel, Gauge>,
    workers: Family<StateLabel, Gauge>,
    queue_jobs: Family<QueueStateLabel, Gauge>,
    queue_starts: Family<QueueLabel, Counter>,
    queue_paused: Family<QueueLabel, Gauge>,
    queue_weight: Family<QueueLabel, Gauge>,
    queue_oldest: Family<QueueLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    queue_limits: Family<QueueLimitLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    queue_limit_hits: Family<QueueLimitLabel, Counter>,
    commit_seconds: Histogram,
    commit_records: Histogram,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// A connection to `port` was refused for want of a valid credential.
    pub fn auth_refused(&self, port: crate::auth::Port) {
        self.auth_refusals
            .get_or_create(&PortLabel {
                port: port.as_str(),
            })
            .inc();
    }

    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("herder");
        let jobs: Family<StateLabel, Gauge> =
            registered(&mut registry, "jobs", "Jobs in the job table, by state");
        let submissions: Family<ResultLabel, Counter> = registered(&mut registry, "submissions", "Submissions that reached the log: accepted, replayed (an idempotency key matched) or rejected by admission control");
        let assignments: Counter =
            registered(&mut registry, "assignments", "Attempts started on a worker");
        let retries: Family<CauseLabel, Counter> = registered(
            &mut registry,
            "retries",
            "Failed attempts that will be retried, by how the attempt ended",
        );
        let rescued: Counter = registered(
            &mut registry,
            "jobs_rescued",
            "Jobs whose worker was lost mid-attempt and that will run again elsewhere",
        );
        let finished: Family<StateLabel, Counter> = registered(
            &mut registry,
            "jobs_finished",
            "Jobs that became terminal, by terminal state",
        );
        let stale_results: Counter = registered(
            &mut registry,
            "stale_results_rejected",
            "Results refused because their attempt's lease was no longer current",
        );
        let auth_refusals: Family<PortLabel, Counter> = registered(
            &mut registry,
            "auth_refusals",
            "Connections refused for want of a valid credential, by port",
        );
        let forbidden: Counter = registered(
            &mut registry,
            "requests_forbidden",
            "Client requests refused because the caller's token does not allow them",
        );
        let lease_expiries: Counter = registered(
            &mut registry,
            "lease_expiries",
            "Attempts whose deadline passed before a result came",
        );
        let released: Counter = registered(
            &mut registry,
            "attempts_released",
            "Attempts handed back unfinished by a draining worker (not charged)",
        );
        let workers_lost: Counter = registered(
            &mut registry,
            "workers_lost",
            "Workers declared lost (connection closed or heartbeats stopped)",
        );
        let queue_wait = histogram(&mut registry, "queue_wait_seconds", "How long a job waited for each attempt: from its submission, or from the end of its previous attempt", exponential_buckets(0.0005, 2.0, 20));
        let run_time = histogram(
            &mut registry,
            "run_seconds",
            "How long a successful attempt ran, from its assignment to its result",
            exponential_buckets(0.0005, 2.0, 20),
        );
        let term: Gauge = registered(
            &mut registry,
            "consensus_term",
            "The term this member is in",
        );
        let last_index: Gauge = registered(
            &mut registry,
            "last_log_index",
            "The last entry in this member's log",
        );
        let commit_index: Gauge = registered(
            &mut registry,
            "commit_index",
            "The last log entry this member knows is committed",
        );
        let applied_index: Gauge = registered(
            &mut registry,
            "applied_index",
            "The last log entry applied to this member's job table",
        );
        let is_leader: Gauge = registered(
            &mut registry,
            "is_leader",
            "1 while this member leads and has caught up with its term, else 0",
        );
        let leader_changes: Counter = registered(
            &mut registry,
            "leader_changes",
            "Times this member saw a new leader (itself elected, or another made itself known)",
        );
        let heartbeat_age: Family<WorkerLabel, Gauge<f64, std::sync::atomic::AtomicU64>> =
            registered(
                &mut registry,
                "worker_heartbeat_age_seconds",
                "Time since the leader last heard from each worker",
            );
        let worker_running: Family<WorkerLabel, Gauge> = registered(
            &mut registry,
            "worker_running",
            "Attempts each worker holds, running or waiting for a slot",
        );
        let worker_capacity: Family<WorkerLabel, Gauge> =
            registered(&mut registry, "worker_capacity", "Slots each worker offers");
        let workers: Family<StateLabel, Gauge> = registered(
            &mut registry,
            "workers",
            "Workers the leader knows, alive or lost",
        );
        let queue_jobs: Family<QueueStateLabel, Gauge> = registered(
            &mut registry,
            "queue_jobs",
            "Jobs of each queue in each state (queued is the queue's depth)",
        );
        let queue_starts: Family<QueueLabel, Counter> = registered(
            &mut registry,
            "queue_starts",
            "Attempts started from each queue while this member led (its rate is the queue's throughput)",
        );
        let queue_paused: Family<QueueLabel, Gauge> = registered(
            &mut registry,
            "queue_paused",
            "1 while a queue is paused (nothing new starts from it)",
        );
        let queue_weight: Family<QueueLabel, Gauge> = registered(
            &mut registry,
            "queue_weight",
            "Each queue's weight: its share of the workers against other busy queues",
        );
        let queue_oldest: Family<QueueLabel, Gauge<f64, std::sync::atomic::AtomicU64>> = registered(
            &mut registry,
            "queue_oldest_queued_seconds",
            "How long each queue's longest-waiting queued job has waited (0 when none waits)",
        );
        let queue_limits: Family<QueueLimitLabel, Gauge<f64, std::sync::atomic::AtomicU64>> =
            registered(
                &mut registry,
                "queue_limit",
                "Each limit a queue sets: concurrency, key_concurrency, max_active_jobs, and rate and key_rate as starts per second (absent: no limit)",
            );
        let queue_limit_hits: Family<QueueLimitLabel, Counter> = registered(
            &mut registry,
            "queue_limit_hits",
            "Times a queue's limit began holding its work back while this member led (concurrency, key_concurrency, rate, key_rate), and submissions its max_active_jobs refused",
        );
        let commit_seconds = histogram(
            &mut registry,
            "storage_commit_seconds",
            "Time one group commit to SQLite took (write and fsync)",
            exponential_buckets(0.000_1, 2.0, 16),
        );
        let commit_records = histogram(
            &mut registry,
            "storage_batch_records",
            "Records (log entries, job rows, metadata) one group commit wrote",
            exponential_buckets(1.0, 2.0, 14),
        );
        // Every label value known in advance is reported from the start, at 0, so a fresh
        // coordinator's scrape already lists every family and a rate starts from zero.
        let submitted = |result| submissions.get_or_create(&ResultLabel { result }).clone();
        let finished_as = |state: JobState| {
            finished
                .get_or_create(&StateLabel {
                    state: state.as_str(),
                })
                .clone()
        };
        for end in [
            AttemptEnd::TaskFailed,
            AttemptEnd::WorkerLost,
            AttemptEnd::DeadlineExpired,
        ] {
            let _ = retries.get_or_create(&CauseLabel {
                cause: end.as_str(),
            });
        }
        Metrics {
            registry,
            scrape: Mutex::new(()),
            jobs,
            accepted: submitted("accepted"),
            rejected: submitted("rejected"),
            assignments,
            retries,
            rescued,
            completed: finished_as(JobState::Completed),
            failed: finished_as(JobState::Failed),
            cancelled: finished_as(JobState::Cancelled),
            stale_results,
            auth_refusals,
            forbidden,
            lease_expiries,
            released,
            workers_lost,
            queue_wait,
            run_time,
            term,
            last_index,
            commit_index,
            applied_index,
            is_leader,
            leader_changes,
            heartbeat_age,
            worker_running,
            worker_capacity,
            workers,
            queue_jobs,
            queue_starts,
            queue_paused,
            queue_weight,
            queue_oldest,
            queue_limits,
            queue_limit_hits,
            commit_seconds,
            commit_records,
        }
    }

    /// Counts what one event says happened.
    pub fn event(&self, event: &Event) {
        match event {
            Event::JobSubmitted { .. } => {
                self.accepted.inc();
            }
            Event::SubmitRejected { .. } => {
                self.rejected.inc();
            }
            Event::QueueSubmitRejected { queue, .. } => {
                self.rejected.inc();
                self.limit_hit(queue, "max_active_jobs");
            }
            Event::QueueHeldBack { queue, rule } if *rule != HeldBack::Paused => {
                self.limit_hit(queue, rule.label());
            }
            Event::JobAssigned {
                queued_millis,
                queue,
                ..
            } => {
                self.assignments.inc();
                self.queue_starts
                    .get_or_create(&QueueLabel {
                        queue: queue.clone(),
                    })
                    .inc();
                if let Some(ms) = queued_millis {
                    self.queue_wait.observe(seconds(*ms));
                }
            }
            Event::RetryScheduled { ended, .. } => {
                self.retries
                    .get_or_create(&CauseLabel {
                        cause: ended.as_str(),
                    })
                    .inc();
                if *ended == AttemptEnd::WorkerLost {
                    self.rescued.inc();
                }
            }
            Event::JobCompleted { ran_millis, .. } => {
                self.completed.inc();
                if let Some(ms) = ran_millis {
                    self.run_time.observe(seconds(*ms));
                }
            }
            Event::ParentCompleted { .. } => {
                self.completed.inc();
            }
            Event::JobFailed { .. } | Event::ParentFailed { .. } => {
                self.failed.inc();
            }
            Event::JobCancelled { .. } => {
                self.cancelled.inc();
            }
            Event::StaleResultRejected { .. } => {
                self.stale_results.inc();
            }
            Event::Forbidden { .. } => {
                self.forbidden.inc();
            }
            Event::LeaseExpired { .. } => {
                self.lease_expiries.inc();
            }
            Event::AttemptReleased { .. } => {
                self.released.inc();
            }
            Event::WorkerLost { .. } => {
                self.workers_lost.inc();
            }
            Event::LeaderElected { .. } | Event::LeaderKnown { .. } => {
                self.leader_changes.inc();
            }
            _ => {}
        }
    }

    fn limit_hit(&self, queue: &str, limit: &'static str) {
        self.queue_limit_hits
            .get_or_create(&QueueLimitLabel {
                queue: queue.to_owned(),
                limit,
            })
            .inc();
    }

    /// One group commit: how long it took and how many records it wrote.
    pub fn storage_commit(&self, took: Duration, records: usize) {
        self.commit_seconds.observe(took.as_secs_f64());
        self.commit_records.observe(records as f64);
    }

    /// The metrics in the Prometheus text format, with the gauges set from `now`.
    pub fn encode(&self, now: &Observation) -> String {
        let _one_at_a_time = self
            .scrape
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (state, count) in JobState::ALL.iter().zip(now.jobs_by_state) {
            self.jobs
                .get_or_create(&StateLabel {
                    state: state.as_str(),
                })
                .set(saturating_i64(count));
        }
        self.term.set(saturating_i64(now.term));
        self.last_index.set(saturating_i64(now.last_index));
        self.commit_index.set(saturating_i64(now.commit_index));
        self.applied_index.set(saturating_i64(now.applied_index));
        self.is_leader.set(i64::from(now.is_leader));
        // Workers come and go: only those known now are reported.
        self.heartbeat_age.clear();
        self.worker_running.clear();
        self.worker_capacity.clear();
        let alive = now.workers.iter().filter(|w| w.alive).count();
        let counts = [("alive", alive), ("lost", now.workers.len() - alive)];
        for (state, count) in counts {
            self.workers
                .get_or_create(&StateLabel { state })
                .set(saturating_i64(count as u64));
        }
        for worker in now.workers.iter().take(WORKERS_REPORTED_MAX) {
            let label = WorkerLabel {
                worker: worker.id.clone(),
            };
            self.heartbeat_age
                .get_or_create(&label)
                .set(worker.heartbeat_age.as_secs_f64());
            self.worker_running
                .get_or_create(&label)
                .set(i64::from(worker.running));
            self.worker_capacity
                .get_or_create(&label)
                .set(i64::from(worker.capacity));
        }
        // Queues are created by jobs and kept (at most `QUEUES_MAX`): each one is reported.
        self.queue_jobs.clear();
        self.queue_paused.clear();
        self.queue_weight.clear();
        self.queue_oldest.clear();
        self.queue_limits.clear();
        for queue in &now.queues {
            let limits = [
                ("concurrency", queue.concurrency.map(f64::from)),
                ("key_concurrency", queue.key_concurrency.map(f64::from)),
                ("max_active_jobs", queue.max_active_jobs.map(|n| n as f64)),
                ("rate", queue.rate.map(per_second)),
                ("key_rate", queue.key_rate.map(per_second)),
            ];
            for (limit, value) in limits {
                if let Some(value) = value {
                    self.queue_limits
                        .get_or_create(&QueueLimitLabel {
                            queue: queue.name.clone(),
                            limit,
                        })
                        .set(value);
                }
            }
            let by_state = [
                ("queued", queue.queued),
                ("running", queue.running),
                ("retry_wait", queue.retry_wait),
                ("blocked", queue.blocked),
                ("scheduled", queue.scheduled),
            ];
            for (state, count) in by_state {
                self.queue_jobs
                    .get_or_create(&QueueStateLabel {
                        queue: queue.name.clone(),
                        state,
                    })
                    .set(saturating_i64(count));
            }
            let label = QueueLabel {
                queue: queue.name.clone(),
            };
            self.queue_paused
                .get_or_create(&label)
                .set(i64::from(queue.paused));
            self.queue_weight
                .get_or_create(&label)
                .set(i64::from(queue.weight));
            self.queue_oldest
                .get_or_create(&label)
                .set(seconds(queue.oldest_queued_millis.unwrap_or(0)));
        }
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut text, &self.registry);
        text
    }
}

/// A rate limit as starts per second.
fn per_second(rate: herder_core::queues::RateLimit) -> f64 {
    f64::from(rate.starts) * 1000.0 / rate.per_millis as f64
}

fn seconds(millis: u64) -> f64 {
    millis as f64 / 1000.0
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A new metric of type `M`, registered under `name` with `help`.
fn registered<M: Metric + Clone + Default>(registry: &mut Registry, name: &str, help: &str) -> M {
    let metric = M::default();
    registry.register(name, help, metric.clone());
    metric
}

/// A new histogram with `buckets`, registered under `name` with `help`.
fn histogram(
    registry: &mut Registry,
    name: &str,
    help: &str,
    buckets: impl Iterator<Item = f64>,
) -> Histogram {
    let histogram = Histogram::new(buckets);
    registry.register(name, help, histogram.clone());
    histogram
}

#[cfg(test)]
mod tests {
    use super::*;
    use herder_core::ids::{Attempt, JobId, LeaseId, WorkerId};
    use herder_core::queues::RateLimit;

    fn sample_line<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        text.lines().find(|line| line.starts_with(name))
    }

    #[test]
    fn events_move_the_counters_they_name() {
        let metrics = Metrics::new();
        let job_id: JobId = id(1);
        metrics.event(&Event::JobAssigned {
            job_id,
            worker: WorkerId("w1".into()),
            attempt: Attempt(1),
            max_attempts: 3,
            lease_id: id::<LeaseId>(2),
            queued_millis: Some(1500),
            queue: "emails".into(),
        });
        metrics.event(&Event::RetryScheduled {
            job_id,
            attempt: Attempt(1),
            max_attempts: 3,
            delay_millis: 10,
            cause: "worker w1 lost".into(),
            ended: AttemptEnd::WorkerLost,
        });
        metrics.event(&Event::RetryScheduled {
            job_id,
            attempt: Attempt(2),
            max_attempts: 3,
            delay_millis: 10,
            cause: "boom".into(),
            ended: AttemptEnd::TaskFailed,
        });
        for rule in HeldBack::ALL {
            metrics.event(&Event::QueueHeldBack {
                queue: "emails".into(),
                rule,
            });
        }
        metrics.event(&Event::QueueSubmitRejected {
            queue: "emails".into(),
            active_jobs: 5,
            max_active_jobs: 5,
        });
        let text = metrics.encode(&Observation::default());
        for limit in [
            "concurrency",
            "key_concurrency",
            "rate",
            "key_rate",
            "max_active_jobs",
        ] {
            let line =
                format!("herder_queue_limit_hits_total{{queue=\"emails\",limit=\"{limit}\"}} 1");
            assert!(text.contains(&line), "missing {line} in\n{text}");
        }
        assert!(
            !text.contains("limit=\"paused\""),
            "a pause is not a limit hit"
        );
        assert_eq!(
            sample_line(&text, "herder_assignments_total"),
            Some("herder_assignments_total 1")
        );
        assert!(text.contains("herder_retries_total{cause=\"worker_lost\"} 1"));
        assert!(text.contains("herder_retries_total{cause=\"task_failed\"} 1"));
        assert_eq!(
            sample_line(&text, "herder_jobs_rescued_total"),
            Some("herder_jobs_rescued_total 1"),
            "only the retry after a lost worker is a rescue"
        );
        assert!(text.contains("herder_queue_wait_seconds_count 1"));
        assert!(text.contains("herder_queue_wait_seconds_sum 1.5"));
        assert!(text.contains("herder_queue_starts_total{queue=\"emails\"} 1"));
    }

    #[test]
    fn a_fresh_scrape_lists_every_labelled_family_at_zero() {
        let text = Metrics::new().encode(&Observation::default());
        for line in [
            "herder_submissions_total{result=\"accepted\"} 0",
            "herder_submissions_total{result=\"rejected\"} 0",
            "herder_retries_total{cause=\"worker_lost\"} 0",
            "herder_retries_total{cause=\"deadline_expired\"} 0",
            "herder_jobs_finished_total{state=\"FAILED\"} 0",
            "herder_jobs{state=\"RETRY_WAIT\"} 0",
            "herder_workers{state=\"alive\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn gauges_show_the_observation_and_forget_workers_that_left() {
        let metrics = Metrics::new();
        let mut now = Observation {
            jobs_by_state: [0, 0, 4, 1, 0, 7, 0, 2],
            term: 3,
            last_index: 40,
            commit_index: 39,
            applied_index: 38,
            is_leader: true,
            leader: Some("c1".into()),
            workers: vec![WorkerObservation {
                id: "w1".into(),
                alive: true,
                capacity: 4,
                running: 1,
                heartbeat_age: Duration::from_millis(250),
            }],
            queues: vec![QueueView {
                name: "reports".into(),
                weight: 3,
                paused: true,
                aging_millis: 60_000,
                queued: 12,
                running: 2,
                retry_wait: 1,
                completed: 40,
                failed: 0,
                cancelled: 0,
                oldest_queued_millis: Some(2_500),
                concurrency: Some(4),
                key_concurrency: None,
                rate: Some(RateLimit {
                    starts: 30,
                    per_millis: 60_000,
                }),
                key_rate: Some(RateLimit {
                    starts: 2,
                    per_millis: 1_000,
                }),
                max_active_jobs: None,
                scheduled: 3,
                blocked: 0,
            }],
        };
        let text = metrics.encode(&now);
        assert!(text.contains("herder_jobs{state=\"QUEUED\"} 4"));
        assert!(text.contains("herder_jobs{state=\"COMPLETED\"} 7"));
        assert!(text.contains("herder_consensus_term 3"));
        assert!(text.contains("herder_commit_index 39"));
        assert!(text.contains("herder_worker_heartbeat_age_seconds{worker=\"w1\"} 0.25"));
        assert!(text.contains("herder_queue_jobs{queue=\"reports\",state=\"queued\"} 12"));
        assert!(text.contains("herder_queue_jobs{queue=\"reports\",state=\"running\"} 2"));
        assert!(text.contains("herder_queue_paused{queue=\"reports\"} 1"));
        assert!(text.contains("herder_queue_weight{queue=\"reports\"} 3"));
        assert!(text.contains("herder_queue_oldest_queued_seconds{queue=\"reports\"} 2.5"));
        assert!(text.contains("herder_queue_limit{queue=\"reports\",limit=\"concurrency\"} 4"));
        assert!(text.contains("herder_queue_limit{queue=\"reports\",limit=\"rate\"} 0.5"));
        assert!(text.contains("herder_queue_limit{queue=\"reports\",limit=\"key_rate\"} 2"));
        assert!(!text.contains("limit=\"key_concurrency\""), "{text}");
        now.workers.clear();
        now.queues.clear();
        let text = metrics.encode(&now);
        assert!(!text.contains("worker=\"w1\""), "{text}");
        assert!(!text.contains("queue=\"reports\""), "{text}");
    }

    fn id<T: std::str::FromStr>(n: u64) -> T
    where
        T::Err: std::fmt::Debug,
    {
        T::from_str(&format!("00000000-0000-4000-8000-{n:012}")).expect("a valid id")
    }
}
