//! Running a task: how a worker should schedule it ([`TaskSpec::plan`]), the pure computation
//! itself ([`execute`], [`execute_until`]) and what comes out of it ([`TaskOutput`] or a
//! [`TaskFailure`]). Nothing here waits, reads a clock or touches the OS; a `sleep` task's wait
//! belongs to the runtime.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{range_span, TaskSpec};
use crate::dataparallel::{is_prime, primes_in_range};
use crate::ids::Attempt;
use crate::limits::{INLINE_NUMBERS_MAX, INLINE_PRIME_LIMIT_MAX, INLINE_TEXT_BYTES_MAX};

/// How a worker runs a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskPlan {
    /// Wait `duration` (the runtime owns the timer), then report `then`.
    Sleep {
        /// How long to wait before reporting.
        duration: Duration,
        /// The outcome to report once the wait is over.
        then: Result<TaskOutput, TaskFailure>,
    },
    /// Call [`execute`]; it finishes without waiting, but may take up to about a second of CPU,
    /// so a runtime should run it off its event loop.
    Compute,
    /// Call [`execute`] in place: it costs microseconds (small text, small limit, `fail`), less
    /// than handing it to another thread would.
    Inline,
}

/// The result of a task that succeeded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum TaskOutput {
    /// A `sleep` task waited this long.
    Slept {
        /// How long the task waited.
        milliseconds: u64,
    },
    /// A `word-count` task found this many words.
    WordCount {
        /// Number of whitespace-separated words.
        words: u64,
    },
    /// A `sha256` task's digest.
    Sha256 {
        /// Lowercase hex, 64 characters.
        hex: String,
    },
    /// A `prime-count` task's answer.
    PrimeCount {
        /// The limit asked for.
        limit: u64,
        /// Number of primes `p <= limit`.
        count: u64,
    },
    /// A `fail` task finally succeeded.
    Succeeded {
        /// The attempt that succeeded.
        attempt: u32,
    },
    /// A `max` task's answer.
    Max {
        /// The largest number.
        max: i64,
    },
    /// A `prime-count-list` task's answer.
    PrimeCountList {
        /// How many of the numbers are prime.
        count: u64,
    },
    /// A `prime-sum` task's answer.
    PrimeSum {
        /// How many primes the range holds.
        count: u64,
        /// Their sum, exact. A decimal string on the wire, since it can exceed 2^64 (and
        /// JavaScript's 2^53).
        #[serde(with = "decimal_u128")]
        sum: u128,
    },
    /// An `exec` task's command exited 0; what it wrote (each cut to
    /// [`crate::limits::EXEC_OUTPUT_BYTES_MAX`], lossily decoded as UTF-8).
    Exec {
        stdout: String,
        stderr: String,
        /// Some of stdout was dropped.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stdout_truncated: bool,
        /// Some of stderr was dropped.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stderr_truncated: bool,
    },
    /// What a user task's handler returned.
    Value {
        /// Any JSON, at most [`crate::limits::TASK_RESULT_BYTES_MAX`] bytes of it.
        value: serde_json::Value,
    },
}

impl TaskOutput {
    /// A result too large to keep: its size as compact JSON and the limit, if it is over.
    pub fn oversize(&self) -> Option<(usize, usize)> {
        let max = crate::limits::TASK_RESULT_BYTES_MAX;
        let bytes = match self {
            TaskOutput::Value { value } => super::json_bytes(value),
            TaskOutput::Exec { .. } => serde_json::to_vec(self).map_or(usize::MAX, |v| v.len()),
            // Other built-in outputs are a few numbers or a digest.
            _ => return None,
        };
        (bytes > max).then_some((bytes, max))
    }
}

/// `u128` as a decimal JSON string.
mod decimal_u128 {
    use serde::{de::Error, Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &u128, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(value)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u128, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(D::Error::custom(format!(
                "expected a decimal string of digits, found {text:?}"
            )));
        }
        text.parse().map_err(D::Error::custom)
    }
}

impl fmt::Display for TaskOutput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskOutput::Slept { milliseconds } => write!(f, "slept {milliseconds} ms"),
            TaskOutput::WordCount { words } => {
                write!(f, "{words} {}", if *words == 1 { "word" } else { "words" })
            }
            TaskOutput::Sha256 { hex } => f.write_str(hex),
            TaskOutput::PrimeCount { limit, count } => write!(
                f,
                "{count} {} <= {limit}",
                if *count == 1 { "prime" } else { "primes" }
            ),
            TaskOutput::Succeeded { attempt } => write!(f, "succeeded on attempt {attempt}"),
            TaskOutput::Max { max } => write!(f, "max {max}"),
            TaskOutput::PrimeCountList { count } => write!(
                f,
                "{count} {}",
                if *count == 1 { "prime" } else { "primes" }
            ),
            TaskOutput::PrimeSum { count, sum } => write!(
                f,
                "sum {sum} of {count} {}",
                if *count == 1 { "prime" } else { "primes" }
            ),
            TaskOutput::Value { value } => write!(f, "{value}"),
            TaskOutput::Exec { stdout, .. } => {
                let line = stdout.lines().next().unwrap_or("");
                write!(f, "exited 0; {} bytes of output: {line}", stdout.len())
            }
        }
    }
}

/// Why a task attempt failed: retryable (the job runs again while attempts remain) or
/// permanent (the job fails at once, whatever attempts remain).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct TaskFailure {
    /// Human-readable reason.
    pub message: String,
    /// Retrying cannot help (bad input, a refused command): fail the job now.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub permanent: bool,
}

impl TaskFailure {
    /// A retryable failure with the given message.
    pub fn new(message: impl Into<String>) -> TaskFailure {
        TaskFailure {
            message: message.into(),
            permanent: false,
        }
    }

    /// A permanent failure: the job fails at once.
    pub fn permanent(message: impl Into<String>) -> TaskFailure {
        TaskFailure {
            message: message.into(),
            permanent: true,
        }
    }
}

impl TaskSpec {
    /// How a worker runs this task on `attempt`.
    ///
    /// A valid `sleep` task waits (the runtime owns timers) and then reports its output;
    /// everything else, including any invalid spec, is [`TaskPlan::Compute`]: [`execute`]
    /// answers right away (with a failure, for an invalid spec).
    pub fn plan(&self, attempt: Attempt) -> TaskPlan {
        match self {
            TaskSpec::Sleep { milliseconds } if self.validate().is_ok() => TaskPlan::Sleep {
                duration: Duration::from_millis(*milliseconds),
                then: execute(self, attempt),
            },
            TaskSpec::WordCount { text } | TaskSpec::Sha256 { text }
                if text.len() <= INLINE_TEXT_BYTES_MAX =>
            {
                TaskPlan::Inline
            }
            TaskSpec::PrimeCount { limit } if *limit <= INLINE_PRIME_LIMIT_MAX => TaskPlan::Inline,
            TaskSpec::Fail { .. } | TaskSpec::Max { .. } => TaskPlan::Inline,
            // Cheap only while the numbers are small too: a large prime costs a dozen
            // Miller-Rabin rounds, and a range far out a sieve up to its square root.
            TaskSpec::PrimeCountList { numbers }
                if numbers.len() <= INLINE_NUMBERS_MAX
                    && numbers
                        .iter()
                        .all(|n| n.unsigned_abs() <= INLINE_PRIME_LIMIT_MAX) =>
            {
                TaskPlan::Inline
            }
            TaskSpec::PrimeSum { start, end }
                if start <= end
                    && end.unsigned_abs() <= INLINE_PRIME_LIMIT_MAX
                    && range_span(*start, *end) <= u128::from(INLINE_PRIME_LIMIT_MAX) =>
            {
                TaskPlan::Inline
            }
            _ => TaskPlan::Compute,
        }
    }
}

/// Runs the task to completion on the calling thread.
///
/// Pure and deterministic in `(spec, attempt)`. A `sleep` task returns its output without
/// sleeping; the runtime does the waiting (see [`TaskSpec::plan`]). A spec that fails
/// [`TaskSpec::validate`] (one that bypassed [`TaskSpec::from_json`]) is not run: it fails with
/// the validation message, so an oversized request cannot tie up a worker.
pub fn execute(spec: &TaskSpec, attempt: Attempt) -> Result<TaskOutput, TaskFailure> {
    match execute_until(spec, attempt, &mut || false) {
        Some(outcome) => outcome,
        None => Err(TaskFailure::new("stopped")),
    }
}

/// [`execute`], asking `should_stop` now and then during long computations (a `prime-sum`
/// range); `None` if it said stop. Lets a worker cancel a long attempt cooperatively.
pub fn execute_until(
    spec: &TaskSpec,
    attempt: Attempt,
    should_stop: &mut dyn FnMut() -> bool,
) -> Option<Result<TaskOutput, TaskFailure>> {
    if let Err(error) = spec.validate() {
        return Some(Err(TaskFailure::permanent(format!(
            "invalid task: {error}"
        ))));
    }
    Some(match spec {
        TaskSpec::User(task) => Err(TaskFailure::permanent(format!(
            "{:?} is not a built-in task; a worker serves it with a handler of its own",
            task.name
        ))),
        TaskSpec::Exec { .. } => Err(TaskFailure::permanent(
            "exec tasks run only on workers that allow commands (--allow-exec)",
        )),
        TaskSpec::Max { numbers } => numbers
            .iter()
            .max()
            .map(|&max| TaskOutput::Max { max })
            .ok_or_else(|| TaskFailure::new("max of an empty list")),
        TaskSpec::PrimeCountList { numbers } => Ok(TaskOutput::PrimeCountList {
            count: numbers.iter().filter(|&&n| is_prime(n)).count() as u64,
        }),
        TaskSpec::PrimeSum { start, end } => {
            let stats = primes_in_range(*start, *end, should_stop)?;
            Ok(TaskOutput::PrimeSum {
                count: stats.count,
                sum: stats.sum,
            })
        }
        TaskSpec::Sleep { milliseconds } => Ok(TaskOutput::Slept {
            milliseconds: *milliseconds,
        }),
        TaskSpec::WordCount { text } => Ok(TaskOutput::WordCount {
            words: count_words(text),
        }),
        TaskSpec::Sha256 { text } => Ok(TaskOutput::Sha256 {
            hex: sha256_hex(text),
        }),
        TaskSpec::PrimeCount { limit } => {
            let end = i64::try_from(*limit).unwrap_or(i64::MAX);
            let stats = primes_in_range(2, end, should_stop)?;
            Ok(TaskOutput::PrimeCount {
                limit: *limit,
                count: stats.count,
            })
        }
        TaskSpec::Fail { fail_until_attempt } => {
            if attempt.0 < *fail_until_attempt {
                Err(TaskFailure::new(format!(
                    "deliberate failure on attempt {} of fail-until-attempt {}",
                    attempt.0, fail_until_attempt
                )))
            } else {
                Ok(TaskOutput::Succeeded { attempt: attempt.0 })
            }
        }
    })
}

/// Number of whitespace-separated words (Unicode `White_Space` separates words).
pub fn count_words(text: &str) -> u64 {
    text.split_whitespace().map(|_| 1u64).sum()
}

/// Lowercase hex SHA-256 of the UTF-8 bytes of `text`.
pub fn sha256_hex(text: &str) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let digest = Sha256::digest(text.as_bytes());
    let mut hex = String::with_capacity(digest.len() * 2);
    for byte in digest {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    hex
}

/// Number of primes `p <= limit`, by the odd-only segmented range sieve of
/// [`crate::dataparallel::primes`] (32 KiB segments, sieving primes up to `sqrt(limit)`), so
/// memory stays well under 1 MiB up to [`crate::limits::PRIME_COUNT_LIMIT_MAX`] and time is
/// roughly linear in `limit`. A limit above `i64::MAX` counts the primes up to `i64::MAX`.
pub fn count_primes_up_to(limit: u64) -> u64 {
    let end = i64::try_from(limit).unwrap_or(i64::MAX);
    primes_in_range(2, end, &mut || false).map_or(0, |stats| stats.count)
}

#[cfg(test)]
mod tests;
