//! What an applied attempt command makes visible at the leader: the assignment sent to its
//! worker with its deadline armed, events, a retry's timer, a revoked lease's cancel. Nothing here
//! runs before the entry is committed, so nothing leaves before it is durable.

use std::time::Duration;

use super::super::{LeaderState, Pending};
use super::task_timeout;
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::coordinator::timers::Timer;
use crate::coordinator::Event;
use crate::ids::{ConnectionId, JobId, LeaseId};
use crate::job::{AttemptEnd, FailureKind, Job, Lease};
use crate::protocol::{CancelReason, CoordinatorToWorker};
use crate::table::Applied;
use crate::time::as_millis_u64;

impl LeaderState {
    /// A settling command applied (whatever its outcome): the lease no longer settles, a result
    /// deferred meanwhile is answered, and a revocation nobody asked for is carried out on any
    /// process that has reported the attempt since.
    pub(in crate::coordinator::leader) fn settlement_applied(
        &mut self,
        m: &mut Member,
        command: &Command,
        applied: &Applied,
        pending: Option<&Pending>,
    ) {
        let (job_id, lease_id) = match command {
            Command::Complete {
                job_id, lease_id, ..
            }
            | Command::Release { job_id, lease_id }
            | Command::AttemptFailed {
                job_id, lease_id, ..
            }
            | Command::Abandon { job_id, lease_id } => (*job_id, *lease_id),
            _ => return,
        };
        self.attempts.settling.remove(&lease_id);
        self.answer_deferred_ack(m, lease_id, pending);
        if !matches!(
            command,
            Command::AttemptFailed { .. } | Command::Abandon { .. }
        ) {
            return;
        }
        // A revocation that found the lease already ended (the job was cancelled while it was
        // being written) sends nothing of its own, yet a worker that re-reported the attempt
        // meanwhile was not told to stop because this was settling.
        let revoked_too_late = matches!(applied, Applied::Stale { .. })
            && matches!(pending, Some(Pending::Revoke { .. }));
        if pending.is_none() || revoked_too_late {
            // Revoked because its worker was lost or a restart interrupted it (or too late, as
            // above). If a process has since reported the attempt, it is told to stop now that
            // the revocation is durable (never before).
            self.cancel_wherever_reported(m, job_id, lease_id);
        }
    }

    pub(in crate::coordinator::leader) fn on_assigned(
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
            timeout_millis: as_millis_u64(task_timeout(m, job_id)),
        };
        let max_attempts = job.max_attempts;
        let queued_millis = queued_millis(job);
        let queue = job.queue.clone();
        self.arm_lease_deadline(m, &lease.worker, job_id, lease.id);
        m.event(Event::JobAssigned {
            job_id,
            worker: lease.worker.clone(),
            attempt,
            max_attempts,
            lease_id: lease.id,
            queued_millis,
            queue,
        });
        m.send_worker(conn, message);
    }

    pub(in crate::coordinator::leader) fn on_completed(
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
    pub(in crate::coordinator::leader) fn on_retry_scheduled(
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

    pub(in crate::coordinator::leader) fn on_failed_permanently(
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
    pub(in crate::coordinator::leader) fn on_stale(
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

    /// Tells the worker holding `lease` (whichever process of that id reported it) to stop.
    pub(in crate::coordinator::leader) fn send_cancel(
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

    /// Sends `TASK_CANCEL` to any live worker that holds `lease_id` (a rare path: recovery only).
    pub(in crate::coordinator::leader) fn cancel_wherever_reported(
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

    /// A cancel revoked the running attempt holding `lease`: its worker is told to stop.
    pub(in crate::coordinator::leader) fn revoked_by_cancel(
        &mut self,
        m: &mut Member,
        job_id: JobId,
        lease: &Lease,
    ) {
        self.disarm_lease_deadline(lease.id);
        self.attempts.awaiting_readoption.remove(&lease.id);
        self.send_cancel(m, lease, job_id, CancelReason::JobCancelled);
    }

    /// A draining worker's attempt was handed back: the job is queued again, uncharged.
    pub(in crate::coordinator::leader) fn on_released(
        &mut self,
        m: &mut Member,
        pending: Option<Pending>,
        job_id: JobId,
        lease: Lease,
    ) {
        self.disarm_lease_deadline(lease.id);
        m.event(Event::AttemptReleased {
            job_id,
            worker: lease.worker.clone(),
        });
        self.ack_result(m, pending, job_id, lease.id, true);
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
pub(in crate::coordinator::leader) fn on_requeued(m: &mut Member, job_id: JobId) {
    if let Some(job) = m.table.get(&job_id) {
        let (attempt, max_attempts) = (job.attempt, job.max_attempts);
        m.event(Event::JobRequeued {
            job_id,
            attempt,
            max_attempts,
        });
    }
}
