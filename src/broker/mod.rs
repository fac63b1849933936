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
//!
//! The layer between the gRPC adapters ([`crate::service::location`], proto <-> domain and the one
//! status mapping) and the pure engines ([`crate::location`]): the handlers validate and send
//! [`message::Command`]s; this actor holds every piece of state of the location path. By job:
//! [`admission`] (rate and pending limits), [`cloaking`] (engines, dispatch, jitter), [`delivery`]
//! (provider queues, acknowledgements, answers, client streams), [`metrics`], and across replicas
//! [`replicas`] (the link to the cluster, requests cloaked or served elsewhere, relaying, NATS). Arrows point down: handlers -> [`message`] <- actor.
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use tokio::sync::{mpsc, oneshot, watch};
use tonic::Code;

use self::metrics::BrokerMetrics;
use crate::config::LocationConfig;
use crate::location::{
    CloakedGroup, Engine, Outcome, PresenceEngine, Pseudonym, RequestId, UserKey,
};
use crate::proto::{self, CloakedRequest};
use crate::telemetry;
use admission::already_pending;
use message::{ClientId, Command, EventQueue, ProviderId, ProviderWindow, Rejection, StreamEnd};
use provider_queues::{ProviderQueue, ProviderQueues};
use rate::RateLimiter;
use replicas::ClusterLink;
use routes::Routes;

mod admission;
mod cloaking;
mod clock;
mod delivery;
mod geo_budget;
mod geo_ind;
pub(crate) mod message;
mod metrics;
pub(crate) mod provider_queues;
pub(crate) mod provider_stream;
mod rate;
pub(crate) mod replicas;
mod routes;
#[cfg(test)]
mod testing;

pub use clock::BrokerClock;

/// Commands the actor takes per wake-up.
const COMMAND_BATCH: usize = 1024;

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
    /// Events of this wake-up not yet handed to the stream ([`Broker::flush_events`]).
    outbox: Vec<proto::LocationEvent>,
    /// What ends the stream once it has drained (OK when `None`).
    final_status: Option<StreamEnd>,
    principal: Arc<str>,
    rate_limited: bool,
    pending: HashSet<RequestId>,
    /// Forwarded requests whose pseudonym is still routable and has not been answered yet.
    awaiting_answer: usize,
    draining: bool,
}

impl ClientState {
    /// A stream of `principal`; `draining` when it brings one request and ends with its outcome
    /// (a request another replica forwarded or relayed here).
    fn new(events: EventQueue, principal: Arc<str>, rate_limited: bool, draining: bool) -> Self {
        ClientState {
            events,
            outbox: Vec::new(),
            final_status: None,
            principal,
            rate_limited,
            pending: HashSet::new(),
            awaiting_answer: 0,
            draining,
        }
    }

    /// Hands the stream the events of this wake-up in order; false when one could not be queued
    /// (the client is gone or reads too slowly), and the rest are dropped with it.
    fn flush(&mut self) -> bool {
        for event in self.outbox.drain(..) {
            if !self.events.try_event(event) {
                return false;
            }
        }
        true
    }
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
    /// REQUESTS with fallback_epsilon_per_km: answered under GEO_IND at its deadline.
    fallback: Option<geo_ind::Fallback>,
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
    /// The request as forwarded (shared with the provider queue), kept until a provider
    /// acknowledges it so it can be handed on.
    unacknowledged: Option<Arc<CloakedRequest>>,
}

/// One provider's Subscribe stream, as the broker tracks it.
struct ProviderState {
    service: usize,
    window: Arc<ProviderWindow>,
    close: oneshot::Sender<StreamEnd>,
    /// Requests it took and has not acknowledged.
    unacknowledged: HashSet<Pseudonym>,
}

/// Why a request is handed on: the requests of a provider stream, or one waiting on its queue.
#[derive(Debug, Clone, Copy)]
enum HandOver {
    /// The stream did not acknowledge one of them within `provider_ack_ms` (it was closed).
    Stalled,
    /// The stream ended.
    Gone,
    /// In a cluster, the last provider of its service here left while it waited on the service's
    /// provider queue.
    Unsubscribed,
}

/// The actor that owns the engine and every routing table.
pub(crate) struct Broker {
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
    /// Clients with events in their outbox, in the order of their first event this wake-up.
    to_flush: Vec<ClientId>,
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
    /// GEO_IND draws: seeded from the operating system, never from `location.seed`.
    geo_rng: ChaCha20Rng,
    metrics: BrokerMetrics,
    /// Cluster: cell owners and the way to other replicas (`None`: standalone).
    cluster: Option<ClusterLink>,
    /// Cluster: requests of this replica's clients that another replica cloaks.
    remote: replicas::RemoteRequests,
    /// The privacy budget of GEO_IND answers (`None`: `location.geo_ind.budget = 0`).
    budget: Option<geo_budget::GeoBudget>,
}

impl Broker {
    pub(crate) fn new(
        live: watch::Receiver<Arc<LocationConfig>>,
        seed: u64,
        all_provider_queues: Arc<ProviderQueues>,
    ) -> Broker {
        let cfg = live.borrow().clone();
        let mut provider_queues = Vec::new();
        all_provider_queues.extend(&mut provider_queues);
        Broker {
            engine: Engine::new(cfg.search, seed)
                .with_index(cfg.index)
                .with_sessions(cfg.sessions),
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
            to_flush: Vec::new(),
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
            geo_rng: ChaCha20Rng::from_os_rng(),
            metrics: BrokerMetrics::new(),
            cfg,
            live,
            cluster: None,
            remote: replicas::RemoteRequests::default(),
            budget: None,
        }
    }

    /// Keeps the privacy budget of GEO_IND answers in `ledger`; its answers come back on `commands`
    /// (this broker's own command channel).
    pub(crate) fn with_budget(
        mut self,
        ledger: crate::ledger::Ledger,
        commands: mpsc::Sender<Command>,
        params: crate::location::geo_ind::predictive::PredictiveParams,
    ) -> Broker {
        self.budget = Some(geo_budget::GeoBudget::new(ledger, commands, params));
        self
    }

    /// Cluster mode: requests go to the replica owning their cell ([`replicas`]).
    pub(crate) fn with_cluster(mut self, link: ClusterLink) -> Broker {
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
                    ClientState::new(events, principal, rate_limited, false),
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
            Command::InboundFailed { client, status } => {
                if let Some(state) = self.clients.get_mut(&client) {
                    state.draining = true;
                    state.final_status = Some(StreamEnd::InboundFailed(status));
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
            Command::BudgetCharged { id, result } => self.budget_charged(id, result),
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
        self.flush_events();
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

    pub(crate) async fn run(
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
            self.flush_events();
            self.record_gauges(commands.len());
            telemetry::saturation::record_broker_busy(busy_from.elapsed());
        }
        self.shut_down();
    }
}

/// Runs the broker actor: on a thread of its own (with a single-threaded runtime) when the daemon
/// runs on tokio's multi-threaded runtime, so the one actor every request passes through is
/// scheduled by the kernel beside the gRPC workers instead of queueing behind their tasks; on the
/// caller's runtime otherwise (tests on a paused clock run on a current-thread runtime).
pub(crate) fn spawn(
    broker: Broker,
    commands: mpsc::Receiver<Command>,
    shutdown: watch::Receiver<bool>,
) {
    let multi_threaded = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if !multi_threaded {
        tokio::spawn(broker.run(commands, shutdown));
        return;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::warn!(%err, "cannot build the location broker's own runtime; it shares the daemon's");
            tokio::spawn(broker.run(commands, shutdown));
            return;
        }
    };
    // The actor goes to the thread once it runs, so it is never lost with a thread that did not
    // start.
    let (hand_over, taken) =
        std::sync::mpsc::channel::<(Broker, mpsc::Receiver<Command>, watch::Receiver<bool>)>();
    let spawned = std::thread::Builder::new()
        .name("cloakd-broker".into())
        .spawn(move || {
            if let Ok((broker, commands, shutdown)) = taken.recv() {
                runtime.block_on(broker.run(commands, shutdown));
            }
        });
    match spawned {
        Ok(_) => {
            let _ = hand_over.send((broker, commands, shutdown));
        }
        Err(err) => {
            tracing::warn!(%err, "cannot start the location broker's own thread; it shares the daemon's runtime");
            tokio::spawn(broker.run(commands, shutdown));
        }
    }
}

/// What woke the broker actor.
enum Wake {
    Commands,
    Deadline,
    Forward,
}
