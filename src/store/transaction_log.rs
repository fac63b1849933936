//! The embedded record log: one append-only file of accepted records and window close markers, the
//! durable source of truth of every transaction stream when no cluster is configured.
//! [`FileRecordLog`] implements [`RecordLog`] over it.
//!
//! # Format
//! One file, `transactions.log`, a sequence of frames `[len: u32 LE][crc32: u32 LE][payload]`, where
//! the payload (at most [`MAX_ENTRY_BYTES`]) is one [`LogEntry`] in its storage encoding
//! ([`LogEntry::encode`]). A [`LogPosition`] is the byte offset of a frame. Beside it,
//! `transactions.log.sealed` ([`SEAL_FILE`]) exists only while no daemon has the log open after a
//! clean shutdown: it holds the log's length and the CRC-32 of all its bytes (written atomically
//! through `transactions.log.sealed.tmp`, [`SEAL_TMP`]). Beside them,
//! `transactions.acks` is the journal of acknowledged batches ([`super::ack_journal`]).
//!
//! # Invariants (how the file gives the [`RecordLog`] contract)
//! 1. **Durable prefix.** [`TransactionLog::append`] writes a whole batch with one `write` and then
//!    `fdatasync`s (group commit), then journals the batch in `transactions.acks` and fsyncs that;
//!    only after it returns `Ok` may any entry of the batch be acknowledged or acted upon. So every
//!    acknowledged entry lies in the fsync'd prefix *and* is named by the journal; an entry beyond
//!    the journal's last batch was never acknowledged.
//! 2. **Torn tail, and only that.** A crash during an append can leave part of the last batch: the
//!    file then ends inside a frame (an incomplete header, or a payload shorter than its length
//!    field). That incomplete *last* frame, and nothing else, is a torn tail; [`TransactionLog::open`]
//!    cuts it (and says so). It held nothing acknowledged only because no seal vouches for the
//!    length (invariant 3) and it lies past every batch the journal names (invariant 1): a log that
//!    no longer holds a journaled batch — cut short, cut in the middle, changed — is lost
//!    acknowledged data, refused and named per stream and window ([`LogScan::lost_problem`]),
//!    never a torn tail. (A log without a journal, written by an older version, is journaled as it
//!    is at its first open.) Everything
//!    else is corruption and refused, naming the file, the byte offset and the rule
//!    ([`super::StoreError::Corrupt`]): a complete frame whose checksum or encoding is wrong (even
//!    the last one: a complete frame was written whole), a length field past
//!    [`MAX_ENTRY_BYTES`], or a length reaching past the end of the file while a complete frame
//!    lies inside what it claims (a damaged length field, not a short write).
//! 3. **Seal.** When the last handle of a [`FileRecordLog`] whose appends all succeeded goes away
//!    (a clean shutdown), it writes the seal: the log's length and CRC-32. [`TransactionLog::open`]
//!    checks the log against the seal and only then removes it (before any append). Every byte
//!    under a seal was acknowledged or acted upon, so any difference — a cut tail, a changed byte —
//!    is loss of acknowledged data and refused, never cut.
//! 4. **Failed append.** When a write or fsync fails, the file is truncated back to its last durable
//!    length and the error is returned; [`FileRecordLog`] then reopens the file (the same path as a
//!    restart) before the next append or replay, and writes no seal on the way.
//! 5. **Ids and windows.** [`FileRecordLog`] keeps every stream's record ids (with their windows) and
//!    its closed windows, rebuilt from the file at open; a batch's entries already present (or
//!    repeated inside the batch) are reported duplicate and not written. (The writer never
//!    acknowledges a record into a window that has a release; `check` refuses records out of
//!    window order at start.) One daemon per data directory ([`super::DataDirLock`]) makes this
//!    index the only writer's.
//!
//! Together with [`super::released_windows`] (a window's release is one atomic, checksummed file)
//! and [`super::check`] (the consistency rules between the log, its close markers and the release
//! files, checked before the daemon opens the store and by `cloakd store check`), a window closed in
//! the log but without a release file is re-anonymized after a restart from the same records, the
//! same order, the same stored parameters and a seed derived from (stream, window): the identical
//! release. A window with a release file is never released again.
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::StoreError;
use super::ack_journal::{ACKS_FILE, Journal, Verdict, count_records, encode_ack};
use super::record_log::{EntryOutcome, LogEntry, LogPosition, RecordLog, Replayed};
use crate::atomic_file::Step;
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
    /// Bytes of a torn tail cut off the end (invariant 2); 0 after a clean shutdown.
    pub truncated_bytes: u64,
    /// Why the tail was cut, if it was.
    pub truncation_reason: Option<String>,
}

/// How the bytes after the last valid frame end (invariant 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogEnd {
    /// Every byte belongs to a valid frame.
    Clean,
    /// The file ends inside the frame at `offset`: a torn tail, unless a seal vouches for more.
    Torn { offset: u64, reason: String },
    /// The frame at `offset` is damaged.
    Corrupt { offset: u64, rule: String },
}

/// The frames of a log file, read without changing it.
#[derive(Debug, Clone)]
pub struct LogScan {
    /// The valid entries, in file order, with the byte offset of each frame.
    pub entries: Vec<(u64, LogEntry)>,
    /// Length of the valid prefix.
    pub valid_len: u64,
    /// Length of the file.
    pub total_len: u64,
    pub end: LogEnd,
    /// The seal of a clean shutdown, if there is one (invariant 3).
    pub seal: Option<Seal>,
    /// CRC-32 of the whole file.
    pub crc: u32,
    /// The journal of acknowledged batches beside the log ([`super::ack_journal`]).
    pub journal: Journal,
    /// What the journal proves about the log (its invariant 3).
    pub verdict: Verdict,
}

/// The seal written at a clean shutdown: the log's length and the CRC-32 of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    pub len: u64,
    pub crc: u32,
}

const SEAL_MAGIC: &str = "cloakd-log-seal v1";

impl Seal {
    fn encode(&self) -> String {
        format!("{SEAL_MAGIC} {} {:08x}\n", self.len, self.crc)
    }

    fn decode(text: &[u8]) -> Result<Seal, String> {
        let text = std::str::from_utf8(text).map_err(|_| "the seal is not text".to_string())?;
        let mut words = text.trim_end_matches('\n').split(' ');
        let mut parse = || -> Option<Seal> {
            let (m, v) = (words.next()?, words.next()?);
            if format!("{m} {v}") != SEAL_MAGIC {
                return None;
            }
            let len = words.next()?.parse().ok()?;
            let crc = u32::from_str_radix(words.next()?, 16).ok()?;
            words.next().is_none().then_some(Seal { len, crc })
        };
        parse().ok_or_else(|| format!("the seal is not `{SEAL_MAGIC} <length> <crc32 hex>`"))
    }
}

impl LogScan {
    /// What is wrong with the log, if anything (offset in the log, rule): corruption (invariant 2),
    /// or any difference from the seal (invariant 3). A torn tail without a seal is not wrong.
    pub fn problem(&self) -> Option<(u64, String)> {
        self.file_problem().or_else(|| self.lost_problem())
    }

    /// Acknowledged batches the log no longer proves (journal invariant 3), naming what is lost.
    pub fn lost_problem(&self) -> Option<(u64, String)> {
        if let Some(unproven) = &self.verdict.unproven {
            return Some((
                unproven.log_offset,
                format!(
                    "the log no longer holds what was acknowledged from byte {} on ({ACKS_FILE} names acknowledged batches up to byte {}, the log's valid part ends at byte {}): {}; acknowledged data is lost, not a torn tail",
                    unproven.log_offset,
                    unproven.acked_end,
                    self.valid_len,
                    self.verdict.describe_lost()
                ),
            ));
        }
        None
    }

    /// What is wrong with the log's own bytes: corruption (invariant 2) or any difference from the
    /// seal (invariant 3).
    pub fn file_problem(&self) -> Option<(u64, String)> {
        if let LogEnd::Corrupt { offset, rule } = &self.end {
            return Some((*offset, rule.clone()));
        }
        let seal = self.seal?;
        if let LogEnd::Torn { offset, reason } = &self.end {
            return Some((
                *offset,
                format!(
                    "{reason}; the log was sealed at {} bytes by a clean shutdown, so this frame was acknowledged: acknowledged data is lost, not a torn tail",
                    seal.len
                ),
            ));
        }
        if self.total_len != seal.len {
            return Some((
                self.total_len.min(seal.len),
                format!(
                    "the log has {} bytes but was sealed at {} bytes by a clean shutdown: acknowledged data is lost",
                    self.total_len, seal.len
                ),
            ));
        }
        (self.crc != seal.crc).then(|| {
            (
                0,
                format!(
                    "the log's CRC-32 is {:08x} but it was sealed with {:08x} by a clean shutdown: its bytes changed",
                    self.crc, seal.crc
                ),
            )
        })
    }
}

/// File name of the seal of a clean shutdown, beside the log (invariant 3).
pub const SEAL_FILE: &str = "transactions.log.sealed";
/// The seal's temporary file while it is written ([`crate::atomic_file::write_bytes_as`]): a fixed
/// name, since the daemon is alone in its data directory; one left by a crash is replaced by the
/// next seal, and nothing ever reads it.
pub const SEAL_TMP: &str = "transactions.log.sealed.tmp";

/// Reads the log and the seal in `dir` without changing anything; a missing log reads as empty.
/// `Err` only for I/O; a damaged seal is a [`LogEnd::Corrupt`]-like problem reported by
/// [`read_seal`]'s caller.
pub fn scan_log(dir: &Path) -> Result<(LogScan, Option<(u64, String)>), StoreError> {
    let path = dir.join(LOG_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(StoreError::io(&path, "reading the log")(e)),
    };
    let (seal, seal_problem) = match read_seal(dir)? {
        Ok(seal) => (seal, None),
        Err(rule) => (None, Some((0, rule))),
    };
    let journal = read_journal(dir)?;
    Ok((scan_bytes(&bytes, seal, journal), seal_problem))
}

/// The journal of acknowledged batches in `dir` as read ([`Journal::decode`]).
pub fn read_journal(dir: &Path) -> Result<Journal, StoreError> {
    let path = dir.join(ACKS_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(Journal::decode(Some(&bytes))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Journal::decode(None)),
        Err(e) => Err(StoreError::io(
            &path,
            "reading the journal of acknowledged batches",
        )(e)),
    }
}

/// The seal in `dir`, if any; `Ok(Err(rule))` if it is damaged.
pub fn read_seal(dir: &Path) -> Result<Result<Option<Seal>, String>, StoreError> {
    let path = dir.join(SEAL_FILE);
    match std::fs::read(&path) {
        Ok(text) => Ok(Seal::decode(&text).map(Some)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Ok(None)),
        Err(e) => Err(StoreError::io(&path, "reading the seal of the log")(e)),
    }
}

/// Scans `bytes` (a whole log) under `seal` and `journal`.
pub fn scan_bytes(bytes: &[u8], seal: Option<Seal>, journal: Journal) -> LogScan {
    let (entries, valid, end) = decode_frames(bytes);
    let mut crc = flate2::Crc::new();
    crc.update(bytes);
    let verdict = journal.verdict(bytes, valid, &entries);
    LogScan {
        journal,
        verdict,
        entries,
        valid_len: valid,
        total_len: bytes.len() as u64,
        end,
        seal,
        crc: crc.sum(),
    }
}

/// Cuts `file` back to `len` bytes, leaves its cursor there and makes the cut durable: a failed
/// append's partial bytes are gone before the next append (best effort for the callers; what a
/// failure here leaves is cut at the next open).
fn cut_back(file: &mut File, len: u64) -> std::io::Result<()> {
    file.set_len(len)?;
    file.seek(SeekFrom::Start(len))?;
    file.sync_all()
}

/// The open log, positioned at its end.
#[derive(Debug)]
pub struct TransactionLog {
    path: PathBuf,
    file: File,
    /// Length of the durable prefix (everything fsync'd).
    durable_len: u64,
    /// CRC-32 of the durable prefix, for the seal.
    crc: flate2::Crc,
    /// The journal of acknowledged batches, positioned at its end.
    acks: AcksFile,
}

/// The open journal of acknowledged batches ([`super::ack_journal`]).
#[derive(Debug)]
struct AcksFile {
    path: PathBuf,
    file: File,
    durable_len: u64,
}

impl AcksFile {
    /// Opens the journal of `dir` (creating it), cut to `valid_len` bytes.
    fn open(dir: &Path, valid_len: u64) -> Result<AcksFile, StoreError> {
        let path = dir.join(ACKS_FILE);
        let created = !path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(StoreError::io(
                &path,
                "opening the journal of acknowledged batches",
            ))?;
        if created {
            super::sync_dir(dir)?;
        }
        let len = file
            .metadata()
            .map_err(StoreError::io(
                &path,
                "opening the journal of acknowledged batches",
            ))?
            .len();
        if len != valid_len {
            file.set_len(valid_len)
                .and_then(|()| file.sync_all())
                .map_err(StoreError::io(
                    &path,
                    "cutting the torn tail of the journal",
                ))?;
        }
        file.seek(SeekFrom::Start(valid_len))
            .map_err(StoreError::io(&path, "seeking to the end of the journal"))?;
        Ok(AcksFile {
            path,
            file,
            durable_len: valid_len,
        })
    }

    /// Appends one frame and fsyncs it (invariant 1 of the journal); on error cuts it back.
    fn append(&mut self, frame: &[u8]) -> Result<(), StoreError> {
        let result = self
            .file
            .write_all(frame)
            .and_then(|()| self.file.sync_data())
            .map_err(StoreError::io(
                &self.path,
                "appending to the journal of acknowledged batches",
            ));
        match result {
            Ok(()) => {
                self.durable_len += frame.len() as u64;
                Ok(())
            }
            Err(err) => {
                let _ = cut_back(&mut self.file, self.durable_len);
                Err(err)
            }
        }
    }
}

impl TransactionLog {
    /// Opens (creating if needed) the log in `dir` and replays it: refuses corruption and any
    /// difference from the seal, cuts a torn tail (invariants 2, 3) and removes the seal.
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
        let seal = match read_seal(dir)? {
            Ok(seal) => seal,
            Err(rule) => {
                return Err(StoreError::Corrupt {
                    path: dir.join(SEAL_FILE),
                    offset: 0,
                    rule,
                });
            }
        };
        let scan = scan_bytes(&bytes, seal, read_journal(dir)?);
        if let Some((offset, rule)) = scan.problem() {
            return Err(StoreError::Corrupt { path, offset, rule });
        }
        if let Some((offset, rule)) = &scan.journal.corrupt {
            return Err(StoreError::Corrupt {
                path: dir.join(ACKS_FILE),
                offset: *offset,
                rule: rule.clone(),
            });
        }
        let valid = scan.valid_len;
        let total = scan.total_len;
        if seal.is_some() {
            // From here on the log may change: the seal no longer describes it.
            let seal_path = dir.join(SEAL_FILE);
            std::fs::remove_file(&seal_path)
                .map_err(StoreError::io(&seal_path, "removing the seal of the log"))?;
            super::sync_dir(dir)?;
        }
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
            truncation_reason: match scan.end {
                LogEnd::Torn { reason, .. } => Some(reason),
                _ => None,
            },
        };
        let mut crc = flate2::Crc::new();
        crc.update(&bytes[..valid as usize]);
        let mut acks = AcksFile::open(dir, scan.journal.valid_len)?;
        // Adopt what the journal does not name: the whole log of an older version, or a batch
        // durable in the log whose acknowledgement was never written (journal invariant 1).
        let acked_end = scan.journal.acked_end();
        if valid > acked_end {
            let counts = count_records(
                scan.entries
                    .iter()
                    .filter(|(offset, _)| *offset >= acked_end)
                    .map(|(_, e)| e),
            );
            acks.append(&encode_ack(acked_end, valid, crc.sum(), &counts))?;
        }
        metrics::gauge!(catalog::TX_LOG_BYTES).set(valid as f64);
        Ok((
            TransactionLog {
                path,
                file,
                durable_len: valid,
                crc,
                acks,
            },
            scan.entries.into_iter().map(|(_, e)| e).collect(),
            recovery,
        ))
    }

    /// Writes the seal of the log as it is now (invariant 3): only if the file is exactly the
    /// durable prefix this handle wrote. Atomic ([`crate::atomic_file`]: [`SEAL_TMP`], fsync, rename,
    /// directory fsync).
    pub fn seal(&self) -> Result<(), StoreError> {
        let len = self
            .file
            .metadata()
            .map_err(StoreError::io(&self.path, "sealing the log"))?
            .len();
        if len != self.durable_len {
            return Ok(());
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let seal = Seal {
            len,
            crc: self.crc.sum(),
        };
        crate::atomic_file::write_bytes_as(&dir.join(SEAL_FILE), SEAL_TMP, seal.encode().as_bytes())
            .map_err(|e| {
                let action = match e.step {
                    Step::SyncDirectory => "syncing the directory",
                    _ => "writing the seal of the log",
                };
                StoreError::io(&e.path, action)(e.source)
            })
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
        // The batch is durable; it is acknowledged once the journal says so (journal invariant 1).
        let mut journaled = false;
        let result = result.and_then(|()| {
            self.crc.update(&buf);
            journaled = true;
            let end = self.durable_len + buf.len() as u64;
            self.acks.append(&encode_ack(
                self.durable_len,
                end,
                self.crc.sum(),
                &count_records(entries),
            ))
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
                if journaled {
                    // The CRC already took the batch in: recompute it over the durable prefix.
                    self.crc = crc_of_prefix(&self.path, self.durable_len).unwrap_or_default();
                }
                // Best effort: cut the partial batch so the next append starts on a frame boundary.
                // If this fails too, the torn tail is cut at the next open.
                let _ = cut_back(&mut self.file, self.durable_len);
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

/// CRC-32 of the first `len` bytes of the file at `path`.
fn crc_of_prefix(path: &Path, len: u64) -> std::io::Result<flate2::Crc> {
    let mut bytes = Vec::new();
    File::open(path)?.take(len).read_to_end(&mut bytes)?;
    let mut crc = flate2::Crc::new();
    crc.update(&bytes);
    Ok(crc)
}

/// Record ids and closed windows of one stream (invariant 5).
#[derive(Debug, Default)]
struct StreamIndex {
    /// Record id -> window, for every record in the file.
    records: HashMap<String, u64>,
    /// Every window closed in the file.
    closed: std::collections::HashSet<u64>,
    /// The highest of them.
    last_closed: Option<u64>,
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
                self.last_closed = self.last_closed.max(Some(c.window_id));
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

impl Drop for FileState {
    /// The last handle is gone with every append settled: seal the log (invariant 3). A log whose
    /// last append failed (`log` is `None`) is not sealed.
    fn drop(&mut self) {
        if let Some(log) = &self.log
            && let Err(e) = log.seal()
        {
            tracing::warn!(error = %e, "could not seal the transaction log; the next start treats it as after a crash");
        }
    }
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
        let (entries, valid, log_end) = decode_frames(&bytes);
        if let LogEnd::Torn { reason: rule, .. } | LogEnd::Corrupt { rule, .. } = log_end {
            return Err(StoreError::Corrupt {
                path,
                offset: from.0 + valid,
                rule,
            });
        }
        Ok(Replayed {
            entries: entries.into_iter().map(|(_, e)| e).collect(),
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
            offset = recovery.valid_bytes,
            truncated_bytes = recovery.truncated_bytes,
            reason = recovery.truncation_reason.as_deref().unwrap_or(""),
            "cut the torn tail of the transaction log: an incomplete last frame of a batch being written when the daemon stopped without a clean shutdown (no seal); its fsync had not returned, so nothing in it was acknowledged"
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

/// Decodes frames from the start of `bytes`: the entries with their offsets, the length of the
/// valid prefix and how the bytes after it end (invariant 2).
fn decode_frames(bytes: &[u8]) -> (Vec<(u64, LogEntry)>, u64, LogEnd) {
    let mut entries = Vec::new();
    let mut pos = 0usize;
    let end = loop {
        let rest = &bytes[pos..];
        let offset = pos as u64;
        if rest.is_empty() {
            break LogEnd::Clean;
        }
        if rest.len() < FRAME_HEADER {
            break LogEnd::Torn {
                offset,
                reason: format!(
                    "the log ends inside a frame header ({} of {FRAME_HEADER} bytes)",
                    rest.len()
                ),
            };
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len > MAX_ENTRY_BYTES {
            break LogEnd::Corrupt {
                offset,
                rule: format!(
                    "frame length field {len} exceeds the largest entry ({MAX_ENTRY_BYTES} bytes)"
                ),
            };
        }
        if rest.len() < FRAME_HEADER + len {
            if let Some(inner) = complete_frame_within(&rest[FRAME_HEADER..]) {
                break LogEnd::Corrupt {
                    offset,
                    rule: format!(
                        "frame length field {len} reaches past the end of the log, but a complete frame starts inside it at byte {}: the length field is damaged",
                        pos + FRAME_HEADER + inner
                    ),
                };
            }
            break LogEnd::Torn {
                offset,
                reason: format!(
                    "the log ends inside a frame ({} of {len} payload bytes)",
                    rest.len() - FRAME_HEADER
                ),
            };
        }
        match frame_entry(rest, len) {
            Ok(entry) => entries.push((offset, entry)),
            Err(rule) => break LogEnd::Corrupt { offset, rule },
        }
        pos += FRAME_HEADER + len;
    };
    (entries, pos as u64, end)
}

/// The entry of the complete frame at the start of `frame` with payload length `len`.
fn frame_entry(frame: &[u8], len: usize) -> Result<LogEntry, String> {
    let crc = u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let payload = &frame[FRAME_HEADER..FRAME_HEADER + len];
    let mut actual = flate2::Crc::new();
    actual.update(payload);
    if actual.sum() != crc {
        return Err(format!(
            "checksum mismatch: the frame's CRC-32 field is {crc:08x}, its {len} payload bytes give {:08x}",
            actual.sum()
        ));
    }
    LogEntry::decode(payload).map_err(|e| format!("undecodable frame: {e}"))
}

/// Where in `bytes` a complete, valid frame starts, if anywhere: proof that a length field
/// reaching past the end of the file is damaged rather than the header of a short write.
fn complete_frame_within(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len().saturating_sub(FRAME_HEADER)).find(|&at| {
        let rest = &bytes[at..];
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        len > 0 && FRAME_HEADER + len <= rest.len() && frame_entry(rest, len).is_ok()
    })
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
        let acks_path = dir.path().join(ACKS_FILE);
        let first_acks = std::fs::read(&acks_path).unwrap();
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
        let full_acks = std::fs::read(&acks_path).unwrap();
        for cut in durable as usize..=full.len() {
            std::fs::write(dir.path().join(LOG_FILE), &full[..cut]).unwrap();
            if cut < full.len() {
                // The journal names the second batch acknowledged: its cut is lost data.
                std::fs::write(&acks_path, &full_acks).unwrap();
                match TransactionLog::open(dir.path()).unwrap_err() {
                    StoreError::Corrupt { rule, .. } => {
                        assert!(
                            rule.contains("acknowledged data is lost, not a torn tail"),
                            "{rule}"
                        )
                    }
                    e => panic!("{e}"),
                }
            }
            // A crash before the second batch was acknowledged: the journal names only the first.
            std::fs::write(&acks_path, &first_acks).unwrap();
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
    fn a_damaged_complete_frame_is_refused_even_when_last() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _, _) = TransactionLog::open(dir.path()).unwrap();
        log.append(&[record("a", 0, "r1", &["x"])]).unwrap();
        let first_len = log.durable_len();
        log.append(&[record("a", 0, "r2", &["y"])]).unwrap();
        drop(log);
        let path = dir.path().join(LOG_FILE);
        let clean = std::fs::read(&path).unwrap();
        let mut bytes = clean.clone();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
        match TransactionLog::open(dir.path()).unwrap_err() {
            StoreError::Corrupt { offset, rule, .. } => {
                assert_eq!(offset, first_len);
                assert!(rule.contains("checksum"), "{rule}");
            }
            e => panic!("{e}"),
        }
        // Nothing was cut.
        assert_eq!(std::fs::read(&path).unwrap(), bytes);
        // A length field reaching past the end while a whole frame lies inside it is damage.
        let mut bytes = clean.clone();
        bytes[2] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
        match TransactionLog::open(dir.path()).unwrap_err() {
            StoreError::Corrupt { offset, rule, .. } => {
                assert_eq!(offset, 0);
                assert!(rule.contains("length field is damaged"), "{rule}");
            }
            e => panic!("{e}"),
        }
    }

    #[test]
    fn a_sealed_log_refuses_a_cut_tail_and_an_unsealed_one_cuts_it() {
        let dir = tempfile::tempdir().unwrap();
        let (log, _) = FileRecordLog::open(dir.path()).unwrap();
        log.append_blocking(&[record("a", 0, "r1", &["x"]), record("a", 0, "r2", &["y"])])
            .unwrap();
        // A seal's temporary file left by a crash (of this version or an older one) is replaced.
        std::fs::write(dir.path().join(SEAL_TMP), b"half a seal").unwrap();
        drop(log);
        assert!(
            dir.path().join(SEAL_FILE).exists(),
            "a clean drop seals the log"
        );
        assert!(!dir.path().join(SEAL_TMP).exists());
        let path = dir.path().join(LOG_FILE);
        let full = std::fs::read(&path).unwrap();
        let cut = &full[..full.len() - 3];
        std::fs::write(&path, cut).unwrap();
        match FileRecordLog::open(dir.path()).unwrap_err() {
            StoreError::Corrupt { rule, .. } => assert!(rule.contains("acknowledged"), "{rule}"),
            e => panic!("{e}"),
        }
        // Without the seal (a crash), the journal still names the batch acknowledged.
        std::fs::remove_file(dir.path().join(SEAL_FILE)).unwrap();
        match FileRecordLog::open(dir.path()).unwrap_err() {
            StoreError::Corrupt { rule, .. } => {
                assert!(
                    rule.contains("1 acknowledged records lost (1 of window 0 of stream \"a\")"),
                    "{rule}"
                )
            }
            e => panic!("{e}"),
        }
        // Without its acknowledgement (a crash before it was written), the same bytes are a torn
        // tail.
        std::fs::write(dir.path().join(ACKS_FILE), b"").unwrap();
        let (log, recovery) = FileRecordLog::open(dir.path()).unwrap();
        // What is cut is the incomplete last frame: every byte of the file past the valid prefix.
        assert_eq!(
            recovery.truncated_bytes,
            cut.len() as u64 - recovery.valid_bytes
        );
        assert!(!dir.path().join(SEAL_FILE).exists());
        drop(log);
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
            // Every byte was acknowledged: a cut is refused while the journal says so.
            prop_assert_eq!(TransactionLog::open(dir.path()).is_ok(), cut == full.len());
            // Without the journal (an older version's data directory), a prefix of whole entries.
            std::fs::remove_file(dir.path().join(ACKS_FILE)).unwrap();
            let (_, entries, _) = TransactionLog::open(dir.path()).unwrap();
            prop_assert!(entries.len() <= model.len());
            prop_assert_eq!(&entries[..], &model[..entries.len()]);
        }
    }
}
