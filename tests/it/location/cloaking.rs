//! End to end: many mobile clients and providers; requests are cloaked k-anonymously, providers see only
//! cloaked requests, and their answers are routed back to the right client.
use std::collections::HashMap;

use cloakd::proto::lbs_gateway_client::LbsGatewayClient;
use cloakd::proto::location_event::Outcome;
use cloakd::proto::{LbsAnswer, LocationEvent};

use crate::support::{MobileClient, TestDaemon, next_cloaked, request_at, subscribe_provider};

fn inside(b: &cloakd::proto::BoundingBox, lat: f64, lon: f64) -> bool {
    b.min_lat <= lat && lat <= b.max_lat && b.min_lon <= lon && lon <= b.max_lon
}

#[tokio::test]
async fn clients_are_cloaked_and_answers_come_back() {
    let daemon = TestDaemon::start_default().await;
    let mut provider = subscribe_provider(daemon.channel().await, "poi").await;

    // Eight users within 70 m of each other, each asking k = 4 on its own connection.
    let users = 8;
    let mut clients = Vec::new();
    for u in 0..users {
        let client = MobileClient::connect(daemon.channel().await).await;
        let request = request_at(&format!("user-{u}"), 1, 10.0 * u as f64, 4);
        client.send(request).await;
        clients.push(client);
    }

    // Every client learns it was cloaked, in a group of >= 4 whose box contains its point.
    let mut pseudonym_of = HashMap::new();
    for (u, client) in clients.iter_mut().enumerate() {
        let sent = request_at(&format!("user-{u}"), 1, 10.0 * u as f64, 4);
        let event: LocationEvent = client.next_event(10).await;
        assert_eq!(event.request_no, 1);
        let Some(Outcome::Cloaked(cloaked)) = event.outcome else {
            panic!("user-{u}: expected Cloaked, got {event:?}");
        };
        assert!(cloaked.group_size >= 4, "{cloaked:?}");
        let b = cloaked.r#box.unwrap();
        assert!(inside(&b, sent.lat, sent.lon), "user-{u}: {b:?}");
        assert!(cloaked.t_start_ms <= cloaked.t_end_ms);
        assert_eq!(cloaked.pseudonym.len(), 32);
        pseudonym_of.insert(cloaked.pseudonym.clone(), u);
    }
    assert_eq!(pseudonym_of.len(), users, "pseudonyms must be unique");

    // The provider receives exactly these pseudonyms with the payloads; boxes are shared per group.
    let mut by_box: HashMap<String, usize> = HashMap::new();
    let mut answers = Vec::new();
    for _ in 0..users {
        let cloaked = next_cloaked(&mut provider, 10).await;
        let u = *pseudonym_of
            .get(&cloaked.pseudonym)
            .expect("provider got an unknown pseudonym");
        assert_eq!(
            cloaked.payload,
            format!("query from user-{u} #1").into_bytes()
        );
        assert_eq!(cloaked.service, "poi");
        *by_box
            .entry(format!(
                "{:?}{}{}",
                cloaked.r#box, cloaked.t_start_ms, cloaked.t_end_ms
            ))
            .or_default() += 1;
        answers.push(LbsAnswer {
            pseudonym: cloaked.pseudonym.clone(),
            payload: format!("answer for {}", cloaked.pseudonym).into_bytes(),
            ack: false,
        });
    }
    assert!(by_box.values().all(|&n| n >= 4), "groups {by_box:?}");

    let mut gateway = LbsGatewayClient::new(daemon.channel().await);
    let summary = gateway
        .answer(tokio_stream::iter(answers))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(summary.delivered, users as u64);
    assert_eq!(summary.undeliverable, 0);

    // Each client receives the answer addressed to its own pseudonym.
    let pseudonym_by_user: HashMap<usize, String> =
        pseudonym_of.iter().map(|(p, u)| (*u, p.clone())).collect();
    for (u, client) in clients.iter_mut().enumerate() {
        let event = client.next_event(10).await;
        let Some(Outcome::Reply(reply)) = event.outcome else {
            panic!("user-{u}: expected a reply, got {event:?}");
        };
        assert_eq!(event.request_no, 1);
        assert_eq!(
            reply.payload,
            format!("answer for {}", pseudonym_by_user[&u]).into_bytes()
        );
    }
    drop(clients);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn one_user_cannot_make_its_own_group() {
    let daemon = TestDaemon::start_default().await;
    let mut client = MobileClient::connect(daemon.channel().await).await;
    // Five requests of the same user at the same place: never k-anonymous for k = 2.
    for no in 0..5 {
        let mut request = request_at("alone", no, 0.0, 2);
        request.dt_ms = Some(300);
        client.send(request).await;
    }
    for _ in 0..5 {
        let event = client.next_event(10).await;
        assert!(
            matches!(event.outcome, Some(Outcome::Expired(_))),
            "expected Expired, got {event:?}"
        );
    }
    daemon.shutdown().await.unwrap();
}
