//! Property test of the embedded store's files against a model of what was acknowledged: a data
//! directory is written through the store layer (two streams, closed, released and open windows;
//! every append that returned `Ok` is acknowledged), then proptest mutates one of its files — the
//! log, the journal of acknowledged batches or a release file — by cutting it, flipping a byte,
//! cutting a range out of it, repeating a range, or copying another window's release over it.
//! Through `store check` (the daemon's start check) and opening the stores, nothing panics, and
//! every acknowledged record is either still in the log, in the window it was acknowledged into,
//! or named as lost for its stream and window: never silently dropped. A directory the check
//! passes opens, replays every acknowledged record and serves only releases of their own window.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cloakd::proto::{ReleasedRecord, ReleasedWindow, UtilityReport};
use cloakd::store::ack_journal::ACKS_FILE;
use cloakd::store::check::check_data_dir;
use cloakd::store::transaction_log::{LOG_FILE, scan_log};
use cloakd::store::{
    FileRecordLog, LogEntry, LogPosition, RecordLog, ReleasedWindows, StoredRecord, WindowClose,
    WindowOutcome,
};
use cloakd::transactions::{Mode, Params};
use proptest::prelude::*;

const STREAMS: [&str; 2] = ["s", "t"];
const PER_WINDOW: u64 = 3;

/// The written directory: its files (relative path, bytes) and what was acknowledged:
/// (stream, record id) -> window.
struct Base {
    files: Vec<(PathBuf, Vec<u8>)>,
    acked: BTreeMap<(String, String), u64>,
    releases: Vec<PathBuf>,
}

fn release_bytes(stream: &str, window: u64) -> Vec<u8> {
    prost::Message::encode_to_vec(&ReleasedWindow {
        stream: stream.into(),
        window_id: window,
        records: (0..PER_WINDOW)
            .map(|_| ReleasedRecord {
                items: vec!["x".into()],
            })
            .collect(),
        report: Some(UtilityReport {
            records: PER_WINDOW,
            rho: 0.5,
            m: 2,
            mode: "exact".into(),
            ..UtilityReport::default()
        }),
    })
}

/// Windows 0-2 of each stream closed (0 and 1 released), window 3 open with 2 records; one batch
/// per window and stream, records batched in twos as a writer might.
fn base() -> &'static Base {
    static BASE: OnceLock<Base> = OnceLock::new();
    BASE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut acked = BTreeMap::new();
        runtime.block_on(async {
            let (log, _) = FileRecordLog::open(dir.path()).unwrap();
            let releases = ReleasedWindows::open(dir.path()).unwrap();
            for window in 0..4u64 {
                for stream in STREAMS {
                    let count = if window == 3 { 2 } else { PER_WINDOW };
                    let mut entries: Vec<LogEntry> = (0..count)
                        .map(|i| {
                            LogEntry::Record(StoredRecord {
                                stream: stream.into(),
                                window_id: window,
                                record_id: format!("{stream}{window}-{i}"),
                                items: vec![format!("i{i}"), "x".into()],
                                sensitive_items: vec!["x".into()],
                            })
                        })
                        .collect();
                    if window < 3 {
                        entries.push(LogEntry::Close(WindowClose {
                            stream: stream.into(),
                            window_id: window,
                            records: PER_WINDOW,
                            params: Params {
                                rho: 0.5,
                                m: 2,
                                mode: Mode::Exact,
                            },
                        }));
                    }
                    for batch in entries.chunks(2) {
                        log.append(batch.to_vec()).await.unwrap();
                        for entry in batch {
                            if let LogEntry::Record(r) = entry {
                                acked.insert((r.stream.clone(), r.record_id.clone()), r.window_id);
                            }
                        }
                    }
                    if window < 2 {
                        releases
                            .write_blocking(
                                stream,
                                window,
                                &WindowOutcome::Released(release_bytes(stream, window)),
                            )
                            .unwrap();
                    }
                }
            }
        });
        // A crash: no clean shutdown, no seal (the log is sealed on drop; remove it).
        let _ = std::fs::remove_file(dir.path().join("transactions.log.sealed"));
        let mut files = Vec::new();
        let mut stack = vec![dir.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    let rel = p.strip_prefix(dir.path()).unwrap().to_path_buf();
                    files.push((rel, std::fs::read(&p).unwrap()));
                }
            }
        }
        files.sort();
        let releases = files
            .iter()
            .map(|(p, _)| p.clone())
            .filter(|p| p.extension().is_some_and(|e| e == "released"))
            .collect();
        Base {
            files,
            acked,
            releases,
        }
    })
}

#[derive(Debug, Clone)]
enum Mutation {
    Cut(f64),
    Flip(f64, u8),
    CutOut(f64, f64),
    Repeat(f64, f64),
    /// Copy release file `from` over the target (only for release files).
    CopyRelease(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0.0f64..1.0).prop_map(Mutation::Cut),
        (0.0f64..1.0, 0u8..8).prop_map(|(at, bit)| Mutation::Flip(at, bit)),
        (0.0f64..1.0, 0.0f64..0.3).prop_map(|(at, len)| Mutation::CutOut(at, len)),
        (0.0f64..1.0, 0.0f64..0.3).prop_map(|(at, len)| Mutation::Repeat(at, len)),
        (0usize..4).prop_map(Mutation::CopyRelease),
    ]
}

fn mutate(bytes: &[u8], m: &Mutation, base: &Base) -> Vec<u8> {
    let n = bytes.len();
    let at = |f: f64| ((n as f64 * f) as usize).min(n);
    match m {
        Mutation::Cut(f) => bytes[..at(*f)].to_vec(),
        Mutation::Flip(f, bit) => {
            let mut out = bytes.to_vec();
            if n > 0 {
                let i = at(*f).min(n - 1);
                out[i] ^= 1 << bit;
            }
            out
        }
        Mutation::CutOut(f, len) => {
            let (a, b) = (at(*f), at(*f + len));
            [&bytes[..a], &bytes[b..]].concat()
        }
        Mutation::Repeat(f, len) => {
            let (a, b) = (at(*f), at(*f + len));
            [&bytes[..b], &bytes[a..b], &bytes[b..]].concat()
        }
        Mutation::CopyRelease(from) => {
            let path = &base.releases[*from % base.releases.len()];
            base.files
                .iter()
                .find(|(p, _)| p == path)
                .unwrap()
                .1
                .clone()
        }
    }
}

fn write_dir(dir: &Path, base: &Base, target: &Path, m: &Mutation) -> bool {
    let mut changed = false;
    for (rel, bytes) in &base.files {
        let path = dir.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let bytes = if rel == target {
            let out = mutate(bytes, m, base);
            changed = out != *bytes;
            out
        } else {
            bytes.clone()
        };
        std::fs::write(&path, bytes).unwrap();
    }
    changed
}

/// Acknowledged records per (stream, window) in the valid prefix of the log of `dir`, counting only
/// those in the window they were acknowledged into.
fn present(dir: &Path, base: &Base) -> BTreeMap<(String, u64), u64> {
    let (scan, _) = scan_log(dir).unwrap();
    let mut counts = BTreeMap::new();
    for (_, entry) in &scan.entries {
        if let LogEntry::Record(r) = entry
            && base.acked.get(&(r.stream.clone(), r.record_id.clone())) == Some(&r.window_id)
        {
            *counts.entry((r.stream.clone(), r.window_id)).or_default() += 1;
        }
    }
    counts
}

fn acked_counts(base: &Base) -> BTreeMap<(String, u64), u64> {
    let mut counts = BTreeMap::new();
    for ((stream, _), window) in &base.acked {
        *counts.entry((stream.clone(), *window)).or_default() += 1;
    }
    counts
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]
    #[test]
    fn every_acknowledged_record_is_kept_or_named_lost(target in 0usize..6, m in mutation()) {
        let base = base();
        // Targets: the log, the journal, the four release files.
        let target = match target {
            0 => PathBuf::from(LOG_FILE),
            1 => PathBuf::from(ACKS_FILE),
            k => base.releases[(k - 2) % base.releases.len()].clone(),
        };
        let is_release = target.extension().is_some_and(|e| e == "released");
        prop_assume!(is_release || !matches!(m, Mutation::CopyRelease(_)));
        let dir = tempfile::tempdir().unwrap();
        let changed = write_dir(dir.path(), base, &target, &m);
        let report = check_data_dir(dir.path()).unwrap();
        let named: BTreeMap<(String, u64), u64> = report
            .lost
            .iter()
            .map(|l| ((l.stream.clone(), l.window_id), l.records))
            .collect();
        let present = present(dir.path(), base);
        for (key, acked) in acked_counts(base) {
            let missing = acked.saturating_sub(present.get(&key).copied().unwrap_or(0));
            let lost = named.get(&key).copied().unwrap_or(0);
            prop_assert!(
                missing <= lost,
                "{target:?} {m:?}: {missing} acknowledged records of {key:?} missing, {lost} named lost; problems {:?}",
                report.problems
            );
        }
        if is_release && changed {
            // A changed release file is never taken for its window's release.
            prop_assert!(!report.problems.is_empty(), "{target:?} {m:?}: not refused");
        }
        let opened = FileRecordLog::open(dir.path());
        if report.problems.is_empty() {
            prop_assert!(report.lost.is_empty());
            let (log, _) = opened.map_err(|e| TestCaseError::fail(format!("{m:?}: {e}")))?;
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let replayed = runtime.block_on(log.replay(LogPosition::START)).unwrap();
            let mut seen = BTreeMap::new();
            for entry in replayed.entries {
                if let LogEntry::Record(r) = entry {
                    seen.insert((r.stream, r.record_id), r.window_id);
                }
            }
            for (key, window) in &base.acked {
                prop_assert_eq!(seen.get(key), Some(window), "{:?} {:?}", target, m);
            }
            let releases = ReleasedWindows::open(dir.path()).unwrap();
            for stream in STREAMS {
                for window in 0..2 {
                    match releases.read_blocking(stream, window) {
                        Ok(Some(WindowOutcome::Released(bytes))) => {
                            let w: ReleasedWindow = prost::Message::decode(bytes.as_slice()).unwrap();
                            prop_assert_eq!((w.stream.as_str(), w.window_id), (stream, window));
                        }
                        Ok(None) => {} // re-anonymized from the log at start
                        other => prop_assert!(false, "{:?} {:?}: {:?}", target, m, other),
                    }
                }
            }
        }
    }
}
