//! Durable state of the daemon: the transaction record log and the released windows.
//!
//! Two traits are the seam between the window manager and any store: [`RecordLog`], the durable,
//! id-idempotent log of accepted records and window close markers ([`record_log`], with its
//! contract), and [`ReleaseStore`], each closed window's outcome stored once ([`release_store`]).
//! The embedded implementations keep everything in the data directory: [`transaction_log`] is the
//! append-only, checksummed, group-committed log file ([`FileRecordLog`]); [`released_windows`]
//! holds each window's outcome as one atomically written file ([`ReleasedWindows`]); [`lock`] keeps
//! a second daemon off the same directory; [`check`] holds the rules between the log and the release
//! files, checked before the daemon opens them and by `cloakd store check` / `cloakd store repair`. [`faults`] wraps any implementation to fail or tear its
//! writes on command, for tests of everything above the seam.
pub mod ack_journal;
pub mod check;
pub mod faults;
pub mod jetstream;
pub mod lock;
pub mod record_log;
pub mod release_store;
pub mod released_windows;
pub mod transaction_log;

pub use lock::DataDirLock;
pub use record_log::{
    EntryOutcome, LogEntry, LogPosition, RecordLog, Replayed, StoredRecord, WindowClose,
};
pub use release_store::{ReleaseStore, Stored, WindowOutcome};
pub use released_windows::ReleasedWindows;
pub use transaction_log::{FileRecordLog, TransactionLog};

/// A store failure, naming the file and what was being done.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store I/O error on {path} while {action}: {source}")]
    Io {
        path: std::path::PathBuf,
        action: &'static str,
        source: std::io::Error,
    },
    #[error(
        "data directory {} is in use by another cloakd ({}); one daemon per data directory (transactions.data_dir)",
        .dir.display(),
        .holder.map_or_else(|| "pid unknown".to_string(), |pid| format!("pid {pid}"))
    )]
    Locked {
        dir: std::path::PathBuf,
        holder: Option<u32>,
    },
    /// A store that is not a local file (a replicated log, a fault injected in tests) failed.
    #[error("store unavailable while {action}: {detail}")]
    Unavailable {
        action: &'static str,
        detail: String,
    },
    #[error("store file {path} is corrupt at byte {offset}: {rule}")]
    Corrupt {
        path: std::path::PathBuf,
        offset: u64,
        rule: String,
    },
}

impl StoreError {
    pub(crate) fn io(
        path: &std::path::Path,
        action: &'static str,
    ) -> impl FnOnce(std::io::Error) -> StoreError {
        let path = path.to_path_buf();
        move |source| StoreError::Io {
            path,
            action,
            source,
        }
    }
}

/// Runs blocking file work on tokio's blocking pool; a panic in it becomes an I/O error on `path`
/// while `action`.
pub(crate) async fn blocking<T: Send + 'static>(
    path: &std::path::Path,
    action: &'static str,
    work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| StoreError::Io {
            path: path.to_path_buf(),
            action,
            source: std::io::Error::other(e),
        })?
}

/// Fsyncs a directory so that a rename or file creation inside it is durable.
pub(crate) fn sync_dir(dir: &std::path::Path) -> Result<(), StoreError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(StoreError::io(dir, "syncing the directory"))
}

/// File-system-safe name of a stream: lower-case hex of its UTF-8 bytes (any stream name works, and
/// no two streams share a name).
pub fn stream_dir_name(stream: &str) -> String {
    stream.bytes().map(|b| format!("{b:02x}")).collect()
}

/// The stream named by `dir` ([`stream_dir_name`]'s inverse); `None` if it is not one.
pub fn stream_name_of_dir(dir: &str) -> Option<String> {
    if !dir.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..dir.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(dir.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}
