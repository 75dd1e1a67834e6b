//! What a worker runs: a handler per task name. Users register their own (async or blocking,
//! typed through serde or on raw JSON); the built-in kinds are ordinary handlers registered by
//! default.
//!
//! A handler gets its payload and a [`TaskContext`] and returns a result or a [`TaskError`]
//! that says whether a retry could help. Cancellation is cooperative for handlers: the
//! context's token fires on a cancel or when the attempt's deadline passes, and the slot stays
//! busy until the handler returns.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herder_core::ids::{Attempt, JobId, LeaseId};
use herder_core::tasks::{
    execute, execute_until, TaskFailure, TaskOutput, TaskPlan, TaskSpec, TASK_KINDS,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
pub use tokio_util::sync::CancellationToken;

/// What a handler's future resolves to.
pub type HandlerFuture = Pin<Box<dyn Future<Output = Result<TaskOutput, TaskFailure>> + Send>>;

/// Everything a handler knows about the attempt it runs.
#[derive(Clone, Debug)]
pub struct TaskContext {
    /// The job this attempt belongs to.
    pub job_id: JobId,
    /// This attempt's lease: only a result carrying it counts.
    pub lease_id: LeaseId,
    /// Which attempt this is, from 1.
    pub attempt: u32,
    /// The job's attempt budget.
    pub max_attempts: u32,
    /// How long the attempt may run before the coordinator gives up on it.
    pub timeout: Duration,
    /// Fires when the job is cancelled, the lease is revoked, the deadline passes or the worker
    /// hands the attempt back during a drain. A handler should stop soon after.
    pub cancelled: CancellationToken,
    pub(crate) reporter: Option<ProgressReporter>,
}

/// Carries an attempt's latest progress note to the worker's driver. Notes coalesce: while one
/// waits to be sent, a newer one replaces it, so a handler reporting in a tight loop costs at
/// most one message per turn of the driver, and the latest note is never lost to the earlier.
#[derive(Clone, Debug)]
pub(crate) struct ProgressReporter {
    pub(crate) lease_id: LeaseId,
    pub(crate) latest: Arc<Mutex<Option<String>>>,
    pub(crate) notify: tokio::sync::mpsc::Sender<ProgressNote>,
}

/// "The attempt holding this lease has a note waiting in this slot."
pub(crate) type ProgressNote = (LeaseId, Arc<Mutex<Option<String>>>);

impl ProgressReporter {
    fn report(&self, note: String) {
        let mut latest = self
            .latest
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let waiting = latest.replace(note).is_some();
        if !waiting
            && self
                .notify
                .try_send((self.lease_id, Arc::clone(&self.latest)))
                .is_err()
        {
            // The driver is far behind (or gone): drop the note rather than queue without bound.
            latest.take();
        }
    }
}

impl TaskContext {
    /// True once the attempt should stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.is_cancelled()
    }

    /// Reports how far the attempt has come. The latest note shows in the job's view while
    /// the attempt runs (cut to 256 bytes; kept in the leader's memory only) and in the
    /// worker's log at debug level.
    pub fn progress(&self, note: impl fmt::Display) {
        let note = note.to_string();
        tracing::debug!(job = %self.job_id, attempt = self.attempt, "Task progress: {note}");
        if let Some(reporter) = &self.reporter {
            reporter.report(note);
        }
    }
}

/// Why a handler failed, and whether running it again could help.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskError {
    /// Try again (another attempt, after a backoff) while attempts remain.
    Retry(String),
    /// Retrying cannot help (bad input, say): the job fails now, whatever attempts remain.
    Permanent(String),
}

impl TaskError {
    /// A failure worth retrying.
    pub fn retry(reason: impl fmt::Display) -> TaskError {
        TaskError::Retry(reason.to_string())
    }

    /// A failure that ends the job.
    pub fn permanent(reason: impl fmt::Display) -> TaskError {
        TaskError::Permanent(reason.to_string())
    }

    fn into_failure(self) -> TaskFailure {
        match self {
            TaskError::Retry(message) => TaskFailure::new(message),
            TaskError::Permanent(message) => TaskFailure::permanent(message),
        }
    }
}

impl fmt::Display for TaskError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskError::Retry(message) => write!(f, "{message} (will retry)"),
            TaskError::Permanent(message) => write!(f, "{message} (permanent)"),
        }
    }
}

impl std::error::Error for TaskError {}

/// Runs the attempts of one task kind.
pub trait Handler: Send + Sync + 'static {
    /// Starts an attempt. The future is spawned on the worker's runtime.
    fn start(&self, task: TaskSpec, context: TaskContext) -> HandlerFuture;

    /// Runs the attempt in place if it costs microseconds (less than spawning it would);
    /// `None` to have it started as usual.
    fn run_inline(
        &self,
        _task: &TaskSpec,
        _attempt: Attempt,
    ) -> Option<Result<TaskOutput, TaskFailure>> {
        None
    }
}

/// The handlers of one worker, by task name.
#[derive(Clone)]
pub struct Handlers {
    by_name: BTreeMap<String, Arc<dyn Handler>>,
}

impl fmt::Debug for Handlers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.by_name.keys()).finish()
    }
}

impl Default for Handlers {
    fn default() -> Handlers {
        Handlers::builtin()
    }
}

impl Handlers {
    /// No handlers at all.
    pub fn none() -> Handlers {
        Handlers {
            by_name: BTreeMap::new(),
        }
    }

    /// The built-in kinds (`sleep`, `sha256`, ... ), each an ordinary handler.
    pub fn builtin() -> Handlers {
        let mut handlers = Handlers::none();
        for kind in TASK_KINDS {
            handlers.insert(kind, Builtin);
        }
        handlers
    }

    /// Registers (or replaces) the handler for `name`.
    pub fn insert(&mut self, name: impl Into<String>, handler: impl Handler) {
        self.by_name.insert(name.into(), Arc::new(handler));
    }

    pub fn remove(&mut self, name: &str) {
        self.by_name.remove(name);
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Handler>> {
        self.by_name.get(name)
    }

    /// The task names served, as registration announces them.
    pub fn names(&self) -> Vec<String> {
        self.by_name.keys().cloned().collect()
    }
}

/// An async handler taking a typed payload.
pub(crate) struct AsyncFn<F, P, R, Fut> {
    f: F,
    _types: PhantomData<fn(P) -> (R, Fut)>,
}

impl<F, P, R, Fut> AsyncFn<F, P, R, Fut> {
    pub(crate) fn new(f: F) -> Self {
        AsyncFn {
            f,
            _types: PhantomData,
        }
    }
}

impl<F, P, R, Fut> Handler for AsyncFn<F, P, R, Fut>
where
    F: Fn(P, TaskContext) -> Fut + Send + Sync + 'static,
    P: DeserializeOwned + Send + 'static,
    R: Serialize + 'static,
    Fut: Future<Output = Result<R, TaskError>> + Send + 'static,
{
    fn start(&self, task: TaskSpec, context: TaskContext) -> HandlerFuture {
        let payload = match payload_of::<P>(&task) {
            Ok(payload) => payload,
            Err(failure) => return Box::pin(std::future::ready(Err(failure))),
        };
        let running = (self.f)(payload, context);
        Box::pin(async move { output_of(running.await) })
    }
}

/// A blocking handler taking a typed payload; it runs on the blocking thread pool, so it may
/// compute or wait on I/O without stalling the worker's heartbeats.
pub(crate) struct BlockingFn<F, P, R> {
    f: Arc<F>,
    _types: PhantomData<fn(P) -> R>,
}

impl<F, P, R> BlockingFn<F, P, R> {
    pub(crate) fn new(f: F) -> Self {
        BlockingFn {
            f: Arc::new(f),
            _types: PhantomData,
        }
    }
}

impl<F, P, R> Handler for BlockingFn<F, P, R>
where
    F: Fn(P, TaskContext) -> Result<R, TaskError> + Send + Sync + 'static,
    P: DeserializeOwned + Send + 'static,
    R: Serialize + Send + 'static,
{
    fn start(&self, task: TaskSpec, context: TaskContext) -> HandlerFuture {
        let payload = match payload_of::<P>(&task) {
            Ok(payload) => payload,
            Err(failure) => return Box::pin(std::future::ready(Err(failure))),
        };
        let f = Arc::clone(&self.f);
        Box::pin(async move {
            match tokio::task::spawn_blocking(move || f(payload, context)).await {
                Ok(result) => output_of(result),
                Err(join) => Err(TaskFailure::new(format!("handler panicked: {join}"))),
            }
        })
    }
}

/// The payload a handler is given: a user task's payload, or a built-in task's whole spec when a
/// user handler replaces a built-in kind.
fn payload_of<P: DeserializeOwned>(task: &TaskSpec) -> Result<P, TaskFailure> {
    let raw = match task {
        TaskSpec::User(user) => user.payload.clone(),
        other => other.to_json(),
    };
    serde_json::from_value(raw).map_err(|error| {
        TaskFailure::permanent(format!(
            "the payload does not fit task {:?}: {error}",
            task.kind()
        ))
    })
}

fn output_of<R: Serialize>(result: Result<R, TaskError>) -> Result<TaskOutput, TaskFailure> {
    match result {
        Ok(value) => serde_json::to_value(value)
            .map(|value| TaskOutput::Value { value })
            .map_err(|error| {
                TaskFailure::permanent(format!("the result cannot be written as JSON: {error}"))
            }),
        Err(error) => Err(error.into_failure()),
    }
}

/// The built-in kinds: `sleep` waits on a timer; CPU kinds run on the blocking pool, checking
/// for a cancel between sieve segments where they are long; the cheapest run in place.
pub struct Builtin;

impl Handler for Builtin {
    fn start(&self, task: TaskSpec, context: TaskContext) -> HandlerFuture {
        let attempt = Attempt(context.attempt);
        Box::pin(async move {
            match task.plan(attempt) {
                TaskPlan::Sleep { duration, then } => tokio::select! {
                    _ = tokio::time::sleep(duration) => then,
                    _ = context.cancelled.cancelled() => Err(TaskFailure::new("stopped")),
                },
                TaskPlan::Compute | TaskPlan::Inline => {
                    let token = context.cancelled.clone();
                    let compute = tokio::task::spawn_blocking(move || {
                        execute_until(&task, attempt, &mut || token.is_cancelled())
                    });
                    match compute.await {
                        Ok(Some(result)) => result,
                        Ok(None) => Err(TaskFailure::new("stopped")),
                        Err(join) => Err(TaskFailure::new(format!("task panicked: {join}"))),
                    }
                }
            }
        })
    }

    fn run_inline(
        &self,
        task: &TaskSpec,
        attempt: Attempt,
    ) -> Option<Result<TaskOutput, TaskFailure>> {
        (task.plan(attempt) == TaskPlan::Inline).then(|| execute(task, attempt))
    }
}
