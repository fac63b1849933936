//! The journal of acknowledged batches: what the record log has acknowledged, kept beside it so
//! that a log shortened or changed after the fact is named as lost acknowledged data, never taken
//! for a torn tail.
//!
//! # Format
//! One file, `transactions.acks` ([`ACKS_FILE`]), a sequence of frames
//! `[len: u32 LE][crc32: u32 LE][payload]` (payload at most [`MAX_ACK_BYTES`]), each payload one
//! acknowledged batch of the log (protobuf [`WireAck`]): the byte range `[log_start, log_end)` of
//! the log it occupies, the CRC-32 of the log's first `log_end` bytes, and how many records it
//! holds per (stream, window). Data directories of older versions have no journal: the first open
//! by this version journals the whole valid log as one range (adopted, see below).
//!
//! # Invariants
//! 1. **Written before acknowledged.** [`super::transaction_log::TransactionLog::append`] fsyncs
//!    the batch into the log, then appends its frame here and fsyncs again; only then is the batch
//!    acknowledged. A crash between the two leaves a batch in the log that the journal does not
//!    name: it was never acknowledged, and the next open *adopts* it (journals it as it is).
//! 2. **Contiguous.** The ranges follow each other from byte 0 of the log without gap or overlap;
//!    a frame that breaks this, or a complete frame whose checksum or encoding is wrong, is damage.
//!    A frame cut short at the very end is the journal's own torn tail (the batch it named was not
//!    acknowledged) and is cut at open.
//! 3. **Proof.** A range is *proven* while it lies inside the log's valid prefix and the log's
//!    first `log_end` bytes still have the CRC-32 it recorded. The first range that is not proven
//!    starts the loss: every record the journal counts from there on that the log no longer holds
//!    past that byte is an acknowledged record lost, named per stream and window ([`Verdict`]).
//!    The log's bytes past the last proven range were never acknowledged: only they may be a torn
//!    tail.
//! 4. Record ids are not journaled (counts only): a lost record is named by its stream, window and
//!    count.
//!
//! Not detectable: a journal deleted together with the end of the log (it reads as a data
//! directory of an older version).
use std::collections::BTreeMap;

use super::record_log::LogEntry;

/// File name of the journal inside the data directory.
pub const ACKS_FILE: &str = "transactions.acks";
/// Largest payload of one journal frame.
pub const MAX_ACK_BYTES: usize = 16 << 20;
const FRAME_HEADER: usize = 8;

/// Storage encoding of one acknowledged batch.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireAck {
    #[prost(uint64, tag = "1")]
    pub log_start: u64,
    #[prost(uint64, tag = "2")]
    pub log_end: u64,
    #[prost(uint32, tag = "3")]
    pub log_crc: u32,
    #[prost(message, repeated, tag = "4")]
    pub windows: Vec<WireCount>,
}

/// Records of one (stream, window) in an acknowledged batch.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WireCount {
    #[prost(string, tag = "1")]
    pub stream: String,
    #[prost(uint64, tag = "2")]
    pub window_id: u64,
    #[prost(uint64, tag = "3")]
    pub records: u64,
}

/// Records per (stream, window).
pub type Counts = BTreeMap<(String, u64), u64>;

/// Counts the records among `entries`.
pub fn count_records<'a>(entries: impl IntoIterator<Item = &'a LogEntry>) -> Counts {
    let mut counts = Counts::new();
    for entry in entries {
        if let LogEntry::Record(r) = entry {
            *counts.entry((r.stream.clone(), r.window_id)).or_default() += 1;
        }
    }
    counts
}

/// The frame of the batch occupying `[log_start, log_end)` of a log whose first `log_end` bytes
/// have CRC-32 `log_crc`, holding `counts`.
pub fn encode_ack(log_start: u64, log_end: u64, log_crc: u32, counts: &Counts) -> Vec<u8> {
    let wire = WireAck {
        log_start,
        log_end,
        log_crc,
        windows: counts
            .iter()
            .map(|((stream, window_id), records)| WireCount {
                stream: stream.clone(),
                window_id: *window_id,
                records: *records,
            })
            .collect(),
    };
    let payload = prost::Message::encode_to_vec(&wire);
    let mut crc = flate2::Crc::new();
    crc.update(&payload);
    let mut out = Vec::with_capacity(FRAME_HEADER + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// One acknowledged batch read from the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// Byte offset of its frame in the journal.
    pub offset: u64,
    pub log_start: u64,
    pub log_end: u64,
    pub log_crc: u32,
    pub counts: Counts,
}

/// The journal as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Journal {
    /// Whether the file exists (data directories of older versions have none).
    pub present: bool,
    pub acks: Vec<Ack>,
    /// Length of the valid prefix.
    pub valid_len: u64,
    pub total_len: u64,
    /// A damaged frame (byte offset in the journal, rule); the frames before it are `acks`.
    pub corrupt: Option<(u64, String)>,
}

impl Journal {
    /// Reads the journal's bytes (`None`: there is no journal).
    pub fn decode(bytes: Option<&[u8]>) -> Journal {
        let Some(bytes) = bytes else {
            return Journal::default();
        };
        let mut journal = Journal {
            present: true,
            total_len: bytes.len() as u64,
            ..Journal::default()
        };
        let mut pos = 0usize;
        let mut expected_start = 0u64;
        while pos < bytes.len() {
            let rest = &bytes[pos..];
            if rest.len() < FRAME_HEADER {
                break; // torn tail (invariant 2)
            }
            let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
            if len > MAX_ACK_BYTES {
                journal.corrupt = Some((
                    pos as u64,
                    format!("journal frame length field {len} exceeds {MAX_ACK_BYTES} bytes"),
                ));
                break;
            }
            let Some(payload) = rest.get(FRAME_HEADER..FRAME_HEADER + len) else {
                break; // torn tail
            };
            let mut actual = flate2::Crc::new();
            actual.update(payload);
            let wire = if actual.sum() != crc {
                Err(format!(
                    "journal checksum mismatch: the frame's CRC-32 field is {crc:08x}, its payload gives {:08x}",
                    actual.sum()
                ))
            } else {
                <WireAck as prost::Message>::decode(payload)
                    .map_err(|e| format!("undecodable journal frame: {e}"))
            };
            let wire = match wire {
                Ok(wire) if wire.log_start == expected_start && wire.log_end > wire.log_start => {
                    wire
                }
                Ok(wire) => {
                    journal.corrupt = Some((
                        pos as u64,
                        format!(
                            "journal frame names log bytes {}..{} but the previous one ends at {expected_start} (ranges must follow each other)",
                            wire.log_start, wire.log_end
                        ),
                    ));
                    break;
                }
                Err(rule) => {
                    journal.corrupt = Some((pos as u64, rule));
                    break;
                }
            };
            expected_start = wire.log_end;
            let mut counts = Counts::new();
            for c in wire.windows {
                *counts.entry((c.stream, c.window_id)).or_default() += c.records;
            }
            journal.acks.push(Ack {
                offset: pos as u64,
                log_start: wire.log_start,
                log_end: wire.log_end,
                log_crc: wire.log_crc,
                counts,
            });
            pos += FRAME_HEADER + len;
        }
        journal.valid_len = pos as u64;
        journal
    }

    /// End of the last acknowledged range (0 if none).
    pub fn acked_end(&self) -> u64 {
        self.acks.last().map_or(0, |a| a.log_end)
    }

    /// Judges the log (`log`, its valid prefix length `log_valid` and the entries of that prefix
    /// with their offsets) against the journal (invariant 3).
    pub fn verdict(&self, log: &[u8], log_valid: u64, entries: &[(u64, LogEntry)]) -> Verdict {
        let mut crc = flate2::Crc::new();
        let mut at = 0u64;
        let mut first_unproven = None;
        for (i, ack) in self.acks.iter().enumerate() {
            if ack.log_end > log_valid {
                first_unproven = Some(i);
                break;
            }
            crc.update(&log[at as usize..ack.log_end as usize]);
            at = ack.log_end;
            if crc.sum() != ack.log_crc {
                first_unproven = Some(i);
                break;
            }
        }
        let Some(first) = first_unproven else {
            return Verdict {
                proven_end: self.acked_end(),
                unproven: None,
                lost: Vec::new(),
            };
        };
        let from = self.acks[first].log_start;
        let mut acked = Counts::new();
        for ack in &self.acks[first..] {
            for (key, n) in &ack.counts {
                *acked.entry(key.clone()).or_default() += n;
            }
        }
        // Records still in the log past `from`, each id once (a repeated frame keeps nothing).
        let mut ids = std::collections::HashSet::new();
        let present = count_records(
            entries
                .iter()
                .filter(|(offset, _)| *offset >= from)
                .map(|(_, e)| e)
                .filter(|e| match e {
                    LogEntry::Record(r) => ids.insert((&r.stream, &r.record_id)),
                    LogEntry::Close(_) => false,
                }),
        );
        let lost = acked
            .into_iter()
            .filter_map(|((stream, window_id), n)| {
                let kept = present
                    .get(&(stream.clone(), window_id))
                    .copied()
                    .unwrap_or(0);
                (n > kept).then(|| Lost {
                    stream,
                    window_id,
                    records: n - kept,
                })
            })
            .collect();
        Verdict {
            proven_end: from,
            unproven: Some(Unproven {
                journal_offset: self.acks[first].offset,
                log_offset: from,
                acked_end: self.acked_end(),
            }),
            lost,
        }
    }
}

/// Acknowledged records of one window no longer in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    pub stream: String,
    pub window_id: u64,
    pub records: u64,
}

/// Where the acknowledged batches stop being proven by the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unproven {
    /// Byte offset in the journal of the first batch not proven.
    pub journal_offset: u64,
    /// Byte offset in the log where that batch started.
    pub log_offset: u64,
    /// End of the acknowledged log according to the journal.
    pub acked_end: u64,
}

/// What the journal proves about the log (invariant 3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verdict {
    /// The log's bytes before this were acknowledged and are intact.
    pub proven_end: u64,
    /// The acknowledged batches the log no longer proves, if any.
    pub unproven: Option<Unproven>,
    /// The acknowledged records lost with them, per stream and window.
    pub lost: Vec<Lost>,
}

impl Verdict {
    /// Total of [`Self::lost`].
    pub fn lost_records(&self) -> u64 {
        self.lost.iter().map(|l| l.records).sum()
    }

    /// The lost records as text: "N acknowledged records lost: k of window w of stream "s", ...".
    pub fn describe_lost(&self) -> String {
        if self.lost.is_empty() {
            return "no acknowledged record is missing from the log, but acknowledged entries past that byte (window close markers) are missing or changed".into();
        }
        let windows: Vec<String> = self
            .lost
            .iter()
            .map(|l| {
                format!(
                    "{} of window {} of stream {}",
                    l.records,
                    l.window_id,
                    crate::text::quote(&l.stream)
                )
            })
            .collect();
        format!(
            "{} acknowledged records lost ({})",
            self.lost_records(),
            windows.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_reads_back_and_a_gap_is_damage() {
        let mut counts = Counts::new();
        counts.insert(("s".into(), 2), 3);
        let mut bytes = encode_ack(0, 10, 7, &counts);
        bytes.extend(encode_ack(10, 25, 8, &Counts::new()));
        let journal = Journal::decode(Some(&bytes));
        assert_eq!(journal.acks.len(), 2);
        assert_eq!(journal.acked_end(), 25);
        assert_eq!(journal.acks[0].counts, counts);
        assert!(journal.corrupt.is_none());
        // A torn last frame is cut, not damage.
        let torn = Journal::decode(Some(&bytes[..bytes.len() - 1]));
        assert_eq!((torn.acks.len(), torn.corrupt.is_none()), (1, true));
        // A range that does not follow the previous one is damage.
        let mut gap = encode_ack(0, 10, 7, &counts);
        gap.extend(encode_ack(11, 25, 8, &Counts::new()));
        let journal = Journal::decode(Some(&gap));
        assert_eq!(journal.acks.len(), 1);
        assert!(journal.corrupt.is_some());
    }
}
