//! Submissions at the leader: a `SUBMIT`, or the jobs of a `SUBMIT_BATCH`. Each job is checked,
//! answered from the idempotency key it names, or admitted and proposed. A job alone and a job
//! of a batch take the same path and differ only in where their one answer goes
//! ([`SubmitTo`]): a batch is answered once every one of its jobs is.

mod batches;
mod checks;

pub(super) use batches::QueueRefusal;

use super::admission::ParkedResend;
use super::reads::Read;
use super::scheduling::{FreshJob, Lane};
use super::{LeaderState, Pending};
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::coordinator::Event;
use crate::ids::{ConnectionId, JobId, RequestId};
use crate::limits::{
    ASSIGN_ENVELOPE_BYTES, ATTEMPT_ERROR_BYTES_MAX, KEYED_RESENDS_PARKED_MAX, PARTITIONS_MAX,
    PARTITION_VIEW_BYTES_MAX,
};
use crate::protocol::{ClientReply, ErrorCode, JobSubmission, Partitions, SubmitResult};
use crate::tasks::TaskSpec;
pub(super) use batches::Batches;
use checks::{check_submission, Checked};

/// Where a submission's one answer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SubmitTo {
    /// A `SUBMIT`: its own reply.
    Request {
        conn: ConnectionId,
        request_id: RequestId,
    },
    /// Job `index` of the open batch `batch`, which came on `conn`: a line of the batch's
    /// reply.
    BatchItem {
        conn: ConnectionId,
        batch: u64,
        index: usize,
    },
}

impl SubmitTo {
    /// The connection the submission came on.
    pub(super) fn conn(&self) -> ConnectionId {
        match self {
            SubmitTo::Request { conn, .. } | SubmitTo::BatchItem { conn, .. } => *conn,
        }
    }
}

impl LeaderState {
    pub(super) fn on_submitted(&mut self, m: &mut Member, pending: Option<Pending>, job_id: JobId) {
        if let Some(job) = m.table.get(&job_id) {
            let (kind, max_attempts) = (job.task.kind().to_owned(), job.max_attempts);
            let partitions = job.is_parent().then_some(job.partitions.len());
            m.event(Event::JobSubmitted {
                job_id,
                kind,
                max_attempts,
            });
            if let Some(partitions) = partitions {
                m.event(Event::JobSplit { job_id, partitions });
            }
        }
        self.answer_submit(m, pending, job_id, false);
        self.count_submission_for_rotation(m);
        if m.table.get(&job_id).is_some_and(|j| j.run_at.is_some()) {
            self.check_due(m);
        }
    }

    /// A submission owed an answer is refused with `code`.
    pub(super) fn refuse_pending_submission(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        code: ErrorCode,
        message: String,
    ) {
        if let Some(Pending::Submit { to }) = pending {
            self.answer_submission(m, to, SubmitResult::Error { code, message });
        }
    }

    pub(super) fn answer_submit(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
        existing: bool,
    ) {
        if let Some(Pending::Submit { to }) = pending {
            self.answer_submission(m, to, SubmitResult::Accepted { job_id, existing });
        }
    }

    /// A `SUBMIT`, or a job of a batch resent once the entry it waited for applied.
    /// `confirmed` says leadership was confirmed since it arrived.
    pub(super) fn submit(
        &mut self,
        m: &mut Member,
        to: SubmitTo,
        submission: JobSubmission,
        confirmed: bool,
    ) {
        match check_submission(m, &submission) {
            Ok(checked) => self.admit(m, to, submission, checked, confirmed),
            Err((code, message)) => {
                self.answer_submission(m, to, SubmitResult::Error { code, message })
            }
        }
    }

    /// Answers the job from its idempotency key, parks it behind the in-flight submission of
    /// that key, refuses it for want of room, or proposes it.
    fn admit(
        &mut self,
        m: &mut Member,
        to: SubmitTo,
        submission: JobSubmission,
        checked: Checked,
        confirmed: bool,
    ) {
        if let Some(key) = &submission.idempotency_key {
            let key = m.scoped(to.conn(), key);
            // A known key is answered from the applied (durable) table, with apply's own rule,
            // once this member is confirmed to lead: a deposed leader may still hold a key
            // whose job the group has since purged (and the key since bound to another job).
            let known = m
                .table
                .check_idempotency(&key, &checked.options(&submission));
            if known.is_some() && !confirmed && m.reads_need_confirmation() {
                return self.confirm_submission(m, to, submission);
            }
            match known {
                Some(Ok(job_id)) => {
                    let existing = SubmitResult::Accepted {
                        job_id,
                        existing: true,
                    };
                    return self.answer_submission(m, to, existing);
                }
                Some(Err(existing)) => {
                    return self.answer_submission(m, to, idempotency_conflict(existing))
                }
                None => {}
            }
            // A key whose submission is still being written: answered once that entry applies.
            if let Some(at) = self.admitting.proposal_for(&key) {
                if let Err(resend) = self.admitting.park(
                    at,
                    ParkedResend {
                        to,
                        submission: Box::new(submission),
                    },
                ) {
                    let message = format!(
                        "{KEYED_RESENDS_PARKED_MAX} resends already wait for their first submission to be written; retry shortly"
                    );
                    let rejected = SubmitResult::Rejected {
                        retryable: true,
                        active_jobs: m.table.active_jobs(),
                        admitting_jobs: self.admitting.slots(),
                        max_active_jobs: m.config.max_active_jobs,
                        queue: None,
                        message,
                    };
                    self.answer_submission(m, resend.to, rejected);
                }
                return;
            }
        }
        let (pieces, slots) = match self.check_pieces(m, &checked, &submission) {
            Ok(fits) => fits,
            Err((code, message)) => {
                assert!(
                    matches!(to, SubmitTo::Request { .. }),
                    "a job of a batch failed a check its batch passed: {message}"
                );
                return self.answer_submission(m, to, SubmitResult::Error { code, message });
            }
        };
        // Admission counts the applied table's active jobs and the submissions still being
        // written, so a refusal writes nothing. Apply checks again with the same rule.
        let limit = m.config.max_active_jobs;
        let (active, admitting) = (m.table.active_jobs(), self.admitting.slots());
        if active.saturating_add(admitting).saturating_add(slots) > limit {
            if !confirmed && m.reads_need_confirmation() {
                // A refusal reads the table: it must not come from a leader that was deposed
                // while other members finished jobs.
                return self.confirm_submission(m, to, submission);
            }
            return self.reject_submission(m, to, active, admitting, limit);
        }
        // So does its queue's admission limit, if it has one.
        let queue = &checked.queue;
        let queue_limit = m
            .table
            .queue_state(queue)
            .and_then(|q| q.settings.max_active_jobs);
        if let Some(limit) = queue_limit {
            let active = m.table.active_in(queue);
            let admitting = self.admitting.queue_slots(queue);
            if active.saturating_add(admitting).saturating_add(slots) > limit {
                if !confirmed && m.reads_need_confirmation() {
                    return self.confirm_submission(m, to, submission);
                }
                let queue = queue.clone();
                return self.reject_for_queue(m, to, queue, (active, admitting), limit);
            }
        }
        self.propose_submission(m, to, submission, checked, (pieces, slots));
    }

    /// Proposes an admitted job, `(pieces, slots)` being its partition count and the admission
    /// slots it takes: its id and its partitions' ids drawn afresh, the entry counted as being
    /// written (for admission and for its key), and a plain job noted for scheduling.
    fn propose_submission(
        &mut self,
        m: &mut Member,
        to: SubmitTo,
        submission: JobSubmission,
        checked: Checked,
        (pieces, slots): (usize, u64),
    ) {
        let limit = m.config.max_active_jobs;
        // The job's id first, then one per partition, each unlike any drawn before it.
        let mut ids = Vec::with_capacity(1 + pieces);
        for _ in 0..=pieces {
            let id = self.fresh_job_id(m, &ids);
            ids.push(id);
        }
        let partitions = ids.split_off(1);
        let job_id = ids[0];
        let key = submission
            .idempotency_key
            .as_deref()
            .map(|k| m.scoped(to.conn(), k));
        // A plain job queued at once may be picked before its entry applies.
        let plain = checked.partitions_asked.is_none()
            && partitions.is_empty()
            && checked.run_at.is_none()
            && submission.after.is_empty();
        let fresh = plain.then(|| Lane {
            kind: checked.task.kind().to_owned(),
            queue: checked.queue.clone(),
            key: checked.fairness_key.clone().unwrap_or_default(),
        });
        let priority = checked.priority;
        let queue = checked.queue.clone();
        let proposal = self.propose(
            m,
            Command::Submit {
                job_id,
                task: checked.task,
                max_attempts: checked.max_attempts,
                idempotency_key: submission.idempotency_key,
                max_active_jobs: limit,
                partitions,
                partitions_asked: checked.partitions_asked,
                timeout_millis: submission.timeout_millis,
                submitted_by: m.owner(to.conn()),
                queue: checked.queue,
                priority: checked.priority,
                fairness_key: checked.fairness_key,
                run_at: checked.run_at,
                retry_of: submission.retry_of,
                after: submission.after,
                after_any_outcome: submission.after_any_outcome,
            },
            Some(Pending::Submit { to }),
        );
        self.admitting
            .proposed((proposal.term, proposal.index), slots, key, queue);
        if let Some(lane) = fresh {
            self.scheduling.fresh.proposed(FreshJob {
                at: proposal.index,
                job_id,
                lane,
                priority,
            });
        }
    }

    /// Answers the submission once a majority confirms this member still leads.
    fn confirm_submission(&mut self, m: &mut Member, to: SubmitTo, submission: JobSubmission) {
        match to {
            SubmitTo::Request { conn, request_id } => {
                let request = submission.into_request(request_id);
                self.confirm_then(m, Read::Request { conn, request: Box::new(request) })
            }
            // `submit_batch` confirms before admitting any job whose answer reads the table,
            // and a job of a batch parked behind its key is answered by
            // `answer_parked_batch_job`, never admitted again.
            SubmitTo::BatchItem { batch, index, .. } => panic!(
                "job {index} of batch {batch} needed leadership confirmed after its batch was admitted"
            ),
        }
    }

    /// The number of partitions the job becomes now and the admission slots it takes, or why
    /// it cannot be taken at all (a reply about it would not fit a frame, or it needs more
    /// slots than admission ever allows).
    fn check_pieces(
        &self,
        m: &Member,
        checked: &Checked,
        submission: &JobSubmission,
    ) -> Result<(usize, u64), (ErrorCode, String)> {
        let pieces = self.resolve_partitions(m, &checked.task, submission.partitions);
        let encoded = checked.encoded;
        // Every reply about the job must fit a frame: the parent's view carries the whole task,
        // a line per partition and at most one worker's error.
        let view_bytes = encoded
            .saturating_add(pieces.saturating_mul(PARTITION_VIEW_BYTES_MAX))
            .saturating_add(ATTEMPT_ERROR_BYTES_MAX)
            .saturating_add(submission.idempotency_key.as_ref().map_or(0, String::len))
            .saturating_add(ASSIGN_ENVELOPE_BYTES);
        if checked.task.is_data_parallel() && view_bytes > m.config.max_frame_bytes {
            return Err((
                ErrorCode::InvalidTask,
                format!(
                    "the task is {encoded} bytes as JSON; split {pieces} ways, a reply showing the job could need {view_bytes} bytes, over the frame limit of {} bytes; submit a smaller input or fewer partitions",
                    m.config.max_frame_bytes
                ),
            ));
        }
        let limit = m.config.max_active_jobs;
        let slots = 1 + pieces as u64;
        if slots > limit {
            return Err((
                ErrorCode::InvalidRequest,
                format!(
                    "a job split into {pieces} partitions needs {slots} admission slots (the job and each partition), but --max-active-jobs is {limit}; ask for fewer partitions or raise the limit"
                ),
            ));
        }
        Ok((pieces, slots))
    }

    /// A job id no job in the table (nor in `taken`) has, ordered by the time it is drawn.
    pub(super) fn fresh_job_id(&mut self, m: &mut Member, taken: &[JobId]) -> JobId {
        let now = m.wall_now();
        loop {
            let id = JobId::ordered(now, &mut m.rng);
            if m.table.get(&id).is_none() && !taken.contains(&id) {
                return id;
            }
        }
    }

    /// How many partition jobs a submission becomes: `min(partitions, items)` for a
    /// data-parallel task (`auto`, or no request, means one per live worker, at least one, at
    /// most what admission leaves room for), 0 for any other task. The request was checked by
    /// [`check_partitions_request`].
    pub(super) fn resolve_partitions(
        &self,
        m: &Member,
        task: &TaskSpec,
        partitions: Option<Partitions>,
    ) -> usize {
        if !task.is_data_parallel() {
            return 0;
        }
        let requested = match partitions.unwrap_or(Partitions::Auto) {
            Partitions::Auto => {
                // One per live worker, but never more than admission leaves room for now (the
                // parent takes a slot too). When nothing is left, one partition is asked for,
                // and admission refuses it.
                let live = self.registry.iter().filter(|w| w.alive).count() as u64;
                let room = m
                    .config
                    .max_active_jobs
                    .saturating_sub(m.table.active_jobs())
                    .saturating_sub(self.admitting.slots())
                    .saturating_sub(1)
                    .max(1);
                u32::try_from(live.clamp(1, room)).unwrap_or(PARTITIONS_MAX)
            }
            Partitions::Count(n) => n,
        };
        // `TaskSpec::split` makes exactly `min(partitions, items)` pieces; counting them here
        // spares copying the input, which apply splits once.
        let pieces = u64::from(requested.clamp(1, PARTITIONS_MAX)).min(task.items());
        usize::try_from(pieces).unwrap_or(PARTITIONS_MAX as usize)
    }

    pub(super) fn reject_submission(
        &mut self,
        m: &mut Member,
        to: SubmitTo,
        active_jobs: u64,
        admitting_jobs: u64,
        max_active_jobs: u64,
    ) {
        m.event(Event::SubmitRejected {
            active_jobs,
            admitting_jobs,
            max_active_jobs,
        });
        let rejected = SubmitResult::Rejected {
            retryable: true,
            active_jobs,
            admitting_jobs,
            max_active_jobs,
            queue: None,
            message: format!(
                "coordinator is at its limit of {max_active_jobs} active jobs ({active_jobs} active, {admitting_jobs} being admitted); retry later"
            ),
        };
        self.answer_submission(m, to, rejected);
    }

    /// Refuses a submission, retryably, because its queue holds `active_jobs` unfinished jobs
    /// and `admitting_jobs` more being written, of the `max_active_jobs` it admits.
    pub(super) fn reject_for_queue(
        &mut self,
        m: &mut Member,
        to: SubmitTo,
        queue: String,
        (active_jobs, admitting_jobs): (u64, u64),
        max_active_jobs: u64,
    ) {
        m.event(Event::QueueSubmitRejected {
            queue: queue.clone(),
            active_jobs,
            max_active_jobs,
        });
        let message = format!(
            "queue {queue:?} is at its limit of {max_active_jobs} unfinished jobs ({active_jobs} unfinished, {admitting_jobs} being admitted); retry later"
        );
        let rejected = SubmitResult::Rejected {
            retryable: true,
            active_jobs,
            admitting_jobs,
            max_active_jobs,
            queue: Some(queue),
            message,
        };
        self.answer_submission(m, to, rejected);
    }

    /// Sends a submission's answer: as its own reply, or into its batch, whose reply leaves
    /// once every job of it is answered.
    pub(super) fn answer_submission(&mut self, m: &mut Member, to: SubmitTo, result: SubmitResult) {
        match to {
            SubmitTo::Request { conn, request_id } => {
                let reply = match result {
                    SubmitResult::Accepted { job_id, existing } => ClientReply::SubmitAccepted {
                        request_id,
                        term: self.term,
                        job_id,
                        existing,
                    },
                    SubmitResult::Rejected {
                        retryable,
                        active_jobs,
                        admitting_jobs,
                        max_active_jobs,
                        queue,
                        message,
                    } => ClientReply::SubmitRejected {
                        request_id,
                        retryable,
                        active_jobs,
                        admitting_jobs,
                        max_active_jobs,
                        queue,
                        message,
                    },
                    SubmitResult::Error { code, message } => {
                        return m.client_error(conn, request_id, code, message)
                    }
                };
                m.send_client(conn, reply);
            }
            SubmitTo::BatchItem { batch, index, .. } => {
                self.answer_batch_item(m, batch, index, result)
            }
        }
    }
}

/// The answer to a submission whose key is bound to another job with other options.
pub(super) fn idempotency_conflict(existing: JobId) -> SubmitResult {
    SubmitResult::Error {
        code: ErrorCode::IdempotencyConflict,
        message: format!(
            "idempotency key is bound to job {existing} with a different task, max attempts, timeout or partition request; use a new key"
        ),
    }
}
