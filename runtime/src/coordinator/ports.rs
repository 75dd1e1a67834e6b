//! The worker and client ports: accepting connections within their bounds, refusing the
//! ones beyond them, and serving each accepted one (its handshake, then its reader and writer).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use herder_core::auth::Caller;
use herder_core::coordinator::Link;
use herder_core::ids::ConnectionId;
use herder_core::protocol::codec::encode_frame;
use herder_core::protocol::{ClientReply, CoordinatorToWorker, ErrorCode};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use super::{ConnectionLimits, Input};
use crate::auth::{self as handshake, Port, RefusalLog, ServerCredentials};
use crate::net::{
    open_connection_within, ConnectionSlot, ConnectionSlots, InputBudget, OutboundTotal,
    ReaderLimits, Unanswered,
};
use crate::tls::Stream;

/// Connections the kernel may hold for a port before the coordinator accepts them (the kernel
/// caps it at `net.core.somaxconn`): a burst of connects waits here instead of being dropped.
const LISTEN_BACKLOG: u32 = 4096;
/// Reads (of 4 KiB) a refused connection's pending bytes get before it is closed.
const REFUSAL_DRAIN_READS_MAX: usize = 16;
/// At most one warning per port this often about refused connections (with their count), so a
/// flood of connects cannot flood the log.
const REFUSAL_WARNING_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Binds `addr` with room for [`LISTEN_BACKLOG`] connections waiting to be accepted.
pub(super) fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
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
pub(super) struct PortContext {
    pub(super) link: Link,
    pub(super) max_frame_bytes: usize,
    pub(super) inputs: mpsc::Sender<Input>,
    pub(super) budget: InputBudget,
    /// Bytes queued for writing, shared by every client connection.
    pub(super) outbound: OutboundTotal,
    /// The rest of the connection bounds.
    pub(super) limits: ConnectionLimits,
    pub(super) credentials: ServerCredentials,
    pub(super) refusals: RefusalLog,
}

impl PortContext {
    fn port(&self) -> Port {
        match self.link {
            Link::Worker => Port::Worker,
            Link::Client => Port::Client,
        }
    }
}

pub(super) async fn accept_loop(
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
