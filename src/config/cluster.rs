//! The `[cluster]` section: how replicas find NATS JetStream, the replication factor of what they
//! store there, the lease duration, this replica's name, and the location grid.
//!
//! `nats_url = ""` (the default) is a standalone daemon on the embedded file store: nothing else is
//! read from the section's connection keys and nothing connects anywhere. Every key is restart-only.
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// Largest replication factor JetStream accepts for a stream or bucket.
pub const MAX_REPLICAS: usize = 5;
/// Shortest lease: renewals run every third of it, and a round trip to JetStream must fit.
pub const MIN_LEASE_MS: u64 = 300;
/// Longest lease: a failed replica's cells and streams stay unserved this long.
pub const MAX_LEASE_MS: u64 = 60_000;

/// Longest `failover_wait_ms`: a producer's records wait at most this long for a stream's writer.
pub const MAX_FAILOVER_WAIT_MS: u64 = 600_000;

/// `[cluster]` as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    pub nats_url: String,
    pub replicas: usize,
    pub lease_ms: u64,
    pub failover_wait_ms: u64,
    pub node_id: String,
    pub cell_size_m: f64,
    pub prefix: String,
    pub connect_timeout_ms: u64,
    pub request_timeout_ms: u64,
    pub credentials_file: String,
    pub tls_ca_file: String,
    pub tls_cert_file: String,
    pub tls_key_file: String,
}

/// The validated `[cluster]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterConfig {
    /// Where NATS is; `None` runs standalone on the embedded file store.
    pub nats: Option<NatsConfig>,
    /// JetStream replication factor of every stream and bucket cloakd creates.
    pub replicas: usize,
    /// Lease duration: a replica that stops renewing loses its cells and streams after this long.
    pub lease: Duration,
    /// How long a record published here waits for its stream to get a reachable writer when the
    /// replica sealing it stops answering (`failover_wait_ms`; 0 in the file: twice the lease).
    pub failover_wait: Duration,
    /// This replica's name on NATS; `None`: the host name and a random suffix, new for every process
    /// ([`crate::cluster::node_id`]).
    pub node_id: Option<String>,
    /// Side of a location cell in metres; each cell is owned by one replica at a time.
    pub cell_size_m: f64,
    /// First token of every subject, stream and bucket name this deployment uses.
    pub prefix: String,
}

impl ClusterConfig {
    /// Whether replicas share state over NATS (`nats_url` is set).
    pub fn enabled(&self) -> bool {
        self.nats.is_some()
    }
}

/// How to reach the NATS servers.
#[derive(Debug, Clone, PartialEq)]
pub struct NatsConfig {
    /// Seed URLs (`nats://host:4222`, `tls://host:4222`); the client learns the rest of the cluster.
    pub servers: Vec<String>,
    pub connect_timeout: Duration,
    /// How long a request (a JetStream publish acknowledgement, a key-value operation) may take.
    pub request_timeout: Duration,
    /// A NATS credentials file (JWT and NKey seed).
    pub credentials_file: Option<PathBuf>,
    /// CA certificates (PEM) to verify the servers by; setting it requires TLS.
    pub tls_ca_file: Option<PathBuf>,
    /// Client certificate and key (PEM) for mutual TLS.
    pub tls_client: Option<(PathBuf, PathBuf)>,
}

impl NatsConfig {
    /// Whether the connection must be TLS (a `tls://` URL or any TLS file configured).
    pub fn requires_tls(&self) -> bool {
        self.tls_ca_file.is_some()
            || self.tls_client.is_some()
            || self.servers.iter().any(|s| s.starts_with("tls://"))
    }
}

/// A name usable as one NATS subject token and in stream and bucket names.
pub fn is_name_token(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn optional_path(s: &str) -> Option<PathBuf> {
    let s = s.trim();
    (!s.is_empty()).then(|| PathBuf::from(s))
}

impl RawCluster {
    pub fn validate(self) -> Result<ClusterConfig, ConfigError> {
        if self.replicas == 0 || self.replicas > MAX_REPLICAS {
            return Err(invalid(
                "cluster.replicas",
                format!(
                    "must lie in [1, {MAX_REPLICAS}] (JetStream's replication factor; got {})",
                    self.replicas
                ),
            ));
        }
        if !(MIN_LEASE_MS..=MAX_LEASE_MS).contains(&self.lease_ms) {
            return Err(invalid(
                "cluster.lease_ms",
                format!(
                    "must lie in [{MIN_LEASE_MS}, {MAX_LEASE_MS}] milliseconds (got {}); at most 5000 is recommended",
                    self.lease_ms
                ),
            ));
        }
        if self.failover_wait_ms > MAX_FAILOVER_WAIT_MS {
            return Err(invalid(
                "cluster.failover_wait_ms",
                format!(
                    "must lie in [0, {MAX_FAILOVER_WAIT_MS}] milliseconds (0: twice cluster.lease_ms; got {})",
                    self.failover_wait_ms
                ),
            ));
        }
        let failover_wait = match self.failover_wait_ms {
            0 => Duration::from_millis(2 * self.lease_ms),
            ms => Duration::from_millis(ms),
        };
        let node_id = match self.node_id.trim() {
            "" => None,
            id if is_name_token(id) => Some(id.to_string()),
            id => {
                return Err(invalid(
                    "cluster.node_id",
                    format!(
                        "must be 1 to 64 letters, digits, '-' or '_' (a NATS subject token; got {id:?})"
                    ),
                ));
            }
        };
        if !self.cell_size_m.is_finite() || !(10.0..=1_000_000.0).contains(&self.cell_size_m) {
            return Err(invalid(
                "cluster.cell_size_m",
                format!(
                    "must lie in [10, 1000000] metres (got {})",
                    self.cell_size_m
                ),
            ));
        }
        if !is_name_token(&self.prefix) {
            return Err(invalid(
                "cluster.prefix",
                format!(
                    "must be 1 to 64 letters, digits, '-' or '_' (it starts subject, stream and bucket names; got {:?})",
                    self.prefix
                ),
            ));
        }
        let millis = |key: &str, v: u64| {
            if v == 0 {
                Err(invalid(key, "must be at least 1 (milliseconds)"))
            } else {
                Ok(Duration::from_millis(v))
            }
        };
        let connect_timeout = millis("cluster.connect_timeout_ms", self.connect_timeout_ms)?;
        let request_timeout = millis("cluster.request_timeout_ms", self.request_timeout_ms)?;
        let tls_client = match (
            optional_path(&self.tls_cert_file),
            optional_path(&self.tls_key_file),
        ) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            (Some(_), None) => {
                return Err(invalid(
                    "cluster.tls_key_file",
                    "must be set together with cluster.tls_cert_file",
                ));
            }
            (None, Some(_)) => {
                return Err(invalid(
                    "cluster.tls_cert_file",
                    "must be set together with cluster.tls_key_file",
                ));
            }
        };
        let servers: Vec<String> = self
            .nats_url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect();
        let nats = if servers.is_empty() {
            None
        } else {
            for server in &servers {
                server.parse::<async_nats::ServerAddr>().map_err(|e| {
                    invalid(
                        "cluster.nats_url",
                        format!(
                            "{server:?} is not a NATS server URL like nats://host:4222 ({e}); separate several seeds with commas"
                        ),
                    )
                })?;
            }
            Some(NatsConfig {
                servers,
                connect_timeout,
                request_timeout,
                credentials_file: optional_path(&self.credentials_file),
                tls_ca_file: optional_path(&self.tls_ca_file),
                tls_client,
            })
        };
        Ok(ClusterConfig {
            nats,
            replicas: self.replicas,
            lease: Duration::from_millis(self.lease_ms),
            failover_wait,
            node_id,
            cell_size_m: self.cell_size_m,
            prefix: self.prefix,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn load(pairs: &[(&str, &str)]) -> Result<Config, String> {
        Config::load_with_env(
            None,
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
        .map_err(|e| e.to_string())
    }

    #[test]
    fn default_is_standalone() {
        let cfg = Config::embedded_defaults();
        assert!(!cfg.cluster.enabled());
        assert_eq!(cfg.cluster.replicas, 1);
        assert_eq!(cfg.cluster.lease.as_millis(), 5000);
        assert_eq!(cfg.cluster.failover_wait.as_millis(), 10_000);
    }

    #[test]
    fn sessions_are_refused_across_replicas() {
        let err = load(&[
            ("CLOAKD_CLUSTER__NATS_URL", "\"nats://a:4222\""),
            ("CLOAKD_LOCATION__SESSION_MS", "60000"),
        ])
        .unwrap_err();
        assert!(err.starts_with("location.session_ms"), "{err}");
        assert!(load(&[("CLOAKD_LOCATION__SESSION_MS", "60000")]).is_ok());
    }

    #[test]
    fn seeds_are_split_on_commas() {
        let cfg = load(&[("CLOAKD_CLUSTER__NATS_URL", "nats://a:4222, nats://b:4222,")]).unwrap();
        let nats = cfg.cluster.nats.unwrap();
        assert_eq!(nats.servers, ["nats://a:4222", "nats://b:4222"]);
        assert!(!nats.requires_tls());
    }

    #[test]
    fn rules_name_the_key() {
        let cases = [
            ("CLOAKD_CLUSTER__REPLICAS", "0", "cluster.replicas"),
            ("CLOAKD_CLUSTER__REPLICAS", "7", "cluster.replicas"),
            ("CLOAKD_CLUSTER__LEASE_MS", "10", "cluster.lease_ms"),
            (
                "CLOAKD_CLUSTER__FAILOVER_WAIT_MS",
                "600001",
                "cluster.failover_wait_ms",
            ),
            ("CLOAKD_CLUSTER__NODE_ID", "\"a.b\"", "cluster.node_id"),
            ("CLOAKD_CLUSTER__CELL_SIZE_M", "0.0", "cluster.cell_size_m"),
            ("CLOAKD_CLUSTER__PREFIX", "\"a b\"", "cluster.prefix"),
            (
                "CLOAKD_CLUSTER__NATS_URL",
                "\"nats://[::1\"",
                "cluster.nats_url",
            ),
            (
                "CLOAKD_CLUSTER__TLS_CERT_FILE",
                "\"c.pem\"",
                "cluster.tls_key_file",
            ),
            (
                "CLOAKD_CLUSTER__REQUEST_TIMEOUT_MS",
                "0",
                "cluster.request_timeout_ms",
            ),
        ];
        for (var, value, key) in cases {
            let err = load(&[(var, value)]).unwrap_err();
            assert!(err.starts_with(key), "{var}={value}: {err}");
        }
    }
}
