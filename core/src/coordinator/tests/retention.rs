//! Retention: the policy purges terminal jobs by count and by age, `PURGE` removes what a
//! client names, and a purged job is gone everywhere (table, disk, idempotency keys).

use super::*;
use crate::coordinator::Retention;
use crate::time::UnixMillis;

/// The wall time the harness's coordinators start at (any fixed time will do).
const WALL_EPOCH: UnixMillis = UnixMillis(1_800_000_000_000);

fn keeping(retention: Retention) -> CoordinatorConfig {
    CoordinatorConfig {
        retention,
        wall_clock_at_epoch: WALL_EPOCH,
        ..config()
    }
}

/// Runs `n` keyed jobs to completion on `w1`, one after another; returns their ids, oldest
/// first, each finished 10 ms after the one before.
fn complete_keyed(h: &mut Harness, n: usize, prefix: &str) -> Vec<JobId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let key = format!("{prefix}-{i}");
        let job_id = match h.submit_request(sha(&key), Some(3), Some(&key)) {
            ClientReply::SubmitAccepted { job_id, .. } => job_id,
            other => panic!("expected acceptance, got {other:?}"),
        };
        let (assigned, lease_id, _) = h.assignments("w1")[0];
        assert_eq!(assigned, job_id);
        h.succeed("w1", job_id, lease_id);
        assert_eq!(h.state(job_id), JobState::Completed);
        h.advance_with_heartbeats(10, &["w1"]);
        ids.push(job_id);
    }
    ids
}

fn purge(h: &mut Harness, state: Option<JobState>, older_than_millis: u64) -> ClientReply {
    let request_id = h.request_id();
    h.client_says(ClientRequest::Purge {
        request_id,
        state,
        older_than_millis,
    });
    h.reply_to(request_id)
}

#[test]
fn jobs_are_stamped_with_the_leaders_wall_time() {
    let mut h = Harness::with(keeping(Retention::FOREVER));
    h.register("w1", 1);
    h.advance_with_heartbeats(250, &["w1"]);
    let [job_id] = complete_keyed(&mut h, 1, "k")[..] else {
        panic!("one job")
    };
    let job = h.job(job_id);
    let created = job.created_at.0 - WALL_EPOCH.0;
    let finished = job.finished_at.expect("a finished job is stamped").0 - WALL_EPOCH.0;
    assert!(
        (250..260).contains(&created),
        "created {created} ms after the epoch"
    );
    assert!(finished >= created, "finished before it was created");
    let view = h.d.c.table().view(&job_id).expect("a view");
    assert_eq!(view.created_at_unix_ms, Some(job.created_at.0));
    assert_eq!(view.finished_at_unix_ms, job.finished_at.map(|at| at.0));
}

#[test]
fn the_count_bound_purges_the_longest_finished_and_forgets_their_keys() {
    let mut h = Harness::with(keeping(Retention {
        max_age: None,
        max_count: Some(3),
        min_age: Duration::from_secs(5),
    }));
    h.register("w1", 1);
    let ids = complete_keyed(&mut h, 5, "k");
    assert_eq!(
        h.d.c.table().finished_jobs(),
        5,
        "nothing is purged before a sweep"
    );
    h.advance_with_heartbeats(2_000, &["w1"]);
    assert_eq!(
        h.d.c.table().finished_jobs(),
        5,
        "the count bound waits until a job is at least min_age old"
    );
    h.advance_with_heartbeats(4_000, &["w1"]);
    assert_eq!(h.d.c.table().finished_jobs(), 3);
    for gone in &ids[..2] {
        assert!(h.d.c.job(gone).is_none(), "job {gone} should be purged");
        assert!(!h.disk.jobs.contains_key(gone), "its row should be deleted");
        let request_id = h.request_id();
        h.client_says(ClientRequest::Status {
            request_id,
            job_id: *gone,
        });
        assert!(matches!(
            h.reply_to(request_id),
            ClientReply::Error {
                code: ErrorCode::JobNotFound,
                ..
            }
        ));
    }
    for kept in &ids[2..] {
        assert_eq!(h.state(*kept), JobState::Completed);
    }
    let purged: u64 = h
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::JobsPurged { purged, .. } => Some(*purged),
            _ => None,
        })
        .sum();
    assert_eq!(purged, 2, "the purges are logged");
    // A purged job's key is free again: resending it creates a new job...
    let again = match h.submit_request(sha("k-0"), Some(3), Some("k-0")) {
        ClientReply::SubmitAccepted {
            job_id, existing, ..
        } => {
            assert!(!existing, "the key was forgotten with its job");
            job_id
        }
        other => panic!("expected acceptance, got {other:?}"),
    };
    assert_ne!(again, ids[0]);
    // ...while a retained job's key still names it.
    match h.submit_request(sha("k-4"), Some(3), Some("k-4")) {
        ClientReply::SubmitAccepted {
            job_id, existing, ..
        } => assert!(existing && job_id == ids[4]),
        other => panic!("expected a replay, got {other:?}"),
    }
}

#[test]
fn the_age_bound_purges_once_a_job_is_old_enough_and_survives_a_restart() {
    let policy = keeping(Retention {
        max_age: Some(Duration::from_secs(60)),
        max_count: None,
        ..Retention::default()
    });
    let mut h = Harness::with(policy.clone());
    h.register("w1", 1);
    let ids = complete_keyed(&mut h, 2, "k");
    h.advance_with_heartbeats(30_000, &["w1"]);
    assert_eq!(h.d.c.table().finished_jobs(), 2, "younger than the bound");
    let young = complete_keyed(&mut h, 1, "young");
    h.advance_with_heartbeats(31_000, &["w1"]);
    assert_eq!(
        h.d.c.table().finished_jobs(),
        1,
        "the first two are over a minute old"
    );
    assert!(ids.iter().all(|id| h.d.c.job(id).is_none()));
    assert_eq!(h.state(young[0]), JobState::Completed);
    // The purge is durable: a restart on the same disk does not bring the jobs back.
    h.restart(policy);
    assert!(ids.iter().all(|id| h.d.c.job(id).is_none()));
    assert_eq!(h.d.c.table().finished_jobs(), 1);
}

#[test]
fn a_purge_request_removes_only_the_state_and_age_asked_for() {
    let mut h = Harness::with(keeping(Retention::FOREVER));
    h.register("w1", 1);
    let done = complete_keyed(&mut h, 2, "done");
    let failed = h.submit(sha("fails"), 1);
    let (_, lease_id, _) = h.assignments("w1")[0];
    h.finish(
        "w1",
        failed,
        lease_id,
        AttemptOutcome::Failed {
            permanent: false,
            error: "boom".into(),
        },
    );
    assert_eq!(h.state(failed), JobState::Failed);
    let queued = h.submit(sha("still queued"), 3);
    h.advance_with_heartbeats(5_000, &["w1"]);

    // Not old enough: nothing goes.
    match purge(&mut h, None, 60_000) {
        ClientReply::Purged {
            purged, remaining, ..
        } => assert_eq!((purged, remaining), (0, 0)),
        other => panic!("expected PURGED, got {other:?}"),
    }
    // Only the failed one.
    match purge(&mut h, Some(JobState::Failed), 1_000) {
        ClientReply::Purged {
            purged, remaining, ..
        } => assert_eq!((purged, remaining), (1, 0)),
        other => panic!("expected PURGED, got {other:?}"),
    }
    assert!(h.d.c.job(&failed).is_none());
    assert!(done.iter().all(|id| h.d.c.job(id).is_some()));
    // A live state is refused and changes nothing.
    let before = h.d.c.table().len();
    assert!(matches!(
        purge(&mut h, Some(JobState::Queued), 0),
        ClientReply::Error {
            code: ErrorCode::InvalidRequest,
            ..
        }
    ));
    assert_eq!(h.d.c.table().len(), before);
    // Everything terminal; the queued job stays whatever its age.
    match purge(&mut h, None, 0) {
        ClientReply::Purged { purged, .. } => assert_eq!(purged, 2),
        other => panic!("expected PURGED, got {other:?}"),
    }
    assert!(h.d.c.job(&queued).is_some());
    assert_eq!(h.d.c.table().len(), 1);
}

#[test]
fn a_purge_names_ids_and_apply_skips_any_that_are_not_purgeable() {
    let mut h = Harness::with(keeping(Retention::FOREVER));
    h.register("w1", 1);
    let done = complete_keyed(&mut h, 1, "done")[0];
    let running = h.submit(sha("runs"), 3);
    assert_eq!(h.state(running), JobState::Running);
    let mut table = h.d.c.table().clone();
    let index = table.applied_index().next();
    let unknown = JobId(uuid::Uuid::from_u128(77));
    let outcome = table.apply(
        index,
        UnixMillis::UNSTAMPED,
        &Command::Purge {
            job_ids: vec![running, unknown, done, done],
        },
    );
    assert_eq!(
        outcome.applied,
        Applied::Purged {
            purged: 1,
            skipped: 3
        }
    );
    assert_eq!(outcome.follow_on, vec![Applied::Removed { job_id: done }]);
    assert_eq!(
        table.get(&running).map(|j| j.state),
        Some(JobState::Running)
    );
    table
        .check_invariants()
        .expect("a purged table keeps its invariants");
}

#[test]
fn a_table_rebuilt_from_rows_after_a_purge_queues_exactly_as_the_live_one() {
    let mut h = Harness::with(keeping(Retention::FOREVER));
    let queued = h.submit(sha("stays queued"), 3);
    let last = h.submit(json!({"kind": "sleep", "milliseconds": 1}), 3);
    cancel(&mut h, last);
    // The most recently enqueued job is purged: the highest queue position left the table.
    match purge(&mut h, None, 0) {
        ClientReply::Purged { purged, .. } => assert_eq!(purged, 1),
        other => panic!("expected PURGED, got {other:?}"),
    }
    let mut live = h.d.c.table().clone();
    let mut rebuilt =
        JobTable::from_rows(live.to_rows(), live.applied_index()).expect("valid rows");
    let next = live.applied_index().next();
    let submit = Command::Submit {
        timeout_millis: None,
        job_id: JobId(uuid::Uuid::from_u128(99)),
        task: TaskSpec::Sha256 { text: "new".into() },
        max_attempts: 3,
        idempotency_key: None,
        max_active_jobs: 100,
        partitions: Vec::new(),
        partitions_asked: None,
        submitted_by: None,
        fairness_key: None,
        priority: 0,
        queue: crate::queues::default_queue(),
        run_at: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    };
    live.apply(next, UnixMillis::UNSTAMPED, &submit);
    rebuilt.apply(next, UnixMillis::UNSTAMPED, &submit);
    let new = JobId(uuid::Uuid::from_u128(99));
    assert_eq!(live.get(&new), rebuilt.get(&new), "the same row on both");
    assert_eq!(
        live.queued().collect::<Vec<_>>(),
        vec![queued, new],
        "first in, first out"
    );
    assert_eq!(
        rebuilt.queued().collect::<Vec<_>>(),
        live.queued().collect::<Vec<_>>()
    );
}
