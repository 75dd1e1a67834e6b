//! State-machine tests for the coordinator, driven by hand with explicit time.
//!
//! They cover the coordinator's behaviour at the state-machine level: failure detection by
//! silence and by disconnect, retry exhaustion, the three kinds of stale result, restart recovery
//! (the final-attempt rule, stale deadlines, re-registration and re-adoption), deadline expiry on
//! a healthy worker, cancellation in every state, admission accounting, idempotency, and a
//! many-clients-many-workers run with exactly one assignment per attempt.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use std::time::Duration;

use super::*;
use crate::command::{Command, LogEntry};
use crate::ids::{Attempt, Incarnation, JobId, LeaseId, RequestId, Term, WorkerId};
use crate::job::{JobState, Lease};
use crate::limits::ATTEMPTS_MAX;
use crate::protocol::{
    AttemptOutcome, CancelReason, JobSubmission, RegisterRejection, RunningAttempt,
};
use crate::table::Applied;
use crate::tasks::{TaskOutput, TaskSpec};
use crate::testing::Driver;

const WORKER_CONN_BASE: u64 = 100;
const CLIENT_CONN: ConnectionId = ConnectionId(1);

fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        task_timeout: Duration::from_millis(10_000),
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(300),
        retry_base: Duration::from_millis(50),
        retry_max: Duration::from_millis(400),
        max_active_jobs: 1_000,
        ..CoordinatorConfig::default()
    }
}

/// Drives one coordinator through the shared test driver (which persists batches at once unless
/// told to hold them, collects every other output, fires timers as time passes and checks the
/// invariants after every output), with helpers that speak for workers and clients.
struct Harness {
    d: Driver,
    next_request: u64,
}

impl std::ops::Deref for Harness {
    type Target = Driver;

    fn deref(&self) -> &Driver {
        &self.d
    }
}

impl std::ops::DerefMut for Harness {
    fn deref_mut(&mut self) -> &mut Driver {
        &mut self.d
    }
}

impl Harness {
    fn new() -> Harness {
        Harness::with(config())
    }

    fn with(config: CoordinatorConfig) -> Harness {
        Harness {
            d: Driver::new(config, 42).expect("valid config"),
            next_request: 0,
        }
    }

    /// Advances time to `now + millis`, firing every timer on the way in order.
    fn advance(&mut self, millis: u64) {
        self.d.advance(Duration::from_millis(millis));
    }

    /// Advances time while every live worker in `beating` heartbeats on schedule.
    fn advance_with_heartbeats(&mut self, millis: u64, beating: &[&str]) {
        let step = 50;
        let mut left = millis;
        while left > 0 {
            let chunk = left.min(step);
            self.advance(chunk);
            left -= chunk;
            for name in beating {
                self.worker_says(name, WorkerToCoordinator::Heartbeat {});
            }
        }
    }

    fn take(&mut self) -> Vec<Output> {
        self.d.take_sent()
    }

    fn events(&mut self) -> Vec<Event> {
        let (events, rest): (Vec<_>, Vec<_>) = self
            .take()
            .into_iter()
            .partition(|o| matches!(o, Output::Event(_)));
        self.sent = rest;
        events
            .into_iter()
            .filter_map(|o| match o {
                Output::Event(e) => Some(e),
                _ => None,
            })
            .collect()
    }

    fn conn_of(name: &str) -> ConnectionId {
        let n: u64 = name
            .trim_start_matches('w')
            .parse()
            .expect("workers are named wN");
        ConnectionId(WORKER_CONN_BASE + n)
    }

    fn register(&mut self, name: &str, capacity: u32) {
        self.register_as(name, capacity, Incarnation(1), Self::conn_of(name), vec![]);
    }

    fn register_as(
        &mut self,
        name: &str,
        capacity: u32,
        incarnation: Incarnation,
        conn: ConnectionId,
        running: Vec<RunningAttempt>,
    ) {
        self.d.c.handle_worker_message(
            self.d.now,
            conn,
            WorkerToCoordinator::Register {
                draining: false,
                tasks: crate::protocol::builtin_task_names(),
                worker_id: WorkerId(name.into()),
                incarnation,
                capacity,
                prefetch: 0,
                running,
                finished: Vec::new(),
                queues: None,
            },
        );
        self.pump();
    }

    fn worker_says(&mut self, name: &str, message: WorkerToCoordinator) {
        self.d
            .c
            .handle_worker_message(self.d.now, Self::conn_of(name), message);
        self.pump();
    }

    fn client_says(&mut self, message: ClientRequest) {
        self.d.c.handle_client_message(
            self.d.now,
            CLIENT_CONN,
            &crate::auth::Caller::anonymous(),
            message,
        );
        self.pump();
    }

    fn request_id(&mut self) -> RequestId {
        self.next_request += 1;
        RequestId(self.next_request)
    }

    /// Sends a submission and returns its request id, without looking for the reply.
    fn send_submit(
        &mut self,
        task: serde_json::Value,
        max_attempts: Option<u32>,
        key: Option<&str>,
    ) -> RequestId {
        let request_id = self.request_id();
        let job = JobSubmission {
            task,
            max_attempts,
            idempotency_key: key.map(str::to_owned),
            ..JobSubmission::default()
        };
        self.client_says(job.into_request(request_id));
        request_id
    }

    /// Submits `job` and returns the reply.
    fn submit_job(&mut self, job: JobSubmission) -> ClientReply {
        let request_id = self.request_id();
        self.client_says(job.into_request(request_id));
        self.reply_to(request_id)
    }

    fn submit_request(
        &mut self,
        task: serde_json::Value,
        max_attempts: Option<u32>,
        key: Option<&str>,
    ) -> ClientReply {
        let request_id = self.send_submit(task, max_attempts, key);
        self.reply_to(request_id)
    }

    fn submit(&mut self, task: serde_json::Value, max_attempts: u32) -> JobId {
        match self.submit_request(task, Some(max_attempts), None) {
            ClientReply::SubmitAccepted { job_id, .. } => job_id,
            other => panic!("expected acceptance, got {other:?}"),
        }
    }

    /// Removes and returns the reply to `request_id`.
    fn reply_to(&mut self, request_id: RequestId) -> ClientReply {
        self.try_reply_to(request_id)
            .unwrap_or_else(|| panic!("no reply to {request_id}; outputs: {:?}", self.sent))
    }

    fn try_reply_to(&mut self, request_id: RequestId) -> Option<ClientReply> {
        let position = self.sent.iter().position(|o| {
            matches!(o, Output::ToClient { message, .. } if message.request_id() == Some(request_id))
        })?;
        match self.sent.remove(position) {
            Output::ToClient { message, .. } => Some(message),
            _ => None,
        }
    }

    /// Removes and returns every message sent to `name`'s connection.
    fn sent_to_worker(&mut self, name: &str) -> Vec<CoordinatorToWorker> {
        let conn = Self::conn_of(name);
        let mut out = Vec::new();
        self.sent.retain(|o| match o {
            Output::ToWorker { conn: c, message } if *c == conn => {
                out.push(message.clone());
                false
            }
            _ => true,
        });
        out
    }

    /// The assignments sent to `name`, as (job, lease, attempt).
    fn assignments(&mut self, name: &str) -> Vec<(JobId, LeaseId, Attempt)> {
        self.sent_to_worker(name)
            .into_iter()
            .filter_map(|m| match m {
                CoordinatorToWorker::TaskAssign {
                    term: Term(1),
                    job_id,
                    lease_id,
                    attempt,
                    ..
                } => Some((job_id, lease_id, attempt)),
                _ => None,
            })
            .collect()
    }

    fn finish(&mut self, name: &str, job_id: JobId, lease_id: LeaseId, outcome: AttemptOutcome) {
        self.worker_says(
            name,
            WorkerToCoordinator::TaskResult {
                job_id,
                lease_id,
                outcome,
            },
        );
    }

    fn succeed(&mut self, name: &str, job_id: JobId, lease_id: LeaseId) {
        let output = TaskOutput::Sha256 { hex: "ok".into() };
        self.finish(name, job_id, lease_id, AttemptOutcome::Succeeded { output });
    }

    fn state(&self, job_id: JobId) -> JobState {
        self.d.c.job(&job_id).expect("job exists").state
    }

    fn job(&self, job_id: JobId) -> &Job {
        self.d.c.job(&job_id).expect("job exists")
    }

    fn closed(&mut self, conn: ConnectionId) -> bool {
        self.sent.contains(&Output::Close { conn })
    }

    /// Crashes the coordinator (losing held, unwritten batches) and restarts it on its disk.
    fn restart(&mut self, config: CoordinatorConfig) {
        self.held.clear();
        self.hold_writes = false;
        self.sent.clear();
        self.d.now = self.d.now.saturating_add(Duration::from_millis(1_000));
        self.c = Coordinator::recover(config, 7, self.d.now, self.disk.durable_state())
            .expect("recovery");
        self.pump();
    }
}

fn sha(text: &str) -> serde_json::Value {
    json!({"kind": "sha256", "text": text})
}

fn ack(accepted: bool, job_id: JobId, lease_id: LeaseId) -> CoordinatorToWorker {
    CoordinatorToWorker::ResultAck {
        term: Term(1),
        job_id,
        lease_id,
        accepted,
    }
}

// ---------------------------------------------------------------------------------------------
// Basic execution
// ---------------------------------------------------------------------------------------------

#[test]
fn a_job_runs_and_completes_and_wait_is_answered_only_then() {
    let mut h = Harness::new();
    h.register("w1", 2);
    assert!(h
        .sent_to_worker("w1")
        .contains(&CoordinatorToWorker::Registered {
            term: Term(1),
            members: Vec::new(),
            heartbeat_interval_millis: 100,
            heartbeat_timeout_millis: 300,
        }));
    let job = h.submit(sha("abc"), 3);
    let wait = h.request_id();
    h.client_says(ClientRequest::Wait {
        request_id: wait,
        job_id: job,
        timeout_millis: None,
    });
    assert_eq!(h.try_reply_to(wait), None, "the job is not terminal yet");
    let [(job_id, lease, attempt)] = h.assignments("w1")[..] else {
        panic!("expected one assignment")
    };
    assert_eq!((job_id, attempt), (job, Attempt(1)));
    assert_eq!(h.state(job), JobState::Running);
    h.succeed("w1", job, lease);
    assert_eq!(h.sent_to_worker("w1"), vec![ack(true, job, lease)]);
    match h.reply_to(wait) {
        ClientReply::WaitResult {
            job: view,
            timed_out,
            ..
        } => {
            assert!(!timed_out);
            assert_eq!(view.state, JobState::Completed);
            assert_eq!(view.result, Some(TaskOutput::Sha256 { hex: "ok".into() }));
            assert_eq!(view.worker, Some(WorkerId("w1".into())));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(h.d.c.table().active_jobs(), 0);
}

#[test]
fn a_wait_times_out_with_the_current_state() {
    let mut h = Harness::new();
    let job = h.submit(sha("abc"), 3);
    let wait = h.request_id();
    h.client_says(ClientRequest::Wait {
        request_id: wait,
        job_id: job,
        timeout_millis: Some(250),
    });
    h.advance(249);
    assert_eq!(h.try_reply_to(wait), None);
    h.advance(1);
    match h.reply_to(wait) {
        ClientReply::WaitResult {
            job: view,
            timed_out,
            ..
        } => {
            assert!(timed_out);
            assert_eq!(view.state, JobState::Queued);
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn invalid_submissions_get_typed_errors_and_change_nothing() {
    let mut h = Harness::new();
    let cases = [
        (
            json!({"kind": "sleep", "milliseconds": -5}),
            None,
            ErrorCode::InvalidTask,
        ),
        (json!({"kind": "no pe"}), None, ErrorCode::InvalidTask),
        (
            json!({"kind": "resize", "text": "x"}),
            None,
            ErrorCode::InvalidTask,
        ),
        (
            json!({"kind": "prime-count", "limit": 2_000_000_000u64}),
            None,
            ErrorCode::InvalidTask,
        ),
        (sha("x"), Some(0), ErrorCode::InvalidRequest),
        (sha("x"), Some(ATTEMPTS_MAX + 1), ErrorCode::InvalidRequest),
    ];
    for (task, max_attempts, expected) in cases {
        match h.submit_request(task, max_attempts, None) {
            ClientReply::Error { code, .. } => assert_eq!(code, expected),
            other => panic!("unexpected {other:?}"),
        }
    }
    match h.submit_request(sha("x"), None, Some("")) {
        ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::InvalidRequest),
        other => panic!("unexpected {other:?}"),
    }
    assert!(h.d.c.table().is_empty());
    assert!(h.disk.log.is_empty(), "nothing was written");
}

/// A task whose JSON fits the frame limit but whose log entry, in the coordinators' binary
/// form, would not (floats take 9 bytes there against 4 as `0.5,`) is refused: admitted, it
/// could never be replicated in one APPEND.
#[test]
fn a_task_too_large_for_the_binary_log_entry_is_refused_though_its_json_fits() {
    let mut h = Harness::with(CoordinatorConfig {
        max_frame_bytes: 64 * 1024,
        ..config()
    });
    let floats = vec![0.5f64; 12_000];
    let task = json!({"kind": "resize", "payload": floats});
    let json_bytes = serde_json::to_vec(&task).expect("JSON").len();
    assert!(
        json_bytes + 2 * 1024 < 64 * 1024,
        "{json_bytes} bytes of JSON fit"
    );
    match h.submit_request(task, None, None) {
        ClientReply::Error { code, message, .. } => {
            assert_eq!(code, ErrorCode::InvalidTask);
            assert!(message.contains("binary form"), "{message}");
        }
        other => panic!("expected INVALID_TASK, got {other:?}"),
    }
    assert!(h.d.c.table().is_empty());
    assert!(h.disk.log.is_empty(), "nothing was written");
}

#[test]
fn unknown_jobs_are_reported_as_not_found() {
    let mut h = Harness::new();
    let ghost = JobId(uuid::Uuid::from_u128(9));
    for make in [
        (|request_id, job_id| ClientRequest::Status { request_id, job_id })
            as fn(RequestId, JobId) -> ClientRequest,
        |request_id, job_id| ClientRequest::Cancel { request_id, job_id },
        |request_id, job_id| ClientRequest::Wait {
            request_id,
            job_id,
            timeout_millis: None,
        },
    ] {
        let request_id = h.request_id();
        h.client_says(make(request_id, ghost));
        match h.reply_to(request_id) {
            ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::JobNotFound),
            other => panic!("unexpected {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Durability before visibility
// ---------------------------------------------------------------------------------------------

#[test]
fn nothing_is_revealed_before_its_records_are_durable() {
    let mut h = Harness::new();
    h.hold_writes = true;
    let request_id = h.send_submit(sha("abc"), None, None);
    assert_eq!(
        h.try_reply_to(request_id),
        None,
        "no acknowledgement before the submit is durable"
    );
    assert!(h.d.c.table().is_empty(), "not applied before it is durable");
    h.release_one();
    assert!(matches!(
        h.reply_to(request_id),
        ClientReply::SubmitAccepted { .. }
    ));
    let job = h.d.c.table().jobs().next().expect("job").id;
    // A worker arrives for the queued job: the assignment is proposed but held back until its
    // own write is durable.
    h.register("w1", 1);
    h.take();
    assert!(
        h.assignments("w1").is_empty(),
        "no TASK_ASSIGN before the assignment is durable"
    );
    assert_eq!(h.state(job), JobState::Queued);
    h.release_one();
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!("one assignment once durable")
    };
    // A result is acknowledged only once its completion is durable, and a waiter learns of it
    // no earlier.
    let wait = h.request_id();
    h.client_says(ClientRequest::Wait {
        request_id: wait,
        job_id: job,
        timeout_millis: None,
    });
    h.succeed("w1", job, lease);
    assert!(
        h.sent_to_worker("w1").is_empty(),
        "no RESULT_ACK before the completion is durable"
    );
    assert_eq!(h.try_reply_to(wait), None);
    assert_eq!(
        h.state(job),
        JobState::Running,
        "the applied table only holds durable state"
    );
    h.release_writes();
    assert_eq!(h.sent_to_worker("w1"), vec![ack(true, job, lease)]);
    assert!(matches!(
        h.reply_to(wait),
        ClientReply::WaitResult {
            timed_out: false,
            ..
        }
    ));
}

#[test]
fn a_submission_finding_a_free_slot_is_assigned_in_the_same_write() {
    let mut h = Harness::new();
    h.register("w1", 1);
    h.take();
    h.hold_writes = true;
    let request_id = h.send_submit(sha("abc"), None, None);
    assert_eq!(
        h.held.len(),
        1,
        "the submit and its assignment go in one write"
    );
    assert_eq!(h.try_reply_to(request_id), None);
    assert!(
        h.assignments("w1").is_empty(),
        "no TASK_ASSIGN before its write is durable"
    );
    h.release_one();
    let ClientReply::SubmitAccepted { job_id, .. } = h.reply_to(request_id) else {
        panic!("the submission is accepted once durable")
    };
    let [(assigned, _, _)] = h.assignments("w1")[..] else {
        panic!("one assignment once durable")
    };
    assert_eq!(assigned, job_id);
    assert_eq!(h.state(job_id), JobState::Running);
    // A second job finds the only slot taken: it is written alone and waits in the queue.
    let second = h.send_submit(sha("def"), None, None);
    h.release_writes();
    let ClientReply::SubmitAccepted { job_id: queued, .. } = h.reply_to(second) else {
        panic!("the second submission is accepted")
    };
    assert_eq!(h.state(queued), JobState::Queued);
    assert!(h.assignments("w1").is_empty());
}

#[test]
fn a_slot_that_frees_goes_to_the_queued_job_before_a_fresh_one() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let first = h.submit(sha("first"), 3);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!("the first job runs")
    };
    let queued = h.submit(sha("queued"), 3);
    assert_eq!(h.state(queued), JobState::Queued);
    h.hold_writes = true;
    let fresh = h.send_submit(sha("fresh"), None, None);
    // The slot frees while the fresh job is still being written.
    h.succeed("w1", first, lease);
    h.release_writes();
    let ClientReply::SubmitAccepted { job_id: fresh, .. } = h.reply_to(fresh) else {
        panic!("the fresh submission is accepted")
    };
    let assigned: Vec<JobId> = h
        .assignments("w1")
        .into_iter()
        .map(|(job, _, _)| job)
        .collect();
    assert_eq!(
        assigned,
        vec![queued],
        "the older, queued job takes the slot"
    );
    assert_eq!(h.state(fresh), JobState::Queued);
}

#[test]
fn a_crash_before_the_write_loses_only_unacknowledged_work() {
    let mut h = Harness::new();
    let kept = h.submit(sha("kept"), 3);
    h.hold_writes = true;
    let request_id = h.send_submit(sha("lost"), None, None);
    assert_eq!(h.try_reply_to(request_id), None);
    h.restart(config());
    assert_eq!(
        h.d.c.table().len(),
        1,
        "the unacknowledged submission is gone, the acknowledged one is not"
    );
    assert_eq!(h.state(kept), JobState::Queued);
}

// ---------------------------------------------------------------------------------------------
// Worker failure
// ---------------------------------------------------------------------------------------------

#[test]
fn heartbeat_silence_loses_the_worker_and_the_job_completes_elsewhere_on_attempt_2() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(json!({"kind": "sleep", "milliseconds": 20_000}), 3);
    let [(_, lease1, _)] = h.assignments("w1")[..] else {
        panic!("assigned to w1")
    };
    h.register("w2", 1);
    // w2 keeps beating, w1 goes silent (a SIGSTOPped process: its socket stays open).
    h.advance_with_heartbeats(299, &["w2"]);
    assert_eq!(
        h.state(job),
        JobState::Running,
        "not declared dead before the timeout"
    );
    h.advance_with_heartbeats(1, &["w2"]);
    let events = h.events();
    assert!(events.contains(&Event::WorkerLost {
        worker: WorkerId("w1".into()),
        reason: LossReason::HeartbeatTimeout { silent_millis: 300 },
    }));
    assert!(
        h.closed(Harness::conn_of("w1")),
        "the silent worker's connection is closed"
    );
    assert_eq!(h.state(job), JobState::RetryWait);
    assert!(h
        .job(job)
        .error
        .as_deref()
        .is_some_and(|e| e.contains("worker w1 lost")));
    h.advance_with_heartbeats(400, &["w2"]);
    let [(_, lease2, attempt)] = h.assignments("w2")[..] else {
        panic!("reassigned to w2")
    };
    assert_eq!(attempt, Attempt(2));
    assert_ne!(lease1, lease2);
    h.succeed("w2", job, lease2);
    assert_eq!(h.state(job), JobState::Completed);
    assert_eq!(h.job(job).attempt, Attempt(2));
    assert_eq!(h.job(job).last_worker, Some(WorkerId("w2".into())));
}

#[test]
fn an_abrupt_disconnect_is_detected_at_once() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(sha("x"), 3);
    assert_eq!(h.assignments("w1").len(), 1);
    h.take();
    h.d.c.handle_closed(h.d.now, Harness::conn_of("w1"));
    h.pump();
    assert!(h.events().contains(&Event::WorkerLost {
        worker: WorkerId("w1".into()),
        reason: LossReason::ConnectionClosed,
    }));
    assert_eq!(
        h.state(job),
        JobState::RetryWait,
        "no heartbeat timeout needed"
    );
    assert_eq!(h.d.now, Instant::ZERO);
}

#[test]
fn heartbeats_keep_a_busy_worker_alive_past_many_timeouts() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(json!({"kind": "sleep", "milliseconds": 5_000}), 3);
    h.advance_with_heartbeats(3_000, &["w1"]);
    assert_eq!(h.state(job), JobState::Running);
    assert!(h.d.c.workers().all(|w| w.alive));
}

// ---------------------------------------------------------------------------------------------
// Retries
// ---------------------------------------------------------------------------------------------

#[test]
fn failures_are_retried_with_bounded_jittered_backoff_until_attempts_run_out() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(json!({"kind": "fail", "fail_until_attempt": 10}), 3);
    for attempt in 1..=3u32 {
        let [(_, lease, got)] = h.assignments("w1")[..] else {
            panic!("attempt {attempt} assigned")
        };
        assert_eq!(got, Attempt(attempt));
        h.take();
        h.finish(
            "w1",
            job,
            lease,
            AttemptOutcome::Failed {
                permanent: false,
                error: format!("boom {attempt}"),
            },
        );
        assert_eq!(h.sent_to_worker("w1"), vec![ack(true, job, lease)]);
        if attempt < 3 {
            assert_eq!(h.state(job), JobState::RetryWait);
            let delay = h.job(job).retry_delay_millis;
            let ceiling = (50u64 << (attempt - 1)).min(400);
            assert!(
                delay <= ceiling,
                "attempt {attempt}: delay {delay} > {ceiling}"
            );
            h.advance_with_heartbeats(delay, &["w1"]);
            assert_eq!(
                h.state(job),
                JobState::Running,
                "requeued and reassigned after the backoff"
            );
        }
    }
    assert_eq!(h.state(job), JobState::Failed);
    assert_eq!(
        h.job(job).attempt,
        Attempt(3),
        "never more than max_attempts"
    );
    assert!(h
        .job(job)
        .error
        .as_deref()
        .is_some_and(|e| e.contains("boom 3")));
    assert_eq!(h.d.c.table().active_jobs(), 0);
}

#[test]
fn backoff_uses_the_seeded_rng_and_is_reproducible() {
    let delays = || {
        let mut h = Harness::new();
        h.register("w1", 1);
        let job = h.submit(json!({"kind": "fail", "fail_until_attempt": 3}), 3);
        let [(_, lease, _)] = h.assignments("w1")[..] else {
            panic!()
        };
        h.finish(
            "w1",
            job,
            lease,
            AttemptOutcome::Failed {
                permanent: false,
                error: "x".into(),
            },
        );
        h.job(job).retry_delay_millis
    };
    assert_eq!(delays(), delays());
}

// ---------------------------------------------------------------------------------------------
// Stale results
// ---------------------------------------------------------------------------------------------

#[test]
fn a_result_from_a_worker_declared_dead_is_rejected() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(sha("x"), 3);
    let [(_, stale, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    h.register("w2", 1);
    h.advance_with_heartbeats(300, &["w2"]);
    assert_eq!(h.state(job), JobState::RetryWait, "w1 declared dead");
    h.advance_with_heartbeats(400, &["w2"]);
    let [(_, current, _)] = h.assignments("w2")[..] else {
        panic!()
    };
    // w1 wakes up, reconnects as the same process and reports its old result.
    h.take();
    h.register_as("w1", 1, Incarnation(1), ConnectionId(999), vec![]);
    h.d.c.handle_worker_message(
        h.d.now,
        ConnectionId(999),
        WorkerToCoordinator::TaskResult {
            job_id: job,
            lease_id: stale,
            outcome: AttemptOutcome::Succeeded {
                output: TaskOutput::Sha256 {
                    hex: "stale".into(),
                },
            },
        },
    );
    h.pump();
    assert!(h.sent.contains(&Output::ToWorker {
        conn: ConnectionId(999),
        message: ack(false, job, stale),
    }));
    assert!(h
        .events()
        .iter()
        .any(|e| matches!(e, Event::StaleResultRejected { lease_id, .. } if *lease_id == stale)));
    assert_eq!(
        h.state(job),
        JobState::Running,
        "the current attempt is untouched"
    );
    assert_eq!(h.job(job).lease.as_ref().map(|l| l.id), Some(current));
    h.succeed("w2", job, current);
    assert_eq!(
        h.job(job).result,
        Some(TaskOutput::Sha256 { hex: "ok".into() })
    );
}

#[test]
fn deadline_expiry_on_a_healthy_worker_revokes_the_lease_and_rejects_the_late_result() {
    let mut h = Harness::with(CoordinatorConfig {
        task_timeout: Duration::from_millis(1_000),
        ..config()
    });
    h.register("w1", 1);
    let job = h.submit(json!({"kind": "sleep", "milliseconds": 20_000}), 3);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    h.advance_with_heartbeats(999, &["w1"]);
    assert_eq!(h.state(job), JobState::Running);
    h.advance_with_heartbeats(1, &["w1"]);
    assert_eq!(
        h.state(job),
        JobState::RetryWait,
        "expired although the worker is healthy"
    );
    assert!(h
        .sent_to_worker("w1")
        .contains(&CoordinatorToWorker::TaskCancel {
            term: Term(1),
            job_id: job,
            lease_id: lease,
            reason: CancelReason::DeadlineExpired,
        }));
    assert!(h
        .events()
        .iter()
        .any(|e| matches!(e, Event::LeaseExpired { .. })));
    // The worker ignores the cancel and reports success late: rejected, and its slot is freed.
    h.succeed("w1", job, lease);
    assert_eq!(h.sent_to_worker("w1"), vec![ack(false, job, lease)]);
    assert_ne!(h.state(job), JobState::Completed);
    h.advance_with_heartbeats(400, &["w1"]);
    let [(_, next, attempt)] = h.assignments("w1")[..] else {
        panic!("retried on the freed slot")
    };
    assert_eq!(attempt, Attempt(2));
    assert_ne!(next, lease);
}

#[test]
fn a_cancel_lost_with_its_connection_is_resent_even_when_a_revocation_was_settling() {
    // The job is cancelled while its lease's deadline revocation is still being written; the
    // TASK_CANCEL goes out on a connection that turns out dead, and the worker re-registers on
    // a new one reporting the attempt while the revocation is settling. When the revocation
    // applies (stale: the job is already cancelled), the worker must still be told to stop.
    let mut h = Harness::with(CoordinatorConfig {
        task_timeout: Duration::from_millis(1_000),
        ..config()
    });
    h.register("w1", 1);
    let job = h.submit(json!({"kind": "sleep", "milliseconds": 20_000}), 3);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    h.hold_writes = true;
    let request_id = h.request_id();
    h.client_says(ClientRequest::Cancel {
        request_id,
        job_id: job,
    });
    h.advance_with_heartbeats(1_000, &["w1"]);
    assert_eq!(
        h.held.len(),
        2,
        "the cancel and the deadline revocation are both in flight"
    );
    h.release_one();
    assert_eq!(h.state(job), JobState::Cancelled);
    // The cancel went to the old connection, which is dead.
    h.sent_to_worker("w1");
    let new_conn = ConnectionId(500);
    h.register_as(
        "w1",
        1,
        Incarnation(1),
        new_conn,
        vec![RunningAttempt {
            job_id: job,
            lease_id: lease,
        }],
    );
    h.release_writes();
    let cancels: Vec<_> = h
        .take()
        .into_iter()
        .filter(|o| {
            matches!(o, Output::ToWorker { conn, message: CoordinatorToWorker::TaskCancel { lease_id, .. } }
                if *conn == new_conn && *lease_id == lease)
        })
        .collect();
    assert_eq!(
        cancels.len(),
        1,
        "the worker on its new connection is told to stop the cancelled attempt"
    );
}

#[test]
fn a_revoked_attempt_keeps_its_slot_until_the_worker_reports_it_stopped() {
    let mut h = Harness::with(CoordinatorConfig {
        task_timeout: Duration::from_millis(1_000),
        ..config()
    });
    h.register("w1", 1);
    let job = h.submit(json!({"kind": "sleep", "milliseconds": 20_000}), 3);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    h.advance_with_heartbeats(1_000 + 400, &["w1"]);
    assert_eq!(
        h.state(job),
        JobState::Queued,
        "requeued, but w1's only slot is still busy"
    );
    assert!(h.assignments("w1").is_empty());
    h.finish("w1", job, lease, AttemptOutcome::Cancelled {});
    assert_eq!(
        h.assignments("w1").len(),
        1,
        "assigned as soon as the slot is free"
    );
}

#[test]
fn a_result_after_cancellation_is_rejected_and_the_job_stays_cancelled() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(sha("x"), 3);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    let cancel = h.request_id();
    h.client_says(ClientRequest::Cancel {
        request_id: cancel,
        job_id: job,
    });
    assert!(matches!(
        h.reply_to(cancel),
        ClientReply::CancelResult {
            term: Term(1),
            cancelled: true,
            ..
        }
    ));
    assert!(h
        .sent_to_worker("w1")
        .contains(&CoordinatorToWorker::TaskCancel {
            term: Term(1),
            job_id: job,
            lease_id: lease,
            reason: CancelReason::JobCancelled,
        }));
    h.succeed("w1", job, lease);
    assert_eq!(h.sent_to_worker("w1"), vec![ack(false, job, lease)]);
    assert_eq!(h.state(job), JobState::Cancelled);
    assert_eq!(h.job(job).result, None);
}

#[test]
fn the_lease_check_lives_in_apply() {
    // Even a command that bypassed the leader's pre-checks cannot complete a job with a stale lease.
    let mut table = JobTable::new();
    let job_id = JobId(uuid::Uuid::from_u128(1));
    let lease = |n| Lease {
        id: LeaseId(uuid::Uuid::from_u128(n)),
        worker: WorkerId("w".into()),
        incarnation: Incarnation(1),
    };
    let commands = [
        Command::Submit {
            timeout_millis: None,
            partitions: Vec::new(),
            job_id,
            task: TaskSpec::Sha256 { text: "x".into() },
            max_attempts: 3,
            idempotency_key: None,
            max_active_jobs: 10,
            partitions_asked: None,
            submitted_by: None,
            fairness_key: None,
            priority: 0,
            queue: crate::queues::default_queue(),
            run_at: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        },
        Command::Assign {
            job_id,
            lease: lease(10),
            as_of: crate::ids::LogIndex(0),
        },
        Command::AttemptFailed {
            permanent: false,
            job_id,
            lease_id: lease(10).id,
            cause: "lost".into(),
            retry_delay_millis: 0,
            kind: Default::default(),
        },
        Command::Requeue { job_id },
        Command::Assign {
            job_id,
            lease: lease(11),
            as_of: crate::ids::LogIndex(0),
        },
    ];
    for (i, command) in commands.iter().enumerate() {
        table.apply(
            LogIndex(i as u64 + 1),
            crate::time::UnixMillis::UNSTAMPED,
            command,
        );
    }
    let stale = Command::Complete {
        job_id,
        lease_id: lease(10).id,
        output: TaskOutput::Sha256 {
            hex: "stale".into(),
        },
    };
    assert_eq!(
        table
            .apply(LogIndex(6), crate::time::UnixMillis::UNSTAMPED, &stale)
            .applied,
        Applied::Stale {
            job_id,
            lease_id: lease(10).id,
            reason: crate::table::StaleReason::LeaseNotCurrent,
        }
    );
    assert_eq!(table.get(&job_id).map(|j| j.state), Some(JobState::Running));
}

// ---------------------------------------------------------------------------------------------
// Cancellation
// ---------------------------------------------------------------------------------------------

fn cancel(h: &mut Harness, job_id: JobId) -> ClientReply {
    let request_id = h.request_id();
    h.client_says(ClientRequest::Cancel { request_id, job_id });
    h.reply_to(request_id)
}

#[test]
fn cancel_works_in_every_non_terminal_state_and_reports_terminal_ones() {
    let mut h = Harness::new();
    // QUEUED (no workers yet).
    let queued = h.submit(sha("q"), 3);
    assert!(matches!(
        cancel(&mut h, queued),
        ClientReply::CancelResult {
            term: Term(1),
            cancelled: true,
            ..
        }
    ));
    assert_eq!(h.state(queued), JobState::Cancelled);
    // RETRY_WAIT.
    h.register("w1", 1);
    let waiting = h.submit(json!({"kind": "fail", "fail_until_attempt": 2}), 3);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    h.finish(
        "w1",
        waiting,
        lease,
        AttemptOutcome::Failed {
            permanent: false,
            error: "x".into(),
        },
    );
    assert_eq!(h.state(waiting), JobState::RetryWait);
    assert!(matches!(
        cancel(&mut h, waiting),
        ClientReply::CancelResult {
            term: Term(1),
            cancelled: true,
            ..
        }
    ));
    h.advance_with_heartbeats(1_000, &["w1"]);
    assert_eq!(
        h.state(waiting),
        JobState::Cancelled,
        "the backoff timer does not resurrect it"
    );
    // RUNNING.
    let running = h.submit(sha("r"), 3);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    assert!(matches!(
        cancel(&mut h, running),
        ClientReply::CancelResult {
            term: Term(1),
            cancelled: true,
            ..
        }
    ));
    assert!(h.sent_to_worker("w1").iter().any(
        |m| matches!(m, CoordinatorToWorker::TaskCancel { lease_id, .. } if *lease_id == lease)
    ));
    // Terminal: cancelling again changes nothing and says so.
    match cancel(&mut h, running) {
        ClientReply::CancelResult { cancelled, job, .. } => {
            assert!(!cancelled);
            assert_eq!(job.state, JobState::Cancelled);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(h.d.c.table().active_jobs(), 0);
}

#[test]
fn a_cancel_racing_an_assignment_never_leaves_a_cancelled_job_running() {
    let mut h = Harness::new();
    h.register("w1", 1);
    h.take();
    h.hold_writes = true;
    let submit = h.request_id();
    h.client_says(ClientRequest::Submit {
        timeout_millis: None,
        partitions: None,
        request_id: submit,
        task: sha("x"),
        max_attempts: None,
        idempotency_key: None,
        fairness_key: None,
        priority: None,
        queue: None,
        delay_millis: None,
        run_at_unix_ms: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    });
    h.release_one();
    let ClientReply::SubmitAccepted { job_id, .. } = h.reply_to(submit) else {
        panic!()
    };
    // The assignment is proposed; the cancel arrives before it is durable.
    let request_id = h.request_id();
    h.client_says(ClientRequest::Cancel { request_id, job_id });
    h.release_writes();
    assert!(matches!(
        h.reply_to(request_id),
        ClientReply::CancelResult {
            term: Term(1),
            cancelled: true,
            ..
        }
    ));
    assert_eq!(h.state(job_id), JobState::Cancelled);
    let to_w1 = h.sent_to_worker("w1");
    let assign = to_w1
        .iter()
        .position(|m| matches!(m, CoordinatorToWorker::TaskAssign { .. }));
    let cancel = to_w1
        .iter()
        .position(|m| matches!(m, CoordinatorToWorker::TaskCancel { .. }));
    assert!(
        assign.is_some(),
        "the assignment was ordered first in the log, so it went out"
    );
    assert!(cancel > assign, "and its cancel follows it");
}

mod admission;
mod batches;
mod callers;
mod delayed;
mod dependencies;
mod prefetch;
mod queues;
mod recovery;
mod registration;
mod retention;
mod tasks;
