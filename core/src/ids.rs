//! Newtypes for every identifier, so a lease can never be passed where a job id is expected.

use std::fmt;

use rand_chacha::rand_core::RngCore;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::limits::WORKER_ID_BYTES_MAX;

/// Draws a version-4 UUID from a seeded generator (never from the OS).
pub fn uuid_from_rng(rng: &mut impl RngCore) -> Uuid {
    let mut bytes = [0u8; 16];
    rng.fill_bytes(&mut bytes);
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            pub fn random(rng: &mut impl RngCore) -> $name {
                $name(uuid_from_rng(rng))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl std::str::FromStr for $name {
            type Err = uuid::Error;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Uuid::parse_str(s).map($name)
            }
        }
    };
}

uuid_id!(
    /// A job, named by the coordinator when the submission is proposed.
    JobId
);

impl JobId {
    /// A job id that sorts by when it was drawn: laid out as a UUID of version 7 (the 48 bits
    /// of `at` in Unix milliseconds, then random bits). Job rows are filed by id, so jobs
    /// created together share the store's pages instead of landing all over them, and a
    /// listing sorted by id is close to submission order. Draws as many random bytes as
    /// [`JobId::random`], so a seeded run draws the same stream either way.
    pub fn ordered(at: crate::time::UnixMillis, rng: &mut impl RngCore) -> JobId {
        let mut bytes = [0u8; 16];
        rng.fill_bytes(&mut bytes);
        let mut random = [0u8; 10];
        random.copy_from_slice(&bytes[..10]);
        JobId(uuid::Builder::from_unix_timestamp_millis(at.0, &random).into_uuid())
    }
}
uuid_id!(
    /// One attempt's lease: fresh for every assignment; a result counts only with the current one.
    LeaseId
);

/// A worker's self-chosen, operator-visible name (`--id`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(pub String);

/// Why a worker id was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkerIdError {
    #[error("worker id is empty; pass --id with a name such as worker-1")]
    Empty,
    #[error("worker id is {len} bytes; the maximum is {WORKER_ID_BYTES_MAX}")]
    TooLong { len: usize },
    #[error("worker id {0:?} may only contain ASCII letters, digits, '.', '_' and '-'")]
    BadCharacter(String),
}

impl WorkerId {
    pub fn parse(raw: &str) -> Result<WorkerId, WorkerIdError> {
        if raw.is_empty() {
            return Err(WorkerIdError::Empty);
        }
        if raw.len() > WORKER_ID_BYTES_MAX {
            return Err(WorkerIdError::TooLong { len: raw.len() });
        }
        if !raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(WorkerIdError::BadCharacter(raw.to_owned()));
        }
        Ok(WorkerId(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One run of a worker process. A restarted worker keeps its id but draws a new incarnation, so the
/// coordinator can tell a reconnect (same incarnation) from a new process (different one).
///
/// On the wire it is 16 lowercase hex digits in a string: a random 64-bit number does not survive
/// JSON parsers that read numbers as doubles.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Incarnation(pub u64);

impl Serialize for Incarnation {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&format!("{:016x}", self.0))
    }
}

impl<'de> Deserialize<'de> for Incarnation {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.len() != 16 {
            return Err(serde::de::Error::custom(
                "incarnation must be 16 hex digits",
            ));
        }
        u64::from_str_radix(&text, 16)
            .map(Incarnation)
            .map_err(|_| serde::de::Error::custom("incarnation must be 16 hex digits"))
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A connection as numbered by the driver. Only meaningful inside one driver process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConnectionId(pub u64);

impl fmt::Display for ConnectionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "conn#{}", self.0)
    }
}

/// A client's number for one request on one connection; replies echo it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestId(pub u64);

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "req#{}", self.0)
    }
}

/// An attempt number, counted from 1.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Attempt(pub u32);

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A coordinator in the replicated group.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub String);

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A consensus term. A group of one stays in term 1 until replication arrives.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Term(pub u64);

/// A position in the replicated command log, counted from 1 (0 means "nothing").
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct LogIndex(pub u64);

impl LogIndex {
    pub fn next(self) -> LogIndex {
        LogIndex(self.0 + 1)
    }

    /// Before the first entry (for fields that are absent on older records).
    pub fn is_zero(&self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for LogIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn seeded_ids_are_reproducible_and_version_4() {
        let a = JobId::random(&mut ChaCha8Rng::seed_from_u64(7));
        let b = JobId::random(&mut ChaCha8Rng::seed_from_u64(7));
        assert_eq!(a, b);
        assert_eq!(a.0.get_version_num(), 4);
    }

    #[test]
    fn incarnations_travel_as_hex_strings() {
        let incarnation = Incarnation(u64::MAX - 1);
        let text = serde_json::to_string(&incarnation).expect("serialize");
        assert_eq!(text, "\"fffffffffffffffe\"");
        assert_eq!(
            serde_json::from_str::<Incarnation>(&text).ok(),
            Some(incarnation)
        );
        assert!(serde_json::from_str::<Incarnation>("12").is_err());
        assert!(serde_json::from_str::<Incarnation>("\"xyz\"").is_err());
    }

    #[test]
    fn worker_ids_are_validated() {
        assert!(WorkerId::parse("worker-1").is_ok());
        assert_eq!(WorkerId::parse(""), Err(WorkerIdError::Empty));
        assert!(matches!(
            WorkerId::parse("a b"),
            Err(WorkerIdError::BadCharacter(_))
        ));
        let long = "w".repeat(WORKER_ID_BYTES_MAX + 1);
        assert!(matches!(
            WorkerId::parse(&long),
            Err(WorkerIdError::TooLong { .. })
        ));
    }
}
