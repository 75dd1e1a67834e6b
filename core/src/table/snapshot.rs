//! The table's rows as the bytes a snapshot carries. Consensus moves these bytes without
//! looking inside; only the table encodes and decodes them.

use crate::job::Job;
use crate::protocol::codec::{decode_binary_message, write_binary};

/// The job table as a snapshot: its rows, encoded for the wire.
pub fn encode_snapshot(jobs: &[&Job]) -> Vec<u8> {
    // Rows are plain data; encoding them cannot fail short of running out of memory.
    let mut data = Vec::new();
    let _ = write_binary(jobs, &mut data);
    data
}

/// The rows of a snapshot, or why they do not decode.
pub fn decode_snapshot(data: &[u8]) -> Result<Vec<Job>, String> {
    decode_binary_message(data).map_err(|e| e.to_string())
}
