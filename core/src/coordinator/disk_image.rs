//! What a coordinator's disk holds, as an executable definition: applying a batch's [`Record`]s
//! to a [`DiskImage`] is exactly what a store must make durable, and [`DiskImage::durable_state`]
//! is what it must hand back at the next start. The runtime's SQLite store implements the same
//! meaning; the simulator and the tests use this image as their disk.

use std::collections::BTreeMap;

use super::{DurableState, HardState, Record, RecoveryError};
use crate::command::LogEntry;
use crate::ids::{JobId, LogIndex, Term};
use crate::job::Job;
use crate::queues::{KeyBucket, QueueState};
use crate::storage::TableRows;
use crate::table::JobTable;

/// The term and vote, job rows, the applied index and the log entries not yet discarded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskImage {
    pub hard_state: HardState,
    pub jobs: BTreeMap<JobId, Job>,
    pub queues: BTreeMap<String, QueueState>,
    /// Key buckets by `(queue, key)`.
    pub key_buckets: BTreeMap<(String, String), KeyBucket>,
    pub applied: LogIndex,
    pub applied_term: Term,
    pub log: BTreeMap<LogIndex, LogEntry>,
}

impl DiskImage {
    /// Makes one batch's records durable, in order.
    pub fn write(&mut self, records: &[Record]) {
        for record in records {
            match record {
                Record::HardState(hard_state) => self.hard_state = hard_state.clone(),
                Record::Log(entry) => {
                    self.log.insert(entry.index, LogEntry::clone(entry));
                }
                Record::TruncateLogAfter(index) => self.log.retain(|i, _| i <= index),
                Record::Job(job) => {
                    self.jobs.insert(job.id, Job::clone(job));
                }
                Record::DeleteJob(job_id) => {
                    self.jobs.remove(job_id);
                }
                Record::Applied { index, term } => {
                    self.applied = *index;
                    self.applied_term = *term;
                }
                Record::DiscardLogThrough(index) => self.log.retain(|i, _| i > index),
                Record::Queue(queue) => {
                    self.queues.insert(queue.name.clone(), queue.clone());
                }
                Record::KeyBucket(bucket) => {
                    let at = (bucket.queue.clone(), bucket.key.clone());
                    self.key_buckets.insert(at, bucket.clone());
                }
                Record::DeleteKeyBucket { queue, key } => {
                    self.key_buckets.remove(&(queue.clone(), key.clone()));
                }
                Record::Snapshot { index, term, rows } => {
                    self.jobs = rows.jobs.iter().map(|job| (job.id, job.clone())).collect();
                    self.queues = rows
                        .queues
                        .iter()
                        .map(|queue| (queue.name.clone(), queue.clone()))
                        .collect();
                    self.key_buckets = rows
                        .key_buckets
                        .iter()
                        .map(|b| ((b.queue.clone(), b.key.clone()), b.clone()))
                        .collect();
                    self.applied = *index;
                    self.applied_term = *term;
                    self.log.retain(|i, _| i > index);
                }
            }
        }
    }

    /// What a coordinator starting on this disk is given.
    pub fn durable_state(&self) -> DurableState {
        DurableState {
            hard_state: self.hard_state.clone(),
            jobs: self.jobs.values().cloned().collect(),
            queues: self.queues.values().cloned().collect(),
            key_buckets: self.key_buckets.values().cloned().collect(),
            applied: self.applied,
            applied_term: self.applied_term,
            log: self.log.values().cloned().collect(),
        }
    }

    /// The job table a recovery from this disk rebuilds: the rows, then the log beyond them.
    pub fn table(&self) -> Result<JobTable, RecoveryError> {
        self.table_through(LogIndex(u64::MAX))
    }

    /// The rows, then the log beyond them up to `through` (a member of a group applies entries
    /// beyond its rows only once they are known committed).
    pub fn table_through(&self, through: LogIndex) -> Result<JobTable, RecoveryError> {
        let rows = TableRows {
            jobs: self.jobs.values().cloned().collect(),
            queues: self.queues.values().cloned().collect(),
            key_buckets: self.key_buckets.values().cloned().collect(),
        };
        let mut table = JobTable::from_rows(rows, self.applied)?;
        if through <= self.applied {
            return Ok(table);
        }
        for (index, entry) in self.log.range(self.applied.next()..=through) {
            let expected = table.applied_index().next();
            if *index != expected {
                return Err(RecoveryError::LogGap {
                    expected,
                    found: *index,
                });
            }
            table.apply(*index, entry.at, &entry.command);
        }
        Ok(table)
    }
}
