//! Bad input is rejected with INVALID_ARGUMENT naming the field and the rule; past the limits the broker
//! answers RESOURCE_EXHAUSTED; a bad request never stops the stream or other clients.
use cloakd::proto::lbs_gateway_client::LbsGatewayClient;
use cloakd::proto::location_event::Outcome;
use cloakd::proto::{LbsAnswer, LbsSubscription, LocationRequest};
use tonic::Code;

use crate::support::{MobileClient, TestDaemon, config_with, request_at};

async fn expect_rejected(
    client: &mut MobileClient,
    request_no: u64,
    field: &str,
    code: Code,
) -> String {
    let event = client.next_event(10).await;
    assert_eq!(event.request_no, request_no);
    let Some(Outcome::Rejected(rejected)) = event.outcome else {
        panic!("request {request_no}: expected Rejected({field}), got {event:?}");
    };
    assert_eq!(rejected.field, field, "{rejected:?}");
    assert_eq!(rejected.code, code as i32, "{rejected:?}");
    assert!(!rejected.reason.is_empty());
    rejected.reason
}

#[tokio::test]
async fn each_bad_field_is_named() {
    let daemon = TestDaemon::start_default().await;
    let mut client = MobileClient::connect(daemon.channel().await).await;
    type Mutate = fn(&mut LocationRequest);
    let cases: Vec<(&str, Mutate)> = vec![
        ("user_id", |r| r.user_id.clear()),
        ("lat", |r| r.lat = f64::NAN),
        ("lat", |r| r.lat = 91.0),
        ("lon", |r| r.lon = f64::INFINITY),
        ("lon", |r| r.lon = -180.5),
        ("k", |r| r.k = Some(0)),
        ("k", |r| r.k = Some(1_000)),
        ("dx_m", |r| r.dx_m = Some(-1.0)),
        ("dy_m", |r| r.dy_m = Some(1e9)),
        ("dx_m", |r| r.dx_m = Some(f64::NAN)),
        ("dt_ms", |r| r.dt_ms = Some(0)),
        ("dt_ms", |r| r.dt_ms = Some(u64::MAX)),
        ("payload", |r| r.payload = vec![0; 1 << 20]),
        ("service", |r| r.service = "teleport".into()),
    ];
    for (no, (field, mutate)) in cases.iter().enumerate() {
        let mut request = request_at("mallory", no as u64, 0.0, 3);
        mutate(&mut request);
        client.send(request).await;
        let reason = expect_rejected(&mut client, no as u64, field, Code::InvalidArgument).await;
        assert!(reason.len() > 10, "{field}: reason too terse: {reason}");
    }
    // A 10 KB value is quoted, not echoed: at most 64 bytes of it come back.
    let mut huge = request_at("mallory", 50, 0.0, 3);
    huge.service = "s".repeat(10_000);
    client.send(huge).await;
    let reason = expect_rejected(&mut client, 50, "service", Code::InvalidArgument).await;
    assert!(
        reason.len() < 300,
        "the reason echoes the input: {} bytes",
        reason.len()
    );
    assert!(reason.contains("(10000 bytes)"), "{reason}");

    // The stream still works: a duplicate (user, request_no) while pending is rejected, the rest go on.
    let mut alice = request_at("alice", 100, 0.0, 2);
    alice.dt_ms = Some(60_000);
    client.send(alice.clone()).await;
    client.send(alice).await;
    // The proto's code for a duplicate: ALREADY_EXISTS (6).
    expect_rejected(&mut client, 100, "request_no", Code::AlreadyExists).await;

    // Another client completes alice's group: the bad input above harmed nobody.
    let mut bob = MobileClient::connect(daemon.channel().await).await;
    bob.send(request_at("bob", 1, 30.0, 2)).await;
    let event = bob.next_event(10).await;
    assert!(
        matches!(event.outcome, Some(Outcome::Cloaked(_))),
        "{event:?}"
    );
    let event = client.next_event(10).await;
    assert_eq!(event.request_no, 100);
    assert!(
        matches!(event.outcome, Some(Outcome::Cloaked(_))),
        "{event:?}"
    );
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn limits_answer_resource_exhausted() {
    let config = config_with(|c| {
        c.location.max_pending_per_stream = 2;
        c.location.max_client_streams = 2;
    });
    let daemon = TestDaemon::start(config).await;
    let mut client = MobileClient::connect(daemon.channel().await).await;
    for no in 0..3u64 {
        client
            .send(request_at(&format!("u{no}"), no, 5_000.0 * no as f64, 2))
            .await;
    }
    expect_rejected(&mut client, 2, "request_no", Code::ResourceExhausted).await;

    let _second = MobileClient::connect(daemon.channel().await).await;
    let third = MobileClient::try_connect(daemon.channel().await).await;
    let status = third.err().expect("third stream must be refused");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status.message().contains("location.max_client_streams"),
        "{status:?}"
    );
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_provider_input_is_named() {
    let daemon = TestDaemon::start_default().await;
    let mut gateway = LbsGatewayClient::new(daemon.channel().await);
    let status = gateway
        .subscribe(LbsSubscription {
            service: "teleport".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("service:"), "{status:?}");

    let status = gateway
        .answer(tokio_stream::iter([LbsAnswer {
            pseudonym: "not-a-pseudonym".into(),
            payload: vec![],
            ack: false,
        }]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().starts_with("pseudonym:"), "{status:?}");

    // A well-formed but unknown pseudonym is counted, not an error.
    let summary = gateway
        .answer(tokio_stream::iter([LbsAnswer {
            pseudonym: "0123456789abcdef0123456789abcdef".into(),
            payload: b"hello".to_vec(),
            ack: false,
        }]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((summary.delivered, summary.undeliverable), (0, 1));
    daemon.shutdown().await.unwrap();
}
