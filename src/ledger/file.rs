//! The ledger's file backend: `budget/budget.ledger` in the daemon's data directory
//! (`transactions.data_dir`), with its own lock (`budget/LOCK`, one daemon per directory) and its
//! hash secret (`budget/hash.key`).
//!
//! # Format
//! A sequence of frames `[len: u32 LE][crc32: u32 LE][payload]`, the store's framing
//! (`crate::store::transaction_log`). Every payload is [`PAYLOAD_BYTES`] long: the user's
//! [`UserHash`] (32 bytes), the window (i64 LE) and the amount spent in it after the charge (f64 LE).
//! A later frame of a user replaces an earlier one.
//!
//! # Invariants
//! 1. **Durable before granted.** A batch's frames are written with one `write` and one
//!    `fdatasync`; only then does [`FileLedger::apply`] return the grants. A failed write or sync
//!    cuts the file back to its last durable length and grants nothing of the batch.
//! 2. **Torn tail, and only that.** A crash during an append can leave the file ending inside a
//!    frame (a short header or a short payload): that last incomplete frame is cut at open and said
//!    so. It was never granted (invariant 1); complete frames of an ungranted batch are kept (the
//!    user is charged for answers never released: never less than spent). Everything else is damage
//!    and refused, naming the file, the byte offset and the rule ([`LedgerError::Damaged`]): a
//!    complete frame whose checksum is wrong (even the last one), a length field other than
//!    [`PAYLOAD_BYTES`], an amount that is not a finite number at least 0.
//! 3. **Compaction.** At open, a file holding entries of past windows or superseded entries is
//!    rewritten with one frame per user of the current window: written to `budget.ledger.tmp`
//!    ([`LEDGER_TMP`]), synced, renamed over the ledger, the directory synced
//!    ([`crate::atomic_file::write_bytes_as`], as the store's files). A crash at any point leaves
//!    either the old or the new file, both complete.
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{Backend, Charge, Charged, KeyedHash, LedgerError, Policy, Spent, UserHash, decide};
use crate::atomic_file::Step;
use crate::store::DataDirLock;

/// The ledger's directory inside the data directory.
pub const DIR: &str = "budget";
/// File name of the ledger inside [`DIR`].
pub const LEDGER_FILE: &str = "budget.ledger";
/// Length of every frame's payload: user hash, window, amount.
pub const PAYLOAD_BYTES: usize = 48;
const HEADER: usize = 8;
const FRAME: usize = HEADER + PAYLOAD_BYTES;

/// The compacted ledger's temporary file (invariant 3): a fixed name, since the ledger is alone in
/// its directory (`budget/LOCK`); one left by a crash is replaced by the next compaction and never
/// read.
pub const LEDGER_TMP: &str = "budget.ledger.tmp";

/// What a failed step of an atomic write ([`crate::atomic_file`]) was doing, in the ledger's
/// words: `writing` the content.
pub(crate) fn atomic_write_action(step: Step, writing: &'static str) -> &'static str {
    match step {
        Step::Create => "creating",
        Step::Write | Step::Sync => writing,
        Step::Rename => "renaming into place",
        Step::SyncDirectory => "syncing the directory",
    }
}

/// Fsyncs a directory so that a rename or file creation inside it is durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), LedgerError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(LedgerError::io(dir, "syncing the directory"))
}

fn frame(user: &UserHash, spent: Spent, out: &mut Vec<u8>) {
    let mut payload = [0u8; PAYLOAD_BYTES];
    payload[..32].copy_from_slice(&user.0);
    payload[32..40].copy_from_slice(&spent.window.to_le_bytes());
    payload[40..48].copy_from_slice(&spent.amount.to_le_bytes());
    let mut crc = flate2::Crc::new();
    crc.update(&payload);
    out.extend_from_slice(&(PAYLOAD_BYTES as u32).to_le_bytes());
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&payload);
}

/// What [`scan`] read from a ledger file.
#[derive(Debug, Default)]
pub struct Scan {
    /// Each user's last entry.
    pub entries: HashMap<UserHash, Spent>,
    /// Frames read.
    pub frames: usize,
    /// Length of the valid prefix.
    pub valid_len: u64,
    /// Bytes of a torn last frame past it (invariant 2).
    pub torn_bytes: u64,
}

/// Reads a ledger file's bytes (invariant 2).
pub fn scan(path: &Path, bytes: &[u8]) -> Result<Scan, LedgerError> {
    let damaged = |offset: usize, rule: String| LedgerError::Damaged {
        path: path.display().to_string().into(),
        offset: offset as u64,
        rule: rule.into(),
    };
    let mut out = Scan::default();
    let mut at = 0usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < HEADER {
            out.torn_bytes = rest.len() as u64;
            break;
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len != PAYLOAD_BYTES {
            return Err(damaged(
                at,
                format!("a frame's length field is {len}, every frame holds {PAYLOAD_BYTES} bytes"),
            ));
        }
        if rest.len() < FRAME {
            out.torn_bytes = rest.len() as u64;
            break;
        }
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let payload = &rest[HEADER..FRAME];
        let mut actual = flate2::Crc::new();
        actual.update(payload);
        if actual.sum() != crc {
            return Err(damaged(
                at,
                "a complete frame fails its CRC-32 (damage, not a torn tail)".into(),
            ));
        }
        let mut user = [0u8; 32];
        user.copy_from_slice(&payload[..32]);
        let mut word = [0u8; 8];
        word.copy_from_slice(&payload[32..40]);
        let window = i64::from_le_bytes(word);
        word.copy_from_slice(&payload[40..48]);
        let amount = f64::from_le_bytes(word);
        if !(amount.is_finite() && amount >= 0.0) {
            return Err(damaged(
                at,
                "an amount spent is not a finite number at least 0".into(),
            ));
        }
        out.entries.insert(UserHash(user), Spent { window, amount });
        out.frames += 1;
        at += FRAME;
    }
    out.valid_len = at as u64;
    Ok(out)
}

/// The file ledger of one data directory.
#[derive(Debug)]
pub struct FileLedger {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    path: PathBuf,
    file: File,
    durable_len: u64,
    entries: HashMap<UserHash, Spent>,
    /// Held while the ledger is open.
    _lock: DataDirLock,
}

/// What [`FileLedger::open`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub users: usize,
    pub torn_bytes: u64,
    pub compacted: bool,
}

impl FileLedger {
    /// Opens (creating it if absent) the ledger under `data_dir/budget/`, with its hash secret.
    /// `now_ms` picks the current window for compaction.
    pub fn open(
        data_dir: &Path,
        policy: Policy,
        now_ms: i64,
    ) -> Result<(FileLedger, KeyedHash, Opened), LedgerError> {
        let dir = data_dir.join(DIR);
        std::fs::create_dir_all(&dir).map_err(LedgerError::io(&dir, "creating the directory"))?;
        let lock = DataDirLock::acquire(&dir).map_err(|e| LedgerError::Io {
            path: dir.display().to_string().into(),
            action: "locking the ledger's directory",
            detail: e.to_string().into(),
        })?;
        let hash = KeyedHash::load_or_create(&dir)?;
        let path = dir.join(LEDGER_FILE);
        let mut bytes = Vec::new();
        match File::open(&path) {
            Ok(mut f) => {
                f.read_to_end(&mut bytes)
                    .map_err(LedgerError::io(&path, "reading"))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(LedgerError::io(&path, "opening")(e)),
        }
        let scan = scan(&path, &bytes)?;
        if scan.torn_bytes > 0 {
            tracing::warn!(
                file = %path.display(),
                offset = scan.valid_len,
                bytes = scan.torn_bytes,
                "the budget ledger ends inside a frame (a torn write of an ungranted batch): cut"
            );
        }
        let window = policy.window(now_ms);
        let live: HashMap<UserHash, Spent> = scan
            .entries
            .into_iter()
            .filter(|(_, s)| s.window >= window)
            .collect();
        let compacted = scan.frames > live.len();
        if compacted {
            let mut out = Vec::with_capacity(live.len() * FRAME);
            for (user, spent) in &live {
                frame(user, *spent, &mut out);
            }
            crate::atomic_file::write_bytes_as(&path, LEDGER_TMP, &out).map_err(|e| {
                LedgerError::io(
                    &e.path,
                    atomic_write_action(e.step, "writing the compacted ledger"),
                )(e.source)
            })?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(LedgerError::io(&path, "opening for appends"))?;
        let durable_len = if compacted {
            (live.len() * FRAME) as u64
        } else {
            scan.valid_len
        };
        // Cut a torn tail (invariant 2) before the first append.
        file.set_len(durable_len)
            .and_then(|()| file.sync_all())
            .map_err(LedgerError::io(&path, "cutting a torn tail"))?;
        if !compacted && durable_len == 0 {
            sync_dir(&dir)?;
        }
        let opened = Opened {
            users: live.len(),
            torn_bytes: scan.torn_bytes,
            compacted,
        };
        let inner = Inner {
            path,
            file,
            durable_len,
            entries: live,
            _lock: lock,
        };
        Ok((
            FileLedger {
                inner: Arc::new(Mutex::new(inner)),
            },
            hash,
            opened,
        ))
    }
}

impl Inner {
    fn apply(&mut self, policy: Policy, batch: &[Charge]) -> Result<Vec<Charged>, LedgerError> {
        let mut staged: HashMap<UserHash, Spent> = HashMap::new();
        let mut answers = Vec::with_capacity(batch.len());
        let mut out = Vec::new();
        for charge in batch {
            let stored = staged
                .get(&charge.user)
                .or_else(|| self.entries.get(&charge.user))
                .copied();
            let (answer, after) = decide(policy, stored, charge);
            if let Some(after) = after {
                staged.insert(charge.user, after);
                frame(&charge.user, after, &mut out);
            }
            answers.push(answer);
        }
        if !out.is_empty() {
            use std::io::{Seek, SeekFrom};
            let written = self
                .file
                .seek(SeekFrom::Start(self.durable_len))
                .and_then(|_| self.file.write_all(&out))
                .and_then(|()| self.file.sync_data());
            if let Err(e) = written {
                // Invariant 1: back to the last durable length; nothing of the batch is granted.
                let _ = self.file.set_len(self.durable_len);
                return Err(LedgerError::io(&self.path, "appending a batch of charges")(
                    e,
                ));
            }
            self.durable_len += out.len() as u64;
            self.entries.extend(staged);
        }
        Ok(answers)
    }
}

/// The file as an asynchronous backend, each commit on tokio's blocking pool: what the tests that
/// need a deterministic batch (one commit of everything queued before a single-threaded runtime
/// yields) run through [`super::Ledger::start`]. The daemon uses [`super::Ledger::start_file`].
#[async_trait]
impl Backend for FileLedger {
    async fn apply(
        &mut self,
        policy: Policy,
        batch: Vec<Charge>,
    ) -> Vec<Result<Charged, LedgerError>> {
        let inner = Arc::clone(&self.inner);
        let size = batch.len();
        let result = tokio::task::spawn_blocking(move || {
            let mut inner = inner.lock().map_err(|_| LedgerError::Stopped)?;
            inner.apply(policy, &batch)
        })
        .await
        .map_err(|_| LedgerError::Stopped)
        .and_then(|r| r);
        match result {
            Ok(answers) => answers.into_iter().map(Ok).collect(),
            Err(e) => vec![Err(e); size],
        }
    }
}

impl FileLedger {
    /// Decides the charges in order and makes every granted one durable, on the calling thread:
    /// the daemon's writer thread ([`super::Ledger::start_file`]), tests and tools.
    pub fn apply_now(&self, policy: Policy, batch: &[Charge]) -> Result<Vec<Charged>, LedgerError> {
        let mut inner = self.inner.lock().map_err(|_| LedgerError::Stopped)?;
        inner.apply(policy, batch)
    }
}
