//! One HTTP/2 connection (one tonic Channel) shared by a canary, a client that never reads its events,
//! a producer pipelining 200,000 small records, and a client flooding requests that are all rejected.
//! Our back-pressure answers each bad stream with its documented status on that stream alone; HTTP/2
//! never closes the connection (no GOAWAY): the canary loses nothing and the channel still serves.
use std::time::Duration;

use cloakd::proto::location_event::Outcome;
use cloakd::proto::transaction_ingest_client::TransactionIngestClient;
use cloakd::proto::{LocationRequest, Transaction};
use tokio::sync::mpsc;
use tokio::sync::watch;
use tokio_stream::wrappers::ReceiverStream;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::support::{MobileClient, TestDaemon, config_with, request_at};

const RECORDS: usize = 200_000;
const FLOOD: u64 = 50_000;
/// Past location.client_queue (4,096) plus what a 64 KiB HTTP/2 window holds.
const SILENT_REQUESTS: u64 = 8_000;
/// Records the producer keeps in flight (below transactions.max_unacked_per_publish).
const IN_FLIGHT: usize = 32_768;

/// Requests of distinct users near `place_m` (metres east of the test's centre) with k = 2: cloaked
/// in pairs, so each gets an event.
fn pairable(prefix: &str, no: u64, place_m: f64) -> LocationRequest {
    request_at(&format!("{prefix}-{no}"), no, place_m + (no % 20) as f64, 2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_streams_on_one_connection_leave_the_others_alone() {
    let daemon = TestDaemon::start(config_with(|c| {
        c.transactions.defaults.window_records = 10_000;
    }))
    .await;
    // One connection for everything, with a client stream window as small as grpcio's.
    let channel = tonic::transport::Endpoint::from_shared(daemon.endpoint())
        .unwrap()
        .initial_stream_window_size(65_535)
        .connect()
        .await
        .unwrap();

    // The canary: pairs of requests every 20 ms until the others are done; every one is cloaked.
    let (done, mut finished) = watch::channel(false);
    let canary = {
        let channel = channel.clone();
        tokio::spawn(async move {
            let mut client = MobileClient::connect(channel).await;
            let mut sent = 0u64;
            loop {
                for _ in 0..2 {
                    // Far from the others, so canary requests pair among themselves.
                    client.send(pairable("canary", sent, 100_000.0)).await;
                    sent += 1;
                }
                for _ in 0..2 {
                    let event = client.next_event(30).await;
                    assert!(
                        matches!(event.outcome, Some(Outcome::Cloaked(_))),
                        "canary lost a request: {event:?}"
                    );
                }
                if *finished.borrow() {
                    return sent;
                }
                tokio::select! {
                    _ = finished.changed() => {}
                    _ = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
        })
    };

    // A client that never reads: its events fill its HTTP/2 window (64 KiB here, as grpcio's), then
    // pile up past location.client_queue.
    let mut idle_reader = MobileClient::connect(channel.clone()).await;
    for no in 0..SILENT_REQUESTS {
        idle_reader.send(pairable("silent", no, 0.0)).await;
    }

    // A client whose requests are all rejected (latitude out of range) and that keeps sending.
    let flooder = {
        let channel = channel.clone();
        tokio::spawn(async move {
            let mut client = MobileClient::connect(channel).await;
            let requests = client.requests.clone();
            tokio::spawn(async move {
                for no in 0..FLOOD {
                    let mut request = request_at("flood", no, 0.0, 2);
                    request.lat = 1_000.0;
                    if requests.send(request).await.is_err() {
                        return;
                    }
                }
            });
            // Each request is answered Rejected naming the field, until every one is, or until the
            // client falls location.client_queue events behind: then its stream alone ends with
            // RESOURCE_EXHAUSTED naming that key.
            let mut rejected = 0u64;
            while rejected < FLOOD {
                let event = tokio::time::timeout(Duration::from_secs(30), client.events.message())
                    .await
                    .expect("the flooding client got nothing for 30 s");
                let event = match event {
                    Ok(Some(event)) => event,
                    Ok(None) => panic!("the flood stream ended with OK after {rejected}"),
                    Err(status) => {
                        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                        assert!(
                            status.message().contains("location.client_queue"),
                            "{status:?}"
                        );
                        return rejected;
                    }
                };
                match event.outcome {
                    Some(Outcome::Rejected(r)) => {
                        assert_eq!(r.field, "lat", "{r:?}");
                        assert_eq!(event.request_no, rejected, "rejections come in order");
                        rejected += 1;
                    }
                    other => panic!("flood request {}: {other:?}", event.request_no),
                }
            }
            rejected
        })
    };

    // A producer pipelining small records on one Publish stream, up to IN_FLIGHT unacknowledged.
    let (records, outbound) = mpsc::channel(1024);
    let mut acks = TransactionIngestClient::new(channel.clone())
        .publish(ReceiverStream::new(outbound))
        .await
        .unwrap()
        .into_inner();
    let (acked_tx, mut acked) = watch::channel(0usize);
    let sender = tokio::spawn(async move {
        for i in 0..RECORDS {
            while i >= *acked.borrow_and_update() + IN_FLIGHT {
                acked.changed().await.unwrap();
            }
            let record = Transaction {
                stream: "clicks".into(),
                record_id: format!("r{i}"),
                items: vec![format!("p{}", i % 7)],
                sensitive_items: vec![],
            };
            records.send(record).await.unwrap();
        }
        // Keep the stream open until every ack has come.
        records
    });
    let mut acknowledged = 0;
    while acknowledged < RECORDS {
        let ack = tokio::time::timeout(Duration::from_secs(60), acks.message())
            .await
            .expect("no ack for 60 s")
            .expect("the producer's stream failed")
            .expect("the producer's stream ended early");
        assert_eq!(
            ack.record_id,
            format!("r{acknowledged}"),
            "acks come in order"
        );
        acknowledged += 1;
        acked_tx.send_replace(acknowledged);
    }
    drop(sender.await.unwrap());

    let rejected = flooder.await.unwrap();
    assert!(rejected > 0, "no flood request was answered");
    done.send_replace(true);
    let canary_sent = canary.await.unwrap();
    assert!(canary_sent >= 2);

    // The silent client's stream ends with RESOURCE_EXHAUSTED naming location.client_queue, once it
    // reads: after the events its window and its queue held, not all of them.
    let mut events = 0;
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(30), idle_reader.events.message())
            .await
            .expect("the silent client's stream neither ended nor delivered")
        {
            Ok(Some(_)) => events += 1,
            Ok(None) => panic!("the silent client's stream ended with OK after {events} events"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("location.client_queue"),
        "{status:?}"
    );
    assert!(events < SILENT_REQUESTS as usize, "{events} events");

    // The connection is still open and serving: no GOAWAY.
    let health = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("the shared connection still serves");
    assert_eq!(health.into_inner().status, 1);
    daemon.shutdown().await.unwrap();
}
