//! The workbench's HTTP/1.1 listener, with the limits a listener open to any local process needs so
//! that it cannot starve the daemon: at most `ui.max_connections` connections open at once (one past
//! it is closed at once, so idle sockets cannot use up the daemon's file descriptors and the gRPC
//! listener keeps accepting); a request's line and headers must arrive within
//! `ui.header_timeout_ms` (hyper's header read timeout, which also runs while a kept-alive
//! connection waits for its next request); a request body that sends nothing, or a response the
//! client does not read, for `ui.idle_timeout_ms` ends the request or the connection. Accept errors
//! (such as running out of file descriptors) are logged and retried after a pause.
//!
//! Invariants: every connection being served holds one place of `ui.max_connections` until it is
//! closed; a handler that is computing (no byte to read or write) is never timed out here; at
//! shutdown every connection finishes its request in flight and closes, then [`serve`] returns.
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http_body::Frame;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::connections::{Admitted, accept_within};
use tokio::time::Sleep;

/// The limits [`serve`] applies (from `[ui]`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Serves `app` on `listener` within `limits` until `stop` turns true, then waits for the open
/// connections to finish their request in flight.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
) {
    let places = Arc::new(Semaphore::new(limits.max_connections));
    while let Some(Admitted {
        stream,
        peer,
        place,
    }) = accept_within(&listener, &places, "ui.max_connections", &mut stop).await
    {
        tokio::spawn(connection(
            stream,
            peer,
            app.clone(),
            limits,
            stop.clone(),
            place,
        ));
    }
    drop(listener);
    // Every place back: every connection closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = places.acquire_many(all).await;
}

/// Serves one connection; its place is freed when it ends.
async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    app: Router,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
    _place: OwnedSemaphorePermit,
) {
    let idle = limits.idle_timeout;
    let service =
        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
            let mut request = request.map(|body| Body::new(IdleBody::new(body, idle)));
            request.extensions_mut().insert(ConnectInfo(peer));
            tower::ServiceExt::oneshot(app.clone(), request)
        });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .serve_connection(TokioIo::new(Unread::new(stream, idle)), service);
    let mut conn = std::pin::pin!(conn);
    let mut stopping = false;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(err) = done {
                    tracing::debug!(%err, "workbench connection ended");
                }
                return;
            }
            _ = stop.wait_for(|stop| *stop), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// Why a request body ended early: nothing arrived for `ui.idle_timeout_ms`.
#[derive(Debug, thiserror::Error)]
#[error("no byte of the body for ui.idle_timeout_ms = {0} ms")]
pub struct BodyIdle(pub u128);

pin_project_lite::pin_project! {
    /// A request body whose next frame must come within the idle timeout.
    struct IdleBody {
        #[pin]
        inner: hyper::body::Incoming,
        timeout: Duration,
        #[pin]
        deadline: Sleep,
    }
}

impl IdleBody {
    fn new(inner: hyper::body::Incoming, timeout: Duration) -> IdleBody {
        IdleBody {
            inner,
            timeout,
            deadline: tokio::time::sleep(timeout),
        }
    }
}

impl http_body::Body for IdleBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(frame) => {
                let next = tokio::time::Instant::now() + *this.timeout;
                this.deadline.as_mut().reset(next);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                if this.deadline.poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(Box::new(BodyIdle(this.timeout.as_millis())))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A connection whose writes fail once the client has accepted no byte for the idle timeout (a
/// client that does not read its response cannot hold the connection).
struct Unread {
    stream: TcpStream,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl Unread {
    fn new(stream: TcpStream, timeout: Duration) -> Unread {
        Unread {
            stream,
            timeout,
            stalled: None,
        }
    }

    /// After a write made no progress: an error once it has made none for the timeout.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<T>> {
        let timeout = self.timeout;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if stalled.as_mut().poll(cx).is_ready() {
            tracing::debug!(
                "closing a workbench connection that reads nothing (ui.idle_timeout_ms)"
            );
            return Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client read nothing for ui.idle_timeout_ms",
            )));
        }
        Poll::Pending
    }
}

impl AsyncRead for Unread {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Unread {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.stream).poll_write(cx, buf) {
            Poll::Pending => self.pending(cx),
            done => {
                self.stalled = None;
                done
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match Pin::new(&mut self.stream).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.pending(cx),
            done => {
                self.stalled = None;
                done
            }
        }
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
