//! The reference POI provider behind the real broker (`daemon::serve` on 127.0.0.1:0): simulated
//! clients at positions of the Oldenburg trace ask "nearest" through the broker; the provider (the real
//! `cloakd provider` process, or the library function behind it) answers from the cloaking box alone;
//! every client refines the candidate list with its own point and must get exactly the answer a
//! brute force over all POIs gives for that point. The provider sees only boxes that strictly contain
//! the clients' points (never a point), and a malformed query is answered with an error, not a crash.
use std::time::Duration;

use cloakd::cli::provider::PoiProvider;
use cloakd::poi::sphere::haversine_m;
use cloakd::poi::{Limits, Poi, PoiIndex, Query};
use cloakd::proto::location_event::Outcome;
use cloakd::proto::poi::{Nearest, PoiCandidates, PoiQuery, poi_query};
use cloakd::proto::{LbsAnswer, LocationRequest};
use prost::Message;
use rand::{Rng, SeedableRng};

use crate::support::{MobileClient, TestDaemon, subscribe_provider};

const CATEGORIES: [&str; 3] = ["cafe", "bank", "fuel"];

/// Seeded POIs over the trace's area.
fn pois() -> Vec<Poi> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(24);
    (0..3000)
        .map(|i| Poi {
            id: format!("p{i:05}"),
            lat: rng.random_range(53.07..53.21),
            lon: rng.random_range(8.11..8.31),
            category: CATEGORIES[i % 3].to_string(),
            name: format!("POI {i}"),
        })
        .collect()
}

/// One request per user at the trace's first instant: (user, lat, lon), at most `users`.
fn clients(users: usize) -> Vec<(String, f64, f64)> {
    let trace = crate::support::repo().join("tests/data/oldenburg_60s.csv.gz");
    let points = cloakd::workload::read_trace_file(&trace, Some(20_000)).unwrap();
    let first = points[0].timestamp;
    let mut seen = std::collections::HashSet::new();
    points
        .iter()
        .filter(|p| p.timestamp == first && seen.insert(p.user_id.clone()))
        .take(users)
        .map(|p| (p.user_id.clone(), p.lat, p.lon))
        .collect()
}

fn nearest_query(i: usize) -> (Vec<u8>, Query, &'static str) {
    let count = [1, 3][i % 2];
    let category = CATEGORIES[i % 3];
    let payload = PoiQuery {
        category: category.to_string(),
        query: Some(poi_query::Query::Nearest(Nearest { count })),
    }
    .encode_to_vec();
    (payload, Query::Nearest { count }, category)
}

fn brute_force(pois: &[Poi], category: &str, lat: f64, lon: f64, n: usize) -> Vec<String> {
    let mut all: Vec<(f64, &str)> = pois
        .iter()
        .filter(|p| p.category == category)
        .map(|p| (haversine_m(lat, lon, p.lat, p.lon), p.id.as_str()))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)));
    all.into_iter().take(n).map(|a| a.1.to_string()).collect()
}

fn request(user: &str, lat: f64, lon: f64, payload: Vec<u8>) -> LocationRequest {
    LocationRequest {
        user_id: user.to_string(),
        request_no: 1,
        lat,
        lon,
        k: Some(2),
        dx_m: Some(1000.0),
        dy_m: Some(1000.0),
        dt_ms: Some(5_000),
        payload,
        service: "poi".to_string(),
        model: None,
    }
}

/// Sends every client's request and returns, per client, its cloaking box and reply payload (None
/// when it was not cloaked).
async fn ask(
    daemon: &TestDaemon,
    requests: Vec<LocationRequest>,
) -> Vec<Option<(cloakd::proto::BoundingBox, Vec<u8>)>> {
    let mut streams = Vec::new();
    for r in requests {
        let client = MobileClient::connect(daemon.channel().await).await;
        client.send(r).await;
        streams.push(client);
    }
    let mut out = Vec::new();
    for mut client in streams {
        let mut cloaked_box = None;
        let outcome = loop {
            let event = client.next_event(30).await;
            match event.outcome {
                Some(Outcome::Cloaked(c)) => cloaked_box = c.r#box,
                Some(Outcome::Reply(reply)) => break Some((cloaked_box.unwrap(), reply.payload)),
                Some(Outcome::Expired(_)) => break None,
                other => panic!("unexpected {other:?}"),
            }
        };
        out.push(outcome);
    }
    out
}

fn strictly_inside(b: &cloakd::proto::BoundingBox, lat: f64, lon: f64) -> bool {
    b.min_lat < lat && lat < b.max_lat && b.min_lon < lon && lon < b.max_lon
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_get_their_exact_nearest_through_the_real_provider_process() {
    let pois = pois();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pois.csv");
    cloakd::poi::table::write_pois(std::fs::File::create(&file).unwrap(), &pois).unwrap();
    let daemon = TestDaemon::start_default().await;
    let mut provider = crate::support::bin()
        .args([
            "provider",
            "--service",
            "poi",
            "--addr",
            &daemon.endpoint(),
            "--pois",
        ])
        .arg(&file)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let clients = clients(200);
    let mut requests = Vec::new();
    let mut asked = Vec::new();
    for (i, (user, lat, lon)) in clients.iter().enumerate() {
        let (payload, query, category) = nearest_query(i);
        requests.push(request(user, *lat, *lon, payload));
        asked.push((query, category));
    }
    // One malformed query among them (two users so that it is cloaked with a peer).
    let (_, lat, lon) = clients[0].clone();
    requests.push(request("bad-1", lat, lon, b"\xff\xffnot a query".to_vec()));
    requests.push(request("bad-2", lat + 1e-4, lon, b"\x08".to_vec()));
    let outcomes = ask(&daemon, requests).await;
    let mut answered = 0;
    for (i, outcome) in outcomes.iter().take(clients.len()).enumerate() {
        let Some((b, payload)) = outcome else {
            continue;
        };
        let (_, lat, lon) = &clients[i];
        assert!(strictly_inside(b, *lat, *lon));
        let reply = PoiCandidates::decode(payload.as_slice()).unwrap();
        assert_eq!(reply.error, "", "client {i}");
        let (query, category) = asked[i];
        let Query::Nearest { count } = query else {
            unreachable!()
        };
        let candidates: Vec<Poi> = reply
            .pois
            .iter()
            .map(|p| Poi {
                id: p.id.clone(),
                lat: p.lat,
                lon: p.lon,
                category: p.category.clone(),
                name: p.name.clone(),
            })
            .collect();
        assert!(candidates.iter().all(|p| p.category == category));
        let exact: Vec<String> = cloakd::poi::refine(&candidates, *lat, *lon, &query)
            .into_iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(
            exact,
            brute_force(&pois, category, *lat, *lon, count as usize)
        );
        answered += 1;
    }
    assert!(answered >= 20, "only {answered} clients were cloaked");
    for outcome in &outcomes[clients.len()..] {
        let (_, payload) = outcome.as_ref().expect("the malformed queries are cloaked");
        let reply = PoiCandidates::decode(payload.as_slice()).unwrap();
        assert!(reply.pois.is_empty());
        assert!(
            reply
                .error
                .starts_with("payload: must be a cloakd.v1.poi.PoiQuery")
                || reply.error.starts_with("category: must not be empty"),
            "{}",
            reply.error
        );
    }
    // Still serving after the malformed queries.
    assert!(
        provider.try_wait().unwrap().is_none(),
        "the provider exited"
    );
    provider.kill().unwrap();
    let _ = provider.wait();
    daemon.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_sees_boxes_never_points() {
    let pois = pois();
    let provider = PoiProvider {
        index: PoiIndex::new(pois.clone()),
        limits: Limits::default(),
        max_payload_bytes: 16_384,
    };
    let daemon = TestDaemon::start_default().await;
    let mut feed = subscribe_provider(daemon.channel().await, "poi").await;
    let mut gateway =
        cloakd::proto::lbs_gateway_client::LbsGatewayClient::new(daemon.channel().await);
    let (tx, rx) = tokio::sync::mpsc::channel(1024);
    let answering = tokio::spawn(async move {
        gateway
            .answer(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    let clients = clients(120);
    let requests: Vec<LocationRequest> = clients
        .iter()
        .enumerate()
        .map(|(i, (user, lat, lon))| request(user, *lat, *lon, nearest_query(i).0))
        .collect();
    let ask = tokio::spawn({
        let mut streams = Vec::new();
        for r in &requests {
            let client = MobileClient::connect(daemon.channel().await).await;
            client.send(r.clone()).await;
            streams.push(client);
        }
        async move {
            let mut got = 0;
            for mut client in streams {
                loop {
                    let event = client.next_event(30).await;
                    match event.outcome {
                        Some(Outcome::Reply(_)) => {
                            got += 1;
                            break;
                        }
                        Some(Outcome::Expired(_)) => break,
                        _ => {}
                    }
                }
            }
            got
        }
    });
    let mut seen = 0;
    while let Ok(Some(Ok(cloaked))) = tokio::time::timeout(Duration::from_secs(8), feed.message())
        .await
        .map(|m| m.transpose())
    {
        let b = cloaked.r#box.expect("a cloaked request has its box");
        assert!(
            b.max_lat > b.min_lat && b.max_lon > b.min_lon,
            "a degenerate box"
        );
        // No client's point is on the box's boundary (so no edge gives one away), and the payload
        // is the client's query unchanged.
        for r in &requests {
            let on_edge = (r.lat == b.min_lat || r.lat == b.max_lat)
                && (b.min_lon..=b.max_lon).contains(&r.lon)
                || (r.lon == b.min_lon || r.lon == b.max_lon)
                    && (b.min_lat..=b.max_lat).contains(&r.lat);
            assert!(!on_edge, "a client's point lies on the box's edge");
        }
        let payload = provider.answer(&cloaked);
        let reply = PoiCandidates::decode(payload.as_slice()).unwrap();
        assert_eq!(reply.error, "");
        tx.send(LbsAnswer {
            pseudonym: cloaked.pseudonym,
            payload,
            ack: false,
        })
        .await
        .unwrap();
        seen += 1;
    }
    let got = ask.await.unwrap();
    assert!(seen >= 10 && got == seen, "seen {seen}, replies {got}");
    drop(tx);
    let _ = answering.await;
    daemon.shutdown().await.unwrap();
}
