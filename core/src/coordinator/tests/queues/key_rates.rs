//! Per-key rate limits: a bucket for each fairness key, judged by the leader and again by the
//! table, forgotten once full, and a key out of tokens parked so picks do not walk it.

use super::*;
use crate::ids::LogIndex;
use crate::queues::{HeldBack, RateLimit};
use crate::table::JobTable;
use crate::time::UnixMillis;

fn key_rate(starts: u32, per_millis: u64) -> QueueChange {
    QueueChange {
        key_rate: Some(RateLimit { starts, per_millis }),
        ..QueueChange::default()
    }
}

#[test]
fn each_key_starts_its_burst_then_waits_while_other_keys_start() {
    let mut h = Harness::new();
    h.register("w1", 20);
    h.set_queue("tenants", key_rate(2, 1000));
    let heavy: Vec<JobId> = (0..4).map(|_| h.submit_placed(keyed("heavy"))).collect();
    let light: Vec<JobId> = (0..2).map(|_| h.submit_placed(keyed("light"))).collect();
    let unkeyed: Vec<JobId> = (0..3)
        .map(|_| {
            h.submit_placed(Place {
                queue: Some("tenants"),
                ..Place::default()
            })
        })
        .collect();
    let started: BTreeSet<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    let expected: BTreeSet<JobId> = heavy[..2]
        .iter()
        .chain(&light)
        .chain(&unkeyed)
        .copied()
        .collect();
    assert_eq!(
        started, expected,
        "two per key at once; jobs without a key are not limited by it"
    );
    assert!(
        h.events().iter().any(|e| matches!(
            e,
            Event::QueueHeldBack { queue, rule: HeldBack::KeyRate } if queue == "tenants"
        )),
        "a key held back by its rate is an event"
    );
    // The heavy key's lane waits parked for its next token, 500 ms on.
    assert_eq!(
        h.c.table()
            .queue_index()
            .parked()
            .map(|(_, _, _, key)| key.to_owned())
            .collect::<Vec<_>>(),
        vec!["heavy".to_owned()]
    );
    h.advance_with_heartbeats(400, &["w1"]);
    assert!(h.assignments("w1").is_empty(), "no token yet");
    h.advance_with_heartbeats(150, &["w1"]);
    let next: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(next, vec![heavy[2]], "one token, one start");
    assert!(
        !h.events()
            .iter()
            .any(|e| matches!(e, Event::QueueHeldBack { .. })),
        "a key waiting parked still holds its queue back: no new event while it waits"
    );
    // Removing the limit starts the rest at once.
    h.set_queue("tenants", key_rate(0, 1000));
    let rest: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(rest, vec![heavy[3]]);
    assert_eq!(h.c.table().key_bucket_count(), 0, "no limit, no buckets");
    h.check();
}

#[test]
fn a_key_that_sends_one_job_at_a_time_still_keeps_its_rate() {
    let mut h = Harness::new();
    h.register("w1", 4);
    h.set_queue("tenants", key_rate(1, 1000));
    let first = h.submit_placed(keyed("drip"));
    let started = h.assignments("w1");
    assert_eq!(started.iter().map(|a| a.0).collect::<Vec<_>>(), vec![first]);
    h.succeed("w1", started[0].0, started[0].1);
    // The key's next job arrives after the first ended: its bucket is still empty.
    let second = h.submit_placed(keyed("drip"));
    assert!(
        h.assignments("w1").is_empty(),
        "the bucket remembers the start"
    );
    h.advance_with_heartbeats(1_000, &["w1"]);
    let next: Vec<JobId> = h.assignments("w1").iter().map(|a| a.0).collect();
    assert_eq!(next, vec![second]);
    h.check();
}

/// A table driven entry by entry, as a log applies it.
struct Log {
    table: JobTable,
    index: u64,
}

impl Log {
    fn new() -> Log {
        Log {
            table: JobTable::new(),
            index: 0,
        }
    }

    fn apply(&mut self, at: u64, command: Command) -> crate::table::Outcome {
        self.index += 1;
        let outcome = self
            .table
            .apply(LogIndex(self.index), UnixMillis(at), &command);
        self.table.check_invariants().expect("consistent");
        outcome
    }

    /// Changes queue `q` at `at`.
    fn set(&mut self, at: u64, change: QueueChange) {
        let set = Command::SetQueue {
            queue: "q".to_owned(),
            change,
        };
        assert!(matches!(
            self.apply(at, set).applied,
            Applied::QueueSet { .. }
        ));
    }

    fn submit(&mut self, at: u64, n: u128, key: &str) {
        let mut submit = plain_submit(job(n), "q");
        if let Command::Submit {
            fairness_key,
            max_active_jobs,
            ..
        } = &mut submit
        {
            *fairness_key = Some(key.to_owned());
            *max_active_jobs = 10_000;
        }
        self.apply(at, submit);
    }

    /// Whether an `Assign` of job `n` at `at` started it.
    fn start(&mut self, at: u64, n: u128) -> bool {
        let assign = Command::Assign {
            job_id: job(n),
            lease: Lease {
                id: LeaseId(uuid::Uuid::from_u128(1_000 + n)),
                worker: WorkerId("w1".into()),
                incarnation: Incarnation(1),
            },
            as_of: LogIndex(1),
        };
        matches!(self.apply(at, assign).applied, Applied::Assigned { .. })
    }
}

fn job(n: u128) -> JobId {
    JobId(uuid::Uuid::from_u128(n))
}

#[test]
fn the_table_refuses_a_start_past_a_keys_rate_whoever_proposed_it() {
    let mut log = Log::new();
    log.set(1_000, key_rate(1, 1000));
    for n in 1..=3 {
        log.submit(1_000, n, "a");
    }
    log.submit(1_000, 4, "b");
    assert!(log.start(1_000, 1));
    assert!(!log.start(1_200, 2), "key a has no token for a second");
    assert!(log.start(1_200, 4), "key b has its own bucket");
    // A leader whose clock is behind cannot get past the bucket: the queue's key clock has
    // reached 1.2 s, and key a's token is due at 2 s.
    assert!(!log.start(500, 2));
    assert!(log.start(2_000, 2));
    // A rebuilt table holds the same buckets and clock, parks the same lanes, and refuses
    // the same start.
    let rows = log.table.to_rows();
    assert_eq!(rows.key_buckets.len(), 2);
    let mut rebuilt = Log {
        table: JobTable::from_rows(rows, log.table.applied_index()).expect("loads"),
        index: log.index,
    };
    rebuilt.table.check_invariants().expect("consistent");
    let parked = |t: &JobTable| {
        t.queue_index()
            .parked()
            .map(|(until, _, _, key)| (until, key.to_owned()))
            .collect::<Vec<_>>()
    };
    assert_eq!(parked(&rebuilt.table), parked(&log.table));
    assert_eq!(
        parked(&log.table),
        vec![(UnixMillis(3_000), "a".to_owned())]
    );
    assert!(!rebuilt.start(2_500, 3));
    assert!(!log.start(2_500, 3));
    // Setting the limit anew fills every bucket and releases every lane.
    log.set(2_500, key_rate(1, 1000));
    assert_eq!(log.table.key_bucket_count(), 0);
    assert!(parked(&log.table).is_empty());
    assert!(log.start(2_500, 3));
}

#[test]
fn buckets_are_forgotten_once_full_by_the_queues_clock() {
    let mut log = Log::new();
    log.set(0, key_rate(2, 1000));
    // A thousand keys start once each: a thousand buckets, each full again 500 ms later.
    for n in 1..=1_000u128 {
        log.submit(1_000, n, &format!("k{n}"));
        assert!(log.start(1_000, n));
    }
    assert_eq!(log.table.key_bucket_count(), 1_000);
    // A start 500 ms later forgets them all but its own.
    log.submit(1_500, 2_000, "late");
    assert!(log.start(1_500, 2_000));
    assert_eq!(log.table.key_bucket_count(), 1);
    assert!(log.table.key_bucket("q", "late").is_some());
    let changed = log.table.take_changed_key_buckets();
    assert_eq!(
        changed.len(),
        1_001,
        "each forgotten bucket is deleted from disk too"
    );
}

#[test]
fn a_pick_does_not_walk_keys_waiting_for_their_rate() {
    let mut log = Log::new();
    log.set(0, key_rate(1, 60_000));
    // 500 keys each start once and queue a second job: every lane waits for its token.
    for n in 1..=500u128 {
        log.submit(1_000, n, &format!("k{n}"));
        log.submit(1_000, 10_000 + n, &format!("k{n}"));
        assert!(log.start(1_000, n));
    }
    log.submit(1_000, 20_000, "fresh");
    assert_eq!(log.table.queue_index().parked().count(), 500);
    let mut walked = 0;
    let picked = log.table.queue_index().pick(
        "sleep",
        "q",
        crate::queues::Ageing {
            now: UnixMillis(1_000),
            bound_millis: 60_000,
        },
        |_| 0,
        |_| {
            walked += 1;
            false
        },
        |_| false,
    );
    assert_eq!(picked, Some(job(20_000)), "the one key with a token");
    assert_eq!(walked, 1, "the parked lanes were not walked");
    // Their tokens come due: an entry at that time returns them to the turn order, where the
    // oldest turn goes first.
    log.submit(61_000, 30_000, "other");
    assert_eq!(log.table.queue_index().parked().count(), 0);
    assert!(log.start(61_000, 10_001));
}

#[test]
fn a_key_out_of_tokens_waits_parked_in_every_task_kind() {
    let mut log = Log::new();
    log.set(0, key_rate(1, 1000));
    log.submit(1_000, 1, "a");
    log.submit(1_000, 2, "a");
    let mut other_kind = plain_submit(job(3), "q");
    if let Command::Submit {
        task, fairness_key, ..
    } = &mut other_kind
    {
        *task = TaskSpec::Sha256 {
            text: "x".to_owned(),
        };
        *fairness_key = Some("a".to_owned());
    }
    log.apply(1_000, other_kind);
    assert!(log.start(1_000, 1));
    let parked: Vec<(String, String)> = log
        .table
        .queue_index()
        .parked()
        .map(|(_, kind, _, key)| (kind.to_owned(), key.to_owned()))
        .collect();
    assert_eq!(
        parked,
        vec![
            ("sha256".to_owned(), "a".to_owned()),
            ("sleep".to_owned(), "a".to_owned())
        ],
        "the bucket is the key's, whatever the kind"
    );
    assert!(!log.start(1_500, 3), "no token for the other kind either");
    assert!(log.start(2_000, 3));
}
