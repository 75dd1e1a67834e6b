//! `herder submit --batch-file FILE`: every job of a JSON-lines file, sent in batches of up to
//! `SUBMIT_BATCH_JOBS_MAX` (one request and one durable write each), one line printed per job.
//! Lines that wait for other lines (`"ref"`, `"after_refs"`, see `batch_graph`) go in waves.

use std::io::Read;
use std::path::Path;

use herder_core::client::ClientConfig;
use herder_core::limits::SUBMIT_BATCH_JOBS_MAX;
use herder_core::protocol::{JobSubmission, SubmitResult};
use herder_core::tasks::TaskSpec;
use serde_json::json;

use std::collections::BTreeMap;

use herder_core::ids::JobId;

use crate::batch_graph::{waves, Node};
use crate::cli::SubmitArgs;
use crate::exit;
use crate::output::{report_error, usage_error};

/// Largest batch file read (the jobs are held in memory while they are sent).
const BATCH_FILE_BYTES_MAX: u64 = 256 * 1024 * 1024;

pub async fn submit_file(path: &Path, args: &SubmitArgs) -> u8 {
    let as_json = args.client.json;
    let text = match read_bounded(path) {
        Ok(text) => text,
        Err(error) => return usage_error(&error, as_json),
    };
    let jobs = match parse_lines(&text, args) {
        Ok(jobs) => jobs,
        Err(error) => return usage_error(&error, as_json),
    };
    if jobs.is_empty() {
        return usage_error(&format!("{} holds no jobs", path.display()), as_json);
    }
    let lines: Vec<usize> = jobs.iter().map(|(line, _, _)| *line).collect();
    let nodes: Vec<Node> = jobs.iter().map(|(_, _, node)| node.clone()).collect();
    let waves = match waves(&nodes, &lines) {
        Ok(waves) => waves,
        Err(error) => return usage_error(&error, as_json),
    };
    let mut jobs: Vec<Option<JobSubmission>> =
        jobs.into_iter().map(|(_, job, _)| Some(job)).collect();
    let client = crate::verbs::new_client(
        &args.client,
        ClientConfig::new(args.client.coordinator.clone()),
    )
    .with_call_timeout(std::time::Duration::from_millis(
        args.client.call_timeout_millis.max(1),
    ));
    let mut refused = 0usize;
    let mut sent = 0usize;
    // The job each named line became, once accepted (`None`: it was not).
    let mut named: BTreeMap<String, Option<JobId>> = BTreeMap::new();
    for wave in waves {
        let mut ready = Vec::new();
        for i in wave {
            let Some(mut job) = jobs[i].take() else {
                continue;
            };
            // The lines it waits for were sent in earlier waves.
            let mut missing = None;
            for name in &nodes[i].after {
                match named.get(name).copied().flatten() {
                    Some(id) => job.after.push(id),
                    None => missing = Some(name.clone()),
                }
            }
            if let Some(name) = missing {
                refused += 1;
                if let Some(own) = &nodes[i].name {
                    named.insert(own.clone(), None);
                }
                print_not_sent(lines[i], &name, as_json);
                continue;
            }
            ready.push((i, job));
        }
        for chunk in ready.chunks(SUBMIT_BATCH_JOBS_MAX) {
            let batch = chunk.iter().map(|(_, job)| job.clone()).collect();
            let results = match client.submit_batch(batch).await {
                Ok(results) => results,
                Err(error) => {
                    if sent > 0 {
                        eprintln!("herder: {sent} jobs were submitted before this error; the rest were not");
                    }
                    return report_error(&error, as_json);
                }
            };
            for ((i, _), result) in chunk.iter().zip(&results) {
                sent += 1;
                let accepted = match result {
                    SubmitResult::Accepted { job_id, .. } => Some(*job_id),
                    _ => None,
                };
                refused += usize::from(accepted.is_none());
                if let Some(name) = &nodes[*i].name {
                    named.insert(name.clone(), accepted);
                }
                print_result(lines[*i], result, as_json);
            }
        }
    }
    if refused > 0 {
        eprintln!(
            "herder: {refused} of {} jobs were not accepted",
            lines.len()
        );
        return exit::REJECTED;
    }
    exit::OK
}

/// A line not sent, because a line it waits for was not accepted.
fn print_not_sent(line: usize, waits_for: &str, as_json: bool) {
    let message = format!("not sent: the line named {waits_for:?} it waits for was not accepted");
    if as_json {
        println!(
            "{}",
            json!({"line": line, "outcome": "NOT_SENT", "message": message})
        );
    } else {
        println!("line {line}: {message}");
    }
}

fn read_bounded(path: &Path) -> Result<String, String> {
    let mut text = String::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin()
            .take(BATCH_FILE_BYTES_MAX + 1)
            .read_to_string(&mut text)
    } else {
        std::fs::File::open(path).and_then(|file| {
            file.take(BATCH_FILE_BYTES_MAX + 1)
                .read_to_string(&mut text)
        })
    };
    read.map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    if text.len() as u64 > BATCH_FILE_BYTES_MAX {
        return Err(format!(
            "{} is larger than {BATCH_FILE_BYTES_MAX} bytes; split it",
            path.display()
        ));
    }
    Ok(text)
}

/// Each non-blank line as a submission, with its line number; checked here with the
/// coordinator's own rules for tasks, so a bad line stops everything before anything is sent.
fn parse_lines(text: &str, args: &SubmitArgs) -> Result<Vec<(usize, JobSubmission, Node)>, String> {
    let (delay_millis, run_at_unix_ms) = crate::verbs::when_to_run(args)?;
    let after = crate::verbs::parse_after(&args.after)?;
    let mut jobs = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let mut value: serde_json::Value = serde_json::from_str(raw)
            .map_err(|error| format!("line {line} is not a job submission: {error}"))?;
        let node = take_node(&mut value).map_err(|error| format!("line {line}: {error}"))?;
        let mut job: JobSubmission = serde_json::from_value(value)
            .map_err(|error| format!("line {line} is not a job submission: {error}"))?;
        TaskSpec::from_json(&job.task).map_err(|error| format!("line {line}: {error}"))?;
        job.max_attempts = job.max_attempts.or(args.max_attempts);
        job.timeout_millis = job.timeout_millis.or(args.timeout_millis);
        job.queue = job.queue.take().or_else(|| args.queue.clone());
        job.priority = job.priority.or(args.priority);
        job.fairness_key = job
            .fairness_key
            .take()
            .or_else(|| args.fairness_key.clone());
        if job.after.is_empty() {
            job.after = after.clone();
            job.after_any_outcome = args.after_any_outcome;
        }
        if job.delay_millis.is_none() && job.run_at_unix_ms.is_none() {
            job.delay_millis = delay_millis;
            job.run_at_unix_ms = run_at_unix_ms;
        }
        jobs.push((line, job, node));
    }
    Ok(jobs)
}

/// Takes a line's `"ref"` (its name) and `"after_refs"` (the names of the lines it waits for)
/// out of it, leaving the fields of a submission.
fn take_node(value: &mut serde_json::Value) -> Result<Node, String> {
    let Some(object) = value.as_object_mut() else {
        return Ok(Node::default());
    };
    let name = match object.remove("ref") {
        None => None,
        Some(serde_json::Value::String(name)) if !name.is_empty() => Some(name),
        Some(other) => return Err(format!("\"ref\" must be a non-empty string, not {other}")),
    };
    let after = match object.remove("after_refs") {
        None => Vec::new(),
        Some(list) => serde_json::from_value::<Vec<String>>(list)
            .map_err(|_| "\"after_refs\" must be a list of the names of other lines".to_owned())?,
    };
    Ok(Node { name, after })
}

fn print_result(line: usize, result: &SubmitResult, as_json: bool) {
    if as_json {
        let mut value = serde_json::to_value(result).unwrap_or_else(|_| json!({}));
        if let Some(object) = value.as_object_mut() {
            object.insert("line".into(), json!(line));
        }
        println!("{value}");
        return;
    }
    match result {
        SubmitResult::Accepted {
            job_id,
            existing: false,
        } => println!("{job_id}"),
        SubmitResult::Accepted {
            job_id,
            existing: true,
        } => println!("{job_id} (existing job for idempotency key)"),
        SubmitResult::Rejected { message, .. } => println!("line {line}: rejected: {message}"),
        SubmitResult::Error { code, message } => {
            println!("line {line}: not accepted ({code:?}): {message}")
        }
    }
}
