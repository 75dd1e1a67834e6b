//! The simulated handlers of user tasks: what a worker's own code would do with a user task's
//! payload. The payload decides everything, per attempt, so a seed replays exactly:
//!
//! `{"n": 12, "fail_until": 2, "permanent_at": 3, "ms": 40}` runs for 40 ms; attempts before
//! `fail_until` fail (retryably), an attempt at or past `permanent_at` fails permanently (that
//! rule first), and any other attempt succeeds with `{"task": name, "n": n, "attempt": a,
//! "square": n * n}`.
//!
//! The checker's model computes the expected outcome with its own reading of these rules (it
//! never calls this code).

use herder_core::ids::Attempt;
use herder_core::protocol::AttemptOutcome;
use herder_core::tasks::{TaskOutput, UserTask};
use serde_json::{json, Value};

/// What the handler of `task` gives on `attempt`, and how long it runs (microseconds).
pub(super) fn run_user_task(task: &UserTask, attempt: Attempt) -> (AttemptOutcome, u64) {
    let field = |name: &str| task.payload.get(name).and_then(Value::as_u64);
    let n = task.payload.get("n").and_then(Value::as_i64).unwrap_or(0);
    let runs_us = field("ms").unwrap_or(0) * 1_000;
    let a = u64::from(attempt.0);
    let outcome = if field("permanent_at").is_some_and(|p| a >= p) {
        AttemptOutcome::Failed {
            error: format!("{}: input refused on attempt {a}", task.name),
            permanent: true,
        }
    } else if field("fail_until").is_some_and(|f| a < f) {
        AttemptOutcome::Failed {
            error: format!("{}: transient error on attempt {a}", task.name),
            permanent: false,
        }
    } else {
        let value = json!({
            "task": task.name,
            "n": n,
            "attempt": a,
            "square": n.wrapping_mul(n),
        });
        AttemptOutcome::Succeeded {
            output: TaskOutput::Value { value },
        }
    };
    (outcome, runs_us)
}
