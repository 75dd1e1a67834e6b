//! What a coordinator makes durable: the records of its disk, the batches they travel in, and
//! what it finds on its disk at start. Consensus writes log records, the coordinator writes the
//! materialized job rows; both go through the same batches, so one transaction orders them.

use serde::{Deserialize, Serialize};

use crate::command::LogEntry;
use crate::ids::{JobId, LogIndex, NodeId, Term};
use crate::job::Job;
use crate::queues::{KeyBucket, QueueState};

/// What a member must remember about elections across restarts (paper figure 2): the latest
/// term it has seen and whom it voted for in that term.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HardState {
    pub term: Term,
    pub voted_for: Option<NodeId>,
    /// The member started with an empty disk and has not yet rejoined its group: it must keep
    /// abstaining from elections after a restart too.
    #[serde(default)]
    pub abstaining: bool,
}

/// Numbers persistence batches; `handle_persisted` acknowledges every batch up to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchId(pub u64);

/// One durable record. A batch's records must become durable atomically (one transaction).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// The member's term and vote.
    HardState(HardState),
    /// Append (or overwrite) a log entry.
    Log(Box<LogEntry>),
    /// Delete every log entry after this index (a conflicting suffix from an old leader).
    TruncateLogAfter(LogIndex),
    /// Upsert a job row of the materialized table.
    Job(Box<Job>),
    /// Delete a job row (retention purged the job).
    DeleteJob(JobId),
    /// Upsert a queue row: its settings and its pass.
    Queue(QueueState),
    /// Upsert the rate bucket of a fairness key in its queue.
    KeyBucket(KeyBucket),
    /// Delete the rate bucket of `key` in `queue` (it refilled, or the limit was set anew).
    DeleteKeyBucket { queue: String, key: String },
    /// The materialized job rows reflect every entry up to `index`, whose term was `term`.
    Applied { index: LogIndex, term: Term },
    /// Log entries up to this index are reflected in the job rows and may be deleted.
    DiscardLogThrough(LogIndex),
    /// The whole job table, received from the leader, as of entry `index` of `term`: every job
    /// and queue row is replaced by `rows`, and the log up to `index` is discarded.
    Snapshot {
        index: LogIndex,
        term: Term,
        rows: TableRows,
    },
}

/// Every row of a job table: what a snapshot carries and what replaces a member's rows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRows {
    pub jobs: Vec<Job>,
    /// Queue rows (absent from a snapshot of a table that had none).
    #[serde(default)]
    pub queues: Vec<QueueState>,
    /// The rate buckets of fairness keys (absent from a snapshot of a table that had none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub key_buckets: Vec<KeyBucket>,
}

impl TableRows {
    /// Job rows alone (every queue they name with its default settings).
    pub fn of_jobs(jobs: Vec<Job>) -> TableRows {
        TableRows {
            jobs,
            ..TableRows::default()
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistBatch {
    pub id: BatchId,
    pub records: Vec<Record>,
    /// Encoded bytes of the log entries among `records`: what a driver bounds (with
    /// [`crate::coordinator::Coordinator::unwritten_bytes`]) to keep a slow disk from letting
    /// proposals pile up in memory.
    pub entry_bytes: u64,
}

/// What a coordinator finds on its disk at start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DurableState {
    pub hard_state: HardState,
    /// The materialized job rows, reflecting every entry up to `applied`.
    pub jobs: Vec<Job>,
    /// The materialized queue rows, as of the same entry.
    pub queues: Vec<QueueState>,
    /// The materialized key buckets, as of the same entry.
    pub key_buckets: Vec<KeyBucket>,
    pub applied: LogIndex,
    /// The term of entry `applied` (0 when nothing was applied).
    pub applied_term: Term,
    /// Log entries not yet discarded (those beyond `applied` are replayed).
    pub log: Vec<LogEntry>,
}
