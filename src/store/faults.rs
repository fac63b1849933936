//! Faults injected through the store traits: [`FaultyLog`] and [`FaultyReleases`] wrap any
//! [`RecordLog`] / [`ReleaseStore`] and, on command of their shared [`Faults`] switch, fail or tear
//! their writes the way a full disk, a crash mid-batch or a lost quorum would. Tests of the window
//! manager and the shared store suite use them on every implementation alike; nothing global.
//!
//! Faults stay within each trait's contract, so everything above the seam must survive them:
//! * a **failed** append writes nothing and returns an error;
//! * a **torn** append makes the first half of the batch (rounded up) durable and then returns an
//!   error (contract 2 of [`super::record_log`]: a prefix may be durable, nothing is acknowledged);
//! * a failed release write stores nothing and returns an error.
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::{
    EntryOutcome, LogEntry, LogPosition, RecordLog, ReleaseStore, Replayed, StoreError, Stored,
    WindowOutcome,
};

#[derive(Debug, Default)]
struct Plan {
    fail_appends: bool,
    tear_appends: u32,
    fail_release_writes: bool,
    injected: u64,
}

/// The switch shared by the wrappers it made; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    plan: Arc<Mutex<Plan>>,
}

impl Faults {
    pub fn new() -> Faults {
        Faults::default()
    }

    fn plan(&self) -> std::sync::MutexGuard<'_, Plan> {
        self.plan
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// While `on`, every append fails and writes nothing.
    pub fn fail_appends(&self, on: bool) {
        self.plan().fail_appends = on;
    }

    /// The next `n` appends each make the first half of their batch durable, then fail.
    pub fn tear_next_appends(&self, n: u32) {
        self.plan().tear_appends = n;
    }

    /// While `on`, every release write fails and stores nothing.
    pub fn fail_release_writes(&self, on: bool) {
        self.plan().fail_release_writes = on;
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u64 {
        self.plan().injected
    }

    /// `log` with this switch's faults.
    pub fn record_log<L: RecordLog>(&self, log: L) -> FaultyLog<L> {
        FaultyLog {
            inner: log,
            faults: self.clone(),
        }
    }

    /// `store` with this switch's faults.
    pub fn release_store<R: ReleaseStore>(&self, store: R) -> FaultyReleases<R> {
        FaultyReleases {
            inner: store,
            faults: self.clone(),
        }
    }
}

fn injected(action: &'static str) -> StoreError {
    StoreError::Unavailable {
        action,
        detail: "injected fault: disk full".into(),
    }
}

/// A [`RecordLog`] failing or tearing appends on command.
#[derive(Debug)]
pub struct FaultyLog<L> {
    inner: L,
    faults: Faults,
}

/// What the next append does.
enum AppendFault {
    None,
    Fail,
    Tear,
}

#[async_trait]
impl<L: RecordLog> RecordLog for FaultyLog<L> {
    async fn append(&self, batch: Vec<LogEntry>) -> Result<Vec<EntryOutcome>, StoreError> {
        let fault = {
            let mut plan = self.faults.plan();
            if plan.fail_appends {
                plan.injected += 1;
                AppendFault::Fail
            } else if plan.tear_appends > 0 && !batch.is_empty() {
                plan.tear_appends -= 1;
                plan.injected += 1;
                AppendFault::Tear
            } else {
                AppendFault::None
            }
        };
        match fault {
            AppendFault::None => self.inner.append(batch).await,
            AppendFault::Fail => Err(injected("appending to the record log")),
            AppendFault::Tear => {
                let mut batch = batch;
                batch.truncate(batch.len().div_ceil(2));
                self.inner.append(batch).await?;
                Err(injected("appending to the record log (torn batch)"))
            }
        }
    }

    async fn windows_of(&self, records: &[(&str, &str)]) -> Result<Vec<Option<u64>>, StoreError> {
        self.inner.windows_of(records).await
    }

    async fn replay(&self, from: LogPosition) -> Result<Replayed, StoreError> {
        self.inner.replay(from).await
    }
}

/// A [`ReleaseStore`] failing writes on command.
#[derive(Debug)]
pub struct FaultyReleases<R> {
    inner: R,
    faults: Faults,
}

#[async_trait]
impl<R: ReleaseStore> ReleaseStore for FaultyReleases<R> {
    async fn write_once(
        &self,
        stream: &str,
        window_id: u64,
        outcome: &WindowOutcome,
    ) -> Result<Stored, StoreError> {
        {
            let mut plan = self.faults.plan();
            if plan.fail_release_writes {
                plan.injected += 1;
                return Err(injected("storing a released window"));
            }
        }
        self.inner.write_once(stream, window_id, outcome).await
    }

    async fn read(
        &self,
        stream: &str,
        window_id: u64,
    ) -> Result<Option<WindowOutcome>, StoreError> {
        self.inner.read(stream, window_id).await
    }

    async fn next_unreleased(&self, stream: &str) -> Result<u64, StoreError> {
        self.inner.next_unreleased(stream).await
    }
}
