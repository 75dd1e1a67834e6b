//! What the CLI prints: seed A's layout for people, one JSON object with `--json`.

use herder_core::client::ClientError;
use herder_core::protocol::{ErrorCode, JobView, WorkerView};
use herder_runtime::client::CallError;
use serde_json::json;

use crate::exit;

/// Seed A's human `status` layout.
pub fn job_for_people(job: &JobView) -> String {
    let mut out = format!("Job {}\n", job.id);
    out += &format!("  State:    {}\n", job.state);
    out += &format!("  Task:     {}\n", describe_task(job));
    // A data-parallel parent has no attempts of its own; its partitions are listed below.
    if job.partitions.is_none() {
        out += &format!("  Attempt:  {}/{}\n", job.attempt, job.max_attempts);
    }
    if let Some(worker) = &job.worker {
        out += &format!("  Worker:   {worker}\n");
    }
    if let Some(result) = &job.result {
        out += &format!("  Result:   {result}\n");
    }
    if let Some(error) = &job.error {
        out += &format!("  Error:    {error}\n");
    }
    if let Some(key) = &job.idempotency_key {
        out += &format!("  Key:      {key}\n");
    }
    if let Some(of) = &job.partition_of {
        out += &format!("  Part of:  job {} (partition {})\n", of.parent, of.index);
    }
    if let Some(parts) = &job.partitions {
        out += &format!("  Partitions: {}/{} done\n", parts.done, parts.total);
        for piece in &parts.pieces {
            let worker = piece.worker.as_ref().map_or("-", |w| w.as_str());
            let result = piece
                .result
                .as_ref()
                .map_or(String::new(), |r| format!("  {r}"));
            let again = if piece.attempt > 1 {
                "  (ran again)"
            } else {
                ""
            };
            out += &format!(
                "    #{:<3} {:<10} attempt {}  worker {worker}{result}{again}\n",
                piece.index, piece.state, piece.attempt
            );
        }
    }
    out
}

fn describe_task(job: &JobView) -> String {
    let payload = job.task.to_json();
    let mut text = job.task.kind().to_owned();
    if let Some(fields) = payload.as_object() {
        for (name, value) in fields.iter().filter(|(name, _)| name.as_str() != "kind") {
            let value = match value {
                serde_json::Value::String(s) if s.chars().count() > 40 => {
                    format!("{:?}…", s.chars().take(40).collect::<String>())
                }
                serde_json::Value::Array(items) if items.len() > 8 => {
                    format!("[{} numbers]", items.len())
                }
                other => other.to_string(),
            };
            text += &format!(" --{} {value}", name.replace('_', "-"));
        }
    }
    text
}

pub fn job_json(job: &JobView) -> serde_json::Value {
    serde_json::to_value(job).unwrap_or_else(|e| json!({ "error": e.to_string() }))
}

pub fn workers_for_people(workers: &[WorkerView]) -> String {
    if workers.is_empty() {
        return "No workers registered.\n".into();
    }
    let mut out = format!(
        "{:<20} {:<6} {:>8} {:>8} {:>16}\n",
        "WORKER", "ALIVE", "RUNNING", "CAPACITY", "LAST SEEN (ms)"
    );
    for w in workers {
        out += &format!(
            "{:<20} {:<6} {:>8} {:>8} {:>16}\n",
            w.id.as_str(),
            if w.alive { "yes" } else { "no" },
            w.running,
            w.capacity,
            w.last_heartbeat_millis_ago
        );
    }
    out
}

pub fn jobs_for_people(jobs: &[JobView]) -> String {
    if jobs.is_empty() {
        return "No jobs.\n".into();
    }
    let mut out = format!(
        "{:<36}  {:<10}  {:>7}  {:<12}  {}\n",
        "JOB", "STATE", "ATTEMPT", "WORKER", "TASK"
    );
    for job in jobs {
        out += &format!(
            "{:<36}  {:<10}  {:>7}  {:<12}  {}\n",
            job.id,
            job.state.as_str(),
            format!("{}/{}", job.attempt, job.max_attempts),
            job.worker.as_ref().map_or("-", |w| w.as_str()),
            describe_task(job)
        );
    }
    out
}

/// Prints a failed call the way the caller asked, and returns its exit code.
pub fn report_error(error: &CallError, as_json: bool) -> u8 {
    let (kind, code) = match error {
        CallError::Client(ClientError::Unreachable { .. }) => ("unreachable", exit::UNREACHABLE),
        CallError::Client(ClientError::Rejected { .. }) => ("rejected", exit::REJECTED),
        CallError::Client(ClientError::Server {
            code: ErrorCode::InvalidTask | ErrorCode::InvalidRequest,
            ..
        }) => ("invalid", exit::USAGE),
        CallError::Client(ClientError::Server { .. }) => ("server", exit::SERVER),
        CallError::Client(ClientError::Ambiguous { .. }) => ("ambiguous", exit::SERVER),
        CallError::Client(ClientError::TooManyRedirects(_)) => ("redirects", exit::UNREACHABLE),
        CallError::Client(ClientError::Unsendable { .. }) => ("invalid", exit::USAGE),
        CallError::UnexpectedReply(_) | CallError::Closed => ("protocol", exit::SERVER),
    };
    let server_code = match error {
        CallError::Client(ClientError::Server { code, .. }) => Some(*code),
        _ => None,
    };
    if as_json {
        println!(
            "{}",
            json!({ "error": { "kind": kind, "code": server_code, "message": error.to_string() } })
        );
    } else {
        eprintln!("herder: {error}");
    }
    code
}

/// A usage problem found before anything was sent.
pub fn usage_error(message: &str, as_json: bool) -> u8 {
    if as_json {
        println!(
            "{}",
            json!({ "error": { "kind": "usage", "message": message } })
        );
    } else {
        eprintln!("herder: {message}");
    }
    exit::USAGE
}
