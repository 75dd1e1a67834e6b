//! `Submit`: idempotency first, then the partition check, admission, and creating the job (with
//! its partitions, for a data-parallel task).

use std::collections::BTreeSet;

use super::{transition, Applied, JobTable, ScopedKey, SubmitOptions};
use crate::ids::{Attempt, JobId, LogIndex};
use crate::job::{Job, JobState, PartitionOf};
use crate::tasks::TaskSpec;
use crate::time::UnixMillis;

/// The fields of a `Submit`, borrowed.
pub(super) struct Submission<'a> {
    pub(super) submitted_by: &'a Option<String>,
    pub(super) job_id: JobId,
    pub(super) options: SubmitOptions<'a>,
    pub(super) idempotency_key: &'a Option<String>,
    pub(super) max_active_jobs: u64,
    pub(super) partitions: &'a [JobId],
    pub(super) run_at: Option<UnixMillis>,
    pub(super) retry_of: Option<JobId>,
    pub(super) after: &'a [JobId],
    pub(super) after_any_outcome: bool,
}

impl JobTable {
    pub(super) fn apply_submit(
        &mut self,
        (index, at): (LogIndex, UnixMillis),
        submission: Submission<'_>,
        follow_on: &mut Vec<Applied>,
    ) -> Applied {
        let scoped = submission.idempotency_key.as_ref().map(|key| ScopedKey {
            owner: submission.submitted_by.clone(),
            key: key.clone(),
        });
        // Idempotency first: a known key never consumes an admission slot.
        if let Some(key) = &scoped {
            match self.check_idempotency(key, &submission.options) {
                Some(Ok(existing)) => return Applied::IdempotentReplay { job_id: existing },
                Some(Err(existing)) => return Applied::IdempotencyConflict { existing },
                None => {}
            }
        }
        let pieces = match self.admit(&submission) {
            Ok(pieces) => pieces,
            Err(refused) => return refused,
        };
        let job_id = submission.job_id;
        if let Some(key) = scoped {
            self.idempotency.insert(key, job_id);
        }
        self.by_submission.insert(index, job_id);
        self.create(&submission, (index, at), pieces, follow_on);
        Applied::Submitted { job_id }
    }

    /// The pieces a data-parallel submission splits into (none for any other), once its
    /// partition ids fit its task, admission has room for the job and every partition, and no
    /// id is taken; otherwise the outcome refusing it, which changes nothing.
    fn admit(&self, submission: &Submission<'_>) -> Result<Vec<TaskSpec>, Applied> {
        let Submission {
            job_id,
            options,
            max_active_jobs,
            partitions,
            run_at,
            ..
        } = *submission;
        let task = options.task;
        if run_at.is_some() && task.is_data_parallel() {
            return Err(Applied::SubmitInvalid {
                job_id,
                reason: "a data-parallel job cannot wait for a run_at".to_owned(),
            });
        }
        if !submission.after.is_empty() && task.is_data_parallel() {
            return Err(Applied::SubmitInvalid {
                job_id,
                reason: "a data-parallel job cannot wait for other jobs".to_owned(),
            });
        }

        let pieces = if task.is_data_parallel() {
            task.split(u32::try_from(partitions.len()).unwrap_or(u32::MAX))
        } else {
            Vec::new()
        };
        if pieces.len() != partitions.len() {
            return Err(Applied::SubmitInvalid {
                job_id,
                reason: format!(
                    "{} partition ids for a {} task that splits into {} pieces",
                    partitions.len(),
                    task.kind(),
                    pieces.len()
                ),
            });
        }
        let mut distinct = BTreeSet::new();
        if !partitions
            .iter()
            .all(|id| *id != job_id && distinct.insert(*id))
        {
            return Err(Applied::SubmitInvalid {
                job_id,
                reason: "a partition id repeats another partition's or the job's own id".into(),
            });
        }
        // A data-parallel job takes a slot for the parent and one per partition; each frees its
        // own slot when it becomes terminal.
        let slots = 1 + partitions.len() as u64;
        if self.active.saturating_add(slots) > max_active_jobs {
            return Err(Applied::AdmissionRejected {
                active_jobs: self.active,
                max_active_jobs,
            });
        }
        self.admit_queue(job_id, options.queue, slots)?;
        if let Some(taken) = std::iter::once(&job_id)
            .chain(partitions)
            .find(|id| self.jobs.contains_key(id))
        {
            return Err(Applied::SubmitInvalid {
                job_id,
                reason: format!("job id {taken} is already taken"),
            });
        }
        Ok(pieces)
    }

    /// Creates the admitted job: queued, scheduled if its `run_at` is still ahead of the
    /// entry's stamp, or for a data-parallel task a running parent with one queued partition per
    /// piece (each a follow-on).
    fn create(
        &mut self,
        submission: &Submission<'_>,
        (index, at): (LogIndex, UnixMillis),
        pieces: Vec<TaskSpec>,
        follow_on: &mut Vec<Applied>,
    ) {
        let (job_id, options, partitions) =
            (submission.job_id, submission.options, submission.partitions);
        if let Err(full) = self.create_queue(options.queue) {
            panic!("admitted a job to a queue it could not create: {full}");
        }
        let new_job = |id: JobId, task: TaskSpec, queue_seq: u64| Job {
            id,
            task,
            max_attempts: options.max_attempts,
            idempotency_key: None,
            state: JobState::Queued,
            attempt: Attempt(0),
            lease: None,
            last_worker: None,
            result: None,
            error: None,
            retry_delay_millis: 0,
            submitted_at: index,
            queue_seq,
            queue: options.queue.to_owned(),
            priority: options.priority,
            fairness_key: options.fairness_key.map(str::to_owned),
            turn: 0,
            queued_at: at,
            partition_of: None,
            partitions: Vec::new(),
            partitions_asked: None,
            created_at: at,
            finished_at: None,
            timeout_millis: options.timeout_millis,
            run_at: None,
            retry_of: None,
            after: Vec::new(),
            after_any_outcome: false,
            first_started_at: None,
            history: Vec::new(),
            history_dropped: 0,
            submitted_by: submission.submitted_by.clone(),
        };
        let mut job = new_job(job_id, options.task.clone(), 0);
        job.idempotency_key = submission.idempotency_key.clone();
        job.retry_of = submission.retry_of;
        self.active += 1;
        self.usage.admitted(&job);
        if !submission.after.is_empty() {
            // Created waiting for its jobs: its first state, not a transition.
            job.state = JobState::Blocked;
            job.run_at = submission.run_at;
            job.after = submission.after.to_vec();
            job.after_any_outcome = submission.after_any_outcome;
            self.jobs.insert(job_id, job);
            self.block(job_id, follow_on);
            return;
        }
        if let Some(run_at) = submission.run_at.filter(|run_at| *run_at > at) {
            // Created waiting: its first state, not a transition.
            job.state = JobState::Scheduled;
            job.run_at = Some(run_at);
            self.jobs.insert(job_id, job);
            self.schedule(job_id, run_at);
            return;
        }
        if !options.task.is_data_parallel() {
            job.run_at = submission.run_at;
            self.jobs.insert(job_id, job);
            self.place_in_queue(job_id);
            return;
        }
        // The parent never queues: it runs while its partitions do (its position is taken only
        // to keep the positions its partitions get).
        job.queue_seq = self.take_queue_seq();
        transition(&mut job, JobState::Running);
        job.partitions = partitions.to_vec();
        job.partitions_asked = options.partitions_asked;
        self.jobs.insert(job_id, job);
        for (index, (&child, piece)) in partitions.iter().zip(pieces).enumerate() {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            let mut partition = new_job(child, piece, 0);
            partition.partition_of = Some(PartitionOf {
                parent: job_id,
                index,
            });
            self.active += 1;
            self.usage.admitted(&partition);
            self.jobs.insert(child, partition);
            self.place_in_queue(child);
            follow_on.push(Applied::PartitionCreated {
                job_id: child,
                parent: job_id,
                index,
            });
        }
        if partitions.is_empty() {
            // Nothing to split (an empty list): the answer is the empty aggregate.
            self.finish_parent(job_id, follow_on);
        }
    }
}
