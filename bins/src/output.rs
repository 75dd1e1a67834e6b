//! What the CLI prints: a human-readable layout by default, one JSON object with `--json`.

use herder_core::protocol::{ClusterView, JobView, QueueView, WorkerView};
use herder_runtime::client::CallError;
use std::collections::BTreeSet;

use herder_core::ids::NodeId;
use serde_json::json;

use crate::exit;

/// The human-readable `status` layout.
/// A wall time as people read it: `2026-12-01 21:29:05.616 UTC`.
pub fn utc(unix_ms: u64) -> String {
    let (days, ms_of_day) = (unix_ms / 86_400_000, unix_ms % 86_400_000);
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian calendar).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, sec, ms) = (
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1_000 % 60,
        ms_of_day % 1_000,
    );
    format!("{year:04}-{month:02}-{day:02} {h:02}:{m:02}:{sec:02}.{ms:03} UTC")
}

/// A duration in milliseconds as people read it.
fn millis(ms: u64) -> String {
    if ms < 10_000 {
        format!("{ms} ms")
    } else {
        format!("{:.1} s", ms as f64 / 1000.0)
    }
}

pub fn job_for_people(job: &JobView) -> String {
    let mut out = format!("Job {}\n", job.id);
    if job.unserved {
        out += &format!(
            "  State:    {} (no live worker serves {:?}; it waits for one)\n",
            job.state,
            job.task.kind()
        );
    } else {
        out += &format!("  State:    {}\n", job.state);
    }
    out += &format!("  Task:     {}\n", describe_task(job));
    if let Some(millis) = job.timeout_millis {
        out += &format!("  Timeout:  {millis} ms per attempt\n");
    }
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
    if let Some(created) = job.created_at_unix_ms {
        out += &format!("  Created:  {}\n", utc(created));
    }
    if let Some(run_at) = job.run_at_unix_ms {
        out += &format!("  Runs at:  {} (not queued before)\n", utc(run_at));
    }
    if let Some(started) = job.first_started_at_unix_ms {
        out += &format!("  Started:  {}\n", utc(started));
    }
    if let Some(finished) = job.finished_at_unix_ms {
        let took = job.created_at_unix_ms.map_or(String::new(), |c| {
            format!(
                " ({} after it was created)",
                millis(finished.saturating_sub(c))
            )
        });
        out += &format!("  Finished: {}{took}\n", utc(finished));
    }
    if !job.history.is_empty() {
        let dropped = if job.history_dropped > 0 {
            format!(" ({} older not kept)", job.history_dropped)
        } else {
            String::new()
        };
        out += &format!("  History:{dropped}\n");
        for record in &job.history {
            let ended = match (record.outcome, record.ran_millis()) {
                (Some(outcome), Some(ran)) => format!("{outcome} after {}", millis(ran)),
                _ => "running".to_owned(),
            };
            out += &format!(
                "    attempt {:<3} {:<12} started {}  {ended}\n",
                record.attempt,
                record.worker.as_str(),
                utc(record.started_at_unix_ms.0)
            );
            if let Some(error) = &record.error {
                out += &format!("                {error}\n");
            }
        }
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
    herder_http::views::job(job)
}

pub fn workers_for_people(workers: &[WorkerView]) -> String {
    if workers.is_empty() {
        return "No workers registered.\n".into();
    }
    let mut out = format!(
        "{:<20} {:<8} {:>8} {:>8} {:>16}  {}\n",
        "WORKER", "ALIVE", "RUNNING", "CAPACITY", "LAST SEEN (ms)", "TASKS"
    );
    for w in workers {
        let alive = match (w.alive, w.draining) {
            (true, true) => "draining",
            (true, false) => "yes",
            (false, _) => "no",
        };
        out += &format!(
            "{:<20} {:<8} {:>8} {:>8} {:>16}  {}\n",
            w.id.as_str(),
            alive,
            w.running,
            w.capacity,
            w.last_heartbeat_millis_ago,
            served_for_people(&w.tasks)
        );
    }
    out
}

/// Queues as a table: settings, jobs by state, and the oldest queued job's wait.
pub fn queues_for_people(queues: &[QueueView]) -> String {
    if queues.is_empty() {
        return "No queues yet: a queue is created by its first job.\n".into();
    }
    let mut out = format!(
        "{:<24} {:>6} {:<7} {:>8} {:>8} {:>8} {:>10} {:>8} {:>10} {:>12}  {}\n",
        "QUEUE",
        "WEIGHT",
        "STATE",
        "QUEUED",
        "RUNNING",
        "RETRYING",
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "OLDEST WAIT",
        "LIMITS"
    );
    for q in queues {
        let state = if q.paused { "paused" } else { "active" };
        let oldest = q.oldest_queued_millis.map_or_else(
            || "-".to_owned(),
            |ms| format!("{:.1}s", ms as f64 / 1000.0),
        );
        out += &format!(
            "{:<24} {:>6} {:<7} {:>8} {:>8} {:>8} {:>10} {:>8} {:>10} {:>12}  {}\n",
            q.name,
            q.weight,
            state,
            q.queued,
            q.running,
            q.retry_wait,
            q.completed,
            q.failed,
            q.cancelled,
            oldest,
            limits_for_people(q)
        );
    }
    out
}

/// A queue's limits in a few words: `running<=4 per-key<=1 rate=30/60s key-rate=2/1s
/// unfinished<=1000`, or `-` for none.
fn limits_for_people(q: &QueueView) -> String {
    let mut limits = Vec::new();
    if let Some(n) = q.concurrency {
        limits.push(format!("running<={n}"));
    }
    if let Some(n) = q.key_concurrency {
        limits.push(format!("per-key<={n}"));
    }
    if let Some(rate) = q.rate {
        limits.push(format!(
            "rate={}/{}",
            rate.starts,
            period_for_people(rate.per_millis)
        ));
    }
    if let Some(rate) = q.key_rate {
        limits.push(format!(
            "key-rate={}/{}",
            rate.starts,
            period_for_people(rate.per_millis)
        ));
    }
    if let Some(n) = q.max_active_jobs {
        limits.push(format!("unfinished<={n}"));
    }
    if limits.is_empty() {
        "-".to_owned()
    } else {
        limits.join(" ")
    }
}

/// A period in the largest whole unit that spells it: `1s`, `5m`, `1500ms`.
fn period_for_people(millis: u64) -> String {
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if millis % size == 0 {
            return format!("{}{unit}", millis / size);
        }
    }
    format!("{millis}ms")
}

/// The kinds a worker serves, with the eight built-in defaults folded into one word.
fn served_for_people(tasks: &[String]) -> String {
    let builtin = herder_core::tasks::TASK_KINDS;
    let all_builtin = builtin.iter().all(|kind| tasks.iter().any(|t| t == kind));
    let mut shown: Vec<&str> = Vec::new();
    if all_builtin {
        shown.push("built-in");
    }
    shown.extend(
        tasks
            .iter()
            .map(String::as_str)
            .filter(|t| !(all_builtin && builtin.contains(t))),
    );
    shown.join(",")
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

/// Prints a failed call the way the caller asked, and returns its exit code. The JSON form
/// is the HTTP API's error body (`herder_http::views::Failure`).
pub fn report_error(error: &CallError, as_json: bool) -> u8 {
    let failure = Failure::of(error);
    let code = match failure.kind {
        "unreachable" | "redirects" | "timeout" => exit::UNREACHABLE,
        "rejected" => exit::REJECTED,
        "invalid" => exit::USAGE,
        _ => exit::SERVER,
    };
    print_failure(error, failure, as_json);
    code
}

/// Prints a failed call as `kind` and returns `code`.
pub fn report_error_as(error: &CallError, as_json: bool, kind: &'static str, code: u8) -> u8 {
    let failure = Failure {
        kind,
        ..Failure::of(error)
    };
    print_failure(error, failure, as_json);
    code
}

fn print_failure(error: &CallError, failure: Failure, as_json: bool) {
    if as_json {
        println!("{}", failure.json());
    } else {
        eprintln!("herder: {error}");
    }
}

/// The member whose view says it leads in the highest term, if any.
use herder_http::views::{leader_view, Failure};

/// One line per member that answered (and one per member listed that did not), then how long
/// ago the leader heard from each member.
pub fn cluster_for_people(views: &[ClusterView], unreachable: &[(String, String)]) -> String {
    let mut out = format!(
        "{:<16} {:<14} {:>6} {:>8} {:>8} {:>8}  {}\n",
        "MEMBER", "ROLE", "TERM", "LAST", "COMMIT", "APPLIED", "CLIENTS AT"
    );
    for view in views {
        let address = view
            .members
            .iter()
            .find(|m| m.node_id == view.node_id)
            .and_then(|m| m.client_address.as_deref())
            .unwrap_or("-");
        out += &format!(
            "{:<16} {:<14} {:>6} {:>8} {:>8} {:>8}  {address}\n",
            view.node_id.0,
            view.role,
            view.term.0,
            view.last_index.0,
            view.commit_index.0,
            view.applied_index.0
        );
    }
    let answered: BTreeSet<&NodeId> = views.iter().map(|v| &v.node_id).collect();
    let silent: BTreeSet<&NodeId> = views
        .iter()
        .flat_map(|v| v.members.iter().map(|m| &m.node_id))
        .filter(|id| !answered.contains(id))
        .collect();
    for id in silent {
        out += &format!("{:<16} {:<14}\n", id.0, "(no answer)");
    }
    match leader_view(views) {
        Some(leader) => {
            let heard: Vec<String> = leader
                .members
                .iter()
                .filter(|m| m.node_id != leader.node_id)
                .map(|m| match m.last_heard_millis_ago {
                    Some(ms) => format!("{} {ms} ms ago", m.node_id),
                    None => format!("{} never", m.node_id),
                })
                .collect();
            out += &format!("\nLeader {} (term {}).", leader.node_id, leader.term.0);
            if !heard.is_empty() {
                out += &format!(" It last heard from {}.", heard.join(", "));
            }
            out += "\n";
        }
        None => out += "\nNo member that answered leads; an election may be under way.\n",
    }
    for (address, error) in unreachable {
        out += &format!("No answer from {address}: {error}\n");
    }
    out
}

/// `herder cluster --json`: the leader and term, every member's view, and the addresses that
/// did not answer.
pub fn cluster_json(views: &[ClusterView], unreachable: &[(String, String)]) -> serde_json::Value {
    herder_http::views::cluster(views, unreachable)
}

/// A usage problem found before anything was sent.
pub fn usage_error(message: &str, as_json: bool) -> u8 {
    if as_json {
        println!(
            "{}",
            json!({ "error": { "kind": "usage", "code": null, "retryable": false, "message": message } })
        );
    } else {
        eprintln!("herder: {message}");
    }
    exit::USAGE
}

#[cfg(test)]
mod time_tests {
    use super::utc;

    #[test]
    fn wall_times_read_as_utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(utc(951_782_400_123), "2000-02-29 00:00:00.123 UTC");
        assert_eq!(utc(1_796_160_545_616), "2026-12-01 21:29:05.616 UTC");
    }
}
