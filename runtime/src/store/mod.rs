//! The coordinator's SQLite store: the command log, the materialized job rows and the applied
//! index, with group commit.
//!
//! - WAL journal, `synchronous=FULL`: a committed transaction survives power loss.
//! - One transaction per group of batches; a batch is reported durable only after its commit.
//! - Schema version in `PRAGMA user_version`. A database written by a newer Herder, one that fails
//!   SQLite's integrity check, or a file that is not a database is refused with a clear message;
//!   nothing is ever silently reset.

mod encoding;

use std::path::{Path, PathBuf};
use std::time::Duration;

use herder_core::command::LogEntry;
use herder_core::coordinator::{DurableState, HardState, Record};
use herder_core::ids::{LogIndex, NodeId, Term};
use herder_core::job::Job;
use herder_core::queues::{KeyBucket, QueueState};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};

/// The schema this build writes and reads. Version 1 (a single coordinator: no term or vote) is
/// upgraded in place when opened.
pub const SCHEMA_VERSION: i64 = 4;

/// File name of the database inside the data directory.
pub const DATABASE_FILE: &str = "herder.sqlite3";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create data directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("data directory {path} is not writable: {source}")]
    NotWritable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open database {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error(
        "database {path} is not a readable Herder database ({detail}); refusing to start. \
         Restore it from a backup or point --data-dir at an empty directory"
    )]
    Corrupt { path: PathBuf, detail: String },
    #[error(
        "database {path} was written by a newer Herder (schema version {found}, this build knows {SCHEMA_VERSION}); \
         refusing to start. Upgrade herder"
    )]
    NewerSchema { path: PathBuf, found: i64 },
    #[error(
        "database {path} is in use by another process (is another coordinator running on this --data-dir?)"
    )]
    InUse { path: PathBuf },
    #[error(
        "{path} is a SQLite database, but not Herder's (it has the tables {tables}); refusing to \
         start and leaving it untouched. Point --data-dir at an empty directory"
    )]
    Foreign { path: PathBuf, tables: String },
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("cannot encode a record: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
}

/// An open store. Not `Sync`: it lives on the store thread.
pub struct Store {
    conn: Connection,
    path: PathBuf,
    /// Holds one encoded record at a time, reused across records and commits.
    buffer: Vec<u8>,
}

impl Store {
    /// Opens (or creates) the store in `data_dir`, checking version and integrity.
    pub fn open(data_dir: &Path) -> Result<Store, StoreError> {
        std::fs::create_dir_all(data_dir).map_err(|source| StoreError::CreateDir {
            path: data_dir.to_owned(),
            source,
        })?;
        check_writable(data_dir)?;
        let path = data_dir.join(DATABASE_FILE);
        let conn = Connection::open_with_flags(
            &path,
            OpenFlags::SQLITE_OPEN_READ_WRITE
                | OpenFlags::SQLITE_OPEN_CREATE
                | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|source| StoreError::Open {
            path: path.clone(),
            source,
        })?;
        let corrupt = |detail: String| StoreError::Corrupt {
            path: path.clone(),
            detail,
        };
        let in_use = || StoreError::InUse { path: path.clone() };
        // A busy file is another coordinator's; any other failure to read it means corruption.
        let in_use_or_corrupt = |e: rusqlite::Error| {
            if is_busy(&e) {
                in_use()
            } else {
                corrupt(e.to_string())
            }
        };
        // One coordinator owns its database: exclusive locking holds the file lock for the life
        // of the connection (a second process is refused at once instead of interleaving with
        // us), and in WAL mode it keeps the WAL index in process memory instead of a shared
        // memory file.
        conn.busy_timeout(Duration::from_millis(LOCK_WAIT_MILLIS))?;
        conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
        // The first statement that reads the file tells us whether it is a database at all.
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |row| row.get(0))
            .map_err(in_use_or_corrupt)?;
        if version > SCHEMA_VERSION {
            return Err(StoreError::NewerSchema {
                path,
                found: version,
            });
        }
        let check: String = conn
            .query_row("PRAGMA quick_check", [], |row| row.get(0))
            .map_err(|e| corrupt(e.to_string()))?;
        if check != "ok" {
            return Err(corrupt(format!("integrity check: {check}")));
        }
        if version == 0 {
            // Tables but no Herder version: someone else's database. Refused before anything
            // (even the journal mode) is changed in it.
            let tables: Vec<String> = conn
                .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")?
                .query_map([], |row| row.get(0))?
                .collect::<Result<_, _>>()?;
            if !tables.is_empty() {
                return Err(StoreError::Foreign {
                    path,
                    tables: tables.join(", "),
                });
            }
        }
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(in_use_or_corrupt)?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        // Take the write lock now, so a second coordinator on this directory fails at start.
        conn.execute_batch("BEGIN EXCLUSIVE; COMMIT;")
            .map_err(|e| {
                if is_busy(&e) {
                    in_use()
                } else {
                    StoreError::Sqlite(e)
                }
            })?;
        upgrade_schema(&conn, version, &in_use_or_corrupt)?;
        let store = Store {
            conn,
            path,
            buffer: Vec::new(),
        };
        store.check_tables()?;
        Ok(store)
    }

    fn check_tables(&self) -> Result<(), StoreError> {
        for table in ["meta", "log", "jobs", "vote", "queues", "key_buckets"] {
            let found: Option<String> = self
                .conn
                .query_row(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?1",
                    [table],
                    |row| row.get(0),
                )
                .optional()?;
            if found.is_none() {
                return Err(StoreError::Corrupt {
                    path: self.path.clone(),
                    detail: format!("table {table} is missing"),
                });
            }
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Everything the coordinator needs to recover.
    pub fn load(&self) -> Result<DurableState, StoreError> {
        let corrupt = |detail: String| StoreError::Corrupt {
            path: self.path.clone(),
            detail,
        };
        let applied: i64 = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'applied_index'",
                [],
                |row| row.get(0),
            )
            .optional()?
            .ok_or_else(|| corrupt("applied index is missing".into()))?;
        let applied = u64::try_from(applied)
            .map_err(|_| corrupt(format!("negative applied index {applied}")))?;
        let applied_term: i64 = self
            .conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'applied_term'",
                [],
                |row| row.get(0),
            )
            .optional()?
            .ok_or_else(|| corrupt("the term of the applied entry is missing".into()))?;
        let applied_term = u64::try_from(applied_term)
            .map_err(|_| corrupt(format!("negative applied term {applied_term}")))?;
        let (term, voted_for, abstaining): (i64, Option<String>, i64) = self
            .conn
            .query_row(
                "SELECT term, voted_for, abstaining FROM vote WHERE id = 1",
                [],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
            )
            .optional()?
            .ok_or_else(|| corrupt("the term and vote are missing".into()))?;
        let term = u64::try_from(term).map_err(|_| corrupt(format!("negative term {term}")))?;
        let mut jobs = Vec::new();
        let mut statement = self.conn.prepare("SELECT id, row FROM jobs")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let id: String = row.get(0)?;
            let job: Job = encoding::decode(row.get_ref(1)?)
                .map_err(|e| corrupt(format!("job row {id}: {e}")))?;
            if job.id.to_string() != id {
                return Err(corrupt(format!(
                    "the job row filed under id {id} holds job {}",
                    job.id
                )));
            }
            jobs.push(job);
        }
        let mut queues = Vec::new();
        let mut statement = self.conn.prepare("SELECT name, row FROM queues")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let name: String = row.get(0)?;
            let queue: QueueState = encoding::decode(row.get_ref(1)?)
                .map_err(|e| corrupt(format!("queue row {name:?}: {e}")))?;
            if queue.name != name {
                return Err(corrupt(format!(
                    "the queue row filed under {name:?} holds queue {:?}",
                    queue.name
                )));
            }
            queues.push(queue);
        }
        let mut key_buckets = Vec::new();
        let mut statement = self
            .conn
            .prepare("SELECT queue, key, tat_micros FROM key_buckets")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let (queue, key, tat): (String, String, i64) = (row.get(0)?, row.get(1)?, row.get(2)?);
            let tat_micros = u64::try_from(tat).map_err(|_| {
                corrupt(format!(
                    "the bucket of key {key:?} in queue {queue:?} is negative"
                ))
            })?;
            key_buckets.push(KeyBucket {
                queue,
                key,
                tat_micros,
            });
        }
        let mut log = Vec::new();
        let mut statement = self
            .conn
            .prepare("SELECT idx, entry FROM log ORDER BY idx")?;
        let mut rows = statement.query([])?;
        while let Some(row) = rows.next()? {
            let idx: i64 = row.get(0)?;
            let entry: LogEntry = encoding::decode(row.get_ref(1)?)
                .map_err(|e| corrupt(format!("log entry {idx}: {e}")))?;
            if i64::try_from(entry.index.0).ok() != Some(idx) {
                return Err(corrupt(format!(
                    "the log entry filed at index {idx} says it is entry {}",
                    entry.index
                )));
            }
            if let Some(previous) = log.last().map(|e: &LogEntry| e.index) {
                if entry.index != previous.next() {
                    return Err(corrupt(format!(
                        "the log jumps from entry {previous} to entry {}",
                        entry.index
                    )));
                }
            }
            log.push(entry);
        }
        Ok(DurableState {
            hard_state: HardState {
                term: Term(term),
                voted_for: voted_for.map(NodeId),
                abstaining: abstaining != 0,
            },
            jobs,
            applied: LogIndex(applied),
            applied_term: Term(applied_term),
            log,
            queues,
            key_buckets,
        })
    }

    /// Writes every record of every batch in one transaction (group commit). Returns only after
    /// the commit, i.e. once the records are durable.
    pub fn write<'a>(
        &mut self,
        records: impl IntoIterator<Item = &'a Record>,
    ) -> Result<(), StoreError> {
        let tx = self.conn.transaction()?;
        let buffer = &mut self.buffer;
        {
            let mut put_log = tx.prepare_cached(
                "INSERT OR REPLACE INTO log (idx, term, entry) VALUES (?1, ?2, ?3)",
            )?;
            let mut put_job = tx.prepare_cached(
                "INSERT OR REPLACE INTO jobs (id, state, row) VALUES (?1, ?2, ?3)",
            )?;
            let mut delete_job = tx.prepare_cached("DELETE FROM jobs WHERE id = ?1")?;
            let mut put_queue =
                tx.prepare_cached("INSERT OR REPLACE INTO queues (name, row) VALUES (?1, ?2)")?;
            let mut put_bucket = tx.prepare_cached(
                "INSERT OR REPLACE INTO key_buckets (queue, key, tat_micros) VALUES (?1, ?2, ?3)",
            )?;
            let mut delete_bucket =
                tx.prepare_cached("DELETE FROM key_buckets WHERE queue = ?1 AND key = ?2")?;
            let mut set_applied =
                tx.prepare_cached("UPDATE meta SET value = ?1 WHERE key = 'applied_index'")?;
            let mut set_applied_term =
                tx.prepare_cached("UPDATE meta SET value = ?1 WHERE key = 'applied_term'")?;
            let mut discard = tx.prepare_cached("DELETE FROM log WHERE idx <= ?1")?;
            let mut truncate = tx.prepare_cached("DELETE FROM log WHERE idx > ?1")?;
            let mut set_vote = tx.prepare_cached(
                "UPDATE vote SET term = ?1, voted_for = ?2, abstaining = ?3 WHERE id = 1",
            )?;
            for record in records {
                match record {
                    Record::HardState(hard_state) => {
                        set_vote.execute(params![
                            to_sql(hard_state.term.0),
                            hard_state.voted_for.as_ref().map(|id| id.0.as_str()),
                            i64::from(hard_state.abstaining)
                        ])?;
                    }
                    Record::TruncateLogAfter(index) => {
                        truncate.execute(params![to_sql(index.0)])?;
                    }
                    Record::Snapshot { index, term, rows } => {
                        tx.execute("DELETE FROM jobs", [])?;
                        tx.execute("DELETE FROM queues", [])?;
                        tx.execute("DELETE FROM key_buckets", [])?;
                        for queue in &rows.queues {
                            encoding::encode_into(queue, buffer)?;
                            put_queue.execute(params![queue.name.as_str(), buffer.as_slice()])?;
                        }
                        for bucket in &rows.key_buckets {
                            put_bucket.execute(params![
                                bucket.queue.as_str(),
                                bucket.key.as_str(),
                                to_sql(bucket.tat_micros)
                            ])?;
                        }
                        for job in &rows.jobs {
                            encoding::encode_into(job, buffer)?;
                            put_job.execute(params![
                                job.id.to_string(),
                                job.state.as_str(),
                                buffer.as_slice()
                            ])?;
                        }
                        set_applied.execute(params![to_sql(index.0)])?;
                        set_applied_term.execute(params![to_sql(term.0)])?;
                        discard.execute(params![to_sql(index.0)])?;
                    }
                    Record::Log(entry) => {
                        encoding::encode_into(entry, buffer)?;
                        put_log.execute(params![
                            to_sql(entry.index.0),
                            to_sql(entry.term.0),
                            buffer.as_slice()
                        ])?;
                    }
                    Record::Job(job) => {
                        encoding::encode_into(job.as_ref(), buffer)?;
                        put_job.execute(params![
                            job.id.to_string(),
                            job.state.as_str(),
                            buffer.as_slice()
                        ])?;
                    }
                    Record::DeleteJob(job_id) => {
                        delete_job.execute(params![job_id.to_string()])?;
                    }
                    Record::Queue(queue) => {
                        encoding::encode_into(queue, buffer)?;
                        put_queue.execute(params![queue.name.as_str(), buffer.as_slice()])?;
                    }
                    Record::KeyBucket(bucket) => {
                        put_bucket.execute(params![
                            bucket.queue.as_str(),
                            bucket.key.as_str(),
                            to_sql(bucket.tat_micros)
                        ])?;
                    }
                    Record::DeleteKeyBucket { queue, key } => {
                        delete_bucket.execute(params![queue.as_str(), key.as_str()])?;
                    }
                    Record::Applied { index, term } => {
                        set_applied.execute(params![to_sql(index.0)])?;
                        set_applied_term.execute(params![to_sql(term.0)])?;
                    }
                    Record::DiscardLogThrough(index) => {
                        discard.execute(params![to_sql(index.0)])?;
                    }
                }
            }
        }
        tx.commit()?;
        Ok(())
    }
}

/// How long opening waits for another process's lock before refusing.
const LOCK_WAIT_MILLIS: u64 = 200;

fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error,
        rusqlite::Error::SqliteFailure(e, _)
            if matches!(e.code, rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// SQLite integers are signed; indexes beyond `i64::MAX` cannot occur in practice (that is
/// 9 * 10^18 commands) and are clamped rather than wrapped.
fn to_sql(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Fails early, with the directory named, when the data directory cannot be written.
fn check_writable(data_dir: &Path) -> Result<(), StoreError> {
    let probe = data_dir.join(".herder-write-probe");
    std::fs::write(&probe, b"probe")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|source| StoreError::NotWritable {
            path: data_dir.to_owned(),
            source,
        })
}

/// Brings a Herder database at schema `version` up to the current one (0: a new, empty file).
fn upgrade_schema(
    conn: &Connection,
    version: i64,
    in_use_or_corrupt: &dyn Fn(rusqlite::Error) -> StoreError,
) -> Result<(), StoreError> {
    if version == 0 {
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS log (idx INTEGER PRIMARY KEY, term INTEGER NOT NULL, entry TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, state TEXT NOT NULL, row TEXT NOT NULL);
             INSERT OR IGNORE INTO meta (key, value) VALUES ('applied_index', 0);
             PRAGMA user_version = 1;
             COMMIT;",
        )?;
    }
    if version <= 1 {
        // Version 2 adds what consensus must remember: the term and vote, and the term of
        // the applied entry (every entry a version 1 coordinator wrote has term 1).
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE IF NOT EXISTS vote (id INTEGER PRIMARY KEY CHECK (id = 1), term INTEGER NOT NULL, voted_for TEXT, abstaining INTEGER NOT NULL DEFAULT 0);
             INSERT OR IGNORE INTO vote (id, term, voted_for, abstaining) VALUES (1, 0, NULL, 0);
             INSERT OR IGNORE INTO meta (key, value)
                 SELECT 'applied_term', CASE WHEN value > 0 THEN 1 ELSE 0 END FROM meta WHERE key = 'applied_index';
             PRAGMA user_version = 2;
             COMMIT;",
        )
        .map_err(in_use_or_corrupt)?;
    }
    if version <= 2 {
        // Version 3 adds queue rows: each queue's settings and its place in the weighted share.
        // Jobs written before name no queue and read as the default one.
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE IF NOT EXISTS queues (name TEXT PRIMARY KEY, row TEXT NOT NULL);
             PRAGMA user_version = 3;
             COMMIT;",
        )
        .map_err(in_use_or_corrupt)?;
    }
    if version <= 3 {
        // Version 4 adds the rate buckets of fairness keys under a per-key rate limit. No
        // earlier version had the limit, so there are none to carry over.
        conn.execute_batch(
            "BEGIN;
             CREATE TABLE IF NOT EXISTS key_buckets (queue TEXT NOT NULL, key TEXT NOT NULL, tat_micros INTEGER NOT NULL, PRIMARY KEY (queue, key));
             PRAGMA user_version = 4;
             COMMIT;",
        )
        .map_err(in_use_or_corrupt)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use herder_core::command::Command;
    use herder_core::ids::{Attempt, JobId};
    use herder_core::job::JobState;
    use herder_core::tasks::TaskSpec;

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("herder-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn job(n: u128) -> Job {
        Job {
            timeout_millis: None,
            id: job_id(n),
            task: TaskSpec::Sha256 { text: "abc".into() },
            max_attempts: 3,
            idempotency_key: Some(format!("key-{n}")),
            state: JobState::Queued,
            attempt: Attempt(0),
            lease: None,
            last_worker: None,
            result: None,
            error: None,
            retry_delay_millis: 0,
            submitted_at: LogIndex(n as u64),
            queue_seq: n as u64,
            partition_of: None,
            partitions: Vec::new(),
            partitions_asked: None,
            created_at: herder_core::time::UnixMillis(1_700_000_000_000),
            finished_at: None,
            first_started_at: None,
            history: Vec::new(),
            history_dropped: 0,
            submitted_by: None,
            queue: herder_core::queues::default_queue(),
            priority: 0,
            fairness_key: None,
            turn: 0,
            queued_at: herder_core::time::UnixMillis::UNSTAMPED,
            run_at: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        }
    }

    /// A job id built through serde, so the test needs no direct uuid dependency.
    fn job_id(n: u128) -> JobId {
        serde_json::from_value(serde_json::json!(format!(
            "00000000-0000-4000-8000-{n:012x}"
        )))
        .expect("uuid")
    }

    fn entry(i: u64) -> LogEntry {
        LogEntry {
            index: LogIndex(i),
            term: Term(1),
            at: herder_core::time::UnixMillis::UNSTAMPED,
            command: Command::Requeue {
                job_id: job_id(i as u128),
            },
        }
    }

    #[test]
    fn batches_round_trip_and_discarded_entries_are_gone() {
        let dir = temp_dir("roundtrip");
        let mut store = Store::open(&dir).expect("open");
        let records = vec![
            Record::Log(Box::new(entry(1))),
            Record::Log(Box::new(entry(2))),
            Record::Log(Box::new(entry(3))),
            Record::Job(Box::new(job(1))),
            Record::Job(Box::new(job(2))),
            Record::Applied {
                index: LogIndex(2),
                term: Term(1),
            },
            Record::DiscardLogThrough(LogIndex(2)),
        ];
        store.write(&records).expect("write");
        drop(store);
        let store = Store::open(&dir).expect("reopen");
        let state = store.load().expect("load");
        assert_eq!(state.applied, LogIndex(2));
        assert_eq!(state.log, vec![entry(3)]);
        let mut ids: Vec<_> = state.jobs.iter().map(|j| j.id).collect();
        ids.sort();
        assert_eq!(ids, vec![job(1).id, job(2).id]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn rows_and_entries_written_as_json_by_an_earlier_version_are_still_read() {
        let dir = temp_dir("json-rows");
        let mut store = Store::open(&dir).expect("open");
        let (old_job, new_job) = (job(1), job(2));
        store
            .conn
            .execute(
                "INSERT INTO jobs (id, state, row) VALUES (?1, ?2, ?3)",
                params![old_job.id.to_string(), "QUEUED", json(&old_job)],
            )
            .expect("a JSON row");
        store
            .conn
            .execute(
                "INSERT INTO log (idx, term, entry) VALUES (1, 1, ?1)",
                params![json(&entry(1))],
            )
            .expect("a JSON entry");
        store
            .write(&[
                Record::Log(Box::new(entry(2))),
                Record::Job(Box::new(new_job.clone())),
            ])
            .expect("binary records beside them");
        let kinds: Vec<String> = store
            .conn
            .prepare("SELECT typeof(entry) FROM log ORDER BY idx")
            .expect("prepare")
            .query_map([], |row| row.get(0))
            .expect("query")
            .collect::<Result<_, _>>()
            .expect("rows");
        assert_eq!(kinds, ["text", "blob"], "new records are written in binary");
        drop(store);
        let state = Store::open(&dir).expect("reopen").load().expect("load");
        assert_eq!(state.log, vec![entry(1), entry(2)]);
        let mut jobs = state.jobs;
        jobs.sort_by_key(|j| j.id);
        assert_eq!(jobs, vec![old_job, new_job]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Every log entry and job row shown in the protocol document (every command, task and
    /// outcome kind has one there) comes back from the store's binary form unchanged.
    #[test]
    fn every_documented_entry_and_row_round_trips_through_the_binary_form() {
        let doc = include_str!("../../../docs/PROTOCOL.md");
        let mut entries = 0;
        let mut buffer = Vec::new();
        for block in doc.split("```jsonc\n").skip(1) {
            let Some((text, _)) = block.split_once("```") else {
                continue;
            };
            if let Ok(entry) = serde_json::from_str::<LogEntry>(text) {
                encoding::encode_into(&entry, &mut buffer).expect("encode");
                let back: LogEntry =
                    encoding::decode(rusqlite::types::ValueRef::Blob(&buffer)).expect("decode");
                assert_eq!(back, entry);
                assert!(buffer.len() < text.len(), "smaller than its JSON: {text}");
                entries += 1;
            }
        }
        assert!(entries >= 10, "only {entries} entries found");
        // And a row with every optional part filled, user JSON of every shape among them.
        let job: Job = serde_json::from_value(serde_json::json!({
            "id": "01a2340d-0c18-7241-8334-46b9e7496fa0",
            "task": {"kind": "resize", "payload": {"n": -3, "f": 1.5, "big": 18446744073709551615u64,
                "s": "é\u{0}\"", "list": [null, true, [], {}], "nested": {"a": {"b": [1, 2.25]}}}},
            "max_attempts": 3,
            "idempotency_key": "order-7",
            "state": "RUNNING",
            "attempt": 2,
            "lease": {"id": "e94a5a36-0525-44c5-be93-082686887253", "worker": "w3",
                "incarnation": "fed3de0940442ec2"},
            "last_worker": "w3",
            "result": {"kind": "value", "value": {"ok": [1, "two", 3.0]}},
            "error": "the first attempt failed",
            "retry_delay_millis": 1200,
            "submitted_at": 9,
            "queue_seq": 18432,
            "partitions_asked": 4,
            "created_at": 1796169600024u64,
            "first_started_at": 1796169600038u64,
            "timeout_millis": 5000,
            "history": [
                {"attempt": 1, "lease_id": "58f56ad9-5b55-44d5-99cd-677c1af4c9d5", "worker": "w1",
                    "started_at_unix_ms": 1796169600038u64, "ended_at_unix_ms": 1796169600059u64,
                    "outcome": "worker_lost", "error": "lost"},
                {"attempt": 2, "lease_id": "e94a5a36-0525-44c5-be93-082686887253", "worker": "w3",
                    "started_at_unix_ms": 1796169600070u64}
            ],
            "history_dropped": 2
        }))
        .expect("a job row");
        encoding::encode_into(&job, &mut buffer).expect("encode");
        let back: Job = encoding::decode(rusqlite::types::ValueRef::Blob(&buffer)).expect("decode");
        assert_eq!(back, job);
        let json = serde_json::to_vec(&job).expect("json");
        assert!(
            buffer.len() < json.len(),
            "{} bytes against {} as JSON",
            buffer.len(),
            json.len()
        );
    }

    /// A value as JSON text, as an earlier version wrote rows and entries.
    fn json<T: serde::Serialize>(value: &T) -> String {
        serde_json::to_string(value).expect("encode")
    }

    #[test]
    fn a_purged_row_is_deleted_and_stays_gone_after_a_reopen() {
        let dir = temp_dir("purge");
        let mut store = Store::open(&dir).expect("open");
        store
            .write(&[Record::Job(Box::new(job(1))), Record::Job(Box::new(job(2)))])
            .expect("write rows");
        store
            .write(&[Record::DeleteJob(job(1).id), Record::DeleteJob(job(9).id)])
            .expect("deleting a row, or one that is not there, is fine");
        drop(store);
        let state = Store::open(&dir).expect("reopen").load().expect("load");
        let ids: Vec<_> = state.jobs.iter().map(|j| j.id).collect();
        assert_eq!(ids, vec![job(2).id]);
        assert_eq!(
            state.jobs[0].created_at,
            job(2).created_at,
            "times round-trip"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn key_buckets_are_upserted_deleted_and_replaced_by_a_snapshot() {
        let dir = temp_dir("key-buckets");
        let mut store = Store::open(&dir).expect("open");
        let bucket = |key: &str, tat_micros: u64| KeyBucket {
            queue: "tenants".into(),
            key: key.into(),
            tat_micros,
        };
        store
            .write(&[
                Record::KeyBucket(bucket("a", 1_000)),
                Record::KeyBucket(bucket("b", 2_000)),
                Record::KeyBucket(bucket("a", 3_000)),
                Record::DeleteKeyBucket {
                    queue: "tenants".into(),
                    key: "b".into(),
                },
            ])
            .expect("write");
        drop(store);
        let mut store = Store::open(&dir).expect("reopen");
        let state = store.load().expect("load");
        assert_eq!(
            state.key_buckets,
            vec![bucket("a", 3_000)],
            "the last write wins"
        );
        let rows = herder_core::storage::TableRows {
            key_buckets: vec![bucket("c", 5_000)],
            ..Default::default()
        };
        store
            .write(&[Record::Snapshot {
                index: LogIndex(7),
                term: Term(2),
                rows,
            }])
            .expect("install");
        let state = store.load().expect("load");
        assert_eq!(state.key_buckets, vec![bucket("c", 5_000)]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_second_store_on_the_same_directory_is_refused_while_the_first_is_open() {
        let dir = temp_dir("inuse");
        let first = Store::open(&dir).expect("open");
        match Store::open(&dir) {
            Err(StoreError::InUse { .. }) => {}
            other => panic!("expected an in-use refusal, got {:?}", other.err()),
        }
        drop(first);
        Store::open(&dir).expect("free again once the first is closed");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = temp_dir("newer");
        Store::open(&dir).expect("create");
        let conn = Connection::open(dir.join(DATABASE_FILE)).expect("raw open");
        conn.pragma_update(None, "user_version", 99).expect("bump");
        drop(conn);
        match Store::open(&dir) {
            Err(StoreError::NewerSchema { found: 99, .. }) => {}
            other => panic!("expected a newer-schema refusal, got {:?}", other.err()),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_refused_and_left_alone() {
        let dir = temp_dir("garbage");
        std::fs::create_dir_all(&dir).expect("dir");
        let garbage = vec![0x5Au8; 8192];
        std::fs::write(dir.join(DATABASE_FILE), &garbage).expect("write garbage");
        match Store::open(&dir) {
            Err(StoreError::Corrupt { .. }) => {}
            other => panic!("expected a corruption refusal, got {:?}", other.err()),
        }
        assert_eq!(
            std::fs::read(dir.join(DATABASE_FILE)).expect("still there"),
            garbage,
            "never reset"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_row_that_does_not_parse_is_reported_as_corruption() {
        let dir = temp_dir("badrow");
        let mut store = Store::open(&dir).expect("open");
        store
            .write(&[Record::Job(Box::new(job(1)))])
            .expect("write");
        store
            .conn
            .execute("UPDATE jobs SET row = '{not json'", [])
            .expect("tamper");
        match store.load() {
            Err(StoreError::Corrupt { detail, .. }) => assert!(detail.contains("job row")),
            other => panic!("expected corruption, got {:?}", other.err()),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn rows_filed_under_another_id_and_a_log_with_a_gap_are_corruption() {
        let dir = temp_dir("misfiled");
        let mut store = Store::open(&dir).expect("open");
        store
            .write(&[Record::Job(Box::new(job(1)))])
            .expect("write");
        store
            .conn
            .execute("UPDATE jobs SET id = 'somebody-else'", [])
            .expect("tamper");
        match store.load() {
            Err(StoreError::Corrupt { detail, .. }) => {
                assert!(detail.contains("filed under id somebody-else"), "{detail}")
            }
            other => panic!("expected corruption, got {:?}", other.err()),
        }
        store.conn.execute("DELETE FROM jobs", []).expect("clear");
        store
            .write(&[
                Record::Log(Box::new(entry(3))),
                Record::Log(Box::new(entry(5))),
            ])
            .expect("write entries");
        match store.load() {
            Err(StoreError::Corrupt { detail, .. }) => {
                assert!(detail.contains("jumps from entry 3 to entry 5"), "{detail}")
            }
            other => panic!("expected corruption, got {:?}", other.err()),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn another_programs_database_is_refused_and_left_untouched() {
        let dir = temp_dir("foreign");
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join(DATABASE_FILE);
        let conn = Connection::open(&path).expect("create");
        conn.execute_batch("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT);")
            .expect("their schema");
        drop(conn);
        let before = std::fs::read(&path).expect("read");
        match Store::open(&dir) {
            Err(StoreError::Foreign { tables, .. }) => assert_eq!(tables, "customers"),
            other => panic!("expected a foreign-database refusal, got {:?}", other.err()),
        }
        assert_eq!(
            std::fs::read(&path).expect("still there"),
            before,
            "untouched"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unwritable_data_dir_is_refused_with_its_name() {
        let file = temp_dir("notadir");
        std::fs::write(&file, b"a file, not a directory").expect("file");
        match Store::open(&file) {
            Err(StoreError::CreateDir { path, .. }) | Err(StoreError::NotWritable { path, .. }) => {
                assert_eq!(path, file)
            }
            other => panic!("expected a refusal, got {:?}", other.err()),
        }
        let _ = std::fs::remove_file(&file);
    }
}
