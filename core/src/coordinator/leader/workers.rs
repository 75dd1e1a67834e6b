//! The worker registry at the leader: registration (checked, then reconciled with what the
//! worker reports: reconnects, duplicates, re-adoption after a takeover), heartbeats, draining,
//! loss, and the `WORKERS` listing. Attempts themselves (results, deadlines, retries) are in
//! `attempts`.

use std::collections::{BTreeMap, BTreeSet};

use super::{LeaderState, Registration};
use crate::coordinator::member::Member;
use crate::coordinator::timers::Timer;
use crate::coordinator::{Event, LossReason, WorkerEntry};
use crate::ids::{ConnectionId, JobId, LeaseId, RequestId, WorkerId};
use crate::job::FailureKind;
use crate::limits::QUEUES_MAX;
use crate::limits::{
    PREFETCH_PER_SLOT_MAX, REPORTED_FINISHED_MAX, TASKS_PER_WORKER_MAX, WORKERS_MAX,
    WORKER_CAPACITY_MAX,
};
use crate::protocol::{
    CancelReason, ClientReply, CoordinatorToWorker, ErrorCode, RegisterRejection, RunningAttempt,
};
use crate::queues::check_queue_name;
use crate::tasks::check_served_name;
use crate::time::as_millis_u64;

impl LeaderState {
    /// A heartbeat: acknowledged if the connection belongs to a registered worker (any
    /// message from one has already been noted as a sign of life).
    pub(super) fn heartbeat(&mut self, m: &mut Member, conn: ConnectionId) {
        match self.registry.worker_on(conn) {
            Some(_) => m.send_worker(conn, CoordinatorToWorker::HeartbeatAck { term: self.term }),
            None => self.reject_unregistered(m, conn),
        }
    }

    /// A client's `WORKERS`: the registry as this leader sees it now.
    pub(super) fn list_workers(
        &mut self,
        m: &mut Member,
        conn: ConnectionId,
        request_id: RequestId,
    ) {
        let now = m.now;
        let workers = self.registry.iter().map(|w| w.view(now)).collect();
        m.send_client(
            conn,
            ClientReply::WorkerList {
                request_id,
                workers,
            },
        );
    }

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
            queues,
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
        if let Some(queues) = queues {
            check_served_queues(queues).map_err(invalid)?;
        }
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
            queues: registration
                .queues
                .map(|queues| queues.into_iter().collect()),
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
                !held.contains(lease_id) && !self.scheduling.in_flight.contains(job_id)
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
            if !still_current && !self.attempts.is_settling(attempt.lease_id) {
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

/// The queues a worker takes work from: 1 to [`QUEUES_MAX`] valid queue names.
fn check_served_queues(queues: &[String]) -> Result<(), String> {
    if queues.is_empty() || queues.len() > QUEUES_MAX {
        return Err(format!(
            "takes work from {} queues; name 1 to {QUEUES_MAX} (or none, for every queue)",
            queues.len()
        ));
    }
    for name in queues {
        check_queue_name(name).map_err(|error| format!("cannot serve a queue: {error}"))?;
    }
    Ok(())
}
