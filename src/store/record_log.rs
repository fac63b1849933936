//! The durable record log of transaction streams, as a trait: what the window writer needs from any
//! store (the embedded file, [`super::transaction_log::FileRecordLog`], or a replicated log), and
//! the entries it holds.
//!
//! # Entries
//! * `Record`: a record of stream s accepted into window w of s (record id, items, sensitive items);
//! * `Close`: window w of stream s is closed with exactly n records and will be anonymized with the
//!   stored parameters (rho, m, mode), whatever the configuration says later.
//!
//! # Contract of every implementation
//! 1. **Durable before acknowledged.** [`RecordLog::append`] returns `Ok` only once every entry of
//!    the batch is durable (survives a crash of this process, and for a replicated log the loss of
//!    a minority of its nodes). Only then may any of it be acknowledged or acted upon.
//! 2. **Failed append.** On `Err`, part of the batch (possibly none, possibly all of it) may be
//!    durable, but a `Close` only together with every entry before it in the batch; nothing of it
//!    may be acknowledged, and the caller rebuilds its state by [`RecordLog::replay`] before
//!    appending again.
//! 3. **Idempotent by id.** A `Record` whose (stream, record id) is already in the log is not
//!    appended again: its outcome is [`EntryOutcome::Duplicate`] with the window it was stored in.
//!    Likewise a `Close` of a window whose close is in the log. This holds for every earlier entry, however
//!    long ago it was appended; [`RecordLog::windows_of`] answers the same question without
//!    appending.
//! 4. **Replay in order.** [`RecordLog::replay`] returns the durable entries from a position (the
//!    start, or a `next` returned by an earlier replay), and the position after them: each stream's
//!    entries in append order, and the entries of an acknowledged batch before those of any batch
//!    appended after it. How the streams of one batch interleave is the implementation's (a
//!    replicated log may store each stream's part of a batch on its own).
//! 5. **Windows are fixed by their close marker** (kept by the writer): the `Close` of window w of s
//!    follows every record of w and precedes every record of w+1, so the record set and order of a
//!    closed window are the same on every replay.
use async_trait::async_trait;

use super::StoreError;
use crate::transactions::{Mode, Params};

/// An accepted record of window `window_id` of `stream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub stream: String,
    pub window_id: u64,
    pub record_id: String,
    pub items: Vec<String>,
    pub sensitive_items: Vec<String>,
}

/// The close marker of window `window_id` of `stream`, holding exactly `records` records, to be
/// anonymized with `params`.
#[derive(Debug, Clone, PartialEq)]
pub struct WindowClose {
    pub stream: String,
    pub window_id: u64,
    pub records: u64,
    pub params: Params,
}

/// One entry of the log.
#[derive(Debug, Clone, PartialEq)]
pub enum LogEntry {
    Record(StoredRecord),
    Close(WindowClose),
}

impl LogEntry {
    pub fn stream(&self) -> &str {
        match self {
            LogEntry::Record(r) => &r.stream,
            LogEntry::Close(c) => &c.stream,
        }
    }
}

/// What became of one entry of an appended batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryOutcome {
    /// Durable now.
    Appended,
    /// Already in the log (contract 3): a record, stored in window `window_id`; or a close marker of
    /// window `window_id`, already closed.
    Duplicate { window_id: u64 },
}

/// A place in the log to replay from: the start, or the `next` of an earlier replay. Its meaning is
/// the implementation's (a byte offset, a stream sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct LogPosition(pub u64);

impl LogPosition {
    pub const START: LogPosition = LogPosition(0);
}

/// The entries of a replay and where the next replay continues.
#[derive(Debug, Clone, PartialEq)]
pub struct Replayed {
    pub entries: Vec<LogEntry>,
    pub next: LogPosition,
}

/// The durable record log (see the module doc for the contract).
#[async_trait]
pub trait RecordLog: Send + Sync + std::fmt::Debug + 'static {
    /// Appends `batch` durably (contracts 1 to 3): one outcome per entry, in order.
    async fn append(&self, batch: Vec<LogEntry>) -> Result<Vec<EntryOutcome>, StoreError>;

    /// The window each of `records` ((stream, record id) pairs) is stored in, if it is in the log.
    async fn windows_of(&self, records: &[(&str, &str)]) -> Result<Vec<Option<u64>>, StoreError>;

    /// The durable entries from `from` on, in append order (contract 4).
    async fn replay(&self, from: LogPosition) -> Result<Replayed, StoreError>;
}

/// Storage encoding of a [`LogEntry`] (protobuf, so fields can be added compatibly). Every
/// implementation stores entries in this form, so they move between stores unchanged.
#[derive(Clone, PartialEq, prost::Message)]
struct WireEntry {
    /// 1 = record, 2 = close.
    #[prost(uint32, tag = "1")]
    kind: u32,
    #[prost(string, tag = "2")]
    stream: String,
    #[prost(uint64, tag = "3")]
    window_id: u64,
    #[prost(string, tag = "4")]
    record_id: String,
    #[prost(string, repeated, tag = "5")]
    items: Vec<String>,
    #[prost(string, repeated, tag = "6")]
    sensitive_items: Vec<String>,
    #[prost(uint64, tag = "7")]
    records: u64,
    #[prost(double, tag = "8")]
    rho: f64,
    #[prost(uint32, tag = "9")]
    m: u32,
    #[prost(bool, tag = "10")]
    sampled: bool,
    #[prost(double, tag = "11")]
    epsilon: f64,
    #[prost(double, tag = "12")]
    delta: f64,
}

const KIND_RECORD: u32 = 1;
const KIND_CLOSE: u32 = 2;

impl LogEntry {
    /// The entry's storage encoding.
    pub fn encode(&self) -> Vec<u8> {
        let wire = match self {
            LogEntry::Record(r) => WireEntry {
                kind: KIND_RECORD,
                stream: r.stream.clone(),
                window_id: r.window_id,
                record_id: r.record_id.clone(),
                items: r.items.clone(),
                sensitive_items: r.sensitive_items.clone(),
                ..WireEntry::default()
            },
            LogEntry::Close(c) => {
                let (sampled, epsilon, delta) = match c.params.mode {
                    Mode::Exact => (false, 0.0, 0.0),
                    Mode::Sampled { epsilon, delta } => (true, epsilon, delta),
                };
                WireEntry {
                    kind: KIND_CLOSE,
                    stream: c.stream.clone(),
                    window_id: c.window_id,
                    records: c.records,
                    rho: c.params.rho,
                    m: c.params.m,
                    sampled,
                    epsilon,
                    delta,
                    ..WireEntry::default()
                }
            }
        };
        prost::Message::encode_to_vec(&wire)
    }

    /// Decodes an entry's storage encoding; the error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<LogEntry, String> {
        let w = <WireEntry as prost::Message>::decode(bytes).map_err(|e| e.to_string())?;
        match w.kind {
            KIND_RECORD => Ok(LogEntry::Record(StoredRecord {
                stream: w.stream,
                window_id: w.window_id,
                record_id: w.record_id,
                items: w.items,
                sensitive_items: w.sensitive_items,
            })),
            KIND_CLOSE => Ok(LogEntry::Close(WindowClose {
                stream: w.stream,
                window_id: w.window_id,
                records: w.records,
                params: Params {
                    rho: w.rho,
                    m: w.m,
                    mode: if w.sampled {
                        Mode::Sampled {
                            epsilon: w.epsilon,
                            delta: w.delta,
                        }
                    } else {
                        Mode::Exact
                    },
                },
            })),
            other => Err(format!("unknown entry kind {other}")),
        }
    }
}

/// A shared log is a log (so wrappers such as [`super::faults::FaultyLog`] take either).
#[async_trait]
impl<L: RecordLog + ?Sized> RecordLog for std::sync::Arc<L> {
    async fn append(&self, batch: Vec<LogEntry>) -> Result<Vec<EntryOutcome>, StoreError> {
        (**self).append(batch).await
    }

    async fn windows_of(&self, records: &[(&str, &str)]) -> Result<Vec<Option<u64>>, StoreError> {
        (**self).windows_of(records).await
    }

    async fn replay(&self, from: LogPosition) -> Result<Replayed, StoreError> {
        (**self).replay(from).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries as earlier versions wrote them (when the mode was a `sampled` flag beside epsilon and
    /// delta) decode to the same entries, and encode to the same bytes.
    #[test]
    fn stored_entries_stay_readable() {
        let pinned = [
            (
                "0802120473686f701807380341000000000000e03f48025001599a9999999999a93f619a9999999999b93f",
                LogEntry::Close(WindowClose {
                    stream: "shop".into(),
                    window_id: 7,
                    records: 3,
                    params: Params {
                        rho: 0.5,
                        m: 2,
                        mode: Mode::Sampled {
                            epsilon: 0.05,
                            delta: 0.1,
                        },
                    },
                }),
            ),
            (
                "0802120473686f701808380141000000000000d03f4803",
                LogEntry::Close(WindowClose {
                    stream: "shop".into(),
                    window_id: 8,
                    records: 1,
                    params: Params {
                        rho: 0.25,
                        m: 3,
                        mode: Mode::Exact,
                    },
                }),
            ),
            (
                "0801120473686f701807220272312a0562726561642a046d696c6b32046d696c6b",
                LogEntry::Record(StoredRecord {
                    stream: "shop".into(),
                    window_id: 7,
                    record_id: "r1".into(),
                    items: vec!["bread".into(), "milk".into()],
                    sensitive_items: vec!["milk".into()],
                }),
            ),
        ];
        for (bytes, entry) in pinned {
            let bytes = hex::decode(bytes).unwrap();
            assert_eq!(LogEntry::decode(&bytes).unwrap(), entry);
            assert_eq!(entry.encode(), bytes);
        }
        assert!(LogEntry::decode(&hex::decode("0803").unwrap()).is_err());
    }
}
