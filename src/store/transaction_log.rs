//! The embedded record log: one append-only file of accepted records and window close markers, the
//! durable source of truth of every transaction stream when no cluster is configured.
//! [`FileRecordLog`] implements [`RecordLog`] over it.
//!
//! # Format
//! One file, `transactions.log`, a sequence of frames `[len: u32 LE][crc32: u32 LE][payload]`, where
//! the payload (at most [`MAX_ENTRY_BYTES`]) is one [`LogEntry`] in its storage encoding
//! ([`LogEntry::encode`]). A [`LogPosition`] is the byte offset of a frame.
//!
//! # Invariants (how the file gives the [`RecordLog`] contract)
//! 1. **Durable prefix.** [`TransactionLog::append`] writes a whole batch with one `write` and then
//!    `fdatasync`s (group commit); only after it returns `Ok` may any entry of the batch be
//!    acknowledged or acted upon. So the acknowledged state is always a prefix of the file.
//! 2. **Torn tail.** A crash can leave a partial last batch. [`TransactionLog::open`] reads frames
//!    until the first one that is incomplete, fails its checksum or does not decode, truncates the
//!    file there and fsyncs it. Everything cut off was never acknowledged (invariant 1), so no
//!    acknowledged entry is lost. (A corrupt frame in the middle of the file, which fsync'd appends
//!    cannot produce, would also be cut there; the number of bytes dropped is reported.)
//! 3. **Failed append.** When a write or fsync fails, the file is truncated back to its last durable
//!    length and the error is returned; [`FileRecordLog`] then reopens the file (the same path as a
//!    restart, cutting whatever the truncation could not) before the next append or replay.
//! 4. **Ids.** [`FileRecordLog`] keeps every stream's record ids (with their windows) and its closed
//!    windows, rebuilt from the file at open; a batch's entries already present (or repeated
//!    inside the batch) are reported duplicate and not written. One daemon per data directory
//!    ([`super::DataDirLock`]) makes this index the only writer's.
//!
//! Together with [`super::released_windows`] (a window's release is one atomic file), a window closed
//! in the log but without a release file is re-anonymized after a restart from the same records, the
//! same order, the same stored parameters and a seed derived from (stream, window): the identical
//! release. A window with a release file is never released again.
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::StoreError;
use super::record_log::{EntryOutcome, LogEntry, LogPosition, RecordLog, Replayed};
use crate::telemetry::catalog;

/// File name of the log inside the data directory.
pub const LOG_FILE: &str = "transactions.log";
/// Largest payload of one frame; a longer length field means a torn or corrupt frame.
pub const MAX_ENTRY_BYTES: usize = 64 << 20;
const FRAME_HEADER: usize = 8;

impl LogEntry {
    /// Appends the frame of this entry to `out`.
    pub fn encode_frame(&self, out: &mut Vec<u8>) {
        let payload = self.encode();
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

/// Record ids and closed windows of one stream (invariant 4).
#[derive(Debug, Default)]
struct StreamIndex {
    /// Record id -> window, for every record in the file.
    records: HashMap<String, u64>,
    /// Every window closed in the file.
    closed: std::collections::HashSet<u64>,
}

impl StreamIndex {
    /// The outcome `entry` would have, given the index and what the batch stages before it.
    fn duplicate_of(&self, entry: &LogEntry) -> Option<u64> {
        match entry {
            LogEntry::Record(r) => self.records.get(&r.record_id).copied(),
            LogEntry::Close(c) => self.closed.contains(&c.window_id).then_some(c.window_id),
        }
    }

    fn add(&mut self, entry: &LogEntry) {
        match entry {
            LogEntry::Record(r) => {
                self.records.insert(r.record_id.clone(), r.window_id);
            }
            LogEntry::Close(c) => {
                self.closed.insert(c.window_id);
            }
        }
    }
}

#[derive(Debug)]
struct FileState {
    /// `None` after a failed append: reopened before the next use (invariant 3).
    log: Option<TransactionLog>,
    index: HashMap<String, StreamIndex>,
    /// The entries read when the file was (re)opened, handed to the first replay from the start
    /// so that a restart reads the file once.
    opened_entries: Option<Vec<LogEntry>>,
}

/// The file record log of a data directory, a [`RecordLog`] (see the module doc).
#[derive(Debug, Clone)]
pub struct FileRecordLog {
    dir: PathBuf,
    state: Arc<Mutex<FileState>>,
}

impl FileRecordLog {
    /// Opens (creating) the log in `dir`, cutting a torn tail (logged as a warning) and indexing it.
    /// Blocking.
    pub fn open(dir: &Path) -> Result<(FileRecordLog, Recovery), StoreError> {
        let mut state = FileState {
            log: None,
            index: HashMap::new(),
            opened_entries: None,
        };
        let recovery = reopen(dir, &mut state)?;
        Ok((
            FileRecordLog {
                dir: dir.to_path_buf(),
                state: Arc::new(Mutex::new(state)),
            },
            recovery,
        ))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FileState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn append_blocking(&self, batch: &[LogEntry]) -> Result<Vec<EntryOutcome>, StoreError> {
        let mut guard = self.lock();
        let state = &mut *guard;
        if state.log.is_none() {
            reopen(&self.dir, state)?;
        }
        // Stage the batch against the index: duplicates of the file or of the batch itself.
        let mut staged: HashMap<&str, StreamIndex> = HashMap::new();
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut fresh = Vec::with_capacity(batch.len());
        for entry in batch {
            let stream = entry.stream();
            let duplicate = staged
                .get(stream)
                .and_then(|s| s.duplicate_of(entry))
                .or_else(|| state.index.get(stream).and_then(|s| s.duplicate_of(entry)));
            match duplicate {
                Some(window_id) => outcomes.push(EntryOutcome::Duplicate { window_id }),
                None => {
                    staged.entry(stream).or_default().add(entry);
                    outcomes.push(EntryOutcome::Appended);
                    fresh.push(entry.clone());
                }
            }
        }
        let Some(log) = state.log.as_mut() else {
            return Err(StoreError::Corrupt {
                path: self.dir.join(LOG_FILE),
                offset: 0,
                rule: "the log could not be reopened".into(),
            });
        };
        // Entries kept from the open would now miss this batch.
        state.opened_entries = None;
        if let Err(e) = log.append(&fresh) {
            state.log = None;
            return Err(e);
        }
        for entry in &fresh {
            state
                .index
                .entry(entry.stream().to_string())
                .or_default()
                .add(entry);
        }
        Ok(outcomes)
    }

    fn replay_blocking(&self, from: LogPosition) -> Result<Replayed, StoreError> {
        let mut guard = self.lock();
        let state = &mut *guard;
        if state.log.is_none() {
            reopen(&self.dir, state)?;
        }
        let (path, end) = match state.log.as_ref() {
            Some(log) => (log.path().to_path_buf(), log.durable_len()),
            None => (self.dir.join(LOG_FILE), 0),
        };
        if from == LogPosition::START
            && let Some(entries) = state.opened_entries.take()
        {
            return Ok(Replayed {
                entries,
                next: LogPosition(end),
            });
        }
        state.opened_entries = None;
        if from.0 > end {
            return Err(StoreError::Corrupt {
                path,
                offset: from.0,
                rule: format!(
                    "replay position {} is past the end of the log ({end})",
                    from.0
                ),
            });
        }
        let mut file = File::open(&path).map_err(StoreError::io(&path, "opening the log"))?;
        file.seek(SeekFrom::Start(from.0))
            .map_err(StoreError::io(&path, "seeking in the log"))?;
        let mut bytes = Vec::new();
        file.take(end - from.0)
            .read_to_end(&mut bytes)
            .map_err(StoreError::io(&path, "reading the log"))?;
        let (entries, valid, reason) = decode_frames(&bytes);
        if let Some(rule) = reason {
            return Err(StoreError::Corrupt {
                path,
                offset: from.0 + valid,
                rule,
            });
        }
        Ok(Replayed {
            entries,
            next: LogPosition(end),
        })
    }
}

/// (Re)opens the log file of `dir` into `state`: cuts a torn tail and rebuilds the index.
fn reopen(dir: &Path, state: &mut FileState) -> Result<Recovery, StoreError> {
    state.log = None;
    let (log, entries, recovery) = TransactionLog::open(dir)?;
    if recovery.truncated_bytes > 0 {
        tracing::warn!(
            log = %log.path().display(),
            truncated_bytes = recovery.truncated_bytes,
            reason = recovery.truncation_reason.as_deref().unwrap_or(""),
            "cut the unacknowledged torn tail of the transaction log"
        );
    }
    state.index.clear();
    for entry in &entries {
        state
            .index
            .entry(entry.stream().to_string())
            .or_default()
            .add(entry);
    }
    state.opened_entries = Some(entries);
    state.log = Some(log);
    Ok(recovery)
}

#[async_trait]
impl RecordLog for FileRecordLog {
    async fn append(&self, batch: Vec<LogEntry>) -> Result<Vec<EntryOutcome>, StoreError> {
        let log = self.clone();
        super::blocking(&self.dir, "running a log task", move || {
            log.append_blocking(&batch)
        })
        .await
    }

    async fn windows_of(&self, records: &[(&str, &str)]) -> Result<Vec<Option<u64>>, StoreError> {
        if self.lock().log.is_none() {
            // After a failed append the index is rebuilt from the file first (invariant 3).
            let log = self.clone();
            super::blocking(&self.dir, "running a log task", move || {
                let mut state = log.lock();
                if state.log.is_none() {
                    reopen(&log.dir, &mut state)?;
                }
                Ok(())
            })
            .await?;
        }
        let state = self.lock();
        Ok(records
            .iter()
            .map(|(stream, id)| {
                state
                    .index
                    .get(*stream)
                    .and_then(|s| s.records.get(*id))
                    .copied()
            })
            .collect())
    }

    async fn replay(&self, from: LogPosition) -> Result<Replayed, StoreError> {
        let log = self.clone();
        super::blocking(&self.dir, "running a log task", move || {
            log.replay_blocking(from)
        })
        .await
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
        match LogEntry::decode(payload) {
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
    use crate::store::{StoredRecord, WindowClose};
    use crate::transactions::{Mode, Params};
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
            params: Params {
                rho: 0.5,
                m: 3,
                mode: Mode::Sampled {
                    epsilon: 0.05,
                    delta: 0.1,
                },
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
                        params: Params {
                            rho,
                            m,
                            mode: if sampled {
                                Mode::Sampled {
                                    epsilon: 0.05,
                                    delta: 0.05,
                                }
                            } else {
                                Mode::Exact
                            },
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
