//! The worker process: drives core's `Worker` over one TCP connection at a time and runs its
//! attempts with the registered [`Handlers`].
//!
//! - Each attempt runs as its own tokio task (blocking handlers and CPU-bound built-ins on the
//!   blocking pool), so the driver loop, and with it heartbeats, never waits behind a busy slot.
//! - Cancellation is cooperative: an attempt's token fires on a cancel, at its deadline, or
//!   when a drain hands it back; its slot is freed when the handler returns.
//! - A drain ([`WorkerHandle::drain`]) stops new work, lets running attempts finish within the
//!   drain timeout, hands back the rest uncharged, and waits (briefly) for the coordinator to
//!   acknowledge every result before the process goes.
//! - Reconnecting, heartbeats, capacity and result retransmission are decided by core.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use herder_core::auth::{Credential, Secret, SecretLink};
use herder_core::ids::{LeaseId, WorkerId};
use herder_core::limits::FRAME_BYTES_MAX_DEFAULT;
use herder_core::protocol::{AttemptOutcome, CoordinatorToWorker};
use herder_core::tasks::{check_served_name, TaskFailure, TaskOutput, TaskSpec};
use herder_core::worker::{
    ConnectAttempt, TaskAssignment, Worker as CoreWorker, WorkerConfig, WorkerConfigError,
    WorkerEvent, WorkerOutput,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::{os_seed, sleep_until, Clock};
use crate::handlers::{
    AsyncFn, BlockingFn, Handler, Handlers, ProgressNote, ProgressReporter, TaskContext, TaskError,
};
use crate::net::{DialError, DialTarget, DialedConnection, Inbound, Outbound};
use crate::tls::ClientTls;

const INPUT_QUEUE_MAX: usize = 4_096;
/// Attempts with a progress note waiting to be sent (one entry per attempt at most).
const PROGRESS_QUEUE_MAX: usize = 1_024;

/// How long running attempts get to finish once a drain begins, unless told otherwise.
pub const DRAIN_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// Once a drain asks the attempts still running to stop, how long they get to do so before they
/// are handed back anyway (an `exec` command is killed well within it, after its grace).
pub const DRAIN_STOP_WAIT: Duration = Duration::from_secs(10);

/// After a drain, how long to wait for the coordinator to acknowledge the last results before
/// exiting anyway (an unacknowledged attempt is then settled by the worker's loss).
pub const DRAIN_ACK_WAIT: Duration = Duration::from_secs(5);

/// The shortest a drain lasts, however idle the worker (see the driver loop).
pub const DRAIN_LINGER: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct WorkerOptions {
    pub config: WorkerConfig,
    pub max_frame_bytes: usize,
    /// Seed for the worker's RNG (and so its incarnation); `None` draws one from the OS.
    pub seed: Option<u64>,
    /// What the worker runs, by task name. The names are what it registers as serving.
    pub handlers: Handlers,
    /// How long a drain lets running attempts finish before handing them back.
    pub drain_timeout: Duration,
    /// The worker secret, proven on every connection (needed by a coordinator that checks it).
    pub secret: Option<Arc<Secret>>,
    /// TLS to the coordinator, verifying it, if given.
    pub tls: Option<ClientTls>,
}

impl WorkerOptions {
    /// Options with the built-in handlers and the default frame limit and drain timeout.
    pub fn new(config: WorkerConfig) -> WorkerOptions {
        WorkerOptions {
            config,
            max_frame_bytes: FRAME_BYTES_MAX_DEFAULT,
            seed: None,
            handlers: Handlers::builtin(),
            drain_timeout: DRAIN_TIMEOUT_DEFAULT,
            secret: None,
            tls: None,
        }
    }
}

enum Input {
    Connected(ConnectAttempt, Result<Outbound, DialError>),
    Conn(ConnectAttempt, Inbound<CoordinatorToWorker>),
    TaskDone(LeaseId, AttemptOutcome),
}

/// How a running worker is told to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Running,
    /// Finish or hand back what runs, then exit.
    Drain,
    /// Close at once; running attempts are abandoned (and charged when the worker is lost).
    Now,
}

/// A running worker.
pub struct WorkerHandle {
    stop: watch::Sender<Stop>,
    task: JoinHandle<()>,
}

impl WorkerHandle {
    /// Stops the worker gracefully: it takes no new work and tells the coordinator so; running
    /// attempts get the drain timeout to finish; the rest are handed back (their jobs are
    /// queued again at once, with no attempt charged). Returns once the worker has stopped.
    pub async fn drain(self) {
        let _ = self.stop.send(Stop::Drain);
        let _ = self.task.await;
    }

    /// Stops the worker at once: its connection closes (the coordinator sees it at once) and
    /// running attempts are abandoned, each costing its job an attempt.
    pub async fn shutdown(self) {
        let _ = self.stop.send(Stop::Now);
        let _ = self.task.await;
    }

    /// Stops the worker abruptly, like a killed process: nothing more is sent.
    pub fn kill(self) {
        self.task.abort();
    }

    /// A handle that stops the worker from elsewhere (a signal handler), while this one
    /// waits for it.
    pub fn stopper(&self) -> Stopper {
        Stopper {
            stop: self.stop.clone(),
        }
    }

    pub async fn wait(self) {
        let _ = self.task.await;
    }
}

/// Stops a running worker, gracefully or at once; see [`WorkerHandle::stopper`].
#[derive(Clone, Debug)]
pub struct Stopper {
    stop: watch::Sender<Stop>,
}

impl Stopper {
    /// Begins a drain, as [`WorkerHandle::drain`] does.
    pub fn drain(&self) {
        self.stop.send_if_modified(|stop| {
            let begin = *stop == Stop::Running;
            if begin {
                *stop = Stop::Drain;
            }
            begin
        });
    }

    /// Stops at once, as [`WorkerHandle::shutdown`] does (a drain under way is cut short).
    pub fn now(&self) {
        let _ = self.stop.send(Stop::Now);
    }
}

/// Starts a worker on the current tokio runtime.
pub fn start(mut options: WorkerOptions) -> Result<WorkerHandle, WorkerConfigError> {
    options.config.tasks = options.handlers.names();
    let clock = Clock::new();
    let seed = options.seed.unwrap_or_else(os_seed);
    let worker = CoreWorker::new(options.config, seed, clock.now())?;
    tracing::info!(
        worker = %worker.id(),
        incarnation = %worker.incarnation(),
        "Worker starting"
    );
    let (stop_tx, stop_rx) = watch::channel(Stop::Running);
    let (input_tx, input_rx) = mpsc::channel(INPUT_QUEUE_MAX);
    let (progress_tx, progress_rx) = mpsc::channel(PROGRESS_QUEUE_MAX);
    let driver = Driver {
        progress: progress_tx,
        worker,
        clock,
        max_frame_bytes: options.max_frame_bytes,
        credential: options.secret.map(|secret| Credential::Secret {
            link: SecretLink::Worker,
            secret,
        }),
        tls: options.tls,
        handlers: options.handlers,
        drain_timeout: options.drain_timeout,
        inputs: input_tx,
        connection: DialedConnection::default(),
        cancels: HashMap::new(),
    };
    let task = tokio::spawn(driver.run(input_rx, progress_rx, stop_rx));
    Ok(WorkerHandle {
        stop: stop_tx,
        task,
    })
}

/// Where a drain stands. Each phase ends at its deadline, or earlier once nothing is left
/// for it to wait for.
#[derive(Clone, Copy)]
enum Draining {
    No,
    /// Running attempts may finish until `stop_at`.
    Finishing {
        stop_at: Instant,
    },
    /// They were asked to stop, and are handed back as each one does, until `force_at`.
    Stopping {
        force_at: Instant,
    },
    /// Whatever still ran was handed back; waiting for acknowledgements until `give_up_at`.
    Acknowledging {
        give_up_at: Instant,
    },
}

struct Driver {
    worker: CoreWorker,
    clock: Clock,
    max_frame_bytes: usize,
    credential: Option<Credential>,
    tls: Option<ClientTls>,
    handlers: Handlers,
    drain_timeout: Duration,
    inputs: mpsc::Sender<Input>,
    progress: mpsc::Sender<ProgressNote>,
    connection: DialedConnection,
    cancels: HashMap<LeaseId, CancellationToken>,
}

impl Driver {
    async fn run(
        mut self,
        mut inputs: mpsc::Receiver<Input>,
        mut progress: mpsc::Receiver<ProgressNote>,
        mut stop: watch::Receiver<Stop>,
    ) {
        self.drain_outputs();
        let mut draining = Draining::No;
        // When the drain began: however soon the worker is idle, it lingers this long, so an
        // assignment the leader made just before it heard of the drain is handed back, not
        // lost with the connection.
        let mut lingers_until = Instant::now();
        loop {
            match *stop.borrow_and_update() {
                Stop::Now => break,
                Stop::Drain if matches!(draining, Draining::No) => {
                    self.worker.begin_drain(self.clock.now());
                    self.drain_outputs();
                    lingers_until = Instant::now() + DRAIN_LINGER;
                    draining = Draining::Finishing {
                        stop_at: Instant::now() + self.drain_timeout,
                    };
                }
                _ => {}
            }
            let lingering = Instant::now() < lingers_until;
            if self.worker.is_drained() && !lingering {
                break;
            }
            let drain_timer = match draining {
                Draining::No => None,
                _ if self.worker.is_drained() => Some(lingers_until),
                Draining::Finishing { stop_at } => Some(stop_at),
                Draining::Stopping { force_at } => Some(force_at),
                Draining::Acknowledging { give_up_at } => Some(give_up_at),
            };
            let timer = self.worker.poll_timeout().map(|at| self.clock.deadline(at));
            tokio::select! {
                biased;
                changed = stop.changed() => if changed.is_err() {
                    break; // every handle is gone
                },
                input = inputs.recv() => match input {
                    Some(input) => self.handle(input),
                    None => break,
                },
                Some((lease_id, latest)) = progress.recv() => {
                    let note = latest.lock().unwrap_or_else(|poison| poison.into_inner()).take();
                    if let Some(note) = note {
                        self.worker.report_progress(lease_id, &note);
                    }
                }
                _ = sleep_until(drain_timer) => {
                    let now = Instant::now();
                    match draining {
                        Draining::Finishing { stop_at } if stop_at <= now => {
                            self.worker.stop_running(self.clock.now());
                            draining = Draining::Stopping {
                                force_at: now + DRAIN_STOP_WAIT,
                            };
                        }
                        Draining::Stopping { force_at } if force_at <= now => {
                            self.worker.release_running(self.clock.now());
                            draining = Draining::Acknowledging {
                                give_up_at: now + DRAIN_ACK_WAIT,
                            };
                        }
                        Draining::Acknowledging { give_up_at } if give_up_at <= now => {
                            tracing::warn!(
                                worker = %self.worker.id(),
                                unacknowledged = self.worker.unacknowledged(),
                                "Drain ended without every result acknowledged"
                            );
                            break;
                        }
                        _ => {} // the linger ended; the loop's head decides
                    }
                }
                _ = sleep_until(timer) => self.worker.handle_timeout(self.clock.now()),
            }
            self.drain_outputs();
        }
        self.connection.close();
        for cancel in self.cancels.values() {
            cancel.cancel();
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
            Input::Connected(attempt, Err(error)) => {
                if let DialError::Refused { address, error } = &error {
                    // Retried with backoff like any failed connect (a coordinator's secret may be
                    // put right), but said every time: no work comes until it is.
                    tracing::error!(%address, %error, "The coordinator refused this worker's credential");
                }
                self.worker
                    .handle_connect_failed(now, attempt, &error.to_string())
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

    /// Performs every pending output; what goes to the coordinator leaves in one write at the
    /// end (results of inline tasks finished meanwhile included).
    fn drain_outputs(&mut self) {
        loop {
            self.perform_outputs();
            let Some((attempt, Err(error))) = self.connection.flush() else {
                return;
            };
            tracing::warn!(%error, "cannot send to coordinator");
            self.connection.lost(attempt);
            self.worker
                .handle_disconnected(self.clock.now(), attempt, &error.to_string());
        }
    }

    fn perform_outputs(&mut self) {
        while let Some(output) = self.worker.poll_output() {
            match output {
                WorkerOutput::Connect { attempt, address } => {
                    self.connection.dial(
                        attempt,
                        DialTarget {
                            address,
                            max_frame_bytes: self.max_frame_bytes,
                            credential: self.credential.clone(),
                            tls: self.tls.clone(),
                        },
                        self.inputs.clone(),
                        move |inbound| Input::Conn(attempt, inbound),
                        move |result| Input::Connected(attempt, result),
                    );
                }
                WorkerOutput::Send(message) => {
                    if let Some((attempt, Err(error))) = self.connection.send_corked(&message) {
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
                WorkerOutput::StartTask(TaskAssignment {
                    job_id,
                    lease_id,
                    attempt,
                    max_attempts,
                    task,
                    timeout,
                }) => {
                    let Some(handler) = self.handlers.get(task.kind()).cloned() else {
                        // Registration names exactly the handlers, so the coordinator sent a
                        // kind it was never told of; another worker may serve it.
                        let error = format!("this worker has no handler for {:?}", task.kind());
                        let outcome = AttemptOutcome::Failed {
                            error,
                            permanent: false,
                        };
                        self.worker
                            .handle_task_finished(self.clock.now(), lease_id, outcome);
                        continue;
                    };
                    if let Some(result) = handler.run_inline(&task, attempt) {
                        // Microseconds of work: cheaper here than on another thread.
                        let outcome = outcome_of(result, false);
                        self.worker
                            .handle_task_finished(self.clock.now(), lease_id, outcome);
                        continue;
                    }
                    let cancelled = CancellationToken::new();
                    self.cancels.insert(lease_id, cancelled.clone());
                    let context = TaskContext {
                        job_id,
                        lease_id,
                        attempt: attempt.0,
                        max_attempts,
                        timeout,
                        cancelled,
                        reporter: Some(ProgressReporter {
                            lease_id,
                            latest: Default::default(),
                            notify: self.progress.clone(),
                        }),
                    };
                    let inputs = self.inputs.clone();
                    tokio::spawn(async move {
                        let outcome = run_attempt(handler, task, context).await;
                        let _ = inputs.send(Input::TaskDone(lease_id, outcome)).await;
                    });
                }
                WorkerOutput::CancelTask { lease_id } => {
                    if let Some(cancel) = self.cancels.get(&lease_id) {
                        cancel.cancel();
                    }
                }
                WorkerOutput::Event(event) => log_event(self.worker.id(), &event),
            }
        }
    }
}

/// Runs one attempt to its outcome. The token fires at the deadline too, so a handler that
/// watches it stops even when the coordinator cannot be reached to say so.
async fn run_attempt(
    handler: Arc<dyn Handler>,
    task: TaskSpec,
    context: TaskContext,
) -> AttemptOutcome {
    let cancelled = context.cancelled.clone();
    let timeout = context.timeout;
    let mut running = tokio::spawn(handler.start(task, context));
    let mut deadline_passed = false;
    let joined = tokio::select! {
        joined = &mut running => joined,
        _ = tokio::time::sleep(timeout) => {
            deadline_passed = !cancelled.is_cancelled();
            cancelled.cancel();
            running.await
        }
    };
    if deadline_passed {
        let millis = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
        return AttemptOutcome::Failed {
            error: format!("the attempt's deadline of {millis} ms passed"),
            permanent: false,
        };
    }
    match joined {
        Ok(result) => outcome_of(result, cancelled.is_cancelled()),
        Err(join) => AttemptOutcome::Failed {
            error: format!("handler panicked: {join}"),
            permanent: false,
        },
    }
}

/// An attempt's outcome; whatever it returned after being told to stop counts as stopped.
fn outcome_of(result: Result<TaskOutput, TaskFailure>, cancelled: bool) -> AttemptOutcome {
    if cancelled {
        return AttemptOutcome::Cancelled {};
    }
    match result {
        Ok(output) => AttemptOutcome::Succeeded { output },
        Err(failure) => AttemptOutcome::Failed {
            error: failure.message,
            permanent: failure.permanent,
        },
    }
}

/// Each task's start and end is logged, as is anything wrong; acknowledgements and dialling
/// are detail.
fn log_event(worker: &WorkerId, event: &WorkerEvent) {
    match event {
        WorkerEvent::ResultAcknowledged { .. } | WorkerEvent::Connecting { .. } => {
            tracing::debug!(%worker, "{event}")
        }
        WorkerEvent::RegistrationRejected { .. }
        | WorkerEvent::CoordinatorError { .. }
        | WorkerEvent::TaskRefused { .. } => {
            tracing::warn!(%worker, "{event}")
        }
        _ => tracing::info!(%worker, "{event}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The builder users start from
// ---------------------------------------------------------------------------------------------

/// A worker a program builds for itself: its own task handlers next to the built-in ones.
///
/// ```no_run
/// # async fn run() -> Result<(), herder_runtime::worker::BuildError> {
/// use herder_runtime::{TaskContext, TaskError, Worker};
///
/// let worker = Worker::builder()
///     .coordinators(["127.0.0.1:7001"])
///     .capacity(4)
///     .task("greet", |name: String, _ctx: TaskContext| async move {
///         Ok::<_, TaskError>(format!("hello, {name}"))
///     })
///     .start()?;
/// herder_runtime::terminated().await;
/// worker.drain().await;
/// # Ok(()) }
/// ```
pub struct Worker;

impl Worker {
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder {
            id: None,
            coordinators: Vec::new(),
            capacity: 4,
            prefetch: 0,
            handlers: Handlers::builtin(),
            max_frame_bytes: FRAME_BYTES_MAX_DEFAULT,
            drain_timeout: DRAIN_TIMEOUT_DEFAULT,
            seed: None,
            secret: None,
            tls: None,
            bad_names: Vec::new(),
        }
    }
}

/// Why a worker could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("invalid worker id: {0}")]
    Id(String),
    #[error("cannot register task {name:?}: {reason}")]
    TaskName { name: String, reason: String },
    #[error(transparent)]
    Config(#[from] WorkerConfigError),
}

/// Configures a [`Worker`]; see [`Worker::builder`].
pub struct WorkerBuilder {
    id: Option<String>,
    coordinators: Vec<String>,
    capacity: u32,
    prefetch: u32,
    handlers: Handlers,
    max_frame_bytes: usize,
    drain_timeout: Duration,
    seed: Option<u64>,
    secret: Option<Arc<Secret>>,
    tls: Option<ClientTls>,
    bad_names: Vec<(String, String)>,
}

impl WorkerBuilder {
    /// The worker's id (default `worker-<pid>`). A restarted process may reuse it.
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// The coordinators' worker addresses, tried in turn.
    pub fn coordinators<S: Into<String>>(mut self, addresses: impl IntoIterator<Item = S>) -> Self {
        self.coordinators = addresses.into_iter().map(Into::into).collect();
        self
    }

    /// How many attempts run at once (default 4).
    pub fn capacity(mut self, capacity: u32) -> Self {
        self.capacity = capacity;
        self
    }

    /// How many assignments it holds beyond its slots, waiting for one (default 0, at most 4
    /// per slot). Prefetching keeps the next short job at hand when a slot frees; a long job
    /// waiting here cannot move to a worker that frees up first.
    pub fn prefetch(mut self, prefetch: u32) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// How long a drain lets running attempts finish (default 30 s).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    pub fn max_frame_bytes(mut self, bytes: usize) -> Self {
        self.max_frame_bytes = bytes;
        self
    }

    /// The worker secret the coordinators check (their `--worker-secret-file`).
    pub fn secret(mut self, secret: Secret) -> Self {
        self.secret = Some(Arc::new(secret));
        self
    }

    /// Speak TLS to the coordinators, verifying them with `tls`.
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Seeds the worker's RNG (its incarnation, its backoff) for a reproducible run.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Serves `name` with an async handler. The payload is decoded into `P` (use
    /// `serde_json::Value` for raw JSON; a payload that does not decode fails the job for good)
    /// and the result is stored as JSON.
    pub fn task<P, R, F, Fut>(mut self, name: &str, handler: F) -> Self
    where
        F: Fn(P, TaskContext) -> Fut + Send + Sync + 'static,
        P: DeserializeOwned + Send + 'static,
        R: Serialize + 'static,
        Fut: Future<Output = Result<R, TaskError>> + Send + 'static,
    {
        if self.name_ok(name) {
            self.handlers.insert(name, AsyncFn::new(handler));
        }
        self
    }

    /// Serves `name` with a blocking handler, run on the blocking thread pool.
    pub fn blocking_task<P, R, F>(mut self, name: &str, handler: F) -> Self
    where
        F: Fn(P, TaskContext) -> Result<R, TaskError> + Send + Sync + 'static,
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
    {
        if self.name_ok(name) {
            self.handlers.insert(name, BlockingFn::new(handler));
        }
        self
    }

    /// Serves `name` with a handler of your own making.
    pub fn handler(mut self, name: &str, handler: impl Handler) -> Self {
        if self.name_ok(name) {
            self.handlers.insert(name, handler);
        }
        self
    }

    /// Serves `exec` tasks whose program the policy admits (see [`crate::exec`]).
    pub fn exec(mut self, policy: crate::exec::ExecPolicy) -> Self {
        match crate::exec::Exec::new(policy) {
            Ok(exec) => self.handlers.insert(herder_core::tasks::EXEC_KIND, exec),
            Err(reason) => self
                .bad_names
                .push((herder_core::tasks::EXEC_KIND.to_owned(), reason)),
        }
        self
    }

    /// Serves only the tasks registered on this builder, not the built-in kinds.
    pub fn without_builtin_tasks(mut self) -> Self {
        for kind in herder_core::tasks::TASK_KINDS {
            self.handlers.remove(kind);
        }
        self
    }

    fn name_ok(&mut self, name: &str) -> bool {
        match check_served_name(name) {
            Ok(()) => true,
            Err(error) => {
                self.bad_names.push((name.to_owned(), error.to_string()));
                false
            }
        }
    }

    /// Starts the worker on the current tokio runtime.
    pub fn start(self) -> Result<WorkerHandle, BuildError> {
        if let Some((name, reason)) = self.bad_names.into_iter().next() {
            return Err(BuildError::TaskName { name, reason });
        }
        let id = self
            .id
            .unwrap_or_else(|| format!("worker-{}", std::process::id()));
        let id = WorkerId::parse(&id).map_err(|error| BuildError::Id(error.to_string()))?;
        let options = WorkerOptions {
            config: WorkerConfig {
                prefetch: self.prefetch,
                ..WorkerConfig::new(id, self.capacity, self.coordinators)
            },
            max_frame_bytes: self.max_frame_bytes,
            seed: self.seed,
            handlers: self.handlers,
            drain_timeout: self.drain_timeout,
            secret: self.secret,
            tls: self.tls,
        };
        Ok(start(options)?)
    }
}
