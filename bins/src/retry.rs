//! `herder retry`: failed or cancelled jobs resubmitted as new jobs, each linked to the job it
//! retries and keyed by it, so running the same retry twice creates each new job once.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use herder_core::ids::JobId;
use herder_core::job::JobState;
use herder_core::limits::{LIST_LIMIT_MAX, SUBMIT_BATCH_JOBS_MAX};
use herder_core::protocol::{JobView, SubmitResult};
use herder_runtime::client::{retry_submission, HerderClient};
use serde_json::json;

use crate::cli::RetryArgs;
use crate::exit;
use crate::output::{report_error, usage_error};
use crate::verbs::client_for;

/// Most jobs one `herder retry --state` looks at (pages of `LIST`), whatever matches.
const SCANNED_MAX: usize = 1_000_000;

/// Which of the jobs a `--state` retry looks at it takes.
struct Filter {
    state: JobState,
    queue: Option<String>,
    /// Finished at or before this wall time.
    finished_by: Option<u64>,
    error_contains: Option<String>,
}

impl Filter {
    fn takes(&self, job: &JobView) -> bool {
        job.state == self.state
            && self.queue.as_ref().is_none_or(|q| *q == job.queue)
            && self
                .finished_by
                .is_none_or(|by| job.finished_at_unix_ms.is_some_and(|at| at <= by))
            && self.error_contains.as_ref().is_none_or(|text| {
                job.error
                    .as_deref()
                    .is_some_and(|error| error.contains(text.as_str()))
            })
    }
}

pub async fn run(args: RetryArgs) -> u8 {
    let as_json = args.client.json;
    let client = client_for(&args.client);
    let originals = if args.job_ids.is_empty() {
        let filter = match filter(&args) {
            Ok(filter) => filter,
            Err(message) => return usage_error(&message, as_json),
        };
        match matching(&client, &filter, args.limit, as_json).await {
            Ok(jobs) => jobs,
            Err(code) => return code,
        }
    } else {
        let mut jobs = Vec::with_capacity(args.job_ids.len());
        for raw in &args.job_ids {
            let Ok(job_id) = JobId::from_str(raw) else {
                return usage_error(&format!("{raw:?} is not a job id"), as_json);
            };
            match client.status(job_id).await {
                Ok(job) => jobs.push(job),
                Err(error) => return report_error(&error, as_json),
            }
        }
        jobs
    };
    if args.dry_run {
        let ids: Vec<String> = originals.iter().map(|j| j.id.to_string()).collect();
        if as_json {
            println!("{}", json!({ "would_retry": ids }));
        } else {
            for (id, job) in ids.iter().zip(&originals) {
                println!(
                    "{id}  {}  {}",
                    job.state,
                    job.error.as_deref().unwrap_or("")
                );
            }
            eprintln!("herder: {} jobs would be retried", ids.len());
        }
        return exit::OK;
    }
    let mut retried = Vec::new();
    let mut refused = Vec::new();
    let mut submissions = Vec::new();
    for job in &originals {
        match retry_submission(job) {
            Ok(submission) => submissions.push((job.id, submission)),
            Err(why) => refused.push((job.id, why)),
        }
    }
    for chunk in submissions.chunks(SUBMIT_BATCH_JOBS_MAX) {
        let jobs = chunk.iter().map(|(_, s)| s.clone()).collect();
        let results = match client.submit_batch(jobs).await {
            Ok(results) => results,
            Err(error) => {
                if !retried.is_empty() && !as_json {
                    eprintln!(
                        "herder: {} jobs were retried before this error",
                        retried.len()
                    );
                }
                return report_error(&error, as_json);
            }
        };
        for ((original, _), result) in chunk.iter().zip(results) {
            match result {
                SubmitResult::Accepted { job_id, existing } => {
                    retried.push((*original, job_id, existing))
                }
                SubmitResult::Rejected { message, .. } => refused.push((*original, message)),
                SubmitResult::Error { code, message } => {
                    refused.push((*original, format!("{code:?}: {message}")))
                }
            }
        }
    }
    print_outcome(&retried, &refused, as_json);
    if refused.is_empty() {
        exit::OK
    } else {
        exit::SERVER
    }
}

fn filter(args: &RetryArgs) -> Result<Filter, String> {
    let raw = args.state.as_deref().unwrap_or_default();
    let state = match JobState::parse(raw) {
        Some(state @ (JobState::Failed | JobState::Cancelled)) => state,
        _ => {
            return Err(format!(
                "--state {raw:?}: only failed or cancelled jobs can be retried"
            ))
        }
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO);
    let finished_by = args
        .older_than
        .map(|age| u64::try_from(now.saturating_sub(age).as_millis()).unwrap_or(u64::MAX));
    Ok(Filter {
        state,
        queue: args.queue.clone(),
        finished_by,
        error_contains: args.error_contains.clone(),
    })
}

/// Up to `limit` jobs the filter takes, newest first, paging through `LIST` of its state.
async fn matching(
    client: &HerderClient,
    filter: &Filter,
    limit: usize,
    as_json: bool,
) -> Result<Vec<JobView>, u8> {
    let mut taken = Vec::new();
    let mut before = None;
    let mut scanned = 0;
    while taken.len() < limit && scanned < SCANNED_MAX {
        let page = client
            .list_before(Some(filter.state), Some(LIST_LIMIT_MAX), before)
            .await
            .map_err(|error| report_error(&error, as_json))?;
        let Some(last) = page.last() else {
            break;
        };
        before = Some(last.id);
        scanned += page.len();
        let full = page.len() == LIST_LIMIT_MAX as usize;
        taken.extend(page.into_iter().filter(|job| filter.takes(job)));
        if !full {
            break;
        }
    }
    taken.truncate(limit);
    Ok(taken)
}

fn print_outcome(retried: &[(JobId, JobId, bool)], refused: &[(JobId, String)], as_json: bool) {
    if as_json {
        let retried: Vec<_> = retried
            .iter()
            .map(|(of, id, existing)| json!({"retry_of": of, "job_id": id, "existing": existing}))
            .collect();
        let refused: Vec<_> = refused
            .iter()
            .map(|(of, why)| json!({"job_id": of, "error": why}))
            .collect();
        println!("{}", json!({ "retried": retried, "refused": refused }));
        return;
    }
    for (of, id, existing) in retried {
        if *existing {
            println!("{of} -> {id} (retried before)");
        } else {
            println!("{of} -> {id}");
        }
    }
    for (of, why) in refused {
        println!("{of}: not retried: {why}");
    }
    eprintln!("herder: {} retried, {} not", retried.len(), refused.len());
}
