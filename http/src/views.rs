//! The JSON answers of the HTTP API, which are also what `herder <verb> --json` prints: one
//! definition, so the two can never drift apart.

use herder_core::client::ClientError;
use herder_core::ids::JobId;
use herder_core::protocol::{ClusterView, ErrorCode, JobView, WorkerView};
use herder_runtime::client::CallError;
use herder_runtime::Submitted;
use serde_json::{json, Value};

/// A job, as `status` shows it.
pub fn job(job: &JobView) -> Value {
    serde_json::to_value(job).unwrap_or_else(|e| json!({ "error": e.to_string() }))
}

/// A durable submission.
pub fn submitted(submitted: &Submitted) -> Value {
    json!({ "job_id": submitted.job_id, "existing": submitted.existing })
}

/// The end of a wait: the job, and whether the wait ran out first.
pub fn waited(view: &JobView, timed_out: bool) -> Value {
    let mut value = job(view);
    if let Some(object) = value.as_object_mut() {
        object.insert("timed_out".into(), json!(timed_out));
    }
    value
}

/// A cancel's answer; `cancelled` is false when the job was terminal already.
pub fn cancelled(view: &JobView, cancelled: bool) -> Value {
    json!({ "cancelled": cancelled, "job": job(view) })
}

/// One page of a listing, newest first. `truncated`: more jobs match beyond the page, and
/// `next_before` (the page's oldest job) asks for the next one.
pub fn job_list(jobs: &[JobView], truncated: bool) -> Value {
    let next_before: Option<JobId> = if truncated {
        jobs.last().map(|j| j.id)
    } else {
        None
    };
    json!({
        "jobs": jobs.iter().map(job).collect::<Vec<_>>(),
        "truncated": truncated,
        "next_before": next_before,
    })
}

pub fn workers(workers: &[WorkerView]) -> Value {
    json!({ "workers": workers })
}

/// The group: the leader and term, every member's view, and the addresses that did not answer.
pub fn cluster(views: &[ClusterView], unreachable: &[(String, String)]) -> Value {
    let leader = leader_view(views);
    json!({
        "leader": leader.map(|v| &v.node_id),
        "term": leader.map(|v| v.term),
        "members": views,
        "unreachable": unreachable
            .iter()
            .map(|(address, error)| json!({ "address": address, "error": error }))
            .collect::<Vec<_>>(),
    })
}

/// The view of the member that says it leads the highest term, if any does.
pub fn leader_view(views: &[ClusterView]) -> Option<&ClusterView> {
    views
        .iter()
        .filter(|v| v.role == "leader")
        .max_by_key(|v| v.term)
}

/// What kind of failure a call ended in, in the words both the CLI and the HTTP API use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// `unreachable`, `rejected`, `invalid`, `not_found`, `conflict`, `server`, `ambiguous`,
    /// `redirects`, `protocol` or `timeout`.
    pub kind: &'static str,
    /// The coordinator's typed code, if it answered with one.
    pub code: Option<String>,
    /// Whether trying again later may succeed.
    pub retryable: bool,
    pub message: String,
}

impl Failure {
    pub fn of(error: &CallError) -> Failure {
        let server_code = match error {
            CallError::Client(ClientError::Server { code, .. }) => Some(*code),
            _ => None,
        };
        let kind = match error {
            CallError::Client(ClientError::Unreachable { .. }) => "unreachable",
            CallError::Client(ClientError::Rejected { .. }) => "rejected",
            CallError::Client(ClientError::Server { code, .. }) => match code {
                ErrorCode::InvalidTask | ErrorCode::InvalidRequest => "invalid",
                ErrorCode::JobNotFound => "not_found",
                ErrorCode::IdempotencyConflict | ErrorCode::TooManyQueues => "conflict",
                _ => "server",
            },
            CallError::Invalid(_) | CallError::Client(ClientError::Unsendable { .. }) => "invalid",
            CallError::Client(ClientError::Ambiguous { .. }) => "ambiguous",
            CallError::Client(ClientError::TooManyRedirects(_)) => "redirects",
            CallError::UnexpectedReply(_) | CallError::Closed => "protocol",
            CallError::TimedOut { .. } => "timeout",
        };
        let code = match error {
            CallError::Client(ClientError::Rejected { .. }) => Some("SUBMIT_REJECTED".to_owned()),
            _ => server_code.map(code_name),
        };
        let retryable = matches!(
            error,
            CallError::Client(
                ClientError::Rejected { .. }
                    | ClientError::Unreachable { .. }
                    | ClientError::TooManyRedirects(_)
            ) | CallError::TimedOut { .. }
        ) || server_code == Some(ErrorCode::TooManyWaiters);
        // A coordinator's own message already says what is wrong; the code is in `code`.
        let message = match error {
            CallError::Client(ClientError::Server { message, .. }) => message.clone(),
            other => other.to_string(),
        };
        Failure {
            kind,
            code,
            retryable,
            message,
        }
    }

    pub fn json(&self) -> Value {
        json!({ "error": {
            "kind": self.kind,
            "code": self.code,
            "retryable": self.retryable,
            "message": self.message,
        }})
    }
}

/// The wire spelling of a typed error code (`JOB_NOT_FOUND`).
pub fn code_name(code: ErrorCode) -> String {
    match serde_json::to_value(code) {
        Ok(Value::String(name)) => name,
        _ => format!("{code:?}"),
    }
}
