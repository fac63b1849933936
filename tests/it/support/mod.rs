//! Shared by the integration tests: start the real daemon on 127.0.0.1:0 and connect real clients.
#![allow(dead_code)]
pub mod nats;
pub mod process;
use std::net::SocketAddr;
use std::time::Duration;

use cloakd::config::Config;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// A daemon running in this test's runtime.
pub struct TestDaemon {
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// A fresh transaction data directory when the config left the default `./data`.
    _data_dir: Option<tempfile::TempDir>,
}

impl TestDaemon {
    /// Starts `cloakd::daemon::serve` with `config` on an ephemeral loopback port.
    /// A config still pointing at the default `./data` gets a fresh temporary data directory instead.
    pub async fn start(mut config: Config) -> TestDaemon {
        let default_dir = Config::embedded_defaults().transactions.data_dir;
        let data_dir = (config.transactions.data_dir == default_dir).then(|| {
            let dir = tempfile::tempdir().unwrap();
            config.transactions.data_dir = dir.path().to_path_buf();
            dir
        });
        // Many daemons run at once in a test process: none takes the default metrics port.
        if config.telemetry == Config::embedded_defaults().telemetry {
            config.telemetry.metrics_listen = None;
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(cloakd::daemon::serve(config, listener, async move {
            let _ = stopped.await;
        }));
        TestDaemon {
            addr,
            stop: Some(stop),
            task: Some(task),
            _data_dir: data_dir,
        }
    }

    /// Starts the daemon on the embedded defaults.
    pub async fn start_default() -> TestDaemon {
        Self::start(Config::embedded_defaults()).await
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A fresh connection to the daemon.
    pub async fn channel(&self) -> Channel {
        let endpoint = tonic::transport::Endpoint::from_shared(self.endpoint()).unwrap();
        for _ in 0..50 {
            if let Ok(channel) = endpoint.connect().await {
                return channel;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("daemon at {} did not accept connections", self.addr);
    }

    /// Graceful shutdown; returns what `serve` returned.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("daemon did not stop within 30 s")
            .expect("daemon task panicked")
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A mobile client's open Submit stream.
pub struct MobileClient {
    pub requests: tokio::sync::mpsc::Sender<cloakd::proto::LocationRequest>,
    pub events: tonic::Streaming<cloakd::proto::LocationEvent>,
}

impl MobileClient {
    pub async fn connect(channel: Channel) -> MobileClient {
        Self::try_connect(channel).await.expect("Submit failed")
    }

    pub async fn try_connect(channel: Channel) -> Result<MobileClient, tonic::Status> {
        let mut client = cloakd::proto::location_broker_client::LocationBrokerClient::new(channel);
        let (requests, rx) = tokio::sync::mpsc::channel(1024);
        let events = client
            .submit(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(MobileClient { requests, events })
    }

    pub async fn send(&self, request: cloakd::proto::LocationRequest) {
        self.requests
            .send(request)
            .await
            .expect("request stream closed");
    }

    /// The next event, failing the test after `secs` seconds.
    pub async fn next_event(&mut self, secs: u64) -> cloakd::proto::LocationEvent {
        tokio::time::timeout(Duration::from_secs(secs), self.events.message())
            .await
            .expect("no event in time")
            .expect("event stream failed")
            .expect("event stream ended")
    }
}

/// A location request near Oldenburg's centre, `offset_m` metres east.
pub fn request_at(
    user: &str,
    request_no: u64,
    offset_m: f64,
    k: u32,
) -> cloakd::proto::LocationRequest {
    let lat: f64 = 53.14;
    let lon = 8.21 + offset_m / (111_195.0 * lat.to_radians().cos());
    cloakd::proto::LocationRequest {
        user_id: user.to_string(),
        request_no,
        lat,
        lon,
        k: Some(k),
        dx_m: Some(500.0),
        dy_m: Some(500.0),
        dt_ms: Some(10_000),
        payload: format!("query from {user} #{request_no}").into_bytes(),
        service: "poi".to_string(),
        model: None,
    }
}

/// Subscribes as a provider of `service`.
pub async fn subscribe_provider(
    channel: Channel,
    service: &str,
) -> tonic::Streaming<cloakd::proto::CloakedRequest> {
    let mut gateway = cloakd::proto::lbs_gateway_client::LbsGatewayClient::new(channel);
    gateway
        .subscribe(cloakd::proto::LbsSubscription {
            service: service.to_string(),
        })
        .await
        .expect("Subscribe failed")
        .into_inner()
}

/// The next cloaked request a provider receives, failing after `secs` seconds.
pub async fn next_cloaked(
    stream: &mut tonic::Streaming<cloakd::proto::CloakedRequest>,
    secs: u64,
) -> cloakd::proto::CloakedRequest {
    tokio::time::timeout(Duration::from_secs(secs), stream.message())
        .await
        .expect("no cloaked request in time")
        .expect("provider stream failed")
        .expect("provider stream ended")
}

/// Subscribes to the released windows of `stream` from window 0, reads the first `count` (failing
/// after 30 s for any), then hangs up.
pub async fn released_windows(
    channel: Channel,
    stream: &str,
    count: usize,
) -> Vec<cloakd::proto::ReleasedWindow> {
    let mut feed = cloakd::proto::release_feed_client::ReleaseFeedClient::new(channel);
    let mut windows = feed
        .subscribe(cloakd::proto::ReleaseSubscription {
            stream: stream.to_string(),
            from_window: 0,
        })
        .await
        .expect("Subscribe failed")
        .into_inner();
    let mut released = Vec::with_capacity(count);
    while released.len() < count {
        let window = tokio::time::timeout(Duration::from_secs(30), windows.message())
            .await
            .expect("window released in time")
            .expect("release feed failed")
            .expect("release feed ended");
        released.push(window);
    }
    released
}

/// A config on the embedded defaults with `f` applied.
pub fn config_with(f: impl FnOnce(&mut Config)) -> Config {
    let mut config = Config::embedded_defaults();
    f(&mut config);
    config
}

/// A gRPC codec that sends raw bytes as the message body (to send mutated or undecodable messages
/// through the real gRPC framing) and decodes responses as `R`.
pub struct RawCodec<R>(std::marker::PhantomData<R>);

impl<R> Default for RawCodec<R> {
    fn default() -> Self {
        RawCodec(std::marker::PhantomData)
    }
}

pub struct RawEncoder;
pub struct ProstDecoder<R>(std::marker::PhantomData<R>);

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl<R: prost::Message + Default> tonic::codec::Decoder for ProstDecoder<R> {
    type Item = R;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<R>, tonic::Status> {
        R::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(e.to_string()))
    }
}

impl<R: prost::Message + Default + Send + 'static> tonic::codec::Codec for RawCodec<R> {
    type Encode = Vec<u8>;
    type Decode = R;
    type Encoder = RawEncoder;
    type Decoder = ProstDecoder<R>;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> ProstDecoder<R> {
        ProstDecoder(std::marker::PhantomData)
    }
}

/// Opens a bidirectional or client-streaming call on `path` (like "/cloakd.v1.LocationBroker/Submit")
/// sending raw message bodies, and returns the response stream.
pub async fn raw_streaming_call<R: prost::Message + Default + Send + 'static>(
    channel: Channel,
    path: &'static str,
    bodies: impl futures::Stream<Item = Vec<u8>> + Send + 'static,
) -> Result<tonic::Streaming<R>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel).max_encoding_message_size(usize::MAX);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.streaming(tonic::Request::new(bodies), path, RawCodec::<R>::default())
        .await
        .map(tonic::Response::into_inner)
}

/// Sends `request()` until a table-job slot is free (RESOURCE_EXHAUSTED while the limiter is full,
/// retried every 100 ms for up to 30 s) and returns the response; panics on any other refusal.
pub async fn evaluate_once_a_slot_frees(
    client: &mut cloakd::proto::table_evaluator_client::TableEvaluatorClient<Channel>,
    request: impl Fn() -> cloakd::proto::EvaluateRequest,
) -> cloakd::proto::EvaluateResponse {
    let mut refused = 0;
    loop {
        match client.evaluate(request()).await {
            Ok(response) => return response.into_inner(),
            Err(status) if status.code() == tonic::Code::ResourceExhausted && refused < 300 => {
                refused += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("the slots were not freed: {status:?} after {refused} tries"),
        }
    }
}
