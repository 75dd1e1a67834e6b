//! What a job may ask of its worker: a task kind only some workers serve, a deadline of its
//! own, a permanent failure; and what a draining worker hands back.

use super::*;
use crate::protocol::JobView;

/// Registers `name` serving exactly `tasks`.
fn register_serving(h: &mut Harness, name: &str, capacity: u32, tasks: &[&str]) {
    h.worker_says(
        name,
        WorkerToCoordinator::Register {
            worker_id: WorkerId(name.into()),
            incarnation: Incarnation(1),
            capacity,
            prefetch: 0,
            running: Vec::new(),
            finished: Vec::new(),
            tasks: tasks.iter().map(|t| t.to_string()).collect(),
            draining: false,
            queues: None,
        },
    );
}

fn status(h: &mut Harness, job_id: JobId) -> JobView {
    let request_id = h.request_id();
    h.client_says(ClientRequest::Status { request_id, job_id });
    match h.reply_to(request_id) {
        ClientReply::Job { job, .. } => *job,
        other => panic!("expected a job view, got {other:?}"),
    }
}

/// Submits `task` with a deadline of its own (and `key`, if any); the coordinator's reply.
fn submit_timed(
    h: &mut Harness,
    task: serde_json::Value,
    key: Option<&str>,
    timeout_millis: u64,
) -> ClientReply {
    let request_id = h.request_id();
    h.client_says(ClientRequest::Submit {
        request_id,
        task,
        max_attempts: Some(2),
        idempotency_key: key.map(str::to_owned),
        partitions: None,
        timeout_millis: Some(timeout_millis),
        fairness_key: None,
        priority: None,
        queue: None,
        delay_millis: None,
        run_at_unix_ms: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    });
    h.reply_to(request_id)
}

fn resize(width: u32) -> serde_json::Value {
    json!({"kind": "resize", "payload": {"width": width}})
}

#[test]
fn a_job_goes_only_to_a_worker_serving_its_kind_and_waits_visibly_until_one_registers() {
    let mut h = Harness::new();
    register_serving(&mut h, "w1", 4, &["sha256"]);
    // The user task is older, but no worker serves it: it must not hold up the sha256 job.
    let user_job = h.submit(resize(100), 3);
    let sha_job = h.submit(sha("x"), 3);
    let assigned: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(assigned, vec![sha_job]);
    let view = status(&mut h, user_job);
    assert_eq!((view.state, view.unserved), (JobState::Queued, true));
    assert!(!status(&mut h, sha_job).unserved, "a running job is served");

    register_serving(&mut h, "w2", 1, &["resize", "sha256"]);
    let assigned: Vec<JobId> = h.assignments("w2").iter().map(|a| a.0).collect();
    assert_eq!(assigned, vec![user_job]);
    assert!(h.assignments("w1").is_empty());
    h.check();
}

#[test]
fn a_worker_that_serves_nothing_valid_is_refused() {
    let mut h = Harness::new();
    register_serving(&mut h, "w1", 1, &["no spaces allowed"]);
    let refused = h.sent_to_worker("w1").into_iter().any(|m| {
        matches!(
            m,
            CoordinatorToWorker::RegisterRejected {
                reason: RegisterRejection::InvalidRegistration,
                ..
            }
        )
    });
    assert!(refused);
    assert!(h.closed(Harness::conn_of("w1")));
    // And it gets no work.
    h.submit(sha("x"), 1);
    assert!(h.assignments("w1").is_empty());
}

#[test]
fn a_permanent_failure_fails_the_job_whatever_attempts_remain() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job_id = h.submit(sha("x"), 5);
    let (_, lease_id, attempt) = h.assignments("w1")[0];
    assert_eq!(attempt, Attempt(1));
    let outcome = AttemptOutcome::Failed {
        error: "bad input".into(),
        permanent: true,
    };
    h.finish("w1", job_id, lease_id, outcome);
    assert_eq!(h.state(job_id), JobState::Failed);
    assert_eq!(h.job(job_id).attempt, Attempt(1));
    let error = h.job(job_id).error.clone().unwrap_or_default();
    assert!(
        error.contains("permanently") && error.contains("bad input"),
        "{error}"
    );
    assert!(h
        .sent_to_worker("w1")
        .contains(&ack(true, job_id, lease_id)));
    h.check();
}

#[test]
fn an_oversized_result_fails_the_job_for_good() {
    let mut h = Harness::new();
    register_serving(&mut h, "w1", 1, &["resize"]);
    let job_id = h.submit(resize(1), 5);
    let (_, lease_id, _) = h.assignments("w1")[0];
    let huge = "x".repeat(crate::limits::TASK_RESULT_BYTES_MAX);
    let output = TaskOutput::Value { value: json!(huge) };
    h.finish("w1", job_id, lease_id, AttemptOutcome::Succeeded { output });
    assert_eq!(h.state(job_id), JobState::Failed);
    let error = h.job(job_id).error.clone().unwrap_or_default();
    assert!(
        error.contains("bytes") && error.contains("reference"),
        "{error}"
    );
}

#[test]
fn a_job_timeout_overrides_the_default_deadline_and_travels_with_the_assignment() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let ClientReply::SubmitAccepted { job_id, .. } =
        submit_timed(&mut h, sha("slow"), Some("k"), 500)
    else {
        panic!("not accepted");
    };
    let timeouts: Vec<u64> = h
        .sent_to_worker("w1")
        .into_iter()
        .filter_map(|m| match m {
            CoordinatorToWorker::TaskAssign { timeout_millis, .. } => Some(timeout_millis),
            _ => None,
        })
        .collect();
    assert_eq!(timeouts, vec![500]);
    assert_eq!(status(&mut h, job_id).timeout_millis, Some(500));
    // The default deadline is 10 s; the job's own expires after 500 ms.
    h.advance_with_heartbeats(499, &["w1"]);
    assert_eq!(h.state(job_id), JobState::Running);
    h.advance_with_heartbeats(2, &["w1"]);
    assert_eq!(h.state(job_id), JobState::RetryWait);
    // A keyed resend must ask for the same deadline.
    match submit_timed(&mut h, sha("slow"), Some("k"), 600) {
        ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::IdempotencyConflict),
        other => panic!("expected a conflict, got {other:?}"),
    }
    for bad in [0, crate::limits::JOB_TIMEOUT_MILLIS_MAX + 1] {
        match submit_timed(&mut h, sha("x"), None, bad) {
            ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::InvalidRequest),
            other => panic!("timeout {bad}: expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn a_draining_worker_gets_no_new_work_and_what_it_hands_back_is_not_charged() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let first = h.submit(sha("a"), 1);
    let second = h.submit(sha("b"), 1);
    let (job_id, lease_id, attempt) = h.assignments("w1")[0];
    assert_eq!((job_id, attempt), (first, Attempt(1)));
    h.worker_says("w1", WorkerToCoordinator::Draining {});
    h.finish("w1", first, lease_id, AttemptOutcome::Released {});
    // Queued again with its only attempt given back, and the slot it freed is not refilled.
    assert_eq!(h.state(first), JobState::Queued);
    assert_eq!(h.job(first).attempt, Attempt(0));
    assert!(h.sent_to_worker("w1").contains(&ack(true, first, lease_id)));
    assert!(h.assignments("w1").is_empty());
    assert!(
        status(&mut h, first).unserved,
        "no worker that takes work serves it"
    );
    // Another worker picks both up, the first on its (still first) attempt; a handed-back job
    // queues behind those already waiting, like any requeued job.
    h.register("w2", 2);
    let assigned: Vec<(JobId, Attempt)> = h.assignments("w2").iter().map(|a| (a.0, a.2)).collect();
    assert_eq!(assigned, vec![(second, Attempt(1)), (first, Attempt(1))]);
    h.check();
}

#[test]
fn a_released_result_for_a_lease_no_longer_current_changes_nothing() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job_id = h.submit(sha("a"), 3);
    let (_, lease_id, _) = h.assignments("w1")[0];
    h.succeed("w1", job_id, lease_id);
    h.finish("w1", job_id, lease_id, AttemptOutcome::Released {});
    assert_eq!(h.state(job_id), JobState::Completed);
    assert_eq!(h.job(job_id).attempt, Attempt(1));
}

#[test]
fn a_running_attempts_progress_shows_in_its_view_until_it_ends() {
    let mut h = Harness::new();
    h.register("w1", 1);
    h.register("w2", 1);
    let job_id = h.submit(sha("a"), 3);
    let (on, lease_id) = match (h.assignments("w1").first(), h.assignments("w2").first()) {
        (Some(a), _) => ("w1", a.1),
        (_, Some(a)) => ("w2", a.1),
        _ => panic!("not assigned"),
    };
    let other = if on == "w1" { "w2" } else { "w1" };
    let progress = |note: &str| WorkerToCoordinator::Progress {
        job_id,
        lease_id,
        note: note.into(),
    };
    // Another worker cannot speak for the attempt.
    h.worker_says(other, progress("forged"));
    assert_eq!(status(&mut h, job_id).progress, None);
    h.worker_says(on, progress("half way"));
    assert_eq!(status(&mut h, job_id).progress.as_deref(), Some("half way"));
    let long = "é".repeat(crate::limits::PROGRESS_NOTE_BYTES_MAX);
    h.worker_says(on, progress(&long));
    let shown = status(&mut h, job_id).progress.unwrap_or_default();
    assert!(shown.len() <= crate::limits::PROGRESS_NOTE_BYTES_MAX && shown.starts_with('é'));
    h.succeed(on, job_id, lease_id);
    assert_eq!(status(&mut h, job_id).progress, None);
    // A late note for the finished attempt is ignored.
    h.worker_says(on, progress("late"));
    assert_eq!(status(&mut h, job_id).progress, None);
}

#[test]
fn a_hand_back_from_a_worker_that_is_not_draining_costs_an_attempt() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job_id = h.submit(sha("a"), 3);
    let (_, lease_id, _) = h.assignments("w1")[0];
    h.finish("w1", job_id, lease_id, AttemptOutcome::Released {});
    assert_eq!(h.state(job_id), JobState::RetryWait);
    assert_eq!(h.job(job_id).attempt, Attempt(1));
    let error = h.job(job_id).error.clone().unwrap_or_default();
    assert!(error.contains("without draining"), "{error}");
}
