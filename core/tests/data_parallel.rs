//! Data-parallel jobs (PROTOCOL.md section 8.12), through the public API.
//!
//! The first half drives `JobTable::apply` with hand-written commands: one `Submit` creates a
//! parent and its partitions, the parent completes with the aggregate when the last partition
//! completes, fails (cancelling the rest) when one fails for good, and is cancelled with all its
//! unfinished partitions. The second half drives a real `Coordinator` with explicit time and a
//! disk that keeps what it is told to persist: the partition count (`auto` and explicit), the
//! spread over workers, the refusals, the cancel fan-out after durability, and `STATUS`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::json;

use herder_core::command::Command;
use herder_core::coordinator::{Coordinator, CoordinatorConfig, Output};
use herder_core::ids::{
    Attempt, ConnectionId, Incarnation, JobId, LeaseId, LogIndex, RequestId, Term, WorkerId,
};
use herder_core::job::{Job, JobState, Lease, PartitionOf};
use herder_core::limits::{
    ATTEMPT_ERROR_BYTES_MAX, PRIME_SUM_SIEVE_ONLY_END, PRIME_SUM_SPAN_MAX_HIGH,
};
use herder_core::protocol::{
    AttemptOutcome, CancelReason, ClientReply, ClientRequest, CoordinatorToWorker, ErrorCode,
    JobView, Partitions, WorkerToCoordinator,
};
use herder_core::storage::TableRows;
use herder_core::table::{Applied, JobTable, Outcome, StaleReason, TableError};
use herder_core::tasks::{aggregate, execute, TaskError, TaskOutput, TaskSpec};
use herder_core::testing::Driver;

// =============================================================================================
// JobTable level
// =============================================================================================

fn job_id(n: u128) -> JobId {
    JobId(uuid::Uuid::from_u128(0x10b_0000 + n))
}

/// `k` partition ids, distinct from each other and from every `job_id(n)` with small `n`.
fn partition_ids(parent: u128, k: u128) -> Vec<JobId> {
    (0..k)
        .map(|i| {
            JobId(uuid::Uuid::from_u128(
                0x9a27_0000_0000 + parent * 0x1000 + i,
            ))
        })
        .collect()
}

fn lease(n: u128, worker: &str) -> Lease {
    Lease {
        id: LeaseId(uuid::Uuid::from_u128(0x1ea5_e000_0000 + n)),
        worker: WorkerId(worker.to_owned()),
        incarnation: Incarnation(1),
    }
}

fn prime_sum(start: i64, end: i64) -> TaskSpec {
    TaskSpec::PrimeSum { start, end }
}

/// A job table that applies commands at consecutive log indices and checks every invariant the
/// table promises after each one.
struct Table {
    t: JobTable,
    next: u64,
}

impl Table {
    fn new() -> Table {
        Table {
            t: JobTable::new(),
            next: 0,
        }
    }

    fn apply(&mut self, command: Command) -> Outcome {
        self.next += 1;
        let outcome = self.t.apply(
            LogIndex(self.next),
            herder_core::time::UnixMillis::UNSTAMPED,
            &command,
        );
        if let Err(violation) = self.t.check_invariants() {
            panic!("invariant broken after {command:?}: {violation}");
        }
        assert_eq!(
            self.t.active_jobs(),
            self.t.jobs().filter(|j| !j.state.is_terminal()).count() as u64,
            "the admission counter equals the number of non-terminal jobs"
        );
        outcome
    }

    fn submit(
        &mut self,
        job: JobId,
        task: TaskSpec,
        partitions: &[JobId],
        max_attempts: u32,
        max_active_jobs: u64,
    ) -> Outcome {
        self.apply(Command::Submit {
            timeout_millis: None,
            job_id: job,
            task,
            max_attempts,
            idempotency_key: None,
            max_active_jobs,
            partitions: partitions.to_vec(),
            partitions_asked: Some(Partitions::Count(partitions.len() as u32)),
            submitted_by: None,
            fairness_key: None,
            priority: 0,
            queue: herder_core::queues::default_queue(),
            run_at: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        })
    }

    fn assign(&mut self, job: JobId, lease: &Lease) -> Outcome {
        self.apply(Command::Assign {
            job_id: job,
            lease: lease.clone(),
            as_of: herder_core::ids::LogIndex(0),
        })
    }

    fn complete(&mut self, job: JobId, lease: &Lease, output: TaskOutput) -> Outcome {
        self.apply(Command::Complete {
            job_id: job,
            lease_id: lease.id,
            output,
        })
    }

    /// Assigns `job` under `lease` and completes it with the output its own task computes.
    fn run_to_completion(&mut self, job: JobId, lease: &Lease) -> Outcome {
        let assigned = self.assign(job, lease);
        assert!(
            matches!(assigned.applied, Applied::Assigned { .. }),
            "{assigned:?}"
        );
        let task = self.get(job).task.clone();
        let output = execute(&task, Attempt(1)).expect("the partition's task runs");
        self.complete(job, lease, output)
    }

    fn get(&self, job: JobId) -> &Job {
        self.t.get(&job).expect("the job exists")
    }

    /// Everything observable about the table, to check that a refused command changed nothing.
    fn snapshot(&self) -> (Vec<Job>, u64, Vec<JobId>, Vec<JobId>) {
        (
            self.t.jobs().cloned().collect(),
            self.t.active_jobs(),
            self.t.queued().collect(),
            self.t.newest_first().map(|j| j.id).collect(),
        )
    }
}

/// The ids of the jobs each `PartitionCreated` follow-on names, with their parent and index.
fn created(outcome: &Outcome) -> Vec<(JobId, JobId, u32)> {
    outcome
        .follow_on
        .iter()
        .filter_map(|a| match a {
            Applied::PartitionCreated {
                job_id,
                parent,
                index,
            } => Some((*job_id, *parent, *index)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_submit_creates_a_running_parent_and_queued_partitions() {
    let mut t = Table::new();
    // Something already active, so the admission counter is seen to grow by 1 + k.
    let other = job_id(99);
    t.submit(other, TaskSpec::Sleep { milliseconds: 5 }, &[], 2, 100);
    assert_eq!(t.t.active_jobs(), 1);

    let parent = job_id(1);
    let task = prime_sum(1, 100_000);
    let k = 3;
    let parts = partition_ids(1, k);
    let outcome = t.submit(parent, task.clone(), &parts, 4, 100);

    assert_eq!(outcome.applied, Applied::Submitted { job_id: parent });
    let expected: Vec<(JobId, JobId, u32)> = parts
        .iter()
        .enumerate()
        .map(|(i, id)| (*id, parent, i as u32))
        .collect();
    assert_eq!(created(&outcome), expected);
    assert_eq!(
        outcome.follow_on.len(),
        k as usize,
        "only PartitionCreated follow-ons: {outcome:?}"
    );
    let changed: BTreeSet<JobId> = outcome.changed_jobs().collect();
    let mut want: BTreeSet<JobId> = parts.iter().copied().collect();
    want.insert(parent);
    assert_eq!(
        changed, want,
        "the parent and every partition are persisted"
    );

    let p = t.get(parent);
    assert_eq!(p.state, JobState::Running);
    assert_eq!(p.attempt, Attempt(0));
    assert_eq!(p.lease, None);
    assert_eq!(p.result, None);
    assert_eq!(p.partition_of, None);
    assert_eq!(p.partitions, parts);
    assert_eq!(p.task, task);
    assert!(p.is_parent());

    let pieces = task.split(k as u32);
    assert_eq!(pieces.len(), k as usize);
    for (i, (id, piece)) in parts.iter().zip(&pieces).enumerate() {
        let part = t.get(*id);
        assert_eq!(part.state, JobState::Queued);
        assert_eq!(part.attempt, Attempt(0));
        assert_eq!(part.lease, None);
        assert_eq!(
            part.max_attempts, 4,
            "a partition has the parent's max_attempts"
        );
        assert_eq!(
            part.partition_of,
            Some(PartitionOf {
                parent,
                index: i as u32
            })
        );
        assert_eq!(&part.task, piece);
        assert!(part.partitions.is_empty());
        assert!(!part.is_parent());
    }
    // The pieces cover the range exactly once, in order.
    assert_eq!(
        pieces,
        vec![
            prime_sum(1, 33_334),
            prime_sum(33_335, 66_667),
            prime_sum(66_668, 100_000)
        ]
    );

    assert_eq!(t.t.active_jobs(), 1 + 1 + k as u64);
    // The partitions queue in order after the job submitted before; the parent never queues.
    let mut queued = vec![other];
    queued.extend(&parts);
    assert_eq!(t.t.queued().collect::<Vec<_>>(), queued);
    // Listing shows the parent and the ordinary job, never a partition.
    assert_eq!(
        t.t.newest_first().map(|j| j.id).collect::<Vec<_>>(),
        vec![parent, other]
    );
    t.t.check_invariants().expect("invariants hold");
}

#[test]
fn admission_counts_the_parent_and_every_partition() {
    let mut t = Table::new();
    let parts = partition_ids(1, 3);
    let before = t.snapshot();
    // 1 + 3 slots do not fit a limit of 3.
    let outcome = t.submit(job_id(1), prime_sum(1, 1_000), &parts, 3, 3);
    assert_eq!(
        outcome.applied,
        Applied::AdmissionRejected {
            active_jobs: 0,
            max_active_jobs: 3
        }
    );
    assert!(outcome.follow_on.is_empty());
    assert_eq!(outcome.changed_jobs().count(), 0);
    assert_eq!(
        t.snapshot(),
        before,
        "a rejected submission changes nothing"
    );

    // With one job already active, a limit of exactly 1 + 3 is one too small.
    t.submit(job_id(2), TaskSpec::Sleep { milliseconds: 1 }, &[], 1, 100);
    let before = t.snapshot();
    let outcome = t.submit(job_id(3), prime_sum(1, 1_000), &parts, 3, 4);
    assert_eq!(
        outcome.applied,
        Applied::AdmissionRejected {
            active_jobs: 1,
            max_active_jobs: 4
        }
    );
    assert_eq!(t.snapshot(), before);
    assert!(t.t.get(&job_id(3)).is_none());
    assert!(parts.iter().all(|p| t.t.get(p).is_none()));

    // Exactly enough room: accepted.
    let outcome = t.submit(job_id(4), prime_sum(1, 1_000), &parts, 3, 5);
    assert_eq!(outcome.applied, Applied::Submitted { job_id: job_id(4) });
    assert_eq!(t.t.active_jobs(), 5);
}

#[test]
fn partition_ids_that_do_not_match_the_split_are_refused() {
    let mut t = Table::new();
    t.submit(job_id(50), TaskSpec::Sleep { milliseconds: 1 }, &[], 1, 100);
    let cases: Vec<(TaskSpec, Vec<JobId>)> = vec![
        // Two numbers split into at most two pieces, not three.
        (
            TaskSpec::Max {
                numbers: vec![4, 7],
            },
            partition_ids(1, 3),
        ),
        // A non-empty list with no partition ids.
        (
            TaskSpec::PrimeCountList {
                numbers: vec![2, 3, 5],
            },
            Vec::new(),
        ),
        // A range of three numbers into four pieces.
        (prime_sum(10, 12), partition_ids(3, 4)),
        // An empty list has no pieces at all.
        (
            TaskSpec::PrimeCountList {
                numbers: Vec::new(),
            },
            partition_ids(4, 1),
        ),
        // A task that is not data-parallel takes no partitions.
        (TaskSpec::Sleep { milliseconds: 1 }, partition_ids(5, 1)),
    ];
    for (n, (task, parts)) in cases.into_iter().enumerate() {
        let before = t.snapshot();
        let id = job_id(100 + n as u128);
        let outcome = t.submit(id, task.clone(), &parts, 3, 100);
        match &outcome.applied {
            Applied::SubmitInvalid { job_id, reason } => {
                assert_eq!(*job_id, id);
                assert!(!reason.is_empty());
            }
            other => panic!(
                "{task:?} with {} ids: expected SubmitInvalid, got {other:?}",
                parts.len()
            ),
        }
        assert!(outcome.follow_on.is_empty());
        assert_eq!(outcome.changed_jobs().count(), 0);
        assert_eq!(
            t.snapshot(),
            before,
            "an invalid submission changes nothing"
        );
    }
}

#[test]
fn an_empty_prime_count_list_completes_at_once_with_zero() {
    let mut t = Table::new();
    let parent = job_id(1);
    let task = TaskSpec::PrimeCountList {
        numbers: Vec::new(),
    };
    let outcome = t.submit(parent, task.clone(), &[], 3, 100);
    assert_eq!(outcome.applied, Applied::Submitted { job_id: parent });
    assert_eq!(
        outcome.follow_on,
        vec![Applied::ParentCompleted { job_id: parent }]
    );
    let p = t.get(parent);
    assert_eq!(p.state, JobState::Completed);
    assert_eq!(p.result, Some(TaskOutput::PrimeCountList { count: 0 }));
    assert_eq!(
        p.result,
        Some(execute(&task, Attempt(1)).expect("runs")),
        "the same answer as running the whole task"
    );
    assert_eq!(p.error, None);
    assert_eq!(p.attempt, Attempt(0));
    assert!(p.partitions.is_empty());
    assert_eq!(t.t.active_jobs(), 0, "its slot is free again");
    assert_eq!(t.t.len(), 1);
    assert_eq!(t.t.queued().count(), 0);
    let view = t.t.view(&parent).expect("a view");
    let parts = view.partitions.expect("a parent lists its partitions");
    assert_eq!((parts.done, parts.total), (0, 0));
    assert!(parts.pieces.is_empty());
}

/// Submits `task` in `k` partitions, runs each to completion (in `order`), and checks the parent
/// completes with the sequential answer when, and only when, the last one does.
fn complete_all(task: TaskSpec, k: u128, order: &[usize]) -> (Table, JobId, Vec<JobId>) {
    let mut t = Table::new();
    let parent = job_id(1);
    let parts = partition_ids(1, k);
    t.submit(parent, task.clone(), &parts, 2, 100);
    assert_eq!(t.t.active_jobs(), 1 + k as u64);
    for (step, &i) in order.iter().enumerate() {
        let last = step + 1 == order.len();
        let outcome = t.run_to_completion(parts[i], &lease(i as u128, "w1"));
        assert_eq!(
            outcome.applied,
            Applied::Completed {
                job_id: parts[i],
                lease: lease(i as u128, "w1")
            }
        );
        if last {
            assert_eq!(
                outcome.follow_on,
                vec![Applied::ParentCompleted { job_id: parent }]
            );
            let changed: Vec<JobId> = outcome.changed_jobs().collect();
            assert_eq!(changed, vec![parts[i], parent], "both rows are persisted");
        } else {
            assert!(outcome.follow_on.is_empty(), "{outcome:?}");
            assert_eq!(t.get(parent).state, JobState::Running);
            assert_eq!(t.get(parent).result, None);
        }
    }
    let p = t.get(parent);
    assert_eq!(p.state, JobState::Completed);
    let whole = execute(&task, Attempt(1)).expect("the whole task runs");
    assert_eq!(
        p.result.as_ref(),
        Some(&whole),
        "aggregate == sequential answer"
    );
    let outputs: Vec<TaskOutput> = parts
        .iter()
        .map(|id| t.get(*id).result.clone().expect("a completed partition"))
        .collect();
    let refs: Vec<&TaskOutput> = outputs.iter().collect();
    assert_eq!(aggregate(&task, &refs), Ok(whole));
    assert_eq!(p.error, None);
    assert_eq!(p.lease, None);
    assert_eq!(p.attempt, Attempt(0));
    assert_eq!(t.t.active_jobs(), 0, "every slot is free");
    (t, parent, parts)
}

#[test]
fn completing_every_partition_completes_the_parent_with_the_aggregate() {
    // prime-sum over 1..=100000 in 3 pieces.
    let (mut t, parent, parts) = complete_all(prime_sum(1, 100_000), 3, &[0, 1, 2]);
    assert_eq!(
        t.get(parent).result,
        Some(TaskOutput::PrimeSum {
            count: 9592,
            sum: 454_396_537
        })
    );

    // A stale Complete for a partition (its lease is spent) changes nothing, and the parent's
    // result stays put.
    let before = t.snapshot();
    let outcome = t.complete(
        parts[1],
        &lease(1, "w1"),
        TaskOutput::PrimeSum { count: 1, sum: 1 },
    );
    assert_eq!(
        outcome.applied,
        Applied::Stale {
            job_id: parts[1],
            lease_id: lease(1, "w1").id,
            reason: StaleReason::JobTerminal(JobState::Completed)
        }
    );
    assert!(outcome.follow_on.is_empty());
    // Nor does one under a lease the partition never had, nor a cancel.
    let outcome = t.complete(
        parts[2],
        &lease(77, "w2"),
        TaskOutput::PrimeSum { count: 0, sum: 0 },
    );
    assert!(matches!(outcome.applied, Applied::Stale { .. }));
    let outcome = t.apply(Command::Cancel { job_id: parent });
    assert_eq!(
        outcome.applied,
        Applied::CancelTooLate {
            job_id: parent,
            state: JobState::Completed
        }
    );
    assert!(outcome.follow_on.is_empty());
    assert_eq!(t.snapshot(), before);
    assert_eq!(
        t.get(parent).result,
        Some(TaskOutput::PrimeSum {
            count: 9592,
            sum: 454_396_537
        })
    );
}

#[test]
fn max_and_prime_count_list_aggregate_in_any_completion_order() {
    let numbers: Vec<i64> = vec![
        -5, 17, 3, 999_983, 4, -1_000_000, 1_000_003, 8, 7919, 2, 1, 0, 42, 97, 1_000_002,
    ];
    let (t, parent, _) = complete_all(
        TaskSpec::Max {
            numbers: numbers.clone(),
        },
        4,
        &[3, 0, 2, 1],
    );
    assert_eq!(
        t.get(parent).result,
        Some(TaskOutput::Max { max: 1_000_003 })
    );

    let (t, parent, _) = complete_all(
        TaskSpec::PrimeCountList {
            numbers: numbers.clone(),
        },
        4,
        &[1, 3, 0, 2],
    );
    // 17, 3, 999983, 1000003, 7919, 2, 97.
    assert_eq!(
        t.get(parent).result,
        Some(TaskOutput::PrimeCountList { count: 7 })
    );

    // One partition per item, and a single partition.
    let (t, parent, _) = complete_all(
        TaskSpec::Max {
            numbers: vec![-3, -9, -1],
        },
        3,
        &[2, 1, 0],
    );
    assert_eq!(t.get(parent).result, Some(TaskOutput::Max { max: -1 }));
    let (t, parent, _) = complete_all(prime_sum(-10, 30), 1, &[0]);
    assert_eq!(
        t.get(parent).result,
        Some(TaskOutput::PrimeSum {
            count: 10,
            sum: 129
        })
    );
}

#[test]
fn a_partition_failing_for_good_fails_the_parent_and_cancels_the_rest() {
    let mut t = Table::new();
    let parent = job_id(1);
    let parts = partition_ids(1, 4);
    t.submit(parent, prime_sum(1, 4_000), &parts, 1, 100);
    // Partition 0 completes, 1 runs on w2, 2 runs on w3 and is about to fail, 3 stays queued.
    t.run_to_completion(parts[0], &lease(0, "w1"));
    t.assign(parts[1], &lease(1, "w2"));
    t.assign(parts[2], &lease(2, "w3"));
    assert_eq!(t.t.active_jobs(), 4);

    let outcome = t.apply(Command::AttemptFailed {
        permanent: false,
        job_id: parts[2],
        lease_id: lease(2, "w3").id,
        cause: "the worker ran out of memory".into(),
        retry_delay_millis: 10,
        kind: Default::default(),
    });
    assert_eq!(
        outcome.applied,
        Applied::FailedPermanently {
            job_id: parts[2],
            lease: lease(2, "w3"),
            error: "the worker ran out of memory".into()
        }
    );
    assert_eq!(outcome.follow_on.len(), 3, "{outcome:?}");
    let error = match &outcome.follow_on[0] {
        Applied::ParentFailed { job_id, error } => {
            assert_eq!(*job_id, parent);
            error.clone()
        }
        other => panic!("expected ParentFailed first, got {other:?}"),
    };
    assert!(error.contains("partition 2"), "{error}");
    assert!(error.contains(&parts[2].to_string()), "{error}");
    assert!(error.contains("the worker ran out of memory"), "{error}");
    // The running sibling's lease is revoked; the queued one had none; the completed one is
    // left alone.
    assert_eq!(
        outcome.follow_on[1..],
        [
            Applied::Cancelled {
                job_id: parts[1],
                previous: JobState::Running,
                revoked: Some(lease(1, "w2"))
            },
            Applied::Cancelled {
                job_id: parts[3],
                previous: JobState::Queued,
                revoked: None
            },
        ]
    );
    let changed: BTreeSet<JobId> = outcome.changed_jobs().collect();
    assert_eq!(
        changed,
        BTreeSet::from([parent, parts[1], parts[2], parts[3]])
    );

    let p = t.get(parent);
    assert_eq!(p.state, JobState::Failed);
    assert_eq!(p.error.as_deref(), Some(error.as_str()));
    assert_eq!(p.result, None);
    assert_eq!(t.get(parts[0]).state, JobState::Completed);
    assert_eq!(t.get(parts[1]).state, JobState::Cancelled);
    assert_eq!(t.get(parts[1]).lease, None);
    assert_eq!(t.get(parts[2]).state, JobState::Failed);
    assert_eq!(t.get(parts[3]).state, JobState::Cancelled);
    assert_eq!(t.t.active_jobs(), 0);
    assert_eq!(t.t.queued().count(), 0);

    // The revoked attempt's late result does not count.
    let before = t.snapshot();
    let outcome = t.complete(
        parts[1],
        &lease(1, "w2"),
        TaskOutput::PrimeSum { count: 0, sum: 0 },
    );
    assert_eq!(
        outcome.applied,
        Applied::Stale {
            job_id: parts[1],
            lease_id: lease(1, "w2").id,
            reason: StaleReason::JobTerminal(JobState::Cancelled)
        }
    );
    assert_eq!(t.snapshot(), before);
}

#[test]
fn a_retry_left_does_not_fail_the_parent() {
    let mut t = Table::new();
    let parent = job_id(1);
    let parts = partition_ids(1, 2);
    t.submit(parent, prime_sum(1, 100), &parts, 2, 100);
    t.assign(parts[0], &lease(0, "w1"));
    let outcome = t.apply(Command::AttemptFailed {
        permanent: false,
        job_id: parts[0],
        lease_id: lease(0, "w1").id,
        cause: "lost".into(),
        retry_delay_millis: 5,
        kind: Default::default(),
    });
    assert!(matches!(outcome.applied, Applied::RetryScheduled { .. }));
    assert!(outcome.follow_on.is_empty());
    assert_eq!(t.get(parent).state, JobState::Running);
    t.apply(Command::Requeue { job_id: parts[0] });
    // The second attempt completes; so does the other partition: the parent completes.
    t.assign(parts[0], &lease(10, "w2"));
    let output = execute(&t.get(parts[0]).task.clone(), Attempt(2)).expect("runs");
    t.complete(parts[0], &lease(10, "w2"), output);
    let outcome = t.run_to_completion(parts[1], &lease(1, "w1"));
    assert_eq!(
        outcome.follow_on,
        vec![Applied::ParentCompleted { job_id: parent }]
    );
    assert_eq!(
        t.get(parent).result,
        Some(TaskOutput::PrimeSum {
            count: 25,
            sum: 1060
        })
    );
    let view = t.t.view(&parent).expect("a view");
    let pieces = view.partitions.expect("partitions").pieces;
    assert_eq!(pieces[0].attempt, 2);
    assert_eq!(pieces[0].worker, Some(WorkerId("w2".into())));
}

#[test]
fn cancelling_the_parent_cancels_every_unfinished_partition() {
    let mut t = Table::new();
    let parent = job_id(1);
    let parts = partition_ids(1, 4);
    t.submit(parent, prime_sum(1, 4_000), &parts, 3, 100);
    // 0 completed, 1 running, 2 waiting to retry, 3 queued.
    t.run_to_completion(parts[0], &lease(0, "w1"));
    t.assign(parts[1], &lease(1, "w2"));
    t.assign(parts[2], &lease(2, "w3"));
    t.apply(Command::AttemptFailed {
        permanent: false,
        job_id: parts[2],
        lease_id: lease(2, "w3").id,
        cause: "lost".into(),
        retry_delay_millis: 100,
        kind: Default::default(),
    });
    assert_eq!(t.get(parts[2]).state, JobState::RetryWait);

    let outcome = t.apply(Command::Cancel { job_id: parent });
    assert_eq!(
        outcome.applied,
        Applied::Cancelled {
            job_id: parent,
            previous: JobState::Running,
            revoked: None
        }
    );
    assert_eq!(
        outcome.follow_on,
        vec![
            Applied::Cancelled {
                job_id: parts[1],
                previous: JobState::Running,
                revoked: Some(lease(1, "w2"))
            },
            Applied::Cancelled {
                job_id: parts[2],
                previous: JobState::RetryWait,
                revoked: None
            },
            Applied::Cancelled {
                job_id: parts[3],
                previous: JobState::Queued,
                revoked: None
            },
        ]
    );
    assert_eq!(t.get(parent).state, JobState::Cancelled);
    assert_eq!(t.get(parts[0]).state, JobState::Completed);
    for id in &parts[1..] {
        assert_eq!(t.get(*id).state, JobState::Cancelled);
    }
    assert_eq!(t.t.active_jobs(), 0);
    assert_eq!(t.t.queued().count(), 0);

    // Afterwards a cancel is too late, whichever job of the family it names; nothing changes.
    let before = t.snapshot();
    let outcome = t.apply(Command::Cancel { job_id: parent });
    assert_eq!(
        outcome.applied,
        Applied::CancelTooLate {
            job_id: parent,
            state: JobState::Cancelled
        }
    );
    assert!(outcome.follow_on.is_empty());
    let outcome = t.apply(Command::Cancel { job_id: parts[1] });
    assert!(
        matches!(outcome.applied, Applied::CancelTooLate { .. }),
        "{outcome:?}"
    );
    assert!(outcome.follow_on.is_empty());
    // The retry timer firing late, or the revoked attempt reporting, changes nothing either.
    let outcome = t.apply(Command::Requeue { job_id: parts[2] });
    assert_eq!(
        outcome.applied,
        Applied::RequeueSkipped { job_id: parts[2] }
    );
    let outcome = t.apply(Command::Assign {
        job_id: parts[3],
        lease: lease(3, "w1"),
        as_of: herder_core::ids::LogIndex(0),
    });
    assert!(matches!(outcome.applied, Applied::AssignSkipped { .. }));
    assert_eq!(t.snapshot(), before);
}

#[test]
fn a_cancel_naming_a_partition_cancels_its_whole_job() {
    let mut t = Table::new();
    let parent = job_id(1);
    let parts = partition_ids(1, 2);
    t.submit(parent, prime_sum(1, 100), &parts, 3, 100);
    t.assign(parts[0], &lease(0, "w1"));
    let outcome = t.apply(Command::Cancel { job_id: parts[1] });
    assert_eq!(
        outcome.applied,
        Applied::Cancelled {
            job_id: parent,
            previous: JobState::Running,
            revoked: None
        }
    );
    assert_eq!(
        outcome.follow_on,
        vec![
            Applied::Cancelled {
                job_id: parts[0],
                previous: JobState::Running,
                revoked: Some(lease(0, "w1"))
            },
            Applied::Cancelled {
                job_id: parts[1],
                previous: JobState::Queued,
                revoked: None
            },
        ]
    );
    assert_eq!(t.t.active_jobs(), 0);
}

/// Every job's view, by id.
fn views(table: &JobTable) -> BTreeMap<JobId, JobView> {
    table
        .jobs()
        .map(|j| (j.id, table.view(&j.id).expect("a listed job has a view")))
        .collect()
}

#[test]
fn from_rows_rebuilds_parents_and_partitions_exactly() {
    let mut t = Table::new();
    // A: running, one partition done, one running, one retrying, one queued.
    let a = job_id(1);
    let a_parts = partition_ids(1, 4);
    t.submit(a, prime_sum(1, 10_000), &a_parts, 3, 100);
    // B: completed.
    let b = job_id(2);
    let b_parts = partition_ids(2, 2);
    t.submit(
        b,
        TaskSpec::Max {
            numbers: vec![3, 1, 4, 1, 5],
        },
        &b_parts,
        3,
        100,
    );
    // C: cancelled.
    let c = job_id(3);
    let c_parts = partition_ids(3, 2);
    t.submit(
        c,
        TaskSpec::PrimeCountList {
            numbers: vec![2, 4, 6, 7],
        },
        &c_parts,
        3,
        100,
    );
    // An ordinary job, queued.
    let d = job_id(4);
    t.submit(d, TaskSpec::Sleep { milliseconds: 3 }, &[], 3, 100);

    t.run_to_completion(a_parts[0], &lease(10, "w1"));
    t.assign(a_parts[1], &lease(11, "w2"));
    t.assign(a_parts[2], &lease(12, "w3"));
    t.apply(Command::AttemptFailed {
        permanent: false,
        job_id: a_parts[2],
        lease_id: lease(12, "w3").id,
        cause: "task failed".into(),
        retry_delay_millis: 40,
        kind: Default::default(),
    });
    t.run_to_completion(b_parts[1], &lease(21, "w2"));
    t.run_to_completion(b_parts[0], &lease(20, "w1"));
    t.assign(c_parts[0], &lease(30, "w3"));
    t.apply(Command::Cancel { job_id: c });

    // The view of a running parent shows done/total and each piece's attempt and worker.
    let view = t.t.view(&a).expect("a view");
    assert_eq!(view.state, JobState::Running);
    assert_eq!(view.attempt, 0);
    assert_eq!(view.lease_id, None);
    assert_eq!(view.partition_of, None);
    let pv = view.partitions.expect("a parent lists its partitions");
    assert_eq!((pv.done, pv.total), (1, 4));
    let summary: Vec<(u32, JobId, JobState, u32, Option<&str>)> = pv
        .pieces
        .iter()
        .map(|p| {
            (
                p.index,
                p.job_id,
                p.state,
                p.attempt,
                p.worker.as_ref().map(|w| w.as_str()),
            )
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            (0, a_parts[0], JobState::Completed, 1, Some("w1")),
            (1, a_parts[1], JobState::Running, 1, Some("w2")),
            (2, a_parts[2], JobState::RetryWait, 1, Some("w3")),
            (3, a_parts[3], JobState::Queued, 0, None),
        ]
    );
    assert_eq!(
        pv.pieces[0].result,
        execute(&prime_sum(1, 2_500), Attempt(1)).ok()
    );
    assert_eq!(pv.pieces[1].result, None);
    // A partition's view names its parent and lists no partitions of its own.
    let part_view = t.t.view(&a_parts[1]).expect("a view");
    assert_eq!(
        part_view.partition_of,
        Some(PartitionOf {
            parent: a,
            index: 1
        })
    );
    assert_eq!(part_view.partitions, None);
    assert_eq!(part_view.lease_id, Some(lease(11, "w2").id));
    // An ordinary job lists none either.
    assert_eq!(t.t.view(&d).expect("a view").partitions, None);
    // The completed and the cancelled parents.
    let bv = t.t.view(&b).expect("a view");
    assert_eq!(bv.state, JobState::Completed);
    assert_eq!(bv.result, Some(TaskOutput::Max { max: 5 }));
    let bp = bv.partitions.expect("partitions");
    assert_eq!((bp.done, bp.total), (2, 2));
    let cv = t.t.view(&c).expect("a view");
    assert_eq!(cv.state, JobState::Cancelled);
    let cp = cv.partitions.expect("partitions");
    assert_eq!((cp.done, cp.total), (0, 2));

    // Rebuild from the rows, in either order (a parent and its partitions share a log index).
    let applied = t.t.applied_index();
    let mut rows: Vec<Job> = t.t.jobs().cloned().collect();
    for _ in 0..2 {
        rows.reverse();
        let rebuilt =
            JobTable::from_rows(TableRows::of_jobs(rows.clone()), applied).expect("the rows load");
        assert_eq!(
            rebuilt.newest_first().map(|j| j.id).collect::<Vec<_>>(),
            vec![d, c, b, a],
            "listing holds the parents and the ordinary job, no partition"
        );
        assert_eq!(views(&rebuilt), views(&t.t));
    }
    // Rows that break the links between a parent and its partitions are refused, not
    // half-loaded: a partition gone, or one that its parent does not list.
    let parent_of_b = rows.iter().find(|j| j.id == b).expect("b").clone();
    let without_a_partition: Vec<Job> = rows
        .iter()
        .filter(|j| j.id != parent_of_b.partitions[0])
        .cloned()
        .collect();
    assert!(matches!(
        JobTable::from_rows(TableRows::of_jobs(without_a_partition), applied),
        Err(TableError::InconsistentJob { job_id, .. }) if job_id == b
    ));
    let orphaned: Vec<Job> = rows.iter().filter(|j| j.id != b).cloned().collect();
    assert!(matches!(
        JobTable::from_rows(TableRows::of_jobs(orphaned), applied),
        Err(TableError::InconsistentJob { .. })
    ));
    // A queued job with no attempt left.
    let mut exhausted = rows.clone();
    let queued = exhausted
        .iter_mut()
        .find(|j| j.state == JobState::Queued && !j.is_parent())
        .expect("a queued job");
    queued.attempt = Attempt(queued.max_attempts);
    assert!(matches!(
        JobTable::from_rows(TableRows::of_jobs(exhausted), applied),
        Err(TableError::InconsistentJob { detail, .. }) if detail.contains("every attempt used")
    ));
    let rebuilt = JobTable::from_rows(TableRows::of_jobs(rows), applied).expect("the rows load");
    rebuilt
        .check_invariants()
        .expect("the rebuilt table is sound");
    assert_eq!(views(&rebuilt), views(&t.t));
    assert_eq!(rebuilt.len(), t.t.len());
    assert_eq!(rebuilt.active_jobs(), t.t.active_jobs());
    assert_eq!(rebuilt.applied_index(), applied);
    assert_eq!(
        rebuilt.queued().collect::<Vec<_>>(),
        t.t.queued().collect::<Vec<_>>()
    );
    assert_eq!(
        rebuilt.newest_first().map(|j| j.id).collect::<Vec<_>>(),
        vec![d, c, b, a],
        "listing holds the parents and the ordinary job, no partition"
    );
    assert_eq!(
        rebuilt.jobs().cloned().collect::<Vec<_>>(),
        t.t.jobs().cloned().collect::<Vec<_>>()
    );

    // And the rebuilt table goes on exactly like the original.
    let mut again = Table {
        t: rebuilt,
        next: t.next,
    };
    let rest = [
        Command::Requeue { job_id: a_parts[2] },
        Command::Assign {
            job_id: a_parts[3],
            lease: lease(13, "w1"),
            as_of: herder_core::ids::LogIndex(0),
        },
        Command::Complete {
            job_id: a_parts[3],
            lease_id: lease(13, "w1").id,
            output: execute(&t.get(a_parts[3]).task.clone(), Attempt(1)).expect("runs"),
        },
        Command::Assign {
            job_id: a_parts[2],
            lease: lease(14, "w3"),
            as_of: herder_core::ids::LogIndex(0),
        },
        Command::Complete {
            job_id: a_parts[2],
            lease_id: lease(14, "w3").id,
            output: execute(&t.get(a_parts[2]).task.clone(), Attempt(2)).expect("runs"),
        },
        Command::Complete {
            job_id: a_parts[1],
            lease_id: lease(11, "w2").id,
            output: execute(&t.get(a_parts[1]).task.clone(), Attempt(1)).expect("runs"),
        },
    ];
    for command in rest {
        assert_eq!(t.apply(command.clone()), again.apply(command));
    }
    assert_eq!(views(&again.t), views(&t.t));
    assert_eq!(t.get(a).state, JobState::Completed);
    assert_eq!(
        t.get(a).result,
        execute(&prime_sum(1, 10_000), Attempt(1)).ok()
    );
}

#[test]
fn a_wrong_kind_of_partition_output_fails_the_parent() {
    let mut t = Table::new();
    let parent = job_id(1);
    let parts = partition_ids(1, 3);
    t.submit(parent, prime_sum(1, 3_000), &parts, 3, 100);
    t.run_to_completion(parts[0], &lease(0, "w1"));
    t.run_to_completion(parts[2], &lease(2, "w1"));
    t.assign(parts[1], &lease(1, "w2"));
    // A confused worker reports a max output for a prime-sum partition. The partition itself
    // accepts it (apply does not recheck the kind), but the parent cannot combine it.
    let outcome = t.complete(parts[1], &lease(1, "w2"), TaskOutput::Max { max: 7 });
    assert!(matches!(outcome.applied, Applied::Completed { .. }));
    assert_eq!(outcome.follow_on.len(), 1, "{outcome:?}");
    match &outcome.follow_on[0] {
        Applied::ParentFailed { job_id, error } => {
            assert_eq!(*job_id, parent);
            assert!(!error.is_empty());
        }
        other => panic!("expected ParentFailed, got {other:?}"),
    }
    let p = t.get(parent);
    assert_eq!(p.state, JobState::Failed);
    assert_eq!(p.result, None);
    assert!(p.error.is_some());
    assert_eq!(t.t.active_jobs(), 0);
}

#[test]
fn partition_ids_must_be_distinct_from_each_other_and_from_the_parent() {
    // A Submit that names one id twice is a leader bug: apply must not silently build a
    // table whose counters disagree with its rows. It refuses (SubmitInvalid, nothing
    // changed); the test also tolerates a panic, and either way there is no broken table.
    let cases: Vec<(JobId, Vec<JobId>)> = vec![
        {
            let p = partition_ids(1, 1)[0];
            (job_id(1), vec![p, p])
        },
        (job_id(2), vec![partition_ids(2, 1)[0], job_id(2)]),
    ];
    for (parent, parts) in cases {
        let result = std::panic::catch_unwind(move || {
            let mut table = JobTable::new();
            let outcome = table.apply(
                LogIndex(1),
                herder_core::time::UnixMillis::UNSTAMPED,
                &Command::Submit {
                    timeout_millis: None,
                    job_id: parent,
                    task: prime_sum(1, 100),
                    max_attempts: 3,
                    idempotency_key: None,
                    max_active_jobs: 100,
                    partitions: parts,
                    partitions_asked: None,
                    submitted_by: None,
                    fairness_key: None,
                    priority: 0,
                    queue: herder_core::queues::default_queue(),
                    run_at: None,
                    retry_of: None,
                    after: Vec::new(),
                    after_any_outcome: false,
                },
            );
            (table, outcome)
        });
        if let Ok((table, outcome)) = result {
            assert!(
                matches!(outcome.applied, Applied::SubmitInvalid { .. }),
                "duplicate ids accepted: {outcome:?}"
            );
            assert!(table.is_empty());
            assert_eq!(table.active_jobs(), 0);
            table.check_invariants().expect("invariants hold");
        }
    }
}

// =============================================================================================
// Coordinator level
// =============================================================================================

const CLIENT: ConnectionId = ConnectionId(1);
const WORKER_CONN_BASE: u64 = 100;

fn config() -> CoordinatorConfig {
    CoordinatorConfig {
        task_timeout: Duration::from_millis(10_000),
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(300),
        retry_base: Duration::from_millis(50),
        retry_max: Duration::from_millis(400),
        max_active_jobs: 1_000,
        ..CoordinatorConfig::default()
    }
}

struct Harness {
    d: Driver,
    next_request: u64,
}

impl std::ops::Deref for Harness {
    type Target = Driver;

    fn deref(&self) -> &Driver {
        &self.d
    }
}

impl std::ops::DerefMut for Harness {
    fn deref_mut(&mut self) -> &mut Driver {
        &mut self.d
    }
}

impl Harness {
    fn new() -> Harness {
        Harness::with(config())
    }

    fn with(config: CoordinatorConfig) -> Harness {
        Harness {
            d: Driver::new(config, 42).expect("valid config"),
            next_request: 0,
        }
    }

    fn conn_of(name: &str) -> ConnectionId {
        let n: u64 = name
            .trim_start_matches('w')
            .parse()
            .expect("workers are named wN");
        ConnectionId(WORKER_CONN_BASE + n)
    }

    fn worker_says(&mut self, name: &str, message: WorkerToCoordinator) {
        self.d
            .c
            .handle_worker_message(self.d.now, Self::conn_of(name), message);
        self.pump();
    }

    fn register(&mut self, name: &str, capacity: u32) {
        self.worker_says(
            name,
            WorkerToCoordinator::Register {
                draining: false,
                tasks: herder_core::protocol::builtin_task_names()
                    .into_iter()
                    .collect(),
                worker_id: WorkerId(name.to_owned()),
                incarnation: Incarnation(1),
                capacity,
                prefetch: 0,
                running: Vec::new(),
                finished: Vec::new(),
                queues: None,
            },
        );
        let replies = self.sent_to_worker(name);
        assert!(
            replies
                .iter()
                .any(|m| matches!(m, CoordinatorToWorker::Registered { .. })),
            "{name} registers: {replies:?}"
        );
    }

    fn request_id(&mut self) -> RequestId {
        self.next_request += 1;
        RequestId(self.next_request)
    }

    fn client_says(&mut self, message: ClientRequest) {
        self.d.c.handle_client_message(
            self.d.now,
            CLIENT,
            &herder_core::auth::Caller::anonymous(),
            message,
        );
        self.pump();
    }

    fn submit_request(
        &mut self,
        task: serde_json::Value,
        max_attempts: Option<u32>,
        partitions: Option<Partitions>,
    ) -> RequestId {
        let request_id = self.request_id();
        self.client_says(ClientRequest::Submit {
            timeout_millis: None,
            request_id,
            task,
            max_attempts,
            idempotency_key: None,
            partitions,
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
    }

    fn submit(
        &mut self,
        task: serde_json::Value,
        max_attempts: Option<u32>,
        partitions: Option<Partitions>,
    ) -> JobId {
        let request_id = self.submit_request(task, max_attempts, partitions);
        match self.reply_to(request_id) {
            ClientReply::SubmitAccepted {
                term: Term(1),
                job_id,
                existing: false,
                ..
            } => job_id,
            other => panic!("expected acceptance, got {other:?}"),
        }
    }

    fn status(&mut self, job_id: JobId) -> JobView {
        let request_id = self.request_id();
        self.client_says(ClientRequest::Status { request_id, job_id });
        match self.reply_to(request_id) {
            ClientReply::Job { job, .. } => *job,
            other => panic!("expected JOB, got {other:?}"),
        }
    }

    fn try_reply_to(&mut self, request_id: RequestId) -> Option<ClientReply> {
        let position = self.sent.iter().position(|o| {
            matches!(o, Output::ToClient { message, .. } if message.request_id() == Some(request_id))
        })?;
        match self.sent.remove(position) {
            Output::ToClient { message, .. } => Some(message),
            _ => None,
        }
    }

    fn reply_to(&mut self, request_id: RequestId) -> ClientReply {
        self.try_reply_to(request_id)
            .unwrap_or_else(|| panic!("no reply to {request_id}; outputs: {:?}", self.sent))
    }

    /// Removes and returns every message sent to `name`'s connection.
    fn sent_to_worker(&mut self, name: &str) -> Vec<CoordinatorToWorker> {
        let conn = Self::conn_of(name);
        let mut out = Vec::new();
        self.sent.retain(|o| match o {
            Output::ToWorker { conn: c, message } if *c == conn => {
                out.push(message.clone());
                false
            }
            _ => true,
        });
        out
    }

    /// The assignments sent to `name`: (job, lease, attempt, task).
    fn assignments(&mut self, name: &str) -> Vec<(JobId, LeaseId, Attempt, TaskSpec)> {
        self.sent_to_worker(name)
            .into_iter()
            .filter_map(|m| match m {
                CoordinatorToWorker::TaskAssign {
                    term: Term(1),
                    job_id,
                    lease_id,
                    attempt,
                    task,
                    ..
                } => Some((job_id, lease_id, attempt, task)),
                _ => None,
            })
            .collect()
    }

    fn report(&mut self, name: &str, job_id: JobId, lease_id: LeaseId, outcome: AttemptOutcome) {
        self.worker_says(
            name,
            WorkerToCoordinator::TaskResult {
                job_id,
                lease_id,
                outcome,
            },
        );
    }
}

const WORKERS: [&str; 3] = ["w1", "w2", "w3"];

/// Three workers of capacity 2, and a prime-sum over 1..=100000 submitted with `partitions`
/// absent: returns the harness, the parent, and each worker's one assignment.
#[allow(clippy::type_complexity)]
fn three_workers_one_split_job() -> (
    Harness,
    JobId,
    Vec<(&'static str, JobId, LeaseId, Attempt, TaskSpec)>,
) {
    let mut h = Harness::new();
    for name in WORKERS {
        h.register(name, 2);
    }
    let parent = h.submit(
        json!({"kind": "prime-sum", "start": 1, "end": 100_000}),
        None,
        None,
    );
    let mut assigned = Vec::new();
    for name in WORKERS {
        for (job, lease, attempt, task) in h.assignments(name) {
            assigned.push((name, job, lease, attempt, task));
        }
    }
    (h, parent, assigned)
}

#[test]
fn auto_partitions_are_one_per_live_worker_and_spread_over_distinct_workers() {
    let (h, parent, assigned) = three_workers_one_split_job();
    let p = h.d.c.job(&parent).expect("the parent exists").clone();
    assert!(p.is_parent());
    assert_eq!(p.state, JobState::Running);
    assert_eq!(p.attempt, Attempt(0));
    assert_eq!(p.lease, None);
    assert_eq!(p.partitions.len(), 3, "auto: one partition per live worker");
    assert_eq!(p.task, prime_sum(1, 100_000));
    assert_eq!(h.d.c.table().active_jobs(), 4);

    // Each partition is assigned exactly once, each to a different worker, and never the parent.
    assert_eq!(assigned.len(), 3, "{assigned:?}");
    let workers: BTreeSet<&str> = assigned.iter().map(|a| a.0).collect();
    assert_eq!(workers.len(), 3, "three distinct workers: {assigned:?}");
    let jobs: BTreeSet<JobId> = assigned.iter().map(|a| a.1).collect();
    assert_eq!(jobs, p.partitions.iter().copied().collect::<BTreeSet<_>>());
    assert!(!jobs.contains(&parent));
    let pieces = p.task.split(3);
    for (name, job, lease_id, attempt, task) in &assigned {
        let part = h.d.c.job(job).expect("the partition exists");
        let of = part.partition_of.expect("a partition");
        assert_eq!(of.parent, parent);
        assert_eq!(p.partitions[of.index as usize], *job);
        assert_eq!(*task, pieces[of.index as usize], "the task is its piece");
        assert_eq!(*attempt, Attempt(1));
        assert_eq!(part.state, JobState::Running);
        let lease = part
            .lease
            .as_ref()
            .expect("a running partition holds a lease");
        assert_eq!(lease.id, *lease_id);
        assert_eq!(lease.worker.as_str(), *name);
    }
    let spread: BTreeMap<&str, usize> =
        h.d.c
            .workers()
            .map(|w| (w.id.as_str(), w.leases.len()))
            .collect();
    assert_eq!(spread, BTreeMap::from([("w1", 1), ("w2", 1), ("w3", 1)]));
}

#[test]
fn auto_partitions_fit_the_room_admission_has_left_now() {
    // Limit 3, one job already active, two live workers: two partitions would need 1 + 2 + 1 =
    // 4 slots, over the limit, but one partition fits (1 + 1 + 1 = 3): `auto` takes what is
    // left instead of refusing a job that fits. (The simulator's check of every rejection
    // against the room really left found this.)
    let mut h = Harness::with(CoordinatorConfig {
        max_active_jobs: 3,
        ..config()
    });
    h.register("w1", 1);
    h.register("w2", 1);
    h.submit(json!({"kind": "sleep", "milliseconds": 60_000}), None, None);
    let parent = h.submit(
        json!({"kind": "max", "numbers": [3, 9, 4, 1]}),
        None,
        Some(Partitions::Auto),
    );
    let job = h.d.c.job(&parent).expect("accepted");
    assert_eq!(job.partitions.len(), 1, "one partition fits the room left");
    assert_eq!(h.d.c.table().active_jobs(), 3);
}

#[test]
fn partitions_prefer_a_busier_worker_to_doubling_up_on_one() {
    // w2 already runs two ordinary jobs; w1 is idle. Plain least-loaded placement would put
    // both partitions on w1; the spread rule puts the second on w2, which has room.
    let mut h = Harness::new();
    h.register("w2", 4);
    for ms in [1_000, 2_000] {
        h.submit(json!({"kind": "sleep", "milliseconds": ms}), None, None);
    }
    assert_eq!(h.assignments("w2").len(), 2);
    h.register("w1", 4);
    let parent = h.submit(
        json!({"kind": "max", "numbers": [1, 2, 3, 4]}),
        None,
        Some(Partitions::Count(2)),
    );
    let on_w1: Vec<JobId> = h.assignments("w1").into_iter().map(|a| a.0).collect();
    let on_w2: Vec<JobId> = h.assignments("w2").into_iter().map(|a| a.0).collect();
    assert_eq!(on_w1.len(), 1, "w1: {on_w1:?}, w2: {on_w2:?}");
    assert_eq!(on_w2.len(), 1, "w1: {on_w1:?}, w2: {on_w2:?}");
    let parts = h.d.c.job(&parent).expect("parent").partitions.clone();
    let mut placed = vec![on_w1[0], on_w2[0]];
    placed.sort();
    let mut want = parts;
    want.sort();
    assert_eq!(placed, want);
}

#[test]
fn a_split_job_runs_to_its_aggregate_through_the_coordinator() {
    let (mut h, parent, assigned) = three_workers_one_split_job();
    // A WAIT on the parent is answered when, and only when, the last partition completes.
    let wait = h.request_id();
    h.client_says(ClientRequest::Wait {
        request_id: wait,
        job_id: parent,
        timeout_millis: Some(60_000),
    });
    assert!(h.try_reply_to(wait).is_none());
    for (i, (name, job, lease_id, attempt, task)) in assigned.iter().enumerate() {
        let output = execute(task, *attempt).expect("the piece runs");
        h.report(name, *job, *lease_id, AttemptOutcome::Succeeded { output });
        let acks = h.sent_to_worker(name);
        assert!(
            acks.contains(&CoordinatorToWorker::ResultAck {
                term: Term(1),
                job_id: *job,
                lease_id: *lease_id,
                accepted: true
            }),
            "{acks:?}"
        );
        if i + 1 < assigned.len() {
            assert!(h.try_reply_to(wait).is_none());
            assert_eq!(h.d.c.job(&parent).expect("parent").state, JobState::Running);
        }
    }
    let whole = TaskOutput::PrimeSum {
        count: 9592,
        sum: 454_396_537,
    };
    match h.reply_to(wait) {
        ClientReply::WaitResult { job, timed_out, .. } => {
            assert!(!timed_out);
            assert_eq!(job.id, parent);
            assert_eq!(job.state, JobState::Completed);
            assert_eq!(job.result, Some(whole.clone()));
            let parts = job.partitions.expect("partitions");
            assert_eq!((parts.done, parts.total), (3, 3));
        }
        other => panic!("expected WAIT_RESULT, got {other:?}"),
    }
    assert_eq!(h.d.c.table().active_jobs(), 0);
    assert!(h.d.c.workers().all(|w| w.leases.is_empty()), "slots freed");

    // LIST shows the parent, not its partitions.
    let list = h.request_id();
    h.client_says(ClientRequest::List {
        request_id: list,
        state: None,
        limit: None,
        before: None,
    });
    match h.reply_to(list) {
        ClientReply::JobList { jobs, .. } => {
            assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), vec![parent]);
        }
        other => panic!("expected JOB_LIST, got {other:?}"),
    }

    // What is on disk recovers to the same table.
    let before = views(h.d.c.table());
    let recovered = Coordinator::recover(config(), 43, h.d.now, h.disk.durable_state())
        .expect("the disk recovers");
    assert_eq!(views(recovered.table()), before);
    assert_eq!(recovered.job(&parent).expect("parent").result, Some(whole));
}

#[test]
fn invalid_partition_requests_are_refused_without_a_log_entry() {
    let mut h = Harness::new();
    for name in WORKERS {
        h.register(name, 2);
    }
    let written = h.entries_written;
    let cases = [
        (
            json!({"kind": "prime-sum", "start": 1, "end": 1000}),
            Some(Partitions::Count(0)),
        ),
        (
            json!({"kind": "max", "numbers": [1, 2, 3]}),
            Some(Partitions::Count(0)),
        ),
        (
            json!({"kind": "sleep", "milliseconds": 10}),
            Some(Partitions::Count(2)),
        ),
        (
            json!({"kind": "sleep", "milliseconds": 10}),
            Some(Partitions::Auto),
        ),
        (
            json!({"kind": "prime-sum", "start": 1, "end": 1000}),
            Some(Partitions::Count(1_000_000)),
        ),
    ];
    for (task, partitions) in cases {
        h.hold_writes = true;
        let request_id = h.submit_request(task.clone(), None, partitions);
        match h.reply_to(request_id) {
            ClientReply::Error {
                request_id: Some(r),
                code,
                message,
            } => {
                assert_eq!(r, request_id);
                assert_eq!(
                    code,
                    ErrorCode::InvalidRequest,
                    "{task} {partitions:?}: {message}"
                );
                assert!(message.contains("partitions"), "{message}");
            }
            other => panic!("{task} {partitions:?}: expected ERROR, got {other:?}"),
        }
        assert!(h.held.is_empty(), "nothing to persist: {:?}", h.held);
        h.release_writes();
        assert_eq!(h.entries_written, written, "no log entry");
        assert!(h.d.c.table().is_empty());
    }
    // None of them reached a worker.
    for name in WORKERS {
        assert!(h.assignments(name).is_empty());
    }
}

#[test]
fn the_coordinator_admits_a_split_job_only_with_a_slot_for_each_partition() {
    let mut h = Harness::with(CoordinatorConfig {
        max_active_jobs: 4,
        ..config()
    });
    h.register("w1", 8);
    let task = json!({"kind": "prime-sum", "start": 1, "end": 1000});
    // 1 + 4 slots can never fit a limit of 4: an invalid request, not a retryable rejection.
    let request_id = h.submit_request(task.clone(), None, Some(Partitions::Count(4)));
    match h.reply_to(request_id) {
        ClientReply::Error { code, message, .. } => {
            assert_eq!(code, ErrorCode::InvalidRequest);
            assert!(message.contains("partitions"), "{message}");
        }
        other => panic!("expected ERROR, got {other:?}"),
    }
    // One ordinary job active: 1 + 3 more slots do not fit now, so a retryable rejection.
    h.submit(json!({"kind": "sleep", "milliseconds": 10}), None, None);
    let written = h.entries_written;
    let request_id = h.submit_request(task.clone(), None, Some(Partitions::Count(3)));
    match h.reply_to(request_id) {
        ClientReply::SubmitRejected {
            retryable,
            active_jobs,
            max_active_jobs,
            ..
        } => {
            assert!(retryable);
            assert_eq!((active_jobs, max_active_jobs), (1, 4));
        }
        other => panic!("expected SUBMIT_REJECTED, got {other:?}"),
    }
    assert_eq!(h.entries_written, written, "no log entry");
    // 1 + 2 fit exactly.
    let parent = h.submit(task, None, Some(Partitions::Count(2)));
    assert_eq!(h.d.c.job(&parent).expect("parent").partitions.len(), 2);
    assert_eq!(h.d.c.table().active_jobs(), 4);
}

#[test]
fn an_explicit_partition_count_is_capped_by_the_items() {
    let mut h = Harness::new();
    h.register("w1", 4);
    let parent = h.submit(
        json!({"kind": "max", "numbers": [5, -2]}),
        None,
        Some(Partitions::Count(5)),
    );
    assert_eq!(h.d.c.job(&parent).expect("parent").partitions.len(), 2);
    let parent = h.submit(
        json!({"kind": "prime-count-list", "numbers": [2, 3, 4, 5, 6, 7, 8]}),
        None,
        Some(Partitions::Count(3)),
    );
    let p = h.d.c.job(&parent).expect("parent").clone();
    assert_eq!(p.partitions.len(), 3);
    let tasks: Vec<TaskSpec> = p
        .partitions
        .iter()
        .map(|id| h.d.c.job(id).expect("partition").task.clone())
        .collect();
    assert_eq!(
        tasks,
        vec![
            TaskSpec::PrimeCountList {
                numbers: vec![2, 3, 4]
            },
            TaskSpec::PrimeCountList {
                numbers: vec![5, 6]
            },
            TaskSpec::PrimeCountList {
                numbers: vec![7, 8]
            },
        ]
    );
    // An empty list is accepted and completes at once.
    let empty = h.submit(
        json!({"kind": "prime-count-list", "numbers": []}),
        None,
        Some(Partitions::Count(4)),
    );
    let view = h.status(empty);
    assert_eq!(view.state, JobState::Completed);
    assert_eq!(view.result, Some(TaskOutput::PrimeCountList { count: 0 }));
}

#[test]
fn cancel_of_a_partition_is_refused_and_cancel_of_the_parent_revokes_every_lease_once_durable() {
    let (mut h, parent, assigned) = three_workers_one_split_job();
    assert_eq!(assigned.len(), 3);

    // CANCEL naming a partition: INVALID_REQUEST naming the parent, nothing written.
    let written = h.entries_written;
    let (_, partition, ..) = assigned[1];
    let request_id = h.request_id();
    h.client_says(ClientRequest::Cancel {
        request_id,
        job_id: partition,
    });
    match h.reply_to(request_id) {
        ClientReply::Error {
            request_id: Some(r),
            code,
            message,
        } => {
            assert_eq!(r, request_id);
            assert_eq!(code, ErrorCode::InvalidRequest);
            assert!(message.contains(&parent.to_string()), "{message}");
        }
        other => panic!("expected ERROR, got {other:?}"),
    }
    assert_eq!(h.entries_written, written, "no log entry");
    assert_eq!(
        h.d.c.job(&partition).expect("partition").state,
        JobState::Running
    );
    assert_eq!(h.d.c.job(&parent).expect("parent").state, JobState::Running);
    for name in WORKERS {
        assert!(h.sent_to_worker(name).is_empty());
    }

    // CANCEL of the parent: nothing leaves before the cancel is durable.
    h.hold_writes = true;
    let request_id = h.request_id();
    h.client_says(ClientRequest::Cancel {
        request_id,
        job_id: parent,
    });
    assert!(!h.held.is_empty(), "the cancel is being persisted");
    assert!(h.try_reply_to(request_id).is_none());
    for name in WORKERS {
        let early = h.sent_to_worker(name);
        assert!(early.is_empty(), "{name} told before durability: {early:?}");
    }
    assert_eq!(h.d.c.job(&parent).expect("parent").state, JobState::Running);

    h.release_writes();
    match h.reply_to(request_id) {
        ClientReply::CancelResult { job, cancelled, .. } => {
            assert!(cancelled);
            assert_eq!(job.id, parent);
            assert_eq!(job.state, JobState::Cancelled);
            let parts = job.partitions.expect("partitions");
            assert_eq!((parts.done, parts.total), (0, 3));
            assert!(parts.pieces.iter().all(|p| p.state == JobState::Cancelled));
        }
        other => panic!("expected CANCEL_RESULT, got {other:?}"),
    }
    for (name, job, lease_id, ..) in &assigned {
        let messages = h.sent_to_worker(name);
        assert_eq!(
            messages,
            vec![CoordinatorToWorker::TaskCancel {
                term: Term(1),
                job_id: *job,
                lease_id: *lease_id,
                reason: CancelReason::JobCancelled
            }],
            "{name} is told to stop its partition exactly once"
        );
        assert_eq!(
            h.d.c.job(job).expect("partition").state,
            JobState::Cancelled
        );
    }
    assert_eq!(h.d.c.table().active_jobs(), 0);

    // The cancelled attempts reporting back get accepted: false and free their slots.
    for (name, job, lease_id, ..) in &assigned {
        h.report(name, *job, *lease_id, AttemptOutcome::Cancelled {});
        assert!(h
            .sent_to_worker(name)
            .contains(&CoordinatorToWorker::ResultAck {
                term: Term(1),
                job_id: *job,
                lease_id: *lease_id,
                accepted: false
            }));
    }
    assert!(h.d.c.workers().all(|w| w.leases.is_empty()));

    // A second cancel of the parent is answered from the table: cancelled: false.
    let request_id = h.request_id();
    h.client_says(ClientRequest::Cancel {
        request_id,
        job_id: parent,
    });
    match h.reply_to(request_id) {
        ClientReply::CancelResult { cancelled, job, .. } => {
            assert!(!cancelled);
            assert_eq!(job.state, JobState::Cancelled);
        }
        other => panic!("expected CANCEL_RESULT, got {other:?}"),
    }
}

#[test]
fn a_partition_failing_for_good_fails_the_parent_and_stops_the_other_workers() {
    let mut h = Harness::new();
    for name in WORKERS {
        h.register(name, 2);
    }
    let parent = h.submit(
        json!({"kind": "prime-sum", "start": 1, "end": 30_000}),
        Some(1),
        Some(Partitions::Count(3)),
    );
    let mut assigned = Vec::new();
    for name in WORKERS {
        for (job, lease, ..) in h.assignments(name) {
            assigned.push((name, job, lease));
        }
    }
    assert_eq!(assigned.len(), 3);
    let (failing_worker, failing, failing_lease) = assigned[0];
    h.report(
        failing_worker,
        failing,
        failing_lease,
        AttemptOutcome::Failed {
            permanent: false,
            error: "disk full".into(),
        },
    );
    let p = h.d.c.job(&parent).expect("parent").clone();
    assert_eq!(p.state, JobState::Failed);
    let index =
        h.d.c
            .job(&failing)
            .and_then(|j| j.partition_of)
            .expect("a partition")
            .index;
    let error = p.error.expect("the parent says why");
    assert!(error.contains(&format!("partition {index}")), "{error}");
    assert!(error.contains("disk full"), "{error}");
    for &(name, job, lease_id) in &assigned[1..] {
        assert_eq!(
            h.d.c.job(&job).expect("partition").state,
            JobState::Cancelled
        );
        assert!(
            h.sent_to_worker(name)
                .contains(&CoordinatorToWorker::TaskCancel {
                    term: Term(1),
                    job_id: job,
                    lease_id,
                    reason: CancelReason::JobCancelled
                }),
            "{name} is told to stop"
        );
    }
    assert_eq!(h.d.c.table().active_jobs(), 0);
}

#[test]
fn status_of_a_parent_shows_its_partitions() {
    let (mut h, parent, assigned) = three_workers_one_split_job();
    let view = h.status(parent);
    assert_eq!(view.id, parent);
    assert_eq!(view.state, JobState::Running);
    assert_eq!(view.attempt, 0);
    assert_eq!(view.lease_id, None);
    assert_eq!(view.partition_of, None);
    let parts = view.partitions.expect("a parent lists its partitions");
    assert_eq!((parts.done, parts.total), (0, 3));

    // One partition completes.
    let (name, job, lease_id, attempt, task) = assigned[2].clone();
    let output = execute(&task, attempt).expect("runs");
    h.report(
        name,
        job,
        lease_id,
        AttemptOutcome::Succeeded {
            output: output.clone(),
        },
    );
    let view = h.status(parent);
    assert_eq!(view.state, JobState::Running);
    assert_eq!(view.result, None);
    let parts = view.partitions.expect("a parent lists its partitions");
    assert_eq!((parts.done, parts.total), (1, 3));
    let parent_job = h.d.c.job(&parent).expect("parent").clone();
    for (i, piece) in parts.pieces.iter().enumerate() {
        assert_eq!(piece.index, i as u32);
        assert_eq!(piece.job_id, parent_job.partitions[i]);
        assert_eq!(piece.attempt, 1);
        let (worker, ..) = assigned
            .iter()
            .find(|a| a.1 == piece.job_id)
            .expect("every piece was assigned");
        assert_eq!(piece.worker.as_ref().map(|w| w.as_str()), Some(*worker));
        if piece.job_id == job {
            assert_eq!(piece.state, JobState::Completed);
            assert_eq!(piece.result, Some(output.clone()));
        } else {
            assert_eq!(piece.state, JobState::Running);
            assert_eq!(piece.result, None);
        }
    }

    // STATUS of a partition names its parent.
    let view = h.status(job);
    assert_eq!(view.state, JobState::Completed);
    assert_eq!(view.partitions, None);
    assert_eq!(view.partition_of.map(|of| of.parent), Some(parent));
}

// ---- Found by review: replies that could not be framed, ranges too slow to finish, order ----

/// A reply about a data-parallel job carries the whole task and a line per partition, so the
/// coordinator refuses a submission whose replies could outgrow the frame limit.
#[test]
fn a_split_whose_replies_could_not_be_framed_is_refused() {
    let mut h = Harness::with(CoordinatorConfig {
        max_frame_bytes: 16 * 1024,
        ..config()
    });
    h.register("w1", 2);
    let numbers: Vec<i64> = (0..300).map(|n| 1_000_000_000 + n).collect();
    let task = json!({"kind": "max", "numbers": numbers});
    let refused = h.submit_request(task.clone(), None, Some(Partitions::Count(30)));
    match h.reply_to(refused) {
        ClientReply::Error { code, message, .. } => {
            assert_eq!(code, ErrorCode::InvalidTask);
            assert!(message.contains("frame limit"), "{message}");
        }
        other => panic!("expected INVALID_TASK, got {other:?}"),
    }
    // The same input in one partition fits, and its status can be sent.
    let job = h.submit(task, None, Some(Partitions::Count(1)));
    let view = h.status(job);
    let bytes = serde_json::to_vec(&view).expect("a view serialises").len();
    assert!(bytes < 16 * 1024, "{bytes} bytes");
}

/// Partition requests are checked before an idempotency key is looked up, so a replay cannot
/// smuggle a request that would be refused without the key.
#[test]
fn an_invalid_partitions_request_is_refused_even_with_a_known_key() {
    let mut h = Harness::new();
    h.register("w1", 2);
    let task = json!({"kind": "sha256", "text": "abc"});
    let first = h.request_id();
    h.client_says(ClientRequest::Submit {
        timeout_millis: None,
        request_id: first,
        task: task.clone(),
        max_attempts: None,
        idempotency_key: Some("k".into()),
        partitions: None,
        fairness_key: None,
        priority: None,
        queue: None,
        delay_millis: None,
        run_at_unix_ms: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    });
    assert!(matches!(
        h.reply_to(first),
        ClientReply::SubmitAccepted {
            term: Term(1),
            existing: false,
            ..
        }
    ));
    for partitions in [Partitions::Count(3), Partitions::Count(5_000)] {
        let again = h.request_id();
        h.client_says(ClientRequest::Submit {
            timeout_millis: None,
            request_id: again,
            task: task.clone(),
            max_attempts: None,
            idempotency_key: Some("k".into()),
            partitions: Some(partitions),
            fairness_key: None,
            priority: None,
            queue: None,
            delay_millis: None,
            run_at_unix_ms: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        });
        match h.reply_to(again) {
            ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::InvalidRequest),
            other => panic!("expected INVALID_REQUEST for {partitions:?}, got {other:?}"),
        }
    }
}

/// A key binds the partition request too: a resend asking for the same count (or `auto`
/// again) is a replay; asking for another count, or `auto` after a count, is a conflict.
#[test]
fn reusing_a_key_with_another_partition_request_is_a_conflict() {
    let mut h = Harness::new();
    h.register("w1", 2);
    let task = json!({"kind": "prime-count-list", "numbers": [2, 3, 4, 5, 6, 7, 8, 9]});
    let submit = |h: &mut Harness, key: &str, partitions: Option<Partitions>| {
        let request_id = h.request_id();
        h.client_says(ClientRequest::Submit {
            timeout_millis: None,
            request_id,
            task: task.clone(),
            max_attempts: None,
            idempotency_key: Some(key.into()),
            partitions,
            fairness_key: None,
            priority: None,
            queue: None,
            delay_millis: None,
            run_at_unix_ms: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
        });
        h.reply_to(request_id)
    };
    let counted = match submit(&mut h, "counted", Some(Partitions::Count(4))) {
        ClientReply::SubmitAccepted {
            job_id,
            existing: false,
            ..
        } => job_id,
        other => panic!("unexpected {other:?}"),
    };
    assert!(matches!(
        submit(&mut h, "counted", Some(Partitions::Count(4))),
        ClientReply::SubmitAccepted { job_id, existing: true, .. } if job_id == counted
    ));
    for other in [Some(Partitions::Count(2)), Some(Partitions::Auto), None] {
        match submit(&mut h, "counted", other) {
            ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::IdempotencyConflict),
            reply => panic!("expected a conflict for {other:?}, got {reply:?}"),
        }
    }
    // `auto` and no request at all are the same request.
    let auto = match submit(&mut h, "auto", None) {
        ClientReply::SubmitAccepted {
            job_id,
            existing: false,
            ..
        } => job_id,
        other => panic!("unexpected {other:?}"),
    };
    assert!(matches!(
        submit(&mut h, "auto", Some(Partitions::Auto)),
        ClientReply::SubmitAccepted { job_id, existing: true, .. } if job_id == auto
    ));
    match submit(&mut h, "auto", Some(Partitions::Count(1))) {
        ClientReply::Error { code, .. } => assert_eq!(code, ErrorCode::IdempotencyConflict),
        reply => panic!("expected a conflict, got {reply:?}"),
    }
}

/// Above 2^44 each sieve survivor needs a Miller–Rabin test, so ranges ending there may span
/// less: a range that could never finish within a task timeout is refused up front.
#[test]
fn prime_sum_ranges_near_the_top_are_narrower() {
    let top = i64::MAX;
    let high_max = PRIME_SUM_SPAN_MAX_HIGH as i64;
    let ok =
        TaskSpec::from_json(&json!({"kind": "prime-sum", "start": top - high_max + 1, "end": top}));
    assert!(ok.is_ok(), "{ok:?}");
    let wide =
        TaskSpec::from_json(&json!({"kind": "prime-sum", "start": top - high_max, "end": top}));
    assert!(
        matches!(wide, Err(TaskError::RangeTooWide { max, .. }) if max == PRIME_SUM_SPAN_MAX_HIGH),
        "{wide:?}"
    );
    let low = PRIME_SUM_SIEVE_ONLY_END;
    let low_ok = TaskSpec::from_json(
        &json!({"kind": "prime-sum", "start": low - 9_999_999_999, "end": low}),
    );
    assert!(low_ok.is_ok(), "{low_ok:?}");
}

/// Apply is total: a `Submit` naming an id the table already has is refused, not a panic.
#[test]
fn a_submit_reusing_a_job_id_is_refused_and_changes_nothing() {
    let mut t = Table::new();
    let parent = job_id(1);
    t.submit(parent, prime_sum(1, 100), &partition_ids(1, 2), 3, 100);
    let before = t.snapshot();
    let reused = t.submit(job_id(2), prime_sum(1, 100), &[parent], 3, 100);
    assert!(
        matches!(reused.applied, Applied::SubmitInvalid { .. }),
        "{reused:?}"
    );
    let again = t.submit(parent, prime_sum(1, 10), &partition_ids(9, 1), 3, 100);
    assert!(
        matches!(again.applied, Applied::SubmitInvalid { .. }),
        "{again:?}"
    );
    assert_eq!(t.snapshot(), before);
}

/// A worker that does not cut its failure message has it cut by the coordinator, so the job's
/// views stay within the bound the submission was checked against.
#[test]
fn an_overlong_worker_error_is_cut() {
    let (mut h, parent, assigned) = three_workers_one_split_job();
    let (name, job, lease, _, _) = assigned[0].clone();
    h.report(
        name,
        job,
        lease,
        AttemptOutcome::Failed {
            permanent: false,
            error: "x".repeat(100_000),
        },
    );
    let partition = h.status(job);
    let error = partition.error.expect("the failure is recorded");
    assert!(
        error.len() <= ATTEMPT_ERROR_BYTES_MAX + 100,
        "{} bytes",
        error.len()
    );
    assert!(h
        .status(parent)
        .error
        .is_none_or(|e| e.len() <= ATTEMPT_ERROR_BYTES_MAX + 200));
}
