//! Every bound in one place. A queue, buffer, batch or loop without a named limit is a bug.

/// Default largest frame payload (docs/PROTOCOL.md, "Framing"); configurable per process.
pub const FRAME_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
/// No configuration may raise the frame limit beyond this, so a typo cannot ask for gigabytes.
pub const FRAME_BYTES_MAX_CEILING: usize = 64 * 1024 * 1024;
/// Smallest frame limit a configuration may set (room for every fixed-size message).
pub const FRAME_BYTES_MIN: usize = 4 * 1024;
/// Room reserved for a `TASK_ASSIGN`'s fields around its task payload.
pub const ASSIGN_ENVELOPE_BYTES: usize = 1024;
/// Bytes of the length prefix in front of every frame.
pub const FRAME_HEADER_BYTES: usize = 4;

/// Most attempts a job may be given.
pub const ATTEMPTS_MAX: u32 = 100;
/// Most task slots one worker may advertise.
pub const WORKER_CAPACITY_MAX: u32 = 1024;
/// Assignments a worker may hold waiting beyond its slots, per slot.
pub const PREFETCH_PER_SLOT_MAX: u32 = 4;
/// Unacknowledged results a worker may always list in `REGISTER`, whatever its room (it may
/// list up to twice its capacity and prefetch together, if that is more).
pub const REPORTED_FINISHED_MAX: usize = 64;
/// Longest worker id.
pub const WORKER_ID_BYTES_MAX: usize = 64;
/// Most workers the registry tracks at once (live or recently lost).
pub const WORKERS_MAX: usize = 4096;
/// Longest idempotency key.
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 256;
/// Most jobs a single `LIST` reply carries.
pub const LIST_LIMIT_MAX: u32 = 1000;
/// Jobs in one `SUBMIT_BATCH` (the frame limit bounds it too).
pub const SUBMIT_BATCH_JOBS_MAX: usize = 1000;
/// The share of a `SUBMIT_BATCH_RESULT` frame each job's line may take (an error's message is
/// cut to half of it); a batch holds no more jobs than the frame limit leaves lines for.
pub const SUBMIT_RESULT_BYTES_MAX: usize = 512;
/// Default number of jobs in a `LIST` reply.
pub const LIST_LIMIT_DEFAULT: u32 = 100;
/// Most outstanding `WAIT` requests the coordinator parks at once.
pub const WAITERS_MAX: usize = 65_536;
/// Most of them one connection may hold by default (`--max-waits-per-connection`), so that one
/// client cannot take every wait slot.
pub const WAITERS_PER_CONNECTION_DEFAULT: usize = 1024;
/// Longest a single `WAIT` may park (one day).
pub const WAIT_MILLIS_MAX: u64 = 24 * 60 * 60 * 1000;
/// Most active (non-terminal) jobs any configuration may allow.
pub const ACTIVE_JOBS_CEILING: u64 = 10_000_000;
/// Longest task timeout, retry delay or heartbeat setting any configuration may ask for (one week).
pub const CONFIG_MILLIS_MAX: u64 = 7 * 24 * 60 * 60 * 1000;

/// Longest text a `word-count` or `sha256` task takes.
pub const TASK_TEXT_BYTES_MAX: usize = 256 * 1024;
/// Longest user task name, in bytes.
pub const TASK_NAME_BYTES_MAX: usize = 64;
/// Largest user task payload, as compact JSON. Large inputs belong in shared storage, with a
/// reference in the payload.
pub const TASK_PAYLOAD_BYTES_MAX: usize = 256 * 1024;
/// Largest successful result, as compact JSON; a bigger one fails its job for good (a handler
/// should store large results elsewhere and return a reference).
pub const TASK_RESULT_BYTES_MAX: usize = 256 * 1024;
/// Longest progress note a worker may report for an attempt; a longer one is cut.
pub const PROGRESS_NOTE_BYTES_MAX: usize = 256;
/// Most task names one worker may serve.
pub const TASKS_PER_WORKER_MAX: usize = 256;
/// Longest job timeout a submission may ask for (one day).
pub const JOB_TIMEOUT_MILLIS_MAX: u64 = 24 * 60 * 60 * 1000;
/// Most arguments (the program included) an `exec` task may pass.
pub const EXEC_ARGS_MAX: usize = 256;
/// Longest single argument, working directory, or environment value of an `exec` task.
pub const EXEC_STRING_BYTES_MAX: usize = 4096;
/// Most environment variables an `exec` task may set.
pub const EXEC_ENV_MAX: usize = 64;
/// Most bytes of each of an `exec` task's stdout and stderr kept in its result; the rest is
/// read and dropped, and the result says it was cut.
pub const EXEC_OUTPUT_BYTES_MAX: usize = 64 * 1024;
/// Longest a `sleep` task may ask to sleep (one day).
pub const SLEEP_MILLIS_MAX: u64 = 24 * 60 * 60 * 1000;
/// Largest text a worker hashes or counts in place rather than on a separate thread.
pub const INLINE_TEXT_BYTES_MAX: usize = 16 * 1024;
/// Largest `prime-count` limit a worker sieves in place (well under a millisecond).
pub const INLINE_PRIME_LIMIT_MAX: u64 = 200_000;
/// Largest `prime-count --limit` (about a second of sieving on one core).
pub const PRIME_COUNT_LIMIT_MAX: u64 = 1_000_000_000;
/// Most numbers a `max` or `prime-count-list` task carries. The frame limit (1 MiB by default,
/// about 50,000 large numbers) usually binds first.
pub const TASK_NUMBERS_MAX: usize = 1_000_000;
/// Most numbers a `prime-sum` range may span (`end - start + 1`) while `end` is at most
/// [`PRIME_SUM_SIEVE_ONLY_END`]: about ten seconds of sieving on one core, before it is split
/// across workers.
pub const PRIME_SUM_SPAN_MAX: u64 = 10_000_000_000;
/// Largest `end` the range sieve settles by sieving alone (its sieving primes reach 2^22). Above
/// it every survivor is confirmed by Miller–Rabin, about a hundred times slower per number.
pub const PRIME_SUM_SIEVE_ONLY_END: i64 = 1 << 44;
/// Most numbers a `prime-sum` range may span when `end` is above [`PRIME_SUM_SIEVE_ONLY_END`]:
/// about ten seconds on one core near `i64::MAX`.
pub const PRIME_SUM_SPAN_MAX_HIGH: u64 = 100_000_000;
/// Most bytes one partition adds to its parent's job view (`partitions.pieces`): ids, state,
/// attempt, a worker id of up to 64 bytes and the largest output.
pub const PARTITION_VIEW_BYTES_MAX: usize = 400;
/// Most partitions a data-parallel job may be split into.
pub const PARTITIONS_MAX: u32 = 1024;
/// Queue positions one log entry may hand out: a submission enqueues at most its partitions,
/// anything else at most one job. Rows written when positions came from a counter (at most
/// 1,025 per entry before it) all sort before the positions of later entries.
pub const QUEUE_POSITIONS_PER_ENTRY: u64 = 2048;
const _: () = assert!((PARTITIONS_MAX as u64) < QUEUE_POSITIONS_PER_ENTRY);
/// Largest list a worker scans for primes in place rather than on a separate thread.
pub const INLINE_NUMBERS_MAX: usize = 1_000;

/// Longest failure message a worker reports for an attempt (longer ones are cut), so every result
/// fits a frame.
pub const ATTEMPT_ERROR_BYTES_MAX: usize = 4096;
/// Attempts a job's history keeps (the latest; older ones are only counted). Drain hand-backs
/// are not charged, so a job can have more attempts than its budget.
pub const ATTEMPT_HISTORY_MAX: usize = 16;
/// Longest failure message one history record keeps (the job's latest error is kept in full).
pub const ATTEMPT_HISTORY_ERROR_BYTES_MAX: usize = 512;
/// Job rows changed since the last materialization that force the next one.
pub const MATERIALIZE_DIRTY_JOBS_MAX: usize = 2048;
/// Log entries beyond the materialized rows that force the next materialization (the most a
/// recovery replays).
pub const MATERIALIZE_LOG_ENTRIES_MAX: u64 = 8192;
/// How long nothing is written before changed job rows are written in a commit of their own
/// (under steady load they wait for `MATERIALIZE_DIRTY_JOBS_MAX` or
/// `MATERIALIZE_LOG_ENTRIES_MAX`).
pub const MATERIALIZE_QUIET: std::time::Duration = std::time::Duration::from_millis(2);
/// How long a terminal job is kept by default before the leader purges it (a week).
pub const RETAIN_TERMINAL_AGE_DEFAULT: std::time::Duration =
    std::time::Duration::from_secs(7 * 24 * 60 * 60);
/// How many terminal jobs are kept by default; the longest finished go first beyond it.
pub const RETAIN_TERMINAL_COUNT_DEFAULT: u64 = 100_000;
/// The count bound never purges a job that finished less than this long ago (twice the
/// client's default call timeout, so a keyed resend after a lost connection finds its job).
pub const RETAIN_TERMINAL_MIN_AGE_DEFAULT: std::time::Duration = std::time::Duration::from_secs(60);
/// Most jobs one `Purge` entry names (the frame limit may cut it shorter).
pub const PURGE_JOBS_PER_ENTRY_MAX: usize = 1024;
/// `Purge` entries a leader has proposed and not yet applied; it proposes more as they apply.
pub const PURGES_IN_FLIGHT_MAX: usize = 4;
/// Scheduled jobs one `Due` entry queues at most (each takes one of the entry's queue
/// positions, of which there are `QUEUE_POSITIONS_PER_ENTRY`).
pub const DUE_JOBS_PER_ENTRY_MAX: usize = 1024;
/// A wall-clock reading that differs from what a coordinator's clock expects (its last reading
/// plus the monotonic time since) by at least this much is a step, and is taken; a smaller
/// difference is drift, and is ignored, so stamps do not jitter.
pub const WALL_CLOCK_STEP_MIN: std::time::Duration = std::time::Duration::from_secs(1);
/// Most jobs one job may wait for (`after`).
pub const AFTER_JOBS_MAX: usize = 64;
/// Most of the jobs waiting for a job that its view lists (`waited_on_by`), so a view of a job
/// many wait for still fits a frame.
pub const WAITING_SHOWN_MAX: usize = 64;
/// How far ahead of the leader's clock a job may be scheduled: a year and a day.
pub const RUN_AT_AHEAD_MILLIS_MAX: u64 = 366 * 24 * 60 * 60 * 1000;
/// How often a leader checks whether retention has jobs to purge.
pub const RETENTION_SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Most records one persistence batch carries before the coordinator starts a new one.
pub const PERSIST_BATCH_RECORDS_MAX: usize = 4096;

/// Applied log entries a member keeps in memory beyond what every follower holds, so a follower
/// that falls a little behind is sent entries rather than the whole table (the default of
/// `CoordinatorConfig::log_retained_entries`).
pub const LOG_RETAINED_ENTRIES_MAX: u64 = 4096;
/// Bytes of applied log entries a member keeps in memory at most (whatever the entry count).
pub const LOG_RETAINED_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Entries in one `APPEND` (the frame limit may cut it shorter).
pub const APPEND_ENTRIES_MAX: usize = 1024;
/// `APPEND`s in flight to one follower before the leader waits for acknowledgements.
pub const APPENDS_IN_FLIGHT_MAX: usize = 32;
/// Room reserved for an `APPEND`'s or `SNAPSHOT`'s own fields around its entries or data.
pub const PEER_ENVELOPE_BYTES: usize = 1024;
/// Snapshot chunks in flight to one follower.
pub const SNAPSHOT_CHUNKS_IN_FLIGHT_MAX: usize = 4;
/// Largest snapshot a follower accepts (it is held in memory while it arrives).
pub const SNAPSHOT_BYTES_MAX: u64 = 4 * 1024 * 1024 * 1024;
/// Most members a coordinator group may have.
pub const GROUP_MEMBERS_MAX: usize = 7;
/// Client and worker messages a newly elected leader holds while it catches up (until its first
/// entry of the term is applied); beyond it they are redirected.
pub const PARKED_INPUTS_MAX: usize = 4096;
/// Reads waiting for the leader to confirm it still leads.
pub const READS_IN_FLIGHT_MAX: usize = 65_536;
/// Keyed `SUBMIT`s parked until the submission their key names, still being written, applies;
/// beyond it a resend is refused as retryable.
pub const KEYED_RESENDS_PARKED_MAX: usize = 4096;
/// Coordinator addresses a worker or client dials in turn (configured plus learned).
pub const DIAL_ADDRESSES_MAX: usize = 64;

/// Shortest shared secret (worker or peer) and shortest client token, in bytes: 24 random
/// characters from a 64-letter alphabet carry 144 bits, beyond any guessing.
pub const CREDENTIAL_BYTES_MIN: usize = 24;
/// Longest shared secret or client token a file may hold.
pub const CREDENTIAL_BYTES_MAX: usize = 512;
/// Most tokens a client tokens file may list.
pub const TOKENS_MAX: usize = 10_000;
/// Longest name a token may carry (it is logged and stored with the jobs it submits).
pub const TOKEN_NAME_BYTES_MAX: usize = 64;
/// The largest frame a connection may send before it has authenticated: every handshake
/// message fits in a few hundred bytes, so a stranger's frame is read under this bound, not
/// the frame limit.
pub const HANDSHAKE_FRAME_BYTES_MAX: usize = 4096;

// Queues, priorities and fairness keys.

/// Distinct queues the job table holds (queues are created by their first job and kept).
pub const QUEUES_MAX: usize = 1000;
/// Bytes of a queue name.
pub const QUEUE_NAME_BYTES_MAX: usize = 64;
/// A queue's largest weight (its share against a queue of weight 1).
pub const QUEUE_WEIGHT_MAX: u32 = 1000;
/// Bytes of a fairness key.
pub const FAIRNESS_KEY_BYTES_MAX: usize = 128;
/// A queued job waiting this long goes before the younger jobs of its lane, whatever their
/// priority, unless its queue sets another bound.
pub const PRIORITY_AGING_MILLIS_DEFAULT: u64 = 60_000;
/// The longest ageing bound a queue may set.
pub const PRIORITY_AGING_MILLIS_MAX: u64 = 24 * 60 * 60 * 1000;
/// A queue's largest concurrency limit (its jobs running at once).
pub const QUEUE_CONCURRENCY_MAX: u32 = 1_000_000;
/// The most starts a rate limit may allow per period.
pub const QUEUE_RATE_STARTS_MAX: u32 = 1_000_000;
/// The longest period a rate limit may count starts over: a day.
pub const QUEUE_RATE_PERIOD_MILLIS_MAX: u64 = 24 * 60 * 60 * 1000;
/// The highest admission limit a queue may be given (the global limit bounds it anyway).
pub const QUEUE_MAX_ACTIVE_JOBS_MAX: u64 = 100_000_000;
