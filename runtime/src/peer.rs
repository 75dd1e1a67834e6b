//! The peer link: how the members of a coordinator group reach each other.
//!
//! ```text
//!   driver ── ToPeer{to} ──> bounded queue ──> outbound task ──HELLO, frames──> member `to`
//!                            (full: drop)       (connect, backoff, reconnect)     peer port
//!
//!   member ──HELLO, frames──> peer port ─accept─> inbound task ── (from, PeerMessage) ──> driver
//!                                                 (HELLO must name a member)
//! ```
//!
//! Every pair of members uses two TCP connections, one in each direction: a member only writes
//! on the connections it opened and only reads on the ones it accepted. Frames on this link are
//! binary (MessagePack, the same fields the JSON links would carry), since only coordinators
//! speak it and every entry crosses it once per follower. What goes over them is
//! core's business; this module decides nothing about it. Consensus tolerates loss,
//! duplication and reordering, so the link is best effort: a full queue drops the message (and
//! counts it), a failed write drops the connection and what was being written, and the
//! outbound task reconnects with capped exponential backoff and jitter.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herder_core::auth::{Credential, Secret, SecretLink};
use herder_core::client::full_jitter;
use herder_core::ids::NodeId;
use herder_core::protocol::codec::{encode_binary_frame, FrameDecoder};
use herder_core::protocol::PeerMessage;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::auth::{self as handshake, Port, RefusalLog, ServerCredentials};
use crate::clock::os_seed;
use crate::net::DialError;
use crate::tls::{ServerTls, Stream};

/// Messages queued for one member before new ones are dropped. The leader keeps at most
/// `APPENDS_IN_FLIGHT_MAX` (32) appends and `SNAPSHOT_CHUNKS_IN_FLIGHT_MAX` (4) snapshot chunks
/// in flight to a follower, so a healthy link never comes near this; a member that is down
/// fills it with heartbeats, which are then dropped. Each message is at most one frame, so the
/// queue holds at most this many times `max_frame_bytes`.
pub const PEER_QUEUE_MESSAGES_MAX: usize = 64;
/// Inbound peer connections open at once. A group has at most 6 other members; the room above
/// that covers a member that reconnects before its old connection is noticed as dead. Extra
/// connections are closed at once.
pub const PEER_INBOUND_CONNECTIONS_MAX: usize = 16;
/// First delay before reconnecting to a member; it doubles per failed attempt.
pub const PEER_RECONNECT_BACKOFF_BASE: Duration = Duration::from_millis(50);
/// Longest delay between reconnection attempts (the delay is jittered in its upper half).
pub const PEER_RECONNECT_BACKOFF_MAX: Duration = Duration::from_millis(2_000);
/// How long a connection attempt to a member may take.
pub const PEER_CONNECT_TIMEOUT: Duration = Duration::from_millis(2_000);
/// How long one write to a member may take before it counts as not reading and the connection
/// is dropped (its queue keeps filling meanwhile, and overflows are dropped).
pub const PEER_WRITE_TIMEOUT: Duration = Duration::from_millis(5_000);
/// How long an accepted connection has to send its `HELLO`.
pub const PEER_HELLO_TIMEOUT: Duration = Duration::from_millis(5_000);
/// Queued messages written to the socket in one write at most.
const PEER_WRITE_COALESCE_MAX: usize = 64;
/// Bytes read from a peer socket per read call.
const PEER_READ_CHUNK_BYTES: usize = 64 * 1024;
/// The largest first frame (`HELLO`: a member id and two addresses) an accepted peer
/// connection may send: a stranger's frame is decoded under this bound, not the frame limit.
pub const PEER_HELLO_BYTES_MAX: usize = 4096;

/// What this member says about itself in every `HELLO`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Greeting {
    pub node_id: NodeId,
    pub client_address: String,
    pub worker_address: String,
}

impl Greeting {
    /// Whether the other members will take this greeting: its frame must fit
    /// [`PEER_HELLO_BYTES_MAX`].
    pub fn check(&self) -> Result<(), String> {
        let mut frame = Vec::new();
        encode_binary_frame(&self.hello(), PEER_HELLO_BYTES_MAX, &mut frame)
            .map(|_| ())
            .map_err(|error| {
                format!(
                    "this member's id and addresses do not fit a greeting of {PEER_HELLO_BYTES_MAX} bytes ({error}); use shorter ones"
                )
            })
    }

    fn hello(&self) -> PeerMessage {
        PeerMessage::Hello {
            node_id: self.node_id.clone(),
            client_address: self.client_address.clone(),
            worker_address: self.worker_address.clone(),
        }
    }
}

/// Counters of one outbound link.
#[derive(Debug, Default)]
struct LinkCounters {
    /// Messages dropped because the queue was full (or the message could not be framed).
    dropped: AtomicU64,
    /// Connections established so far.
    connections: AtomicU64,
}

/// What one outbound link has done so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub dropped: u64,
    pub connections: u64,
}

struct OutboundLink {
    queue: mpsc::Sender<PeerMessage>,
    counters: Arc<LinkCounters>,
    task: JoinHandle<()>,
}

/// The outbound side of the peer link: one queue and one connection task per other member.
/// Dropping it stops the tasks and closes their connections.
pub struct PeerLinks {
    links: BTreeMap<NodeId, OutboundLink>,
}

impl PeerLinks {
    /// Starts one outbound task per entry of `peers` (member id -> its peer address). The tasks
    /// log in the span current when this is called.
    /// With a peer secret in `credentials`, every connection first proves it (and checks the
    /// other member does); with TLS, each side presents its certificate (mutual TLS).
    pub fn start(
        greeting: Greeting,
        peers: &BTreeMap<NodeId, String>,
        max_frame_bytes: usize,
        credentials: &ServerCredentials,
    ) -> PeerLinks {
        let links = peers
            .iter()
            .map(|(node_id, address)| {
                let (queue, rx) = mpsc::channel(PEER_QUEUE_MESSAGES_MAX);
                let counters = Arc::new(LinkCounters::default());
                let task = tokio::spawn(
                    Outbound {
                        to: node_id.clone(),
                        address: address.clone(),
                        hello: greeting.hello(),
                        max_frame_bytes,
                        counters: counters.clone(),
                        rng: ChaCha8Rng::seed_from_u64(os_seed()),
                        secret: credentials.peer_secret.clone(),
                        tls: credentials.tls.clone(),
                    }
                    .run(rx)
                    .in_current_span(),
                );
                let link = OutboundLink {
                    queue,
                    counters,
                    task,
                };
                (node_id.clone(), link)
            })
            .collect();
        PeerLinks { links }
    }

    /// Queues `message` for `to`; never waits. A full queue drops it (consensus retransmits).
    pub fn send(&self, to: &NodeId, message: PeerMessage) {
        let Some(link) = self.links.get(to) else {
            tracing::error!(peer = %to, "no peer link to a member core sends to; dropping the message");
            return;
        };
        if link.queue.try_send(message).is_err() {
            let dropped = link.counters.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            // Every power of two, so a member that is down for long does not flood the log.
            if dropped.is_power_of_two() {
                tracing::debug!(peer = %to, dropped, "peer queue full; dropping messages");
            }
        }
    }

    /// What each outbound link has done so far.
    pub fn stats(&self) -> BTreeMap<NodeId, LinkStats> {
        self.links
            .iter()
            .map(|(id, link)| {
                let stats = LinkStats {
                    dropped: link.counters.dropped.load(Ordering::Relaxed),
                    connections: link.counters.connections.load(Ordering::Relaxed),
                };
                (id.clone(), stats)
            })
            .collect()
    }
}

impl Drop for PeerLinks {
    fn drop(&mut self) {
        for link in self.links.values() {
            link.task.abort();
        }
    }
}

/// One member's outbound connection task.
struct Outbound {
    to: NodeId,
    address: String,
    hello: PeerMessage,
    max_frame_bytes: usize,
    counters: Arc<LinkCounters>,
    rng: ChaCha8Rng,
    secret: Option<Arc<Secret>>,
    /// The member's TLS; each dial takes the peer client of the files as last read.
    tls: Option<ServerTls>,
}

/// Why an outbound connection ended.
enum LinkEnd {
    /// The driver dropped its side: stop for good.
    Stopped,
    Lost(String),
}

impl Outbound {
    async fn run(mut self, mut queue: mpsc::Receiver<PeerMessage>) {
        // Consecutive failed attempts; the backoff grows with it.
        let mut failures: u32 = 0;
        // Whether the last attempt or connection failed in a way already logged.
        let mut down_logged = false;
        loop {
            let Some(stream) = self.dial_once(&mut failures, &mut down_logged).await else {
                continue;
            };
            let _ = stream.tcp().set_nodelay(true);
            let connections = self.counters.connections.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::info!(peer = %self.to, address = %self.address, connections, "Peer link up");
            let (read_half, write_half) = tokio::io::split(stream);
            match self.serve(read_half, write_half, &mut queue).await {
                LinkEnd::Stopped => return,
                LinkEnd::Lost(reason) => {
                    tracing::info!(peer = %self.to, %reason, "Peer link down; reconnecting");
                    down_logged = true;
                    // The connection worked, so the next attempt starts from the base delay;
                    // waiting it out keeps a member that accepts and closes at once from
                    // making this loop spin.
                    failures = 1;
                    self.back_off(failures).await;
                }
            }
        }
    }

    /// One attempt to reach the peer. A failure is logged (a refused credential every time,
    /// anything else once until the link is up again) and its backoff waited out.
    async fn dial_once(&mut self, failures: &mut u32, down_logged: &mut bool) -> Option<Stream> {
        let credential = self.secret.as_ref().map(|secret| Credential::Secret {
            link: SecretLink::Peer,
            secret: secret.clone(),
        });
        let tls = self.tls.as_ref().and_then(ServerTls::peer_client);
        let dialed = crate::net::dial(&self.address, tls.as_ref(), credential);
        let reason = match tokio::time::timeout(PEER_CONNECT_TIMEOUT, dialed).await {
            Ok(Ok(stream)) => return Some(stream),
            Ok(Err(DialError::Failed(reason))) => reason,
            Ok(Err(refused @ DialError::Refused { .. })) => {
                // A refusal is logged every time (with backoff): a member that cannot join
                // its group is the one thing its operator must see.
                tracing::error!(peer = %self.to, address = %self.address, reason = %refused, "The peer refused this member's credential");
                *down_logged = true;
                *failures = failures.saturating_add(1);
                self.back_off(*failures).await;
                return None;
            }
            Err(_) => format!("no connection within {PEER_CONNECT_TIMEOUT:?}"),
        };
        self.connect_failed(failures, down_logged, &reason);
        self.back_off(*failures).await;
        None
    }

    fn connect_failed(&self, failures: &mut u32, down_logged: &mut bool, reason: &str) {
        *failures = failures.saturating_add(1);
        if *down_logged {
            tracing::debug!(peer = %self.to, address = %self.address, %reason, attempt = *failures, "Peer connect failed");
        } else {
            tracing::warn!(peer = %self.to, address = %self.address, %reason, "Cannot reach peer; retrying with backoff");
            *down_logged = true;
        }
    }

    /// Waits `[ceiling / 2, ceiling]` with `ceiling = min(max, base * 2^(failures - 1))`.
    async fn back_off(&mut self, failures: u32) {
        let half_base = PEER_RECONNECT_BACKOFF_BASE / 2;
        let half_max = PEER_RECONNECT_BACKOFF_MAX / 2;
        let floor = half_base
            .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
            .min(half_max);
        let delay = floor + full_jitter(&mut self.rng, half_base, half_max, failures);
        tokio::time::sleep(delay).await;
    }

    /// Writes `HELLO`, then every queued message, until the connection fails or the driver
    /// stops. Reads only to notice the other side closing (it never writes on this link).
    async fn serve(
        &mut self,
        mut read_half: ReadHalf<Stream>,
        mut write_half: WriteHalf<Stream>,
        queue: &mut mpsc::Receiver<PeerMessage>,
    ) -> LinkEnd {
        let mut buffer = Vec::new();
        if let Err(error) = encode_binary_frame(&self.hello, self.max_frame_bytes, &mut buffer) {
            // Our own addresses do not fit in a frame: a configuration no link can carry.
            return LinkEnd::Lost(format!("cannot frame HELLO: {error}"));
        }
        if let Err(reason) = write(&mut write_half, &buffer).await {
            return LinkEnd::Lost(reason);
        }
        let mut scratch = [0u8; 512];
        loop {
            buffer.clear();
            let first = tokio::select! {
                message = queue.recv() => message,
                read = read_half.read(&mut scratch) => {
                    return LinkEnd::Lost(match read {
                        Ok(0) => "closed by the peer".to_owned(),
                        Ok(_) => "the peer wrote on a link it should only read".to_owned(),
                        Err(error) => error.to_string(),
                    });
                }
            };
            let Some(first) = first else {
                let _ = write_half.shutdown().await;
                return LinkEnd::Stopped;
            };
            self.frame(&first, &mut buffer);
            for _ in 1..PEER_WRITE_COALESCE_MAX {
                match queue.try_recv() {
                    Ok(message) => self.frame(&message, &mut buffer),
                    Err(_) => break,
                }
            }
            if buffer.is_empty() {
                continue;
            }
            if let Err(reason) = write(&mut write_half, &buffer).await {
                return LinkEnd::Lost(reason);
            }
        }
    }

    /// Appends `message`'s frame to `buffer`. Core sizes its messages to the frame limit, so a
    /// message that does not fit is a bug there; it is dropped (and counted), not sent.
    fn frame(&self, message: &PeerMessage, buffer: &mut Vec<u8>) {
        let start = buffer.len();
        if let Err(error) = encode_binary_frame(message, self.max_frame_bytes, buffer) {
            buffer.truncate(start);
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            tracing::error!(peer = %self.to, %error, "peer message does not fit in a frame; dropped");
        }
    }
}

async fn write(socket: &mut WriteHalf<Stream>, bytes: &[u8]) -> Result<(), String> {
    let written = async {
        socket.write_all(bytes).await?;
        // A TLS session holds what it is given until flushed.
        socket.flush().await
    };
    match tokio::time::timeout(PEER_WRITE_TIMEOUT, written).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!(
            "the peer did not take {} bytes within {PEER_WRITE_TIMEOUT:?}",
            bytes.len()
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Inbound
// ---------------------------------------------------------------------------------------------

/// The inbound connection currently open from each member, so a reconnecting member's old
/// connection is closed instead of lingering half-dead.
type Current = Arc<Mutex<HashMap<NodeId, (u64, watch::Sender<bool>)>>>;

/// Accepts peer connections on `listener` until `shutdown`: each must open with a `HELLO` from
/// one of `members`; every message it carries (the `HELLO` included) is sent on `inputs` as
/// `wrap(member, message)`. The tasks log in the span current when this is called.
/// With a secret or TLS in `gate`, a connection must prove itself before its `HELLO` is read;
/// one that does not is refused and recorded in the gate's refusal log.
pub fn spawn_accept_loop<T, F>(
    listener: TcpListener,
    members: BTreeSet<NodeId>,
    max_frame_bytes: usize,
    inputs: mpsc::Sender<T>,
    wrap: F,
    mut shutdown: watch::Receiver<bool>,
    gate: PeerGate,
) -> JoinHandle<()>
where
    T: Send + 'static,
    F: Fn(NodeId, PeerMessage) -> T + Clone + Send + Sync + 'static,
{
    let slots = Arc::new(Semaphore::new(PEER_INBOUND_CONNECTIONS_MAX));
    let members = Arc::new(members);
    let current: Current = Arc::default();
    let mut next_generation: u64 = 0;
    tokio::spawn(
        async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = shutdown.changed() => return,
                };
                let (stream, remote) = match accepted {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        // Usually descriptor exhaustion; back off briefly rather than spin.
                        tracing::warn!(%error, "peer accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(
                        %remote,
                        limit = PEER_INBOUND_CONNECTIONS_MAX,
                        "too many inbound peer connections; closing the new one"
                    );
                    drop(stream);
                    continue;
                };
                next_generation += 1;
                let connection = Inbound {
                    stream,
                    remote,
                    generation: next_generation,
                    members: members.clone(),
                    current: current.clone(),
                    max_frame_bytes,
                    credentials: gate.credentials.clone(),
                    refusals: gate.refusals.clone(),
                    _permit: permit,
                };
                tokio::spawn(
                    connection
                        .run(inputs.clone(), wrap.clone(), shutdown.clone())
                        .in_current_span(),
                );
            }
        }
        .in_current_span(),
    )
}

/// What the peer port checks before it reads a `HELLO`.
#[derive(Clone)]
pub struct PeerGate {
    /// The peer secret and TLS are checked, if configured (nothing else is used).
    pub credentials: ServerCredentials,
    pub refusals: RefusalLog,
}

/// One accepted peer connection.
struct Inbound {
    stream: TcpStream,
    remote: std::net::SocketAddr,
    generation: u64,
    members: Arc<BTreeSet<NodeId>>,
    current: Current,
    max_frame_bytes: usize,
    credentials: ServerCredentials,
    refusals: RefusalLog,
    /// Held for the connection's life: it counts against `PEER_INBOUND_CONNECTIONS_MAX`.
    _permit: OwnedSemaphorePermit,
}

impl Inbound {
    async fn run<T, F>(self, inputs: mpsc::Sender<T>, wrap: F, mut shutdown: watch::Receiver<bool>)
    where
        F: Fn(NodeId, PeerMessage) -> T,
    {
        let Inbound {
            stream,
            remote,
            generation,
            members,
            current,
            max_frame_bytes,
            credentials,
            refusals,
            _permit: permit,
        } = self;
        let admitted = handshake::admit(stream, Port::Peer, &credentials, PEER_HELLO_TIMEOUT).await;
        let stream = match admitted {
            Ok((stream, _caller)) => stream,
            Err(failure) => {
                refusals.refused(Port::Peer, remote, &failure);
                return;
            }
        };
        let (mut reader, _writer) = tokio::io::split(stream);
        // Declared after the socket, so it is released before the socket closes: whoever sees
        // the close may connect again at once and find the slot free.
        let _permit = permit;
        let mut decoder = FrameDecoder::new(PEER_HELLO_BYTES_MAX.min(max_frame_bytes));
        let mut chunk = vec![0u8; PEER_READ_CHUNK_BYTES];

        let Some((from, hello)) =
            read_hello(&mut reader, &mut decoder, &mut chunk, remote, &members).await
        else {
            return;
        };

        // A member: its frames may now be as large as the group's limit.
        decoder.raise_max_frame_bytes(max_frame_bytes);
        // This is now the connection from `from`; an older one is closed.
        let (replaced_tx, mut replaced) = watch::channel(false);
        if let Ok(mut open) = current.lock() {
            if let Some((_, old)) = open.insert(from.clone(), (generation, replaced_tx)) {
                let _ = old.send(true);
            }
        }
        tracing::debug!(%remote, peer = %from, "Peer connected");

        let mut message = Some(hello);
        loop {
            if let Some(message) = message.take() {
                if inputs.send(wrap(from.clone(), message)).await.is_err() {
                    break; // The driver is gone.
                }
                continue;
            }
            let next = tokio::select! {
                next = next_message(&mut reader, &mut decoder, &mut chunk) => next,
                _ = replaced.changed() => {
                    tracing::debug!(%remote, peer = %from, "newer connection from the same peer; closing this one");
                    break;
                }
                _ = shutdown.changed() => break,
            };
            match next {
                Ok(Some(next)) => message = Some(next),
                Ok(None) => {
                    tracing::debug!(%remote, peer = %from, "peer closed its connection");
                    break;
                }
                Err(reason) => {
                    tracing::warn!(%remote, peer = %from, %reason, "malformed frame from peer; closing");
                    break;
                }
            }
        }
        if let Ok(mut open) = current.lock() {
            if open
                .get(&from)
                .is_some_and(|(latest, _)| *latest == generation)
            {
                open.remove(&from);
            }
        }
        tracing::debug!(%remote, peer = %from, "Peer connection closed");
    }
}

/// The first message on an accepted peer connection: a `HELLO` from a member of the group, in
/// time. Anything else is logged and ends the connection (`None`).
async fn read_hello(
    reader: &mut ReadHalf<Stream>,
    decoder: &mut FrameDecoder,
    chunk: &mut [u8],
    remote: std::net::SocketAddr,
    members: &BTreeSet<NodeId>,
) -> Option<(NodeId, PeerMessage)> {
    let hello =
        tokio::time::timeout(PEER_HELLO_TIMEOUT, next_message(reader, decoder, chunk)).await;
    let hello = match hello {
        Ok(Ok(Some(message))) => message,
        Ok(Ok(None)) => return None,
        Ok(Err(reason)) => {
            tracing::warn!(%remote, %reason, "bad first frame on the peer port; closing");
            return None;
        }
        Err(_) => {
            tracing::warn!(%remote, timeout = ?PEER_HELLO_TIMEOUT, "no HELLO in time on the peer port; closing");
            return None;
        }
    };
    match &hello {
        PeerMessage::Hello { node_id, .. } if members.contains(node_id) => {
            Some((node_id.clone(), hello))
        }
        PeerMessage::Hello { node_id, .. } => {
            tracing::warn!(%remote, peer = %node_id, "HELLO from a node that is not a member of this group; closing");
            None
        }
        other => {
            use herder_core::protocol::codec::WireMessage;
            tracing::warn!(%remote, first = other.type_name(), "peer connection did not open with HELLO; closing");
            None
        }
    }
}

/// The next whole message: `Ok(None)` when the peer closed, `Err` for a socket error or a
/// frame that does not decode.
async fn next_message(
    reader: &mut ReadHalf<Stream>,
    decoder: &mut FrameDecoder,
    chunk: &mut [u8],
) -> Result<Option<PeerMessage>, String> {
    loop {
        match decoder.next_binary_message::<PeerMessage>() {
            Ok(Some(message)) => return Ok(Some(message)),
            Ok(None) => {}
            Err(error) => return Err(error.to_string()),
        }
        match reader.read(chunk).await {
            Ok(0) => return Ok(None),
            Ok(n) => decoder.extend(chunk.get(..n).unwrap_or_default()),
            Err(error) => return Err(error.to_string()),
        }
    }
}
