//! The writer: one task owning every stream's open window, applying the windowing rules
//! ([`crate::transactions::windowing`]) to batches of appends and making each batch durable in the
//! [`RecordLog`] with one append (group commit) before acknowledging anything of it.
//!
//! Per batch: re-published ids are answered with their stored window ([`RecordLog::windows_of`],
//! and ids repeated inside the batch); windows due by time close first; each new record is admitted
//! by the rules (budget close before it, count close after it); the records and close markers are
//! appended; only then are the records acknowledged and the closed windows handed to their
//! releasers. If the append fails, every command of the batch is answered UNAVAILABLE and the state
//! is rebuilt by replaying the log, exactly as at a restart, so the writer never acts on anything
//! that is not durable. If the log reports as duplicate a record the writer took for new (its state
//! was not the log's), that record is answered with its stored window and the state is rebuilt too.
//! With replicas, a record whose stream's open window already has a release while the state was not
//! rebuilt in this batch (a stream just taken over, read when another replica sealed it) is
//! answered UNAVAILABLE (the router sends it again) and the state is rebuilt; only a fresh state
//! behind its releases is refused as an inconsistent store.
//!
//! A reload ([`Writer::reconfigure`]) gives each stream its new settings and rules at once, counting
//! the open window's antecedents anew; the next batch closes an open window already past its new
//! size. If the open window's records would exceed the budget under the new rules, it is closed
//! instead by the next batch with the parameters it had, and the new ones apply from the next
//! window.
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::{Semaphore, mpsc, watch};
use tokio::time::Instant;

use super::metrics::{StreamMetrics, count_refused};
use super::releaser::ClosedWindow;
use super::{Append, AppendError, Appended, MAX_BATCH, Ownership, StreamHandle};
use crate::config::{StreamSettings, TransactionsConfig};
use crate::store::{
    EntryOutcome, LogEntry, LogPosition, RecordLog, ReleaseStore, StoreError, StoredRecord,
    WindowClose,
};
use crate::transactions::Params;
use crate::transactions::windowing::{OpenWindow, OverBudget, WindowRules};

/// In-memory state of one stream, owned by the writer.
#[derive(Debug)]
struct StreamState {
    settings: StreamSettings,
    rules: WindowRules,
    open: OpenWindow<Instant>,
    /// The open window's records, in log order.
    open_records: Vec<StoredRecord>,
    /// Closed windows possibly not yet released: id -> number of records.
    closed_pending: BTreeMap<u64, usize>,
    /// Windows below this were released before the last (re)start: their records are not kept.
    released_at_open: u64,
    handle: Arc<StreamHandle>,
    metrics: StreamMetrics,
    /// Reloaded settings and rules waiting for the open window to close (it would not fit them).
    pending: Option<(StreamSettings, WindowRules)>,
}

impl StreamState {
    /// Records accepted and not yet released.
    fn waiting(&mut self) -> usize {
        let released = *self.handle.released_upto.borrow();
        self.closed_pending = self.closed_pending.split_off(&released);
        self.open_records.len() + self.closed_pending.values().sum::<usize>()
    }

    fn params(&self) -> Params {
        Params {
            rho: self.settings.rho,
            m: self.settings.m,
            mode: self.settings.mode,
        }
    }

    /// Takes reloaded settings and rules: at once, or (when the open window's records exceed the
    /// new budget) once the open window is closed.
    fn reconfigure(&mut self, stream: &str, settings: StreamSettings, rules: WindowRules) {
        if settings == self.settings && rules == self.rules {
            self.pending = None;
            return;
        }
        let antecedents = self.open_records.iter().fold(0u64, |sum, record| {
            sum.saturating_add(rules.antecedents(record.items.len()))
        });
        if self.open.records > 0 && antecedents > rules.max_antecedents {
            tracing::warn!(
                %stream,
                window_id = self.open.id,
                antecedents,
                "the open window is closed with the parameters it had: its records exceed transactions.max_window_antecedents under the reloaded settings"
            );
            self.pending = Some((settings, rules));
            return;
        }
        self.settings = settings;
        self.rules = rules;
        self.open.antecedents = antecedents;
        self.pending = None;
    }

    /// After a reload: closes the open window if it is past its new size, or if it must close
    /// before pending settings apply. The closed id.
    fn close_after_reload(&mut self) -> Option<u64> {
        (self.open.records > 0
            && (self.pending.is_some() || self.open.records >= self.rules.window_records))
            .then(|| self.open.close())
    }

    /// Takes pending settings once the open window is empty (its predecessor was closed, with the
    /// parameters it had).
    fn apply_pending(&mut self) {
        if self.open.records == 0
            && let Some((settings, rules)) = self.pending.take()
        {
            self.settings = settings;
            self.rules = rules;
        }
    }

    /// The window `window_id` the rules just closed: its marker and records.
    fn closed(&mut self, stream: &str, window_id: u64) -> ClosedWindow {
        let records = std::mem::take(&mut self.open_records);
        self.closed_pending.insert(window_id, records.len());
        ClosedWindow {
            close: WindowClose {
                stream: stream.to_string(),
                window_id,
                records: records.len() as u64,
                params: self.params(),
            },
            records,
            closed_at: std::time::Instant::now(),
            recovered: false,
        }
    }
}

/// A command answered once the batch is durable: its entry's index in the batch (`None`: nothing
/// appended for it, a duplicate), and the answer planned.
struct Planned {
    reply: tokio::sync::oneshot::Sender<Result<Appended, AppendError>>,
    entry: Option<usize>,
    appended: Appended,
    metrics: StreamMetrics,
}

pub(super) struct Writer {
    config: TransactionsConfig,
    /// The live section; a change is taken by [`Writer::reconfigure`].
    live: watch::Receiver<Arc<TransactionsConfig>>,
    log: Arc<dyn RecordLog>,
    releases: Arc<dyn ReleaseStore>,
    state: HashMap<String, StreamState>,
    handles: Arc<Mutex<HashMap<String, Arc<StreamHandle>>>>,
    /// The anonymization pool every releaser shares (`transactions.release_workers`).
    release_workers: Arc<Semaphore>,
    /// The state may not be the log's (a failed append or lookup): rebuilt before the next batch.
    stale: bool,
    /// Which streams this writer seals (a cluster's leases); `None`: all of them.
    ownership: Option<Arc<dyn Ownership>>,
}

impl Writer {
    pub fn new(
        live: watch::Receiver<Arc<TransactionsConfig>>,
        log: Arc<dyn RecordLog>,
        releases: Arc<dyn ReleaseStore>,
        handles: Arc<Mutex<HashMap<String, Arc<StreamHandle>>>>,
        release_workers: Arc<Semaphore>,
        ownership: Option<Arc<dyn Ownership>>,
    ) -> Writer {
        let config = TransactionsConfig::clone(&live.borrow());
        Writer {
            release_workers,
            ownership,
            config,
            live,
            log,
            releases,
            state: HashMap::new(),
            handles,
            stale: true,
        }
    }

    /// Replays the log and creates every configured stream: the state at a (re)start.
    pub async fn recover(&mut self) -> Result<(), StoreError> {
        self.replay().await?;
        let configured: Vec<String> = self.config.streams.keys().cloned().collect();
        for name in configured {
            self.stream_state(&name).await?;
        }
        Ok(())
    }

    /// The state of `name`, creating the stream (handle, releaser) on first use.
    async fn stream_state(&mut self, name: &str) -> Result<&mut StreamState, StoreError> {
        if !self.state.contains_key(name) {
            let released = self.releases.next_unreleased(name).await?;
            let metrics = StreamMetrics::new(name);
            let handle = super::stream_handle(
                &self.handles,
                name,
                released,
                &self.release_workers,
                &self.releases,
                &metrics,
            );
            if let Some(ownership) = &self.ownership {
                ownership.contend(name);
            }
            let settings = self.config.settings_for(name).clone();
            let rules = rules_for(&settings, &self.config);
            self.state.insert(
                name.to_string(),
                StreamState {
                    settings,
                    rules,
                    open: OpenWindow::new(0),
                    open_records: Vec::new(),
                    closed_pending: BTreeMap::new(),
                    released_at_open: released,
                    handle,
                    metrics,
                    pending: None,
                },
            );
        }
        self.state
            .get_mut(name)
            .ok_or_else(|| StoreError::Unavailable {
                action: "creating a stream",
                detail: format!("stream {name:?} vanished"),
            })
    }

    /// Rebuilds every stream's state from the log and queues closed, unreleased windows.
    async fn replay(&mut self) -> Result<(), StoreError> {
        self.stale = true;
        self.state.clear();
        let replayed = self.log.replay(LogPosition::START).await?;
        let now = Instant::now();
        for entry in replayed.entries {
            match entry {
                LogEntry::Record(record) => {
                    let st = self.stream_state(&record.stream).await?;
                    if record.window_id != st.open.id {
                        tracing::error!(
                            stream = %record.stream,
                            record_window = record.window_id,
                            open_window = st.open.id,
                            "log record outside its stream's open window; kept in the open window"
                        );
                    }
                    st.open.replay_record(&st.rules, record.items.len(), now);
                    st.open_records.push(record);
                }
                LogEntry::Close(close) => {
                    let writes = self.writes(&close.stream);
                    let st = self.stream_state(&close.stream).await?;
                    let records = std::mem::take(&mut st.open_records);
                    st.open = OpenWindow::new(close.window_id + 1);
                    // Another replica seals and releases what this one does not write.
                    if close.window_id >= st.released_at_open && writes {
                        st.closed_pending.insert(close.window_id, records.len());
                        let _ = st.handle.releaser.send(ClosedWindow {
                            close,
                            records,
                            closed_at: std::time::Instant::now(),
                            recovered: true,
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
        self.stale = false;
        Ok(())
    }

    /// Takes the reloaded section: new settings and rules for every stream, and the streams of
    /// sections it added. The `process` that follows closes what is due under them.
    async fn reconfigure(&mut self) {
        self.config = TransactionsConfig::clone(&self.live.borrow_and_update());
        for (name, st) in self.state.iter_mut() {
            let settings = self.config.settings_for(name).clone();
            let rules = rules_for(&settings, &self.config);
            st.reconfigure(name, settings, rules);
        }
        let added: Vec<String> = self
            .config
            .streams
            .keys()
            .filter(|name| !self.state.contains_key(*name))
            .cloned()
            .collect();
        for name in added {
            if let Err(e) = self.stream_state(&name).await {
                tracing::error!(stream = %name, error = %e, "cannot create the reloaded stream");
            }
        }
    }

    /// Whether this replica seals `stream`'s windows now.
    fn writes(&self, stream: &str) -> bool {
        self.ownership.as_ref().is_none_or(|o| o.writes(stream))
    }

    fn next_deadline(&self) -> Option<Instant> {
        self.state
            .iter()
            .filter(|(name, _)| self.writes(name))
            .filter_map(|(_, st)| st.open.deadline(&st.rules))
            .min()
    }

    pub async fn run(mut self, mut commands: mpsc::Receiver<Append>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        let mut leases = self.ownership.as_ref().map(|o| o.changes());
        loop {
            let deadline = self.next_deadline();
            tokio::select! {
                command = commands.recv() => match command {
                    Some(c) => batch.push(c),
                    None => break,
                },
                () = sleep_until_opt(deadline) => {}
                Ok(()) = self.live.changed() => self.reconfigure().await,
                // A stream taken over: its state is rebuilt from the log (what the previous writer
                // appended), and its closed, unreleased windows are queued, before anything else.
                () = changed_opt(&mut leases) => self.stale = true,
            }
            while batch.len() < MAX_BATCH {
                match commands.try_recv() {
                    Ok(c) => batch.push(c),
                    Err(_) => break,
                }
            }
            // A stream taken over while a command was picked above is rebuilt before it is written.
            if let Some(rx) = leases.as_mut()
                && rx.has_changed().unwrap_or(false)
            {
                rx.borrow_and_update();
                self.stale = true;
            }
            self.process(std::mem::take(&mut batch)).await;
        }
    }

    async fn process(&mut self, batch: Vec<Append>) {
        let replayed = self.stale;
        if self.stale
            && let Err(e) = self.replay().await
        {
            tracing::error!(error = %e, "transaction store still unavailable");
            refuse_all(batch, &e);
            return;
        }
        let keys: Vec<(&str, &str)> = batch
            .iter()
            .map(|c| (c.stream.as_str(), c.record_id.as_str()))
            .collect();
        let stored = match self.log.windows_of(&keys).await {
            Ok(stored) if stored.len() == batch.len() => stored,
            Ok(_) => {
                let e = StoreError::Unavailable {
                    action: "looking up record ids",
                    detail: "the log answered for a different number of records".into(),
                };
                refuse_all(batch, &e);
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot look up record ids");
                self.stale = true;
                refuse_all(batch, &e);
                return;
            }
        };
        let now = Instant::now();
        let mut entries = Vec::new();
        let mut planned = Vec::new();
        let mut closed = Vec::new();
        // Windows due by time close before this batch's records arrive.
        let ownership = self.ownership.clone();
        for (name, st) in self.state.iter_mut() {
            if ownership.as_ref().is_some_and(|o| !o.writes(name)) {
                continue;
            }
            let due = st
                .open
                .close_if_due(&st.rules, now)
                .or_else(|| st.close_after_reload());
            if let Some(window_id) = due {
                let window = st.closed(name, window_id);
                entries.push(LogEntry::Close(window.close.clone()));
                closed.push(window);
            }
            st.apply_pending();
        }
        let limit = self.config.max_open_records;
        // Ids placed by this batch: (stream, record id) -> window.
        let mut placed: HashMap<(String, String), u64> = HashMap::new();
        // A stream's state found behind its releases without a replay in this batch.
        let mut behind = false;
        for (command, stored) in batch.into_iter().zip(stored) {
            if !self.state.contains_key(&command.stream)
                && self.state.len() >= self.config.max_streams
            {
                let _ = command.reply.send(Err(AppendError::TooManyStreams {
                    streams: self.state.len(),
                }));
                continue;
            }
            if !self.writes(&command.stream) {
                count_refused("not_writer");
                let _ = command.reply.send(Err(AppendError::NotWriter {
                    stream: command.stream,
                }));
                continue;
            }
            let st = match self.stream_state(&command.stream).await {
                Ok(st) => st,
                Err(e) => {
                    let _ = command
                        .reply
                        .send(Err(AppendError::Unavailable(e.to_string())));
                    continue;
                }
            };
            let key = (command.stream, command.record_id);
            if let Some(window_id) = stored.or_else(|| placed.get(&key).copied()) {
                planned.push(Planned {
                    reply: command.reply,
                    entry: None,
                    appended: Appended {
                        window_id,
                        duplicate: true,
                    },
                    metrics: st.metrics.clone(),
                });
                continue;
            }
            let (stream, record_id) = key;
            let released = *st.handle.released_upto.borrow();
            if st.open.id < released && ownership.is_some() && !replayed {
                // With replicas, a stream this writer has just taken over may still have the state
                // it last read, behind what the previous holder appended and released: rebuild it
                // from the log before judging the store (the record waits and is sent again).
                behind = true;
                count_refused("unavailable");
                let _ = command.reply.send(Err(AppendError::Unavailable(format!(
                    "this replica's view of stream {} is behind its releases; rebuilding it from the log",
                    crate::text::quote(&stream)
                ))));
                continue;
            }
            if st.open.id < released {
                count_refused("window_released");
                tracing::error!(
                    %stream,
                    window_id = st.open.id,
                    released_upto = released,
                    "refused a record: the open window already has a release (the store is inconsistent)"
                );
                let _ = command.reply.send(Err(AppendError::WindowReleased {
                    stream,
                    window_id: st.open.id,
                }));
                continue;
            }
            let waiting = st.waiting();
            if waiting >= limit {
                count_refused("too_many_open");
                let _ = command.reply.send(Err(AppendError::TooManyOpenRecords {
                    stream,
                    waiting,
                    limit,
                }));
                continue;
            }
            let placement = match st.open.admit(&st.rules, command.items.len(), now) {
                Ok(placement) => placement,
                Err(OverBudget { antecedents, limit }) => {
                    let _ = command.reply.send(Err(AppendError::TooManyAntecedents {
                        items: command.items.len(),
                        m: st.settings.m,
                        antecedents,
                        limit,
                    }));
                    continue;
                }
            };
            if let Some(window_id) = placement.closed_before {
                let window = st.closed(&stream, window_id);
                entries.push(LogEntry::Close(window.close.clone()));
                closed.push(window);
            }
            let record = StoredRecord {
                stream,
                window_id: placement.window_id,
                record_id,
                items: command.items,
                sensitive_items: command.sensitive_items,
            };
            placed.insert(
                (record.stream.clone(), record.record_id.clone()),
                record.window_id,
            );
            planned.push(Planned {
                reply: command.reply,
                entry: Some(entries.len()),
                appended: Appended {
                    window_id: record.window_id,
                    duplicate: false,
                },
                metrics: st.metrics.clone(),
            });
            entries.push(LogEntry::Record(record.clone()));
            let stream = record.stream.clone();
            st.open_records.push(record);
            if let Some(window_id) = placement.closed_after {
                let window = st.closed(&stream, window_id);
                entries.push(LogEntry::Close(window.close.clone()));
                closed.push(window);
            }
        }
        if behind {
            self.stale = true;
        }
        if entries.is_empty() {
            for p in planned {
                acknowledge(p.reply, p.appended, &p.metrics);
            }
            return;
        }
        let appended = entries.len();
        let outcomes = match self.log.append(entries).await {
            Ok(outcomes) if outcomes.len() == appended => outcomes,
            result => {
                let e = match result {
                    Err(e) => e,
                    Ok(_) => StoreError::Unavailable {
                        action: "appending to the record log",
                        detail: "the log answered for a different number of entries".into(),
                    },
                };
                tracing::error!(error = %e, "transaction log append failed; nothing of the batch is acknowledged");
                for p in planned {
                    count_refused("unavailable");
                    let _ = p.reply.send(Err(AppendError::Unavailable(e.to_string())));
                }
                if let Err(e) = self.replay().await {
                    tracing::error!(error = %e, "cannot reload the transaction log");
                }
                return;
            }
        };
        let mut foreign = 0usize;
        for mut p in planned {
            if let Some(EntryOutcome::Duplicate { window_id }) = p.entry.map(|i| outcomes[i]) {
                foreign += 1;
                p.appended = Appended {
                    window_id,
                    duplicate: true,
                };
            }
            acknowledge(p.reply, p.appended, &p.metrics);
        }
        for mut window in closed {
            if let Some(st) = self.state.get(&window.close.stream) {
                st.metrics.windows_closed.increment(1);
                st.metrics.windows_unreleased.increment(1.0);
                window.closed_at = std::time::Instant::now();
                let _ = st.handle.releaser.send(window);
            }
        }
        if foreign > 0 || outcomes.iter().any(|o| *o != EntryOutcome::Appended) {
            tracing::error!(
                duplicates = foreign,
                "the record log already held entries this writer took for new; rebuilding the state from the log"
            );
            if let Err(e) = self.replay().await {
                tracing::error!(error = %e, "cannot reload the transaction log");
            }
        }
    }
}

/// The windowing rules of a stream with `settings` under `config`'s budget.
fn rules_for(settings: &StreamSettings, config: &TransactionsConfig) -> WindowRules {
    WindowRules {
        window_records: settings.window_records,
        window: settings.window,
        m: settings.m,
        mode: settings.mode,
        max_antecedents: config.max_window_antecedents,
    }
}

/// Answers every command of `batch` UNAVAILABLE.
fn refuse_all(batch: Vec<Append>, error: &StoreError) {
    for command in batch {
        count_refused("unavailable");
        let _ = command
            .reply
            .send(Err(AppendError::Unavailable(error.to_string())));
    }
}

/// Acknowledges a durable (or duplicate) record and counts it.
fn acknowledge(
    reply: tokio::sync::oneshot::Sender<Result<Appended, AppendError>>,
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

/// Resolves when `changes` (if any) changes; never if there is none or its sender is gone.
async fn changed_opt(changes: &mut Option<watch::Receiver<u64>>) {
    if let Some(rx) = changes
        && rx.changed().await.is_ok()
    {
        return;
    }
    std::future::pending().await
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
