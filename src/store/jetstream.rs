//! The record log and the release store on NATS JetStream, for replicas sharing one deployment:
//! [`JetStreamRecordLog`] ([`RecordLog`]) and [`JetStreamReleases`] ([`ReleaseStore`]).
//!
//! # Layout (any NATS client may read it)
//! With the subject prefix `P` (e.g. `cloakd`) and `S` = lower-case hex of the transaction stream's
//! UTF-8 name ([`super::stream_dir_name`], so any name is one subject token):
//! * JetStream stream `<P upper-cased>_RECORDS`, subjects `P.records.>`, `cluster.replicas`
//!   replicas, file storage. A record is one message on `P.records.S.r.<hex of record id>`, a
//!   window close one message on `P.records.S.c.<window id>`; the payload is the entry's storage
//!   encoding ([`LogEntry::encode`], protobuf `WireEntry` of `store::record_log`). A
//!   [`LogPosition`] is a stream sequence (0 = the start).
//! * JetStream stream `<P upper-cased>_RELEASES`, subjects `P.releases.>`. Window w of stream S is
//!   one message on `P.releases.S.<w>` with header `Cloakd-Outcome: released` and the encoded
//!   `cloakd.v1.ReleasedWindow` as payload, or `Cloakd-Outcome: failed` and the reason (UTF-8).
//!   A consumer reads a stream's releases in order with a consumer filtered on `P.releases.S.*`.
//!
//! # How the contracts are met
//! * **Durable before acknowledged:** an append returns once JetStream's PubAck of every entry has
//!   arrived (the entry is stored on a quorum of the stream's replicas).
//! * **Idempotent by id, forever:** every entry is published with `Nats-Expected-Last-Subject-
//!   Sequence: 0` on a subject of its own (record id, or window id for a close), so JetStream stores
//!   at most one message per record id or window close, whichever replica publishes and however long
//!   after; a refused publish (wrong last sequence) is a duplicate, answered with the window read
//!   back from that subject. The record id also goes in as `Nats-Msg-Id` (JetStream's own
//!   de-duplication within its window, for a retried publish whose PubAck was lost).
//! * **A close only after its records:** the records of a batch between two closes are published
//!   back to back (their PubAcks awaited together); a close is published only once every earlier
//!   entry of the batch is acknowledged, and acknowledged before any later entry is published, so a
//!   durable close never lacks a record of its window and no record of the next window is durable
//!   without it.
//! * **Releases once:** the same expected-last-subject-sequence rule on `P.releases.S.<w>`: the first
//!   write of a window is the only one, so a deposed lease holder (or any second replica) cannot
//!   replace a release; every reader gets the first write's bytes.
use std::time::Duration;

use async_nats::jetstream::{self, context::Publish, stream};
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

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

    fn record_subject(&self, stream: &str, record_id: &str) -> String {
        format!(
            "{}.records.{}.r.{}",
            self.prefix,
            stream_dir_name(stream),
            stream_dir_name(record_id)
        )
    }

    fn close_subject(&self, stream: &str, window_id: u64) -> String {
        format!(
            "{}.records.{}.c.{window_id}",
            self.prefix,
            stream_dir_name(stream)
        )
    }

    fn release_subject(&self, stream: &str, window_id: u64) -> String {
        format!(
            "{}.releases.{}.{window_id}",
            self.prefix,
            stream_dir_name(stream)
        )
    }

    fn entry_subject(&self, entry: &LogEntry) -> String {
        match entry {
            LogEntry::Record(r) => self.record_subject(&r.stream, &r.record_id),
            LogEntry::Close(c) => self.close_subject(&c.stream, c.window_id),
        }
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

/// The record log of a deployment on JetStream (see the module doc).
#[derive(Debug, Clone)]
pub struct JetStreamRecordLog {
    js: jetstream::Context,
    stream: stream::Stream,
    layout: Layout,
}

impl JetStreamRecordLog {
    /// Opens (creating) the deployment's record stream.
    pub async fn open(
        js: jetstream::Context,
        layout: Layout,
    ) -> Result<JetStreamRecordLog, StoreError> {
        let subjects = format!("{}.records.>", layout.prefix);
        let stream = layout.stream(&js, "RECORDS", subjects).await?;
        Ok(JetStreamRecordLog { js, stream, layout })
    }

    /// The entry stored on `subject`, if any.
    async fn stored(&self, subject: &str) -> Result<Option<LogEntry>, StoreError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        match self.stream.get_last_raw_message_by_subject(subject).await {
            Ok(message) => LogEntry::decode(&message.payload)
                .map(Some)
                .map_err(unavailable("reading the record log")),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(unavailable("reading the record log")(e.to_string())),
        }
    }

    /// Sends `entry` to its own subject, to be stored only if that subject holds nothing yet.
    async fn publish_pending(
        &self,
        entry: &LogEntry,
    ) -> Result<jetstream::context::PublishAckFuture, StoreError> {
        let subject = self.layout.entry_subject(entry);
        let mut publish = Publish::build()
            .payload(Bytes::from(entry.encode()))
            .expected_last_subject_sequence(0);
        if let LogEntry::Record(r) = entry {
            publish = publish.message_id(format!(
                "{}.{}",
                stream_dir_name(&r.stream),
                stream_dir_name(&r.record_id)
            ));
        }
        self.js
            .send_publish(subject, publish)
            .await
            .map_err(|e| unavailable("appending to the record log")(e.to_string()))
    }

    /// Awaits one PubAck: the entry's outcome.
    async fn settle(
        &self,
        entry: &LogEntry,
        ack: jetstream::context::PublishAckFuture,
    ) -> Result<EntryOutcome, StoreError> {
        use async_nats::jetstream::context::PublishErrorKind;
        match ack.await {
            Ok(ack) if !ack.duplicate => Ok(EntryOutcome::Appended),
            // Within the de-duplication window: the same message id was stored before.
            Ok(_) => self.duplicate_of(entry).await,
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                self.duplicate_of(entry).await
            }
            Err(e) => Err(unavailable("appending to the record log")(e.to_string())),
        }
    }

    /// The window of the record stored on `subject`, if any.
    async fn window_on(&self, subject: String) -> Result<Option<u64>, StoreError> {
        Ok(match self.stored(&subject).await? {
            Some(LogEntry::Record(r)) => Some(r.window_id),
            _ => None,
        })
    }

    /// The outcome of an entry JetStream refused as already stored.
    async fn duplicate_of(&self, entry: &LogEntry) -> Result<EntryOutcome, StoreError> {
        match entry {
            LogEntry::Record(r) => {
                let subject = self.layout.record_subject(&r.stream, &r.record_id);
                match self.stored(&subject).await? {
                    Some(LogEntry::Record(stored)) => Ok(EntryOutcome::Duplicate {
                        window_id: stored.window_id,
                    }),
                    _ => Err(unavailable("appending to the record log")(format!(
                        "record subject {subject} refused the record but holds none"
                    ))),
                }
            }
            LogEntry::Close(c) => Ok(EntryOutcome::Duplicate {
                window_id: c.window_id,
            }),
        }
    }
}

#[async_trait]
impl RecordLog for JetStreamRecordLog {
    async fn append(&self, batch: Vec<LogEntry>) -> Result<Vec<EntryOutcome>, StoreError> {
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut pending = Vec::new();
        for (i, entry) in batch.iter().enumerate() {
            if matches!(entry, LogEntry::Close(_)) {
                // A close is a barrier: published once every earlier entry of the batch is
                // acknowledged, and acknowledged before any later one is published (module doc).
                for (j, ack) in pending.drain(..) {
                    outcomes.push((j, self.settle(&batch[j], ack).await?));
                }
                let ack = self.publish_pending(entry).await?;
                outcomes.push((i, self.settle(entry, ack).await?));
                continue;
            }
            pending.push((i, self.publish_pending(entry).await?));
        }
        for (j, ack) in pending {
            outcomes.push((j, self.settle(&batch[j], ack).await?));
        }
        outcomes.sort_by_key(|(i, _)| *i);
        Ok(outcomes.into_iter().map(|(_, o)| o).collect())
    }

    async fn windows_of(&self, records: &[(&str, &str)]) -> Result<Vec<Option<u64>>, StoreError> {
        let subjects: Vec<String> = records
            .iter()
            .map(|(stream, id)| self.layout.record_subject(stream, id))
            .collect();
        let lookups = subjects.into_iter().map(|subject| self.window_on(subject));
        futures::stream::iter(lookups)
            .buffered(64)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    async fn replay(&self, from: LogPosition) -> Result<Replayed, StoreError> {
        let mut stream = self.stream.clone();
        let last = stream
            .info()
            .await
            .map_err(|e| unavailable("reading the record log")(e.to_string()))?
            .state
            .last_sequence;
        let start = from.0.max(1);
        let mut entries = Vec::new();
        if start <= last {
            let consumer = stream
                .create_consumer(jetstream::consumer::pull::OrderedConfig {
                    deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                        start_sequence: start,
                    },
                    ..Default::default()
                })
                .await
                .map_err(|e| unavailable("replaying the record log")(e.to_string()))?;
            let mut messages = consumer
                .messages()
                .await
                .map_err(|e| unavailable("replaying the record log")(e.to_string()))?;
            while let Some(message) = messages.next().await {
                let message =
                    message.map_err(|e| unavailable("replaying the record log")(e.to_string()))?;
                let sequence = message
                    .info()
                    .map_err(|e| unavailable("replaying the record log")(e.to_string()))?
                    .stream_sequence;
                if sequence > last {
                    break;
                }
                entries.push(
                    LogEntry::decode(&message.payload)
                        .map_err(unavailable("replaying the record log"))?,
                );
                if sequence == last {
                    break;
                }
            }
        }
        Ok(Replayed {
            entries,
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
        use async_nats::jetstream::context::PublishErrorKind;
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
