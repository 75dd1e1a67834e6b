//! Built-in tasks: what a job asks a worker to do, and the pure functions that do it.
//!
//! A [`TaskSpec`] arrives from a client as untrusted JSON. [`TaskSpec::from_json`] parses it
//! strictly and reports every kind of mistake as a typed [`TaskError`] whose message says what is
//! wrong and what would be accepted; [`TaskSpec::validate`] enforces the bounds from
//! [`crate::limits`].
//!
//! Running a task is pure and deterministic in `(spec, attempt)`: [`execute`] computes the result
//! on the calling thread and never sleeps, reads a clock or touches the OS. For `sleep` tasks the
//! runtime owns the timer: [`TaskSpec::plan`] tells it how long to wait and what to report
//! afterwards.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::dataparallel::{is_prime, primes_in_range, split_list, split_range};
use crate::ids::Attempt;
use crate::limits::{
    ATTEMPTS_MAX, INLINE_NUMBERS_MAX, INLINE_PRIME_LIMIT_MAX, INLINE_TEXT_BYTES_MAX,
    PRIME_COUNT_LIMIT_MAX, PRIME_SUM_SIEVE_ONLY_END, PRIME_SUM_SPAN_MAX, PRIME_SUM_SPAN_MAX_HIGH,
    SLEEP_MILLIS_MAX, TASK_NUMBERS_MAX, TASK_TEXT_BYTES_MAX,
};

/// Every task kind, by its wire name, in the order they are listed in error messages.
pub const TASK_KINDS: [&str; 8] = [
    "sleep",
    "word-count",
    "sha256",
    "prime-count",
    "fail",
    "max",
    "prime-count-list",
    "prime-sum",
];

/// Longest piece of client-supplied text (an unknown kind or field name) echoed back in an error.
const ECHO_BYTES_MAX: usize = 64;

/// The task a job runs.
///
/// Wire form: a JSON object with a `"kind"` tag, e.g. `{"kind":"sleep","milliseconds":1000}`,
/// `{"kind":"word-count","text":"a b"}`, `{"kind":"sha256","text":"abc"}`,
/// `{"kind":"prime-count","limit":100000}`, `{"kind":"fail","fail_until_attempt":3}`.
///
/// The derived `Deserialize` checks shape only; input from outside should go through
/// [`TaskSpec::from_json`] (or at least [`TaskSpec::validate`]) so the bounds are enforced.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum TaskSpec {
    /// Wait this long, then succeed.
    Sleep {
        /// How long to wait, at most [`SLEEP_MILLIS_MAX`].
        milliseconds: u64,
    },
    /// Count the whitespace-separated words of `text`.
    WordCount {
        /// The text, at most [`TASK_TEXT_BYTES_MAX`] bytes of UTF-8.
        text: String,
    },
    /// Hash the UTF-8 bytes of `text` with SHA-256.
    Sha256 {
        /// The text, at most [`TASK_TEXT_BYTES_MAX`] bytes of UTF-8.
        text: String,
    },
    /// Count the primes `p <= limit`.
    PrimeCount {
        /// Upper bound (inclusive), at most [`PRIME_COUNT_LIMIT_MAX`].
        limit: u64,
    },
    /// Fail deliberately on every attempt before `fail_until_attempt`, then succeed.
    Fail {
        /// First attempt that succeeds, in `1..=ATTEMPTS_MAX`.
        fail_until_attempt: u32,
    },
    /// The largest of `numbers` (data-parallel: a submission is split into partitions).
    Max {
        /// At least one and at most [`TASK_NUMBERS_MAX`] numbers.
        numbers: Vec<i64>,
    },
    /// How many of `numbers` are prime (data-parallel). An empty list counts 0.
    PrimeCountList {
        /// At most [`TASK_NUMBERS_MAX`] numbers.
        numbers: Vec<i64>,
    },
    /// The primes `p` with `start <= p <= end`: how many, and their exact sum (data-parallel).
    PrimeSum {
        /// First number of the range.
        start: i64,
        /// Last number of the range; `start <= end`, spanning at most [`PRIME_SUM_SPAN_MAX`].
        end: i64,
    },
}

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
        }
    }
}

/// Why a task attempt failed. The job may be retried.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct TaskFailure {
    /// Human-readable reason.
    pub message: String,
}

impl TaskFailure {
    /// A failure with the given message.
    pub fn new(message: impl Into<String>) -> TaskFailure {
        TaskFailure {
            message: message.into(),
        }
    }
}

/// Why a task spec was rejected. Each message names the problem and what is allowed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// The spec is not a JSON object.
    #[error("a task must be a JSON object with a \"kind\" field, found {found}")]
    NotAnObject {
        /// The JSON type found instead, e.g. "an array".
        found: &'static str,
    },
    /// The object has no `"kind"` field.
    #[error("the task has no \"kind\" field; known kinds: {}", known_kinds())]
    MissingKind,
    /// `"kind"` is present but not a string.
    #[error(
        "the task's \"kind\" must be a string, found {found}; known kinds: {}",
        known_kinds()
    )]
    KindNotString {
        /// The JSON type found instead.
        found: &'static str,
    },
    /// `"kind"` names no known task.
    #[error("unknown task kind {kind:?}; known kinds: {}", known_kinds())]
    UnknownKind {
        /// The kind asked for (shortened if very long).
        kind: String,
    },
    /// A required field is absent.
    #[error("{kind} task is missing the field \"{field}\", which must be {}", field_rule(.field))]
    MissingField {
        /// Task kind.
        kind: &'static str,
        /// The missing field.
        field: &'static str,
    },
    /// A field has the wrong JSON type.
    #[error("{kind} task field \"{field}\" must be {}, found {found}", field_rule(.field))]
    WrongType {
        /// Task kind.
        kind: &'static str,
        /// The offending field.
        field: &'static str,
        /// The JSON type wanted: "integer" or "string".
        expected: &'static str,
        /// The JSON type found, e.g. "a string".
        found: &'static str,
    },
    /// A numeric field is negative.
    #[error("{kind} task field \"{field}\" is {value}, but it must be {}", field_rule(.field))]
    Negative {
        /// Task kind.
        kind: &'static str,
        /// The offending field.
        field: &'static str,
        /// The number as serde_json renders it (e.g. `1e3` becomes `1000.0`).
        value: String,
    },
    /// A numeric field has a fraction or is written in floating-point form.
    #[error(
        "{kind} task field \"{field}\" is {value}, which is not a plain integer; it must be {}",
        field_rule(.field)
    )]
    NotInteger {
        /// Task kind.
        kind: &'static str,
        /// The offending field.
        field: &'static str,
        /// The number as serde_json renders it (e.g. `1e3` becomes `1000.0`).
        value: String,
    },
    /// A numeric field is outside its allowed range.
    #[error("{kind} task field \"{field}\" is {value}, outside the allowed range {min}..={max}")]
    OutOfRange {
        /// Task kind.
        kind: &'static str,
        /// The offending field.
        field: &'static str,
        /// The number as serde_json renders it (e.g. `1e3` becomes `1000.0`).
        value: String,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// A text field is longer than [`TASK_TEXT_BYTES_MAX`].
    #[error("{kind} task field \"text\" is {bytes} bytes long; at most {max} bytes are allowed")]
    TextTooLong {
        /// Task kind.
        kind: &'static str,
        /// Length of the text in UTF-8 bytes.
        bytes: usize,
        /// Largest allowed length in bytes.
        max: usize,
    },
    /// A list element is not a 64-bit signed integer.
    #[error("{kind} task field \"numbers\" element {index} is {found}; every element must be an integer in {}..={}", i64::MIN, i64::MAX)]
    BadNumber {
        /// Task kind.
        kind: &'static str,
        /// Position of the element, from 0.
        index: usize,
        /// What was found, e.g. "a string" or the number as serde_json renders it.
        found: String,
    },
    /// A field that must be a 64-bit signed integer is not one.
    #[error(
        "{kind} task field \"{field}\" is {found}; it must be an integer in {}..={}",
        i64::MIN,
        i64::MAX
    )]
    NotI64 {
        /// Task kind.
        kind: &'static str,
        /// The offending field.
        field: &'static str,
        /// What was found.
        found: String,
    },
    /// Too many numbers.
    #[error("{kind} task has {count} numbers; at most {max} are allowed")]
    TooManyNumbers {
        /// Task kind.
        kind: &'static str,
        /// Numbers given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// `max` of an empty list has no answer.
    #[error("max task needs at least one number")]
    EmptyList,
    /// `prime-sum` with `start > end`.
    #[error("prime-sum task needs start <= end, but start is {start} and end is {end}")]
    EmptyRange {
        /// First number asked for.
        start: i64,
        /// Last number asked for.
        end: i64,
    },
    /// `prime-sum` over a range wider than [`PRIME_SUM_SPAN_MAX`].
    #[error(
        "prime-sum task range {start}..={end} spans {span} numbers; at most {max} are allowed"
    )]
    RangeTooWide {
        /// First number asked for.
        start: i64,
        /// Last number asked for.
        end: i64,
        /// `end - start + 1`.
        span: u128,
        /// The limit.
        max: u64,
    },
    /// The object has a field the kind does not take.
    #[error(
        "{kind} task has an unexpected field {field:?}; it takes only \"kind\" and \"{allowed}\""
    )]
    UnexpectedField {
        /// Task kind.
        kind: &'static str,
        /// The unexpected field's name (shortened if very long).
        field: String,
        /// The one field this kind takes besides "kind".
        allowed: &'static str,
    },
}

/// The known kinds as a comma-separated list, for error messages.
fn known_kinds() -> String {
    TASK_KINDS.join(", ")
}

/// What a field must hold, for error messages. Field names are unique across kinds.
fn field_rule(field: &str) -> String {
    match field {
        "milliseconds" => format!("an integer in 0..={SLEEP_MILLIS_MAX}"),
        "limit" => format!("an integer in 0..={PRIME_COUNT_LIMIT_MAX}"),
        "fail_until_attempt" => format!("an integer in 1..={ATTEMPTS_MAX}"),
        "text" => format!("a string of at most {TASK_TEXT_BYTES_MAX} bytes"),
        "numbers" => format!("an array of at most {TASK_NUMBERS_MAX} integers"),
        "start" | "end" => format!("an integer in {}..={}", i64::MIN, i64::MAX),
        _ => "valid".to_string(),
    }
}

/// The JSON type of `value`, with an article, for error messages.
fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Client-supplied text to quote in an error, cut at a character boundary if it is long.
fn echo(text: &str) -> String {
    if text.len() <= ECHO_BYTES_MAX {
        return text.to_string();
    }
    let mut end = ECHO_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// The task kinds, for parsing.
#[derive(Clone, Copy)]
enum Kind {
    Sleep,
    WordCount,
    Sha256,
    PrimeCount,
    Fail,
    Max,
    PrimeCountList,
    PrimeSum,
}

impl Kind {
    fn from_name(name: &str) -> Option<Kind> {
        match name {
            "sleep" => Some(Kind::Sleep),
            "word-count" => Some(Kind::WordCount),
            "sha256" => Some(Kind::Sha256),
            "prime-count" => Some(Kind::PrimeCount),
            "fail" => Some(Kind::Fail),
            "max" => Some(Kind::Max),
            "prime-count-list" => Some(Kind::PrimeCountList),
            "prime-sum" => Some(Kind::PrimeSum),
            _ => None,
        }
    }

    /// The wire name, as in [`TASK_KINDS`].
    fn name(self) -> &'static str {
        match self {
            Kind::Sleep => "sleep",
            Kind::WordCount => "word-count",
            Kind::Sha256 => "sha256",
            Kind::PrimeCount => "prime-count",
            Kind::Fail => "fail",
            Kind::Max => "max",
            Kind::PrimeCountList => "prime-count-list",
            Kind::PrimeSum => "prime-sum",
        }
    }

    /// The fields the kind takes besides `"kind"`.
    fn fields(self) -> &'static [&'static str] {
        match self {
            Kind::Sleep => &["milliseconds"],
            Kind::WordCount | Kind::Sha256 => &["text"],
            Kind::PrimeCount => &["limit"],
            Kind::Fail => &["fail_until_attempt"],
            Kind::Max | Kind::PrimeCountList => &["numbers"],
            Kind::PrimeSum => &["start", "end"],
        }
    }

    /// The allowed fields as error messages quote them: `limit`, or `start" and "end`.
    fn allowed(self) -> &'static str {
        match self {
            Kind::PrimeSum => "start\" and \"end",
            _ => self.fields().first().copied().unwrap_or(""),
        }
    }
}

/// Reads a list of 64-bit signed integers strictly.
fn parse_numbers(kind: &'static str, value: &Value) -> Result<Vec<i64>, TaskError> {
    let Value::Array(items) = value else {
        return Err(TaskError::WrongType {
            kind,
            field: "numbers",
            expected: "array",
            found: json_type(value),
        });
    };
    if items.len() > TASK_NUMBERS_MAX {
        return Err(TaskError::TooManyNumbers {
            kind,
            count: items.len(),
            max: TASK_NUMBERS_MAX,
        });
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item.as_i64().ok_or_else(|| TaskError::BadNumber {
                kind,
                index,
                found: match item {
                    Value::Number(n) => n.to_string(),
                    other => json_type(other).to_string(),
                },
            })
        })
        .collect()
}

/// Reads a 64-bit signed integer field strictly.
fn parse_i64(kind: &'static str, field: &'static str, value: &Value) -> Result<i64, TaskError> {
    value.as_i64().ok_or_else(|| TaskError::NotI64 {
        kind,
        field,
        found: match value {
            Value::Number(n) => n.to_string(),
            other => json_type(other).to_string(),
        },
    })
}

/// Reads a string field, refusing an oversized one before copying it.
fn parse_text(kind: &'static str, field: &'static str, value: &Value) -> Result<String, TaskError> {
    match value {
        Value::String(text) if text.len() > TASK_TEXT_BYTES_MAX => Err(TaskError::TextTooLong {
            kind,
            bytes: text.len(),
            max: TASK_TEXT_BYTES_MAX,
        }),
        Value::String(text) => Ok(text.clone()),
        other => Err(TaskError::WrongType {
            kind,
            field,
            expected: "string",
            found: json_type(other),
        }),
    }
}

/// Reads an unsigned integer field strictly: JSON integers only, within `min..=max`.
fn parse_integer(
    kind: &'static str,
    field: &'static str,
    value: &Value,
    min: u64,
    max: u64,
) -> Result<u64, TaskError> {
    let Value::Number(number) = value else {
        return Err(TaskError::WrongType {
            kind,
            field,
            expected: "integer",
            found: json_type(value),
        });
    };
    let out_of_range = || TaskError::OutOfRange {
        kind,
        field,
        value: number.to_string(),
        min,
        max,
    };
    if let Some(n) = number.as_u64() {
        return if (min..=max).contains(&n) {
            Ok(n)
        } else {
            Err(out_of_range())
        };
    }
    if number.as_i64().is_some() {
        // An integer that does not fit u64 but fits i64 is negative.
        return Err(TaskError::Negative {
            kind,
            field,
            value: number.to_string(),
        });
    }
    // Written with a fraction or exponent, or too large for u64.
    let float = number.as_f64().unwrap_or(f64::NAN);
    if float < 0.0 {
        return Err(TaskError::Negative {
            kind,
            field,
            value: number.to_string(),
        });
    }
    // A whole number too large for u64 (serde_json then holds it as a float) is out of range;
    // anything else here has a fraction or is written in floating-point form.
    if float.is_finite() && float.fract() == 0.0 && float > max as f64 {
        return Err(out_of_range());
    }
    Err(TaskError::NotInteger {
        kind,
        field,
        value: number.to_string(),
    })
}

impl TaskSpec {
    /// Parses an untrusted JSON value strictly, then runs [`TaskSpec::validate`].
    ///
    /// Checks, in order: the value is an object; it has a `"kind"`; the kind is a string naming
    /// a known task; no field other than `"kind"` and the kind's own field is present; that field
    /// is present; it has the right JSON type; a number is a non-negative integer in range; a text
    /// is not too long.
    pub fn from_json(value: &Value) -> Result<TaskSpec, TaskError> {
        let object = value.as_object().ok_or(TaskError::NotAnObject {
            found: json_type(value),
        })?;
        let kind_value = object.get("kind").ok_or(TaskError::MissingKind)?;
        let kind_name = kind_value.as_str().ok_or(TaskError::KindNotString {
            found: json_type(kind_value),
        })?;
        let kind = Kind::from_name(kind_name).ok_or_else(|| TaskError::UnknownKind {
            kind: echo(kind_name),
        })?;
        let (name, fields) = (kind.name(), kind.fields());
        if let Some(extra) = object
            .keys()
            .find(|key| *key != "kind" && !fields.contains(&key.as_str()))
        {
            return Err(TaskError::UnexpectedField {
                kind: name,
                field: echo(extra),
                allowed: kind.allowed(),
            });
        }
        let get = |field: &'static str| {
            object
                .get(field)
                .ok_or(TaskError::MissingField { kind: name, field })
        };
        let field = fields.first().copied().unwrap_or("");
        let raw = get(field)?;
        let integer = |min, max| parse_integer(name, field, raw, min, max);
        let spec = match kind {
            Kind::Sleep => TaskSpec::Sleep {
                milliseconds: integer(0, SLEEP_MILLIS_MAX)?,
            },
            Kind::WordCount => TaskSpec::WordCount {
                text: parse_text(name, field, raw)?,
            },
            Kind::Sha256 => TaskSpec::Sha256 {
                text: parse_text(name, field, raw)?,
            },
            Kind::PrimeCount => TaskSpec::PrimeCount {
                limit: integer(0, PRIME_COUNT_LIMIT_MAX)?,
            },
            Kind::Fail => {
                let max = u64::from(ATTEMPTS_MAX);
                let n = integer(1, max)?;
                // In range means it fits; the conversion still reports rather than assumes it.
                let fail_until_attempt = u32::try_from(n).map_err(|_| TaskError::OutOfRange {
                    kind: name,
                    field,
                    value: n.to_string(),
                    min: 1,
                    max,
                })?;
                TaskSpec::Fail { fail_until_attempt }
            }
            Kind::Max => TaskSpec::Max {
                numbers: parse_numbers(name, raw)?,
            },
            Kind::PrimeCountList => TaskSpec::PrimeCountList {
                numbers: parse_numbers(name, raw)?,
            },
            Kind::PrimeSum => TaskSpec::PrimeSum {
                start: parse_i64(name, "start", raw)?,
                end: parse_i64(name, "end", get("end")?)?,
            },
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Checks the bounds: sleep `milliseconds <= SLEEP_MILLIS_MAX`; text at most
    /// `TASK_TEXT_BYTES_MAX` bytes; `limit <= PRIME_COUNT_LIMIT_MAX`;
    /// `fail_until_attempt` in `1..=ATTEMPTS_MAX`.
    pub fn validate(&self) -> Result<(), TaskError> {
        let kind = self.kind();
        let range = |field, value: u64, min: u64, max: u64| {
            if (min..=max).contains(&value) {
                Ok(())
            } else {
                Err(TaskError::OutOfRange {
                    kind,
                    field,
                    value: value.to_string(),
                    min,
                    max,
                })
            }
        };
        match self {
            TaskSpec::Sleep { milliseconds } => {
                range("milliseconds", *milliseconds, 0, SLEEP_MILLIS_MAX)
            }
            TaskSpec::WordCount { text } | TaskSpec::Sha256 { text } => {
                if text.len() <= TASK_TEXT_BYTES_MAX {
                    Ok(())
                } else {
                    Err(TaskError::TextTooLong {
                        kind,
                        bytes: text.len(),
                        max: TASK_TEXT_BYTES_MAX,
                    })
                }
            }
            TaskSpec::PrimeCount { limit } => range("limit", *limit, 0, PRIME_COUNT_LIMIT_MAX),
            TaskSpec::Fail { fail_until_attempt } => range(
                "fail_until_attempt",
                u64::from(*fail_until_attempt),
                1,
                u64::from(ATTEMPTS_MAX),
            ),
            TaskSpec::Max { numbers } | TaskSpec::PrimeCountList { numbers } => {
                if numbers.len() > TASK_NUMBERS_MAX {
                    Err(TaskError::TooManyNumbers {
                        kind,
                        count: numbers.len(),
                        max: TASK_NUMBERS_MAX,
                    })
                } else if numbers.is_empty() && matches!(self, TaskSpec::Max { .. }) {
                    Err(TaskError::EmptyList)
                } else {
                    Ok(())
                }
            }
            TaskSpec::PrimeSum { start, end } => {
                if start > end {
                    return Err(TaskError::EmptyRange {
                        start: *start,
                        end: *end,
                    });
                }
                let span = range_span(*start, *end);
                let max = prime_sum_span_max(*end);
                if span > u128::from(max) {
                    return Err(TaskError::RangeTooWide {
                        start: *start,
                        end: *end,
                        span,
                        max,
                    });
                }
                Ok(())
            }
        }
    }

    /// True for the data-parallel kinds (`max`, `prime-count-list`, `prime-sum`): a submission
    /// of one becomes a parent job split into partition jobs.
    pub fn is_data_parallel(&self) -> bool {
        matches!(
            self,
            TaskSpec::Max { .. } | TaskSpec::PrimeCountList { .. } | TaskSpec::PrimeSum { .. }
        )
    }

    /// How many items a data-parallel spec splits over (list elements, or range numbers,
    /// saturating); 1 for any other spec.
    pub fn items(&self) -> u64 {
        match self {
            TaskSpec::Max { numbers } | TaskSpec::PrimeCountList { numbers } => {
                numbers.len() as u64
            }
            TaskSpec::PrimeSum { start, end } if start <= end => {
                u64::try_from(range_span(*start, *end)).unwrap_or(u64::MAX)
            }
            TaskSpec::PrimeSum { .. } => 0,
            _ => 1,
        }
    }

    /// Splits a data-parallel spec into `min(partitions, items)` balanced contiguous pieces,
    /// in order (the first pieces take one extra item each when it does not divide evenly).
    /// Every item lands in exactly one piece. Any other spec is one piece: itself.
    pub fn split(&self, partitions: u32) -> Vec<TaskSpec> {
        let partitions = partitions.max(1);
        match self {
            TaskSpec::Max { numbers } => split_list(numbers.len(), partitions as usize)
                .into_iter()
                .map(|r| TaskSpec::Max {
                    numbers: numbers.get(r).unwrap_or_default().to_vec(),
                })
                .collect(),
            TaskSpec::PrimeCountList { numbers } => split_list(numbers.len(), partitions as usize)
                .into_iter()
                .map(|r| TaskSpec::PrimeCountList {
                    numbers: numbers.get(r).unwrap_or_default().to_vec(),
                })
                .collect(),
            TaskSpec::PrimeSum { start, end } => split_range(*start, *end, u64::from(partitions))
                .into_iter()
                .map(|(start, end)| TaskSpec::PrimeSum { start, end })
                .collect(),
            other => vec![other.clone()],
        }
    }

    /// The wire name of the kind: "sleep", "word-count", "sha256", "prime-count" or "fail".
    pub fn kind(&self) -> &'static str {
        match self {
            TaskSpec::Sleep { .. } => "sleep",
            TaskSpec::WordCount { .. } => "word-count",
            TaskSpec::Sha256 { .. } => "sha256",
            TaskSpec::PrimeCount { .. } => "prime-count",
            TaskSpec::Fail { .. } => "fail",
            TaskSpec::Max { .. } => "max",
            TaskSpec::PrimeCountList { .. } => "prime-count-list",
            TaskSpec::PrimeSum { .. } => "prime-sum",
        }
    }

    /// The wire form; identical to the derived `Serialize` and accepted back by
    /// [`TaskSpec::from_json`] whenever the spec is valid.
    pub fn to_json(&self) -> Value {
        let mut object = Map::new();
        object.insert("kind".to_string(), Value::from(self.kind()));
        let (field, value) = match self {
            TaskSpec::Max { numbers } | TaskSpec::PrimeCountList { numbers } => {
                ("numbers", Value::from(numbers.clone()))
            }
            TaskSpec::PrimeSum { start, end } => {
                object.insert("start".to_string(), Value::from(*start));
                ("end", Value::from(*end))
            }
            TaskSpec::Sleep { milliseconds } => ("milliseconds", Value::from(*milliseconds)),
            TaskSpec::WordCount { text } | TaskSpec::Sha256 { text } => {
                ("text", Value::from(text.as_str()))
            }
            TaskSpec::PrimeCount { limit } => ("limit", Value::from(*limit)),
            TaskSpec::Fail { fail_until_attempt } => {
                ("fail_until_attempt", Value::from(*fail_until_attempt))
            }
        };
        object.insert(field.to_string(), value);
        Value::Object(object)
    }

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
            TaskSpec::PrimeCountList { numbers } if numbers.len() <= INLINE_NUMBERS_MAX => {
                TaskPlan::Inline
            }
            TaskSpec::PrimeSum { start, end }
                if start <= end
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
        return Some(Err(TaskFailure::new(format!("invalid task: {error}"))));
    }
    Some(match spec {
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

/// The widest `prime-sum` range allowed to end at `end`: wide while sieving alone settles it,
/// narrower above [`PRIME_SUM_SIEVE_ONLY_END`], where each candidate costs a Miller–Rabin test.
pub fn prime_sum_span_max(end: i64) -> u64 {
    if end > PRIME_SUM_SIEVE_ONLY_END {
        PRIME_SUM_SPAN_MAX_HIGH
    } else {
        PRIME_SUM_SPAN_MAX
    }
}

/// `end - start + 1` for `start <= end`, exact for any pair of `i64` (up to 2^64 numbers).
pub fn range_span(start: i64, end: i64) -> u128 {
    (i128::from(end) - i128::from(start) + 1).max(0) as u128
}

/// Combines the outputs of a data-parallel spec's pieces, in partition order, into the output
/// the whole spec would have given: the max of the maxima, the sum of the counts, the sum of the
/// sums (exact in `u128`). `Err` if a piece's output is of the wrong kind, or a `max` has no
/// pieces (a valid `max` always has at least one).
pub fn aggregate(spec: &TaskSpec, pieces: &[&TaskOutput]) -> Result<TaskOutput, String> {
    let wrong = |piece: &TaskOutput| {
        Err(format!(
            "a {} partition reported a {piece:?} result",
            spec.kind()
        ))
    };
    match spec {
        TaskSpec::Max { .. } => {
            let mut best: Option<i64> = None;
            for piece in pieces {
                match piece {
                    TaskOutput::Max { max } => best = Some(best.map_or(*max, |b| b.max(*max))),
                    other => return wrong(other),
                }
            }
            best.map(|max| TaskOutput::Max { max })
                .ok_or_else(|| "max over no partitions".to_string())
        }
        TaskSpec::PrimeCountList { .. } => {
            let mut total: u64 = 0;
            for piece in pieces {
                match piece {
                    TaskOutput::PrimeCountList { count } => total = total.saturating_add(*count),
                    other => return wrong(other),
                }
            }
            Ok(TaskOutput::PrimeCountList { count: total })
        }
        TaskSpec::PrimeSum { .. } => {
            let (mut count, mut sum): (u64, u128) = (0, 0);
            for piece in pieces {
                match piece {
                    TaskOutput::PrimeSum { count: c, sum: s } => {
                        count = count.saturating_add(*c);
                        sum = sum.saturating_add(*s);
                    }
                    other => return wrong(other),
                }
            }
            Ok(TaskOutput::PrimeSum { count, sum })
        }
        other => Err(format!("{} is not a data-parallel task", other.kind())),
    }
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
/// memory stays well under 1 MiB up to [`PRIME_COUNT_LIMIT_MAX`] and time is roughly linear in
/// `limit`. A limit above `i64::MAX` counts the primes up to `i64::MAX`.
pub fn count_primes_up_to(limit: u64) -> u64 {
    let end = i64::try_from(limit).unwrap_or(i64::MAX);
    primes_in_range(2, end, &mut || false).map_or(0, |stats| stats.count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;
    use std::sync::OnceLock;

    fn parse(value: Value) -> Result<TaskSpec, TaskError> {
        TaskSpec::from_json(&value)
    }

    // ---- sha256 ----

    #[test]
    fn sha256_known_vectors() {
        assert_eq!(
            sha256_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        let output = execute(&TaskSpec::Sha256 { text: "abc".into() }, Attempt(1));
        assert_eq!(
            output,
            Ok(TaskOutput::Sha256 {
                hex: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into()
            })
        );
    }

    #[test]
    fn sha256_hashes_utf8_bytes() {
        assert_eq!(
            sha256_hex("The quick brown fox jumps over the lazy dog"),
            "d7a8fbb307d7809469ca9abcb0082e4f8d5651e46d3cdb762d02d0bf37c9e592"
        );
        // "é" is the two UTF-8 bytes c3 a9.
        let expected: String = Sha256::digest([0xc3u8, 0xa9])
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        assert_eq!(sha256_hex("é"), expected);
        assert_ne!(sha256_hex("é"), sha256_hex("e\u{301}"));
    }

    // ---- word count ----

    #[test]
    fn word_counts() {
        assert_eq!(count_words(""), 0);
        assert_eq!(count_words("   \t\n "), 0);
        assert_eq!(count_words("a b"), 2);
        assert_eq!(count_words("  hello,   world!  "), 2);
        assert_eq!(count_words("one\ttwo\nthree\r\nfour"), 4);
        // No-break space, em space, ideographic space, line separator are Unicode whitespace.
        assert_eq!(count_words("a\u{a0}b\u{2003}c\u{3000}d\u{2028}e"), 5);
        // A zero-width space is not whitespace, so it does not split words.
        assert_eq!(count_words("a\u{200b}b"), 1);
        assert_eq!(count_words("héllo wörld 日本語"), 3);
        assert_eq!(
            execute(
                &TaskSpec::WordCount {
                    text: "the quick  brown".into()
                },
                Attempt(1)
            ),
            Ok(TaskOutput::WordCount { words: 3 })
        );
    }

    // ---- primes ----

    fn is_prime_naive(n: u64) -> bool {
        if n < 2 {
            return false;
        }
        let mut d = 2;
        while d * d <= n {
            if n % d == 0 {
                return false;
            }
            d += 1;
        }
        true
    }

    /// Odd numbers covered by one segment of the range sieve (32 KiB, one bit each).
    const SEGMENT_BITS: u64 = 4096 * 64;

    /// Prefix counts of primes for 0..=REFERENCE_MAX by a plain sieve over all integers.
    const REFERENCE_MAX: usize = 2_000_000;
    fn reference_counts() -> &'static [u32] {
        static COUNTS: OnceLock<Vec<u32>> = OnceLock::new();
        COUNTS.get_or_init(|| {
            let mut prime = vec![true; REFERENCE_MAX + 1];
            prime[0] = false;
            prime[1] = false;
            let mut n = 2;
            while n * n <= REFERENCE_MAX {
                if prime[n] {
                    let mut m = n * n;
                    while m <= REFERENCE_MAX {
                        prime[m] = false;
                        m += n;
                    }
                }
                n += 1;
            }
            let mut running = 0u32;
            prime
                .iter()
                .map(|&p| {
                    running += u32::from(p);
                    running
                })
                .collect()
        })
    }

    #[test]
    fn prime_counts_known_values() {
        let known = [
            (0, 0),
            (1, 0),
            (2, 1),
            (3, 2),
            (4, 2),
            (10, 4),
            (100, 25),
            (1_000, 168),
            (10_000, 1_229),
            (100_000, 9_592),
            (1_000_000, 78_498),
            (10_000_000, 664_579),
        ];
        for (limit, count) in known {
            assert_eq!(count_primes_up_to(limit), count, "limit {limit}");
        }
    }

    #[test]
    fn prime_counts_match_naive_for_every_small_limit() {
        let mut expected = 0;
        for limit in 0..=5_000u64 {
            if is_prime_naive(limit) {
                expected += 1;
            }
            assert_eq!(count_primes_up_to(limit), expected, "limit {limit}");
        }
    }

    #[test]
    fn prime_counts_at_segment_boundaries() {
        let counts = reference_counts();
        // The segment covers odd indexes [k * SEGMENT_BITS, (k + 1) * SEGMENT_BITS), i.e. numbers
        // up to 2 * (k + 1) * SEGMENT_BITS - 1.
        for k in 1..=3u64 {
            let edge = 2 * k * SEGMENT_BITS;
            for limit in edge - 70..=edge + 70 {
                assert_eq!(
                    count_primes_up_to(limit),
                    u64::from(counts[limit as usize]),
                    "limit {limit}"
                );
            }
        }
    }

    #[test]
    fn prime_count_task_output() {
        assert_eq!(
            execute(&TaskSpec::PrimeCount { limit: 100_000 }, Attempt(1)),
            Ok(TaskOutput::PrimeCount {
                limit: 100_000,
                count: 9_592
            })
        );
    }

    proptest! {
        #[test]
        fn prime_counts_match_reference_sieve(limit in 0..=REFERENCE_MAX as u64) {
            prop_assert_eq!(
                count_primes_up_to(limit),
                u64::from(reference_counts()[limit as usize])
            );
        }

        #[test]
        fn prime_counts_match_reference_sieve_near_segment_ends(
            segments in 1..=3u64,
            offset in 0..2_000u64,
        ) {
            // A final segment only a few bits long is where crossing-off bookkeeping goes wrong.
            let limit = 2 * segments * SEGMENT_BITS + offset - 1_000;
            prop_assert_eq!(
                count_primes_up_to(limit),
                u64::from(reference_counts()[limit as usize])
            );
        }
    }

    // ---- fail ----

    #[test]
    fn fail_fails_before_the_threshold_and_succeeds_from_it() {
        let spec = TaskSpec::Fail {
            fail_until_attempt: 3,
        };
        for attempt in 1..3 {
            let failure = execute(&spec, Attempt(attempt)).unwrap_err();
            assert_eq!(
                failure.message,
                format!("deliberate failure on attempt {attempt} of fail-until-attempt 3")
            );
        }
        assert_eq!(
            execute(&spec, Attempt(3)),
            Ok(TaskOutput::Succeeded { attempt: 3 })
        );
        assert_eq!(
            execute(&spec, Attempt(4)),
            Ok(TaskOutput::Succeeded { attempt: 4 })
        );
        let once = TaskSpec::Fail {
            fail_until_attempt: 1,
        };
        assert_eq!(
            execute(&once, Attempt(1)),
            Ok(TaskOutput::Succeeded { attempt: 1 })
        );
        assert_eq!(spec.plan(Attempt(1)), TaskPlan::Inline);
    }

    proptest! {
        #[test]
        fn fail_succeeds_exactly_from_the_threshold(
            until in 1..=ATTEMPTS_MAX,
            attempt in 1..=ATTEMPTS_MAX + 5,
        ) {
            let result = execute(&TaskSpec::Fail { fail_until_attempt: until }, Attempt(attempt));
            prop_assert_eq!(result.is_ok(), attempt >= until);
            if let Ok(output) = result {
                prop_assert_eq!(output, TaskOutput::Succeeded { attempt });
            }
        }
    }

    // ---- sleep and planning ----

    #[test]
    fn sleep_plans_a_wait_and_executes_without_one() {
        let spec = TaskSpec::Sleep {
            milliseconds: 20_000,
        };
        assert_eq!(
            spec.plan(Attempt(1)),
            TaskPlan::Sleep {
                duration: Duration::from_secs(20),
                then: Ok(TaskOutput::Slept {
                    milliseconds: 20_000
                }),
            }
        );
        assert_eq!(
            execute(&spec, Attempt(2)),
            Ok(TaskOutput::Slept {
                milliseconds: 20_000
            })
        );
        assert_eq!(
            TaskSpec::WordCount { text: "x".into() }.plan(Attempt(1)),
            TaskPlan::Inline
        );
        let big_text = "x".repeat(INLINE_TEXT_BYTES_MAX + 1);
        assert_eq!(
            TaskSpec::Sha256 { text: big_text }.plan(Attempt(1)),
            TaskPlan::Compute
        );
        assert_eq!(
            TaskSpec::PrimeCount {
                limit: INLINE_PRIME_LIMIT_MAX + 1
            }
            .plan(Attempt(1)),
            TaskPlan::Compute
        );
    }

    #[test]
    fn invalid_specs_are_not_run() {
        let too_long = TaskSpec::Sleep {
            milliseconds: SLEEP_MILLIS_MAX + 1,
        };
        assert_eq!(too_long.plan(Attempt(1)), TaskPlan::Compute);
        let failure = execute(&too_long, Attempt(1)).unwrap_err();
        assert!(failure.message.starts_with("invalid task: "), "{failure}");
        let too_big = TaskSpec::PrimeCount {
            limit: PRIME_COUNT_LIMIT_MAX + 1,
        };
        assert!(execute(&too_big, Attempt(1)).is_err());
        let zero = TaskSpec::Fail {
            fail_until_attempt: 0,
        };
        assert!(execute(&zero, Attempt(1)).is_err());
    }

    // ---- output text ----

    #[test]
    fn outputs_display_as_human_text() {
        let cases = [
            (
                TaskOutput::Slept {
                    milliseconds: 20_000,
                },
                "slept 20000 ms",
            ),
            (TaskOutput::WordCount { words: 3 }, "3 words"),
            (TaskOutput::WordCount { words: 1 }, "1 word"),
            (TaskOutput::WordCount { words: 0 }, "0 words"),
            (
                TaskOutput::Sha256 {
                    hex: sha256_hex("abc"),
                },
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            ),
            (
                TaskOutput::PrimeCount {
                    limit: 100_000,
                    count: 9_592,
                },
                "9592 primes <= 100000",
            ),
            (
                TaskOutput::PrimeCount { limit: 2, count: 1 },
                "1 prime <= 2",
            ),
            (
                TaskOutput::Succeeded { attempt: 3 },
                "succeeded on attempt 3",
            ),
        ];
        for (output, text) in cases {
            assert_eq!(output.to_string(), text);
        }
    }

    #[test]
    fn outputs_have_tagged_wire_form() {
        let cases = [
            (
                TaskOutput::Slept { milliseconds: 5 },
                json!({"kind":"slept","milliseconds":5}),
            ),
            (
                TaskOutput::WordCount { words: 2 },
                json!({"kind":"word-count","words":2}),
            ),
            (
                TaskOutput::Sha256 { hex: "ab".into() },
                json!({"kind":"sha256","hex":"ab"}),
            ),
            (
                TaskOutput::PrimeCount {
                    limit: 10,
                    count: 4,
                },
                json!({"kind":"prime-count","limit":10,"count":4}),
            ),
            (
                TaskOutput::Succeeded { attempt: 3 },
                json!({"kind":"succeeded","attempt":3}),
            ),
        ];
        for (output, wire) in cases {
            assert_eq!(serde_json::to_value(&output).unwrap(), wire);
            assert_eq!(serde_json::from_value::<TaskOutput>(wire).unwrap(), output);
        }
        let failure = TaskFailure::new("boom");
        assert_eq!(failure.to_string(), "boom");
        assert_eq!(
            serde_json::to_value(&failure).unwrap(),
            json!({"message":"boom"})
        );
    }

    // ---- parsing: accepted forms ----

    #[test]
    fn parses_every_documented_example() {
        let cases = [
            (
                json!({"kind":"sleep","milliseconds":1000}),
                TaskSpec::Sleep { milliseconds: 1000 },
            ),
            (
                json!({"kind":"word-count","text":"a b"}),
                TaskSpec::WordCount { text: "a b".into() },
            ),
            (
                json!({"kind":"sha256","text":"abc"}),
                TaskSpec::Sha256 { text: "abc".into() },
            ),
            (
                json!({"kind":"prime-count","limit":100000}),
                TaskSpec::PrimeCount { limit: 100_000 },
            ),
            (
                json!({"kind":"fail","fail_until_attempt":3}),
                TaskSpec::Fail {
                    fail_until_attempt: 3,
                },
            ),
        ];
        for (wire, spec) in cases {
            assert_eq!(parse(wire.clone()), Ok(spec.clone()));
            assert_eq!(spec.to_json(), wire);
            assert_eq!(serde_json::to_value(&spec).unwrap(), wire);
            assert_eq!(serde_json::from_value::<TaskSpec>(wire).unwrap(), spec);
        }
    }

    #[test]
    fn accepts_the_bounds_themselves() {
        assert!(parse(json!({"kind":"sleep","milliseconds":0})).is_ok());
        assert!(parse(json!({"kind":"sleep","milliseconds":SLEEP_MILLIS_MAX})).is_ok());
        assert!(parse(json!({"kind":"prime-count","limit":PRIME_COUNT_LIMIT_MAX})).is_ok());
        assert!(parse(json!({"kind":"fail","fail_until_attempt":1})).is_ok());
        assert!(parse(json!({"kind":"fail","fail_until_attempt":ATTEMPTS_MAX})).is_ok());
        let longest = "x".repeat(TASK_TEXT_BYTES_MAX);
        assert!(parse(json!({"kind":"sha256","text":longest})).is_ok());
        assert!(parse(json!({"kind":"word-count","text":""})).is_ok());
    }

    #[test]
    fn kinds_are_named() {
        let specs = [
            TaskSpec::Sleep { milliseconds: 1 },
            TaskSpec::WordCount { text: "".into() },
            TaskSpec::Sha256 { text: "".into() },
            TaskSpec::PrimeCount { limit: 1 },
            TaskSpec::Fail {
                fail_until_attempt: 1,
            },
            TaskSpec::Max { numbers: vec![1] },
            TaskSpec::PrimeCountList { numbers: vec![] },
            TaskSpec::PrimeSum { start: 1, end: 2 },
        ];
        let kinds: Vec<&str> = specs.iter().map(TaskSpec::kind).collect();
        assert_eq!(kinds, TASK_KINDS);
        for name in TASK_KINDS {
            assert_eq!(Kind::from_name(name).map(Kind::name), Some(name));
        }
    }

    // ---- parsing: every error variant ----

    #[test]
    fn not_an_object() {
        assert_eq!(
            parse(json!([1, 2])),
            Err(TaskError::NotAnObject { found: "an array" })
        );
        assert_eq!(
            parse(json!("sleep")),
            Err(TaskError::NotAnObject { found: "a string" })
        );
        assert_eq!(
            parse(Value::Null),
            Err(TaskError::NotAnObject { found: "null" })
        );
    }

    #[test]
    fn missing_kind() {
        let error = parse(json!({"milliseconds":5})).unwrap_err();
        assert_eq!(error, TaskError::MissingKind);
        assert!(error
            .to_string()
            .contains("sleep, word-count, sha256, prime-count, fail"));
    }

    #[test]
    fn kind_not_a_string() {
        assert_eq!(
            parse(json!({"kind":7})),
            Err(TaskError::KindNotString { found: "a number" })
        );
    }

    #[test]
    fn unknown_kind_lists_the_known_ones() {
        let error = parse(json!({"kind":"nope"})).unwrap_err();
        assert_eq!(
            error,
            TaskError::UnknownKind {
                kind: "nope".into()
            }
        );
        assert_eq!(
            error.to_string(),
            "unknown task kind \"nope\"; known kinds: sleep, word-count, sha256, prime-count, fail, max, prime-count-list, prime-sum"
        );
        // Kinds are case-sensitive and kebab-case.
        assert!(matches!(
            parse(json!({"kind":"word_count","text":""})),
            Err(TaskError::UnknownKind { .. })
        ));
        // A huge kind is not echoed back in full.
        let huge = "é".repeat(1000);
        match parse(json!({ "kind": huge })) {
            Err(TaskError::UnknownKind { kind }) => assert!(kind.len() <= ECHO_BYTES_MAX + 3),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn missing_field() {
        let error = parse(json!({"kind":"sleep"})).unwrap_err();
        assert_eq!(
            error,
            TaskError::MissingField {
                kind: "sleep",
                field: "milliseconds"
            }
        );
        assert_eq!(
            error.to_string(),
            "sleep task is missing the field \"milliseconds\", which must be an integer in 0..=86400000"
        );
        assert_eq!(
            parse(json!({"kind":"sha256"})),
            Err(TaskError::MissingField {
                kind: "sha256",
                field: "text"
            })
        );
    }

    #[test]
    fn wrong_type() {
        let error = parse(json!({"kind":"sleep","milliseconds":"5"})).unwrap_err();
        assert_eq!(
            error,
            TaskError::WrongType {
                kind: "sleep",
                field: "milliseconds",
                expected: "integer",
                found: "a string"
            }
        );
        assert_eq!(
            error.to_string(),
            "sleep task field \"milliseconds\" must be an integer in 0..=86400000, found a string"
        );
        assert_eq!(
            parse(json!({"kind":"word-count","text":12})),
            Err(TaskError::WrongType {
                kind: "word-count",
                field: "text",
                expected: "string",
                found: "a number"
            })
        );
        assert_eq!(
            parse(json!({"kind":"fail","fail_until_attempt":null})),
            Err(TaskError::WrongType {
                kind: "fail",
                field: "fail_until_attempt",
                expected: "integer",
                found: "null"
            })
        );
    }

    #[test]
    fn negative() {
        let error = parse(json!({"kind":"sleep","milliseconds":-5})).unwrap_err();
        assert_eq!(
            error,
            TaskError::Negative {
                kind: "sleep",
                field: "milliseconds",
                value: "-5".into()
            }
        );
        assert_eq!(
            error.to_string(),
            "sleep task field \"milliseconds\" is -5, but it must be an integer in 0..=86400000"
        );
        assert!(matches!(
            parse(json!({"kind":"prime-count","limit":-2.5})),
            Err(TaskError::Negative { .. })
        ));
    }

    #[test]
    fn not_an_integer() {
        let error = parse(json!({"kind":"sleep","milliseconds":1.5})).unwrap_err();
        assert_eq!(
            error,
            TaskError::NotInteger {
                kind: "sleep",
                field: "milliseconds",
                value: "1.5".into()
            }
        );
        assert!(error.to_string().contains("not a plain integer"));
        // A whole number in floating-point form is not accepted either (nor is it by serde);
        // serde_json also reads "-0" as the float -0.0.
        let five: Value = serde_json::from_str(r#"{"kind":"prime-count","limit":5.0}"#).unwrap();
        assert!(matches!(
            TaskSpec::from_json(&five),
            Err(TaskError::NotInteger { .. })
        ));
        assert!(serde_json::from_value::<TaskSpec>(five).is_err());
        for text in ["1e3", "-0", "-0.0", "0.5"] {
            let wire = format!(r#"{{"kind":"sleep","milliseconds":{text}}}"#);
            let value: Value = serde_json::from_str(&wire).unwrap();
            let result = TaskSpec::from_json(&value);
            assert!(
                matches!(result, Err(TaskError::NotInteger { .. })),
                "{text}: {result:?}"
            );
        }
    }

    #[test]
    fn out_of_range() {
        let error = parse(json!({"kind":"prime-count","limit":2000000000u64})).unwrap_err();
        assert_eq!(
            error,
            TaskError::OutOfRange {
                kind: "prime-count",
                field: "limit",
                value: "2000000000".into(),
                min: 0,
                max: PRIME_COUNT_LIMIT_MAX
            }
        );
        assert_eq!(
            error.to_string(),
            "prime-count task field \"limit\" is 2000000000, outside the allowed range 0..=1000000000"
        );
        assert_eq!(
            parse(json!({"kind":"sleep","milliseconds":SLEEP_MILLIS_MAX + 1})),
            Err(TaskError::OutOfRange {
                kind: "sleep",
                field: "milliseconds",
                value: (SLEEP_MILLIS_MAX + 1).to_string(),
                min: 0,
                max: SLEEP_MILLIS_MAX
            })
        );
        assert_eq!(
            parse(json!({"kind":"fail","fail_until_attempt":0})),
            Err(TaskError::OutOfRange {
                kind: "fail",
                field: "fail_until_attempt",
                value: "0".into(),
                min: 1,
                max: 100
            })
        );
        // Larger than u32 (the field's Rust type) is still just out of range.
        assert!(matches!(
            parse(json!({"kind":"fail","fail_until_attempt":5_000_000_000u64})),
            Err(TaskError::OutOfRange { .. })
        ));
        // Larger than u64: serde_json holds it as a float, and it is still out of range.
        let huge: Value =
            serde_json::from_str(r#"{"kind":"sleep","milliseconds":100000000000000000000}"#)
                .unwrap();
        assert!(matches!(
            TaskSpec::from_json(&huge),
            Err(TaskError::OutOfRange { .. })
        ));
    }

    #[test]
    fn text_too_long() {
        let text = "é".repeat(TASK_TEXT_BYTES_MAX / 2 + 1);
        let error = parse(json!({"kind":"word-count","text":text})).unwrap_err();
        assert_eq!(
            error,
            TaskError::TextTooLong {
                kind: "word-count",
                bytes: TASK_TEXT_BYTES_MAX + 2,
                max: TASK_TEXT_BYTES_MAX
            }
        );
        assert_eq!(
            error.to_string(),
            "word-count task field \"text\" is 262146 bytes long; at most 262144 bytes are allowed"
        );
    }

    #[test]
    fn unexpected_field() {
        let error = parse(json!({"kind":"sleep","milliseconds":5,"x":1})).unwrap_err();
        assert_eq!(
            error,
            TaskError::UnexpectedField {
                kind: "sleep",
                field: "x".into(),
                allowed: "milliseconds"
            }
        );
        assert_eq!(
            error.to_string(),
            "sleep task has an unexpected field \"x\"; it takes only \"kind\" and \"milliseconds\""
        );
        // A misspelt field is reported as unexpected rather than as the real one missing.
        assert!(matches!(
            parse(json!({"kind":"sleep","millis":5})),
            Err(TaskError::UnexpectedField { .. })
        ));
        // The derived Deserialize is strict in the same way.
        assert!(
            serde_json::from_value::<TaskSpec>(json!({"kind":"sleep","milliseconds":5,"x":1}))
                .is_err()
        );
    }

    // ---- properties ----

    fn valid_spec() -> impl Strategy<Value = TaskSpec> {
        prop_oneof![
            (0..=SLEEP_MILLIS_MAX).prop_map(|milliseconds| TaskSpec::Sleep { milliseconds }),
            any::<String>().prop_map(|text| TaskSpec::WordCount { text }),
            any::<String>().prop_map(|text| TaskSpec::Sha256 { text }),
            (0..=PRIME_COUNT_LIMIT_MAX).prop_map(|limit| TaskSpec::PrimeCount { limit }),
            (1..=ATTEMPTS_MAX).prop_map(|fail_until_attempt| TaskSpec::Fail { fail_until_attempt }),
        ]
    }

    fn any_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            prop::sample::select(vec![
                "sleep",
                "word-count",
                "sha256",
                "prime-count",
                "fail",
                ""
            ])
            .prop_map(Value::from),
            ".{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            let key = prop::sample::select(vec![
                "kind",
                "milliseconds",
                "text",
                "limit",
                "fail_until_attempt",
                "x",
            ]);
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map(key.prop_map(String::from), inner, 0..4)
                    .prop_map(|map| Value::Object(map.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn valid_specs_round_trip(spec in valid_spec()) {
            prop_assert_eq!(spec.validate(), Ok(()));
            let wire = spec.to_json();
            prop_assert_eq!(&wire, &serde_json::to_value(&spec).unwrap());
            prop_assert_eq!(TaskSpec::from_json(&wire), Ok(spec.clone()));
            // And through text, as it travels.
            let text = serde_json::to_string(&wire).unwrap();
            let reparsed: Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(TaskSpec::from_json(&reparsed), Ok(spec));
        }

        #[test]
        fn parsing_never_panics_and_agrees_with_validate(value in any_json()) {
            if let Ok(spec) = TaskSpec::from_json(&value) {
                prop_assert_eq!(spec.validate(), Ok(()));
                prop_assert_eq!(spec.to_json(), value);
            }
        }

        #[test]
        fn out_of_range_numbers_are_rejected(
            ms in SLEEP_MILLIS_MAX + 1..,
            limit in PRIME_COUNT_LIMIT_MAX + 1..,
            until in ATTEMPTS_MAX + 1..,
        ) {
            let is_out_of_range = |r: Result<TaskSpec, TaskError>| {
                matches!(r, Err(TaskError::OutOfRange { .. }))
            };
            let sleep = parse(json!({"kind":"sleep","milliseconds":ms}));
            let prime_count = parse(json!({"kind":"prime-count","limit":limit}));
            let fail = parse(json!({"kind":"fail","fail_until_attempt":until}));
            prop_assert!(is_out_of_range(sleep));
            prop_assert!(is_out_of_range(prime_count));
            prop_assert!(is_out_of_range(fail));
        }

        #[test]
        fn word_count_matches_a_simple_scan(text in "[a b\t\u{a0}\u{3000}\u{200b}é]{0,40}") {
            let mut words = 0u64;
            let mut in_word = false;
            for c in text.chars() {
                if c.is_whitespace() {
                    in_word = false;
                } else if !in_word {
                    in_word = true;
                    words += 1;
                }
            }
            prop_assert_eq!(count_words(&text), words);
        }
    }

    // ---- data-parallel kinds ----

    #[test]
    fn data_parallel_validation_follows_seed_b() {
        assert_eq!(
            parse(json!({"kind":"max","numbers":[]})),
            Err(TaskError::EmptyList)
        );
        assert_eq!(
            parse(json!({"kind":"prime-count-list","numbers":[]})),
            Ok(TaskSpec::PrimeCountList { numbers: vec![] })
        );
        assert_eq!(
            parse(json!({"kind":"prime-sum","start":5,"end":4})),
            Err(TaskError::EmptyRange { start: 5, end: 4 })
        );
        assert_eq!(
            parse(json!({"kind":"prime-sum","start":-3,"end":-3})),
            Ok(TaskSpec::PrimeSum { start: -3, end: -3 })
        );
        let wide = parse(json!({"kind":"prime-sum","start":0,"end":PRIME_SUM_SPAN_MAX}));
        assert!(
            matches!(wide, Err(TaskError::RangeTooWide { .. })),
            "{wide:?}"
        );
        let edge = PRIME_SUM_SPAN_MAX as i64 - 1;
        assert!(parse(json!({"kind":"prime-sum","start":0,"end":edge})).is_ok());
        assert_eq!(
            parse(json!({"kind":"max","numbers":[1, "2"]})),
            Err(TaskError::BadNumber {
                kind: "max",
                index: 1,
                found: "a string".into()
            })
        );
        assert!(matches!(
            parse(json!({"kind":"max","numbers":[1, 1.5]})),
            Err(TaskError::BadNumber { index: 1, .. })
        ));
        assert!(matches!(
            parse(json!({"kind":"max","numbers":[18446744073709551615u64]})),
            Err(TaskError::BadNumber { index: 0, .. })
        ));
        assert!(matches!(
            parse(json!({"kind":"prime-sum","start":"1","end":2})),
            Err(TaskError::NotI64 { field: "start", .. })
        ));
        assert!(matches!(
            parse(json!({"kind":"prime-sum","start":1})),
            Err(TaskError::MissingField { field: "end", .. })
        ));
        let extra = parse(json!({"kind":"prime-sum","start":1,"end":2,"step":1})).unwrap_err();
        assert_eq!(
            extra.to_string(),
            "prime-sum task has an unexpected field \"step\"; it takes only \"kind\" and \"start\" and \"end\""
        );
    }

    #[test]
    fn data_parallel_known_answers() {
        let run = |spec: TaskSpec| execute(&spec, Attempt(1));
        assert_eq!(
            run(TaskSpec::PrimeSum {
                start: 1,
                end: 100_000
            }),
            Ok(TaskOutput::PrimeSum {
                count: 9_592,
                sum: 454_396_537
            })
        );
        assert_eq!(
            run(TaskSpec::Max {
                numbers: vec![2, 4, 5, 11, -3]
            }),
            Ok(TaskOutput::Max { max: 11 })
        );
        assert_eq!(
            run(TaskSpec::PrimeCountList {
                numbers: vec![2, 4, 5, 11, -3, 1, 0]
            }),
            Ok(TaskOutput::PrimeCountList { count: 3 })
        );
    }

    #[test]
    fn a_prime_sum_output_carries_its_sum_as_a_decimal_string() {
        let output = TaskOutput::PrimeSum {
            count: 1,
            sum: u128::from(u64::MAX) + 1,
        };
        let json = serde_json::to_value(&output).unwrap();
        assert_eq!(
            json,
            json!({"kind":"prime-sum","count":1,"sum":"18446744073709551616"})
        );
        assert_eq!(serde_json::from_value::<TaskOutput>(json).unwrap(), output);
        for bad in [json!(12), json!("-1"), json!("1e3"), json!("")] {
            let value = json!({"kind":"prime-sum","count":1,"sum":bad});
            assert!(serde_json::from_value::<TaskOutput>(value).is_err());
        }
    }

    fn data_parallel_spec() -> impl Strategy<Value = TaskSpec> {
        let numbers = || {
            proptest::collection::vec(
                prop_oneof![any::<i64>(), -50i64..200, Just(2_147_483_647i64)],
                0..60,
            )
        };
        prop_oneof![
            numbers()
                .prop_filter("max needs a number", |n| !n.is_empty())
                .prop_map(|numbers| TaskSpec::Max { numbers }),
            numbers().prop_map(|numbers| TaskSpec::PrimeCountList { numbers }),
            (-2_000i64..20_000, 0i64..5_000).prop_map(|(start, width)| TaskSpec::PrimeSum {
                start,
                end: start + width
            }),
            (0i64..3_000).prop_map(|width| TaskSpec::PrimeSum {
                start: i64::MAX - width,
                end: i64::MAX
            }),
        ]
    }

    proptest! {
        /// Split any valid input any number of ways, run every piece, aggregate: the answer is
        /// the sequential one, and the pieces are `min(P, items)` many.
        #[test]
        fn aggregating_the_pieces_gives_the_sequential_answer(
            spec in data_parallel_spec(),
            partitions in 1u32..12,
        ) {
            let whole = execute(&spec, Attempt(1));
            let pieces = spec.split(partitions);
            prop_assert_eq!(pieces.len() as u64, u64::from(partitions).min(spec.items()));
            let outputs: Vec<TaskOutput> = pieces
                .iter()
                .map(|piece| execute(piece, Attempt(1)))
                .collect::<Result<_, _>>()
                .map_err(|e| TestCaseError::fail(e.message))?;
            let refs: Vec<&TaskOutput> = outputs.iter().collect();
            match aggregate(&spec, &refs) {
                Ok(combined) => prop_assert_eq!(Ok(combined), whole),
                Err(error) => prop_assert!(false, "aggregate failed: {}", error),
            }
        }
    }
}
