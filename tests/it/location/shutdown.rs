//! Graceful shutdown: pending requests are told they were not forwarded, streams end, serve returns.
use cloakd::proto::location_event::Outcome;
use tonic::Code;

use crate::support::{MobileClient, TestDaemon, request_at, subscribe_provider};

#[tokio::test]
async fn shutdown_answers_pending_requests_and_ends_streams() {
    let daemon = TestDaemon::start_default().await;
    let mut provider = subscribe_provider(daemon.channel().await, "poi").await;
    let mut client = MobileClient::connect(daemon.channel().await).await;
    let mut waiting = request_at("a", 1, 0.0, 5);
    waiting.dt_ms = Some(60_000);
    client.send(waiting).await;
    // Let the request reach the broker before shutting down.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    daemon.shutdown().await.unwrap();

    let event = client.next_event(10).await;
    let Some(Outcome::Rejected(rejected)) = event.outcome else {
        panic!("expected Rejected at shutdown, got {event:?}");
    };
    assert_eq!(rejected.code, Code::Unavailable as i32);
    // Both streams end.
    let end =
        tokio::time::timeout(std::time::Duration::from_secs(10), client.events.message()).await;
    assert!(
        matches!(end, Ok(Ok(None)) | Ok(Err(_))),
        "client stream still open: {end:?}"
    );
    let end = tokio::time::timeout(std::time::Duration::from_secs(10), provider.message()).await;
    assert!(
        matches!(end, Ok(Ok(None)) | Ok(Err(_))),
        "provider stream still open: {end:?}"
    );
}
