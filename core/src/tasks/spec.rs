//! What a task is: the [`TaskSpec`] a client submits, the kinds it can name, and the strict
//! checks that turn untrusted JSON into one. Every way a payload can be wrong has its own
//! [`TaskError`] variant, and the bounds come from [`crate::limits`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::limits::{
    ATTEMPTS_MAX, EXEC_ARGS_MAX, EXEC_ENV_MAX, EXEC_STRING_BYTES_MAX, PRIME_COUNT_LIMIT_MAX,
    PRIME_SUM_SIEVE_ONLY_END, PRIME_SUM_SPAN_MAX, PRIME_SUM_SPAN_MAX_HIGH, SLEEP_MILLIS_MAX,
    TASK_NAME_BYTES_MAX, TASK_NUMBERS_MAX, TASK_PAYLOAD_BYTES_MAX, TASK_TEXT_BYTES_MAX,
};

/// Every built-in task kind, by its wire name, in the order they are listed in error messages.
/// Any other well-formed name is a user task ([`UserTask`]).
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

/// The kind that runs a command on a worker. Built in, but served only by workers that allow
/// commands (`--allow-exec`), so it is not among the kinds a worker serves by default.
pub const EXEC_KIND: &str = "exec";

/// Longest piece of client-supplied text (an unknown kind or field name) echoed back in an error.
const ECHO_BYTES_MAX: usize = 64;

/// The task a job runs.
///
/// Wire form: a JSON object with a `"kind"` tag, e.g. `{"kind":"sleep","milliseconds":1000}`,
/// `{"kind":"word-count","text":"a b"}`, `{"kind":"sha256","text":"abc"}`,
/// `{"kind":"prime-count","limit":100000}`, `{"kind":"fail","fail_until_attempt":3}`.
///
/// A name that is not built in names a user task: `{"kind":"resize","payload":{...}}`, run by
/// whichever worker registered a handler for it.
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
    /// Run a command (no shell) on a worker whose `--allow-exec` patterns admit the program.
    Exec {
        /// The program, then its arguments: 1 to [`EXEC_ARGS_MAX`] strings.
        argv: Vec<String>,
        /// The working directory, relative to the worker's exec directory (absent: that
        /// directory itself).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
        /// Environment variables to set, on top of the worker's clean exec environment.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        env: BTreeMap<String, String>,
    },
    /// A task the user's own handler runs; Herder only carries its payload.
    #[serde(untagged)]
    User(UserTask),
}

/// A user task: a name some worker serves and an opaque JSON payload for its handler.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserTask {
    /// The task name, in the `"kind"` field on the wire; see [`check_task_name`].
    #[serde(rename = "kind")]
    pub name: String,
    /// Whatever the handler expects, at most [`TASK_PAYLOAD_BYTES_MAX`] bytes as JSON.
    #[serde(default)]
    pub payload: Value,
}

/// Whether `name` may name a user task: 1 to [`TASK_NAME_BYTES_MAX`] bytes of ASCII letters,
/// digits and `-_.:/`, starting with a letter or digit, and not a built-in kind.
pub fn check_task_name(name: &str) -> Result<(), TaskError> {
    let bad = |reason: &'static str| TaskError::BadTaskName {
        name: echo(name),
        reason,
    };
    if name.is_empty() {
        return Err(bad("it is empty"));
    }
    if name.len() > TASK_NAME_BYTES_MAX {
        return Err(bad("it is longer than 64 bytes"));
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(bad("it must start with a letter or a digit"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.:/".contains(&b))
    {
        return Err(bad("only ASCII letters, digits and - _ . : / are allowed"));
    }
    if Kind::from_name(name).is_some() || name == EXEC_KIND {
        return Err(bad("it is a built-in task kind"));
    }
    Ok(())
}

/// Checks a name a worker says it serves: a built-in kind or a valid user task name.
pub fn check_served_name(name: &str) -> Result<(), TaskError> {
    if Kind::from_name(name).is_some() || name == EXEC_KIND {
        return Ok(());
    }
    check_task_name(name)
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
    /// A kind that is not built in and is not a valid user task name either.
    #[error(
        "{name:?} is neither a built-in task kind ({}) nor a valid task name: {reason}",
        known_kinds()
    )]
    BadTaskName {
        /// The name (shortened if very long).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An `exec` task field is missing or wrong.
    #[error("exec task field \"{field}\" {reason}")]
    BadExec {
        /// The field: "argv", "cwd" or "env" (or the unexpected field's name).
        field: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// A user task has a field other than "kind" and "payload".
    #[error("task {name:?} has an unexpected field {field:?}; a user task takes only \"kind\" and \"payload\"")]
    UserTaskField {
        /// The task name.
        name: String,
        /// The unexpected field's name (shortened if very long).
        field: String,
    },
    /// A user task's payload is too large.
    #[error("task {name:?} has a payload of {bytes} bytes as JSON; at most {max} bytes are allowed (put large inputs in shared storage and pass a reference)")]
    PayloadTooLarge {
        /// The task name.
        name: String,
        /// The payload's size as compact JSON.
        bytes: usize,
        /// The limit.
        max: usize,
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
    format!("{}...", crate::text::prefix_within(text, ECHO_BYTES_MAX))
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
        if kind_name == EXEC_KIND {
            let spec = parse_exec(object)?;
            spec.validate()?;
            return Ok(spec);
        }
        let Some(kind) = Kind::from_name(kind_name) else {
            return UserTask::from_object(kind_name, object).map(TaskSpec::User);
        };
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
        let kind = match self {
            TaskSpec::User(task) => return task.validate(),
            _ => self.builtin_kind(),
        };
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
            TaskSpec::User(_) => Ok(()),
            TaskSpec::Exec { argv, cwd, env } => validate_exec(argv, cwd.as_deref(), env),
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

    /// The wire name of the kind: one of [`TASK_KINDS`], or a user task's name. Workers
    /// register the names they serve, and a job goes only to a worker serving its kind.
    pub fn kind(&self) -> &str {
        match self {
            TaskSpec::User(task) => &task.name,
            _ => self.builtin_kind(),
        }
    }

    /// A built-in kind's name (`"user"` for a user task, which has its own).
    fn builtin_kind(&self) -> &'static str {
        match self {
            TaskSpec::User(_) => "user",
            TaskSpec::Exec { .. } => EXEC_KIND,
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
        if let TaskSpec::Exec { argv, cwd, env } = self {
            let mut object = Map::new();
            object.insert("kind".to_string(), Value::from(EXEC_KIND));
            object.insert("argv".to_string(), Value::from(argv.clone()));
            if let Some(cwd) = cwd {
                object.insert("cwd".to_string(), Value::from(cwd.as_str()));
            }
            if !env.is_empty() {
                let vars = env
                    .iter()
                    .map(|(name, value)| (name.clone(), Value::from(value.as_str())))
                    .collect();
                object.insert("env".to_string(), Value::Object(vars));
            }
            return Value::Object(object);
        }
        if let TaskSpec::User(task) = self {
            let mut object = Map::new();
            object.insert("kind".to_string(), Value::from(task.name.as_str()));
            object.insert("payload".to_string(), task.payload.clone());
            return Value::Object(object);
        }
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
            TaskSpec::User(_) | TaskSpec::Exec { .. } => unreachable!("answered above"),
        };
        object.insert(field.to_string(), value);
        Value::Object(object)
    }
}

/// Reads an `exec` task's fields strictly (the bounds are [`validate_exec`]'s).
fn parse_exec(object: &Map<String, Value>) -> Result<TaskSpec, TaskError> {
    let bad = |field: &str, reason: String| TaskError::BadExec {
        field: echo(field),
        reason,
    };
    if let Some(extra) = object
        .keys()
        .find(|key| !matches!(key.as_str(), "kind" | "argv" | "cwd" | "env"))
    {
        return Err(bad(
            extra,
            "is not an exec field; it takes \"argv\", \"cwd\" and \"env\"".into(),
        ));
    }
    let argv = match object.get("argv") {
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(index, item)| {
                item.as_str().map(str::to_owned).ok_or_else(|| {
                    bad(
                        "argv",
                        format!(
                            "element {index} is {}; every element must be a string",
                            json_type(item)
                        ),
                    )
                })
            })
            .collect::<Result<Vec<String>, TaskError>>()?,
        Some(other) => {
            return Err(bad(
                "argv",
                format!("must be an array of strings, found {}", json_type(other)),
            ))
        }
        None => {
            return Err(bad(
                "argv",
                "is missing; it must list the program and its arguments".into(),
            ))
        }
    };
    let cwd = match object.get("cwd") {
        None | Some(Value::Null) => None,
        Some(Value::String(cwd)) => Some(cwd.clone()),
        Some(other) => {
            return Err(bad(
                "cwd",
                format!("must be a string, found {}", json_type(other)),
            ))
        }
    };
    let env = match object.get("env") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(Value::Object(vars)) => vars
            .iter()
            .map(|(name, value)| match value {
                Value::String(value) => Ok((name.clone(), value.clone())),
                other => Err(bad(
                    "env",
                    format!(
                        "variable {:?} is {}; every value must be a string",
                        echo(name),
                        json_type(other)
                    ),
                )),
            })
            .collect::<Result<BTreeMap<String, String>, TaskError>>()?,
        Some(other) => {
            return Err(bad(
                "env",
                format!("must be an object of strings, found {}", json_type(other)),
            ))
        }
    };
    Ok(TaskSpec::Exec { argv, cwd, env })
}

/// The bounds of an `exec` task: a program and at most [`EXEC_ARGS_MAX`] strings in all; no
/// string longer than [`EXEC_STRING_BYTES_MAX`] or holding a NUL byte (no OS takes one); a
/// working directory that is relative and never climbs out (`..`); at most [`EXEC_ENV_MAX`]
/// variables named like shell variables.
fn validate_exec(
    argv: &[String],
    cwd: Option<&str>,
    env: &BTreeMap<String, String>,
) -> Result<(), TaskError> {
    let bad = |field: &str, reason: String| TaskError::BadExec {
        field: field.to_owned(),
        reason,
    };
    let check_string = |field: &str, what: &str, text: &str| {
        if text.len() > EXEC_STRING_BYTES_MAX {
            Err(bad(
                field,
                format!(
                    "has {what} of {} bytes; at most {EXEC_STRING_BYTES_MAX} are allowed",
                    text.len()
                ),
            ))
        } else if text.contains('\0') {
            Err(bad(field, format!("has {what} holding a NUL byte")))
        } else {
            Ok(())
        }
    };
    if argv.is_empty() || argv.len() > EXEC_ARGS_MAX {
        return Err(bad(
            "argv",
            format!(
                "has {} strings; it must hold the program and at most {} arguments",
                argv.len(),
                EXEC_ARGS_MAX - 1
            ),
        ));
    }
    let program = &argv[0];
    if program.is_empty() {
        return Err(bad("argv", "names an empty program".into()));
    }
    if program.contains('/') && !program.starts_with('/') {
        return Err(bad(
            "argv",
            format!(
                "names the program {:?}; give an absolute path or a bare name looked up on the worker's PATH",
                echo(program)
            ),
        ));
    }
    for (index, arg) in argv.iter().enumerate() {
        check_string("argv", &format!("element {index}"), arg)?;
    }
    if let Some(cwd) = cwd {
        check_string("cwd", "a path", cwd)?;
        if cwd.starts_with('/') || cwd.split('/').any(|part| part == "..") {
            return Err(bad(
                "cwd",
                format!("is {:?}; it must be a path inside the worker's exec directory (relative, without \"..\")", echo(cwd)),
            ));
        }
    }
    if env.len() > EXEC_ENV_MAX {
        return Err(bad(
            "env",
            format!(
                "sets {} variables; at most {EXEC_ENV_MAX} are allowed",
                env.len()
            ),
        ));
    }
    for (name, value) in env {
        let shell_like = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        // What finds and loads the program is the worker's to set, not the task's: a task's own
        // PATH or preloaded library would run code no allow-list pattern admitted.
        let reserved = name == "PATH"
            || name.starts_with("LD_")
            || name.starts_with("DYLD_")
            || name.starts_with("HERDER_");
        if reserved {
            return Err(bad(
                "env",
                format!("may not set {name}: PATH, LD_*, DYLD_* and HERDER_* are the worker's own"),
            ));
        }
        if !shell_like || name.len() > 128 {
            return Err(bad(
                "env",
                format!(
                    "variable name {:?} must be letters, digits and _ (not starting with a digit), at most 128 bytes",
                    echo(name)
                ),
            ));
        }
        check_string("env", &format!("variable {name}"), value)?;
    }
    Ok(())
}

impl UserTask {
    /// Reads a user task from an object whose `"kind"` is not built in.
    fn from_object(name: &str, object: &Map<String, Value>) -> Result<UserTask, TaskError> {
        check_task_name(name)?;
        if let Some(extra) = object
            .keys()
            .find(|key| *key != "kind" && *key != "payload")
        {
            return Err(TaskError::UserTaskField {
                name: name.to_string(),
                field: echo(extra),
            });
        }
        let task = UserTask {
            name: name.to_string(),
            payload: object.get("payload").cloned().unwrap_or(Value::Null),
        };
        task.validate()?;
        Ok(task)
    }

    /// The name is well formed and the payload within its bound.
    pub fn validate(&self) -> Result<(), TaskError> {
        check_task_name(&self.name)?;
        let bytes = json_bytes(&self.payload);
        if bytes > TASK_PAYLOAD_BYTES_MAX {
            return Err(TaskError::PayloadTooLarge {
                name: self.name.clone(),
                bytes,
                max: TASK_PAYLOAD_BYTES_MAX,
            });
        }
        Ok(())
    }
}

/// The length of `value` as compact JSON, counted without building the text.
pub fn json_bytes(value: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` to a sink that cannot fail cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
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

#[cfg(test)]
mod tests;
