//! The idle-connection timeout (`server.idle_connection_timeout_ms`): a connection with no open gRPC
//! stream for that long is closed. HTTP/2 keeps no such timer (its keepalive pings only find dead
//! peers), so the count of open streams is kept here: the acceptor registers each connection's
//! [`Activity`] under its peer address in [`Connections`], and [`StreamTrackingLayer`], in front of
//! every service, finds it through the request's connect info and holds one count per call until the
//! call's response body is dropped. The connection's reader ([`IdleTimer`]) reports end of stream once
//! the count has been zero for the timeout, and HTTP/2 closes the connection.
//!
//! Invariants: a connection is never closed while a call on it is open; a call whose connection is
//! not registered (it cannot be, but nothing depends on it) is simply not counted; a connection's
//! registration ends when the connection is dropped.
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

/// The open streams of one connection and since when it has had none.
#[derive(Debug)]
pub struct Activity {
    open_streams: AtomicUsize,
    idle_since: Mutex<Instant>,
    /// The connection's reader, woken when its last stream closes so it arms its timer.
    reader: AtomicWaker,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            open_streams: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            reader: AtomicWaker::new(),
        }
    }

    fn idle_since(&self) -> Instant {
        *self.idle_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stream_opened(self: &Arc<Self>) -> StreamGuard {
        self.open_streams.fetch_add(1, Ordering::AcqRel);
        StreamGuard(Arc::clone(self))
    }
}

/// Holds one open stream of a connection.
#[derive(Debug)]
pub struct StreamGuard(Arc<Activity>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        // Stamp the time before the count reaches zero, so a reader that sees zero sees the stamp.
        *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        if self.0.open_streams.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.reader.wake();
        }
    }
}

/// Every accepted connection's activity, by peer address.
#[derive(Debug, Default)]
pub struct Connections {
    by_peer: Mutex<HashMap<SocketAddr, Arc<Activity>>>,
}

impl Connections {
    pub fn new() -> Arc<Connections> {
        Arc::new(Connections::default())
    }

    /// Registers a new connection from `peer`, closed after `timeout` without an open stream.
    pub(super) fn register(self: &Arc<Self>, peer: SocketAddr, timeout: Duration) -> IdleTimer {
        let activity = Arc::new(Activity::new());
        self.lock().insert(peer, Arc::clone(&activity));
        IdleTimer {
            deadline: Box::pin(tokio::time::sleep(timeout)),
            activity,
            timeout,
            registry: Arc::clone(self),
            peer,
        }
    }

    fn activity(&self, peer: &SocketAddr) -> Option<Arc<Activity>> {
        self.lock().get(peer).cloned()
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SocketAddr, Arc<Activity>>> {
        self.by_peer.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A connection's idle timer; its registration ends when it is dropped.
#[derive(Debug)]
pub struct IdleTimer {
    activity: Arc<Activity>,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
    registry: Arc<Connections>,
    peer: SocketAddr,
}

impl IdleTimer {
    /// Whether the connection has had no open stream for the timeout (wakes `cx` when it will).
    pub(super) fn poll_idle(&mut self, cx: &mut Context<'_>) -> bool {
        self.activity.reader.register(cx.waker());
        if self.activity.open_streams.load(Ordering::Acquire) > 0 {
            return false;
        }
        let due = self.activity.idle_since() + self.timeout;
        if self.deadline.deadline() != due {
            self.deadline.as_mut().reset(due);
        }
        self.deadline.as_mut().poll(cx).is_ready()
            && self.activity.open_streams.load(Ordering::Acquire) == 0
    }
}

impl Drop for IdleTimer {
    fn drop(&mut self) {
        let mut by_peer = self.registry.lock();
        if by_peer
            .get(&self.peer)
            .is_some_and(|a| Arc::ptr_eq(a, &self.activity))
        {
            by_peer.remove(&self.peer);
        }
    }
}

/// Counts the calls open on each connection (see the module documentation).
#[derive(Debug, Clone)]
pub struct StreamTrackingLayer {
    connections: Arc<Connections>,
}

impl StreamTrackingLayer {
    pub fn new(connections: Arc<Connections>) -> StreamTrackingLayer {
        StreamTrackingLayer { connections }
    }
}

impl<S> tower::Layer<S> for StreamTrackingLayer {
    type Service = StreamTracking<S>;
    fn layer(&self, inner: S) -> StreamTracking<S> {
        StreamTracking {
            inner,
            connections: Arc::clone(&self.connections),
        }
    }
}

/// The service [`StreamTrackingLayer`] wraps.
#[derive(Debug, Clone)]
pub struct StreamTracking<S> {
    inner: S,
    connections: Arc<Connections>,
}

fn peer(extensions: &http::Extensions) -> Option<SocketAddr> {
    if let Some(tls) = extensions.get::<TlsConnectInfo<TcpConnectInfo>>() {
        return tls.get_ref().remote_addr();
    }
    extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for StreamTracking<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<TrackedBody<ResBody>>;
    type Error = S::Error;
    type Future = TrackedCall<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let guard = peer(request.extensions())
            .and_then(|peer| self.connections.activity(&peer))
            .map(|activity| activity.stream_opened());
        TrackedCall {
            inner: self.inner.call(request),
            guard,
        }
    }
}

pin_project! {
    /// A call in flight; hands its stream count to the response body.
    pub struct TrackedCall<F> {
        #[pin]
        inner: F,
        guard: Option<StreamGuard>,
    }
}

impl<F, B, E> Future for TrackedCall<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx))?;
        let guard = this.guard.take();
        Poll::Ready(Ok(response.map(|body| TrackedBody {
            inner: body,
            _guard: guard,
        })))
    }
}

pin_project! {
    /// A response body that holds its call's stream count until it is dropped.
    pub struct TrackedBody<B> {
        #[pin]
        inner: B,
        _guard: Option<StreamGuard>,
    }
}

impl<B: Default> Default for TrackedBody<B> {
    fn default() -> Self {
        TrackedBody {
            inner: B::default(),
            _guard: None,
        }
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> SocketAddr {
        "127.0.0.1:40000".parse().unwrap()
    }

    #[tokio::test]
    async fn a_connection_is_idle_only_without_open_streams() {
        let timeout = Duration::from_millis(50);
        let connections = Connections::new();
        let mut timer = connections.register(peer(), timeout);
        let poll = |timer: &mut IdleTimer| {
            let waker = futures::task::noop_waker();
            timer.poll_idle(&mut Context::from_waker(&waker))
        };
        let stream = connections.activity(&peer()).unwrap().stream_opened();
        tokio::time::sleep(timeout * 3).await;
        assert!(!poll(&mut timer), "idle while a stream is open");
        drop(stream);
        tokio::time::sleep(timeout * 2).await;
        assert!(poll(&mut timer), "idle once the last stream ended");
        drop(timer);
        assert!(
            connections.is_empty(),
            "the registration ends with the connection"
        );
    }
}
