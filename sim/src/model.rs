//! The checker's own model of the job rules, written from the documented rules and not from the
//! product's `JobTable::apply`, so that a bug in apply cannot hide behind itself.
//!
//! It consumes the committed log (every entry exactly once, in index order) and keeps, per job,
//! what the rules say it must be: state, attempts, the current lease, the result. It also
//! remembers at which log index each visible fact was decided (a job created, an attempt
//! assigned or settled, a job cancelled), so the checker can ask whether that entry was durable
//! on a majority when the fact left a coordinator, and the number of non-terminal jobs after
//! every index, so it can judge admission answers.
//!
//! The rules (the job lifecycle of docs/ARCHITECTURE.md):
//!
//! - **Submit**: a known idempotency key answers with its job (same task and attempts) or
//!   conflicts, consuming nothing; otherwise the job takes one admission slot (a data-parallel
//!   job one more per partition) if the limit the leader stated allows, and is created `QUEUED`
//!   (a data-parallel parent `RUNNING` over `QUEUED` partitions, one per piece of its input).
//! - **Assign** starts attempt `n + 1` of a `QUEUED` job with attempts left under a fresh lease.
//! - **Complete / AttemptFailed / Abandon** count only with the current lease of a `RUNNING`
//!   job. A failure retries (`RETRY_WAIT`) or, on the last attempt, fails the job; an abandoned
//!   attempt requeues or fails. A partition's end decides its parent: all completed completes
//!   it with the sequential answer over the whole input; one failed for good fails it and
//!   cancels the others.
//! - A **permanent** failure fails the job at once, whatever attempts remain; it must be what
//!   the job's task gives on that attempt and what the worker reported. **Release** (a
//!   draining worker's hand-back) of the current lease queues the job again and gives the
//!   attempt back to the budget; a worker must have reported that attempt released.
//! - A **user task** completes with what its payload says the simulated handler returns on
//!   that attempt ([`expected_outcome`], this module's own reading of the payload rules).
//! - **Requeue** moves `RETRY_WAIT` to `QUEUED`. **Cancel** cancels a non-terminal job (a
//!   partition's cancel is its parent's) and every non-terminal partition of it.
//! - **Purge** removes each named job that is terminal and not a partition, with its
//!   partitions and its idempotency key; it skips any other id.
//! - Terminal states never change (a purged job is gone, not changed).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use herder_core::command::{Command, LogEntry};
use herder_core::ids::{Attempt, JobId, LeaseId, LogIndex, WorkerId};
use herder_core::job::{FailureKind, Job, JobState, Lease};
use herder_core::limits::ATTEMPT_HISTORY_MAX;
use herder_core::protocol::Partitions;
use herder_core::queues::QueueChange;
use herder_core::tasks::{self, TaskOutput, TaskSpec, UserTask};
use serde_json::{json, Value};

use crate::checker::Check;
use crate::fairness::{Fairness, Lane};

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// One job as the rules say it is.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelJob {
    pub task: TaskSpec,
    pub max_attempts: u32,
    pub key: Option<String>,
    pub state: JobState,
    pub attempt: u32,
    pub lease: Option<Lease>,
    pub last_worker: Option<WorkerId>,
    pub result: Option<TaskOutput>,
    pub retry_delay_millis: u64,
    pub parent: Option<(JobId, u32)>,
    pub partitions: Vec<JobId>,
    /// The per-attempt deadline its submission asked for.
    pub timeout_millis: Option<u64>,
    /// A data-parallel parent's partition request as submitted (no request: `auto`); none for
    /// any other job. A keyed resend must ask the same.
    pub partitions_asked: Option<Partitions>,
    /// How its last attempt was settled, for messages ("released", "failed permanently", ...).
    pub last_settled: Option<&'static str>,
    /// Attempts handed back by a drain so far (each gave its attempt number back).
    pub releases: u32,
    /// The stamp of the entry that created it.
    pub created: u64,
    /// Every attempt, oldest first, as the rules record it.
    pub attempts: Vec<ModelAttempt>,
    /// Where it is ordered: its queue, fairness key (`""` for none) and priority.
    pub queue: String,
    pub fairness_key: String,
    pub priority: u8,
    /// The entry that last queued it, and that entry's stamp.
    pub queued: (LogIndex, u64),
    /// The wall time its submission asked it to wait for (resolved by the leader).
    pub run_at: Option<u64>,
    /// The jobs it waits for, and whether it runs whatever they end as.
    pub after: Vec<JobId>,
    pub after_any_outcome: bool,
    /// A job it names was not held by the rules when it was submitted.
    pub waits_for_unknown: bool,
}

/// Where a submission places its job, and what it waits for first.
struct Placed {
    queue: String,
    fairness_key: String,
    priority: u8,
    run_at: Option<u64>,
    after: Vec<JobId>,
    after_any_outcome: bool,
}

/// One attempt: its number, lease and worker, when it started, and when and how it ended.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelAttempt {
    pub attempt: u32,
    pub lease_id: LeaseId,
    pub worker: WorkerId,
    pub started: u64,
    pub ended: Option<(u64, &'static str)>,
}

impl ModelJob {
    fn new(task: TaskSpec, max_attempts: u32) -> ModelJob {
        ModelJob {
            task,
            max_attempts,
            key: None,
            state: JobState::Queued,
            attempt: 0,
            lease: None,
            last_worker: None,
            result: None,
            retry_delay_millis: 0,
            parent: None,
            partitions: Vec::new(),
            timeout_millis: None,
            partitions_asked: None,
            last_settled: None,
            releases: 0,
            created: 0,
            attempts: Vec::new(),
            queue: herder_core::queues::DEFAULT_QUEUE.to_owned(),
            fairness_key: String::new(),
            priority: 0,
            queued: (LogIndex(0), 0),
            run_at: None,
            after: Vec::new(),
            after_any_outcome: false,
            waits_for_unknown: false,
        }
    }

    fn holds(&self, lease_id: LeaseId) -> bool {
        self.state == JobState::Running && self.lease.as_ref().is_some_and(|l| l.id == lease_id)
    }
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    pub jobs: BTreeMap<JobId, ModelJob>,
    /// The last index applied.
    pub applied: LogIndex,
    pub keys: HashMap<String, JobId>,
    /// Non-terminal jobs after each index (index 0: none).
    active_at: Vec<u64>,
    /// Where each visible fact was decided.
    pub submitted_at: HashMap<JobId, LogIndex>,
    pub assigned_at: HashMap<LeaseId, (LogIndex, JobId, WorkerId)>,
    pub settled_at: HashMap<LeaseId, LogIndex>,
    pub cancelled_at: HashMap<JobId, LogIndex>,
    /// Jobs removed by a purge (each terminal when it went): where, and what it was then.
    pub purged: HashMap<JobId, (LogIndex, ModelJob)>,
    /// The highest admission limit any submission carried (the limit is fixed per run).
    pub limit: u64,
    /// Attempts a draining worker handed back, which the budget does not count.
    pub released: BTreeSet<LeaseId>,
    /// Jobs a committed permanent failure of their current attempt ended, and where.
    pub failed_permanently: HashMap<JobId, LogIndex>,
    /// Leases some worker reported `released`, and leases it reported failed permanently (fed
    /// by the world from what the simulated workers sent).
    pub reported_released: HashSet<LeaseId>,
    pub reported_permanent: HashSet<LeaseId>,
    /// The wall-clock stamp of the entry being applied.
    stamp: u64,
    /// Each queue's settings as operators changed them, entry by entry.
    pub queues: BTreeMap<String, Vec<(LogIndex, QueueRules)>>,
    /// The last entry that assigned each job, whether or not it started it.
    pub last_assign: HashMap<JobId, LogIndex>,
    /// Each rate-limited queue's starts since its limit was last set, by entry stamp.
    rate_starts: HashMap<String, Vec<u64>>,
    /// Each queue's clock for its per-key rate: the latest stamp any start in it carried.
    key_clocks: HashMap<String, u64>,
    /// Each key's starts since its queue's per-key rate was last set, by `(queue, key)`, at
    /// the queue's clock (so never running backwards).
    key_rate_starts: HashMap<(String, String), Vec<u64>>,
    /// The fairness rule between keys (see [`crate::fairness`]).
    pub fairness: Fairness,
}

/// What the rules need of a queue's settings: whether it is paused, its ageing bound, how
/// many of its jobs may run at once (in all, and per fairness key), how many may start per
/// period, and how many may be unfinished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueRules {
    pub paused: bool,
    pub aging_millis: u64,
    pub concurrency: Option<u32>,
    pub key_concurrency: Option<u32>,
    /// At most `.0` starts per `.1` milliseconds.
    pub rate: Option<(u32, u64)>,
    /// At most `.0` starts per `.1` milliseconds for each fairness key.
    pub key_rate: Option<(u32, u64)>,
    pub max_active_jobs: Option<u64>,
}

/// A new queue's settings: running, the documented ageing bound of 60 s, no limit.
pub const NEW_QUEUE: QueueRules = QueueRules {
    paused: false,
    aging_millis: 60_000,
    concurrency: None,
    key_concurrency: None,
    rate: None,
    key_rate: None,
    max_active_jobs: None,
};

/// What a task must give on an attempt.
#[derive(Clone, Debug, PartialEq)]
pub enum Expected {
    Output(TaskOutput),
    Fails { permanent: bool },
}

/// What `task` must give on `attempt`: a built-in task's answer is `tasks::execute`; a user
/// task's follows the rules its payload states (see [`expected_user_outcome`]).
pub fn expected_outcome(task: &TaskSpec, attempt: u32) -> Expected {
    match task {
        TaskSpec::User(user) => expected_user_outcome(user, attempt),
        _ => match tasks::execute(task, Attempt(attempt)) {
            Ok(output) => Expected::Output(output),
            Err(failure) => Expected::Fails {
                permanent: failure.permanent,
            },
        },
    }
}

/// The payload rules of the simulated user tasks, read here on their own: from attempt
/// `permanent_at` on the task refuses its input for good; before attempt `fail_until` it fails
/// and may be retried; otherwise it answers its name, `n`, the attempt and `n` squared.
pub fn expected_user_outcome(task: &UserTask, attempt: u32) -> Expected {
    let payload = task.payload.as_object();
    let number = |key: &str| payload.and_then(|p| p.get(key)).and_then(Value::as_u64);
    let attempt = u64::from(attempt);
    if let Some(from) = number("permanent_at") {
        if attempt >= from {
            return Expected::Fails { permanent: true };
        }
    }
    if number("fail_until").unwrap_or(0) > attempt {
        return Expected::Fails { permanent: false };
    }
    let n = payload
        .and_then(|p| p.get("n"))
        .and_then(Value::as_i64)
        .unwrap_or(0);
    Expected::Output(TaskOutput::Value {
        value: json!({"task": task.name, "n": n, "attempt": attempt, "square": n.wrapping_mul(n)}),
    })
}

impl Model {
    pub fn new() -> Model {
        Model {
            active_at: vec![0],
            ..Model::default()
        }
    }

    /// A job as the rules last had it: live, or as it was when purged.
    pub fn job_ever(&self, job_id: &JobId) -> Option<&ModelJob> {
        self.jobs
            .get(job_id)
            .or_else(|| self.purged.get(job_id).map(|(_, job)| job))
    }

    pub fn active(&self) -> u64 {
        self.jobs
            .values()
            .filter(|j| !j.state.is_terminal())
            .count() as u64
    }

    /// Non-terminal jobs right after entry `index` was applied, if the model got that far.
    pub fn active_at(&self, index: LogIndex) -> Option<u64> {
        usize::try_from(index.0)
            .ok()
            .and_then(|i| self.active_at.get(i).copied())
    }

    /// Applies the next committed entry.
    pub fn apply(&mut self, entry: &LogEntry) -> Check {
        ensure!(
            entry.index == self.applied.next(),
            "model: entry {} applied out of order (at {})",
            entry.index,
            self.applied
        );
        self.applied = entry.index;
        let at = entry.index;
        self.stamp = entry.at.0;
        let before: BTreeMap<JobId, JobState> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.state.is_terminal())
            .map(|(id, j)| (*id, j.state))
            .collect();
        let queued_before = self.queued_lanes();
        self.apply_command(entry)?;
        self.settle_blocked(entry.index)?;
        let queued_after = self.queued_lanes();
        let started: BTreeSet<JobId> = queued_before
            .keys()
            .filter(|id| {
                self.jobs
                    .get(id)
                    .is_some_and(|j| j.state == JobState::Running)
            })
            .copied()
            .collect();
        let key_limited: BTreeSet<String> = self
            .queues
            .keys()
            .filter(|queue| {
                let rules = self.rules_of(queue, at);
                rules.key_concurrency.is_some() || rules.key_rate.is_some()
            })
            .cloned()
            .collect();
        self.fairness
            .observe(at, &queued_before, &queued_after, &started, &key_limited)?;
        self.after_entry(at, before)
    }

    /// The lane of every queued job: its kind, queue and fairness key.
    fn queued_lanes(&self) -> HashMap<JobId, Lane> {
        self.jobs
            .iter()
            .filter(|(_, j)| j.state == JobState::Queued)
            .map(|(id, j)| {
                let lane = (
                    j.task.kind().to_owned(),
                    j.queue.clone(),
                    j.fairness_key.clone(),
                );
                (*id, lane)
            })
            .collect()
    }

    /// What one entry's command does to the jobs, by the rules.
    fn apply_command(&mut self, entry: &LogEntry) -> Check {
        let at = entry.index;
        match &entry.command {
            Command::Submit {
                job_id,
                task,
                max_attempts,
                idempotency_key,
                max_active_jobs,
                partitions,
                partitions_asked,
                timeout_millis,
                submitted_by,
                queue,
                priority,
                fairness_key,
                run_at,
                retry_of: _,
                after,
                after_any_outcome,
            } => {
                // The model binds keys as the clients sent them: no simulated client that
                // writes holds a named token, so no submission may carry a name (the scoping of
                // keys by name is tested in core, not here).
                if let Some(name) = submitted_by {
                    return Err(format!(
                        "model: entry {} submits job {job_id} as {name:?}, but no simulated writer holds a named token",
                        entry.index.0
                    ));
                }
                // Where it waits, and from when.
                let place = Placed {
                    queue: queue.clone(),
                    fairness_key: fairness_key.clone().unwrap_or_default(),
                    priority: *priority,
                    run_at: run_at.map(|at| at.0),
                    after: after.clone(),
                    after_any_outcome: *after_any_outcome,
                };
                self.submit(
                    at,
                    *job_id,
                    (task, *max_attempts, *timeout_millis, *partitions_asked),
                    idempotency_key,
                    (*max_active_jobs, partitions),
                    place,
                )?
            }
            Command::Due { job_ids } => self.due(at, job_ids),
            Command::Assign {
                job_id,
                lease,
                as_of,
            } => {
                // A paused queue starts nothing, and a queue at one of its limits nothing more
                // (counting every attempt running, whichever leader started it).
                let startable = self.jobs.get(job_id).is_some_and(|job| {
                    job.state == JobState::Queued
                        && job.attempt < job.max_attempts
                        && self.within_queue_rules(at, job)
                });
                if startable {
                    let job = self.job(job_id)?;
                    let (queue, key) = (job.queue.clone(), job.fairness_key.clone());
                    let rules = self.rules_of(&queue, at);
                    let clock = self.key_clock(&queue);
                    self.key_clocks.insert(queue.clone(), clock);
                    if let Some(rate) = rules.rate {
                        let history = self.rate_starts.entry(queue.clone()).or_default();
                        record_start(history, self.stamp, rate);
                    }
                    if let Some(rate) = rules.key_rate.filter(|_| !key.is_empty()) {
                        let history = self.key_rate_starts.entry((queue, key)).or_default();
                        record_start(history, clock, rate);
                    }
                }
                if startable {
                    self.check_priority(at, *job_id, *as_of)?;
                }
                self.last_assign.insert(*job_id, at);
                if let Some(job) = self.jobs.get_mut(job_id) {
                    if startable {
                        job.state = JobState::Running;
                        job.attempt += 1;
                        job.lease = Some(lease.clone());
                        job.last_worker = Some(lease.worker.clone());
                        // A stamp never runs backwards: not before the job, nor an end before
                        // its start (leaders' clocks may disagree).
                        job.attempts.push(ModelAttempt {
                            attempt: job.attempt,
                            lease_id: lease.id,
                            worker: lease.worker.clone(),
                            started: self.stamp.max(job.created),
                            ended: None,
                        });
                        self.assigned_at
                            .insert(lease.id, (at, *job_id, lease.worker.clone()));
                    }
                }
            }
            Command::Complete {
                job_id,
                lease_id,
                output,
            } => {
                self.settled_at.entry(*lease_id).or_insert(at);
                if self.jobs.get(job_id).is_some_and(|j| j.holds(*lease_id)) {
                    let job = self.job(job_id)?;
                    let expected = expected_outcome(&job.task, job.attempt);
                    ensure!(
                        expected == Expected::Output(output.clone()),
                        "job {job_id} completed on attempt {} with {output:?}, but its task gives {expected:?}",
                        job.attempt
                    );
                    let stamp = self.stamp;
                    let job = self.job_mut(job_id)?;
                    end_attempt(job, *lease_id, stamp, "completed")?;
                    job.state = JobState::Completed;
                    job.lease = None;
                    job.result = Some(output.clone());
                    job.last_settled = Some("completed");
                    self.partition_completed(*job_id)?;
                }
            }
            Command::AttemptFailed {
                job_id,
                lease_id,
                retry_delay_millis,
                permanent,
                kind,
                ..
            } => {
                self.settled_at.entry(*lease_id).or_insert(at);
                // Only a worker's permanent report makes a failure permanent.
                ensure!(
                    !permanent || self.reported_permanent.contains(lease_id),
                    "a permanent failure of job {job_id} lease {lease_id} was committed at entry {at}, but no worker reported that attempt failed permanently"
                );
                if self.jobs.get(job_id).is_some_and(|j| j.holds(*lease_id)) {
                    let stamp = self.stamp;
                    let job = self.job_mut(job_id)?;
                    let how = match kind {
                        FailureKind::TaskFailed => "task_failed",
                        FailureKind::WorkerLost => "worker_lost",
                        FailureKind::DeadlineExpired => "deadline_expired",
                    };
                    end_attempt(job, *lease_id, stamp, how)?;
                    job.lease = None;
                    if *permanent {
                        // Terminal at once, whatever attempts remain; and only when the task
                        // really gives a permanent failure on this attempt.
                        let expected = expected_outcome(&job.task, job.attempt);
                        ensure!(
                            expected == Expected::Fails { permanent: true },
                            "job {job_id} failed permanently on attempt {} at entry {at}, but its task gives {expected:?} there",
                            job.attempt
                        );
                        job.state = JobState::Failed;
                        job.last_settled = Some("failed permanently");
                        self.failed_permanently.insert(*job_id, at);
                        self.partition_failed(at, *job_id)?;
                    } else if job.attempt < job.max_attempts {
                        job.state = JobState::RetryWait;
                        job.retry_delay_millis = *retry_delay_millis;
                        job.last_settled = Some("failed, to be retried");
                    } else {
                        job.state = JobState::Failed;
                        job.last_settled = Some("failed on its last attempt");
                        self.partition_failed(at, *job_id)?;
                    }
                    let state = self.job(job_id)?.state;
                    ensure!(
                        !permanent || state == JobState::Failed,
                        "model: job {job_id} is {state} after a permanent failure"
                    );
                }
            }
            Command::Abandon { job_id, lease_id } => {
                self.settled_at.entry(*lease_id).or_insert(at);
                if self.jobs.get(job_id).is_some_and(|j| j.holds(*lease_id)) {
                    let stamp = self.stamp;
                    let job = self.job_mut(job_id)?;
                    end_attempt(job, *lease_id, stamp, "abandoned")?;
                    job.lease = None;
                    job.last_settled = Some("abandoned");
                    if job.attempt < job.max_attempts {
                        job.state = JobState::Queued;
                        job.queued = (at, stamp);
                    } else {
                        job.state = JobState::Failed;
                        self.partition_failed(at, *job_id)?;
                    }
                }
            }
            Command::Release { job_id, lease_id } => {
                self.settled_at.entry(*lease_id).or_insert(at);
                // A leader proposes a release only for what a worker handed back.
                ensure!(
                    self.reported_released.contains(lease_id),
                    "a Release of job {job_id} lease {lease_id} was committed at entry {at}, but no worker reported that attempt released"
                );
                if self.jobs.get(job_id).is_some_and(|j| j.holds(*lease_id)) {
                    // Handed back by a draining worker: queued again, the attempt not charged.
                    let stamp = self.stamp;
                    let job = self.job_mut(job_id)?;
                    end_attempt(job, *lease_id, stamp, "released")?;
                    let before = job.attempt;
                    ensure!(
                        before >= 1,
                        "model: running job {job_id} released with attempt 0"
                    );
                    job.lease = None;
                    job.attempt = before - 1;
                    job.releases += 1;
                    job.state = JobState::Queued;
                    job.queued = (at, stamp);
                    job.last_settled = Some("released (not charged)");
                    self.released.insert(*lease_id);
                }
            }
            Command::Requeue { job_id } => {
                let stamp = self.stamp;
                if let Some(job) = self.jobs.get_mut(job_id) {
                    if job.state == JobState::RetryWait {
                        job.state = JobState::Queued;
                        job.queued = (at, stamp);
                    }
                }
            }
            Command::Cancel { job_id } => {
                let target = match self.jobs.get(job_id).and_then(|j| j.parent) {
                    Some((parent, _)) => parent,
                    None => *job_id,
                };
                if self
                    .jobs
                    .get(&target)
                    .is_some_and(|j| !j.state.is_terminal())
                {
                    self.cancel_one(at, target)?;
                    let partitions = self.jobs.get(&target).map(|j| j.partitions.clone());
                    for part in partitions.unwrap_or_default() {
                        self.cancel_one(at, part)?;
                    }
                }
            }
            Command::NewLeader { .. } => {}
            Command::SetQueue { queue, change } => self.set_queue(at, queue, change)?,
            Command::Purge { job_ids } => {
                for job_id in job_ids {
                    let purgeable = self
                        .jobs
                        .get(job_id)
                        .is_some_and(|j| j.state.is_terminal() && j.parent.is_none());
                    if !purgeable {
                        continue;
                    }
                    let job = self
                        .jobs
                        .remove(job_id)
                        .ok_or("model: purged job vanished")?;
                    if let Some(key) = &job.key {
                        self.keys.remove(key);
                    }
                    for part in &job.partitions {
                        let row = self
                            .jobs
                            .remove(part)
                            .ok_or("model: a partition vanished")?;
                        self.purged.insert(*part, (at, row));
                    }
                    self.purged.insert(*job_id, (at, job));
                }
            }
        }
        Ok(())
    }

    /// After every entry: no terminal job left its state, and the count of active jobs.
    fn after_entry(&mut self, at: LogIndex, before: BTreeMap<JobId, JobState>) -> Check {
        for (id, state) in before {
            if self.purged.get(&id).is_some_and(|(index, _)| *index == at) {
                continue;
            }
            let now = self.jobs.get(&id).map(|j| j.state);
            ensure!(
                now == Some(state),
                "model: terminal job {id} left {state} for {now:?} at entry {at}"
            );
        }
        let active = self.active();
        ensure!(
            active <= self.limit,
            "{active} non-terminal jobs after entry {at}, over the admission limit of {}",
            self.limit
        );
        self.active_at.push(active);
        Ok(())
    }

    fn submit(
        &mut self,
        at: LogIndex,
        job_id: JobId,
        (task, max_attempts, timeout_millis, partitions_asked): (
            &TaskSpec,
            u32,
            Option<u64>,
            Option<Partitions>,
        ),
        key: &Option<String>,
        (max_active_jobs, partitions): (u64, &[JobId]),
        place: Placed,
    ) -> Check {
        let Placed {
            queue,
            fairness_key,
            priority,
            run_at,
            after,
            after_any_outcome,
        } = place;
        self.limit = self.limit.max(max_active_jobs);
        if let Some(key) = key {
            if self.keys.contains_key(key) {
                return Ok(()); // a replay or a conflict: nothing changes
            }
        }
        let pieces = if task.is_data_parallel() {
            task.split(partitions.len() as u32)
        } else {
            Vec::new()
        };
        let distinct: BTreeSet<&JobId> = partitions.iter().collect();
        // A data-parallel job splits at once: it may wait neither for a time nor for jobs.
        let valid = pieces.len() == partitions.len()
            && !(task.is_data_parallel() && (run_at.is_some() || !after.is_empty()))
            && distinct.len() == partitions.len()
            && !distinct.contains(&job_id)
            && !self.jobs.contains_key(&job_id)
            && partitions.iter().all(|p| !self.jobs.contains_key(p));
        let slots = 1 + partitions.len() as u64;
        let active = self.active();
        // The leader counts the submissions it is still writing, so one that reaches the log
        // always finds room: a refusal at apply means a refused submission was written.
        ensure!(
            !valid || active + slots <= max_active_jobs,
            "admission: the submission of job {job_id} at entry {at} was written and then refused when it applied ({active} non-terminal jobs, {slots} slots asked, limit {max_active_jobs})"
        );
        if !valid {
            return Ok(()); // refused: nothing is created
        }
        // Nor beyond its queue's admission limit, counting the queue's unfinished jobs.
        let queue_limit = self.rules_of(&queue, at).max_active_jobs;
        if queue_limit.is_some_and(|limit| self.unfinished_in(&queue) + slots > limit) {
            return Ok(());
        }
        ensure!(
            covers_exactly_once(task, &pieces),
            "job {job_id}: its {} pieces do not cover its input exactly once",
            pieces.len()
        );
        let mut job = ModelJob::new(task.clone(), max_attempts);
        job.created = self.stamp;
        job.queue = queue;
        job.fairness_key = fairness_key;
        job.priority = priority;
        job.queued = (at, self.stamp);
        self.queues.entry(job.queue.clone()).or_default();
        job.key = key.clone();
        job.timeout_millis = timeout_millis;
        job.partitions_asked = partitions_asked;
        job.run_at = run_at;
        // A time still ahead of the entry's stamp: it waits, and no entry stamped before that
        // time may queue it. Jobs to wait for come first: it is blocked until they end (and
        // `settle_blocked` judges it with the rest, after this entry).
        if !after.is_empty() {
            job.state = JobState::Blocked;
            job.waits_for_unknown = after.iter().any(|parent| !self.jobs.contains_key(parent));
            job.after = after;
            job.after_any_outcome = after_any_outcome;
        } else if run_at.is_some_and(|run_at| run_at > self.stamp) {
            job.state = JobState::Scheduled;
        }
        if let Some(key) = key {
            self.keys.insert(key.clone(), job_id);
        }
        self.submitted_at.insert(job_id, at);
        let (queue_of_parent, key_of_parent) = (job.queue.clone(), job.fairness_key.clone());
        if task.is_data_parallel() {
            job.state = JobState::Running;
            job.partitions = partitions.to_vec();
            self.jobs.insert(job_id, job);
            for (index, (part, piece)) in partitions.iter().zip(pieces).enumerate() {
                let mut child = ModelJob::new(piece, max_attempts);
                child.created = self.stamp;
                child.queue = queue_of_parent.clone();
                child.fairness_key = key_of_parent.clone();
                child.priority = priority;
                child.queued = (at, self.stamp);
                child.parent = Some((job_id, index as u32));
                child.timeout_millis = timeout_millis;
                self.jobs.insert(*part, child);
                self.submitted_at.insert(*part, at);
            }
            if partitions.is_empty() {
                self.finish_parent(job_id)?;
            }
        } else {
            self.jobs.insert(job_id, job);
        }
        Ok(())
    }

    /// Attempts running in `queue`: its jobs holding a lease.
    pub fn running_in(&self, queue: &str) -> u64 {
        self.jobs
            .values()
            .filter(|job| job.queue == queue && job.lease.is_some())
            .count() as u64
    }

    /// Attempts of `queue` with fairness key `key` running now.
    fn running_with_key(&self, queue: &str, key: &str) -> u64 {
        self.jobs
            .values()
            .filter(|job| job.queue == queue && job.fairness_key == key && job.lease.is_some())
            .count() as u64
    }

    /// Jobs of `queue` not yet terminal.
    fn unfinished_in(&self, queue: &str) -> u64 {
        self.jobs
            .values()
            .filter(|job| job.queue == queue && !job.state.is_terminal())
            .count() as u64
    }

    /// Whether `job`'s queue lets it start at entry `at`, by the rules in effect there: not
    /// paused; fewer running than its concurrency limit, and than its per-key limit among the
    /// jobs with the same key; a start now keeps every run of the queue's starts since its
    /// rate was set within the rate (by entry stamps); and every run of the key's starts since
    /// the per-key rate was set within that rate, timed by the queue's clock (see
    /// [`within_rate`]).
    fn within_queue_rules(&self, at: LogIndex, job: &ModelJob) -> bool {
        let rules = self.rules_of(&job.queue, at);
        if rules.paused {
            return false;
        }
        if rules
            .concurrency
            .is_some_and(|limit| self.running_in(&job.queue) >= u64::from(limit))
        {
            return false;
        }
        if !job.fairness_key.is_empty()
            && rules.key_concurrency.is_some_and(|limit| {
                self.running_with_key(&job.queue, &job.fairness_key) >= u64::from(limit)
            })
        {
            return false;
        }
        if let Some(rate) = rules.rate {
            let earlier = self.rate_starts.get(&job.queue);
            if !within_rate(earlier.map_or(&[][..], Vec::as_slice), self.stamp, rate) {
                return false;
            }
        }
        if let Some(rate) = rules.key_rate.filter(|_| !job.fairness_key.is_empty()) {
            let lane = (job.queue.clone(), job.fairness_key.clone());
            let earlier = self.key_rate_starts.get(&lane);
            let now = self.key_clock(&job.queue);
            if !within_rate(earlier.map_or(&[][..], Vec::as_slice), now, rate) {
                return false;
            }
        }
        true
    }

    /// The time a start in `queue` now is judged at under a per-key rate: this entry's stamp,
    /// or the latest stamp of a start in the queue if that is later.
    fn key_clock(&self, queue: &str) -> u64 {
        self.key_clocks
            .get(queue)
            .map_or(self.stamp, |clock| self.stamp.max(*clock))
    }

    /// A queue's settings in effect once entry `at` has applied.
    pub fn rules_of(&self, queue: &str, at: LogIndex) -> QueueRules {
        self.queues
            .get(queue)
            .and_then(|changes| changes.iter().rev().find(|(index, _)| *index <= at))
            .map_or(NEW_QUEUE, |(_, rules)| *rules)
    }

    /// An operator's change: the settings it names replace the current ones. A leader proposes
    /// only changes within bounds, so one outside them is a finding, not a refusal.
    fn set_queue(&mut self, at: LogIndex, queue: &str, change: &QueueChange) -> Check {
        ensure!(
            change.weight.is_none_or(|w| (1..=1000).contains(&w))
                && change.aging_millis.is_none_or(|a| a >= 1)
                && [change.rate, change.key_rate]
                    .iter()
                    .flatten()
                    .all(|r| r.starts == 0 || r.per_millis >= 1)
                && (change.weight.is_some()
                    || change.paused.is_some()
                    || change.aging_millis.is_some()
                    || change.concurrency.is_some()
                    || change.key_concurrency.is_some()
                    || change.rate.is_some()
                    || change.key_rate.is_some()
                    || change.max_active_jobs.is_some()),
            "queues: entry {at} changes queue {queue:?} with settings out of bounds: {change:?}"
        );
        let mut rules = self.rules_of(queue, at);
        if let Some(paused) = change.paused {
            rules.paused = paused;
        }
        if let Some(aging_millis) = change.aging_millis {
            rules.aging_millis = aging_millis;
        }
        if let Some(limit) = change.concurrency {
            rules.concurrency = (limit > 0).then_some(limit);
        }
        if let Some(limit) = change.key_concurrency {
            rules.key_concurrency = (limit > 0).then_some(limit);
        }
        if let Some(limit) = change.max_active_jobs {
            rules.max_active_jobs = (limit > 0).then_some(limit);
        }
        if let Some(rate) = change.rate {
            // A rate set anew counts starts from here, with a full bucket.
            rules.rate = (rate.starts > 0).then_some((rate.starts, rate.per_millis));
            self.rate_starts.remove(queue);
        }
        if let Some(rate) = change.key_rate {
            // So does a per-key rate, for every key.
            rules.key_rate = (rate.starts > 0).then_some((rate.starts, rate.per_millis));
            self.key_rate_starts.retain(|(q, _), _| q != queue);
        }
        self.queues
            .entry(queue.to_owned())
            .or_default()
            .push((at, rules));
        Ok(())
    }

    /// Priority within a queue and fairness key: the job an `Assign` at `at` starts, picked by
    /// a leader whose table had applied `as_of`, must not pass over a job of its queue, key and
    /// kind with a higher priority that had been queued since `as_of` or earlier (that leader
    /// saw it) and still is — unless it had itself waited its queue's ageing bound, or the other
    /// job's own assignment was on its way then (an `Assign` of it after `as_of`, which the
    /// table refused when it applied: a pause or a limit came first).
    fn check_priority(&self, at: LogIndex, job_id: JobId, as_of: LogIndex) -> Check {
        let job = self.job(&job_id)?;
        let aging = self.rules_of(&job.queue, as_of).aging_millis;
        if self.stamp.saturating_sub(job.queued.1) >= aging {
            return Ok(());
        }
        let passed_over = self.jobs.iter().find(|(id, other)| {
            **id != job_id
                && other.state == JobState::Queued
                && other.queued.0 <= as_of
                && !self
                    .last_assign
                    .get(id)
                    .is_some_and(|assigned| *assigned > as_of && *assigned < at)
                && other.priority > job.priority
                && other.queue == job.queue
                && other.fairness_key == job.fairness_key
                && other.task.kind() == job.task.kind()
        });
        if let Some((id, other)) = passed_over {
            return Err(format!(
                "priority: job {job_id} (priority {}) started at entry {at}, picked as of entry {as_of}, while job {id} of the same queue {:?}, key {:?} and kind had waited since entry {} with priority {}",
                job.priority, job.queue, job.fairness_key, other.queued.0, other.priority
            ));
        }
        Ok(())
    }

    fn partition_completed(&mut self, job_id: JobId) -> Check {
        let Some((parent, _)) = self.jobs.get(&job_id).and_then(|j| j.parent) else {
            return Ok(());
        };
        let done = self.jobs.get(&parent).is_some_and(|p| {
            p.state == JobState::Running
                && p.partitions.iter().all(|id| {
                    self.jobs
                        .get(id)
                        .is_some_and(|j| j.state == JobState::Completed)
                })
        });
        if done {
            self.finish_parent(parent)?;
        }
        Ok(())
    }

    /// Every partition completed: the parent holds the sequential answer over its whole input.
    fn finish_parent(&mut self, parent: JobId) -> Check {
        let task = self.job(&parent)?.task.clone();
        let job = self.job_mut(&parent)?;
        match tasks::execute(&task, Attempt(0)) {
            Ok(output) => {
                job.state = JobState::Completed;
                job.result = Some(output);
            }
            Err(_) => job.state = JobState::Failed,
        }
        Ok(())
    }

    fn partition_failed(&mut self, at: LogIndex, job_id: JobId) -> Check {
        let Some((parent, _)) = self.jobs.get(&job_id).and_then(|j| j.parent) else {
            return Ok(());
        };
        let Some(p) = self.jobs.get_mut(&parent) else {
            return Ok(());
        };
        if p.state != JobState::Running {
            return Ok(());
        }
        p.state = JobState::Failed;
        for part in p.partitions.clone() {
            self.cancel_one(at, part)?;
        }
        Ok(())
    }

    /// After every entry: each blocked job one of whose jobs ended `FAILED` or `CANCELLED` is
    /// cancelled (unless it runs after any outcome), or waits for one the rules do not hold,
    /// and each whose jobs all ended is released, to wait for its time if that is still
    /// ahead of the entry's stamp, else queued by this entry; repeated until nothing changes,
    /// since a cancel may settle the jobs waiting for the cancelled one.
    fn settle_blocked(&mut self, at: LogIndex) -> Check {
        loop {
            let mut cancel = Vec::new();
            let mut release = Vec::new();
            for (id, job) in &self.jobs {
                if job.state != JobState::Blocked {
                    continue;
                }
                let states: Vec<Option<JobState>> = job
                    .after
                    .iter()
                    .map(|parent| self.jobs.get(parent).map(|p| p.state))
                    .collect();
                let bad = states
                    .iter()
                    .any(|s| matches!(s, Some(JobState::Failed | JobState::Cancelled)));
                // One it waited for that the rules did not hold when it was submitted
                // (purged, or never created): how that one ended is unknown, so it never runs.
                // One purged since has ended, and was judged then.
                if job.waits_for_unknown || (bad && !job.after_any_outcome) {
                    cancel.push(*id);
                } else if states.iter().flatten().all(|s| s.is_terminal()) {
                    release.push(*id);
                }
            }
            if cancel.is_empty() && release.is_empty() {
                return Ok(());
            }
            for id in cancel {
                self.cancel_one(at, id)?;
            }
            let stamp = self.stamp;
            for id in release {
                let job = self.job_mut(&id)?;
                if job.run_at.is_some_and(|run_at| run_at > stamp) {
                    job.state = JobState::Scheduled;
                } else {
                    job.state = JobState::Queued;
                    job.queued = (at, stamp);
                }
            }
        }
    }

    /// `Due`: each named job still waiting whose time this entry's stamp has reached is
    /// queued by it; any other stays as it is.
    fn due(&mut self, at: LogIndex, job_ids: &[JobId]) {
        let stamp = self.stamp;
        for job_id in job_ids {
            if let Some(job) = self.jobs.get_mut(job_id) {
                let reached = job.run_at.is_some_and(|run_at| run_at <= stamp);
                if job.state == JobState::Scheduled && reached {
                    job.state = JobState::Queued;
                    job.queued = (at, stamp);
                }
            }
        }
    }

    fn cancel_one(&mut self, at: LogIndex, job_id: JobId) -> Check {
        if let Some(job) = self.jobs.get_mut(&job_id) {
            if !job.state.is_terminal() {
                if let Some(lease) = job.lease.take() {
                    end_attempt(job, lease.id, self.stamp, "cancelled")?;
                }
                job.state = JobState::Cancelled;
                self.cancelled_at.insert(job_id, at);
            }
        }
        Ok(())
    }

    fn job(&self, id: &JobId) -> Result<&ModelJob, String> {
        self.jobs
            .get(id)
            .ok_or_else(|| format!("model: job {id} is missing"))
    }

    fn job_mut(&mut self, id: &JobId) -> Result<&mut ModelJob, String> {
        self.jobs
            .get_mut(id)
            .ok_or_else(|| format!("model: job {id} is missing"))
    }

    /// The product's row for `id` must say what the rules say.
    pub fn matches(&self, row: &Job) -> Check {
        let Some(job) = self.jobs.get(&row.id) else {
            return Err(format!(
                "job {} ({}) exists in a coordinator's table but the rules never created it",
                row.id, row.state
            ));
        };
        let same = row.state == job.state
            && row.attempt.0 == job.attempt
            && row.max_attempts == job.max_attempts
            && row.lease == job.lease
            && row.last_worker == job.last_worker
            && row.result == job.result
            && row.task == job.task
            && row.idempotency_key == job.key
            && row.partition_of.map(|p| (p.parent, p.index)) == job.parent
            && row.partitions == job.partitions
            && row.timeout_millis == job.timeout_millis
            && row.run_at.map(|at| at.0) == job.run_at
            && row.after == job.after
            && row.after_any_outcome == job.after_any_outcome
            && row.partitions_asked == job.partitions_asked
            && row.queue == job.queue
            && row.priority == job.priority
            && row.fairness_key.as_deref().unwrap_or("") == job.fairness_key
            && (job.state != JobState::RetryWait
                || row.retry_delay_millis == job.retry_delay_millis);
        ensure!(
            same,
            "job {} is {} (attempt {}/{}, lease {:?}, result {:?}) in a coordinator's table, but the rules say {} (attempt {}/{}, lease {:?}, result {:?}; its last attempt {})",
            row.id,
            row.state,
            row.attempt,
            row.max_attempts,
            row.lease.as_ref().map(|l| l.id),
            row.result,
            job.state,
            job.attempt,
            job.max_attempts,
            job.lease.as_ref().map(|l| l.id),
            job.result,
            job.last_settled.unwrap_or("not settled yet")
        );
        // The history: the latest attempts the rules recorded, the older ones only counted.
        let kept = job.attempts.len().min(ATTEMPT_HISTORY_MAX);
        let expected = &job.attempts[job.attempts.len() - kept..];
        let recorded: Vec<ModelAttempt> = row
            .history
            .iter()
            .map(|r| ModelAttempt {
                attempt: r.attempt,
                lease_id: r.lease_id,
                worker: r.worker.clone(),
                started: r.started_at_unix_ms.0,
                ended: r
                    .ended_at_unix_ms
                    .map(|e| e.0)
                    .zip(r.outcome.map(|o| o.as_str())),
            })
            .collect();
        ensure!(
            recorded == expected
                && row.history_dropped as usize == job.attempts.len() - kept
                && row.first_started_at.map(|t| t.0) == job.attempts.first().map(|a| a.started),
            "job {}'s history in a coordinator's table is {recorded:?} ({} dropped, first started {:?}), but the rules recorded {expected:?} ({} dropped)",
            row.id,
            row.history_dropped,
            row.first_started_at,
            job.attempts.len() - kept
        );
        Ok(())
    }
}

/// Ends the running attempt `lease_id`, which must be the latest one recorded and still open.
fn end_attempt(job: &mut ModelJob, lease_id: LeaseId, stamp: u64, how: &'static str) -> Check {
    let Some(last) = job.attempts.last_mut() else {
        return Err(format!(
            "model: attempt {lease_id} ends, but none was recorded"
        ));
    };
    ensure!(
        last.lease_id == lease_id && last.ended.is_none(),
        "model: attempt {lease_id} ends, but the latest recorded is {} ({:?})",
        last.lease_id,
        last.ended
    );
    last.ended = Some((stamp.max(last.started), how));
    Ok(())
}

/// Whether `pieces`, in order, hold every item of `whole` exactly once: joined lists equal
/// the list; ranges abut with no gap or overlap from `start` to `end`.
pub fn covers_exactly_once(whole: &TaskSpec, pieces: &[TaskSpec]) -> bool {
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
        _ => pieces.is_empty(),
    }
}

/// Whether a start at `now` keeps every run of the starts at `earlier` (times in milliseconds)
/// and itself within `rate` (`.0` starts per `.1` ms). In the model's own terms: the starts
/// from the `k`-th on, this one included, number `n`; spaced at the steady interval (the
/// period over the starts, rounded up to the microsecond) they would span `n` intervals,
/// which may exceed the time they took by at most one period (the burst of a full bucket).
fn within_rate(earlier: &[u64], now: u64, rate: (u32, u64)) -> bool {
    let (starts, per_millis) = rate;
    let period = i128::from(per_millis) * 1000;
    let interval = (period + i128::from(starts) - 1) / i128::from(starts);
    let now = i128::from(now) * 1000;
    earlier.iter().enumerate().all(|(k, stamp)| {
        let n = (earlier.len() - k + 1) as i128;
        n * interval <= now - i128::from(*stamp) * 1000 + period
    })
}

/// Adds a start at `at` to a rate's history. A start followed by the next at least one
/// interval later never binds again: the later one's run is longer by one start and by at
/// least that interval. Dropped, so the history stays short.
fn record_start(history: &mut Vec<u64>, at: u64, rate: (u32, u64)) {
    let (starts, per_millis) = rate;
    history.push(at);
    let interval = (per_millis * 1000).div_ceil(u64::from(starts));
    while history.len() > 1 && (history[1].saturating_sub(history[0])) * 1000 >= interval {
        history.remove(0);
    }
}
