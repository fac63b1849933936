//! The broker actor: owns the CliqueCloak [`Engine`] and every routing table of the location path.
//!
//! Client streams hand it validated requests over one bounded command channel. It stamps arrival time
//! on tokio's clock ([`BrokerClock`]), feeds the engine, sends `Cloaked`/`Expired`/`Rejected` to the
//! client, puts `CloakedRequest`s on the service's bounded provider queue (`Undelivered` when it is
//! full), and routes answers back by pseudonym while their route lives (`answer_ttl_ms`).
//!
//! Least privilege: every client stream and every answer carries its principal. A pseudonym is bound
//! to the principal of the provider stream that received it (`Delivered`, sent by that stream before
//! the request leaves the broker), and an answer is routed only if it comes from that same principal;
//! any other answer is refused (counted in its stream's tally, logged and counted as a permission
//! denial). Authenticated principals are held to `max_requests_per_s_per_principal` (token bucket on
//! tokio's clock); past it a request is Rejected with RESOURCE_EXHAUSTED.
//! It also owns the [`PresenceEngine`]: Report batches and every request's own position update each
//! user's latest position; PRESENCE requests are answered at once (`Cloaked` with the anonymity set's
//! region and size, then forwarded under a fresh pseudonym like any other; or `Expired`) and never wait.
//!
//! Providers acknowledge: the broker knows which Subscribe stream took each request (`Delivered`) and
//! waits `provider_ack_ms` for its acknowledgement (an ack or the answer). A stream that misses it is
//! closed (RESOURCE_EXHAUSTED naming the rule), and each request it has not acknowledged, like those
//! of a stream that ends, is handed to another subscribed provider of the service (the route keeps the
//! forwarded request until it is acknowledged) or its client gets `Undelivered`. A route that expires
//! (`answer_ttl_ms`) unacknowledged gets `Undelivered` too: no forwarded request is silently lost.
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::{Code, Status};

use super::cluster::{CellOwner, ClusterLink, Outbound, RemoteClient};
use super::routes::Routes;
use crate::config::CloakModel;
use crate::config::LocationConfig;
use crate::location::presence::PresenceError;
use crate::location::{
    CloakRequest, CloakedGroup, Engine, GeoBox, Outcome, PresenceEngine, PresenceOutcome,
    PresenceRequest, Pseudonym, RequestId, UserKey,
};
use crate::proto::{self, BoundingBox, CloakedRequest, LocationEvent, location_event};
use crate::telemetry::{self, catalog};

use super::error::LocationError;
use super::provider::{ProviderId, ProviderWindow};
use super::providers::{ProviderQueue, ProviderQueues};
use super::rate::{RateLimiter, Take};
use super::validate::{AdmittedRequest, AdmittedUpdate, Rejection};

mod relay;
mod remote;

/// Commands the actor takes per wake-up.
const COMMAND_BATCH: usize = 1024;

pub(super) type ClientId = u64;

/// The bounded event queue of one client stream. One place beyond `location.client_queue` is kept
/// for the status that ends the stream, so a client that reads too slowly (or whose request stream
/// broke) always learns why its stream ended once it reads again. A client of another replica (a
/// request forwarded here, [`super::cluster`]) has its events published to that replica instead.
#[derive(Debug, Clone)]
pub(super) struct EventQueue {
    sink: EventSink,
}

#[derive(Debug, Clone)]
enum EventSink {
    Stream(mpsc::Sender<Result<LocationEvent, Status>>),
    Replica {
        to: RemoteClient,
        out: mpsc::Sender<Outbound>,
    },
}

impl EventQueue {
    pub(super) fn channel(
        client_queue: usize,
    ) -> (EventQueue, mpsc::Receiver<Result<LocationEvent, Status>>) {
        let (sender, receiver) = mpsc::channel(client_queue.saturating_add(1));
        (
            EventQueue {
                sink: EventSink::Stream(sender),
            },
            receiver,
        )
    }

    /// The events of a client stream `to` that another replica holds, sent through `out`.
    pub(super) fn replica(to: RemoteClient, out: mpsc::Sender<Outbound>) -> EventQueue {
        EventQueue {
            sink: EventSink::Replica { to, out },
        }
    }

    /// Whether the stream is held by another replica.
    pub(super) fn is_replica(&self) -> bool {
        matches!(self.sink, EventSink::Replica { .. })
    }

    /// The replica holding the stream, and the request's tag there.
    pub(super) fn remote_client(&self) -> Option<&RemoteClient> {
        match &self.sink {
            EventSink::Replica { to, .. } => Some(to),
            EventSink::Stream(_) => None,
        }
    }

    /// Queues an event unless only the place reserved for the final status is left; false when the
    /// event was not queued (the client is too slow, or gone).
    pub(super) fn try_event(&self, event: LocationEvent) -> bool {
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

    /// Ends the stream with `status` (uses the reserved place). The replica holding a remote
    /// stream ends it itself.
    pub(super) fn finish(&self, status: Status) {
        if let EventSink::Stream(sender) = &self.sink {
            let _ = sender.try_send(Err(status));
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        match &self.sink {
            EventSink::Stream(sender) => sender.is_closed(),
            EventSink::Replica { out, .. } => out.is_closed(),
        }
    }
}

/// The broker's clock: Unix milliseconds read from tokio's clock, so tests can pause time.
#[derive(Debug, Clone, Copy)]
pub struct BrokerClock {
    start: tokio::time::Instant,
    start_unix_ms: i64,
}

impl BrokerClock {
    pub fn new() -> BrokerClock {
        let start_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        BrokerClock {
            start: tokio::time::Instant::now(),
            start_unix_ms,
        }
    }

    pub fn now_ms(&self) -> i64 {
        let elapsed = i64::try_from(self.start.elapsed().as_millis()).unwrap_or(i64::MAX);
        self.start_unix_ms.saturating_add(elapsed)
    }

    /// The tokio instant at which the clock reads `unix_ms`.
    pub fn instant_at(&self, unix_ms: i64) -> tokio::time::Instant {
        let offset = unix_ms.saturating_sub(self.start_unix_ms).max(0);
        self.start + Duration::from_millis(offset.unsigned_abs())
    }
}

impl Default for BrokerClock {
    fn default() -> Self {
        Self::new()
    }
}

/// Tally of one `Answer` stream, kept by the actor.
#[derive(Debug, Default)]
pub(super) struct AnswerTally {
    pub(super) delivered: AtomicU64,
    pub(super) undeliverable: AtomicU64,
    /// Answers for pseudonyms another principal received (refused).
    pub(super) denied: AtomicU64,
    /// Acknowledgements without an answer of requests this principal received.
    pub(super) acknowledged: AtomicU64,
}

pub(super) enum Command {
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
        error: LocationError,
    },
    /// The client went away.
    Gone { client: ClientId },
    /// A provider's Subscribe stream opened; `close` ends it with a status.
    ProviderOpen {
        provider: ProviderId,
        service: usize,
        window: Arc<ProviderWindow>,
        close: oneshot::Sender<Status>,
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
    /// Cluster: a cloaked request another replica relayed to this one's providers of `service`;
    /// `client` is a new stream of this one request whose events go to the client's replica.
    Relayed {
        client: ClientId,
        events: EventQueue,
        service: usize,
        request: CloakedRequest,
        /// Whether it was put on the provider queue (refused when the queue is full).
        taken: oneshot::Sender<bool>,
    },
}

/// What became of one Report batch.
#[derive(Debug)]
pub(super) struct ReportResult {
    /// Updates applied before the refused one (`usize::MAX`: all of them).
    pub(super) applied: usize,
    pub(super) refused: Option<Rejection>,
}

/// Where a cloaked request goes: the client to tell, and the provider queue with its payload.
struct Delivery {
    client: ClientId,
    request_no: u64,
    user: UserKey,
    service: usize,
    payload: Vec<u8>,
}

struct ClientState {
    events: EventQueue,
    /// The status that ends the stream once it has drained (OK when `None`).
    final_status: Option<Status>,
    principal: Arc<str>,
    rate_limited: bool,
    pending: HashSet<RequestId>,
    /// Forwarded requests whose pseudonym is still routable and has not been answered yet.
    awaiting_answer: usize,
    draining: bool,
}

struct PendingEntry {
    /// The request's deadline (Unix ms): a group is forwarded no later than it, jitter included.
    deadline_ms: i64,
    client: ClientId,
    request_no: u64,
    user: UserKey,
    service: usize,
    k: u32,
    payload: Vec<u8>,
}

struct Route {
    client: ClientId,
    request_no: u64,
    answered: bool,
    /// The principal whose provider stream received the pseudonym; only it may answer.
    delivered_to: Option<Arc<str>>,
    service: usize,
    /// The Subscribe stream that took the request and has not acknowledged it yet.
    holder: Option<ProviderId>,
    /// The request as forwarded, kept until a provider acknowledges it so it can be handed on
    /// (boxed: most routes live on long after it, and the table holds `answer_ttl_ms` of them).
    unacknowledged: Option<Box<CloakedRequest>>,
}

/// One provider's Subscribe stream, as the broker tracks it.
struct ProviderState {
    service: usize,
    window: Arc<ProviderWindow>,
    close: oneshot::Sender<Status>,
    /// Requests it took and has not acknowledged.
    unacknowledged: HashSet<Pseudonym>,
}

/// Why the requests of a provider stream are handed on.
#[derive(Debug, Clone, Copy)]
enum HandOver {
    /// The stream did not acknowledge one of them within `provider_ack_ms` (it was closed).
    Stalled,
    /// The stream ended.
    Gone,
}

/// The actor that owns the engine and every routing table.
pub(super) struct Broker {
    /// The `[location]` section in force, refreshed from `live` before each batch of commands.
    cfg: Arc<LocationConfig>,
    live: watch::Receiver<Arc<LocationConfig>>,
    clock: BrokerClock,
    engine: Engine,
    /// Latest positions and reciprocal anonymity sets of the PRESENCE model.
    presence: PresenceEngine,
    next_request_id: RequestId,
    /// Keyed hash (random key per broker) giving each user id the same key for the broker's lifetime,
    /// also while he has nothing pending, as memorized anonymity sets need.
    user_keys: std::hash::RandomState,
    /// By the broker's own sequential id (foldhash: no key here is a client's choice).
    pending: HashMap<RequestId, PendingEntry, foldhash::fast::RandomState>,
    pending_keys: HashSet<(UserKey, u64)>,
    clients: HashMap<ClientId, ClientState>,
    /// The broker's copy of the provider queues (by service index; grows on reload).
    provider_queues: Vec<ProviderQueue>,
    all_provider_queues: Arc<ProviderQueues>,
    /// Sharded so that no single resize pauses the broker ([`super::routes`]).
    routes: Routes<Route>,
    route_expiry: VecDeque<(i64, Pseudonym)>,
    providers: HashMap<ProviderId, ProviderState>,
    /// When each delivered request must be acknowledged, in order (the ack time is one constant).
    ack_expiry: VecDeque<(i64, Pseudonym, ProviderId)>,
    outcomes: Vec<Outcome>,
    rate_limiter: RateLimiter,
    /// Groups waiting out their forwarding jitter, by (due Unix ms, key).
    delayed: BinaryHeap<std::cmp::Reverse<(i64, u64)>>,
    delayed_groups: HashMap<u64, CloakedGroup>,
    next_delayed: u64,
    jitter_rng: ChaCha20Rng,
    metrics: BrokerMetrics,
    /// Cluster: cell owners and the way to other replicas (`None`: standalone).
    cluster: Option<ClusterLink>,
    /// Cluster: requests of this replica's clients that another replica cloaks.
    remote: remote::RemoteRequests,
}

/// The broker's metric handles, registered once (see [`crate::telemetry::catalog`]).
struct BrokerMetrics {
    cloaked: metrics::Counter,
    expired: metrics::Counter,
    rejected: metrics::Counter,
    withdrawn: metrics::Counter,
    pending: metrics::Gauge,
    command_queue: metrics::Gauge,
    /// Group size and relative anonymity by model: CliqueCloak groups ...
    requests: ModelMetrics,
    /// ... and PRESENCE anonymity sets.
    presence: ModelMetrics,
    overhead: metrics::Histogram,
    answers_delivered: metrics::Counter,
    answers_undeliverable: metrics::Counter,
}

/// `cloakd_location_group_size` and `cloakd_location_relative_anonymity` of one cloaking model.
struct ModelMetrics {
    group_size: metrics::Histogram,
    relative_anonymity: metrics::Histogram,
}

impl ModelMetrics {
    fn new(model: &'static str) -> ModelMetrics {
        ModelMetrics {
            group_size: metrics::histogram!(catalog::LOCATION_GROUP_SIZE, "model" => model),
            relative_anonymity: metrics::histogram!(
                catalog::LOCATION_RELATIVE_ANONYMITY,
                "model" => model
            ),
        }
    }
}

impl BrokerMetrics {
    fn new() -> BrokerMetrics {
        let requests = |outcome: &'static str| metrics::counter!(catalog::LOCATION_REQUESTS, "outcome" => outcome);
        let answers =
            |result: &'static str| metrics::counter!(catalog::LBS_ANSWERS, "result" => result);
        BrokerMetrics {
            cloaked: requests("cloaked"),
            expired: requests("expired"),
            rejected: requests("rejected"),
            withdrawn: requests("withdrawn"),
            pending: metrics::gauge!(catalog::LOCATION_PENDING),
            command_queue: metrics::gauge!(catalog::LOCATION_COMMAND_QUEUE_DEPTH),
            requests: ModelMetrics::new("requests"),
            presence: ModelMetrics::new("presence"),
            overhead: metrics::histogram!(catalog::LOCATION_BROKER_OVERHEAD),
            answers_delivered: answers("delivered"),
            answers_undeliverable: answers("undeliverable"),
        }
    }
}

impl Broker {
    pub(super) fn new(
        live: watch::Receiver<Arc<LocationConfig>>,
        seed: u64,
        all_provider_queues: Arc<ProviderQueues>,
    ) -> Broker {
        let cfg = live.borrow().clone();
        let mut provider_queues = Vec::new();
        all_provider_queues.extend(&mut provider_queues);
        Broker {
            engine: Engine::new(cfg.search, seed).with_sessions(cfg.sessions),
            presence: PresenceEngine::new(
                cfg.presence,
                seed.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15,
            ),
            clock: BrokerClock::new(),
            next_request_id: 0,
            user_keys: std::hash::RandomState::new(),
            pending: HashMap::default(),
            pending_keys: HashSet::new(),
            clients: HashMap::new(),
            provider_queues,
            all_provider_queues,
            routes: Routes::default(),
            route_expiry: VecDeque::new(),
            providers: HashMap::new(),
            ack_expiry: VecDeque::new(),
            outcomes: Vec::new(),
            rate_limiter: RateLimiter::default(),
            delayed: BinaryHeap::new(),
            delayed_groups: HashMap::new(),
            next_delayed: 0,
            // Its own stream from the broker's seed, so jitter does not shift the engine's draws.
            jitter_rng: ChaCha20Rng::seed_from_u64(seed ^ 0x6a09_e667_f3bc_c908),
            metrics: BrokerMetrics::new(),
            cfg,
            live,
            cluster: None,
            remote: remote::RemoteRequests::default(),
        }
    }

    /// Cluster mode: requests go to the replica owning their cell ([`super::cluster`]).
    pub(super) fn with_cluster(mut self, link: ClusterLink) -> Broker {
        self.cluster = Some(link);
        self
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Open {
                client,
                events,
                principal,
                rate_limited,
            } => {
                self.clients.insert(
                    client,
                    ClientState {
                        events,
                        final_status: None,
                        principal,
                        rate_limited,
                        pending: HashSet::new(),
                        awaiting_answer: 0,
                        draining: false,
                    },
                );
            }
            Command::Submit {
                client,
                request,
                received,
            } => {
                self.submit(client, request);
                self.metrics
                    .overhead
                    .record(received.elapsed().as_secs_f64());
            }
            Command::Reject {
                client,
                request_no,
                rejection,
            } => self.reject(client, request_no, &rejection),
            Command::InboundClosed { client } => {
                if let Some(state) = self.clients.get_mut(&client) {
                    state.draining = true;
                }
                self.maybe_close(client);
            }
            Command::InboundFailed { client, error } => {
                if let Some(state) = self.clients.get_mut(&client) {
                    state.draining = true;
                    state.final_status = Some(error.into());
                }
                self.maybe_close(client);
            }
            Command::Gone { client } => self.drop_client(client),
            Command::ProviderOpen {
                provider,
                service,
                window,
                close,
            } => {
                self.providers.insert(
                    provider,
                    ProviderState {
                        service,
                        window,
                        close,
                        unacknowledged: HashSet::new(),
                    },
                );
                self.providers_changed();
            }
            Command::ProviderGone { provider } => self.end_provider(provider, HandOver::Gone),
            Command::Delivered {
                pseudonyms,
                principal,
                provider,
            } => {
                for pseudonym in pseudonyms {
                    self.delivered(pseudonym, Arc::clone(&principal), provider);
                }
            }
            Command::Answers {
                answers,
                tally,
                principal,
            } => {
                for (pseudonym, payload) in answers {
                    self.answer(pseudonym, payload, &tally, &principal);
                }
            }
            Command::Sync { done } => {
                let _ = done.send(());
            }
            Command::Report { updates, done } => {
                let _ = done.send(self.report(updates));
            }
            Command::SubmitForwarded {
                client,
                events,
                principal,
                request,
                received,
            } => {
                self.submit_forwarded(client, events, principal, request);
                self.metrics
                    .overhead
                    .record(received.elapsed().as_secs_f64());
            }
            Command::Resolved {
                tag,
                request,
                owner,
            } => self.resolved(tag, request, owner),
            Command::RemoteEvent { tag, event } => self.remote_event(tag, event),
            Command::Relayed {
                client,
                events,
                service,
                request,
                taken,
            } => {
                let _ = taken.send(self.take_relayed(client, events, service, request));
            }
        }
    }

    fn submit(&mut self, client: ClientId, request: AdmittedRequest) {
        let request_no = request.request_no;
        let Some(state) = self.clients.get(&client) else {
            return;
        };
        if let Some(rate) = self.cfg.max_requests_per_s_per_principal
            && state.rate_limited
        {
            let now = tokio::time::Instant::now();
            if let Take::Refused { first } = self.rate_limiter.take(&state.principal, rate, now) {
                let principal = Arc::clone(&state.principal);
                crate::auth::rate_limited_request(
                    &principal,
                    "location.max_requests_per_s_per_principal",
                    first,
                );
                let rejection = Rejection::exhausted(
                    "request_no",
                    format!(
                        "principal {principal:?} is past its {rate} requests/s (location.max_requests_per_s_per_principal)"
                    ),
                );
                return self.send(client, rejection.to_event(request_no));
            }
        }
        if request.model == CloakModel::Presence {
            return self.submit_presence(client, request);
        }
        if self.pending.len() >= self.cfg.max_pending {
            let rejection = Rejection::exhausted(
                "request_no",
                format!(
                    "the broker already holds {} pending requests (location.max_pending)",
                    self.pending.len()
                ),
            );
            return self.reject(client, request_no, &rejection);
        }
        if state.pending.len() >= self.cfg.max_pending_per_stream {
            let rejection = Rejection::exhausted(
                "request_no",
                format!(
                    "this stream already has {} pending requests (location.max_pending_per_stream)",
                    state.pending.len()
                ),
            );
            return self.reject(client, request_no, &rejection);
        }
        let Some(request) = self.route_to_owner(client, request) else {
            return;
        };
        self.cloak_here(client, request);
    }

    /// Feeds a request to this replica's engine.
    fn cloak_here(&mut self, client: ClientId, request: AdmittedRequest) {
        let request_no = request.request_no;
        let user = self.user_key(&request.user_id);
        if !self.pending_keys.insert((user, request_no)) {
            return self.reject(client, request_no, &already_pending(request_no));
        }
        // The request's position is its user's latest for the PRESENCE model too; when the presence
        // table is full it is simply not recorded (this request does not depend on it).
        let _ = self
            .presence
            .update(user, request.lat, request.lon, self.clock.now_ms());
        let id = self.next_request_id;
        self.next_request_id += 1;
        let cloak = CloakRequest {
            id,
            user,
            lat: request.lat,
            lon: request.lon,
            k: request.k,
            dx_m: request.dx_m,
            dy_m: request.dy_m,
            dt_ms: request.dt_ms,
            arrival_ms: self.clock.now_ms(),
        };
        let deadline_ms = cloak.deadline_ms();
        self.pending.insert(
            id,
            PendingEntry {
                client,
                request_no,
                user,
                service: request.service,
                k: request.k,
                payload: request.payload,
                deadline_ms,
            },
        );
        if let Some(state) = self.clients.get_mut(&client) {
            state.pending.insert(id);
        }
        let mut outcomes = std::mem::take(&mut self.outcomes);
        let result = self.engine.submit(cloak, &mut outcomes);
        self.dispatch(&mut outcomes);
        self.outcomes = outcomes;
        if let Err(err) = result {
            // The service validated already; the engine's own check is the last line of defence.
            if let Some(entry) = self.take_pending(id) {
                let rejection = Rejection::invalid("request", err.to_string());
                self.reject(entry.client, entry.request_no, &rejection);
            }
        }
    }

    /// Answers a request with `Rejected`, counting it by field and code.
    fn reject(&mut self, client: ClientId, request_no: u64, rejection: &Rejection) {
        self.metrics.rejected.increment(1);
        metrics::counter!(
            catalog::LOCATION_REJECTIONS,
            "field" => rejection.field,
            "code" => crate::telemetry::grpc::code_name(rejection.code),
        )
        .increment(1);
        self.send(client, rejection.to_event(request_no));
    }

    fn expire(&mut self) {
        let mut outcomes = std::mem::take(&mut self.outcomes);
        self.engine.expire(self.clock.now_ms(), &mut outcomes);
        self.dispatch(&mut outcomes);
        self.outcomes = outcomes;
    }

    /// Removes a pending request from every table (not from the engine).
    fn take_pending(&mut self, id: RequestId) -> Option<PendingEntry> {
        let entry = self.pending.remove(&id)?;
        self.pending_keys.remove(&(entry.user, entry.request_no));
        if let Some(state) = self.clients.get_mut(&entry.client) {
            state.pending.remove(&id);
        }
        Some(entry)
    }

    fn dispatch(&mut self, outcomes: &mut Vec<Outcome>) {
        for outcome in outcomes.drain(..) {
            match outcome {
                Outcome::Cloaked(group) => self.forward_after_jitter(group),
                Outcome::Expired { id, deadline_ms } => {
                    if let Some(entry) = self.take_pending(id) {
                        self.metrics.expired.increment(1);
                        let event = LocationEvent {
                            request_no: entry.request_no,
                            outcome: Some(location_event::Outcome::Expired(proto::Expired {
                                deadline_ms,
                            })),
                        };
                        let client = entry.client;
                        self.send(client, event);
                        self.maybe_close(client);
                    }
                }
            }
        }
    }

    /// Forwards `group` now, or (with `location.forward_jitter_ms`) after a random delay that ends
    /// no later than any member's deadline. Members stay pending (and answerable by shutdown or
    /// cancellation) until then.
    fn forward_after_jitter(&mut self, group: CloakedGroup) {
        let now = self.clock.now_ms();
        let max_jitter = i64::try_from(self.cfg.forward_jitter_ms).unwrap_or(i64::MAX);
        let earliest_deadline = group
            .members
            .iter()
            .filter_map(|(id, _)| self.pending.get(id).map(|entry| entry.deadline_ms))
            .min()
            .unwrap_or(now);
        let room = max_jitter.min(earliest_deadline.saturating_sub(now));
        if room <= 0 {
            return self.forward(group);
        }
        let delay = self.jitter_rng.random_range(0..=room);
        if delay == 0 {
            return self.forward(group);
        }
        self.next_delayed += 1;
        self.delayed
            .push(std::cmp::Reverse((now + delay, self.next_delayed)));
        self.delayed_groups.insert(self.next_delayed, group);
    }

    /// Forwards the delayed groups that are due.
    fn forward_due(&mut self) {
        let now = self.clock.now_ms();
        while let Some(&std::cmp::Reverse((due, key))) = self.delayed.peek() {
            if due > now {
                break;
            }
            self.delayed.pop();
            if let Some(group) = self.delayed_groups.remove(&key) {
                self.forward(group);
            }
        }
    }

    fn forward(&mut self, group: CloakedGroup) {
        let cloaking_box = to_proto_box(&group.cloaking_box);
        let group_size = u32::try_from(group.members.len()).unwrap_or(u32::MAX);
        self.metrics
            .requests
            .group_size
            .record(f64::from(group_size));
        for (id, pseudonym) in group.members {
            let Some(entry) = self.take_pending(id) else {
                continue;
            };
            self.metrics
                .requests
                .relative_anonymity
                .record(f64::from(group_size) / f64::from(entry.k.max(1)));
            self.deliver(
                Delivery {
                    client: entry.client,
                    request_no: entry.request_no,
                    user: entry.user,
                    service: entry.service,
                    payload: entry.payload,
                },
                pseudonym,
                proto::Cloaked {
                    pseudonym: pseudonym.to_string(),
                    r#box: Some(cloaking_box),
                    t_start_ms: group.t_start_ms,
                    t_end_ms: group.t_end_ms,
                    group_size,
                },
            );
        }
    }

    /// Tells the client its request was cloaked and puts it on its service's provider queue under
    /// `pseudonym` (or tells the client it was undelivered when the queue is full); in a cluster
    /// without a provider of the service here, relays it to another replica's ([`relay`]).
    fn deliver(&mut self, to: Delivery, pseudonym: Pseudonym, cloaked: proto::Cloaked) {
        let Delivery {
            client,
            request_no,
            user,
            service,
            payload,
        } = to;
        self.metrics.cloaked.increment(1);
        let forwarded = CloakedRequest {
            pseudonym: cloaked.pseudonym.clone(),
            r#box: cloaked.r#box,
            t_start_ms: cloaked.t_start_ms,
            t_end_ms: cloaked.t_end_ms,
            payload,
            service: self.provider_queues[service].service.clone(),
        };
        self.send(
            client,
            LocationEvent {
                request_no,
                outcome: Some(location_event::Outcome::Cloaked(cloaked)),
            },
        );
        if self.relays(service) {
            self.relay(client, request_no, user, service, forwarded);
        } else {
            self.enqueue(client, request_no, service, pseudonym, forwarded);
        }
        self.maybe_close(client);
    }

    /// Puts a cloaked request on its service's provider queue and routes its answers to `client`
    /// (or tells the client it was undelivered when the queue is full).
    fn enqueue(
        &mut self,
        client: ClientId,
        request_no: u64,
        service: usize,
        pseudonym: Pseudonym,
        forwarded: CloakedRequest,
    ) {
        let now = self.clock.now_ms();
        match self.provider_queues[service]
            .sender
            .try_send(forwarded.clone())
        {
            Ok(()) => {
                self.routes.insert(
                    pseudonym,
                    Route {
                        client,
                        request_no,
                        answered: false,
                        delivered_to: None,
                        service,
                        holder: None,
                        unacknowledged: Some(Box::new(forwarded)),
                    },
                );
                self.route_expiry.push_back((
                    now.saturating_add(i64::try_from(self.cfg.answer_ttl_ms).unwrap_or(i64::MAX)),
                    pseudonym,
                ));
                if let Some(state) = self.clients.get_mut(&client) {
                    state.awaiting_answer += 1;
                }
            }
            Err(err) => {
                let (label, reason) = self.queue_refusal(service, err.is_full());
                self.undelivered(client, request_no, service, label, reason);
            }
        }
    }

    /// The label and reason of a provider queue that refused a request (full, or closed at shutdown).
    fn queue_refusal(&self, service: usize, full: bool) -> (&'static str, String) {
        if full {
            (
                "queue_full",
                format!(
                    "the provider queue of service {:?} is full ({} requests waiting; location.provider_queue)",
                    self.provider_queues[service].service, self.cfg.provider_queue
                ),
            )
        } else {
            ("shutting_down", "the broker is shutting down".to_string())
        }
    }

    /// Tells the client its forwarded request reached no provider, counting it by `label`.
    fn undelivered(
        &mut self,
        client: ClientId,
        request_no: u64,
        service: usize,
        label: &'static str,
        reason: String,
    ) {
        metrics::counter!(
            catalog::LOCATION_UNDELIVERED,
            "service" => self.provider_queues[service].service.clone(),
            "reason" => label,
        )
        .increment(1);
        self.send(
            client,
            LocationEvent {
                request_no,
                outcome: Some(location_event::Outcome::Undelivered(proto::Undelivered {
                    reason,
                })),
            },
        );
    }

    /// The Subscribe stream `provider` took the request of `pseudonym`: it must acknowledge it within
    /// `provider_ack_ms`.
    fn delivered(&mut self, pseudonym: Pseudonym, principal: Arc<str>, provider: ProviderId) {
        let Some(route) = self.routes.get_mut(&pseudonym) else {
            // Expired or undelivered meanwhile: nothing to wait for.
            if let Some(state) = self.providers.get(&provider) {
                state.window.release();
            }
            return;
        };
        route.delivered_to = Some(principal);
        if route.unacknowledged.is_none() {
            // Acknowledged already (a copy handed on earlier was answered): nothing to wait for.
            if let Some(state) = self.providers.get(&provider) {
                state.window.release();
            }
            return;
        }
        match self.providers.get_mut(&provider) {
            Some(state) => {
                route.holder = Some(provider);
                state.unacknowledged.insert(pseudonym);
                let due = self
                    .clock
                    .now_ms()
                    .saturating_add(i64::try_from(self.cfg.provider_ack_ms).unwrap_or(i64::MAX));
                self.ack_expiry.push_back((due, pseudonym, provider));
            }
            // The stream is gone already: hand the request on at once.
            None => self.hand_on(pseudonym, HandOver::Gone),
        }
    }

    /// Closes the streams whose acknowledgement is overdue and hands their requests on.
    fn expire_acks(&mut self) {
        let now = self.clock.now_ms();
        while let Some(&(due, pseudonym, provider)) = self.ack_expiry.front() {
            if due > now {
                break;
            }
            self.ack_expiry.pop_front();
            // The stream's own set is small and holds exactly the requests it still has to
            // acknowledge (so no lookup in the large route table).
            let overdue = self
                .providers
                .get(&provider)
                .is_some_and(|state| state.unacknowledged.contains(&pseudonym));
            if overdue {
                self.end_provider(provider, HandOver::Stalled);
            }
        }
    }

    /// Forgets a provider stream (closing it with a status when it stalled) and hands on every
    /// request it has not acknowledged.
    fn end_provider(&mut self, provider: ProviderId, why: HandOver) {
        let Some(state) = self.providers.remove(&provider) else {
            return;
        };
        self.providers_changed();
        let held = state.unacknowledged.len();
        if let HandOver::Stalled = why {
            tracing::warn!(
                provider,
                service = %self.provider_queues[state.service].service,
                unacknowledged = held,
                limit_ms = self.cfg.provider_ack_ms,
                "provider did not acknowledge a request in time; closing its stream (location.provider_ack_ms)"
            );
            let _ = state.close.send(
                LocationError::ProviderStalled {
                    limit_ms: self.cfg.provider_ack_ms,
                    handed_on: held,
                }
                .into(),
            );
        }
        for pseudonym in state.unacknowledged {
            self.hand_on(pseudonym, why);
        }
    }

    /// Hands a request whose stream stalled or ended to another provider of its service (through
    /// the service's queue), or tells its client it was undelivered when no other provider of the
    /// service is subscribed or the queue is full.
    fn hand_on(&mut self, pseudonym: Pseudonym, why: HandOver) {
        let Some(route) = self.routes.get_mut(&pseudonym) else {
            return;
        };
        let Some(forwarded) = route.unacknowledged.clone() else {
            return;
        };
        route.holder = None;
        route.delivered_to = None;
        let (client, request_no, service) = (route.client, route.request_no, route.service);
        let another = self.providers.values().any(|p| p.service == service);
        let refusal = if another {
            match self.provider_queues[service].sender.try_send(*forwarded) {
                Ok(()) => {
                    metrics::counter!(
                        catalog::LOCATION_REHANDED,
                        "service" => self.provider_queues[service].service.clone(),
                    )
                    .increment(1);
                    return;
                }
                Err(err) => self.queue_refusal(service, err.is_full()),
            }
        } else {
            let cause = match why {
                HandOver::Stalled => format!(
                    "the provider that received it did not acknowledge it within {} ms (location.provider_ack_ms)",
                    self.cfg.provider_ack_ms
                ),
                HandOver::Gone => {
                    "the provider stream that received it ended before acknowledging it (location.provider_ack_ms)"
                        .to_string()
                }
            };
            (
                "no_provider",
                format!(
                    "{cause} and no other provider of service {:?} is subscribed",
                    self.provider_queues[service].service
                ),
            )
        };
        // Undelivered: the route is over (an answer that still comes is undeliverable).
        self.routes.remove(&pseudonym);
        if let Some(state) = self.clients.get_mut(&client) {
            state.awaiting_answer = state.awaiting_answer.saturating_sub(1);
        }
        self.undelivered(client, request_no, service, refusal.0, refusal.1);
        self.maybe_close(client);
    }

    /// A PRESENCE request: cloaked at once into its anonymity set's region, or expired at once.
    fn submit_presence(&mut self, client: ClientId, request: AdmittedRequest) {
        let request_no = request.request_no;
        let now = self.clock.now_ms();
        let user = self.user_key(&request.user_id);
        let req = PresenceRequest {
            user,
            lat: request.lat,
            lon: request.lon,
            k: request.k,
            dx_m: request.dx_m,
            dy_m: request.dy_m,
        };
        match self.presence.cloak(&req, now) {
            Ok(PresenceOutcome::Cloaked(region)) => {
                let group_size = u32::try_from(region.anonymity_set.len()).unwrap_or(u32::MAX);
                // The anonymity set is the presence model's group.
                let presence = &self.metrics.presence;
                presence.group_size.record(f64::from(group_size));
                presence
                    .relative_anonymity
                    .record(f64::from(group_size) / f64::from(request.k.max(1)));
                self.deliver(
                    Delivery {
                        client,
                        request_no,
                        user,
                        service: request.service,
                        payload: request.payload,
                    },
                    region.pseudonym,
                    proto::Cloaked {
                        pseudonym: region.pseudonym.to_string(),
                        r#box: Some(to_proto_box(&region.cloaking_box)),
                        t_start_ms: now,
                        t_end_ms: now,
                        group_size,
                    },
                );
            }
            Ok(PresenceOutcome::Expired(_)) => {
                self.send(
                    client,
                    LocationEvent {
                        request_no,
                        outcome: Some(location_event::Outcome::Expired(proto::Expired {
                            deadline_ms: now,
                        })),
                    },
                );
                self.maybe_close(client);
            }
            Err(err) => {
                let rejection = presence_rejection(err);
                self.send(client, rejection.to_event(request_no));
                self.maybe_close(client);
            }
        }
    }

    /// Position updates of one Report batch, applied in order; stops at the first refused one.
    fn report(&mut self, updates: Vec<AdmittedUpdate>) -> ReportResult {
        let now = self.clock.now_ms();
        for (applied, update) in updates.into_iter().enumerate() {
            let user = self.user_key(&update.user_id);
            if let Err(err) = self.presence.update(user, update.lat, update.lon, now) {
                return ReportResult {
                    applied,
                    refused: Some(presence_rejection(err)),
                };
            }
        }
        ReportResult {
            applied: usize::MAX,
            refused: None,
        }
    }

    /// The broker-lifetime key of a user id (a keyed hash, so no table of user ids is kept for it).
    fn user_key(&self, user_id: &str) -> UserKey {
        std::hash::BuildHasher::hash_one(&self.user_keys, user_id)
    }

    fn answer(
        &mut self,
        pseudonym: Pseudonym,
        payload: Option<Vec<u8>>,
        tally: &AnswerTally,
        principal: &str,
    ) {
        let Some(route) = self.routes.get_mut(&pseudonym) else {
            tally.undeliverable.fetch_add(1, Ordering::Relaxed);
            self.metrics.answers_undeliverable.increment(1);
            return;
        };
        if route.delivered_to.as_deref() != Some(principal) {
            tally.denied.fetch_add(1, Ordering::Relaxed);
            crate::auth::permission_denied(
                principal,
                "answer_binding",
                "an answer is accepted only from the principal whose Subscribe stream received the pseudonym",
            );
            return;
        }
        // An answer or an acknowledgement: stop waiting for the acknowledgement and free the
        // request's place in its stream's window.
        route.unacknowledged = None;
        let holder = route.holder.take();
        let (client, request_no) = (route.client, route.request_no);
        let first = payload.is_some() && !route.answered;
        if payload.is_some() {
            route.answered = true;
        }
        if let Some(holder) = holder
            && let Some(state) = self.providers.get_mut(&holder)
            && state.unacknowledged.remove(&pseudonym)
        {
            state.window.release();
        }
        let Some(payload) = payload else {
            tally.acknowledged.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if !self.clients.contains_key(&client) {
            tally.undeliverable.fetch_add(1, Ordering::Relaxed);
            self.metrics.answers_undeliverable.increment(1);
            return;
        }
        self.send(
            client,
            LocationEvent {
                request_no,
                outcome: Some(location_event::Outcome::Reply(proto::LbsReply { payload })),
            },
        );
        if self.clients.contains_key(&client) {
            tally.delivered.fetch_add(1, Ordering::Relaxed);
            self.metrics.answers_delivered.increment(1);
        } else {
            tally.undeliverable.fetch_add(1, Ordering::Relaxed);
            self.metrics.answers_undeliverable.increment(1);
        }
        if first {
            if let Some(state) = self.clients.get_mut(&client) {
                state.awaiting_answer = state.awaiting_answer.saturating_sub(1);
            }
            self.maybe_close(client);
        }
    }

    fn prune_routes(&mut self) {
        let now = self.clock.now_ms();
        while let Some(&(expires, pseudonym)) = self.route_expiry.front() {
            if expires > now {
                break;
            }
            self.route_expiry.pop_front();
            if let Some(route) = self.routes.remove(&pseudonym)
                && !route.answered
            {
                if let Some(holder) = route.holder
                    && let Some(state) = self.providers.get_mut(&holder)
                    && state.unacknowledged.remove(&pseudonym)
                {
                    state.window.release();
                }
                if let Some(state) = self.clients.get_mut(&route.client) {
                    state.awaiting_answer = state.awaiting_answer.saturating_sub(1);
                }
                if route.unacknowledged.is_some() {
                    let reason = format!(
                        "no provider of service {:?} acknowledged it within {} ms (location.answer_ttl_ms)",
                        self.provider_queues[route.service].service, self.cfg.answer_ttl_ms
                    );
                    self.undelivered(
                        route.client,
                        route.request_no,
                        route.service,
                        "expired",
                        reason,
                    );
                }
                self.maybe_close(route.client);
            }
        }
    }

    /// Sends an event; a client that is gone or reads too slowly loses its stream (the slow one is
    /// told so with RESOURCE_EXHAUSTED when it reads again).
    fn send(&mut self, client: ClientId, event: LocationEvent) {
        let Some(state) = self.clients.get(&client) else {
            return;
        };
        if state.events.try_event(event) {
            return;
        }
        if !state.events.is_closed() {
            tracing::warn!(
                client,
                limit = self.cfg.client_queue,
                "client reads too slowly; closing its stream (location.client_queue)"
            );
            state.events.finish(
                LocationError::ClientTooSlow {
                    limit: self.cfg.client_queue,
                }
                .into(),
            );
        }
        self.drop_client(client);
    }

    fn maybe_close(&mut self, client: ClientId) {
        let done = self.clients.get(&client).is_some_and(|state| {
            state.draining
                && state.pending.is_empty()
                && state.awaiting_answer == 0
                && self.remote.awaited(client) == 0
        });
        if done
            && let Some(state) = self.clients.remove(&client)
            && let Some(status) = state.final_status
        {
            state.events.finish(status);
        }
    }

    /// Forgets a client and withdraws its pending requests from the engine.
    fn drop_client(&mut self, client: ClientId) {
        let Some(state) = self.clients.remove(&client) else {
            return;
        };
        self.forget_remote(client);
        for id in state.pending {
            self.engine.cancel(id);
            if self.take_pending(id).is_some() {
                self.metrics.withdrawn.increment(1);
            }
        }
    }

    /// At shutdown: every pending request is told it was not forwarded.
    fn shut_down(&mut self) {
        let ids: Vec<RequestId> = self.pending.keys().copied().collect();
        for id in ids {
            self.engine.cancel(id);
            if let Some(entry) = self.take_pending(id) {
                let rejection = Rejection {
                    field: "request_no",
                    reason: "the broker is shutting down; the request was not forwarded".into(),
                    code: Code::Unavailable,
                };
                self.reject(entry.client, entry.request_no, &rejection);
            }
        }
        self.shut_down_remote();
        self.clients.clear();
        self.providers.clear();
        self.all_provider_queues.close();
        self.record_gauges(0);
    }

    /// Takes a reloaded configuration, and the queues of services it added, before the commands
    /// that may use them.
    fn refresh_config(&mut self) {
        if self.live.has_changed().unwrap_or(false) {
            self.cfg = self.live.borrow_and_update().clone();
        }
        self.all_provider_queues.extend(&mut self.provider_queues);
    }

    /// Updates the pending, command-queue and provider-queue gauges.
    fn record_gauges(&self, commands_waiting: usize) {
        self.metrics.pending.set(self.pending.len() as f64);
        self.metrics.command_queue.set(commands_waiting as f64);
        for queue in &self.provider_queues {
            queue.depth.set(queue.sender.len() as f64);
        }
    }

    pub(super) async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut batch = Vec::with_capacity(COMMAND_BATCH);
        loop {
            // Wake for the next request deadline, and for the next route to expire (a stream
            // waiting only for answers closes when its last route expires).
            let next_route = self
                .route_expiry
                .front()
                .map(|&(expires, _)| expires.saturating_add(1));
            let next_ack = self.ack_expiry.front().map(|&(due, _, _)| due);
            let next_remote = self.remote.next_expiry();
            let next_expiry = [
                self.engine.next_deadline(),
                next_route,
                next_ack,
                next_remote,
            ]
            .into_iter()
            .flatten()
            .min()
            .map(|deadline| self.clock.instant_at(deadline.saturating_add(1)));
            let next_forward = self
                .delayed
                .peek()
                .map(|std::cmp::Reverse((due, _))| self.clock.instant_at(*due));
            let wake = tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                received = commands.recv_many(&mut batch, COMMAND_BATCH) => {
                    if received == 0 {
                        break;
                    }
                    Wake::Commands
                }
                _ = tokio::time::sleep_until(next_expiry.unwrap_or_else(tokio::time::Instant::now)),
                    if next_expiry.is_some() => Wake::Deadline,
                _ = tokio::time::sleep_until(next_forward.unwrap_or_else(tokio::time::Instant::now)),
                    if next_forward.is_some() => Wake::Forward,
            };
            // Busy from here to the next wait (cloakd_location_broker_busy_seconds_total).
            let busy_from = std::time::Instant::now();
            match wake {
                Wake::Commands => {
                    self.refresh_config();
                    // Expire first so a request never joins a group after its deadline.
                    self.expire();
                    for command in batch.drain(..) {
                        self.handle(command);
                    }
                }
                Wake::Deadline => self.expire(),
                Wake::Forward => {}
            }
            self.forward_due();
            self.expire_acks();
            self.prune_routes();
            self.expire_remote();
            self.record_gauges(commands.len());
            telemetry::saturation::record_broker_busy(busy_from.elapsed());
        }
        self.shut_down();
    }
}

/// What woke the broker actor.
enum Wake {
    Commands,
    Deadline,
    Forward,
}

/// The refusal of a request whose user has one of the same number pending (here or, forwarded,
/// at its cell's owner).
fn already_pending(request_no: u64) -> Rejection {
    Rejection {
        field: "request_no",
        reason: format!("the user already has request {request_no} pending"),
        code: Code::AlreadyExists,
    }
}

/// A refusal of the presence engine as the client sees it.
fn presence_rejection(err: PresenceError) -> Rejection {
    match err {
        PresenceError::Invalid { field, rule } => Rejection::invalid(field, rule),
        err @ PresenceError::TooManyUsers { .. } => {
            Rejection::exhausted("user_id", err.to_string())
        }
    }
}

fn to_proto_box(b: &GeoBox) -> BoundingBox {
    BoundingBox {
        min_lat: b.min_lat,
        min_lon: b.min_lon,
        max_lat: b.max_lat,
        max_lon: b.max_lon,
    }
}
