//! Real gRPC clients of the daemon's services as the tests use them: a mobile client's Submit stream,
//! location requests near Oldenburg, a provider's subscription, the release feed, and the table
//! evaluator retried while its job slots are full. Every wait is bounded and fails the test.
use std::time::Duration;

use tonic::transport::Channel;

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
        epsilon_per_km: None,
        fallback_epsilon_per_km: None,
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
