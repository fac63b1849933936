//! Users who keep asking: with `location.session_ms`, a user's successive requests are cloaked only with
//! users of his previous group (memorized anonymity sets), so intersecting his groups over a session
//! (query tracking) never leaves fewer than k users. Checked against the real daemon: a hand-made
//! scenario that tracking breaks without the defence, and a trace replay whose client-side view is
//! checked by the session-anonymity measure (`location::tracking`, not the engine's code).
use std::collections::HashMap;
use std::time::Duration;

use cloakd::data_files::read_trace_file;
use cloakd::location::tracking::{CloakedObservation, session_anonymity};
use cloakd::proto::location_event::Outcome;
use cloakd::proto::{Cloaked, LocationRequest};

use crate::support::{MobileClient, TestDaemon, config_with, request_at};

/// The key the provider and an observer tell a group by: its shared box and interval.
fn group_key(c: &Cloaked) -> String {
    format!("{:?}|{}|{}", c.r#box, c.t_start_ms, c.t_end_ms)
}

async fn cloaked(client: &mut MobileClient) -> Cloaked {
    match client.next_event(20).await.outcome {
        Some(Outcome::Cloaked(c)) => c,
        other => panic!("expected Cloaked, got {other:?}"),
    }
}

/// Round 1: a, b, c are cloaked together. Round 2: a asks again next to d, e and f. Without sessions,
/// a's second group is {a, d, e} (or with f) and tracking a over both groups leaves a alone; with
/// sessions a waits for b and c, and d, e, f are cloaked among themselves.
async fn two_rounds(session_ms: u64) -> (String, String, String) {
    let daemon = TestDaemon::start(config_with(|c| {
        c.location.sessions.session_ms = session_ms;
    }))
    .await;
    let mut clients = HashMap::new();
    for user in ["a", "b", "c", "d", "e", "f"] {
        clients.insert(user, MobileClient::connect(daemon.channel().await).await);
    }
    for (i, user) in ["a", "b", "c"].into_iter().enumerate() {
        clients[user]
            .send(request_at(user, 1, 10.0 * i as f64, 3))
            .await;
    }
    let first = cloaked(clients.get_mut("a").unwrap()).await;
    for user in ["b", "c"] {
        assert_eq!(
            group_key(&cloaked(clients.get_mut(user).unwrap()).await),
            group_key(&first)
        );
    }
    for (i, user) in ["a", "d", "e"].into_iter().enumerate() {
        clients[user]
            .send(request_at(user, 2, 20.0 + i as f64, 3))
            .await;
    }
    let (a_second, d_second, b_second) = if session_ms == 0 {
        let a = cloaked(clients.get_mut("a").unwrap()).await;
        let d = cloaked(clients.get_mut("d").unwrap()).await;
        (group_key(&a), group_key(&d), String::new())
    } else {
        clients["f"].send(request_at("f", 2, 25.0, 3)).await;
        let d = group_key(&cloaked(clients.get_mut("d").unwrap()).await);
        for user in ["e", "f"] {
            assert_eq!(group_key(&cloaked(clients.get_mut(user).unwrap()).await), d);
        }
        for (i, user) in ["b", "c"].into_iter().enumerate() {
            clients[user]
                .send(request_at(user, 2, 30.0 + i as f64, 3))
                .await;
        }
        let a = group_key(&cloaked(clients.get_mut("a").unwrap()).await);
        let b = group_key(&cloaked(clients.get_mut("b").unwrap()).await);
        (a, d, b)
    };
    drop(clients);
    daemon.shutdown().await.unwrap();
    (a_second, d_second, b_second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sessions_tracking_isolates_a_user() {
    let (a, d, _) = two_rounds(0).await;
    assert_eq!(a, d, "a's second request was cloaked with d (the attack)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sessions_a_user_is_cloaked_again_with_his_memorized_group() {
    let (a, d, b) = two_rounds(60_000).await;
    assert_ne!(a, d, "a must not be cloaked with d inside his session");
    assert_eq!(a, b, "a's second group is again with b (and c)");
}

const ROWS: usize = 5_000;
const STREAMS: usize = 8;
const SPEEDUP: f64 = 4.0;

/// Replays a trace slice (k is each user's setting) and returns the session anonymity the clients see.
async fn replay(session_ms: u64) -> cloakd::location::tracking::SessionAnonymity {
    let trace = crate::support::repo().join("tests/data/oldenburg_60s.csv.gz");
    let points = read_trace_file(&trace, Some(ROWS)).unwrap();
    let daemon = TestDaemon::start(config_with(|c| {
        c.location.sessions.session_ms = session_ms;
    }))
    .await;
    let _provider = crate::support::subscribe_provider(daemon.channel().await, "poi").await;
    let mut users: HashMap<&str, u64> = HashMap::new();
    let requests: Vec<(u64, LocationRequest)> = points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let next = users.len() as u64;
            let user = *users.entry(p.user_id.as_str()).or_insert(next);
            let request = LocationRequest {
                user_id: p.user_id.clone(),
                request_no: i as u64,
                lat: p.lat,
                lon: p.lon,
                k: Some(2 + (user % 4) as u32),
                dx_m: Some(500.0),
                dy_m: Some(500.0),
                dt_ms: Some(2_000),
                payload: vec![],
                service: "poi".into(),
                model: None,
                epsilon_per_km: None,
                fallback_epsilon_per_km: None,
            };
            (user, request)
        })
        .collect();
    let t0 = points[0].timestamp;
    let start = tokio::time::Instant::now();
    let (event_tx, mut event_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut per_stream: Vec<Vec<(Duration, LocationRequest)>> = vec![Vec::new(); STREAMS];
    for (p, (user, r)) in points.iter().zip(&requests) {
        let due = Duration::from_secs_f64((p.timestamp - t0) as f64 / SPEEDUP);
        per_stream[*user as usize % STREAMS].push((due, r.clone()));
    }
    let mut senders = Vec::new();
    for batch in per_stream {
        let MobileClient {
            requests: tx,
            mut events,
        } = MobileClient::connect(daemon.channel().await).await;
        let event_tx = event_tx.clone();
        tokio::spawn(async move {
            while let Ok(Some(event)) = events.message().await {
                if event_tx.send(event).is_err() {
                    break;
                }
            }
        });
        senders.push(tokio::spawn(async move {
            for (due, request) in batch {
                tokio::time::sleep_until(start + due).await;
                tx.send(request).await.unwrap();
            }
            tx
        }));
    }
    let mut outcomes = 0;
    let mut groups: HashMap<String, u64> = HashMap::new();
    let mut observed = Vec::new();
    while outcomes < ROWS {
        let event = tokio::time::timeout(Duration::from_secs(30), event_rx.recv())
            .await
            .expect("outcomes stopped arriving")
            .unwrap();
        let (user, request) = &requests[event.request_no as usize];
        match event.outcome {
            Some(Outcome::Cloaked(c)) => {
                outcomes += 1;
                let next = groups.len() as u64;
                observed.push(CloakedObservation {
                    user: *user,
                    group: *groups.entry(group_key(&c)).or_insert(next),
                    formed_at_ms: c.t_end_ms,
                    k: request.k.unwrap(),
                });
            }
            Some(Outcome::Expired(_)) => outcomes += 1,
            Some(Outcome::Rejected(r)) => panic!("rejected: {r:?}"),
            _ => {}
        }
    }
    for s in senders {
        drop(s.await);
    }
    daemon.shutdown().await.unwrap();
    assert!(observed.len() > 100, "only {} cloaked", observed.len());
    session_anonymity(&observed, session_ms.max(60_000))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_replay_keeps_every_session_k_anonymous() {
    let plain = replay(0).await;
    assert!(
        plain.share_below_k > 0.0,
        "the slice should exhibit query tracking without the defence: {plain:?}"
    );
    let defended = replay(60_000).await;
    assert!(defended.repeated_sessions > 50, "{defended:?}");
    assert_eq!(defended.share_below_k, 0.0, "{defended:?}");
}
