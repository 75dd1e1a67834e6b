//! Applying one log entry: the router from a command to the change it makes, and the stamp of
//! when each job it ended finished.

use super::invariants::check_row;
use super::submit::Submission;
use super::{Applied, JobTable, Outcome, SubmitOptions};
use crate::command::Command;
use crate::ids::LogIndex;
use crate::time::UnixMillis;

impl JobTable {
    /// Applies the entry at `index`, stamped `at` by its leader. Entries must be applied in
    /// order, each exactly once.
    pub fn apply(&mut self, index: LogIndex, at: UnixMillis, command: &Command) -> Outcome {
        assert_eq!(
            index,
            self.applied.next(),
            "log entries must be applied in order, once"
        );
        self.applied = index;
        self.enqueued_in_entry = 0;
        self.entry_at = at;
        self.release_rate_waits(at);
        let mut follow_on = Vec::new();
        let applied = self.apply_command(index, at, command, &mut follow_on);
        // Jobs that ended release, or cancel, the jobs waiting for them (nothing to look at,
        // and nothing allocated, while no job waits).
        if !self.dependents.is_empty() {
            let changed = std::iter::once(&applied)
                .chain(&follow_on)
                .filter_map(Applied::changed_job)
                .collect();
            self.settle_dependents(changed, &mut follow_on);
        }
        let outcome = Outcome { applied, follow_on };
        self.stamp_finished(at, &outcome);
        if cfg!(debug_assertions) {
            for job_id in outcome.changed_jobs() {
                if let Some(job) = self.jobs.get(&job_id) {
                    if let Err(detail) = check_row(job) {
                        panic!("apply broke job {job_id}: {detail}");
                    }
                }
            }
        }
        outcome
    }

    fn apply_command(
        &mut self,
        index: LogIndex,
        at: UnixMillis,
        command: &Command,
        follow_on: &mut Vec<Applied>,
    ) -> Applied {
        let applied = match command {
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
                retry_of,
                after,
                after_any_outcome,
            } => {
                return self.apply_submit(
                    (index, at),
                    Submission {
                        submitted_by,
                        job_id: *job_id,
                        options: SubmitOptions {
                            task,
                            max_attempts: *max_attempts,
                            partitions_asked: *partitions_asked,
                            timeout_millis: *timeout_millis,
                            queue,
                            priority: *priority,
                            fairness_key: fairness_key.as_deref(),
                        },
                        idempotency_key,
                        max_active_jobs: *max_active_jobs,
                        partitions,
                        run_at: *run_at,
                        retry_of: *retry_of,
                        after,
                        after_any_outcome: *after_any_outcome,
                    },
                    follow_on,
                )
            }
            Command::Assign { job_id, lease, .. } => self.apply_assign(*job_id, lease, follow_on),
            Command::SetQueue { queue, change } => self.apply_set_queue(queue, change),
            Command::Complete {
                job_id,
                lease_id,
                output,
            } => self.apply_complete(*job_id, *lease_id, output),
            Command::AttemptFailed {
                job_id,
                lease_id,
                cause,
                retry_delay_millis,
                permanent,
                kind,
            } => self.apply_attempt_failed(
                (*job_id, *lease_id),
                (*kind, cause),
                (!permanent).then_some(*retry_delay_millis),
            ),
            Command::Release { job_id, lease_id } => self.apply_release(*job_id, *lease_id),
            Command::Requeue { job_id } => self.apply_requeue(*job_id),
            Command::Cancel { job_id } => {
                // A partition is cancelled by cancelling its whole job.
                let target = match self.jobs.get(job_id).and_then(|j| j.partition_of) {
                    Some(of) => of.parent,
                    None => *job_id,
                };
                self.apply_cancel(target, follow_on)
            }
            Command::Abandon { job_id, lease_id } => self.apply_abandon(*job_id, *lease_id),
            Command::NewLeader { leader } => Applied::NewLeader {
                leader: leader.clone(),
            },
            Command::Purge { job_ids } => self.apply_purge(job_ids, follow_on),
            Command::Due { job_ids } => self.apply_due(job_ids, at, follow_on),
        };
        // What a partition's fate means for its parent.
        match &applied {
            Applied::Completed { job_id, .. } => self.partition_completed(*job_id, follow_on),
            Applied::FailedPermanently { job_id, error, .. } => {
                let error = error.clone();
                self.partition_failed(*job_id, &error, follow_on);
            }
            _ => {}
        }
        applied
    }

    /// Stamps every job this entry made terminal with the entry's wall time, and enters those
    /// that retention counts into the finished index. Leaders' clocks may disagree, so a stamp
    /// earlier than the job's creation is raised to it: a job never finishes before it began.
    /// The stamp depends only on the entry and the row, so every member computes the same.
    fn stamp_finished(&mut self, at: UnixMillis, outcome: &Outcome) {
        for job_id in outcome.changed_jobs() {
            let Some(job) = self.jobs.get_mut(&job_id) else {
                continue; // removed by a purge
            };
            if job.state.is_terminal() && job.finished_at.is_none() {
                let finished_at = at.max(job.created_at);
                job.finished_at = Some(finished_at);
                if job.partition_of.is_none() {
                    self.finished.insert((finished_at, job_id));
                }
            }
        }
    }
}
