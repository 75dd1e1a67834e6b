//! A listener that keeps at most a fixed number of connections open: it accepts the next one
//! only once a slot is free, and each connection gives its slot back when it closes.
//!
//! With TLS, each accepted connection's handshake runs on a task of its own, within
//! [`TLS_HANDSHAKE_WITHIN`] and holding its slot, so a slow client holds up nobody else; a
//! client that speaks plain HTTP to the HTTPS port gets a plain answer saying so.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use herder_runtime::tls::{opens_with_tls, ServerTls, Stream, TlsPort};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// How long a new connection may take over its TLS handshake.
pub const TLS_HANDSHAKE_WITHIN: Duration = Duration::from_secs(10);

const PLAIN_TO_TLS_ANSWER: &[u8] = b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\ncontent-length: 49\r\n\r\nThis port speaks HTTPS: use https:// to reach it\n";

pub struct Bounded {
    addr: io::Result<SocketAddr>,
    ready: mpsc::Receiver<(Slotted, SocketAddr)>,
}

impl Bounded {
    /// Starts accepting on `listener` (on the current runtime); connections are handed out by
    /// `accept`, after their TLS handshake if `tls` is given.
    pub fn new(listener: TcpListener, max: usize, tls: Option<ServerTls>) -> Bounded {
        let addr = listener.local_addr();
        let (tx, ready) = mpsc::channel(max.max(1));
        let slots = Arc::new(Semaphore::new(max));
        tokio::spawn(accept_loop(listener, slots, tls, tx));
        Bounded { addr, ready }
    }
}

async fn accept_loop(
    listener: TcpListener,
    slots: Arc<Semaphore>,
    tls: Option<ServerTls>,
    ready: mpsc::Sender<(Slotted, SocketAddr)>,
) {
    loop {
        // The semaphore is never closed, so this only waits.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let (stream, addr) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Usually descriptor exhaustion: back off briefly rather than spin.
                    tracing::warn!(%error, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = ready.closed() => return,
        };
        let _ = stream.set_nodelay(true);
        match &tls {
            None => {
                let slotted = Slotted {
                    stream: Stream::Plain(stream),
                    _slot: slot,
                };
                if ready.send((slotted, addr)).await.is_err() {
                    return;
                }
            }
            Some(tls) => {
                let (tls, ready) = (tls.clone(), ready.clone());
                tokio::spawn(async move {
                    let handshake =
                        tokio::time::timeout(TLS_HANDSHAKE_WITHIN, secure(stream, &tls));
                    match handshake.await {
                        Ok(Ok(stream)) => {
                            let _ = ready
                                .send((
                                    Slotted {
                                        stream,
                                        _slot: slot,
                                    },
                                    addr,
                                ))
                                .await;
                        }
                        Ok(Err(error)) => tracing::debug!(%addr, %error, "HTTPS handshake failed"),
                        Err(_) => tracing::debug!(%addr, "no HTTPS handshake in time"),
                    }
                });
            }
        }
    }
}

async fn secure(mut stream: TcpStream, tls: &ServerTls) -> io::Result<Stream> {
    if !opens_with_tls(&stream).await? {
        stream.write_all(PLAIN_TO_TLS_ANSWER).await?;
        let _ = stream.shutdown().await;
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "plain HTTP on the HTTPS port",
        ));
    }
    let acceptor = tls
        .acceptor(TlsPort::ServerOnly)
        .map_err(|e| io::Error::other(e.to_string()))?;
    let stream = acceptor.accept(stream).await?;
    Ok(Stream::Tls(Box::new(stream.into())))
}

/// A connection holding its slot.
pub struct Slotted {
    stream: Stream,
    _slot: OwnedSemaphorePermit,
}

impl axum::serve::Listener for Bounded {
    type Io = Slotted;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Slotted, SocketAddr) {
        match self.ready.recv().await {
            Some(ready) => ready,
            // The accepting task ended (its listener failed for good): serve nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.addr {
            Ok(addr) => Ok(*addr),
            Err(error) => Err(io::Error::new(error.kind(), error.to_string())),
        }
    }
}

impl AsyncRead for Slotted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Slotted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
