//! gRPC adapter of location cloaking: `LocationBroker.Submit` (mobile clients) and `LbsGateway`
//! (providers), around one broker actor ([`crate::broker`]) that owns the CliqueCloak engine.
//! This module keeps proto <-> domain conversion ([`grpc`]), validation ([`validate`]) and the one
//! status mapping ([`error`]); the actor's state and rules live in [`crate::broker`].
//!
//! Flow: each client stream's task validates requests (rejections name the field and the rule) and hands
//! them to the actor over a bounded channel (backpressure, not growth). The actor stamps arrival time on
//! tokio's clock, feeds the engine, and routes outcomes: `Cloaked`/`Expired`/`Rejected` to the client,
//! `CloakedRequest` to the service's provider queue (bounded; it also buffers while no provider is
//! subscribed, and when it is full the client gets `Undelivered`). Providers acknowledge what their
//! Subscribe stream takes within `provider_ack_ms` (see [`crate::broker::provider_stream`]); a stream that does not is
//! closed and its requests are handed to another provider or reported `Undelivered`. Answers come
//! back by pseudonym through a routing table whose entries live `answer_ttl_ms`.
//!
//! Invariants: every accepted request gets exactly one of Cloaked, Expired or Rejected (at shutdown the
//! still-pending ones get Rejected with UNAVAILABLE); providers never see a user id, k or exact point;
//! every queue and table is bounded by a configured limit.
//!
//! With `[cluster]` set, [`crate::broker::replicas`] shards CliqueCloak by grid cell: each request is cloaked by the
//! replica holding its cell's lease, whichever replica the client is connected to.
//!
//! Live configuration: the `[location]` section is a `watch` value that a SIGHUP reload replaces
//! ([`LocationServices::reconfigure`]). Client streams read it per request (k bounds and default,
//! tolerances, services, model, payload size), the broker actor per batch of commands (pending
//! limits, answer TTL, rate limit, jitter); a request keeps what it was admitted with. The engines'
//! construction parameters, stream limits and queue sizes are restart-only (see [`crate::reload`]).
mod error;
mod grpc;
mod validate;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::sync::{mpsc, watch};

use crate::config::LocationConfig;
use crate::connections::{PrincipalStreamLimit, StreamLimit};
use crate::proto::lbs_gateway_server::LbsGatewayServer;
use crate::proto::location_broker_server::LocationBrokerServer;
use crate::service::DEFAULT_MAX_MESSAGE_BYTES;

pub use crate::broker::BrokerClock;
use crate::broker::message::Command;
pub use crate::broker::provider_queues::{ProviderQueue, ProviderQueues};
use crate::broker::{self, Broker, replicas};
pub use error::LocationError;
pub use validate::{AdmittedRequest, MAX_USER_ID_BYTES, Rejection, validate};

/// Commands buffered between the client streams and the broker actor.
const COMMAND_QUEUE: usize = 65_536;

/// The location services sharing one broker actor.
#[derive(Clone)]
pub struct LocationServices {
    /// The `[location]` section in force (replaced by a reload).
    cfg: watch::Receiver<Arc<LocationConfig>>,
    reconfigure: Arc<watch::Sender<Arc<LocationConfig>>>,
    commands: mpsc::Sender<Command>,
    provider_queues: Arc<ProviderQueues>,
    client_streams: StreamLimit,
    provider_streams: StreamLimit,
    provider_streams_per_principal: PrincipalStreamLimit,
    next_client: Arc<AtomicU64>,
    next_provider: Arc<AtomicU64>,
    /// Largest request message (`server.max_message_bytes`).
    max_message_bytes: usize,
    stop: watch::Receiver<bool>,
}

impl LocationServices {
    /// Starts the broker actor; it stops when `shutdown` turns true (or every handle is dropped).
    /// With `ledger`, GEO_IND answers are charged to the users' privacy budget there.
    pub fn start(
        cfg: LocationConfig,
        shutdown: watch::Receiver<bool>,
        ledger: Option<crate::ledger::Ledger>,
    ) -> LocationServices {
        Self::start_with(cfg, shutdown, None, ledger)
    }

    /// [`Self::start`] as one replica of a cluster: each request is cloaked by the replica owning
    /// its grid cell, whichever replica received it ([`crate::broker::replicas`]).
    pub async fn start_clustered(
        cfg: LocationConfig,
        shutdown: watch::Receiver<bool>,
        cluster: &crate::cluster::Cluster,
        ledger: Option<crate::ledger::Ledger>,
    ) -> Result<LocationServices, crate::cluster::ClusterError> {
        let joined = replicas::LocationCluster::join(cluster).await?;
        Ok(Self::start_with(cfg, shutdown, Some(joined), ledger))
    }

    fn start_with(
        cfg: LocationConfig,
        shutdown: watch::Receiver<bool>,
        cluster: Option<replicas::LocationCluster>,
        ledger: Option<crate::ledger::Ledger>,
    ) -> LocationServices {
        let seed = cfg.seed.unwrap_or_else(rand::random::<u64>);
        let provider_queues = Arc::new(ProviderQueues::new(&cfg.services, cfg.provider_queue));
        let (reconfigure, live) = watch::channel(Arc::new(cfg));
        let cfg = live.borrow().clone();
        let (commands, command_rx) = mpsc::channel(COMMAND_QUEUE);
        let next_client = Arc::new(AtomicU64::new(0));
        let mut broker = Broker::new(live.clone(), seed, Arc::clone(&provider_queues));
        if let Some(cluster) = cluster {
            broker = broker.with_cluster(cluster.start(
                commands.clone(),
                Arc::clone(&provider_queues),
                Arc::clone(&next_client),
                shutdown.clone(),
            ));
        }
        if let (Some(ledger), Some(budget)) = (ledger, cfg.geo_ind.budget) {
            broker =
                broker.with_budget(ledger, commands.clone(), budget.predictive, budget.reserve);
        }
        broker::spawn(broker, command_rx, shutdown.clone());
        LocationServices {
            client_streams: StreamLimit::new("location.max_client_streams", cfg.max_client_streams),
            provider_streams: StreamLimit::new(
                "location.max_provider_streams",
                cfg.max_provider_streams,
            ),
            provider_streams_per_principal: PrincipalStreamLimit::new(
                "location.max_provider_streams_per_principal",
                cfg.max_provider_streams_per_principal,
            ),
            cfg: live,
            reconfigure: Arc::new(reconfigure),
            commands,
            provider_queues,
            next_client,
            next_provider: Arc::new(AtomicU64::new(0)),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            stop: shutdown,
        }
    }

    /// Puts a new `[location]` section in force (a reload). The caller checked that only
    /// reloadable keys changed.
    pub fn reconfigure(&self, cfg: LocationConfig) {
        self.reload_target().reconfigure(cfg);
    }

    /// What a reload hands the new configuration to (it holds no stream or actor alive).
    pub fn reload_target(&self) -> LocationReload {
        LocationReload {
            provider_queues: Arc::clone(&self.provider_queues),
            reconfigure: Arc::clone(&self.reconfigure),
        }
    }

    /// The `[location]` section in force.
    pub fn config(&self) -> Arc<LocationConfig> {
        self.cfg.borrow().clone()
    }

    /// Sets the largest request message accepted (`server.max_message_bytes`).
    pub fn with_max_message_bytes(mut self, max_message_bytes: usize) -> LocationServices {
        self.max_message_bytes = max_message_bytes;
        self
    }

    pub fn broker_server(&self) -> LocationBrokerServer<LocationServices> {
        LocationBrokerServer::new(self.clone()).max_decoding_message_size(self.max_message_bytes)
    }

    pub fn gateway_server(&self) -> LbsGatewayServer<LocationServices> {
        LbsGatewayServer::new(self.clone()).max_decoding_message_size(self.max_message_bytes)
    }
}

/// Puts a reloaded `[location]` section in force.
#[derive(Clone)]
pub struct LocationReload {
    provider_queues: Arc<ProviderQueues>,
    reconfigure: Arc<watch::Sender<Arc<LocationConfig>>>,
}

impl LocationReload {
    /// Queues for added services first, so a request naming one always finds its queue.
    pub fn reconfigure(&self, cfg: LocationConfig) {
        self.provider_queues.ensure(&cfg.services);
        self.reconfigure.send_replace(Arc::new(cfg));
    }
}

impl crate::reload::ReloadTarget for LocationReload {
    fn apply(&self, config: &crate::config::Config) {
        self.reconfigure(config.location.clone());
    }
}
