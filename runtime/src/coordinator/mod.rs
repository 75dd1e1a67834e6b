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

mod driver;
mod ports;
mod store_thread;

use driver::Driver;
use ports::{accept_loop, listen, PortContext};
use store_thread::store_loop;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use herder_core::auth::Caller;
use herder_core::coordinator::{
    BatchId, Coordinator, CoordinatorConfig, Link, PersistBatch, RecoveryError,
};
use herder_core::ids::{ConnectionId, NodeId};
use herder_core::protocol::{ClientRequest, PeerMessage, WorkerToCoordinator};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::auth::{RefusalLog, ServerCredentials};
use crate::clock::{os_seed, Clock};
use crate::metrics::{Metrics, Observation};
use crate::net::{
    ConnectionSlots, Inbound, InputBudget, InputBytes, Outbound, OutboundTotal, Unanswered,
};
use crate::peer::{self, Greeting, PeerLinks};
use crate::store::{Store, StoreError};

/// Inputs waiting for the driver on each of its two queues (workers and members; clients)
/// before readers are made to wait (TCP backpressure).
const INPUT_QUEUE_MAX: usize = 16_384;
/// Bytes of received frames the worker readers, and the client readers, may have queued for the
/// driver: beyond them a reader stops reading until the driver catches up, so the queues hold
/// at most this much whatever the frame sizes.
const WORKER_INPUT_BYTES_MAX: u32 = 16 * 1024 * 1024;
const CLIENT_INPUT_BYTES_MAX: u32 = 64 * 1024 * 1024;
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
    let addresses = Addresses::of(&listeners)?;
    if listeners.peer.is_some() || !peers.is_empty() {
        require_peer_ca(&credentials)?;
    }
    check_group(&config, &peers, addresses.peer)?;
    let greeting = addresses.announce(&mut config)?;
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
    let max_frame_bytes = config.max_frame_bytes;
    let store = Store::open(&data_dir)?;
    let durable = store.load()?;
    let coordinator =
        Coordinator::recover(config, seed.unwrap_or_else(os_seed), clock.now(), durable)?;
    span.in_scope(|| addresses.log_start(&store, members.len()));

    // Workers and members on one queue, clients on another: the driver can stop taking client
    // requests while the disk catches up without holding back results and heartbeats.
    let (input_tx, input_rx) = mpsc::channel(INPUT_QUEUE_MAX);
    let (client_tx, client_rx) = mpsc::channel(INPUT_QUEUE_MAX);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let metrics = Arc::new(Metrics::new());
    let observer = Observer {
        inputs: input_tx.clone(),
        metrics: metrics.clone(),
    };
    let wiring = PortWiring {
        max_frame_bytes,
        limits,
        credentials: credentials.clone(),
        outbound: OutboundTotal::new(limits.outbound_bytes),
        refusals: RefusalLog::new(metrics.clone()),
        shutdown: shutdown_rx.clone(),
        span: span.clone(),
    };
    let accepting = wiring.spawn_accept_loops(listeners, members, input_tx, client_tx);
    let peer_links =
        span.in_scope(|| PeerLinks::start(greeting, &peers, max_frame_bytes, &credentials));
    let writer = StoreThread::spawn(store, metrics.clone())?;
    let (durable_rx, store_thread) = (writer.durable, writer.thread);
    let driver = Driver {
        coordinator,
        clock,
        conns: HashMap::new(),
        unanswered: HashMap::new(),
        to_flush: Vec::new(),
        batches: writer.batches,
        peers: peer_links,
        metrics,
    };
    let stopped = shutdown_tx.clone();
    let task = tokio::spawn(
        async move {
            let result = driver
                .run(input_rx, client_rx, durable_rx, shutdown_rx)
                .await;
            // However the driver ended, every task serving a connection stops with it.
            let _ = stopped.send(true);
            accepting.abort();
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
        worker_addr: addresses.worker,
        client_addr: addresses.client,
        peer_addr: addresses.peer,
        shutdown: shutdown_tx,
        task,
        observer,
    })
}

/// Members prove themselves to each other by certificate: with TLS, a group needs a CA.
fn require_peer_ca(credentials: &ServerCredentials) -> Result<(), CoordinatorError> {
    match &credentials.tls {
        Some(tls) => tls
            .require_ca()
            .map_err(|e| CoordinatorError::Tls(e.to_string())),
        None => Ok(()),
    }
}

/// The thread that writes persistence batches: they go in on `batches`, and each is reported
/// durable (or the write failed) on `durable`.
struct StoreThread {
    batches: std::sync::mpsc::Sender<PersistBatch>,
    durable: mpsc::UnboundedReceiver<Result<BatchId, String>>,
    thread: std::thread::JoinHandle<()>,
}

impl StoreThread {
    fn spawn(store: Store, metrics: Arc<Metrics>) -> Result<StoreThread, CoordinatorError> {
        let (batches, batch_rx) = std::sync::mpsc::channel::<PersistBatch>();
        let (durable_tx, durable) = mpsc::unbounded_channel::<Result<BatchId, String>>();
        let thread = std::thread::Builder::new()
            .name("herder-store".into())
            .spawn(move || store_loop(store, batch_rx, durable_tx, &metrics))
            .map_err(|e| CoordinatorError::StoreThread(e.to_string()))?;
        Ok(StoreThread {
            batches,
            durable,
            thread,
        })
    }
}

/// Where a coordinator's listeners are bound.
struct Addresses {
    worker: SocketAddr,
    client: SocketAddr,
    peer: Option<SocketAddr>,
}

impl Addresses {
    fn of(listeners: &Listeners) -> Result<Addresses, CoordinatorError> {
        let bound = |listener: &TcpListener, what: &str| {
            listener
                .local_addr()
                .map_err(|e| CoordinatorError::Group(format!("{what} listener: {e}")))
        };
        Ok(Addresses {
            worker: bound(&listeners.worker, "worker")?,
            client: bound(&listeners.client, "client")?,
            peer: match &listeners.peer {
                Some(listener) => Some(bound(listener, "peer")?),
                None => None,
            },
        })
    }

    /// Fills in the addresses the configuration left empty with the bound ones (unless bound
    /// on every interface, where no host can be guessed), and says who this member is to the
    /// others.
    fn announce(&self, config: &mut CoordinatorConfig) -> Result<Greeting, CoordinatorError> {
        if config.client_address.is_empty() && !self.client.ip().is_unspecified() {
            config.client_address = self.client.to_string();
        }
        if config.worker_address.is_empty() && !self.worker.ip().is_unspecified() {
            config.worker_address = self.worker.to_string();
        }
        let greeting = Greeting {
            node_id: config.node_id.clone(),
            client_address: config.client_address.clone(),
            worker_address: config.worker_address.clone(),
        };
        if !config.peers.is_empty() {
            greeting.check().map_err(CoordinatorError::Group)?;
        }
        Ok(greeting)
    }

    fn log_start(&self, store: &Store, others: usize) {
        tracing::info!(data = %store.path().display(), "Coordinator store opened");
        let (worker_addr, client_addr) = (self.worker, self.client);
        match self.peer {
            Some(peer_addr) => tracing::info!(
                %worker_addr,
                %client_addr,
                %peer_addr,
                members = others + 1,
                "Coordinator listening"
            ),
            None => tracing::info!(%worker_addr, %client_addr, "Coordinator listening"),
        }
    }
}

/// What every port's accept loop shares.
struct PortWiring {
    max_frame_bytes: usize,
    limits: ConnectionLimits,
    credentials: ServerCredentials,
    outbound: OutboundTotal,
    refusals: RefusalLog,
    shutdown: watch::Receiver<bool>,
    span: tracing::Span,
}

/// The accept loops of a running coordinator, stopped together.
struct Accepting {
    worker: JoinHandle<()>,
    client: JoinHandle<()>,
    peer: Option<JoinHandle<()>>,
}

impl Accepting {
    fn abort(&self) {
        self.worker.abort();
        self.client.abort();
        if let Some(peer) = &self.peer {
            peer.abort();
        }
    }
}

impl PortWiring {
    fn port(&self, link: Link, inputs: mpsc::Sender<Input>, budget: u32) -> PortContext {
        PortContext {
            link,
            max_frame_bytes: self.max_frame_bytes,
            inputs,
            budget: InputBudget::new(budget),
            outbound: self.outbound.clone(),
            limits: self.limits,
            credentials: self.credentials.clone(),
            refusals: self.refusals.clone(),
        }
    }

    /// Starts accepting on every port: workers and members feed `inputs`, clients `clients`.
    fn spawn_accept_loops(
        &self,
        listeners: Listeners,
        members: BTreeSet<NodeId>,
        inputs: mpsc::Sender<Input>,
        clients: mpsc::Sender<Input>,
    ) -> Accepting {
        let next_conn = Arc::new(AtomicU64::new(1));
        let slots = || ConnectionSlots::new(self.limits.per_port);
        let worker = tokio::spawn(
            accept_loop(
                listeners.worker,
                self.port(Link::Worker, inputs.clone(), WORKER_INPUT_BYTES_MAX),
                slots(),
                next_conn.clone(),
                self.shutdown.clone(),
            )
            .instrument(self.span.clone()),
        );
        let client = tokio::spawn(
            accept_loop(
                listeners.client,
                self.port(Link::Client, clients, CLIENT_INPUT_BYTES_MAX),
                slots(),
                next_conn,
                self.shutdown.clone(),
            )
            .instrument(self.span.clone()),
        );
        let peer = self.span.in_scope(|| {
            listeners.peer.map(|listener| {
                peer::spawn_accept_loop(
                    listener,
                    members,
                    self.max_frame_bytes,
                    inputs,
                    Input::Peer,
                    self.shutdown.clone(),
                    peer::PeerGate {
                        credentials: self.credentials.clone(),
                        refusals: self.refusals.clone(),
                    },
                )
            })
        });
        Accepting {
            worker,
            client,
            peer,
        }
    }
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
