//! Accepting TCP connections for the gRPC server, with the limits tonic does not have: at most
//! `server.max_connections` open at once (a connection past it is closed at once, so idle sockets
//! cannot use up the daemon's file descriptors), and a handshake deadline: a connection must send its
//! first 24 bytes (the HTTP/2 client preface, or a TLS client hello) within
//! `server.handshake_timeout_ms` or it is closed. Accept errors (such as running out of file
//! descriptors) are logged and retried after a pause instead of spinning. A connection without an
//! open stream for `server.idle_connection_timeout_ms` is closed ([`idle`]).
//!
//! Invariant: every connection handed to the server holds one place of the connection limit until it
//! is dropped (closed).
//!
//! Also the counting limits of concurrent streams and jobs ([`StreamLimit`], [`PrincipalStreamLimit`]),
//! which the gRPC services and the table jobs ([`crate::jobs`]) take their places of.
mod idle;
mod limit;

pub use idle::{Connections, StreamTrackingLayer};
pub use limit::{LimitExceeded, PrincipalSlot, PrincipalStreamLimit, StreamLimit, StreamSlot};

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Bytes a client must send before the handshake deadline: the length of the HTTP/2 preface.
const HANDSHAKE_BYTES: usize = 24;
/// Pause after a failed accept (for example EMFILE) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);
/// Pause between looks at a connection that has sent part of its first bytes.
const HANDSHAKE_POLL: Duration = Duration::from_millis(5);

/// A connection accepted within the limits; holds its place of `server.max_connections`.
#[derive(Debug)]
pub struct LimitedConnection {
    stream: TcpStream,
    idle: idle::IdleTimer,
    _place: OwnedSemaphorePermit,
}

impl Connected for LimitedConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for LimitedConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.idle.poll_idle(cx) {
            tracing::debug!(
                "closing a connection without open streams (server.idle_connection_timeout_ms)"
            );
            // End of stream: HTTP/2 closes the connection.
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Whether the client sent its first [`HANDSHAKE_BYTES`] bytes (not consumed: the server reads them).
async fn sent_handshake(stream: &TcpStream) -> bool {
    let mut first = [0u8; HANDSHAKE_BYTES];
    loop {
        match stream.peek(&mut first).await {
            Ok(n) if n >= HANDSHAKE_BYTES => return true,
            Ok(0) | Err(_) => return false,
            Ok(_) => tokio::time::sleep(HANDSHAKE_POLL).await,
        }
    }
}

/// One connection accepted within a connection limit: the stream (no delay set), its peer and its
/// place of the limit, held until the connection is dropped.
#[derive(Debug)]
pub struct Admitted {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    pub place: OwnedSemaphorePermit,
}

/// The next connection on `listener` that gets a place of `places` (one per open connection), or
/// `None` once `stop` turns true. A failed accept (such as running out of file descriptors) is
/// logged and retried after a pause; a connection past the limit is closed at once, and a run of
/// such refusals is logged once, naming `limit_key`, so a flood cannot flood the log. Both
/// listeners, gRPC ([`accept`]) and the workbench's, accept through this.
pub async fn accept_within(
    listener: &TcpListener,
    places: &Arc<Semaphore>,
    limit_key: &'static str,
    stop: &mut watch::Receiver<bool>,
) -> Option<Admitted> {
    let mut refusing = false;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|stop| *stop) => return None,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                tracing::warn!(%err, "accepting a connection failed; retrying");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let Ok(place) = Arc::clone(places).try_acquire_owned() else {
            if !refusing {
                tracing::warn!("connections refused: {limit_key} are open");
                refusing = true;
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        return Some(Admitted {
            stream,
            peer,
            place,
        });
    }
}

/// The limits and timeouts [`accept`] applies.
#[derive(Debug, Clone)]
pub struct AcceptLimits {
    pub max_connections: usize,
    pub handshake_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Accepts connections on `listener` until `stop` turns true, yielding those within the limits and
/// registering each in `connections` (for the idle timeout).
pub fn accept(
    listener: TcpListener,
    limits: AcceptLimits,
    connections: Arc<Connections>,
    mut stop: watch::Receiver<bool>,
) -> ReceiverStream<std::io::Result<LimitedConnection>> {
    let AcceptLimits {
        max_connections,
        handshake_timeout,
        idle_timeout,
    } = limits;
    let (ready, incoming) = mpsc::channel(1024);
    let places = Arc::new(Semaphore::new(max_connections));
    tokio::spawn(async move {
        loop {
            let Some(Admitted {
                stream,
                peer,
                place,
            }) = accept_within(&listener, &places, "server.max_connections", &mut stop).await
            else {
                return;
            };
            let ready = ready.clone();
            let connections = Arc::clone(&connections);
            tokio::spawn(async move {
                match tokio::time::timeout(handshake_timeout, sent_handshake(&stream)).await {
                    Ok(true) => {
                        let connection = LimitedConnection {
                            stream,
                            idle: connections.register(peer, idle_timeout),
                            _place: place,
                        };
                        let _ = ready.send(Ok(connection)).await;
                    }
                    Ok(false) => {}
                    Err(_) => tracing::debug!(
                        "connection closed: no handshake within server.handshake_timeout_ms"
                    ),
                }
            });
        }
    });
    ReceiverStream::new(incoming)
}
