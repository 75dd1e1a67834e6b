//! Admission control and idempotency: the active-job limit, submissions racing in one
//! batch, keyed resends of a submission still being written, and the idempotency rules.

use super::*;

fn limited(limit: u64) -> CoordinatorConfig {
    CoordinatorConfig {
        max_active_jobs: limit,
        ..config()
    }
}

fn expect_rejected(reply: ClientReply, active: u64, limit: u64) {
    match reply {
        ClientReply::SubmitRejected {
            retryable,
            active_jobs,
            max_active_jobs,
            ..
        } => {
            assert!(retryable);
            assert_eq!((active_jobs, max_active_jobs), (active, limit));
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn admission_accepts_to_the_limit_then_rejects_and_terminal_transitions_free_one_slot_each() {
    let mut h = Harness::with(limited(3));
    let a = h.submit(sha("a"), 3);
    let b = h.submit(json!({"kind": "fail", "fail_until_attempt": 9}), 2);
    let c = h.submit(sha("c"), 3);
    expect_rejected(h.submit_request(sha("d"), None, None), 3, 3);
    assert_eq!(h.d.c.table().len(), 3, "a rejection creates nothing");
    // Cancellation frees one slot.
    cancel(&mut h, c);
    assert_eq!(h.d.c.table().active_jobs(), 2);
    let d = h.submit(sha("d"), 3);
    expect_rejected(h.submit_request(sha("e"), None, None), 3, 3);
    // A retry does not re-enter admission: b fails once, waits, and still counts once.
    h.register("w1", 3);
    let assigned = h.assignments("w1");
    let lease_of = |job: JobId| {
        assigned
            .iter()
            .find(|(j, _, _)| *j == job)
            .map(|(_, l, _)| *l)
            .expect("assigned")
    };
    h.finish(
        "w1",
        b,
        lease_of(b),
        AttemptOutcome::Failed {
            permanent: false,
            error: "x".into(),
        },
    );
    assert_eq!(h.state(b), JobState::RetryWait);
    assert_eq!(h.d.c.table().active_jobs(), 3);
    // Completion frees one slot.
    h.succeed("w1", a, lease_of(a));
    assert_eq!(h.d.c.table().active_jobs(), 2);
    // Permanent failure frees one slot.
    h.advance_with_heartbeats(400, &["w1"]);
    let [(_, lease, _)] = h.assignments("w1")[..] else {
        panic!()
    };
    h.finish(
        "w1",
        b,
        lease,
        AttemptOutcome::Failed {
            permanent: false,
            error: "y".into(),
        },
    );
    assert_eq!(h.state(b), JobState::Failed);
    assert_eq!(h.d.c.table().active_jobs(), 1);
    assert_eq!(h.state(d), JobState::Running);
}

#[test]
fn racing_submissions_in_one_batch_admit_exactly_the_limit() {
    let mut h = Harness::with(limited(5));
    h.hold_writes = true;
    let requests: Vec<RequestId> = (0..8)
        .map(|i| {
            let request_id = h.request_id();
            h.d.c.handle_client_message(
                h.d.now,
                ConnectionId(10 + i),
                &crate::auth::Caller::anonymous(),
                ClientRequest::Submit {
                    timeout_millis: None,
                    partitions: None,
                    request_id,
                    task: sha(&format!("{i}")),
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
                },
            );
            request_id
        })
        .collect();
    h.pump();
    // The submissions still being written count: the last three are refused at once, before
    // any write lands, with the slots being admitted named, and none of them is written.
    for request_id in &requests[5..] {
        match h.reply_to(*request_id) {
            ClientReply::SubmitRejected {
                active_jobs,
                admitting_jobs,
                max_active_jobs,
                ..
            } => assert_eq!((active_jobs, admitting_jobs, max_active_jobs), (0, 5, 5)),
            other => panic!("expected a rejection while writes are held, got {other:?}"),
        }
    }
    assert_eq!(
        held_submissions(&h),
        5,
        "a refused submission writes nothing"
    );
    h.release_writes();
    let replies: Vec<ClientReply> = requests[..5].iter().map(|r| h.reply_to(*r)).collect();
    assert!(replies
        .iter()
        .all(|r| matches!(r, ClientReply::SubmitAccepted { .. })));
    assert_eq!(h.d.c.table().active_jobs(), 5);
}

#[test]
fn unwritten_bytes_count_the_entries_waiting_for_the_disk() {
    let mut h = Harness::new();
    h.hold_writes = true;
    assert_eq!(h.d.c.unwritten_bytes(), 0);
    let big = "x".repeat(10_000);
    for _ in 0..3 {
        let request_id = h.request_id();
        h.client_says(ClientRequest::Submit {
            timeout_millis: None,
            partitions: None,
            request_id,
            task: sha(&big),
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
    }
    let held: u64 = h.held.iter().map(|b| b.entry_bytes).sum();
    assert!(held >= 30_000, "three 10 kB payloads are waiting: {held}");
    assert_eq!(h.d.c.unwritten_bytes(), held);
    h.release_one();
    let after_one: u64 = h.held.iter().map(|b| b.entry_bytes).sum();
    assert_eq!(h.d.c.unwritten_bytes(), after_one);
    assert!(after_one < held);
    h.release_writes();
    assert_eq!(h.d.c.unwritten_bytes(), 0, "everything written");
}

#[test]
fn one_connection_cannot_take_every_wait_slot() {
    // The default bound, and one set lower.
    for per_connection in [crate::limits::WAITERS_PER_CONNECTION_DEFAULT, 3] {
        let mut h = Harness::with(CoordinatorConfig {
            max_waiters_per_connection: per_connection,
            ..config()
        });
        let job = h.submit(sha("never runs: no workers"), 3);
        let (greedy, polite) = (ConnectionId(40), ConnectionId(41));
        let wait = |h: &mut Harness, conn: ConnectionId| {
            let request_id = h.request_id();
            h.d.c.handle_client_message(
                h.d.now,
                conn,
                &crate::auth::Caller::anonymous(),
                ClientRequest::Wait {
                    request_id,
                    job_id: job,
                    timeout_millis: None,
                },
            );
            h.pump();
            request_id
        };
        for _ in 0..per_connection {
            let parked = wait(&mut h, greedy);
            assert!(h.try_reply_to(parked).is_none(), "parked");
        }
        let refused = wait(&mut h, greedy);
        match h.reply_to(refused) {
            ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::TooManyWaiters),
            other => panic!("expected TOO_MANY_WAITERS, got {other:?}"),
        }
        let other = wait(&mut h, polite);
        assert!(
            h.try_reply_to(other).is_none(),
            "another connection still parks a wait"
        );
        // The greedy connection goes: its slots are free again.
        h.d.c.handle_closed(h.d.now, greedy);
        h.pump();
        let again = wait(&mut h, ConnectionId(42));
        assert!(h.try_reply_to(again).is_none());
        // Cancelling the job answers the two waits still parked.
        cancel(&mut h, job);
        assert!(matches!(
            h.reply_to(other),
            ClientReply::WaitResult {
                timed_out: false,
                ..
            }
        ));
        assert!(matches!(
            h.reply_to(again),
            ClientReply::WaitResult {
                timed_out: false,
                ..
            }
        ));
    }
}

/// `Submit` entries in the batches held back from the disk.
fn held_submissions(h: &Harness) -> usize {
    h.held
        .iter()
        .flat_map(|batch| &batch.records)
        .filter(|r| matches!(r, Record::Log(e) if matches!(e.command, Command::Submit { .. })))
        .count()
}

#[test]
fn a_keyed_resend_of_a_submission_still_being_written_waits_for_it_and_writes_nothing() {
    let mut h = Harness::with(limited(1));
    h.hold_writes = true;
    let submit = |h: &mut Harness, text: &str| {
        let request_id = h.request_id();
        h.client_says(ClientRequest::Submit {
            timeout_millis: None,
            partitions: None,
            request_id,
            task: sha(text),
            max_attempts: None,
            idempotency_key: Some("order-7".into()),
            fairness_key: None,
            priority: None,
            queue: None,
            delay_millis: None,
            run_at_unix_ms: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        });
        request_id
    };
    let first = submit(&mut h, "abc");
    // At the limit (the first takes the only slot), a resend and a conflicting reuse of the key
    // are neither refused nor written: they wait for the first entry.
    let resend = submit(&mut h, "abc");
    let conflicting = submit(&mut h, "other");
    assert!(h.try_reply_to(resend).is_none() && h.try_reply_to(conflicting).is_none());
    assert_eq!(
        held_submissions(&h),
        1,
        "only the first submission is written"
    );
    h.release_writes();
    let job = match h.reply_to(first) {
        ClientReply::SubmitAccepted {
            job_id,
            existing: false,
            ..
        } => job_id,
        other => panic!("unexpected {other:?}"),
    };
    match h.reply_to(resend) {
        ClientReply::SubmitAccepted {
            job_id,
            existing: true,
            ..
        } => assert_eq!(job_id, job),
        other => panic!("the resend should get the first job, got {other:?}"),
    }
    match h.reply_to(conflicting) {
        ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::IdempotencyConflict),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(h.d.c.table().len(), 1);
}

#[test]
fn a_parked_resend_whose_connection_closes_is_dropped() {
    let mut h = Harness::with(limited(2));
    h.hold_writes = true;
    let keyed = |request_id| ClientRequest::Submit {
        timeout_millis: None,
        partitions: None,
        request_id,
        task: sha("abc"),
        max_attempts: None,
        idempotency_key: Some("k".into()),
        fairness_key: None,
        priority: None,
        queue: None,
        delay_millis: None,
        run_at_unix_ms: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    };
    let first = h.request_id();
    h.client_says(keyed(first));
    let resend = h.request_id();
    h.d.c.handle_client_message(
        h.d.now,
        ConnectionId(77),
        &crate::auth::Caller::anonymous(),
        keyed(resend),
    );
    h.d.c.handle_closed(h.d.now, ConnectionId(77));
    h.pump();
    h.release_writes();
    assert!(matches!(
        h.reply_to(first),
        ClientReply::SubmitAccepted { .. }
    ));
    assert!(
        h.try_reply_to(resend).is_none(),
        "nothing is sent for a closed connection's resend"
    );
}

#[test]
fn after_recovery_a_count_above_a_lowered_limit_runs_down_and_only_new_work_is_refused() {
    let mut h = Harness::with(limited(5));
    let jobs: Vec<JobId> = (0..5).map(|i| h.submit(sha(&format!("{i}")), 3)).collect();
    h.restart(limited(2));
    assert_eq!(
        h.d.c.table().active_jobs(),
        5,
        "recovered count above the new limit"
    );
    expect_rejected(h.submit_request(sha("new"), None, None), 5, 2);
    h.register("w1", 5);
    let assigned = h.assignments("w1");
    assert_eq!(assigned.len(), 5, "recovered jobs all run");
    for (job, lease, _) in &assigned {
        h.succeed("w1", *job, *lease);
        if *job == jobs[3] {
            assert_eq!(h.d.c.table().active_jobs(), 1);
        }
    }
    assert_eq!(h.d.c.table().active_jobs(), 0);
    h.submit(sha("new"), 3);
}

#[test]
fn idempotency_keys_replay_conflict_and_bypass_admission() {
    let mut h = Harness::with(limited(1));
    let first = match h.submit_request(sha("abc"), None, Some("order-42")) {
        ClientReply::SubmitAccepted {
            term: Term(1),
            job_id,
            existing,
            ..
        } => {
            assert!(!existing);
            job_id
        }
        other => panic!("unexpected {other:?}"),
    };
    // At the limit, a known key still answers with its job and adds nothing.
    match h.submit_request(sha("abc"), None, Some("order-42")) {
        ClientReply::SubmitAccepted {
            term: Term(1),
            job_id,
            existing,
            ..
        } => {
            assert_eq!(job_id, first);
            assert!(existing);
        }
        other => panic!("unexpected {other:?}"),
    }
    // A different spec under the same key is a conflict, and changes nothing.
    match h.submit_request(sha("different"), None, Some("order-42")) {
        ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::IdempotencyConflict),
        other => panic!("unexpected {other:?}"),
    }
    match h.submit_request(sha("abc"), Some(7), Some("order-42")) {
        ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::IdempotencyConflict),
        other => panic!("unexpected {other:?}"),
    }
    // A new key at the limit is admission-controlled as usual.
    expect_rejected(h.submit_request(sha("abc"), None, Some("order-43")), 1, 1);
    assert_eq!(h.d.c.table().len(), 1);
    // The key stays bound after the job is terminal, and after a restart.
    cancel(&mut h, first);
    h.restart(limited(1));
    match h.submit_request(sha("abc"), None, Some("order-42")) {
        ClientReply::SubmitAccepted {
            term: Term(1),
            job_id,
            existing,
            ..
        } => {
            assert_eq!(job_id, first);
            assert!(existing);
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        h.state(first),
        JobState::Cancelled,
        "a burned key never re-runs its job"
    );
}

#[test]
fn duplicate_keys_in_one_batch_create_one_job() {
    let mut h = Harness::new();
    h.hold_writes = true;
    let a = h.request_id();
    let b = h.request_id();
    for request_id in [a, b] {
        h.client_says(ClientRequest::Submit {
            timeout_millis: None,
            partitions: None,
            request_id,
            task: sha("x"),
            max_attempts: None,
            idempotency_key: Some("k".into()),
            fairness_key: None,
            priority: None,
            queue: None,
            delay_millis: None,
            run_at_unix_ms: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        });
    }
    h.release_writes();
    let (
        ClientReply::SubmitAccepted {
            term: Term(1),
            job_id: first,
            existing: false,
            ..
        },
        ClientReply::SubmitAccepted {
            term: Term(1),
            job_id: second,
            existing: true,
            ..
        },
    ) = (h.reply_to(a), h.reply_to(b))
    else {
        panic!("one creation and one replay")
    };
    assert_eq!(first, second);
    assert_eq!(h.d.c.table().len(), 1);
}
