//! Dependencies: a job naming others in `after` waits `BLOCKED` until they all end, runs only
//! after its jobs completed, and is cancelled with a reason when one of them fails (unless it
//! runs after any outcome); a cancel spreads downstream.

use super::*;

impl Harness {
    /// Submits a sha256 job waiting for `after`; returns the reply.
    fn submit_after(&mut self, text: &str, after: &[JobId], any_outcome: bool) -> ClientReply {
        self.submit_job(JobSubmission {
            task: sha(text),
            max_attempts: Some(1),
            after: after.to_vec(),
            after_any_outcome: any_outcome,
            ..JobSubmission::default()
        })
    }

    fn after(&mut self, text: &str, after: &[JobId]) -> JobId {
        match self.submit_after(text, after, false) {
            ClientReply::SubmitAccepted { job_id, .. } => job_id,
            other => panic!("expected acceptance, got {other:?}"),
        }
    }

    /// Runs `w1`'s assignments to the end, each succeeding or failing as `fail` says, and
    /// returns the jobs in the order they were assigned.
    fn run_all(&mut self, fail: &[JobId]) -> Vec<JobId> {
        let mut order = Vec::new();
        for _ in 0..20 {
            let assigned = self.assignments("w1");
            if assigned.is_empty() {
                break;
            }
            for (job_id, lease_id, _) in assigned {
                order.push(job_id);
                if fail.contains(&job_id) {
                    let outcome = AttemptOutcome::Failed {
                        permanent: true,
                        error: "broken".into(),
                    };
                    self.finish("w1", job_id, lease_id, outcome);
                } else {
                    self.succeed("w1", job_id, lease_id);
                }
            }
        }
        order
    }
}

#[test]
fn a_chain_runs_in_order_and_a_fan_in_waits_for_every_parent() {
    let mut h = Harness::new();
    let a = h.submit(sha("a"), 1);
    let b = h.after("b", &[a]);
    let c = h.after("c", &[b]);
    assert_eq!(h.state(b), JobState::Blocked);
    assert_eq!(h.state(c), JobState::Blocked);
    let parents: Vec<JobId> = (0..10)
        .map(|i| h.submit(sha(&format!("p{i}")), 1))
        .collect();
    let child = h.after("child", &parents);
    assert_eq!(h.c.table().dependents_of(&a).collect::<Vec<_>>(), vec![b]);
    let view = h.c.table().view(&a).expect("a view");
    assert_eq!(view.waited_on_by, vec![b]);
    assert_eq!(h.c.table().view(&child).expect("a view").after, parents);

    h.register("w1", 4);
    let order = h.run_all(&[]);
    let at = |job: JobId| order.iter().position(|j| *j == job).expect("ran");
    assert!(at(a) < at(b) && at(b) < at(c), "{order:?}");
    assert!(parents.iter().all(|p| at(*p) < at(child)), "{order:?}");
    for job in [a, b, c, child] {
        assert_eq!(h.state(job), JobState::Completed);
    }
    assert_eq!(h.job(child).after, parents);
}

#[test]
fn a_failed_parent_cancels_everything_downstream_with_a_reason_unless_asked_otherwise() {
    let mut h = Harness::new();
    let a = h.submit(sha("a"), 1);
    let b = h.after("b", &[a]);
    let c = h.after("c", &[b]);
    let anyway = match h.submit_after("anyway", &[a], true) {
        ClientReply::SubmitAccepted { job_id, .. } => job_id,
        other => panic!("{other:?}"),
    };
    h.register("w1", 4);
    let order = h.run_all(&[a]);
    assert_eq!(h.state(a), JobState::Failed);
    assert_eq!(h.state(b), JobState::Cancelled);
    assert_eq!(h.state(c), JobState::Cancelled);
    let why = h.job(b).error.clone().expect("a reason");
    assert!(
        why.contains(&a.to_string()) && why.contains("FAILED"),
        "{why}"
    );
    assert!(h
        .job(c)
        .error
        .clone()
        .expect("a reason")
        .contains(&b.to_string()));
    assert!(!order.contains(&b) && !order.contains(&c), "{order:?}");
    assert!(order.contains(&anyway));
    assert_eq!(h.state(anyway), JobState::Completed);
    // A job submitted after its parent failed is cancelled at once.
    let late = h.after("late", &[a]);
    assert_eq!(h.state(late), JobState::Cancelled);
}

#[test]
fn a_cancelled_blocked_job_releases_its_parents_and_cancels_its_children() {
    let mut h = Harness::new();
    let a = h.submit(sha("a"), 1);
    let b = h.after("b", &[a]);
    let c = h.after("c", &[b]);
    match cancel(&mut h, b) {
        ClientReply::CancelResult { cancelled, .. } => assert!(cancelled),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.state(c), JobState::Cancelled);
    assert_eq!(h.c.table().dependents_of(&a).count(), 0);
    h.register("w1", 2);
    h.run_all(&[]);
    assert_eq!(h.state(a), JobState::Completed);
    assert_eq!(h.state(b), JobState::Cancelled);
}

#[test]
fn bad_lists_are_refused_and_an_unknown_job_waited_for_cancels_the_waiting_one() {
    let mut h = Harness::new();
    let a = h.submit(sha("a"), 1);
    for (after, any) in [(vec![a, a], false), (vec![], true)] {
        match h.submit_after("x", &after, any) {
            ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::InvalidRequest),
            other => panic!("{after:?}/{any} should be refused, got {other:?}"),
        }
    }
    assert_eq!(h.c.table().len(), 1);
    // A job never submitted (or purged): how it ended is unknown, so the job waiting for it
    // never runs, even one that asked to run after any outcome.
    let ghost = JobId(uuid::Uuid::from_u128(7));
    for any in [false, true] {
        let job = match h.submit_after("x", &[a, ghost], any) {
            ClientReply::SubmitAccepted { job_id, .. } => job_id,
            other => panic!("{other:?}"),
        };
        assert_eq!(h.state(job), JobState::Cancelled);
        let why = h.job(job).error.clone().expect("a reason");
        assert!(
            why.contains(&ghost.to_string()) && why.contains("not known"),
            "{why}"
        );
    }
}

#[test]
fn blocked_jobs_survive_a_restart() {
    let mut h = Harness::new();
    let a = h.submit(sha("a"), 1);
    let b = h.after("b", &[a]);
    h.restart(config());
    assert_eq!(h.state(b), JobState::Blocked);
    assert_eq!(h.c.table().dependents_of(&a).collect::<Vec<_>>(), vec![b]);
    h.register("w1", 2);
    h.run_all(&[]);
    assert_eq!(h.state(b), JobState::Completed);
}
