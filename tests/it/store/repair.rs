//! Issue 21's observations of damaged store files, reproduced against the real `cloakd` binary: a
//! flipped byte in the middle of the log, a cut tail, a lost, emptied or damaged release file, a
//! deleted log under kept release files. The daemon refuses to start naming the file, the offset
//! and the rule; `cloakd store check` lists the problem and exits non-zero; `cloakd store repair`
//! (after a dry run that changes nothing) keeps a backup and leaves a store on which nothing is
//! acknowledged into a released window and every earlier release comes back byte-identical. A lost
//! release file is re-anonymized from the log byte for byte, and a release damaged while the daemon
//! runs reaches the subscriber as DATA_LOSS, logged and counted.
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use cloakd::proto::ReleasedWindow;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::support::free_port;
use crate::support::transactions::{PATIENCE, next_windows, publish, subscribe, transaction};

const STREAM: &str = "s1";

struct Setup {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
    data: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let data = root.join("data");
    let config = root.join("cloakd.toml");
    std::fs::write(
        &config,
        format!(
            "[telemetry]\nmetrics_listen = '127.0.0.1:0'\n[transactions]\ndata_dir = '{}'\n[transactions.streams.{STREAM}]\nrho = 0.5\nm = 2\nwindow_records = 50\nwindow_ms = 600000\n",
            data.display()
        ),
    )
    .unwrap();
    Setup {
        _dir: dir,
        root,
        config,
        data,
    }
}

struct Daemon {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Daemon {
    fn spawn(s: &Setup) -> Daemon {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = s.root.join("cloakd.log");
        let child = crate::support::bin()
            .args(["serve", "--config"])
            .arg(&s.config)
            .args(["--listen", &addr])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Daemon { child, addr, log }
    }

    /// A channel to the daemon once it serves: an answered health check, not only an accepted
    /// connection (the listener is bound before the stores are opened, so a connection alone does
    /// not say the start-up checks are over).
    async fn channel(&mut self) -> Channel {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr)).unwrap();
        let started = std::time::Instant::now();
        loop {
            if let Ok(channel) = endpoint.connect().await {
                let mut health = HealthClient::new(channel.clone());
                if health.check(HealthCheckRequest::default()).await.is_ok() {
                    return channel;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("cloakd exited with {status}: {}", self.log_text());
            }
            assert!(started.elapsed() < PATIENCE, "cloakd did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM (a clean shutdown), then reap.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "cloakd exited with {status}: {}",
            self.log_text()
        );
    }

    /// SIGKILL (kill -9: no clean shutdown, no seal), then reap.
    fn kill_9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Waits for the daemon to exit by itself (a refusal to start); its status and log.
    fn refused(mut self) -> String {
        let started = std::time::Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(!status.success(), "cloakd exited cleanly");
                return self.log_text();
            }
            assert!(
                started.elapsed() < PATIENCE,
                "cloakd did not refuse to start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `cloakd store ARGS`; (success, stdout + stderr).
fn store(args: &[&str], dir: &Path) -> (bool, String) {
    let out = crate::support::bin()
        .arg("store")
        .args(args)
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Publishes `ids` (distinct items, one sensitive) and returns the acks' windows.
async fn publish_ids(channel: Channel, ids: impl Iterator<Item = u32>) -> Vec<(String, u64)> {
    let records: Vec<_> = ids
        .map(|i| {
            let item = format!("i{}", i % 5);
            transaction(STREAM, &format!("r{i}"), &[&item, "x"], &["x"])
        })
        .collect();
    let n = records.len();
    let outcome = publish(channel, records).await;
    assert!(outcome.status.is_none(), "{:?}", outcome.status);
    assert_eq!(outcome.acks.len(), n);
    outcome
        .acks
        .into_iter()
        .map(|a| {
            assert!(!a.duplicate);
            (a.record_id, a.window_id)
        })
        .collect()
}

/// Publishes r0..r229 (windows 0-3 closed and released, 4 open), reads the four releases, stops
/// cleanly. The releases' encoded bytes.
async fn publish_230(s: &Setup) -> Vec<Vec<u8>> {
    publish_230_then(s, Daemon::stop).await.0
}

/// [`publish_230`], ending the daemon with `end`; also the acknowledgements (record id, window).
async fn publish_230_then(s: &Setup, end: fn(Daemon)) -> (Vec<Vec<u8>>, Vec<(String, u64)>) {
    let mut daemon = Daemon::spawn(s);
    let channel = daemon.channel().await;
    let acks = publish_ids(channel.clone(), 0..230).await;
    assert_eq!(acks.last().unwrap().1, 4);
    let mut feed = subscribe(channel, STREAM, 0).await.unwrap();
    let windows = next_windows(&mut feed, 4).await;
    end(daemon);
    (
        windows.iter().map(prost::Message::encode_to_vec).collect(),
        acks,
    )
}

fn release_file(s: &Setup, window: u64) -> PathBuf {
    s.data
        .join("windows")
        .join(cloakd::store::stream_dir_name(STREAM))
        .join(format!("{window:020}.released"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_byte_mid_log_is_refused_and_repaired_explicitly() {
    let s = setup();
    let before = publish_230(&s).await;
    let log_path = s.data.join("transactions.log");
    let mut bytes = std::fs::read(&log_path).unwrap();
    bytes[3333] ^= 0x01;
    std::fs::write(&log_path, &bytes).unwrap();

    // The daemon refuses, naming the file, an offset and the rule; nothing is cut.
    let log = Daemon::spawn(&s).refused();
    assert!(log.contains("transactions.log is corrupt at byte"), "{log}");
    assert!(log.contains("checksum mismatch"), "{log}");
    assert!(!log.contains("torn tail"), "{log}");
    assert_eq!(std::fs::read(&log_path).unwrap(), bytes);

    let (ok, out) = store(&["check"], &s.data);
    assert!(!ok, "{out}");
    assert!(
        out.contains("PROBLEM") && out.contains("transactions.log at byte"),
        "{out}"
    );
    let (ok, out) = store(&["repair", "--dry-run"], &s.data);
    assert!(ok, "{out}");
    assert!(out.contains("would: cut"), "{out}");
    assert_eq!(
        std::fs::read(&log_path).unwrap(),
        bytes,
        "a dry run changes nothing"
    );

    let (ok, out) = store(&["repair"], &s.data);
    assert!(ok, "{out}");
    assert!(out.contains("close marker of window 2"), "{out}");
    assert!(out.contains("close marker of window 3"), "{out}");
    let backup = std::fs::read_dir(&s.data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("repair-backup-")
        })
        .expect("a backup directory");
    assert_eq!(
        std::fs::read(backup.join("transactions.log")).unwrap(),
        bytes
    );
    let (ok, out) = store(&["check"], &s.data);
    assert!(ok, "{out}");

    // Restarted: nothing is acknowledged into windows 0-3, which keep their exact bytes.
    let mut daemon = Daemon::spawn(&s);
    let channel = daemon.channel().await;
    for (id, window) in publish_ids(channel.clone(), 1000..1060).await {
        assert!(
            window >= 4,
            "{id} acknowledged into released window {window}"
        );
    }
    let mut feed = subscribe(channel, STREAM, 0).await.unwrap();
    let after = next_windows(&mut feed, 4).await;
    for (window, bytes) in after.iter().zip(&before) {
        assert_eq!(&prost::Message::encode_to_vec(window), bytes);
    }
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_tail_after_a_clean_stop_is_acknowledged_data_lost() {
    let s = setup();
    publish_230(&s).await;
    let log_path = s.data.join("transactions.log");
    let bytes = std::fs::read(&log_path).unwrap();
    std::fs::write(&log_path, &bytes[..bytes.len() - 3]).unwrap();
    let log = Daemon::spawn(&s).refused();
    assert!(log.contains("acknowledged data is lost"), "{log}");
    assert!(!log.contains("torn tail of the transaction log"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_release_is_rebuilt_byte_for_byte() {
    let s = setup();
    let before = publish_230(&s).await;
    let file = release_file(&s, 1);
    let stored = std::fs::read(&file).unwrap();
    std::fs::remove_file(&file).unwrap();
    let (ok, out) = store(&["check"], &s.data);
    assert!(ok, "{out}");
    assert!(out.contains("re-anonymized"), "{out}");
    let mut daemon = Daemon::spawn(&s);
    let channel = daemon.channel().await;
    let mut feed = subscribe(channel, STREAM, 0).await.unwrap();
    let after: Vec<ReleasedWindow> = next_windows(&mut feed, 4).await;
    for (window, bytes) in after.iter().zip(&before) {
        assert_eq!(&prost::Message::encode_to_vec(window), bytes);
    }
    assert_eq!(std::fs::read(&file).unwrap(), stored, "the same file bytes");
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emptied_release_is_refused_at_start_and_data_loss_while_running() {
    let s = setup();
    publish_230(&s).await;
    let file = release_file(&s, 1);
    let stored = std::fs::read(&file).unwrap();
    std::fs::write(&file, b"").unwrap();
    let log = Daemon::spawn(&s).refused();
    assert!(
        log.contains("00000000000000000001.released is corrupt at byte 0"),
        "{log}"
    );
    std::fs::write(&file, &stored).unwrap();

    // Damaged while the daemon runs: DATA_LOSS, logged without records, counted.
    let mut daemon = Daemon::spawn(&s);
    let channel = daemon.channel().await;
    std::fs::write(&file, b"").unwrap();
    let mut feed = subscribe(channel, STREAM, 0).await.unwrap();
    let first = next_windows(&mut feed, 1).await;
    assert_eq!(first[0].window_id, 0);
    let status = match tokio::time::timeout(PATIENCE, tokio_stream::StreamExt::next(&mut feed))
        .await
        .unwrap()
    {
        Some(Err(status)) => status,
        other => panic!("window 1 served: {other:?}"),
    };
    assert_eq!(status.code(), tonic::Code::DataLoss, "{status}");
    let log = daemon.log_text();
    assert!(log.contains("DATA_LOSS"), "{log}");
    assert!(!log.contains("r100"), "no record id in the log: {log}");
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_log_under_kept_releases_is_refused() {
    let s = setup();
    publish_230(&s).await;
    std::fs::remove_file(s.data.join("transactions.log")).unwrap();
    std::fs::remove_file(s.data.join("transactions.log.sealed")).unwrap();
    let log = Daemon::spawn(&s).refused();
    assert!(log.contains("230 acknowledged records lost"), "{log}");
    let (ok, out) = store(&["check"], &s.data);
    assert!(!ok, "{out}");
    assert!(out.contains("has no close marker"), "{out}");
}

/// Subscribes from window 0 and reads windows 0-3: the first `served` come, then window `served`
/// is refused as DATA_LOSS (a misplaced file is never served).
async fn served_until_data_loss(channel: Channel, served: usize) {
    let mut feed = subscribe(channel, STREAM, 0).await.unwrap();
    let first = next_windows(&mut feed, served).await;
    assert_eq!(first.len(), served);
    match tokio::time::timeout(PATIENCE, tokio_stream::StreamExt::next(&mut feed))
        .await
        .unwrap()
    {
        Some(Err(status)) => assert_eq!(status.code(), tonic::Code::DataLoss, "{status}"),
        other => panic!("window {served} served: {other:?}"),
    }
}

/// Repairs `s` (expecting the misplaced `files` moved aside, a backup kept), restarts, and reads
/// windows 0-3: each is `before`'s exact bytes, so every acknowledged record of them is released
/// exactly once.
async fn repair_and_release_once(s: &Setup, files: &[PathBuf], before: &[Vec<u8>]) {
    let (ok, out) = store(&["repair"], &s.data);
    assert!(ok, "{out}");
    for file in files {
        assert!(out.contains(&format!("moved {}", file.display())), "{out}");
    }
    let (ok, out) = store(&["check"], &s.data);
    assert!(ok, "{out}");
    let mut daemon = Daemon::spawn(s);
    let channel = daemon.channel().await;
    let mut feed = subscribe(channel, STREAM, 0).await.unwrap();
    let after = next_windows(&mut feed, 4).await;
    let mut released = 0;
    for (window, bytes) in after.iter().zip(before) {
        assert_eq!(&prost::Message::encode_to_vec(window), bytes);
        released += window.records.len();
    }
    assert_eq!(released, 200, "windows 0-3 hold r0..r199 once each");
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_copied_over_another_window_is_refused_everywhere_and_rebuilt() {
    let s = setup();
    let before = publish_230(&s).await;
    let (one, three) = (release_file(&s, 1), release_file(&s, 3));
    let stored = std::fs::read(&three).unwrap();
    std::fs::copy(&one, &three).unwrap();

    let (ok, out) = store(&["check"], &s.data);
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!("PROBLEM {} at byte", three.display()))
            && out.contains("misplaced window file: filed as the release of window 3 of stream \"s1\", it is the release of window 1"),
        "{out}"
    );
    assert!(!out.contains(" 0 problems"), "{out}");
    let log = Daemon::spawn(&s).refused();
    assert!(
        log.contains("00000000000000000003.released is corrupt at byte"),
        "{log}"
    );
    assert!(log.contains("misplaced window file"), "{log}");

    // Misplaced while the daemon runs: windows 0-2 are served, window 3 is DATA_LOSS.
    std::fs::write(&three, &stored).unwrap();
    let mut daemon = Daemon::spawn(&s);
    let channel = daemon.channel().await;
    std::fs::copy(&one, &three).unwrap();
    served_until_data_loss(channel, 3).await;
    daemon.stop();

    repair_and_release_once(&s, std::slice::from_ref(&three), &before).await;
    assert_eq!(
        std::fs::read(&three).unwrap(),
        stored,
        "rebuilt byte for byte"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_swapped_releases_are_refused_everywhere_and_rebuilt() {
    let s = setup();
    let before = publish_230(&s).await;
    let (zero, two) = (release_file(&s, 0), release_file(&s, 2));
    let (a, b) = (std::fs::read(&zero).unwrap(), std::fs::read(&two).unwrap());
    std::fs::write(&zero, &b).unwrap();
    std::fs::write(&two, &a).unwrap();

    let (ok, out) = store(&["check"], &s.data);
    assert!(!ok, "{out}");
    for file in [&zero, &two] {
        assert!(
            out.contains(&format!("PROBLEM {} at byte", file.display())),
            "{out}"
        );
    }
    assert!(out.contains("2 problems"), "{out}");
    let log = Daemon::spawn(&s).refused();
    assert!(log.contains("misplaced window file"), "{log}");

    // Swapped while the daemon runs: a consumer resuming at window 0 gets DATA_LOSS at once.
    std::fs::write(&zero, &a).unwrap();
    std::fs::write(&two, &b).unwrap();
    let mut daemon = Daemon::spawn(&s);
    let channel = daemon.channel().await;
    std::fs::write(&zero, &b).unwrap();
    std::fs::write(&two, &a).unwrap();
    served_until_data_loss(channel, 0).await;
    daemon.stop();

    repair_and_release_once(&s, &[zero.clone(), two.clone()], &before).await;
    assert_eq!(std::fs::read(&zero).unwrap(), a, "rebuilt byte for byte");
    assert_eq!(std::fs::read(&two).unwrap(), b, "rebuilt byte for byte");
}

/// The acknowledged records of `acks` whose log frame does not lie whole in the first `cut` bytes
/// of `log`, counted per window: what a cut at `cut` loses.
fn lost_by_cut(
    log: &[u8],
    cut: usize,
    acks: &[(String, u64)],
) -> std::collections::BTreeMap<u64, u64> {
    let mut lost = std::collections::BTreeMap::new();
    let mut pos = 0usize;
    while pos < log.len() {
        let len = u32::from_le_bytes(log[pos..pos + 4].try_into().unwrap()) as usize;
        let end = pos + 8 + len;
        if end > cut
            && let Ok(cloakd::store::LogEntry::Record(r)) =
                cloakd::store::LogEntry::decode(&log[pos + 8..end])
        {
            let window = acks.iter().find(|(id, _)| *id == r.record_id).unwrap().1;
            *lost.entry(window).or_default() += 1;
        }
        pos = end;
    }
    lost
}

fn named(lost: &std::collections::BTreeMap<u64, u64>) -> String {
    let total: u64 = lost.values().sum();
    let windows: Vec<String> = lost
        .iter()
        .map(|(w, n)| format!("{n} of window {w} of stream \"{STREAM}\""))
        .collect();
    format!("{total} acknowledged records lost ({})", windows.join(", "))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_cut_at_80_percent_after_kill_9_names_the_lost_acknowledged_records() {
    let s = setup();
    let (before, acks) = publish_230_then(&s, Daemon::kill_9).await;
    let log_path = s.data.join("transactions.log");
    let bytes = std::fs::read(&log_path).unwrap();
    let cut = bytes.len() * 8 / 10;
    std::fs::write(&log_path, &bytes[..cut]).unwrap();
    let lost = lost_by_cut(&bytes, cut, &acks);
    assert!(
        lost.contains_key(&4) && lost.values().sum::<u64>() > 30,
        "{lost:?}"
    );

    let (ok, out) = store(&["check"], &s.data);
    assert!(!ok, "{out}");
    assert!(out.contains(&named(&lost)), "{out}");
    assert!(
        !out.contains("nothing in it was acknowledged") && !out.contains(" 0 problems"),
        "{out}"
    );
    let log = Daemon::spawn(&s).refused();
    assert!(log.contains(&named(&lost)), "{log}");
    assert!(!log.contains("cut the torn tail"), "{log}");

    let (ok, out) = store(&["repair"], &s.data);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("LOST for good: {}", named(&lost))),
        "{out}"
    );
    let (ok, out) = store(&["check"], &s.data);
    assert!(ok, "{out}");
    // The released windows keep their bytes; nothing is acknowledged into them again.
    let mut daemon = Daemon::spawn(&s);
    let channel = daemon.channel().await;
    let mut feed = subscribe(channel, STREAM, 0).await.unwrap();
    let after = next_windows(&mut feed, 4).await;
    for (window, bytes) in after.iter().zip(&before) {
        assert_eq!(&prost::Message::encode_to_vec(window), bytes);
    }
    daemon.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sealed_log_cut_in_half_names_the_lost_acknowledged_records() {
    let s = setup();
    let (_, acks) = publish_230_then(&s, Daemon::stop).await;
    let log_path = s.data.join("transactions.log");
    let bytes = std::fs::read(&log_path).unwrap();
    let cut = bytes.len() / 2;
    std::fs::write(&log_path, &bytes[..cut]).unwrap();
    let lost = lost_by_cut(&bytes, cut, &acks);

    let (ok, out) = store(&["check"], &s.data);
    assert!(!ok, "{out}");
    assert!(out.contains(&named(&lost)), "{out}");
    let log = Daemon::spawn(&s).refused();
    assert!(log.contains(&named(&lost)), "{log}");
    let (ok, out) = store(&["repair"], &s.data);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("LOST for good: {}", named(&lost))),
        "{out}"
    );
}
