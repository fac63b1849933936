//! Transaction streams on two replicas of the real `cloakd` binary sharing a 3-node NATS JetStream
//! cluster (replication 3): producers publish one stream through both replicas, one replica is
//! killed with SIGKILL mid-stream and restarted, and the producers reconnect and publish again
//! what was not acknowledged. Checked: every acknowledged record is released exactly once, in the
//! window its acknowledgement named; windows are released without gaps; the releases read through
//! either replica are identical; a record published again through either replica is a duplicate in
//! its window.
mod common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloakd::proto::Transaction;
use cloakd::proto::transaction_ingest_client::TransactionIngestClient;
use common::nats::NatsCluster;
use common::process::DaemonProcess;

const STREAM: &str = "orders";
const PRODUCERS: usize = 2;
const RECORDS_PER_PRODUCER: usize = 600;
const CHUNK: usize = 20;
/// Upper bound on a failover or a release (liveness, not timing).
const PATIENCE: Duration = Duration::from_secs(90);

fn replica_config(nats: &NatsCluster, node: &str) -> String {
    let url: Vec<String> = (0..3).map(|i| nats.node_url(i)).collect();
    format!(
        r#"
[cluster]
nats_url = "{}"
node_id = "{node}"
replicas = 3
lease_ms = 1500

[transactions.streams.{STREAM}]
window_records = 25
window_ms = 1000
rho = 0.5
m = 2
"#,
        url.join(",")
    )
}

/// The replicas' current addresses; a restarted replica gets a new one.
type Endpoints = Arc<Mutex<Vec<String>>>;

fn record(producer: usize, i: usize) -> Transaction {
    Transaction {
        stream: STREAM.into(),
        record_id: format!("p{producer}-{i}"),
        // A unique item per record (no sensitive items, so nothing is suppressed) and shared ones.
        items: vec![
            format!("id-p{producer}-{i}"),
            format!("shelf-{}", i % 7),
            format!("brand-{}", i % 3),
        ],
        sensitive_items: vec![],
    }
}

/// Publishes `chunk` through the replica `endpoint`; the acknowledgements, or why it failed.
async fn publish_chunk(
    endpoint: &str,
    chunk: &[Transaction],
) -> Result<Vec<cloakd::proto::PublishAck>, String> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .unwrap()
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut client = TransactionIngestClient::new(channel);
    let mut acks = client
        .publish(futures::stream::iter(chunk.to_vec()))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    let mut got = Vec::new();
    while got.len() < chunk.len() {
        match tokio::time::timeout(Duration::from_secs(15), acks.message()).await {
            Ok(Ok(Some(ack))) => got.push(ack),
            Ok(Ok(None)) => return Err("the ack stream ended early".into()),
            Ok(Err(status)) => return Err(status.to_string()),
            Err(_) => return Err("no ack within 15 s".into()),
        }
    }
    Ok(got)
}

/// One producer: its records in chunks, each through replica `first` if it answers, else the other;
/// a chunk that fails is published again whole (record ids make that safe). Record id -> window.
async fn produce(
    producer: usize,
    endpoints: Endpoints,
    acked: Arc<Mutex<usize>>,
) -> HashMap<String, u64> {
    let mut windows = HashMap::new();
    let records: Vec<Transaction> = (0..RECORDS_PER_PRODUCER)
        .map(|i| record(producer, i))
        .collect();
    let mut failures = 0;
    for chunk in records.chunks(CHUNK) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut attempt = 0;
        loop {
            let endpoint = {
                let endpoints = endpoints.lock().unwrap();
                endpoints[(producer + attempt) % endpoints.len()].clone()
            };
            match publish_chunk(&endpoint, chunk).await {
                Ok(acks) => {
                    for (t, ack) in chunk.iter().zip(acks) {
                        assert_eq!(ack.record_id, t.record_id, "acks come in order");
                        if let Some(before) = windows.insert(t.record_id.clone(), ack.window_id) {
                            assert_eq!(
                                before, ack.window_id,
                                "{} acknowledged in two windows",
                                t.record_id
                            );
                        }
                    }
                    *acked.lock().unwrap() += chunk.len();
                    break;
                }
                Err(e) => {
                    failures += 1;
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "producer {producer}: no replica took a chunk within {PATIENCE:?}: {e}"
                    );
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
    eprintln!("producer {producer}: {failures} failed attempts");
    windows
}

/// Reads released windows of the stream through `endpoint` from window 0 until they hold `records`
/// records in all.
async fn releases_through(endpoint: &str, records: usize) -> Vec<cloakd::proto::ReleasedWindow> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_string())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut feed = cloakd::proto::release_feed_client::ReleaseFeedClient::new(channel);
    let mut stream = feed
        .subscribe(cloakd::proto::ReleaseSubscription {
            stream: STREAM.into(),
            from_window: 0,
        })
        .await
        .expect("Subscribe")
        .into_inner();
    let mut windows = Vec::new();
    let mut seen = 0;
    while seen < records {
        let window = tokio::time::timeout(PATIENCE * 2, stream.message())
            .await
            .unwrap_or_else(|_| panic!("{seen} of {records} records released after {PATIENCE:?}"))
            .expect("release feed failed")
            .expect("release feed ended");
        seen += window.records.len();
        windows.push(window);
    }
    windows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_mid_stream_loses_and_repeats_nothing() {
    let nats = NatsCluster::three().await;
    let names = ["a", "b"];
    let mut replicas: Vec<DaemonProcess> = names
        .iter()
        .map(|n| DaemonProcess::start(&replica_config(&nats, n)))
        .collect();
    let endpoints: Endpoints = Arc::new(Mutex::new(
        replicas
            .iter()
            .map(|r| format!("http://{}", r.addr))
            .collect(),
    ));
    let acked = Arc::new(Mutex::new(0usize));
    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| tokio::spawn(produce(p, endpoints.clone(), acked.clone())))
        .collect();

    // Mid-stream: SIGKILL the replica that seals the stream, and start it again a little later.
    let total = PRODUCERS * RECORDS_PER_PRODUCER;
    while *acked.lock().unwrap() < total / 3 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took_lease = |r: &DaemonProcess| {
        r.logs()
            .iter()
            .filter(|l| l["message"] == "lease taken")
            .count()
    };
    let holder = (0..2)
        .find(|&i| took_lease(&replicas[i]) > 0)
        .expect("a replica seals the stream");
    let survivor = 1 - holder;
    let taken_before = took_lease(&replicas[survivor]);
    replicas[holder].signal("KILL");
    let killed_at = *acked.lock().unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    replicas[holder] = DaemonProcess::start(&replica_config(&nats, names[holder]));
    endpoints.lock().unwrap()[holder] = format!("http://{}", replicas[holder].addr);

    let mut acknowledged: HashMap<String, u64> = HashMap::new();
    for p in producers {
        acknowledged.extend(p.await.unwrap());
    }
    assert_eq!(acknowledged.len(), total);
    assert!(
        killed_at < total,
        "the kill came after every record was acknowledged"
    );
    assert!(
        took_lease(&replicas[survivor]) > taken_before,
        "the surviving replica took the stream over"
    );

    let through_a = releases_through(&format!("http://{}", replicas[0].addr), total).await;
    let through_b = releases_through(&format!("http://{}", replicas[1].addr), total).await;
    assert_eq!(
        through_a, through_b,
        "the two replicas release different windows"
    );

    // Exactly once, in the window the acknowledgement named.
    let mut expected: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (id, window) in &acknowledged {
        expected
            .entry(*window)
            .or_default()
            .push(format!("id-{id}"));
    }
    let mut released: HashMap<String, u64> = HashMap::new();
    for (i, window) in through_a.iter().enumerate() {
        assert_eq!(window.window_id, i as u64, "windows released without gaps");
        let report = window.report.as_ref().expect("a utility report");
        assert_eq!(report.records as usize, window.records.len());
        for r in &window.records {
            let ids: Vec<&String> = r.items.iter().filter(|i| i.starts_with("id-")).collect();
            assert_eq!(ids.len(), 1, "one unique item per released record: {r:?}");
            if let Some(other) = released.insert(ids[0].clone(), window.window_id) {
                panic!(
                    "{} released twice, in windows {other} and {}",
                    ids[0], window.window_id
                );
            }
        }
    }
    assert_eq!(released.len(), total, "every acknowledged record released");
    for (window, ids) in expected {
        for id in ids {
            assert_eq!(
                released.get(&id),
                Some(&window),
                "{id} acknowledged in window {window}"
            );
        }
    }
    // Published again through either replica, long after the de-duplication window of a single
    // message would matter: every record is a duplicate, in the window it was stored in.
    let again: Vec<Transaction> = (0..CHUNK).map(|i| record(0, i * 7)).collect();
    for r in &replicas {
        let acks = publish_chunk(&format!("http://{}", r.addr), &again)
            .await
            .expect("published again");
        for (t, ack) in again.iter().zip(acks) {
            assert!(ack.duplicate, "{} stored twice", t.record_id);
            assert_eq!(Some(&ack.window_id), acknowledged.get(&t.record_id));
        }
    }

    // Exactly one replica holds the stream now, and the survivor, which did not hold it before the
    // kill, forwarded its producer's records to the replica that did.
    let held: f64 = replicas
        .iter()
        .map(|r| {
            r.scrape()
                .sum("cloakd_cluster_leases_held", &[("kind", "stream")])
        })
        .sum();
    assert_eq!(held, 1.0);
    let forwarded = replicas[survivor].scrape().sum(
        "cloakd_transaction_records_forwarded_total",
        &[("result", "stored")],
    );
    assert!(forwarded > 0.0, "the survivor forwarded nothing");
    for r in replicas {
        r.stop();
    }
}

/// A stream published only through replica a, which is killed right after the acknowledgements: b,
/// which never saw a record of it, learns of it from the lease bucket, takes it over after the
/// lease, closes its open window by time and releases every record.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_only_the_dead_replica_saw_is_taken_over() {
    let nats = NatsCluster::three().await;
    let a = DaemonProcess::start(&replica_config(&nats, "a"));
    let b = DaemonProcess::start(&replica_config(&nats, "b"));
    // 60 records: two windows closed by count, the third (10 records) open when a dies.
    let records: Vec<Transaction> = (0..60).map(|i| record(7, i)).collect();
    let acks = publish_chunk(&format!("http://{}", a.addr), &records)
        .await
        .expect("replica a takes the records");
    assert!(acks.iter().all(|ack| !ack.duplicate));
    assert!(
        b.logs().iter().all(|l| l["message"] != "lease taken"),
        "b took the stream before a died"
    );
    a.signal("KILL");
    drop(a);
    let windows = match tokio::time::timeout(
        PATIENCE,
        releases_through(&format!("http://{}", b.addr), records.len()),
    )
    .await
    {
        Ok(windows) => windows,
        Err(_) => panic!("b released too little; its logs: {:#?}", b.logs()),
    };
    let released: usize = windows.iter().map(|w| w.records.len()).sum();
    assert_eq!(released, records.len());
    assert_eq!(
        windows.iter().map(|w| w.window_id).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    b.stop();
}

/// `cloakd publish-load` (the benchmark's load generator) through both replicas: every record is
/// acknowledged once, and the CPU time of the processes given is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_load_goes_through_both_replicas() {
    let nats = NatsCluster::single().await;
    let url = nats.url();
    let config = |node: &str| format!("[cluster]\nnats_url = \"{url}\"\nnode_id = \"{node}\"\n");
    let a = DaemonProcess::start(&config("a"));
    let b = DaemonProcess::start(&config("b"));
    let addrs = format!("http://{},http://{}", a.addr, b.addr);
    let pid = std::process::id().to_string();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_cloakd"))
            .args(["publish-load", "--addr", &addrs, "--records", "3000"])
            .args([
                "--producers",
                "4",
                "--streams",
                "3",
                "--json",
                "--pid",
                &pid,
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}\nlogs of a: {:#?}\nlogs of b: {:#?}",
        String::from_utf8_lossy(&output.stderr),
        a.logs(),
        b.logs()
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["records_acknowledged"], 3000);
    // Duplicates only from records sent again after a refusal (a lease moving).
    assert!(
        report["duplicates"] == 0 || report["streams_reopened"].as_u64().unwrap() > 0,
        "{report}"
    );
    assert!(report["processes"][0]["cpu_seconds"].as_f64().unwrap() >= 0.0);
    a.stop();
    b.stop();
}
