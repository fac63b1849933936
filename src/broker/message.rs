//! The location broker's message vocabulary: what the gRPC handlers ([`crate::service::location`]),
//! the providers' Subscribe streams ([`super::provider_stream`]) and the replica side ([`super::replicas`])
//! send the actor, and what they share with it. Nothing here holds actor state; the actor
//! ([`super`]) and everything that talks to it import this file, so no arrow points back up.
//!
//! Invariants: every client stream is one [`ClientId`] and every Subscribe stream one [`ProviderId`]
//! for the broker's lifetime; an [`EventQueue`] keeps one place beyond `location.client_queue` for
//! the status that ends its stream; a [`ProviderWindow`] is raised only by its stream and lowered
//! only by the actor.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::{Notify, mpsc, oneshot};
use tonic::{Code, Status};

use super::replicas::wire::ForwardedRequest;
use crate::config::CloakModel;
use crate::location::Pseudonym;
use crate::proto::{self, CloakedRequest, LocationEvent, location_event};

pub(crate) type ClientId = u64;

/// The bounded event queue of one client stream. One place beyond `location.client_queue` is kept
/// for the status that ends the stream, so a client that reads too slowly (or whose request stream
/// broke) always learns why its stream ended once it reads again. A client of another replica (a
/// request forwarded here, [`super::replicas`]) has its events published to that replica instead.
#[derive(Debug, Clone)]
pub(crate) struct EventQueue {
    sink: EventSink,
}

/// Why the broker ends a client's or a provider's stream. The location service maps it to a status
/// with its other errors (`service/location/error.rs`, the one mapping), so the actor never builds
/// a stream-ending status itself.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StreamEnd {
    #[error(
        "the client reads its events too slowly: {limit} events were waiting (location.client_queue); the stream was closed"
    )]
    ClientTooSlow { limit: usize },
    #[error(
        "the provider did not acknowledge a request within {limit_ms} ms (location.provider_ack_ms); the stream was closed and its {handed_on} unacknowledged requests were handed to other providers or reported undelivered"
    )]
    ProviderStalled { limit_ms: u64, handed_on: usize },
    /// The client's request stream broke; the status the adapter mapped its error to, delivered
    /// after the outcomes of the requests already read.
    #[error("{}", .0.message())]
    InboundFailed(Status),
}

#[derive(Debug, Clone)]
enum EventSink {
    Stream(mpsc::Sender<Result<LocationEvent, StreamEnd>>),
    Replica {
        to: RemoteClient,
        out: mpsc::Sender<Outbound>,
    },
}

impl EventQueue {
    pub(crate) fn channel(
        client_queue: usize,
    ) -> (EventQueue, mpsc::Receiver<Result<LocationEvent, StreamEnd>>) {
        let (sender, receiver) = mpsc::channel(client_queue.saturating_add(1));
        (
            EventQueue {
                sink: EventSink::Stream(sender),
            },
            receiver,
        )
    }

    /// The events of a client stream `to` that another replica holds, sent through `out`.
    pub(crate) fn replica(to: RemoteClient, out: mpsc::Sender<Outbound>) -> EventQueue {
        EventQueue {
            sink: EventSink::Replica { to, out },
        }
    }

    /// Whether the stream is held by another replica.
    pub(crate) fn is_replica(&self) -> bool {
        matches!(self.sink, EventSink::Replica { .. })
    }

    /// The replica holding the stream, and the request's tag there.
    pub(crate) fn remote_client(&self) -> Option<&RemoteClient> {
        match &self.sink {
            EventSink::Replica { to, .. } => Some(to),
            EventSink::Stream(_) => None,
        }
    }

    /// Queues an event unless only the place reserved for the final status is left; false when the
    /// event was not queued (the client is too slow, or gone).
    pub(crate) fn try_event(&self, event: LocationEvent) -> bool {
        match &self.sink {
            EventSink::Stream(sender) => {
                sender.capacity() > 1 && sender.try_send(Ok(event)).is_ok()
            }
            EventSink::Replica { to, out } => out
                .try_send(Outbound::Event {
                    to: to.clone(),
                    event,
                })
                .is_ok(),
        }
    }

    /// Ends the stream with `end` (uses the reserved place). The replica holding a remote
    /// stream ends it itself.
    pub(crate) fn finish(&self, end: StreamEnd) {
        if let EventSink::Stream(sender) = &self.sink {
            let _ = sender.try_send(Err(end));
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        match &self.sink {
            EventSink::Stream(sender) => sender.is_closed(),
            EventSink::Replica { out, .. } => out.is_closed(),
        }
    }
}

/// Tally of one `Answer` stream, kept by the actor.
#[derive(Debug, Default)]
pub(crate) struct AnswerTally {
    pub(crate) delivered: AtomicU64,
    pub(crate) undeliverable: AtomicU64,
    /// Answers for pseudonyms another principal received (refused).
    pub(crate) denied: AtomicU64,
    /// Acknowledgements without an answer of requests this principal received.
    pub(crate) acknowledged: AtomicU64,
}

pub(crate) enum Command {
    Open {
        client: ClientId,
        events: EventQueue,
        /// Name of the stream's principal.
        principal: Arc<str>,
        /// Whether the principal is held to `max_requests_per_s_per_principal`.
        rate_limited: bool,
    },
    Submit {
        client: ClientId,
        request: AdmittedRequest,
        /// When the request was read off its stream (wall clock, for the broker overhead metric).
        received: std::time::Instant,
    },
    Reject {
        client: ClientId,
        request_no: u64,
        rejection: Rejection,
    },
    /// The client half-closed: close its stream once nothing more can reach it.
    InboundClosed { client: ClientId },
    /// The client's request stream broke (oversized or undecodable message): its pending requests
    /// still get their outcome, then the stream ends with the error's status.
    InboundFailed {
        client: ClientId,
        /// The error's status (mapped by the location service's one mapping).
        status: Status,
    },
    /// The client went away.
    Gone { client: ClientId },
    /// A provider's Subscribe stream opened; `close` ends it with a status.
    ProviderOpen {
        provider: ProviderId,
        service: usize,
        window: Arc<ProviderWindow>,
        close: oneshot::Sender<StreamEnd>,
    },
    /// A provider's Subscribe stream ended: the requests it has not acknowledged are handed on.
    ProviderGone { provider: ProviderId },
    /// The Subscribe stream `provider` of `principal` took the cloaked requests of `pseudonyms`
    /// off its queue (in that order; one command for whatever it took at once).
    Delivered {
        pseudonyms: Vec<Pseudonym>,
        principal: Arc<str>,
        provider: ProviderId,
    },
    /// Answers of one Answer stream, in order: a payload, or an acknowledgement alone (`None`).
    /// One command for whatever the stream had read at once.
    Answers {
        answers: Vec<(Pseudonym, Option<Vec<u8>>)>,
        tally: Arc<AnswerTally>,
        /// Name of the answering principal.
        principal: Arc<str>,
    },
    /// Answers once every earlier command has been handled.
    Sync { done: oneshot::Sender<()> },
    /// Position updates of a Report stream (PRESENCE model), applied in order.
    Report {
        updates: Vec<AdmittedUpdate>,
        done: oneshot::Sender<ReportResult>,
    },
    /// Cluster: a request another replica forwarded here (this replica owns its cell); `client`
    /// is a new stream of this one request whose events go to that replica.
    SubmitForwarded {
        client: ClientId,
        events: EventQueue,
        principal: Arc<str>,
        request: AdmittedRequest,
        received: std::time::Instant,
    },
    /// Cluster: the cell of the remote request `tag` has an owner now (or still none).
    Resolved {
        tag: u64,
        request: AdmittedRequest,
        owner: CellOwner,
    },
    /// Cluster: an event for the remote request `tag` (another replica cloaks it).
    RemoteEvent { tag: u64, event: LocationEvent },
    /// The budget ledger answered the charges of GEO_IND answers, those of one group commit
    /// ([`super::geo_budget`]).
    BudgetCharged {
        /// Per charge, which waiting answer (the broker keeps them by this number) and the answer.
        answers: crate::ledger::Answers,
    },
    /// Cluster: a cloaked request another replica relayed to this one's providers of `service`;
    /// `client` is a new stream of this one request whose events go to the client's replica.
    Relayed {
        client: ClientId,
        events: EventQueue,
        service: usize,
        request: CloakedRequest,
        /// Whether it was put on the provider queue, or why not.
        taken: oneshot::Sender<Result<(), RelayRefusal>>,
    },
}

/// Why a replica did not take a cloaked request another replica relayed to its providers (the
/// relaying replica then asks another, and tells the client the last refusal's reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RelayRefusal {
    /// The service's provider queue is full (`location.provider_queue`).
    QueueFull,
    /// No provider of the service is subscribed here any more (the last one left while the
    /// request was on its way).
    NoProvider,
    /// The request's pseudonym cannot be read.
    UnreadablePseudonym,
}

/// What became of one Report batch.
#[derive(Debug)]
pub(crate) struct ReportResult {
    /// Updates applied before the refused one (`usize::MAX`: all of them).
    pub(crate) applied: usize,
    pub(crate) refused: Option<Rejection>,
}

/// Identifies one Subscribe stream for the broker's lifetime.
pub(crate) type ProviderId = u64;

/// The unacknowledged requests of one Subscribe stream, shared by the stream and the broker.
#[derive(Debug, Default)]
pub(crate) struct ProviderWindow {
    unacknowledged: AtomicUsize,
    room: Notify,
}

impl ProviderWindow {
    /// The stream took a request.
    pub(crate) fn take(&self) {
        self.unacknowledged.fetch_add(1, Ordering::AcqRel);
    }

    /// The broker no longer waits for the acknowledgement of one request of this stream.
    pub(crate) fn release(&self) {
        let _ = self
            .unacknowledged
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        self.room.notify_one();
    }

    /// Whether fewer than `limit` requests are unacknowledged.
    pub(crate) fn has_room(&self, limit: usize) -> bool {
        self.unacknowledged.load(Ordering::Acquire) < limit
    }

    /// Waits until fewer than `limit` requests are unacknowledged.
    pub(crate) async fn room(&self, limit: usize) {
        loop {
            let acknowledged = self.room.notified();
            if self.unacknowledged.load(Ordering::Acquire) < limit {
                return;
            }
            acknowledged.await;
        }
    }
}

/// A request whose client stream another replica holds: that replica, and the request's tag there.
#[derive(Debug, Clone)]
pub(crate) struct RemoteClient {
    pub node: Arc<str>,
    pub tag: u64,
}

/// What the broker hands the NATS side.
#[derive(Debug)]
pub(crate) enum Outbound {
    /// An event for a client of another replica.
    Event {
        to: RemoteClient,
        event: LocationEvent,
    },
    /// A request for the replica owning its cell.
    Forward {
        owner: String,
        tag: u64,
        request: ForwardedRequest,
    },
    /// A cloaked request for a replica with a provider of its service; its events go to `to`.
    Relay {
        to: RemoteClient,
        request: CloakedRequest,
    },
}

/// Where a request is cloaked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CellOwner {
    Here,
    Replica(String),
    /// Nobody is known to hold the cell: being contended for, or being taken over.
    Unknown,
}

/// A request that passed validation, with defaults filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmittedRequest {
    pub user_id: String,
    pub request_no: u64,
    pub lat: f64,
    pub lon: f64,
    pub k: u32,
    pub dx_m: f64,
    pub dy_m: f64,
    pub dt_ms: u64,
    pub payload: Vec<u8>,
    /// Index of the service's queue ([`super::provider_queues::ProviderQueues`]).
    pub service: usize,
    pub model: CloakModel,
    /// GEO_IND: the privacy level (per km) the answer is drawn at; `None` under the other models.
    pub epsilon_per_km: Option<f64>,
    /// REQUESTS: answer under GEO_IND at this level (per km) instead of `Expired` at the deadline.
    pub fallback_epsilon_per_km: Option<f64>,
}

/// A position update that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmittedUpdate {
    pub user_id: String,
    pub lat: f64,
    pub lon: f64,
}

/// Why a request was not accepted: the field, the rule, and the gRPC code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct Rejection {
    pub field: &'static str,
    pub reason: String,
    pub code: Code,
}

impl Rejection {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Rejection {
        Rejection {
            field,
            reason: reason.into(),
            code: Code::InvalidArgument,
        }
    }

    pub(crate) fn exhausted(field: &'static str, reason: impl Into<String>) -> Rejection {
        Rejection {
            field,
            reason: reason.into(),
            code: Code::ResourceExhausted,
        }
    }

    pub(crate) fn to_event(&self, request_no: u64) -> LocationEvent {
        LocationEvent {
            request_no,
            outcome: Some(location_event::Outcome::Rejected(proto::Rejected {
                field: self.field.to_string(),
                reason: self.reason.clone(),
                code: self.code as i32,
                refill_at_ms: None,
            })),
        }
    }
}

/// A cloaking box as the protocol carries it.
pub(super) fn to_proto_box(b: &crate::location::geo::GeoBox) -> proto::BoundingBox {
    proto::BoundingBox {
        min_lat: b.min_lat,
        min_lon: b.min_lon,
        max_lat: b.max_lat,
        max_lon: b.max_lon,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_window_waits_for_an_acknowledgement() {
        let window = Arc::new(ProviderWindow::default());
        window.take();
        window.take();
        let waiting = {
            let window = Arc::clone(&window);
            tokio::spawn(async move { window.room(2).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        window.release();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("room after a release")
            .unwrap();
        // A release with nothing outstanding never wraps around.
        window.release();
        window.release();
        assert_eq!(window.unacknowledged.load(Ordering::Acquire), 0);
    }
}
