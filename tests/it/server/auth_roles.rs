//! Authentication and roles against the real daemon (`auth.required = true`, bearer tokens): health
//! stays open, no or an unknown credential is UNAUTHENTICATED, each role reaches its services and no
//! other (PERMISSION_DENIED naming the rule), and scopes bind services, user ids and streams.
use std::time::Duration;

use cloakd::proto::EvaluateRequest;
use cloakd::proto::lbs_gateway_client::LbsGatewayClient;
use cloakd::proto::location_broker_client::LocationBrokerClient;
use cloakd::proto::location_event::Outcome;
use cloakd::proto::release_feed_client::ReleaseFeedClient;
use cloakd::proto::table_evaluator_client::TableEvaluatorClient;
use cloakd::proto::transaction_ingest_client::TransactionIngestClient;
use cloakd::proto::{
    LbsAnswer, LbsSubscription, LocationRequest, ReleaseSubscription, Transaction,
};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::support::security::{as_principal, secured_config};
use crate::support::{TestDaemon, request_at};

/// Opens a Submit stream as `name` and returns (requests, events) or the call's status.
async fn submit_as(
    daemon: &TestDaemon,
    name: Option<&str>,
) -> Result<
    (
        tokio::sync::mpsc::Sender<LocationRequest>,
        tonic::Streaming<cloakd::proto::LocationEvent>,
    ),
    tonic::Status,
> {
    let mut client = LocationBrokerClient::new(as_principal(daemon.channel().await, name));
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let events = client
        .submit(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    Ok((tx, events))
}

async fn next_event(
    events: &mut tonic::Streaming<cloakd::proto::LocationEvent>,
) -> cloakd::proto::LocationEvent {
    tokio::time::timeout(Duration::from_secs(10), events.message())
        .await
        .expect("no event in time")
        .expect("event stream failed")
        .expect("event stream ended")
}

async fn subscribe_as(
    daemon: &TestDaemon,
    name: Option<&str>,
    service: &str,
) -> Result<tonic::Streaming<cloakd::proto::CloakedRequest>, tonic::Status> {
    LbsGatewayClient::new(as_principal(daemon.channel().await, name))
        .subscribe(LbsSubscription {
            service: service.into(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn evaluate_as(daemon: &TestDaemon, name: Option<&str>) -> Code {
    match TableEvaluatorClient::new(as_principal(daemon.channel().await, name))
        .evaluate(EvaluateRequest::default())
        .await
    {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

async fn publish_as(
    daemon: &TestDaemon,
    name: Option<&str>,
    stream: &str,
) -> Result<(), tonic::Status> {
    let mut client = TransactionIngestClient::new(as_principal(daemon.channel().await, name));
    let record = Transaction {
        stream: stream.into(),
        record_id: "r1".into(),
        items: vec!["bread".into()],
        sensitive_items: vec![],
    };
    let mut acks = client
        .publish(tokio_stream::iter(vec![record]))
        .await?
        .into_inner();
    match tokio::time::timeout(Duration::from_secs(10), acks.message())
        .await
        .expect("no ack in time")
    {
        Ok(Some(_)) => Ok(()),
        Ok(None) => panic!("publish stream ended without an ack"),
        Err(status) => Err(status),
    }
}

fn denied(status: &tonic::Status, rule: &str) {
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains(rule), "{status:?}");
}

#[tokio::test]
async fn health_is_open_and_everything_else_needs_a_credential() {
    let daemon = TestDaemon::start(secured_config()).await;
    let health = HealthClient::new(daemon.channel().await)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await;
    assert!(health.is_ok(), "{health:?}");

    let status = submit_as(&daemon, None).await.expect_err("no credential");
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    let status = subscribe_as(&daemon, None, "poi")
        .await
        .expect_err("no credential");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(evaluate_as(&daemon, None).await, Code::Unauthenticated);

    // An unknown token, and a malformed header, are refused; neither is echoed.
    let mut client = LbsGatewayClient::new(tonic::service::interceptor::InterceptedService::new(
        daemon.channel().await,
        crate::support::security::Bearer(Some("not-a-configured-token".into())),
    ));
    let status = client
        .subscribe(LbsSubscription {
            service: "poi".into(),
        })
        .await
        .expect_err("unknown token");
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(!status.message().contains("not-a-configured-token"));
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn each_role_reaches_its_services_and_no_other() {
    let daemon = TestDaemon::start(secured_config()).await;
    // Mobile: LocationBroker yes; gateway, tables, transactions no.
    assert!(submit_as(&daemon, Some("app-a")).await.is_ok());
    denied(
        &subscribe_as(&daemon, Some("app-a"), "poi")
            .await
            .err()
            .unwrap(),
        "needs role provider",
    );
    assert_eq!(
        evaluate_as(&daemon, Some("app-a")).await,
        Code::PermissionDenied
    );
    denied(
        &publish_as(&daemon, Some("app-a"), "orders-eu")
            .await
            .unwrap_err(),
        "needs role producer",
    );

    // Provider: its services only; not LocationBroker.
    assert!(subscribe_as(&daemon, Some("lbs-poi"), "poi").await.is_ok());
    denied(
        &subscribe_as(&daemon, Some("lbs-poi"), "traffic")
            .await
            .err()
            .unwrap(),
        "auth.principals.services",
    );
    denied(
        &submit_as(&daemon, Some("lbs-poi")).await.err().unwrap(),
        "needs role mobile",
    );

    // Producer: its stream prefix only.
    publish_as(&daemon, Some("shop"), "orders-eu")
        .await
        .unwrap();
    denied(
        &publish_as(&daemon, Some("shop"), "clicks")
            .await
            .unwrap_err(),
        "auth.principals.streams",
    );
    // Consumer: its stream only, and cannot publish.
    let feed = ReleaseFeedClient::new(as_principal(daemon.channel().await, Some("reader")))
        .subscribe(ReleaseSubscription {
            stream: "orders-eu".into(),
            from_window: 0,
        })
        .await;
    assert!(feed.is_ok(), "{:?}", feed.err());
    let status = ReleaseFeedClient::new(as_principal(daemon.channel().await, Some("reader")))
        .subscribe(ReleaseSubscription {
            stream: "orders-us".into(),
            from_window: 0,
        })
        .await
        .err()
        .unwrap();
    denied(&status, "auth.principals.streams");
    denied(
        &publish_as(&daemon, Some("reader"), "orders-eu")
            .await
            .unwrap_err(),
        "needs role producer",
    );
    let status = ReleaseFeedClient::new(as_principal(daemon.channel().await, Some("shop")))
        .subscribe(ReleaseSubscription {
            stream: "orders-eu".into(),
            from_window: 0,
        })
        .await
        .err()
        .unwrap();
    denied(&status, "needs role consumer");

    // Analysts and operators reach the table services (the empty request is then invalid).
    for name in ["analyst", "ops"] {
        let code = evaluate_as(&daemon, Some(name)).await;
        assert!(
            !matches!(code, Code::PermissionDenied | Code::Unauthenticated),
            "{name}: {code:?}"
        );
    }
    assert_eq!(
        evaluate_as(&daemon, Some("lbs-poi")).await,
        Code::PermissionDenied
    );
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn mobile_principals_submit_only_for_their_user_ids() {
    let daemon = TestDaemon::start(secured_config()).await;
    let (a_tx, mut a_events) = submit_as(&daemon, Some("app-a")).await.unwrap();
    let (b_tx, mut b_events) = submit_as(&daemon, Some("app-b")).await.unwrap();
    // app-a poses as carol (app-b's user): refused, without repeating the user id.
    a_tx.send(request_at("carol", 1, 0.0, 2)).await.unwrap();
    let event = next_event(&mut a_events).await;
    let Some(Outcome::Rejected(rejected)) = event.outcome else {
        panic!("{event:?}")
    };
    assert_eq!(rejected.code, Code::PermissionDenied as i32);
    assert_eq!(rejected.field, "user_id");
    assert!(rejected.reason.contains("auth.principals.user_ids"));
    assert!(!rejected.reason.contains("carol"), "{}", rejected.reason);
    // Their own users are cloaked together.
    a_tx.send(request_at("alice", 2, 0.0, 2)).await.unwrap();
    b_tx.send(request_at("carol", 1, 20.0, 2)).await.unwrap();
    for events in [&mut a_events, &mut b_events] {
        let event = next_event(events).await;
        assert!(
            matches!(event.outcome, Some(Outcome::Cloaked(_))),
            "{event:?}"
        );
    }
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn answers_are_accepted_only_from_the_principal_that_received_the_pseudonym() {
    let daemon = TestDaemon::start(secured_config()).await;
    let mut provider = subscribe_as(&daemon, Some("lbs-poi"), "poi").await.unwrap();
    let (a_tx, mut a_events) = submit_as(&daemon, Some("app-a")).await.unwrap();
    let (b_tx, mut b_events) = submit_as(&daemon, Some("app-b")).await.unwrap();
    a_tx.send(request_at("alice", 1, 0.0, 2)).await.unwrap();
    b_tx.send(request_at("carol", 1, 20.0, 2)).await.unwrap();
    for events in [&mut a_events, &mut b_events] {
        assert!(matches!(
            next_event(events).await.outcome,
            Some(Outcome::Cloaked(_))
        ));
    }
    let first = crate::support::next_cloaked(&mut provider, 10).await;
    let second = crate::support::next_cloaked(&mut provider, 10).await;

    // Another provider of the same service, and a provider of another service, forge answers.
    for forger in ["lbs-poi-2", "lbs-traffic"] {
        let forged: Vec<LbsAnswer> = [&first, &second]
            .iter()
            .map(|c| LbsAnswer {
                pseudonym: c.pseudonym.clone(),
                payload: b"forged".to_vec(),
                ack: false,
            })
            .collect();
        let status = LbsGatewayClient::new(as_principal(daemon.channel().await, Some(forger)))
            .answer(tokio_stream::iter(forged))
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::PermissionDenied,
            "{forger}: {status:?}"
        );
        assert!(status.message().contains("did not receive"), "{status:?}");
    }
    // The receiving principal answers (from a new Answer stream): both delivered.
    let answers: Vec<LbsAnswer> = [&first, &second]
        .iter()
        .map(|c| LbsAnswer {
            pseudonym: c.pseudonym.clone(),
            payload: b"genuine".to_vec(),
            ack: false,
        })
        .collect();
    let summary = LbsGatewayClient::new(as_principal(daemon.channel().await, Some("lbs-poi")))
        .answer(tokio_stream::iter(answers))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((summary.delivered, summary.undeliverable), (2, 0));
    // The clients got the genuine reply only.
    for events in [&mut a_events, &mut b_events] {
        let Some(Outcome::Reply(reply)) = next_event(events).await.outcome else {
            panic!("expected a reply")
        };
        assert_eq!(reply.payload, b"genuine");
    }
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn one_principal_cannot_hold_every_provider_stream() {
    let mut config = secured_config();
    config.location.max_provider_streams_per_principal = 2;
    config.location.max_provider_streams = 3;
    let daemon = TestDaemon::start(config).await;
    let _one = subscribe_as(&daemon, Some("lbs-poi-2"), "poi")
        .await
        .unwrap();
    let _two = subscribe_as(&daemon, Some("lbs-poi-2"), "poi")
        .await
        .unwrap();
    let status = subscribe_as(&daemon, Some("lbs-poi-2"), "poi")
        .await
        .err()
        .unwrap();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status
            .message()
            .contains("location.max_provider_streams_per_principal")
    );
    // The real provider still gets in.
    assert!(subscribe_as(&daemon, Some("lbs-poi"), "poi").await.is_ok());
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn one_credential_is_held_to_its_request_rate() {
    let mut config = secured_config();
    config.location.max_requests_per_s_per_principal = Some(1.0);
    let daemon = TestDaemon::start(config).await;
    let (tx, mut events) = submit_as(&daemon, Some("app-b")).await.unwrap();
    let started = std::time::Instant::now();
    let users = ["carol", "dave", "erin"];
    let sent = 12u64;
    for n in 0..sent {
        // k = 50 keeps the accepted ones pending (no peers), so each gets no event until expiry.
        let mut request = request_at(users[n as usize % 3], n, 0.0, 50);
        request.dt_ms = Some(60_000);
        tx.send(request).await.unwrap();
    }
    let mut exhausted = 0;
    loop {
        match tokio::time::timeout(Duration::from_millis(1500), events.message()).await {
            Ok(Ok(Some(event))) => match event.outcome {
                Some(Outcome::Rejected(r)) if r.code == Code::ResourceExhausted as i32 => {
                    assert!(
                        r.reason
                            .contains("location.max_requests_per_s_per_principal")
                    );
                    assert!(r.reason.contains("app-b"));
                    exhausted += 1;
                }
                other => panic!("unexpected {other:?}"),
            },
            Err(_) => break,
            other => panic!("stream failed: {other:?}"),
        }
    }
    // At 1 request/s (bucket of 1), at most 1 + the elapsed seconds got through.
    let elapsed = started.elapsed().as_secs() + 1;
    let admitted = sent - exhausted;
    assert!(exhausted > 0, "nothing was rate limited");
    assert!(
        admitted <= 1 + elapsed,
        "{admitted} admitted in about {elapsed} s"
    );
    daemon.shutdown().await.unwrap();
}
