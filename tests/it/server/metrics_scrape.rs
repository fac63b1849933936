//! `/metrics` of the real daemon during a workload: the counters move as the clients saw things
//! happen (every location request ends in exactly one outcome; every acknowledged record is counted;
//! every closed window is released), and the gRPC layer counts calls by service, method and code.
use cloakd::proto::transaction_ingest_client::TransactionIngestClient;
use cloakd::proto::{Transaction, location_event};

use crate::support::process::DaemonProcess;
use crate::support::{MobileClient, released_windows, request_at};

const CONFIG: &str = r#"
[location]
services = ["poi"]
# Forwarded requests stay answerable briefly, so a client stream can end soon after its last outcome.
answer_ttl_ms = 300

[transactions.defaults]
window_records = 5
window_ms = 600000
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_follow_a_location_and_transaction_workload() {
    let daemon = DaemonProcess::start(CONFIG);
    let before = daemon.scrape();
    assert!(before.has("cloakd_build_info"), "{}", before.text);
    assert_eq!(before.sum("cloakd_location_requests_total", &[]), 0.0);

    // ---- Location: groups of k = 2 nearby, a lonely request that expires, invalid ones.
    let mut client = MobileClient::connect(daemon.channel().await).await;
    let mut sent = 0u64;
    for pair in 0..6u64 {
        for member in 0..2u64 {
            let user = format!("u{pair}-{member}");
            client
                .send(request_at(
                    &user,
                    pair * 2 + member,
                    20.0 * member as f64,
                    2,
                ))
                .await;
            sent += 1;
        }
    }
    let mut lonely = request_at("lonely", 100, 5_000_000.0, 5);
    lonely.dt_ms = Some(300);
    lonely.lat = 10.0;
    client.send(lonely).await;
    sent += 1;
    for n in 0..3u64 {
        let mut bad = request_at("bad", 200 + n, 0.0, 2);
        bad.lat = 123.0;
        client.send(bad).await;
        sent += 1;
    }
    let mut bad_k = request_at("bad", 300, 0.0, 2);
    bad_k.k = Some(0);
    client.send(bad_k).await;
    sent += 1;

    // The lonely request's 300 ms and a group's answer_ttl_ms (300 ms) race: an Undelivered may
    // come before the last expiry, and counts with the ones read after the half-close.
    let (mut cloaked, mut expired, mut rejected) = (0u64, 0u64, 0u64);
    let mut undelivered = 0u64;
    while cloaked + expired + rejected < sent {
        match client.next_event(30).await.outcome {
            Some(location_event::Outcome::Cloaked(_)) => cloaked += 1,
            Some(location_event::Outcome::Expired(_)) => expired += 1,
            Some(location_event::Outcome::Rejected(_)) => rejected += 1,
            Some(location_event::Outcome::Undelivered(u)) => {
                assert!(u.reason.contains("location.answer_ttl_ms"), "{u:?}");
                undelivered += 1;
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!((cloaked, expired, rejected), (12, 1, 4));
    // Half-close and read to the end: no provider is subscribed, so each cloaked request gets
    // Undelivered once answer_ttl_ms passes without an acknowledgement; then the call ends with OK.
    let MobileClient {
        requests,
        mut events,
    } = client;
    drop(requests);
    while let Some(event) = events.message().await.unwrap() {
        match event.outcome {
            Some(location_event::Outcome::Undelivered(u)) => {
                assert!(u.reason.contains("location.answer_ttl_ms"), "{u:?}");
                undelivered += 1;
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(undelivered, cloaked);

    let m = daemon.eventually(|m| m.sum("cloakd_location_requests_total", &[]) == sent as f64);
    let outcome = |o: &str| m.sum("cloakd_location_requests_total", &[("outcome", o)]);
    assert_eq!(outcome("cloaked"), cloaked as f64);
    assert_eq!(outcome("expired"), expired as f64);
    assert_eq!(outcome("rejected"), rejected as f64);
    assert_eq!(
        m.sum(
            "cloakd_location_undelivered_total",
            &[("service", "poi"), ("reason", "expired")]
        ),
        cloaked as f64
    );
    assert_eq!(
        m.sum(
            "cloakd_location_rejections_total",
            &[("field", "lat"), ("code", "InvalidArgument")]
        ),
        3.0
    );
    assert_eq!(
        m.sum("cloakd_location_rejections_total", &[("field", "k")]),
        1.0
    );
    assert_eq!(m.sum("cloakd_location_pending_requests", &[]), 0.0);
    // Six groups of two; relative anonymity 1 each.
    let requests = [("model", "requests")];
    assert_eq!(m.sum("cloakd_location_group_size_count", &requests), 6.0);
    assert_eq!(m.sum("cloakd_location_group_size_sum", &requests), 12.0);
    assert_eq!(
        m.sum(
            "cloakd_location_relative_anonymity_bucket",
            &[("model", "requests"), ("le", "1")]
        ),
        12.0
    );
    assert_eq!(
        m.sum("cloakd_location_group_size_count", &[("model", "presence")]),
        0.0
    );
    // Saturation: the broker actor worked, and the runtime serving gRPC reports its workers.
    assert!(
        m.sum("cloakd_location_broker_busy_seconds_total", &[]) > 0.0,
        "{}",
        m.text
    );
    assert!(m.sum("cloakd_runtime_workers", &[]) >= 1.0, "{}", m.text);
    assert!(
        m.sum("cloakd_runtime_worker_busy_seconds_total", &[]) > 0.0,
        "{}",
        m.text
    );
    assert!(m.has("cloakd_location_command_queue_depth"), "{}", m.text);
    assert!(m.has("cloakd_runtime_global_queue_depth"), "{}", m.text);
    // Every request that reached the broker was timed.
    assert_eq!(
        m.sum("cloakd_location_broker_overhead_seconds_count", &[]),
        (cloaked + expired) as f64,
        "requests that passed validation are timed; rejected ones never reach the clique search"
    );
    // No provider was subscribed: the twelve cloaked requests wait in the queue.
    assert_eq!(
        m.sum(
            "cloakd_location_provider_queue_depth",
            &[("service", "poi")]
        ),
        12.0
    );

    // ---- Transactions: 12 records in windows of 5 (two windows close), one re-published.
    let mut ingest = TransactionIngestClient::new(daemon.channel().await);
    let records: Vec<Transaction> = (0..13)
        .map(|i| Transaction {
            stream: "clicks".into(),
            record_id: format!("r{}", i.min(11)),
            items: vec![format!("a{}", i % 3), format!("b{}", i % 4)],
            sensitive_items: vec![format!("b{}", i % 4)],
        })
        .collect();
    let mut acks = ingest
        .publish(tokio_stream::iter(records))
        .await
        .unwrap()
        .into_inner();
    let mut duplicates = 0;
    let mut acked = 0;
    while let Some(ack) = acks.message().await.unwrap() {
        acked += 1;
        duplicates += usize::from(ack.duplicate);
    }
    assert_eq!((acked, duplicates), (13, 1));
    let mut suppressed = 0;
    for (expected, window) in released_windows(daemon.channel().await, "clicks", 2)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(window.window_id, expected as u64);
        suppressed += window.report.unwrap().suppressed;
    }

    let stream = [("stream", "clicks")];
    let m =
        daemon.eventually(|m| m.sum("cloakd_transaction_windows_released_total", &stream) == 2.0);
    let records = |result: &str| {
        m.sum(
            "cloakd_transaction_records_total",
            &[("stream", "clicks"), ("result", result)],
        )
    };
    assert_eq!(records("stored"), 12.0);
    assert_eq!(records("duplicate"), 1.0);
    assert_eq!(
        m.sum("cloakd_transaction_windows_closed_total", &stream),
        2.0
    );
    assert_eq!(
        m.sum("cloakd_transaction_windows_failed_total", &stream),
        0.0
    );
    assert_eq!(m.sum("cloakd_transaction_windows_unreleased", &stream), 0.0);
    // Two records sit in the open window.
    assert_eq!(m.sum("cloakd_transaction_open_records", &stream), 2.0);
    assert_eq!(
        m.sum("cloakd_transaction_suppressed_items_total", &stream),
        suppressed as f64
    );
    assert_eq!(
        m.sum("cloakd_transaction_release_lag_seconds_count", &[]),
        2.0
    );
    assert_eq!(
        m.sum("cloakd_transaction_window_anonymization_seconds_count", &[]),
        2.0
    );
    assert!(m.sum("cloakd_transaction_log_fsync_seconds_count", &[]) >= 1.0);
    let log_bytes = std::fs::metadata(
        daemon
            .config_path
            .with_file_name("data")
            .join("transactions.log"),
    )
    .unwrap()
    .len();
    assert_eq!(m.sum("cloakd_transaction_log_bytes", &[]), log_bytes as f64);

    // ---- gRPC calls by service, method and code.
    let handled = |service: &str, method: &str, code: &str| {
        m.sum(
            "grpc_server_handled_total",
            &[
                ("grpc_service", service),
                ("grpc_method", method),
                ("grpc_code", code),
            ],
        )
    };
    assert_eq!(handled("cloakd.v1.LocationBroker", "Submit", "OK"), 1.0);
    assert_eq!(handled("cloakd.v1.TransactionIngest", "Publish", "OK"), 1.0);
    assert_eq!(
        m.sum(
            "grpc_server_started_total",
            &[
                ("grpc_service", "cloakd.v1.ReleaseFeed"),
                ("grpc_method", "Subscribe")
            ]
        ),
        1.0
    );
    let mut gateway =
        cloakd::proto::lbs_gateway_client::LbsGatewayClient::new(daemon.channel().await);
    let unknown = gateway
        .subscribe(cloakd::proto::LbsSubscription {
            service: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::InvalidArgument);
    let mut health = tonic_health::pb::health_client::HealthClient::new(daemon.channel().await);
    for _ in 0..3 {
        health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .unwrap();
    }
    // The consumer hung up on its live subscription: Canceled, once the server noticed.
    let m = daemon.eventually(|m| {
        let handled = |labels: &[(&str, &str)]| m.sum("grpc_server_handled_total", labels);
        handled(&[
            ("grpc_service", "grpc.health.v1.Health"),
            ("grpc_code", "OK"),
        ]) == 3.0
            && handled(&[
                ("grpc_service", "cloakd.v1.ReleaseFeed"),
                ("grpc_method", "Subscribe"),
                ("grpc_code", "Canceled"),
            ]) == 1.0
    });
    assert_eq!(
        m.sum(
            "grpc_server_handled_total",
            &[
                ("grpc_service", "cloakd.v1.LbsGateway"),
                ("grpc_method", "Subscribe"),
                ("grpc_code", "InvalidArgument")
            ]
        ),
        1.0
    );
    assert_eq!(
        m.sum(
            "grpc_server_handling_seconds_count",
            &[
                ("grpc_service", "grpc.health.v1.Health"),
                ("grpc_method", "Check")
            ]
        ),
        3.0
    );
    // Nothing in the exposition names a user or a position.
    for secret in ["u0-0", "lonely", "53.14"] {
        assert!(!m.text.contains(secret), "{secret} leaked into /metrics");
    }
    assert!(!m.text.contains("quantile="), "histograms, not summaries");
    daemon.stop();
}

/// PRESENCE requests are observed like CliqueCloak groups, under `model="presence"`: one group size
/// (the anonymity set the client was told) and one relative anonymity (set size / k) per cloaked
/// request; an expired one is not observed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_requests_observe_group_size_and_relative_anonymity() {
    let daemon = DaemonProcess::start(
        r#"
[location]
services = ["poi"]
presence_max_age_ms = 600000
"#,
    );
    let users: Vec<String> = (0..6).map(|i| format!("p{i}")).collect();
    let mut broker =
        cloakd::proto::location_broker_client::LocationBrokerClient::new(daemon.channel().await);
    let updates: Vec<cloakd::proto::PositionUpdate> = users
        .iter()
        .enumerate()
        .map(|(i, user)| {
            let at = request_at(user, 0, 30.0 * i as f64, 2);
            cloakd::proto::PositionUpdate {
                user_id: user.clone(),
                lat: at.lat,
                lon: at.lon,
            }
        })
        .collect();
    let accepted = broker
        .report(tokio_stream::iter(updates))
        .await
        .unwrap()
        .into_inner()
        .accepted;
    assert_eq!(accepted, 6);

    let mut client = MobileClient::connect(daemon.channel().await).await;
    let asks: [(usize, u32); 4] = [(0, 2), (3, 3), (5, 2), (1, 50)];
    for (n, &(user, k)) in asks.iter().enumerate() {
        let mut request = request_at(&users[user], n as u64, 30.0 * user as f64, k);
        request.model = Some(cloakd::proto::CloakModel::Presence as i32);
        client.send(request).await;
    }
    let (mut cloaked, mut sizes, mut relative) = (0u64, 0.0, 0.0);
    for _ in 0..asks.len() {
        let event = client.next_event(30).await;
        let k = asks[event.request_no as usize].1;
        match event.outcome {
            Some(location_event::Outcome::Cloaked(c)) => {
                assert!(c.group_size >= k, "{c:?}");
                cloaked += 1;
                sizes += f64::from(c.group_size);
                relative += f64::from(c.group_size) / f64::from(k);
            }
            Some(location_event::Outcome::Expired(_)) => assert_eq!(k, 50),
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(cloaked, 3, "six users present: k = 50 cannot be met");
    let presence = [("model", "presence")];
    let m = daemon.eventually(|m| m.sum("cloakd_location_group_size_count", &presence) == 3.0);
    assert_eq!(m.sum("cloakd_location_group_size_sum", &presence), sizes);
    assert_eq!(
        m.sum("cloakd_location_relative_anonymity_count", &presence),
        3.0
    );
    let observed = m.sum("cloakd_location_relative_anonymity_sum", &presence);
    assert!(
        (observed - relative).abs() < 1e-9,
        "{observed} vs {relative}"
    );
    assert_eq!(
        m.sum("cloakd_location_group_size_count", &[("model", "requests")]),
        0.0
    );
    drop(client);
    daemon.stop();
}
