//! The worker process: drives core's `Worker` over one TCP connection at a time and runs its
//! attempts.
//!
//! - `sleep` tasks wait on a timer; CPU tasks run on tokio's blocking pool, so the driver loop —
//!   and with it heartbeats — never waits behind a busy slot.
//! - Cancellation is cooperative: a sleeping task stops at once; `prime-count` and `prime-sum`
//!   check for a cancel between sieve segments; any other CPU task is bounded by its payload
//!   limits (about a second at most). A cancelled CPU task reports `cancelled` when it returns, so its slot is
//!   only freed once the CPU is really free.
//! - Reconnecting, heartbeats, capacity and result retransmission are decided by core.

use std::collections::HashMap;

use herder_core::ids::LeaseId;
use herder_core::ids::WorkerId;
use herder_core::protocol::{AttemptOutcome, CoordinatorToWorker};
use herder_core::tasks::{execute, execute_until, TaskFailure, TaskOutput, TaskPlan, TaskSpec};
use herder_core::worker::{
    ConnectAttempt, Worker, WorkerConfig, WorkerConfigError, WorkerEvent, WorkerOutput,
};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::clock::{os_seed, sleep_until, Clock};
use crate::net::{DialedConnection, Inbound, Outbound};

const INPUT_QUEUE_MAX: usize = 4_096;

#[derive(Clone, Debug)]
pub struct WorkerOptions {
    pub config: WorkerConfig,
    pub max_frame_bytes: usize,
    /// Seed for the worker's RNG (and so its incarnation); `None` draws one from the OS.
    pub seed: Option<u64>,
}

enum Input {
    Connected(ConnectAttempt, Result<Outbound, String>),
    Conn(ConnectAttempt, Inbound<CoordinatorToWorker>),
    TaskDone(LeaseId, AttemptOutcome),
}

/// A running worker.
pub struct WorkerHandle {
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl WorkerHandle {
    /// Stops the worker: its connection closes (the coordinator sees it at once) and running
    /// tasks are abandoned.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }

    /// Stops the worker abruptly, like a killed process: nothing more is sent.
    pub fn kill(self) {
        self.task.abort();
    }

    pub fn shutdown_sender(&self) -> watch::Sender<bool> {
        self.shutdown.clone()
    }

    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

pub fn start(options: WorkerOptions) -> Result<WorkerHandle, WorkerConfigError> {
    let clock = Clock::new();
    let seed = options.seed.unwrap_or_else(os_seed);
    let worker = Worker::new(options.config, seed, clock.now())?;
    tracing::info!(
        worker = %worker.id(),
        incarnation = %worker.incarnation(),
        "Worker starting"
    );
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let (input_tx, input_rx) = mpsc::channel(INPUT_QUEUE_MAX);
    let driver = Driver {
        worker,
        clock,
        max_frame_bytes: options.max_frame_bytes,
        inputs: input_tx,
        connection: DialedConnection::default(),
        cancels: HashMap::new(),
    };
    let task = tokio::spawn(driver.run(input_rx, shutdown_rx));
    Ok(WorkerHandle {
        shutdown: shutdown_tx,
        task,
    })
}

struct Driver {
    worker: Worker,
    clock: Clock,
    max_frame_bytes: usize,
    inputs: mpsc::Sender<Input>,
    connection: DialedConnection,
    cancels: HashMap<LeaseId, watch::Sender<bool>>,
}

impl Driver {
    async fn run(mut self, mut inputs: mpsc::Receiver<Input>, mut shutdown: watch::Receiver<bool>) {
        self.drain();
        loop {
            let timer = self.worker.poll_timeout().map(|at| self.clock.deadline(at));
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                input = inputs.recv() => match input {
                    Some(input) => self.handle(input),
                    None => break,
                },
                _ = sleep_until(timer) => self.worker.handle_timeout(self.clock.now()),
            }
            self.drain();
        }
        self.connection.close();
        for cancel in self.cancels.values() {
            let _ = cancel.send(true);
        }
        tracing::info!(worker = %self.worker.id(), "Worker stopped");
    }

    fn handle(&mut self, input: Input) {
        let now = self.clock.now();
        match input {
            Input::Connected(attempt, Ok(outbound)) => {
                if self.connection.opened(attempt, outbound) {
                    self.worker.handle_connected(now, attempt);
                }
            }
            Input::Connected(attempt, Err(reason)) => {
                self.worker.handle_connect_failed(now, attempt, &reason)
            }
            Input::Conn(attempt, Inbound::Message(message)) => {
                self.worker.handle_message(now, attempt, message)
            }
            Input::Conn(attempt, Inbound::Malformed(error)) => {
                self.connection.lost(attempt);
                self.worker.handle_disconnected(
                    now,
                    attempt,
                    &format!("malformed frame from coordinator: {error}"),
                );
            }
            Input::Conn(attempt, Inbound::Closed(reason)) => {
                self.connection.lost(attempt);
                self.worker.handle_disconnected(now, attempt, &reason);
            }
            Input::TaskDone(lease_id, outcome) => {
                self.cancels.remove(&lease_id);
                self.worker.handle_task_finished(now, lease_id, outcome);
            }
        }
    }

    fn drain(&mut self) {
        while let Some(output) = self.worker.poll_output() {
            match output {
                WorkerOutput::Connect { attempt, address } => {
                    self.connection.dial(
                        attempt,
                        address,
                        self.max_frame_bytes,
                        self.inputs.clone(),
                        move |inbound| Input::Conn(attempt, inbound),
                        move |result| Input::Connected(attempt, result),
                    );
                }
                WorkerOutput::Send(message) => {
                    if let Some((attempt, Err(error))) = self.connection.send(&message) {
                        tracing::warn!(%error, "cannot send to coordinator");
                        self.connection.lost(attempt);
                        self.worker.handle_disconnected(
                            self.clock.now(),
                            attempt,
                            &error.to_string(),
                        );
                    }
                }
                WorkerOutput::Close => self.connection.close(),
                WorkerOutput::StartTask {
                    lease_id,
                    attempt,
                    task,
                    ..
                } => {
                    if task.plan(attempt) == TaskPlan::Inline {
                        // Microseconds of work: cheaper here than on another thread.
                        let outcome = outcome_of(execute(&task, attempt));
                        self.worker
                            .handle_task_finished(self.clock.now(), lease_id, outcome);
                        continue;
                    }
                    let (cancel_tx, cancel_rx) = watch::channel(false);
                    self.cancels.insert(lease_id, cancel_tx);
                    let inputs = self.inputs.clone();
                    tokio::spawn(async move {
                        let outcome = run_task(task, attempt, cancel_rx).await;
                        let _ = inputs.send(Input::TaskDone(lease_id, outcome)).await;
                    });
                }
                WorkerOutput::CancelTask { lease_id } => {
                    if let Some(cancel) = self.cancels.get(&lease_id) {
                        let _ = cancel.send(true);
                    }
                }
                WorkerOutput::Event(event) => log_event(self.worker.id(), &event),
            }
        }
    }
}

/// Runs one attempt to its outcome, stopping early when cancelled.
async fn run_task(
    task: TaskSpec,
    attempt: herder_core::ids::Attempt,
    mut cancel: watch::Receiver<bool>,
) -> AttemptOutcome {
    match task.plan(attempt) {
        TaskPlan::Sleep { duration, then } => tokio::select! {
            _ = tokio::time::sleep(duration) => outcome_of(then),
            _ = cancel.wait_for(|cancelled| *cancelled) => AttemptOutcome::Cancelled {},
        },
        TaskPlan::Compute | TaskPlan::Inline => {
            let flag = cancel.clone();
            let compute = tokio::task::spawn_blocking(move || {
                execute_until(&task, attempt, &mut || *flag.borrow())
            });
            let result = compute.await;
            if *cancel.borrow_and_update() {
                return AttemptOutcome::Cancelled {};
            }
            match result {
                Ok(Some(result)) => outcome_of(result),
                // Stopped by a cancel (the flag was seen above unless it raced; either way).
                Ok(None) => AttemptOutcome::Cancelled {},
                Err(join) => AttemptOutcome::Failed {
                    error: format!("task panicked: {join}"),
                },
            }
        }
    }
}

fn outcome_of(result: Result<TaskOutput, TaskFailure>) -> AttemptOutcome {
    match result {
        Ok(output) => AttemptOutcome::Succeeded { output },
        Err(failure) => AttemptOutcome::Failed {
            error: failure.message,
        },
    }
}

/// Connection-level events are worth an operator's attention; per-task ones are detail (the
/// coordinator's log already tells each job's story).
fn log_event(worker: &WorkerId, event: &WorkerEvent) {
    match event {
        WorkerEvent::TaskStarted { .. }
        | WorkerEvent::TaskFinished { .. }
        | WorkerEvent::ResultAcknowledged { .. }
        | WorkerEvent::Connecting { .. } => tracing::debug!(%worker, "{event}"),
        WorkerEvent::RegistrationRejected { .. }
        | WorkerEvent::CoordinatorError { .. }
        | WorkerEvent::TaskRefused { .. } => {
            tracing::warn!(%worker, "{event}")
        }
        _ => tracing::info!(%worker, "{event}"),
    }
}
