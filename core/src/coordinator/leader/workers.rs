//! The worker link at the leader: registration (reconnects, duplicates, re-adoption after a
//! takeover), heartbeats and loss, results and the lease check, deadlines and retries.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand_chacha::rand_core::RngCore;

use super::{LeaderState, Pending, Registration};
use crate::command::Command;
use crate::coordinator::member::Member;
use crate::coordinator::timers::Timer;
use crate::coordinator::{Event, LossReason, WorkerEntry};
use crate::ids::{ConnectionId, Incarnation, JobId, LeaseId, WorkerId};
use crate::job::FailureKind;
use crate::limits::{
    ATTEMPT_ERROR_BYTES_MAX, PREFETCH_PER_SLOT_MAX, PROGRESS_NOTE_BYTES_MAX, REPORTED_FINISHED_MAX,
    TASKS_PER_WORKER_MAX, WORKERS_MAX, WORKER_CAPACITY_MAX,
};
use crate::protocol::{
    AttemptOutcome, CancelReason, CoordinatorToWorker, ErrorCode, RegisterRejection, RunningAttempt,
};
use crate::tasks::check_served_name;
use crate::text::prefix_within;
use crate::time::as_millis_u64;

impl LeaderState {
    pub(super) fn reject_unregistered(&mut self, m: &mut Member, conn: ConnectionId) {
        m.send_worker(
            conn,
            CoordinatorToWorker::Error {
                code: ErrorCode::NotRegistered,
                message: "this connection has not registered (or was declared lost); reconnect and REGISTER".into(),
            },
        );
        m.close(conn);
    }

    pub(super) fn refuse_registration(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        worker: WorkerId,
        reason: RegisterRejection,
        message: String,
    ) {
        m.event(Event::WorkerRejected {
            worker,
            reason: message.clone(),
        });
        m.send_worker(
            conn,
            CoordinatorToWorker::RegisterRejected { reason, message },
        );
        m.close(conn);
    }

    pub(super) fn register(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        mut registration: Registration,
    ) {
        if let Err((reason, message)) = self.check_registration(conn, &registration) {
            let worker = registration.worker_id;
            return self.refuse_registration(m, conn, worker, reason, message);
        }
        let running = std::mem::take(&mut registration.running);
        let finished = std::mem::take(&mut registration.finished);
        let Registration {
            ref worker_id,
            incarnation,
            capacity,
            draining,
            ..
        } = registration;
        let worker_id = worker_id.clone();
        let existing = self
            .registry
            .get(&worker_id)
            .map(|w| (w.alive, w.incarnation, w.conn));
        match existing {
            Some((true, known, old_conn)) if known == incarnation => {
                // The same process on a new connection (the old one is half-open or just closing).
                if old_conn != Some(conn) {
                    self.registry.rebind(&worker_id, conn);
                    if let Some(old) = old_conn {
                        m.close(old);
                    }
                }
                // Capacity and tasks are fixed for the life of a process; a reconnect cannot
                // change them, but a drain that began while it was away counts.
                if let Some(entry) = self.registry.get_mut(&worker_id) {
                    entry.last_heartbeat = m.now;
                    entry.draining |= draining;
                }
                self.reconcile_slots(m, &worker_id, &running, &finished);
                m.event(Event::WorkerRegistered {
                    worker: worker_id.clone(),
                    incarnation,
                    capacity,
                    reconnect: true,
                });
            }
            Some((true, known, _)) => {
                let message = format!(
                    "worker id {worker_id} is held by a live process (incarnation {known}); pick another id or stop that process"
                );
                let reason = RegisterRejection::DuplicateWorkerId;
                return self.refuse_registration(m, conn, worker_id, reason, message);
            }
            _ => {
                if let Err(message) = self.make_room_for(&worker_id) {
                    let reason = RegisterRejection::TooManyWorkers;
                    return self.refuse_registration(m, conn, worker_id, reason, message);
                }
                let entry = self.new_entry(m, conn, registration);
                self.registry.insert(entry);
                m.event(Event::WorkerRegistered {
                    worker: worker_id.clone(),
                    incarnation,
                    capacity,
                    reconnect: false,
                });
                self.abandon_other_incarnations(m, &worker_id, incarnation);
            }
        }
        m.send_worker(
            conn,
            CoordinatorToWorker::Registered {
                term: self.term,
                members: m.member_addresses(crate::coordinator::Link::Worker),
                heartbeat_interval_millis: as_millis_u64(m.config.heartbeat_interval),
                heartbeat_timeout_millis: as_millis_u64(m.config.heartbeat_timeout),
            },
        );
        for attempt in running {
            self.reconcile_reported(m, conn, &worker_id, attempt);
        }
    }

    /// Whether `registration`, on `conn`, is one an honest worker could send: a valid id,
    /// capacity and prefetch within bounds, no more attempts reported than it has room for,
    /// task names that are valid, and a connection not registered as another worker.
    fn check_registration(
        &self,
        conn: ConnectionId,
        registration: &Registration,
    ) -> Result<(), (RegisterRejection, String)> {
        let invalid = |message: String| (RegisterRejection::InvalidRegistration, message);
        let Registration {
            worker_id,
            incarnation,
            capacity,
            prefetch,
            running,
            finished,
            tasks,
            ..
        } = registration;
        let (capacity, prefetch) = (*capacity, *prefetch);
        WorkerId::parse(worker_id.as_str()).map_err(|error| invalid(error.to_string()))?;
        if !(1..=WORKER_CAPACITY_MAX).contains(&capacity) {
            return Err(invalid(format!(
                "capacity must be between 1 and {WORKER_CAPACITY_MAX} (got {capacity})"
            )));
        }
        if prefetch > capacity.saturating_mul(PREFETCH_PER_SLOT_MAX) {
            return Err(invalid(format!(
                "prefetch may be at most {PREFETCH_PER_SLOT_MAX} per slot ({} with capacity {capacity}), got {prefetch}",
                capacity.saturating_mul(PREFETCH_PER_SLOT_MAX)
            )));
        }
        // An honest process cannot hold (or hold results of) more attempts than it has slots and
        // prefetch room, plus results waiting; bounding the report bounds what a peer can make
        // us track. A reconnect is held to the room its entry was registered with, which it
        // cannot change.
        let (bound_capacity, bound_prefetch) = match self.registry.get(worker_id) {
            Some(entry) if entry.alive && entry.incarnation == *incarnation => {
                (entry.capacity, entry.prefetch)
            }
            _ => (capacity, prefetch),
        };
        let holdable = (bound_capacity as usize).saturating_add(bound_prefetch as usize);
        let reported = running.len().saturating_add(finished.len());
        let reportable = holdable.saturating_mul(2).max(1);
        if running.len() > holdable || reported > reportable.max(REPORTED_FINISHED_MAX) {
            return Err(invalid(format!(
                "reports {} running or waiting attempts with capacity {capacity} and prefetch {prefetch} (and {} unacknowledged results)",
                running.len(),
                finished.len()
            )));
        }
        check_served_tasks(tasks).map_err(invalid)?;
        match self.registry.worker_on(conn) {
            Some(bound) if bound != worker_id => Err(invalid(format!(
                "this connection is already registered as {bound}"
            ))),
            _ => Ok(()),
        }
    }

    /// Room in the registry for a worker id it does not hold yet: lost workers are evicted if
    /// it is full; a registry full of live ones has none.
    fn make_room_for(&mut self, worker_id: &WorkerId) -> Result<(), String> {
        if self.registry.get(worker_id).is_none() && self.registry.len() >= WORKERS_MAX {
            self.registry.evict_lost(WORKERS_MAX - 1);
            if self.registry.len() >= WORKERS_MAX {
                return Err(format!(
                    "the registry already tracks {WORKERS_MAX} live workers"
                ));
            }
        }
        Ok(())
    }

    /// The registry entry of a newly registered process (its reports already taken out), with
    /// its heartbeat check armed.
    fn new_entry(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        registration: Registration,
    ) -> WorkerEntry {
        self.next_registration += 1;
        let number = self.next_registration;
        self.timers.arm(
            m.now.saturating_add(m.config.heartbeat_timeout),
            Timer::HeartbeatCheck(registration.worker_id.clone(), number),
        );
        WorkerEntry {
            id: registration.worker_id,
            incarnation: registration.incarnation,
            registration: number,
            capacity: registration.capacity,
            prefetch: registration.prefetch,
            conn: Some(conn),
            alive: true,
            last_heartbeat: m.now,
            leases: BTreeMap::new(),
            ends: BTreeMap::new(),
            overdue: BTreeSet::new(),
            tasks: registration.tasks.into_iter().collect(),
            draining: registration.draining,
        }
    }

    /// The worker is shutting down: it gets no new work. What it runs ends as usual, or comes
    /// back released.
    pub(super) fn worker_draining(&mut self, m: &mut Member, worker: &WorkerId) {
        if let Some(entry) = self.registry.get_mut(worker) {
            if !entry.draining {
                entry.draining = true;
                let running = entry.leases.len();
                m.event(Event::WorkerDraining {
                    worker: worker.clone(),
                    running,
                });
            }
        }
    }

    /// The same process came back on a new connection, saying what it holds. Messages on the old
    /// connection may have been lost: an assignment it never got keeps a slot that nothing would
    /// ever free, and its attempt would wait for its deadline. Whatever the worker neither runs
    /// nor has a result for is given up now (the attempt is retried); an assignment still being
    /// made durable is left alone, it goes out on the new connection.
    pub(super) fn reconcile_slots(
        &mut self,
        m: &mut Member,
        worker_id: &WorkerId,
        running: &[RunningAttempt],
        finished: &[RunningAttempt],
    ) {
        let Some(entry) = self.registry.get(worker_id) else {
            return;
        };
        let held: BTreeSet<LeaseId> = running
            .iter()
            .chain(finished)
            .map(|attempt| attempt.lease_id)
            .collect();
        let missing: Vec<(LeaseId, JobId)> = entry
            .leases
            .iter()
            .filter(|(lease_id, job_id)| {
                !held.contains(lease_id) && !self.assigning.contains(job_id)
            })
            .map(|(&lease_id, &job_id)| (lease_id, job_id))
            .collect();
        for (lease_id, job_id) in missing {
            if let Some(entry) = self.registry.get_mut(worker_id) {
                entry.free(lease_id);
            }
            let cause = format!(
                "worker {worker_id} reconnected without attempt {lease_id}: its assignment was lost with the old connection"
            );
            self.fail_attempt(m, job_id, lease_id, (FailureKind::WorkerLost, cause), None);
        }
    }

    /// A registering worker says it is running `attempt`. Re-adopt it if it is a recovered
    /// attempt of this very process; keep counting the slot of an attempt it already holds;
    /// otherwise it is stale: tell the worker to stop it, and count its slot until it does.
    pub(super) fn reconcile_reported(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        worker_id: &WorkerId,
        attempt: RunningAttempt,
    ) {
        if self.try_readopt(m, worker_id, attempt.job_id, attempt.lease_id) {
            return;
        }
        let still_current = m.table.is_current_lease(attempt.job_id, attempt.lease_id);
        let Some(entry) = self.registry.get_mut(worker_id) else {
            return;
        };
        if entry.leases.contains_key(&attempt.lease_id) {
            if !still_current && !self.settling.contains(&attempt.lease_id) {
                // Revoked while the old connection carried the cancel; it may have been lost.
                m.send_worker(
                    conn,
                    CoordinatorToWorker::TaskCancel {
                        term: self.term,
                        job_id: attempt.job_id,
                        lease_id: attempt.lease_id,
                        reason: CancelReason::LeaseNotCurrent,
                    },
                );
            }
            return;
        }
        let job_id = attempt.job_id;
        entry.leases.insert(attempt.lease_id, job_id);
        // Stale, and about to be told to stop; until it does, it holds a slot, for at most a
        // default timeout if it is running.
        entry.ends.insert(
            attempt.lease_id,
            m.now.saturating_add(m.config.task_timeout),
        );
        if still_current {
            // Its revocation is proposed but not yet durable; the cancel goes out when it applies
            // (see `settle_effects`), never before.
            return;
        }
        m.send_worker(
            conn,
            CoordinatorToWorker::TaskCancel {
                term: self.term,
                job_id,
                lease_id: attempt.lease_id,
                reason: CancelReason::LeaseNotCurrent,
            },
        );
    }

    /// Re-adopts a recovered running attempt if `worker_id`'s live incarnation is the one the
    /// lease was granted to.
    pub(super) fn try_readopt(
        &mut self,
        m: &mut Member,
        worker_id: &WorkerId,
        job_id: JobId,
        lease_id: LeaseId,
    ) -> bool {
        if self.awaiting_readoption.get(&lease_id) != Some(&job_id) {
            return false;
        }
        let Some(lease) = m.table.get(&job_id).and_then(|job| job.lease.clone()) else {
            return false;
        };
        let Some(entry) = self.registry.get_mut(worker_id) else {
            return false;
        };
        if lease.id != lease_id
            || lease.worker != *worker_id
            || lease.incarnation != entry.incarnation
            || !entry.alive
        {
            return false;
        }
        self.awaiting_readoption.remove(&lease_id);
        entry.leases.insert(lease_id, job_id);
        self.arm_lease_deadline(m, worker_id, job_id, lease_id);
        m.event(Event::AttemptReadopted {
            job_id,
            lease_id,
            worker: worker_id.clone(),
        });
        true
    }

    /// A worker id came back as a new process: attempts the old process held cannot be re-adopted.
    pub(super) fn abandon_other_incarnations(
        &mut self,
        m: &mut Member,
        worker_id: &WorkerId,
        incarnation: Incarnation,
    ) {
        let orphans: Vec<(LeaseId, JobId)> = self
            .awaiting_readoption
            .iter()
            .filter(|(_, job_id)| {
                m.table
                    .get(job_id)
                    .and_then(|job| job.lease.as_ref())
                    .is_some_and(|lease| {
                        lease.worker == *worker_id && lease.incarnation != incarnation
                    })
            })
            .map(|(&lease_id, &job_id)| (lease_id, job_id))
            .collect();
        for (lease_id, job_id) in orphans {
            self.abandon(m, job_id, lease_id);
        }
    }

    pub(super) fn abandon(&mut self, m: &mut Member, job_id: JobId, lease_id: LeaseId) {
        self.awaiting_readoption.remove(&lease_id);
        if self.settling.contains(&lease_id) || !m.table.is_current_lease(job_id, lease_id) {
            return;
        }
        let worker = m
            .table
            .get(&job_id)
            .and_then(|job| job.lease.as_ref())
            .map(|lease| lease.worker.clone())
            .unwrap_or_else(|| WorkerId(String::new()));
        m.event(Event::AttemptAbandoned {
            job_id,
            lease_id,
            worker,
        });
        self.settling.insert(lease_id);
        self.propose(m, Command::Abandon { job_id, lease_id }, None);
    }

    pub(super) fn end_readoption(&mut self, m: &mut Member) {
        let leftovers: Vec<(LeaseId, JobId)> = self
            .awaiting_readoption
            .iter()
            .map(|(&lease_id, &job_id)| (lease_id, job_id))
            .collect();
        for (lease_id, job_id) in leftovers {
            self.abandon(m, job_id, lease_id);
        }
    }

    pub(super) fn check_heartbeat(&mut self, m: &mut Member, worker: &WorkerId, registration: u64) {
        let Some(entry) = self.registry.get(worker) else {
            return;
        };
        // A check armed for an earlier registration dies here instead of re-arming forever.
        if !entry.alive || entry.registration != registration {
            return;
        }
        let deadline = entry
            .last_heartbeat
            .saturating_add(m.config.heartbeat_timeout);
        if deadline <= m.now {
            let silent_millis = as_millis_u64(m.now.saturating_since(entry.last_heartbeat));
            self.lose_worker(m, worker, LossReason::HeartbeatTimeout { silent_millis });
        } else {
            self.timers.arm(
                deadline,
                Timer::HeartbeatCheck(worker.clone(), registration),
            );
        }
    }

    /// Declares `worker` lost: its connection is closed and every attempt it held is failed
    /// (retried if attempts remain).
    pub(super) fn lose_worker(&mut self, m: &mut Member, worker: &WorkerId, reason: LossReason) {
        if !self.registry.get(worker).is_some_and(|w| w.alive) {
            return;
        }
        let (conn, leases) = self.registry.mark_lost(worker);
        if let Some(conn) = conn {
            m.close(conn);
        }
        let cause = format!("worker {worker} lost ({reason})");
        m.event(Event::WorkerLost {
            worker: worker.clone(),
            reason,
        });
        for (lease_id, job_id) in leases {
            // Attempts with an `Assign` still in flight are failed when it applies (see `on_assigned`).
            self.fail_attempt(
                m,
                job_id,
                lease_id,
                (FailureKind::WorkerLost, cause.clone()),
                None,
            );
        }
    }

    /// Proposes `AttemptFailed` (retryable) for a current, not-yet-settling lease.
    pub(super) fn fail_attempt(
        &mut self,
        m: &mut Member,
        job_id: JobId,
        lease_id: LeaseId,
        failure: (FailureKind, String),
        pending: Option<Pending>,
    ) -> bool {
        self.propose_failure(m, (job_id, lease_id), failure, false, pending)
    }

    /// Proposes `AttemptFailed` for a current, not-yet-settling lease; a `permanent` failure
    /// ends the job whatever attempts remain.
    pub(super) fn propose_failure(
        &mut self,
        m: &mut Member,
        (job_id, lease_id): (JobId, LeaseId),
        (kind, cause): (FailureKind, String),
        permanent: bool,
        pending: Option<Pending>,
    ) -> bool {
        if self.settling.contains(&lease_id) || !m.table.is_current_lease(job_id, lease_id) {
            return false;
        }
        let attempt = m.table.get(&job_id).map_or(1, |job| job.attempt.0);
        let retry_delay_millis = self.retry_delay_millis(m, attempt);
        self.settling.insert(lease_id);
        self.propose(
            m,
            Command::AttemptFailed {
                job_id,
                lease_id,
                cause,
                retry_delay_millis,
                permanent,
                kind,
            },
            pending,
        );
        true
    }

    /// Full jitter: uniform in `[0, min(retry_max, retry_base * 2^(attempt-1))]`.
    pub(super) fn retry_delay_millis(&mut self, m: &mut Member, attempt: u32) -> u64 {
        let base = as_millis_u64(m.config.retry_base);
        let cap = as_millis_u64(m.config.retry_max);
        let exponent = attempt.saturating_sub(1).min(63);
        let ceiling = base.saturating_mul(1u64 << exponent).min(cap);
        m.rng.next_u64() % (ceiling + 1)
    }

    pub(super) fn expire_lease(&mut self, m: &mut Member, job_id: JobId, lease_id: LeaseId) {
        self.lease_deadlines.remove(&lease_id);
        let Some(worker) = m
            .table
            .get(&job_id)
            .and_then(|job| job.lease.as_ref())
            .filter(|lease| lease.id == lease_id)
            .map(|lease| lease.worker.clone())
        else {
            return;
        };
        if let Some(entry) = self.registry.get_mut(&worker) {
            if entry.leases.contains_key(&lease_id) {
                // It keeps its slot until the worker says it stopped, and when that will be
                // is no longer known.
                entry.overdue.insert(lease_id);
            }
        }
        let cause = format!(
            "attempt deadline of {} ms expired on worker {worker}",
            as_millis_u64(task_timeout(m, job_id))
        );
        let revoke = Pending::Revoke {
            reason: CancelReason::DeadlineExpired,
        };
        if self.fail_attempt(
            m,
            job_id,
            lease_id,
            (FailureKind::DeadlineExpired, cause),
            Some(revoke),
        ) {
            m.event(Event::LeaseExpired {
                job_id,
                lease_id,
                worker,
            });
        }
    }

    pub(super) fn receive_result(
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
        if current && self.settling.contains(&lease_id) {
            // The attempt's settlement is proposed but not yet durable. Answering now would reveal
            // an outcome a crash could still undo (and the worker would drop its result); the
            // answer goes out when the settlement applies.
            self.deferred_acks.insert(lease_id, (job_id, worker));
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
                self.settling.insert(lease_id);
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
                self.settling.insert(lease_id);
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

    /// Arms the deadline of a lease that is going out to (or was re-adopted from) `worker`: its
    /// attempt's timeout, counted from when the attempt can start at the latest, so time spent
    /// waiting for a slot at a prefetching worker never counts against it.
    pub(super) fn arm_lease_deadline(
        &mut self,
        m: &mut Member,
        worker: &WorkerId,
        job_id: JobId,
        lease_id: LeaseId,
    ) {
        let timeout = task_timeout(m, job_id);
        let at = match self.registry.get_mut(worker) {
            Some(entry) => {
                let at = entry.latest_start(lease_id, m.now).saturating_add(timeout);
                if entry.leases.contains_key(&lease_id) {
                    entry.ends.insert(lease_id, at);
                }
                at
            }
            None => m.now.saturating_add(timeout),
        };
        let key = self.timers.arm(at, Timer::LeaseDeadline(job_id, lease_id));
        self.lease_deadlines.insert(lease_id, key);
    }

    pub(super) fn disarm_lease_deadline(&mut self, lease_id: LeaseId) {
        self.progress.remove(&lease_id);
        if let Some(key) = self.lease_deadlines.remove(&lease_id) {
            self.timers.disarm(key);
        }
    }

    /// Keeps a running attempt's latest progress note, if the attempt is this worker's and its
    /// deadline is armed (it runs); anything else is a stale or mistaken report and ignored.
    pub(super) fn note_progress(
        &mut self,
        worker: &WorkerId,
        job_id: JobId,
        lease_id: LeaseId,
        note: &str,
    ) {
        let holds = self
            .registry
            .get(worker)
            .is_some_and(|w| w.leases.get(&lease_id) == Some(&job_id));
        if holds && self.lease_deadlines.contains_key(&lease_id) {
            let note = prefix_within(note, PROGRESS_NOTE_BYTES_MAX).to_owned();
            self.progress.insert(lease_id, note);
        }
    }
}

/// The task kinds a worker registers: at most [`TASKS_PER_WORKER_MAX`], each a built-in kind
/// or a valid user task name.
fn check_served_tasks(tasks: &[String]) -> Result<(), String> {
    if tasks.len() > TASKS_PER_WORKER_MAX {
        return Err(format!(
            "serves {} task kinds; at most {TASKS_PER_WORKER_MAX} are allowed",
            tasks.len()
        ));
    }
    for name in tasks {
        check_served_name(name).map_err(|error| format!("cannot serve a task: {error}"))?;
    }
    Ok(())
}

/// Each attempt's deadline for `job_id`: the one its submission chose, else the default.
pub(super) fn task_timeout(m: &Member, job_id: JobId) -> Duration {
    m.table
        .get(&job_id)
        .and_then(|job| job.timeout_millis)
        .map_or(m.config.task_timeout, Duration::from_millis)
}
