//! The client state machine: one connection to the coordinator group, many operations on it.
//!
//! It owns every decision a careful client makes, so the CLI, the Rust library and the simulator
//! behave identically:
//!
//! - **Failover.** Addresses are tried in turn; a typed `NOT_LEADER` redirect is followed (the
//!   request was not processed, so resending is always safe). After `connect_rounds` full passes
//!   over the list without a connection, waiting operations fail with `Unreachable`.
//! - **Ambiguity.** If the connection drops (or a reply does not come within `request_timeout`)
//!   after a request was sent, the client cannot know whether it took effect. Reads, waits and
//!   cancels are resent (they are safe to repeat). A submission is resent only when it carries an
//!   idempotency key — then the coordinator maps the resend to the same job; without a key it
//!   fails with `Ambiguous` rather than risk creating a second job.
//! - **Admission retry (opt-in).** A retryable `SUBMIT_REJECTED` is retried up to
//!   `submit_retries` times with full jitter: a delay uniform in `[0, min(cap, base * 2^(n-1))]`
//!   before the n-th retry. Nothing else is ever retried on the client's initiative.
//!
//! Calling order: `start` operations at any time; drain `poll_output`; perform `Connect`, `Send`
//! and `Close`; report connection outcomes with the `ConnectAttempt` they concern
//! (`handle_connected`, `handle_connect_failed`, `handle_disconnected`), replies with
//! `handle_message`, and call `handle_timeout` when `poll_timeout` is due. Each operation ends
//! with exactly one `Done`.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub use crate::dial::{full_jitter, ConnectAttempt};
use crate::dial::{AfterFailure, Dialer, RedirectRule};
use crate::ids::{JobId, RequestId};
use crate::job::JobState;
use crate::protocol::{ClientReply, ClientRequest, ErrorCode, LeaderHint};
use crate::time::{as_millis_u64, Instant};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// Coordinator client-port addresses, tried in turn.
    pub coordinators: Vec<String>,
    /// Retries of a retryable `SUBMIT_REJECTED` after the first attempt (0 = one-shot).
    pub submit_retries: u32,
    pub submit_retry_base: Duration,
    pub submit_retry_max: Duration,
    /// How long to wait for a connection to open.
    pub connect_timeout: Duration,
    /// How long to wait for a reply before treating the connection as failed. A `WAIT` gets its
    /// own timeout on top.
    pub request_timeout: Duration,
    /// Full passes over `coordinators` without a connection before giving up. Between passes the
    /// client waits `connect_backoff_base * 2^(pass-1)`, capped at `connect_backoff_max`, so a
    /// coordinator that is restarting has time to come back.
    pub connect_rounds: u32,
    pub connect_backoff_base: Duration,
    pub connect_backoff_max: Duration,
    /// Times one operation is sent again after the connection carrying it failed, before the
    /// client gives up on it (bounds every resend loop, whatever the cause).
    pub max_resends: u32,
    /// Redirects one operation may follow (with the default pauses, about 10 s of a group
    /// without a leader before it gives up).
    pub max_redirects: u32,
    /// After the second redirect in a row, the client pauses before following the next:
    /// `redirect_pause_base * 2^(n-2)`, capped at `redirect_pause_max`. While leadership moves,
    /// the old leader and the member taking over can name each other for a moment; the pause
    /// lets the election finish instead of spending every redirect in a millisecond. The cap
    /// is short, so a client notices a new leader within about that long of its election.
    pub redirect_pause_base: Duration,
    pub redirect_pause_max: Duration,
}

impl ClientConfig {
    pub fn new(coordinators: Vec<String>) -> ClientConfig {
        ClientConfig {
            coordinators,
            submit_retries: 0,
            submit_retry_base: Duration::from_millis(200),
            submit_retry_max: Duration::from_millis(5_000),
            connect_timeout: Duration::from_millis(3_000),
            request_timeout: Duration::from_millis(30_000),
            connect_rounds: 5,
            connect_backoff_base: Duration::from_millis(100),
            connect_backoff_max: Duration::from_millis(2_000),
            max_resends: 4,
            max_redirects: 100,
            redirect_pause_base: Duration::from_millis(20),
            redirect_pause_max: Duration::from_millis(100),
        }
    }
}

/// What a client asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Operation {
    /// One job (`SUBMIT`).
    Submit(crate::protocol::JobSubmission),
    /// Many jobs in one request (`SUBMIT_BATCH`). A job refused by admission is reported in
    /// the batch's results and not retried here: the caller sees which ones to send again.
    SubmitBatch {
        jobs: Vec<crate::protocol::JobSubmission>,
    },
    Status {
        job_id: JobId,
    },
    Wait {
        job_id: JobId,
        timeout_millis: Option<u64>,
    },
    Cancel {
        job_id: JobId,
    },
    List {
        state: Option<JobState>,
        limit: Option<u32>,
        /// Only jobs submitted before this one (the next page of a listing).
        before: Option<JobId>,
    },
    Workers,
    /// Every queue with its settings and counts.
    Queues,
    /// Change a queue's settings.
    SetQueue {
        queue: String,
        change: crate::queues::QueueChange,
    },
    /// The group as the member this client is connected to sees it (any member answers).
    Cluster,
    /// Ask the leader to hand leadership to `to` (or to the most up-to-date member).
    TransferLeader {
        to: Option<crate::ids::NodeId>,
    },
    /// Remove one batch of terminal jobs that finished at least `older_than_millis` ago.
    Purge {
        state: Option<JobState>,
        older_than_millis: u64,
    },
}

impl Operation {
    /// Whether sending this twice is harmless.
    fn safe_to_resend(&self) -> bool {
        match self {
            Operation::Submit(job) => job.idempotency_key.is_some(),
            Operation::SubmitBatch { jobs } => jobs.iter().all(|j| j.idempotency_key.is_some()),
            Operation::Status { .. }
            | Operation::Wait { .. }
            | Operation::Cancel { .. }
            | Operation::List { .. }
            | Operation::Workers
            | Operation::Queues
            | Operation::Cluster
            // Setting the same values twice leaves the queue as once.
            | Operation::SetQueue { .. }
            // A second purge removes only what still matches: what the first one would have.
            | Operation::Purge { .. } => true,
            // A second hand-over after the first one took effect would move leadership again.
            Operation::TransferLeader { .. } => false,
        }
    }

    fn request(&self, request_id: RequestId) -> ClientRequest {
        match self.clone() {
            Operation::Submit(job) => job.into_request(request_id),
            Operation::SubmitBatch { jobs } => ClientRequest::SubmitBatch { request_id, jobs },
            Operation::Status { job_id } => ClientRequest::Status { request_id, job_id },
            Operation::Wait {
                job_id,
                timeout_millis,
            } => ClientRequest::Wait {
                request_id,
                job_id,
                timeout_millis,
            },
            Operation::Cancel { job_id } => ClientRequest::Cancel { request_id, job_id },
            Operation::List {
                state,
                limit,
                before,
            } => ClientRequest::List {
                request_id,
                state,
                limit,
                before,
            },
            Operation::Workers => ClientRequest::Workers { request_id },
            Operation::Queues => ClientRequest::Queues { request_id },
            Operation::SetQueue { queue, change } => {
                ClientRequest::set_queue(request_id, queue, change)
            }
            Operation::Cluster => ClientRequest::Cluster { request_id },
            Operation::TransferLeader { to } => ClientRequest::TransferLeader { request_id, to },
            Operation::Purge {
                state,
                older_than_millis,
            } => ClientRequest::Purge {
                request_id,
                state,
                older_than_millis,
            },
        }
    }

    fn reply_timeout(&self, request_timeout: Duration) -> Duration {
        match self {
            Operation::Wait { timeout_millis, .. } => {
                let wait =
                    Duration::from_millis(timeout_millis.unwrap_or(crate::limits::WAIT_MILLIS_MAX));
                wait.saturating_add(request_timeout)
            }
            _ => request_timeout,
        }
    }
}

/// Names one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

/// Why an operation did not succeed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach any coordinator (tried {tried}): {last_error}")]
    Unreachable { tried: String, last_error: String },
    #[error(
        "the connection failed after the submission was sent, so it may or may not have been created; \
         check with `herder list`, or submit with --idempotency-key to make resending safe ({reason})"
    )]
    Ambiguous { reason: String },
    #[error("submission rejected: {message} (active {active_jobs} of {max_active_jobs})")]
    Rejected {
        active_jobs: u64,
        max_active_jobs: u64,
        /// Set when the limit reached was this queue's; the counts are then the queue's.
        queue: Option<String>,
        message: String,
    },
    #[error("coordinator error {code:?}: {message}")]
    Server { code: ErrorCode, message: String },
    #[error("followed {0} leader redirects without reaching the leader")]
    TooManyRedirects(u32),
    #[error("the request cannot be sent: {reason}")]
    Unsendable { reason: String },
}

/// What the client asks its driver to do.
#[derive(Clone, Debug, PartialEq)]
pub enum ClientOutput {
    Connect {
        attempt: ConnectAttempt,
        address: String,
    },
    Send(ClientRequest),
    /// Close the current connection (no report is expected back).
    Close,
    /// An operation ended.
    Done {
        op: OpId,
        result: Result<ClientReply, ClientError>,
    },
}

#[derive(Clone, Debug)]
struct PendingOp {
    op: Operation,
    /// Sent on the current connection and not yet answered; `Some(deadline)` for the reply.
    sent: Option<Instant>,
    /// Waiting out a rejection backoff until this instant.
    retry_at: Option<Instant>,
    rejections: u32,
    redirects: u32,
    /// Times it was sent again after a connection failure.
    resends: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Link {
    Idle,
    Connecting {
        attempt: ConnectAttempt,
        give_up_at: Instant,
    },
    /// Connected. `draining`: a redirect arrived, so nothing new is sent here; once every request
    /// already sent is answered, the client moves to the leader.
    Ready {
        attempt: ConnectAttempt,
        draining: bool,
    },
}

/// The client. See the module documentation for the calling order.
pub struct Client {
    config: ClientConfig,
    rng: ChaCha8Rng,
    link: Link,
    next_op: u64,
    /// Where to connect next, and when to pause or give up. A leader redirect is used for one
    /// connection; consecutive failures are reset by a successful connection.
    dialer: Dialer,
    /// No new connection before this instant (backoff between passes over the addresses).
    reconnect_at: Option<Instant>,
    last_error: String,
    ops: BTreeMap<OpId, PendingOp>,
    outputs: VecDeque<ClientOutput>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("link", &self.link)
            .field("ops", &self.ops.len())
            .finish()
    }
}

impl Client {
    pub fn new(config: ClientConfig, seed: u64) -> Client {
        let dialer = Dialer::new(config.coordinators.clone(), RedirectRule::Once);
        Client {
            config,
            rng: ChaCha8Rng::seed_from_u64(seed),
            link: Link::Idle,
            next_op: 0,
            dialer,
            reconnect_at: None,
            last_error: String::new(),
            ops: BTreeMap::new(),
            outputs: VecDeque::new(),
        }
    }

    /// Operations not yet done.
    pub fn pending(&self) -> usize {
        self.ops.len()
    }

    pub fn poll_output(&mut self) -> Option<ClientOutput> {
        self.outputs.pop_front()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        let connect = match &self.link {
            Link::Connecting { give_up_at, .. } => Some(*give_up_at),
            // Only worth waking for when something is waiting to be sent.
            Link::Idle
                if self
                    .ops
                    .values()
                    .any(|op| op.sent.is_none() && op.retry_at.is_none()) =>
            {
                self.reconnect_at
            }
            Link::Idle => None,
            Link::Ready { .. } => None,
        };
        self.ops
            .values()
            .filter_map(|op| op.retry_at.or(op.sent))
            .chain(connect)
            .min()
    }

    /// Starts an operation; it ends with one `Done`.
    pub fn start(&mut self, now: Instant, op: Operation) -> OpId {
        self.next_op += 1;
        let id = OpId(self.next_op);
        if self.dialer.addresses().is_empty() {
            self.finish(
                id,
                Err(ClientError::Unreachable {
                    tried: "no addresses".into(),
                    last_error: "no coordinator address was given".into(),
                }),
            );
            return id;
        }
        self.ops.insert(
            id,
            PendingOp {
                op,
                sent: None,
                retry_at: None,
                rejections: 0,
                redirects: 0,
                resends: 0,
            },
        );
        self.pump(now);
        id
    }

    fn finish(&mut self, op: OpId, result: Result<ClientReply, ClientError>) {
        self.ops.remove(&op);
        self.outputs.push_back(ClientOutput::Done { op, result });
    }

    fn current_attempt(&self) -> Option<ConnectAttempt> {
        match &self.link {
            Link::Idle => None,
            Link::Connecting { attempt, .. } | Link::Ready { attempt, .. } => Some(*attempt),
        }
    }

    /// Sends what can be sent, connecting first if needed.
    fn pump(&mut self, now: Instant) {
        let ready = self
            .ops
            .iter()
            .any(|(_, op)| op.sent.is_none() && op.retry_at.is_none());
        match self.link {
            // Every request sent here has been answered: move to the leader.
            Link::Ready { draining: true, .. } if self.ops.values().all(|op| op.sent.is_none()) => {
                self.outputs.push_back(ClientOutput::Close);
                self.link = Link::Idle;
                let hops = self.ops.values().map(|op| op.redirects).max().unwrap_or(0);
                if hops >= 2 {
                    let doubling = 1u32 << (hops - 2).min(16);
                    let pause = self
                        .config
                        .redirect_pause_base
                        .saturating_mul(doubling)
                        .min(self.config.redirect_pause_max);
                    self.reconnect_at = Some(now.saturating_add(pause));
                } else if ready {
                    self.connect(now);
                }
            }
            Link::Ready {
                draining: false, ..
            } => {
                let to_send: Vec<OpId> = self
                    .ops
                    .iter()
                    .filter(|(_, op)| op.sent.is_none() && op.retry_at.is_none())
                    .map(|(id, _)| *id)
                    .collect();
                for id in to_send {
                    if let Some(pending) = self.ops.get_mut(&id) {
                        let deadline = now
                            .saturating_add(pending.op.reply_timeout(self.config.request_timeout));
                        pending.sent = Some(deadline);
                        let request = pending.op.request(RequestId(id.0));
                        self.outputs.push_back(ClientOutput::Send(request));
                    }
                }
            }
            Link::Idle if ready && self.reconnect_at.is_none_or(|at| at <= now) => {
                self.reconnect_at = None;
                self.connect(now);
            }
            _ => {}
        }
    }

    fn connect(&mut self, now: Instant) {
        let (attempt, address) = self.dialer.dial();
        self.link = Link::Connecting {
            attempt,
            give_up_at: now.saturating_add(self.config.connect_timeout),
        };
        self.outputs
            .push_back(ClientOutput::Connect { attempt, address });
    }

    pub fn handle_connected(&mut self, now: Instant, attempt: ConnectAttempt) {
        if !matches!(self.link, Link::Connecting { attempt: a, .. } if a == attempt) {
            return;
        }
        self.link = Link::Ready {
            attempt,
            draining: false,
        };
        self.dialer.reset_failures();
        self.pump(now);
    }

    pub fn handle_connect_failed(&mut self, now: Instant, attempt: ConnectAttempt, reason: &str) {
        if self.current_attempt() != Some(attempt) {
            return;
        }
        self.link = Link::Idle;
        self.connection_failed(now, format!("connect failed: {reason}"));
    }

    /// The coordinator refused this client's credential (code `UNAUTHENTICATED`), or could
    /// not prove its own. Final for every operation waiting: another member of the same group
    /// would refuse it too. A later operation dials afresh.
    pub fn handle_refused(
        &mut self,
        now: Instant,
        attempt: ConnectAttempt,
        code: ErrorCode,
        message: &str,
    ) {
        if self.current_attempt() != Some(attempt) {
            return;
        }
        self.link = Link::Idle;
        self.last_error = message.to_owned();
        let waiting: Vec<OpId> = self.ops.keys().copied().collect();
        for id in waiting {
            self.finish(
                id,
                Err(ClientError::Server {
                    code,
                    message: message.to_owned(),
                }),
            );
        }
        self.pump(now);
    }

    pub fn handle_disconnected(&mut self, now: Instant, attempt: ConnectAttempt, reason: &str) {
        if self.current_attempt() != Some(attempt) {
            return;
        }
        self.link = Link::Idle;
        self.connection_failed(now, format!("connection closed: {reason}"));
    }

    /// The connection is gone. Settle what was in flight, then try the next address or give up.
    fn connection_failed(&mut self, now: Instant, reason: String) {
        self.last_error = reason.clone();
        let in_flight: Vec<OpId> = self
            .ops
            .iter()
            .filter(|(_, op)| op.sent.is_some())
            .map(|(id, _)| *id)
            .collect();
        for id in in_flight {
            let safe = self.ops.get(&id).is_some_and(|op| op.op.safe_to_resend());
            if safe {
                let Some(op) = self.ops.get_mut(&id) else {
                    continue;
                };
                op.sent = None;
                op.resends += 1;
                if op.resends > self.config.max_resends {
                    let resends = op.resends - 1;
                    self.finish(
                        id,
                        Err(ClientError::Unreachable {
                            tried: self.dialer.addresses().join(","),
                            last_error: format!("no answer after {resends} resends: {reason}"),
                        }),
                    );
                }
            } else {
                self.finish(
                    id,
                    Err(ClientError::Ambiguous {
                        reason: reason.clone(),
                    }),
                );
            }
        }
        match self.dialer.pass_failed(
            self.config.connect_rounds,
            self.config.connect_backoff_base,
            self.config.connect_backoff_max,
        ) {
            AfterFailure::GiveUp => {
                let tried = self.dialer.addresses().join(",");
                let waiting: Vec<OpId> = self.ops.keys().copied().collect();
                for id in waiting {
                    self.finish(
                        id,
                        Err(ClientError::Unreachable {
                            tried: tried.clone(),
                            last_error: self.last_error.clone(),
                        }),
                    );
                }
                return;
            }
            AfterFailure::Pause(delay) => self.reconnect_at = Some(now.saturating_add(delay)),
            AfterFailure::Next => {}
        }
        self.pump(now);
    }

    pub fn handle_message(&mut self, now: Instant, attempt: ConnectAttempt, reply: ClientReply) {
        if self.current_attempt() != Some(attempt) {
            return;
        }
        let Some(request_id) = reply.request_id() else {
            // A connection-level error: the coordinator is closing this connection.
            if let ClientReply::Error { code, message, .. } = reply {
                self.outputs.push_back(ClientOutput::Close);
                if code == ErrorCode::Unauthenticated {
                    // The port wants a token this client does not have: no resend or other
                    // member would do better.
                    return self.handle_refused(now, attempt, code, &message);
                }
                self.link = Link::Idle;
                self.connection_failed(now, format!("coordinator error {code:?}: {message}"));
            }
            return;
        };
        let id = OpId(request_id.0);
        let Some(pending) = self.ops.get_mut(&id) else {
            return; // An answer to an operation already settled (e.g. after a timeout).
        };
        if pending.sent.is_none() {
            return; // Not sent on this connection; a stale duplicate.
        }
        match reply {
            ClientReply::SubmitRejected {
                retryable,
                active_jobs,
                max_active_jobs,
                queue,
                message,
                ..
            } => {
                let counts = (active_jobs, max_active_jobs);
                self.on_submit_rejected(now, id, retryable, counts, queue, message);
            }
            ClientReply::NotLeader {
                leader,
                uncertain,
                members,
                ..
            } => {
                if !self.on_not_leader(id, leader, uncertain, members) {
                    return;
                }
            }
            ClientReply::Error { code, message, .. } => {
                self.finish(id, Err(ClientError::Server { code, message }));
            }
            reply => self.finish(id, Ok(reply)),
        }
        // An answer may complete a redirect's drain.
        self.pump(now);
    }

    /// Operation `id`, a submission, was refused for want of room: retried after a pause if
    /// the refusal says it may be and retries are left, else finished with the refusal.
    fn on_submit_rejected(
        &mut self,
        now: Instant,
        id: OpId,
        retryable: bool,
        (active_jobs, max_active_jobs): (u64, u64),
        queue: Option<String>,
        message: String,
    ) {
        let retries = self.config.submit_retries;
        let Some(pending) = self.ops.get_mut(&id) else {
            return;
        };
        if retryable && pending.rejections < retries {
            pending.rejections += 1;
            pending.sent = None;
            let n = pending.rejections;
            let delay = full_jitter(
                &mut self.rng,
                self.config.submit_retry_base,
                self.config.submit_retry_max,
                n,
            );
            if let Some(pending) = self.ops.get_mut(&id) {
                pending.retry_at = Some(now.saturating_add(delay));
            }
        } else {
            self.finish(
                id,
                Err(ClientError::Rejected {
                    active_jobs,
                    max_active_jobs,
                    queue,
                    message,
                }),
            );
        }
    }

    /// The member asked for operation `id` does not lead: the request goes again to the leader
    /// (unless it may have taken effect and is not safe to repeat, or it was redirected too
    /// often). False when nothing more is to be done for this answer.
    fn on_not_leader(
        &mut self,
        id: OpId,
        leader: Option<LeaderHint>,
        uncertain: bool,
        members: Vec<String>,
    ) -> bool {
        let max_redirects = self.config.max_redirects;
        let Some(pending) = self.ops.get_mut(&id) else {
            return true;
        };
        if uncertain && !pending.op.safe_to_resend() {
            // The coordinator lost its leadership while this request was being made
            // durable: it may have taken effect. Without a key, do not risk a second job.
            let reason = "the coordinator stopped leading while the submission was being made durable; it may or may not have been accepted".to_owned();
            self.finish(id, Err(ClientError::Ambiguous { reason }));
            self.dialer.learn(members);
            self.dialer.not_leader(leader);
            if let Link::Ready { draining, .. } = &mut self.link {
                *draining = true;
            }
            return true;
        }
        pending.redirects += 1;
        let redirects = pending.redirects;
        self.dialer.learn(members);
        if redirects > max_redirects {
            self.finish(id, Err(ClientError::TooManyRedirects(redirects - 1)));
            return false;
        }
        // This request was not processed (or is safe to repeat), so it is sent again, to the
        // leader. Others sent on this connection may have been processed (leadership can move
        // mid-connection), so they are not resent: their answers are awaited here first.
        if let Some(pending) = self.ops.get_mut(&id) {
            pending.sent = None;
        }
        self.dialer.not_leader(leader);
        if let Link::Ready { draining, .. } = &mut self.link {
            *draining = true;
        }
        true
    }

    /// The driver could not turn the request for `request_id` into a frame (e.g. it is larger
    /// than the frame limit). That is a property of the request, not of the connection: the
    /// operation fails and nothing is resent.
    pub fn handle_unsendable(&mut self, now: Instant, request_id: RequestId, reason: &str) {
        let id = OpId(request_id.0);
        if self.ops.contains_key(&id) {
            self.finish(
                id,
                Err(ClientError::Unsendable {
                    reason: reason.to_owned(),
                }),
            );
        }
        self.pump(now);
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        if self.reconnect_at.is_some_and(|at| at <= now) {
            // The pause is over whether or not anything is waiting to be sent.
            self.reconnect_at = None;
        }
        if let Link::Connecting { give_up_at, .. } = self.link {
            if give_up_at <= now {
                self.outputs.push_back(ClientOutput::Close);
                self.link = Link::Idle;
                self.connection_failed(now, "connect timed out".into());
            }
        }
        let mut reply_overdue = false;
        for op in self.ops.values_mut() {
            if op.retry_at.is_some_and(|at| at <= now) {
                op.retry_at = None;
            }
            if op.sent.is_some_and(|deadline| deadline <= now) {
                reply_overdue = true;
            }
        }
        if reply_overdue && matches!(self.link, Link::Ready { .. }) {
            // No answer in time: treat the connection as failed (the coordinator may be paused or
            // partitioned away) and let the resend rules decide.
            self.outputs.push_back(ClientOutput::Close);
            self.link = Link::Idle;
            let timeout = as_millis_u64(self.config.request_timeout);
            self.connection_failed(now, format!("no reply within {timeout} ms"));
        }
        self.pump(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{NodeId, Term};
    use crate::protocol::LeaderHint;
    use uuid::Uuid;

    fn client(addresses: &[&str], submit_retries: u32) -> Client {
        let mut config = ClientConfig::new(addresses.iter().map(|a| a.to_string()).collect());
        config.submit_retries = submit_retries;
        Client::new(config, 5)
    }

    fn drain(client: &mut Client) -> Vec<ClientOutput> {
        std::iter::from_fn(|| client.poll_output()).collect()
    }

    fn connect_of(outputs: &[ClientOutput]) -> (ConnectAttempt, String) {
        outputs
            .iter()
            .find_map(|o| match o {
                ClientOutput::Connect { attempt, address } => Some((*attempt, address.clone())),
                _ => None,
            })
            .expect("a Connect output")
    }

    fn sent(outputs: &[ClientOutput]) -> Vec<ClientRequest> {
        outputs
            .iter()
            .filter_map(|o| match o {
                ClientOutput::Send(request) => Some(request.clone()),
                _ => None,
            })
            .collect()
    }

    fn done(outputs: &[ClientOutput]) -> Vec<(OpId, Result<ClientReply, ClientError>)> {
        outputs
            .iter()
            .filter_map(|o| match o {
                ClientOutput::Done { op, result } => Some((*op, result.clone())),
                _ => None,
            })
            .collect()
    }

    fn submit(key: Option<&str>) -> Operation {
        Operation::Submit(crate::protocol::JobSubmission {
            timeout_millis: None,
            partitions: None,
            task: serde_json::json!({"kind": "sha256", "text": "abc"}),
            max_attempts: None,
            idempotency_key: key.map(str::to_owned),
            ..Default::default()
        })
    }

    fn connected(c: &mut Client, now: Instant) -> (ConnectAttempt, Vec<ClientOutput>) {
        let (attempt, _) = connect_of(&drain(c));
        c.handle_connected(now, attempt);
        (attempt, drain(c))
    }

    #[test]
    fn a_submission_without_a_key_is_never_resent_after_an_ambiguous_failure() {
        let mut c = client(&["a", "b"], 0);
        let op = c.start(Instant::ZERO, submit(None));
        let (attempt, outputs) = connected(&mut c, Instant::ZERO);
        assert_eq!(sent(&outputs).len(), 1);
        c.handle_disconnected(Instant::ZERO, attempt, "reset");
        let outputs = drain(&mut c);
        assert!(sent(&outputs).is_empty());
        assert!(
            matches!(done(&outputs).as_slice(), [(id, Err(ClientError::Ambiguous { .. }))] if *id == op)
        );
        assert!(
            !outputs
                .iter()
                .any(|o| matches!(o, ClientOutput::Connect { .. })),
            "nothing left to do"
        );
    }

    #[test]
    fn a_submission_with_a_key_is_resent_on_the_next_coordinator() {
        let mut c = client(&["a", "b"], 0);
        let op = c.start(Instant::ZERO, submit(Some("order-42")));
        let (attempt, outputs) = connected(&mut c, Instant::ZERO);
        let first = sent(&outputs);
        c.handle_disconnected(Instant::ZERO, attempt, "reset");
        let (next, address) = connect_of(&drain(&mut c));
        assert_eq!(address, "b");
        c.handle_connected(Instant::ZERO, next);
        let second = sent(&drain(&mut c));
        assert_eq!(
            first, second,
            "the same request, with the same key, goes out again"
        );
        let reply = ClientReply::SubmitAccepted {
            term: Term(1),
            request_id: RequestId(op.0),
            job_id: JobId(Uuid::from_u128(1)),
            existing: true,
        };
        c.handle_message(Instant::ZERO, next, reply.clone());
        assert_eq!(done(&drain(&mut c)), vec![(op, Ok(reply))]);
    }

    #[test]
    fn retryable_rejections_are_retried_with_bounded_full_jitter_then_surfaced() {
        let mut c = client(&["a"], 2);
        let op = c.start(Instant::ZERO, submit(None));
        let (attempt, _) = connected(&mut c, Instant::ZERO);
        let rejected = ClientReply::SubmitRejected {
            queue: None,
            request_id: RequestId(op.0),
            retryable: true,
            active_jobs: 3,
            admitting_jobs: 0,
            max_active_jobs: 3,
            message: "full".into(),
        };
        let mut now = Instant::ZERO;
        for n in 1..=2u64 {
            c.handle_message(now, attempt, rejected.clone());
            assert!(drain(&mut c).is_empty(), "waits before retrying");
            let at = c.poll_timeout().expect("a retry timer");
            // Full jitter: at most base * 2^(n-1) = 200 ms * 2^(n-1) later.
            assert!(at.saturating_since(now) <= Duration::from_millis(200 << (n - 1)));
            now = at;
            c.handle_timeout(now);
            assert_eq!(sent(&drain(&mut c)).len(), 1, "retry {n} is sent");
        }
        c.handle_message(now, attempt, rejected);
        assert!(matches!(
            done(&drain(&mut c)).as_slice(),
            [(
                _,
                Err(ClientError::Rejected {
                    active_jobs: 3,
                    max_active_jobs: 3,
                    ..
                })
            )]
        ));
    }

    #[test]
    fn a_rejection_by_a_queues_limit_is_retried_and_surfaced_naming_the_queue() {
        let mut c = client(&["a"], 1);
        let op = c.start(Instant::ZERO, submit(None));
        let (attempt, _) = connected(&mut c, Instant::ZERO);
        let rejected = ClientReply::SubmitRejected {
            queue: Some("imports".into()),
            request_id: RequestId(op.0),
            retryable: true,
            active_jobs: 2,
            admitting_jobs: 0,
            max_active_jobs: 2,
            message: "queue \"imports\" is full".into(),
        };
        c.handle_message(Instant::ZERO, attempt, rejected.clone());
        let at = c.poll_timeout().expect("a retry timer");
        c.handle_timeout(at);
        assert_eq!(sent(&drain(&mut c)).len(), 1, "retried once");
        c.handle_message(at, attempt, rejected);
        let finished = done(&drain(&mut c));
        assert!(
            matches!(
                finished.as_slice(),
                [(_, Err(ClientError::Rejected { queue: Some(queue), max_active_jobs: 2, .. }))] if queue == "imports"
            ),
            "{finished:?}"
        );
    }

    #[test]
    fn a_non_retryable_rejection_is_not_retried() {
        let mut c = client(&["a"], 5);
        let op = c.start(Instant::ZERO, submit(None));
        let (attempt, _) = connected(&mut c, Instant::ZERO);
        c.handle_message(
            Instant::ZERO,
            attempt,
            ClientReply::SubmitRejected {
                queue: None,
                request_id: RequestId(op.0),
                retryable: false,
                active_jobs: 1,
                admitting_jobs: 0,
                max_active_jobs: 1,
                message: "no".into(),
            },
        );
        assert!(matches!(
            done(&drain(&mut c)).as_slice(),
            [(_, Err(ClientError::Rejected { .. }))]
        ));
    }

    #[test]
    fn redirects_are_followed_to_the_named_leader() {
        let mut c = client(&["a", "b"], 0);
        let op = c.start(Instant::ZERO, Operation::Workers);
        let (attempt, _) = connected(&mut c, Instant::ZERO);
        c.handle_message(
            Instant::ZERO,
            attempt,
            ClientReply::NotLeader {
                request_id: RequestId(op.0),
                leader: Some(LeaderHint {
                    node_id: NodeId("c3".into()),
                    address: "leader:7071".into(),
                }),
                uncertain: false,
                members: Vec::new(),
            },
        );
        let outputs = drain(&mut c);
        assert!(outputs.contains(&ClientOutput::Close));
        assert_eq!(connect_of(&outputs).1, "leader:7071");
    }

    #[test]
    fn a_redirect_waits_for_other_answers_and_never_resends_an_unkeyed_submission() {
        let mut c = client(&["a", "b"], 0);
        let submit_op = c.start(Instant::ZERO, submit(None));
        let read_op = c.start(Instant::ZERO, Operation::Workers);
        let (attempt, outputs) = connected(&mut c, Instant::ZERO);
        assert_eq!(sent(&outputs).len(), 2);
        // The read is redirected; the submission (maybe processed by the old leader) is not.
        c.handle_message(
            Instant::ZERO,
            attempt,
            ClientReply::NotLeader {
                request_id: RequestId(read_op.0),
                leader: Some(LeaderHint {
                    node_id: NodeId("c2".into()),
                    address: "leader:7071".into(),
                }),
                uncertain: false,
                members: Vec::new(),
            },
        );
        let outputs = drain(&mut c);
        assert!(
            outputs.is_empty(),
            "waits for the submission's answer first: {outputs:?}"
        );
        let accepted = ClientReply::SubmitAccepted {
            term: Term(1),
            request_id: RequestId(submit_op.0),
            job_id: JobId(Uuid::from_u128(3)),
            existing: false,
        };
        c.handle_message(Instant::ZERO, attempt, accepted.clone());
        let outputs = drain(&mut c);
        assert!(done(&outputs).contains(&(submit_op, Ok(accepted))));
        assert!(outputs.contains(&ClientOutput::Close));
        let (next, address) = connect_of(&outputs);
        assert_eq!(address, "leader:7071");
        c.handle_connected(Instant::ZERO, next);
        let resent = sent(&drain(&mut c));
        assert_eq!(
            resent,
            vec![ClientRequest::Workers {
                request_id: RequestId(read_op.0)
            }]
        );
    }

    #[test]
    fn unreachable_after_every_address_failed_for_the_configured_rounds_with_backoff_between() {
        let mut c = client(&["a", "b"], 0);
        let op = c.start(Instant::ZERO, Operation::Workers);
        let mut tried = Vec::new();
        let mut now = Instant::ZERO;
        let mut waits = Vec::new();
        for _ in 0..10 {
            let mut outputs = drain(&mut c);
            if !outputs
                .iter()
                .any(|o| matches!(o, ClientOutput::Connect { .. }))
            {
                // Between passes: nothing happens until the backoff timer.
                let at = c.poll_timeout().expect("a reconnect timer");
                waits.push(at.saturating_since(now));
                now = at;
                c.handle_timeout(now);
                outputs = drain(&mut c);
            }
            let (attempt, address) = connect_of(&outputs);
            tried.push(address);
            c.handle_connect_failed(now, attempt, "refused");
        }
        assert_eq!(tried, ["a", "b", "a", "b", "a", "b", "a", "b", "a", "b"]);
        let millis: Vec<u128> = waits.iter().map(Duration::as_millis).collect();
        assert_eq!(
            millis,
            [100, 200, 400, 800],
            "doubling pauses between the five passes"
        );
        let outputs = drain(&mut c);
        assert!(
            matches!(done(&outputs).as_slice(), [(id, Err(ClientError::Unreachable { .. }))] if *id == op)
        );
        assert_eq!(c.pending(), 0);
    }

    #[test]
    fn an_idle_client_has_no_timer_left_once_its_reconnect_pause_is_over() {
        let mut c = client(&["a"], 0);
        let op = c.start(Instant::ZERO, Operation::Workers);
        let (attempt, _) = connected(&mut c, Instant::ZERO);
        c.handle_message(
            Instant::ZERO,
            attempt,
            ClientReply::WorkerList {
                request_id: RequestId(op.0),
                workers: vec![],
            },
        );
        // The connection drops while nothing is pending: a reconnect pause is set ...
        c.handle_disconnected(Instant::ZERO, attempt, "reset");
        drain(&mut c);
        // ... but with nothing to send there is nothing to wake up for, now or later.
        assert_eq!(c.poll_timeout(), None);
        c.handle_timeout(Instant::from_millis(500));
        assert_eq!(c.poll_timeout(), None);
        assert!(drain(&mut c).is_empty());
    }

    #[test]
    fn a_safe_request_is_resent_a_bounded_number_of_times() {
        let mut c = client(&["a"], 0);
        let op = c.start(Instant::ZERO, submit(Some("key")));
        let mut sends = 0;
        let mut now = Instant::ZERO;
        for _ in 0..20 {
            let outputs = drain(&mut c);
            if !done(&outputs).is_empty() {
                assert!(
                    matches!(done(&outputs).as_slice(), [(id, Err(ClientError::Unreachable { .. }))] if *id == op)
                );
                assert_eq!(sends, 5, "the first send and max_resends (4) resends");
                return;
            }
            let outputs = if outputs
                .iter()
                .any(|o| matches!(o, ClientOutput::Connect { .. }))
            {
                outputs
            } else {
                now = c.poll_timeout().expect("timer");
                c.handle_timeout(now);
                drain(&mut c)
            };
            let (attempt, _) = connect_of(&outputs);
            c.handle_connected(now, attempt);
            sends += sent(&drain(&mut c)).len();
            // The coordinator drops every connection right after the request arrives.
            c.handle_disconnected(now, attempt, "reset");
        }
        panic!("the client never gave up");
    }

    #[test]
    fn a_silent_coordinator_is_abandoned_after_the_request_timeout() {
        let mut c = client(&["a", "b"], 0);
        c.start(Instant::ZERO, Operation::Workers);
        let (_, outputs) = connected(&mut c, Instant::ZERO);
        assert_eq!(sent(&outputs).len(), 1);
        let deadline = c.poll_timeout().expect("reply deadline");
        assert_eq!(
            deadline,
            Instant::ZERO.saturating_add(Duration::from_millis(30_000))
        );
        c.handle_timeout(deadline);
        let outputs = drain(&mut c);
        assert!(outputs.contains(&ClientOutput::Close));
        assert_eq!(connect_of(&outputs).1, "b", "a read is retried elsewhere");
    }

    #[test]
    fn an_unsendable_request_fails_alone_and_is_not_retried() {
        let mut c = client(&["a"], 0);
        let big = c.start(Instant::ZERO, submit(Some("key")));
        let small = c.start(Instant::ZERO, Operation::Workers);
        let (attempt, outputs) = connected(&mut c, Instant::ZERO);
        assert_eq!(sent(&outputs).len(), 2);
        c.handle_unsendable(Instant::ZERO, RequestId(big.0), "frame too large");
        let outputs = drain(&mut c);
        assert!(
            matches!(done(&outputs).as_slice(), [(id, Err(ClientError::Unsendable { .. }))] if *id == big)
        );
        assert!(
            sent(&outputs).is_empty() && !outputs.contains(&ClientOutput::Close),
            "the connection stays"
        );
        assert_eq!(c.pending(), 1);
        let reply = ClientReply::WorkerList {
            request_id: RequestId(small.0),
            workers: vec![],
        };
        c.handle_message(Instant::ZERO, attempt, reply.clone());
        assert_eq!(done(&drain(&mut c)), vec![(small, Ok(reply))]);
    }

    #[test]
    fn server_errors_are_typed() {
        let mut c = client(&["a"], 3);
        let op = c.start(
            Instant::ZERO,
            Operation::Status {
                job_id: JobId(Uuid::nil()),
            },
        );
        let (attempt, _) = connected(&mut c, Instant::ZERO);
        c.handle_message(
            Instant::ZERO,
            attempt,
            ClientReply::Error {
                request_id: Some(RequestId(op.0)),
                code: ErrorCode::JobNotFound,
                message: "no job".into(),
            },
        );
        assert!(matches!(
            done(&drain(&mut c)).as_slice(),
            [(
                _,
                Err(ClientError::Server {
                    code: ErrorCode::JobNotFound,
                    ..
                })
            )]
        ));
    }
}
