//! Data-parallel jobs: what a partition's fate means for its parent. The parent completes with
//! the aggregate when its last partition completes, and fails (cancelling the rest) when one
//! fails for good.

use super::{transition, Applied, JobTable};
use crate::ids::JobId;
use crate::job::JobState;
use crate::tasks::{aggregate, TaskOutput};

impl JobTable {
    /// A partition completed: if it was its parent's last, the parent completes.
    pub(super) fn partition_completed(&mut self, job_id: JobId, follow_on: &mut Vec<Applied>) {
        let Some(parent) = self.jobs.get(&job_id).and_then(|j| j.partition_of) else {
            return;
        };
        let all_done = self.jobs.get(&parent.parent).is_some_and(|p| {
            p.state == JobState::Running
                && p.partitions.iter().all(|id| {
                    self.jobs
                        .get(id)
                        .is_some_and(|j| j.state == JobState::Completed)
                })
        });
        if all_done {
            self.finish_parent(parent.parent, follow_on);
        }
    }

    /// Completes a running parent with the aggregate of its partitions' results, in order;
    /// fails it if the results cannot be combined (a worker reported the wrong kind).
    pub(super) fn finish_parent(&mut self, parent: JobId, follow_on: &mut Vec<Applied>) {
        let Some(job) = self.jobs.get(&parent) else {
            return;
        };
        let results: Vec<&TaskOutput> = job
            .partitions
            .iter()
            .filter_map(|id| self.jobs.get(id).and_then(|j| j.result.as_ref()))
            .collect();
        let combined = if results.len() == job.partitions.len() {
            aggregate(&job.task, &results)
        } else {
            Err("a partition has no result".to_string())
        };
        match combined {
            Ok(output) => {
                let job = self.job_mut(parent);
                transition(job, JobState::Completed);
                job.result = Some(output);
                job.error = None;
                self.job_ended(parent);
                follow_on.push(Applied::ParentCompleted { job_id: parent });
            }
            Err(error) => self.fail_parent(parent, error, follow_on),
        }
    }

    /// A partition failed for good: its parent fails, and its other partitions are cancelled.
    pub(super) fn partition_failed(
        &mut self,
        job_id: JobId,
        error: &str,
        follow_on: &mut Vec<Applied>,
    ) {
        let Some(of) = self.jobs.get(&job_id).and_then(|j| j.partition_of) else {
            return;
        };
        let error = format!("partition {} (job {job_id}) failed: {error}", of.index);
        self.fail_parent(of.parent, error, follow_on);
    }

    pub(super) fn fail_parent(
        &mut self,
        parent: JobId,
        error: String,
        follow_on: &mut Vec<Applied>,
    ) {
        if self
            .jobs
            .get(&parent)
            .is_none_or(|p| p.state != JobState::Running)
        {
            return;
        }
        let job = self.job_mut(parent);
        transition(job, JobState::Failed);
        job.error = Some(error.clone());
        self.job_ended(parent);
        follow_on.push(Applied::ParentFailed {
            job_id: parent,
            error,
        });
        self.cancel_partitions(parent, "its job failed", follow_on);
    }

    /// Cancels every non-terminal partition of `parent`, each a follow-on of its own.
    pub(super) fn cancel_partitions(
        &mut self,
        parent: JobId,
        why: &str,
        follow_on: &mut Vec<Applied>,
    ) {
        let partitions = self
            .jobs
            .get(&parent)
            .map(|p| p.partitions.clone())
            .unwrap_or_default();
        for id in partitions {
            if let Some(cancelled) = self.cancel_one(id, why) {
                follow_on.push(cancelled);
            }
        }
    }
}
