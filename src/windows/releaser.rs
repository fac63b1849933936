//! The releaser of one stream: anonymizes its closed windows strictly in id order and stores each
//! outcome once in the [`ReleaseStore`] before announcing it. A releaser is a task; the
//! anonymization and the store write run on one of the `transactions.release_workers` places of a
//! pool every stream shares, so many streams never mean many threads.
//!
//! Invariants: window w is announced (`released_upto` > w) only once its outcome is durable; a
//! window whose outcome is already stored (queued twice after a replay, or stored by an earlier
//! run) keeps the stored outcome ([`ReleaseStore::write_once`]), and a recovered window that has
//! one is announced without being anonymized again (only a lost window below it is); a failed write is retried with
//! backoff, so nothing is announced that is not stored. The releaser ends once its stream's handle
//! is gone and its queue is empty, so a graceful shutdown finishes the windows already closed.
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, watch};

use super::metrics::StreamMetrics;
use super::release_window::release_window;
use crate::store::{ReleaseStore, Stored, StoredRecord, WindowClose, WindowOutcome};
use crate::telemetry::catalog;

/// A closed window handed to its stream's releaser.
#[derive(Debug)]
pub(super) struct ClosedWindow {
    pub close: WindowClose,
    pub records: Vec<StoredRecord>,
    /// When its close became durable (or it was recovered), for the release lag metric.
    pub closed_at: std::time::Instant,
    /// Queued by a replay: it may have an outcome already (a window above a lost one).
    pub recovered: bool,
}

/// Releases the closed windows of `stream` in order (see the module doc).
pub(super) async fn run_releaser(
    stream: String,
    workers: Arc<Semaphore>,
    releases: Arc<dyn ReleaseStore>,
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
        // One place of the pool for the anonymization and the write of its outcome.
        let Ok(_worker) = workers.acquire().await else {
            return;
        };
        // A recovered window that has an outcome (even a damaged one, which is never rewritten)
        // is announced as it is: only a window without one is anonymized.
        if window.recovered
            && matches!(
                releases.read(&stream, window_id).await,
                Ok(Some(_)) | Err(crate::store::StoreError::Corrupt { .. })
            )
        {
            released_upto.send_if_modified(|upto| {
                let advanced = window_id + 1 > *upto;
                *upto = (*upto).max(window_id + 1);
                advanced
            });
            metrics.windows_unreleased.decrement(1.0);
            metrics.open_records.decrement(records as f64);
            continue;
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
        let mut backoff = Duration::from_millis(100);
        loop {
            match releases.write_once(&stream, window_id, &outcome).await {
                Ok(Stored::Written) => break,
                Ok(Stored::Already) => {
                    tracing::debug!(%stream, window_id, "window already stored; its first outcome stands");
                    break;
                }
                Err(e) => {
                    tracing::error!(%stream, window_id, error = %e, "cannot store released window; retrying")
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(10));
        }
        // Another replica's release may have been announced past it meanwhile (a cluster).
        released_upto.send_if_modified(|upto| {
            let advanced = window_id + 1 > *upto;
            *upto = (*upto).max(window_id + 1);
            advanced
        });
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
