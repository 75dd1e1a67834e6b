//! `Cancel`, and cancelling one job for any reason (a client, or its data-parallel job ending).

use super::attempts::close_attempt;
use super::{transition, Applied, JobTable};
use crate::ids::JobId;
use crate::job::{AttemptEnd, JobState};

impl JobTable {
    pub(super) fn apply_cancel(&mut self, job_id: JobId, follow_on: &mut Vec<Applied>) -> Applied {
        let Some(job) = self.jobs.get(&job_id) else {
            return Applied::UnknownJob { job_id };
        };
        if job.state.is_terminal() {
            return Applied::CancelTooLate {
                job_id,
                state: job.state,
            };
        }
        let cancelled = self.cancel_one(job_id, "cancelled by client");
        self.cancel_partitions(job_id, "its job was cancelled", follow_on);
        cancelled.unwrap_or(Applied::UnknownJob { job_id })
    }

    /// Cancels one non-terminal job (revoking its lease); `None` if it is terminal or unknown.
    pub(super) fn cancel_one(&mut self, job_id: JobId, why: &str) -> Option<Applied> {
        let job = self.jobs.get(&job_id)?;
        let previous = job.state;
        if previous.is_terminal() {
            return None;
        }
        // It leaves the index its state files it in.
        match previous {
            JobState::Queued => {
                let removed = self.queue.remove(job.queue_seq, &job.placement());
                assert_eq!(
                    removed,
                    Some(job_id),
                    "queued job {job_id} was not at its queue position"
                );
            }
            JobState::Scheduled => {
                let run_at = job.run_at;
                self.unschedule(job_id, run_at);
            }
            JobState::Blocked => self.unblock(job_id),
            _ => {}
        }
        let Some(job) = self.jobs.get_mut(&job_id) else {
            panic!("job {job_id} vanished during apply");
        };
        job.turn = 0;
        transition(job, JobState::Cancelled);
        let revoked = job.lease.take();
        assert!(
            revoked.is_some() == (previous == JobState::Running && !job.is_parent()),
            "job {job_id} was {previous} with lease {:?}",
            revoked.as_ref().map(|lease| lease.id)
        );
        if let Some(lease) = &revoked {
            close_attempt(job, lease.id, self.entry_at, AttemptEnd::Cancelled, None);
        }
        job.error = Some(why.to_owned());
        if revoked.is_some() {
            self.attempt_left(job_id);
        }
        self.job_ended(job_id);
        Some(Applied::Cancelled {
            job_id,
            previous,
            revoked,
        })
    }
}
