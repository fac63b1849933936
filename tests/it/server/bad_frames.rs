//! Oversized (`server.max_message_bytes`) and undecodable messages end their stream with
//! RESOURCE_EXHAUSTED / INVALID_ARGUMENT naming the limit or the problem, never with OK (they used
//! to end Submit and Publish with OK and no event); requests already pending on that stream still get
//! their outcome first, and the same connection keeps working.
use std::time::Duration;

use cloakd::proto::location_event::Outcome;
use cloakd::proto::{LocationEvent, PublishAck};
use prost::Message;
use tonic::Code;

use crate::support::{TestDaemon, config_with, raw_streaming_call, request_at};

/// The bodies, then the stream stays open (the client does not half-close).
fn held_open(bodies: Vec<Vec<u8>>) -> impl futures::Stream<Item = Vec<u8>> + Send + 'static {
    use futures::StreamExt;
    futures::stream::iter(bodies).chain(futures::stream::pending())
}

async fn submit_outcome(
    channel: tonic::transport::Channel,
    bad: Vec<u8>,
) -> (Vec<LocationEvent>, tonic::Status) {
    // A request that will expire (k = 3, nobody else around), then the bad message.
    let mut pending = request_at("alice", 1, 0.0, 3);
    pending.dt_ms = Some(300);
    let mut events = raw_streaming_call::<LocationEvent>(
        channel,
        "/cloakd.v1.LocationBroker/Submit",
        held_open(vec![pending.encode_to_vec(), bad]),
    )
    .await
    .unwrap();
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), events.message())
            .await
            .expect("the stream must end with a status")
        {
            Ok(Some(event)) => seen.push(event),
            Ok(None) => panic!("stream ended with OK after {seen:?}"),
            Err(status) => return (seen, status),
        }
    }
}

#[tokio::test]
async fn bad_submit_messages_end_the_stream_with_a_status_after_pending_outcomes() {
    let daemon = TestDaemon::start(config_with(|c| c.server.max_message_bytes = 64 * 1024)).await;
    let channel = daemon.channel().await;
    let cases: [(Vec<u8>, Code, &str); 2] = [
        (
            vec![0u8; 100 * 1024],
            Code::ResourceExhausted,
            "server.max_message_bytes",
        ),
        (vec![0xff; 16], Code::InvalidArgument, "cannot be decoded"),
    ];
    for (bad, code, named) in cases {
        let (events, status) = submit_outcome(channel.clone(), bad).await;
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(named), "{}", status.message());
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].request_no, 1);
        assert!(
            matches!(events[0].outcome, Some(Outcome::Expired(_))),
            "{events:?}"
        );
    }
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_publish_messages_end_the_stream_with_a_status_after_earlier_acks() {
    let daemon = TestDaemon::start(config_with(|c| c.server.max_message_bytes = 64 * 1024)).await;
    let channel = daemon.channel().await;
    let cases: [(Vec<u8>, Code, &str); 2] = [
        (
            vec![0u8; 100 * 1024],
            Code::ResourceExhausted,
            "server.max_message_bytes",
        ),
        (vec![0xff; 16], Code::InvalidArgument, "cannot be decoded"),
    ];
    for (n, (bad, code, named)) in cases.into_iter().enumerate() {
        let good = transactions_record(&format!("r{n}"));
        let mut acks = raw_streaming_call::<PublishAck>(
            channel.clone(),
            "/cloakd.v1.TransactionIngest/Publish",
            held_open(vec![good.encode_to_vec(), bad]),
        )
        .await
        .unwrap();
        let ack = acks
            .message()
            .await
            .unwrap()
            .expect("the good record is acknowledged");
        assert_eq!(ack.record_id, format!("r{n}"));
        let status = acks
            .message()
            .await
            .expect_err("the stream ends with an error");
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(named), "{}", status.message());
    }
    daemon.shutdown().await.unwrap();
}

fn transactions_record(id: &str) -> cloakd::proto::Transaction {
    cloakd::proto::Transaction {
        stream: "s".into(),
        record_id: id.into(),
        items: vec!["a".into(), "b".into()],
        sensitive_items: vec!["a".into()],
    }
}
