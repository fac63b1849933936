//! A request that cannot reach k before its deadline expires, is never forwarded, and its client is told.
use std::time::{Duration, Instant};

use cloakd::proto::location_event::Outcome;

use crate::support::{MobileClient, TestDaemon, next_cloaked, request_at, subscribe_provider};

#[tokio::test]
async fn lonely_requests_expire_at_their_deadline_and_are_not_forwarded() {
    let daemon = TestDaemon::start_default().await;
    let mut provider = subscribe_provider(daemon.channel().await, "poi").await;
    let mut a = MobileClient::connect(daemon.channel().await).await;
    let mut b = MobileClient::connect(daemon.channel().await).await;

    // Two users 5 km apart with 500 m tolerance: never neighbours.
    let mut far = request_at("a", 7, 0.0, 2);
    far.dt_ms = Some(400);
    let started = Instant::now();
    a.send(far).await;
    let mut other = request_at("b", 9, 5_000.0, 2);
    other.dt_ms = Some(400);
    b.send(other).await;

    for (client, no) in [(&mut a, 7), (&mut b, 9)] {
        let event = client.next_event(10).await;
        assert_eq!(event.request_no, no);
        let Some(Outcome::Expired(expired)) = event.outcome else {
            panic!("expected Expired, got {event:?}");
        };
        assert!(expired.deadline_ms > 0);
    }
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "expired before its deadline"
    );

    // Nothing reached the provider: a later pair that does meet is the first thing it sees.
    a.send(request_at("a", 8, 0.0, 2)).await;
    b.send(request_at("b", 10, 20.0, 2)).await;
    let first = next_cloaked(&mut provider, 10).await;
    let second = next_cloaked(&mut provider, 10).await;
    let mut payloads = vec![first.payload, second.payload];
    payloads.sort();
    assert_eq!(
        payloads,
        vec![b"query from a #8".to_vec(), b"query from b #10".to_vec()]
    );
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_request_that_gets_its_peers_in_time_is_cloaked() {
    let daemon = TestDaemon::start_default().await;
    let mut a = MobileClient::connect(daemon.channel().await).await;
    let mut b = MobileClient::connect(daemon.channel().await).await;
    let mut first = request_at("a", 1, 0.0, 2);
    first.dt_ms = Some(5_000);
    a.send(first).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.send(request_at("b", 1, 50.0, 2)).await;
    for client in [&mut a, &mut b] {
        let event = client.next_event(10).await;
        let Some(Outcome::Cloaked(cloaked)) = event.outcome else {
            panic!("expected Cloaked, got {event:?}");
        };
        assert_eq!(cloaked.group_size, 2);
        // The interval spans both arrivals (about 200 ms apart).
        assert!(cloaked.t_end_ms - cloaked.t_start_ms >= 150, "{cloaked:?}");
    }
    daemon.shutdown().await.unwrap();
}
