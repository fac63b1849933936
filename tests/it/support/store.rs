//! The store suite: the contract of [`RecordLog`] and [`ReleaseStore`] checked the same way against
//! every implementation. An implementation's test file supplies a [`Stores`] opener (opening the
//! same underlying store again is a restart) and instantiates [`store_suite!`] with it.
//!
//! Faults (failed and torn appends, failed release writes) are injected through the traits with
//! [`Faults`], never inside an implementation.
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use cloakd::store::faults::Faults;
use cloakd::store::{
    EntryOutcome, LogEntry, LogPosition, RecordLog, ReleaseStore, Stored, StoredRecord,
    WindowClose, WindowOutcome,
};
use cloakd::transactions::{Mode, Params};
use proptest::prelude::*;

/// The two stores of one deployment.
pub struct Opened {
    pub log: Arc<dyn RecordLog>,
    pub releases: Arc<dyn ReleaseStore>,
}

/// One deployment of the stores under test.
pub trait Stores: Send + Sync + 'static {
    /// Opens the deployment's stores; each call opens the same underlying stores anew (a restart).
    fn open(&self) -> Pin<Box<dyn Future<Output = Opened> + Send + '_>>;

    /// Another deployment, empty and independent of this one (on the same servers, if any).
    fn another(&self) -> Self
    where
        Self: Sized;
}

pub fn record(stream: &str, window_id: u64, id: &str, items: &[&str]) -> LogEntry {
    LogEntry::Record(StoredRecord {
        stream: stream.into(),
        window_id,
        record_id: id.into(),
        items: items.iter().map(|s| s.to_string()).collect(),
        sensitive_items: vec!["s".into()],
    })
}

pub fn close(stream: &str, window_id: u64, records: u64) -> LogEntry {
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

/// A log's entries as the contract orders them: each stream's in append order (the order across
/// streams inside one batch is the implementation's).
pub type PerStream = std::collections::BTreeMap<String, Vec<LogEntry>>;

pub fn per_stream(entries: impl IntoIterator<Item = LogEntry>) -> PerStream {
    let mut streams = PerStream::new();
    for entry in entries {
        streams
            .entry(entry.stream().to_string())
            .or_default()
            .push(entry);
    }
    streams
}

async fn entries(log: &Arc<dyn RecordLog>) -> PerStream {
    per_stream(log.replay(LogPosition::START).await.unwrap().entries)
}

/// One test per check of the suite, each over a fresh deployment: `$fresh` is a future of a
/// [`Stores`] value, in the test file of an implementation.
#[macro_export]
macro_rules! store_suite {
    ($fresh:expr) => {
        #[tokio::test]
        async fn append_and_replay() {
            $crate::support::store::append_and_replay(&$fresh.await).await;
        }
        #[tokio::test]
        async fn ids_are_idempotent() {
            $crate::support::store::ids_are_idempotent(&$fresh.await).await;
        }
        #[tokio::test]
        async fn failed_and_torn_appends_acknowledge_nothing() {
            $crate::support::store::failed_and_torn_appends_acknowledge_nothing(&$fresh.await)
                .await;
        }
        #[tokio::test]
        async fn releases_are_stored_once() {
            $crate::support::store::releases_are_stored_once(&$fresh.await).await;
        }
        #[tokio::test]
        async fn failed_release_writes_store_nothing() {
            $crate::support::store::failed_release_writes_store_nothing(&$fresh.await).await;
        }
        #[tokio::test]
        async fn log_matches_model() {
            let base = $fresh.await;
            // The model test drives its own runtime, on a thread of its own.
            std::thread::spawn(move || {
                $crate::support::store::log_matches_model(move || base.another())
            })
            .join()
            .unwrap();
        }
    };
}

/// Appended batches replay in order, from the start and from a returned position, also after a
/// restart.
pub async fn append_and_replay(stores: &dyn Stores) {
    let Opened { log, .. } = stores.open().await;
    assert!(entries(&log).await.is_empty());
    let batch1 = vec![
        record("a", 0, "r1", &["x", "y"]),
        record("b", 0, "r1", &["z"]),
    ];
    let batch2 = vec![close("a", 0, 1), record("a", 1, "r2", &["é", "w"])];
    let outcomes = log.append(batch1.clone()).await.unwrap();
    assert_eq!(outcomes, [EntryOutcome::Appended; 2]);
    let first = log.replay(LogPosition::START).await.unwrap();
    assert_eq!(per_stream(first.entries), per_stream(batch1.clone()));
    log.append(batch2.clone()).await.unwrap();
    let rest = log.replay(first.next).await.unwrap();
    assert_eq!(per_stream(rest.entries), per_stream(batch2.clone()));
    assert!(log.replay(rest.next).await.unwrap().entries.is_empty());
    assert_eq!(log.append(vec![]).await.unwrap(), []);
    drop(log);
    let Opened { log, .. } = stores.open().await;
    assert_eq!(entries(&log).await, per_stream([batch1, batch2].concat()));
}

/// A record id or a window close already in the log is reported duplicate and not appended again,
/// from the same batch, a later one, or after a restart; ids are per stream.
pub async fn ids_are_idempotent(stores: &dyn Stores) {
    let Opened { log, .. } = stores.open().await;
    let outcomes = log
        .append(vec![
            record("s", 0, "r1", &["x"]),
            record("s", 0, "r1", &["other"]),
            record("t", 4, "r1", &["x"]),
            close("s", 0, 1),
        ])
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [
            EntryOutcome::Appended,
            EntryOutcome::Duplicate { window_id: 0 },
            EntryOutcome::Appended,
            EntryOutcome::Appended,
        ]
    );
    drop(log);
    let Opened { log, .. } = stores.open().await;
    let outcomes = log
        .append(vec![
            record("s", 1, "r1", &["x"]),
            close("s", 0, 1),
            record("s", 1, "r2", &["y"]),
        ])
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        [
            EntryOutcome::Duplicate { window_id: 0 },
            EntryOutcome::Duplicate { window_id: 0 },
            EntryOutcome::Appended,
        ]
    );
    assert_eq!(
        log.windows_of(&[
            ("s", "r1"),
            ("s", "r2"),
            ("t", "r1"),
            ("t", "r2"),
            ("u", "r1")
        ])
        .await
        .unwrap(),
        [Some(0), Some(1), Some(4), None, None]
    );
    assert_eq!(
        entries(&log).await,
        per_stream([
            record("s", 0, "r1", &["x"]),
            record("t", 4, "r1", &["x"]),
            close("s", 0, 1),
            record("s", 1, "r2", &["y"]),
        ])
    );
}

/// A failed append leaves the log as it was; a torn one leaves a prefix of its batch; neither
/// disturbs what was there, and appending goes on afterwards.
pub async fn failed_and_torn_appends_acknowledge_nothing(stores: &dyn Stores) {
    let Opened { log, .. } = stores.open().await;
    let faults = Faults::new();
    let faulty: Arc<dyn RecordLog> = Arc::new(faults.record_log(log.clone()));
    faulty
        .append(vec![record("s", 0, "r1", &["x"])])
        .await
        .unwrap();
    faults.fail_appends(true);
    let err = faulty
        .append(vec![record("s", 0, "r2", &["x"])])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("disk full"), "{err}");
    faults.fail_appends(false);
    assert_eq!(
        entries(&faulty).await,
        per_stream([record("s", 0, "r1", &["x"])])
    );
    faults.tear_next_appends(1);
    let torn = vec![
        record("s", 0, "r2", &["x"]),
        record("s", 0, "r3", &["y"]),
        close("s", 0, 3),
        record("s", 1, "r4", &["z"]),
    ];
    assert!(faulty.append(torn.clone()).await.is_err());
    assert_eq!(faults.injected(), 2);
    let expected = [vec![record("s", 0, "r1", &["x"])], torn[..2].to_vec()].concat();
    assert_eq!(entries(&faulty).await, per_stream(expected));
    // The unacknowledged prefix is durable: appending the batch again stores only the rest.
    let outcomes = faulty.append(torn.clone()).await.unwrap();
    assert_eq!(
        outcomes,
        [
            EntryOutcome::Duplicate { window_id: 0 },
            EntryOutcome::Duplicate { window_id: 0 },
            EntryOutcome::Appended,
            EntryOutcome::Appended,
        ]
    );
    drop((faulty, log));
    let Opened { log, .. } = stores.open().await;
    assert_eq!(
        entries(&log).await,
        per_stream([vec![record("s", 0, "r1", &["x"])], torn].concat())
    );
}

/// A window's outcome is stored once: a second write stores nothing and the first stands, before
/// and after a restart; `next_unreleased` is one past the highest stored window.
pub async fn releases_are_stored_once(stores: &dyn Stores) {
    let Opened { releases, .. } = stores.open().await;
    assert_eq!(releases.next_unreleased("s/1").await.unwrap(), 0);
    assert_eq!(releases.read("s/1", 0).await.unwrap(), None);
    let first = WindowOutcome::Released(vec![1, 2, 3]);
    let failed = WindowOutcome::Failed("cannot be made rho-uncertain".into());
    assert_eq!(
        releases.write_once("s/1", 0, &first).await.unwrap(),
        Stored::Written
    );
    assert_eq!(
        releases.write_once("s/1", 1, &failed).await.unwrap(),
        Stored::Written
    );
    let other = WindowOutcome::Released(vec![9]);
    assert_eq!(
        releases.write_once("s/1", 0, &other).await.unwrap(),
        Stored::Already
    );
    assert_eq!(
        releases.write_once("s/1", 1, &other).await.unwrap(),
        Stored::Already
    );
    assert_eq!(releases.next_unreleased("s/1").await.unwrap(), 2);
    assert_eq!(releases.next_unreleased("other").await.unwrap(), 0);
    drop(releases);
    let Opened { releases, .. } = stores.open().await;
    assert_eq!(releases.read("s/1", 0).await.unwrap(), Some(first));
    assert_eq!(releases.read("s/1", 1).await.unwrap(), Some(failed));
    assert_eq!(releases.read("s/1", 2).await.unwrap(), None);
    assert_eq!(releases.next_unreleased("s/1").await.unwrap(), 2);
}

/// A failed release write stores nothing; the window can be written afterwards.
pub async fn failed_release_writes_store_nothing(stores: &dyn Stores) {
    let Opened { releases, .. } = stores.open().await;
    let faults = Faults::new();
    let faulty = faults.release_store(releases);
    faults.fail_release_writes(true);
    let outcome = WindowOutcome::Released(vec![7]);
    assert!(faulty.write_once("f", 0, &outcome).await.is_err());
    assert_eq!(faulty.read("f", 0).await.unwrap(), None);
    assert_eq!(faulty.next_unreleased("f").await.unwrap(), 0);
    faults.fail_release_writes(false);
    assert_eq!(
        faulty.write_once("f", 0, &outcome).await.unwrap(),
        Stored::Written
    );
    assert_eq!(faulty.read("f", 0).await.unwrap(), Some(outcome));
}

/// One step of the model test.
#[derive(Debug, Clone)]
enum Step {
    Append(Vec<LogEntry>),
    Fail(Vec<LogEntry>),
    Tear(Vec<LogEntry>),
    Restart,
}

fn arb_entry() -> impl Strategy<Value = LogEntry> {
    let name = "[a-b]{1,2}";
    prop_oneof![
        4 => (name, 0u64..4, "[a-d]{1,2}", prop::collection::vec("[x-z]{1,3}", 0..3)).prop_map(
            |(stream, window_id, id, items)| {
                let items: Vec<&str> = items.iter().map(String::as_str).collect();
                record(&stream, window_id, &id, &items)
            }
        ),
        1 => (name, 0u64..4, 0u64..9).prop_map(|(stream, window_id, records)| close(
            &stream, window_id, records
        )),
    ]
}

fn arb_step() -> impl Strategy<Value = Step> {
    let batch = || prop::collection::vec(arb_entry(), 0..5);
    prop_oneof![
        6 => batch().prop_map(Step::Append),
        1 => batch().prop_map(Step::Fail),
        1 => batch().prop_map(Step::Tear),
        1 => Just(Step::Restart),
    ]
}

/// The model of a log: its entries, the window of every (stream, record id) and every closed
/// (stream, window).
#[derive(Debug, Default)]
struct Model {
    entries: Vec<LogEntry>,
    records: HashMap<(String, String), u64>,
    closed: std::collections::HashSet<(String, u64)>,
}

impl Model {
    /// Appends `batch` as the contract says; returns the outcomes.
    fn append(&mut self, batch: &[LogEntry]) -> Vec<EntryOutcome> {
        batch
            .iter()
            .map(|entry| match entry {
                LogEntry::Record(r) => {
                    let key = (r.stream.clone(), r.record_id.clone());
                    if let Some(&window_id) = self.records.get(&key) {
                        return EntryOutcome::Duplicate { window_id };
                    }
                    self.records.insert(key, r.window_id);
                    self.entries.push(entry.clone());
                    EntryOutcome::Appended
                }
                LogEntry::Close(c) => {
                    if !self.closed.insert((c.stream.clone(), c.window_id)) {
                        return EntryOutcome::Duplicate {
                            window_id: c.window_id,
                        };
                    }
                    self.entries.push(entry.clone());
                    EntryOutcome::Appended
                }
            })
            .collect()
    }
}

/// Model test: random appends, failed and torn appends and restarts; the log's outcomes and replay
/// always equal the model's. Each case runs on a fresh deployment made by `fresh`.
pub fn log_matches_model<S: Stores>(fresh: impl Fn() -> S) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let config = ProptestConfig::with_cases(48);
    proptest!(config, |(steps in prop::collection::vec(arb_step(), 1..12))| {
        let stores = fresh();
        runtime.block_on(async {
            let faults = Faults::new();
            let open = |opened: Opened| -> Arc<dyn RecordLog> { Arc::new(faults.record_log(opened.log)) };
            let mut log = open(stores.open().await);
            let mut model = Model::default();
            for step in steps {
                match step {
                    Step::Append(batch) => {
                        let expected = model.append(&batch);
                        let outcomes = log.append(batch).await.unwrap();
                        assert_eq!(outcomes, expected);
                    }
                    Step::Fail(batch) => {
                        faults.fail_appends(true);
                        assert!(log.append(batch).await.is_err());
                        faults.fail_appends(false);
                    }
                    Step::Tear(batch) => {
                        faults.tear_next_appends(1);
                        let result = log.append(batch.clone()).await;
                        faults.tear_next_appends(0);
                        if !batch.is_empty() {
                            assert!(result.is_err());
                            model.append(&batch[..batch.len().div_ceil(2)]);
                        }
                    }
                    Step::Restart => {
                        drop(log);
                        log = open(stores.open().await);
                    }
                }
                assert_eq!(entries(&log).await, per_stream(model.entries.clone()));
            }
        });
    });
}
