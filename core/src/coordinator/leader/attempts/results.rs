//! A worker's result at the leader: taken in (held, current, settling, or stale), its settlement
//! proposed, and the worker's acknowledgement, which is sent only once the outcome it reveals is
//! durable. Every decision to acknowledge a result, and how, is made in this file.

use super::super::{LeaderState, Pending};
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::coordinator::Event;
use crate::ids::{ConnectionId, JobId, LeaseId, WorkerId};
use crate::job::{FailureKind, Lease};
use crate::limits::ATTEMPT_ERROR_BYTES_MAX;
use crate::protocol::{AttemptOutcome, CoordinatorToWorker};
use crate::text::prefix_within;

impl LeaderState {
    pub(in crate::coordinator::leader) fn receive_result(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        job_id: JobId,
        lease_id: LeaseId,
        outcome: AttemptOutcome,
    ) {
        let Some(worker) = self.registry.worker_on(conn).cloned() else {
            return self.reject_unregistered(m, conn);
        };
        // A result is as good as a report that the attempt is still ours: re-adopt, then settle.
        self.try_readopt(m, &worker, job_id, lease_id);
        // The slot is freed only by a report naming both the lease and the job it was granted for;
        // a report that gets the pair wrong changes nothing.
        let held = match self.registry.get_mut(&worker) {
            Some(entry) if entry.leases.get(&lease_id) == Some(&job_id) => {
                entry.free(lease_id);
                true
            }
            _ => false,
        };
        let current = m
            .table
            .get(&job_id)
            .and_then(|job| job.lease.as_ref())
            .is_some_and(|lease| lease.id == lease_id && lease.worker == worker);
        if current && self.attempts.is_settling(lease_id) {
            // The attempt's settlement is proposed but not yet durable. Answering now would reveal
            // an outcome a crash could still undo (and the worker would drop its result); the
            // answer goes out when the settlement applies.
            self.attempts
                .deferred_acks
                .insert(lease_id, (job_id, worker));
            return;
        }
        if !held || !current {
            let answer = CoordinatorToWorker::ResultAck {
                term: self.term,
                job_id,
                lease_id,
                accepted: false,
            };
            if held && matches!(outcome, AttemptOutcome::Cancelled {}) {
                // The expected end of a revoked attempt: its slot is free again, nothing to report.
                return m.send_worker(conn, answer);
            }
            // The lease is not current in the durable table, or not this worker's: leases never
            // become current again, so this verdict is final; apply would reach the same one.
            let reason = match m.table.get(&job_id) {
                None => "unknown job".to_owned(),
                Some(job) if job.state.is_terminal() => format!("job is already {}", job.state),
                Some(_) => "lease is not the job's current lease".to_owned(),
            };
            m.event(Event::StaleResultRejected {
                job_id,
                lease_id,
                worker,
                reason,
            });
            return m.send_worker(conn, answer);
        }
        let pending = Some(Pending::Result {
            worker: worker.clone(),
        });
        self.propose_settlement(m, (job_id, lease_id), &worker, outcome, pending);
    }

    /// A result for the current attempt of `worker`, not yet settling: propose what it settles
    /// (completion, failure, or a release by a draining worker). `pending` is answered when
    /// that applies.
    fn propose_settlement(
        &mut self,
        m: &mut Member,
        (job_id, lease_id): (JobId, LeaseId),
        worker: &WorkerId,
        outcome: AttemptOutcome,
        pending: Option<Pending>,
    ) {
        match outcome {
            AttemptOutcome::Succeeded { output } if output.oversize().is_some() => {
                // Workers refuse to send these; one that does not fails its job here, since
                // no retry would make the result smaller.
                let (bytes, max) = output.oversize().unwrap_or_default();
                let cause = format!(
                    "task on worker {worker} returned a result of {bytes} bytes as JSON; at most {max} bytes are kept (store large results elsewhere and return a reference)"
                );
                self.propose_failure(
                    m,
                    (job_id, lease_id),
                    (FailureKind::TaskFailed, cause),
                    true,
                    pending,
                );
            }
            AttemptOutcome::Succeeded { output } => {
                self.attempts.begin_settling(lease_id);
                self.propose(
                    m,
                    Command::Complete {
                        job_id,
                        lease_id,
                        output,
                    },
                    pending,
                );
            }
            AttemptOutcome::Failed { error, permanent } => {
                // Workers cut their messages; one that does not is cut here, so every job view
                // stays within its bound.
                let error = prefix_within(&error, ATTEMPT_ERROR_BYTES_MAX);
                let cause = if permanent {
                    format!("task failed permanently on worker {worker}: {error}")
                } else {
                    format!("task failed on worker {worker}: {error}")
                };
                self.propose_failure(
                    m,
                    (job_id, lease_id),
                    (FailureKind::TaskFailed, cause),
                    permanent,
                    pending,
                );
            }
            AttemptOutcome::Released {}
                if self.registry.get(worker).is_some_and(|w| w.draining) =>
            {
                self.attempts.begin_settling(lease_id);
                self.propose(m, Command::Release { job_id, lease_id }, pending);
            }
            AttemptOutcome::Released {} => {
                // Only a drain hands an attempt back for free; otherwise a worker could keep
                // a job forever without it ever costing an attempt.
                let cause = format!("worker {worker} handed the attempt back without draining");
                self.fail_attempt(
                    m,
                    job_id,
                    lease_id,
                    (FailureKind::TaskFailed, cause),
                    pending,
                );
            }
            AttemptOutcome::Cancelled {} => {
                let cause = format!("worker {worker} stopped the attempt unasked");
                self.fail_attempt(
                    m,
                    job_id,
                    lease_id,
                    (FailureKind::TaskFailed, cause),
                    pending,
                );
            }
        }
    }

    /// Effects of a failed attempt settling: acknowledge the worker's report, or tell the worker
    /// its lease was revoked.
    pub(in crate::coordinator::leader) fn settle_effects(
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

    /// A result that arrived while its attempt was settling gets its (now durable) answer. The
    /// settlement's own acknowledgement already covers a resend from the worker whose result it
    /// was; anyone else learns their result did not count.
    pub(in crate::coordinator::leader) fn answer_deferred_ack(
        &mut self,
        m: &mut Member,
        lease_id: LeaseId,
        pending: Option<&Pending>,
    ) {
        let Some((job_id, worker)) = self.attempts.deferred_acks.remove(&lease_id) else {
            return;
        };
        if matches!(pending, Some(Pending::Result { worker: w }) if *w == worker) {
            return;
        }
        self.ack_result(m, Some(Pending::Result { worker }), job_id, lease_id, false);
    }

    /// Acknowledges a worker's result on the worker's current connection (it may have
    /// reconnected while the result was being made durable).
    pub(in crate::coordinator::leader) fn ack_result(
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
}
