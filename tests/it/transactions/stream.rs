//! Transaction streams against the real daemon on 127.0.0.1:0 with real tonic clients: publish with
//! durable acks, windows closing by count and by time, subscribe and resume, idempotent re-publish,
//! bad input, NOT_FOUND, RESOURCE_EXHAUSTED, and a restart on the same data directory. Every released
//! window is checked for personalized rho^m-uncertainty by the independent checker.
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cloakd::config::{Config, Mode, StreamSettings};
use cloakd::proto::{ReleasedWindow, Transaction};
use tonic::Code;

use crate::support::TestDaemon;
use crate::support::transactions::{
    check_window, next_windows, publish, random_records, subscribe, transaction,
};

fn settings(window_records: usize, window: Duration) -> StreamSettings {
    StreamSettings {
        rho: 0.5,
        m: 2,
        mode: Mode::Exact,
        window_records,
        window,
    }
}

/// Defaults, a data directory of the test's own, and `streams` configured.
fn config(dir: &std::path::Path, streams: &[(&str, StreamSettings)]) -> Config {
    let mut config = Config::embedded_defaults();
    config.transactions.data_dir = dir.to_path_buf();
    for (name, s) in streams {
        config
            .transactions
            .streams
            .insert(name.to_string(), s.clone());
    }
    config
}

/// Checks that the windows hold exactly the published records (by counts of records) and each is
/// rho-uncertain; returns the published records grouped by acknowledged window.
fn check_windows(
    published: &[Transaction],
    acks: &[cloakd::proto::PublishAck],
    windows: &[ReleasedWindow],
    rho: f64,
    m: usize,
) {
    let by_id: BTreeMap<&str, &Transaction> = published
        .iter()
        .map(|t| (t.record_id.as_str(), t))
        .collect();
    let mut by_window: BTreeMap<u64, Vec<Transaction>> = BTreeMap::new();
    for ack in acks {
        by_window
            .entry(ack.window_id)
            .or_default()
            .push((*by_id[ack.record_id.as_str()]).clone());
    }
    for window in windows {
        let originals = &by_window[&window.window_id];
        check_window(originals, window, rho, m)
            .unwrap_or_else(|e| panic!("window {}: {e}", window.window_id));
        let report = window.report.as_ref().expect("every window has a report");
        assert_eq!(report.records, originals.len() as u64);
        assert_eq!(report.rho, rho);
        assert_eq!(report.m as usize, m);
        assert_eq!(report.mode, "exact");
        // No record ids are released.
        for record in &window.records {
            for item in &record.items {
                assert!(
                    !by_id.contains_key(item.as_str()),
                    "record id {item} leaked"
                );
            }
        }
    }
}

#[tokio::test]
async fn windows_close_by_count_and_release_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start(config(
        dir.path(),
        &[("shop", settings(20, Duration::from_secs(3600)))],
    ))
    .await;
    let records = random_records("shop", "r", 50, 1);
    let outcome = publish(daemon.channel().await, records.clone()).await;
    assert!(outcome.status.is_none(), "{:?}", outcome.status);
    assert_eq!(outcome.acks.len(), 50);
    for (i, ack) in outcome.acks.iter().enumerate() {
        assert_eq!(ack.record_id, records[i].record_id, "acks in order");
        assert_eq!(ack.window_id, (i / 20) as u64);
        assert!(!ack.duplicate);
    }
    let mut feed = subscribe(daemon.channel().await, "shop", 0).await.unwrap();
    let windows = next_windows(&mut feed, 2).await;
    assert_eq!(
        windows.iter().map(|w| w.window_id).collect::<Vec<_>>(),
        [0, 1]
    );
    assert!(windows.iter().all(|w| w.stream == "shop"));
    check_windows(&records, &outcome.acks, &windows, 0.5, 2);
    // Window 2 (10 records) stays open: nothing more arrives until it fills.
    let more = random_records("shop", "more", 10, 2);
    let outcome2 = publish(daemon.channel().await, more.clone()).await;
    assert!(outcome2.acks.iter().all(|a| a.window_id == 2));
    let third = next_windows(&mut feed, 1).await;
    assert_eq!(third[0].window_id, 2);
    let all: Vec<Transaction> = records.iter().chain(&more).cloned().collect();
    let acks: Vec<_> = outcome.acks.iter().chain(&outcome2.acks).cloned().collect();
    check_windows(&all, &acks, &third, 0.5, 2);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn windows_close_by_time_and_unconfigured_streams_get_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), &[]);
    cfg.transactions.defaults = settings(1_000_000, Duration::from_millis(200));
    let daemon = TestDaemon::start(cfg).await;
    // Unknown until its first publish.
    let err = subscribe(daemon.channel().await, "clicks", 0)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("clicks"), "{}", err.message());
    let records = random_records("clicks", "c", 30, 3);
    let outcome = publish(daemon.channel().await, records.clone()).await;
    assert!(outcome.status.is_none(), "{:?}", outcome.status);
    let mut feed = subscribe(daemon.channel().await, "clicks", 0)
        .await
        .unwrap();
    // The window closes by time (its record limit is far away); every record is in some window.
    let mut windows = Vec::new();
    let mut released = 0;
    while released < records.len() {
        let w = next_windows(&mut feed, 1).await.remove(0);
        assert_eq!(w.window_id, windows.len() as u64);
        released += w.records.len();
        windows.push(w);
    }
    assert_eq!(released, records.len());
    check_windows(&records, &outcome.acks, &windows, 0.5, 2);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn subscribers_resume_from_a_window_and_get_live_windows() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start(config(
        dir.path(),
        &[("feed", settings(10, Duration::from_secs(3600)))],
    ))
    .await;
    // Configured streams exist before their first record.
    let mut live = subscribe(daemon.channel().await, "feed", 0).await.unwrap();
    let records = random_records("feed", "f", 30, 4);
    let outcome = publish(daemon.channel().await, records.clone()).await;
    assert_eq!(outcome.acks.len(), 30);
    let from_start = next_windows(&mut live, 3).await;
    assert_eq!(
        from_start.iter().map(|w| w.window_id).collect::<Vec<_>>(),
        [0, 1, 2]
    );
    check_windows(&records, &outcome.acks, &from_start, 0.5, 2);
    // A consumer that reconnects names the window it wants next and gets identical windows.
    let mut resumed = subscribe(daemon.channel().await, "feed", 1).await.unwrap();
    let again = next_windows(&mut resumed, 2).await;
    assert_eq!(again[0], from_start[1]);
    assert_eq!(again[1], from_start[2]);
    // Both keep receiving new windows live.
    let more = random_records("feed", "g", 10, 5);
    publish(daemon.channel().await, more).await;
    assert_eq!(next_windows(&mut live, 1).await[0].window_id, 3);
    assert_eq!(next_windows(&mut resumed, 1).await[0].window_id, 3);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn republished_records_are_acked_with_their_window_and_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = TestDaemon::start(config(
        dir.path(),
        &[("dup", settings(8, Duration::from_secs(3600)))],
    ))
    .await;
    let records = random_records("dup", "d", 6, 6);
    let first = publish(daemon.channel().await, records.clone()).await;
    assert!(first.acks.iter().all(|a| a.window_id == 0 && !a.duplicate));
    // The same ids again (with different items: the stored record wins), interleaved with new ones.
    let mut second_batch: Vec<Transaction> = random_records("dup", "d", 6, 99);
    second_batch.extend(random_records("dup", "n", 2, 7));
    second_batch.push(records[0].clone());
    let second = publish(daemon.channel().await, second_batch).await;
    assert!(second.status.is_none(), "{:?}", second.status);
    let dups: Vec<bool> = second.acks.iter().map(|a| a.duplicate).collect();
    assert_eq!(
        dups,
        [true, true, true, true, true, true, false, false, true]
    );
    assert!(second.acks.iter().all(|a| a.window_id == 0));
    let mut feed = subscribe(daemon.channel().await, "dup", 0).await.unwrap();
    let window = next_windows(&mut feed, 1).await.remove(0);
    assert_eq!(
        window.records.len(),
        8,
        "6 + 2 distinct records, no duplicates"
    );
    let mut published = records.clone();
    published.extend(random_records("dup", "n", 2, 7));
    let acks: Vec<_> = first
        .acks
        .iter()
        .chain(&second.acks[6..8])
        .cloned()
        .collect();
    check_windows(&published, &acks, &[window], 0.5, 2);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_records_end_the_stream_naming_the_field_after_earlier_acks() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), &[]);
    cfg.transactions.max_items_per_record = 4;
    cfg.transactions.max_item_bytes = 8;
    let daemon = TestDaemon::start(cfg).await;
    let good = || transaction("s", "ok1", &["a", "b"], &["b"]);
    let cases = [
        (transaction("", "x", &["a"], &[]), "stream"),
        (transaction("s", "", &["a"], &[]), "record_id"),
        (transaction("s", "x", &[], &[]), "items"),
        (transaction("s", "x", &["a", "b", "a"], &[]), "items[2]"),
        (
            transaction("s", "x", &["a", "b", "c", "d", "e"], &[]),
            "items",
        ),
        (transaction("s", "x", &["a", "123456789"], &[]), "items[1]"),
        (
            transaction("s", "x", &["a"], &["z", "z"]),
            "sensitive_items[1]",
        ),
    ];
    for (bad, field) in cases {
        let outcome = publish(
            daemon.channel().await,
            vec![good(), bad, transaction("s", "after", &["a"], &[])],
        )
        .await;
        assert_eq!(
            outcome.acks.len(),
            1,
            "{field}: the earlier record is acked"
        );
        assert_eq!(outcome.acks[0].record_id, "ok1");
        let status = outcome.status.expect("the stream ends with an error");
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(
            status.message().starts_with(&format!("{field}:")),
            "{field}: {}",
            status.message()
        );
    }
    // The record after a bad one was never accepted; "ok1" was, once.
    let outcome = publish(
        daemon.channel().await,
        vec![
            transaction("s", "after", &["a"], &[]),
            transaction("s", "ok1", &["a"], &[]),
        ],
    )
    .await;
    assert_eq!(
        outcome.acks.iter().map(|a| a.duplicate).collect::<Vec<_>>(),
        [false, true]
    );
    let err = subscribe(daemon.channel().await, "", 0).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("stream:"), "{}", err.message());
    let err = subscribe(daemon.channel().await, "nope", 0)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn too_many_waiting_records_is_resource_exhausted() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), &[]);
    cfg.transactions.max_open_records = 3;
    cfg.transactions.defaults = settings(100, Duration::from_secs(3600));
    let daemon = TestDaemon::start(cfg).await;
    let outcome = publish(daemon.channel().await, random_records("full", "r", 5, 8)).await;
    assert_eq!(outcome.acks.len(), 3);
    let status = outcome.status.unwrap();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert!(
        status.message().contains("max_open_records"),
        "{}",
        status.message()
    );
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_restart_keeps_windows_identical_and_ids_known() {
    let dir = tempfile::tempdir().unwrap();
    let streams = [("keep", settings(10, Duration::from_secs(3600)))];
    let records = random_records("keep", "k", 25, 9);
    let (first_windows, acks) = {
        let daemon = TestDaemon::start(config(dir.path(), &streams)).await;
        let outcome = publish(daemon.channel().await, records.clone()).await;
        let mut feed = subscribe(daemon.channel().await, "keep", 0).await.unwrap();
        let windows = next_windows(&mut feed, 2).await;
        daemon.shutdown().await.unwrap();
        // A graceful shutdown ends the live subscription, naming the window to resume from.
        let status = feed
            .message()
            .await
            .expect_err("subscription ends at shutdown");
        assert_eq!(status.code(), Code::Unavailable);
        assert!(
            status.message().contains("window 2"),
            "{}",
            status.message()
        );
        (windows, outcome.acks)
    };
    let daemon = TestDaemon::start(config(dir.path(), &streams)).await;
    let mut feed = subscribe(daemon.channel().await, "keep", 0).await.unwrap();
    let again = next_windows(&mut feed, 2).await;
    assert_eq!(
        again
            .iter()
            .map(prost::Message::encode_to_vec)
            .collect::<Vec<_>>(),
        first_windows
            .iter()
            .map(prost::Message::encode_to_vec)
            .collect::<Vec<_>>(),
        "windows are byte-identical after a restart"
    );
    // The open window 2 (5 records) survived: re-publishing is a duplicate; 5 more close it.
    let outcome = publish(daemon.channel().await, records[20..].to_vec()).await;
    assert!(outcome.acks.iter().all(|a| a.duplicate && a.window_id == 2));
    let more = random_records("keep", "m", 5, 10);
    let outcome = publish(daemon.channel().await, more.clone()).await;
    assert!(
        outcome
            .acks
            .iter()
            .all(|a| !a.duplicate && a.window_id == 2)
    );
    let third = next_windows(&mut feed, 1).await;
    let all: Vec<Transaction> = records.iter().chain(&more).cloned().collect();
    let all_acks: Vec<_> = acks.iter().chain(&outcome.acks).cloned().collect();
    check_windows(&all, &all_acks, &third, 0.5, 2);
    let ids: BTreeSet<u64> = all_acks.iter().map(|a| a.window_id).collect();
    assert_eq!(ids, BTreeSet::from([0, 1, 2]));
    daemon.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_record_exact_mode_cannot_afford_is_refused_and_its_window_is_still_released() {
    let dir = tempfile::tempdir().unwrap();
    // Exact mode with m = 6: one 60-item record alone has about 56 million adversary antecedents,
    // more than a whole window may have (transactions.max_window_antecedents). Before admission
    // control such a record was acknowledged, and then its whole window failed and was never
    // released.
    let mut huge = settings(2, Duration::from_secs(3600));
    huge.m = 6;
    let daemon = TestDaemon::start(config(dir.path(), &[("huge", huge)])).await;
    let long: Vec<String> = (0..60).map(|i| format!("item{i}")).collect();
    let long: Vec<&str> = long.iter().map(String::as_str).collect();
    let outcome = publish(
        daemon.channel().await,
        vec![
            transaction("huge", "small1", &["a", "b"], &["a"]),
            transaction("huge", "big1", &long, &["item0"]),
        ],
    )
    .await;
    let ids: Vec<&str> = outcome.acks.iter().map(|a| a.record_id.as_str()).collect();
    assert_eq!(ids, ["small1"]);
    let status = outcome.status.expect("the big record is refused");
    assert_eq!(status.code(), Code::InvalidArgument);
    for part in [
        "items:",
        "60 items",
        "m = 6",
        "transactions.max_window_antecedents",
    ] {
        assert!(
            status.message().contains(part),
            "{part}: {}",
            status.message()
        );
    }
    let outcome = publish(
        daemon.channel().await,
        vec![transaction("huge", "small2", &["b", "c"], &[])],
    )
    .await;
    assert!(outcome.status.is_none(), "{:?}", outcome.status);
    // Every acknowledged record is released.
    let mut feed = subscribe(daemon.channel().await, "huge", 0).await.unwrap();
    let window = next_windows(&mut feed, 1).await.remove(0);
    assert_eq!(window.window_id, 0);
    assert_eq!(window.records.len(), 2);
    daemon.shutdown().await.unwrap();
}
