//! Frame I/O over TCP: one reader task and one writer task per connection, speaking core's codec.
//!
//! The reader decodes frames with `FrameDecoder` and hands each message (or the first decode
//! error, after which it stops reading) to its owner through a channel. The writer owns the write
//! half: it coalesces queued frames into one write, and closes the socket when asked. Neither
//! makes any decision about what the bytes mean.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use herder_core::protocol::codec::{
    encode_frame, EncodeError, FrameDecoder, FrameError, WireMessage,
};
use herder_core::worker::ConnectAttempt;
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

/// Bytes queued for one connection before it is treated as a stalled peer and closed.
pub const OUTBOUND_BYTES_MAX: usize = 64 * 1024 * 1024;
/// Bytes read from a socket per read call.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Frames coalesced into one write at most.
const WRITE_COALESCE_MAX: usize = 256;

enum WriteCommand {
    Frame(Vec<u8>),
    Close,
}

/// The sending side of a connection. Cheap to clone; sends never block.
#[derive(Clone)]
pub struct Outbound {
    tx: mpsc::UnboundedSender<WriteCommand>,
    queued: Arc<AtomicUsize>,
    max_frame_bytes: usize,
}

/// Why a message could not be queued.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("connection is closed")]
    Closed,
    #[error("peer is not reading: {queued} bytes already queued")]
    Stalled { queued: usize },
    #[error(transparent)]
    Encode(#[from] EncodeError),
}

impl Outbound {
    /// Encodes and queues one message.
    pub fn send<M: Serialize>(&self, message: &M) -> Result<(), SendError> {
        let mut frame = Vec::new();
        encode_frame(message, self.max_frame_bytes, &mut frame)?;
        let queued = self.queued.fetch_add(frame.len(), Ordering::Relaxed) + frame.len();
        if queued > OUTBOUND_BYTES_MAX {
            self.close();
            return Err(SendError::Stalled { queued });
        }
        self.tx
            .send(WriteCommand::Frame(frame))
            .map_err(|_| SendError::Closed)
    }

    /// Flushes what is queued, then closes the connection.
    pub fn close(&self) {
        let _ = self.tx.send(WriteCommand::Close);
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

/// The read half of a connection whose reader has not started yet.
pub struct PendingReader {
    socket: OwnedReadHalf,
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
            wrap,
            self.closed,
        ));
    }
}

/// Starts the writer task of `stream` and hands back its `Outbound`, with the reader still to be
/// started. An owner that must learn of the connection before its first message (the
/// coordinator registers every connection before reading from it) starts the reader afterwards.
pub fn open_connection(stream: TcpStream, max_frame_bytes: usize) -> (Outbound, PendingReader) {
    let _ = stream.set_nodelay(true);
    let (read_half, write_half) = stream.into_split();
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let (closed_tx, closed_rx) = watch::channel(false);
    tokio::spawn(write_loop(write_half, rx, queued.clone(), closed_tx));
    let outbound = Outbound {
        tx,
        queued,
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
    stream: TcpStream,
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

async fn write_loop(
    mut socket: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<WriteCommand>,
    queued: Arc<AtomicUsize>,
    closed: watch::Sender<bool>,
) {
    let mut buffer = Vec::new();
    'outer: while let Some(command) = rx.recv().await {
        let mut close = false;
        let mut pending = Some(command);
        let mut frames = 0;
        while let Some(command) = pending.take() {
            match command {
                WriteCommand::Frame(frame) => {
                    queued.fetch_sub(frame.len(), Ordering::Relaxed);
                    buffer.extend_from_slice(&frame);
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
            if socket.write_all(&buffer).await.is_err() {
                break 'outer;
            }
            buffer.clear();
        }
        if close {
            break;
        }
    }
    let _ = socket.shutdown().await;
    let _ = closed.send(true);
}

async fn read_loop<M, T, F>(
    mut socket: OwnedReadHalf,
    max_frame_bytes: usize,
    report: mpsc::Sender<T>,
    wrap: F,
    mut closed: watch::Receiver<bool>,
) where
    M: WireMessage,
    F: Fn(Inbound<M>) -> T,
{
    let mut decoder = FrameDecoder::new(max_frame_bytes);
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    let reason = loop {
        let read = tokio::select! {
            read = socket.read(&mut chunk) => read,
            _ = closed.changed() => break "closed locally".to_owned(),
        };
        match read {
            Ok(0) => break "connection closed by peer".to_owned(),
            Ok(n) => {
                decoder.extend(chunk.get(..n).unwrap_or_default());
                loop {
                    match decoder.next_message::<M>() {
                        Ok(Some(message)) => {
                            if report.send(wrap(Inbound::Message(message))).await.is_err() {
                                return;
                            }
                        }
                        Ok(None) => break,
                        Err(error) => {
                            let _ = report.send(wrap(Inbound::Malformed(error))).await;
                            // Keep the socket until the owner closes it, so its error reply can
                            // still be written; then report the close.
                            let _ = closed.changed().await;
                            let _ = report
                                .send(wrap(Inbound::Closed("malformed frame".into())))
                                .await;
                            return;
                        }
                    }
                }
            }
            Err(error) => break error.to_string(),
        }
    };
    let _ = report.send(wrap(Inbound::Closed(reason))).await;
}

/// Connects to `address` in the background. On success the connection's reader reports through
/// `report` (tagged by `wrap`); either way, `connected` builds the one input that says how the
/// attempt went, which is sent on `report` too.
pub fn spawn_connect<M, T, F, C>(
    address: String,
    max_frame_bytes: usize,
    report: mpsc::Sender<T>,
    wrap: F,
    connected: C,
) where
    M: WireMessage + Send + 'static,
    T: Send + 'static,
    F: Fn(Inbound<M>) -> T + Send + 'static,
    C: FnOnce(Result<Outbound, String>) -> T + Send + 'static,
{
    tokio::spawn(async move {
        let result = match TcpStream::connect(&address).await {
            Ok(stream) => Ok(spawn_connection(
                stream,
                max_frame_bytes,
                report.clone(),
                wrap,
            )),
            Err(error) => Err(format!("{address}: {error}")),
        };
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
        address: String,
        max_frame_bytes: usize,
        report: mpsc::Sender<T>,
        wrap: F,
        connected: C,
    ) where
        M: WireMessage + Send + 'static,
        T: Send + 'static,
        F: Fn(Inbound<M>) -> T + Send + 'static,
        C: FnOnce(Result<Outbound, String>) -> T + Send + 'static,
    {
        self.expected = Some(attempt);
        spawn_connect(address, max_frame_bytes, report, wrap, connected);
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

    /// Closes the current connection and stops waiting for any attempt.
    pub fn close(&mut self) {
        self.expected = None;
        if let Some((_, outbound)) = self.current.take() {
            outbound.close();
        }
    }
}
