//! Queues, priorities and fairness keys, through the coordinator: the order jobs start in,
//! pausing, weights, workers that serve some queues, and bad input refused.

use super::*;
use crate::protocol::{ErrorCode, QueueView};
use crate::queues::QueueChange;

/// Where and how urgently to run a job.
#[derive(Clone, Copy, Default)]
struct Place<'a> {
    queue: Option<&'a str>,
    priority: Option<u8>,
    key: Option<&'a str>,
}

/// A job of queue `tenants` with fairness key `key`.
fn keyed(key: &str) -> Place<'_> {
    Place {
        queue: Some("tenants"),
        key: Some(key),
        ..Place::default()
    }
}

fn sleep() -> serde_json::Value {
    json!({"kind": "sleep", "milliseconds": 20_000})
}

impl Harness {
    fn submit_to(&mut self, place: Place<'_>) -> ClientReply {
        let request_id = self.request_id();
        self.client_says(ClientRequest::Submit {
            request_id,
            task: sleep(),
            max_attempts: Some(3),
            idempotency_key: None,
            partitions: None,
            timeout_millis: None,
            queue: place.queue.map(str::to_owned),
            priority: place.priority,
            fairness_key: place.key.map(str::to_owned),
            delay_millis: None,
            run_at_unix_ms: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        });
        self.reply_to(request_id)
    }

    fn submit_placed(&mut self, place: Place<'_>) -> JobId {
        match self.submit_to(place) {
            ClientReply::SubmitAccepted { job_id, .. } => job_id,
            other => panic!("expected acceptance, got {other:?}"),
        }
    }

    fn set_queue(&mut self, queue: &str, change: QueueChange) -> ClientReply {
        let request_id = self.request_id();
        self.client_says(ClientRequest::set_queue(
            request_id,
            queue.to_owned(),
            change,
        ));
        self.reply_to(request_id)
    }

    fn queue_views(&mut self) -> Vec<QueueView> {
        let request_id = self.request_id();
        self.client_says(ClientRequest::Queues { request_id });
        match self.reply_to(request_id) {
            ClientReply::QueueList { queues, .. } => queues,
            other => panic!("expected the queue list, got {other:?}"),
        }
    }

    /// Finishes every attempt `name` holds and returns the jobs started next, in order, one
    /// start at a time (the worker has one slot): `starts` of them.
    fn drain_one_by_one(
        &mut self,
        name: &str,
        mut held: (JobId, LeaseId),
        starts: usize,
    ) -> Vec<JobId> {
        let mut order = Vec::new();
        for _ in 0..starts {
            self.succeed(name, held.0, held.1);
            let next = self.assignments(name);
            assert_eq!(next.len(), 1, "one slot frees, one job starts: {next:?}");
            held = (next[0].0, next[0].1);
            order.push(held.0);
        }
        order
    }
}

/// The log entry submitting a short sleep as `job_id` into `queue` (admission room for 10).
fn plain_submit(job_id: JobId, queue: &str) -> Command {
    Command::Submit {
        job_id,
        task: TaskSpec::Sleep { milliseconds: 1 },
        max_attempts: 3,
        idempotency_key: None,
        max_active_jobs: 10,
        partitions: Vec::new(),
        partitions_asked: None,
        timeout_millis: None,
        submitted_by: None,
        queue: queue.to_owned(),
        priority: 0,
        fairness_key: None,
        run_at: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    }
}

/// A worker with one slot, busy with a first job; returns that job's attempt.
fn one_busy_slot(h: &mut Harness) -> (JobId, LeaseId) {
    h.register("w1", 1);
    let first = h.submit_placed(Place::default());
    let assigned = h.assignments("w1");
    assert_eq!(assigned.len(), 1);
    assert_eq!(assigned[0].0, first);
    (first, assigned[0].1)
}

#[test]
fn higher_priority_starts_first_then_first_in_first_out() {
    let mut h = Harness::new();
    let busy = one_busy_slot(&mut h);
    let low = h.submit_placed(Place::default());
    let high = h.submit_placed(Place {
        priority: Some(7),
        ..Place::default()
    });
    let low_later = h.submit_placed(Place::default());
    let high_later = h.submit_placed(Place {
        priority: Some(7),
        ..Place::default()
    });
    assert_eq!(h.job(high).priority, 7);
    let order = h.drain_one_by_one("w1", busy, 4);
    assert_eq!(order, vec![high, high_later, low, low_later]);
    h.check();
}

#[test]
fn a_low_priority_job_that_waited_the_ageing_bound_goes_first() {
    let mut h = Harness::new();
    let busy = one_busy_slot(&mut h);
    let reply = h.set_queue(
        "default",
        QueueChange {
            aging_millis: Some(5_000),
            ..QueueChange::default()
        },
    );
    assert!(
        matches!(reply, ClientReply::QueueSet { ref queue, .. } if queue.aging_millis == 5_000),
        "{reply:?}"
    );
    let old_low = h.submit_placed(Place::default());
    h.advance_with_heartbeats(6_000, &["w1"]);
    let high = h.submit_placed(Place {
        priority: Some(9),
        ..Place::default()
    });
    let order = h.drain_one_by_one("w1", busy, 2);
    assert_eq!(
        order,
        vec![old_low, high],
        "the job queued 6 s ago has aged past 5 s"
    );
    h.check();
}

#[test]
fn a_light_key_is_not_held_up_by_a_heavy_keys_backlog() {
    let mut h = Harness::new();
    let busy = one_busy_slot(&mut h);
    for _ in 0..30 {
        h.submit_placed(Place {
            key: Some("heavy"),
            ..Place::default()
        });
    }
    let light: BTreeSet<JobId> = (0..3)
        .map(|_| {
            h.submit_placed(Place {
                key: Some("light"),
                ..Place::default()
            })
        })
        .collect();
    let order = h.drain_one_by_one("w1", busy, 6);
    let light_started = order.iter().filter(|job| light.contains(job)).count();
    assert_eq!(
        light_started, 3,
        "the light key's 3 jobs start within 6 starts: {order:?}"
    );
    h.check();
}

#[test]
fn busy_queues_share_starts_by_weight() {
    let mut h = Harness::new();
    let busy = one_busy_slot(&mut h);
    h.set_queue(
        "heavy",
        QueueChange {
            weight: Some(3),
            ..QueueChange::default()
        },
    );
    let mut queue_of = BTreeMap::new();
    for _ in 0..40 {
        queue_of.insert(
            h.submit_placed(Place {
                queue: Some("heavy"),
                ..Place::default()
            }),
            "heavy",
        );
        queue_of.insert(
            h.submit_placed(Place {
                queue: Some("light"),
                ..Place::default()
            }),
            "light",
        );
    }
    let order = h.drain_one_by_one("w1", busy, 40);
    let heavy = order.iter().filter(|job| queue_of[*job] == "heavy").count();
    // Three to one: 30 of 40, give or take the start each queue may be ahead.
    assert!((29..=31).contains(&heavy), "heavy got {heavy} of 40 starts");
    h.check();
}

#[test]
fn a_paused_queue_starts_nothing_until_resumed_and_its_jobs_stay_queued() {
    let mut h = Harness::new();
    h.register("w1", 2);
    let reply = h.set_queue("reports", QueueChange::pause(true));
    assert!(
        matches!(reply, ClientReply::QueueSet { ref queue, .. } if queue.paused),
        "{reply:?}"
    );
    let held = h.submit_placed(Place {
        queue: Some("reports"),
        ..Place::default()
    });
    let other = h.submit_placed(Place::default());
    let started: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(
        started,
        vec![other],
        "the paused queue's job waits; the other one runs"
    );
    assert_eq!(h.state(held), JobState::Queued);
    let views = h.queue_views();
    let reports = views.iter().find(|q| q.name == "reports").expect("listed");
    assert!(
        reports.paused && reports.queued == 1 && reports.running == 0,
        "{reports:?}"
    );
    h.set_queue("reports", QueueChange::pause(false));
    let started: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(started, vec![held], "resuming starts it at once");
    h.check();
}

#[test]
fn an_assignment_that_applies_after_a_pause_is_refused_by_the_table() {
    let mut table = crate::table::JobTable::new();
    let job_id = JobId(uuid::Uuid::from_u128(1));
    let submit = plain_submit(job_id, "q");
    let pause = Command::SetQueue {
        queue: "q".to_owned(),
        change: QueueChange::pause(true),
    };
    let lease = Lease {
        id: LeaseId(uuid::Uuid::from_u128(9)),
        worker: WorkerId("w1".into()),
        incarnation: Incarnation(1),
    };
    let assign = Command::Assign {
        job_id,
        lease,
        as_of: crate::ids::LogIndex(2),
    };
    let at = crate::time::UnixMillis(1);
    table.apply(crate::ids::LogIndex(1), at, &submit);
    table.apply(crate::ids::LogIndex(2), at, &pause);
    let outcome = table.apply(crate::ids::LogIndex(3), at, &assign);
    assert!(
        matches!(outcome.applied, Applied::AssignSkipped { .. }),
        "{outcome:?}"
    );
    assert_eq!(table.get(&job_id).map(|j| j.state), Some(JobState::Queued));
    table.check_invariants().expect("consistent");
}

#[test]
fn a_worker_serving_some_queues_gets_only_their_jobs() {
    let mut h = Harness::new();
    let register = WorkerToCoordinator::Register {
        worker_id: WorkerId("w1".into()),
        incarnation: Incarnation(1),
        capacity: 4,
        prefetch: 0,
        running: Vec::new(),
        finished: Vec::new(),
        tasks: crate::protocol::builtin_task_names(),
        draining: false,
        queues: Some(vec!["emails".to_owned()]),
    };
    h.worker_says("w1", register);
    let other = h.submit_placed(Place {
        queue: Some("reports"),
        ..Place::default()
    });
    let email = h.submit_placed(Place {
        queue: Some("emails"),
        ..Place::default()
    });
    let started: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(started, vec![email]);
    assert_eq!(h.state(other), JobState::Queued);
    h.check();
}

#[test]
fn bad_queue_names_priorities_and_keys_are_refused_and_create_nothing() {
    let mut h = Harness::new();
    let bad = [
        Place {
            queue: Some("has space"),
            ..Place::default()
        },
        Place {
            queue: Some(""),
            ..Place::default()
        },
        Place {
            priority: Some(10),
            ..Place::default()
        },
        Place {
            key: Some("-leading-dash"),
            ..Place::default()
        },
    ];
    for place in bad {
        match h.submit_to(place) {
            ClientReply::Error {
                code: ErrorCode::InvalidRequest,
                ..
            } => {}
            other => panic!("expected INVALID_REQUEST, got {other:?}"),
        }
    }
    assert!(h.c.table().is_empty(), "nothing was created");
    let names: Vec<String> = h.queue_views().into_iter().map(|q| q.name).collect();
    assert!(names.is_empty(), "no queue was created: {names:?}");
    match h.set_queue(
        "q",
        QueueChange {
            weight: Some(0),
            ..QueueChange::default()
        },
    ) {
        ClientReply::Error {
            code: ErrorCode::InvalidRequest,
            ..
        } => {}
        other => panic!("expected INVALID_REQUEST, got {other:?}"),
    }
    h.check();
}

#[test]
fn a_queue_beyond_the_maximum_is_refused_with_its_own_code() {
    let mut table = crate::table::JobTable::new();
    let at = crate::time::UnixMillis(1);
    for n in 0..crate::limits::QUEUES_MAX as u64 {
        let set = Command::SetQueue {
            queue: format!("q{n}"),
            change: QueueChange::pause(false),
        };
        let outcome = table.apply(crate::ids::LogIndex(n + 1), at, &set);
        assert!(matches!(outcome.applied, Applied::QueueSet { .. }));
    }
    let next = crate::ids::LogIndex(crate::limits::QUEUES_MAX as u64 + 1);
    let submit = plain_submit(JobId(uuid::Uuid::from_u128(1)), "one-too-many");
    let outcome = table.apply(next, at, &submit);
    assert!(
        matches!(outcome.applied, Applied::TooManyQueues { .. }),
        "{outcome:?}"
    );
    assert!(table.is_empty() && table.queue_count() == crate::limits::QUEUES_MAX);
}

#[test]
fn queues_and_their_passes_survive_a_restart() {
    let mut h = Harness::new();
    let busy = one_busy_slot(&mut h);
    h.set_queue(
        "heavy",
        QueueChange {
            weight: Some(2),
            ..QueueChange::default()
        },
    );
    for _ in 0..4 {
        h.submit_placed(Place {
            queue: Some("heavy"),
            ..Place::default()
        });
        h.submit_placed(Place {
            queue: Some("light"),
            priority: Some(3),
            key: Some("t1"),
        });
    }
    h.drain_one_by_one("w1", busy, 3);
    let before = h.queue_views();
    let passes: Vec<_> = h.c.table().queues().cloned().collect();
    h.restart(config());
    assert_eq!(h.c.table().queues().cloned().collect::<Vec<_>>(), passes);
    // The same counts and settings; the oldest job has waited the restart's second longer.
    let waited = |views: Vec<QueueView>| -> Vec<QueueView> {
        views
            .into_iter()
            .map(|q| QueueView {
                oldest_queued_millis: None,
                ..q
            })
            .collect()
    };
    assert_eq!(waited(h.queue_views()), waited(before));
    h.check();
}

#[test]
fn a_queue_runs_at_most_its_concurrency_and_starts_more_as_attempts_end() {
    let mut h = Harness::new();
    h.register("w1", 4);
    let reply = h.set_queue(
        "reports",
        QueueChange {
            concurrency: Some(2),
            ..QueueChange::default()
        },
    );
    assert!(
        matches!(reply, ClientReply::QueueSet { ref queue, .. } if queue.concurrency == Some(2)),
        "{reply:?}"
    );
    let jobs: Vec<JobId> = (0..4)
        .map(|_| {
            h.submit_placed(Place {
                queue: Some("reports"),
                ..Place::default()
            })
        })
        .collect();
    let other = h.submit_placed(Place::default());
    let started = h.assignments("w1");
    let ids: Vec<JobId> = started.iter().map(|a| a.0).collect();
    assert_eq!(
        ids,
        vec![jobs[0], jobs[1], other],
        "two of the queue, and the other queue's job"
    );
    assert_eq!(h.c.table().running_in("reports"), 2);
    h.succeed("w1", started[0].0, started[0].1);
    let next: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(next, vec![jobs[2]], "one ended, one more starts");
    // Lifting the limit starts the rest at once.
    h.set_queue(
        "reports",
        QueueChange {
            concurrency: Some(0),
            ..QueueChange::default()
        },
    );
    let rest: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(rest, vec![jobs[3]]);
    h.check();
}

#[test]
fn a_start_beyond_the_limit_is_refused_by_the_table_whoever_proposed_it() {
    let mut table = crate::table::JobTable::new();
    let at = crate::time::UnixMillis(1);
    let job = |n: u128| JobId(uuid::Uuid::from_u128(n));
    let mut index = 0;
    let mut apply = |table: &mut crate::table::JobTable, command: Command| {
        index += 1;
        table.apply(crate::ids::LogIndex(index), at, &command)
    };
    apply(
        &mut table,
        Command::SetQueue {
            queue: "q".to_owned(),
            change: QueueChange {
                concurrency: Some(1),
                ..QueueChange::default()
            },
        },
    );
    for n in 1..=2 {
        apply(&mut table, plain_submit(job(n), "q"));
    }
    let lease = |n: u128| Lease {
        id: LeaseId(uuid::Uuid::from_u128(100 + n)),
        worker: WorkerId("w1".into()),
        incarnation: Incarnation(1),
    };
    // Two leaders each started one (the second a deposed one whose entry still committed).
    let first = apply(
        &mut table,
        Command::Assign {
            job_id: job(1),
            lease: lease(1),
            as_of: crate::ids::LogIndex(3),
        },
    );
    let second = apply(
        &mut table,
        Command::Assign {
            job_id: job(2),
            lease: lease(2),
            as_of: crate::ids::LogIndex(3),
        },
    );
    assert!(
        matches!(first.applied, Applied::Assigned { .. }),
        "{first:?}"
    );
    assert!(
        matches!(second.applied, Applied::AssignSkipped { .. }),
        "{second:?}"
    );
    assert_eq!(table.running_in("q"), 1);
    table.check_invariants().expect("consistent");
    // The first ends: the count drops, and the second may start.
    apply(&mut table, Command::Cancel { job_id: job(1) });
    assert_eq!(table.running_in("q"), 0);
    let again = apply(
        &mut table,
        Command::Assign {
            job_id: job(2),
            lease: lease(3),
            as_of: crate::ids::LogIndex(6),
        },
    );
    assert!(
        matches!(again.applied, Applied::Assigned { .. }),
        "{again:?}"
    );
    table.check_invariants().expect("consistent");
}

#[test]
fn a_queue_that_cannot_start_does_not_hold_back_the_pass_a_newcomer_joins_at() {
    let mut h = Harness::new();
    let mut busy = one_busy_slot(&mut h);
    h.set_queue("held", QueueChange::pause(true));
    h.submit_placed(Place {
        queue: Some("held"),
        ..Place::default()
    });
    let mut queue_of = BTreeMap::new();
    for _ in 0..15 {
        queue_of.insert(
            h.submit_placed(Place {
                queue: Some("a"),
                ..Place::default()
            }),
            "a",
        );
    }
    let first = h.drain_one_by_one("w1", busy, 15);
    busy = (
        *first.last().expect("15 starts"),
        h.job(*first.last().expect("15"))
            .lease
            .as_ref()
            .expect("running")
            .id,
    );
    for _ in 0..10 {
        queue_of.insert(
            h.submit_placed(Place {
                queue: Some("a"),
                ..Place::default()
            }),
            "a",
        );
        queue_of.insert(
            h.submit_placed(Place {
                queue: Some("c"),
                ..Place::default()
            }),
            "c",
        );
    }
    let next = h.drain_one_by_one("w1", busy, 10);
    let to_c = next
        .iter()
        .filter(|job| queue_of.get(*job) == Some(&"c"))
        .count();
    // The newcomer joins at the pass of the queues that compete (not the paused one's): the two
    // share the starts, give or take one.
    assert!(
        (4..=6).contains(&to_c),
        "c got {to_c} of 10 starts: {next:?}"
    );
    h.check();
}

mod key_rates;
mod limits;
