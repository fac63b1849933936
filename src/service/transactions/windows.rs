//! The per-stream window manager: one writer task owning the [`TransactionLog`] and every stream's
//! open window, and one releaser task per stream that anonymizes closed windows in order.
//!
//! # Writer (group commit)
//! The writer takes every [`Append`] command waiting in its queue (up to [`MAX_BATCH`]), decides for
//! each record: a re-published id is answered from the record-id index with its original window; a
//! new record is assigned to its stream's open window; a window reaching `window_records` records, or
//! open for `window` since its first record, gets its close marker. The whole batch is written with
//! one fsync (on a blocking thread; commands arriving meanwhile form the next batch), and only then are
//! the records acknowledged and the closed windows handed to their releasers. If the append fails,
//! every command of the batch is answered UNAVAILABLE and the writer rebuilds its state by replaying
//! the log, exactly as at a restart, so it never acts on anything that is not durable.
//!
//! # Releaser
//! Per stream, windows are released strictly in id order: anonymize (blocking thread), write the
//! outcome atomically ([`ReleasedWindows`]), then advance the stream's `released_upto` watch, which
//! subscribers follow. A window already having an outcome on disk is skipped (it can be queued twice
//! after a replay). A failed write is retried with backoff; nothing is released before it is durable.
//!
//! The releaser ends once its stream's handle is gone (the services and the writer stopped) and its
//! queue is empty, so a graceful shutdown finishes the windows already closed.
//!
//! # Reload
//! The writer follows the live `[transactions]` section. Limits apply from the next batch. A
//! stream's settings (rho, m, mode, window sizes) apply to its open window at once, and the window is
//! closed at once if it is already past its new size or age; in exact mode, if the open window's
//! records would exceed `max_window_antecedents` under the new m, that window keeps its settings
//! until it closes (logged) and the next one takes the new ones. A window already closed keeps the
//! parameters it was closed with (they are in its close marker). A stream section added by a reload
//! creates its stream.
//!
//! # Recovery
//! [`WindowManager::start`] replays the log: rebuilds the record-id index, the open windows (their
//! timers restart) and queues every window closed in the log without an outcome on disk.
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::release::release_window;
use crate::config::{RhoMode, StreamSettings, TransactionsConfig};
use crate::store::{
    LogEntry, ReleasedWindows, StoreError, StoredParams, StoredRecord, TransactionLog, WindowClose,
    WindowOutcome,
};
use crate::telemetry::catalog;

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

/// A closed window handed to its stream's releaser.
#[derive(Debug)]
struct ClosedWindow {
    close: WindowClose,
    records: Vec<StoredRecord>,
    /// When its close became durable (or it was recovered), for the release lag metric.
    closed_at: std::time::Instant,
}

/// Metric handles of one stream (see [`crate::telemetry::catalog`]).
#[derive(Debug, Clone)]
struct StreamMetrics {
    stored: metrics::Counter,
    duplicate: metrics::Counter,
    open_records: metrics::Gauge,
    windows_closed: metrics::Counter,
    windows_released: metrics::Counter,
    windows_failed: metrics::Counter,
    windows_unreleased: metrics::Gauge,
}

impl StreamMetrics {
    fn new(stream: &str) -> StreamMetrics {
        let stream = stream.to_string();
        StreamMetrics {
            stored: metrics::counter!(catalog::TX_RECORDS, "stream" => stream.clone(), "result" => "stored"),
            duplicate: metrics::counter!(catalog::TX_RECORDS, "stream" => stream.clone(), "result" => "duplicate"),
            open_records: metrics::gauge!(catalog::TX_OPEN_RECORDS, "stream" => stream.clone()),
            windows_closed: metrics::counter!(catalog::TX_WINDOWS_CLOSED, "stream" => stream.clone()),
            windows_released: metrics::counter!(catalog::TX_WINDOWS_RELEASED, "stream" => stream.clone()),
            windows_failed: metrics::counter!(catalog::TX_WINDOWS_FAILED, "stream" => stream.clone()),
            windows_unreleased: metrics::gauge!(catalog::TX_WINDOWS_UNRELEASED, "stream" => stream),
        }
    }
}

/// Counts a record refused before it was stored (`reason`: invalid, too_many_open, unavailable).
pub fn count_refused(reason: &'static str) {
    metrics::counter!(catalog::TX_RECORDS_REFUSED, "reason" => reason).increment(1);
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
    pub streams: Arc<Mutex<HashMap<String, Arc<StreamHandle>>>>,
    pub windows: ReleasedWindows,
}

impl WindowManager {
    /// Opens the store under `config.data_dir`, replays it and starts the writer and the releasers.
    /// Must run inside a tokio runtime.
    pub async fn start(
        live: watch::Receiver<Arc<TransactionsConfig>>,
    ) -> Result<WindowManager, StoreError> {
        let config = TransactionsConfig::clone(&live.borrow());
        let dir = config.data_dir.clone();
        let opened = tokio::task::spawn_blocking(move || {
            let windows = ReleasedWindows::open(&dir)?;
            let (log, entries, recovery) = TransactionLog::open(&dir)?;
            Ok::<_, StoreError>((windows, log, entries, recovery))
        })
        .await
        .map_err(|e| StoreError::Io {
            path: config.data_dir.clone(),
            action: "opening the store",
            source: std::io::Error::other(e),
        })??;
        let (windows, log, entries, recovery) = opened;
        if recovery.truncated_bytes > 0 {
            tracing::warn!(
                log = %log.path().display(),
                truncated_bytes = recovery.truncated_bytes,
                reason = recovery.truncation_reason.as_deref().unwrap_or(""),
                "cut the unacknowledged torn tail of the transaction log"
            );
        }
        let streams = Arc::new(Mutex::new(HashMap::new()));
        let (appends, commands) = mpsc::channel(WRITER_QUEUE);
        let mut writer = Writer {
            config,
            live,
            data_dir: PathBuf::new(),
            log: Some(log),
            state: HashMap::new(),
            handles: streams.clone(),
            windows: windows.clone(),
        };
        writer.data_dir = writer.config.data_dir.clone();
        writer.replay(entries)?;
        let configured: Vec<String> = writer.config.streams.keys().cloned().collect();
        for name in configured {
            writer.stream_state(&name)?;
        }
        tokio::spawn(writer.run(commands));
        Ok(WindowManager {
            appends,
            streams,
            windows,
        })
    }

    /// The stream's shared handle, if the stream is configured or has ever been published to.
    pub fn stream(&self, name: &str) -> Option<Arc<StreamHandle>> {
        self.streams
            .lock()
            .ok()
            .and_then(|streams| streams.get(name).cloned())
    }
}

/// In-memory state of one stream, owned by the writer.
#[derive(Debug)]
struct StreamState {
    settings: StreamSettings,
    open_window: u64,
    open_records: Vec<StoredRecord>,
    /// When the open window got its first record.
    opened_at: Option<Instant>,
    /// Exact mode's antecedents of the open window's records (0 in sampled mode).
    open_antecedents: u64,
    /// Closed windows possibly not yet released: id -> number of records.
    closed_pending: BTreeMap<u64, usize>,
    /// Record id -> window id, for every record ever accepted.
    index: HashMap<String, u64>,
    /// Windows below this were released before the last (re)start: their records are not kept.
    released_at_open: u64,
    handle: Arc<StreamHandle>,
    metrics: StreamMetrics,
    /// Reloaded settings waiting for the open window to close (it would exceed the budget).
    deferred: Option<StreamSettings>,
}

impl StreamState {
    /// Records accepted and not yet released.
    fn waiting(&mut self) -> usize {
        let released = *self.handle.released_upto.borrow();
        self.closed_pending = self.closed_pending.split_off(&released);
        self.open_records.len() + self.closed_pending.values().sum::<usize>()
    }

    fn stored_params(&self) -> StoredParams {
        StoredParams {
            rho: self.settings.rho,
            m: self.settings.m,
            sampled: match self.settings.mode {
                RhoMode::Exact => None,
                RhoMode::Sampled { epsilon, delta } => Some((epsilon, delta)),
            },
        }
    }

    /// Closes the open window: returns its close marker and records.
    fn close_window(&mut self, stream: &str) -> ClosedWindow {
        let records = std::mem::take(&mut self.open_records);
        let close = WindowClose {
            stream: stream.to_string(),
            window_id: self.open_window,
            records: records.len() as u64,
            params: self.stored_params(),
        };
        self.closed_pending.insert(self.open_window, records.len());
        if let Some(next) = self.deferred.take() {
            self.settings = next;
        }
        self.open_window += 1;
        self.opened_at = None;
        self.open_antecedents = 0;
        ClosedWindow {
            close,
            records,
            closed_at: std::time::Instant::now(),
        }
    }

    fn deadline(&self) -> Option<Instant> {
        self.opened_at.map(|t| t + self.settings.window)
    }

    /// Takes reloaded settings (see the module doc): at once, or when the open window closes if
    /// its records would not fit `budget` under them.
    fn reconfigure(&mut self, stream: &str, next: StreamSettings, budget: u64) {
        if next == self.settings {
            self.deferred = None;
            return;
        }
        let cost = match next.mode {
            RhoMode::Exact => self.open_records.iter().fold(0u64, |sum, record| {
                sum.saturating_add(crate::transactions::antecedent_count(
                    record.items.len(),
                    next.m,
                ))
            }),
            RhoMode::Sampled { .. } => 0,
        };
        if cost > budget {
            tracing::warn!(
                %stream,
                window_id = self.open_window,
                antecedents = cost,
                "the open window keeps its settings until it closes: its records exceed transactions.max_window_antecedents under the reloaded m"
            );
            self.deferred = Some(next);
            return;
        }
        self.settings = next;
        self.open_antecedents = cost;
        self.deferred = None;
    }

    /// What a record of `items` items costs the open window in exact mode.
    fn antecedents(&self, items: usize) -> u64 {
        match self.settings.mode {
            RhoMode::Exact => crate::transactions::antecedent_count(items, self.settings.m),
            RhoMode::Sampled { .. } => 0,
        }
    }
}

struct Writer {
    config: TransactionsConfig,
    /// The live section; a change is taken by [`Writer::reconfigure`].
    live: watch::Receiver<Arc<TransactionsConfig>>,
    data_dir: PathBuf,
    /// `None` while an append is in flight on a blocking thread, or after a failed replay.
    log: Option<TransactionLog>,
    state: HashMap<String, StreamState>,
    handles: Arc<Mutex<HashMap<String, Arc<StreamHandle>>>>,
    windows: ReleasedWindows,
}

impl Writer {
    /// The state of `name`, creating the stream (handle, releaser) on first use.
    fn stream_state(&mut self, name: &str) -> Result<&mut StreamState, StoreError> {
        if !self.state.contains_key(name) {
            let released = self.windows.next_unreleased(name)?;
            let metrics = StreamMetrics::new(name);
            let handle = {
                let mut handles = self
                    .handles
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
                        tokio::spawn(run_releaser(
                            name.to_string(),
                            self.windows.clone(),
                            handle.released_upto.clone(),
                            closed,
                            metrics.clone(),
                        ));
                        handle
                    })
                    .clone()
            };
            self.state.insert(
                name.to_string(),
                StreamState {
                    settings: self.config.settings_for(name).clone(),
                    open_window: 0,
                    open_records: Vec::new(),
                    opened_at: None,
                    open_antecedents: 0,
                    closed_pending: BTreeMap::new(),
                    index: HashMap::new(),
                    released_at_open: released,
                    handle,
                    metrics,
                    deferred: None,
                },
            );
        }
        self.state.get_mut(name).ok_or_else(|| StoreError::Corrupt {
            path: self.data_dir.clone(),
            offset: 0,
            rule: format!("stream {name:?} vanished"),
        })
    }

    /// Rebuilds every stream's state from the log entries and queues closed, unreleased windows.
    fn replay(&mut self, entries: Vec<LogEntry>) -> Result<(), StoreError> {
        self.state.clear();
        let now = Instant::now();
        for entry in entries {
            match entry {
                LogEntry::Record(record) => {
                    let st = self.stream_state(&record.stream)?;
                    st.index.insert(record.record_id.clone(), record.window_id);
                    if record.window_id != st.open_window {
                        tracing::error!(
                            stream = %record.stream,
                            record_window = record.window_id,
                            open_window = st.open_window,
                            "log record outside its stream's open window; kept in the open window"
                        );
                    }
                    st.opened_at.get_or_insert(now);
                    st.open_antecedents = st
                        .open_antecedents
                        .saturating_add(st.antecedents(record.items.len()));
                    st.open_records.push(record);
                }
                LogEntry::Close(close) => {
                    let st = self.stream_state(&close.stream)?;
                    let records = std::mem::take(&mut st.open_records);
                    st.open_window = close.window_id + 1;
                    st.opened_at = None;
                    if close.window_id >= st.released_at_open {
                        st.closed_pending.insert(close.window_id, records.len());
                        let _ = st.handle.releaser.send(ClosedWindow {
                            close,
                            records,
                            closed_at: std::time::Instant::now(),
                        });
                    }
                }
            }
        }
        for (name, st) in &self.state {
            st.metrics
                .windows_unreleased
                .set(st.closed_pending.len() as f64);
            st.metrics
                .open_records
                .set((st.open_records.len() + st.closed_pending.values().sum::<usize>()) as f64);
            if !st.closed_pending.is_empty() || !st.open_records.is_empty() {
                tracing::info!(
                    stream = %name,
                    windows_to_release = st.closed_pending.len(),
                    open_records = st.open_records.len(),
                    "recovered transaction stream"
                );
            }
        }
        Ok(())
    }

    /// Replays the log from disk after a failed append (the same path as a restart).
    async fn reload(&mut self) -> Result<(), StoreError> {
        let dir = self.data_dir.clone();
        let (log, entries, _) = tokio::task::spawn_blocking(move || TransactionLog::open(&dir))
            .await
            .map_err(|e| StoreError::Io {
                path: self.data_dir.clone(),
                action: "reopening the log",
                source: std::io::Error::other(e),
            })??;
        self.replay(entries)?;
        self.log = Some(log);
        Ok(())
    }

    /// Takes the reloaded section; the `process` that follows closes windows already past their
    /// new size or age.
    fn reconfigure(&mut self) {
        self.config = TransactionsConfig::clone(&self.live.borrow_and_update());
        let budget = self.config.max_window_antecedents;
        for (name, st) in self.state.iter_mut() {
            st.reconfigure(name, self.config.settings_for(name).clone(), budget);
        }
        let added: Vec<String> = self
            .config
            .streams
            .keys()
            .filter(|name| !self.state.contains_key(*name))
            .cloned()
            .collect();
        for name in added {
            if let Err(e) = self.stream_state(&name) {
                tracing::error!(stream = %name, error = %e, "cannot create the reloaded stream");
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.state.values().filter_map(StreamState::deadline).min()
    }

    async fn run(mut self, mut commands: mpsc::Receiver<Append>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            let deadline = self.next_deadline();
            tokio::select! {
                command = commands.recv() => match command {
                    Some(c) => batch.push(c),
                    None => break,
                },
                () = sleep_until_opt(deadline) => {}
                Ok(()) = self.live.changed() => self.reconfigure(),
            }
            while batch.len() < MAX_BATCH {
                match commands.try_recv() {
                    Ok(c) => batch.push(c),
                    Err(_) => break,
                }
            }
            self.process(std::mem::take(&mut batch)).await;
        }
    }

    async fn process(&mut self, batch: Vec<Append>) {
        if self.log.is_none()
            && let Err(e) = self.reload().await
        {
            tracing::error!(error = %e, "transaction store still unavailable");
            for command in batch {
                let _ = command
                    .reply
                    .send(Err(AppendError::Unavailable(e.to_string())));
            }
            return;
        }
        let mut entries = Vec::new();
        let mut replies = Vec::new();
        let mut closed = Vec::new();
        let limit = self.config.max_open_records;
        let budget = self.config.max_window_antecedents;
        for command in batch {
            if !self.state.contains_key(&command.stream)
                && self.state.len() >= self.config.max_streams
            {
                let _ = command.reply.send(Err(AppendError::TooManyStreams {
                    streams: self.state.len(),
                }));
                continue;
            }
            let st = match self.stream_state(&command.stream) {
                Ok(st) => st,
                Err(e) => {
                    let _ = command
                        .reply
                        .send(Err(AppendError::Unavailable(e.to_string())));
                    continue;
                }
            };
            if let Some(&window_id) = st.index.get(&command.record_id) {
                replies.push((
                    command.reply,
                    Appended {
                        window_id,
                        duplicate: true,
                    },
                    st.metrics.clone(),
                ));
                continue;
            }
            let waiting = st.waiting();
            if waiting >= limit {
                count_refused("too_many_open");
                let _ = command.reply.send(Err(AppendError::TooManyOpenRecords {
                    stream: command.stream,
                    waiting,
                    limit,
                }));
                continue;
            }
            let cost = st.antecedents(command.items.len());
            if cost > budget {
                let _ = command.reply.send(Err(AppendError::TooManyAntecedents {
                    items: command.items.len(),
                    m: st.settings.m,
                    antecedents: cost,
                    limit: budget,
                }));
                continue;
            }
            if st.open_antecedents.saturating_add(cost) > budget && !st.open_records.is_empty() {
                // Close before adding: the window stays within exact mode's budget.
                let window = st.close_window(&command.stream);
                entries.push(LogEntry::Close(window.close.clone()));
                closed.push(window);
            }
            st.open_antecedents = st.open_antecedents.saturating_add(cost);
            let record = StoredRecord {
                stream: command.stream,
                window_id: st.open_window,
                record_id: command.record_id,
                items: command.items,
                sensitive_items: command.sensitive_items,
            };
            st.index.insert(record.record_id.clone(), record.window_id);
            st.opened_at.get_or_insert_with(Instant::now);
            replies.push((
                command.reply,
                Appended {
                    window_id: record.window_id,
                    duplicate: false,
                },
                st.metrics.clone(),
            ));
            entries.push(LogEntry::Record(record.clone()));
            let stream = record.stream.clone();
            st.open_records.push(record);
            if st.open_records.len() >= st.settings.window_records {
                let window = st.close_window(&stream);
                entries.push(LogEntry::Close(window.close.clone()));
                closed.push(window);
            }
        }
        let now = Instant::now();
        for (name, st) in self.state.iter_mut() {
            let due = st.deadline().is_some_and(|d| d <= now)
                || st.open_records.len() >= st.settings.window_records;
            if due && !st.open_records.is_empty() {
                let window = st.close_window(name);
                entries.push(LogEntry::Close(window.close.clone()));
                closed.push(window);
            }
        }
        if entries.is_empty() {
            for (reply, appended, metrics) in replies {
                acknowledge(reply, appended, &metrics);
            }
            return;
        }
        let Some(mut log) = self.log.take() else {
            return;
        };
        let (log, result) = match tokio::task::spawn_blocking(move || {
            let result = log.append(&entries);
            (log, result)
        })
        .await
        {
            Ok(done) => done,
            Err(e) => {
                for (reply, _, _) in replies {
                    count_refused("unavailable");
                    let _ = reply.send(Err(AppendError::Unavailable(e.to_string())));
                }
                // The log handle was lost with the panicked task; the next batch reopens it.
                self.state.clear();
                return;
            }
        };
        match result {
            Ok(()) => {
                self.log = Some(log);
                for (reply, appended, metrics) in replies {
                    acknowledge(reply, appended, &metrics);
                }
                for mut window in closed {
                    if let Some(st) = self.state.get(&window.close.stream) {
                        st.metrics.windows_closed.increment(1);
                        st.metrics.windows_unreleased.increment(1.0);
                        window.closed_at = std::time::Instant::now();
                        let _ = st.handle.releaser.send(window);
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "transaction log append failed; nothing of the batch is acknowledged");
                for (reply, _, _) in replies {
                    count_refused("unavailable");
                    let _ = reply.send(Err(AppendError::Unavailable(e.to_string())));
                }
                drop(log);
                if let Err(e) = self.reload().await {
                    tracing::error!(error = %e, "cannot reload the transaction log");
                }
            }
        }
    }
}

/// Acknowledges a durable (or duplicate) record and counts it.
fn acknowledge(
    reply: oneshot::Sender<Result<Appended, AppendError>>,
    appended: Appended,
    metrics: &StreamMetrics,
) {
    if appended.duplicate {
        metrics.duplicate.increment(1);
    } else {
        metrics.stored.increment(1);
        metrics.open_records.increment(1.0);
    }
    let _ = reply.send(Ok(appended));
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Releases the closed windows of `stream` in order (see the module doc).
async fn run_releaser(
    stream: String,
    windows: ReleasedWindows,
    released_upto: watch::Sender<u64>,
    mut closed: mpsc::UnboundedReceiver<ClosedWindow>,
    metrics: StreamMetrics,
) {
    while let Some(window) = closed.recv().await {
        let window_id = window.close.window_id;
        let closed_at = window.closed_at;
        let records = window.records.len();
        let next = *released_upto.borrow();
        if window_id < next {
            continue;
        }
        if window_id > next {
            tracing::error!(%stream, window_id, expected = next, "window closed out of order");
        }
        let outcome = match tokio::task::spawn_blocking(move || {
            release_window(&window.close, &window.records)
        })
        .await
        {
            Ok(outcome) => outcome,
            Err(e) => WindowOutcome::Failed(format!(
                "window {window_id} of stream {stream:?} was not released: the engine panicked: {e}"
            )),
        };
        let failed = matches!(outcome, WindowOutcome::Failed(_));
        if let WindowOutcome::Failed(reason) = &outcome {
            tracing::error!(%stream, window_id, %reason, "window not released");
        }
        let outcome = Arc::new(outcome);
        let mut backoff = Duration::from_millis(100);
        loop {
            let (windows, stream_name, outcome_ref) =
                (windows.clone(), stream.clone(), outcome.clone());
            let written = tokio::task::spawn_blocking(move || {
                if windows.read(&stream_name, window_id)?.is_some() {
                    return Ok(());
                }
                windows.write(&stream_name, window_id, &outcome_ref)
            })
            .await;
            match written {
                Ok(Ok(())) => break,
                Ok(Err(e)) => {
                    tracing::error!(%stream, window_id, error = %e, "cannot store released window; retrying")
                }
                Err(e) => {
                    tracing::error!(%stream, window_id, error = %e, "window store task failed; retrying")
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
        released_upto.send_replace(window_id + 1);
        if failed {
            metrics.windows_failed.increment(1);
        } else {
            metrics.windows_released.increment(1);
        }
        metrics.windows_unreleased.decrement(1.0);
        metrics.open_records.decrement(records as f64);
        metrics::histogram!(catalog::TX_RELEASE_LAG_SECONDS)
            .record(closed_at.elapsed().as_secs_f64());
        tracing::debug!(%stream, window_id, "window released");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::transaction_log::fault_injection;

    fn config(dir: &std::path::Path) -> TransactionsConfig {
        let mut config = crate::config::Config::embedded_defaults().transactions;
        config.data_dir = dir.to_path_buf();
        config.defaults.window_records = 100;
        config
    }

    async fn start(config: TransactionsConfig) -> WindowManager {
        WindowManager::start(watch::channel(Arc::new(config)).1)
            .await
            .unwrap()
    }

    fn closed_params(dir: &std::path::Path) -> Vec<(u64, u64, StoredParams)> {
        let (_, entries, _) = TransactionLog::open(dir).unwrap();
        entries
            .into_iter()
            .filter_map(|e| match e {
                LogEntry::Close(c) => Some((c.window_id, c.records, c.params)),
                LogEntry::Record(_) => None,
            })
            .collect()
    }

    /// A reload applies to the open window (closing it at once when it is past its new size) and
    /// to later ones; a closed window keeps the parameters it was closed with.
    #[tokio::test]
    async fn a_reload_applies_to_the_open_window_and_later_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        cfg.defaults.window_records = 3;
        let (reload, live) = watch::channel(Arc::new(cfg.clone()));
        let manager = WindowManager::start(live).await.unwrap();
        for id in ["a", "b", "c", "d", "e"] {
            append(&manager, id).await.unwrap();
        }
        let mut released = manager.stream("s").unwrap().released_upto.subscribe();
        released.wait_for(|&upto| upto >= 1).await.unwrap();
        // Window 1 holds d and e; at most 2 records from now on, and rho 0.3.
        cfg.defaults.window_records = 2;
        cfg.defaults.rho = 0.3;
        reload.send_replace(Arc::new(cfg.clone()));
        released.wait_for(|&upto| upto >= 2).await.unwrap();
        for id in ["f", "g"] {
            assert_eq!(append(&manager, id).await.unwrap().window_id, 2);
        }
        released.wait_for(|&upto| upto >= 3).await.unwrap();
        let closed: Vec<(u64, u64, f64)> = closed_params(dir.path())
            .into_iter()
            .map(|(window, records, params)| (window, records, params.rho))
            .collect();
        assert_eq!(closed, [(0, 3, 0.5), (1, 2, 0.3), (2, 2, 0.3)]);
        // A stream section added by a reload creates its stream.
        assert!(manager.stream("clicks").is_none());
        let mut clicks = cfg.defaults.clone();
        clicks.rho = 0.2;
        cfg.streams.insert("clicks".into(), clicks);
        reload.send_replace(Arc::new(cfg));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while manager.stream("clicks").is_none() {
            assert!(tokio::time::Instant::now() < deadline, "stream not created");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn append(manager: &WindowManager, id: &str) -> Result<Appended, AppendError> {
        let (reply, receive) = oneshot::channel();
        let command = Append {
            stream: "s".into(),
            record_id: id.into(),
            items: vec!["a".into()],
            sensitive_items: vec![],
            reply,
        };
        manager.appends.send(command).await.unwrap();
        receive.await.unwrap()
    }

    fn logged_ids(dir: &std::path::Path) -> Vec<String> {
        let (_, entries, recovery) = TransactionLog::open(dir).unwrap();
        assert_eq!(recovery.truncated_bytes, 0);
        entries
            .into_iter()
            .filter_map(|e| match e {
                LogEntry::Record(r) => Some(r.record_id),
                LogEntry::Close(_) => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn a_failed_append_acknowledges_nothing_and_the_writer_recovers() {
        let dir = tempfile::tempdir().unwrap();
        let manager = start(config(dir.path())).await;
        let fresh = Appended {
            window_id: 0,
            duplicate: false,
        };
        assert_eq!(append(&manager, "r1").await.unwrap(), fresh);
        fault_injection::set_failing(dir.path(), true);
        let err = append(&manager, "r2").await.unwrap_err();
        assert!(matches!(err, AppendError::Unavailable(_)), "{err}");
        let status = tonic::Status::from(super::super::TransactionsError::Append(err));
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status.message().contains("disk full"),
            "{}",
            status.message()
        );
        assert_eq!(logged_ids(dir.path()), ["r1"]);
        fault_injection::set_failing(dir.path(), false);
        // r2 was never stored: publishing it again stores it; r1 is still known.
        assert_eq!(append(&manager, "r2").await.unwrap(), fresh);
        assert!(append(&manager, "r1").await.unwrap().duplicate);
        assert!(append(&manager, "r2").await.unwrap().duplicate);
        assert_eq!(logged_ids(dir.path()), ["r1", "r2"]);
    }

    #[tokio::test]
    async fn windows_close_by_count_with_a_durable_marker() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = config(dir.path());
        cfg.defaults.window_records = 2;
        let manager = start(cfg).await;
        let mut released = {
            append(&manager, "a").await.unwrap();
            manager.stream("s").unwrap().released_upto.subscribe()
        };
        assert_eq!(append(&manager, "b").await.unwrap().window_id, 0);
        assert_eq!(append(&manager, "c").await.unwrap().window_id, 1);
        released.wait_for(|&upto| upto >= 1).await.unwrap();
        let (_, entries, _) = TransactionLog::open(dir.path()).unwrap();
        let kinds: Vec<&str> = entries
            .iter()
            .map(|e| match e {
                LogEntry::Record(r) => r.record_id.as_str(),
                LogEntry::Close(_) => "close",
            })
            .collect();
        assert_eq!(kinds, ["a", "b", "close", "c"]);
        assert!(manager.windows.read("s", 0).unwrap().is_some());
        assert!(manager.windows.read("s", 1).unwrap().is_none());
    }
}
