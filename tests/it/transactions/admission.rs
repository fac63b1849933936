//! Exact mode's cost is bounded at admission: a window closes before a record would take it past
//! `transactions.max_window_antecedents`, so every acknowledged record's window is released (each
//! checked by the independent rho-uncertainty checker); a record over the item limit is refused with
//! INVALID_ARGUMENT and the records before it are still released.
use std::collections::BTreeMap;
use std::time::Duration;

use cloakd::config::{Config, Mode, StreamSettings};
use tonic::Code;

use crate::support::TestDaemon;
use crate::support::transactions::{check_window, next_windows, publish, subscribe, transaction};

#[tokio::test]
async fn a_window_closes_before_its_antecedent_budget_is_exceeded() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::embedded_defaults();
    config.transactions.data_dir = dir.path().to_path_buf();
    // 20 items with m = 2: 20 + 190 = 210 antecedents per record; 4 fit a budget of 1000, not 5.
    config.transactions.max_window_antecedents = 1000;
    config.transactions.streams.insert(
        "wide".into(),
        StreamSettings {
            rho: 0.5,
            m: 2,
            mode: Mode::Exact,
            window_records: 1000,
            window: Duration::from_secs(3600),
        },
    );
    let daemon = TestDaemon::start(config).await;
    let items: Vec<Vec<String>> = (0..10)
        .map(|r| (0..20).map(|i| format!("i{}", (r * 7 + i) % 30)).collect())
        .collect();
    let records: Vec<_> = items
        .iter()
        .enumerate()
        .map(|(r, items)| {
            let items: Vec<&str> = items.iter().map(String::as_str).collect();
            transaction("wide", &format!("r{r}"), &items, &[items[0]])
        })
        .collect();
    let outcome = publish(daemon.channel().await, records.clone()).await;
    assert!(outcome.status.is_none(), "{:?}", outcome.status);
    let windows: Vec<u64> = outcome.acks.iter().map(|a| a.window_id).collect();
    assert_eq!(windows, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]);
    let mut feed = subscribe(daemon.channel().await, "wide", 0).await.unwrap();
    let released = next_windows(&mut feed, 2).await;
    let by_window: BTreeMap<u64, Vec<_>> =
        outcome.acks.iter().fold(BTreeMap::new(), |mut map, ack| {
            let record = records
                .iter()
                .find(|r| r.record_id == ack.record_id)
                .unwrap();
            map.entry(ack.window_id).or_default().push(record.clone());
            map
        });
    for window in &released {
        assert_eq!(window.records.len(), 4);
        check_window(&by_window[&window.window_id], window, 0.5, 2).unwrap();
    }
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_record_past_the_item_limit_is_refused_and_the_window_released_on_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::embedded_defaults();
    config.transactions.data_dir = dir.path().to_path_buf();
    // The report's setting: exact, m = 3, a 1 s window.
    config.transactions.defaults.window = Duration::from_millis(1000);
    assert_eq!(config.transactions.defaults.m, 3);
    let daemon = TestDaemon::start(config).await;
    let outcome = publish(
        daemon.channel().await,
        vec![transaction("s", "alice", &["a", "b"], &["a"])],
    )
    .await;
    assert!(outcome.status.is_none(), "{:?}", outcome.status);
    for n in [600, 700, 1000] {
        let items: Vec<String> = (0..n).map(|i| format!("item{i}")).collect();
        let items: Vec<&str> = items.iter().map(String::as_str).collect();
        let outcome = publish(
            daemon.channel().await,
            vec![transaction("s", &format!("big{n}"), &items, &[])],
        )
        .await;
        assert!(outcome.acks.is_empty());
        let status = outcome.status.expect("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(
            status.message().starts_with("items:")
                && status
                    .message()
                    .contains("transactions.max_items_per_record"),
            "{}",
            status.message()
        );
    }
    let mut feed = subscribe(daemon.channel().await, "s", 0).await.unwrap();
    let window = next_windows(&mut feed, 1).await.remove(0);
    assert_eq!(window.records.len(), 1);
    // Shutdown is prompt: nothing is left anonymizing.
    tokio::time::timeout(Duration::from_secs(20), daemon.shutdown())
        .await
        .expect("prompt shutdown")
        .unwrap();
}
