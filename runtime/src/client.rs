//! The async Rust client library: submit, status, wait, cancel, list, workers, the group view
//! and leadership transfer against a coordinator group.
//!
//! A `HerderClient` is a cheap, cloneable handle to one background task that drives core's
//! `Client` machine over one connection. Many calls may be outstanding at once (they are
//! pipelined on the connection); failover, redirects and the resend rules are core's.
//!
//! ```no_run
//! # async fn demo() -> Result<(), herder_runtime::client::CallError> {
//! use herder_runtime::client::{HerderClient, SubmitOptions};
//! use herder_core::client::ClientConfig;
//! use herder_core::tasks::TaskSpec;
//!
//! let client = HerderClient::new(ClientConfig::new(vec!["127.0.0.1:7071".into()]));
//! let job = client.submit(&TaskSpec::Sha256 { text: "abc".into() }, SubmitOptions::default()).await?;
//! let (view, _timed_out) = client.wait(job.job_id, None).await?;
//! println!("{:?}", view.result);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use herder_core::auth::{ClientToken, Credential};
use herder_core::client::{
    Client, ClientConfig, ClientError, ClientOutput, ConnectAttempt, OpId, Operation,
};
use herder_core::ids::{JobId, NodeId};
use herder_core::job::JobState;
use herder_core::limits::FRAME_BYTES_MAX_DEFAULT;
use herder_core::protocol::{
    ClientReply, ClusterView, JobSubmission, JobView, Partitions, QueueView, SubmitResult,
    WorkerView,
};
use herder_core::queues::QueueChange;
use herder_core::tasks::TaskSpec;
use tokio::sync::{mpsc, oneshot};

use crate::clock::{os_seed, sleep_until, Clock};
use crate::net::{DialError, DialTarget, DialedConnection, Inbound, Outbound, SendError};
use crate::tls::ClientTls;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("the coordinator answered with an unexpected message: {0}")]
    UnexpectedReply(String),
    #[error("the client has shut down")]
    Closed,
    /// The request could not be made (nothing was sent).
    #[error("{0}")]
    Invalid(String),
    /// The call's deadline passed with no answer (a coordinator that accepts connections but
    /// does not answer, or a group without a leader for that long).
    #[error("no answer within {} s while waiting for {what}; is the coordinator paused or overloaded?", after.as_secs_f64())]
    TimedOut {
        after: std::time::Duration,
        what: &'static str,
    },
}

/// What a caller of `op` is waiting for, in words.
fn waiting_for(op: &Operation) -> &'static str {
    match op {
        Operation::Submit(_) => "the submission to be acknowledged",
        Operation::SubmitBatch { .. } => "the batch to be acknowledged",
        Operation::Status { .. } => "the job's status",
        Operation::Wait { .. } => "the job to end",
        Operation::Cancel { .. } => "the cancel to be acknowledged",
        Operation::List { .. } => "the job list",
        Operation::Workers => "the worker list",
        Operation::Queues => "the queue list",
        Operation::SetQueue { .. } => "the queue change to be written",
        Operation::Cluster => "the member's view of the group",
        Operation::TransferLeader { .. } => "the hand-over to start",
        Operation::Purge { .. } => "the purge to be written",
    }
}

/// Options of one submission.
#[derive(Clone, Debug, Default)]
pub struct SubmitOptions {
    pub max_attempts: Option<u32>,
    pub idempotency_key: Option<String>,
    /// For a data-parallel task: how many partitions (`None`: one per live worker).
    pub partitions: Option<Partitions>,
    /// Each attempt's deadline (`None`: the coordinator's `--task-timeout-millis`).
    pub timeout_millis: Option<u64>,
    /// The queue (`None`: `default`).
    pub queue: Option<String>,
    /// `0..=9`, higher first (`None`: 0).
    pub priority: Option<u8>,
    /// Whom the job is fair to within its queue.
    pub fairness_key: Option<String>,
    /// Not before this wall time, in ms since the Unix epoch (`None`: now).
    pub run_at_unix_ms: Option<u64>,
    /// Not before this long after the leader admits it (`None`: now).
    pub delay_millis: Option<u64>,
    /// The job this one retries (`None`: a job of its own).
    pub retry_of: Option<JobId>,
    /// Jobs to wait for: `BLOCKED` until they end.
    pub after: Vec<JobId>,
    /// Run whatever the jobs in `after` end as.
    pub after_any_outcome: bool,
}

/// A durable submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Submitted {
    pub job_id: JobId,
    /// True when the idempotency key named a job that already existed.
    pub existing: bool,
}

struct Call {
    op: Operation,
    reply: oneshot::Sender<Result<ClientReply, ClientError>>,
}

enum Input {
    Call(Call),
    Connected(ConnectAttempt, Result<Outbound, DialError>),
    Conn(ConnectAttempt, Inbound<ClientReply>),
}

/// A handle to a client connection. Clone it freely; the connection closes when the last clone
/// is dropped.
#[derive(Clone)]
pub struct HerderClient {
    calls: mpsc::UnboundedSender<Call>,
    /// Longest a call may go unanswered (a `WAIT` gets its own timeout on top; one without a
    /// timeout is not bounded). `None`: no deadline beyond the client's own retries.
    call_timeout: Option<std::time::Duration>,
}

impl HerderClient {
    /// Starts the client's driver task (on the current tokio runtime). Connects lazily.
    pub fn new(config: ClientConfig) -> HerderClient {
        HerderClient::with_frame_limit(config, FRAME_BYTES_MAX_DEFAULT)
    }

    pub fn with_frame_limit(config: ClientConfig, max_frame_bytes: usize) -> HerderClient {
        HerderClient::with_token(config, max_frame_bytes, None)
    }

    /// A client that presents `token` on every connection it opens (a coordinator that checks
    /// tokens refuses one without). A refused token fails the waiting calls with
    /// `ClientError::Server` and code `UNAUTHENTICATED`; they are not retried.
    pub fn with_token(
        config: ClientConfig,
        max_frame_bytes: usize,
        token: Option<Arc<ClientToken>>,
    ) -> HerderClient {
        HerderClient::secured(config, max_frame_bytes, token, None)
    }

    /// Like [`HerderClient::with_token`], speaking TLS to the coordinators (verified with
    /// `tls`) if given. A coordinator whose certificate does not verify is refused like a
    /// token: the waiting calls fail with `UNAUTHENTICATED`.
    pub fn secured(
        config: ClientConfig,
        max_frame_bytes: usize,
        token: Option<Arc<ClientToken>>,
        tls: Option<ClientTls>,
    ) -> HerderClient {
        let (calls_tx, calls_rx) = mpsc::unbounded_channel();
        let (input_tx, input_rx) = mpsc::channel(1024);
        let driver = Driver {
            client: Client::new(config, os_seed()),
            clock: Clock::new(),
            max_frame_bytes,
            inputs: input_tx,
            connection: DialedConnection::default(),
            credential: token.map(Credential::Token),
            tls,
            waiting: HashMap::new(),
        };
        tokio::spawn(driver.run(calls_rx, input_rx));
        HerderClient {
            calls: calls_tx,
            call_timeout: None,
        }
    }

    /// Bounds every call by `timeout` (see `call_timeout`).
    pub fn with_call_timeout(mut self, timeout: std::time::Duration) -> HerderClient {
        self.call_timeout = Some(timeout);
        self
    }

    /// Runs one operation and returns the coordinator's (successful) reply.
    pub async fn call(&self, op: Operation) -> Result<ClientReply, CallError> {
        let what = waiting_for(&op);
        let deadline = match (&op, self.call_timeout) {
            (_, None)
            | (
                Operation::Wait {
                    timeout_millis: None,
                    ..
                },
                _,
            ) => None,
            (
                Operation::Wait {
                    timeout_millis: Some(t),
                    ..
                },
                Some(base),
            ) => Some(base + std::time::Duration::from_millis(*t)),
            (_, Some(base)) => Some(base),
        };
        let (reply, rx) = oneshot::channel();
        self.calls
            .send(Call { op, reply })
            .map_err(|_| CallError::Closed)?;
        let answer = match deadline {
            None => rx.await,
            Some(after) => match tokio::time::timeout(after, rx).await {
                Ok(answer) => answer,
                // The operation stays with the driver; its late answer finds nobody.
                Err(_) => return Err(CallError::TimedOut { after, what }),
            },
        };
        Ok(answer.map_err(|_| CallError::Closed)??)
    }

    /// A client of the coordinators at `addresses` (client ports), with default settings.
    /// Must be called on a tokio runtime; connects lazily.
    pub fn connect<S: Into<String>>(addresses: impl IntoIterator<Item = S>) -> HerderClient {
        HerderClient::new(ClientConfig::new(
            addresses.into_iter().map(Into::into).collect(),
        ))
    }

    pub async fn submit(
        &self,
        task: &TaskSpec,
        options: SubmitOptions,
    ) -> Result<Submitted, CallError> {
        self.submit_json(task.to_json(), options).await
    }

    /// Submits a task by name with its payload: a user task, served by whichever worker
    /// registered a handler for `name`.
    pub async fn submit_task(
        &self,
        name: &str,
        payload: &impl serde::Serialize,
        options: SubmitOptions,
    ) -> Result<Submitted, CallError> {
        let payload = serde_json::to_value(payload).map_err(|error| {
            CallError::Invalid(format!("the payload cannot be written as JSON: {error}"))
        })?;
        self.submit_json(
            serde_json::json!({"kind": name, "payload": payload}),
            options,
        )
        .await
    }

    /// Submits a task given as its JSON wire form (the coordinator checks it).
    pub async fn submit_json(
        &self,
        task: serde_json::Value,
        options: SubmitOptions,
    ) -> Result<Submitted, CallError> {
        self.submit_job(JobSubmission {
            timeout_millis: options.timeout_millis,
            partitions: options.partitions,
            task,
            max_attempts: options.max_attempts,
            idempotency_key: options.idempotency_key,
            queue: options.queue,
            priority: options.priority,
            fairness_key: options.fairness_key,
            delay_millis: options.delay_millis,
            run_at_unix_ms: options.run_at_unix_ms,
            retry_of: options.retry_of,
            after: options.after,
            after_any_outcome: options.after_any_outcome,
        })
        .await
    }

    /// Submits one job given as the fields of a `SUBMIT`.
    pub async fn submit_job(&self, job: JobSubmission) -> Result<Submitted, CallError> {
        match self.call(Operation::Submit(job)).await? {
            ClientReply::SubmitAccepted {
                job_id, existing, ..
            } => Ok(Submitted { job_id, existing }),
            other => Err(unexpected(&other)),
        }
    }

    /// Submits many jobs in one request and one durable write (`SUBMIT_BATCH`). The results
    /// are in the order of `jobs`: each accepted (maybe an existing job, by its idempotency
    /// key), refused by admission, or refused for another reason. A job that fails
    /// validation fails the whole call with `CallError::Client(ClientError::Server { .. })`,
    /// and then none was created. Refused jobs are not retried here.
    pub async fn submit_batch(
        &self,
        jobs: Vec<JobSubmission>,
    ) -> Result<Vec<SubmitResult>, CallError> {
        let asked = jobs.len();
        match self.call(Operation::SubmitBatch { jobs }).await? {
            ClientReply::SubmitBatchResult { results, .. } if results.len() == asked => Ok(results),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn status(&self, job_id: JobId) -> Result<JobView, CallError> {
        match self.call(Operation::Status { job_id }).await? {
            ClientReply::Job { job, .. } => Ok(*job),
            other => Err(unexpected(&other)),
        }
    }

    /// Waits until the job is terminal or `timeout_millis` passes; returns the job and whether
    /// the wait timed out.
    pub async fn wait(
        &self,
        job_id: JobId,
        timeout_millis: Option<u64>,
    ) -> Result<(JobView, bool), CallError> {
        match self
            .call(Operation::Wait {
                job_id,
                timeout_millis,
            })
            .await?
        {
            ClientReply::WaitResult { job, timed_out, .. } => Ok((*job, timed_out)),
            other => Err(unexpected(&other)),
        }
    }

    /// Cancels the job; returns it and whether this call cancelled it (false: already terminal).
    pub async fn cancel(&self, job_id: JobId) -> Result<(JobView, bool), CallError> {
        match self.call(Operation::Cancel { job_id }).await? {
            ClientReply::CancelResult { job, cancelled, .. } => Ok((*job, cancelled)),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn list(
        &self,
        state: Option<JobState>,
        limit: Option<u32>,
    ) -> Result<Vec<JobView>, CallError> {
        self.list_before(state, limit, None).await
    }

    /// Like `list`, with only the jobs submitted before `before` (the next page).
    pub async fn list_before(
        &self,
        state: Option<JobState>,
        limit: Option<u32>,
        before: Option<JobId>,
    ) -> Result<Vec<JobView>, CallError> {
        let op = Operation::List {
            state,
            limit,
            before,
        };
        match self.call(op).await? {
            ClientReply::JobList { jobs, .. } => Ok(jobs),
            other => Err(unexpected(&other)),
        }
    }

    pub async fn workers(&self) -> Result<Vec<WorkerView>, CallError> {
        match self.call(Operation::Workers).await? {
            ClientReply::WorkerList { workers, .. } => Ok(workers),
            other => Err(unexpected(&other)),
        }
    }

    /// Every queue: its settings, its jobs by state, how long its oldest queued job waits.
    pub async fn queues(&self) -> Result<Vec<QueueView>, CallError> {
        match self.call(Operation::Queues).await? {
            ClientReply::QueueList { queues, .. } => Ok(queues),
            other => Err(unexpected(&other)),
        }
    }

    /// Changes `queue`'s settings (creating it if it is new); the queue as the change left it.
    pub async fn set_queue(
        &self,
        queue: &str,
        change: QueueChange,
    ) -> Result<QueueView, CallError> {
        let op = Operation::SetQueue {
            queue: queue.to_owned(),
            change,
        };
        match self.call(op).await? {
            ClientReply::QueueSet { queue, .. } => Ok(queue),
            other => Err(unexpected(&other)),
        }
    }

    /// The group as the member this client reaches sees it. Any member answers, so no redirect
    /// is involved: a client given one address learns that member's view.
    pub async fn cluster(&self) -> Result<ClusterView, CallError> {
        match self.call(Operation::Cluster).await? {
            ClientReply::Cluster { cluster, .. } => Ok(cluster),
            other => Err(unexpected(&other)),
        }
    }

    /// Purges one batch of terminal jobs (of `state`, or of every terminal state) that finished
    /// at least `older_than` ago: returns how many went and how many more match.
    pub async fn purge(
        &self,
        state: Option<JobState>,
        older_than: std::time::Duration,
    ) -> Result<(u64, u64), CallError> {
        let older_than_millis = u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX);
        let op = Operation::Purge {
            state,
            older_than_millis,
        };
        match self.call(op).await? {
            ClientReply::Purged {
                purged, remaining, ..
            } => Ok((purged, remaining)),
            other => Err(unexpected(&other)),
        }
    }

    /// Asks the leader to hand leadership to `to` (or to the most up-to-date member); returns
    /// the member taking over.
    pub async fn transfer_leader(&self, to: Option<NodeId>) -> Result<NodeId, CallError> {
        match self.call(Operation::TransferLeader { to }).await? {
            ClientReply::TransferStarted { to, .. } => Ok(to),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(reply: &ClientReply) -> CallError {
    use herder_core::protocol::codec::WireMessage;
    CallError::UnexpectedReply(reply.type_name().to_owned())
}

struct Driver {
    client: Client,
    clock: Clock,
    max_frame_bytes: usize,
    inputs: mpsc::Sender<Input>,
    connection: DialedConnection,
    credential: Option<Credential>,
    tls: Option<ClientTls>,
    waiting: HashMap<OpId, oneshot::Sender<Result<ClientReply, ClientError>>>,
}

impl Driver {
    async fn run(
        mut self,
        mut calls: mpsc::UnboundedReceiver<Call>,
        mut inputs: mpsc::Receiver<Input>,
    ) {
        let mut open = true;
        loop {
            if !open && self.waiting.is_empty() {
                break;
            }
            let timer = self.client.poll_timeout().map(|at| self.clock.deadline(at));
            tokio::select! {
                call = calls.recv(), if open => match call {
                    Some(call) => self.handle(Input::Call(call)),
                    None => open = false,
                },
                input = inputs.recv() => match input {
                    Some(input) => self.handle(input),
                    None => break,
                },
                _ = sleep_until(timer) => self.client.handle_timeout(self.clock.now()),
            }
            self.drain();
        }
        self.connection.close();
    }

    fn handle(&mut self, input: Input) {
        let now = self.clock.now();
        match input {
            Input::Call(call) => {
                let op = self.client.start(now, call.op);
                self.waiting.insert(op, call.reply);
            }
            Input::Connected(attempt, Ok(outbound)) => {
                if self.connection.opened(attempt, outbound) {
                    self.client.handle_connected(now, attempt);
                }
            }
            Input::Connected(attempt, Err(DialError::Failed(reason))) => {
                self.client.handle_connect_failed(now, attempt, &reason)
            }
            Input::Connected(attempt, Err(DialError::Refused { address, error })) => self
                .client
                .handle_refused(now, attempt, error.code(), &format!("{address}: {error}")),
            Input::Conn(attempt, Inbound::Message(reply)) => {
                self.client.handle_message(now, attempt, reply)
            }
            Input::Conn(attempt, Inbound::Malformed(error)) => {
                self.connection.lost(attempt);
                self.client
                    .handle_disconnected(now, attempt, &format!("malformed frame: {error}"));
            }
            Input::Conn(attempt, Inbound::Closed(reason)) => {
                self.connection.lost(attempt);
                self.client.handle_disconnected(now, attempt, &reason);
            }
        }
    }

    fn drain(&mut self) {
        while let Some(output) = self.client.poll_output() {
            match output {
                ClientOutput::Connect { attempt, address } => {
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
                ClientOutput::Send(request) => match self.connection.send(&request) {
                    None | Some((_, Ok(()))) => {}
                    Some((_, Err(SendError::Encode(error)))) => {
                        // The request itself cannot be framed; the connection is fine.
                        self.client.handle_unsendable(
                            self.clock.now(),
                            request.request_id(),
                            &error.to_string(),
                        );
                    }
                    Some((attempt, Err(error))) => {
                        self.connection.lost(attempt);
                        self.client.handle_disconnected(
                            self.clock.now(),
                            attempt,
                            &error.to_string(),
                        );
                    }
                },
                ClientOutput::Close => self.connection.close(),
                ClientOutput::Done { op, result } => {
                    if let Some(reply) = self.waiting.remove(&op) {
                        let _ = reply.send(result);
                    }
                }
            }
        }
    }
}

/// The submission that retries `original` as a new job: the same task, attempts, deadline,
/// queue, priority, fairness key and partition count, linked back by `retry_of`, and keyed by
/// `retry:` and the original's id, so retrying one job twice (a bulk retry run again, a resend)
/// creates one new job. Only a `FAILED` or `CANCELLED` job that is not a partition can be
/// retried; otherwise, why not.
pub fn retry_submission(original: &JobView) -> Result<JobSubmission, String> {
    if !matches!(original.state, JobState::Failed | JobState::Cancelled) {
        return Err(format!(
            "job {} is {}; only a FAILED or CANCELLED job can be retried as a new job",
            original.id, original.state
        ));
    }
    if let Some(of) = original.partition_of {
        return Err(format!(
            "job {} is partition {} of job {}; retry that job instead",
            original.id, of.index, of.parent
        ));
    }
    Ok(JobSubmission {
        task: original.task.to_json(),
        max_attempts: Some(original.max_attempts),
        idempotency_key: Some(format!("retry:{}", original.id)),
        partitions: original
            .partitions
            .as_ref()
            .map(|p| Partitions::Count(p.total.max(1))),
        timeout_millis: original.timeout_millis,
        queue: Some(original.queue.clone()),
        priority: Some(original.priority),
        fairness_key: original.fairness_key.clone(),
        run_at_unix_ms: None,
        delay_millis: None,
        retry_of: Some(original.id),
        after: Vec::new(),
        after_any_outcome: false,
    })
}
