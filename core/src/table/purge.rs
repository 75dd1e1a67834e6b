//! `Purge`: retention removing finished jobs, each with its partitions and its idempotency key.

use super::{Applied, JobTable, ScopedKey};
use crate::ids::JobId;

impl JobTable {
    /// Removes each named job that is terminal and not a partition, with its partitions.
    pub(super) fn apply_purge(
        &mut self,
        job_ids: &[JobId],
        follow_on: &mut Vec<Applied>,
    ) -> Applied {
        let (mut purged, mut skipped) = (0, 0);
        for job_id in job_ids {
            let purgeable = self
                .jobs
                .get(job_id)
                .is_some_and(|j| j.state.is_terminal() && j.partition_of.is_none());
            if !purgeable {
                skipped += 1;
                continue;
            }
            let job = self
                .jobs
                .remove(job_id)
                .unwrap_or_else(|| panic!("job {job_id} vanished during purge"));
            let removed = self
                .finished
                .remove(&(job.finished_at.unwrap_or_default(), *job_id));
            assert!(
                removed,
                "terminal job {job_id} was missing from the finished index"
            );
            self.by_submission.remove(&job.submitted_at);
            if let Some(key) = ScopedKey::of(&job) {
                self.idempotency.remove(&key);
            }
            for part in &job.partitions {
                let row = self.jobs.remove(part);
                assert!(
                    row.is_some_and(|r| r.state.is_terminal()),
                    "terminal job {job_id} had a missing or live partition {part}"
                );
                follow_on.push(Applied::Removed { job_id: *part });
            }
            follow_on.push(Applied::Removed { job_id: *job_id });
            purged += 1;
        }
        Applied::Purged { purged, skipped }
    }
}
