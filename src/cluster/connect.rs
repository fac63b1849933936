//! Connecting a replica to NATS from `[cluster]`: seeds, optional credentials file and TLS, and the
//! JetStream context every cluster component shares.
//!
//! Connecting fails fast with an error naming `cluster.nats_url` when no seed answers within
//! `cluster.connect_timeout_ms`; once connected, the client reconnects on its own (to any server it
//! learnt of) and the components see failed requests until it has.
use async_nats::jetstream;
use async_nats::jetstream::kv;

use super::{ClusterConfig, ClusterError};

/// A replica's connection to the NATS cluster.
#[derive(Clone, Debug)]
pub struct Cluster {
    pub client: async_nats::Client,
    pub jetstream: jetstream::Context,
    /// This replica's name (validated `cluster.node_id`, or [`node_id`]: unique to the process).
    pub node_id: String,
    pub config: ClusterConfig,
}

/// Connects to the configured NATS servers; `None` when `cluster.nats_url` is empty (standalone).
pub async fn connect(config: &ClusterConfig) -> Result<Option<Cluster>, ClusterError> {
    let Some(nats) = &config.nats else {
        return Ok(None);
    };
    let node_id = config.node_id.clone().unwrap_or_else(node_id);
    let mut options = async_nats::ConnectOptions::new()
        .name(format!("cloakd-{node_id}"))
        .connection_timeout(nats.connect_timeout)
        .request_timeout(Some(nats.request_timeout))
        .require_tls(nats.requires_tls());
    if let Some(path) = &nats.credentials_file {
        options = options
            .credentials_file(path)
            .await
            .map_err(|source| ClusterError::File {
                key: "cluster.credentials_file",
                path: path.clone(),
                source,
            })?;
    }
    if let Some(ca) = &nats.tls_ca_file {
        readable("cluster.tls_ca_file", ca)?;
        options = options.add_root_certificates(ca.clone());
    }
    if let Some((cert, key)) = &nats.tls_client {
        readable("cluster.tls_cert_file", cert)?;
        readable("cluster.tls_key_file", key)?;
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    // The URLs were parsed when the configuration was validated.
    let client = options
        .connect(nats.servers.as_slice())
        .await
        .map_err(|source| ClusterError::Connect {
            servers: redacted(&nats.servers),
            source,
        })?;
    let version = client.server_info().version;
    if parse_version(&version).is_some_and(|v| v < MIN_SERVER_VERSION) {
        return Err(ClusterError::ServerTooOld { version });
    }
    let mut jetstream = jetstream::new(client.clone());
    jetstream.set_timeout(nats.request_timeout);
    jetstream
        .query_account()
        .await
        .map_err(|e| ClusterError::JetStream(e.to_string()))?;
    // Once connected, a JetStream request (a key-value operation, a publish awaiting its PubAck, a
    // read) unanswered after a second is given up, and its caller makes it again: after a NATS
    // server died, a request sent to it before the client reconnected, or while a stream's leader
    // was being elected, would otherwise hold its caller for a whole request_timeout_ms.
    jetstream.set_timeout(nats.request_timeout.min(JETSTREAM_ATTEMPT));
    tracing::info!(
        node_id = %node_id,
        servers = %redacted(&nats.servers),
        replicas = config.replicas,
        "connected to NATS JetStream"
    );
    Ok(Some(Cluster {
        client,
        jetstream,
        node_id,
        config: config.clone(),
    }))
}

impl Cluster {
    /// The name of a subject, stream or bucket of this deployment: `<prefix><sep><name>`.
    pub fn name(&self, sep: char, name: &str) -> String {
        format!("{}{sep}{name}", self.config.prefix)
    }

    /// The key-value bucket holding the leases (`<prefix>_leases`), created on first use with
    /// `cluster.replicas` replicas and one revision per key.
    pub async fn lease_bucket(&self) -> Result<kv::Store, ClusterError> {
        self.bucket("leases", "cloakd leases: one key per leased cell or stream")
            .await
    }

    /// Opens (creating it if absent) the bucket `<prefix>_<name>` with `cluster.replicas` replicas.
    /// JetStream may still be electing leaders when replicas start together: a failure is retried
    /// for about 30 s (pauses doubling from 0.25 s to 8 s) before it is returned.
    pub async fn bucket(&self, name: &str, description: &str) -> Result<kv::Store, ClusterError> {
        let mut pause = std::time::Duration::from_millis(250);
        let mut attempt = 1;
        loop {
            match self.try_bucket(name, description).await {
                Err(e) if attempt < 8 => {
                    tracing::warn!(error = %e, attempt, "cannot open a key-value bucket; trying again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(std::time::Duration::from_secs(8));
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn try_bucket(&self, name: &str, description: &str) -> Result<kv::Store, ClusterError> {
        let bucket = self.name('_', name);
        let config = kv::Config {
            bucket: bucket.clone(),
            description: description.to_string(),
            history: 1,
            num_replicas: self.config.replicas,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        match self.jetstream.create_key_value(config).await {
            Ok(store) => Ok(store),
            // Already there with another configuration (e.g. created with another replication
            // factor): use it as it is.
            Err(create) => match self.jetstream.get_key_value(&bucket).await {
                Ok(store) => {
                    tracing::warn!(bucket = %bucket, error = %create, "using the existing key-value bucket as it is");
                    Ok(store)
                }
                Err(_) => Err(ClusterError::Bucket {
                    bucket,
                    message: create.to_string(),
                }),
            },
        }
    }
}

/// Longest a JetStream request waits for its answer once the replica is connected (at most
/// `cluster.request_timeout_ms`): every caller retries (the record log for up to
/// `cluster.request_timeout_ms`, `crate::store::jetstream::Patience`; leases until they run out).
pub const JETSTREAM_ATTEMPT: std::time::Duration = std::time::Duration::from_secs(1);

/// Oldest NATS server cloakd runs on: before 2.10, concurrent updates of a replicated key-value
/// bucket expecting the same revision could all be accepted (nats-server#4320), and leases rely on
/// that compare-and-set.
pub const MIN_SERVER_VERSION: (u64, u64) = (2, 10);

/// `(major, minor)` of a version like `2.10.3` or `v2.15.1`.
fn parse_version(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim_start_matches('v').split('.');
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// This replica's default name, new for every process: the host name (every character other than
/// letters, digits, '-' and '_' replaced by '-', at most 47 of them) and 16 random hex digits, e.g.
/// `web-3-5f0c2a9e41d7b388`; `cloakd-<16 hex digits>` when the host has no name. Two processes on one
/// host (or two pods sharing a host name) so never share a name.
pub fn node_id() -> String {
    let suffix = format!("{:016x}", rand::random::<u64>());
    match host_name() {
        Some(host) => {
            let host: String = host
                .chars()
                .take(47)
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect();
            format!("{host}-{suffix}")
        }
        None => format!("cloakd-{suffix}"),
    }
}

/// The host name (`$HOSTNAME`, else the kernel's), if it has one.
pub fn host_name() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

fn readable(key: &'static str, path: &std::path::Path) -> Result<(), ClusterError> {
    std::fs::metadata(path)
        .map(|_| ())
        .map_err(|source| ClusterError::File {
            key,
            path: path.to_path_buf(),
            source,
        })
}

/// The seeds for messages, without any user or password written into a URL.
fn redacted(servers: &[String]) -> String {
    servers
        .iter()
        .map(|s| match (s.find("://"), s.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                format!("{}***{}", &s[..scheme + 3], &s[at..])
            }
            _ => s.clone(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_in_urls_are_not_repeated() {
        let servers = vec![
            "nats://alice:secret@nats-0:4222".to_string(),
            "nats-1:4222".to_string(),
        ];
        assert_eq!(redacted(&servers), "nats://***@nats-0:4222,nats-1:4222");
    }

    #[test]
    fn versions_compare_by_major_and_minor() {
        assert_eq!(parse_version("2.9.10"), Some((2, 9)));
        assert!(parse_version("2.9.10").unwrap() < MIN_SERVER_VERSION);
        assert!(parse_version("v2.15.1").unwrap() >= MIN_SERVER_VERSION);
        assert_eq!(parse_version("garbage"), None);
    }

    #[test]
    fn node_id_is_a_subject_token_unique_per_call() {
        let (a, b) = (node_id(), node_id());
        assert!(crate::config::cluster::is_name_token(&a), "{a}");
        assert!(a.len() <= 64, "{a}");
        assert_ne!(a, b);
    }
}
