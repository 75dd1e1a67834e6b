//! The worker state machine: connect, register, heartbeat, accept attempts, report results until
//! they are acknowledged, obey cancels. It never runs a task itself: it asks its driver to
//! (`StartTask`), and the driver reports back (`handle_task_finished`).
//!
//! ```text
//!         ┌──────── backoff (full jitter) <──────────────┐
//!         v                                              │ connect failed / closed /
//!     Idle ──timer──> Connecting ──connected──> Registering ──REGISTERED──> Registered
//!                                                   │                          │
//!                                                   └── coordinator silent ────┘
//! ```
//!
//! Calling order for a driver:
//!
//! 1. Create with `Worker::new`, then drain `poll_output`: the first output is a `Connect`.
//! 2. Report what happened to that connection attempt with `handle_connected`,
//!    `handle_connect_failed` or `handle_disconnected`, always passing the `ConnectAttempt` the
//!    `Connect` carried; reports about an older attempt are ignored, so a late "closed" for a
//!    socket the machine already gave up on can never tear down the new one.
//! 3. Feed coordinator messages with `handle_message`, task completions with
//!    `handle_task_finished`, and call `handle_timeout` when `poll_timeout` is due.
//! 4. After every input, drain `poll_output`.
//!
//! Results survive a coordinator restart: each result is kept until `RESULT_ACK` names its lease,
//! and all unacknowledged results are sent again right after every successful registration.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use crate::dial::ConnectAttempt;
use crate::dial::{Dialer, RedirectRule};
use crate::ids::{Attempt, Incarnation, JobId, LeaseId, Term, WorkerId};
use crate::limits::{ATTEMPT_ERROR_BYTES_MAX, PROGRESS_NOTE_BYTES_MAX};
use crate::protocol::{
    AttemptOutcome, CoordinatorToWorker, ErrorCode, RunningAttempt, WorkerToCoordinator,
};
use crate::tasks::TaskSpec;
use crate::text::cut_within;
use crate::time::{as_millis_u64, Instant};

mod config;
mod outputs;
#[cfg(test)]
mod tests;

pub use config::{WorkerConfig, WorkerConfigError};
pub use outputs::{TaskAssignment, WorkerEvent, WorkerOutput};

#[derive(Clone, Debug)]
struct RunningTask {
    job_id: JobId,
    cancel_requested: bool,
    /// A drain asked it to stop: unless it succeeds after all, it is reported `released`.
    releasing: bool,
    /// When the assignment arrived, by the driver's clock (for the log's run time).
    started: Instant,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Link {
    /// Not connected; try again at `retry_at`.
    Idle { retry_at: Instant },
    /// Waiting for the driver to open the connection, or for `REGISTERED`.
    Connecting {
        attempt: ConnectAttempt,
        opened: bool,
        give_up_at: Instant,
    },
    Registered {
        attempt: ConnectAttempt,
        heartbeat_interval: Duration,
        heartbeat_timeout: Duration,
        next_heartbeat: Instant,
        last_heard: Instant,
    },
}

/// The worker. See the module documentation for the calling order.
pub struct Worker {
    config: WorkerConfig,
    incarnation: Incarnation,
    rng: ChaCha8Rng,
    link: Link,
    /// Where to connect next, and the reconnect backoff. A leader redirect is kept until a
    /// connect fails or times out, or a `NOT_LEADER` names no leader.
    dialer: Dialer,
    running: BTreeMap<LeaseId, RunningTask>,
    /// Prefetched assignments in arrival order, each started as a slot frees (at most
    /// `config.prefetch`, and only while every slot is taken).
    waiting: VecDeque<TaskAssignment>,
    /// Finished attempts whose results await `RESULT_ACK`.
    unacked: BTreeMap<LeaseId, (JobId, AttemptOutcome)>,
    /// The highest coordinator term heard from. Anything from an older term comes from a
    /// deposed leader and is ignored (its view of leases may be stale).
    highest_term: Term,
    /// Shutting down: no new work is accepted, and the coordinator is told so.
    draining: bool,
    /// A result went out since the last heartbeat was due: it shows the coordinator this worker
    /// is alive, so the next heartbeat is folded into it (not sent) if the coordinator was heard
    /// meanwhile too.
    result_since_heartbeat: bool,
    outputs: VecDeque<WorkerOutput>,
}

impl Worker {
    /// A worker process starting at `now`. Its incarnation is drawn from `seed`, so a restarted
    /// process (given a new seed) is told apart from a reconnecting one.
    pub fn new(config: WorkerConfig, seed: u64, now: Instant) -> Result<Worker, WorkerConfigError> {
        config.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let incarnation = Incarnation(rng.next_u64());
        let dialer = Dialer::new(config.coordinators.clone(), RedirectRule::Sticky);
        let mut worker = Worker {
            config,
            incarnation,
            rng,
            link: Link::Idle { retry_at: now },
            dialer,
            running: BTreeMap::new(),
            waiting: VecDeque::new(),
            unacked: BTreeMap::new(),
            highest_term: Term(0),
            draining: false,
            result_since_heartbeat: false,
            outputs: VecDeque::new(),
        };
        worker.connect(now);
        Ok(worker)
    }

    pub fn id(&self) -> &WorkerId {
        &self.config.worker_id
    }

    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    pub fn is_registered(&self) -> bool {
        matches!(self.link, Link::Registered { .. })
    }

    /// Attempts executing now.
    pub fn running(&self) -> impl Iterator<Item = (LeaseId, JobId)> + '_ {
        self.running
            .iter()
            .map(|(lease, task)| (*lease, task.job_id))
    }

    /// Prefetched attempts waiting for a slot, in the order they will start.
    pub fn waiting(&self) -> impl Iterator<Item = (LeaseId, JobId)> + '_ {
        self.waiting.iter().map(|w| (w.lease_id, w.job_id))
    }

    /// The task slots: at most this many attempts run at once.
    pub fn capacity(&self) -> u32 {
        self.config.capacity
    }

    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Draining, with nothing left running and every result acknowledged: the process can
    /// exit without costing any job an attempt.
    pub fn is_drained(&self) -> bool {
        self.draining
            && self.running.is_empty()
            && self.waiting.is_empty()
            && self.unacked.is_empty()
    }

    /// Begins a graceful shutdown: take no new work and tell the coordinator, so it assigns
    /// this worker nothing more. Running attempts go on; [`Worker::release_running`] hands
    /// back whatever is still running when the driver's drain timeout ends.
    pub fn begin_drain(&mut self, _now: Instant) {
        if self.draining {
            return;
        }
        self.draining = true;
        self.event(WorkerEvent::Draining {
            running: self.running.len(),
        });
        if self.is_registered() {
            self.send(WorkerToCoordinator::Draining {});
        }
        // What never started goes straight back: it costs its job no attempt.
        while let Some(waiting) = self.waiting.pop_front() {
            self.release(waiting.job_id, waiting.lease_id);
        }
    }

    /// The drain timeout passed: every attempt still running is asked to stop (`CancelTask`).
    /// Each is reported `released` once its driver says it stopped (or its result if it
    /// succeeded meanwhile), so no job runs on two workers because of a drain.
    pub fn stop_running(&mut self, _now: Instant) {
        assert!(self.draining, "attempts are stopped only by a drain");
        let mut stopping = Vec::new();
        for (lease_id, task) in &mut self.running {
            if !task.releasing {
                task.releasing = true;
                stopping.push(*lease_id);
            }
        }
        for lease_id in stopping {
            self.outputs
                .push_back(WorkerOutput::CancelTask { lease_id });
        }
    }

    /// Ends a drain: every attempt still running (one that ignored being stopped) is reported
    /// `released` at once, so the coordinator queues its job again without charging the
    /// attempt; the driver is about to exit, which ends it.
    pub fn release_running(&mut self, _now: Instant) {
        assert!(self.draining, "attempts are released only by a drain");
        let leases: Vec<LeaseId> = self.running.keys().copied().collect();
        for lease_id in leases {
            if let Some(task) = self.running.remove(&lease_id) {
                self.outputs
                    .push_back(WorkerOutput::CancelTask { lease_id });
                self.release(task.job_id, lease_id);
            }
        }
    }

    /// Records and sends a `released` result for an attempt this worker will not run.
    fn release(&mut self, job_id: JobId, lease_id: LeaseId) {
        self.event(WorkerEvent::TaskReleased { job_id, lease_id });
        self.record_result(job_id, lease_id, AttemptOutcome::Released {});
    }

    /// Reports how far a running attempt has come (sent only while registered; a note for an
    /// attempt that is not running here is dropped).
    pub fn report_progress(&mut self, lease_id: LeaseId, note: &str) {
        let Some(task) = self.running.get(&lease_id) else {
            return;
        };
        if self.is_registered() {
            let job_id = task.job_id;
            self.send(WorkerToCoordinator::Progress {
                job_id,
                lease_id,
                note: cut_within(note.to_owned(), PROGRESS_NOTE_BYTES_MAX),
            });
        }
    }

    /// Results not yet acknowledged.
    pub fn unacknowledged(&self) -> usize {
        self.unacked.len()
    }

    /// The attempts whose results await `RESULT_ACK`.
    pub fn unacknowledged_leases(&self) -> impl Iterator<Item = LeaseId> + '_ {
        self.unacked.keys().copied()
    }

    pub fn poll_output(&mut self) -> Option<WorkerOutput> {
        self.outputs.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.link {
            Link::Idle { retry_at } => Some(*retry_at),
            Link::Connecting { give_up_at, .. } => Some(*give_up_at),
            Link::Registered {
                next_heartbeat,
                last_heard,
                heartbeat_timeout,
                ..
            } => Some((*next_heartbeat).min(last_heard.saturating_add(*heartbeat_timeout))),
        }
    }

    fn current_attempt(&self) -> Option<ConnectAttempt> {
        match &self.link {
            Link::Idle { .. } => None,
            Link::Connecting { attempt, .. } | Link::Registered { attempt, .. } => Some(*attempt),
        }
    }

    fn event(&mut self, event: WorkerEvent) {
        self.outputs.push_back(WorkerOutput::Event(event));
    }

    fn send(&mut self, message: WorkerToCoordinator) {
        if matches!(message, WorkerToCoordinator::TaskResult { .. }) {
            self.result_since_heartbeat = true;
        }
        self.outputs.push_back(WorkerOutput::Send(message));
    }

    fn connect(&mut self, now: Instant) {
        let (attempt, address) = self.dialer.dial();
        self.link = Link::Connecting {
            attempt,
            opened: false,
            give_up_at: now.saturating_add(self.config.connect_timeout),
        };
        self.event(WorkerEvent::Connecting {
            address: address.clone(),
        });
        self.outputs
            .push_back(WorkerOutput::Connect { attempt, address });
    }

    /// Drops the connection (if any) and schedules the next attempt with backoff.
    fn back_off(&mut self, now: Instant, reason: String, close: bool) {
        if close {
            self.outputs.push_back(WorkerOutput::Close);
        }
        let delay = self.dialer.jittered_backoff(
            &mut self.rng,
            self.config.reconnect_base,
            self.config.reconnect_max,
        );
        self.link = Link::Idle {
            retry_at: now.saturating_add(delay),
        };
        self.event(WorkerEvent::Disconnected {
            reason,
            retry_in_millis: as_millis_u64(delay),
        });
    }

    pub fn handle_connected(&mut self, now: Instant, attempt: ConnectAttempt) {
        let Link::Connecting {
            attempt: current,
            opened,
            ..
        } = &mut self.link
        else {
            return;
        };
        if *current != attempt {
            return;
        }
        *opened = true;
        let _ = now;
        // Waiting attempts are held too; listed after the running ones, in the order they start.
        let running = self
            .running()
            .chain(self.waiting())
            .map(|(lease_id, job_id)| RunningAttempt { job_id, lease_id })
            .collect();
        let finished = self
            .unacked
            .iter()
            .map(|(lease_id, (job_id, _))| RunningAttempt {
                job_id: *job_id,
                lease_id: *lease_id,
            })
            .collect();
        self.send(WorkerToCoordinator::Register {
            worker_id: self.config.worker_id.clone(),
            incarnation: self.incarnation,
            capacity: self.config.capacity,
            prefetch: self.config.prefetch,
            running,
            finished,
            tasks: self.config.tasks.clone(),
            queues: self.config.queues.clone(),
            draining: self.draining,
        });
    }

    pub fn handle_connect_failed(&mut self, now: Instant, attempt: ConnectAttempt, reason: &str) {
        if self.current_attempt() != Some(attempt) {
            return;
        }
        self.dialer.forget_redirect();
        self.back_off(now, format!("connect failed: {reason}"), false);
    }

    pub fn handle_disconnected(&mut self, now: Instant, attempt: ConnectAttempt, reason: &str) {
        if self.current_attempt() != Some(attempt) {
            return;
        }
        self.back_off(now, format!("connection closed: {reason}"), false);
    }

    pub fn handle_message(
        &mut self,
        now: Instant,
        attempt: ConnectAttempt,
        message: CoordinatorToWorker,
    ) {
        if self.current_attempt() != Some(attempt) {
            return;
        }
        if let Some(term) = message.term() {
            if term < self.highest_term {
                let seen = self.highest_term;
                self.event(WorkerEvent::DeposedCoordinator { term, seen });
                self.dialer.forget_redirect();
                return self.back_off(now, "the coordinator was deposed".into(), true);
            }
            self.highest_term = term;
        }
        if let Link::Registered { last_heard, .. } = &mut self.link {
            *last_heard = now;
        }
        match message {
            CoordinatorToWorker::Registered {
                heartbeat_interval_millis,
                heartbeat_timeout_millis,
                members,
                ..
            } => {
                self.dialer.learn(members);
                self.on_registered(
                    now,
                    attempt,
                    heartbeat_interval_millis,
                    heartbeat_timeout_millis,
                )
            }
            CoordinatorToWorker::RegisterRejected { message, .. } => {
                self.event(WorkerEvent::RegistrationRejected {
                    message: message.clone(),
                });
                self.back_off(now, format!("registration rejected: {message}"), true);
            }
            CoordinatorToWorker::HeartbeatAck { .. } => {}
            CoordinatorToWorker::TaskAssign {
                job_id,
                lease_id,
                attempt,
                task,
                timeout_millis,
                max_attempts,
                ..
            } => self.on_assign(
                now,
                job_id,
                (lease_id, attempt, max_attempts),
                task,
                timeout_millis,
            ),
            CoordinatorToWorker::TaskCancel {
                job_id, lease_id, ..
            } => {
                if let Some(at) = self.waiting.iter().position(|w| w.lease_id == lease_id) {
                    // Never started: nothing to stop, only to report.
                    self.waiting.remove(at);
                    self.event(WorkerEvent::CancelRequested { job_id, lease_id });
                    return self.record_result(job_id, lease_id, AttemptOutcome::Cancelled {});
                }
                if let Some(task) = self.running.get_mut(&lease_id) {
                    if !task.cancel_requested {
                        task.cancel_requested = true;
                        self.event(WorkerEvent::CancelRequested { job_id, lease_id });
                        self.outputs
                            .push_back(WorkerOutput::CancelTask { lease_id });
                    }
                }
            }
            CoordinatorToWorker::ResultAck {
                job_id,
                lease_id,
                accepted,
                ..
            } => {
                if self.unacked.remove(&lease_id).is_some() {
                    self.event(WorkerEvent::ResultAcknowledged {
                        job_id,
                        lease_id,
                        accepted,
                    });
                }
            }
            CoordinatorToWorker::NotLeader { leader, members } => {
                self.dialer.learn(members);
                self.dialer.not_leader(leader);
                self.dialer.reset_failures();
                self.back_off(now, "coordinator is not the leader".into(), true);
            }
            CoordinatorToWorker::Error { code, message } => {
                self.event(WorkerEvent::CoordinatorError {
                    code,
                    message: message.clone(),
                });
                if code.closes_connection() || code == ErrorCode::NotRegistered {
                    self.back_off(now, format!("coordinator error {code:?}"), true);
                }
            }
        }
    }

    fn on_registered(
        &mut self,
        now: Instant,
        attempt: ConnectAttempt,
        interval_millis: u64,
        timeout_millis: u64,
    ) {
        // Never heartbeat slower than a third of the timeout, whatever the coordinator says.
        let heartbeat_timeout = Duration::from_millis(timeout_millis.max(1));
        let heartbeat_interval = Duration::from_millis(interval_millis.max(1))
            .min(heartbeat_timeout / 3)
            .max(Duration::from_millis(1));
        let address = self.dialer.current_address();
        self.link = Link::Registered {
            attempt,
            heartbeat_interval,
            heartbeat_timeout,
            next_heartbeat: now.saturating_add(heartbeat_interval),
            last_heard: now,
        };
        self.dialer.reset_failures();
        // A result sent on an earlier connection says nothing about this one.
        self.result_since_heartbeat = false;
        self.event(WorkerEvent::Registered { address });
        if self.draining {
            // A drain that began while `REGISTER` (saying otherwise) was on its way.
            self.send(WorkerToCoordinator::Draining {});
        }
        let results: Vec<_> = self
            .unacked
            .iter()
            .map(
                |(lease_id, (job_id, outcome))| WorkerToCoordinator::TaskResult {
                    job_id: *job_id,
                    lease_id: *lease_id,
                    outcome: outcome.clone(),
                },
            )
            .collect();
        for result in results {
            self.send(result);
        }
    }

    fn on_assign(
        &mut self,
        now: Instant,
        job_id: JobId,
        (lease_id, attempt, max_attempts): (LeaseId, Attempt, u32),
        task: TaskSpec,
        timeout_millis: u64,
    ) {
        if self.holds(lease_id) || self.unacked.contains_key(&lease_id) {
            return; // Already have it.
        }
        if self.draining {
            // Sent before the coordinator heard of the drain: hand it straight back.
            return self.release(job_id, lease_id);
        }
        let assignment = TaskAssignment {
            job_id,
            lease_id,
            attempt,
            max_attempts,
            task,
            timeout: Duration::from_millis(timeout_millis),
        };
        let capacity = usize::try_from(self.config.capacity).unwrap_or(usize::MAX);
        let prefetch = usize::try_from(self.config.prefetch).unwrap_or(usize::MAX);
        if self.running.len() < capacity {
            return self.start(now, assignment);
        }
        if self.waiting.len() < prefetch {
            self.waiting.push_back(assignment);
            return;
        }
        // The coordinator counts slots too, so this means its view and ours disagree; refuse
        // rather than overcommit, and let the attempt be retried elsewhere.
        let reason = format!(
            "worker at capacity ({} of {} running, {} of {} waiting)",
            self.running.len(),
            capacity,
            self.waiting.len(),
            prefetch
        );
        self.event(WorkerEvent::TaskRefused {
            job_id,
            lease_id,
            reason: reason.clone(),
        });
        let outcome = AttemptOutcome::Failed {
            error: reason,
            permanent: false,
        };
        self.record_result(job_id, lease_id, outcome);
    }

    /// Whether `lease_id` is running or waiting here.
    fn holds(&self, lease_id: LeaseId) -> bool {
        self.running.contains_key(&lease_id) || self.waiting.iter().any(|w| w.lease_id == lease_id)
    }

    fn start(&mut self, now: Instant, assignment: TaskAssignment) {
        self.running.insert(
            assignment.lease_id,
            RunningTask {
                job_id: assignment.job_id,
                cancel_requested: false,
                releasing: false,
                started: now,
            },
        );
        assert!(
            self.running.len() <= self.config.capacity as usize,
            "worker {} runs {} attempts with {} slots",
            self.config.worker_id,
            self.running.len(),
            self.config.capacity
        );
        self.event(WorkerEvent::TaskStarted {
            job_id: assignment.job_id,
            lease_id: assignment.lease_id,
            attempt: assignment.attempt,
            kind: assignment.task.kind().to_owned(),
        });
        self.outputs.push_back(WorkerOutput::StartTask(assignment));
    }

    /// Starts waiting attempts, oldest first, while slots are free.
    fn start_waiting(&mut self, now: Instant) {
        while self.running.len() < self.config.capacity as usize {
            let Some(next) = self.waiting.pop_front() else {
                return;
            };
            self.start(now, next);
        }
    }

    /// Keeps `outcome` until it is acknowledged, and sends it if registered (else it goes out
    /// after the next registration).
    fn record_result(&mut self, job_id: JobId, lease_id: LeaseId, outcome: AttemptOutcome) {
        self.unacked.insert(lease_id, (job_id, outcome.clone()));
        if self.is_registered() {
            self.send(WorkerToCoordinator::TaskResult {
                job_id,
                lease_id,
                outcome,
            });
        }
    }

    /// The driver finished (or stopped) an attempt.
    pub fn handle_task_finished(
        &mut self,
        now: Instant,
        lease_id: LeaseId,
        outcome: AttemptOutcome,
    ) {
        let Some(task) = self.running.remove(&lease_id) else {
            return;
        };
        let outcome = match outcome {
            // Stopped by a drain: handed back, whatever the handler made of being stopped.
            outcome if task.releasing && !matches!(outcome, AttemptOutcome::Succeeded { .. }) => {
                return self.release(task.job_id, lease_id);
            }
            AttemptOutcome::Succeeded { output } if output.oversize().is_some() => {
                // Sending it would only fail the job at the coordinator; fail it here, saying
                // why, and keep the frame small.
                let (bytes, max) = output.oversize().unwrap_or_default();
                AttemptOutcome::Failed {
                    error: format!(
                        "the result is {bytes} bytes as JSON; at most {max} bytes are kept (store large results elsewhere and return a reference)"
                    ),
                    permanent: true,
                }
            }
            AttemptOutcome::Failed { error, permanent } => AttemptOutcome::Failed {
                error: cut_within(error, ATTEMPT_ERROR_BYTES_MAX),
                permanent,
            },
            other => other,
        };
        let job_id = task.job_id;
        let summary = match &outcome {
            AttemptOutcome::Succeeded { output } => output.to_string(),
            AttemptOutcome::Failed {
                error,
                permanent: true,
            } => format!("failed permanently: {error}"),
            AttemptOutcome::Failed { error, .. } => format!("failed: {error}"),
            AttemptOutcome::Cancelled {} => "cancelled".to_owned(),
            AttemptOutcome::Released {} => "released".to_owned(),
        };
        self.event(WorkerEvent::TaskFinished {
            job_id,
            lease_id,
            outcome: summary,
            ran_millis: as_millis_u64(now.saturating_since(task.started)),
        });
        self.record_result(job_id, lease_id, outcome);
        self.start_waiting(now);
    }

    /// Handles every timer due at `now`. Afterwards `poll_timeout` lies strictly after `now`
    /// (handling one timer can arm another for the same instant, e.g. a reconnect backoff of
    /// zero), so a driver never has to call this twice for one instant.
    pub fn handle_timeout(&mut self, now: Instant) {
        // Each pass moves the link forward (idle -> connecting, or re-arms a heartbeat), so a few
        // passes always suffice; the bound keeps a bug from becoming a hang.
        for _ in 0..8 {
            if self.poll_timeout().is_none_or(|at| at > now) {
                return;
            }
            self.handle_timeout_once(now);
        }
    }

    fn handle_timeout_once(&mut self, now: Instant) {
        match self.link.clone() {
            Link::Idle { retry_at } if retry_at <= now => self.connect(now),
            Link::Connecting {
                give_up_at, opened, ..
            } if give_up_at <= now => {
                self.dialer.forget_redirect();
                let reason = if opened {
                    "no answer to REGISTER"
                } else {
                    "connect timed out"
                };
                self.back_off(now, reason.into(), true);
            }
            Link::Registered {
                attempt,
                heartbeat_interval,
                heartbeat_timeout,
                next_heartbeat,
                last_heard,
            } => {
                if last_heard.saturating_add(heartbeat_timeout) <= now {
                    let silent = as_millis_u64(now.saturating_since(last_heard));
                    self.back_off(now, format!("coordinator silent for {silent} ms"), true);
                } else if next_heartbeat <= now {
                    // Folded into the traffic that flows anyway: a result sent during the
                    // interval stands for the heartbeat, but only if the coordinator was heard
                    // in it too. It answers a result only once the result is durable, so while
                    // its disk is behind, the heartbeat's immediate answer is what keeps this
                    // worker from taking it for silent.
                    let heard_in_interval =
                        last_heard.saturating_add(heartbeat_interval) >= next_heartbeat;
                    let result_sent = std::mem::take(&mut self.result_since_heartbeat);
                    if !(result_sent && heard_in_interval) {
                        self.send(WorkerToCoordinator::Heartbeat {});
                    }
                    self.link = Link::Registered {
                        attempt,
                        heartbeat_interval,
                        heartbeat_timeout,
                        next_heartbeat: now.saturating_add(heartbeat_interval),
                        last_heard,
                    };
                }
            }
            _ => {}
        }
    }
}
