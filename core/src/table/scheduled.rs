//! Delayed jobs: the index of `SCHEDULED` jobs by the wall time they may run, and `Due`, which
//! queues those whose time an entry's stamp has reached.
//!
//! The index is ordered by `(run_at, id)`, so the leader finds the next job due in O(log n)
//! and a batch of due jobs in O(batch), however many are scheduled. It is derived from the
//! rows (rebuilt on load, checked by `check_invariants`), never stored on its own.

use super::{transition, Applied, JobTable};
use crate::ids::JobId;
use crate::job::JobState;
use crate::time::UnixMillis;

impl JobTable {
    /// `SCHEDULED` jobs, soonest first: when each may run, and its id.
    pub fn scheduled(&self) -> impl Iterator<Item = (UnixMillis, JobId)> + '_ {
        self.scheduled.iter().copied()
    }

    /// How many jobs are `SCHEDULED`.
    pub fn scheduled_jobs(&self) -> u64 {
        self.scheduled.len() as u64
    }

    /// The earliest `run_at` among `SCHEDULED` jobs.
    pub fn next_run_at(&self) -> Option<UnixMillis> {
        self.scheduled.first().map(|(at, _)| *at)
    }

    /// Up to `limit` `SCHEDULED` jobs whose `run_at` is at or before `now`, soonest first.
    pub fn due_by(&self, now: UnixMillis, limit: usize) -> Vec<JobId> {
        self.scheduled
            .iter()
            .take_while(|(at, _)| *at <= now)
            .take(limit)
            .map(|(_, id)| *id)
            .collect()
    }

    /// A new job that waits for `run_at`: filed in the index.
    pub(super) fn schedule(&mut self, job_id: JobId, run_at: UnixMillis) {
        assert!(
            self.scheduled.insert((run_at, job_id)),
            "job {job_id} was scheduled twice"
        );
    }

    /// `job_id` leaves `SCHEDULED` (queued or cancelled): it leaves the index.
    pub(super) fn unschedule(&mut self, job_id: JobId, run_at: Option<UnixMillis>) {
        let Some(run_at) = run_at else {
            panic!("scheduled job {job_id} has no run_at");
        };
        assert!(
            self.scheduled.remove(&(run_at, job_id)),
            "scheduled job {job_id} was missing from the index at {run_at:?}"
        );
    }

    /// `Due`: queues each named job still `SCHEDULED` whose `run_at` is at or before the
    /// entry's stamp `at` (each a `Due` follow-on); skips any other.
    pub(super) fn apply_due(
        &mut self,
        job_ids: &[JobId],
        at: UnixMillis,
        follow_on: &mut Vec<Applied>,
    ) -> Applied {
        let mut queued = 0;
        for &job_id in job_ids {
            let Some(job) = self.jobs.get(&job_id) else {
                continue; // purged after it was cancelled
            };
            if job.state != JobState::Scheduled || job.run_at.is_none_or(|run_at| run_at > at) {
                continue;
            }
            let run_at = job.run_at;
            self.unschedule(job_id, run_at);
            transition(self.job_mut(job_id), JobState::Queued);
            self.place_in_queue(job_id);
            follow_on.push(Applied::Due { job_id });
            queued += 1;
        }
        Applied::DueChecked {
            queued,
            skipped: job_ids.len() as u64 - queued,
        }
    }
}
