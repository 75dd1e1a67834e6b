//! How the store writes log entries and job rows: MessagePack with field names (the binary form
//! of the coordinators' link, `herder_core::protocol::codec::write_binary`), the same serde
//! data the wire carries as JSON, in a compact binary form (UUIDs as 16 bytes, numbers in as few
//! bytes as they need, no quoting or escaping), stored as BLOBs.
//!
//! The field names stay, so the rules that let JSON rows and entries evolve (a field added
//! with a default, one left out when empty) hold here unchanged. A value written as JSON text
//! by an earlier version is still read: SQLite keeps each value's type, and a TEXT value is
//! decoded as JSON.

use rusqlite::types::ValueRef;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Encodes `value` into `buffer` (cleared first), which the caller reuses from one record to
/// the next.
pub(super) fn encode_into<T: Serialize>(
    value: &T,
    buffer: &mut Vec<u8>,
) -> Result<(), rmp_serde::encode::Error> {
    buffer.clear();
    herder_core::protocol::codec::write_binary(value, buffer)
}

/// Decodes a stored value: a BLOB as written by [`encode_into`], TEXT as JSON.
pub(super) fn decode<T: DeserializeOwned>(value: ValueRef<'_>) -> Result<T, String> {
    match value {
        ValueRef::Blob(bytes) => rmp_serde::from_slice(bytes).map_err(|e| e.to_string()),
        ValueRef::Text(text) => serde_json::from_slice(text).map_err(|e| e.to_string()),
        other => Err(format!(
            "a {:?} value where a record was expected",
            other.data_type()
        )),
    }
}
