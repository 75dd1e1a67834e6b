//! The checks of a submitted job that depend on nothing but the job and the configuration: its
//! task, its sizes against the frames that will carry it, its attempts, timeout, key and
//! partition request.

use crate::coordinator::member::Member;
use crate::limits::{
    AFTER_JOBS_MAX, ASSIGN_ENVELOPE_BYTES, ATTEMPTS_MAX, IDEMPOTENCY_KEY_BYTES_MAX,
    JOB_TIMEOUT_MILLIS_MAX, PARTITIONS_MAX, RUN_AT_AHEAD_MILLIS_MAX,
};
use crate::protocol::codec::binary_encoded_len;
use crate::protocol::{ErrorCode, JobSubmission, Partitions};
use crate::queues::{check_fairness_key, check_priority, check_queue_name, default_queue};
use crate::table::SubmitOptions;
use crate::tasks::TaskSpec;
use crate::time::UnixMillis;

/// More than any value's binary form can take against its JSON (see `check_submission`).
const BINARY_GROWTH_MAX: usize = 3;

/// A job that passed every check that depends on nothing but itself.
pub(super) struct Checked {
    pub(super) task: TaskSpec,
    /// The task's size as JSON.
    pub(super) encoded: usize,
    pub(super) max_attempts: u32,
    /// What the job records of its partition request, and a keyed resend must repeat.
    pub(super) partitions_asked: Option<Partitions>,
    pub(super) queue: String,
    pub(super) priority: u8,
    pub(super) fairness_key: Option<String>,
    /// When it may run, if that is still ahead of this leader's clock (a delay resolved
    /// against it); `None` runs it now.
    pub(super) run_at: Option<UnixMillis>,
}

impl Checked {
    pub(super) fn options<'a>(&'a self, submission: &JobSubmission) -> SubmitOptions<'a> {
        SubmitOptions {
            task: &self.task,
            max_attempts: self.max_attempts,
            partitions_asked: self.partitions_asked,
            timeout_millis: submission.timeout_millis,
            queue: &self.queue,
            priority: self.priority,
            fairness_key: self.fairness_key.as_deref(),
        }
    }
}

/// Every check of a job that depends on nothing but the job and the configuration.
pub(super) fn check_submission(
    m: &Member,
    s: &JobSubmission,
) -> Result<Checked, (ErrorCode, String)> {
    let task = TaskSpec::from_json(&s.task).map_err(|e| (ErrorCode::InvalidTask, e.to_string()))?;
    // The assignment carries the task as JSON; the log entry carries it and the key in the
    // coordinators' binary form, which is smaller for most tasks but not all (a float takes
    // 9 bytes there), and must fit one APPEND. Both must fit a frame.
    let json = serde_json::to_vec(&task).map_or(usize::MAX, |bytes| bytes.len());
    let key_bytes = s.idempotency_key.as_ref().map_or(0, |k| {
        let json = serde_json::to_vec(k).map_or(usize::MAX, |bytes| bytes.len());
        json.max(binary_encoded_len(k).unwrap_or(usize::MAX))
    });
    // No task's binary form takes three times its JSON (the worst value, a short float, takes 3
    // bytes there and 9 here), so it is counted only for a task that could come near the limit:
    // the tiny tasks a busy leader mostly admits are not written out twice.
    let far_below_limit = json
        .saturating_mul(BINARY_GROWTH_MAX)
        .saturating_add(key_bytes)
        .saturating_add(ASSIGN_ENVELOPE_BYTES)
        <= m.config.max_frame_bytes;
    let binary = if far_below_limit {
        0
    } else {
        binary_encoded_len(&task).unwrap_or(usize::MAX)
    };
    let (encoded, form) = if binary > json {
        (binary, "in the coordinators' binary form")
    } else {
        (json, "as JSON")
    };
    if encoded
        .saturating_add(key_bytes)
        .saturating_add(ASSIGN_ENVELOPE_BYTES)
        > m.config.max_frame_bytes
    {
        return Err((
            ErrorCode::InvalidTask,
            format!(
                "the task is {encoded} bytes {form}; its assignment or log entry would not fit the frame limit of {} bytes",
                m.config.max_frame_bytes
            ),
        ));
    }
    let max_attempts = s.max_attempts.unwrap_or(m.config.default_max_attempts);
    if !(1..=ATTEMPTS_MAX).contains(&max_attempts) {
        return Err((
            ErrorCode::InvalidRequest,
            format!("max_attempts must be between 1 and {ATTEMPTS_MAX} (got {max_attempts})"),
        ));
    }
    check_partitions_request(&task, s.partitions).map_err(|e| (ErrorCode::InvalidRequest, e))?;
    if let Some(millis) = s.timeout_millis {
        if !(1..=JOB_TIMEOUT_MILLIS_MAX).contains(&millis) {
            return Err((
                ErrorCode::InvalidRequest,
                format!(
                    "timeout_millis must be between 1 and {JOB_TIMEOUT_MILLIS_MAX} (got {millis})"
                ),
            ));
        }
    }
    if let Some(key) = &s.idempotency_key {
        if key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
            return Err((
                ErrorCode::InvalidRequest,
                format!(
                    "idempotency key must be 1 to {IDEMPOTENCY_KEY_BYTES_MAX} bytes (got {})",
                    key.len()
                ),
            ));
        }
    }
    let partitions_asked = task
        .is_data_parallel()
        .then(|| s.partitions.unwrap_or(Partitions::Auto));
    let invalid = |e: String| (ErrorCode::InvalidRequest, e);
    let queue = s.queue.clone().unwrap_or_else(default_queue);
    check_queue_name(&queue).map_err(invalid)?;
    let priority = s.priority.unwrap_or(0);
    check_priority(priority).map_err(invalid)?;
    if let Some(key) = &s.fairness_key {
        check_fairness_key(key).map_err(invalid)?;
    }
    let run_at = check_run_at(&task, s, m.wall_now()).map_err(invalid)?;
    check_after(&task, s).map_err(invalid)?;
    Ok(Checked {
        task,
        encoded,
        max_attempts,
        partitions_asked,
        queue,
        priority,
        fairness_key: s.fairness_key.clone(),
        run_at,
    })
}

/// The wall time a job asks to wait for, resolved against `now` (the leader's clock): `None`
/// if it asks for none or for a time already reached. At most `RUN_AT_AHEAD_MILLIS_MAX` ahead,
/// one way of asking, and not for a data-parallel job.
fn check_run_at(
    task: &TaskSpec,
    s: &JobSubmission,
    now: UnixMillis,
) -> Result<Option<UnixMillis>, String> {
    let run_at = match (s.run_at_unix_ms, s.delay_millis) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err("give run_at_unix_ms or delay_millis, not both".to_owned());
        }
        (Some(at), None) => {
            let ahead = at.saturating_sub(now.0);
            if ahead > RUN_AT_AHEAD_MILLIS_MAX {
                return Err(format!(
                    "run_at_unix_ms is {ahead} ms ahead of the leader's clock; the most is {RUN_AT_AHEAD_MILLIS_MAX} (366 days)"
                ));
            }
            UnixMillis(at)
        }
        (None, Some(delay)) => {
            if delay > RUN_AT_AHEAD_MILLIS_MAX {
                return Err(format!(
                    "delay_millis must be at most {RUN_AT_AHEAD_MILLIS_MAX} (366 days) (got {delay})"
                ));
            }
            UnixMillis(now.0.saturating_add(delay))
        }
    };
    if task.is_data_parallel() {
        return Err(format!(
            "a {} task splits across workers at once and cannot be delayed",
            task.kind()
        ));
    }
    Ok(Some(run_at).filter(|at| *at > now))
}

/// A `partitions` request is for a data-parallel task and within `1..=PARTITIONS_MAX`.
fn check_partitions_request(task: &TaskSpec, partitions: Option<Partitions>) -> Result<(), String> {
    match partitions {
        Some(_) if !task.is_data_parallel() => Err(format!(
            "partitions apply only to max, prime-count-list and prime-sum tasks, not {}",
            task.kind()
        )),
        Some(Partitions::Count(n)) if !(1..=PARTITIONS_MAX).contains(&n) => Err(format!(
            "partitions must be between 1 and {PARTITIONS_MAX} (got {n})"
        )),
        _ => Ok(()),
    }
}

/// The jobs a job waits for: at most `AFTER_JOBS_MAX`, each named once, not for a
/// data-parallel job, and `after_any_outcome` only with some. (Whether they exist is for apply
/// to say: one may be written just before this job.)
fn check_after(task: &TaskSpec, s: &JobSubmission) -> Result<(), String> {
    if s.after.is_empty() {
        return if s.after_any_outcome {
            Err("after_any_outcome needs jobs to wait for in after".to_owned())
        } else {
            Ok(())
        };
    }
    if s.after.len() > AFTER_JOBS_MAX {
        return Err(format!(
            "after names {} jobs; the most is {AFTER_JOBS_MAX}",
            s.after.len()
        ));
    }
    let distinct: std::collections::BTreeSet<_> = s.after.iter().collect();
    if distinct.len() != s.after.len() {
        return Err("after names a job twice".to_owned());
    }
    if task.is_data_parallel() {
        return Err(format!(
            "a {} task splits across workers at once and cannot wait for other jobs",
            task.kind()
        ));
    }
    Ok(())
}
