//! Test fixture of the broker's unit tests: one [`Broker`] driven command by command, with the real
//! engines, on tokio's paused clock (tests advance it with `tokio::time::advance`). [`Fixture::tick`]
//! does what the run loop does after every wake-up, so a rule can be checked on its own without
//! the channel or the loop around it. [`Fixture::clustered`] makes the broker one replica of a
//! cluster without NATS: the test reads what it sends other replicas ([`Wire`]) and hands it what
//! they would send back, as commands.
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::sync::{mpsc, oneshot, watch};

use super::Broker;
use super::message::{
    AdmittedRequest, ClientId, Command, EventQueue, Outbound, ProviderId, ProviderWindow,
    RelayRefusal, RemoteClient, StreamEnd,
};
use super::provider_queues::ProviderQueues;
use super::replicas::ClusterLink;
use crate::cluster::Owner;
use crate::config::{CloakModel, Config, LocationConfig};
use crate::location::Pseudonym;
use crate::proto::{CloakedRequest, LocationEvent, location_event};

/// `cluster.request_timeout_ms` of a clustered fixture.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// The embedded defaults with one service (`poi`), no forwarding jitter and a fixed seed.
pub(super) fn config() -> LocationConfig {
    let mut cfg = Config::embedded_defaults().location;
    cfg.services = vec!["poi".to_string()];
    cfg.forward_jitter_ms = 0;
    cfg.seed = Some(7);
    cfg
}

/// A CliqueCloak request of `user` near Oldenburg with 500 m tolerances and 10 s to wait.
pub(super) fn request(user: &str, request_no: u64, k: u32) -> AdmittedRequest {
    AdmittedRequest {
        user_id: user.to_string(),
        request_no,
        lat: 53.14,
        lon: 8.21,
        k,
        dx_m: 500.0,
        dy_m: 500.0,
        dt_ms: 10_000,
        payload: format!("query of {user}").into_bytes(),
        service: 0,
        model: CloakModel::Requests,
        epsilon_per_km: None,
        fallback_epsilon_per_km: None,
    }
}

pub(super) struct Fixture {
    pub(super) broker: Broker,
    pub(super) queues: Arc<ProviderQueues>,
    /// The broker's own metrics (its handles are registered here, not with the process's
    /// recorder).
    metrics: PrometheusHandle,
}

/// What a clustered fixture's replica (node `a`) sends other replicas, in place of NATS.
pub(super) struct Wire {
    pub(super) outbound: mpsc::Receiver<Outbound>,
    /// The sender the NATS side gives streams of other replicas' clients.
    pub(super) out: mpsc::Sender<Outbound>,
    /// Commands the link hands its own broker (kept open; nothing reads them).
    _commands: mpsc::Receiver<Command>,
}

impl Wire {
    /// Everything sent so far.
    pub(super) fn sent(&mut self) -> Vec<Outbound> {
        let mut sent = Vec::new();
        while let Ok(message) = self.outbound.try_recv() {
            sent.push(message);
        }
        sent
    }
}

/// One client stream's events as the handler would read them.
pub(super) type Events = mpsc::Receiver<Result<LocationEvent, StreamEnd>>;

/// One provider's Subscribe stream as the broker sees it.
pub(super) struct Provider {
    pub(super) id: ProviderId,
    pub(super) window: Arc<ProviderWindow>,
    pub(super) closed: oneshot::Receiver<StreamEnd>,
}

impl Fixture {
    pub(super) fn new(cfg: LocationConfig) -> Fixture {
        let recorder = PrometheusBuilder::new().build_recorder();
        let metrics = recorder.handle();
        let (broker, queues) = metrics::with_local_recorder(&recorder, || {
            let queues = Arc::new(ProviderQueues::new(&cfg.services, cfg.provider_queue));
            // The sender may go: the broker keeps the last value it was given.
            let (_, live) = watch::channel(Arc::new(cfg));
            (Broker::new(live, 7, Arc::clone(&queues)), queues)
        });
        Fixture {
            broker,
            queues,
            metrics,
        }
    }

    /// The broker as replica `a` of a cluster on which every cell is owned by `owner`.
    pub(super) fn clustered(cfg: LocationConfig, owner: Owner) -> (Fixture, Wire) {
        let mut f = Fixture::new(cfg);
        let (out, outbound) = mpsc::channel(64);
        let (commands, _commands) = mpsc::channel(64);
        let link = ClusterLink::detached("a", owner, out.clone(), commands, REQUEST_TIMEOUT);
        f.broker.replicas.link = Some(link);
        let wire = Wire {
            outbound,
            out,
            _commands,
        };
        (f, wire)
    }

    /// One command, then what the run loop does with the events of its wake-up (they go out).
    pub(super) fn handle(&mut self, command: Command) {
        self.broker.handle(command);
        self.broker.flush_events();
        self.broker.delivery.announce();
    }

    pub(super) fn open(&mut self, client: ClientId, principal: &str, rate_limited: bool) -> Events {
        let (events, receiver) = EventQueue::channel(self.broker.cfg.client_queue);
        self.handle(Command::Open {
            client,
            events,
            principal: principal.into(),
            rate_limited,
        });
        receiver
    }

    pub(super) fn submit(&mut self, client: ClientId, request: AdmittedRequest) {
        self.handle(Command::Submit {
            client,
            request,
            received: std::time::Instant::now(),
        });
    }

    pub(super) fn subscribe(&mut self, id: ProviderId) -> Provider {
        let window = Arc::new(ProviderWindow::default());
        let (close, closed) = oneshot::channel();
        self.handle(Command::ProviderOpen {
            provider: id,
            service: 0,
            window: Arc::clone(&window),
            close,
        });
        Provider { id, window, closed }
    }

    /// The provider stream `provider` ends.
    pub(super) fn leave(&mut self, provider: &Provider) {
        self.handle(Command::ProviderGone {
            provider: provider.id,
        });
    }

    /// A cloaked request another replica relays here, its events for `tag` on node `b`: whether
    /// this replica took it.
    pub(super) fn relayed(
        &mut self,
        wire: &Wire,
        client: ClientId,
        tag: u64,
        request: CloakedRequest,
    ) -> Result<(), RelayRefusal> {
        let (taken, mut answer) = oneshot::channel();
        let to = RemoteClient {
            node: Arc::from("b"),
            tag,
        };
        self.handle(Command::Relayed {
            client,
            events: EventQueue::replica(to, wire.out.clone()),
            service: 0,
            request,
            taken,
        });
        answer.try_recv().expect("the broker answers at once")
    }

    /// Takes what the service's provider queue holds, as a Subscribe stream of `principal` would,
    /// and tells the broker (`Delivered`).
    pub(super) fn take(&mut self, provider: &Provider, principal: &str) -> Vec<CloakedRequest> {
        let queue = self.queues.get("poi").expect("queue of poi").queue;
        let mut taken = Vec::new();
        while let Some(request) = queue.try_take() {
            provider.window.take();
            taken.push(Arc::unwrap_or_clone(request.request));
        }
        let pseudonyms = taken.iter().map(pseudonym).collect();
        self.handle(Command::Delivered {
            pseudonyms,
            principal: principal.into(),
            provider: provider.id,
        });
        taken
    }

    /// What the run loop does after every wake-up.
    pub(super) fn tick(&mut self) {
        self.broker.expire();
        self.broker.forward_due();
        self.broker.expire_acks();
        self.broker.prune_routes();
        self.broker.expire_remote();
        self.broker.flush_events();
        self.broker.record_gauges(0);
    }

    /// The value of the gauge `name{service="poi"}` as last recorded.
    pub(super) fn gauge_of_poi(&self, name: &str) -> Option<f64> {
        let series = format!("{name}{{service=\"poi\"}} ");
        self.metrics
            .render()
            .lines()
            .find_map(|line| line.strip_prefix(&series))
            .and_then(|value| value.trim().parse().ok())
    }
}

pub(super) fn pseudonym(request: &CloakedRequest) -> Pseudonym {
    request
        .pseudonym
        .parse()
        .expect("a pseudonym the broker formatted")
}

/// Everything queued on a client stream so far: events, then the status that ended it if any.
pub(super) fn drain(events: &mut Events) -> (Vec<location_event::Outcome>, Option<StreamEnd>) {
    let mut outcomes = Vec::new();
    while let Ok(item) = events.try_recv() {
        match item {
            Ok(event) => outcomes.push(event.outcome.expect("every event has an outcome")),
            Err(end) => return (outcomes, Some(end)),
        }
    }
    (outcomes, None)
}
