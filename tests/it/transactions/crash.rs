//! Crash safety of transaction streams: the real `cloakd` binary is killed with SIGKILL at random
//! moments while a producer publishes and a consumer subscribes, then restarted on the same data
//! directory, several rounds. At the end every record is re-published (acked ids must keep their
//! window), and the test checks that each window holds exactly the records acknowledged into it
//! (every acknowledged record released exactly once), that every window seen before a crash is
//! byte-identical when fetched again, and that every window is rho-uncertain (independent checker).
//!
//! The kill moments come from a seeded RNG; set `TRANSACTIONS_CRASH_SEED` to try others. The rounds
//! take the store configuration as an argument, so each store implementation runs them.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloakd::proto::release_feed_client::ReleaseFeedClient;
use cloakd::proto::transaction_ingest_client::TransactionIngestClient;
use cloakd::proto::{PublishAck, ReleaseSubscription, ReleasedWindow, Transaction};
use rand::{Rng, SeedableRng};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

use crate::support::free_port;
use crate::support::transactions::{PATIENCE, check_window, next_windows, random_records};

const STREAM: &str = "crash";
const RHO: f64 = 0.5;
const M: usize = 2;
const ROUNDS: usize = 8;
const RECORDS_PER_ROUND: usize = 1500;

/// The configuration of the embedded file stores in `dir`.
fn file_stores(dir: &Path) -> String {
    format!(
        "[transactions]\ndata_dir = '{}'\n",
        dir.join("data").display()
    )
}

/// Writes a configuration: the store section `stores` plus the crash stream's settings.
fn write_config(dir: &Path, stores: &str) -> std::path::PathBuf {
    let path = dir.join("cloakd.toml");
    let text = format!(
        "{stores}\n[transactions.streams.{STREAM}]\nrho = {RHO}\nm = {M}\nwindow_records = 7\nwindow_ms = 300\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

struct Daemon {
    child: Child,
    addr: String,
    log: std::path::PathBuf,
}

impl Daemon {
    fn spawn(config: &Path, log: &Path) -> Daemon {
        let addr = format!("127.0.0.1:{}", free_port());
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = crate::support::bin()
            .args(["serve", "--config"])
            .arg(config)
            .args(["--listen", &addr])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("cloakd binary starts");
        Daemon {
            child,
            addr,
            log: log.to_path_buf(),
        }
    }

    async fn channel(&mut self) -> Channel {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr)).unwrap();
        let started = std::time::Instant::now();
        loop {
            if let Ok(channel) = endpoint.connect().await {
                return channel;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!("cloakd exited with {status} before serving; its log:\n{log}");
            }
            assert!(started.elapsed() < PATIENCE, "cloakd did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGKILL (std's `Child::kill` on Unix), then reap.
    fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Publishes `records` on one stream, pushing each ack into `acks` as it arrives, until the stream
/// ends or breaks (the daemon was killed).
async fn publish_into(
    channel: Channel,
    records: Vec<Transaction>,
    acks: Arc<Mutex<Vec<PublishAck>>>,
) {
    let mut client = TransactionIngestClient::new(channel);
    let Ok(response) = client.publish(tokio_stream::iter(records)).await else {
        return;
    };
    let mut inbound = response.into_inner();
    while let Some(Ok(ack)) = inbound.next().await {
        acks.lock().unwrap().push(ack);
    }
}

/// Collects released windows (as encoded bytes) until the subscription breaks.
async fn collect_windows(channel: Channel, seen: Arc<Mutex<BTreeMap<u64, Vec<u8>>>>) {
    let mut client = ReleaseFeedClient::new(channel);
    let Ok(response) = client
        .subscribe(ReleaseSubscription {
            stream: STREAM.into(),
            from_window: 0,
        })
        .await
    else {
        return;
    };
    let mut inbound = response.into_inner();
    while let Some(Ok(window)) = inbound.next().await {
        seen.lock()
            .unwrap()
            .insert(window.window_id, prost::Message::encode_to_vec(&window));
    }
}

/// Records an ack, checking that an id keeps its window across rounds.
fn record_acks(acked: &mut BTreeMap<String, u64>, acks: &[PublishAck]) {
    for ack in acks {
        match acked.insert(ack.record_id.clone(), ack.window_id) {
            Some(before) if before != ack.window_id => panic!(
                "record {} acked in window {before}, later in window {}",
                ack.record_id, ack.window_id
            ),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_loses_and_repeats_nothing() {
    kill_9_rounds(file_stores).await;
}

/// The crash rounds against the stores configured by `stores` (a configuration fragment for a
/// directory), so every store implementation runs the same test.
async fn kill_9_rounds(stores: fn(&Path) -> String) {
    let seed: u64 = std::env::var("TRANSACTIONS_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_125);
    eprintln!("TRANSACTIONS_CRASH_SEED={seed}");
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &stores(dir.path()));
    let log = dir.path().join("cloakd.log");

    let mut published: BTreeMap<String, Transaction> = BTreeMap::new();
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen_windows: BTreeMap<u64, Vec<u8>> = BTreeMap::new();

    for round in 0..ROUNDS {
        let mut daemon = Daemon::spawn(&config, &log);
        let channel = daemon.channel().await;
        // Windows released before any earlier crash must come back byte-identical.
        if !seen_windows.is_empty() {
            let mut client = ReleaseFeedClient::new(channel.clone());
            let mut feed = client
                .subscribe(ReleaseSubscription {
                    stream: STREAM.into(),
                    from_window: 0,
                })
                .await
                .unwrap()
                .into_inner();
            let again = next_windows(&mut feed, seen_windows.len()).await;
            for window in again {
                assert_eq!(
                    Some(&prost::Message::encode_to_vec(&window)),
                    seen_windows.get(&window.window_id),
                    "round {round}: window {} changed across a crash",
                    window.window_id
                );
            }
        }
        // New records, plus a re-publish of some earlier ones (acked or not).
        let mut records = random_records(
            STREAM,
            &format!("r{round}-"),
            RECORDS_PER_ROUND,
            seed + round as u64,
        );
        let earlier: Vec<Transaction> = published.values().cloned().collect();
        for t in &earlier {
            if !rng.random_bool(0.2) {
                continue;
            }
            let at = rng.random_range(0..=records.len());
            records.insert(at, t.clone());
        }
        for t in &records {
            published
                .entry(t.record_id.clone())
                .or_insert_with(|| t.clone());
        }
        let acks = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let producer = tokio::spawn(publish_into(channel.clone(), records, acks.clone()));
        let consumer = tokio::spawn(collect_windows(channel.clone(), seen.clone()));
        // Half the kills land while records are being published and acked, the others while the
        // closed windows are anonymized and released.
        let wait_ms = if rng.random_bool(0.5) {
            rng.random_range(0..40)
        } else {
            rng.random_range(0..300)
        };
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        daemon.kill9();
        let _ = tokio::time::timeout(PATIENCE, producer).await;
        let _ = tokio::time::timeout(PATIENCE, consumer).await;
        let acks = acks.lock().unwrap().clone();
        eprintln!(
            "round {round}: killed after {wait_ms} ms, {} acks, {} windows seen",
            acks.len(),
            seen.lock().unwrap().len()
        );
        record_acks(&mut acked, &acks);
        for (id, bytes) in seen.lock().unwrap().iter() {
            if let Some(before) = seen_windows.get(id) {
                assert_eq!(before, bytes, "window {id} released differently");
            }
            seen_windows.insert(*id, bytes.clone());
        }
    }

    // Final run: re-publish everything ever sent; each id is acked (new or duplicate) with one window.
    let mut daemon = Daemon::spawn(&config, &log);
    let channel = daemon.channel().await;
    let acks = Arc::new(Mutex::new(Vec::new()));
    let all: Vec<Transaction> = published.values().cloned().collect();
    publish_into(channel.clone(), all, acks.clone()).await;
    let acks = acks.lock().unwrap().clone();
    assert_eq!(
        acks.len(),
        published.len(),
        "every record acked in the final run"
    );
    record_acks(&mut acked, &acks);
    assert_eq!(acked.len(), published.len());

    let last_window = acked.values().copied().max().unwrap();
    let mut client = ReleaseFeedClient::new(channel.clone());
    let mut feed = client
        .subscribe(ReleaseSubscription {
            stream: STREAM.into(),
            from_window: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let windows: Vec<ReleasedWindow> = next_windows(&mut feed, last_window as usize + 1).await;
    let mut by_window: BTreeMap<u64, Vec<Transaction>> = BTreeMap::new();
    for (id, window) in &acked {
        by_window
            .entry(*window)
            .or_default()
            .push(published[id].clone());
    }
    let ids: BTreeSet<u64> = windows.iter().map(|w| w.window_id).collect();
    assert_eq!(ids, (0..=last_window).collect::<BTreeSet<_>>());
    for window in &windows {
        let originals = by_window
            .get(&window.window_id)
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            window.records.len(),
            originals.len(),
            "window {} must hold exactly the records acked into it",
            window.window_id
        );
        check_window(&originals, window, RHO, M)
            .unwrap_or_else(|e| panic!("window {}: {e}", window.window_id));
        if let Some(before) = seen_windows.get(&window.window_id) {
            assert_eq!(
                before,
                &prost::Message::encode_to_vec(window),
                "window {} changed across a crash",
                window.window_id
            );
        }
    }
    daemon.kill9();
}
