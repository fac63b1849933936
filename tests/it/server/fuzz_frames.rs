//! Fuzzing the real daemon: more than 10,000 mutated gRPC messages across LocationBroker.Submit,
//! TransactionIngest.Publish, LbsGateway.Answer and TableAnonymizer.Anonymize (through the real gRPC
//! framing), h2 streams with broken gRPC framing, and connections sending random HTTP/2 frames.
//! Asserts: the daemon lives, every stream holding a message that cannot be decoded (or is larger
//! than `server.max_message_bytes`) ends with a non-OK status, and a canary client keeps working
//! throughout.
use std::time::Duration;

use bytes::Bytes;
use cloakd::proto::location_event::Outcome;
use cloakd::proto::{
    AnonymizeRequest, AnswerSummary, LbsAnswer, LocationEvent, LocationRequest, PublishAck,
    TableJob, Transaction,
};
use prost::Message;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::io::AsyncWriteExt;

use crate::support::{MobileClient, TestDaemon, config_with, raw_streaming_call, request_at};

const MAX_MESSAGE_BYTES: usize = 16 * 1024;
const STREAMS: usize = 420;
const MESSAGES_PER_STREAM: usize = 25;

/// One valid message of the method `kind`, encoded.
fn valid(kind: usize, rng: &mut ChaCha8Rng) -> Vec<u8> {
    let n: u32 = rng.random_range(0..1000);
    match kind {
        0 => {
            let mut r = request_at(&format!("u{n}"), u64::from(n), f64::from(n), 2);
            r.dt_ms = Some(200);
            r.encode_to_vec()
        }
        1 => Transaction {
            stream: format!("fuzz{}", n % 8),
            record_id: format!("r{n}"),
            items: vec![format!("i{}", n % 7), format!("j{}", n % 5)],
            sensitive_items: vec![format!("i{}", n % 7)],
        }
        .encode_to_vec(),
        2 => LbsAnswer {
            pseudonym: format!("{:032x}", u128::from(n)),
            payload: vec![1, 2, 3],
            ack: false,
        }
        .encode_to_vec(),
        _ => AnonymizeRequest {
            part: Some(cloakd::proto::anonymize_request::Part::Job(TableJob {
                job_toml: "[columns]\nage = { role = \"quasi\", kind = \"numeric\" }\n".into(),
                header: vec!["age".into()],
                ..Default::default()
            })),
        }
        .encode_to_vec(),
    }
}

/// A mutation of `message`: bit flips, cuts, random bytes, splices, or an oversized body.
fn mutate(mut message: Vec<u8>, rng: &mut ChaCha8Rng) -> Vec<u8> {
    match rng.random_range(0..6) {
        0 => {
            for _ in 0..rng.random_range(1..4) {
                if !message.is_empty() {
                    let at = rng.random_range(0..message.len());
                    message[at] ^= 1 << rng.random_range(0..8);
                }
            }
            message
        }
        1 => {
            let keep = rng.random_range(0..=message.len());
            message.truncate(keep);
            message
        }
        2 => (0..rng.random_range(1..64)).map(|_| rng.random()).collect(),
        3 => {
            let at = rng.random_range(0..=message.len());
            let junk: Vec<u8> = (0..rng.random_range(1..16)).map(|_| rng.random()).collect();
            message.splice(at..at, junk);
            message
        }
        4 => vec![0u8; MAX_MESSAGE_BYTES + rng.random_range(1..1024)],
        _ => message,
    }
}

fn decodes(kind: usize, body: &[u8]) -> bool {
    body.len() <= MAX_MESSAGE_BYTES
        && match kind {
            0 => LocationRequest::decode(body).is_ok(),
            1 => Transaction::decode(body).is_ok(),
            2 => LbsAnswer::decode(body).is_ok(),
            _ => AnonymizeRequest::decode(body).is_ok(),
        }
}

/// The final status of a response stream (`Ok` when it ended cleanly).
async fn final_status<R: Message + Default + Send + 'static>(
    channel: tonic::transport::Channel,
    path: &'static str,
    bodies: Vec<Vec<u8>>,
) -> Result<(), tonic::Status> {
    let mut stream = raw_streaming_call::<R>(channel, path, futures::stream::iter(bodies)).await?;
    loop {
        match tokio::time::timeout(Duration::from_secs(60), stream.message()).await {
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => return Ok(()),
            Ok(Err(status)) => return Err(status),
            Err(_) => panic!("{path}: the stream neither ended nor failed within 60 s"),
        }
    }
}

async fn canary_round(daemon: &TestDaemon, round: u64) {
    let channel = daemon.channel().await;
    let mut a = MobileClient::connect(channel.clone()).await;
    let mut b = MobileClient::connect(channel).await;
    // 100 km east of the fuzzed requests, so none of them joins (or steals) a canary group.
    for (client, name, offset) in [(&a, "a", 100_000.0), (&b, "b", 100_020.0)] {
        let mut request = request_at(&format!("canary-{name}{round}"), round, offset, 2);
        request.dt_ms = Some(2_000);
        client.send(request).await;
    }
    for client in [&mut a, &mut b] {
        let event = client.next_event(30).await;
        assert!(
            matches!(event.outcome, Some(Outcome::Cloaked(_))),
            "canary round {round}: {event:?}"
        );
    }
}

/// An h2 stream whose gRPC framing is broken (bad compression flag, or a length prefix longer than
/// the body): its grpc-status must not be 0.
async fn broken_framing(addr: std::net::SocketAddr, rng: &mut ChaCha8Rng) -> u32 {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let mut client = client.ready().await.unwrap();
    let paths = [
        "/cloakd.v1.LocationBroker/Submit",
        "/cloakd.v1.TransactionIngest/Publish",
        "/cloakd.v1.LbsGateway/Answer",
        "/cloakd.v1.TableAnonymizer/Anonymize",
    ];
    let mut statuses = 0;
    for _ in 0..10 {
        let path = paths[rng.random_range(0..paths.len())];
        let request = http::Request::post(format!("http://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (response, mut send) = client.send_request(request, false).unwrap();
        let mut body: Vec<u8> = Vec::new();
        if rng.random_bool(0.5) {
            body.push(rng.random_range(2..=255)); // not a compression flag
            body.extend_from_slice(&4u32.to_be_bytes());
            body.extend_from_slice(&[1, 2, 3, 4]);
        } else {
            body.push(0);
            body.extend_from_slice(&1000u32.to_be_bytes()); // longer than what follows
            body.extend_from_slice(&[8, 1]);
        }
        send.send_data(Bytes::from(body), true).unwrap();
        let response = tokio::time::timeout(Duration::from_secs(30), response)
            .await
            .expect("a response")
            .unwrap();
        // A trailers-only response carries grpc-status in its headers.
        let in_headers = response.headers().get("grpc-status").cloned();
        let mut body = response.into_body();
        let mut status = in_headers.or(response_status(&mut body).await);
        if status.is_none() {
            status = body
                .trailers()
                .await
                .ok()
                .flatten()
                .and_then(|t| t.get("grpc-status").cloned());
        }
        let status = status.expect("a grpc-status");
        assert_ne!(status, "0", "{path}: broken framing answered OK");
        statuses += 1;
    }
    statuses
}

async fn response_status(body: &mut h2::RecvStream) -> Option<http::HeaderValue> {
    while let Some(chunk) = body.data().await {
        if let Ok(chunk) = chunk {
            let _ = body.flow_control().release_capacity(chunk.len());
        } else {
            return None;
        }
    }
    None
}

/// A connection that sends the preface, then random frames.
async fn random_frames(addr: std::net::SocketAddr, rng: &mut ChaCha8Rng, frames: usize) {
    let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await else {
        return;
    };
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]); // empty SETTINGS
    for _ in 0..frames {
        let len: usize = rng.random_range(0..64);
        bytes.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
        bytes.push(rng.random_range(0..10)); // type
        bytes.push(rng.random()); // flags
        bytes.extend_from_slice(&(rng.random::<u32>() & 0x7fff_ffff & 0xff).to_be_bytes());
        bytes.extend((0..len).map(|_| rng.random::<u8>()));
    }
    let _ = tcp.write_all(&bytes).await;
    let _ = tcp.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_survives_mutated_messages_and_random_frames() {
    let daemon = TestDaemon::start(config_with(|c| {
        c.server.max_message_bytes = MAX_MESSAGE_BYTES;
        c.location.max_dt_ms = 2_000;
        c.location.default_dt_ms = 1_000;
        // Forwarded requests keep their stream open until answered or this passes.
        c.location.answer_ttl_ms = 300;
    }))
    .await;
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    canary_round(&daemon, 0).await;
    let channel = daemon.channel().await;
    let mut sent = 0usize;
    let mut bad_streams = 0usize;
    let mut calls = tokio::task::JoinSet::new();
    for stream in 0..STREAMS {
        let kind = stream % 4;
        let bodies: Vec<Vec<u8>> = (0..MESSAGES_PER_STREAM)
            .map(|_| {
                let message = valid(kind, &mut rng);
                mutate(message, &mut rng)
            })
            .collect();
        sent += bodies.len();
        // The stream is bad if one of its messages cannot be decoded; the server stops at the first.
        let bad = bodies.iter().any(|b| !decodes(kind, b));
        bad_streams += usize::from(bad);
        let channel = channel.clone();
        calls.spawn(async move {
            let result = match kind {
                0 => {
                    final_status::<LocationEvent>(
                        channel,
                        "/cloakd.v1.LocationBroker/Submit",
                        bodies,
                    )
                    .await
                }
                1 => {
                    final_status::<PublishAck>(
                        channel,
                        "/cloakd.v1.TransactionIngest/Publish",
                        bodies,
                    )
                    .await
                }
                2 => {
                    final_status::<AnswerSummary>(channel, "/cloakd.v1.LbsGateway/Answer", bodies)
                        .await
                }
                _ => {
                    final_status::<cloakd::proto::AnonymizeResponse>(
                        channel,
                        "/cloakd.v1.TableAnonymizer/Anonymize",
                        bodies,
                    )
                    .await
                }
            };
            (kind, bad, result)
        });
        if calls.len() >= 32 {
            let (kind, bad, result) = calls.join_next().await.unwrap().unwrap();
            if bad {
                assert!(result.is_err(), "kind {kind}: a bad stream ended OK");
            }
        }
        if stream % 100 == 99 {
            canary_round(&daemon, stream as u64).await;
        }
    }
    while let Some(joined) = calls.join_next().await {
        let (kind, bad, result) = joined.unwrap();
        if bad {
            assert!(result.is_err(), "kind {kind}: a bad stream ended OK");
        }
    }
    assert!(sent >= 10_000, "{sent} messages");
    assert!(bad_streams > STREAMS / 2, "{bad_streams} bad streams");

    let mut framing = 0;
    for _ in 0..20 {
        framing += broken_framing(daemon.addr, &mut rng).await;
    }
    assert_eq!(framing, 200);
    for _ in 0..50 {
        random_frames(daemon.addr, &mut rng, 40).await;
    }
    // Alive, and the canary still works.
    canary_round(&daemon, 1_000_000).await;
    daemon.shutdown().await.unwrap();
}
