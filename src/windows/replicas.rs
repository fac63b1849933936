//! Transaction streams across replicas on NATS JetStream (`[cluster]`): who seals which stream, how a
//! record published to any replica reaches it, and how every replica learns of releases.
//!
//! * **One writer per stream.** Every replica contends for the lease `stream.<S>` (S = hex of the
//!   stream's name, [`crate::store::stream_dir_name`]) of each stream it knows (configured, in the
//!   log, published to, or whose key any replica created) in the bucket `<prefix>_leases`
//!   ([`StreamLeases`] over [`LeaseTable`]). The first replica to see a stream usually creates its
//!   key and so seals it, which spreads streams over the replicas their producers use. Only the holder's window writer admits records, seals windows (by count and by
//!   time) and releases them; when it takes a stream over it first rebuilds the stream's state from
//!   the log and queues the closed windows the previous holder did not release. The log's fence
//!   ([`crate::store::jetstream`]) makes a writer that lost its lease unnoticed harmless, and
//!   releases are written once, so a window is never released twice or differently.
//! * **Forwarding** ([`Router`]). A replica that receives a record for a stream another replica
//!   seals sends it there as a NATS request on `<prefix>.ingest.<node id>` (a `ForwardRequest` of
//!   up to [`MAX_FORWARD_BYTES`]; one request per batch of the router's queue and holder), and
//!   acknowledges it to its producer only with the holder's answer (durable, or a duplicate with its
//!   window). The holder validates the records again with its own limits ([`serve_ingest`]).
//! * **Failover without the producer noticing** ([`Router::deliver`]). Records whose stream has no
//!   known holder, or whose holder does not take them (unreachable, no answer within
//!   `cluster.request_timeout_ms`, or answering that it no longer seals the stream), wait until the
//!   stream's lease is held here or by another replica (a request in flight is given up as soon as
//!   the lease leaves its holder) and are then sent there, up to `cluster.failover_wait_ms` (default
//!   twice the lease) after the first failure. Sending again is safe: a record the old holder
//!   stored is answered by the new one as a duplicate in its window (the log is idempotent by record
//!   id). Past the wait a record is refused with [`AppendError::NoWriter`] (not acknowledged;
//!   publish it again), which Publish reports per record when the producer asks for it.
//! * **Store outages without the producer noticing** ([`Router::answers_here`]). A record of a
//!   stream this replica seals goes to its own writer with a copy kept; when the writer does not
//!   store it for a reason that passes (its store unavailable, e.g. while JetStream elects a new
//!   leader after a NATS server died, or the lease gone before the record was written), the record
//!   waits and is sent again, here or to the stream's new holder, bounded by the same
//!   `cluster.failover_wait_ms` counted from that failure. The producer sees a pause, not an
//!   ended stream. Invariant: every record gets exactly one answer, and only a writer's answer
//!   (durable, or a duplicate with its window) acknowledges it.
//! * **Releases everywhere** ([`watch_releases`]). Every replica listens on `<prefix>.releases.>`
//!   (the release store's subjects; JetStream delivers stored messages to plain subscribers too) and
//!   announces each release to its local subscribers, and re-reads the release store every lease
//!   duration for the streams someone subscribes to here, in case a message was missed.
//!
//! Records travel between replicas in the clear inside NATS: run NATS with TLS
//! (`cluster.tls_ca_file`) where the network is not trusted.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, watch};

use super::{Append, AppendError, Appended, ForwardedKind, Ownership, StreamHandle};
use crate::cluster::{Cluster, LeaseTable, Owner};
use crate::config::TransactionsConfig;
use crate::store::{ReleaseStore, stream_dir_name, stream_name_of_dir};
use crate::text::quote;

/// Largest payload of one forwarded batch: below NATS's default `max_payload` (1 MiB).
pub const MAX_FORWARD_BYTES: usize = 512 * 1024;

/// The stream leases of this replica, as the window writer asks for them.
#[derive(Debug, Clone)]
pub struct StreamLeases(pub LeaseTable);

impl StreamLeases {
    /// Who seals `stream`, as far as this replica knows.
    pub fn owner(&self, stream: &str) -> Owner {
        self.0.owner(&stream_dir_name(stream))
    }
}

impl Ownership for StreamLeases {
    fn writes(&self, stream: &str) -> bool {
        self.0.holds(&stream_dir_name(stream))
    }

    fn contend(&self, stream: &str) {
        self.0.contend(&stream_dir_name(stream));
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.0.changes()
    }
}

/// A record as forwarded to the replica that seals its stream.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardRecord {
    #[prost(string, tag = "1")]
    pub stream: String,
    #[prost(string, tag = "2")]
    pub record_id: String,
    #[prost(string, repeated, tag = "3")]
    pub items: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub sensitive_items: Vec<String>,
}

/// The body of a request on `<prefix>.ingest.<node id>`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardRequest {
    #[prost(message, repeated, tag = "1")]
    pub records: Vec<ForwardRecord>,
}

/// The answer for one forwarded record: stored (or a duplicate) in a window, or refused.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardResult {
    #[prost(uint64, tag = "1")]
    pub window_id: u64,
    #[prost(bool, tag = "2")]
    pub duplicate: bool,
    /// 0: stored; 1: a limit; 2: invalid; 3: unavailable.
    #[prost(uint32, tag = "3")]
    pub refused: u32,
    #[prost(string, tag = "4")]
    pub message: String,
}

/// The reply to a [`ForwardRequest`]: one result per record, in order.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ForwardReply {
    #[prost(message, repeated, tag = "1")]
    pub results: Vec<ForwardResult>,
}

impl ForwardResult {
    fn of(result: Result<Appended, AppendError>) -> ForwardResult {
        match result {
            Ok(a) => ForwardResult {
                window_id: a.window_id,
                duplicate: a.duplicate,
                refused: 0,
                message: String::new(),
            },
            Err(e) => ForwardResult {
                window_id: 0,
                duplicate: false,
                refused: match e.kind() {
                    ForwardedKind::Exhausted => 1,
                    ForwardedKind::Invalid => 2,
                    ForwardedKind::Unavailable => 3,
                },
                message: e.to_string(),
            },
        }
    }

    fn into_result(self) -> Result<Appended, AppendError> {
        let kind = match self.refused {
            0 => {
                return Ok(Appended {
                    window_id: self.window_id,
                    duplicate: self.duplicate,
                });
            }
            1 => ForwardedKind::Exhausted,
            2 => ForwardedKind::Invalid,
            _ => ForwardedKind::Unavailable,
        };
        Err(AppendError::Forwarded {
            kind,
            message: self.message,
        })
    }
}

fn count_forwarded(result: &'static str) {
    count_forwarded_n(result, 1);
}

fn count_forwarded_n(result: &'static str, records: usize) {
    metrics::counter!(crate::telemetry::catalog::TX_RECORDS_FORWARDED, "result" => result)
        .increment(records as u64);
}

fn ingest_subject(prefix: &str, node: &str) -> String {
    format!("{prefix}.ingest.{node}")
}

/// Sends each record to the replica that seals its stream: this one's writer, or another replica
/// over NATS (see the module doc). Runs until every sender of its queue is gone.
#[derive(Debug, Clone)]
pub struct Router {
    pub writer: mpsc::Sender<Append>,
    pub leases: StreamLeases,
    pub client: async_nats::Client,
    pub prefix: String,
    pub request_timeout: Duration,
    pub lease: Duration,
    /// How long a record waits for a reachable writer of its stream (`cluster.failover_wait_ms`).
    pub failover_wait: Duration,
}

/// Records the holder of their stream did not take (unreachable, no answer, or it answered that it
/// no longer seals the stream), to be sent again once the lease moves; and why.
struct NotTaken {
    appends: Vec<Append>,
    failure: String,
}

/// How often a waiting record checks whether its stream's lease moved.
const LEASE_POLL: Duration = Duration::from_millis(20);

/// Pause before a record this replica's writer did not store is written here again; it doubles
/// up to [`LOCAL_RETRY_MAX`].
const LOCAL_RETRY_FIRST: Duration = Duration::from_millis(50);
const LOCAL_RETRY_MAX: Duration = Duration::from_millis(800);

/// A record handed to this replica's writer ([`Router::write_here`]): the producer's reply, the
/// writer's answer, and a copy of the record to send it again.
struct Written {
    record: ForwardRecord,
    reply: oneshot::Sender<Result<Appended, AppendError>>,
    answer: oneshot::Receiver<Result<Appended, AppendError>>,
}

impl Router {
    pub async fn run(self, mut input: mpsc::Receiver<Append>) {
        let mut batch = Vec::with_capacity(super::MAX_BATCH);
        while let Some(first) = input.recv().await {
            batch.push(first);
            while batch.len() < super::MAX_BATCH {
                match input.try_recv() {
                    Ok(append) => batch.push(append),
                    Err(_) => break,
                }
            }
            let mut remote: HashMap<String, Vec<Append>> = HashMap::new();
            let mut here = Vec::new();
            for append in batch.drain(..) {
                match self.leases.owner(&append.stream) {
                    // Handed to the writer now, in the order received.
                    Owner::Local => here.extend(self.write_here(append)),
                    Owner::Remote(node) => remote.entry(node).or_default().push(append),
                    Owner::Vacant => {
                        let router = self.clone();
                        let deadline = tokio::time::Instant::now() + router.failover_wait;
                        tokio::spawn(async move {
                            router
                                .deliver(
                                    vec![append],
                                    None,
                                    deadline,
                                    "no replica is known to seal the stream".into(),
                                )
                                .await
                        });
                    }
                }
            }
            if !here.is_empty() {
                let router = self.clone();
                tokio::spawn(async move {
                    if let Some(not_written) = router.answers_here(here).await {
                        let deadline = tokio::time::Instant::now() + router.failover_wait;
                        router.wait_for_writer(not_written, None, deadline);
                    }
                });
            }
            for (node, appends) in remote {
                let router = self.clone();
                tokio::spawn(async move { router.forward(node, appends).await });
            }
        }
    }

    /// Hands `append` to this replica's writer, keeping a copy to send it again should the writer
    /// not store it ([`Self::answers_here`]); `None` when the writer's queue refused it (answered).
    fn write_here(&self, append: Append) -> Option<Written> {
        let Append {
            stream,
            record_id,
            items,
            sensitive_items,
            reply,
        } = append;
        let record = ForwardRecord {
            stream: stream.clone(),
            record_id: record_id.clone(),
            items: items.clone(),
            sensitive_items: sensitive_items.clone(),
        };
        let (to_writer, answer) = oneshot::channel();
        let append = Append {
            stream,
            record_id,
            items,
            sensitive_items,
            reply: to_writer,
        };
        match self.writer.try_send(append) {
            Ok(()) => Some(Written {
                record,
                reply,
                answer,
            }),
            Err(e) => {
                let message = match e {
                    mpsc::error::TrySendError::Full(_) => format!(
                        "the transaction writer's queue is full ({} records waiting); publish the rest again later",
                        self.writer.max_capacity()
                    ),
                    mpsc::error::TrySendError::Closed(_) => {
                        "the transaction writer has stopped".to_string()
                    }
                };
                let _ = reply.send(Err(AppendError::Forwarded {
                    kind: ForwardedKind::Exhausted,
                    message,
                }));
                None
            }
        }
    }

    /// Passes this replica's writer's answers on to the producers as they come, except for records
    /// it did not store for a reason that passes (its store unavailable, e.g. while JetStream elects
    /// a leader after a NATS server died; or the stream's lease gone before they were written):
    /// those are returned, to be sent again. Sending again is safe: the log is idempotent by record
    /// id, so a record stored after all is answered as a duplicate in its window.
    async fn answers_here(&self, written: Vec<Written>) -> Option<NotTaken> {
        let mut not_taken = NotTaken {
            appends: Vec::new(),
            failure: String::new(),
        };
        let mut answers: futures::stream::FuturesUnordered<_> = written
            .into_iter()
            .map(|w| async move { (w.answer.await, w.record, w.reply) })
            .collect();
        while let Some((answer, record, reply)) = answers.next().await {
            match answer {
                Ok(Err(e @ (AppendError::Unavailable(_) | AppendError::NotWriter { .. }))) => {
                    not_taken.failure = format!("this replica did not store it ({e})");
                    not_taken.appends.push(append_of(record, reply));
                }
                Ok(result) => {
                    let _ = reply.send(result);
                }
                Err(_) => {
                    let _ = reply.send(Err(AppendError::Unavailable(
                        "the transaction writer has stopped".into(),
                    )));
                }
            }
        }
        if !not_taken.appends.is_empty() {
            count_forwarded_n("retried", not_taken.appends.len());
            tracing::warn!(records = not_taken.appends.len(), failure = %not_taken.failure, "records not stored here; they wait for a writer of their stream");
        }
        (!not_taken.appends.is_empty()).then_some(not_taken)
    }

    /// Has the records `not_taken` wait for their streams' writers ([`Self::deliver`], one task per
    /// stream) until `deadline`; `failed`: the replica that did not take them, if another.
    fn wait_for_writer(
        &self,
        not_taken: NotTaken,
        failed: Option<String>,
        deadline: tokio::time::Instant,
    ) {
        let mut by_stream: HashMap<String, Vec<Append>> = HashMap::new();
        for append in not_taken.appends {
            by_stream
                .entry(append.stream.clone())
                .or_default()
                .push(append);
        }
        for (_, appends) in by_stream {
            let router = self.clone();
            let (failed, failure) = (failed.clone(), not_taken.failure.clone());
            tokio::spawn(async move { router.deliver(appends, failed, deadline, failure).await });
        }
    }

    /// Sends `appends` to `node` in requests of at most [`MAX_FORWARD_BYTES`], one after the other,
    /// and answers each record with its result; records `node` did not take wait for their stream's
    /// lease to move ([`Self::deliver`]).
    async fn forward(&self, node: String, appends: Vec<Append>) {
        let deadline = tokio::time::Instant::now() + self.failover_wait;
        for chunk in chunks(appends) {
            if let Some(not_taken) = self.send(&node, chunk).await {
                self.wait_for_writer(not_taken, Some(node.clone()), deadline);
            }
        }
    }

    /// Delivers records of one stream whose writer did not take them (`failed`, or nobody known),
    /// as soon as the stream's lease is held by this replica or another reachable one, until
    /// `deadline`; records still not taken then are refused with [`AppendError::NoWriter`].
    async fn deliver(
        &self,
        mut appends: Vec<Append>,
        mut failed: Option<String>,
        deadline: tokio::time::Instant,
        mut failure: String,
    ) {
        let stream = appends[0].stream.clone();
        let started = tokio::time::Instant::now();
        let mut pause = LOCAL_RETRY_FIRST;
        while let Some(owner) = self.next_holder(&stream, failed.as_deref(), deadline).await {
            match owner {
                Owner::Remote(node) => match self.send(&node, appends).await {
                    None => return,
                    Some(not_taken) => {
                        appends = not_taken.appends;
                        failure = not_taken.failure;
                        failed = Some(node);
                    }
                },
                _ => {
                    let written = appends
                        .into_iter()
                        .filter_map(|a| self.write_here(a))
                        .collect();
                    match self.answers_here(written).await {
                        None => return,
                        Some(not_taken) => {
                            appends = not_taken.appends;
                            failure = not_taken.failure;
                            failed = None;
                            // The writer's store fails at once while JetStream has no leader:
                            // give it a moment (doubling) before writing again.
                            let left =
                                deadline.saturating_duration_since(tokio::time::Instant::now());
                            tokio::time::sleep(pause.min(left)).await;
                            pause = (pause * 2).min(LOCAL_RETRY_MAX);
                        }
                    }
                }
            }
        }
        let waited = started.elapsed();
        tracing::warn!(
            stream = %quote(&stream),
            records = appends.len(),
            waited_ms = waited.as_millis() as u64,
            "no replica took the records within cluster.failover_wait_ms; refused"
        );
        count_forwarded_n("no_writer", appends.len());
        for append in appends {
            let _ = append.reply.send(Err(AppendError::NoWriter {
                stream: append.stream,
                waited_ms: waited.as_millis() as u64,
                detail: failure.clone(),
            }));
        }
    }

    /// Waits until `stream` is sealed here or by a replica other than `failed` (`failed` itself
    /// again after a third of a lease: it may only have been slow); `None` at `deadline`.
    async fn next_holder(
        &self,
        stream: &str,
        failed: Option<&str>,
        deadline: tokio::time::Instant,
    ) -> Option<Owner> {
        let key = stream_dir_name(stream);
        let retry_failed_at = tokio::time::Instant::now() + (self.lease / 3).max(LEASE_POLL);
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return None;
            }
            let owner = match self.leases.owner(stream) {
                Owner::Vacant => {
                    let wait = (deadline - now).min(self.lease / 3).max(LEASE_POLL);
                    self.leases.0.resolve(&key, wait).await
                }
                owner => owner,
            };
            match &owner {
                Owner::Local => return Some(owner),
                Owner::Remote(node) if Some(node.as_str()) != failed || now >= retry_failed_at => {
                    return Some(owner);
                }
                _ => tokio::time::sleep(LEASE_POLL.min(deadline - now)).await,
            }
        }
    }

    /// One request to `node` with `chunk`; answers the records it took (stored, duplicate, or
    /// refused for a reason of theirs) and returns the ones it did not take, and why. A request
    /// still unanswered when the stream's lease moves away from `node` is given up (the records are
    /// sent again to the new holder, which answers a record `node` stored as a duplicate).
    async fn send(&self, node: &str, chunk: Vec<Append>) -> Option<NotTaken> {
        let subject = ingest_subject(&self.prefix, node);
        let (records, replies): (Vec<ForwardRecord>, Vec<oneshot::Sender<_>>) = chunk
            .into_iter()
            .map(|a| {
                (
                    ForwardRecord {
                        stream: a.stream,
                        record_id: a.record_id,
                        items: a.items,
                        sensitive_items: a.sensitive_items,
                    },
                    a.reply,
                )
            })
            .unzip();
        let payload = prost::Message::encode_to_vec(&ForwardRequest {
            records: records.clone(),
        });
        let streams: Vec<String> = {
            let mut s: Vec<String> = records.iter().map(|r| r.stream.clone()).collect();
            s.sort();
            s.dedup();
            s
        };
        // Given up early when the lease leaves `node`, or when this client reconnected to NATS (the
        // request or its answer may have been lost with the old connection).
        let connects = || {
            self.client
                .statistics()
                .connects
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let connected = connects();
        let moved = async {
            let holder = Owner::Remote(node.to_string());
            loop {
                tokio::time::sleep(LEASE_POLL).await;
                if streams.iter().any(|s| self.leases.owner(s) != holder) {
                    return "stopped sealing the stream before it answered";
                }
                if connects() != connected {
                    return "did not answer before this replica reconnected to NATS";
                }
            }
        };
        let answer = tokio::select! {
            answer = tokio::time::timeout(
                self.request_timeout,
                self.client.request(subject, payload.into()),
            ) => Ok(answer),
            why = moved => Err(why),
        };
        let failure = match answer {
            Ok(Ok(Ok(message))) => {
                match <ForwardReply as prost::Message>::decode(message.payload.as_ref()) {
                    Ok(reply) if reply.results.len() == replies.len() => {
                        let mut not_taken = NotTaken {
                            appends: Vec::new(),
                            failure: String::new(),
                        };
                        for ((result, reply), record) in
                            reply.results.into_iter().zip(replies).zip(records)
                        {
                            let result = result.into_result();
                            if let Err(AppendError::Forwarded {
                                kind: ForwardedKind::Unavailable,
                                message,
                            }) = &result
                            {
                                // Not stored there (it lost the lease, or its store failed):
                                // wait for the stream's next holder.
                                not_taken.failure = format!("replica {node:?} answered: {message}");
                                not_taken.appends.push(append_of(record, reply));
                                continue;
                            }
                            count_forwarded(match &result {
                                Ok(a) if a.duplicate => "duplicate",
                                Ok(_) => "stored",
                                Err(_) => "refused",
                            });
                            let _ = reply.send(result);
                        }
                        return (!not_taken.appends.is_empty()).then_some(not_taken);
                    }
                    Ok(_) => "answered for a different number of records".to_string(),
                    Err(e) => format!("sent an unreadable answer ({e})"),
                }
            }
            Ok(Ok(Err(e))) => format!("could not be reached ({e})"),
            Ok(Err(_)) => format!(
                "did not answer within {} ms (cluster.request_timeout_ms)",
                self.request_timeout.as_millis()
            ),
            Err(why) => why.to_string(),
        };
        let failure = format!("replica {node:?} {failure}");
        tracing::warn!(records = replies.len(), failure = %failure, "forwarding records failed; they wait for the stream's lease");
        count_forwarded_n("failed", replies.len());
        Some(NotTaken {
            appends: records
                .into_iter()
                .zip(replies)
                .map(|(r, reply)| append_of(r, reply))
                .collect(),
            failure,
        })
    }
}

fn append_of(
    record: ForwardRecord,
    reply: oneshot::Sender<Result<Appended, AppendError>>,
) -> Append {
    Append {
        stream: record.stream,
        record_id: record.record_id,
        items: record.items,
        sensitive_items: record.sensitive_items,
        reply,
    }
}

/// `appends` in chunks of about half of [`MAX_FORWARD_BYTES`] each (one request per chunk).
fn chunks(appends: Vec<Append>) -> Vec<Vec<Append>> {
    let mut out = Vec::new();
    let mut chunk: Vec<Append> = Vec::new();
    let mut bytes = 0usize;
    for append in appends {
        bytes += append.record_id.len()
            + append.stream.len()
            + append.items.iter().map(|i| i.len() + 2).sum::<usize>()
            + append
                .sensitive_items
                .iter()
                .map(|i| i.len() + 2)
                .sum::<usize>()
            + 16;
        chunk.push(append);
        if bytes >= MAX_FORWARD_BYTES / 2 {
            out.push(std::mem::take(&mut chunk));
            bytes = 0;
        }
    }
    if !chunk.is_empty() {
        out.push(chunk);
    }
    out
}

/// How a replica checks a forwarded record: the gRPC adapter's own validation of a published
/// record (the same rules and messages as on its Publish stream), passed in so that this layer
/// does not import the adapter.
pub type Validate = fn(&crate::proto::Transaction, &TransactionsConfig) -> Result<(), String>;

/// Serves the records other replicas forward to this one (see the module doc), until the
/// subscription ends. Each record is checked with `validate` before it reaches the writer.
pub async fn serve_ingest(
    client: async_nats::Client,
    mut requests: async_nats::Subscriber,
    writer: mpsc::Sender<Append>,
    config: watch::Receiver<Arc<TransactionsConfig>>,
    validate: Validate,
) {
    while let Some(message) = requests.next().await {
        let Some(reply_to) = message.reply.clone() else {
            continue;
        };
        let client = client.clone();
        let writer = writer.clone();
        let config = config.borrow().clone();
        tokio::spawn(async move {
            let request = match <ForwardRequest as prost::Message>::decode(message.payload.as_ref())
            {
                Ok(request) => request,
                Err(e) => {
                    tracing::warn!(error = %e, "unreadable forwarded records; ignored");
                    return;
                }
            };
            let mut pending = Vec::with_capacity(request.records.len());
            for record in request.records {
                let (reply, answer) = oneshot::channel();
                let t = crate::proto::Transaction {
                    stream: record.stream,
                    record_id: record.record_id,
                    items: record.items,
                    sensitive_items: record.sensitive_items,
                };
                if let Err(message) = validate(&t, &config) {
                    pending.push(Err(AppendError::Forwarded {
                        kind: ForwardedKind::Invalid,
                        message,
                    }));
                    continue;
                }
                let append = Append::of(t, reply);
                match writer.try_send(append) {
                    Ok(()) => pending.push(Ok(answer)),
                    Err(_) => pending.push(Err(AppendError::Forwarded {
                        kind: ForwardedKind::Exhausted,
                        message: format!(
                            "the transaction writer's queue is full ({} records waiting); publish the rest again later",
                            writer.max_capacity()
                        ),
                    })),
                }
            }
            let mut results = Vec::with_capacity(pending.len());
            for p in pending {
                let result = match p {
                    Ok(answer) => answer.await.unwrap_or_else(|_| {
                        Err(AppendError::Unavailable(
                            "the transaction writer has stopped".into(),
                        ))
                    }),
                    Err(e) => Err(e),
                };
                results.push(ForwardResult::of(result));
            }
            let payload = prost::Message::encode_to_vec(&ForwardReply { results });
            if let Err(e) = client.publish(reply_to, payload.into()).await {
                tracing::warn!(error = %e, "cannot answer forwarded records");
            }
        });
    }
}

/// Announces releases stored by any replica to this replica's subscribers (see the module doc),
/// until the subscription ends.
pub async fn watch_releases(
    mut releases_seen: async_nats::Subscriber,
    handles: Arc<Mutex<HashMap<String, Arc<StreamHandle>>>>,
    store: Arc<dyn ReleaseStore>,
    resync: Duration,
) {
    let handle_of = |stream: &str| {
        handles
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .get(stream)
            .cloned()
    };
    let mut tick = tokio::time::interval(resync);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            message = releases_seen.next() => {
                let Some(message) = message else { return };
                // <prefix>.releases.<hex stream>.<window id>
                let mut tokens = message.subject.as_str().rsplit('.');
                let window = tokens.next().and_then(|w| w.parse::<u64>().ok());
                let stream = tokens.next().and_then(stream_name_of_dir);
                // The message reaches plain subscribers when the server takes it in, which may
                // be before it is stored (or when it is refused as a second write of the window):
                // announce the window only once it can be read.
                if let (Some(window), Some(stream)) = (window, stream)
                    && let Some(handle) = handle_of(&stream)
                {
                    let store = store.clone();
                    tokio::spawn(async move {
                        for _ in 0..50 {
                            if let Ok(Some(_)) = store.read(&stream, window).await {
                                announce(&handle, window + 1);
                                return;
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    });
                }
            }
            _ = tick.tick() => {
                let watched: Vec<(String, Arc<StreamHandle>)> = handles
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .iter()
                    .filter(|(_, h)| h.released_upto.receiver_count() > 0)
                    .map(|(name, h)| (name.clone(), Arc::clone(h)))
                    .collect();
                for (name, handle) in watched {
                    match store.next_unreleased(&name).await {
                        Ok(next) => announce(&handle, next),
                        Err(e) => tracing::warn!(stream = %name, error = %e, "cannot read the release store"),
                    }
                }
            }
        }
    }
}

/// Windows below `upto` are stored: announce them (never moving back).
fn announce(handle: &StreamHandle, upto: u64) {
    handle.released_upto.send_if_modified(|current| {
        let advanced = upto > *current;
        *current = (*current).max(upto);
        advanced
    });
}

/// What a replica runs for its transaction streams in a cluster: opened by
/// [`super::TransactionServices::start_cluster`].
#[derive(Debug, Clone)]
pub struct ClusterStreams {
    pub leases: StreamLeases,
}

impl ClusterStreams {
    /// Whether `stream` exists in the deployment (some replica has contended for it).
    pub async fn exists(&self, stream: &str) -> bool {
        self.leases
            .0
            .ever_leased(&stream_dir_name(stream))
            .await
            .unwrap_or(false)
    }

    /// Leases for the streams of `cluster`, in its bucket `<prefix>_leases`.
    pub async fn leases(cluster: &Cluster) -> Result<StreamLeases, crate::cluster::ClusterError> {
        let kv = cluster.lease_bucket().await?;
        let table = LeaseTable::new(kv, "stream", &cluster.node_id, cluster.config.lease);
        table.follow_all();
        Ok(StreamLeases(table))
    }
}
