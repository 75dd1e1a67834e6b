//! What clients see of a job: the table's rows as the wire's job views.

use std::collections::BTreeMap;

use super::JobTable;
use crate::ids::JobId;
use crate::job::{Job, JobState};
use crate::limits::WAITING_SHOWN_MAX;
use crate::protocol::{JobView, PartitionView, PartitionsView, QueueView};
use crate::time::UnixMillis;

impl JobTable {
    /// What clients see of a job; a data-parallel parent's view lists its partitions.
    pub fn view(&self, job_id: &JobId) -> Option<JobView> {
        let job = self.jobs.get(job_id)?;
        let mut view = job.view();
        view.waited_on_by = self.dependents_of(job_id).take(WAITING_SHOWN_MAX).collect();
        if job.is_parent() {
            let pieces: Vec<PartitionView> = job
                .partitions
                .iter()
                .enumerate()
                .filter_map(|(index, id)| {
                    let part = self.jobs.get(id)?;
                    Some(PartitionView {
                        index: u32::try_from(index).unwrap_or(u32::MAX),
                        job_id: *id,
                        state: part.state,
                        attempt: part.attempt.0,
                        worker: part.last_worker.clone(),
                        result: part.result.clone(),
                    })
                })
                .collect();
            let done = pieces
                .iter()
                .filter(|p| p.state == JobState::Completed)
                .count();
            view.partitions = Some(PartitionsView {
                done: u32::try_from(done).unwrap_or(u32::MAX),
                total: u32::try_from(pieces.len()).unwrap_or(u32::MAX),
                pieces,
            });
        }
        Some(view)
    }
}

impl JobTable {
    /// Every queue as clients see it, at wall time `now`. Counts by state walk the table: this
    /// answers an operator's request, and is not on any scheduling path.
    pub fn queue_views(&self, now: UnixMillis) -> Vec<QueueView> {
        let mut counts: BTreeMap<&str, [u64; 8]> = BTreeMap::new();
        for job in self.jobs.values() {
            let slot = JobState::ALL
                .iter()
                .position(|s| *s == job.state)
                .unwrap_or_else(|| panic!("state {} is not among all states", job.state));
            counts.entry(job.queue.as_str()).or_default()[slot] += 1;
        }
        self.queues
            .values()
            .map(|queue| {
                let [blocked, scheduled, queued, running, retry_wait, completed, failed, cancelled] =
                    counts.get(queue.name.as_str()).copied().unwrap_or_default();
                QueueView {
                    name: queue.name.clone(),
                    weight: queue.settings.weight,
                    paused: queue.settings.paused,
                    aging_millis: queue.settings.aging_millis,
                    concurrency: queue.settings.concurrency,
                    key_concurrency: queue.settings.key_concurrency,
                    rate: queue.settings.rate,
                    key_rate: queue.settings.key_rate,
                    max_active_jobs: queue.settings.max_active_jobs,
                    blocked,
                    scheduled,
                    queued,
                    running,
                    retry_wait,
                    completed,
                    failed,
                    cancelled,
                    oldest_queued_millis: self
                        .queue
                        .oldest_in(&queue.name)
                        .map(|at| now.0.saturating_sub(at.0)),
                }
            })
            .collect()
    }

    /// One queue as clients see it.
    pub fn queue_view(&self, name: &str, now: UnixMillis) -> Option<QueueView> {
        self.queue_views(now).into_iter().find(|q| q.name == name)
    }
}

impl Job {
    /// What clients see of this row on its own (a parent's partitions are added by the table).
    pub fn view(&self) -> JobView {
        JobView {
            id: self.id,
            state: self.state,
            attempt: self.attempt.0,
            max_attempts: self.max_attempts,
            worker: self.last_worker.clone(),
            lease_id: self.lease.as_ref().map(|lease| lease.id),
            task: self.task.clone(),
            result: self.result.clone(),
            error: self.error.clone(),
            idempotency_key: self.idempotency_key.clone(),
            partition_of: self.partition_of,
            partitions: None,
            created_at_unix_ms: Some(self.created_at.0).filter(|&ms| ms != 0),
            finished_at_unix_ms: self.finished_at.map(|at| at.0).filter(|&ms| ms != 0),
            timeout_millis: self.timeout_millis,
            unserved: false,
            progress: None,
            first_started_at_unix_ms: self.first_started_at.map(|at| at.0).filter(|&ms| ms != 0),
            history: self.history.clone(),
            history_dropped: self.history_dropped,
            submitted_by: self.submitted_by.clone(),
            queue: self.queue.clone(),
            priority: self.priority,
            fairness_key: self.fairness_key.clone(),
            run_at_unix_ms: self.run_at.map(|at| at.0),
            retry_of: self.retry_of,
            after: self.after.clone(),
            after_any_outcome: self.after_any_outcome,
            waited_on_by: Vec::new(),
        }
    }
}
