//! Persistence plumbing of one member: the open batch, the batches handed to the driver and not
//! yet durable, and the lazily materialized job rows.
//!
//! ```text
//!   records (log entries, job rows) ──> open batch ──flush──> Output::Persist(batch)
//!                                                                   │ driver writes it
//!   durable(id) <── handle_persisted(id) ───────────────────────────┘
//!      └──> the last log index the durable batches carried
//! ```
//!
//! The log alone is enough to recover, so the materialized rows are written lazily: when enough
//! has piled up that recovery should not replay more, or once nothing has been written for
//! [`MATERIALIZE_QUIET`]. So under any steady load a job's row is written once, with
//! thousands of others, instead of at every transition. Not as soon as the disk is free: that
//! commit would hold the disk just when the next submission arrives, and at light load every
//! submission would wait behind the previous job's rows. Nor with every batch that goes out
//! while the disk is free: under load that is most batches, and each row would again be written
//! at every transition.

use std::collections::{BTreeSet, VecDeque};

use crate::ids::{JobId, LogIndex};
use crate::limits::{
    MATERIALIZE_DIRTY_JOBS_MAX, MATERIALIZE_LOG_ENTRIES_MAX, MATERIALIZE_QUIET,
    PERSIST_BATCH_RECORDS_MAX,
};
use crate::queues::KeyBucket;
use crate::replica::Replica;
use crate::storage::{BatchId, PersistBatch, Record};
use crate::table::JobTable;
use crate::time::Instant;

#[derive(Debug)]
pub(super) struct Persistence {
    open_batch: Vec<Record>,
    /// Job rows changed by apply and not yet handed out for persistence.
    dirty: BTreeSet<JobId>,
    /// Queue rows changed by apply and not yet handed out (as few as the queues).
    dirty_queues: BTreeSet<String>,
    /// Key buckets set or forgotten by apply and not yet handed out, by `(queue, key)` (at
    /// most one per start since the last write, plus those a limit set anew forgot).
    dirty_key_buckets: BTreeSet<(String, String)>,
    /// The applied index the last handed-out rows reflect.
    materialized: LogIndex,
    /// When the dirty rows are written by themselves if no batch carries them first.
    rows_due_at: Option<Instant>,
    next_batch: u64,
    /// Batches handed out and not yet durable: (id, consensus records up to and in it, entry
    /// bytes in it).
    in_flight: VecDeque<(BatchId, u64, u64)>,
    /// Encoded bytes of the log entries in the open batch.
    open_bytes: u64,
    /// Encoded bytes of the log entries in `in_flight`.
    in_flight_bytes: u64,
    /// Consensus records pushed so far (the replica's count of records taken, up to the last
    /// one pushed): what a batch closed now makes durable.
    consensus_records: u64,
}

impl Persistence {
    /// Nothing written yet; the rows on disk reflect every entry up to `materialized`.
    pub(super) fn new(materialized: LogIndex) -> Persistence {
        Persistence {
            open_batch: Vec::new(),
            dirty: BTreeSet::new(),
            dirty_queues: BTreeSet::new(),
            dirty_key_buckets: BTreeSet::new(),
            materialized,
            rows_due_at: None,
            next_batch: 1,
            in_flight: VecDeque::new(),
            open_bytes: 0,
            in_flight_bytes: 0,
            consensus_records: 0,
        }
    }

    /// Encoded bytes of the log entries handed out or about to be, and not yet durable.
    pub(super) fn unwritten_bytes(&self) -> u64 {
        self.open_bytes + self.in_flight_bytes
    }

    /// Adds the `number`-th consensus record taken from the replica to the open batch. Returns
    /// true when the batch is full and should be handed out now.
    pub(super) fn push(&mut self, record: Record, number: u64, entry_bytes: u64) -> bool {
        assert_eq!(
            number,
            self.consensus_records + 1,
            "consensus records are pushed one by one, in the order they were taken"
        );
        self.consensus_records = number;
        self.open_bytes += entry_bytes;
        self.open_batch.push(record);
        self.open_batch.len() >= PERSIST_BATCH_RECORDS_MAX
    }

    /// Job rows that apply changed; they are written with the next materialization.
    pub(super) fn mark_dirty(&mut self, jobs: impl IntoIterator<Item = JobId>) {
        self.dirty.extend(jobs);
    }

    /// Queue rows that apply changed; written with the next materialization, like job rows.
    pub(super) fn mark_queues_dirty(&mut self, queues: BTreeSet<String>) {
        if self.dirty_queues.is_empty() {
            self.dirty_queues = queues;
        } else {
            self.dirty_queues.extend(queues);
        }
    }

    /// Key buckets that apply set or forgot; written with the next materialization.
    pub(super) fn mark_key_buckets_dirty(&mut self, buckets: BTreeSet<(String, String)>) {
        if self.dirty_key_buckets.is_empty() {
            self.dirty_key_buckets = buckets;
        } else {
            self.dirty_key_buckets.extend(buckets);
        }
    }

    /// Closes the open batch (adding the materialized rows when due). `replica` says how far
    /// the log goes. The batch is tagged with the consensus records pushed so far, not with
    /// all those taken: a batch closed because it filled up in the middle of a take must not
    /// make the rest of that take look durable.
    pub(super) fn flush(
        &mut self,
        table: &JobTable,
        replica: &Replica,
        now: Instant,
    ) -> Option<PersistBatch> {
        let last_index = replica.last_index();
        // Nothing was written for the quiet interval, and nothing is being written now.
        let quiet = self.open_batch.is_empty()
            && self.in_flight.is_empty()
            && self.rows_due_at.is_some_and(|at| at <= now);
        let unmaterialized = last_index.0.saturating_sub(self.materialized.0);
        let due = self.dirty.len() >= MATERIALIZE_DIRTY_JOBS_MAX
            || unmaterialized >= MATERIALIZE_LOG_ENTRIES_MAX;
        let clean = self.dirty.is_empty()
            && self.dirty_queues.is_empty()
            && self.dirty_key_buckets.is_empty();
        let write_rows = !clean && (due || quiet);
        if clean || write_rows {
            self.rows_due_at = None;
        } else if !self.open_batch.is_empty() || self.rows_due_at.is_none() {
            // Every write from here on moves the quiet moment later.
            self.rows_due_at = Some(now.saturating_add(MATERIALIZE_QUIET));
        }
        if write_rows {
            for job_id in std::mem::take(&mut self.dirty) {
                // A dirty job the table no longer holds was purged.
                self.open_batch.push(match table.get(&job_id) {
                    Some(job) => Record::Job(Box::new(job.clone())),
                    None => Record::DeleteJob(job_id),
                });
            }
            for name in std::mem::take(&mut self.dirty_queues) {
                let Some(queue) = table.queue_state(&name) else {
                    panic!("queue {name:?} changed and the table does not hold it");
                };
                self.open_batch.push(Record::Queue(queue.clone()));
            }
            for (queue, key) in std::mem::take(&mut self.dirty_key_buckets) {
                // A dirty bucket the table no longer holds was forgotten.
                self.open_batch.push(match table.key_bucket(&queue, &key) {
                    Some(tat_micros) => Record::KeyBucket(KeyBucket {
                        queue,
                        key,
                        tat_micros,
                    }),
                    None => Record::DeleteKeyBucket { queue, key },
                });
            }
            let applied = table.applied_index();
            // The applied entry is always within the log (compaction stops at it).
            let term = replica.term_at(applied).unwrap_or_default();
            self.materialized = applied;
            self.open_batch.push(Record::Applied {
                index: applied,
                term,
            });
            // Recovery needs no entry the rows reflect; a follower that needs one from this
            // member's memory or, once compacted, gets the table instead.
            self.open_batch.push(Record::DiscardLogThrough(applied));
        }
        if self.open_batch.is_empty() {
            return None;
        }
        let id = BatchId(self.next_batch);
        self.next_batch += 1;
        debug_assert!(self.consensus_records <= replica.records_taken());
        let entry_bytes = std::mem::take(&mut self.open_bytes);
        self.in_flight_bytes += entry_bytes;
        self.in_flight
            .push_back((id, self.consensus_records, entry_bytes));
        Some(PersistBatch {
            id,
            records: std::mem::take(&mut self.open_batch),
            entry_bytes,
        })
    }

    /// When the dirty rows are next due by themselves: only while the disk is free, since a
    /// durable report calls for a flush anyway (and a deadline reported while a batch is in
    /// flight would be due and yet not acted on).
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        self.rows_due_at.filter(|_| self.in_flight.is_empty())
    }

    /// Every batch up to and including `batch` is durable: how many consensus records that
    /// makes durable, if any batch was newly acknowledged.
    pub(super) fn durable(&mut self, batch: BatchId, now: Instant) -> Option<u64> {
        let mut durable = None;
        while let Some(&(id, records, bytes)) = self.in_flight.front() {
            if id > batch {
                break;
            }
            self.in_flight.pop_front();
            self.in_flight_bytes -= bytes;
            durable = Some(records);
        }
        // The quiet moment is counted from when the disk went idle, not from when the last batch
        // was handed out: a commit slower than the interval would otherwise have the rows follow
        // it at once, just as the next submission arrives.
        if durable.is_some() && self.in_flight.is_empty() && self.rows_due_at.is_some() {
            self.rows_due_at = Some(now.saturating_add(MATERIALIZE_QUIET));
        }
        durable
    }

    /// The table was replaced by a snapshot through `index`: its rows are written by the
    /// snapshot record itself.
    pub(super) fn snapshot_installed(&mut self, index: LogIndex) {
        self.dirty.clear();
        self.dirty_queues.clear();
        self.dirty_key_buckets.clear();
        self.rows_due_at = None;
        self.materialized = index;
    }
}
