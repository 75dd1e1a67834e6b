//! Delayed jobs: `SCHEDULED` until their time by the leader's clock, queued by a `Due` entry
//! stamped at or after it, cancellable, kept across a restart, and following a stepped clock.

use super::*;
use crate::limits::{DUE_JOBS_PER_ENTRY_MAX, RUN_AT_AHEAD_MILLIS_MAX};
use crate::time::UnixMillis;

impl Harness {
    /// Submits a sha256 job that waits `delay_millis` (or for `run_at`), and returns the reply.
    fn submit_delayed(&mut self, delay_millis: Option<u64>, run_at: Option<u64>) -> ClientReply {
        self.submit_job(JobSubmission {
            task: sha("later"),
            run_at_unix_ms: run_at,
            delay_millis,
            ..JobSubmission::default()
        })
    }

    fn delayed(&mut self, delay_millis: u64) -> JobId {
        match self.submit_delayed(Some(delay_millis), None) {
            ClientReply::SubmitAccepted { job_id, .. } => job_id,
            other => panic!("expected acceptance, got {other:?}"),
        }
    }

    /// The `Due` entries written so far (a harness that kept its landed batches): each one's
    /// stamp and the jobs it names. (A group of one compacts its log into rows, so the disk's
    /// log does not keep them.)
    fn due_entries(&self) -> Vec<(UnixMillis, Vec<JobId>)> {
        assert!(self.keep_landed, "the harness must keep its landed batches");
        self.landed
            .iter()
            .flat_map(|batch| &batch.records)
            .filter_map(|record| match record {
                crate::storage::Record::Log(entry) => match &entry.command {
                    Command::Due { job_ids } => Some((entry.at, job_ids.clone())),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }
}

#[test]
fn a_delayed_job_waits_scheduled_and_is_queued_by_an_entry_stamped_at_its_time() {
    let mut h = Harness::new();
    h.keep_landed = true;
    h.register("w1", 1);
    let job_id = h.delayed(5_000);
    assert_eq!(h.state(job_id), JobState::Scheduled);
    let run_at = h
        .job(job_id)
        .run_at
        .expect("a delayed job records its time");
    assert_eq!(h.c.table().next_run_at(), Some(run_at));

    // An idle worker gets nothing while the job waits.
    h.advance_with_heartbeats(4_900, &["w1"]);
    assert_eq!(h.state(job_id), JobState::Scheduled);
    assert!(h.assignments("w1").is_empty());
    assert!(h.due_entries().is_empty());

    h.advance_with_heartbeats(200, &["w1"]);
    let dues = h.due_entries();
    assert_eq!(dues.len(), 1, "one entry queues it: {dues:?}");
    assert_eq!(dues[0].1, vec![job_id]);
    assert!(
        dues[0].0 >= run_at,
        "queued by an entry stamped before its time"
    );
    let assigned = h.assignments("w1");
    assert_eq!(assigned.len(), 1);
    assert_eq!(assigned[0].0, job_id);
    assert_eq!(h.c.table().next_run_at(), None);
    let view = h.c.table().view(&job_id).expect("view");
    assert_eq!(view.run_at_unix_ms, Some(run_at.0));
}

#[test]
fn a_time_already_reached_runs_the_job_now() {
    let mut h = Harness::new();
    h.keep_landed = true;
    h.register("w1", 1);
    h.advance_with_heartbeats(1_000, &["w1"]);
    let reply = h.submit_delayed(None, Some(10));
    let ClientReply::SubmitAccepted { job_id, .. } = reply else {
        panic!("expected acceptance, got {reply:?}");
    };
    assert_eq!(h.assignments("w1").len(), 1);
    assert_ne!(h.state(job_id), JobState::Scheduled);
    assert!(h.due_entries().is_empty());
}

#[test]
fn a_scheduled_job_can_be_cancelled_and_never_runs() {
    let mut h = Harness::new();
    h.register("w1", 1);
    let job_id = h.delayed(1_000);
    match cancel(&mut h, job_id) {
        ClientReply::CancelResult { cancelled, .. } => assert!(cancelled),
        other => panic!("expected a cancel result, got {other:?}"),
    }
    assert_eq!(h.state(job_id), JobState::Cancelled);
    assert_eq!(h.c.table().scheduled_jobs(), 0);
    h.advance_with_heartbeats(2_000, &["w1"]);
    assert!(h.assignments("w1").is_empty());
    assert_eq!(h.state(job_id), JobState::Cancelled);
}

#[test]
fn bad_times_are_refused_and_write_nothing() {
    let mut h = Harness::new();
    let cases = [
        (Some(10), Some(10)),
        (Some(RUN_AT_AHEAD_MILLIS_MAX + 1), None),
        (None, Some(RUN_AT_AHEAD_MILLIS_MAX + 10_000)),
    ];
    for (delay, run_at) in cases {
        match h.submit_delayed(delay, run_at) {
            ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::InvalidRequest),
            other => panic!("{delay:?}/{run_at:?} should be refused, got {other:?}"),
        }
    }
    // A data-parallel task splits at once: it cannot wait.
    let reply = h.submit_job(JobSubmission {
        task: json!({"kind": "max", "numbers": [1, 2, 3]}),
        delay_millis: Some(1_000),
        ..JobSubmission::default()
    });
    match reply {
        ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::InvalidRequest),
        other => panic!("a delayed data-parallel job should be refused, got {other:?}"),
    }
    assert!(h.c.table().is_empty(), "nothing was created");
    // Just inside the bound is fine.
    let reply = h.submit_delayed(Some(RUN_AT_AHEAD_MILLIS_MAX), None);
    assert!(
        matches!(reply, ClientReply::SubmitAccepted { .. }),
        "{reply:?}"
    );
}

#[test]
fn scheduled_jobs_survive_a_restart_and_are_queued_by_the_recovered_leader() {
    let mut h = Harness::new();
    let early = h.delayed(3_000);
    let late = h.delayed(60_000);
    h.restart(config());
    assert_eq!(h.state(early), JobState::Scheduled);
    assert_eq!(h.state(late), JobState::Scheduled);
    assert_eq!(h.c.table().scheduled_jobs(), 2);
    h.register("w1", 1);
    // The recovered leader's clock starts again near zero: the job waits for that clock.
    h.advance_with_heartbeats(3_100, &["w1"]);
    assert_eq!(h.state(early), JobState::Running);
    assert_eq!(h.state(late), JobState::Scheduled);
}

#[test]
fn many_due_jobs_are_queued_in_bounded_entries() {
    let mut h = Harness::with(CoordinatorConfig {
        max_active_jobs: 5_000,
        ..config()
    });
    h.keep_landed = true;
    let count = DUE_JOBS_PER_ENTRY_MAX * 2 + 10;
    for _ in 0..count {
        h.delayed(1_000);
    }
    h.advance(1_100);
    let dues = h.due_entries();
    assert_eq!(dues.len(), 3, "{} entries", dues.len());
    assert!(dues
        .iter()
        .all(|(_, ids)| ids.len() <= DUE_JOBS_PER_ENTRY_MAX));
    let named: BTreeSet<JobId> = dues.iter().flat_map(|(_, ids)| ids.clone()).collect();
    assert_eq!(named.len(), count, "every job named once");
    assert_eq!(h.c.table().scheduled_jobs(), 0);
    assert_eq!(h.c.table().queued().count(), count);
}

#[test]
fn a_clock_stepped_forward_queues_what_it_passed_and_one_stepped_back_holds_the_rest() {
    let mut h = Harness::new();
    h.keep_landed = true;
    h.register("w1", 4);
    let soon = h.delayed(10_000);
    let later = h.delayed(30_000);
    // A step smaller than the bound is drift: nothing moves.
    let wall = h.c.config().wall_clock_at_epoch.at(h.now);
    let now = h.now;
    h.c.handle_wall_clock(now, UnixMillis(wall.0 + 500));
    h.pump();
    assert!(h
        .events()
        .iter()
        .all(|e| !matches!(e, Event::WallClockStepped { .. })));
    // Forward by 20 s: the first job's time is passed, and it is queued at once.
    let wall = h.c.config().wall_clock_at_epoch.at(h.now);
    h.c.handle_wall_clock(now, UnixMillis(wall.0 + 20_000));
    h.pump();
    assert!(h.events().iter().any(|e| matches!(
        e,
        Event::WallClockStepped {
            step_millis: 20_000
        }
    )));
    assert_eq!(h.state(soon), JobState::Running);
    assert_eq!(h.state(later), JobState::Scheduled);
    // Back by 15 s: the second job now waits 15 s longer than it would have.
    let wall = h.c.config().wall_clock_at_epoch.at(h.now);
    h.c.handle_wall_clock(now, UnixMillis(wall.0 - 15_000));
    h.pump();
    h.advance_with_heartbeats(20_000, &["w1"]);
    assert_eq!(h.state(later), JobState::Scheduled);
    h.advance_with_heartbeats(5_100, &["w1"]);
    assert_eq!(h.state(later), JobState::Running);
    for (at, _) in h.due_entries() {
        assert!(at >= h.job(soon).run_at.expect("run_at"));
    }
}
