//! The window manager over the store traits, with faults injected through them ([`Faults`]).
use std::time::Duration;

use super::*;
use crate::store::faults::Faults;
use crate::store::{LogEntry, LogPosition, WindowOutcome};

fn config(dir: &std::path::Path) -> TransactionsConfig {
    let mut config = crate::config::Config::embedded_defaults().transactions;
    config.data_dir = dir.to_path_buf();
    config.defaults.window_records = 100;
    config
}

/// A manager over the file stores of `dir`, behind one fault switch; also the log, for inspection.
async fn start(cfg: TransactionsConfig) -> (WindowManager, Faults, Arc<dyn RecordLog>) {
    let dir = cfg.data_dir.clone();
    let (log, _) = FileRecordLog::open(&dir).unwrap();
    let releases = ReleasedWindows::open(&dir).unwrap();
    let faults = Faults::new();
    let log: Arc<dyn RecordLog> = Arc::new(faults.record_log(log));
    let releases = Arc::new(faults.release_store(releases));
    let manager = WindowManager::start_with(cfg, log.clone(), releases, None)
        .await
        .unwrap();
    (manager, faults, log)
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

/// The log's entries: record ids, and "close" for a close marker.
async fn logged(log: &Arc<dyn RecordLog>) -> Vec<String> {
    log.replay(LogPosition::START)
        .await
        .unwrap()
        .entries
        .into_iter()
        .map(|e| match e {
            LogEntry::Record(r) => r.record_id,
            LogEntry::Close(_) => "close".into(),
        })
        .collect()
}

const FRESH: Appended = Appended {
    window_id: 0,
    duplicate: false,
};

#[tokio::test]
async fn a_failed_append_acknowledges_nothing_and_the_writer_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let (manager, faults, log) = start(config(dir.path())).await;
    assert_eq!(append(&manager, "r1").await.unwrap(), FRESH);
    faults.fail_appends(true);
    let err = append(&manager, "r2").await.unwrap_err();
    assert!(matches!(err, AppendError::Unavailable(_)), "{err}");
    // The service maps this error to UNAVAILABLE (`service::transactions` tests); the cause is named.
    assert!(err.to_string().contains("disk full"), "{err}");
    assert_eq!(logged(&log).await, ["r1"]);
    faults.fail_appends(false);
    // r2 was never stored: publishing it again stores it; r1 is still known.
    assert_eq!(append(&manager, "r2").await.unwrap(), FRESH);
    assert!(append(&manager, "r1").await.unwrap().duplicate);
    assert!(append(&manager, "r2").await.unwrap().duplicate);
    assert_eq!(logged(&log).await, ["r1", "r2"]);
}

#[tokio::test]
async fn a_torn_append_acknowledges_nothing_and_keeps_each_id_in_one_window() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.defaults.window_records = 2;
    let (manager, faults, log) = start(cfg).await;
    assert_eq!(append(&manager, "r1").await.unwrap(), FRESH);
    // The batch [r2, close 0] is torn after r2: r2 is durable but not acknowledged.
    faults.tear_next_appends(1);
    let err = append(&manager, "r2").await.unwrap_err();
    assert!(matches!(err, AppendError::Unavailable(_)), "{err}");
    assert_eq!(faults.injected(), 1);
    assert_eq!(logged(&log).await, ["r1", "r2"]);
    // The writer rebuilt its state from the log: r2 is known in window 0, which is full by count
    // and closes before the next record.
    assert_eq!(
        append(&manager, "r2").await.unwrap(),
        Appended {
            window_id: 0,
            duplicate: true
        }
    );
    assert_eq!(append(&manager, "r3").await.unwrap().window_id, 1);
    assert_eq!(append(&manager, "r4").await.unwrap().window_id, 1);
    assert_eq!(
        logged(&log).await,
        ["r1", "r2", "close", "r3", "r4", "close"]
    );
}

#[tokio::test]
async fn windows_close_by_count_with_a_durable_marker() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.defaults.window_records = 2;
    let (manager, _, log) = start(cfg).await;
    let mut released = {
        append(&manager, "a").await.unwrap();
        manager.stream("s").unwrap().released_upto.subscribe()
    };
    assert_eq!(append(&manager, "b").await.unwrap().window_id, 0);
    assert_eq!(append(&manager, "c").await.unwrap().window_id, 1);
    released.wait_for(|&upto| upto >= 1).await.unwrap();
    assert_eq!(logged(&log).await, ["a", "b", "close", "c"]);
    assert!(manager.releases.read("s", 0).await.unwrap().is_some());
    assert!(manager.releases.read("s", 1).await.unwrap().is_none());
}

#[tokio::test]
async fn a_window_is_announced_only_once_its_outcome_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.defaults.window_records = 1;
    let (manager, faults, _) = start(cfg).await;
    faults.fail_release_writes(true);
    assert_eq!(append(&manager, "a").await.unwrap(), FRESH);
    let mut released = manager.stream("s").unwrap().released_upto.subscribe();
    // The releaser retries with backoff; wait until it has failed twice.
    while faults.injected() < 2 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(*released.borrow_and_update(), 0);
    assert_eq!(manager.releases.read("s", 0).await.unwrap(), None);
    faults.fail_release_writes(false);
    released.wait_for(|&upto| upto >= 1).await.unwrap();
    assert!(matches!(
        manager.releases.read("s", 0).await.unwrap(),
        Some(WindowOutcome::Released(_))
    ));
}

#[tokio::test]
async fn a_restart_requeues_closed_windows_without_an_outcome() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.defaults.window_records = 1;
    {
        let (manager, faults, _) = start(cfg.clone()).await;
        faults.fail_release_writes(true);
        assert_eq!(append(&manager, "a").await.unwrap(), FRESH);
        while faults.injected() < 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Same files, no faults: window 0 is closed in the log and released after the restart.
    let (manager, _, _) = start(cfg).await;
    let mut released = manager.stream("s").unwrap().released_upto.subscribe();
    released.wait_for(|&upto| upto >= 1).await.unwrap();
    assert!(manager.releases.read("s", 0).await.unwrap().is_some());
    assert!(append(&manager, "a").await.unwrap().duplicate);
}

async fn append_items(
    manager: &WindowManager,
    stream: &str,
    id: &str,
    items: &[&str],
) -> Result<Appended, AppendError> {
    let (reply, receive) = oneshot::channel();
    let command = Append {
        stream: stream.into(),
        record_id: id.into(),
        items: items.iter().map(|i| i.to_string()).collect(),
        sensitive_items: vec![],
        reply,
    };
    manager.appends.send(command).await.unwrap();
    receive.await.unwrap()
}

/// The log's close markers: (window, records, rho, m).
async fn closes(log: &Arc<dyn RecordLog>) -> Vec<(u64, u64, f64, u32)> {
    log.replay(LogPosition::START)
        .await
        .unwrap()
        .entries
        .into_iter()
        .filter_map(|e| match e {
            LogEntry::Close(c) => Some((c.window_id, c.records, c.params.rho, c.params.m)),
            LogEntry::Record(_) => None,
        })
        .collect()
}

/// A reload applies to the open window (closing it at once when it is past its new size) and to
/// later ones; a window closed before keeps the parameters it was closed with; a stream section
/// added by a reload creates its stream.
#[tokio::test]
async fn a_reload_applies_to_the_open_window_and_later_ones() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.defaults.window_records = 3;
    let (manager, _faults, log) = start(cfg.clone()).await;
    for id in ["a", "b", "c", "d", "e"] {
        append(&manager, id).await.unwrap();
    }
    let mut released = manager.stream("s").unwrap().released_upto.subscribe();
    released.wait_for(|&upto| upto >= 1).await.unwrap();
    // Window 1 holds d and e; at most 2 records from now on, and rho 0.3.
    cfg.defaults.window_records = 2;
    cfg.defaults.rho = 0.3;
    manager
        .reconfigure_handle()
        .send_replace(Arc::new(cfg.clone()));
    released.wait_for(|&upto| upto >= 2).await.unwrap();
    for id in ["f", "g"] {
        assert_eq!(append(&manager, id).await.unwrap().window_id, 2);
    }
    released.wait_for(|&upto| upto >= 3).await.unwrap();
    assert_eq!(
        closes(&log).await,
        [(0, 3, 0.5, 3), (1, 2, 0.3, 3), (2, 2, 0.3, 3)]
    );
    assert_eq!(manager.config().borrow().defaults.rho, 0.3);

    assert!(manager.stream("clicks").is_none());
    let mut clicks = cfg.defaults.clone();
    clicks.rho = 0.2;
    cfg.streams.insert("clicks".into(), clicks);
    manager.reconfigure_handle().send_replace(Arc::new(cfg));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while manager.stream("clicks").is_none() {
        assert!(tokio::time::Instant::now() < deadline, "stream not created");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An open window whose records would exceed the budget under a reloaded m is closed with the m it
/// had; the next window is counted and closed under the new m.
#[tokio::test]
async fn a_reload_past_the_budget_closes_the_open_window_with_its_parameters() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.defaults.m = 1;
    cfg.max_window_antecedents = 20;
    let (manager, _faults, log) = start(cfg.clone()).await;
    let items = ["a", "b", "c", "d"];
    // m = 1: 4 antecedents a record, 12 in the window.
    for id in ["r1", "r2", "r3"] {
        let appended = append_items(&manager, "s", id, &items).await.unwrap();
        assert_eq!(appended.window_id, 0);
    }
    // m = 3: 14 a record; the open window would hold 42 > 20.
    cfg.defaults.m = 3;
    manager.reconfigure_handle().send_replace(Arc::new(cfg));
    let mut released = manager.stream("s").unwrap().released_upto.subscribe();
    released.wait_for(|&upto| upto >= 1).await.unwrap();
    assert_eq!(closes(&log).await, [(0, 3, 0.5, 1)]);
    assert_eq!(
        append_items(&manager, "s", "r4", &items)
            .await
            .unwrap()
            .window_id,
        1
    );
    // 14 + 14 > 20: window 1 closes before r5, under m = 3.
    assert_eq!(
        append_items(&manager, "s", "r5", &items)
            .await
            .unwrap()
            .window_id,
        2
    );
    assert_eq!(closes(&log).await, [(0, 3, 0.5, 1), (1, 1, 0.5, 3)]);
}
