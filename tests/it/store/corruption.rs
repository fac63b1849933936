//! The corruption fuzzer of the embedded store (invariants in `src/store/transaction_log.rs`,
//! `released_windows.rs` and `check.rs`): a small data directory is written through the store
//! layer, then every byte of its log and of one release file is flipped (XOR 0x01), and the files
//! are cut at every length, one at a time. Each outcome must be either a refusal naming the damaged
//! file and the place (the frame holding the byte), or a recovery in which an independent checker
//! (written here, not in the store) finds every acknowledged record exactly once, in the window it
//! was acknowledged into, with each release holding as many records as were acknowledged into its
//! window. The daemon runs the same check before it opens the store (`tests/store_repair.rs` runs a
//! few positions end to end).
use std::collections::BTreeMap;
use std::path::Path;

use cloakd::proto::{ReleasedRecord, ReleasedWindow, UtilityReport};
use cloakd::store::ack_journal::{ACKS_FILE, Journal};
use cloakd::store::check::{Fix, check_data_dir};
use cloakd::store::transaction_log::{LOG_FILE, SEAL_FILE};
use cloakd::store::{
    FileRecordLog, LogEntry, LogPosition, RecordLog, ReleasedWindows, StoreError, StoredRecord,
    WindowClose, WindowOutcome,
};
use cloakd::transactions::{Mode, Params};

const STREAM: &str = "s";
const WINDOW: u64 = 3;

fn params() -> Params {
    Params {
        rho: 0.5,
        m: 2,
        mode: Mode::Exact,
    }
}

/// What the producer was told: (record id) -> window.
type Acked = BTreeMap<String, u64>;

/// Writes the store: windows 0..3 of 3 records closed (0 and 1 released, 2 not yet), 2 records open,
/// in batches as the writer does; every append that returned Ok is acknowledged. Then the log is
/// dropped (a clean shutdown: sealed).
async fn write_store(dir: &Path) -> Acked {
    let (log, _) = FileRecordLog::open(dir).unwrap();
    let releases = ReleasedWindows::open(dir).unwrap();
    let mut acked = Acked::new();
    let mut n = 0;
    for window in 0..4u64 {
        let count = if window == 3 { 2 } else { WINDOW };
        let mut batch = Vec::new();
        for _ in 0..count {
            batch.push(LogEntry::Record(StoredRecord {
                stream: STREAM.into(),
                window_id: window,
                record_id: format!("r{n}"),
                items: vec![format!("i{}", n % 3), "x".into()],
                sensitive_items: vec!["x".into()],
            }));
            n += 1;
        }
        if window < 3 {
            batch.push(LogEntry::Close(WindowClose {
                stream: STREAM.into(),
                window_id: window,
                records: WINDOW,
                params: params(),
            }));
        }
        log.append(batch.clone()).await.unwrap();
        for entry in batch {
            if let LogEntry::Record(r) = entry {
                acked.insert(r.record_id, r.window_id);
            }
        }
        if window < 2 {
            let released = ReleasedWindow {
                stream: STREAM.into(),
                window_id: window,
                records: (0..WINDOW)
                    .map(|_| ReleasedRecord {
                        items: vec!["x".into()],
                    })
                    .collect(),
                report: Some(UtilityReport {
                    records: WINDOW,
                    rho: 0.5,
                    m: 2,
                    mode: "exact".into(),
                    ..UtilityReport::default()
                }),
            };
            releases
                .write_blocking(
                    STREAM,
                    window,
                    &WindowOutcome::Released(prost::Message::encode_to_vec(&released)),
                )
                .unwrap();
        }
    }
    drop(log);
    assert!(dir.join(SEAL_FILE).exists());
    acked
}

/// The independent checker: after a recovery, every acknowledged record is in the log exactly once
/// in its window, and every release file holds as many records as were acknowledged into its
/// window.
async fn check_recovered(dir: &Path, acked: &Acked) -> Result<(), String> {
    let (log, _) = FileRecordLog::open(dir).map_err(|e| e.to_string())?;
    let replayed = log
        .replay(LogPosition::START)
        .await
        .map_err(|e| e.to_string())?;
    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for entry in &replayed.entries {
        if let LogEntry::Record(r) = entry {
            seen.entry(r.record_id.clone())
                .or_default()
                .push(r.window_id);
        }
    }
    for (id, window) in acked {
        match seen.get(id).map(Vec::as_slice) {
            Some([w]) if w == window => {}
            other => return Err(format!("acknowledged {id} (window {window}) is {other:?}")),
        }
    }
    let releases = ReleasedWindows::open(dir).map_err(|e| e.to_string())?;
    for window in 0..4u64 {
        let want = acked.values().filter(|w| **w == window).count();
        if let Some(WindowOutcome::Released(bytes)) = releases
            .read_blocking(STREAM, window)
            .map_err(|e| e.to_string())?
        {
            let released: ReleasedWindow =
                prost::Message::decode(bytes.as_slice()).map_err(|e| e.to_string())?;
            if released.records.len() != want || released.window_id != window {
                return Err(format!(
                    "window {window} released {released:?}, {want} acked"
                ));
            }
        }
    }
    drop(log);
    Ok(())
}

/// Byte offsets where the log's frames start, and its length.
fn frame_starts(log: &[u8]) -> Vec<u64> {
    let mut starts = Vec::new();
    let mut pos = 0usize;
    while pos < log.len() {
        starts.push(pos as u64);
        let len = u32::from_le_bytes(log[pos..pos + 4].try_into().unwrap()) as usize;
        pos += 8 + len;
    }
    starts
}

/// The start of the frame holding byte `at`.
fn frame_of(starts: &[u64], at: u64) -> u64 {
    *starts.iter().rev().find(|s| **s <= at).unwrap()
}

/// Copies of the files of `dir` to put back between positions (a seal written since is removed).
struct Snapshot(std::path::PathBuf, Vec<(std::path::PathBuf, Vec<u8>)>);

impl Snapshot {
    fn take(dir: &Path) -> Snapshot {
        let mut files = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    files.push((p.clone(), std::fs::read(&p).unwrap()));
                }
            }
        }
        Snapshot(dir.to_path_buf(), files)
    }

    fn restore(&self) {
        let seal = self.0.join(SEAL_FILE);
        if seal.exists() && !self.1.iter().any(|(p, _)| *p == seal) {
            std::fs::remove_file(&seal).unwrap();
        }
        for (path, bytes) in &self.1 {
            std::fs::write(path, bytes).unwrap();
        }
    }
}

/// A damaged log: the check refuses it naming the log and `offset`, and so does opening the log.
fn assert_refused_at(dir: &Path, offset: u64, what: &str) {
    let report = check_data_dir(dir).unwrap();
    let refusal = report
        .refusal()
        .unwrap_or_else(|| panic!("{what}: not refused"));
    match refusal {
        StoreError::Corrupt {
            path, offset: at, ..
        } => {
            assert_eq!(path, dir.join(LOG_FILE), "{what}");
            assert_eq!(at, offset, "{what}: {}", report.problems[0].finding);
        }
        e => panic!("{what}: {e}"),
    }
    assert!(
        matches!(FileRecordLog::open(dir), Err(StoreError::Corrupt { .. })),
        "{what}: the log opened"
    );
}

#[tokio::test]
async fn every_flipped_or_cut_byte_of_a_sealed_log_is_refused_at_its_frame() {
    let dir = tempfile::tempdir().unwrap();
    let acked = write_store(dir.path()).await;
    let snapshot = Snapshot::take(dir.path());
    let log_path = dir.path().join(LOG_FILE);
    let log = std::fs::read(&log_path).unwrap();
    let starts = frame_starts(&log);
    assert!(check_data_dir(dir.path()).unwrap().problems.is_empty());
    check_recovered(dir.path(), &acked).await.unwrap();
    snapshot.restore();
    for at in 0..log.len() {
        let mut bytes = log.clone();
        bytes[at] ^= 0x01;
        std::fs::write(&log_path, &bytes).unwrap();
        assert_refused_at(
            dir.path(),
            frame_of(&starts, at as u64),
            &format!("flip {at}"),
        );
        snapshot.restore();
    }
    for cut in 0..log.len() {
        std::fs::write(&log_path, &log[..cut]).unwrap();
        // A cut on a frame boundary is named where the sealed log ends short.
        let offset = if starts.contains(&(cut as u64)) {
            cut as u64
        } else {
            frame_of(&starts, cut as u64)
        };
        assert_refused_at(dir.path(), offset, &format!("cut at {cut}"));
        snapshot.restore();
    }
}

#[tokio::test]
async fn without_a_seal_every_flip_before_the_last_frame_is_refused_and_a_torn_tail_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let acked = write_store(dir.path()).await;
    // A crash: no seal. Only the last batch (window 3's two records) can be a torn write.
    std::fs::remove_file(dir.path().join(SEAL_FILE)).unwrap();
    let snapshot = Snapshot::take(dir.path());
    let log_path = dir.path().join(LOG_FILE);
    let log = std::fs::read(&log_path).unwrap();
    let starts = frame_starts(&log);
    let last = *starts.last().unwrap() as usize;
    // Flips: a complete frame is checked whole, so damage anywhere is refused at its frame; only
    // the last frame's length field cannot be told from a short write without a seal.
    for at in (0..log.len()).filter(|at| !(last..last + 4).contains(at)) {
        let mut bytes = log.clone();
        bytes[at] ^= 0x01;
        std::fs::write(&log_path, &bytes).unwrap();
        assert_refused_at(
            dir.path(),
            frame_of(&starts, at as u64),
            &format!("flip {at}"),
        );
        snapshot.restore();
    }
    // A cut inside the last frame is a torn tail only if its batch was never acknowledged: the
    // journal of acknowledged batches tells.
    let mut unacked = acked.clone();
    let last_id = unacked
        .keys()
        .max_by_key(|id| id[1..].parse::<u32>().unwrap())
        .cloned()
        .unwrap();
    unacked.remove(&last_id);
    // The journal of acknowledged batches, and the same without its last batch (a crash after the
    // batch's fsync, before its acknowledgement was written).
    let acks_path = dir.path().join(ACKS_FILE);
    let acks = std::fs::read(&acks_path).unwrap();
    let last_ack = Journal::decode(Some(&acks)).acks.last().unwrap().offset as usize;
    for cut in last + 1..log.len() {
        std::fs::write(&log_path, &log[..cut]).unwrap();
        // The last batch was acknowledged: cutting it is lost data, named, never a torn tail.
        let report = check_data_dir(dir.path()).unwrap();
        assert_eq!(report.lost_records(), 1, "cut at {cut}");
        let refusal = report.refusal().unwrap().to_string();
        assert!(
            refusal.contains("1 acknowledged records lost (1 of window 3 of stream \"s\")"),
            "cut at {cut}: {refusal}"
        );
        assert!(FileRecordLog::open(dir.path()).is_err(), "cut at {cut}");
        std::fs::write(&acks_path, &acks[..last_ack]).unwrap();
        let report = check_data_dir(dir.path()).unwrap();
        assert!(
            report.problems.is_empty(),
            "cut at {cut}: {:?}",
            report.problems
        );
        assert_eq!(
            report.notes.len(),
            1,
            "cut at {cut}: the torn tail is reported"
        );
        check_recovered(dir.path(), &unacked).await.unwrap();
        assert_eq!(std::fs::read(&log_path).unwrap(), &log[..last]);
        snapshot.restore();
    }
}

#[tokio::test]
async fn every_flipped_or_cut_byte_of_a_release_file_is_refused_and_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let acked = write_store(dir.path()).await;
    let snapshot = Snapshot::take(dir.path());
    let file = dir
        .path()
        .join("windows")
        .join(cloakd::store::stream_dir_name(STREAM))
        .join(format!("{:020}.released", 1));
    let clean = std::fs::read(&file).unwrap();
    let releases = ReleasedWindows::open(dir.path()).unwrap();
    let damaged = |what: String| {
        let report = check_data_dir(dir.path()).unwrap();
        let first = report
            .problems
            .first()
            .unwrap_or_else(|| panic!("{what}: not refused"));
        assert_eq!(first.finding.path, file, "{what}");
        // The log holds window 1 whole: the repair moves the file away to rebuild it.
        assert_eq!(first.fix, Some(Fix::MoveAway(file.clone())), "{what}");
        assert!(
            matches!(
                releases.read_blocking(STREAM, 1),
                Err(StoreError::Corrupt { .. })
            ),
            "{what}: served"
        );
    };
    for at in 0..clean.len() {
        let mut bytes = clean.clone();
        bytes[at] ^= 0x01;
        std::fs::write(&file, &bytes).unwrap();
        damaged(format!("flip {at}"));
        snapshot.restore();
    }
    for cut in 0..clean.len() {
        std::fs::write(&file, &clean[..cut]).unwrap();
        damaged(format!("cut at {cut}"));
        snapshot.restore();
    }
    check_recovered(dir.path(), &acked).await.unwrap();
}
