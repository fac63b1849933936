//! Test fixture of the broker's unit tests: one [`Broker`] driven command by command, with the real
//! engines, on tokio's paused clock (tests advance it with `tokio::time::advance`). [`Fixture::tick`]
//! does what the run loop does after every wake-up, so a rule can be checked on its own without
//! the channel or the loop around it.
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, watch};

use super::Broker;
use super::message::{
    AdmittedRequest, ClientId, Command, EventQueue, ProviderId, ProviderWindow, StreamEnd,
};
use super::providers::ProviderQueues;
use crate::config::{CloakModel, Config, LocationConfig};
use crate::location::Pseudonym;
use crate::proto::{CloakedRequest, LocationEvent, location_event};

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
    }
}

pub(super) struct Fixture {
    pub(super) broker: Broker,
    pub(super) queues: Arc<ProviderQueues>,
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
        let queues = Arc::new(ProviderQueues::new(&cfg.services, cfg.provider_queue));
        // The sender may go: the broker keeps the last value it was given.
        let (_, live) = watch::channel(Arc::new(cfg));
        let broker = Broker::new(live, 7, Arc::clone(&queues));
        Fixture { broker, queues }
    }

    pub(super) fn open(&mut self, client: ClientId, principal: &str, rate_limited: bool) -> Events {
        let (events, receiver) = EventQueue::channel(self.broker.cfg.client_queue);
        self.broker.handle(Command::Open {
            client,
            events,
            principal: principal.into(),
            rate_limited,
        });
        receiver
    }

    pub(super) fn submit(&mut self, client: ClientId, request: AdmittedRequest) {
        self.broker.handle(Command::Submit {
            client,
            request,
            received: std::time::Instant::now(),
        });
    }

    pub(super) fn subscribe(&mut self, id: ProviderId) -> Provider {
        let window = Arc::new(ProviderWindow::default());
        let (close, closed) = oneshot::channel();
        self.broker.handle(Command::ProviderOpen {
            provider: id,
            service: 0,
            window: Arc::clone(&window),
            close,
        });
        Provider { id, window, closed }
    }

    /// Takes what the service's provider queue holds, as a Subscribe stream of `principal` would,
    /// and tells the broker (`Delivered`).
    pub(super) fn take(&mut self, provider: &Provider, principal: &str) -> Vec<CloakedRequest> {
        let queue = self.queues.get("poi").expect("queue of poi").receiver;
        let mut taken = Vec::new();
        while let Ok(request) = queue.try_recv() {
            provider.window.take();
            taken.push(request);
        }
        let pseudonyms = taken.iter().map(pseudonym).collect();
        self.broker.handle(Command::Delivered {
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
