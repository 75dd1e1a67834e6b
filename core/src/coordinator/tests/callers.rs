//! Who asks: a request beyond its caller's role is refused and changes nothing; idempotency
//! keys are bound within the name of the token that submitted them; a token below `admin`
//! cancels only its own jobs.

use super::*;
use crate::auth::{Caller, Role};

const ALICE: ConnectionId = ConnectionId(201);
const BOB: ConnectionId = ConnectionId(202);
const OPS: ConnectionId = ConnectionId(203);

fn named(name: &str, role: Role) -> Caller {
    Caller {
        name: Some(name.to_owned()),
        role,
    }
}

impl Harness {
    fn as_caller(&mut self, conn: ConnectionId, caller: &Caller, message: ClientRequest) {
        self.d
            .c
            .handle_client_message(self.d.now, conn, caller, message);
        self.pump();
    }

    /// A keyed `sha256` submission by `caller` on `conn`; the job it was answered with.
    fn submit_as(&mut self, conn: ConnectionId, caller: &Caller, key: &str) -> (JobId, bool) {
        let request_id = self.request_id();
        let submit = ClientRequest::Submit {
            request_id,
            task: serde_json::json!({"kind": "sha256", "text": "abc"}),
            max_attempts: None,
            idempotency_key: Some(key.to_owned()),
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
        };
        self.as_caller(conn, caller, submit);
        self.release_writes();
        match self.reply_to(request_id) {
            ClientReply::SubmitAccepted {
                job_id, existing, ..
            } => (job_id, existing),
            other => panic!("expected SUBMIT_ACCEPTED, got {other:?}"),
        }
    }

    fn cancel_as(&mut self, conn: ConnectionId, caller: &Caller, job_id: JobId) -> ClientReply {
        let request_id = self.request_id();
        self.as_caller(conn, caller, ClientRequest::Cancel { request_id, job_id });
        self.release_writes();
        self.reply_to(request_id)
    }
}

#[test]
fn a_reader_is_refused_every_write_and_nothing_is_proposed() {
    let mut h = Harness::new();
    let reader = named("dash", Role::Reader);
    let before = h.d.c.replica().last_index();
    let request_id = h.request_id();
    h.as_caller(
        ALICE,
        &reader,
        ClientRequest::Submit {
            request_id,
            task: serde_json::json!({"kind": "sha256", "text": "abc"}),
            max_attempts: None,
            idempotency_key: None,
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
        },
    );
    assert!(matches!(
        h.reply_to(request_id),
        ClientReply::Error {
            code: ErrorCode::Forbidden,
            ..
        }
    ));
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::Forbidden {
            request: "SUBMIT",
            ..
        }
    )));
    h.release_writes();
    assert_eq!(h.d.c.replica().last_index(), before, "nothing was proposed");
    assert_eq!(h.d.c.table().jobs().count(), 0);
    // The connection stays usable for what the role allows.
    let request_id = h.request_id();
    h.as_caller(ALICE, &reader, ClientRequest::Workers { request_id });
    assert!(matches!(
        h.reply_to(request_id),
        ClientReply::WorkerList { .. }
    ));
}

#[test]
fn the_same_key_from_two_tokens_names_two_jobs_and_each_resend_its_own() {
    let mut h = Harness::new();
    let (alice, bob) = (
        named("alice", Role::Submitter),
        named("bob", Role::Submitter),
    );
    let (first, existing) = h.submit_as(ALICE, &alice, "nightly");
    assert!(!existing);
    let (second, existing) = h.submit_as(BOB, &bob, "nightly");
    assert!(!existing, "bob's key is his own, not a replay of alice's");
    assert_ne!(first, second);
    assert_eq!(h.job(first).submitted_by.as_deref(), Some("alice"));
    assert_eq!(h.job(second).view().submitted_by.as_deref(), Some("bob"));
    // Each one's resend, on a new connection, finds its own job.
    assert_eq!(
        h.submit_as(ConnectionId(301), &alice, "nightly"),
        (first, true)
    );
    assert_eq!(
        h.submit_as(ConnectionId(302), &bob, "nightly"),
        (second, true)
    );
    h.check();

    // A restart rebuilds the index from the rows, scopes and all.
    h.restart(config());
    assert_eq!(
        h.submit_as(ConnectionId(303), &bob, "nightly"),
        (second, true)
    );
    h.check();
}

#[test]
fn a_submitter_cancels_only_its_own_jobs_and_an_admin_any() {
    let mut h = Harness::new();
    let (alice, bob, ops) = (
        named("alice", Role::Submitter),
        named("bob", Role::Submitter),
        named("ops", Role::Admin),
    );
    let (alices, _) = h.submit_as(ALICE, &alice, "a");
    let (bobs, _) = h.submit_as(BOB, &bob, "b");

    match h.cancel_as(BOB, &bob, alices) {
        ClientReply::Error {
            code: ErrorCode::Forbidden,
            message,
            ..
        } => assert!(message.contains("\"alice\""), "{message}"),
        other => panic!("expected FORBIDDEN, got {other:?}"),
    }
    assert_eq!(
        h.state(alices),
        JobState::Queued,
        "the refused cancel changed nothing"
    );
    assert!(matches!(
        h.cancel_as(BOB, &bob, bobs),
        ClientReply::CancelResult {
            cancelled: true,
            ..
        }
    ));
    assert!(matches!(
        h.cancel_as(OPS, &ops, alices),
        ClientReply::CancelResult {
            cancelled: true,
            ..
        }
    ));
    assert_eq!(h.state(alices), JobState::Cancelled);
}
