//! Frame I/O over TCP: one reader task and one writer task per connection, speaking core's codec.
//!
//! The reader decodes frames with `FrameDecoder` and hands each message (or the first decode
//! error, after which it stops reading) to its owner through a channel. The writer owns the write
//! half: it coalesces queued frames into one write, and closes the socket when asked. Neither
//! makes any decision about what the bytes mean.
//!
//! A sender writes its frames itself while nothing is queued for the writer: one non-blocking
//! write, straight into the kernel's buffer, without waking the writer task. Only what the
//! socket does not take then (a peer that reads slowly) is queued for the writer, behind which
//! every later frame waits, so frames always leave in the order they were sent. A driver that
//! sends several messages to one connection in one turn corks them (`send_corked`): they are
//! encoded into the connection's reused buffer and leave together in one write at `flush`.
//!
//! A TLS connection has no direct path: its bytes must pass through the TLS session, which the
//! writer task owns, so every frame is queued for it.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use herder_core::auth::{AuthError, Credential};
use herder_core::protocol::codec::{
    encode_frame, EncodeError, FrameDecoder, FrameError, WireMessage,
};
use herder_core::worker::ConnectAttempt;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::auth::InitiateFailure;
use crate::tls::{ClientTls, DialTlsError, Stream};

/// Bytes queued for one connection before it is treated as a stalled peer and closed.
pub const OUTBOUND_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Bytes read from a socket per read call.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Frames coalesced into one write at most.
const WRITE_COALESCE_MAX: usize = 256;
/// Bytes a connection may hold corked before they are flushed on the spot (a turn with more to
/// send writes in steps of this size), and the capacity its cork buffer keeps between turns.
const CORKED_BYTES_MAX: usize = 1024 * 1024;
/// How long one write may wait for the peer to read before the connection is closed (and its
/// owner told, through the reader): a peer that stops reading must not hold buffers forever.
pub const WRITE_STALL_MAX: std::time::Duration = std::time::Duration::from_secs(30);

enum WriteCommand {
    Frame(QueuedFrame),
    Close,
}

/// An encoded frame and the counters it is queued against. Its bytes are given back when it is
/// dropped: once written, or wherever else it ends (a closed channel, an abandoned write), so
/// no path can leave them counted.
struct QueuedFrame {
    bytes: Vec<u8>,
    counters: Counters,
}

impl Drop for QueuedFrame {
    fn drop(&mut self) {
        self.counters.release(self.bytes.len());
    }
}

/// Bytes queued for writing across every connection that shares it: a process with many
/// connections bounds what all of them may hold together, not only each one.
#[derive(Clone, Debug)]
pub struct OutboundTotal {
    queued: Arc<AtomicUsize>,
    max: usize,
}

impl OutboundTotal {
    pub fn new(max: usize) -> OutboundTotal {
        OutboundTotal {
            queued: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// Bytes queued now, over every connection sharing this total.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    fn release(&self, bytes: usize) {
        self.queued.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The write half, shared by the writer task (which holds it, and closes the socket by dropping
/// it) and the senders, which write straight into it while nothing is queued. Every write to
/// the socket holds `writing`, so two writes never interleave their bytes.
struct WriteHalf {
    socket: OwnedWriteHalf,
    writing: Mutex<()>,
}

impl WriteHalf {
    /// One non-blocking write under the lock.
    fn try_write(&self, bytes: &[u8]) -> std::io::Result<usize> {
        let _one_writer = lock(&self.writing);
        self.socket.try_write(bytes)
    }
}

/// Where the writer task writes.
enum Sink {
    /// Plain TCP, shared with senders that write directly.
    Direct(Arc<WriteHalf>),
    /// A TLS session's write side, the writer's alone.
    Tls(tokio::io::WriteHalf<Stream>),
}

impl Sink {
    async fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self {
            Sink::Direct(socket) => write_all(socket, bytes).await,
            Sink::Tls(tls) => {
                tls.write_all(bytes).await?;
                tls.flush().await
            }
        }
    }

    /// Ends the connection's sending side: dropping the plain write half shuts the socket
    /// down for writing; a TLS session first says goodbye (close_notify), briefly.
    async fn close(self) {
        match self {
            Sink::Direct(socket) => drop(socket),
            Sink::Tls(mut tls) => {
                let _ = tokio::time::timeout(TLS_CLOSE_WITHIN, tls.shutdown()).await;
            }
        }
    }
}

/// How long a closing TLS connection may take to send its goodbye.
const TLS_CLOSE_WITHIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Locks `mutex`, whose data (bytes, or nothing) stays usable if a holder panicked.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The sending side of a connection. Cheap to clone; sends never block.
#[derive(Clone)]
pub struct Outbound {
    /// The socket, while the writer still holds it: a frame sent with nothing queued and the
    /// connection not closing goes straight into it.
    direct: Weak<WriteHalf>,
    /// Set by `close`: from then on nothing is written directly.
    closing: Arc<AtomicBool>,
    /// Frames encoded and not yet written or queued (`send_corked`), in a buffer kept from one
    /// flush to the next.
    corked: Arc<Mutex<Vec<u8>>>,
    tx: mpsc::UnboundedSender<WriteCommand>,
    queued: Arc<AtomicUsize>,
    total: Option<OutboundTotal>,
    /// Ends the connection at once, a blocked write included (a graceful close waits for it).
    abort: Arc<tokio::sync::Notify>,
    max_frame_bytes: usize,
}

/// Why a message could not be queued.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("connection is closed")]
    Closed,
    #[error("peer is not reading: {queued} bytes already queued")]
    Stalled { queued: usize },
    #[error("{queued} bytes are queued across every connection, over the bound of {max}")]
    OverTotal { queued: usize, max: usize },
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

impl Outbound {
    /// Encodes one message and writes it (with anything corked before it), or queues it for
    /// the writer.
    pub fn send<M: Serialize>(&self, message: &M) -> Result<(), SendError> {
        self.send_corked(message)?;
        self.flush()
    }

    /// Encodes one message behind the others corked since the last `flush`, which sends them
    /// all in one write. Returns whether it is the first since then (the connection now needs a
    /// flush). A message that does not fit a frame is refused and nothing changes.
    pub fn send_corked<M: Serialize>(&self, message: &M) -> Result<bool, SendError> {
        let mut corked = lock(&self.corked);
        if corked.len() >= CORKED_BYTES_MAX {
            // Bounded like everything queued: what is corked goes out (or to the writer,
            // against the connection's bounds) before more is added.
            self.flush_locked(&mut corked)?;
        }
        let first = corked.is_empty();
        encode_frame(message, self.max_frame_bytes, &mut corked)?;
        Ok(first)
    }

    /// Writes the corked frames at once if nothing is queued for the writer, and queues what the
    /// socket does not take (or all of it, behind frames already queued).
    pub fn flush(&self) -> Result<(), SendError> {
        let mut corked = lock(&self.corked);
        self.flush_locked(&mut corked)
    }

    fn flush_locked(&self, corked: &mut Vec<u8>) -> Result<(), SendError> {
        if corked.is_empty() {
            return Ok(());
        }
        // Held until the rest, if any, is queued: bytes another sender writes meanwhile cannot
        // overtake it.
        let socket = self.direct.upgrade();
        let _one_writer = socket.as_ref().map(|socket| lock(&socket.writing));
        let mut written = 0;
        if let Some(socket) = &socket {
            if self.queued.load(Ordering::Acquire) == 0 && !self.closing.load(Ordering::Acquire) {
                // Full, or failed: the writer waits for room, or meets the failure and closes
                // the connection.
                written = socket.socket.try_write(corked).unwrap_or(0);
            }
        }
        if written == corked.len() {
            corked.clear();
            if corked.capacity() > CORKED_BYTES_MAX {
                // One large turn does not leave a large buffer behind for the connection's life.
                corked.shrink_to(CORKED_BYTES_MAX);
            }
            return Ok(());
        }
        // The buffer itself goes to the writer (the next turn starts a new one).
        let mut rest = std::mem::take(corked);
        rest.drain(..written);
        self.queue(rest)
    }

    /// Hands `bytes` to the writer, counted against this connection's bound and the total.
    fn queue(&self, bytes: Vec<u8>) -> Result<(), SendError> {
        let length = bytes.len();
        let queued = self.queued.fetch_add(length, Ordering::Relaxed) + length;
        if queued > OUTBOUND_BYTES_MAX {
            self.queued.fetch_sub(length, Ordering::Relaxed);
            self.abort.notify_one();
            return Err(SendError::Stalled { queued });
        }
        if let Some(total) = &self.total {
            let all = total.queued.fetch_add(length, Ordering::Relaxed) + length;
            if all > total.max {
                // The connection being written to goes: the bound is far above what healthy
                // peers hold, so whoever reaches it is most likely one that stopped reading.
                total.release(length);
                self.queued.fetch_sub(length, Ordering::Relaxed);
                self.abort.notify_one();
                return Err(SendError::OverTotal {
                    queued: all,
                    max: total.max,
                });
            }
        }
        let frame = QueuedFrame {
            bytes,
            counters: Counters {
                own: self.queued.clone(),
                total: self.total.clone(),
            },
        };
        // A refused frame comes back inside the error and gives its bytes back as it drops.
        self.tx
            .send(WriteCommand::Frame(frame))
            .map_err(|_| SendError::Closed)
    }

    /// Flushes what is corked and queued, then closes the connection.
    pub fn close(&self) {
        let _ = self.flush();
        self.closing.store(true, Ordering::Release);
        let _ = self.tx.send(WriteCommand::Close);
    }
}

/// Requests read from one connection and not yet answered. A reader that has `max` of them
/// outstanding reads nothing more until an answer goes out, so a client that pipelines without
/// reading its answers waits in TCP instead of piling requests up in the coordinator.
#[derive(Clone, Debug)]
pub struct Unanswered {
    permits: Arc<Semaphore>,
    max: usize,
}

impl Unanswered {
    pub fn new(max: usize) -> Unanswered {
        Unanswered {
            permits: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// Waits for room for one more request; false once the connection is being torn down.
    async fn take(&self) -> bool {
        match self.permits.acquire().await {
            Ok(permit) => {
                permit.forget();
                true
            }
            Err(_) => false,
        }
    }

    /// One request was answered.
    pub fn answered(&self) {
        // Never more room than the bound, whatever a peer manages to get answered twice.
        if self.permits.available_permits() < self.max {
            self.permits.add_permits(1);
        }
    }

    /// Requests read and not yet answered.
    pub fn outstanding(&self) -> usize {
        self.max - self.permits.available_permits()
    }
}

/// The bytes of one received frame, held against its reader's budget until dropped: an owner
/// drops it once it has handled the message, so the messages queued for it never hold more
/// than the budget.
#[derive(Debug)]
pub struct InputBytes {
    _held: Option<OwnedSemaphorePermit>,
}

/// Open connections of one kind, counted so that a port can refuse more than its bound.
#[derive(Clone, Debug)]
pub struct ConnectionSlots {
    open: Arc<AtomicUsize>,
    max: usize,
}

/// One open connection's place among its `ConnectionSlots`, given back when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    open: Arc<AtomicUsize>,
}

impl ConnectionSlots {
    pub fn new(max: usize) -> ConnectionSlots {
        ConnectionSlots {
            open: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// A place for one more connection, unless `max` are open.
    pub fn take(&self) -> Option<ConnectionSlot> {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.max).then_some(open + 1)
            })
            .ok()?;
        Some(ConnectionSlot {
            open: self.open.clone(),
        })
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Bytes of received messages that the readers sharing it may have queued for their owner.
#[derive(Clone, Debug)]
pub struct InputBudget {
    permits: Arc<Semaphore>,
    bytes: u32,
}

impl InputBudget {
    pub fn new(bytes: u32) -> InputBudget {
        InputBudget {
            permits: Arc::new(Semaphore::new(bytes as usize)),
            bytes,
        }
    }

    /// Bytes not held by any queued message.
    pub fn available(&self) -> usize {
        self.permits.available_permits()
    }

    /// Holds `frame` bytes (at most the whole budget, so that any frame fits), waiting while
    /// the budget is spent. `None` if the budget was closed.
    async fn hold(&self, frame: usize) -> Option<InputBytes> {
        let wanted = u32::try_from(frame)
            .unwrap_or(u32::MAX)
            .clamp(1, self.bytes.max(1));
        let permit = self.permits.clone().acquire_many_owned(wanted).await.ok()?;
        Some(InputBytes {
            _held: Some(permit),
        })
    }
}

impl InputBytes {
    /// Bytes held against no budget.
    pub fn unbudgeted() -> InputBytes {
        InputBytes { _held: None }
    }
}

/// What a reader reports about its connection.
#[derive(Debug)]
pub enum Inbound<M> {
    Message(M),
    /// The first undecodable frame; the reader has stopped.
    Malformed(FrameError),
    /// The peer closed, the socket failed, or we closed it.
    Closed(String),
}

/// The read side of a connection (plain or TLS).
type ReadSide = Box<dyn AsyncRead + Unpin + Send>;

/// The read half of a connection whose reader has not started yet.
pub struct PendingReader {
    socket: ReadSide,
    max_frame_bytes: usize,
    closed: watch::Receiver<bool>,
}

impl PendingReader {
    /// Starts the reader task: it reports through `report`, tagged by `wrap`.
    pub fn start<M, T, F>(self, report: mpsc::Sender<T>, wrap: F)
    where
        M: WireMessage + Send + 'static,
        T: Send + 'static,
        F: Fn(Inbound<M>) -> T + Send + 'static,
    {
        tokio::spawn(read_loop(
            self.socket,
            self.max_frame_bytes,
            report,
            move |inbound, _| wrap(inbound),
            None,
            self.closed,
        ));
    }

    /// Like `start`, but every message first takes its frame's size from `budget` (shared by
    /// the readers of one kind of connection), handed to `wrap` to be held until the message
    /// is handled. While the budget is spent the reader stops reading, and TCP pushes back on
    /// the sender.
    /// A connection whose first whole message has not arrived by `first_message_within` is
    /// closed (reported as `Closed`): a socket that never speaks must not hold a place.
    pub fn start_budgeted<M, T, F>(self, report: mpsc::Sender<T>, wrap: F, limits: ReaderLimits)
    where
        M: WireMessage + Send + 'static,
        T: Send + 'static,
        F: Fn(Inbound<M>, InputBytes) -> T + Send + 'static,
    {
        tokio::spawn(read_loop(
            self.socket,
            self.max_frame_bytes,
            report,
            wrap,
            Some(limits),
            self.closed,
        ));
    }
}

/// What bounds one budgeted reader.
pub struct ReaderLimits {
    /// The bytes every reader of its port may have queued for the owner.
    pub budget: InputBudget,
    /// How long a new connection may take to send its first whole message.
    pub first_message_within: std::time::Duration,
    /// Requests read and not yet answered, if the owner answers requests.
    pub unanswered: Option<Unanswered>,
}

/// Starts the writer task of `stream` and hands back its `Outbound`, with the reader still to be
/// started. An owner that must learn of the connection before its first message (the
/// coordinator registers every connection before reading from it) starts the reader afterwards.
pub fn open_connection(
    stream: impl Into<Stream>,
    max_frame_bytes: usize,
) -> (Outbound, PendingReader) {
    open_connection_within(stream, max_frame_bytes, None, WRITE_STALL_MAX)
}

/// Like [`open_connection`], with the bytes queued for writing also counted against `total`,
/// and `write_stall` as the longest one write may wait for the peer to read.
pub fn open_connection_within(
    stream: impl Into<Stream>,
    max_frame_bytes: usize,
    total: Option<OutboundTotal>,
    write_stall: std::time::Duration,
) -> (Outbound, PendingReader) {
    let stream = stream.into();
    let _ = stream.tcp().set_nodelay(true);
    let peer = stream.peer_addr();
    let (read_half, sink, direct): (ReadSide, _, _) = match stream {
        Stream::Plain(tcp) => {
            let (read_half, write_half) = tcp.into_split();
            let write_half = Arc::new(WriteHalf {
                socket: write_half,
                writing: Mutex::new(()),
            });
            let direct = Arc::downgrade(&write_half);
            (Box::new(read_half), Sink::Direct(write_half), direct)
        }
        tls @ Stream::Tls(_) => {
            let (read_half, write_half) = tokio::io::split(tls);
            (Box::new(read_half), Sink::Tls(write_half), Weak::new())
        }
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let (closed_tx, closed_rx) = watch::channel(false);
    let counters = Counters {
        own: queued.clone(),
        total: total.clone(),
    };
    let abort = Arc::new(tokio::sync::Notify::new());
    let closing = Arc::new(AtomicBool::new(false));
    tokio::spawn(write_loop(
        (sink, peer),
        rx,
        counters,
        (abort.clone(), write_stall),
        (closing.clone(), closed_tx),
    ));
    let outbound = Outbound {
        direct,
        closing,
        corked: Arc::new(Mutex::new(Vec::new())),
        tx,
        queued,
        total,
        abort,
        max_frame_bytes,
    };
    let reader = PendingReader {
        socket: read_half,
        max_frame_bytes,
        closed: closed_rx,
    };
    (outbound, reader)
}

/// Starts both halves of `stream`: a reader task that reports through `report` (tagged by
/// `wrap`) and a writer task fed through the returned `Outbound`.
pub fn spawn_connection<M, T, F>(
    stream: impl Into<Stream>,
    max_frame_bytes: usize,
    report: mpsc::Sender<T>,
    wrap: F,
) -> Outbound
where
    M: WireMessage + Send + 'static,
    T: Send + 'static,
    F: Fn(Inbound<M>) -> T + Send + 'static,
{
    let (outbound, reader) = open_connection(stream, max_frame_bytes);
    reader.start(report, wrap);
    outbound
}

/// What a connection's queued bytes count against: its own bound, and the shared total.
#[derive(Clone)]
struct Counters {
    own: Arc<AtomicUsize>,
    total: Option<OutboundTotal>,
}

impl Counters {
    fn release(&self, bytes: usize) {
        // Release: a sender that then reads the count as zero also sees whatever the writer did
        // before (the `closing` flag it sets on its way out).
        self.own.fetch_sub(bytes, Ordering::Release);
        if let Some(total) = &self.total {
            total.release(bytes);
        }
    }
}

async fn write_loop(
    (mut socket, peer): (Sink, Option<std::net::SocketAddr>),
    mut rx: mpsc::UnboundedReceiver<WriteCommand>,
    queued: Counters,
    (abort, write_stall): (Arc<tokio::sync::Notify>, std::time::Duration),
    (closing, closed): (Arc<AtomicBool>, watch::Sender<bool>),
) {
    // Bytes stay counted as queued until the socket has taken them, so a write blocked on a
    // peer that does not read holds them against both bounds: the frames of a write are kept
    // until it completes, and give their bytes back as they drop.
    let mut buffer = Vec::new();
    let mut in_buffer: Vec<QueuedFrame> = Vec::new();
    'outer: loop {
        let command = tokio::select! {
            command = rx.recv() => match command {
                Some(command) => command,
                None => break,
            },
            () = abort.notified() => break,
        };
        let mut close = false;
        let mut pending = Some(command);
        let mut frames = 0;
        while let Some(command) = pending.take() {
            match command {
                WriteCommand::Frame(frame) => {
                    buffer.extend_from_slice(&frame.bytes);
                    in_buffer.push(frame);
                    frames += 1;
                }
                WriteCommand::Close => {
                    close = true;
                    break;
                }
            }
            if frames < WRITE_COALESCE_MAX {
                pending = rx.try_recv().ok();
            }
        }
        if !buffer.is_empty() {
            let write = tokio::time::timeout(write_stall, socket.write_all(&buffer));
            let written = tokio::select! {
                written = write => written,
                () = abort.notified() => break 'outer,
            };
            match written {
                Ok(Ok(())) => {}
                // Failed, or the peer read nothing for too long: the connection is closed,
                // and the reader (told through `closed`) reports it to the owner.
                Ok(Err(_)) => break 'outer,
                Err(_) => {
                    tracing::warn!(
                        peer = ?peer,
                        stalled_millis = u64::try_from(write_stall.as_millis()).unwrap_or(u64::MAX),
                        unwritten = queued.own.load(Ordering::Relaxed),
                        "Closing a connection whose peer has read nothing for too long"
                    );
                    break 'outer;
                }
            }
            in_buffer.clear();
            buffer.clear();
        }
        if close {
            break;
        }
    }
    // No sender writes directly from here on: a write cut short (a stall) may have left half a
    // frame on the socket, and the counts are about to drop to zero.
    closing.store(true, Ordering::Release);
    // What was never written gives its bytes back as it drops: the unfinished write's frames
    // now, frames still in the channel (even one sent as it closes) with the channel.
    drop(in_buffer);
    rx.close();
    drop(rx);
    // The only lasting hold on the write half: dropping it shuts the socket down for writing
    // (a sender writing directly at this instant holds it a moment longer, never more).
    socket.close().await;
    let _ = closed.send(true);
}

/// Writes all of `bytes`, waiting for room as needed; each write holds the socket's lock.
async fn write_all(socket: &WriteHalf, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        socket.socket.writable().await?;
        match socket.try_write(bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(written) => bytes = bytes.get(written..).unwrap_or_default(),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

async fn read_loop<M, T, F>(
    mut socket: ReadSide,
    max_frame_bytes: usize,
    report: mpsc::Sender<T>,
    wrap: F,
    limits: Option<ReaderLimits>,
    mut closed: watch::Receiver<bool>,
) where
    M: WireMessage,
    F: Fn(Inbound<M>, InputBytes) -> T,
{
    let none = InputBytes::unbudgeted;
    let (budget, first_message_within, unanswered) = match limits {
        Some(limits) => (
            Some(limits.budget),
            Some(limits.first_message_within),
            limits.unanswered,
        ),
        None => (None, None, None),
    };
    // Until the first whole message, the socket has this long to send one.
    let mut first_message_by =
        first_message_within.map(|within| tokio::time::Instant::now() + within);
    let mut decoder = FrameDecoder::new(max_frame_bytes);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    // Every way out but the owner going away reports the close, so the owner always learns of it.
    let reason = 'reading: loop {
        let read = tokio::select! {
            read = socket.read(&mut chunk) => read,
            _ = closed.changed() => break "closed locally".to_owned(),
            _ = crate::clock::sleep_until(first_message_by) => {
                break format!(
                    "no whole message within {} s of connecting",
                    first_message_within.map_or(0, |d| d.as_secs())
                );
            }
        };
        match read {
            Ok(0) => break "connection closed by peer".to_owned(),
            Ok(n) => {
                decoder.extend(chunk.get(..n).unwrap_or_default());
                loop {
                    let buffered = decoder.buffered_len();
                    match decoder.next_message::<M>() {
                        Ok(Some(message)) => {
                            first_message_by = None;
                            let frame = buffered.saturating_sub(decoder.buffered_len());
                            let held = match &budget {
                                None => InputBytes::unbudgeted(),
                                Some(budget) => {
                                    let held = tokio::select! {
                                        held = budget.hold(frame) => held,
                                        _ = closed.changed() => break 'reading "closed locally".to_owned(),
                                    };
                                    match held {
                                        Some(held) => held,
                                        None => break 'reading "input budget closed".to_owned(),
                                    }
                                }
                            };
                            if let Some(unanswered) = &unanswered {
                                let room = tokio::select! {
                                    room = unanswered.take() => room,
                                    _ = closed.changed() => break 'reading "closed locally".to_owned(),
                                };
                                if !room {
                                    break 'reading "request bound closed".to_owned();
                                }
                            }
                            if report
                                .send(wrap(Inbound::Message(message), held))
                                .await
                                .is_err()
                            {
                                return;
                            }
                        }
                        Ok(None) => break,
                        Err(error) => {
                            let _ = report.send(wrap(Inbound::Malformed(error), none())).await;
                            // Keep the socket until the owner closes it, so its error reply can
                            // still be written; then report the close.
                            let _ = closed.changed().await;
                            let _ = report
                                .send(wrap(Inbound::Closed("malformed frame".into()), none()))
                                .await;
                            return;
                        }
                    }
                }
            }
            Err(error) => break error.to_string(),
        }
    };
    let _ = report.send(wrap(Inbound::Closed(reason), none())).await;
}

/// Why a dial did not give a connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DialError {
    /// No connection, or it broke during the handshake: worth another try.
    #[error("{0}")]
    Failed(String),
    /// The coordinator refused this side's credential, or could not prove its own.
    #[error("{address}: {error}")]
    Refused { address: String, error: AuthError },
}

/// Where a dialing driver connects, and what it proves there.
#[derive(Clone, Debug)]
pub struct DialTarget {
    pub address: String,
    pub max_frame_bytes: usize,
    /// Proven right after the connection opens (see [`crate::auth::initiate`]).
    pub credential: Option<Credential>,
    /// TLS first, verifying the server, if given.
    pub tls: Option<ClientTls>,
}

/// Opens a connection to `address`: TCP, then TLS if asked, then the credential's handshake.
pub async fn dial(
    address: &str,
    tls: Option<&ClientTls>,
    credential: Option<Credential>,
) -> Result<Stream, DialError> {
    let tcp = TcpStream::connect(address)
        .await
        .map_err(|error| DialError::Failed(format!("{address}: {error}")))?;
    let mut stream = match tls {
        None => Stream::Plain(tcp),
        Some(tls) => match tls.connect(address, tcp).await {
            Ok(stream) => stream,
            Err(DialTlsError::Broken(reason)) => {
                return Err(DialError::Failed(format!("{address}: {reason}")))
            }
            Err(DialTlsError::Refused(message)) => {
                return Err(DialError::Refused {
                    address: address.to_owned(),
                    error: AuthError::Refused {
                        code: herder_core::protocol::ErrorCode::Unauthenticated,
                        message,
                    },
                })
            }
        },
    };
    if let Some(credential) = credential {
        match crate::auth::initiate(&mut stream, credential).await {
            Ok(()) => {}
            Err(InitiateFailure::Refused(error)) => {
                return Err(DialError::Refused {
                    address: address.to_owned(),
                    error,
                })
            }
            Err(InitiateFailure::Broken(reason)) => {
                return Err(DialError::Failed(format!("{address}: {reason}")))
            }
        }
    }
    Ok(stream)
}

/// Connects to `target.address` in the background and, with a credential, authenticates. On success
/// the connection's reader reports through `report` (tagged by `wrap`); either way,
/// `connected` builds the one input that says how the attempt went, which is sent on `report`
/// too.
pub fn spawn_connect<M, T, F, C>(target: DialTarget, report: mpsc::Sender<T>, wrap: F, connected: C)
where
    M: WireMessage + Send + 'static,
    T: Send + 'static,
    F: Fn(Inbound<M>) -> T + Send + 'static,
    C: FnOnce(Result<Outbound, DialError>) -> T + Send + 'static,
{
    let DialTarget {
        address,
        max_frame_bytes,
        credential,
        tls,
    } = target;
    tokio::spawn(async move {
        let result = dial(&address, tls.as_ref(), credential)
            .await
            .map(|stream| spawn_connection(stream, max_frame_bytes, report.clone(), wrap));
        let _ = report.send(connected(result)).await;
    });
}

/// The single outgoing connection of a dialing driver (a worker or a client), tracked by the
/// machine's `ConnectAttempt`s: a connection that opens for an attempt the machine has given up on
/// is closed at once, and reports about an abandoned socket never touch the current one.
#[derive(Default)]
pub struct DialedConnection {
    /// The attempt the machine is waiting on.
    expected: Option<ConnectAttempt>,
    current: Option<(ConnectAttempt, Outbound)>,
}

impl DialedConnection {
    /// Starts connecting for `attempt` (see `spawn_connect`).
    pub fn dial<M, T, F, C>(
        &mut self,
        attempt: ConnectAttempt,
        target: DialTarget,
        report: mpsc::Sender<T>,
        wrap: F,
        connected: C,
    ) where
        M: WireMessage + Send + 'static,
        T: Send + 'static,
        F: Fn(Inbound<M>) -> T + Send + 'static,
        C: FnOnce(Result<Outbound, DialError>) -> T + Send + 'static,
    {
        self.expected = Some(attempt);
        spawn_connect(target, report, wrap, connected);
    }

    /// The connection for `attempt` opened. Returns false (and closes it) if the machine no longer
    /// waits for that attempt.
    pub fn opened(&mut self, attempt: ConnectAttempt, outbound: Outbound) -> bool {
        if self.expected != Some(attempt) {
            outbound.close();
            return false;
        }
        self.current = Some((attempt, outbound));
        true
    }

    /// The connection of `attempt` failed or closed; forget it if it is the current one.
    pub fn lost(&mut self, attempt: ConnectAttempt) {
        if self.current.as_ref().is_some_and(|(a, _)| *a == attempt) {
            if let Some((_, outbound)) = self.current.take() {
                outbound.close();
            }
        }
    }

    /// Sends on the current connection. `None` when there is none (the machine never sends
    /// then); otherwise the attempt it went out on and how the send went.
    pub fn send<M: Serialize>(
        &self,
        message: &M,
    ) -> Option<(ConnectAttempt, Result<(), SendError>)> {
        self.current
            .as_ref()
            .map(|(attempt, outbound)| (*attempt, outbound.send(message)))
    }

    /// Corks `message` on the current connection (see [`Outbound::send_corked`]); `flush`
    /// sends what is corked.
    pub fn send_corked<M: Serialize>(
        &self,
        message: &M,
    ) -> Option<(ConnectAttempt, Result<(), SendError>)> {
        self.current
            .as_ref()
            .map(|(attempt, outbound)| (*attempt, outbound.send_corked(message).map(|_first| ())))
    }

    /// Writes what is corked on the current connection.
    pub fn flush(&self) -> Option<(ConnectAttempt, Result<(), SendError>)> {
        self.current
            .as_ref()
            .map(|(attempt, outbound)| (*attempt, outbound.flush()))
    }

    /// Closes the current connection and stops waiting for any attempt.
    pub fn close(&mut self) {
        self.expected = None;
        if let Some((_, outbound)) = self.current.take() {
            outbound.close();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use herder_core::protocol::WorkerToCoordinator;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    #[tokio::test]
    async fn a_reader_whose_budget_is_spent_reads_nothing_more_until_a_message_is_handled() {
        let mut heartbeat = Vec::new();
        encode_frame(&WorkerToCoordinator::Heartbeat {}, 1024, &mut heartbeat).expect("encode");
        let frame = heartbeat.len();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut sender = TcpStream::connect(addr).await.expect("connect");
        let (accepted, _) = listener.accept().await.expect("accept");
        // Room for exactly three frames; five are sent at once.
        let budget = InputBudget::new(u32::try_from(3 * frame).expect("small"));
        let (report, mut received) = mpsc::channel(16);
        let (_outbound, reader) = open_connection(accepted, 1024);
        reader.start_budgeted(
            report,
            |inbound: Inbound<WorkerToCoordinator>, bytes| (inbound, bytes),
            ReaderLimits {
                budget: budget.clone(),
                first_message_within: std::time::Duration::from_secs(60),
                unanswered: None,
            },
        );
        sender
            .write_all(&heartbeat.repeat(5))
            .await
            .expect("send five frames");
        let mut held = Vec::new();
        for _ in 0..3 {
            let (inbound, bytes) = received.recv().await.expect("a message");
            assert!(matches!(
                inbound,
                Inbound::Message(WorkerToCoordinator::Heartbeat {})
            ));
            held.push(bytes);
        }
        // The three queued messages hold the whole budget, so the reader is waiting for room
        // before it may report a fourth.
        assert_eq!(budget.available(), 0);
        assert!(
            received.try_recv().is_err(),
            "a fourth message with no room left"
        );
        // Handling one message gives its bytes back: the fourth arrives.
        held.pop();
        let (inbound, _bytes) = received.recv().await.expect("the fourth message");
        assert!(matches!(
            inbound,
            Inbound::Message(WorkerToCoordinator::Heartbeat {})
        ));
    }

    #[tokio::test]
    async fn a_reader_with_its_requests_unanswered_reads_nothing_more_until_one_is_answered() {
        let mut heartbeat = Vec::new();
        encode_frame(&WorkerToCoordinator::Heartbeat {}, 1024, &mut heartbeat).expect("encode");
        let (mut sender, accepted) = connected_pair().await;
        let unanswered = Unanswered::new(2);
        let (report, mut received) = mpsc::channel(16);
        let (_outbound, reader) = open_connection(accepted, 1024);
        reader.start_budgeted(
            report,
            |inbound: Inbound<WorkerToCoordinator>, _| inbound,
            ReaderLimits {
                budget: InputBudget::new(1 << 20),
                first_message_within: std::time::Duration::from_secs(60),
                unanswered: Some(unanswered.clone()),
            },
        );
        sender
            .write_all(&heartbeat.repeat(3))
            .await
            .expect("send three frames");
        for _ in 0..2 {
            let inbound = received.recv().await.expect("a message");
            assert!(matches!(inbound, Inbound::Message(_)));
        }
        // Two read and unanswered: the reader waits for an answer before reporting a third.
        assert_eq!(unanswered.outstanding(), 2);
        assert!(received.try_recv().is_err(), "a third with no answer out");
        unanswered.answered();
        let inbound = received.recv().await.expect("the third message");
        assert!(matches!(inbound, Inbound::Message(_)));
        assert_eq!(unanswered.outstanding(), 2);
        // Answers beyond what was asked never widen the bound.
        for _ in 0..5 {
            unanswered.answered();
        }
        assert_eq!(unanswered.outstanding(), 0);
    }

    #[tokio::test]
    async fn a_reader_waiting_for_room_still_reports_the_close() {
        let mut heartbeat = Vec::new();
        encode_frame(&WorkerToCoordinator::Heartbeat {}, 1024, &mut heartbeat).expect("encode");
        let (mut sender, accepted) = connected_pair().await;
        let (report, mut received) = mpsc::channel(16);
        let (outbound, reader) = open_connection(accepted, 1024);
        reader.start_budgeted(
            report,
            |inbound: Inbound<WorkerToCoordinator>, _| inbound,
            ReaderLimits {
                budget: InputBudget::new(1 << 20),
                first_message_within: std::time::Duration::from_secs(60),
                unanswered: Some(Unanswered::new(1)),
            },
        );
        sender
            .write_all(&heartbeat.repeat(2))
            .await
            .expect("send two frames");
        assert!(matches!(received.recv().await, Some(Inbound::Message(_))));
        // The second waits for an answer that never comes; the connection is closed meanwhile.
        outbound.close();
        match received.recv().await.expect("a report") {
            Inbound::Closed(reason) => assert_eq!(reason, "closed locally"),
            other => panic!("expected the close, got {other:?}"),
        }
    }

    async fn connected_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let client = TcpStream::connect(addr).await.expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        (client, server)
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_never_sends_a_whole_message_is_closed() {
        let (mut sender, accepted) = connected_pair().await;
        let (report, mut received) = mpsc::channel(4);
        let (_outbound, reader) = open_connection(accepted, 1024);
        reader.start_budgeted(
            report,
            |inbound: Inbound<WorkerToCoordinator>, _| inbound,
            ReaderLimits {
                budget: InputBudget::new(1 << 20),
                first_message_within: std::time::Duration::from_secs(10),
                unanswered: None,
            },
        );
        // Half a frame header, then silence.
        sender.write_all(&[0, 0]).await.expect("write");
        match received.recv().await.expect("a report") {
            Inbound::Closed(reason) => assert!(reason.contains("no whole message"), "{reason}"),
            other => panic!("expected the connection closed, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn frames_written_at_once_and_frames_queued_behind_a_slow_reader_arrive_whole_in_order() {
        let (late_reader, accepted) = connected_pair().await;
        let (outbound, _reader) = open_connection(accepted, 1 << 20);
        // Numbered frames of 64 KiB: the first go straight into the kernel's buffer, until it
        // is full and the rest (and the rest of a frame it took only part of) wait in the queue.
        let frames = 96u64;
        let message = |seq: u64| WorkerToCoordinator::Progress {
            job_id: format!("{seq:032x}").parse().expect("a UUID"),
            lease_id: format!("{:032x}", 0).parse().expect("a UUID"),
            note: "x".repeat(64 * 1024),
        };
        for seq in 0..frames {
            outbound.send(&message(seq)).expect("queued");
        }
        assert!(
            outbound.queued.load(Ordering::Relaxed) > 0,
            "the peer read nothing yet, so some frames must wait in the queue"
        );
        let (report, mut received) = mpsc::channel(4);
        let (_unused, peer_reader) = open_connection(late_reader, 1 << 20);
        peer_reader.start(report, |inbound: Inbound<WorkerToCoordinator>| inbound);
        for seq in 0..frames {
            match received.recv().await.expect("a report") {
                Inbound::Message(got) => assert_eq!(got, message(seq), "frame {seq}"),
                other => panic!("expected frame {seq}, got {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn corked_frames_wait_for_the_flush_and_leave_in_the_order_they_were_sent() {
        let (peer, accepted) = connected_pair().await;
        let (outbound, _reader) = open_connection(accepted, 1 << 20);
        let note = |n: u64| WorkerToCoordinator::Progress {
            job_id: format!("{n:032x}").parse().expect("a UUID"),
            lease_id: format!("{:032x}", 0).parse().expect("a UUID"),
            note: format!("note {n}"),
        };
        assert!(
            outbound.send_corked(&note(1)).expect("corked"),
            "the first since a flush"
        );
        assert!(!outbound.send_corked(&note(2)).expect("corked"));
        // A flush would have written at once (one non-blocking write into the socket), so the
        // peer's socket holding nothing means nothing left.
        let mut byte = [0u8; 1];
        assert!(
            matches!(peer.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "nothing leaves before the flush"
        );
        let (report, mut received) = mpsc::channel(8);
        let (_unused, peer_reader) = open_connection(peer, 1 << 20);
        peer_reader.start(report, |inbound: Inbound<WorkerToCoordinator>| inbound);
        // A plain send flushes what was corked before it, ahead of itself.
        outbound.send(&note(3)).expect("sent");
        for n in 1..=3 {
            match received.recv().await.expect("a report") {
                Inbound::Message(got) => assert_eq!(got, note(n)),
                other => panic!("expected note {n}, got {other:?}"),
            }
        }
        outbound.send_corked(&note(4)).expect("corked");
        outbound.flush().expect("flushed");
        match received.recv().await.expect("a report") {
            Inbound::Message(got) => assert_eq!(got, note(4)),
            other => panic!("expected note 4, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn corking_for_a_peer_that_reads_nothing_meets_the_connections_bound() {
        let (_silent, accepted) = connected_pair().await;
        let (outbound, _reader) = open_connection(accepted, 2 << 20);
        let message = WorkerToCoordinator::Progress {
            job_id: format!("{:032x}", 1).parse().expect("a UUID"),
            lease_id: format!("{:032x}", 0).parse().expect("a UUID"),
            note: "x".repeat(1 << 20),
        };
        // One turn that corks far more than the connection may hold: the corked bytes are
        // counted as they grow, not only at the end of the turn.
        let frames = OUTBOUND_BYTES_MAX / (1 << 20) + 16;
        let refused = (0..frames).find_map(|_| outbound.send_corked(&message).err());
        assert!(
            matches!(refused, Some(SendError::Stalled { .. })),
            "expected the bound to refuse, got {refused:?}"
        );
        assert!(lock(&outbound.corked).capacity() <= 2 * CORKED_BYTES_MAX + (2 << 20));
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_stops_reading_is_disconnected_and_its_owner_told() {
        let (_silent, accepted) = connected_pair().await;
        let (report, mut received) = mpsc::channel(4);
        let (outbound, reader) = open_connection(accepted, 1 << 20);
        reader.start(report, |inbound: Inbound<WorkerToCoordinator>| inbound);
        // Far more than the kernel buffers hold: the writer's last write blocks for good.
        let text = "x".repeat(512 * 1024);
        let message = WorkerToCoordinator::Register {
            draining: false,
            tasks: herder_core::protocol::builtin_task_names(),
            worker_id: herder_core::ids::WorkerId(text),
            incarnation: herder_core::ids::Incarnation(1),
            capacity: 1,
            prefetch: 0,
            running: Vec::new(),
            finished: Vec::new(),
            queues: None,
        };
        for _ in 0..64 {
            if outbound.send(&message).is_err() {
                break;
            }
        }
        match received.recv().await.expect("a report") {
            Inbound::Closed(reason) => assert_eq!(reason, "closed locally"),
            other => panic!("expected the connection closed, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn connections_that_stop_reading_cannot_queue_more_than_their_shared_total() {
        const MAX: usize = 4 * 1024 * 1024;
        let total = OutboundTotal::new(MAX);
        let (_silent_a, a) = connected_pair().await;
        let (_silent_b, b) = connected_pair().await;
        let stall = WRITE_STALL_MAX;
        let mut sides = Vec::new();
        for accepted in [a, b] {
            let (report, received) = mpsc::channel(4);
            let (outbound, reader) =
                open_connection_within(accepted, 1 << 20, Some(total.clone()), stall);
            reader.start(report, |inbound: Inbound<WorkerToCoordinator>| inbound);
            sides.push((outbound, received));
        }
        let message = WorkerToCoordinator::Register {
            draining: false,
            tasks: herder_core::protocol::builtin_task_names(),
            worker_id: herder_core::ids::WorkerId("x".repeat(256 * 1024)),
            incarnation: herder_core::ids::Incarnation(1),
            capacity: 1,
            prefetch: 0,
            running: Vec::new(),
            finished: Vec::new(),
            queues: None,
        };
        // Neither peer reads: once the kernel buffers are full, every frame stays queued, and
        // the frame that would take the shared total past its bound is refused, on whichever
        // connection it was sent (which one depends on how much each writer got into its
        // kernel buffer first).
        let mut refused = None;
        'rounds: for _ in 0..400 {
            for (side, (outbound, _)) in sides.iter().enumerate() {
                if let Err(error) = outbound.send(&message) {
                    refused = Some((side, error));
                    break 'rounds;
                }
            }
            tokio::task::yield_now().await;
        }
        let Some((side, error)) = refused else {
            panic!("400 rounds of frames nobody reads were all queued");
        };
        assert!(
            matches!(error, SendError::OverTotal { max: MAX, .. }),
            "{error:?}"
        );
        assert!(total.queued() <= MAX, "{} bytes queued", total.queued());
        match sides[side].1.recv().await.expect("a report") {
            Inbound::Closed(reason) => assert_eq!(reason, "closed locally"),
            other => panic!("the refused connection is closed, got {other:?}"),
        }
    }

    #[test]
    fn a_port_refuses_connections_beyond_its_bound_until_one_closes() {
        let slots = ConnectionSlots::new(2);
        let first = slots.take().expect("room for one");
        let _second = slots.take().expect("room for two");
        assert!(slots.take().is_none(), "a third is refused");
        drop(first);
        assert!(
            slots.take().is_some(),
            "a closed connection frees its place"
        );
    }
}
