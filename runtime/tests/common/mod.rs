//! Shared helpers for the end-to-end tests: temp data dirs, coordinators and real workers on
//! ephemeral ports with millisecond timeouts, clients, bounded polling, and a protocol-level
//! "fake worker" for precise fault injection.
//!
//! Nothing here sleeps and hopes: every wait polls a condition up to a bounded deadline and
//! fails with a message naming the condition and the last thing observed.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herder_core::client::ClientConfig;
use herder_core::coordinator::CoordinatorConfig;
use herder_core::ids::{Attempt, Incarnation, JobId, LeaseId, WorkerId};
use herder_core::job::JobState;
use herder_core::limits::FRAME_BYTES_MAX_DEFAULT;
use herder_core::protocol::codec::{encode_frame, FrameDecoder, FrameError};
use herder_core::protocol::{
    AttemptOutcome, CancelReason, CoordinatorToWorker, JobView, RunningAttempt,
    WorkerToCoordinator, WorkerView,
};
use herder_core::tasks::{TaskOutput, TaskSpec};
use herder_core::worker::WorkerConfig;
use herder_runtime::client::{HerderClient, SubmitOptions};
use herder_runtime::coordinator::{self, CoordinatorError, CoordinatorHandle, CoordinatorOptions};
use herder_runtime::worker::{self, WorkerHandle, WorkerOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Heartbeat interval the coordinators under test ask for (and the fake workers use).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(50);
/// Silence after which a worker is declared lost. Generous for a loaded 2-core machine.
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_millis(500);
/// Default bound for "eventually" conditions.
pub const DEADLINE: Duration = Duration::from_secs(20);
/// Bound for conditions that must hold quickly (a message that is already on its way).
pub const SHORT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Temp data dirs
// ---------------------------------------------------------------------------------------------

pub use herder_runtime::testing::TestDir;

// ---------------------------------------------------------------------------------------------
// Coordinators, workers, clients
// ---------------------------------------------------------------------------------------------

/// A coordinator configuration with millisecond-scale timeouts.
pub fn fast_config() -> CoordinatorConfig {
    CoordinatorConfig {
        task_timeout: Duration::from_secs(60),
        heartbeat_interval: HEARTBEAT_INTERVAL,
        heartbeat_timeout: HEARTBEAT_TIMEOUT,
        default_max_attempts: 3,
        retry_base: Duration::from_millis(10),
        retry_max: Duration::from_millis(50),
        ..CoordinatorConfig::default()
    }
}

fn localhost_any() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

pub async fn try_start_coordinator(
    config: CoordinatorConfig,
    data_dir: &Path,
    worker_addr: SocketAddr,
    client_addr: SocketAddr,
) -> Result<CoordinatorHandle, CoordinatorError> {
    coordinator::start(CoordinatorOptions {
        config,
        data_dir: data_dir.to_owned(),
        worker_addr,
        client_addr,
        peer_addr: None,
        peers: Default::default(),
        seed: None,
        limits: Default::default(),
        credentials: Default::default(),
    })
    .await
}

/// Starts a coordinator on ephemeral ports of 127.0.0.1, a peer port among them, whose ports
/// check `credentials`.
pub async fn start_checking(
    config: CoordinatorConfig,
    data_dir: &Path,
    credentials: herder_runtime::auth::ServerCredentials,
) -> CoordinatorHandle {
    coordinator::start(CoordinatorOptions {
        config,
        data_dir: data_dir.to_owned(),
        worker_addr: localhost_any(),
        client_addr: localhost_any(),
        peer_addr: Some(localhost_any()),
        peers: Default::default(),
        seed: None,
        limits: Default::default(),
        credentials,
    })
    .await
    .unwrap_or_else(|e| panic!("coordinator failed to start: {e}"))
}

/// `herder_auth_refusals_total{port}` as the coordinator's metrics say now.
pub async fn auth_refusals(coordinator: &CoordinatorHandle, port: &str) -> u64 {
    let text = coordinator
        .observer()
        .metrics_text()
        .await
        .expect("the coordinator runs");
    let prefix = format!("herder_auth_refusals_total{{port=\"{port}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Starts a coordinator on ephemeral ports of 127.0.0.1.
pub async fn start_coordinator(config: CoordinatorConfig, data_dir: &Path) -> CoordinatorHandle {
    try_start_coordinator(config, data_dir, localhost_any(), localhost_any())
        .await
        .unwrap_or_else(|e| panic!("coordinator failed to start: {e}"))
}

/// Starts a coordinator on the same data dir and ports as a previous one that was shut down.
/// The old listeners are released asynchronously, so a bind failure is retried (bounded).
pub async fn restart_coordinator(
    config: CoordinatorConfig,
    data_dir: &Path,
    worker_addr: SocketAddr,
    client_addr: SocketAddr,
) -> CoordinatorHandle {
    let deadline = tokio::time::Instant::now() + SHORT;
    loop {
        match try_start_coordinator(config.clone(), data_dir, worker_addr, client_addr).await {
            Ok(handle) => {
                assert_eq!(handle.worker_addr(), worker_addr);
                assert_eq!(handle.client_addr(), client_addr);
                return handle;
            }
            Err(CoordinatorError::Bind { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!(
                "coordinator failed to restart on {}: {e}",
                data_dir.display()
            ),
        }
    }
}

/// Starts a real worker with fast reconnects.
pub fn start_worker(id: &str, capacity: u32, coordinator_worker_addr: SocketAddr) -> WorkerHandle {
    let mut config = WorkerConfig::new(
        worker_id(id),
        capacity,
        vec![coordinator_worker_addr.to_string()],
    );
    config.reconnect_base = Duration::from_millis(20);
    config.reconnect_max = Duration::from_millis(200);
    config.connect_timeout = Duration::from_secs(2);
    worker::start(WorkerOptions::new(config))
        .unwrap_or_else(|e| panic!("worker {id} failed to start: {e}"))
}

pub fn worker_id(id: &str) -> WorkerId {
    WorkerId::parse(id).unwrap_or_else(|e| panic!("bad worker id {id}: {e}"))
}

pub fn client_config(client_addr: SocketAddr) -> ClientConfig {
    ClientConfig::new(vec![client_addr.to_string()])
}

pub fn client(client_addr: SocketAddr) -> HerderClient {
    HerderClient::new(client_config(client_addr))
}

// ---------------------------------------------------------------------------------------------
// Bounded polling
// ---------------------------------------------------------------------------------------------

/// Polls `check` until it returns `Ok`, at most `timeout`. `Err` carries the latest observation,
/// which is reported if the condition never holds.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(value) => return value,
            Err(last) => last,
        };
        if tokio::time::Instant::now() >= deadline {
            panic!("condition never held within {timeout:?}: {what}; last observed: {last}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn submit(client: &HerderClient, task: TaskSpec) -> JobId {
    submit_with(client, task, SubmitOptions::default()).await
}

pub async fn submit_with(client: &HerderClient, task: TaskSpec, options: SubmitOptions) -> JobId {
    match client.submit(&task, options).await {
        Ok(submitted) => {
            assert!(
                !submitted.existing,
                "a fresh submission must not be reported as existing"
            );
            submitted.job_id
        }
        Err(e) => panic!("submission of {task:?} failed: {e}"),
    }
}

pub fn attempts(n: u32) -> SubmitOptions {
    SubmitOptions {
        partitions: None,
        max_attempts: Some(n),
        idempotency_key: None,
        timeout_millis: None,
        fairness_key: None,
        priority: None,
        queue: None,
        delay_millis: None,
        run_at_unix_ms: None,
        retry_of: None,
        after: Vec::new(),
        after_any_outcome: false,
    }
}

pub async fn status(client: &HerderClient, job_id: JobId) -> JobView {
    client
        .status(job_id)
        .await
        .unwrap_or_else(|e| panic!("status of {job_id} failed: {e}"))
}

/// Waits (server-side WAIT, bounded) until the job is terminal.
pub async fn wait_terminal(client: &HerderClient, job_id: JobId) -> JobView {
    let timeout = DEADLINE.as_millis() as u64;
    let (job, timed_out) = client
        .wait(job_id, Some(timeout))
        .await
        .unwrap_or_else(|e| panic!("wait for {job_id} failed: {e}"));
    assert!(
        !timed_out && job.state.is_terminal(),
        "job {job_id} did not become terminal within {timeout} ms: {job:?}"
    );
    job
}

/// Polls STATUS until `accept` holds for the job.
pub async fn wait_job<F>(client: &HerderClient, job_id: JobId, what: &str, mut accept: F) -> JobView
where
    F: FnMut(&JobView) -> bool,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let last = match client.status(job_id).await {
            Ok(job) if accept(&job) => return job,
            Ok(job) => format!("{job:?}"),
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            panic!("condition never held within {DEADLINE:?}: {what}; last observed: {last}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the job is RUNNING (optionally on a given worker).
pub async fn wait_running(client: &HerderClient, job_id: JobId, on: Option<&str>) -> JobView {
    wait_job(
        client,
        job_id,
        &format!("job {job_id} RUNNING on {on:?}"),
        |job| {
            job.state == JobState::Running
                && on.is_none_or(|w| job.worker.as_ref().map(WorkerId::as_str) == Some(w))
        },
    )
    .await
}

/// Polls WORKERS until `accept` holds for the list.
pub async fn wait_workers<F>(client: &HerderClient, what: &str, mut accept: F) -> Vec<WorkerView>
where
    F: FnMut(&[WorkerView]) -> bool,
{
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let last = match client.workers().await {
            Ok(workers) if accept(&workers) => return workers,
            Ok(workers) => format!("{workers:?}"),
            Err(e) => e.to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            panic!("condition never held within {DEADLINE:?}: {what}; last observed: {last}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until every named worker is registered and alive.
pub async fn wait_alive(client: &HerderClient, ids: &[&str]) -> Vec<WorkerView> {
    wait_workers(client, &format!("workers {ids:?} alive"), |workers| {
        ids.iter()
            .all(|id| workers.iter().any(|w| w.id.as_str() == *id && w.alive))
    })
    .await
}

pub fn sha256_hex(text: &str) -> String {
    match herder_core::tasks::execute(&TaskSpec::Sha256 { text: text.into() }, Attempt(1)) {
        Ok(TaskOutput::Sha256 { hex }) => hex,
        other => panic!("sha256 task did not produce a digest: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Raw frames
// ---------------------------------------------------------------------------------------------

pub fn frame<M: serde::Serialize>(message: &M) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(message, FRAME_BYTES_MAX_DEFAULT, &mut out).expect("message fits a frame");
    out
}

/// A frame around arbitrary payload bytes.
pub fn raw_frame(payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

/// Reads from `stream` until it yields one whole message of type `M` (returned) or the peer
/// closes (`None`). Panics if neither happens within `timeout` or the bytes do not decode.
pub async fn read_one<M: herder_core::protocol::codec::WireMessage>(
    stream: &mut TcpStream,
    timeout: Duration,
) -> Option<M> {
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
    let mut chunk = vec![0u8; 64 * 1024];
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match decoder.next_message::<M>() {
            Ok(Some(message)) => return Some(message),
            Ok(None) => {}
            Err(e) => panic!("peer sent an undecodable frame: {e}"),
        }
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return None,
            Ok(Ok(n)) => decoder.extend(&chunk[..n]),
            Err(_) => panic!("no message and no close within {timeout:?}"),
        }
    }
}

/// Asserts the peer closes the connection (EOF or reset) within `timeout`, discarding anything
/// else it sends.
pub async fn expect_eof(stream: &mut TcpStream, timeout: Duration, what: &str) {
    let mut chunk = vec![0u8; 64 * 1024];
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return,
            Ok(Ok(_)) => {}
            Err(_) => panic!("{what}: the connection was not closed within {timeout:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The fake worker
// ---------------------------------------------------------------------------------------------

/// A TASK_ASSIGN as the fake worker received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub job_id: JobId,
    pub lease_id: LeaseId,
    pub attempt: Attempt,
    pub max_attempts: u32,
    pub task: TaskSpec,
    pub timeout_millis: u64,
}

impl Assignment {
    fn from_message(message: &CoordinatorToWorker) -> Option<Assignment> {
        match message {
            CoordinatorToWorker::TaskAssign {
                job_id,
                lease_id,
                attempt,
                max_attempts,
                task,
                timeout_millis,
                ..
            } => Some(Assignment {
                job_id: *job_id,
                lease_id: *lease_id,
                attempt: *attempt,
                max_attempts: *max_attempts,
                task: task.clone(),
                timeout_millis: *timeout_millis,
            }),
            _ => None,
        }
    }
}

#[derive(Debug)]
enum FakeEvent {
    Message(CoordinatorToWorker),
    Malformed(FrameError),
    Closed(String),
}

pub fn fresh_incarnation() -> Incarnation {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    Incarnation(
        0xFA4E_0000_0000_0000
            | (u64::from(std::process::id()) << 16)
            | NEXT.fetch_add(1, Ordering::Relaxed),
    )
}

/// A worker that speaks the protocol over a raw socket and does exactly what the test says:
/// register, heartbeat (or go silent while keeping the socket open), receive assignments,
/// send any result with any lease, and drop the connection abruptly.
pub struct FakeWorker {
    pub id: WorkerId,
    pub incarnation: Incarnation,
    writer: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    events: mpsc::UnboundedReceiver<FakeEvent>,
    backlog: VecDeque<CoordinatorToWorker>,
    heartbeating: Arc<AtomicBool>,
    auto_complete: Arc<AtomicBool>,
    heartbeat_acks: Arc<AtomicUsize>,
    /// Every TASK_ASSIGN ever received on this connection.
    assigned: Arc<Mutex<Vec<Assignment>>>,
    closed: bool,
    reader: JoinHandle<()>,
    beater: JoinHandle<()>,
}

impl FakeWorker {
    /// Opens a connection (nothing is sent yet).
    pub async fn connect(addr: SocketAddr, id: &str, incarnation: Incarnation) -> FakeWorker {
        let stream = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("fake worker {id} cannot connect to {addr}: {e}"));
        let _ = stream.set_nodelay(true);
        let (mut read_half, write_half) = stream.into_split();
        let writer = Arc::new(tokio::sync::Mutex::new(write_half));
        let (tx, events) = mpsc::unbounded_channel();
        let heartbeating = Arc::new(AtomicBool::new(false));
        let auto_complete = Arc::new(AtomicBool::new(false));
        let heartbeat_acks = Arc::new(AtomicUsize::new(0));
        let assigned = Arc::new(Mutex::new(Vec::new()));

        let reader = {
            let writer = writer.clone();
            let auto_complete = auto_complete.clone();
            let heartbeat_acks = heartbeat_acks.clone();
            let assigned = assigned.clone();
            tokio::spawn(async move {
                let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
                let mut chunk = vec![0u8; 64 * 1024];
                loop {
                    let n = match read_half.read(&mut chunk).await {
                        Ok(0) => {
                            let _ = tx.send(FakeEvent::Closed("closed by coordinator".into()));
                            return;
                        }
                        Ok(n) => n,
                        Err(e) => {
                            let _ = tx.send(FakeEvent::Closed(e.to_string()));
                            return;
                        }
                    };
                    decoder.extend(&chunk[..n]);
                    loop {
                        match decoder.next_message::<CoordinatorToWorker>() {
                            Ok(Some(CoordinatorToWorker::HeartbeatAck { .. })) => {
                                heartbeat_acks.fetch_add(1, Ordering::SeqCst);
                            }
                            Ok(Some(message)) => {
                                if let Some(assignment) = Assignment::from_message(&message) {
                                    assigned.lock().expect("lock").push(assignment.clone());
                                    if auto_complete.load(Ordering::SeqCst) {
                                        let outcome = match herder_core::tasks::execute(
                                            &assignment.task,
                                            assignment.attempt,
                                        ) {
                                            Ok(output) => AttemptOutcome::Succeeded { output },
                                            Err(failure) => AttemptOutcome::Failed {
                                                permanent: false,
                                                error: failure.message,
                                            },
                                        };
                                        let result = WorkerToCoordinator::TaskResult {
                                            job_id: assignment.job_id,
                                            lease_id: assignment.lease_id,
                                            outcome,
                                        };
                                        let _ =
                                            writer.lock().await.write_all(&frame(&result)).await;
                                    }
                                }
                                let _ = tx.send(FakeEvent::Message(message));
                            }
                            Ok(None) => break,
                            Err(e) => {
                                let _ = tx.send(FakeEvent::Malformed(e));
                                return;
                            }
                        }
                    }
                }
            })
        };
        let beater = {
            let writer = writer.clone();
            let heartbeating = heartbeating.clone();
            tokio::spawn(async move {
                let heartbeat = frame(&WorkerToCoordinator::Heartbeat {});
                loop {
                    tokio::time::sleep(HEARTBEAT_INTERVAL).await;
                    if heartbeating.load(Ordering::SeqCst) {
                        let _ = writer.lock().await.write_all(&heartbeat).await;
                    }
                }
            })
        };
        FakeWorker {
            id: worker_id(id),
            incarnation,
            writer,
            events,
            backlog: VecDeque::new(),
            heartbeating,
            auto_complete,
            heartbeat_acks,
            assigned,
            closed: false,
            reader,
            beater,
        }
    }

    /// Connects, registers with a fresh incarnation, expects REGISTERED and starts heartbeating.
    pub async fn start(addr: SocketAddr, id: &str, capacity: u32) -> FakeWorker {
        FakeWorker::rejoin(addr, id, fresh_incarnation(), capacity, Vec::new()).await
    }

    /// Connects as the given process (incarnation) reporting `running`, expects REGISTERED and
    /// starts heartbeating.
    pub async fn rejoin(
        addr: SocketAddr,
        id: &str,
        incarnation: Incarnation,
        capacity: u32,
        running: Vec<RunningAttempt>,
    ) -> FakeWorker {
        let mut fake = FakeWorker::connect(addr, id, incarnation).await;
        fake.register(capacity, running).await;
        fake.set_heartbeating(true);
        fake
    }

    /// Sends REGISTER and expects REGISTERED.
    pub async fn register(&mut self, capacity: u32, running: Vec<RunningAttempt>) {
        self.send(&WorkerToCoordinator::Register {
            draining: false,
            tasks: herder_core::protocol::builtin_task_names(),
            worker_id: self.id.clone(),
            incarnation: self.incarnation,
            capacity,
            prefetch: 0,
            running,
            finished: Vec::new(),
            queues: None,
        })
        .await;
        let id = self.id.clone();
        self.expect(&format!("REGISTERED for {id}"), SHORT, |m| match m {
            CoordinatorToWorker::Registered { .. } => Some(()),
            CoordinatorToWorker::RegisterRejected { message, .. } => {
                panic!("registration of {id} rejected: {message}")
            }
            _ => None,
        })
        .await;
    }

    pub fn set_heartbeating(&self, on: bool) {
        self.heartbeating.store(on, Ordering::SeqCst);
    }

    /// Answer every TASK_ASSIGN at once with the task's real result.
    pub fn set_auto_complete(&self, on: bool) {
        self.auto_complete.store(on, Ordering::SeqCst);
    }

    pub fn heartbeat_acks(&self) -> usize {
        self.heartbeat_acks.load(Ordering::SeqCst)
    }

    pub fn assignments(&self) -> Vec<Assignment> {
        self.assigned.lock().expect("lock").clone()
    }

    pub async fn send(&self, message: &WorkerToCoordinator) {
        self.send_raw(&frame(message)).await;
    }

    pub async fn send_raw(&self, bytes: &[u8]) {
        self.writer
            .lock()
            .await
            .write_all(bytes)
            .await
            .unwrap_or_else(|e| panic!("fake worker {} cannot send: {e}", self.id));
    }

    pub async fn send_result(&self, job_id: JobId, lease_id: LeaseId, outcome: AttemptOutcome) {
        self.send(&WorkerToCoordinator::TaskResult {
            job_id,
            lease_id,
            outcome,
        })
        .await;
    }

    pub async fn succeed(&self, assignment: &Assignment, output: TaskOutput) {
        self.send_result(
            assignment.job_id,
            assignment.lease_id,
            AttemptOutcome::Succeeded { output },
        )
        .await;
    }

    /// The first message (already received or arriving within `timeout`) for which `pick`
    /// returns `Some`. Other messages are kept for later expectations; heartbeat acks are only
    /// counted.
    pub async fn expect<T, F>(&mut self, what: &str, timeout: Duration, mut pick: F) -> T
    where
        F: FnMut(&CoordinatorToWorker) -> Option<T>,
    {
        if let Some(pos) = self.backlog.iter().position(|m| pick(m).is_some()) {
            let message = self.backlog.remove(pos).expect("position is valid");
            return pick(&message).expect("picked before");
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let event = match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(event)) => event,
                Ok(None) => panic!(
                    "fake worker {}: reader gone while waiting for {what}",
                    self.id
                ),
                Err(_) => panic!(
                    "fake worker {}: no {what} within {timeout:?}; unclaimed messages: {:?}",
                    self.id, self.backlog
                ),
            };
            match event {
                FakeEvent::Message(message) => {
                    if let Some(value) = pick(&message) {
                        return value;
                    }
                    self.backlog.push_back(message);
                }
                FakeEvent::Malformed(e) => panic!(
                    "fake worker {}: coordinator sent a bad frame ({e}) while waiting for {what}",
                    self.id
                ),
                FakeEvent::Closed(reason) => {
                    self.closed = true;
                    panic!(
                        "fake worker {}: connection closed ({reason}) while waiting for {what}; unclaimed messages: {:?}",
                        self.id, self.backlog
                    )
                }
            }
        }
    }

    pub async fn expect_assign(&mut self) -> Assignment {
        self.expect("TASK_ASSIGN", DEADLINE, Assignment::from_message)
            .await
    }

    /// Expects TASK_CANCEL for `lease_id`; returns its reason.
    pub async fn expect_cancel(&mut self, lease_id: LeaseId) -> CancelReason {
        self.expect(
            &format!("TASK_CANCEL for lease {lease_id}"),
            SHORT,
            |m| match m {
                CoordinatorToWorker::TaskCancel {
                    lease_id: l,
                    reason,
                    ..
                } if *l == lease_id => Some(*reason),
                _ => None,
            },
        )
        .await
    }

    /// Expects RESULT_ACK for `lease_id`; returns `accepted`.
    pub async fn expect_ack(&mut self, lease_id: LeaseId) -> bool {
        self.expect(
            &format!("RESULT_ACK for lease {lease_id}"),
            SHORT,
            |m| match m {
                CoordinatorToWorker::ResultAck {
                    lease_id: l,
                    accepted,
                    ..
                } if *l == lease_id => Some(*accepted),
                _ => None,
            },
        )
        .await
    }

    /// Expects the coordinator to close the connection within `timeout` (messages are kept).
    pub async fn expect_closed(&mut self, timeout: Duration) {
        if self.closed {
            return;
        }
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Some(FakeEvent::Message(m))) => self.backlog.push_back(m),
                Ok(Some(FakeEvent::Malformed(_))) | Ok(Some(FakeEvent::Closed(_))) | Ok(None) => {
                    self.closed = true;
                    return;
                }
                Err(_) => panic!(
                    "fake worker {}: connection still open after {timeout:?}",
                    self.id
                ),
            }
        }
    }

    /// Messages received and not claimed by an expectation (heartbeat acks excluded).
    pub fn unclaimed(&mut self) -> Vec<CoordinatorToWorker> {
        while let Ok(event) = self.events.try_recv() {
            if let FakeEvent::Message(m) = event {
                self.backlog.push_back(m);
            }
        }
        self.backlog.iter().cloned().collect()
    }

    /// Drops the connection abruptly, like a crashed process.
    pub async fn disconnect(mut self) {
        self.reader.abort();
        self.beater.abort();
        let _ = (&mut self.reader).await;
        let _ = (&mut self.beater).await;
        // The tasks' clones of the write half are gone; dropping the last one closes the socket.
    }
}

impl Drop for FakeWorker {
    fn drop(&mut self) {
        self.reader.abort();
        self.beater.abort();
    }
}
