//! gRPC adapter of location cloaking: `LocationBroker.Submit` (mobile clients) and `LbsGateway`
//! (providers), around one broker actor that owns the CliqueCloak [`Engine`].
//!
//! Flow: each client stream's task validates requests (rejections name the field and the rule) and hands
//! them to the actor over a bounded channel (backpressure, not growth). The actor stamps arrival time on
//! tokio's clock, feeds the engine, and routes outcomes: `Cloaked`/`Expired`/`Rejected` to the client,
//! `CloakedRequest` to the service's provider queue (bounded; it also buffers while no provider is
//! subscribed, and when it is full the client gets `Undelivered`). Answers come back by pseudonym through a
//! routing table whose entries live `answer_ttl_ms`.
//!
//! Invariants: every accepted request gets exactly one of Cloaked, Expired or Rejected (at shutdown the
//! still-pending ones get Rejected with UNAVAILABLE); providers never see a user id, k or exact point;
//! every queue and table is bounded by a configured limit.
use std::collections::{HashMap, HashSet, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming};

use crate::config::LocationConfig;
use crate::location::{
    CloakRequest, CloakedGroup, Engine, GeoBox, Outcome, Pseudonym, RequestId, UserKey,
};
use crate::proto::lbs_gateway_server::{LbsGateway, LbsGatewayServer};
use crate::proto::location_broker_server::{LocationBroker, LocationBrokerServer};
use crate::proto::{
    self, AnswerSummary, BoundingBox, CloakedRequest, LbsAnswer, LbsSubscription, LocationEvent,
    LocationRequest, location_event,
};
use crate::service::{StreamLimit, StreamSlot};

/// Longest user id accepted, in bytes.
pub const MAX_USER_ID_BYTES: usize = 256;
/// Commands buffered between the client streams and the broker actor.
const COMMAND_QUEUE: usize = 65_536;
/// Commands the actor takes per wake-up.
const COMMAND_BATCH: usize = 1024;

type ClientId = u64;
type EventSender = mpsc::Sender<Result<LocationEvent, Status>>;

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
    pub service: usize,
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
    fn invalid(field: &'static str, reason: impl Into<String>) -> Rejection {
        Rejection {
            field,
            reason: reason.into(),
            code: Code::InvalidArgument,
        }
    }

    fn exhausted(field: &'static str, reason: impl Into<String>) -> Rejection {
        Rejection {
            field,
            reason: reason.into(),
            code: Code::ResourceExhausted,
        }
    }

    fn to_event(&self, request_no: u64) -> LocationEvent {
        LocationEvent {
            request_no,
            outcome: Some(location_event::Outcome::Rejected(proto::Rejected {
                field: self.field.to_string(),
                reason: self.reason.clone(),
                code: self.code as i32,
            })),
        }
    }
}

/// Checks one request against the configured rules and fills in defaults.
pub fn validate(req: LocationRequest, cfg: &LocationConfig) -> Result<AdmittedRequest, Rejection> {
    if req.user_id.trim().is_empty() {
        return Err(Rejection::invalid("user_id", "must not be empty"));
    }
    if req.user_id.len() > MAX_USER_ID_BYTES {
        return Err(Rejection::invalid(
            "user_id",
            format!("must be at most {MAX_USER_ID_BYTES} bytes"),
        ));
    }
    if !req.lat.is_finite() || !(-90.0..=90.0).contains(&req.lat) {
        return Err(Rejection::invalid(
            "lat",
            format!(
                "must be a finite latitude in [-90, 90] degrees (got {})",
                req.lat
            ),
        ));
    }
    if !req.lon.is_finite() || !(-180.0..=180.0).contains(&req.lon) {
        return Err(Rejection::invalid(
            "lon",
            format!(
                "must be a finite longitude in [-180, 180] degrees (got {})",
                req.lon
            ),
        ));
    }
    let k = req.k.unwrap_or(cfg.default_k);
    if k < cfg.min_k || k > cfg.max_k {
        return Err(Rejection::invalid(
            "k",
            format!("must lie in [{}, {}] (got {k})", cfg.min_k, cfg.max_k),
        ));
    }
    let tolerance = |field: &'static str, v: Option<f64>, default: f64, max: f64| {
        let v = v.unwrap_or(default);
        if !v.is_finite() || v <= 0.0 || v > max {
            Err(Rejection::invalid(
                field,
                format!("must be a tolerance in metres in (0, {max}] (got {v})"),
            ))
        } else {
            Ok(v)
        }
    };
    let dx_m = tolerance("dx_m", req.dx_m, cfg.default_dx_m, cfg.max_dx_m)?;
    let dy_m = tolerance("dy_m", req.dy_m, cfg.default_dy_m, cfg.max_dy_m)?;
    let dt_ms = req.dt_ms.unwrap_or(cfg.default_dt_ms);
    if dt_ms == 0 || dt_ms > cfg.max_dt_ms {
        return Err(Rejection::invalid(
            "dt_ms",
            format!(
                "must be a tolerance in milliseconds in [1, {}] (got {dt_ms})",
                cfg.max_dt_ms
            ),
        ));
    }
    if req.payload.len() > cfg.max_payload_bytes {
        return Err(Rejection::invalid(
            "payload",
            format!(
                "must be at most {} bytes (got {})",
                cfg.max_payload_bytes,
                req.payload.len()
            ),
        ));
    }
    let Some(service) = cfg.services.iter().position(|s| *s == req.service) else {
        return Err(Rejection::invalid(
            "service",
            format!(
                "unknown service {:?}; this broker serves {:?}",
                req.service, cfg.services
            ),
        ));
    };
    Ok(AdmittedRequest {
        user_id: req.user_id,
        request_no: req.request_no,
        lat: req.lat,
        lon: req.lon,
        k,
        dx_m,
        dy_m,
        dt_ms,
        payload: req.payload,
        service,
    })
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
struct AnswerTally {
    delivered: AtomicU64,
    undeliverable: AtomicU64,
}

enum Command {
    Open {
        client: ClientId,
        events: EventSender,
    },
    Submit {
        client: ClientId,
        request: AdmittedRequest,
    },
    Reject {
        client: ClientId,
        request_no: u64,
        rejection: Rejection,
    },
    /// The client half-closed: close its stream once nothing more can reach it.
    InboundClosed { client: ClientId },
    /// The client went away.
    Gone { client: ClientId },
    Answer {
        pseudonym: Pseudonym,
        payload: Vec<u8>,
        tally: Arc<AnswerTally>,
    },
    /// Answers once every earlier command has been handled.
    Sync { done: oneshot::Sender<()> },
}

struct ClientState {
    events: EventSender,
    pending: HashSet<RequestId>,
    /// Forwarded requests whose pseudonym is still routable and has not been answered yet.
    awaiting_answer: usize,
    draining: bool,
}

struct PendingEntry {
    client: ClientId,
    user_id: String,
    request_no: u64,
    user: UserKey,
    service: usize,
    payload: Vec<u8>,
}

struct Route {
    client: ClientId,
    request_no: u64,
    answered: bool,
}

/// The actor that owns the engine and every routing table.
struct Broker {
    cfg: Arc<LocationConfig>,
    clock: BrokerClock,
    engine: Engine,
    next_request_id: RequestId,
    next_user_key: UserKey,
    /// Interned user ids with the number of their pending requests.
    users: HashMap<String, (UserKey, usize)>,
    pending: HashMap<RequestId, PendingEntry>,
    pending_keys: HashSet<(UserKey, u64)>,
    clients: HashMap<ClientId, ClientState>,
    provider_queues: Vec<async_channel::Sender<CloakedRequest>>,
    routes: HashMap<Pseudonym, Route>,
    route_expiry: VecDeque<(i64, Pseudonym)>,
    outcomes: Vec<Outcome>,
}

impl Broker {
    fn handle(&mut self, command: Command) {
        match command {
            Command::Open { client, events } => {
                self.clients.insert(
                    client,
                    ClientState {
                        events,
                        pending: HashSet::new(),
                        awaiting_answer: 0,
                        draining: false,
                    },
                );
            }
            Command::Submit { client, request } => self.submit(client, request),
            Command::Reject {
                client,
                request_no,
                rejection,
            } => self.send(client, rejection.to_event(request_no)),
            Command::InboundClosed { client } => {
                if let Some(state) = self.clients.get_mut(&client) {
                    state.draining = true;
                }
                self.maybe_close(client);
            }
            Command::Gone { client } => self.drop_client(client),
            Command::Answer {
                pseudonym,
                payload,
                tally,
            } => self.answer(pseudonym, payload, &tally),
            Command::Sync { done } => {
                let _ = done.send(());
            }
        }
    }

    fn submit(&mut self, client: ClientId, request: AdmittedRequest) {
        let request_no = request.request_no;
        let Some(state) = self.clients.get(&client) else {
            return;
        };
        if self.pending.len() >= self.cfg.max_pending {
            let rejection = Rejection::exhausted(
                "request_no",
                format!(
                    "the broker already holds {} pending requests (location.max_pending)",
                    self.pending.len()
                ),
            );
            return self.send(client, rejection.to_event(request_no));
        }
        if state.pending.len() >= self.cfg.max_pending_per_stream {
            let rejection = Rejection::exhausted(
                "request_no",
                format!(
                    "this stream already has {} pending requests (location.max_pending_per_stream)",
                    state.pending.len()
                ),
            );
            return self.send(client, rejection.to_event(request_no));
        }
        let user = match self.users.get(&request.user_id) {
            Some((key, _)) => *key,
            None => {
                let key = self.next_user_key;
                self.next_user_key += 1;
                self.users.insert(request.user_id.clone(), (key, 0));
                key
            }
        };
        if !self.pending_keys.insert((user, request_no)) {
            let rejection = Rejection::invalid(
                "request_no",
                format!(
                    "user {:?} already has request {request_no} pending",
                    request.user_id
                ),
            );
            return self.send(client, rejection.to_event(request_no));
        }
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
        if let Some(entry) = self.users.get_mut(&request.user_id) {
            entry.1 += 1;
        }
        self.pending.insert(
            id,
            PendingEntry {
                client,
                user_id: request.user_id,
                request_no,
                user,
                service: request.service,
                payload: request.payload,
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
                self.send(entry.client, rejection.to_event(entry.request_no));
            }
        }
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
        // Forget the user once it has nothing pending, so the table stays bounded.
        if let Some((_, count)) = self.users.get_mut(&entry.user_id) {
            *count -= 1;
            if *count == 0 {
                self.users.remove(&entry.user_id);
            }
        }
        Some(entry)
    }

    fn dispatch(&mut self, outcomes: &mut Vec<Outcome>) {
        for outcome in outcomes.drain(..) {
            match outcome {
                Outcome::Cloaked(group) => self.forward(group),
                Outcome::Expired { id, deadline_ms } => {
                    if let Some(entry) = self.take_pending(id) {
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

    fn forward(&mut self, group: CloakedGroup) {
        let cloaking_box = to_proto_box(&group.cloaking_box);
        let group_size = u32::try_from(group.members.len()).unwrap_or(u32::MAX);
        let now = self.clock.now_ms();
        for (id, pseudonym) in group.members {
            let Some(entry) = self.take_pending(id) else {
                continue;
            };
            let client = entry.client;
            let request_no = entry.request_no;
            let service = entry.service;
            self.send(
                client,
                LocationEvent {
                    request_no,
                    outcome: Some(location_event::Outcome::Cloaked(proto::Cloaked {
                        pseudonym: pseudonym.to_string(),
                        r#box: Some(cloaking_box),
                        t_start_ms: group.t_start_ms,
                        t_end_ms: group.t_end_ms,
                        group_size,
                    })),
                },
            );
            let cloaked = CloakedRequest {
                pseudonym: pseudonym.to_string(),
                r#box: Some(cloaking_box),
                t_start_ms: group.t_start_ms,
                t_end_ms: group.t_end_ms,
                payload: entry.payload,
                service: self.cfg.services[service].clone(),
            };
            match self.provider_queues[service].try_send(cloaked) {
                Ok(()) => {
                    self.routes.insert(
                        pseudonym,
                        Route {
                            client,
                            request_no,
                            answered: false,
                        },
                    );
                    self.route_expiry.push_back((
                        now.saturating_add(
                            i64::try_from(self.cfg.answer_ttl_ms).unwrap_or(i64::MAX),
                        ),
                        pseudonym,
                    ));
                    if let Some(state) = self.clients.get_mut(&client) {
                        state.awaiting_answer += 1;
                    }
                }
                Err(err) => {
                    let reason = if err.is_full() {
                        format!(
                            "the provider queue of service {:?} is full ({} requests waiting; location.provider_queue)",
                            self.cfg.services[service], self.cfg.provider_queue
                        )
                    } else {
                        "the broker is shutting down".to_string()
                    };
                    self.send(
                        client,
                        LocationEvent {
                            request_no,
                            outcome: Some(location_event::Outcome::Undelivered(
                                proto::Undelivered { reason },
                            )),
                        },
                    );
                }
            }
            self.maybe_close(client);
        }
    }

    fn answer(&mut self, pseudonym: Pseudonym, payload: Vec<u8>, tally: &AnswerTally) {
        let Some(route) = self.routes.get_mut(&pseudonym) else {
            tally.undeliverable.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let (client, request_no) = (route.client, route.request_no);
        let first = !route.answered;
        route.answered = true;
        if !self.clients.contains_key(&client) {
            tally.undeliverable.fetch_add(1, Ordering::Relaxed);
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
        } else {
            tally.undeliverable.fetch_add(1, Ordering::Relaxed);
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
                if let Some(state) = self.clients.get_mut(&route.client) {
                    state.awaiting_answer = state.awaiting_answer.saturating_sub(1);
                }
                self.maybe_close(route.client);
            }
        }
    }

    /// Sends an event; a client that is gone or reads too slowly loses its stream.
    fn send(&mut self, client: ClientId, event: LocationEvent) {
        let Some(state) = self.clients.get(&client) else {
            return;
        };
        match state.events.try_send(Ok(event)) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(
                    client,
                    limit = self.cfg.client_queue,
                    "client reads too slowly; closing its stream (location.client_queue)"
                );
                self.drop_client(client);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => self.drop_client(client),
        }
    }

    fn maybe_close(&mut self, client: ClientId) {
        let done = self.clients.get(&client).is_some_and(|state| {
            state.draining && state.pending.is_empty() && state.awaiting_answer == 0
        });
        if done {
            self.clients.remove(&client);
        }
    }

    /// Forgets a client and withdraws its pending requests from the engine.
    fn drop_client(&mut self, client: ClientId) {
        let Some(state) = self.clients.remove(&client) else {
            return;
        };
        for id in state.pending {
            self.engine.cancel(id);
            self.take_pending(id);
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
                self.send(entry.client, rejection.to_event(entry.request_no));
            }
        }
        self.clients.clear();
        self.provider_queues.clear();
    }

    async fn run(
        mut self,
        mut commands: mpsc::Receiver<Command>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut batch = Vec::with_capacity(COMMAND_BATCH);
        loop {
            let next_expiry = self
                .engine
                .next_deadline()
                .map(|deadline| self.clock.instant_at(deadline.saturating_add(1)));
            tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                received = commands.recv_many(&mut batch, COMMAND_BATCH) => {
                    if received == 0 {
                        break;
                    }
                    // Expire first so a request never joins a group after its deadline.
                    self.expire();
                    for command in batch.drain(..) {
                        self.handle(command);
                    }
                }
                _ = tokio::time::sleep_until(next_expiry.unwrap_or_else(tokio::time::Instant::now)),
                    if next_expiry.is_some() => self.expire(),
            }
            self.prune_routes();
        }
        self.shut_down();
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

/// The location services sharing one broker actor.
#[derive(Clone)]
pub struct LocationServices {
    cfg: Arc<LocationConfig>,
    commands: mpsc::Sender<Command>,
    provider_receivers: Arc<Vec<async_channel::Receiver<CloakedRequest>>>,
    client_streams: StreamLimit,
    provider_streams: StreamLimit,
    next_client: Arc<AtomicU64>,
    stop: watch::Receiver<bool>,
}

impl LocationServices {
    /// Starts the broker actor; it stops when `shutdown` turns true (or every handle is dropped).
    pub fn start(cfg: LocationConfig, shutdown: watch::Receiver<bool>) -> LocationServices {
        let cfg = Arc::new(cfg);
        let seed = cfg.seed.unwrap_or_else(rand::random::<u64>);
        let (senders, receivers): (Vec<_>, Vec<_>) = cfg
            .services
            .iter()
            .map(|_| async_channel::bounded(cfg.provider_queue))
            .unzip();
        let (commands, command_rx) = mpsc::channel(COMMAND_QUEUE);
        let broker = Broker {
            cfg: Arc::clone(&cfg),
            clock: BrokerClock::new(),
            engine: Engine::new(cfg.search, seed),
            next_request_id: 0,
            next_user_key: 0,
            users: HashMap::new(),
            pending: HashMap::new(),
            pending_keys: HashSet::new(),
            clients: HashMap::new(),
            provider_queues: senders,
            routes: HashMap::new(),
            route_expiry: VecDeque::new(),
            outcomes: Vec::new(),
        };
        tokio::spawn(broker.run(command_rx, shutdown.clone()));
        LocationServices {
            client_streams: StreamLimit::new("location.max_client_streams", cfg.max_client_streams),
            provider_streams: StreamLimit::new(
                "location.max_provider_streams",
                cfg.max_provider_streams,
            ),
            cfg,
            commands,
            provider_receivers: Arc::new(receivers),
            next_client: Arc::new(AtomicU64::new(0)),
            stop: shutdown,
        }
    }

    pub fn broker_server(&self) -> LocationBrokerServer<LocationServices> {
        LocationBrokerServer::new(self.clone())
    }

    pub fn gateway_server(&self) -> LbsGatewayServer<LocationServices> {
        LbsGatewayServer::new(self.clone())
    }
}

fn broker_gone() -> Status {
    Status::unavailable("the location broker is shutting down")
}

/// A response stream that holds its stream-limit place while it lives.
struct SlotStream<S> {
    inner: S,
    _slot: StreamSlot,
}

impl<S: Stream + Unpin> Stream for SlotStream<S> {
    type Item = S::Item;
    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<LocationEvent, Status>> + Send>>;
type CloakedStream = Pin<Box<dyn Stream<Item = Result<CloakedRequest, Status>> + Send>>;

#[tonic::async_trait]
impl LocationBroker for LocationServices {
    type SubmitStream = EventStream;

    async fn submit(
        &self,
        request: Request<Streaming<LocationRequest>>,
    ) -> Result<Response<Self::SubmitStream>, Status> {
        let slot = self.client_streams.acquire()?;
        let client = self.next_client.fetch_add(1, Ordering::Relaxed);
        let (events, event_rx) = mpsc::channel(self.cfg.client_queue);
        self.commands
            .send(Command::Open { client, events })
            .await
            .map_err(|_| broker_gone())?;
        let mut inbound = request.into_inner();
        let commands = self.commands.clone();
        let cfg = Arc::clone(&self.cfg);
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    message = inbound.message() => message,
                    // At shutdown stop reading, so the stream (and its connection) can close.
                    _ = stop.wait_for(|stop| *stop) => break,
                };
                let command = match message {
                    Ok(Some(req)) => {
                        let request_no = req.request_no;
                        match validate(req, &cfg) {
                            Ok(request) => Command::Submit { client, request },
                            Err(rejection) => Command::Reject {
                                client,
                                request_no,
                                rejection,
                            },
                        }
                    }
                    Ok(None) => {
                        let _ = commands.send(Command::InboundClosed { client }).await;
                        break;
                    }
                    Err(_) => {
                        let _ = commands.send(Command::Gone { client }).await;
                        break;
                    }
                };
                if commands.send(command).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(SlotStream {
            inner: ReceiverStream::new(event_rx),
            _slot: slot,
        })))
    }
}

#[tonic::async_trait]
impl LbsGateway for LocationServices {
    type SubscribeStream = CloakedStream;

    async fn subscribe(
        &self,
        request: Request<LbsSubscription>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let service = request.into_inner().service;
        let Some(index) = self.cfg.services.iter().position(|s| *s == service) else {
            return Err(Status::invalid_argument(format!(
                "service: unknown service {service:?}; this broker serves {:?}",
                self.cfg.services
            )));
        };
        let slot = self.provider_streams.acquire()?;
        let queue = self.provider_receivers[index].clone();
        Ok(Response::new(Box::pin(SlotStream {
            inner: Box::pin(queue).map(Ok),
            _slot: slot,
        })))
    }

    async fn answer(
        &self,
        request: Request<Streaming<LbsAnswer>>,
    ) -> Result<Response<AnswerSummary>, Status> {
        let mut inbound = request.into_inner();
        let tally = Arc::new(AnswerTally::default());
        let mut failure = None;
        loop {
            match inbound.message().await {
                Ok(Some(answer)) => {
                    let pseudonym = match answer.pseudonym.parse::<Pseudonym>() {
                        Ok(p) if answer.pseudonym.len() == 32 => p,
                        _ => {
                            failure = Some(Status::invalid_argument(format!(
                                "pseudonym: must be 32 hex digits as received in CloakedRequest (got {:?})",
                                answer.pseudonym
                            )));
                            break;
                        }
                    };
                    if answer.payload.len() > self.cfg.max_payload_bytes {
                        failure = Some(Status::invalid_argument(format!(
                            "payload: must be at most {} bytes (got {})",
                            self.cfg.max_payload_bytes,
                            answer.payload.len()
                        )));
                        break;
                    }
                    self.commands
                        .send(Command::Answer {
                            pseudonym,
                            payload: answer.payload,
                            tally: Arc::clone(&tally),
                        })
                        .await
                        .map_err(|_| broker_gone())?;
                }
                Ok(None) => break,
                Err(status) => return Err(status),
            }
        }
        // Every answer sent so far is routed before the summary (or the error) is returned.
        let (done, wait) = oneshot::channel();
        self.commands
            .send(Command::Sync { done })
            .await
            .map_err(|_| broker_gone())?;
        wait.await.map_err(|_| broker_gone())?;
        if let Some(status) = failure {
            return Err(status);
        }
        Ok(Response::new(AnswerSummary {
            delivered: tally.delivered.load(Ordering::Relaxed),
            undeliverable: tally.undeliverable.load(Ordering::Relaxed),
        }))
    }
}
