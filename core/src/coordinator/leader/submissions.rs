//! Submissions at the leader: a `SUBMIT`, or the jobs of a `SUBMIT_BATCH`. Each job is checked,
//! answered from the idempotency key it names, or admitted and proposed. A job alone and a job
//! of a batch take the same path and differ only in where their one answer goes
//! ([`SubmitTo`]): a batch is answered once every one of its jobs is.

use std::collections::BTreeMap;

use super::admission::ParkedResend;
use super::reads::Read;
use super::scheduling::FreshJob;
use super::{LeaderState, Pending};
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::coordinator::Event;
use crate::ids::{ConnectionId, JobId, RequestId};
use crate::limits::{
    ASSIGN_ENVELOPE_BYTES, ATTEMPTS_MAX, ATTEMPT_ERROR_BYTES_MAX, IDEMPOTENCY_KEY_BYTES_MAX,
    JOB_TIMEOUT_MILLIS_MAX, KEYED_RESENDS_PARKED_MAX, PARTITIONS_MAX, PARTITION_VIEW_BYTES_MAX,
    SUBMIT_BATCH_JOBS_MAX, SUBMIT_RESULT_BYTES_MAX,
};
use crate::protocol::codec::binary_encoded_len;
use crate::protocol::{
    ClientReply, ClientRequest, ErrorCode, JobSubmission, Partitions, SubmitResult,
};
use crate::table::SubmitOptions;
use crate::tasks::TaskSpec;
use crate::text::prefix_within;

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

/// A `SUBMIT_BATCH` some of whose jobs are not answered yet.
pub(super) struct OpenBatch {
    pub(super) conn: ConnectionId,
    pub(super) request_id: RequestId,
    results: Vec<Option<SubmitResult>>,
    unanswered: usize,
}

/// The open batches. Each of their unanswered jobs is a proposal in flight or a resend parked
/// on one, so admission and `KEYED_RESENDS_PARKED_MAX` bound how many there can be.
#[derive(Default)]
pub(super) struct Batches {
    open: BTreeMap<u64, OpenBatch>,
    next: u64,
}

impl Batches {
    fn open(&mut self, conn: ConnectionId, request_id: RequestId, jobs: usize) -> u64 {
        self.next += 1;
        let batch = OpenBatch {
            conn,
            request_id,
            results: vec![None; jobs],
            unanswered: jobs,
        };
        self.open.insert(self.next, batch);
        self.next
    }

    /// Records job `index`'s answer; gives the batch back once every job is answered. A batch
    /// that is gone (its connection closed, or it was answered `NOT_LEADER`) takes nothing.
    fn answer(&mut self, batch: u64, index: usize, result: SubmitResult) -> Option<OpenBatch> {
        let open = self.open.get_mut(&batch)?;
        let slot = &mut open.results[index];
        assert!(
            slot.is_none(),
            "job {index} of batch {batch} was answered twice: {slot:?}, then {result:?}"
        );
        *slot = Some(result);
        open.unanswered -= 1;
        if open.unanswered > 0 {
            return None;
        }
        self.open.remove(&batch)
    }

    /// Takes the batch out unanswered (the leader is stepping down).
    pub(super) fn close(&mut self, batch: u64) -> Option<OpenBatch> {
        self.open.remove(&batch)
    }

    /// Every batch still open (the leader is stepping down).
    pub(super) fn into_open(self) -> impl Iterator<Item = OpenBatch> {
        self.open.into_values()
    }

    /// `conn` closed: nobody is left to answer.
    pub(super) fn drop_conn(&mut self, conn: ConnectionId) {
        self.open.retain(|_, batch| batch.conn != conn);
    }
}

/// A job that passed every check that depends on nothing but itself.
struct Checked {
    task: TaskSpec,
    /// The task's size as JSON.
    encoded: usize,
    max_attempts: u32,
    /// What the job records of its partition request, and a keyed resend must repeat.
    partitions_asked: Option<Partitions>,
}

impl Checked {
    fn options<'a>(&'a self, submission: &JobSubmission) -> SubmitOptions<'a> {
        SubmitOptions {
            task: &self.task,
            max_attempts: self.max_attempts,
            partitions_asked: self.partitions_asked,
            timeout_millis: submission.timeout_millis,
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

    /// A `SUBMIT_BATCH`. Every job is checked before any is admitted, so a bad one fails the
    /// whole batch and creates nothing; and whether an answer must wait for leadership to be
    /// confirmed is decided for the batch as a whole, before any job of it is proposed.
    pub(super) fn submit_batch(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
        jobs: Vec<JobSubmission>,
        confirmed: bool,
    ) {
        let fit = m
            .config
            .max_frame_bytes
            .saturating_sub(ASSIGN_ENVELOPE_BYTES)
            / SUBMIT_RESULT_BYTES_MAX;
        let most = SUBMIT_BATCH_JOBS_MAX.min(fit);
        if jobs.is_empty() || jobs.len() > most {
            return m.client_error(
                conn,
                request_id,
                ErrorCode::InvalidRequest,
                format!(
                    "a batch holds 1 to {most} jobs at this frame limit (got {})",
                    jobs.len()
                ),
            );
        }
        let mut checked = Vec::with_capacity(jobs.len());
        // Whether some answer reads the table, and the admission slots the batch could take.
        let (mut reads_table, mut slots) = (false, 0u64);
        for (index, job) in jobs.iter().enumerate() {
            let refuse = |m: &mut Member, (code, message): (ErrorCode, String)| {
                m.client_error(
                    conn,
                    request_id,
                    code,
                    format!("job {index} of the batch: {message}"),
                )
            };
            let this = match check_submission(m, job) {
                Ok(this) => this,
                Err(error) => return refuse(m, error),
            };
            let key = job.idempotency_key.as_deref().map(|k| m.scoped(conn, k));
            let known = key
                .as_ref()
                .is_some_and(|k| m.table.check_idempotency(k, &this.options(job)).is_some());
            let in_flight = key
                .as_ref()
                .is_some_and(|k| self.admitting.proposal_for(k).is_some());
            // A key bound or being bound by an earlier request is answered from the table,
            // once its entry applies in the second case: that reads the table.
            if known || in_flight {
                reads_table = true;
            } else {
                // Room only shrinks while the batch is admitted, and with it the pieces of an
                // `auto` split: what passes here passes then.
                match self.check_pieces(m, &this, job) {
                    Ok((_, job_slots)) => slots = slots.saturating_add(job_slots),
                    Err(error) => return refuse(m, error),
                }
            }
            checked.push(this);
        }
        let room = m
            .config
            .max_active_jobs
            .saturating_sub(m.table.active_jobs())
            .saturating_sub(self.admitting.slots());
        if !confirmed && m.reads_need_confirmation() && (reads_table || slots > room) {
            let request = ClientRequest::SubmitBatch { request_id, jobs };
            return self.confirm_then(m, Read::Request { conn, request });
        }
        let batch = self.batches.open(conn, request_id, jobs.len());
        for (index, (job, this)) in jobs.into_iter().zip(checked).enumerate() {
            self.admit(
                m,
                SubmitTo::BatchItem { conn, batch, index },
                job,
                this,
                confirmed,
            );
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
                if let Err(resend) = self.admitting.park(at, ParkedResend { to, submission }) {
                    let message = format!(
                        "{KEYED_RESENDS_PARKED_MAX} resends already wait for their first submission to be written; retry shortly"
                    );
                    let rejected = SubmitResult::Rejected {
                        retryable: true,
                        active_jobs: m.table.active_jobs(),
                        admitting_jobs: self.admitting.slots(),
                        max_active_jobs: m.config.max_active_jobs,
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
        let plain = checked.partitions_asked.is_none() && partitions.is_empty();
        let kind = plain.then(|| checked.task.kind().to_owned());
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
            },
            Some(Pending::Submit { to }),
        );
        self.admitting
            .proposed((proposal.term, proposal.index), slots, key);
        if let Some(kind) = kind {
            self.fresh.proposed(FreshJob {
                at: proposal.index,
                job_id,
                kind,
            });
        }
    }

    /// A job of a batch that waited for the entry binding its key, which has just applied: it
    /// is answered from the table that entry left, never admitted now (its batch skipped the
    /// admission checks for it). In a group its batch was admitted only once leadership was
    /// confirmed after it arrived, so the key's job was not purged by a later leader before
    /// the batch arrived.
    pub(super) fn answer_parked_batch_job(&mut self, m: &mut Member, resend: ParkedResend) {
        let ParkedResend { to, submission } = resend;
        let result = match check_submission(m, &submission) {
            Err((code, message)) => SubmitResult::Error { code, message },
            Ok(checked) => {
                let known = submission.idempotency_key.as_deref().and_then(|key| {
                    m.table
                        .check_idempotency(&m.scoped(to.conn(), key), &checked.options(&submission))
                });
                match known {
                    Some(Ok(job_id)) => SubmitResult::Accepted {
                        job_id,
                        existing: true,
                    },
                    Some(Err(existing)) => idempotency_conflict(existing),
                    // The entry it waited for created nothing (only a leader bug, which apply
                    // refuses, does that): this job was not created, and sending it again is
                    // safe.
                    None => SubmitResult::Error {
                        code: ErrorCode::InvalidRequest,
                        message: "the submission of this key that it waited for was not created; send it again".to_owned(),
                    },
                }
            }
        };
        self.answer_submission(m, to, result);
    }

    /// Answers the submission once a majority confirms this member still leads.
    fn confirm_submission(&mut self, m: &mut Member, to: SubmitTo, submission: JobSubmission) {
        match to {
            SubmitTo::Request { conn, request_id } => {
                let request = submission.into_request(request_id);
                self.confirm_then(m, Read::Request { conn, request })
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
            message: format!(
                "coordinator is at its limit of {max_active_jobs} active jobs ({active_jobs} active, {admitting_jobs} being admitted); retry later"
            ),
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
                        message,
                    } => ClientReply::SubmitRejected {
                        request_id,
                        retryable,
                        active_jobs,
                        admitting_jobs,
                        max_active_jobs,
                        message,
                    },
                    SubmitResult::Error { code, message } => {
                        return m.client_error(conn, request_id, code, message)
                    }
                };
                m.send_client(conn, reply);
            }
            SubmitTo::BatchItem { batch, index, .. } => {
                // Each line of a batch's reply keeps within its share of the frame.
                let result = match result {
                    SubmitResult::Error { code, message } => SubmitResult::Error {
                        code,
                        message: prefix_within(&message, SUBMIT_RESULT_BYTES_MAX / 2).to_owned(),
                    },
                    result => result,
                };
                let Some(done) = self.batches.answer(batch, index, result) else {
                    return;
                };
                let results = done
                    .results
                    .into_iter()
                    .enumerate()
                    .map(|(i, result)| {
                        result.unwrap_or_else(|| {
                            panic!("batch {batch} closed with job {i} unanswered")
                        })
                    })
                    .collect();
                m.send_client(
                    done.conn,
                    ClientReply::SubmitBatchResult {
                        request_id: done.request_id,
                        term: self.term,
                        results,
                    },
                );
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

/// More than any value's binary form can take against its JSON (see `check_submission`).
const BINARY_GROWTH_MAX: usize = 3;

/// Every check of a job that depends on nothing but the job and the configuration.
fn check_submission(m: &Member, s: &JobSubmission) -> Result<Checked, (ErrorCode, String)> {
    let task = TaskSpec::from_json(&s.task).map_err(|e| (ErrorCode::InvalidTask, e.to_string()))?;
    // The assignment carries the task as JSON; the log entry carries it and the key in the
    // coordinators' binary form, which is smaller for most tasks but not all (a float takes
    // 9 bytes there), and must fit one APPEND. Both must fit a frame.
    let json = serde_json::to_vec(&task).map_or(usize::MAX, |bytes| bytes.len());
    let key_bytes = s.idempotency_key.as_ref().map_or(0, |k| {
        let json = serde_json::to_vec(k).map_or(usize::MAX, |bytes| bytes.len());
        json.max(binary_encoded_len(k).unwrap_or(usize::MAX))
    });
    // No task's binary form takes three times its JSON (the worst value, a short float, takes 3
    // bytes there and 9 here), so it is counted only for a task that could come near the limit:
    // the tiny tasks a busy leader mostly admits are not written out twice.
    let far_below_limit = json
        .saturating_mul(BINARY_GROWTH_MAX)
        .saturating_add(key_bytes)
        .saturating_add(ASSIGN_ENVELOPE_BYTES)
        <= m.config.max_frame_bytes;
    let binary = if far_below_limit {
        0
    } else {
        binary_encoded_len(&task).unwrap_or(usize::MAX)
    };
    let (encoded, form) = if binary > json {
        (binary, "in the coordinators' binary form")
    } else {
        (json, "as JSON")
    };
    if encoded
        .saturating_add(key_bytes)
        .saturating_add(ASSIGN_ENVELOPE_BYTES)
        > m.config.max_frame_bytes
    {
        return Err((
            ErrorCode::InvalidTask,
            format!(
                "the task is {encoded} bytes {form}; its assignment or log entry would not fit the frame limit of {} bytes",
                m.config.max_frame_bytes
            ),
        ));
    }
    let max_attempts = s.max_attempts.unwrap_or(m.config.default_max_attempts);
    if !(1..=ATTEMPTS_MAX).contains(&max_attempts) {
        return Err((
            ErrorCode::InvalidRequest,
            format!("max_attempts must be between 1 and {ATTEMPTS_MAX} (got {max_attempts})"),
        ));
    }
    check_partitions_request(&task, s.partitions).map_err(|e| (ErrorCode::InvalidRequest, e))?;
    if let Some(millis) = s.timeout_millis {
        if !(1..=JOB_TIMEOUT_MILLIS_MAX).contains(&millis) {
            return Err((
                ErrorCode::InvalidRequest,
                format!(
                    "timeout_millis must be between 1 and {JOB_TIMEOUT_MILLIS_MAX} (got {millis})"
                ),
            ));
        }
    }
    if let Some(key) = &s.idempotency_key {
        if key.is_empty() || key.len() > IDEMPOTENCY_KEY_BYTES_MAX {
            return Err((
                ErrorCode::InvalidRequest,
                format!(
                    "idempotency key must be 1 to {IDEMPOTENCY_KEY_BYTES_MAX} bytes (got {})",
                    key.len()
                ),
            ));
        }
    }
    let partitions_asked = task
        .is_data_parallel()
        .then(|| s.partitions.unwrap_or(Partitions::Auto));
    Ok(Checked {
        task,
        encoded,
        max_attempts,
        partitions_asked,
    })
}

/// A `partitions` request is for a data-parallel task and within `1..=PARTITIONS_MAX`.
fn check_partitions_request(task: &TaskSpec, partitions: Option<Partitions>) -> Result<(), String> {
    match partitions {
        Some(_) if !task.is_data_parallel() => Err(format!(
            "partitions apply only to max, prime-count-list and prime-sum tasks, not {}",
            task.kind()
        )),
        Some(Partitions::Count(n)) if !(1..=PARTITIONS_MAX).contains(&n) => Err(format!(
            "partitions must be between 1 and {PARTITIONS_MAX} (got {n})"
        )),
        _ => Ok(()),
    }
}
