//! Starting the window pipeline of the transaction streams, alone or as a replica: [`Pipeline`]
//! opens the stores (the files of `data_dir`, locked, or given stores, or a cluster's JetStream),
//! starts the [`WindowManager`] over them and, on a replica, the forwarding router, the forwarded
//! records' server, the release watcher and the stream leases ([`cluster`]); [`read_announced`]
//! reads a window its releaser announced, waiting for a replicated store that lags.
//!
//! Invariants: a pipeline over the files of `data_dir` holds the directory's lock for as long as it
//! (or a clone of its lock) lives; on a replica, records reach the writer only through the router
//! (which forwards those of streams another replica writes), and the stream leases are given up
//! when `shutdown` turns true. Opening the cluster's stores is retried at most [`OPEN_ATTEMPTS`]
//! times before the replica gives up.
use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use crate::config::TransactionsConfig;
use crate::store::{DataDirLock, RecordLog, ReleaseStore, StoreError, WindowOutcome};
use crate::windows::{self as windows, Append, WindowManager, replicas as cluster};

/// A started window pipeline: the manager, where records go in, and what a replica adds.
#[derive(Debug)]
pub struct Pipeline {
    pub manager: WindowManager,
    /// Where records go: the writer, or in a cluster the router in front of it.
    pub appends: mpsc::Sender<Append>,
    /// The cluster's stream leases, when replicas share NATS JetStream.
    pub cluster: Option<cluster::ClusterStreams>,
    /// This daemon's hold on `data_dir` (file stores), released when the last holder is dropped.
    pub lock: Option<Arc<DataDirLock>>,
}

impl Pipeline {
    /// Locks `config.data_dir`, opens and recovers the file stores there and starts the window
    /// manager.
    pub async fn start(config: TransactionsConfig) -> Result<Pipeline, StoreError> {
        let dir = config.data_dir.clone();
        let lock = tokio::task::spawn_blocking(move || DataDirLock::acquire(&dir))
            .await
            .map_err(|e| StoreError::Io {
                path: config.data_dir.clone(),
                action: "locking the data directory",
                source: std::io::Error::other(e),
            })??;
        let manager = WindowManager::start(config.clone()).await?;
        Ok(Pipeline::over(manager, Some(Arc::new(lock))))
    }

    /// As [`Self::start`], over the given record log and release store instead of the files of
    /// `config.data_dir` (which is then neither locked nor used).
    pub async fn start_with(
        config: TransactionsConfig,
        log: Arc<dyn RecordLog>,
        releases: Arc<dyn ReleaseStore>,
    ) -> Result<Pipeline, StoreError> {
        let manager = WindowManager::start_with(config, log, releases, None).await?;
        Ok(Pipeline::over(manager, None))
    }

    /// A replica of `nats`'s cluster: the record log and the release store on its JetStream
    /// ([`crate::store::jetstream`], `config.data_dir` is neither locked nor used), one writer per
    /// stream by lease, records forwarded to it from every replica, and releases announced on every
    /// replica ([`cluster`]); forwarded records are checked with `validate`. On shutdown the replica gives its stream leases up, so others take
    /// its streams over at once.
    pub async fn start_cluster(
        config: TransactionsConfig,
        nats: &crate::cluster::Cluster,
        validate: cluster::Validate,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<Pipeline> {
        use anyhow::Context;
        let layout = crate::store::jetstream::Layout {
            prefix: nats.config.prefix.clone(),
            replicas: nats.config.replicas,
        };
        // JetStream may still be electing leaders when replicas start together (a fresh cluster, a
        // rolling restart): opening is retried for a while before the replica gives up.
        let request_timeout = nats
            .config
            .nats
            .as_ref()
            .map_or(std::time::Duration::from_secs(5), |n| n.request_timeout);
        // A log request unanswered after a second is made again (it is idempotent), for up to
        // `cluster.request_timeout_ms`: after a NATS server died, the first request after the
        // JetStream election goes through instead of the writer waiting out a whole timeout.
        let patience = crate::store::jetstream::Patience {
            attempt: Some(request_timeout.min(crate::cluster::connect::JETSTREAM_ATTEMPT)),
            total: request_timeout,
        };
        let (log, releases) = retry_opening(|| async {
            let log = crate::store::jetstream::JetStreamRecordLog::open_with(
                nats.jetstream.clone(),
                layout.clone(),
                patience,
            )
            .await
            .context("opening the record log on JetStream")?;
            let releases = crate::store::jetstream::JetStreamReleases::open(
                nats.jetstream.clone(),
                layout.clone(),
            )
            .await
            .context("opening the release store on JetStream")?;
            Ok((log, releases))
        })
        .await?;
        let releases: Arc<dyn ReleaseStore> = Arc::new(releases);
        let leases =
            retry_opening(|| async { Ok(cluster::ClusterStreams::leases(nats).await?) }).await?;
        let manager = WindowManager::start_with(
            config,
            Arc::new(log),
            releases.clone(),
            Some(Arc::new(leases.clone())),
        )
        .await?;
        let prefix = nats.config.prefix.clone();
        let ingest = nats
            .client
            .subscribe(format!("{prefix}.ingest.{}", nats.node_id))
            .await
            .context("subscribing to forwarded records")?;
        tokio::spawn(cluster::serve_ingest(
            nats.client.clone(),
            ingest,
            manager.appends.clone(),
            manager.config(),
            validate,
        ));
        let seen = nats
            .client
            .subscribe(format!("{prefix}.releases.>"))
            .await
            .context("subscribing to releases")?;
        tokio::spawn(cluster::watch_releases(
            seen,
            manager.streams.clone(),
            releases,
            nats.config.lease,
        ));
        let (appends, routed) = mpsc::channel(windows::WRITER_QUEUE);
        let router = cluster::Router {
            writer: manager.appends.clone(),
            leases: leases.clone(),
            client: nats.client.clone(),
            prefix,
            request_timeout,
            lease: nats.config.lease,
            failover_wait: nats.config.failover_wait,
        };
        tokio::spawn(router.run(routed));
        {
            let mut shutdown = shutdown.clone();
            let leases = leases.clone();
            tokio::spawn(async move {
                let _ = shutdown.wait_for(|stop| *stop).await;
                leases.0.stop().await;
            });
        }
        Ok(Pipeline {
            manager,
            appends,
            cluster: Some(cluster::ClusterStreams { leases }),
            lock: None,
        })
    }

    fn over(manager: WindowManager, lock: Option<Arc<DataDirLock>>) -> Pipeline {
        Pipeline {
            appends: manager.appends.clone(),
            manager,
            cluster: None,
            lock,
        }
    }
}

/// Attempts to open cluster stores at start, before giving up on the first error kept.
const OPEN_ATTEMPTS: u32 = 8;

/// Runs `open` until it succeeds, at most [`OPEN_ATTEMPTS`] times with a doubling pause (0.25 s to
/// 8 s, about 30 s in all); the last error otherwise.
async fn retry_opening<T, F, Fut>(mut open: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let mut pause = std::time::Duration::from_millis(250);
    let mut attempt = 1;
    loop {
        match open().await {
            Ok(opened) => return Ok(opened),
            Err(e) if attempt < OPEN_ATTEMPTS => {
                tracing::warn!(
                    error = format!("{e:#}"),
                    attempt,
                    "opening the transaction stores on JetStream failed; trying again"
                );
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(8));
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Reads window `window`, announced as stored. A replicated store may answer from a replica that
/// has not caught up yet: an announced window that reads as missing is read again for a while.
pub async fn read_announced(
    releases: &dyn ReleaseStore,
    stream: &str,
    window: u64,
) -> Result<Option<WindowOutcome>, StoreError> {
    let mut wait = std::time::Duration::from_millis(10);
    for _ in 0..10 {
        match releases.read(stream, window).await? {
            Some(outcome) => return Ok(Some(outcome)),
            None => tokio::time::sleep(wait).await,
        }
        wait = (wait * 2).min(std::time::Duration::from_secs(1));
    }
    releases.read(stream, window).await
}
