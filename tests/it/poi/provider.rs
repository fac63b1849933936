//! The reference POI provider behind the real broker (`daemon::serve` on 127.0.0.1:0): simulated
//! clients at positions of the Oldenburg trace ask "nearest" through the broker; the provider (the real
//! `cloakd provider` process, or the library function behind it) answers from the cloaking box alone;
//! every client refines the candidate list with its own point and must get exactly the answer a
//! brute force over all POIs gives for that point. The provider sees only boxes that strictly contain
//! the clients' points (never a point), and a malformed query is answered with an error, not a crash.
//! Under a burst the provider acknowledges at once and answers every request (or sheds it with the
//! overloaded answer) without being closed; it reconnects when the daemon restarts; a POI file with
//! a duplicate id is refused; an unknown category is answered with an error naming the known ones.
use std::path::Path;
use std::time::Duration;

use cloakd::poi::sphere::haversine_m;
use cloakd::poi::{Limits, Poi, PoiIndex, Query};
use cloakd::proto::location_event::Outcome;
use cloakd::proto::poi::{Nearest, PoiCandidates, PoiQuery, poi_query};
use cloakd::proto::{LbsAnswer, LocationRequest};
use cloakd::provider::PoiProvider;
use prost::Message;
use rand::{Rng, SeedableRng};

use crate::support::{MobileClient, TestDaemon, bin, config_with, subscribe_provider};

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
    let points = cloakd::data_files::read_trace_file(&trace, Some(20_000)).unwrap();
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
        epsilon_per_km: None,
        fallback_epsilon_per_km: None,
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
    cloakd::poi::pois_csv::write_pois(std::fs::File::create(&file).unwrap(), &pois).unwrap();
    let daemon = TestDaemon::start_default().await;
    let mut provider = bin()
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

/// A running `cloakd provider` process, killed when dropped; its stderr goes to a file.
struct ProviderProcess {
    child: std::process::Child,
    stderr: std::path::PathBuf,
}

impl ProviderProcess {
    fn start(addr: &str, pois: &Path, extra: &[&str], dir: &Path) -> ProviderProcess {
        let stderr = dir.join("provider.stderr");
        let child = bin()
            .args(["provider", "--service", "poi", "--addr", addr, "--pois"])
            .arg(pois)
            .args(extra)
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        ProviderProcess { child, stderr }
    }

    fn assert_running(&mut self) {
        let status = self.child.try_wait().unwrap();
        assert!(
            status.is_none(),
            "the provider exited ({status:?}): {}",
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        );
    }
}

impl Drop for ProviderProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `count` seeded POIs of `category` spread over the box around Oldenburg's centre.
fn dense_pois(count: usize, category: &str) -> Vec<Poi> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(43);
    (0..count)
        .map(|i| Poi {
            id: format!("r{i:06}"),
            lat: rng.random_range(53.04..53.24),
            lon: rng.random_range(8.06..8.36),
            category: category.to_string(),
            name: String::new(),
        })
        .collect()
}

fn write_pois(dir: &Path, pois: &[Poi]) -> std::path::PathBuf {
    let file = dir.join("pois.csv");
    cloakd::poi::pois_csv::write_pois(std::fs::File::create(&file).unwrap(), pois).unwrap();
    file
}

fn nearest(category: &str, count: u32) -> Vec<u8> {
    PoiQuery {
        category: category.to_string(),
        query: Some(poi_query::Query::Nearest(Nearest { count })),
    }
    .encode_to_vec()
}

/// What the provider's replies said, by kind.
#[derive(Debug, Default)]
struct Replies {
    answered: usize,
    overloaded: usize,
    refused: Vec<String>,
}

impl Replies {
    fn count(&mut self, payload: &[u8]) {
        let reply = PoiCandidates::decode(payload).expect("a reply is a PoiCandidates");
        if reply.overloaded {
            assert!(reply.pois.is_empty());
            assert!(reply.error.starts_with("provider: overloaded"), "{reply:?}");
            self.overloaded += 1;
        } else if reply.error.is_empty() {
            self.answered += 1;
        } else {
            self.refused.push(reply.error);
        }
    }
}

/// Issue 43, item 10: a burst of ordinary queries on one stream, with a provider window and an
/// acknowledgement deadline far below what the provider needs to answer the burst. The provider
/// acknowledges every request at once, answers from its worker pool, sheds what its queue cannot
/// hold with the overloaded answer, and keeps running: every cloaked request gets exactly one reply,
/// none is Undelivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_queries_gets_one_reply_each_and_the_provider_survives() {
    const BURST: u64 = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let file = write_pois(dir.path(), &dense_pois(30_000, "restaurant"));
    let daemon = TestDaemon::start(config_with(|c| {
        c.location.provider_ack_ms = 300;
        c.location.provider_window = 1024;
    }))
    .await;
    let mut provider = ProviderProcess::start(
        &daemon.endpoint(),
        &file,
        &["--threads", "2", "--queue", "64"],
        dir.path(),
    );
    let mut client = MobileClient::connect(daemon.channel().await).await;
    let requests = client.requests.clone();
    let sender = tokio::spawn(async move {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(10);
        for no in 0..BURST {
            let mut r = request(
                &format!("burst-{no}"),
                rng.random_range(53.10..53.18),
                rng.random_range(8.15..8.27),
                nearest("restaurant", 5),
            );
            r.request_no = no;
            r.dx_m = Some(2_000.0);
            r.dy_m = Some(2_000.0);
            r.dt_ms = Some(10_000);
            requests.send(r).await.unwrap();
        }
    });
    let mut cloaked = std::collections::HashSet::new();
    let mut finished = std::collections::HashMap::new();
    let mut replies = Replies::default();
    while finished.len() < BURST as usize {
        let event = tokio::time::timeout(Duration::from_secs(60), client.events.message())
            .await
            .unwrap_or_else(|_| panic!("stalled after {} outcomes", finished.len()))
            .expect("event stream failed")
            .expect("event stream ended");
        let no = event.request_no;
        match event.outcome {
            Some(Outcome::Cloaked(_)) => assert!(cloaked.insert(no), "{no} cloaked twice"),
            Some(Outcome::Reply(reply)) => {
                assert!(cloaked.contains(&no), "{no}: a reply before Cloaked");
                replies.count(&reply.payload);
                assert!(finished.insert(no, "reply").is_none(), "{no}: two outcomes");
            }
            Some(Outcome::Expired(_)) => {
                assert!(
                    finished.insert(no, "expired").is_none(),
                    "{no}: two outcomes"
                );
            }
            other => panic!("request {no}: {other:?}"),
        }
    }
    sender.await.unwrap();
    let replied = finished.values().filter(|&&o| o == "reply").count();
    assert_eq!(
        replied,
        cloaked.len(),
        "every cloaked request gets its reply"
    );
    assert!(replied >= BURST as usize / 2, "only {replied} cloaked");
    // Not everything was shed: the provider computed answers (lists, or lists too long to send).
    assert!(replies.answered + replies.refused.len() > 0, "{replies:?}");
    assert!(
        replies.refused.iter().all(|e| e.starts_with("query: ")),
        "{:?}",
        replies.refused.first()
    );
    eprintln!(
        "burst: {replied} replies: {} answered, {} overloaded, {} refused",
        replies.answered,
        replies.overloaded,
        replies.refused.len()
    );
    provider.assert_running();
    drop(provider);
    daemon.shutdown().await.unwrap();
}

/// A daemon on a fixed address that can be stopped and started again on it.
struct RestartableDaemon {
    addr: std::net::SocketAddr,
    data: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl RestartableDaemon {
    async fn start(listener: tokio::net::TcpListener, data: tempfile::TempDir) -> Self {
        let mut config = cloakd::config::Config::embedded_defaults();
        config.transactions.data_dir = data.path().to_path_buf();
        config.telemetry.metrics_listen = None;
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(cloakd::daemon::serve(config, listener, async move {
            let _ = stopped.await;
        }));
        RestartableDaemon {
            addr,
            data,
            stop: Some(stop),
            task: Some(task),
        }
    }

    async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    /// Stops the daemon and starts a new one on the same address.
    async fn restart(mut self) -> Self {
        let _ = self.stop.take().unwrap().send(());
        tokio::time::timeout(Duration::from_secs(30), self.task.take().unwrap())
            .await
            .expect("the daemon did not stop")
            .unwrap()
            .unwrap();
        let mut tries = 0;
        let listener = loop {
            match tokio::net::TcpListener::bind(self.addr).await {
                Ok(listener) => break listener,
                Err(e) if tries < 100 => {
                    tries += 1;
                    eprintln!("rebinding {}: {e}", self.addr);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("cannot bind {} again: {e}", self.addr),
            }
        };
        let data = std::mem::replace(&mut self.data, tempfile::tempdir().unwrap());
        Self::start(listener, data).await
    }
}

/// Two clients near each other ask a nearest query; both must get a candidate list.
async fn ask_pair(channel: tonic::transport::Channel, round: u32) {
    let mut pair = Vec::new();
    for i in 0..2 {
        let client = MobileClient::connect(channel.clone()).await;
        let user = format!("round-{round}-{i}");
        let lat = 53.14 + f64::from(i) * 1e-4;
        client
            .send(request(&user, lat, 8.21, nearest("restaurant", 1)))
            .await;
        pair.push(client);
    }
    for mut client in pair {
        loop {
            match client.next_event(60).await.outcome {
                Some(Outcome::Cloaked(_)) => {}
                Some(Outcome::Reply(reply)) => {
                    let list = PoiCandidates::decode(reply.payload.as_slice()).unwrap();
                    assert_eq!(list.error, "", "round {round}");
                    assert!(!list.pois.is_empty(), "round {round}");
                    break;
                }
                other => panic!("round {round}: {other:?}"),
            }
        }
    }
}

/// A provider whose daemon stops and comes back reconnects (with backoff) and answers again,
/// instead of exiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_reconnects_when_the_daemon_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_pois(dir.path(), &dense_pois(2_000, "restaurant"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut daemon = RestartableDaemon::start(listener, tempfile::tempdir().unwrap()).await;
    let mut provider = ProviderProcess::start(
        &format!("http://{}", daemon.addr),
        &file,
        &["--reconnect-max-ms", "300"],
        dir.path(),
    );
    ask_pair(daemon.channel().await, 0).await;
    for round in 1..=2 {
        daemon = daemon.restart().await;
        ask_pair(daemon.channel().await, round).await;
        provider.assert_running();
    }
    drop(provider);
    let _ = daemon.stop.take().unwrap().send(());
}

/// Issue 43, item 11: a POI file with a duplicate id is refused, naming the file, the line and the
/// id; the provider does not start.
#[test]
fn a_poi_file_with_a_duplicate_id_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pois.csv");
    std::fs::write(
        &file,
        "id,lat,lon,category,name\na,53.1,8.2,cafe,A\nb,53.2,8.2,cafe,B\na,53.3,8.2,bank,C\n",
    )
    .unwrap();
    let out = bin()
        .args(["provider", "--addr", "http://127.0.0.1:9", "--pois"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "{}: line 4: id: \"a\" is already the id of line 2",
            file.display()
        )),
        "{stderr}"
    );
}

/// Issue 43, item 11: an unknown category is answered with an error naming it and the categories
/// the provider knows (not an empty list).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_category_is_answered_with_an_error_naming_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_pois(dir.path(), &pois());
    let daemon = TestDaemon::start_default().await;
    let mut provider = ProviderProcess::start(&daemon.endpoint(), &file, &[], dir.path());
    let mut pair = Vec::new();
    for i in 0..2 {
        let client = MobileClient::connect(daemon.channel().await).await;
        let lat = 53.14 + f64::from(i) * 1e-4;
        client
            .send(request(
                &format!("u{i}"),
                lat,
                8.21,
                nearest("restaurnat", 1),
            ))
            .await;
        pair.push(client);
    }
    for mut client in pair {
        let reply = loop {
            match client.next_event(30).await.outcome {
                Some(Outcome::Cloaked(_)) => {}
                Some(Outcome::Reply(reply)) => break reply,
                other => panic!("{other:?}"),
            }
        };
        let list = PoiCandidates::decode(reply.payload.as_slice()).unwrap();
        assert!(list.pois.is_empty());
        assert!(!list.overloaded);
        assert_eq!(
            list.error,
            "category: unknown category \"restaurnat\"; this provider knows \"bank\", \"cafe\", \"fuel\""
        );
    }
    provider.assert_running();
    drop(provider);
    daemon.shutdown().await.unwrap();
}
