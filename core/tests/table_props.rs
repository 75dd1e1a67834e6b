//! Property tests for the replicated job table (`command::JobTable`).
//!
//! Random logs of commands are applied to a table. The logs use small pools (a few leases, two
//! workers, two idempotency keys, two task specs, admission limits of 1 to 5) so that conflicts,
//! stale leases, admission refusals and exhausted attempts all happen often. After every apply the
//! invariants of docs/SIMULATION.md that the table owns are checked (2, 3, 4, 5, 6), plus
//! replica agreement (8: the same log gives the same table) and recovery from persisted rows.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest::sample::Index;

use herder_core::command::Command;
use herder_core::ids::{Attempt, Incarnation, JobId, LeaseId, LogIndex, WorkerId};
use herder_core::job::{Job, JobState, Lease};
use herder_core::storage::TableRows;
use herder_core::table::{Applied, JobTable, Outcome, StaleReason};
use herder_core::tasks::{TaskOutput, TaskSpec};
use herder_core::time::UnixMillis;

// ---------------------------------------------------------------------------------------------
// Abstract operations, made concrete against the table as it is when they run
// ---------------------------------------------------------------------------------------------

/// Which lease a lease-carrying command names.
#[derive(Clone, Debug)]
enum LeaseRef {
    /// The job's lease right now (if it has one; otherwise a pool lease).
    Current,
    /// One of the small pool of lease ids, current or not.
    Pool(usize),
    /// A lease this job held earlier (stale), if it had any.
    Earlier(Index),
}

/// A job reference: one of the jobs submitted so far, or (`None`) a job that never existed.
type JobRef = Option<Index>;

#[derive(Clone, Debug)]
enum Op {
    Submit {
        spec: usize,
        max_attempts: u32,
        key: Option<usize>,
        limit: u64,
        /// Wait until this many ms after the entry before it (`None`: run now); under 10 ms
        /// is already reached by the submission's own stamp.
        wait: Option<u64>,
        /// Jobs to wait for (a ghost among them is unknown), and whether any outcome will do.
        after: Vec<JobRef>,
        any_outcome: bool,
    },
    /// Queue these jobs if their time has come.
    Due {
        jobs: Vec<JobRef>,
    },
    Assign {
        job: JobRef,
        lease: usize,
        worker: usize,
        incarnation: u64,
    },
    Complete {
        job: JobRef,
        lease: LeaseRef,
        output: usize,
    },
    AttemptFailed {
        job: JobRef,
        lease: LeaseRef,
        delay: u64,
        permanent: bool,
    },
    Release {
        job: JobRef,
        lease: LeaseRef,
    },
    Requeue {
        job: JobRef,
    },
    Cancel {
        job: JobRef,
    },
    Abandon {
        job: JobRef,
        lease: LeaseRef,
    },
}

const LEASE_POOL: u128 = 6;
const WORKERS: [&str; 2] = ["w1", "w2"];
const KEYS: [&str; 2] = ["key-a", "key-b"];

fn spec(choice: usize) -> TaskSpec {
    match choice {
        0 => TaskSpec::Sha256 { text: "a".into() },
        1 => TaskSpec::User(herder_core::tasks::UserTask {
            name: "resize".into(),
            payload: serde_json::json!({"width": 1.5}),
        }),
        _ => TaskSpec::Sleep { milliseconds: 5 },
    }
}

fn output(choice: usize) -> TaskOutput {
    match choice {
        0 => TaskOutput::Sha256 { hex: "aa".into() },
        _ => TaskOutput::Slept { milliseconds: 5 },
    }
}

/// The stamp of the entry at `index`: ten milliseconds apart, a function of the index so a
/// replay stamps alike.
fn stamp(index: LogIndex) -> UnixMillis {
    UnixMillis(index.0 * 10)
}

fn pool_lease(i: usize) -> LeaseId {
    LeaseId(uuid::Uuid::from_u128(
        0x1ea5_e000_0000 + i as u128 % LEASE_POOL,
    ))
}

/// A job id no submission ever uses.
fn ghost_job() -> JobId {
    JobId(uuid::Uuid::from_u128(u128::MAX))
}

fn job_ref() -> impl Strategy<Value = JobRef> {
    proptest::option::weighted(0.92, any::<Index>())
}

fn lease_ref() -> impl Strategy<Value = LeaseRef> {
    prop_oneof![
        4 => Just(LeaseRef::Current),
        2 => (0..LEASE_POOL as usize).prop_map(LeaseRef::Pool),
        2 => any::<Index>().prop_map(LeaseRef::Earlier),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (
            0..3usize,
            1..=3u32,
            proptest::option::of(0..2usize),
            1..=5u64,
            proptest::option::weighted(0.3, 0..60u64),
            proptest::collection::vec(job_ref(), 0..3),
            any::<bool>(),
        )
            .prop_map(|(spec, max_attempts, key, limit, wait, after, any_outcome)| Op::Submit {
                spec,
                max_attempts,
                key,
                limit,
                wait,
                // Half the submissions wait for nobody.
                after: if any_outcome { Vec::new() } else { after },
                any_outcome: any_outcome && wait.is_some(),
            }),
        2 => proptest::collection::vec(job_ref(), 1..4).prop_map(|jobs| Op::Due { jobs }),
        4 => (job_ref(), 0..LEASE_POOL as usize, 0..2usize, 1..=2u64).prop_map(
            |(job, lease, worker, incarnation)| Op::Assign { job, lease, worker, incarnation }
        ),
        3 => (job_ref(), lease_ref(), 0..2usize)
            .prop_map(|(job, lease, output)| Op::Complete { job, lease, output }),
        3 => (job_ref(), lease_ref(), 0..100u64, proptest::bool::weighted(0.2)).prop_map(
            |(job, lease, delay, permanent)| Op::AttemptFailed { job, lease, delay, permanent }
        ),
        2 => (job_ref(), lease_ref()).prop_map(|(job, lease)| Op::Release { job, lease }),
        2 => job_ref().prop_map(|job| Op::Requeue { job }),
        1 => job_ref().prop_map(|job| Op::Cancel { job }),
        2 => (job_ref(), lease_ref()).prop_map(|(job, lease)| Op::Abandon { job, lease }),
    ]
}

/// Turns abstract operations into a concrete command log. Needs the table as it stands before
/// each command, so it is driven step by step by `run`.
#[derive(Default)]
struct Concretizer {
    /// Every job id proposed by a `Submit`, in order (created or not).
    submitted: Vec<JobId>,
    /// Every lease each job was ever assigned (applied or not).
    leases_of: BTreeMap<JobId, Vec<LeaseId>>,
    next_job: u128,
}

impl Concretizer {
    fn job(&self, job: &JobRef) -> JobId {
        match job {
            Some(index) if !self.submitted.is_empty() => *index.get(&self.submitted),
            _ => ghost_job(),
        }
    }

    fn lease(&self, table: &JobTable, job_id: JobId, lease: &LeaseRef) -> LeaseId {
        let current = table
            .get(&job_id)
            .and_then(|job| job.lease.as_ref())
            .map(|l| l.id);
        let earlier = self.leases_of.get(&job_id).filter(|list| !list.is_empty());
        match (lease, current, earlier) {
            (LeaseRef::Current, Some(id), _) => id,
            (LeaseRef::Earlier(index), _, Some(list)) => *index.get(list),
            (LeaseRef::Pool(i), _, _) => pool_lease(*i),
            // Nothing to point at: fall back to the pool (deterministically).
            (_, _, _) => pool_lease(job_id.0.as_u128() as usize),
        }
    }

    fn command(&mut self, table: &JobTable, op: &Op) -> Command {
        match op {
            Op::Submit {
                spec: choice,
                max_attempts,
                key,
                limit,
                wait,
                after,
                any_outcome,
            } => {
                // The leader never proposes one job id twice; it sends each job waited for
                // once (one may be unknown: a ghost).
                let mut after: Vec<JobId> = after.iter().map(|job| self.job(job)).collect();
                after.sort();
                after.dedup();
                let after_any_outcome = *any_outcome && !after.is_empty();
                self.next_job += 1;
                let job_id = JobId(uuid::Uuid::from_u128(self.next_job));
                self.submitted.push(job_id);
                Command::Submit {
                    timeout_millis: None,
                    partitions: Vec::new(),
                    partitions_asked: None,
                    job_id,
                    task: spec(*choice),
                    max_attempts: *max_attempts,
                    idempotency_key: key.map(|k| KEYS[k].to_owned()),
                    max_active_jobs: *limit,
                    submitted_by: None,
                    fairness_key: None,
                    priority: 0,
                    queue: herder_core::queues::default_queue(),
                    run_at: wait.map(|ms| UnixMillis(stamp(table.applied_index()).0 + ms)),
                    after,
                    after_any_outcome,
                    retry_of: None,
                }
            }
            Op::Due { jobs } => Command::Due {
                job_ids: jobs.iter().map(|job| self.job(job)).collect(),
            },
            Op::Assign {
                job,
                lease,
                worker,
                incarnation,
            } => {
                let job_id = self.job(job);
                let lease = Lease {
                    id: pool_lease(*lease),
                    worker: WorkerId(WORKERS[*worker].to_owned()),
                    incarnation: Incarnation(*incarnation),
                };
                self.leases_of.entry(job_id).or_default().push(lease.id);
                Command::Assign {
                    job_id,
                    lease,
                    as_of: LogIndex(0),
                }
            }
            Op::Complete {
                job,
                lease,
                output: choice,
            } => {
                let job_id = self.job(job);
                Command::Complete {
                    job_id,
                    lease_id: self.lease(table, job_id, lease),
                    output: output(*choice),
                }
            }
            Op::AttemptFailed {
                job,
                lease,
                delay,
                permanent,
            } => {
                let job_id = self.job(job);
                Command::AttemptFailed {
                    permanent: *permanent,
                    job_id,
                    lease_id: self.lease(table, job_id, lease),
                    cause: "task failed".to_owned(),
                    retry_delay_millis: *delay,
                    kind: Default::default(),
                }
            }
            Op::Release { job, lease } => {
                let job_id = self.job(job);
                Command::Release {
                    job_id,
                    lease_id: self.lease(table, job_id, lease),
                }
            }
            Op::Requeue { job } => Command::Requeue {
                job_id: self.job(job),
            },
            Op::Cancel { job } => Command::Cancel {
                job_id: self.job(job),
            },
            Op::Abandon { job, lease } => {
                let job_id = self.job(job);
                Command::Abandon {
                    job_id,
                    lease_id: self.lease(table, job_id, lease),
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Observations of a table
// ---------------------------------------------------------------------------------------------

fn rows(table: &JobTable) -> BTreeMap<JobId, Job> {
    table.jobs().map(|job| (job.id, job.clone())).collect()
}

/// Everything observable about a table through its public API.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Snapshot {
    rows: BTreeMap<JobId, Job>,
    queues: Vec<herder_core::queues::QueueState>,
    key_buckets: Vec<herder_core::queues::KeyBucket>,
    active: u64,
    applied: LogIndex,
    queued: Vec<JobId>,
    newest_first: Vec<JobId>,
    len: usize,
}

fn snapshot(table: &JobTable) -> Snapshot {
    Snapshot {
        rows: rows(table),
        queues: table.queues().cloned().collect(),
        key_buckets: table.key_bucket_rows().collect(),
        active: table.active_jobs(),
        applied: table.applied_index(),
        queued: table.queued().collect(),
        newest_first: table.newest_first().map(|job| job.id).collect(),
        len: table.len(),
    }
}

fn lease_of(command: &Command) -> Option<LeaseId> {
    match command {
        Command::Complete { lease_id, .. }
        | Command::AttemptFailed { lease_id, .. }
        | Command::Release { lease_id, .. }
        | Command::Abandon { lease_id, .. } => Some(*lease_id),
        _ => None,
    }
}

/// The invariants that hold of any single table state.
fn check_state(table: &JobTable) -> Result<(), TestCaseError> {
    if let Err(violation) = table.check_invariants() {
        return Err(TestCaseError::fail(format!(
            "check_invariants: {violation}"
        )));
    }
    let non_terminal = table.jobs().filter(|job| !job.state.is_terminal()).count() as u64;
    prop_assert_eq!(
        table.active_jobs(),
        non_terminal,
        "invariant 6: admission counter"
    );
    let mut keys: BTreeMap<herder_core::table::ScopedKey, Vec<JobId>> = BTreeMap::new();
    for job in table.jobs() {
        prop_assert!(
            job.attempt.0 <= job.max_attempts,
            "invariant 4: job {} at attempt {} of {}",
            job.id,
            job.attempt,
            job.max_attempts
        );
        prop_assert_eq!(job.state == JobState::Running, job.lease.is_some());
        prop_assert_eq!(job.state == JobState::Completed, job.result.is_some());
        if let Some(key) = herder_core::table::ScopedKey::of(job) {
            keys.entry(key).or_default().push(job.id);
        }
    }
    for (key, jobs) in keys {
        prop_assert_eq!(jobs.len(), 1, "invariant 5: key {:?} names {:?}", key, jobs);
        let job = table.get(&jobs[0]).expect("listed job exists");
        let asked = herder_core::table::SubmitOptions {
            task: &job.task,
            max_attempts: job.max_attempts,
            partitions_asked: job.partitions_asked,
            timeout_millis: job.timeout_millis,
            fairness_key: job.fairness_key.as_deref(),
            priority: job.priority,
            queue: &job.queue,
        };
        prop_assert_eq!(table.check_idempotency(&key, &asked), Some(Ok(job.id)));
    }
    // The queue lists exactly the QUEUED jobs, each once, in ascending queue position.
    let queued: Vec<JobId> = table.queued().collect();
    let queued_set: BTreeSet<JobId> = queued.iter().copied().collect();
    prop_assert_eq!(queued.len(), queued_set.len());
    let expected: BTreeSet<JobId> = table
        .jobs()
        .filter(|job| job.state == JobState::Queued)
        .map(|job| job.id)
        .collect();
    prop_assert_eq!(&queued_set, &expected);
    let seqs: Vec<u64> = queued
        .iter()
        .map(|id| table.get(id).expect("queued job exists").queue_seq)
        .collect();
    prop_assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "queue out of order: {:?}",
        seqs
    );
    Ok(())
}

/// What must hold of one apply, given the table before and after it.
fn check_step(
    before: &Snapshot,
    command: &Command,
    outcome: &Outcome,
    after: &JobTable,
) -> Result<(), TestCaseError> {
    let applied = &outcome.applied;
    let after_rows = rows(after);
    let Some(job_id) = command.job_id() else {
        return Ok(()); // Only a leader's no-op names no job, and the generator makes none.
    };

    // Invariant 2: terminal rows are frozen (state, result and everything else).
    for (id, old) in &before.rows {
        let new = after_rows
            .get(id)
            .ok_or_else(|| TestCaseError::fail(format!("job {id} disappeared")))?;
        if old.state.is_terminal() {
            prop_assert_eq!(new, old, "a terminal job changed");
        }
        if old.state == JobState::Cancelled {
            prop_assert_ne!(new.state, JobState::Completed);
        }
        if old.state == JobState::Completed {
            prop_assert_eq!(&new.result, &old.result);
        }
        // Attempts only count up, by at most one per command; only a release of the current
        // attempt gives one back.
        if matches!(applied, Applied::Released { job_id, .. } if job_id == id) {
            prop_assert_eq!(new.attempt.0 + 1, old.attempt.0);
        } else {
            prop_assert!(new.attempt >= old.attempt);
        }
        prop_assert!(new.attempt.0 <= old.attempt.0 + 1);
        // Identity never changes.
        prop_assert_eq!(&new.task, &old.task);
        prop_assert_eq!(new.max_attempts, old.max_attempts);
        prop_assert_eq!(&new.idempotency_key, &old.idempotency_key);
        prop_assert_eq!(new.submitted_at, old.submitted_at);
        if let (Some(old_result), true) = (&old.result, new.result.is_some()) {
            prop_assert_eq!(Some(old_result), new.result.as_ref());
        }
    }

    // Only the rows the outcome names may change (persistence writes just those), and at most
    // one new row appears, for a `Submitted`. Besides the job the command names, that is the
    // job whose turn a start out of turn order handed over.
    let named: BTreeSet<JobId> = outcome.changed_jobs().collect();
    for (id, new) in &after_rows {
        let changed = before.rows.get(id) != Some(new);
        if changed {
            prop_assert!(
                named.contains(id),
                "row {} changed but {:?} does not say so",
                id,
                outcome
            );
            let retagged = outcome
                .follow_on
                .iter()
                .any(|f| matches!(f, Applied::Retagged { job_id } if job_id == id));
            if applied.changed_job() != Some(*id) && retagged {
                let assigned = matches!(applied, Applied::Assigned { .. });
                prop_assert!(assigned, "only a start hands a turn over");
                prop_assert_ne!(new.turn, before.rows[id].turn);
                let mut unturned = new.clone();
                unturned.turn = before.rows[id].turn;
                prop_assert_eq!(&unturned, &before.rows[id], "only its turn changed");
            } else if applied.changed_job() != Some(*id) {
                // Otherwise a job the entry queued (its time came) or judged (a job it waited
                // for ended, or it was just created waiting).
                let old_state = before.rows.get(id).map(|old| old.state);
                prop_assert!(
                    matches!(
                        old_state,
                        Some(JobState::Blocked | JobState::Scheduled) | None
                    ),
                    "row {} changed from {:?} as a follow-on of {:?}",
                    id,
                    old_state,
                    outcome
                );
            }
        }
    }
    if applied.changed_job().is_none() {
        prop_assert_eq!(&after_rows, &before.rows, "{:?} changed rows", applied);
        prop_assert_eq!(after.active_jobs(), before.active);
        prop_assert_eq!(&after.queued().collect::<Vec<_>>(), &before.queued);
    }

    // Invariant 3: a lease-carrying command counts only with the job's current lease.
    if let Some(lease_id) = lease_of(command) {
        let old = before.rows.get(&job_id);
        let current = old
            .filter(|job| job.state == JobState::Running)
            .and_then(|job| job.lease.as_ref())
            .is_some_and(|lease| lease.id == lease_id);
        if current {
            prop_assert!(
                !matches!(applied, Applied::Stale { .. }),
                "a current lease was refused: {:?}",
                applied
            );
            let old = old.expect("current implies the job exists");
            let new = &after_rows[&job_id];
            prop_assert!(new.lease.is_none(), "the settled lease is still held");
            match (command, applied) {
                (Command::Complete { output, .. }, Applied::Completed { .. }) => {
                    prop_assert_eq!(new.state, JobState::Completed);
                    prop_assert_eq!(new.result.as_ref(), Some(output));
                }
                (
                    Command::AttemptFailed {
                        permanent: false, ..
                    },
                    Applied::RetryScheduled { attempt, .. },
                ) => {
                    prop_assert!(old.attempt.0 < old.max_attempts);
                    prop_assert_eq!(*attempt, old.attempt);
                    prop_assert_eq!(new.state, JobState::RetryWait);
                }
                (
                    Command::AttemptFailed {
                        permanent: true, ..
                    },
                    Applied::FailedPermanently { .. },
                ) => {
                    // A permanent failure ends the job whatever attempts remain.
                    prop_assert_eq!(new.state, JobState::Failed);
                    prop_assert_eq!(new.attempt, old.attempt);
                }
                (Command::Release { .. }, Applied::Released { .. }) => {
                    // Handed back: queued last, and the attempt is not charged.
                    prop_assert_eq!(new.state, JobState::Queued);
                    prop_assert_eq!(new.attempt.0, old.attempt.0 - 1);
                    prop_assert_eq!(after.queued().last(), Some(job_id));
                }
                (Command::AttemptFailed { .. }, Applied::FailedPermanently { .. })
                | (Command::Abandon { .. }, Applied::FailedPermanently { .. }) => {
                    prop_assert_eq!(old.attempt.0, old.max_attempts, "failed with attempts left");
                    prop_assert_eq!(new.state, JobState::Failed);
                }
                (Command::Abandon { .. }, Applied::Requeued { .. }) => {
                    prop_assert!(old.attempt.0 < old.max_attempts);
                    prop_assert_eq!(new.state, JobState::Queued);
                    // The interrupted attempt still counts.
                    prop_assert_eq!(new.attempt, old.attempt);
                }
                other => {
                    return Err(TestCaseError::fail(format!(
                        "unexpected outcome for a current lease: {other:?}"
                    )))
                }
            }
        } else {
            match applied {
                Applied::Stale {
                    job_id: stale_job,
                    lease_id: stale_lease,
                    reason,
                } => {
                    prop_assert_eq!(*stale_job, job_id);
                    prop_assert_eq!(*stale_lease, lease_id);
                    let expected = match old {
                        None => StaleReason::UnknownJob,
                        Some(job) if job.state.is_terminal() => StaleReason::JobTerminal(job.state),
                        Some(_) => StaleReason::LeaseNotCurrent,
                    };
                    prop_assert_eq!(*reason, expected);
                }
                other => {
                    return Err(TestCaseError::fail(format!(
                        "a non-current lease {lease_id} was not refused as stale: {other:?}"
                    )))
                }
            }
            // And nothing at all changed.
            prop_assert_eq!(&snapshot(after).rows, &before.rows);
            prop_assert_eq!(after.active_jobs(), before.active);
            prop_assert_eq!(&after.queued().collect::<Vec<_>>(), &before.queued);
        }
    }

    // Per-command expectations computed from the table before.
    match command {
        Command::Submit {
            timeout_millis: _,
            job_id,
            task,
            max_attempts,
            idempotency_key,
            partitions: _,
            partitions_asked,
            max_active_jobs,
            run_at,
            after: waits_for,
            ..
        } => {
            let bound = idempotency_key.as_ref().and_then(|key| {
                before
                    .rows
                    .values()
                    .find(|job| job.idempotency_key.as_ref() == Some(key))
            });
            match (bound, applied) {
                (Some(existing), Applied::IdempotentReplay { job_id: replayed }) => {
                    prop_assert_eq!(*replayed, existing.id);
                    prop_assert!(existing.task == *task && existing.max_attempts == *max_attempts);
                    prop_assert!(
                        existing.partitions_asked.is_none()
                            || existing.partitions_asked == *partitions_asked
                    );
                }
                (Some(existing), Applied::IdempotencyConflict { existing: named }) => {
                    prop_assert_eq!(*named, existing.id);
                    prop_assert!(
                        existing.task != *task
                            || existing.max_attempts != *max_attempts
                            || (existing.partitions_asked.is_some()
                                && existing.partitions_asked != *partitions_asked)
                    );
                }
                (
                    None,
                    Applied::AdmissionRejected {
                        active_jobs,
                        max_active_jobs: limit,
                    },
                ) => {
                    prop_assert_eq!(*active_jobs, before.active);
                    prop_assert_eq!(limit, max_active_jobs);
                    prop_assert!(before.active >= *max_active_jobs);
                }
                (None, Applied::Submitted { job_id: created }) => {
                    prop_assert_eq!(created, job_id);
                    prop_assert!(before.active < *max_active_jobs, "admitted over the limit");
                    let job = &after_rows[job_id];
                    // A job waiting for one that ended badly, or for one unknown, is created
                    // and cancelled by the same entry.
                    let counted = u64::from(!job.state.is_terminal());
                    prop_assert_eq!(after.active_jobs(), before.active + counted);
                    prop_assert_eq!(job.attempt, Attempt(0));
                    if !waits_for.is_empty() {
                        prop_assert!(
                            matches!(
                                job.state,
                                JobState::Blocked
                                    | JobState::Queued
                                    | JobState::Scheduled
                                    | JobState::Cancelled
                            ),
                            "{:?}",
                            job.state
                        );
                    } else if run_at.is_some_and(|at| at > stamp(after.applied_index())) {
                        prop_assert_eq!(job.state, JobState::Scheduled);
                        prop_assert!(after.scheduled().any(|(_, id)| id == *job_id));
                        prop_assert!(after.queued().all(|id| id != *job_id));
                    } else {
                        prop_assert_eq!(job.state, JobState::Queued);
                        prop_assert_eq!(
                            after.queued().last(),
                            Some(*job_id),
                            "new jobs queue last"
                        );
                    }
                }
                other => {
                    return Err(TestCaseError::fail(format!(
                        "unexpected submit outcome {other:?}"
                    )))
                }
            }
        }
        Command::Assign { job_id, lease, .. } => {
            let eligible = before.rows.get(job_id).is_some_and(|job| {
                job.state == JobState::Queued && job.attempt.0 < job.max_attempts
            });
            if eligible {
                let old = &before.rows[job_id];
                let new = &after_rows[job_id];
                prop_assert!(
                    matches!(applied, Applied::Assigned { attempt, .. } if attempt.0 == old.attempt.0 + 1),
                    "{:?}",
                    applied
                );
                prop_assert_eq!(new.state, JobState::Running);
                prop_assert_eq!(new.lease.as_ref(), Some(lease));
                prop_assert_eq!(new.last_worker.as_ref(), Some(&lease.worker));
            } else {
                prop_assert!(
                    matches!(
                        applied,
                        Applied::AssignSkipped { .. } | Applied::UnknownJob { .. }
                    ),
                    "{:?}",
                    applied
                );
            }
        }
        Command::Requeue { job_id } => {
            let waiting = before
                .rows
                .get(job_id)
                .is_some_and(|job| job.state == JobState::RetryWait);
            if waiting {
                prop_assert!(matches!(applied, Applied::Requeued { .. }), "{:?}", applied);
                prop_assert_eq!(after_rows[job_id].state, JobState::Queued);
                prop_assert_eq!(after.queued().last(), Some(*job_id));
            } else {
                prop_assert!(
                    matches!(
                        applied,
                        Applied::RequeueSkipped { .. } | Applied::UnknownJob { .. }
                    ),
                    "{:?}",
                    applied
                );
            }
        }
        Command::Cancel { job_id } => match before.rows.get(job_id) {
            None => prop_assert!(
                matches!(applied, Applied::UnknownJob { .. }),
                "{:?}",
                applied
            ),
            Some(old) if old.state.is_terminal() => {
                prop_assert!(
                    matches!(applied, Applied::CancelTooLate { .. }),
                    "{:?}",
                    applied
                )
            }
            Some(old) => {
                prop_assert_eq!(
                    applied,
                    &Applied::Cancelled {
                        job_id: *job_id,
                        previous: old.state,
                        revoked: old.lease.clone(),
                    }
                );
                prop_assert_eq!(after_rows[job_id].state, JobState::Cancelled);
                // The jobs waiting for it may be cancelled with it (the count is checked below).
                prop_assert!(after.active_jobs() < before.active);
            }
        },
        Command::Due { job_ids } => {
            // Exactly the named jobs waiting for a time this entry's stamp reached are queued,
            // and never one whose time is still ahead.
            let now = stamp(after.applied_index());
            for job_id in job_ids {
                let Some(old) = before.rows.get(job_id) else {
                    continue;
                };
                let new = &after_rows[job_id];
                if old.state == JobState::Scheduled && old.run_at.is_some_and(|at| at <= now) {
                    prop_assert_eq!(new.state, JobState::Queued);
                    prop_assert!(after.scheduled().all(|(_, id)| id != *job_id));
                } else {
                    prop_assert_eq!(new.state, old.state, "a job not due was moved");
                }
            }
        }
        Command::Complete { .. }
        | Command::AttemptFailed { .. }
        | Command::Release { .. }
        | Command::Abandon { .. }
        | Command::NewLeader { .. }
        | Command::SetQueue { .. }
        | Command::Purge { .. } => {}
    }

    // Terminal transitions free exactly one admission slot each; nothing else changes the count
    // except a new job (which may end in the entry that created it).
    let newly_terminal = after_rows
        .values()
        .filter(|job| job.state.is_terminal())
        .filter(|job| {
            before
                .rows
                .get(&job.id)
                .is_none_or(|old| !old.state.is_terminal())
        })
        .count() as u64;
    let created = (after_rows.len() - before.rows.len()) as u64;
    prop_assert_eq!(
        after.active_jobs() + newly_terminal,
        before.active + created
    );
    Ok(())
}

/// Applies `log` to a fresh table (`start` = rows restored at `applied`, or empty).
fn replay(start: JobTable, log: &[Command]) -> (JobTable, Vec<Applied>) {
    let mut table = start;
    let mut outcomes = Vec::with_capacity(log.len());
    for command in log {
        let index = table.applied_index().next();
        outcomes.push(table.apply(index, stamp(index), command).applied);
    }
    (table, outcomes)
}

/// The command log a run produced, the outcome of each command, and the table's snapshot before
/// the first command and after each one.
type Run = (Vec<Command>, Vec<Applied>, Vec<Snapshot>);

/// Runs `ops` against a table, checking everything after every step.
fn run(ops: &[Op]) -> Result<Run, TestCaseError> {
    let mut table = JobTable::new();
    let mut concretizer = Concretizer::default();
    let mut log = Vec::new();
    let mut outcomes = Vec::new();
    let mut snapshots = vec![snapshot(&table)];
    for op in ops {
        let command = concretizer.command(&table, op);
        let before = snapshot(&table);
        let index = table.applied_index().next();
        let outcome = table.apply(index, stamp(index), &command);
        prop_assert_eq!(table.applied_index(), index);
        check_state(&table)?;
        check_step(&before, &command, &outcome, &table)?;
        let applied = outcome.applied;

        // Recovery: the persisted rows rebuild the same table.
        let restored = JobTable::from_rows(table.to_rows(), index).map_err(|error| {
            TestCaseError::fail(format!("from_rows refused live rows: {error}"))
        })?;
        check_state(&restored)?;
        prop_assert_eq!(snapshot(&restored), snapshot(&table));

        log.push(command);
        outcomes.push(applied);
        snapshots.push(snapshot(&table));
    }
    Ok((log, outcomes, snapshots))
}

fn ops(max_len: usize) -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 1..max_len)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1500))]

    /// Invariants 2 to 6 after every apply, and recovery from the rows at every step.
    #[test]
    fn every_apply_keeps_the_table_invariants(ops in ops(80)) {
        run(&ops)?;
    }

    /// Invariant 8: the same log gives the same table, step by step, with the same outcomes.
    #[test]
    fn replaying_the_log_reproduces_every_row(ops in ops(80)) {
        let (log, outcomes, snapshots) = run(&ops)?;
        let (replayed, replayed_outcomes) = replay(JobTable::new(), &log);
        prop_assert_eq!(&replayed_outcomes, &outcomes);
        prop_assert_eq!(snapshot(&replayed), snapshots.last().cloned().expect("one snapshot at least"));
        // Every prefix too.
        let mut table = JobTable::new();
        for (i, command) in log.iter().enumerate() {
            let index = table.applied_index().next();
            table.apply(index, stamp(index), command);
            prop_assert_eq!(&snapshot(&table), &snapshots[i + 1]);
        }
    }

    /// Restoring from the rows at any point and applying the rest of the log lands on exactly
    /// the table the uninterrupted run reached, with the same outcomes on the way.
    #[test]
    fn recovering_mid_log_and_continuing_matches_the_straight_run(ops in ops(60), cut in any::<Index>()) {
        let (log, outcomes, snapshots) = run(&ops)?;
        let at = cut.index(log.len() + 1);
        let rows_at = TableRows {
            jobs: snapshots[at].rows.values().cloned().collect(),
            queues: snapshots[at].queues.clone(),
            key_buckets: snapshots[at].key_buckets.clone(),
        };
        let restored = JobTable::from_rows(rows_at, LogIndex(at as u64))
            .map_err(|error| TestCaseError::fail(format!("from_rows: {error}")))?;
        prop_assert_eq!(restored.active_jobs(), snapshots[at].active);
        let (continued, continued_outcomes) = replay(restored, &log[at..]);
        prop_assert_eq!(&continued_outcomes[..], &outcomes[at..]);
        prop_assert_eq!(snapshot(&continued), snapshots.last().cloned().expect("one snapshot at least"));
    }
}

// ---------------------------------------------------------------------------------------------
// A few fixed sequences the generator should reach, pinned so they stay covered
// ---------------------------------------------------------------------------------------------

fn submit(id: u128, key: Option<&str>, max_attempts: u32, limit: u64) -> Command {
    Command::Submit {
        timeout_millis: None,
        partitions: Vec::new(),
        partitions_asked: None,
        job_id: JobId(uuid::Uuid::from_u128(id)),
        task: spec(0),
        max_attempts,
        idempotency_key: key.map(str::to_owned),
        max_active_jobs: limit,
        submitted_by: None,
        fairness_key: None,
        priority: 0,
        queue: herder_core::queues::default_queue(),
        run_at: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    }
}

fn assign(id: u128, lease: usize) -> Command {
    Command::Assign {
        job_id: JobId(uuid::Uuid::from_u128(id)),
        lease: Lease {
            id: pool_lease(lease),
            worker: WorkerId("w1".into()),
            incarnation: Incarnation(1),
        },
        as_of: herder_core::ids::LogIndex(0),
    }
}

fn apply_all(table: &mut JobTable, log: &[Command]) -> Vec<Applied> {
    log.iter()
        .map(|command| {
            let index = table.applied_index().next();
            let applied = table.apply(index, stamp(index), command).applied;
            table.check_invariants().expect("invariants hold");
            applied
        })
        .collect()
}

#[test]
fn a_result_for_the_previous_attempt_is_stale_after_a_retry() {
    let job = JobId(uuid::Uuid::from_u128(1));
    let mut table = JobTable::new();
    apply_all(
        &mut table,
        &[
            submit(1, None, 3, 5),
            assign(1, 0),
            Command::AttemptFailed {
                permanent: false,
                job_id: job,
                lease_id: pool_lease(0),
                cause: "boom".into(),
                retry_delay_millis: 10,
                kind: Default::default(),
            },
            Command::Requeue { job_id: job },
            assign(1, 1),
        ],
    );
    let before = rows(&table);
    let outcome = apply_all(
        &mut table,
        &[Command::Complete {
            job_id: job,
            lease_id: pool_lease(0),
            output: output(0),
        }],
    );
    assert_eq!(
        outcome,
        vec![Applied::Stale {
            job_id: job,
            lease_id: pool_lease(0),
            reason: StaleReason::LeaseNotCurrent,
        }]
    );
    assert_eq!(rows(&table), before);
    assert_eq!(table.get(&job).map(|j| j.attempt), Some(Attempt(2)));
}

#[test]
fn a_replayed_key_does_not_consume_an_admission_slot_and_a_conflict_changes_nothing() {
    let mut table = JobTable::new();
    let outcomes = apply_all(
        &mut table,
        &[
            submit(1, Some("k"), 3, 1),
            // Full (limit 1), but the key is known with the same spec: replay, not rejection.
            submit(2, Some("k"), 3, 1),
            // Same key, different max_attempts: conflict.
            submit(3, Some("k"), 2, 1),
            // A new key while full: rejected.
            submit(4, Some("other"), 3, 1),
        ],
    );
    let first = JobId(uuid::Uuid::from_u128(1));
    assert_eq!(
        outcomes,
        vec![
            Applied::Submitted { job_id: first },
            Applied::IdempotentReplay { job_id: first },
            Applied::IdempotencyConflict { existing: first },
            Applied::AdmissionRejected {
                active_jobs: 1,
                max_active_jobs: 1
            },
        ]
    );
    assert_eq!(table.len(), 1);
}

/// Guards against a generator that silently stops reaching the interesting cases: across a fixed
/// set of generated logs, every kind of `Applied` outcome (and each kind of stale reason) occurs.
#[test]
fn the_generator_reaches_every_outcome() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for _ in 0..200 {
        let ops = ops(80)
            .new_tree(&mut runner)
            .expect("strategy generates")
            .current();
        let (_, outcomes, _) = run(&ops).expect("the properties hold");
        for applied in outcomes {
            let name = match &applied {
                Applied::Stale { reason, .. } => format!("Stale/{reason:?}"),
                other => format!("{other:?}"),
            };
            let name = name
                .split(['{', '('])
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned();
            seen.insert(name);
        }
    }
    let wanted = [
        "Submitted",
        "IdempotentReplay",
        "IdempotencyConflict",
        "AdmissionRejected",
        "Assigned",
        "AssignSkipped",
        "Completed",
        "RetryScheduled",
        "FailedPermanently",
        "Requeued",
        "Cancelled",
        "CancelTooLate",
        "Stale/JobTerminal",
        "Stale/LeaseNotCurrent",
        "Stale/UnknownJob",
        "RequeueSkipped",
        "UnknownJob",
        "DueChecked",
    ];
    let missing: Vec<&str> = wanted
        .iter()
        .copied()
        .filter(|name| !seen.contains(*name))
        .collect();
    assert!(
        missing.is_empty(),
        "never reached: {missing:?} (saw {seen:?})"
    );
}
