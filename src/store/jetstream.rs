//! The record log and the release store on NATS JetStream, for replicas sharing one deployment:
//! [`JetStreamRecordLog`] ([`RecordLog`]) and [`JetStreamReleases`] ([`ReleaseStore`]).
//!
//! # Layout (any NATS client may read it)
//! With the subject prefix `P` (e.g. `cloakd`) and `S` = lower-case hex of the transaction stream's
//! UTF-8 name ([`super::stream_dir_name`], so any name is one subject token):
//! * JetStream stream `<P upper-cased>_RECORDS`, subjects `P.records.>`, `cluster.replicas`
//!   replicas, file storage. Transaction stream S is the subject `P.records.S`: each message is a
//!   batch of its entries in order, the protobuf `WireBatch { repeated bytes entries = 1; }`, each
//!   element an entry's storage encoding ([`LogEntry::encode`], protobuf `WireEntry` of
//!   `store::record_log`: a record, or a window close). A [`LogPosition`] is a stream sequence
//!   (0 = the start).
//! * Each batch message carries `Nats-Expected-Last-Subject-Sequence: F` (the fence, below) and
//!   `Nats-Msg-Id: S.F.D`, where D is the lower-case hex of the first 16 bytes of the SHA-256 of
//!   the payload ([`BatchMessage`]). The id is opaque: it names no record id (record ids may be
//!   user data). It is per batch, not per record, because JetStream de-duplicates whole messages
//!   and a message holds many records (one message per record would cost most of the throughput,
//!   and the fence cannot be pipelined); idempotence by record id comes from the log itself
//!   (below). What the id gives is a safe retry of one publish: the same batch at the same fence
//!   has the same id, any other batch has another one.
//! * JetStream stream `<P upper-cased>_RELEASES`, subjects `P.releases.>`. Window w of stream S is
//!   one message on `P.releases.S.<w>` with header `Cloakd-Outcome: released` and the encoded
//!   `cloakd.v1.ReleasedWindow` as payload, or `Cloakd-Outcome: failed` and the reason (UTF-8).
//!   A consumer reads a stream's releases in order with a consumer filtered on `P.releases.S.*`.
//!
//! # How the contracts are met
//! * **Fenced appends.** Each log remembers, per transaction stream, the last sequence on the
//!   stream's subject that it has read (by [`RecordLog::replay`], and at open) or appended: its
//!   *fence*. Every batch message is published with `Nats-Expected-Last-Subject-Sequence` = the
//!   fence, so JetStream stores it only if nothing was appended to that stream since this log last
//!   looked. A writer whose view is stale (a replica that lost its lease while paused, a second
//!   writer) has its append refused, acknowledges nothing, and must replay first (contract 2), which
//!   brings its windows up to date. Two writers can therefore never interleave records and closes
//!   of one stream, whatever the timing of leases: the lease decides who *should* write; the fence
//!   makes a wrong writer harmless.
//! * **Durable before acknowledged:** an append returns once JetStream's PubAck of every message has
//!   arrived (stored on a quorum of the stream's replicas).
//! * **A lost PubAck is not a failed append.** When publishing a batch or awaiting its PubAck fails
//!   in a way that may pass (a timeout, no responders, a lost connection, a 503 or a 409 "message
//!   id in process" while a leader moves), the *identical* message (same id, same expected
//!   sequence, same bytes) is published again, after 100, 200 and 400 ms, and then every 400 ms
//!   until [`Patience::total`] has passed (a replica uses `cluster.request_timeout_ms`); an
//!   attempt unanswered after [`Patience::attempt`] (a replica: 1 s) is given up and made again,
//!   so the first attempt after a JetStream leader election is answered at once instead of after
//!   a whole request timeout. A replay retries its reads likewise. If an earlier attempt
//!   was stored, a replicated stream answers with the original sequence and `duplicate = true`
//!   (nats-server checks the id before the expected sequence there, within the stream's
//!   `duplicate_window` of 120 s), which is success. A stream of one replica (and any stream past
//!   the window) checks the expected sequence first and refuses the retry as "wrong last
//!   sequence"; on that refusal, the last message on the stream's subject is read, and if it
//!   carries this very id, it is this batch, stored: success with its sequence. Safe because the
//!   id covers fence and content: a different batch at the same fence has another id and stays
//!   refused by the fence.
//! * **Idempotent by id, forever:** the log knows every record id and closed window of what it has
//!   read or appended. An entry among them is answered as a duplicate; any other entry stored
//!   since, by another writer, lies behind the fence, so the append fails instead of storing it
//!   twice, and after the replay the entry is known. [`RecordLog::windows_of`] answers from the same
//!   knowledge, with the same reasoning.
//! * **A close only after its records:** a stream's entries of a batch go in one message (or, past
//!   [`MAX_BATCH_MESSAGE_BYTES`], in several published one after the other, each expecting the one
//!   before), so a durable close never lacks an earlier record of the batch.
//! * **Releases once:** `Nats-Expected-Last-Subject-Sequence: 0` on `P.releases.S.<w>`: the first
//!   write of a window is the only one, so a deposed lease holder (or any second replica) cannot
//!   replace a release; every reader gets the first write's bytes.
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::{self, context::Publish, stream};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use tokio::sync::Mutex;

use super::{
    EntryOutcome, LogEntry, LogPosition, RecordLog, ReleaseStore, Replayed, StoreError, Stored,
    WindowOutcome, stream_dir_name,
};

/// Header saying what a release message holds.
pub const OUTCOME_HEADER: &str = "Cloakd-Outcome";

fn unavailable(action: &'static str) -> impl FnOnce(String) -> StoreError {
    move |detail| StoreError::Unavailable { action, detail }
}

/// Where a deployment keeps its streams.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Subject prefix, e.g. `cloakd`.
    pub prefix: String,
    /// Replicas of each JetStream stream (`cluster.replicas`).
    pub replicas: usize,
}

impl Layout {
    fn stream_name(&self, kind: &str) -> String {
        format!(
            "{}_{kind}",
            self.prefix.to_ascii_uppercase().replace('.', "_")
        )
    }

    /// The subject of every batch message of transaction stream `stream`.
    fn records_subject(&self, stream: &str) -> String {
        format!("{}.records.{}", self.prefix, stream_dir_name(stream))
    }

    fn release_subject(&self, stream: &str, window_id: u64) -> String {
        format!(
            "{}.releases.{}.{window_id}",
            self.prefix,
            stream_dir_name(stream)
        )
    }

    async fn stream(
        &self,
        js: &jetstream::Context,
        kind: &str,
        subjects: String,
    ) -> Result<stream::Stream, StoreError> {
        js.get_or_create_stream(stream::Config {
            name: self.stream_name(kind),
            subjects: vec![subjects],
            num_replicas: self.replicas,
            storage: stream::StorageType::File,
            duplicate_window: Duration::from_secs(120),
            allow_direct: true,
            ..Default::default()
        })
        .await
        .map_err(|e| e.to_string())
        .map_err(unavailable("opening a JetStream stream"))
    }
}

/// Largest payload of one batch message: below NATS's default `max_payload` (1 MiB). A batch of a
/// stream that encodes larger is split into several messages, published in order; an entry that
/// alone is larger goes in a message of its own (and fails with the server's error if the server
/// refuses it).
pub const MAX_BATCH_MESSAGE_BYTES: usize = 512 * 1024;

/// Reads of the log a replay retries after a failure before it fails.
const REPLAY_ATTEMPTS: u32 = 5;

/// Times a batch message is published again after a failure that may pass; the waits before them
/// double from [`PUBLISH_BACKOFF`] (100, 200, 400 ms); more within [`Patience::total`].
const PUBLISH_RETRIES: u32 = 3;

/// Wait before the first publish retry.
const PUBLISH_BACKOFF: Duration = Duration::from_millis(100);

/// Bytes of the payload's SHA-256 in a batch message id (as 32 hex digits).
const MESSAGE_ID_DIGEST_BYTES: usize = 16;

/// A batch message of the record log as it is published, every attempt alike (module doc,
/// Layout): public so that tests and tools can rebuild what a log publishes.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchMessage {
    /// `P.records.S`.
    pub subject: String,
    /// `Nats-Msg-Id`: `S.F.D`.
    pub message_id: String,
    /// `Nats-Expected-Last-Subject-Sequence`: the fence F.
    pub expected_last_subject_sequence: u64,
    /// The encoded `WireBatch`.
    pub payload: Bytes,
}

impl BatchMessage {
    /// The message holding `encoded` (entries of transaction stream `stream` in their storage
    /// encoding, in order) published on top of the sequence `fence`.
    pub fn new(layout: &Layout, stream: &str, fence: u64, encoded: Vec<Vec<u8>>) -> BatchMessage {
        let payload = Bytes::from(prost::Message::encode_to_vec(&WireBatch {
            entries: encoded,
        }));
        let digest = Sha256::digest(&payload);
        BatchMessage {
            subject: layout.records_subject(stream),
            message_id: format!(
                "{}.{fence}.{}",
                stream_dir_name(stream),
                hex::encode(&digest[..MESSAGE_ID_DIGEST_BYTES])
            ),
            expected_last_subject_sequence: fence,
            payload,
        }
    }

    /// Publishes this message (one attempt) and waits for its PubAck.
    pub async fn send(&self, js: &jetstream::Context) -> Result<PublishAck, PublishError> {
        let publish = Publish::build()
            .payload(self.payload.clone())
            .message_id(&self.message_id)
            .expected_last_subject_sequence(self.expected_last_subject_sequence);
        js.send_publish(self.subject.clone(), publish).await?.await
    }
}

/// What to do after a failed publish of a batch message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PublishFailure {
    /// The fence refused it: stored only if the last message on the subject is this one.
    Fenced,
    /// It may pass (timeout, no responders, connection, leader moving): publish it again.
    Transient,
    /// Anything else: the append fails.
    Final,
}

impl PublishFailure {
    /// Decides from the error's kind and, for an error answered by JetStream, its status
    /// (`code`: 503 unavailable, 409 "duplicate message id is in process").
    fn of(kind: PublishErrorKind, api_status: Option<usize>) -> PublishFailure {
        match kind {
            PublishErrorKind::WrongLastSequence => PublishFailure::Fenced,
            // async-nats reports a 503 "no responders" as StreamNotFound: while a stream's leader
            // moves, or its server restarts, nobody may answer for a moment.
            PublishErrorKind::TimedOut
            | PublishErrorKind::BrokenPipe
            | PublishErrorKind::StreamNotFound => PublishFailure::Transient,
            PublishErrorKind::Other if matches!(api_status, Some(503 | 409)) => {
                PublishFailure::Transient
            }
            _ => PublishFailure::Final,
        }
    }

    fn of_error(error: &PublishError) -> PublishFailure {
        let api_status = std::error::Error::source(error)
            .and_then(|source| source.downcast_ref::<jetstream::Error>())
            .map(jetstream::Error::code);
        PublishFailure::of(error.kind(), api_status)
    }
}

/// Storage encoding of one batch message: the entries' own encodings ([`LogEntry::encode`]), in
/// order (protobuf, field 1 `repeated bytes`).
#[derive(Clone, PartialEq, prost::Message)]
struct WireBatch {
    #[prost(bytes = "vec", repeated, tag = "1")]
    entries: Vec<Vec<u8>>,
}

/// What this log has read of one transaction stream.
#[derive(Debug, Default)]
struct StreamSeen {
    /// The last sequence on the stream's subject read by [`RecordLog::replay`] or appended here:
    /// the fence every append of the stream expects (0: nothing).
    fence: u64,
    /// Record id -> window, of every record read or appended.
    records: HashMap<String, u64>,
    /// Windows whose close was read or appended.
    closed: HashSet<u64>,
}

impl StreamSeen {
    fn learn(&mut self, entry: &LogEntry) {
        match entry {
            LogEntry::Record(r) => {
                self.records.insert(r.record_id.clone(), r.window_id);
            }
            LogEntry::Close(c) => {
                self.closed.insert(c.window_id);
            }
        }
    }

    /// The outcome `entry` would have if it were appended now: a duplicate of what was read.
    fn duplicate(&self, entry: &LogEntry) -> Option<EntryOutcome> {
        match entry {
            LogEntry::Record(r) => self
                .records
                .get(&r.record_id)
                .map(|&window_id| EntryOutcome::Duplicate { window_id }),
            LogEntry::Close(c) => {
                self.closed
                    .contains(&c.window_id)
                    .then_some(EntryOutcome::Duplicate {
                        window_id: c.window_id,
                    })
            }
        }
    }
}

/// The record log of a deployment on JetStream (see the module doc).
#[derive(Debug, Clone)]
pub struct JetStreamRecordLog {
    js: jetstream::Context,
    stream: stream::Stream,
    layout: Layout,
    patience: Patience,
    /// Per transaction stream, what this log has read; one append or replay at a time.
    seen: Arc<Mutex<HashMap<String, StreamSeen>>>,
}

/// How long the record log waits on JetStream (module doc, "A lost PubAck is not a failed
/// append"): each request (a publish awaiting its PubAck, each step of a read) may take `attempt`
/// before it is given up and, being idempotent, made again; a failure that may pass is retried
/// until `total` has passed since the first attempt, and at least [`PUBLISH_RETRIES`] times for a
/// publish and [`REPLAY_ATTEMPTS`] times for a replay. While a JetStream leader is being elected
/// (a NATS server died) requests fail at once (no responders) or go unanswered; a short `attempt`
/// lets the first request after the election through without waiting out a long timeout.
#[derive(Debug, Clone, Copy, Default)]
pub struct Patience {
    /// `None`: the JetStream context's own request timeout.
    pub attempt: Option<Duration>,
    pub total: Duration,
}

/// Longest wait before a failed publish or read of the log is made again, when its requests are
/// given up after [`Patience::attempt`].
const RETRY_PAUSE_MAX: Duration = Duration::from_millis(400);

impl JetStreamRecordLog {
    /// `work`, given up after [`Patience::attempt`]; its error as unavailable while `action`.
    async fn within<T, E: std::fmt::Display>(
        &self,
        action: &'static str,
        work: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, StoreError> {
        let result = match self.patience.attempt {
            Some(limit) => match tokio::time::timeout(limit, work).await {
                Ok(result) => result.map_err(|e| e.to_string()),
                Err(_) => Err(format!("no answer within {} ms", limit.as_millis())),
            },
            None => work.await.map_err(|e| e.to_string()),
        };
        result.map_err(unavailable(action))
    }

    /// Whether a failed request, first made at `started` and retried `retries` times, is made
    /// again ([`Patience`]).
    fn retry(&self, started: tokio::time::Instant, retries: u32, at_least: u32) -> bool {
        retries < at_least || started.elapsed() < self.patience.total
    }

    /// The pause before retry `retry + 1` of a request: `first` doubling with each retry, at most
    /// [`RETRY_PAUSE_MAX`] when requests are given up after [`Patience::attempt`].
    fn pause(&self, first: Duration, retry: u32) -> Duration {
        let pause = first * 2u32.pow(retry.min(6));
        match self.patience.attempt {
            Some(_) => pause.min(RETRY_PAUSE_MAX),
            None => pause,
        }
    }

    /// The last sequence of the record stream and the entries of the messages from `start` to it.
    async fn read_from(&self, start: u64) -> Result<(u64, Vec<(u64, LogEntry)>), StoreError> {
        let mut stream = self.stream.clone();
        let last = self
            .within("reading the record log", stream.info())
            .await?
            .state
            .last_sequence;
        Ok((last, self.read_range(start, last).await?))
    }

    /// The entries of the messages with sequences `start..=last`, in order (nothing if
    /// `start > last`). Fails if the messages end before `last`.
    async fn read_range(&self, start: u64, last: u64) -> Result<Vec<(u64, LogEntry)>, StoreError> {
        const ACTION: &str = "replaying the record log";
        let mut entries = Vec::new();
        if start > last {
            return Ok(entries);
        }
        let consumer = self
            .within(
                ACTION,
                self.stream
                    .clone()
                    .create_consumer(jetstream::consumer::pull::OrderedConfig {
                        deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                            start_sequence: start,
                        },
                        ..Default::default()
                    }),
            )
            .await?;
        let mut messages = self.within(ACTION, consumer.messages()).await?;
        loop {
            let next = self
                .within(ACTION, async {
                    messages.next().await.ok_or_else(|| {
                        format!("the messages ended before sequence {last} was read")
                    })
                })
                .await?;
            let message = next.map_err(|e| unavailable(ACTION)(e.to_string()))?;
            let sequence = message
                .info()
                .map_err(|e| unavailable("replaying the record log")(e.to_string()))?
                .stream_sequence;
            if sequence > last {
                break;
            }
            let batch = <WireBatch as prost::Message>::decode(message.payload.as_ref())
                .map_err(|e| unavailable("replaying the record log")(e.to_string()))?;
            for bytes in batch.entries {
                let entry =
                    LogEntry::decode(&bytes).map_err(unavailable("replaying the record log"))?;
                entries.push((sequence, entry));
            }
            if sequence == last {
                break;
            }
        }
        Ok(entries)
    }

    /// Opens (creating) the deployment's record stream and reads it whole, so that ids already in
    /// the log are known and this log's appends expect what it has read.
    pub async fn open(
        js: jetstream::Context,
        layout: Layout,
    ) -> Result<JetStreamRecordLog, StoreError> {
        Self::open_with(js, layout, Patience::default()).await
    }

    /// As [`Self::open`], waiting on JetStream as `patience` says.
    pub async fn open_with(
        js: jetstream::Context,
        layout: Layout,
        patience: Patience,
    ) -> Result<JetStreamRecordLog, StoreError> {
        let subjects = format!("{}.records.>", layout.prefix);
        let stream = layout.stream(&js, "RECORDS", subjects).await?;
        let log = JetStreamRecordLog {
            js,
            stream,
            layout,
            patience,
            seen: Arc::new(Mutex::new(HashMap::new())),
        };
        log.replay(LogPosition::START).await?;
        Ok(log)
    }

    /// Publishes `encoded` (entries of `stream`, in their storage encoding) as one message that
    /// JetStream stores only if the last message on the stream's subject is still `fence`; returns
    /// the new message's sequence. A failure that may pass is retried with the identical message,
    /// and an attempt found stored counts as success (module doc).
    async fn publish_batch(
        &self,
        stream: &str,
        fence: u64,
        encoded: Vec<Vec<u8>>,
    ) -> Result<u64, StoreError> {
        let message = BatchMessage::new(&self.layout, stream, fence, encoded);
        let started = tokio::time::Instant::now();
        let mut retries = 0;
        loop {
            let sent = match self.patience.attempt {
                Some(limit) => tokio::time::timeout(limit, message.send(&self.js))
                    .await
                    .unwrap_or_else(|_| Err(PublishError::from(PublishErrorKind::TimedOut))),
                None => message.send(&self.js).await,
            };
            let error = match sent {
                // `duplicate`: an earlier attempt was stored, at this sequence.
                Ok(ack) => return Ok(ack.sequence),
                Err(error) => error,
            };
            match PublishFailure::of_error(&error) {
                PublishFailure::Fenced => return self.stored_before(&message, stream).await,
                PublishFailure::Transient if self.retry(started, retries, PUBLISH_RETRIES) => {
                    retries += 1;
                    tracing::warn!(error = %error, retry = retries, "appending to the record log failed; publishing the same batch again");
                    tokio::time::sleep(self.pause(PUBLISH_BACKOFF, retries - 1)).await;
                }
                _ => {
                    return Err(unavailable("appending to the record log")(
                        error.to_string(),
                    ));
                }
            }
        }
    }

    /// After the fence refused `message`: its sequence if it is the last message on its subject
    /// (an earlier attempt stored it and its PubAck was lost), else the fence's error.
    async fn stored_before(&self, message: &BatchMessage, stream: &str) -> Result<u64, StoreError> {
        if let Ok(last) = self
            .stream
            .get_last_raw_message_by_subject(&message.subject)
            .await
        {
            let id = last
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .map(|id| id.as_str());
            if id == Some(message.message_id.as_str()) {
                tracing::info!(
                    sequence = last.sequence,
                    "a batch of the record log was stored by an earlier attempt whose PubAck was lost"
                );
                return Ok(last.sequence);
            }
        }
        Err(StoreError::Unavailable {
            action: "appending to the record log",
            detail: format!(
                "transaction stream {stream:?} was appended to by another writer since this one last read it (expected last sequence {}); replay the log before appending again",
                message.expected_last_subject_sequence
            ),
        })
    }

    /// Appends `entries` of one stream in messages of at most [`MAX_BATCH_MESSAGE_BYTES`], each
    /// expecting the previous one, learning each as it is acknowledged.
    async fn append_stream(
        &self,
        seen: &mut StreamSeen,
        stream: &str,
        entries: Vec<&LogEntry>,
    ) -> Result<(), StoreError> {
        // Each entry is encoded once: for its size here and as its bytes in the message.
        let mut chunks: Vec<(Vec<&LogEntry>, Vec<Vec<u8>>)> = vec![Default::default()];
        let mut bytes = 0usize;
        for entry in entries {
            let encoded = entry.encode();
            let size = encoded.len() + 8;
            let (chunk, _) = chunks.last().expect("one chunk at least");
            if !chunk.is_empty() && bytes + size > MAX_BATCH_MESSAGE_BYTES {
                chunks.push(Default::default());
                bytes = 0;
            }
            bytes += size;
            let (chunk, chunk_bytes) = chunks.last_mut().expect("one chunk at least");
            chunk.push(entry);
            chunk_bytes.push(encoded);
        }
        for (chunk, encoded) in chunks {
            if chunk.is_empty() {
                continue;
            }
            seen.fence = self.publish_batch(stream, seen.fence, encoded).await?;
            for entry in chunk {
                seen.learn(entry);
            }
        }
        Ok(())
    }
}

#[async_trait]
impl RecordLog for JetStreamRecordLog {
    async fn append(&self, batch: Vec<LogEntry>) -> Result<Vec<EntryOutcome>, StoreError> {
        let mut seen = self.seen.lock().await;
        // Outcomes first: an id read before, or repeated earlier in this batch, is a duplicate.
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut new: HashMap<&str, (StreamSeen, Vec<&LogEntry>)> = HashMap::new();
        for entry in &batch {
            let known = seen.get(entry.stream());
            let (staged, entries) = new.entry(entry.stream()).or_default();
            match known
                .and_then(|k| k.duplicate(entry))
                .or_else(|| staged.duplicate(entry))
            {
                Some(duplicate) => outcomes.push(duplicate),
                None => {
                    staged.learn(entry);
                    entries.push(entry);
                    outcomes.push(EntryOutcome::Appended);
                }
            }
        }
        // Then each stream's new entries, the streams side by side.
        let mut work = Vec::new();
        for (stream, (_, entries)) in new {
            if entries.is_empty() {
                continue;
            }
            let mut stream_seen = seen.remove(stream).unwrap_or_default();
            work.push(async move {
                let result = self.append_stream(&mut stream_seen, stream, entries).await;
                (stream, stream_seen, result)
            });
        }
        let mut first_error = None;
        for (stream, stream_seen, result) in futures::future::join_all(work).await {
            seen.insert(stream.to_string(), stream_seen);
            if let Err(e) = result {
                first_error.get_or_insert(e);
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(outcomes),
        }
    }

    async fn windows_of(&self, records: &[(&str, &str)]) -> Result<Vec<Option<u64>>, StoreError> {
        // What this log has read is enough: an id stored by another writer since is behind the
        // fence, so the append of the batch asking fails and its writer replays (module doc).
        let seen = self.seen.lock().await;
        Ok(records
            .iter()
            .map(|(stream, id)| seen.get(*stream)?.records.get(*id).copied())
            .collect())
    }

    async fn replay(&self, from: LogPosition) -> Result<Replayed, StoreError> {
        let mut seen = self.seen.lock().await;
        let start = from.0.max(1);
        // A read may fail while JetStream moves a leader or is busy (503, or no answer): read
        // again, for a while (`Patience`), before giving up. Nothing is learnt from a failed read.
        let started = tokio::time::Instant::now();
        let mut attempt = 0;
        let (last, entries) = loop {
            match self.read_from(start).await {
                Ok(read) => break read,
                Err(e) if self.retry(started, attempt, REPLAY_ATTEMPTS) => {
                    attempt += 1;
                    tracing::warn!(error = %e, attempt, "replaying the record log failed; reading again");
                    tokio::time::sleep(self.pause(Duration::from_millis(100), attempt)).await;
                }
                Err(e) => return Err(e),
            }
        };
        // Learnt only now: a replay that fails half-way must not move a fence past entries its
        // caller has not seen.
        for (sequence, entry) in &entries {
            let stream_seen = seen.entry(entry.stream().to_string()).or_default();
            stream_seen.learn(entry);
            stream_seen.fence = stream_seen.fence.max(*sequence);
        }
        Ok(Replayed {
            entries: entries.into_iter().map(|(_, entry)| entry).collect(),
            next: LogPosition(last.max(from.0.saturating_sub(1)) + 1),
        })
    }
}

/// The release store of a deployment on JetStream (see the module doc).
#[derive(Debug, Clone)]
pub struct JetStreamReleases {
    js: jetstream::Context,
    stream: stream::Stream,
    layout: Layout,
}

impl JetStreamReleases {
    /// Opens (creating) the deployment's release stream.
    pub async fn open(
        js: jetstream::Context,
        layout: Layout,
    ) -> Result<JetStreamReleases, StoreError> {
        let subjects = format!("{}.releases.>", layout.prefix);
        let stream = layout.stream(&js, "RELEASES", subjects).await?;
        Ok(JetStreamReleases { js, stream, layout })
    }
}

#[async_trait]
impl ReleaseStore for JetStreamReleases {
    async fn write_once(
        &self,
        stream: &str,
        window_id: u64,
        outcome: &WindowOutcome,
    ) -> Result<Stored, StoreError> {
        let (kind, payload) = match outcome {
            WindowOutcome::Released(bytes) => ("released", Bytes::from(bytes.clone())),
            WindowOutcome::Failed(reason) => ("failed", Bytes::from(reason.clone().into_bytes())),
        };
        let publish = Publish::build()
            .payload(payload)
            .header(OUTCOME_HEADER, kind)
            .message_id(format!("{}.{window_id}", stream_dir_name(stream)))
            .expected_last_subject_sequence(0);
        let ack = self
            .js
            .send_publish(self.layout.release_subject(stream, window_id), publish)
            .await
            .map_err(|e| unavailable("storing a released window")(e.to_string()))?;
        match ack.await {
            Ok(ack) if !ack.duplicate => Ok(Stored::Written),
            Ok(_) => Ok(Stored::Already),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => Ok(Stored::Already),
            Err(e) => Err(unavailable("storing a released window")(e.to_string())),
        }
    }

    async fn read(
        &self,
        stream: &str,
        window_id: u64,
    ) -> Result<Option<WindowOutcome>, StoreError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        let subject = self.layout.release_subject(stream, window_id);
        let message = match self.stream.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => message,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(unavailable("reading a released window")(e.to_string())),
        };
        let kind = message
            .headers
            .get(OUTCOME_HEADER)
            .map(|v| v.as_str().to_string());
        match kind.as_deref() {
            Some("released") => Ok(Some(WindowOutcome::Released(message.payload.to_vec()))),
            Some("failed") => Ok(Some(WindowOutcome::Failed(
                String::from_utf8_lossy(&message.payload).into_owned(),
            ))),
            other => Err(unavailable("reading a released window")(format!(
                "message on {subject} has {OUTCOME_HEADER} {other:?}, not released or failed"
            ))),
        }
    }

    async fn next_unreleased(&self, stream: &str) -> Result<u64, StoreError> {
        // Windows are stored without gaps from 0 (contract 3): find the first missing one by
        // doubling, then bisecting.
        if self.read(stream, 0).await?.is_none() {
            return Ok(0);
        }
        let (mut present, mut missing) = (0u64, 1u64);
        while self.read(stream, missing).await?.is_some() {
            present = missing;
            missing = missing.saturating_mul(2);
        }
        while missing - present > 1 {
            let mid = present + (missing - present) / 2;
            if self.read(stream, mid).await?.is_some() {
                present = mid;
            } else {
                missing = mid;
            }
        }
        Ok(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_that_may_pass_are_retried_and_the_fence_is_never() {
        use PublishErrorKind::*;
        for status in [None, Some(400), Some(409), Some(503)] {
            assert_eq!(
                PublishFailure::of(WrongLastSequence, status),
                PublishFailure::Fenced
            );
            for kind in [TimedOut, BrokenPipe, StreamNotFound] {
                assert_eq!(PublishFailure::of(kind, status), PublishFailure::Transient);
            }
            assert_eq!(
                PublishFailure::of(WrongLastMessageId, status),
                PublishFailure::Final
            );
        }
        assert_eq!(
            PublishFailure::of(Other, Some(503)),
            PublishFailure::Transient
        );
        assert_eq!(
            PublishFailure::of(Other, Some(409)),
            PublishFailure::Transient
        );
        assert_eq!(PublishFailure::of(Other, Some(400)), PublishFailure::Final);
        assert_eq!(PublishFailure::of(Other, None), PublishFailure::Final);
        assert_eq!(
            PublishFailure::of_error(&PublishError::from(TimedOut)),
            PublishFailure::Transient
        );
        assert_eq!(
            PublishFailure::of_error(&PublishError::from(Other)),
            PublishFailure::Final
        );
    }

    #[test]
    fn a_batch_message_id_names_stream_fence_and_digest_and_no_record() {
        let layout = Layout {
            prefix: "cloakd".into(),
            replicas: 1,
        };
        let entries = vec![b"secret-record-id".to_vec(), b"close".to_vec()];
        let message = BatchMessage::new(&layout, "s/1", 7, entries.clone());
        assert_eq!(
            message.subject,
            format!("cloakd.records.{}", hex::encode("s/1"))
        );
        let digest = hex::encode(Sha256::digest(&message.payload));
        assert_eq!(
            message.message_id,
            format!("{}.7.{}", hex::encode("s/1"), &digest[..32])
        );
        assert!(!message.message_id.contains("secret"));
        assert_eq!(
            <WireBatch as prost::Message>::decode(message.payload.as_ref())
                .unwrap()
                .entries,
            entries
        );
        // Deterministic; another fence, or other content, is another id.
        assert_eq!(
            BatchMessage::new(&layout, "s/1", 7, entries.clone()),
            message
        );
        let at_8 = BatchMessage::new(&layout, "s/1", 8, entries.clone());
        assert_ne!(at_8.message_id, message.message_id);
        let other = BatchMessage::new(&layout, "s/1", 7, vec![b"close".to_vec()]);
        assert_ne!(other.message_id, message.message_id);
    }
}
