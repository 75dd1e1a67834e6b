//! The coordinator process: two TCP listeners, one single-writer driver for the core
//! `Coordinator`, and a store thread doing group commit.
//!
//! ```text
//!  worker port ─accept─> reader tasks ─┐                         ┌─> writer tasks ─> sockets
//!  client port ─accept─> reader tasks ─┼─> inputs ─> driver ─────┤
//!                       timers ────────┘     │  ^                └─> store thread (SQLite)
//!                                            │  └── "batch N durable" ───────┘
//!                                            └─> tracing (events)
//! ```
//!
//! The driver is the only code that touches the `Coordinator`. It waits for the next input, the
//! next timer, a durability report or shutdown; feeds it in; and performs every output. The store
//! thread takes every batch queued while it was busy and commits them in one transaction, then
//! reports the highest batch id durable.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use herder_core::coordinator::{
    BatchId, Coordinator, CoordinatorConfig, Event, Link, Output, PersistBatch, RecoveryError,
};
use herder_core::ids::ConnectionId;
use herder_core::protocol::codec::FrameError;
use herder_core::protocol::{
    ClientReply, ClientRequest, CoordinatorToWorker, ErrorCode, WorkerToCoordinator,
};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::clock::{os_seed, sleep_until, Clock};
use crate::net::{open_connection, Inbound, Outbound, SendError};
use crate::store::{Store, StoreError};

/// Inputs waiting for the driver before readers are made to wait (TCP backpressure).
const INPUT_QUEUE_MAX: usize = 16_384;
/// Inputs the driver takes in one go before draining outputs.
const INPUT_BURST_MAX: usize = 512;

#[derive(Clone, Debug)]
pub struct CoordinatorOptions {
    pub config: CoordinatorConfig,
    pub data_dir: PathBuf,
    pub worker_addr: SocketAddr,
    pub client_addr: SocketAddr,
    /// Seed for the coordinator's RNG; `None` draws one from the OS (the normal case).
    pub seed: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot recover from the stored state: {0}")]
    Recovery(#[from] RecoveryError),
    #[error("cannot listen on {addr} for {what}: {source} (is another coordinator running there? pick another port)")]
    Bind {
        addr: SocketAddr,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("store thread failed: {0}")]
    StoreThread(String),
}

enum Input {
    Opened(ConnectionId, Outbound),
    Worker(ConnectionId, Inbound<WorkerToCoordinator>),
    Client(ConnectionId, Inbound<ClientRequest>),
}

/// A running coordinator.
pub struct CoordinatorHandle {
    worker_addr: SocketAddr,
    client_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<Result<(), CoordinatorError>>,
}

impl CoordinatorHandle {
    pub fn worker_addr(&self) -> SocketAddr {
        self.worker_addr
    }

    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// Stops accepting, lets the store finish what it was given, and returns.
    pub async fn shutdown(self) -> Result<(), CoordinatorError> {
        let _ = self.shutdown.send(true);
        self.wait().await
    }

    /// Runs until shut down (or until the store fails).
    pub async fn wait(self) -> Result<(), CoordinatorError> {
        match self.task.await {
            Ok(result) => result,
            Err(join) => Err(CoordinatorError::StoreThread(join.to_string())),
        }
    }

    /// A sender that stops the coordinator when `true` is sent (for signal handlers).
    pub fn shutdown_sender(&self) -> watch::Sender<bool> {
        self.shutdown.clone()
    }
}

/// Opens the store, recovers, binds both ports and starts serving.
pub async fn start(options: CoordinatorOptions) -> Result<CoordinatorHandle, CoordinatorError> {
    let CoordinatorOptions {
        config,
        data_dir,
        worker_addr,
        client_addr,
        seed,
    } = options;
    let max_frame_bytes = config.max_frame_bytes;
    let clock = Clock::new();
    let store = Store::open(&data_dir)?;
    let durable = store.load()?;
    let seed = seed.unwrap_or_else(os_seed);
    let coordinator = Coordinator::recover(config, seed, clock.now(), durable)?;
    tracing::info!(
        data = %store.path().display(),
        "Coordinator store opened"
    );

    let worker_listener =
        TcpListener::bind(worker_addr)
            .await
            .map_err(|source| CoordinatorError::Bind {
                addr: worker_addr,
                what: "workers",
                source,
            })?;
    let client_listener =
        TcpListener::bind(client_addr)
            .await
            .map_err(|source| CoordinatorError::Bind {
                addr: client_addr,
                what: "clients",
                source,
            })?;
    let worker_addr = worker_listener.local_addr().unwrap_or(worker_addr);
    let client_addr = client_listener.local_addr().unwrap_or(client_addr);
    tracing::info!(%worker_addr, %client_addr, "Coordinator listening");

    let (input_tx, input_rx) = mpsc::channel(INPUT_QUEUE_MAX);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let next_conn = Arc::new(AtomicU64::new(1));
    let worker_accept = tokio::spawn(accept_loop(
        worker_listener,
        Link::Worker,
        max_frame_bytes,
        input_tx.clone(),
        next_conn.clone(),
        shutdown_rx.clone(),
    ));
    let client_accept = tokio::spawn(accept_loop(
        client_listener,
        Link::Client,
        max_frame_bytes,
        input_tx,
        next_conn,
        shutdown_rx.clone(),
    ));

    let (batch_tx, batch_rx) = std::sync::mpsc::channel::<PersistBatch>();
    let (durable_tx, durable_rx) = mpsc::unbounded_channel::<Result<BatchId, String>>();
    let store_thread = std::thread::Builder::new()
        .name("herder-store".into())
        .spawn(move || store_loop(store, batch_rx, durable_tx))
        .map_err(|e| CoordinatorError::StoreThread(e.to_string()))?;

    let task = tokio::spawn(async move {
        let driver = Driver {
            coordinator,
            clock,
            conns: HashMap::new(),
            batches: batch_tx,
        };
        let result = driver.run(input_rx, durable_rx, shutdown_rx).await;
        worker_accept.abort();
        client_accept.abort();
        // Dropping the driver closed the batch channel; the store thread finishes and exits.
        let joined = tokio::task::spawn_blocking(move || store_thread.join()).await;
        if !matches!(joined, Ok(Ok(()))) {
            tracing::error!("store thread did not exit cleanly");
        }
        result
    });
    Ok(CoordinatorHandle {
        worker_addr,
        client_addr,
        shutdown: shutdown_tx,
        task,
    })
}

async fn accept_loop(
    listener: TcpListener,
    link: Link,
    max_frame_bytes: usize,
    inputs: mpsc::Sender<Input>,
    next_conn: Arc<AtomicU64>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Usually descriptor exhaustion; back off briefly rather than spin.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let conn = ConnectionId(next_conn.fetch_add(1, Ordering::Relaxed));
        // The driver learns of the connection before the first message it carries can arrive.
        let (outbound, reader) = open_connection(stream, max_frame_bytes);
        if inputs.send(Input::Opened(conn, outbound)).await.is_err() {
            return;
        }
        match link {
            Link::Worker => {
                reader.start(inputs.clone(), move |inbound| Input::Worker(conn, inbound))
            }
            Link::Client => {
                reader.start(inputs.clone(), move |inbound| Input::Client(conn, inbound))
            }
        }
    }
}

fn store_loop(
    mut store: Store,
    batches: std::sync::mpsc::Receiver<PersistBatch>,
    durable: mpsc::UnboundedSender<Result<BatchId, String>>,
) {
    while let Ok(first) = batches.recv() {
        // Group commit: everything queued while the last transaction was committing goes into
        // this one.
        let mut group = vec![first];
        while let Ok(next) = batches.try_recv() {
            group.push(next);
        }
        let last = group.last().map(|b| b.id);
        let records = group.iter().flat_map(|batch| batch.records.iter());
        let result = store.write(records).map_err(|e| e.to_string());
        let failed = result.is_err();
        let report = result.and_then(|()| last.ok_or_else(|| "empty group".to_owned()));
        if durable.send(report).is_err() || failed {
            return;
        }
    }
}

struct Driver {
    coordinator: Coordinator,
    clock: Clock,
    conns: HashMap<ConnectionId, Outbound>,
    batches: std::sync::mpsc::Sender<PersistBatch>,
}

impl Driver {
    async fn run(
        mut self,
        mut inputs: mpsc::Receiver<Input>,
        mut durable: mpsc::UnboundedReceiver<Result<BatchId, String>>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), CoordinatorError> {
        self.drain()?;
        loop {
            let timer = self
                .coordinator
                .poll_timeout()
                .map(|at| self.clock.deadline(at));
            tokio::select! {
                biased;
                _ = shutdown.changed() => {
                    tracing::info!("Coordinator shutting down");
                    return Ok(());
                }
                report = durable.recv() => match report {
                    Some(Ok(batch)) => self.coordinator.handle_persisted(self.clock.now(), batch),
                    Some(Err(error)) => {
                        tracing::error!(%error, "Durable write failed; stopping so no unwritten state is ever acknowledged");
                        return Err(CoordinatorError::StoreThread(error));
                    }
                    None => return Err(CoordinatorError::StoreThread("store thread exited".into())),
                },
                input = inputs.recv() => {
                    let Some(input) = input else { return Ok(()) };
                    self.handle(input);
                    for _ in 1..INPUT_BURST_MAX {
                        match inputs.try_recv() {
                            Ok(input) => self.handle(input),
                            Err(_) => break,
                        }
                    }
                }
                _ = sleep_until(timer) => self.coordinator.handle_timeout(self.clock.now()),
            }
            self.drain()?;
        }
    }

    fn handle(&mut self, input: Input) {
        let now = self.clock.now();
        match input {
            Input::Opened(conn, outbound) => {
                self.conns.insert(conn, outbound);
            }
            Input::Worker(conn, Inbound::Message(message)) => {
                self.coordinator.handle_worker_message(now, conn, message)
            }
            Input::Client(conn, Inbound::Message(message)) => {
                self.coordinator.handle_client_message(now, conn, message)
            }
            Input::Worker(conn, Inbound::Malformed(error)) => {
                self.malformed(conn, Link::Worker, &error)
            }
            Input::Client(conn, Inbound::Malformed(error)) => {
                self.malformed(conn, Link::Client, &error)
            }
            Input::Worker(conn, Inbound::Closed(_)) | Input::Client(conn, Inbound::Closed(_)) => {
                self.conns.remove(&conn);
                self.coordinator.handle_closed(now, conn);
            }
        }
    }

    fn malformed(&mut self, conn: ConnectionId, link: Link, error: &FrameError) {
        self.coordinator
            .handle_malformed(self.clock.now(), conn, link, error);
    }

    /// Performs every pending output.
    fn drain(&mut self) -> Result<(), CoordinatorError> {
        while let Some(output) = self.coordinator.poll_output() {
            match output {
                Output::ToWorker { conn, message } => self.send_worker(conn, &message),
                Output::ToClient { conn, message } => self.send_client(conn, &message),
                Output::Close { conn } => {
                    if let Some(outbound) = self.conns.remove(&conn) {
                        outbound.close();
                    }
                }
                Output::Persist(batch) => {
                    if self.batches.send(batch).is_err() {
                        return Err(CoordinatorError::StoreThread("store thread exited".into()));
                    }
                }
                Output::Event(event) => log_event(&event),
                Output::ToPeer { .. } => {} // PEER-LINK: replaced when the peer port lands
            }
        }
        Ok(())
    }

    fn send_worker(&mut self, conn: ConnectionId, message: &CoordinatorToWorker) {
        if let Some(outbound) = self.conns.get(&conn) {
            if let Err(error) = outbound.send(message) {
                tracing::warn!(%conn, %error, "dropping worker connection");
                self.close_after_send_failure(conn);
            }
        }
    }

    fn send_client(&mut self, conn: ConnectionId, message: &ClientReply) {
        let Some(outbound) = self.conns.get(&conn) else {
            return;
        };
        match outbound.send(message) {
            Ok(()) => {}
            Err(SendError::Encode(error)) => {
                // A reply too large for one frame (e.g. a huge LIST): answer with a typed error.
                let fallback = ClientReply::Error {
                    request_id: message.request_id(),
                    code: ErrorCode::ReplyTooLarge,
                    message: format!("the reply does not fit in one frame ({error}); ask for less, e.g. a smaller --limit"),
                };
                if outbound.send(&fallback).is_err() {
                    self.close_after_send_failure(conn);
                }
            }
            Err(error) => {
                tracing::warn!(%conn, %error, "dropping client connection");
                self.close_after_send_failure(conn);
            }
        }
    }

    fn close_after_send_failure(&mut self, conn: ConnectionId) {
        if let Some(outbound) = self.conns.remove(&conn) {
            outbound.close();
        }
    }
}

/// Events become log lines; their `Display` already tells the story in seed A's words.
fn log_event(event: &Event) {
    match event {
        Event::StaleResultRejected { .. }
        | Event::WorkerLost { .. }
        | Event::WorkerRejected { .. }
        | Event::MalformedFrame { .. }
        | Event::JobFailed { .. }
        | Event::LeaseExpired { .. } => {
            tracing::warn!("{event}")
        }
        Event::SubmitRejected { .. } | Event::JobSubmitted { .. } => tracing::debug!("{event}"),
        _ => tracing::info!("{event}"),
    }
}
