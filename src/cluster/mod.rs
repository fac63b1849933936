//! Replicas on NATS JetStream: the connection ([`connect`]), this replica's name ([`node_id`]) and
//! the lease ([`lease::Lease`]) through which exactly one replica at a time owns a location cell or
//! seals a stream's windows.
//!
//! Everything a deployment puts on NATS starts with `cluster.prefix` (default `cloakd`):
//! subjects `<prefix>.…`, streams and key-value buckets `<prefix>_…`. The leases live in the
//! key-value bucket `<prefix>_leases` (replicated `cluster.replicas` times), one key per leased
//! thing, and one key `node.<node id>` per running replica ([`registration`]). With `cluster.nats_url = ""` none of this runs.
pub mod connect;
pub mod lease;
pub mod lease_table;
pub mod registration;

pub use crate::config::cluster::{ClusterConfig, NatsConfig};
pub use connect::{Cluster, connect, node_id};
pub use lease::{Contender, Lease, LeaseAttempt};
pub use lease_table::{LeaseTable, Owner};
pub use registration::{Registration, RegistrationError};

/// What can go wrong talking to NATS; each names what was being done.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot connect to NATS at {servers} (cluster.nats_url): {source}")]
    Connect {
        servers: String,
        source: async_nats::ConnectError,
    },
    #[error("cannot read {key} {path}: {source}")]
    File {
        key: &'static str,
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the NATS server is version {version}; cloakd needs at least 2.10 (older servers may accept two concurrent compare-and-set updates of a replicated key-value bucket, nats-server#4320, which breaks leases)"
    )]
    ServerTooOld { version: String },
    #[error("JetStream is not available on the NATS servers (start them with JetStream, -js): {0}")]
    JetStream(String),
    #[error("cannot open key-value bucket {bucket}: {message}")]
    Bucket { bucket: String, message: String },
    #[error("key-value operation on {key} failed: {message}")]
    KeyValue { key: String, message: String },
}
