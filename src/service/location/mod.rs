//! gRPC adapter of location cloaking: `LocationBroker.Submit` (mobile clients) and `LbsGateway`
//! (providers), around one broker actor that owns the CliqueCloak [`Engine`].
//!
//! Flow: each client stream's task validates requests (rejections name the field and the rule) and hands
//! them to the actor over a bounded channel (backpressure, not growth). The actor stamps arrival time on
//! tokio's clock, feeds the engine, and routes outcomes: `Cloaked`/`Expired`/`Rejected` to the client,
//! `CloakedRequest` to the service's provider queue (bounded; it also buffers while no provider is
//! subscribed, and when it is full the client gets `Undelivered`). Providers acknowledge what their
//! Subscribe stream takes within `provider_ack_ms` (see [`provider`]); a stream that does not is
//! closed and its requests are handed to another provider or reported `Undelivered`. Answers come
//! back by pseudonym through a routing table whose entries live `answer_ttl_ms`.
//!
//! Invariants: every accepted request gets exactly one of Cloaked, Expired or Rejected (at shutdown the
//! still-pending ones get Rejected with UNAVAILABLE); providers never see a user id, k or exact point;
//! every queue and table is bounded by a configured limit.
mod broker;
mod error;
mod grpc;
mod provider;
mod rate;
mod validate;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio::sync::{mpsc, watch};

use crate::config::LocationConfig;
use crate::proto::CloakedRequest;
use crate::proto::lbs_gateway_server::LbsGatewayServer;
use crate::proto::location_broker_server::LocationBrokerServer;
use crate::service::{DEFAULT_MAX_MESSAGE_BYTES, PrincipalStreamLimit, StreamLimit};

pub use broker::BrokerClock;
use broker::{Broker, Command};
pub use error::LocationError;
pub use validate::{AdmittedRequest, MAX_USER_ID_BYTES, Rejection, validate};

/// Commands buffered between the client streams and the broker actor.
const COMMAND_QUEUE: usize = 65_536;

/// The location services sharing one broker actor.
#[derive(Clone)]
pub struct LocationServices {
    cfg: Arc<LocationConfig>,
    commands: mpsc::Sender<Command>,
    provider_receivers: Arc<Vec<async_channel::Receiver<CloakedRequest>>>,
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
    pub fn start(cfg: LocationConfig, shutdown: watch::Receiver<bool>) -> LocationServices {
        let cfg = Arc::new(cfg);
        let seed = cfg.seed.unwrap_or_else(rand::random::<u64>);
        let (senders, receivers): (Vec<_>, Vec<_>) = cfg
            .services
            .iter()
            .map(|_| async_channel::bounded(cfg.provider_queue))
            .unzip();
        let (commands, command_rx) = mpsc::channel(COMMAND_QUEUE);
        let broker = Broker::new(Arc::clone(&cfg), seed, senders);
        tokio::spawn(broker.run(command_rx, shutdown.clone()));
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
            cfg,
            commands,
            provider_receivers: Arc::new(receivers),
            next_client: Arc::new(AtomicU64::new(0)),
            next_provider: Arc::new(AtomicU64::new(0)),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            stop: shutdown,
        }
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
