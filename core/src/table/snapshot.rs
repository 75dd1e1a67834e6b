//! The table's rows as the bytes a snapshot carries. Consensus moves these bytes without
//! looking inside; only the table encodes and decodes them.

use super::JobTable;
use crate::protocol::codec::{decode_binary_message, write_binary};
use crate::storage::TableRows;

/// Every row of the table, as a snapshot carries them.
pub fn encode_snapshot(table: &JobTable) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Rows<'a> {
        jobs: Vec<&'a crate::job::Job>,
        queues: Vec<&'a crate::queues::QueueState>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        key_buckets: Vec<crate::queues::KeyBucket>,
    }
    let rows = Rows {
        jobs: table.jobs().collect(),
        queues: table.queues().collect(),
        key_buckets: table.key_bucket_rows().collect(),
    };
    // Rows are plain data; encoding them cannot fail short of running out of memory.
    let mut data = Vec::new();
    let _ = write_binary(&rows, &mut data);
    data
}

impl JobTable {
    /// A copy of every row of the table: what [`JobTable::from_rows`] rebuilds it from.
    pub fn to_rows(&self) -> TableRows {
        TableRows {
            jobs: self.jobs().cloned().collect(),
            queues: self.queues().cloned().collect(),
            key_buckets: self.key_bucket_rows().collect(),
        }
    }
}

/// The rows of a snapshot, or why they do not decode.
pub fn decode_snapshot(data: &[u8]) -> Result<TableRows, String> {
    decode_binary_message(data).map_err(|e| e.to_string())
}
