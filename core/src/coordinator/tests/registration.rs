//! Registration and scheduling: duplicate and bad registrations, traffic on the wrong port,
//! malformed frames, FIFO onto the least-loaded worker, and many clients over many workers.

use super::*;

#[test]
fn a_second_live_process_with_the_same_id_is_rejected_but_a_reconnect_is_not() {
    let mut h = Harness::new();
    h.register("w1", 1);
    h.take();
    // A different process claims w1 while the first is alive.
    h.register_as("w1", 1, Incarnation(2), ConnectionId(500), vec![]);
    assert!(h.sent.contains(&Output::ToWorker {
        conn: ConnectionId(500),
        message: CoordinatorToWorker::RegisterRejected {
            reason: RegisterRejection::DuplicateWorkerId,
            message: "worker id w1 is held by a live process (incarnation 0000000000000001); pick another id or stop that process".into(),
        },
    }));
    assert!(h.closed(ConnectionId(500)));
    h.take();
    // The same process on a new connection takes over; the old connection is closed.
    h.register_as("w1", 1, Incarnation(1), ConnectionId(501), vec![]);
    assert!(h.closed(Harness::conn_of("w1")));
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::WorkerRegistered {
            reconnect: true,
            ..
        }
    )));
    // Closing the superseded connection does not lose the worker.
    h.d.c.handle_closed(h.d.now, Harness::conn_of("w1"));
    h.pump();
    assert!(h.d.c.workers().all(|w| w.alive));
    // Once the first process is lost, a new process may take the id.
    h.d.c.handle_closed(h.d.now, ConnectionId(501));
    h.pump();
    h.register_as("w1", 1, Incarnation(2), ConnectionId(502), vec![]);
    assert!(h
        .c
        .workers()
        .any(|w| w.alive && w.incarnation == Incarnation(2)));
}

#[test]
fn a_flapping_worker_does_not_pile_up_timers() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let baseline = h.d.c.armed_timers();
    for _ in 0..50 {
        // Lost by silence, then back as the same process before its old check would fire again.
        h.advance(300);
        h.register("w1", 1);
        h.advance_with_heartbeats(100, &["w1"]);
    }
    assert!(
        h.d.c.armed_timers() <= baseline + 1,
        "{} timers armed after 50 flaps (baseline {baseline})",
        h.d.c.armed_timers()
    );
}

#[test]
fn bad_registrations_and_unregistered_traffic_are_refused() {
    let mut h = Harness::new();
    h.register_as("w1", 0, Incarnation(1), ConnectionId(600), vec![]);
    assert!(h.sent.iter().any(|o| matches!(
        o,
        Output::ToWorker {
            message: CoordinatorToWorker::RegisterRejected {
                reason: RegisterRejection::InvalidRegistration,
                ..
            },
            ..
        }
    )));
    h.take();
    h.d.c.handle_worker_message(
        h.d.now,
        ConnectionId(601),
        WorkerToCoordinator::Heartbeat {},
    );
    h.pump();
    assert!(h.sent.iter().any(|o| matches!(
        o,
        Output::ToWorker {
            message: CoordinatorToWorker::Error {
                code: ErrorCode::NotRegistered,
                ..
            },
            ..
        }
    )));
    assert!(h.closed(ConnectionId(601)));
    assert_eq!(h.d.c.workers().count(), 0);
}

#[test]
fn a_worker_at_the_client_port_or_a_client_at_the_worker_port_is_told_so() {
    let mut h = Harness::new();
    let register = FrameError::UnknownType {
        type_name: "REGISTER".into(),
    };
    h.d.c
        .handle_malformed(h.d.now, ConnectionId(60), Link::Client, &register);
    let submit = FrameError::UnknownType {
        type_name: "SUBMIT".into(),
    };
    h.d.c
        .handle_malformed(h.d.now, ConnectionId(61), Link::Worker, &submit);
    h.pump();
    let messages: Vec<(ConnectionId, String)> = h
        .take()
        .into_iter()
        .filter_map(|o| match o {
            Output::ToClient {
                conn,
                message: ClientReply::Error { message, .. },
            } => Some((conn, message)),
            Output::ToWorker {
                conn,
                message: CoordinatorToWorker::Error { message, .. },
            } => Some((conn, message)),
            _ => None,
        })
        .collect();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(messages
        .iter()
        .any(|(c, m)| *c == ConnectionId(60) && m.contains("point the worker at the worker port")));
    assert!(messages
        .iter()
        .any(|(c, m)| *c == ConnectionId(61) && m.contains("point the client at the client port")));
}

#[test]
fn a_malformed_frame_gets_a_typed_error_and_the_worker_is_dropped() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job = h.submit(sha("x"), 3);
    h.take();
    let error = FrameError::UnknownType {
        type_name: "BOGUS".into(),
    };
    h.d.c
        .handle_malformed(h.d.now, Harness::conn_of("w1"), Link::Worker, &error);
    h.pump();
    assert!(h.sent_to_worker("w1").iter().any(|m| matches!(
        m,
        CoordinatorToWorker::Error {
            code: ErrorCode::UnknownType,
            ..
        }
    )));
    assert!(h.closed(Harness::conn_of("w1")));
    assert_eq!(h.state(job), JobState::RetryWait);
    // The coordinator keeps serving clients.
    h.d.c.handle_malformed(
        h.d.now,
        ConnectionId(77),
        Link::Client,
        &FrameError::EmptyFrame,
    );
    h.pump();
    let status = h.request_id();
    h.client_says(ClientRequest::Status {
        request_id: status,
        job_id: job,
    });
    assert!(matches!(h.reply_to(status), ClientReply::Job { .. }));
}

// ---------------------------------------------------------------------------------------------
// Scheduling
// ---------------------------------------------------------------------------------------------

#[test]
fn fifo_onto_the_least_loaded_worker_within_capacity() {
    let mut h = Harness::new();
    let jobs: Vec<JobId> = (0..5).map(|i| h.submit(sha(&format!("{i}")), 3)).collect();
    h.register("w1", 2);
    let first: Vec<JobId> = h.assignments("w1").iter().map(|(j, _, _)| *j).collect();
    assert_eq!(first, jobs[..2], "oldest first, up to capacity");
    h.register("w2", 4);
    let second: Vec<JobId> = h.assignments("w2").iter().map(|(j, _, _)| *j).collect();
    assert_eq!(second, jobs[2..], "the rest to the idle worker");
    let extra = h.submit(sha("extra"), 3);
    // w1 has 2 of 2, w2 has 3 of 4: only w2 has room.
    assert_eq!(h.assignments("w2").first().map(|(j, _, _)| *j), Some(extra));
    assert!(h.assignments("w1").is_empty());
}

#[test]
fn sixty_jobs_from_four_clients_over_five_workers_get_exactly_one_assignment_per_attempt() {
    let mut h = Harness::new();
    for w in 1..=5 {
        h.register(&format!("w{w}"), 2);
    }
    let mut jobs = BTreeSet::new();
    for i in 0..60u64 {
        let request_id = h.request_id();
        h.d.c.handle_client_message(
            h.d.now,
            ConnectionId(10 + i % 4),
            &crate::auth::Caller::anonymous(),
            ClientRequest::Submit {
                timeout_millis: None,
                partitions: None,
                request_id,
                task: sha(&format!("job {i}")),
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
        h.pump();
        match h.reply_to(request_id) {
            ClientReply::SubmitAccepted { job_id, .. } => {
                jobs.insert(job_id);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let mut assignments: BTreeMap<(JobId, Attempt), Vec<(String, LeaseId)>> = BTreeMap::new();
    let mut rounds = 0;
    while h.d.c.table().active_jobs() > 0 {
        rounds += 1;
        assert!(rounds < 100, "the run makes progress");
        for w in 1..=5 {
            let name = format!("w{w}");
            for (job, lease, attempt) in h.assignments(&name) {
                assignments
                    .entry((job, attempt))
                    .or_default()
                    .push((name.clone(), lease));
                h.succeed(&name, job, lease);
            }
        }
    }
    assert_eq!(assignments.len(), 60);
    for ((job, attempt), holders) in &assignments {
        assert_eq!(
            holders.len(),
            1,
            "job {job} attempt {attempt} assigned {} times",
            holders.len()
        );
        assert_eq!(*attempt, Attempt(1));
    }
    assert!(jobs.iter().all(|job| h.state(*job) == JobState::Completed));
    let per_worker: BTreeSet<&String> = assignments.values().flatten().map(|(w, _)| w).collect();
    assert_eq!(per_worker.len(), 5, "work spread across every worker");
}

#[test]
fn list_and_workers_report_the_table_and_registry() {
    let mut h = Harness::new();
    let a = h.submit(sha("a"), 3);
    let b = h.submit(sha("b"), 3);
    cancel(&mut h, a);
    h.register("w1", 3);
    let request_id = h.request_id();
    h.client_says(ClientRequest::List {
        request_id,
        state: None,
        limit: None,
        before: None,
    });
    match h.reply_to(request_id) {
        ClientReply::JobList { jobs, .. } => {
            assert_eq!(
                jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
                vec![b, a],
                "newest first"
            );
        }
        other => panic!("unexpected {other:?}"),
    }
    let request_id = h.request_id();
    h.client_says(ClientRequest::List {
        request_id,
        state: Some(JobState::Cancelled),
        limit: Some(10),
        before: None,
    });
    match h.reply_to(request_id) {
        ClientReply::JobList { jobs, .. } => {
            assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![a])
        }
        other => panic!("unexpected {other:?}"),
    }
    let request_id = h.request_id();
    h.client_says(ClientRequest::Workers { request_id });
    match h.reply_to(request_id) {
        ClientReply::WorkerList { workers, .. } => {
            assert_eq!(workers.len(), 1);
            assert_eq!(
                (workers[0].capacity, workers[0].running, workers[0].alive),
                (3, 1, true)
            );
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn a_listing_pages_from_the_job_it_stopped_at() {
    let mut h = Harness::new();
    let jobs: Vec<JobId> = (0..5).map(|i| h.submit(sha(&format!("{i}")), 3)).collect();
    let page = |h: &mut Harness, before: Option<JobId>| {
        let request_id = h.request_id();
        h.client_says(ClientRequest::List {
            request_id,
            state: None,
            limit: Some(2),
            before,
        });
        match h.reply_to(request_id) {
            ClientReply::JobList { jobs, .. } => jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
            other => panic!("unexpected {other:?}"),
        }
    };
    let first = page(&mut h, None);
    assert_eq!(first, vec![jobs[4], jobs[3]]);
    let second = page(&mut h, first.last().copied());
    assert_eq!(second, vec![jobs[2], jobs[1]]);
    let third = page(&mut h, second.last().copied());
    assert_eq!(third, vec![jobs[0]]);
    assert!(
        page(&mut h, Some(jobs[0])).is_empty(),
        "nothing before the oldest"
    );

    let request_id = h.request_id();
    let unknown = JobId(uuid::Uuid::from_u128(99));
    h.client_says(ClientRequest::List {
        request_id,
        state: None,
        limit: None,
        before: Some(unknown),
    });
    match h.reply_to(request_id) {
        ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::JobNotFound),
        other => panic!("an unknown cursor is a typed error, got {other:?}"),
    }
}

#[test]
fn the_coordinator_log_tells_the_failure_recovery_story() {
    let mut h = Harness::new();
    h.register("w1", 1);
    h.register("w2", 1);
    let job = h.submit(json!({"kind": "sleep", "milliseconds": 20_000}), 3);
    h.take();
    h.d.c.handle_closed(h.d.now, Harness::conn_of("w1"));
    h.pump();
    h.advance_with_heartbeats(400, &["w2"]);
    let lease = h
        .job(job)
        .lease
        .as_ref()
        .map(|l| l.id)
        .expect("running again");
    h.succeed("w2", job, lease);
    let story: Vec<String> = h.events().iter().map(ToString::to_string).collect();
    let kinds = [
        "Worker connection lost: workerId=w1",
        "Retry scheduled:",
        "Job requeued:",
        "Job assigned:",
        "Job completed:",
    ];
    let mut at = 0;
    for kind in kinds {
        let found = story[at..].iter().position(|line| line.starts_with(kind));
        let Some(offset) = found else {
            panic!("missing {kind:?} after line {at} in {story:#?}")
        };
        at += offset + 1;
    }
}
