//! The transaction log: an append-only file of accepted records and window close markers, the
//! durable source of truth of every transaction stream.
//!
//! # Format
//! One file, `transactions.log`, a sequence of frames `[len: u32 LE][crc32: u32 LE][payload]`, where
//! the payload (at most [`MAX_ENTRY_BYTES`]) is one protobuf-encoded [`LogEntry`]. Two kinds of entry:
//! * `Record`: a record of stream s accepted into window w of s (record id, items, sensitive items);
//! * `Close`: window w of stream s is closed with exactly n records and will be anonymized with the
//!   stored parameters (rho, m, mode), whatever the configuration says later.
//!
//! # Invariants
//! 1. **Durable prefix.** [`TransactionLog::append`] writes a whole batch with one `write` and then
//!    `fdatasync`s (group commit); only after it returns `Ok` may any entry of the batch be
//!    acknowledged or acted upon. So the acknowledged state is always a prefix of the file.
//! 2. **Torn tail.** A crash can leave a partial last batch. [`TransactionLog::open`] reads frames
//!    until the first one that is incomplete, fails its checksum or does not decode, truncates the
//!    file there and fsyncs it. Everything cut off was never acknowledged (invariant 1), so no
//!    acknowledged entry is lost. (A corrupt frame in the middle of the file, which fsync'd appends
//!    cannot produce, would also be cut there; the number of bytes dropped is reported.)
//! 3. **Failed append.** When a write or fsync fails, the file is truncated back to its last durable
//!    length and the error is returned; the caller must then rebuild its in-memory state from
//!    [`TransactionLog::open`] (the same path as a restart) before appending again.
//! 4. **Windows are fixed by their close marker.** The writer assigns each record of stream s to the
//!    currently open window of s and writes the `Close` entry of window w after every record of w and
//!    before any record of w+1. So the record set and order of window w are the `Record` entries of
//!    (s, w) preceding its `Close` entry: fixed once the marker is durable, the same on every replay.
//! 5. **Record ids are unique per stream.** The writer checks a record id against every earlier entry
//!    (rebuilt by replaying the log) before appending it; a re-published id is answered from the
//!    index, never appended twice.
//!
//! Together with [`super::released_windows`] (a window's release is one atomic file), a window closed
//! in the log but without a release file is re-anonymized after a restart from the same records, the
//! same order, the same stored parameters and a seed derived from (stream, window): the identical
//! release. A window with a release file is never released again.
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::StoreError;
use crate::telemetry::catalog;

/// File name of the log inside the data directory.
pub const LOG_FILE: &str = "transactions.log";
/// Largest payload of one frame; a longer length field means a torn or corrupt frame.
pub const MAX_ENTRY_BYTES: usize = 64 << 20;
const FRAME_HEADER: usize = 8;

/// An accepted record of window `window_id` of `stream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub stream: String,
    pub window_id: u64,
    pub record_id: String,
    pub items: Vec<String>,
    pub sensitive_items: Vec<String>,
}

/// Anonymization parameters fixed when a window closes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoredParams {
    pub rho: f64,
    pub m: u32,
    /// `None`: exact mode; `Some((epsilon, delta))`: sampled mode.
    pub sampled: Option<(f64, f64)>,
}

/// The close marker of window `window_id` of `stream`, holding exactly `records` records.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowClose {
    pub stream: String,
    pub window_id: u64,
    pub records: u64,
    pub params: StoredParams,
}

/// One entry of the log.
#[derive(Debug, Clone, PartialEq)]
pub enum LogEntry {
    Record(StoredRecord),
    Close(WindowClose),
}

/// On-disk encoding of a [`LogEntry`] (protobuf, so fields can be added compatibly).
#[derive(Clone, PartialEq, prost::Message)]
struct WireEntry {
    /// 1 = record, 2 = close.
    #[prost(uint32, tag = "1")]
    kind: u32,
    #[prost(string, tag = "2")]
    stream: String,
    #[prost(uint64, tag = "3")]
    window_id: u64,
    #[prost(string, tag = "4")]
    record_id: String,
    #[prost(string, repeated, tag = "5")]
    items: Vec<String>,
    #[prost(string, repeated, tag = "6")]
    sensitive_items: Vec<String>,
    #[prost(uint64, tag = "7")]
    records: u64,
    #[prost(double, tag = "8")]
    rho: f64,
    #[prost(uint32, tag = "9")]
    m: u32,
    #[prost(bool, tag = "10")]
    sampled: bool,
    #[prost(double, tag = "11")]
    epsilon: f64,
    #[prost(double, tag = "12")]
    delta: f64,
}

const KIND_RECORD: u32 = 1;
const KIND_CLOSE: u32 = 2;

impl LogEntry {
    fn to_wire(&self) -> WireEntry {
        match self {
            LogEntry::Record(r) => WireEntry {
                kind: KIND_RECORD,
                stream: r.stream.clone(),
                window_id: r.window_id,
                record_id: r.record_id.clone(),
                items: r.items.clone(),
                sensitive_items: r.sensitive_items.clone(),
                ..WireEntry::default()
            },
            LogEntry::Close(c) => WireEntry {
                kind: KIND_CLOSE,
                stream: c.stream.clone(),
                window_id: c.window_id,
                records: c.records,
                rho: c.params.rho,
                m: c.params.m,
                sampled: c.params.sampled.is_some(),
                epsilon: c.params.sampled.map_or(0.0, |s| s.0),
                delta: c.params.sampled.map_or(0.0, |s| s.1),
                ..WireEntry::default()
            },
        }
    }

    fn from_wire(w: WireEntry) -> Result<LogEntry, String> {
        match w.kind {
            KIND_RECORD => Ok(LogEntry::Record(StoredRecord {
                stream: w.stream,
                window_id: w.window_id,
                record_id: w.record_id,
                items: w.items,
                sensitive_items: w.sensitive_items,
            })),
            KIND_CLOSE => Ok(LogEntry::Close(WindowClose {
                stream: w.stream,
                window_id: w.window_id,
                records: w.records,
                params: StoredParams {
                    rho: w.rho,
                    m: w.m,
                    sampled: w.sampled.then_some((w.epsilon, w.delta)),
                },
            })),
            other => Err(format!("unknown entry kind {other}")),
        }
    }

    /// Appends the frame of this entry to `out`.
    pub fn encode_frame(&self, out: &mut Vec<u8>) {
        let payload = prost::Message::encode_to_vec(&self.to_wire());
        let mut crc = flate2::Crc::new();
        crc.update(&payload);
        out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&crc.sum().to_le_bytes());
        out.extend_from_slice(&payload);
    }
}

/// What [`TransactionLog::open`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// Length of the valid prefix kept.
    pub valid_bytes: u64,
    /// Bytes cut off the end (a torn or corrupt tail); 0 after a clean shutdown.
    pub truncated_bytes: u64,
    /// Why the tail was cut, if it was.
    pub truncation_reason: Option<String>,
}

/// The open log, positioned at its end.
#[derive(Debug)]
pub struct TransactionLog {
    path: PathBuf,
    file: File,
    /// Length of the durable prefix (everything fsync'd).
    durable_len: u64,
}

impl TransactionLog {
    /// Opens (creating if needed) the log in `dir`, replays it and cuts a torn tail (invariant 2).
    pub fn open(dir: &Path) -> Result<(TransactionLog, Vec<LogEntry>, Recovery), StoreError> {
        std::fs::create_dir_all(dir).map_err(StoreError::io(dir, "creating the data directory"))?;
        let path = dir.join(LOG_FILE);
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(StoreError::io(&path, "opening the log"))?;
        if created {
            super::sync_dir(dir)?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(StoreError::io(&path, "reading the log"))?;
        let (entries, valid, reason) = decode_frames(&bytes);
        let total = bytes.len() as u64;
        if valid < total {
            file.set_len(valid)
                .and_then(|()| file.sync_all())
                .map_err(StoreError::io(&path, "truncating the torn tail of the log"))?;
        }
        file.seek(SeekFrom::Start(valid))
            .map_err(StoreError::io(&path, "seeking to the end of the log"))?;
        let recovery = Recovery {
            valid_bytes: valid,
            truncated_bytes: total - valid,
            truncation_reason: reason,
        };
        metrics::gauge!(catalog::TX_LOG_BYTES).set(valid as f64);
        Ok((
            TransactionLog {
                path,
                file,
                durable_len: valid,
            },
            entries,
            recovery,
        ))
    }

    /// Appends `entries` with one write and one fsync (invariant 1). On error the file is cut back to
    /// its durable length (invariant 3) and nothing of the batch may be acknowledged.
    pub fn append(&mut self, entries: &[LogEntry]) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::new();
        for entry in entries {
            entry.encode_frame(&mut buf);
        }
        #[cfg(test)]
        if fault_injection::should_fail(&self.path) {
            // As a full disk would: half the batch reaches the file, then the write fails.
            let _ = self.file.write_all(&buf[..buf.len() / 2]);
            let _ = self.file.set_len(self.durable_len).and_then(|()| {
                self.file
                    .seek(SeekFrom::Start(self.durable_len))
                    .map(|_| ())
            });
            return Err(StoreError::Io {
                path: self.path.clone(),
                action: "appending to the log",
                source: std::io::Error::new(std::io::ErrorKind::StorageFull, "injected: disk full"),
            });
        }
        let started = std::time::Instant::now();
        let result = self
            .file
            .write_all(&buf)
            .map_err(StoreError::io(&self.path, "appending to the log"))
            .and_then(|()| {
                self.file
                    .sync_data()
                    .map_err(StoreError::io(&self.path, "fsyncing the log"))
            });
        match result {
            Ok(()) => {
                metrics::histogram!(catalog::TX_LOG_FSYNC_SECONDS)
                    .record(started.elapsed().as_secs_f64());
                self.durable_len += buf.len() as u64;
                metrics::gauge!(catalog::TX_LOG_BYTES).set(self.durable_len as f64);
                Ok(())
            }
            Err(err) => {
                // Best effort: cut the partial batch so the next append starts on a frame boundary.
                // If this fails too, the torn tail is cut at the next open.
                let _ = self
                    .file
                    .set_len(self.durable_len)
                    .and_then(|()| {
                        self.file
                            .seek(SeekFrom::Start(self.durable_len))
                            .map(|_| ())
                    })
                    .and_then(|()| self.file.sync_all());
                Err(err)
            }
        }
    }

    /// Length of the durable prefix.
    pub fn durable_len(&self) -> u64 {
        self.durable_len
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Test-only: makes appends to chosen log files fail, as on a full disk.
#[cfg(test)]
pub(crate) mod fault_injection {
    use std::collections::HashSet;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    static FAILING: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

    /// Appends to the log in `dir` fail while `failing` is true.
    pub(crate) fn set_failing(dir: &Path, failing: bool) {
        let mut set = FAILING.lock().unwrap();
        let set = set.get_or_insert_with(HashSet::new);
        let path = dir.join(super::LOG_FILE);
        if failing {
            set.insert(path);
        } else {
            set.remove(&path);
        }
    }

    pub(crate) fn should_fail(path: &Path) -> bool {
        FAILING
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|set| set.contains(path))
    }
}

/// Decodes frames from the start of `bytes`; returns the entries, the length of the valid prefix
/// and, when it is shorter than `bytes`, why.
fn decode_frames(bytes: &[u8]) -> (Vec<LogEntry>, u64, Option<String>) {
    let mut entries = Vec::new();
    let mut pos = 0usize;
    let reason = loop {
        let rest = &bytes[pos..];
        if rest.is_empty() {
            break None;
        }
        if rest.len() < FRAME_HEADER {
            break Some(format!("incomplete frame header at byte {pos}"));
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len > MAX_ENTRY_BYTES {
            break Some(format!("frame length {len} too large at byte {pos}"));
        }
        if rest.len() < FRAME_HEADER + len {
            break Some(format!("incomplete frame at byte {pos}"));
        }
        let payload = &rest[FRAME_HEADER..FRAME_HEADER + len];
        let mut actual = flate2::Crc::new();
        actual.update(payload);
        if actual.sum() != crc {
            break Some(format!("checksum mismatch at byte {pos}"));
        }
        let entry = <WireEntry as prost::Message>::decode(payload)
            .map_err(|e| e.to_string())
            .and_then(LogEntry::from_wire);
        match entry {
            Ok(entry) => entries.push(entry),
            Err(e) => break Some(format!("undecodable frame at byte {pos}: {e}")),
        }
        pos += FRAME_HEADER + len;
    };
    (entries, pos as u64, reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record(stream: &str, window_id: u64, id: &str, items: &[&str]) -> LogEntry {
        LogEntry::Record(StoredRecord {
            stream: stream.into(),
            window_id,
            record_id: id.into(),
            items: items.iter().map(|s| s.to_string()).collect(),
            sensitive_items: vec!["s".into()],
        })
    }

    fn close(stream: &str, window_id: u64, records: u64) -> LogEntry {
        LogEntry::Close(WindowClose {
            stream: stream.into(),
            window_id,
            records,
            params: StoredParams {
                rho: 0.5,
                m: 3,
                sampled: Some((0.05, 0.1)),
            },
        })
    }

    #[test]
    fn append_then_reopen_returns_the_same_entries() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, entries, rec) = TransactionLog::open(dir.path()).unwrap();
        assert!(entries.is_empty());
        assert_eq!(rec.truncated_bytes, 0);
        let batch1 = vec![
            record("a", 0, "r1", &["x", "y"]),
            record("b", 0, "r1", &["z"]),
        ];
        let batch2 = vec![close("a", 0, 1), record("a", 1, "r2", &["é", ""])];
        log.append(&batch1).unwrap();
        log.append(&batch2).unwrap();
        drop(log);
        let (log, entries, rec) = TransactionLog::open(dir.path()).unwrap();
        assert_eq!(entries, [batch1, batch2].concat());
        assert_eq!(rec.truncated_bytes, 0);
        assert_eq!(
            log.durable_len(),
            std::fs::metadata(dir.path().join(LOG_FILE)).unwrap().len()
        );
    }

    #[test]
    fn torn_tail_is_cut_at_every_length() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _, _) = TransactionLog::open(dir.path()).unwrap();
        let first = vec![record("a", 0, "r1", &["x"])];
        log.append(&first).unwrap();
        let durable = log.durable_len();
        let second = vec![record("a", 0, "r2", &["y", "z"]), close("a", 0, 2)];
        log.append(&second).unwrap();
        drop(log);
        let full = std::fs::read(dir.path().join(LOG_FILE)).unwrap();
        // Every cut inside the second batch keeps exactly the entries that are complete.
        let mut frame_ends = vec![durable as usize];
        let mut buf = Vec::new();
        for e in &second {
            e.encode_frame(&mut buf);
            frame_ends.push(durable as usize + buf.len());
        }
        for cut in durable as usize..=full.len() {
            std::fs::write(dir.path().join(LOG_FILE), &full[..cut]).unwrap();
            let (log, entries, rec) = TransactionLog::open(dir.path()).unwrap();
            let complete = frame_ends.iter().filter(|&&end| end <= cut).count() - 1;
            assert_eq!(entries.len(), 1 + complete, "cut at {cut}");
            assert_eq!(entries[..1], first[..]);
            assert_eq!(entries[1..], second[..complete]);
            let kept = frame_ends[complete] as u64;
            assert_eq!(log.durable_len(), kept);
            assert_eq!(rec.truncated_bytes, cut as u64 - kept);
            assert_eq!(
                std::fs::metadata(dir.path().join(LOG_FILE)).unwrap().len(),
                kept
            );
        }
    }

    #[test]
    fn corrupt_byte_cuts_the_log_at_that_frame() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _, _) = TransactionLog::open(dir.path()).unwrap();
        log.append(&[record("a", 0, "r1", &["x"])]).unwrap();
        let first_len = log.durable_len() as usize;
        log.append(&[record("a", 0, "r2", &["y"])]).unwrap();
        drop(log);
        let mut bytes = std::fs::read(dir.path().join(LOG_FILE)).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(dir.path().join(LOG_FILE), &bytes).unwrap();
        let (mut log, entries, rec) = TransactionLog::open(dir.path()).unwrap();
        assert_eq!(entries.len(), 1);
        assert!(rec.truncation_reason.unwrap().contains("checksum"));
        assert_eq!(log.durable_len() as usize, first_len);
        // Appending after recovery continues on a frame boundary.
        log.append(&[record("a", 0, "r3", &["w"])]).unwrap();
        drop(log);
        let (_, entries, rec) = TransactionLog::open(dir.path()).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(rec.truncated_bytes, 0);
    }

    fn arb_entry() -> impl Strategy<Value = LogEntry> {
        let name = "[a-c]{0,3}";
        prop_oneof![
            (
                name,
                0u64..5,
                name,
                prop::collection::vec(name, 0..4),
                prop::collection::vec(name, 0..3)
            )
                .prop_map(|(stream, window_id, record_id, items, sensitive_items)| {
                    LogEntry::Record(StoredRecord {
                        stream,
                        window_id,
                        record_id,
                        items,
                        sensitive_items,
                    })
                }),
            (
                name,
                0u64..5,
                0u64..100,
                0.01f64..0.99,
                1u32..6,
                any::<bool>()
            )
                .prop_map(|(stream, window_id, records, rho, m, sampled)| {
                    LogEntry::Close(WindowClose {
                        stream,
                        window_id,
                        records,
                        params: StoredParams {
                            rho,
                            m,
                            sampled: sampled.then_some((0.05, 0.05)),
                        },
                    })
                }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Model test: the log replays exactly the concatenation of the batches appended, and a
        /// truncation at any byte keeps a prefix of whole entries.
        #[test]
        fn log_matches_model(batches in prop::collection::vec(prop::collection::vec(arb_entry(), 0..5), 0..6),
                             cut_fraction in 0.0f64..1.0) {
            let dir = tempfile::tempdir().unwrap();
            let mut model = Vec::new();
            {
                let (mut log, _, _) = TransactionLog::open(dir.path()).unwrap();
                for batch in &batches {
                    log.append(batch).unwrap();
                    model.extend(batch.iter().cloned());
                }
            }
            let (_, entries, _) = TransactionLog::open(dir.path()).unwrap();
            prop_assert_eq!(&entries, &model);
            let path = dir.path().join(LOG_FILE);
            let full = std::fs::read(&path).unwrap();
            let cut = (full.len() as f64 * cut_fraction) as usize;
            std::fs::write(&path, &full[..cut]).unwrap();
            let (_, entries, _) = TransactionLog::open(dir.path()).unwrap();
            prop_assert!(entries.len() <= model.len());
            prop_assert_eq!(&entries[..], &model[..entries.len()]);
        }
    }
}
