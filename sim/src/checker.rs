//! The invariant checker: SPEC section 4 safety properties, checked after every simulated step.
//!
//! It sees three things: what reaches each coordinator's disk (`record_durable`), every output a
//! coordinator emits (`check_output`, before the output takes effect), and the coordinator's state
//! after each step (`check_state`). Every error names the job, lease or worker concerned; the
//! world prefixes the time and node.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use herder_core::command::{Applied, Command, JobTable};
use herder_core::coordinator::{DiskImage, Output, Record, WorkerEntry};
use herder_core::ids::{Attempt, JobId, LeaseId, WorkerId};
use herder_core::job::{Job, JobState};
use herder_core::protocol::{CancelReason, ClientReply, CoordinatorToWorker, JobView};
use herder_core::tasks::{self, TaskSpec};

pub type Check = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// A coordinator's disk: exactly the batches that became durable, applied in order.
pub type Disk = DiskImage;

/// Monotone facts about commands that reached a disk (log entries are discarded later, so the
/// facts are collected as batches land).
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub submits: HashSet<JobId>,
    pub assigns: HashMap<(JobId, LeaseId), WorkerId>,
    pub settles: HashSet<(JobId, LeaseId)>,
    /// Jobs a durable entry cancelled: by a `Cancel` of the job (or of its data-parallel parent),
    /// or because a sibling partition failed for good.
    pub cancels: HashSet<JobId>,
    /// The table the durable log alone produces, applied entry by entry as entries become
    /// durable, so cascades (a parent's cancel cancelling its partitions) are known exactly.
    pub durable_table: JobTable,
}

/// Who a coordinator connection belongs to, as the world knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnOwner {
    Worker(WorkerId),
    Client,
    Unknown,
}

#[derive(Clone, Debug, Default)]
pub struct Checker {
    pub facts: Facts,
    /// Every lease id ever sent in a `TASK_ASSIGN`.
    leases_sent: HashSet<LeaseId>,
    /// (job, attempt) -> (lease, worker) of its one assignment.
    attempts: HashMap<(JobId, u32), (LeaseId, WorkerId)>,
    /// Terminal jobs as first seen; they must never change.
    terminal: BTreeMap<JobId, Job>,
    /// Jobs acknowledged by `SUBMIT_ACCEPTED`.
    acked: BTreeSet<JobId>,
    /// Idempotency key -> the job it was acknowledged for.
    key_binding: HashMap<String, JobId>,
    pub assignments: u64,
    pub completions: u64,
}

impl Checker {
    pub fn new() -> Checker {
        Checker::default()
    }

    pub fn acked(&self) -> &BTreeSet<JobId> {
        &self.acked
    }

    /// A batch became durable.
    pub fn record_durable(&mut self, records: &[Record]) {
        for record in records {
            let Record::Log(entry) = record else { continue };
            match &entry.command {
                Command::Submit { job_id, .. } => {
                    self.facts.submits.insert(*job_id);
                }
                Command::Assign { job_id, lease } => {
                    self.facts
                        .assigns
                        .insert((*job_id, lease.id), lease.worker.clone());
                }
                Command::Complete {
                    job_id, lease_id, ..
                }
                | Command::AttemptFailed {
                    job_id, lease_id, ..
                }
                | Command::Abandon { job_id, lease_id } => {
                    self.facts.settles.insert((*job_id, *lease_id));
                }
                Command::Cancel { .. } | Command::Requeue { .. } | Command::NewLeader { .. } => {}
            }
            let table = &mut self.facts.durable_table;
            if entry.index == table.applied_index().next() {
                let outcome = table.apply(entry.index, &entry.command);
                for applied in std::iter::once(&outcome.applied).chain(&outcome.follow_on) {
                    if let Applied::Cancelled { job_id, .. } = applied {
                        self.facts.cancels.insert(*job_id);
                    }
                }
            }
        }
    }

    /// A `TASK_ASSIGN` left a coordinator for `worker`.
    pub fn observe_assign(
        &mut self,
        job_id: JobId,
        lease_id: LeaseId,
        attempt: u32,
        max_attempts: u32,
        worker: &WorkerId,
    ) -> Check {
        ensure!(
            self.leases_sent.insert(lease_id),
            "lease {lease_id} (job {job_id}) was sent in a TASK_ASSIGN before: lease ids must be unique"
        );
        ensure!(
            attempt >= 1 && attempt <= max_attempts,
            "TASK_ASSIGN for job {job_id} carries attempt {attempt} of {max_attempts}"
        );
        if let Some((lease, owner)) = self.attempts.get(&(job_id, attempt)) {
            return Err(format!(
                "attempt {attempt} of job {job_id} assigned twice: lease {lease} to {owner}, then lease {lease_id} to {worker}"
            ));
        }
        self.attempts
            .insert((job_id, attempt), (lease_id, worker.clone()));
        self.assignments += 1;
        Ok(())
    }

    /// Checks one coordinator output before it takes effect.
    pub fn check_output(&mut self, output: &Output, owner: &ConnOwner, key: Option<&str>) -> Check {
        match output {
            Output::ToWorker { message, conn } => match message {
                CoordinatorToWorker::TaskAssign {
                    job_id,
                    lease_id,
                    attempt,
                    max_attempts,
                    ..
                } => {
                    let ConnOwner::Worker(worker) = owner else {
                        return Err(format!(
                            "TASK_ASSIGN {job_id}/{lease_id} sent on connection {conn}, which is not a worker's ({owner:?})"
                        ));
                    };
                    let durable = self.facts.assigns.get(&(*job_id, *lease_id));
                    ensure!(
                        durable.is_some(),
                        "durability: TASK_ASSIGN job {job_id} lease {lease_id} left before its Assign was durable"
                    );
                    ensure!(
                        durable == Some(worker),
                        "TASK_ASSIGN job {job_id} lease {lease_id} durable for {durable:?} but sent to {worker}"
                    );
                    self.observe_assign(*job_id, *lease_id, attempt.0, *max_attempts, worker)?;
                }
                CoordinatorToWorker::ResultAck {
                    job_id,
                    lease_id,
                    accepted: true,
                    ..
                } => ensure!(
                    self.facts.settles.contains(&(*job_id, *lease_id)),
                    "durability: RESULT_ACK(accepted) job {job_id} lease {lease_id} before its settlement was durable"
                ),
                CoordinatorToWorker::TaskCancel {
                    job_id,
                    lease_id,
                    reason: CancelReason::JobCancelled,
                    ..
                } => ensure!(
                    self.facts.cancels.contains(job_id),
                    "durability: TASK_CANCEL(job cancelled) job {job_id} lease {lease_id} before the cancel was durable"
                ),
                CoordinatorToWorker::TaskCancel {
                    job_id,
                    lease_id,
                    reason: CancelReason::DeadlineExpired,
                    ..
                } => ensure!(
                    self.facts.settles.contains(&(*job_id, *lease_id)),
                    "durability: TASK_CANCEL(deadline) job {job_id} lease {lease_id} before the failure was durable"
                ),
                _ => {}
            },
            Output::ToClient { message, .. } => self.check_reply(message, key)?,
            _ => {}
        }
        Ok(())
    }

    fn check_reply(&mut self, reply: &ClientReply, key: Option<&str>) -> Check {
        match reply {
            ClientReply::SubmitAccepted {
                job_id, existing, ..
            } => {
                ensure!(
                    self.facts.submits.contains(job_id),
                    "durability: SUBMIT_ACCEPTED for job {job_id} before its Submit was durable"
                );
                if !existing {
                    ensure!(
                        !self.acked.contains(job_id),
                        "job {job_id} acknowledged as new twice"
                    );
                }
                if let Some(key) = key {
                    let bound = *self.key_binding.entry(key.to_owned()).or_insert(*job_id);
                    ensure!(
                        bound == *job_id,
                        "idempotency key {key:?} acknowledged for job {bound} and for job {job_id}"
                    );
                }
                self.acked.insert(*job_id);
            }
            ClientReply::CancelResult {
                job,
                cancelled: true,
                ..
            } => ensure!(
                self.facts.cancels.contains(&job.id) && job.state == JobState::Cancelled,
                "durability: CANCEL_RESULT(cancelled) for job {} ({}) before the cancel was durable",
                job.id,
                job.state
            ),
            ClientReply::WaitResult {
                job,
                timed_out: false,
                ..
            } => ensure!(
                job.state.is_terminal(),
                "WAIT_RESULT for job {} answered early in state {}",
                job.id,
                job.state
            ),
            _ => {}
        }
        if let Some(view) = terminal_view(reply) {
            self.check_view(view)?;
        }
        Ok(())
    }

    /// A terminal job shown to a client must be the one the checker froze (when it knows it).
    fn check_view(&self, view: &JobView) -> Check {
        if let Some(frozen) = self.terminal.get(&view.id) {
            ensure!(
                frozen.state == view.state && frozen.result == view.result,
                "job {} shown to a client as {} {:?}, but it ended {} {:?}",
                view.id,
                view.state,
                view.result,
                frozen.state,
                frozen.result
            );
        }
        Ok(())
    }

    /// Checks a live coordinator's state (after every step, and right after a recovery).
    pub fn check_state<'a>(
        &mut self,
        table: &JobTable,
        workers: impl Iterator<Item = &'a WorkerEntry>,
    ) -> Check {
        table
            .check_invariants()
            .map_err(|violation| format!("job table invariant: {violation}"))?;
        for worker in workers {
            ensure!(
                worker.leases.len() <= worker.capacity as usize,
                "worker {} holds {} leases with capacity {}: {:?}",
                worker.id,
                worker.leases.len(),
                worker.capacity,
                worker.leases.keys().collect::<Vec<_>>()
            );
        }
        for (id, frozen) in &self.terminal {
            match table.get(id) {
                Some(job) => ensure!(
                    job == frozen,
                    "terminal job {id} changed: it was {} (attempt {}, result {:?}), now {} (attempt {}, result {:?})",
                    frozen.state,
                    frozen.attempt,
                    frozen.result,
                    job.state,
                    job.attempt,
                    job.result
                ),
                None => return Err(format!("terminal job {id} ({}) disappeared", frozen.state)),
            }
        }
        for id in &self.acked {
            ensure!(
                table.get(id).is_some(),
                "acknowledged job {id} is missing from the table"
            );
        }
        if table.len() > self.terminal.len() {
            let fresh: Vec<Job> = table
                .jobs()
                .filter(|job| job.state.is_terminal() && !self.terminal.contains_key(&job.id))
                .cloned()
                .collect();
            for job in fresh {
                if job.is_parent() {
                    self.check_parent_terminal(&job, table)?;
                } else {
                    self.check_newly_terminal(&job)?;
                }
                self.terminal.insert(job.id, job);
            }
        }
        Ok(())
    }

    /// SPEC invariant 7: a data-parallel job that completed holds exactly the sequential answer
    /// over its whole input, and its partitions cover that input exactly once, in order, each
    /// completed; one that failed has a partition that failed for good.
    pub fn check_parent_terminal(&mut self, job: &Job, table: &JobTable) -> Check {
        let parts: Vec<&Job> = job
            .partitions
            .iter()
            .map(|id| {
                table
                    .get(id)
                    .ok_or_else(|| format!("job {}: partition {id} is missing", job.id))
            })
            .collect::<Result<_, _>>()?;
        match job.state {
            JobState::Completed => {
                self.completions += 1;
                let expected = tasks::execute(&job.task, Attempt(0));
                ensure!(
                    expected.as_ref().ok() == job.result.as_ref(),
                    "data-parallel job {} completed with {:?} over {} partitions, but the whole input gives {:?}",
                    job.id,
                    job.result,
                    parts.len(),
                    expected
                );
                let pieces = job.task.split(parts.len() as u32);
                ensure!(
                    pieces.len() == parts.len(),
                    "data-parallel job {} has {} partitions but its input splits into {}",
                    job.id,
                    parts.len(),
                    pieces.len()
                );
                for (index, (part, piece)) in parts.iter().zip(&pieces).enumerate() {
                    ensure!(
                        part.task == *piece && part.state == JobState::Completed,
                        "data-parallel job {}: partition {index} ({}) is {} over {:?}, expected COMPLETED over {:?}",
                        job.id,
                        part.id,
                        part.state,
                        part.task,
                        piece
                    );
                }
                ensure!(
                    covers_exactly_once(&job.task, &pieces),
                    "data-parallel job {}: its partitions do not cover its input exactly once",
                    job.id
                );
            }
            JobState::Failed => ensure!(
                parts.iter().any(|p| p.state == JobState::Failed),
                "data-parallel job {} failed ({:?}) but none of its partitions did",
                job.id,
                job.error
            ),
            _ => {}
        }
        Ok(())
    }

    /// A job just became terminal: a completion must carry the right answer for its attempt.
    pub fn check_newly_terminal(&mut self, job: &Job) -> Check {
        if job.state != JobState::Completed {
            return Ok(());
        }
        self.completions += 1;
        let Some((lease, worker)) = self.attempts.get(&(job.id, job.attempt.0)) else {
            return Err(format!(
                "job {} completed on attempt {}, which was never assigned",
                job.id, job.attempt
            ));
        };
        let expected = tasks::execute(&job.task, job.attempt);
        ensure!(
            expected.as_ref().ok() == job.result.as_ref(),
            "job {} completed on attempt {} (lease {lease}, worker {worker}) with {:?}, but the task gives {:?}",
            job.id,
            job.attempt,
            job.result,
            expected
        );
        ensure!(
            job.last_worker.as_ref() == Some(worker),
            "job {} completed by {:?}, but attempt {} (lease {lease}) was assigned to {worker}",
            job.id,
            job.last_worker,
            job.attempt
        );
        Ok(())
    }
}

/// Whether `pieces`, in order, hold every item of `whole` exactly once: joined lists equal
/// the list; ranges abut with no gap or overlap from `start` to `end`.
fn covers_exactly_once(whole: &TaskSpec, pieces: &[TaskSpec]) -> bool {
    match whole {
        TaskSpec::Max { numbers } | TaskSpec::PrimeCountList { numbers } => {
            let mut joined = Vec::new();
            for piece in pieces {
                match piece {
                    TaskSpec::Max { numbers } | TaskSpec::PrimeCountList { numbers } => {
                        joined.extend_from_slice(numbers)
                    }
                    _ => return false,
                }
            }
            joined == *numbers
        }
        TaskSpec::PrimeSum { start, end } => {
            let mut next = i128::from(*start);
            for piece in pieces {
                match piece {
                    TaskSpec::PrimeSum { start: a, end: b } if i128::from(*a) == next && a <= b => {
                        next = i128::from(*b) + 1;
                    }
                    _ => return false,
                }
            }
            next == i128::from(*end) + 1
        }
        _ => false,
    }
}

fn terminal_view(reply: &ClientReply) -> Option<&JobView> {
    match reply {
        ClientReply::Job { job, .. }
        | ClientReply::WaitResult { job, .. }
        | ClientReply::CancelResult { job, .. }
            if job.state.is_terminal() =>
        {
            Some(job)
        }
        _ => None,
    }
}
