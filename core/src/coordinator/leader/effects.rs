//! What the leader does when a committed entry applies: the replies, assignments, cancels,
//! acknowledgements, timers and events that the entry's outcome makes visible. Nothing here runs
//! before the entry is committed, so nothing visible leaves before it is durable.

use std::time::Duration;

use super::submissions::{idempotency_conflict, SubmitTo};
use super::{LeaderState, Pending};
use crate::command::{Command, LogEntry};
use crate::coordinator::member::Member;
use crate::coordinator::timers::Timer;
use crate::coordinator::Event;
use crate::ids::{ConnectionId, JobId, LeaseId};
use crate::job::{AttemptEnd, FailureKind, Job, JobState, Lease};
use crate::protocol::{CancelReason, ClientReply, CoordinatorToWorker, ErrorCode, SubmitResult};
use crate::table::{Applied, Outcome};
use crate::time::as_millis_u64;

impl LeaderState {
    /// `entry` was committed and applied to the table with `outcome`: make it visible.
    pub(in crate::coordinator) fn on_entry_applied(
        &mut self,
        m: &mut Member,
        entry: &LogEntry,
        outcome: Outcome,
    ) {
        let at = (entry.term, entry.index);
        let pending = self.pending.remove(&at);
        let submitted = match &entry.command {
            Command::Submit { job_id, .. } => Some(*job_id),
            _ => None,
        };
        self.fresh.applied(entry.index, submitted);
        if let (Command::Purge { job_ids }, Applied::Purged { purged, .. }) =
            (&entry.command, &outcome.applied)
        {
            self.purge_applied(m, job_ids, *purged, pending);
        } else {
            self.on_applied(m, &entry.command, outcome.applied, pending);
            for follow_on in outcome.follow_on {
                self.on_outcome(m, follow_on, None);
            }
        }
        // Resends of a key this entry bound are answered from the table now that it holds it.
        for resend in self.admitting.applied(at) {
            match resend.to {
                SubmitTo::Request { .. } => self.submit(m, resend.to, resend.submission, false),
                SubmitTo::BatchItem { .. } => self.answer_parked_batch_job(m, resend),
            }
        }
        self.answer_confirmed_reads(m);
    }

    pub(super) fn on_applied(
        &mut self,
        m: &mut Member,
        command: &Command,
        applied: Applied,
        pending: Option<Pending>,
    ) {
        if let Command::Assign { job_id, lease } = command {
            self.assigning.remove(job_id);
            if let Applied::UnknownJob { .. } = applied {
                // A fresh job's `Submit` created no job: the slot it was given is free again.
                if let Some(entry) = self.registry.get_mut(&lease.worker) {
                    entry.free(lease.id);
                }
            }
        }
        match command {
            Command::Complete { lease_id, .. } => {
                self.settling.remove(lease_id);
                self.answer_deferred_ack(m, *lease_id, pending.as_ref());
            }
            Command::Release { lease_id, .. } => {
                self.settling.remove(lease_id);
                self.answer_deferred_ack(m, *lease_id, pending.as_ref());
            }
            Command::AttemptFailed {
                job_id, lease_id, ..
            }
            | Command::Abandon { job_id, lease_id } => {
                self.settling.remove(lease_id);
                self.answer_deferred_ack(m, *lease_id, pending.as_ref());
                // A revocation that found the lease already ended (the job was cancelled while
                // it was being written) sends nothing of its own, yet a worker that re-reported
                // the attempt meanwhile was not told to stop because this was settling.
                let revoked_too_late = matches!(applied, Applied::Stale { .. })
                    && matches!(pending, Some(Pending::Revoke { .. }));
                if pending.is_none() || revoked_too_late {
                    // Revoked because its worker was lost or a restart interrupted it (or too
                    // late, as above). If a process has since reported the attempt, it is told
                    // to stop now that the revocation is durable (never before).
                    self.cancel_wherever_reported(m, *job_id, *lease_id);
                }
            }
            _ => {}
        }
        self.on_outcome(m, applied, pending);
    }

    /// The visible effects of one job's change: replies, events, timers, cancels. A router:
    /// each outcome has its own handler below.
    pub(super) fn on_outcome(
        &mut self,
        m: &mut Member,
        applied: Applied,
        pending: Option<Pending>,
    ) {
        match applied {
            Applied::Submitted { job_id } => self.on_submitted(m, pending, job_id),
            Applied::IdempotentReplay { job_id } => self.answer_submit(m, pending, job_id, true),
            Applied::SubmitInvalid { job_id, reason } => {
                let message = format!("job {job_id} was not created: {reason}");
                self.refuse_pending_submission(m, pending, ErrorCode::InvalidRequest, message);
            }
            Applied::IdempotencyConflict { existing } => {
                if let Some(Pending::Submit { to }) = pending {
                    self.answer_submission(m, to, idempotency_conflict(existing));
                }
            }
            Applied::AdmissionRejected {
                active_jobs,
                max_active_jobs,
            } => {
                if let Some(Pending::Submit { to }) = pending {
                    let admitting = self.admitting.slots();
                    self.reject_submission(m, to, active_jobs, admitting, max_active_jobs);
                }
            }
            Applied::UnknownJob { job_id } => self.on_unknown_job(m, pending, job_id),
            Applied::Assigned {
                job_id,
                lease,
                attempt,
            } => self.on_assigned(m, job_id, lease, attempt),
            Applied::AssignSkipped { lease, .. } => {
                if let Some(entry) = self.registry.get_mut(&lease.worker) {
                    entry.free(lease.id);
                }
            }
            Applied::Completed { job_id, lease } => self.on_completed(m, pending, job_id, lease),
            Applied::RetryScheduled {
                job_id,
                lease,
                attempt,
                delay_millis,
                cause,
            } => {
                let retry = (attempt, delay_millis, cause);
                self.on_retry_scheduled(m, pending, job_id, lease, retry)
            }
            Applied::FailedPermanently {
                job_id,
                lease,
                error,
            } => self.on_failed_permanently(m, pending, job_id, lease, error),
            Applied::Released { job_id, lease } => {
                self.disarm_lease_deadline(lease.id);
                m.event(Event::AttemptReleased {
                    job_id,
                    worker: lease.worker.clone(),
                });
                self.ack_result(m, pending, job_id, lease.id, true);
            }
            Applied::Stale {
                job_id,
                lease_id,
                reason,
            } => self.on_stale(m, pending, job_id, lease_id, reason.to_string()),
            Applied::Requeued { job_id } => on_requeued(m, job_id),
            Applied::Cancelled {
                job_id,
                previous,
                revoked,
            } => self.on_cancelled(m, pending, job_id, previous, revoked),
            Applied::CancelTooLate { job_id, .. } => self.answer_cancel(m, pending, job_id, false),
            Applied::ParentCompleted { job_id } => {
                let partitions = m.table.get(&job_id).map_or(0, |j| j.partitions.len());
                m.event(Event::ParentCompleted { job_id, partitions });
                self.wake_waiters(m, job_id);
            }
            Applied::ParentFailed { job_id, error } => {
                m.event(Event::ParentFailed { job_id, error });
                self.wake_waiters(m, job_id);
            }
            // Answered by `purge_applied`; a purged job was terminal, so nobody waits for it.
            Applied::Purged { .. } | Applied::Removed { .. } => {}
            Applied::NewLeader { .. }
            | Applied::PartitionCreated { .. }
            | Applied::RequeueSkipped { .. } => {}
        }
    }

    fn on_submitted(&mut self, m: &mut Member, pending: Option<Pending>, job_id: JobId) {
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
    fn refuse_pending_submission(
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

    fn on_unknown_job(&mut self, m: &mut Member, pending: Option<Pending>, job_id: JobId) {
        match pending {
            Some(Pending::Cancel { conn, request_id }) => {
                self.job_not_found(m, conn, request_id, job_id)
            }
            pending => {
                let message = format!("no job {job_id}");
                self.refuse_pending_submission(m, pending, ErrorCode::JobNotFound, message);
            }
        }
    }

    fn on_completed(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
        lease: Lease,
    ) {
        self.disarm_lease_deadline(lease.id);
        let job = m.table.get(&job_id);
        let attempts = job.map(|job| job.attempt).unwrap_or_default();
        let ran_millis = job
            .and_then(|job| job.history.last())
            .and_then(|record| record.ran_millis());
        m.event(Event::JobCompleted {
            job_id,
            worker: lease.worker.clone(),
            attempts,
            ran_millis,
        });
        self.ack_result(m, pending, job_id, lease.id, true);
        self.wake_waiters(m, job_id);
    }

    /// An attempt failed and another is due after a delay: `retry` is the attempt that failed,
    /// the delay and the cause.
    fn on_retry_scheduled(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
        lease: Lease,
        retry: (crate::ids::Attempt, u64, String),
    ) {
        let (attempt, delay_millis, cause) = retry;
        self.disarm_lease_deadline(lease.id);
        let job = m.table.get(&job_id);
        let max_attempts = job.map_or(0, |job| job.max_attempts);
        let ended = job
            .and_then(|job| job.history.last())
            .and_then(|record| record.outcome)
            .unwrap_or(AttemptEnd::TaskFailed);
        m.event(Event::RetryScheduled {
            job_id,
            attempt,
            max_attempts,
            delay_millis,
            cause,
            ended,
        });
        let at = m.now.saturating_add(Duration::from_millis(delay_millis));
        self.timers.arm(at, Timer::RetryDue(job_id));
        self.settle_effects(m, pending, job_id, &lease);
    }

    fn on_failed_permanently(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
        lease: Lease,
        error: String,
    ) {
        self.disarm_lease_deadline(lease.id);
        let attempts = m
            .table
            .get(&job_id)
            .map(|job| job.attempt)
            .unwrap_or_default();
        m.event(Event::JobFailed {
            job_id,
            attempts,
            error,
        });
        self.settle_effects(m, pending, job_id, &lease);
        self.wake_waiters(m, job_id);
    }

    /// A result whose lease was no longer current when its entry applied.
    fn on_stale(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
        lease_id: LeaseId,
        reason: String,
    ) {
        if let Some(Pending::Result { worker }) = &pending {
            let worker = worker.clone();
            m.event(Event::StaleResultRejected {
                job_id,
                lease_id,
                worker,
                reason,
            });
        }
        self.ack_result(m, pending, job_id, lease_id, false);
    }

    fn on_cancelled(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
        previous: JobState,
        revoked: Option<Lease>,
    ) {
        m.event(Event::JobCancelled { job_id, previous });
        if let Some(lease) = revoked {
            self.disarm_lease_deadline(lease.id);
            self.awaiting_readoption.remove(&lease.id);
            self.send_cancel(m, &lease, job_id, CancelReason::JobCancelled);
        }
        self.answer_cancel(m, pending, job_id, true);
        self.wake_waiters(m, job_id);
    }

    pub(super) fn on_assigned(
        &mut self,
        m: &mut Member,
        job_id: JobId,
        lease: Lease,
        attempt: crate::ids::Attempt,
    ) {
        let conn = self
            .registry
            .get(&lease.worker)
            .filter(|w| {
                w.alive && w.incarnation == lease.incarnation && w.leases.contains_key(&lease.id)
            })
            .and_then(|w| w.conn);
        let Some(conn) = conn else {
            // The worker was lost while the assignment was being made durable.
            let cause = format!(
                "worker {} lost before the assignment reached it",
                lease.worker
            );
            self.fail_attempt(m, job_id, lease.id, (FailureKind::WorkerLost, cause), None);
            return;
        };
        let Some(job) = m.table.get(&job_id) else {
            return;
        };
        let message = CoordinatorToWorker::TaskAssign {
            term: self.term,
            job_id,
            lease_id: lease.id,
            attempt,
            max_attempts: job.max_attempts,
            task: job.task.clone(),
            timeout_millis: as_millis_u64(super::workers::task_timeout(m, job_id)),
        };
        let max_attempts = job.max_attempts;
        let queued_millis = queued_millis(job);
        self.arm_lease_deadline(m, &lease.worker, job_id, lease.id);
        m.event(Event::JobAssigned {
            job_id,
            worker: lease.worker.clone(),
            attempt,
            max_attempts,
            lease_id: lease.id,
            queued_millis,
        });
        m.send_worker(conn, message);
    }

    /// Effects of a failed attempt settling: acknowledge the worker's report, or tell the worker
    /// its lease was revoked.
    pub(super) fn settle_effects(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
        lease: &Lease,
    ) {
        match pending {
            Some(Pending::Revoke { reason }) => self.send_cancel(m, lease, job_id, reason),
            pending @ Some(Pending::Result { .. }) => {
                self.ack_result(m, pending, job_id, lease.id, true)
            }
            _ => {}
        }
    }

    /// Tells the worker holding `lease` (whichever process of that id reported it) to stop.
    pub(super) fn send_cancel(
        &mut self,
        m: &mut Member,
        lease: &Lease,
        job_id: JobId,
        reason: CancelReason,
    ) {
        let conn = self
            .registry
            .get(&lease.worker)
            .filter(|w| w.alive && w.leases.contains_key(&lease.id))
            .and_then(|w| w.conn);
        if let Some(conn) = conn {
            m.send_worker(
                conn,
                CoordinatorToWorker::TaskCancel {
                    term: self.term,
                    job_id,
                    lease_id: lease.id,
                    reason,
                },
            );
        }
    }

    /// A result that arrived while its attempt was settling gets its (now durable) answer. The
    /// settlement's own acknowledgement already covers a resend from the worker whose result it
    /// was; anyone else learns their result did not count.
    pub(super) fn answer_deferred_ack(
        &mut self,
        m: &mut Member,
        lease_id: LeaseId,
        pending: Option<&Pending>,
    ) {
        let Some((job_id, worker)) = self.deferred_acks.remove(&lease_id) else {
            return;
        };
        if matches!(pending, Some(Pending::Result { worker: w }) if *w == worker) {
            return;
        }
        self.ack_result(m, Some(Pending::Result { worker }), job_id, lease_id, false);
    }

    /// Sends `TASK_CANCEL` to any live worker that holds `lease_id` (a rare path: recovery only).
    pub(super) fn cancel_wherever_reported(
        &mut self,
        m: &mut Member,
        job_id: JobId,
        lease_id: LeaseId,
    ) {
        let conns: Vec<ConnectionId> = self
            .registry
            .iter()
            .filter(|w| w.alive && w.leases.contains_key(&lease_id))
            .filter_map(|w| w.conn)
            .collect();
        for conn in conns {
            m.send_worker(
                conn,
                CoordinatorToWorker::TaskCancel {
                    term: self.term,
                    job_id,
                    lease_id,
                    reason: CancelReason::LeaseNotCurrent,
                },
            );
        }
    }

    /// Acknowledges a worker's result on the worker's current connection (it may have
    /// reconnected while the result was being made durable).
    pub(super) fn ack_result(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
        lease_id: LeaseId,
        accepted: bool,
    ) {
        let Some(Pending::Result { worker }) = pending else {
            return;
        };
        let conn = self
            .registry
            .get(&worker)
            .filter(|w| w.alive)
            .and_then(|w| w.conn);
        if let Some(conn) = conn {
            m.send_worker(
                conn,
                CoordinatorToWorker::ResultAck {
                    term: self.term,
                    job_id,
                    lease_id,
                    accepted,
                },
            );
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

    pub(super) fn answer_cancel(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
        cancelled: bool,
    ) {
        if let Some(Pending::Cancel { conn, request_id }) = pending {
            // Every request gets its one answer, whatever became of the job.
            match self.job_view(m, &job_id) {
                Some(job) => m.send_client(
                    conn,
                    ClientReply::CancelResult {
                        term: self.term,
                        request_id,
                        job: Box::new(job),
                        cancelled,
                    },
                ),
                None => self.job_not_found(m, conn, request_id, job_id),
            }
        }
    }

    /// Term rotation, done safely: after `rotate_leader_after_jobs` new jobs in one
    /// term, leadership is handed to the next member (running attempts are re-adopted there).
    /// Only noted here: a hand-over can end this member's leadership at once, and entries
    /// still being applied must not meet a leader state whose member no longer leads.
    fn count_submission_for_rotation(&mut self, m: &Member) {
        self.submitted_this_term += 1;
        if m.config
            .rotate_leader_after_jobs
            .is_some_and(|after| self.submitted_this_term >= after)
        {
            self.rotation_due = true;
        }
    }

    /// Starts the rotation noted while applying, if one is due and none is under way; true if
    /// a hand-over started (the caller settles the role change it may bring).
    pub(in crate::coordinator) fn start_rotation_if_due(&mut self, m: &mut Member) -> bool {
        if !std::mem::take(&mut self.rotation_due) || m.replica.transferring_to().is_some() {
            return false;
        }
        match m.replica.transfer_leadership(None) {
            Ok(to) => {
                m.event(Event::TransferStarted { to });
                true
            }
            Err(_) => false,
        }
    }
}

/// How long the attempt that just started waited: since the previous attempt ended, or since
/// the submission for the first (unknown once older records were dropped).
fn queued_millis(job: &Job) -> Option<u64> {
    let (started, earlier) = match job.history.as_slice() {
        [] => return None,
        [only] if job.history_dropped == 0 => (only, job.created_at),
        [.., previous, started] => (started, previous.ended_at_unix_ms?),
        [_] => return None,
    };
    Some(started.started_at_unix_ms.0.saturating_sub(earlier.0))
}

/// A job went back to the queue (its worker lost, its lease expired, or a drain gave it back).
fn on_requeued(m: &mut Member, job_id: JobId) {
    if let Some(job) = m.table.get(&job_id) {
        let (attempt, max_attempts) = (job.attempt, job.max_attempts);
        m.event(Event::JobRequeued {
            job_id,
            attempt,
            max_attempts,
        });
    }
}
