//! `SUBMIT_BATCH`: one durable write for many jobs, each answered as a `SUBMIT` of it alone
//! would be, and a bad job failing the batch before anything is created.

use super::*;
use crate::limits::SUBMIT_BATCH_JOBS_MAX;
use crate::protocol::{JobSubmission, SubmitResult};

fn job(task: serde_json::Value, key: Option<&str>) -> JobSubmission {
    JobSubmission {
        task,
        max_attempts: None,
        idempotency_key: key.map(str::to_owned),
        partitions: None,
        timeout_millis: None,
        fairness_key: None,
        priority: None,
        queue: None,
        delay_millis: None,
        run_at_unix_ms: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    }
}

impl Harness {
    fn batch_request(&mut self, jobs: Vec<JobSubmission>) -> RequestId {
        let request_id = self.request_id();
        self.client_says(ClientRequest::SubmitBatch { request_id, jobs });
        request_id
    }

    fn batch(&mut self, jobs: Vec<JobSubmission>) -> Vec<SubmitResult> {
        let request_id = self.batch_request(jobs);
        match self.reply_to(request_id) {
            ClientReply::SubmitBatchResult { results, .. } => results,
            other => panic!("expected a batch result, got {other:?}"),
        }
    }

    fn persists_held(&self) -> usize {
        self.held.len()
    }
}

fn accepted(result: &SubmitResult) -> JobId {
    match result {
        SubmitResult::Accepted { job_id, .. } => *job_id,
        other => panic!("expected an accepted job, got {other:?}"),
    }
}

#[test]
fn a_batch_is_one_durable_write_and_is_answered_only_once_it_is_durable() {
    let mut h = Harness::new();
    h.hold_writes = true;
    let jobs = (0..5).map(|i| job(sha(&format!("{i}")), None)).collect();
    let request_id = h.batch_request(jobs);
    assert_eq!(h.persists_held(), 1, "five jobs, one write");
    assert!(
        h.try_reply_to(request_id).is_none(),
        "nothing is answered before the write is durable"
    );
    h.release_writes();
    let ClientReply::SubmitBatchResult { results, .. } = h.reply_to(request_id) else {
        panic!("expected a batch result");
    };
    assert_eq!(results.len(), 5);
    for (i, result) in results.iter().enumerate() {
        let id = accepted(result);
        let text = format!("{i}");
        assert_eq!(
            h.job(id).task,
            TaskSpec::Sha256 { text },
            "in the order sent"
        );
    }
    assert_eq!(h.d.c.table().len(), 5);
}

#[test]
fn a_bad_job_fails_the_whole_batch_and_creates_nothing() {
    let mut h = Harness::new();
    let jobs = vec![
        job(sha("ok"), None),
        job(json!({"kind": "sha256"}), None),
        job(sha("ok too"), None),
    ];
    let request_id = h.batch_request(jobs);
    match h.reply_to(request_id) {
        ClientReply::Error { code, message, .. } => {
            assert_eq!(code, ErrorCode::InvalidTask);
            assert!(message.starts_with("job 1 of the batch"), "{message}");
        }
        other => panic!("expected an error, got {other:?}"),
    }
    assert_eq!(h.d.c.table().len(), 0);
    for jobs in [
        Vec::new(),
        vec![job(sha("x"), None); SUBMIT_BATCH_JOBS_MAX + 1],
    ] {
        let request_id = h.batch_request(jobs);
        match h.reply_to(request_id) {
            ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::InvalidRequest),
            other => panic!("expected an error, got {other:?}"),
        }
    }
    assert_eq!(h.d.c.table().len(), 0);
}

#[test]
fn admission_answers_each_job_and_refuses_only_what_does_not_fit() {
    let mut h = Harness::with(CoordinatorConfig {
        max_active_jobs: 3,
        ..config()
    });
    h.submit(sha("before"), 3);
    let results = h.batch((0..4).map(|i| job(sha(&format!("{i}")), None)).collect());
    accepted(&results[0]);
    accepted(&results[1]);
    for refused in &results[2..] {
        match refused {
            SubmitResult::Rejected {
                retryable,
                active_jobs,
                admitting_jobs,
                max_active_jobs,
                ..
            } => {
                assert!(retryable);
                assert_eq!((*active_jobs, *admitting_jobs, *max_active_jobs), (1, 2, 3));
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    assert_eq!(h.d.c.table().len(), 3);
}

#[test]
fn keys_are_answered_per_job_within_a_batch_and_across_batches() {
    let mut h = Harness::new();
    let first = accepted(&h.batch(vec![job(sha("a"), Some("k1"))])[0]);
    let results = h.batch(vec![
        job(sha("a"), Some("k1")),
        job(sha("other"), Some("k1")),
        job(sha("b"), Some("k2")),
        job(sha("b"), Some("k2")),
    ]);
    assert_eq!(
        results[0],
        SubmitResult::Accepted {
            job_id: first,
            existing: true
        }
    );
    match &results[1] {
        SubmitResult::Error { code, .. } => assert_eq!(*code, ErrorCode::IdempotencyConflict),
        other => panic!("expected a conflict, got {other:?}"),
    }
    // The second k2 waited for the first to be written and names the same job.
    let b = accepted(&results[2]);
    assert_eq!(
        results[3],
        SubmitResult::Accepted {
            job_id: b,
            existing: true
        }
    );
    assert_eq!(h.d.c.table().len(), 2);
}

#[test]
fn a_batch_whose_connection_closes_is_dropped_and_its_jobs_still_exist() {
    let mut h = Harness::new();
    h.hold_writes = true;
    let request_id = h.request_id();
    let jobs = vec![job(sha("a"), None), job(sha("b"), None)];
    h.d.c.handle_client_message(
        h.d.now,
        ConnectionId(77),
        &crate::auth::Caller::anonymous(),
        ClientRequest::SubmitBatch { request_id, jobs },
    );
    h.d.c.handle_closed(h.d.now, ConnectionId(77));
    h.pump();
    h.release_writes();
    assert!(h.try_reply_to(request_id).is_none());
    assert_eq!(h.d.c.table().len(), 2, "what was proposed is written");
}
