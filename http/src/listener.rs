//! A listener that keeps at most a fixed number of connections open: it accepts the next one
//! only once a slot is free, and each connection gives its slot back when it closes.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

pub struct Bounded {
    listener: TcpListener,
    slots: Arc<Semaphore>,
}

impl Bounded {
    pub fn new(listener: TcpListener, max: usize) -> Bounded {
        Bounded {
            listener,
            slots: Arc::new(Semaphore::new(max)),
        }
    }
}

/// A connection holding its slot.
pub struct Slotted {
    stream: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl axum::serve::Listener for Bounded {
    type Io = Slotted;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Slotted, SocketAddr) {
        loop {
            // The semaphore is never closed, so this only waits.
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                continue;
            };
            match self.listener.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    return (
                        Slotted {
                            stream,
                            _slot: slot,
                        },
                        addr,
                    );
                }
                Err(error) => {
                    // Usually descriptor exhaustion: back off briefly rather than spin.
                    tracing::warn!(%error, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
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
