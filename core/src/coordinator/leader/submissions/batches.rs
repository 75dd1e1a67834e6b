//! `SUBMIT_BATCH`: a batch is checked whole before any job of it is admitted, then each job goes
//! down the one submission path; the batch is answered once every one of its jobs is.

use std::collections::BTreeMap;

use super::super::admission::ParkedResend;
use super::super::reads::Read;
use super::super::LeaderState;
use super::checks::check_submission;
use super::{idempotency_conflict, SubmitTo};
use crate::coordinator::member::Member;
use crate::ids::{ConnectionId, RequestId};
use crate::limits::{ASSIGN_ENVELOPE_BYTES, SUBMIT_BATCH_JOBS_MAX, SUBMIT_RESULT_BYTES_MAX};
use crate::protocol::{ClientReply, ClientRequest, ErrorCode, JobSubmission, SubmitResult};
use crate::text::prefix_within;

/// A `SUBMIT_BATCH` some of whose jobs are not answered yet.
pub(in crate::coordinator::leader) struct OpenBatch {
    pub(in crate::coordinator::leader) conn: ConnectionId,
    pub(in crate::coordinator::leader) request_id: RequestId,
    results: Vec<Option<SubmitResult>>,
    unanswered: usize,
}

/// The open batches. Each of their unanswered jobs is a proposal in flight or a resend parked
/// on one, so admission and `KEYED_RESENDS_PARKED_MAX` bound how many there can be.
#[derive(Default)]
pub(in crate::coordinator::leader) struct Batches {
    open: BTreeMap<u64, OpenBatch>,
    next: u64,
}

impl Batches {
    pub(super) fn open(&mut self, conn: ConnectionId, request_id: RequestId, jobs: usize) -> u64 {
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
    pub(super) fn answer(
        &mut self,
        batch: u64,
        index: usize,
        result: SubmitResult,
    ) -> Option<OpenBatch> {
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
    pub(in crate::coordinator::leader) fn close(&mut self, batch: u64) -> Option<OpenBatch> {
        self.open.remove(&batch)
    }

    /// Every batch still open (the leader is stepping down).
    pub(in crate::coordinator::leader) fn into_open(self) -> impl Iterator<Item = OpenBatch> {
        self.open.into_values()
    }

    /// `conn` closed: nobody is left to answer.
    pub(in crate::coordinator::leader) fn drop_conn(&mut self, conn: ConnectionId) {
        self.open.retain(|_, batch| batch.conn != conn);
    }
}

impl LeaderState {
    /// A `SUBMIT_BATCH`. Every job is checked before any is admitted, so a bad one fails the
    /// whole batch and creates nothing; and whether an answer must wait for leadership to be
    /// confirmed is decided for the batch as a whole, before any job of it is proposed.
    pub(in crate::coordinator::leader) fn submit_batch(
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
        // Whether some answer reads the table, and the admission slots the batch could take,
        // in all and by queue.
        let (mut reads_table, mut slots) = (false, 0u64);
        let mut queue_slots: BTreeMap<String, u64> = BTreeMap::new();
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
                    Ok((_, job_slots)) => {
                        slots = slots.saturating_add(job_slots);
                        *queue_slots.entry(this.queue.clone()).or_default() += job_slots;
                    }
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
        // A job its queue's admission limit would refuse reads the table too.
        let queue_refuses = queue_slots.iter().any(|(queue, slots)| {
            m.table
                .queue_state(queue)
                .and_then(|q| q.settings.max_active_jobs)
                .is_some_and(|limit| {
                    m.table
                        .active_in(queue)
                        .saturating_add(self.admitting.queue_slots(queue))
                        .saturating_add(*slots)
                        > limit
                })
        });
        let refuses = slots > room || queue_refuses;
        if !confirmed && m.reads_need_confirmation() && (reads_table || refuses) {
            let request = ClientRequest::SubmitBatch { request_id, jobs };
            return self.confirm_then(
                m,
                Read::Request {
                    conn,
                    request: Box::new(request),
                },
            );
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

    /// A job of a batch that waited for the entry binding its key, which has just applied: it
    /// is answered from the table that entry left, never admitted now (its batch skipped the
    /// admission checks for it). In a group its batch was admitted only once leadership was
    /// confirmed after it arrived, so the key's job was not purged by a later leader before
    /// the batch arrived.
    /// `refused` is the queue refusal the entry met when it applied, if it met one.
    pub(in crate::coordinator::leader) fn answer_parked_batch_job(
        &mut self,
        m: &mut Member,
        resend: ParkedResend,
        refused: Option<&QueueRefusal>,
    ) {
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
                    // The entry it waited for created nothing: its queue's admission limit
                    // refused it when it applied (the limit was lowered meanwhile). The same
                    // refusal answers this job; sending it again later is safe.
                    None => match refused {
                        Some(refusal) => refusal.result(self.admitting.queue_slots(&refusal.queue)),
                        // Otherwise only a leader bug, which apply refuses, creates nothing.
                        None => SubmitResult::Error {
                            code: ErrorCode::InvalidRequest,
                            message: "the submission of this key that it waited for was not created; send it again".to_owned(),
                        },
                    },
                }
            }
        };
        self.answer_submission(m, to, result);
    }

    /// Fills line `index` of batch `batch`; once every line is filled, the batch is answered.
    pub(in crate::coordinator::leader) fn answer_batch_item(
        &mut self,
        m: &mut Member,
        batch: u64,
        index: usize,
        result: SubmitResult,
    ) {
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
                result.unwrap_or_else(|| panic!("batch {batch} closed with job {i} unanswered"))
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

/// A submission its queue's admission limit refused when its entry applied.
pub(in crate::coordinator::leader) struct QueueRefusal {
    pub(in crate::coordinator::leader) queue: String,
    pub(in crate::coordinator::leader) active_jobs: u64,
    pub(in crate::coordinator::leader) max_active_jobs: u64,
}

impl QueueRefusal {
    /// The retryable refusal a job waiting on that submission's key gets, `admitting_jobs` of
    /// the queue being written now.
    fn result(&self, admitting_jobs: u64) -> SubmitResult {
        let QueueRefusal {
            queue,
            active_jobs,
            max_active_jobs,
        } = self;
        SubmitResult::Rejected {
            retryable: true,
            active_jobs: *active_jobs,
            admitting_jobs,
            max_active_jobs: *max_active_jobs,
            queue: Some(queue.clone()),
            message: format!(
                "the submission of this key that it waited for was refused by queue {queue:?}'s limit of {max_active_jobs} unfinished jobs ({active_jobs} unfinished); retry later"
            ),
        }
    }
}
