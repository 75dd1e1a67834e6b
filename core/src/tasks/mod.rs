//! Built-in tasks: what a job asks a worker to do, and the pure functions that do it.
//!
//! The module has three parts, one role each, all re-exported here:
//!
//! - `spec`: the [`TaskSpec`] a client sends as untrusted JSON, read strictly by
//!   [`TaskSpec::from_json`] (each mistake a typed [`TaskError`] saying what is wrong and what
//!   would be accepted) and bounded by [`TaskSpec::validate`] against [`crate::limits`].
//! - `run`: running a task, pure and deterministic in `(spec, attempt)`. [`execute`] computes the
//!   [`TaskOutput`] on the calling thread without sleeping, reading a clock or touching the OS;
//!   for a `sleep` task the runtime owns the timer, and [`TaskSpec::plan`] says how long to wait
//!   and what to report afterwards.
//! - `split`: the data-parallel kinds, cut into partitions by [`TaskSpec::split`] and put back
//!   together by [`aggregate`].

mod run;
mod spec;
mod split;

pub use run::{
    count_primes_up_to, count_words, execute, execute_until, sha256_hex, TaskFailure, TaskOutput,
    TaskPlan,
};
pub use spec::{
    check_served_name, check_task_name, json_bytes, prime_sum_span_max, range_span, TaskError,
    TaskSpec, UserTask, EXEC_KIND, TASK_KINDS,
};
pub use split::{aggregate, Partitions};
