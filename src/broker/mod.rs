//! The broker actor: owns the CliqueCloak [`Engine`](crate::location::Engine) and every routing table of the location path.
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
//! It also owns the [`PresenceEngine`](crate::location::PresenceEngine): Report batches and every request's own position update each
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
//! [`message::Command`]s; this actor holds every piece of state of the location path, grouped by
//! the concern that uses it, each group a struct owned by the one file that works on it (as
//! mini-redis keeps its state apart from its handlers); this file keeps the configuration, the
//! clock, the metrics, the command loop and shutdown. By job:
//! - [`admission`] (`AdmissionState`: rate buckets, user keys, the (user, request number) pairs
//!   held): the one place that decides whether a request is admitted: rate limit, pending limits
//!   here and for requests other replicas cloak, one request per user and number;
//! - [`cloaking`] (`CloakingState`: the engines, pending requests, groups waiting out their
//!   jitter): engine calls, dispatch, jitter, PRESENCE answers and Report batches;
//! - [`geo_ind`] (`GeoIndState`: its generator and budget) and [`geo_budget`] (charging the budget
//!   before an answer is released);
//! - [`delivery`] (`DeliveryState`: provider queues and streams, routes, acknowledgement
//!   deadlines): provider queues, acknowledgements, handing on, answers by pseudonym;
//! - [`clients`] (`ClientStreams`): the client streams, their events of one wake-up, closing;
//! - [`replicas`] (`ReplicaState`: the cluster link, remote requests): forwarding to a cell's
//!   owner, relaying to a replica with a provider, the NATS side;
//! - beside them [`metrics`], [`clock`], [`rate`] (the token bucket), [`routes`] (the sharded
//!   route table), and the providers' side: [`provider_stream`] (one Subscribe stream's take
//!   loop) and [`provider_queues`].
//!
//! Arrows point down: handlers -> [`message`] <- actor.
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tonic::Code;

use self::metrics::BrokerMetrics;
use crate::config::LocationConfig;
use crate::location::RequestId;
use crate::telemetry;
use clients::ClientState;
use delivery::HandOver;
use message::{Command, Rejection, StreamEnd};
use provider_queues::ProviderQueues;
use replicas::ClusterLink;

mod admission;
mod clients;
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

/// The actor that owns the engine and every routing table: its state grouped by the concern that
/// uses it, each group owned by the file that works on it.
pub(crate) struct Broker {
    /// The `[location]` section in force, refreshed from `live` before each batch of commands.
    cfg: Arc<LocationConfig>,
    live: watch::Receiver<Arc<LocationConfig>>,
    clock: BrokerClock,
    metrics: BrokerMetrics,
    /// Rate buckets, user keys and the (user, request number) pairs held ([`admission`]).
    admission: admission::AdmissionState,
    /// The engines, the pending requests and the groups waiting out their jitter ([`cloaking`]).
    cloaking: cloaking::CloakingState,
    /// Provider queues and streams, routes and acknowledgement deadlines ([`delivery`]).
    delivery: delivery::DeliveryState,
    /// The client streams and their events of this wake-up ([`clients`]).
    clients: clients::ClientStreams,
    /// GEO_IND's generator and privacy budget ([`geo_ind`], [`geo_budget`]).
    geo_ind: geo_ind::GeoIndState,
    /// The link to the cluster and the requests cloaked or served elsewhere ([`replicas`]).
    replicas: replicas::ReplicaState,
}

impl Broker {
    pub(crate) fn new(
        live: watch::Receiver<Arc<LocationConfig>>,
        seed: u64,
        all_provider_queues: Arc<ProviderQueues>,
    ) -> Broker {
        let cfg = live.borrow().clone();
        Broker {
            admission: admission::AdmissionState::default(),
            cloaking: cloaking::CloakingState::new(&cfg, seed),
            delivery: delivery::DeliveryState::new(all_provider_queues),
            clients: clients::ClientStreams::default(),
            geo_ind: geo_ind::GeoIndState::new(),
            replicas: replicas::ReplicaState::default(),
            clock: BrokerClock::new(),
            metrics: BrokerMetrics::new(),
            cfg,
            live,
        }
    }

    /// Keeps the privacy budget of GEO_IND answers in `ledger`; its answers come back on `commands`
    /// (this broker's own command channel).
    pub(crate) fn with_budget(
        mut self,
        ledger: crate::ledger::Ledger,
        commands: mpsc::Sender<Command>,
        params: crate::location::geo_ind::predictive::PredictiveParams,
        reserve: f64,
    ) -> Broker {
        self.geo_ind.budget = Some(geo_budget::GeoBudget::new(
            ledger, commands, params, reserve,
        ));
        self
    }

    /// Cluster mode: requests go to the replica owning their cell ([`replicas`]).
    pub(crate) fn with_cluster(mut self, link: ClusterLink) -> Broker {
        self.replicas.link = Some(link);
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
            } => self.open_provider(provider, service, window, close),
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
            Command::BudgetCharged { answers } => {
                for (id, result) in answers {
                    self.budget_charged(id, result);
                }
            }
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
        let ids: Vec<RequestId> = self.cloaking.pending.keys().copied().collect();
        for id in ids {
            self.cloaking.engine.cancel(id);
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
        self.delivery.providers.clear();
        self.delivery.all_provider_queues.close();
        self.record_gauges(0);
    }

    /// Takes a reloaded configuration, and the queues of services it added, before the commands
    /// that may use them.
    fn refresh_config(&mut self) {
        if self.live.has_changed().unwrap_or(false) {
            self.cfg = self.live.borrow_and_update().clone();
        }
        self.delivery
            .all_provider_queues
            .extend(&mut self.delivery.provider_queues);
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
                .delivery
                .routes
                .next_expiry()
                .map(|expires| expires.saturating_add(1));
            let next_ack = self.delivery.ack_expiry.front().map(|&(due, _, _)| due);
            let next_remote = self.replicas.remote.next_expiry();
            let next_expiry = [
                self.cloaking.engine.next_deadline(),
                next_route,
                next_ack,
                next_remote,
            ]
            .into_iter()
            .flatten()
            .min()
            .map(|deadline| self.clock.instant_at(deadline.saturating_add(1)));
            let next_forward = self
                .cloaking
                .next_forward()
                .map(|due| self.clock.instant_at(due));
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
            self.delivery.announce();
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
