//! What the leader does when a committed entry applies: a router from the entry and its outcome
//! to the feature that owns it (`scheduling`, `attempts`, `submissions`, `clients`, `waits`,
//! `retention`, `reads`), which sends the replies, assignments, cancels, acknowledgements and
//! events the outcome makes visible. Nothing here runs before the entry is committed, so nothing
//! visible leaves before it is durable.

use super::submissions::{idempotency_conflict, QueueRefusal, SubmitTo};
use super::{LeaderState, Pending};
use crate::command::{Command, LogEntry};
use crate::coordinator::member::Member;
use crate::coordinator::Event;
use crate::job::JobState;
use crate::protocol::ErrorCode;
use crate::table::{Applied, Outcome};

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
        self.scheduling_applied(entry, &outcome);
        let refused = match &outcome.applied {
            Applied::QueueAdmissionRejected {
                queue,
                active_jobs,
                max_active_jobs,
                ..
            } => Some(QueueRefusal {
                queue: queue.clone(),
                active_jobs: *active_jobs,
                max_active_jobs: *max_active_jobs,
            }),
            _ => None,
        };
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
                SubmitTo::Request { .. } => self.submit(m, resend.to, *resend.submission, false),
                SubmitTo::BatchItem { .. } => {
                    self.answer_parked_batch_job(m, resend, refused.as_ref())
                }
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
        self.settlement_applied(m, command, &applied, pending.as_ref());
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
            Applied::QueueAdmissionRejected {
                queue,
                active_jobs,
                max_active_jobs,
                ..
            } => {
                if let Some(Pending::Submit { to }) = pending {
                    let admitting = self.admitting.queue_slots(&queue);
                    self.reject_for_queue(m, to, queue, (active_jobs, admitting), max_active_jobs);
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
            Applied::Released { job_id, lease } => self.on_released(m, pending, job_id, lease),
            Applied::Stale {
                job_id,
                lease_id,
                reason,
            } => self.on_stale(m, pending, job_id, lease_id, reason.to_string()),
            Applied::Requeued { job_id } => super::attempts::on_requeued(m, job_id),
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
            Applied::TooManyQueues { job_id, queues } => {
                let message = format!(
                    "job {job_id} was not created: it names a new queue and the cluster holds its maximum of {queues} queues"
                );
                self.refuse_pending_submission(m, pending, ErrorCode::TooManyQueues, message);
            }
            Applied::QueueSet { queue } => self.on_queue_set(m, pending, &queue, None),
            Applied::QueueRefused {
                queue,
                reason,
                full,
            } => {
                let code = if full {
                    ErrorCode::TooManyQueues
                } else {
                    ErrorCode::InvalidRequest
                };
                self.on_queue_set(m, pending, &queue, Some((code, reason)))
            }
            Applied::DueChecked { queued, .. } => self.on_due_checked(m, pending.as_ref(), queued),
            // Released to wait for its time: the timer may have to move up.
            Applied::Unblocked { job_id } => {
                if m.table
                    .get(&job_id)
                    .is_some_and(|j| j.state == JobState::Scheduled)
                {
                    self.check_due(m);
                }
            }
            Applied::NewLeader { .. }
            | Applied::Due { .. }
            | Applied::PartitionCreated { .. }
            | Applied::Retagged { .. }
            | Applied::RequeueSkipped { .. } => {}
        }
    }
}
