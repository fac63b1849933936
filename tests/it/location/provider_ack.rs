//! Providers acknowledge: a provider that never reads takes at most `location.provider_window`
//! requests, is closed with RESOURCE_EXHAUSTED naming `location.provider_ack_ms` once it misses an
//! acknowledgement, and the requests it held are answered through another provider or reported
//! Undelivered; none is silently lost. An acknowledgement (ack = true) keeps a slow provider's stream.
use std::collections::HashMap;
use std::time::Duration;

use cloakd::config::Config;
use cloakd::proto::lbs_gateway_client::LbsGatewayClient;
use cloakd::proto::location_event::Outcome;
use cloakd::proto::{CloakedRequest, LbsAnswer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::support::{
    MobileClient, TestDaemon, config_with, next_cloaked, request_at, subscribe_provider,
};

const REQUESTS: u64 = 2_000;
const WINDOW: usize = 32;

fn config(provider_ack_ms: u64, answer_ttl_ms: u64) -> Config {
    config_with(|c| {
        c.location.provider_ack_ms = provider_ack_ms;
        c.location.provider_window = WINDOW;
        c.location.answer_ttl_ms = answer_ttl_ms;
    })
}

/// The final outcome of each request after its Cloaked event: a reply or Undelivered (reason).
#[derive(Debug, Default)]
struct Outcomes {
    cloaked: HashMap<u64, usize>,
    replied: HashMap<u64, usize>,
    undelivered: HashMap<u64, String>,
}

impl Outcomes {
    fn finished(&self) -> usize {
        self.replied.len() + self.undelivered.len()
    }
}

/// Submits `REQUESTS` requests of distinct users (k = 2) on one stream and reads events until every
/// request has its final outcome or the stream ends.
async fn submit_all(daemon: &TestDaemon) -> Outcomes {
    let mut client = MobileClient::connect(daemon.channel().await).await;
    let requests = client.requests.clone();
    tokio::spawn(async move {
        for no in 0..REQUESTS {
            let request = request_at(&format!("user-{no}"), no, (no % 50) as f64, 2);
            if requests.send(request).await.is_err() {
                return;
            }
        }
    });
    let mut outcomes = Outcomes::default();
    while outcomes.finished() < REQUESTS as usize {
        let event = tokio::time::timeout(Duration::from_secs(30), client.events.message())
            .await
            .unwrap_or_else(|_| panic!("stalled after {} outcomes", outcomes.finished()))
            .expect("event stream failed");
        let Some(event) = event else { break };
        let no = event.request_no;
        match event.outcome {
            Some(Outcome::Cloaked(_)) => *outcomes.cloaked.entry(no).or_default() += 1,
            Some(Outcome::Reply(_)) => *outcomes.replied.entry(no).or_default() += 1,
            Some(Outcome::Undelivered(u)) => {
                assert!(
                    outcomes.undelivered.insert(no, u.reason).is_none(),
                    "request {no} undelivered twice"
                );
            }
            other => panic!("request {no}: unexpected {other:?}"),
        }
    }
    outcomes
}

/// Answers every request it receives at once (without a separate ack: an answer is one).
fn answering_provider(
    mut subscription: tonic::Streaming<CloakedRequest>,
    mut gateway: LbsGatewayClient<tonic::transport::Channel>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let (answers, rx) = mpsc::channel(1024);
        tokio::spawn(async move { gateway.answer(ReceiverStream::new(rx)).await });
        while let Ok(Some(cloaked)) = subscription.message().await {
            let answer = LbsAnswer {
                pseudonym: cloaked.pseudonym,
                payload: b"open until ten".to_vec(),
                ack: false,
            };
            if answers.send(answer).await.is_err() {
                break;
            }
        }
    })
}

/// Reads what a provider stream buffered and the status that ended it.
async fn drain_provider(mut stream: tonic::Streaming<CloakedRequest>) -> (usize, tonic::Status) {
    let mut received = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("the stalled provider's stream was not closed")
        {
            Ok(Some(_)) => received += 1,
            Ok(None) => panic!("the stalled provider's stream ended with OK"),
            Err(status) => return (received, status),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_never_reads_loses_no_request() {
    let daemon = TestDaemon::start(config(1_000, 60_000)).await;
    // The stalled provider subscribes first, so it takes its window before the good one is there.
    let stalled = subscribe_provider(daemon.channel().await, "poi").await;
    let good_channel = daemon.channel().await;
    let good = answering_provider(
        subscribe_provider(good_channel.clone(), "poi").await,
        LbsGatewayClient::new(good_channel),
    );
    let outcomes = submit_all(&daemon).await;
    assert_eq!(
        outcomes.cloaked.len(),
        REQUESTS as usize,
        "every request is cloaked"
    );
    assert!(outcomes.cloaked.values().all(|&n| n == 1));
    for no in 0..REQUESTS {
        let replies = outcomes.replied.get(&no).copied().unwrap_or(0);
        let undelivered = outcomes.undelivered.contains_key(&no);
        assert!(
            (replies == 1) != undelivered,
            "request {no}: {replies} replies, undelivered {undelivered}"
        );
    }
    // Another provider was there throughout: every request the stalled one held was handed to it.
    assert!(
        outcomes.undelivered.is_empty(),
        "undelivered: {:?}",
        outcomes.undelivered.iter().take(3).collect::<Vec<_>>()
    );
    let (held, status) = drain_provider(stalled).await;
    assert!(held <= WINDOW, "the stalled provider took {held} requests");
    assert!(held > 0, "the stalled provider took no request");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("location.provider_ack_ms"),
        "{status:?}"
    );
    good.abort();
    daemon.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_another_provider_the_clients_get_undelivered() {
    let daemon = TestDaemon::start(config(300, 1_500)).await;
    let stalled = subscribe_provider(daemon.channel().await, "poi").await;
    let outcomes = submit_all(&daemon).await;
    assert_eq!(outcomes.cloaked.len(), REQUESTS as usize);
    assert!(outcomes.replied.is_empty());
    assert_eq!(
        outcomes.undelivered.len(),
        REQUESTS as usize,
        "every request gets Undelivered"
    );
    // The requests the stalled stream held name its rule; the others, still queued, expire.
    let stalled_reasons = outcomes
        .undelivered
        .values()
        .filter(|r| r.contains("location.provider_ack_ms"))
        .count();
    assert!((1..=WINDOW).contains(&stalled_reasons), "{stalled_reasons}");
    assert!(
        outcomes
            .undelivered
            .values()
            .all(|r| r.contains("location.provider_ack_ms") || r.contains("location.answer_ttl_ms")),
        "{:?}",
        outcomes.undelivered.values().next()
    );
    let (held, status) = drain_provider(stalled).await;
    assert_eq!(held, stalled_reasons);
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_acknowledged_request_may_be_answered_later() {
    let daemon = TestDaemon::start(config(1_500, 60_000)).await;
    let mut provider = subscribe_provider(daemon.channel().await, "poi").await;
    let mut a = MobileClient::connect(daemon.channel().await).await;
    let mut b = MobileClient::connect(daemon.channel().await).await;
    a.send(request_at("a", 1, 0.0, 2)).await;
    b.send(request_at("b", 1, 10.0, 2)).await;
    let first = next_cloaked(&mut provider, 10).await;
    let second = next_cloaked(&mut provider, 10).await;
    let mut gateway = LbsGatewayClient::new(daemon.channel().await);
    let (answers, rx) = mpsc::channel(8);
    let summary = tokio::spawn(async move { gateway.answer(ReceiverStream::new(rx)).await });
    for cloaked in [&first, &second] {
        answers
            .send(LbsAnswer {
                pseudonym: cloaked.pseudonym.clone(),
                payload: Vec::new(),
                ack: true,
            })
            .await
            .unwrap();
    }
    // Past provider_ack_ms: acknowledged requests stay with this provider.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    for cloaked in [&first, &second] {
        answers
            .send(LbsAnswer {
                pseudonym: cloaked.pseudonym.clone(),
                payload: b"later".to_vec(),
                ack: false,
            })
            .await
            .unwrap();
    }
    drop(answers);
    let summary = summary.await.unwrap().unwrap().into_inner();
    assert_eq!(summary.acknowledged, 2, "{summary:?}");
    assert_eq!(summary.delivered, 2, "{summary:?}");
    for client in [&mut a, &mut b] {
        assert!(matches!(
            client.next_event(10).await.outcome,
            Some(Outcome::Cloaked(_))
        ));
        let reply = client.next_event(10).await;
        assert!(
            matches!(&reply.outcome, Some(Outcome::Reply(r)) if r.payload == b"later"),
            "{reply:?}"
        );
    }
    // The provider's stream is still open: nothing ended it.
    assert!(
        tokio::time::timeout(Duration::from_millis(300), provider.message())
            .await
            .is_err(),
        "the acknowledging provider's stream ended"
    );
    // An acknowledgement with a payload is refused, naming the field.
    let status = LbsGatewayClient::new(daemon.channel().await)
        .answer(tokio_stream::iter([LbsAnswer {
            pseudonym: first.pseudonym.clone(),
            payload: b"both".to_vec(),
            ack: true,
        }]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().starts_with("payload"), "{status:?}");
    daemon.shutdown().await.unwrap();
}
