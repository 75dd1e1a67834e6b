//! The coordinator process: three TCP listeners, one single-writer driver for the core
//! `Coordinator`, a store thread doing group commit, and one outbound link per other member of
//! the group.
//!
//! ```text
//!  worker port ─accept─> reader tasks ─┐                         ┌─> writer tasks ─> sockets
//!  client port ─accept─> reader tasks ─┤                         ├─> peer links ─> other members
//!  peer port ───accept─> peer readers ─┼─> inputs ─> driver ─────┤   (see `peer`)
//!                       timers ────────┘     │  ^                └─> store thread (SQLite)
//!                                            │  └── "batch N durable" ───────┘
//!                                            └─> tracing (events)
//! ```
//!
//! The driver is the only code that touches the `Coordinator`. It runs due timers first, then
//! waits for the next input, the next timer, a durability report or shutdown; feeds it in; and
//! performs every output. Inputs come on two queues, workers and members on one and clients on
//! the other, each bounded in messages and (through the readers' budgets) in bytes; while too
//! many log bytes wait for the disk the driver leaves the client queue alone, so clients are
//! pushed back by TCP and results keep flowing. The store thread takes every batch queued while
//! it was busy and commits them in one transaction, then reports the highest batch id durable.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use herder_core::auth::Caller;
use herder_core::coordinator::{
    BatchId, Coordinator, CoordinatorConfig, Event, Link, Output, PersistBatch, RecoveryError,
};
use herder_core::ids::{ConnectionId, NodeId};
use herder_core::job::JobState;
use herder_core::protocol::codec::{encode_frame, FrameError};
use herder_core::protocol::{
    ClientReply, ClientRequest, CoordinatorToWorker, ErrorCode, PeerMessage, WorkerToCoordinator,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::auth::{self as handshake, Port, RefusalLog, ServerCredentials};
use crate::clock::{os_seed, sleep_until, Clock};
use crate::metrics::{Metrics, Observation, WorkerObservation};
use crate::net::{
    open_connection_within, ConnectionSlot, ConnectionSlots, Inbound, InputBudget, InputBytes,
    Outbound, OutboundTotal, ReaderLimits, SendError, Unanswered,
};
use crate::peer::{self, Greeting, PeerLinks};
use crate::store::{Store, StoreError};
use crate::tls::Stream;

/// Inputs waiting for the driver on each of its two queues (workers and members; clients)
/// before readers are made to wait (TCP backpressure).
const INPUT_QUEUE_MAX: usize = 16_384;
/// Bytes of received frames the worker readers, and the client readers, may have queued for the
/// driver: beyond them a reader stops reading until the driver catches up, so the queues hold
/// at most this much whatever the frame sizes.
const WORKER_INPUT_BYTES_MAX: u32 = 16 * 1024 * 1024;
const CLIENT_INPUT_BYTES_MAX: u32 = 64 * 1024 * 1024;
/// Encoded log-entry bytes waiting for the disk beyond which the driver stops taking client
/// requests (workers' results and heartbeats, and other members' messages, keep flowing)
/// until the store catches up.
const UNWRITTEN_BYTES_MAX: u64 = 32 * 1024 * 1024;
/// The bounds on a coordinator's worker and client connections (docs/FAILURE_MODEL.md,
/// "Overload"); the defaults are those of the CLI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections each port (workers, clients) accepts; beyond them a new connection is
    /// sent a `TOO_MANY_CONNECTIONS` error and closed at once.
    pub per_port: usize,
    /// How long a new connection may take to send its first whole message before it is closed.
    pub first_message_within: std::time::Duration,
    /// How long one write may wait for a peer that does not read before the connection is
    /// closed and the core told.
    pub write_stall: std::time::Duration,
    /// Bytes queued for writing across every client connection; a send that would go beyond it
    /// closes the connection it was for (each connection, a worker's too, also has its own
    /// bound).
    pub outbound_bytes: usize,
    /// Requests one client connection may have read and not yet answered (above the waits it
    /// may park); beyond them its reader stops reading until an answer goes out.
    pub requests_in_flight: usize,
}

impl Default for ConnectionLimits {
    fn default() -> ConnectionLimits {
        ConnectionLimits {
            per_port: 4096,
            first_message_within: std::time::Duration::from_secs(10),
            write_stall: crate::net::WRITE_STALL_MAX,
            outbound_bytes: 256 * 1024 * 1024,
            requests_in_flight: 4096,
        }
    }
}
/// Connections the kernel may hold for a port before the coordinator accepts them (the kernel
/// caps it at `net.core.somaxconn`): a burst of connects waits here instead of being dropped.
const LISTEN_BACKLOG: u32 = 4096;
/// Reads (of 4 KiB) a refused connection's pending bytes get before it is closed.
const REFUSAL_DRAIN_READS_MAX: usize = 16;
/// At most one warning per port this often about refused connections (with their count), so a
/// flood of connects cannot flood the log.
const REFUSAL_WARNING_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// Inputs the driver takes in one go before draining outputs and running due timers.
const INPUT_BURST_MAX: usize = 512;

#[derive(Clone, Debug)]
pub struct CoordinatorOptions {
    /// `config.peers` names the other members of the group; `peers` below must give an address
    /// for exactly those. An empty `config.client_address` or `config.worker_address` is
    /// filled in with the address the listener got, unless it listens on every interface
    /// (then no host can be guessed, and the caller must say how others reach it).
    pub config: CoordinatorConfig,
    pub data_dir: PathBuf,
    pub worker_addr: SocketAddr,
    pub client_addr: SocketAddr,
    /// Where the other members connect (`--peer-port`). `None`: no peer listener, which only a
    /// group of one can do without.
    pub peer_addr: Option<SocketAddr>,
    /// The other members' peer addresses, as this member dials them.
    pub peers: BTreeMap<NodeId, String>,
    /// Seed for the coordinator's RNG; `None` draws one from the OS (the normal case).
    pub seed: Option<u64>,
    /// The bounds on its worker and client connections.
    pub limits: ConnectionLimits,
    /// What each port checks before a connection reaches the coordinator (nothing, by
    /// default: then every port must be on loopback, which the command line enforces).
    pub credentials: ServerCredentials,
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
    #[error("{0}")]
    Group(String),
    #[error("TLS: {0}")]
    Tls(String),
}

enum Input {
    /// A connection opened; a client's comes with the count of its requests not yet answered.
    Opened(ConnectionId, Outbound, Option<Unanswered>),
    /// A message and the input budget its frame holds until it has been handled.
    Worker(ConnectionId, Inbound<WorkerToCoordinator>, InputBytes),
    /// A client's request, with the caller its connection authenticated as.
    Client(
        ConnectionId,
        Arc<Caller>,
        Inbound<ClientRequest>,
        InputBytes,
    ),
    /// A message from another member, tagged with the member its connection's `HELLO` named.
    Peer(NodeId, PeerMessage),
    /// A scrape wants the gauges as they are now.
    Observe(oneshot::Sender<Observation>),
}

/// Reads a running coordinator's metrics (for the HTTP server's `/metrics`). Cloneable.
#[derive(Clone)]
pub struct Observer {
    inputs: mpsc::Sender<Input>,
    metrics: Arc<Metrics>,
}

impl Observer {
    /// The metrics in the Prometheus text format, or `None` once the coordinator has stopped.
    pub async fn metrics_text(&self) -> Option<String> {
        let (tx, rx) = oneshot::channel();
        self.inputs.send(Input::Observe(tx)).await.ok()?;
        let now = rx.await.ok()?;
        Some(self.metrics.encode(&now))
    }

    /// The gauges as they are now, or `None` once the coordinator has stopped.
    pub async fn observe(&self) -> Option<Observation> {
        let (tx, rx) = oneshot::channel();
        self.inputs.send(Input::Observe(tx)).await.ok()?;
        rx.await.ok()
    }
}

/// A coordinator's listening sockets, bound before it starts, so that the members of a group
/// started together (in tests, or `herder dev`) can learn each other's ports first.
pub struct Listeners {
    worker: TcpListener,
    client: TcpListener,
    peer: Option<TcpListener>,
}

impl Listeners {
    /// Binds the worker, client and (if given) peer addresses of `options`.
    pub async fn bind(options: &CoordinatorOptions) -> Result<Listeners, CoordinatorError> {
        let bind = |addr: SocketAddr, what: &'static str| async move {
            listen(addr).map_err(|source| CoordinatorError::Bind { addr, what, source })
        };
        let worker = bind(options.worker_addr, "workers").await?;
        let client = bind(options.client_addr, "clients").await?;
        let peer = match options.peer_addr {
            Some(addr) => Some(bind(addr, "other coordinators").await?),
            None => None,
        };
        Ok(Listeners {
            worker,
            client,
            peer,
        })
    }

    pub fn worker_addr(&self) -> Option<SocketAddr> {
        self.worker.local_addr().ok()
    }

    pub fn client_addr(&self) -> Option<SocketAddr> {
        self.client.local_addr().ok()
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer.as_ref().and_then(|l| l.local_addr().ok())
    }
}

/// A running coordinator.
pub struct CoordinatorHandle {
    worker_addr: SocketAddr,
    client_addr: SocketAddr,
    peer_addr: Option<SocketAddr>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<Result<(), CoordinatorError>>,
    observer: Observer,
}

impl CoordinatorHandle {
    pub fn worker_addr(&self) -> SocketAddr {
        self.worker_addr
    }

    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// Where the other members connect (`None` when this member has no peer listener).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer_addr
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

    /// What reads its metrics.
    pub fn observer(&self) -> Observer {
        self.observer.clone()
    }

    /// A sender that stops the coordinator when `true` is sent (for signal handlers).
    pub fn shutdown_sender(&self) -> watch::Sender<bool> {
        self.shutdown.clone()
    }
}

/// Binds the ports, opens the store, recovers and starts serving.
pub async fn start(options: CoordinatorOptions) -> Result<CoordinatorHandle, CoordinatorError> {
    let listeners = Listeners::bind(&options).await?;
    start_on(listeners, options).await
}

/// Like `start`, on listeners bound already (the addresses in `options` are not used).
pub async fn start_on(
    listeners: Listeners,
    options: CoordinatorOptions,
) -> Result<CoordinatorHandle, CoordinatorError> {
    let CoordinatorOptions {
        mut config,
        data_dir,
        peers,
        seed,
        limits,
        credentials,
        ..
    } = options;
    let Listeners {
        worker: worker_listener,
        client: client_listener,
        peer: peer_listener,
    } = listeners;
    if let (Some(tls), true) = (
        &credentials.tls,
        peer_listener.is_some() || !peers.is_empty(),
    ) {
        tls.require_ca()
            .map_err(|e| CoordinatorError::Tls(e.to_string()))?;
    }
    let worker_addr = worker_listener
        .local_addr()
        .map_err(|e| CoordinatorError::Group(format!("worker listener: {e}")))?;
    let client_addr = client_listener
        .local_addr()
        .map_err(|e| CoordinatorError::Group(format!("client listener: {e}")))?;
    let peer_addr = match &peer_listener {
        Some(listener) => Some(
            listener
                .local_addr()
                .map_err(|e| CoordinatorError::Group(format!("peer listener: {e}")))?,
        ),
        None => None,
    };
    check_group(&config, &peers, peer_addr)?;
    if config.client_address.is_empty() && !client_addr.ip().is_unspecified() {
        config.client_address = client_addr.to_string();
    }
    if config.worker_address.is_empty() && !worker_addr.ip().is_unspecified() {
        config.worker_address = worker_addr.to_string();
    }
    let max_frame_bytes = config.max_frame_bytes;
    let greeting = Greeting {
        node_id: config.node_id.clone(),
        client_address: config.client_address.clone(),
        worker_address: config.worker_address.clone(),
    };
    if !config.peers.is_empty() {
        greeting.check().map_err(CoordinatorError::Group)?;
    }
    let members: BTreeSet<NodeId> = config.peers.iter().cloned().collect();
    // Several members may share a process (`herder dev`, tests): their lines say whose they
    // are. A group of one logs as it always has.
    let span = if members.is_empty() {
        tracing::Span::none()
    } else {
        tracing::info_span!("coordinator", node = %greeting.node_id)
    };
    let clock = Clock::new();
    config.wall_clock_at_epoch = clock.wall_at_epoch();
    let store = Store::open(&data_dir)?;
    let durable = store.load()?;
    let seed = seed.unwrap_or_else(os_seed);
    let coordinator = Coordinator::recover(config, seed, clock.now(), durable)?;
    span.in_scope(|| {
        tracing::info!(
            data = %store.path().display(),
            "Coordinator store opened"
        );
        match peer_addr {
            Some(peer_addr) => tracing::info!(
                %worker_addr,
                %client_addr,
                %peer_addr,
                members = members.len() + 1,
                "Coordinator listening"
            ),
            None => tracing::info!(%worker_addr, %client_addr, "Coordinator listening"),
        }
    });

    // Workers and members on one queue, clients on another: the driver can stop taking client
    // requests while the disk catches up without holding back results and heartbeats.
    let (input_tx, input_rx) = mpsc::channel(INPUT_QUEUE_MAX);
    let (client_tx, client_rx) = mpsc::channel(INPUT_QUEUE_MAX);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let next_conn = Arc::new(AtomicU64::new(1));
    let metrics = Arc::new(Metrics::new());
    let observer = Observer {
        inputs: input_tx.clone(),
        metrics: metrics.clone(),
    };
    let outbound_total = OutboundTotal::new(limits.outbound_bytes);
    let refusals = RefusalLog::new(metrics.clone());
    let port = |link: Link, inputs: mpsc::Sender<Input>, budget: u32| PortContext {
        link,
        max_frame_bytes,
        inputs,
        budget: InputBudget::new(budget),
        outbound: outbound_total.clone(),
        limits,
        credentials: credentials.clone(),
        refusals: refusals.clone(),
    };
    let worker_accept = tokio::spawn(
        accept_loop(
            worker_listener,
            port(Link::Worker, input_tx.clone(), WORKER_INPUT_BYTES_MAX),
            ConnectionSlots::new(limits.per_port),
            next_conn.clone(),
            shutdown_rx.clone(),
        )
        .instrument(span.clone()),
    );
    let client_accept = tokio::spawn(
        accept_loop(
            client_listener,
            port(Link::Client, client_tx, CLIENT_INPUT_BYTES_MAX),
            ConnectionSlots::new(limits.per_port),
            next_conn,
            shutdown_rx.clone(),
        )
        .instrument(span.clone()),
    );
    let peer_accept = span.in_scope(|| {
        peer_listener.map(|listener| {
            peer::spawn_accept_loop(
                listener,
                members,
                max_frame_bytes,
                input_tx,
                Input::Peer,
                shutdown_rx.clone(),
                peer::PeerGate {
                    credentials: credentials.clone(),
                    refusals: refusals.clone(),
                },
            )
        })
    });
    let peer_links =
        span.in_scope(|| PeerLinks::start(greeting, &peers, max_frame_bytes, &credentials));

    let (batch_tx, batch_rx) = std::sync::mpsc::channel::<PersistBatch>();
    let (durable_tx, durable_rx) = mpsc::unbounded_channel::<Result<BatchId, String>>();
    let store_metrics = metrics.clone();
    let store_thread = std::thread::Builder::new()
        .name("herder-store".into())
        .spawn(move || store_loop(store, batch_rx, durable_tx, &store_metrics))
        .map_err(|e| CoordinatorError::StoreThread(e.to_string()))?;

    let stopped = shutdown_tx.clone();
    let task = tokio::spawn(
        async move {
            let driver = Driver {
                coordinator,
                clock,
                conns: HashMap::new(),
                unanswered: HashMap::new(),
                to_flush: Vec::new(),
                batches: batch_tx,
                peers: peer_links,
                metrics,
            };
            let result = driver
                .run(input_rx, client_rx, durable_rx, shutdown_rx)
                .await;
            // However the driver ended, every task serving a connection stops with it.
            let _ = stopped.send(true);
            worker_accept.abort();
            client_accept.abort();
            if let Some(peer_accept) = peer_accept {
                peer_accept.abort();
            }
            // Dropping the driver closed the batch channel; the store thread finishes and exits.
            let joined = tokio::task::spawn_blocking(move || store_thread.join()).await;
            if !matches!(joined, Ok(Ok(()))) {
                tracing::error!("store thread did not exit cleanly");
            }
            result
        }
        .instrument(span),
    );
    Ok(CoordinatorHandle {
        worker_addr,
        client_addr,
        peer_addr,
        shutdown: shutdown_tx,
        task,
        observer,
    })
}

/// A group needs a peer listener and an address for every other member, and nothing more.
fn check_group(
    config: &CoordinatorConfig,
    peers: &BTreeMap<NodeId, String>,
    peer_addr: Option<SocketAddr>,
) -> Result<(), CoordinatorError> {
    let configured: BTreeSet<&NodeId> = config.peers.iter().collect();
    let addressed: BTreeSet<&NodeId> = peers.keys().collect();
    if let Some(missing) = configured.difference(&addressed).next() {
        return Err(CoordinatorError::Group(format!(
            "member {missing} of the group has no peer address"
        )));
    }
    if let Some(extra) = addressed.difference(&configured).next() {
        return Err(CoordinatorError::Group(format!(
            "a peer address is given for {extra}, which is not a member of the group"
        )));
    }
    if !config.peers.is_empty() && peer_addr.is_none() {
        return Err(CoordinatorError::Group(
            "a member of a group of several needs a peer port for the others to connect to"
                .to_owned(),
        ));
    }
    Ok(())
}

/// Binds `addr` with room for [`LISTEN_BACKLOG`] connections waiting to be accepted.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Tells a connection beyond the port's bound why it is closed: one small frame, written
/// without waiting (a new socket's send buffer is empty, so it fits; if not, the close alone
/// still says it).
fn refuse(stream: &TcpStream, link: Link, open: usize, max_frame_bytes: usize) {
    let message = format!(
        "this port already has its maximum of {open} open connections; retry later, or raise --max-connections-per-port"
    );
    let code = ErrorCode::TooManyConnections;
    let mut frame = Vec::new();
    let encoded = match link {
        Link::Worker => encode_frame(
            &CoordinatorToWorker::Error { code, message },
            max_frame_bytes,
            &mut frame,
        ),
        Link::Client => encode_frame(
            &ClientReply::Error {
                request_id: None,
                code,
                message,
            },
            max_frame_bytes,
            &mut frame,
        ),
    };
    if encoded.is_ok() {
        let _ = stream.try_write(&frame);
    }
    // Bytes the peer sent already and nobody read would make the close a reset, which can
    // discard the frame before the peer reads it: read what has arrived (never waiting).
    let mut unread = [0u8; 4096];
    for _ in 0..REFUSAL_DRAIN_READS_MAX {
        match stream.try_read(&mut unread) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
}

/// Refused connections since the last warning about them.
#[derive(Default)]
struct Refusals {
    since_warning: u64,
    warned_at: Option<tokio::time::Instant>,
}

impl Refusals {
    fn count(&mut self, link: Link, open: usize) {
        self.since_warning += 1;
        let now = tokio::time::Instant::now();
        if self
            .warned_at
            .is_none_or(|at| now.duration_since(at) >= REFUSAL_WARNING_EVERY)
        {
            tracing::warn!(
                link = ?link,
                open,
                refused = self.since_warning,
                "Connections refused: this port already has its maximum of open connections"
            );
            self.since_warning = 0;
            self.warned_at = Some(now);
        }
    }
}

/// Everything the connections of one port share: where their inputs go, the bytes their
/// readers may have queued for the driver, the bytes queued for writing, the connection bounds
/// and what the port checks before it hands a connection over.
#[derive(Clone)]
struct PortContext {
    link: Link,
    max_frame_bytes: usize,
    inputs: mpsc::Sender<Input>,
    budget: InputBudget,
    /// Bytes queued for writing, shared by every client connection.
    outbound: OutboundTotal,
    /// The rest of the connection bounds.
    limits: ConnectionLimits,
    credentials: ServerCredentials,
    refusals: RefusalLog,
}

impl PortContext {
    fn port(&self) -> Port {
        match self.link {
            Link::Worker => Port::Worker,
            Link::Client => Port::Client,
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    context: PortContext,
    slots: ConnectionSlots,
    next_conn: Arc<AtomicU64>,
    mut shutdown: watch::Receiver<bool>,
) {
    let link = context.link;
    let mut refusals = Refusals::default();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => return,
        };
        let (stream, remote) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Usually descriptor exhaustion; back off briefly rather than spin.
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(slot) = slots.take() else {
            refuse(&stream, link, slots.open(), context.max_frame_bytes);
            refusals.count(link, slots.open());
            drop(stream);
            continue;
        };
        let conn = ConnectionId(next_conn.fetch_add(1, Ordering::Relaxed));
        let checks = context.credentials.policy(context.port()).is_some()
            || context.credentials.tls.is_some();
        if !checks {
            // A port that checks nothing hands the connection over at once, in order.
            let caller = Arc::new(Caller::anonymous());
            if !serve(stream.into(), conn, slot, caller, &context).await {
                return;
            }
            continue;
        }
        // TLS and the handshake run on a task of their own (holding the connection's slot),
        // so a slow or silent stranger holds up nobody else.
        let context = context.clone();
        tokio::spawn(
            async move {
                let within = context.limits.first_message_within;
                match handshake::admit(stream, context.port(), &context.credentials, within).await {
                    Ok((stream, caller)) => {
                        serve(stream, conn, slot, Arc::new(caller), &context).await;
                    }
                    Err(failure) => context.refusals.refused(context.port(), remote, &failure),
                }
            }
            .in_current_span(),
        );
    }
}

/// Hands an accepted (and, where the port checks credentials, authenticated) connection to the
/// driver and starts its reader. False once the driver is gone.
async fn serve(
    stream: Stream,
    conn: ConnectionId,
    slot: ConnectionSlot,
    caller: Arc<Caller>,
    context: &PortContext,
) -> bool {
    let link = context.link;
    // The driver learns of the connection before the first message it carries can arrive.
    // Only client connections share the total: a send refused under it closes the
    // connection it was for, and a worker must not be dropped (and its attempts charged)
    // because clients stopped reading. Each worker connection keeps its own bound.
    let shared = (link == Link::Client).then(|| context.outbound.clone());
    let (outbound, reader) = open_connection_within(
        stream,
        context.max_frame_bytes,
        shared,
        context.limits.write_stall,
    );
    // Every client request is answered exactly once, so a client's requests in flight
    // are bounded by counting them in and out (workers send no requests).
    let unanswered =
        (link == Link::Client).then(|| Unanswered::new(context.limits.requests_in_flight));
    if context
        .inputs
        .send(Input::Opened(conn, outbound, unanswered.clone()))
        .await
        .is_err()
    {
        return false;
    }
    let limits = ReaderLimits {
        budget: context.budget.clone(),
        first_message_within: context.limits.first_message_within,
        unanswered,
    };
    // The reader owns the slot (inside `wrap`): it is given back when the reader ends.
    match link {
        Link::Worker => reader.start_budgeted(
            context.inputs.clone(),
            move |inbound, bytes| {
                let _slot = &slot;
                Input::Worker(conn, inbound, bytes)
            },
            limits,
        ),
        Link::Client => reader.start_budgeted(
            context.inputs.clone(),
            move |inbound, bytes| {
                let _slot = &slot;
                Input::Client(conn, caller.clone(), inbound, bytes)
            },
            limits,
        ),
    }
    true
}

fn store_loop(
    mut store: Store,
    batches: std::sync::mpsc::Receiver<PersistBatch>,
    durable: mpsc::UnboundedSender<Result<BatchId, String>>,
    metrics: &Metrics,
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
        let count = group.iter().map(|batch| batch.records.len()).sum();
        let started = std::time::Instant::now();
        let result = store.write(records).map_err(|e| e.to_string());
        metrics.storage_commit(started.elapsed(), count);
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
    /// Requests read from each client connection and not yet answered.
    unanswered: HashMap<ConnectionId, Unanswered>,
    /// Connections with messages corked in this drain: each gets one write at its end.
    to_flush: Vec<ConnectionId>,
    batches: std::sync::mpsc::Sender<PersistBatch>,
    peers: PeerLinks,
    metrics: Arc<Metrics>,
}

impl Driver {
    async fn run(
        mut self,
        mut inputs: mpsc::Receiver<Input>,
        mut clients: mpsc::Receiver<Input>,
        mut durable: mpsc::UnboundedReceiver<Result<BatchId, String>>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<(), CoordinatorError> {
        self.drain()?;
        loop {
            // Timers first, whatever the input rate: each turn of the loop takes at most one
            // burst of inputs, so heartbeat loss, lease deadlines, retries and waits are never
            // held back by a flood.
            let timer = self
                .coordinator
                .poll_timeout()
                .map(|at| self.clock.deadline(at));
            if timer.is_some_and(|at| at <= tokio::time::Instant::now()) {
                self.coordinator.handle_timeout(self.clock.now());
                self.drain()?;
                continue;
            }
            // While the disk is behind, client requests wait in their queue (and then in TCP).
            let taking_clients = self.coordinator.unwritten_bytes() < UNWRITTEN_BYTES_MAX;
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
                    self.take_burst(&mut inputs, false);
                }
                input = clients.recv(), if taking_clients => {
                    let Some(input) = input else { return Ok(()) };
                    self.handle(input);
                    self.take_burst(&mut clients, true);
                }
                _ = sleep_until(timer) => self.coordinator.handle_timeout(self.clock.now()),
            }
            self.drain()?;
        }
    }

    /// Handles what else is queued on `queue`, up to a burst (and, for the client queue, only
    /// while the disk keeps up).
    fn take_burst(&mut self, queue: &mut mpsc::Receiver<Input>, clients: bool) {
        for _ in 1..INPUT_BURST_MAX {
            if clients && self.coordinator.unwritten_bytes() >= UNWRITTEN_BYTES_MAX {
                break;
            }
            match queue.try_recv() {
                Ok(input) => self.handle(input),
                Err(_) => break,
            }
        }
    }

    fn handle(&mut self, input: Input) {
        let now = self.clock.now();
        match input {
            Input::Opened(conn, outbound, unanswered) => {
                self.conns.insert(conn, outbound);
                if let Some(unanswered) = unanswered {
                    self.unanswered.insert(conn, unanswered);
                }
            }
            // The frame's budget is given back once its message is handled (`_bytes` drops).
            Input::Worker(conn, Inbound::Message(message), _bytes) => {
                self.coordinator.handle_worker_message(now, conn, message)
            }
            Input::Client(conn, caller, Inbound::Message(message), _bytes) => self
                .coordinator
                .handle_client_message(now, conn, &caller, message),
            Input::Worker(conn, Inbound::Malformed(error), _) => {
                self.malformed(conn, Link::Worker, &error)
            }
            Input::Client(conn, _, Inbound::Malformed(error), _) => {
                self.malformed(conn, Link::Client, &error)
            }
            Input::Worker(conn, Inbound::Closed(_), _)
            | Input::Client(conn, _, Inbound::Closed(_), _) => {
                self.conns.remove(&conn);
                self.unanswered.remove(&conn);
                self.coordinator.handle_closed(now, conn);
            }
            Input::Peer(from, message) => self.coordinator.handle_peer_message(now, &from, message),
            Input::Observe(answer) => {
                let _ = answer.send(self.observe());
            }
        }
    }

    /// The gauges a scrape reports, read now.
    fn observe(&self) -> Observation {
        let now = self.clock.now();
        let mut jobs_by_state = [0u64; 6];
        for job in self.coordinator.table().jobs() {
            if let Some(slot) = JobState::ALL.iter().position(|s| *s == job.state) {
                jobs_by_state[slot] += 1;
            }
        }
        let replica = self.coordinator.replica();
        Observation {
            jobs_by_state,
            term: replica.term().0,
            last_index: replica.last_index().0,
            commit_index: replica.committed_index().0,
            applied_index: replica.applied_index().0,
            is_leader: self.coordinator.is_acting_leader(),
            leader: replica.leader().map(|id| id.0.clone()),
            workers: self
                .coordinator
                .workers()
                .map(|w| WorkerObservation {
                    id: w.id.0.clone(),
                    alive: w.alive,
                    capacity: w.capacity,
                    running: u32::try_from(w.leases.len()).unwrap_or(u32::MAX),
                    heartbeat_age: now.saturating_since(w.last_heartbeat),
                })
                .collect(),
        }
    }

    fn malformed(&mut self, conn: ConnectionId, link: Link, error: &FrameError) {
        self.coordinator
            .handle_malformed(self.clock.now(), conn, link, error);
    }

    /// Performs every pending output; the messages for each connection leave together in one
    /// write at the end.
    fn drain(&mut self) -> Result<(), CoordinatorError> {
        let drained = self.drain_outputs();
        for conn in std::mem::take(&mut self.to_flush) {
            let Some(outbound) = self.conns.get(&conn) else {
                continue;
            };
            if let Err(error) = outbound.flush() {
                tracing::warn!(%conn, %error, "dropping connection");
                self.close_after_send_failure(conn);
            }
        }
        drained
    }

    fn drain_outputs(&mut self) -> Result<(), CoordinatorError> {
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
                Output::Event(event) => {
                    self.metrics.event(&event);
                    log_event(&event);
                }
                Output::ToPeer { to, message } => self.peers.send(&to, message),
            }
        }
        Ok(())
    }

    fn send_worker(&mut self, conn: ConnectionId, message: &CoordinatorToWorker) {
        if let Err(error) = self.cork(conn, message) {
            tracing::warn!(%conn, %error, "dropping worker connection");
            self.close_after_send_failure(conn);
        }
    }

    fn send_client(&mut self, conn: ConnectionId, message: &ClientReply) {
        if !self.conns.contains_key(&conn) {
            return;
        }
        if message.request_id().is_some() {
            if let Some(unanswered) = self.unanswered.get(&conn) {
                unanswered.answered();
            }
        }
        match self.cork(conn, message) {
            Ok(()) => {}
            Err(SendError::Encode(error)) => {
                // A reply too large for one frame (e.g. a huge LIST): answer with a typed error.
                let fallback = ClientReply::Error {
                    request_id: message.request_id(),
                    code: ErrorCode::ReplyTooLarge,
                    message: format!("the reply does not fit in one frame ({error}); ask for less, e.g. a smaller --limit"),
                };
                if self.cork(conn, &fallback).is_err() {
                    self.close_after_send_failure(conn);
                }
            }
            Err(error) => {
                tracing::warn!(%conn, %error, "dropping client connection");
                self.close_after_send_failure(conn);
            }
        }
    }

    /// Corks `message` on `conn` (nothing if it is gone), which then gets its write at the end
    /// of the drain.
    fn cork<M: serde::Serialize>(
        &mut self,
        conn: ConnectionId,
        message: &M,
    ) -> Result<(), SendError> {
        let Some(outbound) = self.conns.get(&conn) else {
            return Ok(());
        };
        if outbound.send_corked(message)? {
            self.to_flush.push(conn);
        }
        Ok(())
    }

    fn close_after_send_failure(&mut self, conn: ConnectionId) {
        if let Some(outbound) = self.conns.remove(&conn) {
            outbound.close();
        }
    }
}

/// Events become log lines; their `Display` already tells the story in plain words.
fn log_event(event: &Event) {
    match event {
        Event::StaleResultRejected { .. }
        | Event::WorkerLost { .. }
        | Event::WorkerRejected { .. }
        | Event::MalformedFrame { .. }
        | Event::JobFailed { .. }
        | Event::LeaseExpired { .. }
        | Event::SnapshotRefused { .. }
        | Event::FollowerLostEntries { .. }
        | Event::PeerIgnored { .. }
        | Event::PeerProtocolViolation { .. } => {
            tracing::warn!("{event}")
        }
        // A member cut off from the others pre-votes every election timeout; only real
        // elections are news.
        Event::ElectionStarted { pre_vote: true, .. } | Event::SubmitRejected { .. } => {
            tracing::debug!("{event}")
        }
        // Everything else, leader elected, took over, stepped down, elections, transfers and
        // snapshots included, is the story an operator follows.
        _ => tracing::info!("{event}"),
    }
}
