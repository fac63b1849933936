//! A realistic workload through the real daemon: a slice of the Oldenburg trace (Brinkhoff's generator)
//! replayed by many client streams, with a provider acknowledging each request and answering. An independent checker verifies every
//! outcome from what the clients and the provider saw: each cloaked request shares its box and interval
//! with >= k requests of >= k distinct users, the box contains its point and lies inside its constraint
//! box, and every request gets exactly one outcome.
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloakd::data_files::read_trace_file;
use cloakd::proto::lbs_gateway_client::LbsGatewayClient;
use cloakd::proto::location_event::Outcome;
use cloakd::proto::{LbsAnswer, LocationRequest};
use rand::{Rng, SeedableRng};
use tokio_stream::wrappers::ReceiverStream;

use crate::support::{MobileClient, TestDaemon, subscribe_provider};

const ROWS: usize = 6_000;
const STREAMS: usize = 8;
const SPEEDUP: f64 = 20.0;

/// Half-widths in degrees of a tolerance, computed here independently of the broker's geometry.
fn half_widths(lat: f64, dx: f64, dy: f64) -> (f64, f64) {
    let m_per_deg = 6_371_008.8 * std::f64::consts::PI / 180.0;
    (dy / m_per_deg, dx / (m_per_deg * lat.to_radians().cos()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oldenburg_slice_is_cloaked_k_anonymously() {
    let trace = crate::support::repo().join("tests/data/oldenburg_60s.csv.gz");
    let points = read_trace_file(&trace, Some(ROWS)).unwrap();
    assert_eq!(points.len(), ROWS);
    let daemon = TestDaemon::start_default().await;
    let mut provider = subscribe_provider(daemon.channel().await, "poi").await;
    // The provider acknowledges each request as it arrives (location.provider_ack_ms) and answers
    // them all at the end.
    let received = Arc::new(Mutex::new(Vec::new()));
    let (acks, ack_rx) = tokio::sync::mpsc::channel(1024);
    let acknowledgements = {
        let mut gateway = LbsGatewayClient::new(daemon.channel().await);
        tokio::spawn(async move { gateway.answer(ReceiverStream::new(ack_rx)).await })
    };
    let receiver = {
        let received = Arc::clone(&received);
        tokio::spawn(async move {
            while let Ok(Some(c)) = provider.message().await {
                let ack = LbsAnswer {
                    pseudonym: c.pseudonym.clone(),
                    payload: vec![],
                    ack: true,
                };
                received.lock().unwrap().push(c.pseudonym);
                if acks.send(ack).await.is_err() {
                    break;
                }
            }
        })
    };

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let requests: Vec<LocationRequest> = points
        .iter()
        .enumerate()
        .map(|(i, p)| LocationRequest {
            user_id: p.user_id.clone(),
            request_no: i as u64,
            lat: p.lat,
            lon: p.lon,
            k: Some(rng.random_range(2..=6)),
            dx_m: Some(500.0),
            dy_m: Some(500.0),
            dt_ms: Some(3_000),
            payload: vec![],
            service: "poi".into(),
            model: None,
            epsilon_per_km: None,
            fallback_epsilon_per_km: None,
        })
        .collect();

    // Users are pinned to streams, as phones to connections.
    let mut clients = Vec::new();
    for _ in 0..STREAMS {
        clients.push(MobileClient::connect(daemon.channel().await).await);
    }
    let stream_of = |user: &str| user.bytes().map(usize::from).sum::<usize>() % STREAMS;
    let t0 = points[0].timestamp;
    let start = tokio::time::Instant::now();
    let mut senders = Vec::new();
    let mut per_stream: Vec<Vec<(Duration, LocationRequest)>> = vec![Vec::new(); STREAMS];
    for (p, r) in points.iter().zip(&requests) {
        let due = Duration::from_secs_f64((p.timestamp - t0) as f64 / SPEEDUP);
        per_stream[stream_of(&r.user_id)].push((due, r.clone()));
    }
    let mut receivers = Vec::new();
    for (client, batch) in clients.into_iter().zip(per_stream) {
        let MobileClient {
            requests: tx,
            events,
        } = client;
        receivers.push(events);
        senders.push(tokio::spawn(async move {
            for (due, request) in batch {
                tokio::time::sleep_until(start + due).await;
                tx.send(request).await.unwrap();
            }
            tx
        }));
    }

    // Collect every client event until each request has its outcome.
    let (event_tx, mut event_rx) = tokio::sync::mpsc::unbounded_channel();
    for mut events in receivers {
        let event_tx = event_tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(event)) = events.message().await {
                if event_tx.send(event).is_err() {
                    break;
                }
            }
        });
    }
    let mut outcome = HashMap::new();
    while outcome.len() < ROWS {
        let event = tokio::time::timeout(Duration::from_secs(30), event_rx.recv())
            .await
            .expect("outcomes stopped arriving")
            .unwrap();
        match &event.outcome {
            Some(Outcome::Cloaked(_) | Outcome::Expired(_) | Outcome::Rejected(_)) => {
                let previous = outcome.insert(event.request_no, event.outcome.clone().unwrap());
                assert!(
                    previous.is_none(),
                    "request {} got two outcomes",
                    event.request_no
                );
            }
            Some(Outcome::Undelivered(u)) => panic!("undelivered: {u:?}"),
            _ => {}
        }
    }

    // The checker.
    let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
    let mut cloaked = 0;
    for (no, o) in &outcome {
        let r = &requests[*no as usize];
        match o {
            Outcome::Cloaked(c) => {
                cloaked += 1;
                let b = c.r#box.unwrap();
                assert!(
                    b.min_lat <= r.lat
                        && r.lat <= b.max_lat
                        && b.min_lon <= r.lon
                        && r.lon <= b.max_lon
                );
                let (dlat, dlon) = half_widths(r.lat, 500.0, 500.0);
                let eps = 1e-9;
                assert!(
                    b.min_lat >= r.lat - dlat - eps && b.max_lat <= r.lat + dlat + eps,
                    "box exceeds dy: {b:?} {r:?}"
                );
                assert!(
                    b.min_lon >= r.lon - dlon - eps && b.max_lon <= r.lon + dlon + eps,
                    "box exceeds dx: {b:?} {r:?}"
                );
                assert!(c.t_end_ms - c.t_start_ms <= 3_000);
                let key = format!("{b:?}|{}|{}", c.t_start_ms, c.t_end_ms);
                groups.entry(key).or_default().push(*no as usize);
            }
            Outcome::Expired(_) => {}
            other => panic!("request {no}: unexpected {other:?}"),
        }
    }
    for members in groups.values() {
        let users: HashSet<&str> = members
            .iter()
            .map(|&i| requests[i].user_id.as_str())
            .collect();
        assert_eq!(
            users.len(),
            members.len(),
            "a user appears twice in a group"
        );
        let max_k = members
            .iter()
            .map(|&i| requests[i].k.unwrap())
            .max()
            .unwrap();
        assert!(
            members.len() >= max_k as usize,
            "group of {} for k = {max_k}",
            members.len()
        );
    }
    // Peers are grouped within 0.6 of each 500 m tolerance (the box slides in the rest), so about
    // two fifths of this sparse slice are cloaked; the bound guards against a vacuous run.
    assert!(cloaked > ROWS / 5, "only {cloaked} of {ROWS} cloaked");

    // The provider got exactly the cloaked ones, acknowledged them, and can answer them all.
    let waiting = tokio::time::Instant::now();
    while received.lock().unwrap().len() < cloaked {
        assert!(
            waiting.elapsed() < Duration::from_secs(30),
            "the provider received {} of {cloaked}",
            received.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    receiver.abort();
    let _ = receiver.await;
    let acknowledged = acknowledgements.await.unwrap().unwrap().into_inner();
    assert_eq!(acknowledged.acknowledged as usize, cloaked);
    let answers: Vec<LbsAnswer> = received
        .lock()
        .unwrap()
        .drain(..)
        .map(|pseudonym| LbsAnswer {
            pseudonym,
            payload: b"ok".to_vec(),
            ack: false,
        })
        .collect();
    assert_eq!(answers.len(), cloaked);
    let summary = LbsGatewayClient::new(daemon.channel().await)
        .answer(tokio_stream::iter(answers))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(summary.delivered as usize, cloaked);
    for s in senders {
        drop(s.await);
    }
    daemon.shutdown().await.unwrap();
}
