//! Durable state of the daemon: the transaction record log and the released windows.
//!
//! [`transaction_log`] is the append-only, checksummed, group-committed log of accepted transaction
//! records and window close markers; [`released_windows`] holds each released (anonymized) window as
//! one atomically written file. Their joint invariants, which give exactly-once release across
//! crashes, are written at the top of [`transaction_log`]. [`lock`] keeps a second daemon off the
//! same data directory.
pub mod lock;
pub mod released_windows;
pub mod transaction_log;

pub use lock::DataDirLock;
pub use released_windows::{ReleasedWindows, WindowOutcome};
pub use transaction_log::{LogEntry, StoredParams, StoredRecord, TransactionLog, WindowClose};

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
