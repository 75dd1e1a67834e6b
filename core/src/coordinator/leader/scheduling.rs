//! Scheduling at the leader: FIFO over the queued jobs that some worker with a free slot
//! serves, each onto the least-loaded such worker, under a fresh lease drawn from the member's
//! seeded RNG. A job whose kind no worker serves waits without holding up the jobs behind it.

use std::collections::BTreeMap;

use super::LeaderState;
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::coordinator::WorkerEntry;
use crate::ids::{JobId, LeaseId};
use crate::job::Lease;

impl LeaderState {
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
        let mut budget: BTreeMap<&str, usize> = BTreeMap::new();
        for worker in self.registry.with_free_slots() {
            for kind in &worker.tasks {
                if m.table.queued_of_kind(kind).next().is_some() {
                    *budget.entry(kind.as_str()).or_default() += worker.free_slots() as usize;
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
            let table = &m.table;
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
            let Some(worker) = self.registry.least_loaded_for(job.task.kind(), siblings_on) else {
                continue; // every worker serving this kind filled up meanwhile
            };
            assert!(
                worker.serves(job.task.kind()) && worker.takes_work(),
                "scheduled a {} job onto worker {}, which does not serve it or takes no work",
                job.task.kind(),
                worker.id
            );
            let worker_id = worker.id.clone();
            let incarnation = worker.incarnation;
            let lease = Lease {
                id: LeaseId::random(&mut m.rng),
                worker: worker_id.clone(),
                incarnation,
            };
            if let Some(entry) = self.registry.get_mut(&worker_id) {
                entry.leases.insert(lease.id, job_id);
                assert!(
                    entry.leases.len() <= entry.lease_bound(),
                    "worker {worker_id} given {} leases; it has {} slots and prefetches {}",
                    entry.leases.len(),
                    entry.capacity,
                    entry.prefetch
                );
            }
            self.assigning.insert(job_id);
            self.propose(m, Command::Assign { job_id, lease }, None);
        }
    }
}
