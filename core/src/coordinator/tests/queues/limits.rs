//! A queue's limits through the coordinator: per-key concurrency, rate and admission, each
//! held by the leader's scheduling and again by the table whoever proposed a start.

use super::*;
use crate::queues::{HeldBack, RateLimit};

fn rate(starts: u32, per_millis: u64) -> QueueChange {
    QueueChange {
        rate: Some(RateLimit { starts, per_millis }),
        ..QueueChange::default()
    }
}

#[test]
fn a_key_at_its_limit_waits_while_other_keys_start() {
    let mut h = Harness::new();
    h.register("w1", 6);
    h.set_queue(
        "tenants",
        QueueChange {
            key_concurrency: Some(1),
            ..QueueChange::default()
        },
    );
    let heavy: Vec<JobId> = (0..3).map(|_| h.submit_placed(keyed("heavy"))).collect();
    let light: Vec<JobId> = (0..2).map(|_| h.submit_placed(keyed("light"))).collect();
    let unkeyed = h.submit_placed(Place {
        queue: Some("tenants"),
        ..Place::default()
    });
    let started = h.assignments("w1");
    let ids: Vec<JobId> = started.iter().map(|a| a.0).collect();
    assert_eq!(
        ids,
        vec![heavy[0], light[0], unkeyed],
        "one per key; a job without a key is not limited by it"
    );
    assert_eq!(h.c.table().running_with_key("tenants", "heavy"), 1);
    // The heavy key's attempt ends: its next job starts, and only that one.
    h.succeed("w1", started[0].0, started[0].1);
    let next: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(next, vec![heavy[1]]);
    h.check();
}

#[test]
fn a_rate_limited_queue_starts_a_burst_then_one_per_interval() {
    let mut h = Harness::new();
    h.register("w1", 10);
    let reply = h.set_queue("mail", rate(2, 1000));
    assert!(
        matches!(reply, ClientReply::QueueSet { ref queue, .. } if queue.rate.is_some_and(|r| r.starts == 2)),
        "{reply:?}"
    );
    let jobs: Vec<JobId> = (0..5)
        .map(|_| {
            h.submit_placed(Place {
                queue: Some("mail"),
                ..Place::default()
            })
        })
        .collect();
    let burst: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(burst, jobs[..2], "a full bucket: two at once");
    assert!(
        h.events().iter().any(|e| matches!(
            e,
            Event::QueueHeldBack { queue, rule: HeldBack::Rate } if queue == "mail"
        )),
        "the rate limit holding work back is an event"
    );
    // Nothing more until the next token, 500 ms later: the leader's timer schedules again.
    h.advance_with_heartbeats(400, &["w1"]);
    assert!(h.assignments("w1").is_empty(), "no token yet");
    h.advance_with_heartbeats(150, &["w1"]);
    let next: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(next, vec![jobs[2]], "one token, one start");
    h.advance_with_heartbeats(500, &["w1"]);
    let next: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(next, vec![jobs[3]]);
    // Removing the limit starts the rest at once.
    h.set_queue("mail", rate(0, 1000));
    let rest: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(rest, vec![jobs[4]]);
    h.check();
}

#[test]
fn a_submission_beyond_its_queues_admission_limit_is_refused_naming_the_queue() {
    let mut h = Harness::new();
    h.set_queue(
        "imports",
        QueueChange {
            max_active_jobs: Some(2),
            ..QueueChange::default()
        },
    );
    let place = Place {
        queue: Some("imports"),
        ..Place::default()
    };
    let first = h.submit_placed(place);
    h.submit_placed(place);
    match h.submit_to(place) {
        ClientReply::SubmitRejected {
            retryable,
            queue,
            active_jobs,
            max_active_jobs,
            ..
        } => {
            assert!(retryable);
            assert_eq!(queue.as_deref(), Some("imports"));
            assert_eq!((active_jobs, max_active_jobs), (2, 2));
        }
        other => panic!("expected a rejection naming the queue, got {other:?}"),
    }
    // Another queue is not limited by it.
    h.submit_placed(Place::default());
    assert_eq!(h.c.table().active_in("imports"), 2);
    // A job of the queue ends: there is room again.
    let cancel = h.request_id();
    h.client_says(ClientRequest::Cancel {
        request_id: cancel,
        job_id: first,
    });
    h.reply_to(cancel);
    h.submit_placed(place);
    h.check();
}

#[test]
fn the_table_refuses_a_start_past_a_key_limit_or_the_rate_whoever_proposed_it() {
    let mut table = crate::table::JobTable::new();
    let job = |n: u128| JobId(uuid::Uuid::from_u128(n));
    let mut index = 0;
    let mut apply = |table: &mut crate::table::JobTable, at: u64, command: Command| {
        index += 1;
        table.apply(
            crate::ids::LogIndex(index),
            crate::time::UnixMillis(at),
            &command,
        )
    };
    let mut limits = rate(2, 1000);
    limits.key_concurrency = Some(1);
    apply(
        &mut table,
        1_000,
        Command::SetQueue {
            queue: "q".to_owned(),
            change: limits,
        },
    );
    for n in 1..=4 {
        let mut submit = plain_submit(job(n), "q");
        if let Command::Submit { fairness_key, .. } = &mut submit {
            *fairness_key = Some(if n == 2 { "a" } else { "b" }.to_owned());
        }
        apply(&mut table, 1_000, submit);
    }
    let assign = |n: u128| Command::Assign {
        job_id: job(n),
        lease: Lease {
            id: LeaseId(uuid::Uuid::from_u128(100 + n)),
            worker: WorkerId("w1".into()),
            incarnation: Incarnation(1),
        },
        as_of: crate::ids::LogIndex(1),
    };
    let started =
        |outcome: &crate::table::Outcome| matches!(outcome.applied, Applied::Assigned { .. });
    // Key b's first job starts; its second would make two running with key b.
    assert!(started(&apply(&mut table, 1_000, assign(1))));
    assert!(!started(&apply(&mut table, 1_000, assign(3))));
    // Key a's job takes the bucket's second token; nothing more this instant, whatever key.
    assert!(started(&apply(&mut table, 1_000, assign(2))));
    apply(&mut table, 1_000, Command::Cancel { job_id: job(1) });
    assert!(
        !started(&apply(&mut table, 1_000, assign(3))),
        "no token left"
    );
    assert!(
        started(&apply(&mut table, 1_500, assign(3))),
        "a token 500 ms later"
    );
    assert!(
        !started(&apply(&mut table, 2_500, assign(4))),
        "key b runs its limit again"
    );
    table.check_invariants().expect("consistent");
    // A table rebuilt from its rows holds the same bucket and counts.
    let rebuilt =
        crate::table::JobTable::from_rows(table.to_rows(), table.applied_index()).expect("loads");
    assert_eq!(rebuilt.running_with_key("q", "b"), 1);
    assert_eq!(
        rebuilt.queue_state("q").map(|q| q.rate_tat_micros),
        table.queue_state("q").map(|q| q.rate_tat_micros)
    );
    rebuilt.check_invariants().expect("consistent");
}

#[test]
fn the_table_refuses_a_submission_its_queue_has_no_room_for_whoever_proposed_it() {
    let mut table = crate::table::JobTable::new();
    let job = |n: u128| JobId(uuid::Uuid::from_u128(n));
    let at = crate::time::UnixMillis(1);
    let change = QueueChange {
        max_active_jobs: Some(1),
        ..QueueChange::default()
    };
    let set = Command::SetQueue {
        queue: "q".to_owned(),
        change,
    };
    table.apply(crate::ids::LogIndex(1), at, &set);
    let first = table.apply(crate::ids::LogIndex(2), at, &plain_submit(job(1), "q"));
    let second = table.apply(crate::ids::LogIndex(3), at, &plain_submit(job(2), "q"));
    let elsewhere = table.apply(crate::ids::LogIndex(4), at, &plain_submit(job(3), "other"));
    assert!(
        matches!(first.applied, Applied::Submitted { .. }),
        "{first:?}"
    );
    assert!(
        matches!(
            second.applied,
            Applied::QueueAdmissionRejected { ref queue, active_jobs: 1, max_active_jobs: 1, .. } if queue == "q"
        ),
        "{second:?}"
    );
    assert!(table.get(&job(2)).is_none(), "nothing was created");
    assert!(matches!(elsewhere.applied, Applied::Submitted { .. }));
    table.check_invariants().expect("consistent");
}
