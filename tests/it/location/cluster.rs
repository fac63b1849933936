//! Location cloaking across replicas, against a real 3-node NATS JetStream cluster (`nats-server`
//! processes started here; the tests fail without one) and real cloakd replicas: requests of one
//! cell entering through different replicas are cloaked together by the cell's owner (checked by a
//! brute-force checker of every group), a provider on the owner answers clients of the other
//! replica, and when the owner is killed with SIGKILL its cells move to the surviving replica,
//! which serves them.
use std::collections::HashMap;
use std::time::{Duration, Instant};

use cloakd::config::Config;
use cloakd::location::cells::CellGrid;
use cloakd::location::geo::constraint_box;
use cloakd::proto::location_event::Outcome;
use cloakd::proto::{LbsAnswer, LocationRequest};

use crate::support::nats::NatsCluster;
use crate::support::process::DaemonProcess;
use crate::support::{MobileClient, TestDaemon, next_cloaked, subscribe_provider};

const LEASE_MS: u64 = 1500;
const CELL_M: f64 = 5000.0;
/// `cluster.request_timeout_ms` of the replicas: also how long a request for a cell nobody holds
/// waits for the lease (a loaded machine running several of these tests at once has needed more
/// than 1 s for that key-value round trip).
const REQUEST_TIMEOUT_MS: u64 = 3000;

fn replica_config(nats: &NatsCluster, node: &str) -> Config {
    let mut config = Config::embedded_defaults();
    config.cluster = nats.cluster_config(&[0, 1, 2], node, 3, LEASE_MS);
    config.cluster.cell_size_m = CELL_M;
    // A request sent to an owner in the instant it is killed waits this long for its answer.
    if let Some(nats) = config.cluster.nats.as_mut() {
        nats.request_timeout = Duration::from_millis(REQUEST_TIMEOUT_MS);
    }
    config
}

/// A request `east_m` metres east and `north_m` north of Oldenburg's centre.
fn request(user: &str, request_no: u64, east_m: f64, north_m: f64, k: u32) -> LocationRequest {
    let mut request = crate::support::request_at(user, request_no, east_m, k);
    request.lat += north_m / 111_195.0;
    request
}

/// Waits until `node` holds the lease of the cell of `(lat, lon)`, as the bucket says.
async fn wait_for_holder(nats: &NatsCluster, lat: f64, lon: f64, node: &str) {
    let observer = cloakd::cluster::connect(&nats.cluster_config(&[0], "observer", 3, LEASE_MS))
        .await
        .expect("connect")
        .expect("configured");
    let kv = observer.lease_bucket().await.expect("bucket");
    let key = format!("cell.{}", CellGrid::new(CELL_M).cell_of(lat, lon).key());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(entry)) = kv.entry(&key).await {
            let value: serde_json::Value = serde_json::from_slice(&entry.value).unwrap_or_default();
            if entry.operation == async_nats::jetstream::kv::Operation::Put
                && value["holder"] == node
            {
                return;
            }
        }
        assert!(Instant::now() < deadline, "{node} never held {key}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One request as sent and the Cloaked event its client got.
struct Cloaked {
    request: LocationRequest,
    event: cloakd::proto::Cloaked,
}

/// Brute force over every group (members share box and interval): its size is what each member
/// was told, it holds at least the largest k of its members in distinct users, every member's
/// point lies inside the box and the box inside every member's constraint box.
fn check_groups(cloaked: &[Cloaked]) {
    let mut groups: HashMap<String, Vec<&Cloaked>> = HashMap::new();
    for c in cloaked {
        let b = c.event.r#box.unwrap();
        let key = format!(
            "{:?}/{}/{}",
            (b.min_lat, b.min_lon, b.max_lat, b.max_lon),
            c.event.t_start_ms,
            c.event.t_end_ms
        );
        groups.entry(key).or_default().push(c);
    }
    for members in groups.values() {
        let size = members[0].event.group_size as usize;
        assert_eq!(members.len(), size, "every member of the group was seen");
        let mut users: Vec<&str> = members.iter().map(|m| m.request.user_id.as_str()).collect();
        users.sort();
        users.dedup();
        assert_eq!(users.len(), size, "a user appears once per group");
        let max_k = members.iter().map(|m| m.request.k.unwrap()).max().unwrap();
        assert!(size >= max_k as usize, "group of {size} for k = {max_k}");
        let b = members[0].event.r#box.unwrap();
        for m in members {
            let r = &m.request;
            assert!(b.min_lat <= r.lat && r.lat <= b.max_lat);
            assert!(b.min_lon <= r.lon && r.lon <= b.max_lon);
            let cb = constraint_box(r.lat, r.lon, r.dx_m.unwrap(), r.dy_m.unwrap());
            let eps = 1e-9;
            assert!(
                cb.min_lat - eps <= b.min_lat
                    && b.max_lat <= cb.max_lat + eps
                    && cb.min_lon - eps <= b.min_lon
                    && b.max_lon <= cb.max_lon + eps,
                "cloaking box inside every member's constraint box"
            );
        }
    }
}

/// An Answer stream to `daemon`, fed by the returned sender.
async fn answer_stream(daemon: &TestDaemon) -> tokio::sync::mpsc::Sender<LbsAnswer> {
    let mut gateway =
        cloakd::proto::lbs_gateway_client::LbsGatewayClient::new(daemon.channel().await);
    let (answers, answer_rx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move {
        let _ = gateway
            .answer(tokio_stream::wrappers::ReceiverStream::new(answer_rx))
            .await;
    });
    answers
}

/// Reads the events still coming for `request_no` (each must be for it) until none comes for
/// `quiet_ms`.
async fn drain_round(client: &mut MobileClient, request_no: u64, quiet_ms: u64) {
    while let Ok(Some(event)) =
        tokio::time::timeout(Duration::from_millis(quiet_ms), client.events.message())
            .await
            .map(|m| m.unwrap())
    {
        assert_eq!(event.request_no, request_no, "{event:?}");
    }
}

/// The next event that is not `Undelivered` (no provider is subscribed in some tests, so every
/// cloaked request is followed by one).
async fn next_outcome(client: &mut MobileClient) -> cloakd::proto::LocationEvent {
    loop {
        let event = client.next_event(30).await;
        if !matches!(event.outcome, Some(Outcome::Undelivered(_))) {
            return event;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_cell_through_two_replicas_is_cloaked_together_and_answered_across() {
    let nats = NatsCluster::three().await;
    let a = TestDaemon::start(replica_config(&nats, "a")).await;
    let b = TestDaemon::start(replica_config(&nats, "b")).await;
    let mut provider = subscribe_provider(a.channel().await, "poi").await;
    let mut on_a = MobileClient::connect(a.channel().await).await;
    let mut on_b = MobileClient::connect(b.channel().await).await;

    // A takes the cell with its client's first request; B's client then joins it there.
    let first = request("alice", 1, 0.0, 0.0, 2);
    on_a.send(first.clone()).await;
    wait_for_holder(&nats, first.lat, first.lon, "a").await;
    let second = request("bob", 1, 40.0, 30.0, 2);
    on_b.send(second.clone()).await;
    let mut cloaked = Vec::new();
    for (client, req) in [(&mut on_a, &first), (&mut on_b, &second)] {
        let event = client.next_event(20).await;
        let Some(Outcome::Cloaked(c)) = event.outcome else {
            panic!("{} got {event:?}", req.user_id);
        };
        assert_eq!(c.group_size, 2, "cloaked together across replicas");
        cloaked.push(Cloaked {
            request: req.clone(),
            event: c,
        });
    }
    assert_eq!(cloaked[0].event.r#box, cloaked[1].event.r#box);
    check_groups(&cloaked);

    // The provider on A answers both; B's client gets its reply through B.
    let mut gateway = cloakd::proto::lbs_gateway_client::LbsGatewayClient::new(a.channel().await);
    let mut answers = Vec::new();
    for _ in 0..2 {
        let forwarded = next_cloaked(&mut provider, 10).await;
        answers.push(LbsAnswer {
            pseudonym: forwarded.pseudonym.clone(),
            payload: format!("answer for {}", forwarded.pseudonym).into_bytes(),
            ack: false,
        });
    }
    let summary = gateway
        .answer(tokio_stream::iter(answers))
        .await
        .expect("answer")
        .into_inner();
    assert_eq!(summary.delivered, 2, "{summary:?}");
    for (client, c) in [(&mut on_a, &cloaked[0]), (&mut on_b, &cloaked[1])] {
        let event = client.next_event(10).await;
        let Some(Outcome::Reply(reply)) = event.outcome else {
            panic!("{event:?}");
        };
        assert_eq!(event.request_no, 1);
        assert_eq!(
            reply.payload,
            format!("answer for {}", c.event.pseudonym).into_bytes()
        );
    }

    // Many users of one cell, entering through either replica at random, k in [2, 4]: every group
    // passes the checker, and groups mix clients of both replicas.
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut sent = Vec::new();
    for i in 0..40u64 {
        let through_a = rng.random_bool(0.5);
        let req = request(
            &format!("user{i}"),
            100 + i,
            rng.random_range(-300.0..300.0),
            rng.random_range(-300.0..300.0),
            rng.random_range(2..=4),
        );
        let client = if through_a { &on_a } else { &on_b };
        client.send(req.clone()).await;
        sent.push((through_a, req));
    }
    // The provider acknowledges every copy as it takes it (so none is handed on), and keeps it.
    let copies = {
        let acks = answer_stream(&a).await;
        tokio::spawn(async move {
            let mut copies = Vec::new();
            while let Ok(Ok(Some(copy))) =
                tokio::time::timeout(Duration::from_secs(5), provider.message()).await
            {
                let _ = acks
                    .send(LbsAnswer {
                        pseudonym: copy.pseudonym.clone(),
                        payload: Vec::new(),
                        ack: true,
                    })
                    .await;
                copies.push(copy);
            }
            copies
        })
    };
    // Every request gets exactly one outcome (Cloaked or Expired) on its own stream.
    let mut pending_a = sent.iter().filter(|(a, _)| *a).count();
    let mut pending_b = sent.len() - pending_a;
    let mut by_pseudonym: HashMap<String, (bool, cloakd::proto::Cloaked, LocationRequest)> =
        HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(40);
    while pending_a + pending_b > 0 {
        assert!(Instant::now() < deadline, "outcomes missing");
        let (through_a, event) = tokio::select! {
            e = on_a.events.message(), if pending_a > 0 => (true, e.unwrap().unwrap()),
            e = on_b.events.message(), if pending_b > 0 => (false, e.unwrap().unwrap()),
            () = tokio::time::sleep_until(deadline.into()) => {
                panic!("outcomes missing: {pending_a} through A, {pending_b} through B")
            }
        };
        let (sent_through_a, req) = &sent[(event.request_no - 100) as usize];
        assert_eq!(
            *sent_through_a, through_a,
            "the outcome reached its own replica"
        );
        match event.outcome {
            Some(Outcome::Cloaked(c)) => {
                by_pseudonym.insert(c.pseudonym.clone(), (through_a, c, req.clone()));
            }
            Some(Outcome::Expired(_)) => {}
            other => panic!("{other:?}"),
        }
        if through_a {
            pending_a -= 1;
        } else {
            pending_b -= 1;
        }
    }
    // The provider's copies carry the payload, which names the user: join them by pseudonym.
    let copies = copies.await.unwrap();
    assert_eq!(
        copies.len(),
        by_pseudonym.len(),
        "one copy per cloaked request"
    );
    let mut checked = Vec::new();
    let mut mixed = false;
    let mut origins_by_box: HashMap<String, Vec<bool>> = HashMap::new();
    for copy in copies {
        let (through_a, c, req) = by_pseudonym
            .get(&copy.pseudonym)
            .expect("the provider's copy matches a client's Cloaked")
            .clone();
        assert_eq!(
            copy.payload, req.payload,
            "the copy carries its request's payload"
        );
        assert_eq!(copy.r#box, c.r#box, "the provider sees the client's box");
        origins_by_box
            .entry(format!("{:?}", c.r#box))
            .or_default()
            .push(through_a);
        checked.push(Cloaked {
            request: req,
            event: c,
        });
    }
    for origins in origins_by_box.values() {
        mixed |= origins.contains(&true) && origins.contains(&false);
    }
    assert!(
        checked.len() >= 30,
        "most requests are cloaked ({})",
        checked.len()
    );
    check_groups(&checked);
    assert!(mixed, "some group has members of both replicas");
    drop((on_a, on_b));
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_owner_loses_its_cells_to_the_other_replica() {
    let nats = NatsCluster::three().await;
    // The owner is the real binary, so it can be killed with SIGKILL.
    let owner = DaemonProcess::start(&format!(
        "[cluster]\nnats_url = {:?}\nnode_id = \"a\"\nreplicas = 3\nlease_ms = {LEASE_MS}\ncell_size_m = {CELL_M:.1}\n",
        nats.url()
    ));
    let b = TestDaemon::start(replica_config(&nats, "b")).await;
    let mut on_a = MobileClient::connect(owner.channel().await).await;
    let mut on_b = MobileClient::connect(b.channel().await).await;
    let first = request("alice", 1, 0.0, 0.0, 2);
    on_a.send(first.clone()).await;
    wait_for_holder(&nats, first.lat, first.lon, "a").await;
    on_b.send(request("bob", 1, 20.0, 0.0, 2)).await;
    for client in [&mut on_a, &mut on_b] {
        let event = client.next_event(20).await;
        assert!(
            matches!(&event.outcome, Some(Outcome::Cloaked(c)) if c.group_size == 2),
            "{event:?}"
        );
        // No provider is subscribed on any replica: Undelivered at once, not at answer_ttl_ms.
        let event = client.next_event(20).await;
        assert!(
            matches!(&event.outcome, Some(Outcome::Undelivered(u)) if u.reason.contains("no provider")),
            "{event:?}"
        );
    }

    owner.signal("KILL");
    let killed = Instant::now();
    drop(on_a);
    // Clients of the dead replica reconnect to B. Until B holds the cell, requests are refused with
    // UNAVAILABLE; then B cloaks them.
    let mut carol = MobileClient::connect(b.channel().await).await;
    let mut request_no = 2;
    let served = loop {
        assert!(
            killed.elapsed() < Duration::from_secs(60),
            "the cell never moved to B"
        );
        on_b.send(request("bob", request_no, 20.0, 0.0, 2)).await;
        carol
            .send(request("carol", request_no, -20.0, 10.0, 2))
            .await;
        let mut cloaked = 0;
        for client in [&mut on_b, &mut carol] {
            let event = next_outcome(client).await;
            assert_eq!(event.request_no, request_no);
            match event.outcome {
                Some(Outcome::Cloaked(c)) => {
                    assert_eq!(c.group_size, 2);
                    cloaked += 1;
                }
                Some(Outcome::Rejected(r)) => {
                    assert_eq!(r.code, tonic::Code::Unavailable as i32, "{r:?}");
                    assert!(!r.reason.contains("53.14"), "no position in a status");
                }
                Some(Outcome::Expired(_)) => {}
                other => panic!("{other:?}"),
            }
        }
        if cloaked == 2 {
            break killed.elapsed();
        }
        // A request refused while the other was accepted may leave that one pending on B until
        // its deadline: drain it before the next round.
        if cloaked == 1 {
            for client in [&mut on_b, &mut carol] {
                drain_round(client, request_no, 200).await;
            }
        }
        request_no += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    wait_for_holder(&nats, first.lat, first.lon, "b").await;
    eprintln!("cell served by B {served:?} after the owner was killed (lease {LEASE_MS} ms)");
    // The lease protocol lets B take over one lease duration after A's last renewal; allow for a
    // loaded machine, but a cell must not stay unserved for many leases.
    assert!(
        served < Duration::from_millis(LEASE_MS * 4 + REQUEST_TIMEOUT_MS + 5_000),
        "served only {served:?} after the kill"
    );
    drop((on_b, carol));
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provider_on_one_replica_serves_the_cells_of_every_replica() {
    let nats = NatsCluster::three().await;
    let a = TestDaemon::start(replica_config(&nats, "a")).await;
    let b = TestDaemon::start(replica_config(&nats, "b")).await;
    let mut on_a = MobileClient::connect(a.channel().await).await;
    let mut on_b = MobileClient::connect(b.channel().await).await;
    let first = request("alice", 1, 0.0, 0.0, 2);
    on_a.send(first.clone()).await;
    wait_for_holder(&nats, first.lat, first.lon, "a").await;
    on_b.send(request("bob", 1, 30.0, -20.0, 2)).await;
    // No provider anywhere: each client hears so at once after its Cloaked.
    for client in [&mut on_a, &mut on_b] {
        let event = client.next_event(20).await;
        assert!(
            matches!(&event.outcome, Some(Outcome::Cloaked(c)) if c.group_size == 2),
            "{event:?}"
        );
        let event = client.next_event(20).await;
        assert_eq!(event.request_no, 1);
        let Some(Outcome::Undelivered(u)) = &event.outcome else {
            panic!("{event:?}");
        };
        assert!(u.reason.contains("no provider"), "{u:?}");
        assert!(!u.reason.contains("alice") && !u.reason.contains("bob"));
    }

    // A provider subscribed on B only. The cell's groups are formed on A, so they are relayed to B
    // (its subscription reaches A through NATS: try a few pairs until one is not Undelivered).
    let mut provider = subscribe_provider(b.channel().await, "poi").await;
    let mut gateway_b = cloakd::proto::lbs_gateway_client::LbsGatewayClient::new(b.channel().await);
    let mut request_no = 2;
    let deadline = Instant::now() + Duration::from_secs(30);
    let cloaked = loop {
        assert!(
            Instant::now() < deadline,
            "requests never reached B's provider"
        );
        let pair = [
            request("carol", request_no, -40.0, 10.0, 2),
            request("dave", request_no, 15.0, 25.0, 2),
        ];
        on_a.send(pair[0].clone()).await;
        on_b.send(pair[1].clone()).await;
        let mut cloaked = Vec::new();
        let mut undelivered = 0;
        for (client, req) in [(&mut on_a, &pair[0]), (&mut on_b, &pair[1])] {
            let event = client.next_event(20).await;
            assert_eq!(event.request_no, request_no, "{event:?}");
            let Some(Outcome::Cloaked(c)) = event.outcome else {
                panic!("{event:?}");
            };
            cloaked.push(Cloaked {
                request: req.clone(),
                event: c,
            });
            // Undelivered now, or the provider's answer later.
            if let Ok(event) =
                tokio::time::timeout(Duration::from_millis(500), client.events.message()).await
            {
                let event = event.unwrap().unwrap();
                assert!(
                    matches!(event.outcome, Some(Outcome::Undelivered(_))),
                    "{event:?}"
                );
                undelivered += 1;
            }
        }
        if undelivered == 0 {
            break cloaked;
        }
        // A request relayed while B's subscription was still on its way: drain its copy.
        while let Ok(Some(Ok(copy))) =
            tokio::time::timeout(Duration::from_millis(300), provider.message())
                .await
                .map(|m| m.transpose())
        {
            let _ = gateway_b
                .answer(tokio_stream::iter([LbsAnswer {
                    pseudonym: copy.pseudonym,
                    payload: Vec::new(),
                    ack: true,
                }]))
                .await;
        }
        // Both of a pair reach the same provider or none, unless only one of them was late.
        for client in [&mut on_a, &mut on_b] {
            drain_round(client, request_no, 300).await;
        }
        request_no += 1;
    };
    assert_eq!(cloaked[0].event.r#box, cloaked[1].event.r#box, "one group");
    check_groups(&cloaked);

    // B's provider gets both (the copy is what a provider on the owner would get), answers them
    // through B, and each client gets its answer through its own replica.
    let mut answers = Vec::new();
    let mut pseudonyms = Vec::new();
    for _ in 0..2 {
        let copy = next_cloaked(&mut provider, 10).await;
        let c = cloaked
            .iter()
            .find(|c| c.event.pseudonym == copy.pseudonym)
            .expect("the copy is one of the group's requests");
        assert_eq!(copy.payload, c.request.payload);
        assert_eq!(copy.r#box, c.event.r#box);
        pseudonyms.push(copy.pseudonym.clone());
        answers.push(LbsAnswer {
            pseudonym: copy.pseudonym.clone(),
            payload: format!("answer for {}", copy.pseudonym).into_bytes(),
            ack: false,
        });
    }
    // An answer through A, whose providers never received the pseudonym, is not routed.
    let mut gateway_a = cloakd::proto::lbs_gateway_client::LbsGatewayClient::new(a.channel().await);
    let stray = gateway_a
        .answer(tokio_stream::iter([LbsAnswer {
            pseudonym: pseudonyms[0].clone(),
            payload: b"forged".to_vec(),
            ack: false,
        }]))
        .await
        .expect("answer")
        .into_inner();
    assert_eq!(stray.delivered, 0, "{stray:?}");
    let summary = gateway_b
        .answer(tokio_stream::iter(answers))
        .await
        .expect("answer")
        .into_inner();
    assert_eq!(summary.delivered, 2, "{summary:?}");
    for (client, c) in [(&mut on_a, &cloaked[0]), (&mut on_b, &cloaked[1])] {
        let event = client.next_event(10).await;
        assert_eq!(event.request_no, request_no);
        let Some(Outcome::Reply(reply)) = event.outcome else {
            panic!("{event:?}");
        };
        assert_eq!(
            reply.payload,
            format!("answer for {}", c.event.pseudonym).into_bytes()
        );
    }

    // The provider leaves: B stops taking relays, and requests are Undelivered at once again.
    drop(provider);
    request_no += 1;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < deadline,
            "B kept taking relays after its provider left"
        );
        on_a.send(request("erin", request_no, 5.0, 5.0, 2)).await;
        on_b.send(request("frank", request_no, -5.0, -5.0, 2)).await;
        let mut no_provider = 0;
        for client in [&mut on_a, &mut on_b] {
            let event = client.next_event(20).await;
            assert!(
                matches!(event.outcome, Some(Outcome::Cloaked(_))),
                "{event:?}"
            );
            let event = client.next_event(20).await;
            match event.outcome {
                Some(Outcome::Undelivered(u)) if u.reason.contains("no provider") => {
                    no_provider += 1
                }
                Some(Outcome::Undelivered(_)) => {}
                other => panic!("{other:?}"),
            }
        }
        if no_provider == 2 {
            break;
        }
        request_no += 1;
    }
    drop((on_a, on_b));
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_provider_queue_spills_over_to_another_replicas_provider() {
    let nats = NatsCluster::three().await;
    // A's provider queue is tiny; B's has room for the whole burst.
    let config = |node: &str, places: usize| {
        let mut config = replica_config(&nats, node);
        config.location.provider_queue = places;
        config.location.provider_window = places;
        // The stuck provider must not be closed (and its requests handed on) during the test.
        config.location.provider_ack_ms = 60_000;
        config
    };
    let a = TestDaemon::start(config("a", 2)).await;
    let b = TestDaemon::start(config("b", 64)).await;
    // A's provider takes what its window allows (2) and never answers; A's queue (2) then fills.
    let _stuck = subscribe_provider(a.channel().await, "poi").await;
    let mut provider_b = subscribe_provider(b.channel().await, "poi").await;
    let answering = {
        let answers = answer_stream(&b).await;
        tokio::spawn(async move {
            let mut copies = 0usize;
            while let Ok(Some(copy)) = provider_b.message().await {
                copies += 1;
                let _ = answers
                    .send(LbsAnswer {
                        payload: format!("from b: {}", copy.pseudonym).into_bytes(),
                        pseudonym: copy.pseudonym,
                        ack: false,
                    })
                    .await;
            }
            copies
        })
    };
    let mut on_a = MobileClient::connect(a.channel().await).await;
    let first = request("u0", 0, 0.0, 0.0, 2);
    on_a.send(first.clone()).await;
    wait_for_holder(&nats, first.lat, first.lon, "a").await;
    // B's subscription to relayed requests travels to A through the NATS cluster.
    tokio::time::sleep(Duration::from_secs(1)).await;
    const N: u64 = 40;
    for i in 1..N {
        let offset = i as f64 * 7.0;
        on_a.send(request(
            &format!("u{i}"),
            i,
            offset - 140.0,
            140.0 - offset,
            2,
        ))
        .await;
    }
    let mut cloaked = HashMap::new();
    let (mut decided, mut replies, mut undelivered) = (0, 0, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(30);
    // Every request is Cloaked or Expired; every cloaked one that A's stuck provider and queue do
    // not hold (at most 4) gets B's answer.
    while decided < N || replies + undelivered.len() + 4 < cloaked.len() {
        let Ok(event) = tokio::time::timeout_at(deadline.into(), on_a.events.message()).await
        else {
            break;
        };
        let event = event.unwrap().unwrap();
        match event.outcome {
            Some(Outcome::Cloaked(c)) => {
                decided += 1;
                cloaked.insert(event.request_no, c.pseudonym);
            }
            Some(Outcome::Expired(_)) => decided += 1,
            Some(Outcome::Reply(reply)) => {
                let pseudonym = &cloaked[&event.request_no];
                assert_eq!(reply.payload, format!("from b: {pseudonym}").into_bytes());
                replies += 1;
            }
            Some(Outcome::Undelivered(u)) => undelivered.push(u.reason),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(decided, N, "every request has its outcome");
    assert!(cloaked.len() >= 30, "most are cloaked ({})", cloaked.len());
    // Without the spill-over every request past A's 4 places would be Undelivered (queue full).
    // With it, each is offered to a random member of the service's queue group (A itself among
    // them, refusing) up to 6 times: all but about one in 64 reach B.
    assert!(
        undelivered
            .iter()
            .all(|reason| reason.contains("on every replica asked")),
        "only relays that found no room: {undelivered:?}"
    );
    assert!(
        replies + 4 + undelivered.len() >= cloaked.len() && replies * 2 >= cloaked.len() - 4,
        "{replies} answered through B of {} cloaked; undelivered: {undelivered:?}",
        cloaked.len()
    );
    drop(on_a);
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
    assert!(answering.await.unwrap() >= replies);
}
