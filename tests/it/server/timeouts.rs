//! Timeouts against the real daemon: TCP connections that never send the HTTP/2 preface are closed
//! after `server.handshake_timeout_ms` and past `server.max_connections` at once, so idle sockets
//! cannot starve real clients (3,000 idle sockets used to be held forever); table uploads that stop
//! sending are cancelled after `tables.upload_idle_ms` and free their job slot; HTTP/2 connections
//! without an open stream are closed after `server.idle_connection_timeout_ms`, and never while a stream
//! is open on them.
use std::time::Duration;

use cloakd::proto::anonymize_request::Part;
use cloakd::proto::table_anonymizer_client::TableAnonymizerClient;
use cloakd::proto::{AnonymizeRequest, TableJob};
use tokio::io::AsyncReadExt;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::support::{TestDaemon, config_with};

#[tokio::test]
async fn idle_sockets_are_closed_and_real_clients_served() {
    let daemon = TestDaemon::start(config_with(|c| {
        c.server.handshake_timeout = Duration::from_millis(500);
        c.server.max_connections = 100;
    }))
    .await;
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(tokio::net::TcpStream::connect(daemon.addr).await.unwrap());
    }
    // A real client (retrying as gRPC clients do) is served once the idle sockets are closed.
    let mut tries = 0;
    loop {
        tries += 1;
        let channel = daemon.channel().await;
        let answer = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await;
        match answer {
            Ok(status) => {
                assert_eq!(status.into_inner().status, 1);
                break;
            }
            Err(status) if tries < 100 => {
                assert_eq!(status.code(), Code::Cancelled, "{status:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("never served: {status:?}"),
        }
    }
    // Every idle socket is closed by the daemon (end of stream or reset).
    for mut socket in idle {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(30), socket.read(&mut byte))
            .await
            .expect("the daemon closed the idle socket");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
    daemon.shutdown().await.unwrap();
}

fn job() -> AnonymizeRequest {
    AnonymizeRequest {
        part: Some(Part::Job(TableJob {
            job_toml: "[columns]\nage = { role = \"quasi\", kind = \"numeric\" }\ndisease = { role = \"sensitive\" }\n[privacy]\nk = 1\n".into(),
            header: vec!["age".into(), "disease".into()],
            ..Default::default()
        })),
    }
}

#[tokio::test]
async fn stalled_uploads_are_cancelled_and_free_their_slots() {
    let daemon = TestDaemon::start(config_with(|c| {
        c.tables.upload_idle = Duration::from_millis(500);
        c.tables.max_concurrent_jobs = 2;
    }))
    .await;
    let channel = daemon.channel().await;
    // Two uploads that send the job and then nothing, never finishing.
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut client = TableAnonymizerClient::new(channel.clone());
        stalled.push(tokio::spawn(async move {
            use futures::StreamExt;
            let requests = futures::stream::iter(vec![job()]).chain(futures::stream::pending());
            client.anonymize(requests).await
        }));
    }
    for call in stalled {
        let status = call.await.unwrap().expect_err("cancelled");
        assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
        assert!(
            status.message().contains("tables.upload_idle_ms"),
            "{}",
            status.message()
        );
    }
    // Their slots are free: a complete job runs.
    let rows = AnonymizeRequest {
        part: Some(Part::Rows(cloakd::proto::RowChunk {
            rows: (0..4)
                .map(|i| cloakd::proto::Row {
                    values: vec![(30 + i).to_string(), "flu".into()],
                })
                .collect(),
        })),
    };
    let mut client = TableAnonymizerClient::new(channel);
    let mut out = client
        .anonymize(futures::stream::iter(vec![job(), rows]))
        .await
        .unwrap()
        .into_inner();
    let mut messages = 0;
    while out.message().await.unwrap().is_some() {
        messages += 1;
    }
    assert!(messages >= 2);
    daemon.shutdown().await.unwrap();
}

/// An HTTP/2 connection (h2's client, so the test sees when the server closes it).
async fn h2_connection(
    addr: std::net::SocketAddr,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::task::JoinHandle<Result<(), h2::Error>>,
) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    (client, tokio::spawn(connection))
}

#[tokio::test]
async fn connections_without_open_streams_are_closed_after_the_idle_timeout() {
    let daemon = TestDaemon::start(config_with(|c| {
        c.server.idle_connection_timeout = Duration::from_millis(300);
    }))
    .await;
    // A connection that never opens a stream is closed (keepalive pings do not keep it).
    let (_client, idle) = h2_connection(daemon.addr).await;
    tokio::time::timeout(Duration::from_secs(20), idle)
        .await
        .expect("the idle connection was not closed")
        .unwrap()
        .ok();

    // A connection with an open stream (a provider's Subscribe) stays open well past the timeout.
    let (client, busy) = h2_connection(daemon.addr).await;
    let mut client = client.ready().await.unwrap();
    let request = http::Request::post(format!(
        "http://{}/cloakd.v1.LbsGateway/Subscribe",
        daemon.addr
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .unwrap();
    let (response, mut send) = client.send_request(request, false).unwrap();
    let subscription = prost::Message::encode_to_vec(&cloakd::proto::LbsSubscription {
        service: "poi".into(),
    });
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(subscription.len() as u32).to_be_bytes());
    frame.extend_from_slice(&subscription);
    send.send_data(frame.into(), true).unwrap();
    let response = response.await.unwrap();
    assert_eq!(response.status(), 200);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !busy.is_finished(),
        "a connection with an open stream was closed"
    );

    // Once that stream ends (the client resets it, keeping the connection), the connection is idle
    // and closed in turn.
    drop(response);
    drop(send);
    tokio::time::timeout(Duration::from_secs(20), busy)
        .await
        .expect("the connection was not closed after its last stream ended")
        .unwrap()
        .ok();
    drop(client);
    daemon.shutdown().await.unwrap();
}
