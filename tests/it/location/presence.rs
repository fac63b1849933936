//! The PRESENCE model against the real daemon: positions reported over `Report`, requests answered at
//! once, and every `Cloaked` region checked on the client side by the independent presence checker
//! (at least k reported users inside, inside the constraint box, reciprocal: the users inside who asked
//! with the same k got the same region); expired requests are never forwarded; bad updates end the
//! Report stream naming the field; the tracked-user limit answers RESOURCE_EXHAUSTED; positions age out.
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use cloakd::location::GeoBox;
use cloakd::location::presence_checker::PresenceChecker;
use cloakd::proto::location_broker_client::LocationBrokerClient;
use cloakd::proto::location_event::Outcome;
use cloakd::proto::{CloakModel, LocationRequest, PositionUpdate};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tonic::Code;

use crate::support::{MobileClient, TestDaemon, config_with, subscribe_provider};

const TOLERANCE_M: f64 = 1_000.0;

fn update(user: &str, lat: f64, lon: f64) -> PositionUpdate {
    PositionUpdate {
        user_id: user.to_string(),
        lat,
        lon,
    }
}

fn presence_request(
    user: &str,
    request_no: u64,
    (lat, lon): (f64, f64),
    k: u32,
) -> LocationRequest {
    LocationRequest {
        user_id: user.to_string(),
        request_no,
        lat,
        lon,
        k: Some(k),
        dx_m: Some(TOLERANCE_M),
        dy_m: Some(TOLERANCE_M),
        dt_ms: None,
        payload: b"nearest pharmacy".to_vec(),
        service: "poi".to_string(),
        model: Some(CloakModel::Presence as i32),
        epsilon_per_km: None,
        fallback_epsilon_per_km: None,
    }
}

async fn report(
    daemon: &TestDaemon,
    updates: Vec<PositionUpdate>,
) -> Result<cloakd::proto::ReportSummary, tonic::Status> {
    let mut client = LocationBrokerClient::new(daemon.channel().await);
    client
        .report(tokio_stream::iter(updates))
        .await
        .map(|r| r.into_inner())
}

fn to_geo(b: &cloakd::proto::BoundingBox) -> GeoBox {
    GeoBox {
        min_lat: b.min_lat,
        min_lon: b.min_lon,
        max_lat: b.max_lat,
        max_lon: b.max_lon,
    }
}

#[tokio::test]
async fn every_region_holds_k_reported_users_and_is_reciprocal() {
    let daemon = TestDaemon::start(config_with(|c| {
        c.location.presence.max_age_ms = 600_000;
    }))
    .await;
    let mut provider = subscribe_provider(daemon.channel().await, "poi").await;

    // 80 users around Oldenburg: a dense centre and a sparse ring, so some requests must expire.
    let mut rng = ChaCha8Rng::seed_from_u64(14);
    let users: Vec<(String, (f64, f64))> = (0..80)
        .map(|i| {
            let spread = if i < 50 { 0.01 } else { 0.08 };
            let lat = 53.14 + rng.random_range(-spread..spread);
            let lon = 8.21 + rng.random_range(-spread..spread) * 1.66;
            (format!("user-{i:02}"), (lat, lon))
        })
        .collect();
    let summary = report(
        &daemon,
        users
            .iter()
            .map(|(u, (lat, lon))| update(u, *lat, *lon))
            .collect(),
    )
    .await
    .expect("Report failed");
    assert_eq!(summary.accepted, 80);
    let mut checker = PresenceChecker::new(u64::MAX);
    for (user, (lat, lon)) in &users {
        checker.record(user.clone(), *lat, *lon, 0);
    }

    // Every user asks with each k at the position it reported: the snapshot never changes, so these
    // are the re-cloakings of each other that reciprocity speaks of.
    let ks = [2u32, 3, 5];
    let mut client = MobileClient::connect(daemon.channel().await).await;
    let mut asked: HashMap<u64, (usize, u32)> = HashMap::new();
    for (i, (user, position)) in users.iter().enumerate() {
        for &k in &ks {
            let request_no = asked.len() as u64;
            asked.insert(request_no, (i, k));
            client
                .send(presence_request(user, request_no, *position, k))
                .await;
        }
    }
    // (user index, k) -> the region it got (None: expired), and the announced anonymity set size.
    let mut regions: BTreeMap<(usize, u32), Option<(GeoBox, u32)>> = BTreeMap::new();
    while regions.len() < asked.len() {
        let event = client.next_event(10).await;
        let (i, k) = asked[&event.request_no];
        let answer = match event.outcome {
            Some(Outcome::Cloaked(c)) => {
                assert_eq!(c.t_start_ms, c.t_end_ms, "answered at once");
                Some((to_geo(&c.r#box.expect("a cloaked box")), c.group_size))
            }
            Some(Outcome::Expired(_)) => None,
            other => panic!("unexpected outcome {other:?}"),
        };
        regions.insert((i, k), answer);
    }

    let mut cloaked = 0;
    for (&(i, k), answer) in &regions {
        let Some((region, group_size)) = answer else {
            continue;
        };
        cloaked += 1;
        let (user, (lat, lon)) = &users[i];
        let found = checker
            .check_region(user, *lat, *lon, k, TOLERANCE_M, TOLERANCE_M, region, 0)
            .unwrap_or_else(|e| panic!("{user} k={k}: {e}"));
        let same = PresenceChecker::check_reciprocity(user, k, region, &found.inside, |other| {
            let j = users.iter().position(|(u, _)| u == other)?;
            regions.get(&(j, k)).copied().flatten().map(|(r, _)| r)
        })
        .unwrap_or_else(|e| panic!("{user} k={k}: {e}"));
        // The anonymity set is exactly the users who get this region with this k.
        assert_eq!(same as u32, *group_size, "{user} k={k}");
        assert!(
            *group_size >= k && *group_size < 2 * k,
            "{user} k={k}: {group_size}"
        );
    }
    let expired = regions.len() - cloaked;
    assert!(cloaked > 100, "only {cloaked} of {} cloaked", regions.len());
    assert!(
        expired > 0,
        "the sparse ring should leave some requests without a region"
    );

    // Exactly the cloaked requests reach the provider, with the box the client was told.
    let mut forwarded = 0;
    while forwarded < cloaked {
        let request = tokio::time::timeout(Duration::from_secs(10), provider.message())
            .await
            .expect("provider got too few requests")
            .expect("provider stream failed")
            .expect("provider stream ended");
        let region = to_geo(&request.r#box.expect("box"));
        assert!(regions.values().flatten().any(|(r, _)| *r == region));
        assert_eq!(request.pseudonym.len(), 32);
        forwarded += 1;
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(300), provider.message())
            .await
            .is_err(),
        "an expired request was forwarded"
    );
    drop(client);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_updates_end_the_report_naming_the_field() {
    let daemon = TestDaemon::start_default().await;
    let cases: [(&str, PositionUpdate); 4] = [
        ("lat", update("a", f64::NAN, 8.0)),
        ("lat", update("a", 90.5, 8.0)),
        ("lon", update("a", 53.0, -181.0)),
        ("user_id", update(" ", 53.0, 8.0)),
    ];
    for (field, bad) in cases {
        let updates = vec![update("ok-1", 53.0, 8.0), update("ok-2", 53.0, 8.0), bad];
        let status = report(&daemon, updates).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(status.message().starts_with(field), "{status:?}");
        assert!(
            status.message().contains("update 3") && status.message().contains("2 before it"),
            "{status:?}"
        );
    }
    // A bad model is rejected on the request's own event, and the stream goes on.
    let mut client = MobileClient::connect(daemon.channel().await).await;
    for (no, model) in [(0u64, 0i32), (1, 7)] {
        let mut request = presence_request("a", no, (53.0, 8.0), 2);
        request.model = Some(model);
        client.send(request).await;
        let event = client.next_event(10).await;
        let Some(Outcome::Rejected(rejected)) = event.outcome else {
            panic!("expected Rejected, got {event:?}");
        };
        assert_eq!(rejected.field, "model");
        assert_eq!(rejected.code, Code::InvalidArgument as i32);
    }
    drop(client);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn tracked_users_are_bounded_and_positions_age_out() {
    let daemon = TestDaemon::start(config_with(|c| {
        c.location.presence.max_tracked_users = 3;
        c.location.presence.max_age_ms = 300;
        c.location.default_model = cloakd::config::CloakModel::Presence;
    }))
    .await;
    let updates = (0..4)
        .map(|i| update(&format!("u{i}"), 53.14, 8.21 + 0.0001 * f64::from(i)))
        .collect();
    let status = report(&daemon, updates).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("location.max_tracked_users")
            && status.message().contains("3 before it were applied"),
        "{status:?}"
    );
    // Known users still update; a request without a model takes the default (presence), at once.
    let mut client = MobileClient::connect(daemon.channel().await).await;
    let mut request = presence_request("u0", 0, (53.14, 8.21), 3);
    request.model = None;
    client.send(request.clone()).await;
    let event = client.next_event(10).await;
    let Some(Outcome::Cloaked(cloaked)) = event.outcome else {
        panic!("expected Cloaked, got {event:?}");
    };
    assert_eq!(cloaked.group_size, 3);
    // Once the others' positions are older than presence_max_age_ms, the requester is alone.
    tokio::time::sleep(Duration::from_millis(400)).await;
    request.request_no = 1;
    client.send(request).await;
    let event = client.next_event(10).await;
    assert!(
        matches!(event.outcome, Some(Outcome::Expired(_))),
        "{event:?}"
    );
    drop(client);
    daemon.shutdown().await.unwrap();
}
