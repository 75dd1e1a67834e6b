//! Scheduling at the leader: FIFO over the queued jobs onto the least-loaded live worker with a
//! free slot, each assignment under a fresh lease drawn from the member's seeded RNG.

use super::LeaderState;
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::coordinator::WorkerEntry;
use crate::ids::{JobId, LeaseId};
use crate::job::Lease;

impl LeaderState {
    /// FIFO onto the least-loaded live worker, while both queued jobs and free slots remain.
    pub(in crate::coordinator) fn schedule(&mut self, m: &mut Member) {
        if m.replica.transferring_to().is_some() {
            // Handing over: let the log go quiet so the next leader can catch up.
            return;
        }
        if self.registry.least_loaded().is_none() {
            return;
        }
        let candidates: Vec<JobId> = m
            .table
            .queued()
            .filter(|job_id| !self.assigning.contains(job_id))
            .take(self.registry.iter().map(|w| w.free_slots() as usize).sum())
            .collect();
        for job_id in candidates {
            // Partitions of one job go to distinct workers where capacity allows.
            let parent = m
                .table
                .get(&job_id)
                .and_then(|job| job.partition_of)
                .map(|of| of.parent);
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
            let Some(worker) = self.registry.least_loaded_by(siblings_on) else {
                break;
            };
            let worker_id = worker.id.clone();
            let incarnation = worker.incarnation;
            let lease = Lease {
                id: LeaseId::random(&mut m.rng),
                worker: worker_id.clone(),
                incarnation,
            };
            if let Some(entry) = self.registry.get_mut(&worker_id) {
                entry.leases.insert(lease.id, job_id);
            }
            self.assigning.insert(job_id);
            self.propose(m, Command::Assign { job_id, lease }, None);
        }
    }
}
