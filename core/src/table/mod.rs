//! The job table: the deterministic state every member derives from the log.
//!
//! `JobTable::apply` is a pure function of the table and a [`Command`]: it draws no randomness
//! and reads no clock (a retry delay or a fresh id is chosen by the leader when it proposes, and
//! travels inside the command). So every replica that applies the same log reaches the same
//! table, and every safety check that matters lives here, where no replica can skip it:
//!
//! - admission control (`Submit` carries the limit in force when it was proposed),
//! - idempotency keys (checked before admission),
//! - the lease check (a `Complete`, `AttemptFailed` or `Abandon` counts only with the current lease),
//! - the attempt budget and the final-attempt rule,
//! - data-parallel jobs: a parent and its partitions are created by one `Submit`; the parent
//!   completes with the aggregate when its last partition completes, fails (cancelling the
//!   rest) when one fails for good, and a cancel of either cancels the whole job.
//!
//! One command can change several jobs (a parent and its partitions), so applying returns an
//! [`Outcome`]: what happened to the job the command names, then what followed from it.
//! Expected refusals (a stale result, a cancel that lost a race with completion) are ordinary
//! `Applied` outcomes and change nothing. A broken invariant is a bug and panics.
//!
//! One role per file:
//!
//! | file            | role                                                              |
//! |-----------------|-------------------------------------------------------------------|
//! | `mod.rs`        | the table's fields, its queries, the queue and id helpers          |
//! | `outcome.rs`    | what applying a command did (`Applied`, `Outcome`), load errors    |
//! | `apply.rs`      | `apply`: the router from a command to the change it makes          |
//! | `submit.rs`     | `Submit`: idempotency, admission, creating a job and its partitions |
//! | `attempts.rs`   | one attempt's life: assign, complete, fail, release, requeue, abandon |
//! | `cancel.rs`     | `Cancel`, and cancelling one job for any reason                    |
//! | `scheduled.rs`  | delayed jobs: the index by `run_at`, and `Due` queueing them       |
//! | `dependencies.rs` | jobs waiting for others (`after`): blocking, releasing, cancelling |
//! | `purge.rs`      | `Purge`: retention removing finished jobs                          |
//! | `queues.rs`     | `SetQueue`, creating queues, the rules that hold a queue back      |
//! | `key_rates.rs`  | per-key rate buckets, and parking the lanes of keys out of tokens  |
//! | `usage.rs`      | what each queue and key runs and holds unfinished                  |
//! | `cascade.rs`    | data-parallel jobs: what a partition's fate means for its parent   |
//! | `load.rs`       | rebuilding a table from stored rows, every derived index recomputed |
//! | `view.rs`       | what clients see of a job                                          |
//! | `snapshot.rs`   | the table's rows as the bytes a snapshot carries                   |
//! | `invariants.rs` | the table's promises, checked after every step by tests and the simulator |

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::{JobId, LogIndex};
use crate::job::{Job, JobState};
use crate::limits::QUEUE_POSITIONS_PER_ENTRY;
use crate::queues::{JobQueue, QueueState};
use crate::tasks::{Partitions, TaskSpec};
use crate::time::UnixMillis;
use key_rates::KeyBuckets;
use usage::QueueUsage;

mod apply;
mod attempts;
mod cancel;
mod cascade;
mod dependencies;
mod invariants;
mod key_rates;
mod load;
mod outcome;
mod purge;
mod queues;
mod scheduled;
mod snapshot;
mod submit;
mod usage;
mod view;

pub use outcome::{Applied, Outcome, StaleReason, TableError};
pub use snapshot::{decode_snapshot, encode_snapshot};

/// The job table: the state every coordinator derives from the log.
#[derive(Clone, Debug, Default)]
pub struct JobTable {
    jobs: BTreeMap<JobId, Job>,
    /// `QUEUED` jobs in FIFO order, keyed by `Job::queue_seq`, and in scheduling order (by
    /// kind, queue, fairness key and priority; see [`crate::queues`]).
    queue: JobQueue,
    /// Every queue a job was submitted to or an operator configured: its settings and pass.
    queues: BTreeMap<String, QueueState>,
    /// Queues whose row changed since the coordinator last took them (to persist them).
    queues_changed: BTreeSet<String>,
    /// What each queue runs and holds unfinished, against its limits.
    usage: QueueUsage,
    /// The rate buckets of fairness keys under their queue's per-key rate.
    key_buckets: KeyBuckets,
    /// Jobs enqueued so far by the entry being applied. A queue position is the entry's index
    /// times `QUEUE_POSITIONS_PER_ENTRY` plus this: a function of the log alone, so a table
    /// rebuilt from rows (whatever was purged) hands out exactly the positions a table that
    /// applied every entry does.
    enqueued_in_entry: u64,
    /// The wall-time stamp of the entry being applied, for the attempt history.
    entry_at: UnixMillis,
    /// A job not yet terminal -> the `BLOCKED` jobs waiting for it (see `dependencies.rs`).
    dependents: BTreeMap<JobId, BTreeSet<JobId>>,
    /// `SCHEDULED` jobs by when they may run (see `scheduled.rs`).
    scheduled: BTreeSet<(UnixMillis, JobId)>,
    /// Idempotency key, within its submitter -> job, for the job's whole life.
    idempotency: BTreeMap<ScopedKey, JobId>,
    /// Jobs in submission order (for listing).
    by_submission: BTreeMap<LogIndex, JobId>,
    /// Non-terminal jobs: the admission counter.
    active: u64,
    /// Terminal jobs that are not partitions, by when they finished: what retention purges,
    /// oldest first.
    finished: BTreeSet<(UnixMillis, JobId)>,
    /// The last log index applied.
    applied: LogIndex,
}

impl JobTable {
    pub fn new() -> JobTable {
        JobTable::default()
    }

    pub fn get(&self, job_id: &JobId) -> Option<&Job> {
        self.jobs.get(job_id)
    }

    pub fn jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Non-terminal jobs (the admission counter).
    pub fn active_jobs(&self) -> u64 {
        self.active
    }

    /// Terminal jobs that retention may purge (partitions go with their job), oldest first:
    /// when each finished, and its id.
    pub fn finished_oldest_first(&self) -> impl Iterator<Item = (UnixMillis, JobId)> + '_ {
        self.finished.iter().copied()
    }

    /// How many terminal jobs retention counts (partitions are not counted on their own).
    pub fn finished_jobs(&self) -> u64 {
        self.finished.len() as u64
    }

    pub fn applied_index(&self) -> LogIndex {
        self.applied
    }

    /// `QUEUED` jobs, oldest first.
    pub fn queued(&self) -> impl Iterator<Item = JobId> + '_ {
        self.queue.iter()
    }

    /// The queued jobs in scheduling order (see [`crate::queues`]).
    pub fn queue_index(&self) -> &JobQueue {
        &self.queue
    }

    /// Every queue, by name.
    pub fn queues(&self) -> impl Iterator<Item = &QueueState> {
        self.queues.values()
    }

    pub fn queue_state(&self, name: &str) -> Option<&QueueState> {
        self.queues.get(name)
    }

    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Attempts running in `queue` now.
    pub fn running_in(&self, queue: &str) -> u64 {
        self.usage.running(queue)
    }

    /// Jobs of `queue` not yet terminal.
    pub fn active_in(&self, queue: &str) -> u64 {
        self.usage.active(queue)
    }

    /// Attempts of `queue` with fairness key `key` running now.
    pub fn running_with_key(&self, queue: &str, key: &str) -> u64 {
        self.usage.running_with_key(queue, key)
    }

    /// Whether `queue` runs as many attempts as its concurrency limit allows (or more, after
    /// the limit was lowered), counting `starting` more on their way.
    pub fn queue_full(&self, queue: &str, starting: u64) -> bool {
        self.queues
            .get(queue)
            .and_then(|q| q.settings.concurrency)
            .is_some_and(|limit| {
                self.running_in(queue).saturating_add(starting) >= u64::from(limit)
            })
    }

    /// Whether `key` runs as many attempts in `queue` as the queue's per-key limit allows,
    /// counting `starting` more on their way. Jobs without a key are not limited by it.
    pub fn key_full(&self, queue: &str, key: Option<&str>, starting: u64) -> bool {
        let Some(key) = key else {
            return false;
        };
        self.queues
            .get(queue)
            .and_then(|q| q.settings.key_concurrency)
            .is_some_and(|limit| {
                self.running_with_key(queue, key).saturating_add(starting) >= u64::from(limit)
            })
    }

    /// An attempt of `job_id` took a lease: its queue (and key) runs one more.
    pub(super) fn attempt_started(&mut self, job_id: JobId) {
        let Some(job) = self.jobs.get(&job_id) else {
            panic!("job {job_id} vanished during apply");
        };
        self.usage.started(job);
    }

    /// An attempt of `job_id` gave its lease up: its queue (and key) runs one fewer.
    pub(super) fn attempt_left(&mut self, job_id: JobId) {
        let Some(job) = self.jobs.get(&job_id) else {
            panic!("job {job_id} vanished during apply");
        };
        self.usage.left(job);
    }

    /// The queues whose rows changed since the last call, to be persisted.
    pub fn take_changed_queues(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.queues_changed)
    }

    /// Jobs in submission order, newest first.
    pub fn newest_first(&self) -> impl Iterator<Item = &Job> {
        self.newest_first_before(None)
    }

    /// Jobs submitted before log index `before` (all of them for `None`), newest first.
    pub fn newest_first_before(&self, before: Option<LogIndex>) -> impl Iterator<Item = &Job> {
        let end = before.unwrap_or(LogIndex(u64::MAX));
        self.by_submission
            .range(..end)
            .rev()
            .filter_map(|(_, id)| self.jobs.get(id))
    }

    /// The job an idempotency key names, and whether the submission matches it: the same
    /// task, attempts, timeout and (for a data-parallel task) partition request. A row written
    /// before the partition request was recorded matches any.
    /// `Some(Ok(id))`: replay; `Some(Err(id))`: conflict; `None`: the key is new.
    pub fn check_idempotency(
        &self,
        key: &ScopedKey,
        asked: &SubmitOptions<'_>,
    ) -> Option<Result<JobId, JobId>> {
        let &job_id = self.idempotency.get(key)?;
        let job = self.jobs.get(&job_id)?;
        let same_split =
            job.partitions_asked.is_none() || job.partitions_asked == asked.partitions_asked;
        if job.task == *asked.task
            && job.max_attempts == asked.max_attempts
            && job.timeout_millis == asked.timeout_millis
            && job.queue == asked.queue
            && job.priority == asked.priority
            && job.fairness_key.as_deref() == asked.fairness_key
            && same_split
        {
            Some(Ok(job_id))
        } else {
            Some(Err(job_id))
        }
    }

    /// `job_id` (in the table, not `QUEUED`) is queued again.
    pub(super) fn enqueue(&mut self, job_id: JobId) {
        transition(self.job_mut(job_id), JobState::Queued);
        self.place_in_queue(job_id);
    }

    /// Files `job_id` (in the table and `QUEUED`) at a fresh queue position, with the turn its
    /// lane gives it and the entry's stamp. A queue that had nothing queued rejoins the others
    /// at the smallest pass among them, so its idle time is not banked as credit.
    pub(super) fn place_in_queue(&mut self, job_id: JobId) {
        let seq = self.take_queue_seq();
        let at = self.entry_at;
        let Some(job) = self.jobs.get(&job_id) else {
            panic!("job {job_id} vanished during apply");
        };
        if self.queue.depth(&job.queue) == 0 {
            let queue = job.queue.clone();
            self.rejoin(&queue);
        }
        let job = self
            .jobs
            .get_mut(&job_id)
            .unwrap_or_else(|| panic!("job {job_id} vanished during apply"));
        assert_eq!(
            job.state,
            JobState::Queued,
            "placing a job that is not queued"
        );
        job.queue_seq = seq;
        job.queued_at = at;
        job.turn = self.queue.next_tag(&job.placement());
        assert!(
            self.queue.insert(seq, job_id, &job.placement(), job.turn),
            "queue position {seq} handed out twice"
        );
        // A key out of rate tokens waits with its lane parked, whichever way its jobs came.
        let Some(job) = self.jobs.get(&job_id) else {
            panic!("job {job_id} vanished during apply");
        };
        if let Some(until) = self.key_rate_due(&job.queue, job.fairness_key.as_deref(), 0, at) {
            let p = job.placement();
            self.queue.park(p.kind, p.queue, p.key, until);
        }
    }

    pub(super) fn take_queue_seq(&mut self) -> u64 {
        assert!(
            self.enqueued_in_entry < QUEUE_POSITIONS_PER_ENTRY,
            "one entry enqueued more jobs than it has queue positions"
        );
        let seq = self.applied.0.saturating_mul(QUEUE_POSITIONS_PER_ENTRY) + self.enqueued_in_entry;
        self.enqueued_in_entry += 1;
        seq
    }

    /// The smallest pass among the queues other than `except` that compete for starts now:
    /// with a job queued, not paused and below their concurrency limit.
    pub(super) fn floor_pass(&self, except: &str) -> Option<u64> {
        self.queue
            .busy_queues()
            .filter(|name| *name != except)
            .filter_map(|name| self.queues.get(name))
            .filter(|q| !q.settings.paused && !self.queue_full(&q.name, 0))
            .map(|q| q.pass)
            .min()
    }

    /// `queue` starts competing again (its first job queued, or it was resumed): it rejoins at
    /// the floor of the others, so time it spent idle or paused is not banked as credit.
    pub(super) fn rejoin(&mut self, queue: &str) {
        let floor = self.floor_pass(queue);
        let Some(state) = self.queues.get_mut(queue) else {
            panic!("queue {queue:?} rejoins, and the table does not hold it");
        };
        if let Some(floor) = floor.filter(|floor| *floor > state.pass) {
            state.pass = floor;
            self.queues_changed.insert(queue.to_owned());
        }
    }

    /// A job became terminal: it frees its admission slot. The counter counts non-terminal jobs,
    /// so it cannot be zero here; checked in every build, since a wrapped counter would admit
    /// without bound.
    pub(super) fn job_ended(&mut self, job_id: JobId) {
        self.active = self
            .active
            .checked_sub(1)
            .unwrap_or_else(|| panic!("a job ended with no job counted as active"));
        let Some(job) = self.jobs.get(&job_id) else {
            panic!("job {job_id} vanished during apply");
        };
        self.usage.ended(job);
    }

    pub(super) fn job_mut(&mut self, job_id: JobId) -> &mut Job {
        self.jobs
            .get_mut(&job_id)
            .unwrap_or_else(|| panic!("job {job_id} vanished during apply"))
    }
}

pub(super) fn transition(job: &mut Job, to: JobState) {
    if let Err(illegal) = job.transition(to) {
        panic!("job {}: {illegal} (apply checked the state first)", job.id);
    }
}

/// What a submission asks for, which a keyed resend must repeat exactly.
#[derive(Clone, Copy, Debug)]
pub struct SubmitOptions<'a> {
    pub task: &'a TaskSpec,
    pub max_attempts: u32,
    pub partitions_asked: Option<Partitions>,
    pub timeout_millis: Option<u64>,
    pub queue: &'a str,
    pub priority: u8,
    pub fairness_key: Option<&'a str>,
}

/// An idempotency key as the table binds it: within the name of the token that submitted it
/// (`None`: a caller with no token), so one caller's keys never name another's jobs.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ScopedKey {
    pub owner: Option<String>,
    pub key: String,
}

impl ScopedKey {
    /// The key `job` is bound under, if it has one.
    pub fn of(job: &Job) -> Option<ScopedKey> {
        job.idempotency_key.as_ref().map(|key| ScopedKey {
            owner: job.submitted_by.clone(),
            key: key.clone(),
        })
    }
}

impl std::fmt::Display for ScopedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.owner {
            Some(owner) => write!(f, "{:?} of {owner:?}", self.key),
            None => write!(f, "{:?}", self.key),
        }
    }
}
