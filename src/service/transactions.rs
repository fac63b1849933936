//! gRPC adapter of the transaction path: `TransactionIngest.Publish` and `ReleaseFeed.Subscribe`
//! (contract in `proto/cloakd/v1/transactions.proto`, DESIGN.md §3). Validation and status codes live
//! here; durability and windows in [`windows`] (over [`crate::store`]); anonymization of a closed
//! window in [`release`] (over [`crate::transactions::anonymize`], personalized rho-uncertainty of
//! Nakagawa, Arai & Nakagawa 2018).
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
//! failed record was not acknowledged.
//!
//! # Subscribe
//! Released windows are read from disk in id order from `from_window`, then each new one as its
//! stream's releaser announces it. The disk is the buffer: a slow subscriber only delays its own
//! reads (at most `subscriber_queue` windows are in memory for it). A window that could not be
//! anonymized ends the subscription with INTERNAL naming the window; the consumer may resume after it.
//!
//! # Shutdown
//! When the daemon stops, Publish streams stop reading (every record already read is still
//! acknowledged once durable) and end with UNAVAILABLE; subscriptions end with UNAVAILABLE naming the
//! window to resume from. Windows already closed are still released by their releasers.
pub mod release;
pub mod windows;

use std::pin::Pin;

use futures::Stream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::config::TransactionsConfig;
use crate::proto::release_feed_server::{ReleaseFeed, ReleaseFeedServer};
use crate::proto::transaction_ingest_server::{TransactionIngest, TransactionIngestServer};
use crate::proto::{PublishAck, ReleaseSubscription, ReleasedWindow, Transaction};
use crate::store::{StoreError, WindowOutcome};
use windows::{Append, AppendError, Appended, WindowManager};

/// Longest stream name, in bytes (its hex form names a directory).
pub const MAX_STREAM_NAME_BYTES: usize = 120;
/// Records of one Publish stream handed to the writer and not yet acknowledged.
pub const PUBLISH_IN_FLIGHT: usize = 4096;

/// Why a request was refused, naming the field and the rule.
#[derive(Debug, thiserror::Error)]
pub enum TransactionsError {
    #[error("{field}: {rule} (record_id {record_id:?})")]
    InvalidRecord {
        field: String,
        rule: String,
        record_id: String,
    },
    #[error("{field}: {rule}")]
    InvalidArgument { field: &'static str, rule: String },
    #[error("stream: unknown stream {0:?} (not configured and never published to)")]
    UnknownStream(String),
    #[error(transparent)]
    Append(#[from] AppendError),
    #[error("transaction store unavailable: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    WindowFailed(String),
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
            TransactionsError::Append(AppendError::TooManyOpenRecords { .. }) => {
                Status::resource_exhausted(message)
            }
            TransactionsError::Append(AppendError::Unavailable(_))
            | TransactionsError::Store(_) => Status::unavailable(message),
            TransactionsError::WindowFailed(_) => Status::internal(message),
            TransactionsError::Denied(denial) => denial.into_status(),
        }
    }
}

/// Both transaction services over one [`WindowManager`].
#[derive(Debug, Clone)]
pub struct TransactionServices {
    config: TransactionsConfig,
    manager: WindowManager,
    /// Becomes true when the daemon shuts down: Publish stops reading, Subscribe ends.
    shutdown: watch::Receiver<bool>,
}

impl TransactionServices {
    /// Opens and recovers the store under `config.data_dir` and starts the window manager.
    /// When `shutdown` becomes true, Publish streams stop reading (records already read are still
    /// acknowledged once durable) and end with UNAVAILABLE, and subscriptions end with UNAVAILABLE.
    pub async fn start(
        config: TransactionsConfig,
        shutdown: watch::Receiver<bool>,
    ) -> Result<TransactionServices, StoreError> {
        let manager = WindowManager::start(config.clone()).await?;
        Ok(TransactionServices {
            config,
            manager,
            shutdown,
        })
    }

    pub fn ingest_server(&self) -> TransactionIngestServer<TransactionServices> {
        TransactionIngestServer::new(self.clone())
    }

    pub fn feed_server(&self) -> ReleaseFeedServer<TransactionServices> {
        ReleaseFeedServer::new(self.clone())
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
                format!("duplicates {field}[{first}] ({item:?})"),
            ));
        }
    }
    Ok(())
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

/// Completes when the daemon shuts down (or its shutdown signal is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

fn shutting_down() -> Status {
    Status::unavailable(
        "the broker is shutting down; records not acknowledged were not stored, publish them again",
    )
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
        let mut inbound = request.into_inner();
        let (ack_tx, ack_rx) = mpsc::channel::<Result<PublishAck, Status>>(256);
        let (pending_tx, mut pending_rx) = mpsc::channel::<PendingAck>(PUBLISH_IN_FLIGHT);
        let config = self.config.clone();
        let appends = self.manager.appends.clone();
        let mut shutdown = self.shutdown.clone();
        // Reader: validate and hand records to the writer, in order, without waiting for acks.
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    message = inbound.next() => message,
                    () = stopped(&mut shutdown) => {
                        let _ = pending_tx.send(PendingAck::Refused(shutting_down())).await;
                        break;
                    }
                };
                let Some(Ok(t)) = message else { break };
                let checked = validate(&t, &config)
                    .and_then(|()| principal.check_stream(&t.stream).map_err(Into::into));
                if let Err(e) = checked {
                    let _ = pending_tx.send(PendingAck::Refused(e.into())).await;
                    break;
                }
                let (reply, receive) = oneshot::channel();
                let record_id = t.record_id.clone();
                let append = Append {
                    stream: t.stream,
                    record_id: t.record_id,
                    items: t.items,
                    sensitive_items: t.sensitive_items,
                    reply,
                };
                if appends.send(append).await.is_err() {
                    let refused = TransactionsError::Append(AppendError::Unavailable(
                        "the transaction writer has stopped".into(),
                    ));
                    let _ = pending_tx.send(PendingAck::Refused(refused.into())).await;
                    break;
                }
                let pending = PendingAck::Durable {
                    record_id,
                    reply: receive,
                };
                if pending_tx.send(pending).await.is_err() {
                    break;
                }
            }
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
                        }),
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
        let handle = self
            .manager
            .stream(&stream)
            .ok_or_else(|| TransactionsError::UnknownStream(stream.clone()))?;
        let mut released = handle.released_upto.subscribe();
        let windows = self.manager.windows.clone();
        let (tx, rx) = mpsc::channel(self.config.subscriber_queue);
        let mut shutdown = self.shutdown.clone();
        tokio::spawn(async move {
            let mut next = from_window;
            loop {
                let upto = *released.borrow_and_update();
                while next < upto {
                    let (store, name) = (windows.clone(), stream.clone());
                    let read = tokio::task::spawn_blocking(move || store.read(&name, next)).await;
                    let item = match read {
                        Ok(Ok(Some(WindowOutcome::Released(bytes)))) => {
                            <ReleasedWindow as prost::Message>::decode(bytes.as_slice()).map_err(
                                |e| {
                                    Status::data_loss(format!(
                                        "window {next} of stream {stream:?} is unreadable: {e}"
                                    ))
                                },
                            )
                        }
                        Ok(Ok(Some(WindowOutcome::Failed(reason)))) => {
                            Err(TransactionsError::WindowFailed(reason).into())
                        }
                        Ok(Ok(None)) => Err(Status::internal(format!(
                            "window {next} of stream {stream:?} is announced but missing"
                        ))),
                        Ok(Err(e)) => Err(TransactionsError::Store(e).into()),
                        Err(e) => Err(Status::internal(e.to_string())),
                    };
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
                            .send(Err(Status::unavailable(format!(
                                "the broker is shutting down; resume from window {next}"
                            ))))
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
}
