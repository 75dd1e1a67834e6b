//! What a coordinator makes durable: the records of its disk, the batches they travel in, and
//! what it finds on its disk at start. Consensus writes log records, the coordinator writes the
//! materialized job rows; both go through the same batches, so one transaction orders them.

use crate::command::LogEntry;
use crate::ids::LogIndex;
use crate::job::Job;

/// Numbers persistence batches; `handle_persisted` acknowledges every batch up to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchId(pub u64);

/// One durable record. A batch's records must become durable atomically (one transaction).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// Append (or overwrite) a log entry.
    Log(LogEntry),
    /// Upsert a job row of the materialized table.
    Job(Job),
    /// The materialized job rows reflect every entry up to this index.
    Applied(LogIndex),
    /// Log entries up to this index are reflected in the job rows and may be deleted.
    DiscardLogThrough(LogIndex),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistBatch {
    pub id: BatchId,
    pub records: Vec<Record>,
}

/// What a coordinator finds on its disk at start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DurableState {
    /// The materialized job rows, reflecting every entry up to `applied`.
    pub jobs: Vec<Job>,
    pub applied: LogIndex,
    /// Log entries not yet discarded (those beyond `applied` are replayed).
    pub log: Vec<LogEntry>,
}
