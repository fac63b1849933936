//! The per-stream window manager, over the store traits ([`RecordLog`], [`ReleaseStore`]): one
//! writer task ([`writer`]) owning every stream's open window and making batches of records and
//! close markers durable with one append (group commit), and one releaser task per stream
//! ([`releaser`]) that anonymizes closed windows in order and stores each outcome once.
//!
//! # Reload
//! The writer follows the live `[transactions]` section ([`WindowManager::reconfigure_handle`]).
//! Limits apply from the next batch. A stream's settings (rho, m, mode, window sizes) apply to its
//! open window at once, and the window is closed at once if it is already past its new size or age;
//! in exact mode, if the open window's records would exceed `max_window_antecedents` under the new
//! rules, that window keeps its settings until it closes (logged) and the next one takes the new
//! ones. A window already closed keeps the parameters it was closed with (they are in its close
//! marker). A stream section added by a reload creates its stream.
//!
//! # Recovery
//! [`WindowManager::start_with`] replays the log: rebuilds the open windows (their timers restart)
//! and queues every window closed in the log without a stored outcome. The same replay rebuilds the
//! writer's state after a failed append.
mod metrics;
pub mod pipeline;
pub mod release_window;
mod releaser;
pub mod replicas;
#[cfg(test)]
mod tests;
mod writer;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Semaphore, mpsc, oneshot, watch};

use crate::config::TransactionsConfig;
use crate::store::{FileRecordLog, RecordLog, ReleaseStore, ReleasedWindows, StoreError};
pub use metrics::count_refused;
use releaser::ClosedWindow;

/// Most commands written with one fsync.
pub const MAX_BATCH: usize = 4096;
/// Depth of the writer's command queue (a Publish stream finding it full ends with
/// RESOURCE_EXHAUSTED; readers never wait on it).
pub const WRITER_QUEUE: usize = 65_536;

/// Why an append was not acknowledged.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AppendError {
    #[error(
        "stream {stream:?} has {waiting} records waiting for release; the limit (transactions.max_open_records) is {limit}"
    )]
    TooManyOpenRecords {
        stream: String,
        waiting: usize,
        limit: usize,
    },
    #[error(
        "stream: {streams} streams exist, the limit transactions.max_streams; publish to an existing stream"
    )]
    TooManyStreams { streams: usize },
    #[error(
        "items: a record of {items} items has {antecedents} adversary antecedents with m = {m}, more than a whole window may have (transactions.max_window_antecedents = {limit}); send fewer items or use a sampled-mode stream"
    )]
    TooManyAntecedents {
        items: usize,
        m: u32,
        antecedents: u64,
        limit: u64,
    },
    #[error("transaction store unavailable, record not stored durably: {0}")]
    Unavailable(String),
    /// The stream's windows are sealed by another replica now (its lease moved); nothing stored.
    #[error(
        "stream {stream:?} is being taken over by another replica; the record was not stored, publish it again"
    )]
    NotWriter { stream: String },
    /// No replica took the record within `cluster.failover_wait_ms` (the one sealing its stream
    /// stopped answering and the lease did not move in time, or its store stayed unavailable);
    /// not acknowledged.
    #[error(
        "stream {stream:?}: no replica took the record within {waited_ms} ms (cluster.failover_wait_ms; {detail}); it was not acknowledged: publish it again (had it been stored after all, it is then acknowledged as a duplicate in its window)"
    )]
    NoWriter {
        stream: String,
        waited_ms: u64,
        detail: String,
    },
    /// The stream's open window already has a release: the store is inconsistent (a log lost or
    /// cut under its release files). Nothing is acknowledged into a released window.
    #[error(
        "window {window_id} of stream {stream:?} already has a release; the record was not stored (the transaction store is inconsistent: the operator must run `cloakd store check`)"
    )]
    WindowReleased { stream: String, window_id: u64 },
    /// The replica that seals the stream's windows refused the record (forwarded there).
    #[error("{message}")]
    Forwarded {
        kind: ForwardedKind,
        message: String,
    },
}

/// How a replica that seals a stream refused a forwarded record, for the status the producer gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardedKind {
    /// A limit (RESOURCE_EXHAUSTED).
    Exhausted,
    /// The record cannot be stored as it is (INVALID_ARGUMENT).
    Invalid,
    /// Try again (UNAVAILABLE).
    Unavailable,
}

impl AppendError {
    /// The class of this refusal, as a forwarded refusal carries it.
    pub fn kind(&self) -> ForwardedKind {
        match self {
            AppendError::TooManyOpenRecords { .. } | AppendError::TooManyStreams { .. } => {
                ForwardedKind::Exhausted
            }
            AppendError::TooManyAntecedents { .. } => ForwardedKind::Invalid,
            AppendError::Unavailable(_)
            | AppendError::NotWriter { .. }
            | AppendError::NoWriter { .. }
            | AppendError::WindowReleased { .. } => ForwardedKind::Unavailable,
            AppendError::Forwarded { kind, .. } => *kind,
        }
    }
}

/// Which streams this replica seals (in a cluster, the streams whose lease it holds). Standalone
/// there is none and the writer seals every stream.
pub trait Ownership: Send + Sync + std::fmt::Debug {
    /// Whether this replica seals `stream`'s windows now.
    fn writes(&self, stream: &str) -> bool;
    /// Starts contending for `stream` (idempotent).
    fn contend(&self, stream: &str);
    /// Changes whenever this replica gains or loses a stream.
    fn changes(&self) -> watch::Receiver<u64>;
}

/// The acknowledgement of an appended (or already present) record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub window_id: u64,
    pub duplicate: bool,
}

/// A validated record to append.
#[derive(Debug)]
pub struct Append {
    pub stream: String,
    pub record_id: String,
    pub items: Vec<String>,
    pub sensitive_items: Vec<String>,
    pub reply: oneshot::Sender<Result<Appended, AppendError>>,
}

impl Append {
    /// The validated record `t`, to be answered on `reply`.
    pub fn of(
        t: crate::proto::Transaction,
        reply: oneshot::Sender<Result<Appended, AppendError>>,
    ) -> Append {
        Append {
            stream: t.stream,
            record_id: t.record_id,
            items: t.items,
            sensitive_items: t.sensitive_items,
            reply,
        }
    }
}

/// What subscribers and publishers share about one stream.
#[derive(Debug)]
pub struct StreamHandle {
    /// Windows with id below this have an outcome on disk.
    pub released_upto: watch::Sender<u64>,
    releaser: mpsc::UnboundedSender<ClosedWindow>,
}

/// Handle to the running window manager.
#[derive(Debug, Clone)]
pub struct WindowManager {
    pub appends: mpsc::Sender<Append>,
    /// The `[transactions]` section in force; the writer follows it.
    config: Arc<watch::Sender<Arc<TransactionsConfig>>>,
    pub streams: Arc<Mutex<HashMap<String, Arc<StreamHandle>>>>,
    pub releases: Arc<dyn ReleaseStore>,
    /// The anonymization pool every releaser shares (`transactions.release_workers`).
    release_workers: Arc<Semaphore>,
}

/// `name`'s shared handle, created (with its releaser task) on first use; `released`: windows
/// below it already have an outcome.
fn stream_handle(
    handles: &Mutex<HashMap<String, Arc<StreamHandle>>>,
    name: &str,
    released: u64,
    release_workers: &Arc<Semaphore>,
    releases: &Arc<dyn ReleaseStore>,
    metrics: &metrics::StreamMetrics,
) -> Arc<StreamHandle> {
    let mut handles = handles
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    handles
        .entry(name.to_string())
        .or_insert_with(|| {
            let (releaser, closed) = mpsc::unbounded_channel();
            let (released_upto, _) = watch::channel(released);
            let handle = Arc::new(StreamHandle {
                released_upto,
                releaser,
            });
            tokio::spawn(releaser::run_releaser(
                name.to_string(),
                Arc::clone(release_workers),
                releases.clone(),
                handle.released_upto.clone(),
                closed,
                metrics.clone(),
            ));
            handle
        })
        .clone()
}

impl WindowManager {
    /// Opens the file stores under `config.data_dir` and starts over them ([`Self::start_with`]).
    pub async fn start(config: TransactionsConfig) -> Result<WindowManager, StoreError> {
        let dir = config.data_dir.clone();
        let (log, releases) =
            crate::store::blocking(&config.data_dir, "opening the store", move || {
                // The daemon's start and `cloakd store check` share this one check.
                let report = crate::store::check::check_data_dir(&dir)?;
                if let Some(refusal) = report.refusal() {
                    return Err(refusal);
                }
                for note in &report.notes {
                    tracing::warn!(file = %note.path.display(), offset = note.offset, "{}", note.rule);
                }
                let releases = ReleasedWindows::open(&dir)?;
                let (log, _recovery) = FileRecordLog::open(&dir)?;
                Ok((log, releases))
            })
            .await?;
        WindowManager::start_with(config, Arc::new(log), Arc::new(releases), None).await
    }

    /// Replays `log` and starts the writer and the releasers over `log` and `releases`; with
    /// `ownership`, the writer seals only the streams it says (see [`Ownership`]). Must run inside a
    /// tokio runtime.
    pub async fn start_with(
        config: TransactionsConfig,
        log: Arc<dyn RecordLog>,
        releases: Arc<dyn ReleaseStore>,
        ownership: Option<Arc<dyn Ownership>>,
    ) -> Result<WindowManager, StoreError> {
        let streams = Arc::new(Mutex::new(HashMap::new()));
        let (appends, commands) = mpsc::channel(WRITER_QUEUE);
        let release_workers = Arc::new(Semaphore::new(config.release_workers.max(1)));
        let (reconfigure, live) = watch::channel(Arc::new(config));
        let mut writer = writer::Writer::new(
            live,
            log,
            releases.clone(),
            streams.clone(),
            Arc::clone(&release_workers),
            ownership,
        );
        writer.recover().await?;
        tokio::spawn(writer.run(commands));
        Ok(WindowManager {
            appends,
            config: Arc::new(reconfigure),
            streams,
            releases,
            release_workers,
        })
    }

    /// `name`'s handle, created if needed (a stream another replica writes, subscribed to here):
    /// its releases are announced as they are stored, whoever stores them.
    pub async fn adopt(&self, name: &str) -> Result<Arc<StreamHandle>, StoreError> {
        if let Some(handle) = self.stream(name) {
            return Ok(handle);
        }
        let released = self.releases.next_unreleased(name).await?;
        Ok(stream_handle(
            &self.streams,
            name,
            released,
            &self.release_workers,
            &self.releases,
            &metrics::StreamMetrics::new(name),
        ))
    }

    /// The `[transactions]` section in force, followed as it changes.
    pub fn config(&self) -> watch::Receiver<Arc<TransactionsConfig>> {
        self.config.subscribe()
    }

    /// Where a reload puts a new `[transactions]` section (the caller checked that only reloadable
    /// keys changed). Holds neither the writer nor the stores alive.
    pub fn reconfigure_handle(&self) -> Arc<watch::Sender<Arc<TransactionsConfig>>> {
        Arc::clone(&self.config)
    }

    /// The stream's shared handle, if the stream is configured or has ever been published to.
    pub fn stream(&self, name: &str) -> Option<Arc<StreamHandle>> {
        self.streams
            .lock()
            .ok()
            .and_then(|streams| streams.get(name).cloned())
    }
}
