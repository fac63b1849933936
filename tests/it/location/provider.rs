//! Provider side: requests wait (bounded) while no provider is subscribed, a full queue is reported to
//! the client, and a provider that disconnects does not take the broker down.
use cloakd::proto::LbsAnswer;
use cloakd::proto::lbs_gateway_client::LbsGatewayClient;
use cloakd::proto::location_event::Outcome;

use crate::support::{
    MobileClient, TestDaemon, config_with, next_cloaked, request_at, subscribe_provider,
};

#[tokio::test]
async fn requests_wait_for_a_provider_then_flow() {
    let daemon = TestDaemon::start_default().await;
    let mut a = MobileClient::connect(daemon.channel().await).await;
    let mut b = MobileClient::connect(daemon.channel().await).await;
    a.send(request_at("a", 1, 0.0, 2)).await;
    b.send(request_at("b", 1, 10.0, 2)).await;
    for client in [&mut a, &mut b] {
        let event = client.next_event(10).await;
        assert!(
            matches!(event.outcome, Some(Outcome::Cloaked(_))),
            "{event:?}"
        );
    }
    // The provider subscribes only now and still gets both.
    let mut provider = subscribe_provider(daemon.channel().await, "poi").await;
    let first = next_cloaked(&mut provider, 10).await;
    let second = next_cloaked(&mut provider, 10).await;
    assert_ne!(first.pseudonym, second.pseudonym);
    assert_eq!(first.r#box, second.r#box, "members share one cloaking box");
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_full_provider_queue_is_reported_not_dropped_silently() {
    let daemon = TestDaemon::start(config_with(|c| c.location.provider_queue = 1)).await;
    let mut a = MobileClient::connect(daemon.channel().await).await;
    let mut b = MobileClient::connect(daemon.channel().await).await;
    a.send(request_at("a", 1, 0.0, 2)).await;
    b.send(request_at("b", 1, 10.0, 2)).await;
    let mut outcomes = Vec::new();
    for client in [&mut a, &mut b] {
        let cloaked = client.next_event(10).await;
        assert!(
            matches!(cloaked.outcome, Some(Outcome::Cloaked(_))),
            "{cloaked:?}"
        );
        outcomes.push(client);
    }
    // One of the two fit the queue; the other client is told it was undelivered.
    let (a, b) = (&mut a, &mut b);
    let mut undelivered = 0;
    for client in [a, b] {
        let next = tokio::time::timeout(
            std::time::Duration::from_millis(500),
            client.events.message(),
        )
        .await;
        if let Ok(Ok(Some(event))) = next {
            let Some(Outcome::Undelivered(u)) = event.outcome else {
                panic!("unexpected {event:?}");
            };
            assert!(u.reason.contains("location.provider_queue"), "{u:?}");
            undelivered += 1;
        }
    }
    assert_eq!(undelivered, 1);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn provider_disconnect_leaves_the_broker_serving() {
    let daemon = TestDaemon::start_default().await;
    let provider = subscribe_provider(daemon.channel().await, "poi").await;
    drop(provider);
    let mut second = subscribe_provider(daemon.channel().await, "poi").await;
    let mut a = MobileClient::connect(daemon.channel().await).await;
    let mut b = MobileClient::connect(daemon.channel().await).await;
    a.send(request_at("a", 1, 0.0, 2)).await;
    b.send(request_at("b", 1, 10.0, 2)).await;
    let mut answers = Vec::new();
    for _ in 0..2 {
        let cloaked = next_cloaked(&mut second, 10).await;
        answers.push(LbsAnswer {
            pseudonym: cloaked.pseudonym,
            payload: b"ok".to_vec(),
            ack: false,
        });
    }
    let summary = LbsGatewayClient::new(daemon.channel().await)
        .answer(tokio_stream::iter(answers))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(summary.delivered, 2);
    for client in [&mut a, &mut b] {
        assert!(matches!(
            client.next_event(10).await.outcome,
            Some(Outcome::Cloaked(_))
        ));
        assert!(matches!(
            client.next_event(10).await.outcome,
            Some(Outcome::Reply(_))
        ));
    }
    daemon.shutdown().await.unwrap();
}
