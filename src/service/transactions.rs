//! gRPC adapter of the transaction path: `TransactionIngest.Publish` and `ReleaseFeed.Subscribe`
//! (contract in `proto/cloakd/v1/transactions.proto`, docs/architecture.md#contract). Validation and
//! status codes live
//! here; durability, windows, releases and replicas in the window pipeline [`crate::windows`] (over the
//! store traits of [`crate::store`]; anonymization of a closed window in [`crate::windows::release`],
//! over [`crate::transactions::anonymize`], personalized rho-uncertainty of Nakagawa, Arai & Nakagawa
//! 2018).
//!
//! # Publish
//! Records are validated as they arrive and handed to the writer without waiting for earlier acks,
//! so one producer's records share fsyncs (group commit). Acknowledgements go out in the order the
//! records were sent, each only once its record is durable. A bad record ends the stream with
//! INVALID_ARGUMENT naming the field and the record id, *after* every earlier record's ack: nothing
//! accepted is lost, and the producer knows exactly which record to fix. (Rejecting just that record
//! and carrying on would need a per-record error message in the ack stream; ending the stream keeps
//! the contract "every ack means durable" simple.) Past `max_open_records` waiting records of a
//! stream: RESOURCE_EXHAUSTED; store errors: UNAVAILABLE — in both cases the stream ends and the
//! failed record was not acknowledged. One refusal does not end the stream: with replicas, a record
//! no replica took within `cluster.failover_wait_ms` ([`cluster::Router`]) is answered with a
//! [`PublishAck`] whose `refused` is set, on calls whose metadata has [`RECORD_REFUSALS_HEADER`]`: 1`
//! (older producers would read any acknowledgement as "stored", so without it the refusal ends the
//! stream with UNAVAILABLE).
//!
//! # Subscribe
//! Released windows are read from the release store in id order from `from_window`, then each new
//! one as its stream's releaser announces it. The store is the buffer: a slow subscriber only delays its own
//! reads (at most `subscriber_queue` windows are in memory for it). A window that could not be
//! anonymized ends the subscription with INTERNAL naming the window; the consumer may resume after it.
//!
//! # Shutdown
//! When the daemon stops, Publish streams stop reading (every record already read is still
//! acknowledged once durable) and end with UNAVAILABLE; subscriptions end with UNAVAILABLE naming the
//! window to resume from. Windows already closed are still released by their releasers.
//!
//! # Reload
//! The `[transactions]` section is a `watch` value a SIGHUP reload replaces
//! ([`TransactionsReload`]): record limits apply from the next record, `max_unacked_per_publish`
//! and `subscriber_queue` from the next stream, stream settings as [`windows`] describes.
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::config::TransactionsConfig;
use crate::proto::release_feed_server::{ReleaseFeed, ReleaseFeedServer};
use crate::proto::transaction_ingest_server::{TransactionIngest, TransactionIngestServer};
use crate::proto::{
    PublishAck, RecordRefusal, RefusalReason, ReleaseSubscription, ReleasedWindow, Transaction,
};
use crate::service::{InboundError, drain};
use crate::store::{DataDirLock, RecordLog, ReleaseStore, StoreError, WindowOutcome};
use crate::text::quote;
use crate::windows::pipeline::{Pipeline, read_announced};
use crate::windows::{
    self, Append, AppendError, Appended, ForwardedKind, WindowManager, replicas as cluster,
};

/// Request metadata of a Publish call whose producer reads [`PublishAck::refused`]: with value `1`,
/// a record no replica took within `cluster.failover_wait_ms` is refused in its acknowledgement and
/// the stream goes on; without it, that refusal ends the stream (older producers would read any
/// acknowledgement as "stored").
pub const RECORD_REFUSALS_HEADER: &str = "cloakd-record-refusals";

/// Longest stream name, in bytes (its hex form names a directory).
pub const MAX_STREAM_NAME_BYTES: usize = 120;

/// Why a request was refused, naming the field and the rule.
#[derive(Debug, thiserror::Error)]
pub enum TransactionsError {
    #[error("{field}: {rule} (record_id {})", quote(.record_id))]
    InvalidRecord {
        field: String,
        rule: String,
        record_id: String,
    },
    #[error("{field}: {rule}")]
    InvalidArgument { field: &'static str, rule: String },
    #[error("stream: unknown stream {} (not configured and never published to)", quote(.0))]
    UnknownStream(String),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error("transaction store unavailable: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    WindowFailed(String),
    #[error("window {window} of stream {} is unreadable: {detail}", quote(.stream))]
    WindowUnreadable {
        stream: String,
        window: u64,
        detail: String,
    },
    #[error(
        "{limit} records were sent on this stream and not yet acknowledged, the limit of transactions.max_unacked_per_publish; read the acknowledgements, then publish the rest again"
    )]
    TooManyUnacked { limit: usize },
    #[error(
        "the transaction writer's queue is full ({queue} records waiting); publish the rest again later"
    )]
    WriterBusy { queue: usize },
    #[error(
        "the broker is shutting down; records not acknowledged were not stored, publish them again"
    )]
    ShuttingDown,
    #[error("the broker is shutting down; resume from window {next}")]
    SubscriptionStopped { next: u64 },
    #[error(transparent)]
    Inbound(#[from] InboundError),
    #[error("internal error: {0}")]
    Internal(String),
    /// The caller's principal may not use the stream (`auth.principals.streams`).
    #[error(transparent)]
    Denied(#[from] crate::auth::Denial),
}

impl From<TransactionsError> for Status {
    fn from(err: TransactionsError) -> Status {
        let message = err.to_string();
        match err {
            TransactionsError::InvalidRecord { .. } | TransactionsError::InvalidArgument { .. } => {
                Status::invalid_argument(message)
            }
            TransactionsError::UnknownStream(_) => Status::not_found(message),
            TransactionsError::Append(
                AppendError::TooManyOpenRecords { .. } | AppendError::TooManyStreams { .. },
            )
            | TransactionsError::TooManyUnacked { .. }
            | TransactionsError::WriterBusy { .. } => Status::resource_exhausted(message),
            TransactionsError::Append(AppendError::TooManyAntecedents { .. }) => {
                Status::invalid_argument(message)
            }
            TransactionsError::Append(AppendError::Forwarded { kind, .. }) => match kind {
                ForwardedKind::Exhausted => Status::resource_exhausted(message),
                ForwardedKind::Invalid => Status::invalid_argument(message),
                ForwardedKind::Unavailable => Status::unavailable(message),
            },
            TransactionsError::Append(
                AppendError::Unavailable(_)
                | AppendError::NotWriter { .. }
                | AppendError::NoWriter { .. },
            )
            | TransactionsError::Store(_)
            | TransactionsError::ShuttingDown
            | TransactionsError::SubscriptionStopped { .. } => Status::unavailable(message),
            TransactionsError::WindowFailed(_)
            | TransactionsError::Internal(_)
            | TransactionsError::Append(AppendError::WindowReleased { .. }) => {
                Status::internal(message)
            }
            TransactionsError::WindowUnreadable { .. } => Status::data_loss(message),
            TransactionsError::Inbound(inbound) => inbound.status(),
            TransactionsError::Denied(denial) => denial.into_status(),
        }
    }
}

/// Both transaction services over one [`WindowManager`].
#[derive(Debug, Clone)]
pub struct TransactionServices {
    /// The `[transactions]` section in force (the window manager's; replaced by a reload).
    config: watch::Receiver<Arc<TransactionsConfig>>,
    manager: WindowManager,
    /// Where Publish hands records: the writer, or in a cluster the router in front of it.
    appends: mpsc::Sender<Append>,
    /// The cluster's stream leases, when replicas share NATS JetStream.
    cluster: Option<cluster::ClusterStreams>,
    /// Largest request message (`server.max_message_bytes`).
    max_message_bytes: usize,
    /// This daemon's hold on `data_dir` (file stores), released when the services are dropped.
    _lock: Option<std::sync::Arc<DataDirLock>>,
    /// Becomes true when the daemon shuts down: Publish stops reading, Subscribe ends.
    shutdown: watch::Receiver<bool>,
}

impl TransactionServices {
    /// Locks `config.data_dir`, opens and recovers the file stores there and starts the window
    /// pipeline ([`Pipeline::start`]). When `shutdown` becomes true, Publish streams stop reading
    /// (records already read are still acknowledged once durable) and end with UNAVAILABLE, and
    /// subscriptions end with UNAVAILABLE.
    pub async fn start(
        config: TransactionsConfig,
        shutdown: watch::Receiver<bool>,
    ) -> Result<TransactionServices, StoreError> {
        Ok(TransactionServices::over(
            Pipeline::start(config).await?,
            shutdown,
        ))
    }

    /// As [`Self::start`], over the given record log and release store instead of the files of
    /// `config.data_dir` (which is then neither locked nor used).
    pub async fn start_with(
        config: TransactionsConfig,
        log: Arc<dyn RecordLog>,
        releases: Arc<dyn ReleaseStore>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<TransactionServices, StoreError> {
        let pipeline = Pipeline::start_with(config, log, releases).await?;
        Ok(TransactionServices::over(pipeline, shutdown))
    }

    /// A replica of `nats`'s cluster ([`Pipeline::start_cluster`]); forwarded records are checked
    /// as Publish checks its own ([`validate`]).
    pub async fn start_cluster(
        config: TransactionsConfig,
        nats: &crate::cluster::Cluster,
        shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<TransactionServices> {
        let pipeline =
            Pipeline::start_cluster(config, nats, validate_forwarded, shutdown.clone()).await?;
        Ok(TransactionServices::over(pipeline, shutdown))
    }

    fn over(pipeline: Pipeline, shutdown: watch::Receiver<bool>) -> TransactionServices {
        let Pipeline {
            manager,
            appends,
            cluster,
            lock,
        } = pipeline;
        TransactionServices {
            config: manager.config(),
            appends,
            cluster,
            manager,
            max_message_bytes: crate::service::DEFAULT_MAX_MESSAGE_BYTES,
            _lock: lock,
            shutdown,
        }
    }

    /// What a reload hands the new configuration to (it holds neither the store nor its lock).
    pub fn reload_target(&self) -> TransactionsReload {
        TransactionsReload {
            reconfigure: self.manager.reconfigure_handle(),
        }
    }

    /// The `[transactions]` section in force.
    pub fn config(&self) -> Arc<TransactionsConfig> {
        self.config.borrow().clone()
    }

    /// Sets the largest request message accepted (`server.max_message_bytes`).
    pub fn with_max_message_bytes(mut self, max_message_bytes: usize) -> TransactionServices {
        self.max_message_bytes = max_message_bytes;
        self
    }

    pub fn ingest_server(&self) -> TransactionIngestServer<TransactionServices> {
        TransactionIngestServer::new(self.clone()).max_decoding_message_size(self.max_message_bytes)
    }

    pub fn feed_server(&self) -> ReleaseFeedServer<TransactionServices> {
        ReleaseFeedServer::new(self.clone()).max_decoding_message_size(self.max_message_bytes)
    }
}

/// Puts a reloaded `[transactions]` section in force. The caller checked that only reloadable keys
/// changed (`data_dir` is restart-only).
#[derive(Debug, Clone)]
pub struct TransactionsReload {
    reconfigure: Arc<watch::Sender<Arc<TransactionsConfig>>>,
}

impl TransactionsReload {
    pub fn reconfigure(&self, config: TransactionsConfig) {
        self.reconfigure.send_replace(Arc::new(config));
    }
}

impl crate::reload::ReloadTarget for TransactionsReload {
    fn apply(&self, config: &crate::config::Config) {
        self.reconfigure(config.transactions.clone());
    }
}

fn check_stream_name(stream: &str) -> Result<(), TransactionsError> {
    if stream.is_empty() {
        return Err(TransactionsError::InvalidArgument {
            field: "stream",
            rule: "must not be empty".into(),
        });
    }
    if stream.len() > MAX_STREAM_NAME_BYTES {
        return Err(TransactionsError::InvalidArgument {
            field: "stream",
            rule: format!(
                "must be at most {MAX_STREAM_NAME_BYTES} bytes (got {})",
                stream.len()
            ),
        });
    }
    Ok(())
}

/// Checks one item list: count, names, duplicates.
fn check_items(
    field: &str,
    items: &[String],
    config: &TransactionsConfig,
    record_id: &str,
) -> Result<(), TransactionsError> {
    let bad = |field: String, rule: String| TransactionsError::InvalidRecord {
        field,
        rule,
        record_id: record_id.to_string(),
    };
    if items.len() > config.max_items_per_record {
        return Err(bad(
            field.to_string(),
            format!(
                "holds {} items; the limit (transactions.max_items_per_record) is {}",
                items.len(),
                config.max_items_per_record
            ),
        ));
    }
    let mut seen = std::collections::HashMap::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        if item.is_empty() {
            return Err(bad(format!("{field}[{i}]"), "must not be empty".into()));
        }
        if item.len() > config.max_item_bytes {
            return Err(bad(
                format!("{field}[{i}]"),
                format!(
                    "is {} bytes; the limit (transactions.max_item_bytes) is {}",
                    item.len(),
                    config.max_item_bytes
                ),
            ));
        }
        if let Some(first) = seen.insert(item.as_str(), i) {
            return Err(bad(
                format!("{field}[{i}]"),
                format!("duplicates {field}[{first}] ({})", quote(item)),
            ));
        }
    }
    Ok(())
}

/// [`validate`] as a replica's forwarded-records server takes it ([`cluster::Validate`]).
fn validate_forwarded(t: &Transaction, config: &TransactionsConfig) -> Result<(), String> {
    validate(t, config).map_err(|e| e.to_string())
}

/// Validates a published transaction.
pub fn validate(t: &Transaction, config: &TransactionsConfig) -> Result<(), TransactionsError> {
    check_stream_name(&t.stream).map_err(|e| match e {
        TransactionsError::InvalidArgument { field, rule } => TransactionsError::InvalidRecord {
            field: field.into(),
            rule,
            record_id: t.record_id.clone(),
        },
        other => other,
    })?;
    let bad = |field: &str, rule: String| TransactionsError::InvalidRecord {
        field: field.into(),
        rule,
        record_id: t.record_id.clone(),
    };
    if t.record_id.is_empty() {
        return Err(bad("record_id", "must not be empty".into()));
    }
    if t.record_id.len() > config.max_item_bytes {
        return Err(bad(
            "record_id",
            format!(
                "is {} bytes; the limit (transactions.max_item_bytes) is {}",
                t.record_id.len(),
                config.max_item_bytes
            ),
        ));
    }
    if t.items.is_empty() {
        return Err(bad("items", "a record must hold at least one item".into()));
    }
    check_items("items", &t.items, config, &t.record_id)?;
    check_items("sensitive_items", &t.sensitive_items, config, &t.record_id)?;
    Ok(())
}

/// A window a subscriber cannot be sent: logged (stream, window and what is wrong; never a record)
/// and counted (`cloakd_transaction_data_loss_total`), then sent as DATA_LOSS.
/// The file is named in the log line only, not to the subscriber.
fn data_loss(
    stream: &str,
    window: u64,
    reason: &'static str,
    file: Option<std::path::PathBuf>,
    detail: String,
) -> TransactionsError {
    tracing::error!(
        stream = %stream,
        file = %file.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
        window_id = window,
        reason,
        detail = %detail,
        "a released window cannot be sent: DATA_LOSS to the subscriber; stop the daemon and run `cloakd store check` on its data directory"
    );
    metrics::counter!(crate::telemetry::catalog::TX_DATA_LOSS, "stream" => stream.to_string(), "reason" => reason)
        .increment(1);
    TransactionsError::WindowUnreadable {
        stream: stream.to_string(),
        window,
        detail,
    }
}

/// Completes when the daemon shuts down (or its shutdown signal is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// One entry of a Publish stream's ordered acknowledgement queue.
enum PendingAck {
    Durable {
        record_id: String,
        reply: oneshot::Receiver<Result<Appended, AppendError>>,
    },
    Refused(Status),
}

type AckStream = Pin<Box<dyn Stream<Item = Result<PublishAck, Status>> + Send>>;
type WindowStream = Pin<Box<dyn Stream<Item = Result<ReleasedWindow, Status>> + Send>>;

#[tonic::async_trait]
impl TransactionIngest for TransactionServices {
    type PublishStream = AckStream;

    async fn publish(
        &self,
        request: Request<Streaming<Transaction>>,
    ) -> Result<Response<AckStream>, Status> {
        let principal = crate::auth::Caller::of(&request)?;
        let per_record_refusals = request
            .metadata()
            .get(RECORD_REFUSALS_HEADER)
            .is_some_and(|v| v.as_bytes() == b"1");
        let mut inbound = request.into_inner();
        let limit = self.config.borrow().max_unacked_per_publish;
        let (ack_tx, ack_rx) = mpsc::channel::<Result<PublishAck, Status>>(256);
        // One place beyond the limit is kept for the status that ends the stream.
        let (pending_tx, mut pending_rx) = mpsc::channel::<PendingAck>(limit.saturating_add(1));
        let config = self.config.clone();
        let appends = self.appends.clone();
        let max_message_bytes = self.max_message_bytes;
        let mut shutdown = self.shutdown.clone();
        // Reader: validate and hand records to the writer, in order, without waiting for acks or for
        // the writer: it never blocks, so HTTP/2 never holds frames the daemon does not read. After
        // the first refusal it keeps draining the stream until the client ends it.
        tokio::spawn(async move {
            let refuse = |error: TransactionsError| {
                // The reserved place: cannot be full.
                let _ = pending_tx.try_send(PendingAck::Refused(error.into()));
            };
            loop {
                let message = tokio::select! {
                    message = inbound.message() => message,
                    () = stopped(&mut shutdown) => {
                        refuse(TransactionsError::ShuttingDown);
                        return;
                    }
                };
                let t = match message {
                    Ok(Some(t)) => t,
                    Ok(None) => return,
                    Err(status) => {
                        match InboundError::classify(&status, max_message_bytes) {
                            InboundError::Transport { .. } => {}
                            error => refuse(error.into()),
                        }
                        return;
                    }
                };
                // The limits in force now (a reload applies from the next record).
                let checked = validate(&t, &config.borrow())
                    .and_then(|()| principal.check_stream(&t.stream).map_err(Into::into));
                if let Err(e) = checked {
                    windows::count_refused("invalid");
                    refuse(e);
                    break;
                }
                if pending_tx.capacity() <= 1 {
                    refuse(TransactionsError::TooManyUnacked { limit });
                    break;
                }
                let (reply, receive) = oneshot::channel();
                let record_id = t.record_id.clone();
                let append = Append::of(t, reply);
                match appends.try_send(append) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        refuse(TransactionsError::WriterBusy {
                            queue: appends.max_capacity(),
                        });
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        refuse(TransactionsError::Append(AppendError::Unavailable(
                            "the transaction writer has stopped".into(),
                        )));
                        break;
                    }
                }
                let pending = PendingAck::Durable {
                    record_id,
                    reply: receive,
                };
                if pending_tx.try_send(pending).is_err() {
                    break;
                }
            }
            drop(pending_tx);
            drain(inbound);
        });
        // Acknowledger: in the order sent; the first failure ends the stream.
        tokio::spawn(async move {
            while let Some(pending) = pending_rx.recv().await {
                let result = match pending {
                    PendingAck::Refused(status) => Err(status),
                    PendingAck::Durable { record_id, reply } => match reply.await {
                        Ok(Ok(appended)) => Ok(PublishAck {
                            record_id,
                            window_id: appended.window_id,
                            duplicate: appended.duplicate,
                            refused: None,
                        }),
                        Ok(Err(e @ AppendError::NoWriter { .. })) if per_record_refusals => {
                            windows::count_refused("no_writer");
                            Ok(PublishAck {
                                record_id,
                                window_id: 0,
                                duplicate: false,
                                refused: Some(RecordRefusal {
                                    reason: RefusalReason::NoWriter.into(),
                                    message: e.to_string(),
                                }),
                            })
                        }
                        Ok(Err(e)) => Err(TransactionsError::Append(e).into()),
                        Err(_) => Err(TransactionsError::Append(AppendError::Unavailable(
                            "the transaction writer dropped the record".into(),
                        ))
                        .into()),
                    },
                };
                let failed = result.is_err();
                if ack_tx.send(result).await.is_err() || failed {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(ack_rx))))
    }
}

#[tonic::async_trait]
impl ReleaseFeed for TransactionServices {
    type SubscribeStream = WindowStream;

    async fn subscribe(
        &self,
        request: Request<ReleaseSubscription>,
    ) -> Result<Response<WindowStream>, Status> {
        let principal = crate::auth::Caller::of(&request)?;
        let ReleaseSubscription {
            stream,
            from_window,
        } = request.into_inner();
        check_stream_name(&stream)?;
        principal
            .check_stream(&stream)
            .map_err(TransactionsError::from)?;
        let handle = match (self.manager.stream(&stream), &self.cluster) {
            (Some(handle), _) => handle,
            // A stream another replica writes, first subscribed to here.
            (None, Some(cluster)) if cluster.exists(&stream).await => self
                .manager
                .adopt(&stream)
                .await
                .map_err(TransactionsError::from)?,
            (None, _) => return Err(TransactionsError::UnknownStream(stream.clone()).into()),
        };
        let mut released = handle.released_upto.subscribe();
        let releases = self.manager.releases.clone();
        let subscriber_queue = self.config.borrow().subscriber_queue;
        let (tx, rx) = mpsc::channel(subscriber_queue);
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut next = from_window;
            loop {
                let upto = *released.borrow_and_update();
                while next < upto {
                    let item = match read_announced(releases.as_ref(), &stream, next).await {
                        Ok(Some(WindowOutcome::Released(bytes))) => {
                            <ReleasedWindow as prost::Message>::decode(bytes.as_slice()).map_err(
                                |e| data_loss(&stream, next, "damaged", None, e.to_string()),
                            )
                        }
                        Ok(Some(WindowOutcome::Failed(reason))) => {
                            Err(TransactionsError::WindowFailed(reason))
                        }
                        Ok(None) => Err(data_loss(
                            &stream,
                            next,
                            "missing",
                            None,
                            "it is announced as stored but its outcome is gone".into(),
                        )),
                        Err(StoreError::Corrupt { path, offset, rule }) => Err(data_loss(
                            &stream,
                            next,
                            "damaged",
                            Some(path),
                            format!("its stored outcome is damaged at byte {offset}: {rule}"),
                        )),
                        Err(e) => Err(TransactionsError::Store(e)),
                    };
                    let item = item.map_err(Status::from);
                    let failed = item.is_err();
                    if tx.send(item).await.is_err() || failed {
                        return;
                    }
                    next += 1;
                }
                tokio::select! {
                    changed = released.changed() => if changed.is_err() { return },
                    () = tx.closed() => return,
                    () = stopped(&mut shutdown) => {
                        let _ = tx
                            .send(Err(TransactionsError::SubscriptionStopped { next }.into()))
                            .await;
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tx(stream: &str, id: &str, items: &[&str], sensitive: &[&str]) -> Transaction {
        Transaction {
            stream: stream.into(),
            record_id: id.into(),
            items: items.iter().map(|s| s.to_string()).collect(),
            sensitive_items: sensitive.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn validation_names_the_field() {
        let config = crate::config::Config::embedded_defaults().transactions;
        let long = "x".repeat(config.max_item_bytes + 1);
        let many: Vec<String> = (0..=config.max_items_per_record)
            .map(|i| i.to_string())
            .collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let cases = [
            (tx("", "r", &["a"], &[]), "stream:"),
            (tx("s", "", &["a"], &[]), "record_id:"),
            (tx("s", "r", &[], &[]), "items:"),
            (tx("s", "r", &["a", "b", "a"], &[]), "items[2]:"),
            (tx("s", "r", &["a", ""], &[]), "items[1]:"),
            (tx("s", "r", &["a", &long], &[]), "items[1]:"),
            (tx("s", "r", &many, &[]), "items:"),
            (tx("s", "r", &["a"], &["b", "b"]), "sensitive_items[1]:"),
        ];
        for (t, field) in cases {
            let err = validate(&t, &config).unwrap_err();
            let message = err.to_string();
            assert!(message.starts_with(field), "{field}: {message}");
            assert_eq!(Status::from(err).code(), tonic::Code::InvalidArgument);
        }
        assert!(validate(&tx("s", "r", &["a", "b"], &["a", "z"]), &config).is_ok());
    }

    #[test]
    fn a_store_failure_is_unavailable_naming_its_cause() {
        let err = AppendError::Unavailable("disk full".into());
        let status = Status::from(TransactionsError::Append(err));
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert!(
            status.message().contains("disk full"),
            "{}",
            status.message()
        );
    }
}
