//! Scheduling at the leader: FIFO over the queued jobs that some worker with a free slot
//! serves, each onto the least-loaded such worker, under a fresh lease drawn from the member's
//! seeded RNG. A job whose kind no worker serves waits without holding up the jobs behind it.
//!
//! After the queued jobs come the fresh ones: plain jobs whose `Submit` is proposed and not
//! yet applied. Assigning one now puts its `Assign` in the same write as its `Submit`, so a job
//! that finds a slot free costs one commit before it starts instead of two. Nothing leaves
//! early: the worker hears of the assignment only when the `Assign` applies, after the `Submit`
//! before it in the log. If that `Submit` created no job (an idempotent answer, a refusal at
//! apply), the `Assign` finds no job and its slot is freed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::LeaderState;
use crate::command::{Command, LogEntry};
use crate::coordinator::member::Member;
use crate::coordinator::WorkerEntry;
use crate::ids::{Incarnation, JobId, LeaseId, LogIndex, WorkerId};
use crate::job::Lease;
use crate::table::{Applied, JobTable};

/// A plain job whose `Submit` this leader proposed at `at` and which has not applied yet.
#[derive(Clone, Debug)]
pub(super) struct FreshJob {
    pub(super) at: LogIndex,
    pub(super) job_id: JobId,
    pub(super) kind: String,
}

/// The fresh jobs not yet assigned, in proposal (and so log) order. They are as many as the
/// submissions being written, which admission bounds.
#[derive(Debug, Default)]
pub(super) struct FreshJobs(VecDeque<FreshJob>);

impl FreshJobs {
    pub(super) fn proposed(&mut self, job: FreshJob) {
        assert!(
            self.0.back().is_none_or(|last| last.at < job.at),
            "fresh job {} proposed at {} after one at {:?}",
            job.job_id,
            job.at,
            self.0.back().map(|last| last.at)
        );
        self.0.push_back(job);
    }

    /// The entry at `index` applied: a fresh job proposed there is fresh no longer (it is in the
    /// table now, queued, or it was never created).
    pub(super) fn applied(&mut self, index: LogIndex, job_id: Option<JobId>) {
        let Some(front) = self.0.front() else {
            return;
        };
        // Entries apply in log order and each one applied is checked here, so no fresh job can
        // have been passed over.
        assert!(
            front.at >= index,
            "fresh job {} proposed at {} outlived the apply of that entry (now at {index})",
            front.job_id,
            front.at
        );
        if front.at == index {
            assert_eq!(
                Some(front.job_id),
                job_id,
                "entry {index} applied is not the submission proposed there"
            );
            self.0.pop_front();
        }
    }
}

impl LeaderState {
    /// An entry applied: a job whose `Submit` applied is no longer fresh, and an `Assign` is no
    /// longer in flight (if it found no job, the slot it was given is free again).
    pub(super) fn scheduling_applied(&mut self, entry: &LogEntry, applied: &Applied) {
        let submitted = match &entry.command {
            Command::Submit { job_id, .. } => Some(*job_id),
            _ => None,
        };
        self.fresh.applied(entry.index, submitted);
        if let Command::Assign { job_id, lease } = &entry.command {
            self.assigning.remove(job_id);
            if let Applied::UnknownJob { .. } = applied {
                // A fresh job's `Submit` created no job: the slot it was given is free again.
                if let Some(worker) = self.registry.get_mut(&lease.worker) {
                    worker.free(lease.id);
                }
            }
        }
    }

    /// FIFO onto the least-loaded live worker serving each job's kind, while both queued jobs
    /// and free slots for them remain.
    pub(in crate::coordinator) fn schedule(&mut self, m: &mut Member) {
        if m.replica.transferring_to().is_some() {
            // Handing over: let the log go quiet so the next leader can catch up.
            return;
        }
        let free: usize = self
            .registry
            .with_free_slots()
            .map(|w| w.free_slots() as usize)
            .sum();
        if free == 0 {
            return;
        }
        // Each kind a worker with a free slot serves and has a queued job, with the free slots
        // of the workers serving it. The kinds come from the workers (bounded by their
        // registrations), not from the queue (whose kinds clients choose).
        let fresh_kinds: BTreeSet<&str> = self.fresh.0.iter().map(|f| f.kind.as_str()).collect();
        let mut budget: BTreeMap<&str, usize> = BTreeMap::new();
        let mut fresh_budget: BTreeSet<String> = BTreeSet::new();
        for worker in self.registry.with_free_slots() {
            for kind in &worker.tasks {
                if m.table.queued_of_kind(kind).next().is_some() {
                    *budget.entry(kind.as_str()).or_default() += worker.free_slots() as usize;
                }
                if fresh_kinds.contains(kind.as_str()) {
                    fresh_budget.insert(kind.clone());
                }
            }
        }
        // The oldest jobs of each kind, as many as its workers have room for, merged back into
        // queue order.
        let mut candidates: Vec<(u64, JobId)> = Vec::new();
        for (kind, room) in &budget {
            candidates.extend(
                m.table
                    .queued_of_kind(kind)
                    .filter(|(_, job_id)| !self.assigning.contains(job_id))
                    .take((*room).min(free)),
            );
        }
        candidates.sort_unstable();
        for (_, job_id) in candidates {
            let Some(job) = m.table.get(&job_id) else {
                continue;
            };
            // Partitions of one job go to distinct workers where capacity allows.
            let parent = job.partition_of.map(|of| of.parent);
            let Some(worker) = self.pick_worker(&m.table, job.task.kind(), parent) else {
                continue; // every worker serving this kind filled up meanwhile
            };
            self.assign(m, job_id, worker);
        }
        if fresh_budget.is_empty() {
            return;
        }
        // Then the fresh jobs, oldest first, while some worker serving their kind has room.
        let mut fresh = std::mem::take(&mut self.fresh.0);
        fresh.retain(|job| {
            if !fresh_budget.contains(&job.kind) {
                return true;
            }
            match self.pick_worker(&m.table, &job.kind, None) {
                Some(worker) => {
                    self.assign(m, job.job_id, worker);
                    false
                }
                None => {
                    fresh_budget.remove(&job.kind);
                    true
                }
            }
        });
        assert!(
            self.fresh.0.is_empty(),
            "fresh jobs proposed while scheduling"
        );
        self.fresh.0 = fresh;
    }

    /// The least-loaded worker with a free slot serving `kind`, counting for a partition of
    /// `parent` how many of its siblings each worker already runs.
    fn pick_worker(
        &self,
        table: &JobTable,
        kind: &str,
        parent: Option<JobId>,
    ) -> Option<(WorkerId, Incarnation)> {
        let siblings_on = |worker: &WorkerEntry| match parent {
            Some(parent) => worker
                .leases
                .values()
                .filter(|id| {
                    table
                        .get(id)
                        .and_then(|job| job.partition_of)
                        .is_some_and(|of| of.parent == parent)
                })
                .count(),
            None => 0,
        };
        let worker = self.registry.least_loaded_for(kind, siblings_on)?;
        assert!(
            worker.serves(kind) && worker.takes_work(),
            "scheduled a {kind} job onto worker {}, which does not serve it or takes no work",
            worker.id
        );
        Some((worker.id.clone(), worker.incarnation))
    }

    /// Proposes `job_id`'s next attempt on `worker` under a fresh lease.
    fn assign(&mut self, m: &mut Member, job_id: JobId, worker: (WorkerId, Incarnation)) {
        let (worker_id, incarnation) = worker;
        let lease = Lease {
            id: LeaseId::random(&mut m.rng),
            worker: worker_id.clone(),
            incarnation,
        };
        if let Some(entry) = self.registry.get_mut(&worker_id) {
            let earlier = entry.leases.insert(lease.id, job_id);
            assert!(earlier.is_none(), "lease {} handed out twice", lease.id);
            assert!(
                entry.leases.len() <= entry.lease_bound(),
                "worker {worker_id} given {} leases; it has {} slots and prefetches {}",
                entry.leases.len(),
                entry.capacity,
                entry.prefetch
            );
        }
        assert!(
            self.assigning.insert(job_id),
            "job {job_id} assigned while an assignment of it is in flight"
        );
        self.propose(m, Command::Assign { job_id, lease }, None);
    }
}
