//! Rebuilding a table from stored rows (a restart, or a snapshot from the leader).

use super::invariants::check_row;
use super::{JobTable, ScopedKey, TableError};
use crate::ids::LogIndex;
use crate::job::JobState;
use crate::queues::{check_queue_name, QueueSettings, QueueState};
use crate::storage::TableRows;
use crate::time::UnixMillis;

impl JobTable {
    /// Rebuilds a table from persisted rows (the state after applying `applied`).
    /// Every derived index (queue, idempotency keys, the admission counter) is recomputed from the
    /// rows, so nothing derived can disagree with what was stored. A job naming a queue without
    /// a row (written before queues had rows: `default`) gets that queue with the default
    /// settings at pass 0, as the first job of a queue creates it when applied.
    pub fn from_rows(rows: TableRows, applied: LogIndex) -> Result<JobTable, TableError> {
        let TableRows {
            jobs: rows,
            queues,
            key_buckets,
        } = rows;
        let mut table = JobTable {
            applied,
            ..JobTable::default()
        };
        for queue in queues {
            if let Err(detail) = check_queue_name(&queue.name) {
                return Err(TableError::InconsistentQueue {
                    queue: queue.name,
                    detail,
                });
            }
            if table.queues.contains_key(&queue.name) {
                return Err(TableError::InconsistentQueue {
                    queue: queue.name,
                    detail: "it appears twice".to_owned(),
                });
            }
            table.queues.insert(queue.name.clone(), queue);
        }
        for job in &rows {
            if !table.queues.contains_key(&job.queue) {
                table.queues.insert(
                    job.queue.clone(),
                    QueueState {
                        name: job.queue.clone(),
                        settings: QueueSettings::default(),
                        pass: 0,
                        rate_tat_micros: 0,
                        key_clock_micros: 0,
                    },
                );
            }
        }
        for job in rows {
            let id = job.id;
            check_row(&job).map_err(|detail| TableError::InconsistentJob { job_id: id, detail })?;
            if let Some(key) = ScopedKey::of(&job) {
                if let Some(&first) = table.idempotency.get(&key) {
                    return Err(TableError::DuplicateIdempotencyKey {
                        key: key.to_string(),
                        first,
                        second: id,
                    });
                }
                table.idempotency.insert(key, id);
            }
            if job.state == JobState::Queued
                && !table
                    .queue
                    .insert(job.queue_seq, id, &job.placement(), job.turn)
            {
                return Err(TableError::InconsistentJob {
                    job_id: id,
                    detail: format!("queue position {} is held by two jobs", job.queue_seq),
                });
            }
            if job.state == JobState::Scheduled {
                // `check_row` made sure a scheduled job has its time.
                let run_at = job.run_at.unwrap_or_default();
                if !table.scheduled.insert((run_at, id)) {
                    return Err(TableError::DuplicateJob(id));
                }
            }
            if !job.state.is_terminal() {
                table.active += 1;
            }
            if job.partition_of.is_none() {
                table.by_submission.insert(job.submitted_at, id);
                if job.state.is_terminal() {
                    table
                        .finished
                        .insert((job.finished_at.unwrap_or_default(), id));
                }
            }
            if table.jobs.insert(id, job).is_some() {
                return Err(TableError::DuplicateJob(id));
            }
        }
        // A parent and its partitions name each other.
        for job in table.jobs.values() {
            for (index, child) in job.partitions.iter().enumerate() {
                let named_back = table.jobs.get(child).and_then(|c| c.partition_of);
                if named_back.is_none_or(|of| of.parent != job.id || of.index as usize != index) {
                    return Err(TableError::InconsistentJob {
                        job_id: job.id,
                        detail: format!(
                            "partition {index} ({child}) is missing or does not name this job as its parent"
                        ),
                    });
                }
            }
            if let Some(of) = job.partition_of {
                let listed = table
                    .jobs
                    .get(&of.parent)
                    .and_then(|p| p.partitions.get(of.index as usize));
                if listed != Some(&job.id) {
                    return Err(TableError::InconsistentJob {
                        job_id: job.id,
                        detail: format!(
                            "a partition of {} (at {}) that its parent does not list",
                            of.parent, of.index
                        ),
                    });
                }
            }
        }
        // Who waits for whom: each blocked job for each job it names that has not ended.
        for job in table.jobs.values() {
            if job.state != JobState::Blocked {
                continue;
            }
            for parent in &job.after {
                if table
                    .jobs
                    .get(parent)
                    .is_some_and(|p| !p.state.is_terminal())
                {
                    table.dependents.entry(*parent).or_default().insert(job.id);
                }
            }
        }
        table.usage = super::QueueUsage::of_rows(table.jobs.values());
        for bucket in &key_buckets {
            if !table.key_buckets.load(bucket) {
                return Err(TableError::InconsistentKeyBuckets {
                    detail: format!(
                        "the bucket of key {:?} in queue {:?} appears twice",
                        bucket.key, bucket.queue
                    ),
                });
            }
            // A key out of tokens waits with its lanes parked, as in the live table.
            if let Some(until) =
                table.key_rate_due(&bucket.queue, Some(&bucket.key), 0, UnixMillis(0))
            {
                table.queue.park_key(&bucket.queue, &bucket.key, until);
            }
        }
        table
            .check_key_rates()
            .map_err(|detail| TableError::InconsistentKeyBuckets { detail })?;
        Ok(table)
    }
}
