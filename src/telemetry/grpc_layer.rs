//! One tower layer in front of every gRPC service: counts calls started and handled by service,
//! method and status code, and times them (`grpc_server_*`, the names of go-grpc-prometheus).
//!
//! The status of a call is read where gRPC puts it: the `grpc-status` header of a trailers-only
//! response (an error returned before any message), or the trailers at the end of the response body
//! (every stream, and unary successes). A response body dropped before its trailers is a call the
//! client abandoned, counted as `Canceled`; a body that ends without a status counts as `Unknown`.
//!
//! Invariant: label values come from a fixed set — the services and methods of the descriptor sets
//! given to [`GrpcMetricsLayer::new`]; any other path is labelled `unknown`, so a client cannot grow
//! the number of series by inventing method names.
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use prost::Message;

use super::catalog;

/// Service and method labels of one known gRPC path.
#[derive(Debug, Clone)]
struct MethodLabels {
    service: Arc<str>,
    method: Arc<str>,
}

/// The layer; clone it freely (the method table is shared).
#[derive(Debug, Clone)]
pub struct GrpcMetricsLayer {
    methods: Arc<HashMap<String, MethodLabels>>,
}

impl GrpcMetricsLayer {
    /// Knows the methods of every service in the encoded `FileDescriptorSet`s.
    pub fn new(descriptor_sets: &[&[u8]]) -> GrpcMetricsLayer {
        let mut methods = HashMap::new();
        for bytes in descriptor_sets {
            let Ok(set) = prost_types::FileDescriptorSet::decode(*bytes) else {
                tracing::warn!("undecodable file descriptor set; its methods are labelled unknown");
                continue;
            };
            for file in set.file {
                let package = file.package.unwrap_or_default();
                for service in file.service {
                    let name = service.name.unwrap_or_default();
                    let full: Arc<str> = if package.is_empty() {
                        name.into()
                    } else {
                        format!("{package}.{name}").into()
                    };
                    for method in service.method {
                        let method: Arc<str> = method.name.unwrap_or_default().into();
                        methods.insert(
                            format!("/{full}/{method}"),
                            MethodLabels {
                                service: Arc::clone(&full),
                                method,
                            },
                        );
                    }
                }
            }
        }
        GrpcMetricsLayer {
            methods: Arc::new(methods),
        }
    }

    fn labels(&self, path: &str) -> MethodLabels {
        self.methods
            .get(path)
            .cloned()
            .unwrap_or_else(|| MethodLabels {
                service: "unknown".into(),
                method: "unknown".into(),
            })
    }
}

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;
    fn layer(&self, inner: S) -> GrpcMetrics<S> {
        GrpcMetrics {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service the layer wraps around the gRPC router.
#[derive(Debug, Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
    layer: GrpcMetricsLayer,
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for GrpcMetrics<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<MeteredBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let call = Call::start(self.layer.labels(request.uri().path()));
        ResponseFuture {
            inner: self.inner.call(request),
            call: Some(call),
        }
    }
}

/// One call in flight; records its status exactly once, when it is known or when it is dropped.
#[derive(Debug)]
struct Call {
    labels: MethodLabels,
    started: Instant,
    done: bool,
}

impl Call {
    fn start(labels: MethodLabels) -> Call {
        metrics::counter!(
            catalog::GRPC_STARTED,
            "grpc_service" => labels.service.to_string(),
            "grpc_method" => labels.method.to_string(),
        )
        .increment(1);
        Call {
            labels,
            started: Instant::now(),
            done: false,
        }
    }

    fn finish(&mut self, code: tonic::Code) {
        if self.done {
            return;
        }
        self.done = true;
        let service = self.labels.service.to_string();
        let method = self.labels.method.to_string();
        metrics::histogram!(
            catalog::GRPC_HANDLING_SECONDS,
            "grpc_service" => service.clone(),
            "grpc_method" => method.clone(),
        )
        .record(self.started.elapsed().as_secs_f64());
        metrics::counter!(
            catalog::GRPC_HANDLED,
            "grpc_service" => service,
            "grpc_method" => method,
            "grpc_code" => code_name(code),
        )
        .increment(1);
    }

    /// Records the status in `headers` (a trailers-only response or trailers), if there is one.
    fn observe(&mut self, headers: &http::HeaderMap) -> bool {
        match headers.get("grpc-status") {
            Some(value) => {
                let code = value
                    .to_str()
                    .ok()
                    .and_then(|s| s.parse::<i32>().ok())
                    .map_or(tonic::Code::Unknown, tonic::Code::from_i32);
                self.finish(code);
                true
            }
            None => false,
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        self.finish(tonic::Code::Cancelled);
    }
}

/// The code's name as gRPC's other implementations print it (so go-grpc-prometheus dashboards match).
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

pin_project! {
    /// The future of a metered call: hands the response body its [`Call`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
    }
}

impl<F, ResBody, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
{
    type Output = Result<http::Response<MeteredBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = std::task::ready!(this.inner.poll(cx));
        let mut call = this.call.take();
        Poll::Ready(match result {
            Ok(response) => {
                if let Some(call) = call.as_mut() {
                    call.observe(response.headers());
                }
                Ok(response.map(|inner| MeteredBody { inner, call }))
            }
            Err(err) => {
                if let Some(call) = call.as_mut() {
                    call.finish(tonic::Code::Internal);
                }
                Err(err)
            }
        })
    }
}

pin_project! {
    /// A response body that records its call's status from the trailers.
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
    }
}

impl<B: Body> Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = std::task::ready!(this.inner.poll_frame(cx));
        if let Some(call) = this.call.as_mut() {
            match &polled {
                Some(Ok(frame)) => {
                    if let Some(trailers) = frame.trailers_ref() {
                        call.observe(trailers);
                    }
                }
                Some(Err(_)) => call.finish(tonic::Code::Internal),
                None => call.finish(tonic::Code::Unknown),
            }
        }
        Poll::Ready(polled)
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

    #[test]
    fn known_paths_get_their_labels_and_others_unknown() {
        let layer = GrpcMetricsLayer::new(&[
            crate::proto::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
        ]);
        let labels = layer.labels("/cloakd.v1.LocationBroker/Submit");
        assert_eq!(&*labels.service, "cloakd.v1.LocationBroker");
        assert_eq!(&*labels.method, "Submit");
        let labels = layer.labels("/grpc.health.v1.Health/Check");
        assert_eq!(&*labels.service, "grpc.health.v1.Health");
        let labels = layer.labels("/cloakd.v1.LocationBroker/Invented");
        assert_eq!(&*labels.service, "unknown");
        assert_eq!(&*labels.method, "unknown");
    }
}
