//! The checker's own reading of the checks a submission must pass (docs/PROTOCOL.md, `SUBMIT`
//! steps 1 to 8, and `SUBMIT_BATCH`), written from the protocol and not from the leader's code:
//! which submissions must be refused with an `ERROR` and with which code, which may be, and
//! whether a job bound to an idempotency key was submitted with the same options as a resend.
//!
//! Task validity is judged against the world's own list of the invalid tasks its workload
//! sends ([`invalid_tasks`]): every other task the workload sends is built from a valid task
//! spec. Request fields, partition counts and admission slots are judged from the submission's
//! own fields.

use std::fmt;
use std::sync::OnceLock;

use herder_core::ids::RequestId;
use herder_core::limits::{
    AFTER_JOBS_MAX, ASSIGN_ENVELOPE_BYTES, ATTEMPTS_MAX, ATTEMPT_ERROR_BYTES_MAX,
    IDEMPOTENCY_KEY_BYTES_MAX, JOB_TIMEOUT_MILLIS_MAX, PARTITIONS_MAX, PARTITION_VIEW_BYTES_MAX,
    RUN_AT_AHEAD_MILLIS_MAX, SUBMIT_BATCH_JOBS_MAX, SUBMIT_RESULT_BYTES_MAX,
};
use herder_core::protocol::{ErrorCode, JobSubmission, Partitions};
use herder_core::time::UnixMillis;
use serde_json::{json, Value};

use crate::model::ModelJob;

/// What the coordinators of a run were configured with, as far as submissions go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rules {
    pub max_active_jobs: u64,
    pub default_max_attempts: u32,
    pub max_frame_bytes: usize,
}

impl Default for Rules {
    fn default() -> Rules {
        Rules {
            max_active_jobs: u64::MAX,
            default_max_attempts: 3,
            max_frame_bytes: usize::MAX,
        }
    }
}

/// A `run_at_unix_ms` at or beyond this is too far ahead of any coordinator's clock in a run:
/// a run lasts minutes of the world's time from its epoch and clocks are stepped by at most a
/// minute, while the bound is 366 days. (The workload sends times either within seconds of
/// its clock or at least this far ahead.)
pub const TOO_FAR_AHEAD: UnixMillis = UnixMillis(
    crate::world::WORLD_WALL_EPOCH.0 + RUN_AT_AHEAD_MILLIS_MAX + 30 * 24 * 60 * 60 * 1000,
);

/// The kinds whose jobs are split into partitions.
const DATA_PARALLEL: [&str; 3] = ["max", "prime-count-list", "prime-sum"];

/// The tasks the workload sends knowing they are invalid, each with what is wrong with it.
pub fn invalid_tasks() -> &'static [(Value, &'static str)] {
    static TASKS: OnceLock<Vec<(Value, &'static str)>> = OnceLock::new();
    TASKS.get_or_init(|| {
        vec![
            (
                json!({"kind": "resize image", "payload": {}}),
                "a task name with a space",
            ),
            (
                json!({"kind": "sleep", "milliseconds": 86_400_001}),
                "a sleep over one day",
            ),
            (json!({"kind": "sha256"}), "a sha256 task without its text"),
            (
                json!({"kind": "word-count", "text": "a b", "extra": true}),
                "a built-in task with a field it does not have",
            ),
            (
                json!({"kind": "fail", "fail_until_attempt": 0}),
                "a fail task that never fails",
            ),
            (json!({"milliseconds": 5}), "a task without a kind"),
            (json!(["sleep", 5]), "a task that is not an object"),
            (
                json!({"kind": "resize", "payload": {"n": 1}, "priority": 1}),
                "a user task with a field other than kind and payload",
            ),
        ]
    })
}

/// Why the task is invalid, if it is one of [`invalid_tasks`].
fn invalid_task(task: &Value) -> Option<&'static str> {
    invalid_tasks()
        .iter()
        .find(|(bad, _)| bad == task)
        .map(|(_, why)| *why)
}

/// A task's kind, as its JSON names it.
fn kind(task: &Value) -> Option<&str> {
    task.get("kind").and_then(Value::as_str)
}

pub fn is_data_parallel(task: &Value) -> bool {
    kind(task).is_some_and(|k| DATA_PARALLEL.contains(&k))
}

/// The items a data-parallel task's input holds: list entries, or the numbers of a range.
fn items(task: &Value) -> u64 {
    match kind(task) {
        Some("max" | "prime-count-list") => task
            .get("numbers")
            .and_then(Value::as_array)
            .map_or(0, |numbers| numbers.len() as u64),
        Some("prime-sum") => {
            let bound = |field: &str| task.get(field).and_then(Value::as_i64).unwrap_or(0);
            let span = i128::from(bound("end")) - i128::from(bound("start")) + 1;
            u64::try_from(span.max(0)).unwrap_or(u64::MAX)
        }
        _ => 1,
    }
}

/// The bytes of `value` as compact JSON.
fn json_len(value: &Value) -> usize {
    serde_json::to_vec(value).map_or(usize::MAX, |bytes| bytes.len())
}

/// The fewest admission slots a submission can take: the job, and for a data-parallel task
/// one per partition (`min(asked, items)`; `auto` is at least one per live worker, so at least
/// `min(1, items)`).
pub fn fewest_slots(task: &Value, partitions: Option<Partitions>) -> u64 {
    if !is_data_parallel(task) {
        return 1;
    }
    let asked = match partitions {
        Some(Partitions::Count(n)) => u64::from(n),
        _ => 1,
    };
    1 + asked.min(items(task))
}

/// What the checks make of one submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The first of steps 1 to 6 it fails: the one `ERROR` code that fits, and why.
    pub invalid: Option<(ErrorCode, &'static str)>,
    /// Step 8: the job and its partitions need more admission slots than the limit ever
    /// allows (`INVALID_REQUEST`), unless its key answers it first (step 7 comes before).
    pub oversize: bool,
    /// Large enough that steps 2 or 8 may refuse it as `INVALID_TASK` (a reply about it might
    /// not fit a frame). Sizes are judged with a margin, so this only permits that answer; the
    /// workload sends nothing near the frame limit.
    pub maybe_too_large: bool,
}

impl Verdict {
    /// A submission every check passes, whatever its key is bound to.
    pub fn passes(&self) -> bool {
        self.invalid.is_none() && !self.oversize && !self.maybe_too_large
    }
}

/// Judges `job` by steps 1 to 6 and 8 of `SUBMIT`, in the protocol's order.
pub fn verdict(job: &JobSubmission, rules: &Rules) -> Verdict {
    let task = &job.task;
    let dp = is_data_parallel(task);
    let invalid_request = |why| Some((ErrorCode::InvalidRequest, why));
    let max_attempts = job.max_attempts.unwrap_or(rules.default_max_attempts);
    let invalid = if let Some(why) = invalid_task(task) {
        Some((ErrorCode::InvalidTask, why))
    } else if !(1..=ATTEMPTS_MAX).contains(&max_attempts) {
        invalid_request("a max_attempts out of 1..=100")
    } else if job.partitions.is_some() && !dp {
        invalid_request("a partition request for a task that is not data-parallel")
    } else if matches!(job.partitions, Some(Partitions::Count(n)) if !(1..=PARTITIONS_MAX).contains(&n))
    {
        invalid_request("a partition count out of 1..=1024")
    } else if job
        .timeout_millis
        .is_some_and(|t| !(1..=JOB_TIMEOUT_MILLIS_MAX).contains(&t))
    {
        invalid_request("a timeout_millis out of 1..=86,400,000")
    } else if job
        .idempotency_key
        .as_ref()
        .is_some_and(|k| k.is_empty() || k.len() > IDEMPOTENCY_KEY_BYTES_MAX)
    {
        invalid_request("an idempotency key not of 1 to 256 bytes")
    } else if job.queue.as_deref().is_some_and(|q| !label_ok(q, 64)) {
        invalid_request("a queue name not of 1 to 64 letters, digits and -_.:/")
    } else if job.priority.is_some_and(|p| p > 9) {
        invalid_request("a priority out of 0..=9")
    } else if job
        .fairness_key
        .as_deref()
        .is_some_and(|k| !label_ok(k, 128))
    {
        invalid_request("a fairness key not of 1 to 128 letters, digits and -_.:/")
    } else if job.run_at_unix_ms.is_some() && job.delay_millis.is_some() {
        invalid_request("both a run_at_unix_ms and a delay_millis")
    } else if job
        .delay_millis
        .is_some_and(|d| d > RUN_AT_AHEAD_MILLIS_MAX)
    {
        invalid_request("a delay_millis over 366 days")
    } else if job.run_at_unix_ms.is_some_and(|at| at >= TOO_FAR_AHEAD.0) {
        invalid_request("a run_at_unix_ms over 366 days ahead")
    } else if dp && (job.run_at_unix_ms.is_some() || job.delay_millis.is_some()) {
        invalid_request("a delayed data-parallel job")
    } else if job.after.is_empty() && job.after_any_outcome {
        invalid_request("after_any_outcome without jobs to wait for")
    } else if job.after.len() > AFTER_JOBS_MAX {
        invalid_request("more than 64 jobs to wait for")
    } else if job
        .after
        .iter()
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        != job.after.len()
    {
        invalid_request("a job to wait for named twice")
    } else if dp && !job.after.is_empty() {
        invalid_request("a data-parallel job waiting for others")
    } else {
        None
    };
    // Step 8, for a data-parallel task: `auto` resolves to at most what admission leaves room
    // for (never under one partition), so only a count can need more slots than the limit.
    let pieces = match job.partitions {
        Some(Partitions::Count(n)) => u64::from(n).min(items(task)),
        _ => 1.min(items(task)),
    };
    let oversize = dp && invalid.is_none() && 1 + pieces > rules.max_active_jobs;
    // Step 2 (the task in a `TASK_ASSIGN`) and, for a data-parallel task, step 8 (a view of
    // the job with a line per partition), with a margin of a frame envelope either way.
    let key_bytes = job
        .idempotency_key
        .as_ref()
        .map_or(0, |k| json_len(&Value::from(k.as_str())));
    let most_pieces = items(task).min(u64::from(PARTITIONS_MAX)) as usize;
    let mut bytes = json_len(task)
        .saturating_add(key_bytes)
        .saturating_add(2 * ASSIGN_ENVELOPE_BYTES);
    if dp {
        bytes = bytes
            .saturating_add(most_pieces.saturating_mul(PARTITION_VIEW_BYTES_MAX))
            .saturating_add(ATTEMPT_ERROR_BYTES_MAX);
    }
    let maybe_too_large = bytes > rules.max_frame_bytes;
    Verdict {
        invalid,
        oversize,
        maybe_too_large,
    }
}

/// A queue name or fairness key as the protocol defines them: 1 to `max` bytes of ASCII
/// letters, digits and `-_.:/`, starting with a letter or a digit.
fn label_ok(label: &str, max: usize) -> bool {
    !label.is_empty()
        && label.len() <= max
        && label.as_bytes()[0].is_ascii_alphanumeric()
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b))
}

/// The most jobs a batch may hold: `SUBMIT_BATCH_JOBS_MAX`, and no more than its reply holds.
pub fn batch_jobs_max(rules: &Rules) -> usize {
    let fit = rules.max_frame_bytes.saturating_sub(ASSIGN_ENVELOPE_BYTES) / SUBMIT_RESULT_BYTES_MAX;
    SUBMIT_BATCH_JOBS_MAX.min(fit)
}

/// How the job bound to a key differs from a submission of that key (none: the same task, max
/// attempts with the default filled in, timeout, and for a data-parallel task the same
/// partition request, no request counting as `auto`).
pub fn differences(job: &ModelJob, sent: &JobSubmission, rules: &Rules) -> Option<String> {
    if job.task.to_json() != sent.task {
        return Some(format!(
            "task is {} where this asks {}",
            job.task.to_json(),
            sent.task
        ));
    }
    let max_attempts = sent.max_attempts.unwrap_or(rules.default_max_attempts);
    if job.max_attempts != max_attempts {
        return Some(format!(
            "max attempts are {} where this asks {max_attempts}",
            job.max_attempts
        ));
    }
    if job.timeout_millis != sent.timeout_millis {
        return Some(format!(
            "timeout is {:?} where this asks {:?}",
            job.timeout_millis, sent.timeout_millis
        ));
    }
    let queue = sent
        .queue
        .as_deref()
        .unwrap_or(herder_core::queues::DEFAULT_QUEUE);
    let priority = sent.priority.unwrap_or(0);
    let key = sent.fairness_key.as_deref().unwrap_or("");
    if (job.queue.as_str(), job.priority, job.fairness_key.as_str()) != (queue, priority, key) {
        return Some(format!(
            "queue, priority and fairness key are {:?}, {}, {:?} where this asks {queue:?}, {priority}, {key:?}",
            job.queue, job.priority, job.fairness_key
        ));
    }
    if is_data_parallel(&sent.task) {
        let asked = Some(sent.partitions.unwrap_or(Partitions::Auto));
        if job.partitions_asked != asked {
            return Some(format!(
                "partition request is {:?} where this asks {asked:?}",
                job.partitions_asked
            ));
        }
    }
    None
}

/// An error code as the protocol spells it.
pub fn code_name(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::FrameTooLarge => "FRAME_TOO_LARGE",
        ErrorCode::EmptyFrame => "EMPTY_FRAME",
        ErrorCode::InvalidUtf8 => "INVALID_UTF8",
        ErrorCode::InvalidJson => "INVALID_JSON",
        ErrorCode::MissingType => "MISSING_TYPE",
        ErrorCode::UnknownType => "UNKNOWN_TYPE",
        ErrorCode::InvalidMessage => "INVALID_MESSAGE",
        ErrorCode::InvalidTask => "INVALID_TASK",
        ErrorCode::InvalidRequest => "INVALID_REQUEST",
        ErrorCode::JobNotFound => "JOB_NOT_FOUND",
        ErrorCode::IdempotencyConflict => "IDEMPOTENCY_CONFLICT",
        ErrorCode::NotRegistered => "NOT_REGISTERED",
        ErrorCode::TooManyWaiters => "TOO_MANY_WAITERS",
        ErrorCode::ReplyTooLarge => "REPLY_TOO_LARGE",
        ErrorCode::TooManyConnections => "TOO_MANY_CONNECTIONS",
        ErrorCode::Unauthenticated => "UNAUTHENTICATED",
        ErrorCode::Forbidden => "FORBIDDEN",
        ErrorCode::TooManyQueues => "TOO_MANY_QUEUES",
    }
}

/// Which submission an answer is about, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Subject {
    /// A `SUBMIT`: its connection and request.
    Submit { conn: usize, request: RequestId },
    /// Job `index` of a `SUBMIT_BATCH`.
    BatchJob {
        conn: usize,
        request: RequestId,
        index: usize,
    },
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::Submit { conn, request } => {
                write!(f, "the SUBMIT of request {} on conn {conn}", request.0)
            }
            Subject::BatchJob {
                conn,
                request,
                index,
            } => write!(
                f,
                "job {index} of the SUBMIT_BATCH of request {} on conn {conn}",
                request.0
            ),
        }
    }
}
