//! Shared by the transaction stream tests: producer and consumer clients, a seeded record generator,
//! and an independent brute-force checker of personalized rho^m-uncertainty on a released window.
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cloakd::proto::release_feed_client::ReleaseFeedClient;
use cloakd::proto::transaction_ingest_client::TransactionIngestClient;
use cloakd::proto::{PublishAck, ReleaseSubscription, ReleasedWindow, Transaction};
use rand::{Rng, SeedableRng};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// Upper bound on waiting for anything the daemon should do promptly (liveness, not timing).
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A transaction of `stream`.
pub fn transaction(stream: &str, id: &str, items: &[&str], sensitive: &[&str]) -> Transaction {
    Transaction {
        stream: stream.into(),
        record_id: id.into(),
        items: items.iter().map(|s| s.to_string()).collect(),
        sensitive_items: sensitive.iter().map(|s| s.to_string()).collect(),
    }
}

/// `n` seeded random records over a small vocabulary (so that sensitive rules have support), ids
/// `{prefix}{i}`. Each record holds 1..=5 of items i0..i7; sensitive items are drawn from i0..i3
/// ("personalized+": the first items tend to be sensitive).
pub fn random_records(stream: &str, prefix: &str, n: usize, seed: u64) -> Vec<Transaction> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let len = rng.random_range(1..=5);
            let mut items = BTreeSet::new();
            while items.len() < len {
                items.insert(format!("i{}", rng.random_range(0..8)));
            }
            let sensitive: BTreeSet<String> = (0..4)
                .filter(|_| rng.random_bool(0.5))
                .map(|k| format!("i{k}"))
                .collect();
            Transaction {
                stream: stream.into(),
                record_id: format!("{prefix}{i}"),
                items: items.into_iter().collect(),
                sensitive_items: sensitive.into_iter().collect(),
            }
        })
        .collect()
}

/// What one Publish stream returned: the acks, and the status it ended with (None: clean end).
#[derive(Debug)]
pub struct PublishOutcome {
    pub acks: Vec<PublishAck>,
    pub status: Option<tonic::Status>,
}

/// Publishes `records` on one stream and reads every ack until the server ends the stream.
pub async fn publish(channel: Channel, records: Vec<Transaction>) -> PublishOutcome {
    let mut client = TransactionIngestClient::new(channel);
    let mut acks = Vec::new();
    let response = match client.publish(tokio_stream::iter(records)).await {
        Ok(r) => r,
        Err(status) => {
            return PublishOutcome {
                acks,
                status: Some(status),
            };
        }
    };
    let mut inbound = response.into_inner();
    loop {
        match tokio::time::timeout(PATIENCE, inbound.next()).await {
            Ok(Some(Ok(ack))) => acks.push(ack),
            Ok(Some(Err(status))) => {
                return PublishOutcome {
                    acks,
                    status: Some(status),
                };
            }
            Ok(None) => return PublishOutcome { acks, status: None },
            Err(_) => panic!("no ack within {PATIENCE:?}"),
        }
    }
}

/// Subscribes to `stream` from `from_window`.
pub async fn subscribe(
    channel: Channel,
    stream: &str,
    from_window: u64,
) -> Result<tonic::Streaming<ReleasedWindow>, tonic::Status> {
    let mut client = ReleaseFeedClient::new(channel);
    client
        .subscribe(ReleaseSubscription {
            stream: stream.into(),
            from_window,
        })
        .await
        .map(|r| r.into_inner())
}

/// Reads the next `n` windows of a subscription.
pub async fn next_windows(
    feed: &mut tonic::Streaming<ReleasedWindow>,
    n: usize,
) -> Vec<ReleasedWindow> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(PATIENCE, feed.next()).await {
            Ok(Some(Ok(w))) => out.push(w),
            Ok(Some(Err(status))) => panic!("subscription failed: {status}"),
            Ok(None) => panic!("subscription ended after {} windows", out.len()),
            Err(_) => panic!("no window within {PATIENCE:?} (got {})", out.len()),
        }
    }
    out
}

/// Independent check of personalized rho^m-uncertainty of one released window.
///
/// `originals` are the window's records as published (items D_u, sensitive items E_u); `released`
/// the released records (shuffled, without ids). Supports are counted over the released multiset, Q
/// ranges over the ORIGINAL items: for every u, every Q ⊆ D_u with 1 <= |Q| <= m and every
/// e ∈ E_u \ Q, supp'(Q ∪ {e}) <= rho · supp'(Q) or supp'(Q) = 0 (supports over the released
/// multiset need no matching of released to original records). Also checks, as necessary conditions
/// of "suppression only", that the record count is unchanged, no item is released more often than it
/// was published, and every released record is a subset of some published record.
pub fn check_window(
    originals: &[Transaction],
    released: &ReleasedWindow,
    rho: f64,
    m: usize,
) -> Result<(), String> {
    let released_sets: Vec<BTreeSet<&str>> = released
        .records
        .iter()
        .map(|r| r.items.iter().map(String::as_str).collect())
        .collect();
    if released_sets.len() != originals.len() {
        return Err(format!(
            "{} records released for {} published",
            released_sets.len(),
            originals.len()
        ));
    }
    for (r, set) in released.records.iter().zip(&released_sets) {
        if set.len() != r.items.len() {
            return Err(format!("a released record repeats an item: {:?}", r.items));
        }
    }
    // Suppression only: per item, released occurrences <= original occurrences, and every released
    // record is contained in some original record.
    let mut original_counts: BTreeMap<&str, usize> = BTreeMap::new();
    for t in originals {
        for item in &t.items {
            *original_counts.entry(item).or_default() += 1;
        }
    }
    let mut released_counts: BTreeMap<&str, usize> = BTreeMap::new();
    for set in &released_sets {
        for item in set {
            *released_counts.entry(item).or_default() += 1;
        }
    }
    for (item, count) in &released_counts {
        let before = original_counts.get(item).copied().unwrap_or(0);
        if *count > before {
            return Err(format!(
                "item {item:?} released {count} times, published {before}"
            ));
        }
    }
    let original_sets: Vec<BTreeSet<&str>> = originals
        .iter()
        .map(|t| t.items.iter().map(String::as_str).collect())
        .collect();
    for set in &released_sets {
        if !original_sets.iter().any(|o| set.is_subset(o)) {
            return Err(format!(
                "released record {set:?} is no subset of any original"
            ));
        }
    }
    let support = |q: &BTreeSet<&str>| {
        released_sets
            .iter()
            .filter(|r| q.iter().all(|i| r.contains(i)))
            .count()
    };
    for t in originals {
        let items: Vec<&str> = t.items.iter().map(String::as_str).collect();
        for q in subsets(&items, m) {
            let supp_q = support(&q);
            if supp_q == 0 {
                continue;
            }
            for e in &t.sensitive_items {
                if q.contains(e.as_str()) {
                    continue;
                }
                let mut qe = q.clone();
                qe.insert(e.as_str());
                let supp_qe = support(&qe);
                if supp_qe as f64 > rho * supp_q as f64 {
                    return Err(format!(
                        "record {:?}: conf({q:?} -> {e:?}) = {supp_qe}/{supp_q} > rho = {rho}",
                        t.record_id
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Every subset of `items` with 1..=max elements.
fn subsets<'a>(items: &[&'a str], max: usize) -> Vec<BTreeSet<&'a str>> {
    let mut all: Vec<BTreeSet<&'a str>> = vec![BTreeSet::new()];
    for &item in items {
        let grown: Vec<BTreeSet<&'a str>> = all
            .iter()
            .filter(|s| s.len() < max)
            .map(|s| {
                let mut s = s.clone();
                s.insert(item);
                s
            })
            .collect();
        all.extend(grown);
    }
    all.retain(|s| !s.is_empty());
    all
}

#[test]
fn checker_catches_a_violation() {
    // a -> s holds in 2 of 2 records: confidence 1 > 0.5.
    let originals = vec![
        transaction("s", "1", &["a", "s"], &["s"]),
        transaction("s", "2", &["a", "s"], &["s"]),
    ];
    let window = ReleasedWindow {
        records: originals
            .iter()
            .map(|t| cloakd::proto::ReleasedRecord {
                items: t.items.clone(),
            })
            .collect(),
        ..ReleasedWindow::default()
    };
    assert!(check_window(&originals, &window, 0.5, 2).is_err());
    // With s suppressed everywhere the window is safe.
    let safe = ReleasedWindow {
        records: vec![
            cloakd::proto::ReleasedRecord {
                items: vec!["a".into()],
            };
            2
        ],
        ..ReleasedWindow::default()
    };
    assert!(check_window(&originals, &safe, 0.5, 2).is_ok());
    // Adding an item is caught.
    let added = ReleasedWindow {
        records: vec![
            cloakd::proto::ReleasedRecord {
                items: vec!["a".into(), "z".into()],
            };
            2
        ],
        ..ReleasedWindow::default()
    };
    assert!(check_window(&originals, &added, 0.5, 2).is_err());
}
