//! Configuration: `config/default.toml` (embedded in the binary) is the single place where defaults live.
//!
//! Loading is layered: the embedded defaults, then an operator's file deep-merged over them, then
//! environment variables `CLOAKD_<SECTION>__<KEY>` (nested keys joined by `__`). The merged document is
//! deserialized into raw structs that reject unknown keys, and [`RawConfig::validate`] turns it into the
//! typed [`Config`] with messages that name the key and the rule.
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// The embedded default configuration (the file `config/default.toml`).
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Prefix of environment variables that override configuration keys.
pub const ENV_PREFIX: &str = "CLOAKD_";

/// A configuration problem, naming the key (or file) and the rule.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("{key}: {rule}")]
    Invalid { key: String, rule: String },
}

pub(crate) fn invalid(key: &str, rule: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        rule: rule.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Raw (as written) configuration
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub server: RawServer,
    pub location: RawLocation,
    pub transactions: RawTransactions,
    pub tables: RawTables,
    pub telemetry: RawTelemetry,
    pub auth: RawAuth,
    pub cluster: crate::cluster::config::RawCluster,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    pub metrics_listen: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: String,
    pub max_concurrent_streams: u32,
    pub shutdown_grace_ms: u64,
    pub max_message_bytes: usize,
    pub max_connections: usize,
    pub handshake_timeout_ms: u64,
    pub idle_connection_timeout_ms: u64,
    pub keepalive_interval_ms: u64,
    pub keepalive_timeout_ms: u64,
    pub http2_connection_window_bytes: u32,
    pub http2_stream_window_bytes: u32,
    pub http2_max_pending_accept_reset_streams: usize,
    pub http2_max_local_error_reset_streams: usize,
    pub allow_insecure: bool,
    pub tls: Option<RawTls>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    pub required: bool,
    #[serde(default)]
    pub principals: Vec<RawPrincipal>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrincipal {
    pub name: String,
    pub role: String,
    pub token_sha256: Option<String>,
    pub cert_dns_name: Option<String>,
    pub services: Option<Vec<String>>,
    pub user_ids: Option<Vec<String>>,
    pub streams: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLocation {
    pub services: Vec<String>,
    pub default_k: u32,
    pub min_k: u32,
    pub max_k: u32,
    pub default_dx_m: f64,
    pub default_dy_m: f64,
    pub max_dx_m: f64,
    pub max_dy_m: f64,
    pub default_dt_ms: u64,
    pub max_dt_ms: u64,
    pub max_payload_bytes: usize,
    pub search: String,
    pub session_ms: u64,
    pub session_policy: String,
    pub default_model: String,
    pub presence_max_age_ms: u64,
    pub max_tracked_users: usize,
    pub presence_target_m: f64,
    pub max_pending: usize,
    pub max_pending_per_stream: usize,
    pub max_client_streams: usize,
    pub max_provider_streams: usize,
    pub provider_queue: usize,
    pub client_queue: usize,
    pub answer_ttl_ms: u64,
    pub provider_ack_ms: u64,
    pub provider_window: usize,
    pub seed: u64,
    pub max_provider_streams_per_principal: usize,
    pub max_requests_per_s_per_principal: f64,
    pub forward_jitter_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTransactions {
    pub data_dir: PathBuf,
    pub max_items_per_record: usize,
    pub max_item_bytes: usize,
    pub max_open_records: usize,
    pub max_window_antecedents: u64,
    pub max_streams: usize,
    pub release_workers: usize,
    pub max_unacked_per_publish: usize,
    pub subscriber_queue: usize,
    pub defaults: RawStreamSettings,
    #[serde(default)]
    pub streams: BTreeMap<String, RawStreamOverride>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStreamSettings {
    pub rho: f64,
    pub mode: String,
    pub m: u32,
    pub epsilon: f64,
    pub delta: f64,
    pub window_records: usize,
    pub window_ms: u64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStreamOverride {
    pub rho: Option<f64>,
    pub mode: Option<String>,
    pub m: Option<u32>,
    pub epsilon: Option<f64>,
    pub delta: Option<f64>,
    pub window_records: Option<usize>,
    pub window_ms: Option<u64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTables {
    pub max_rows: usize,
    pub max_bytes: usize,
    pub max_concurrent_jobs: usize,
    pub rows_per_chunk: usize,
    pub max_queries: usize,
    pub upload_idle_ms: u64,
    pub max_job_ms: u64,
}

// ---------------------------------------------------------------------------------------------
// Typed (validated) configuration
// ---------------------------------------------------------------------------------------------

/// The validated configuration of the whole daemon.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub location: LocationConfig,
    pub transactions: TransactionsConfig,
    pub tables: TablesConfig,
    pub telemetry: TelemetryConfig,
    pub auth: AuthConfig,
    /// `[cluster]`: replicas sharing NATS JetStream, or standalone.
    pub cluster: crate::cluster::ClusterConfig,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Address of the Prometheus `/metrics` listener; `None` turns it off.
    pub metrics_listen: Option<SocketAddr>,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub max_concurrent_streams: u32,
    pub shutdown_grace: Duration,
    /// Largest request message of the streaming services.
    pub max_message_bytes: usize,
    /// Most open TCP connections; further ones are closed at once.
    pub max_connections: usize,
    /// A connection must send its first bytes (HTTP/2 preface or TLS hello) within this.
    pub handshake_timeout: Duration,
    /// A connection with no open stream for this long is closed.
    pub idle_connection_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    pub http2_connection_window_bytes: u32,
    pub http2_stream_window_bytes: u32,
    pub http2_max_pending_accept_reset_streams: usize,
    pub http2_max_local_error_reset_streams: usize,
    /// Serve without TLS or without required authentication on a non-loopback address.
    pub allow_insecure: bool,
    pub tls: Option<TlsConfig>,
}

/// `[server.tls]`: PEM files, read at start and again on SIGHUP.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// With it, clients may authenticate by a certificate this CA issued (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
}

/// `[auth]`: whether a credential is required, and the principals.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub required: bool,
    pub principals: Vec<PrincipalConfig>,
}

/// One `[[auth.principals]]` entry: the principal and how it proves who it is.
#[derive(Debug, Clone)]
pub struct PrincipalConfig {
    pub principal: crate::auth::Principal,
    pub token_sha256: Option<[u8; 32]>,
    pub cert_dns_name: Option<rustls_pki_types::DnsName<'static>>,
}

pub use crate::location::SearchMode;
pub use crate::location::presence::PresenceParams;
/// Anonymization mode of a transaction stream: the engine's own type, from config to store to engine.
pub use crate::transactions::Mode;

/// How a location request is made k-anonymous (the `model` field of a request, or its default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloakModel {
    /// CliqueCloak: wait for k requests of k users that meet in space and time.
    Requests,
    /// k users present: a reciprocal region of at least k users' latest positions, at once.
    Presence,
}
pub use crate::location::session::{SessionPolicy, SessionSettings};

#[derive(Debug, Clone)]
pub struct LocationConfig {
    pub services: Vec<String>,
    pub default_k: u32,
    pub min_k: u32,
    pub max_k: u32,
    pub default_dx_m: f64,
    pub default_dy_m: f64,
    pub max_dx_m: f64,
    pub max_dy_m: f64,
    pub default_dt_ms: u64,
    pub max_dt_ms: u64,
    pub max_payload_bytes: usize,
    pub search: SearchMode,
    /// Memorized anonymity sets against query tracking (`session_ms == 0`: off).
    pub sessions: SessionSettings,
    /// Model of a request that leaves `model` unset.
    pub default_model: CloakModel,
    /// The presence engine's limits.
    pub presence: PresenceParams,
    pub max_pending: usize,
    pub max_pending_per_stream: usize,
    pub max_client_streams: usize,
    pub max_provider_streams: usize,
    pub provider_queue: usize,
    pub client_queue: usize,
    pub answer_ttl_ms: u64,
    /// How long a provider has to acknowledge a request its Subscribe stream took.
    pub provider_ack_ms: u64,
    /// Most unacknowledged requests one Subscribe stream holds.
    pub provider_window: usize,
    /// `None`: draw a seed from the operating system.
    pub seed: Option<u64>,
    pub max_provider_streams_per_principal: usize,
    /// Requests per second one principal may submit (its bucket holds one second's worth);
    /// `None`: unlimited.
    pub max_requests_per_s_per_principal: Option<f64>,
    pub forward_jitter_ms: u64,
}

/// Settings of one transaction stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSettings {
    pub rho: f64,
    pub m: u32,
    pub mode: Mode,
    pub window_records: usize,
    pub window: Duration,
}

#[derive(Debug, Clone)]
pub struct TransactionsConfig {
    pub data_dir: PathBuf,
    pub max_items_per_record: usize,
    pub max_item_bytes: usize,
    pub max_open_records: usize,
    /// Exact mode's budget per window: the sum over its records of Σ_{l<=m} C(|D_u|, l).
    pub max_window_antecedents: u64,
    /// Most transaction streams (names) the daemon keeps.
    pub max_streams: usize,
    /// Windows anonymized at once across all streams (a bounded pool of blocking threads).
    pub release_workers: usize,
    /// Most records one Publish stream may have sent and not yet had acknowledged.
    pub max_unacked_per_publish: usize,
    pub subscriber_queue: usize,
    pub defaults: StreamSettings,
    pub streams: BTreeMap<String, StreamSettings>,
}

impl TransactionsConfig {
    /// The settings of `stream`: its own section if configured, the defaults otherwise.
    pub fn settings_for(&self, stream: &str) -> &StreamSettings {
        self.streams.get(stream).unwrap_or(&self.defaults)
    }
}

#[derive(Debug, Clone)]
pub struct TablesConfig {
    pub max_rows: usize,
    pub max_bytes: usize,
    pub max_concurrent_jobs: usize,
    pub rows_per_chunk: usize,
    /// Most COUNT queries one evaluation may ask for.
    pub max_queries: usize,
    /// An upload with no message for this long is cancelled.
    pub upload_idle: Duration,
    /// The most time one job's computation (anonymization or evaluation) may take before it is
    /// stopped, whatever deadline its caller set.
    pub max_job: Duration,
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

impl Config {
    /// The embedded defaults, with environment overrides applied.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load_with_env(file, std::env::vars())
    }

    /// The embedded defaults only (no file, no environment): what tests start from.
    pub fn embedded_defaults() -> Config {
        Self::load_with_env(None, std::iter::empty())
            .expect("the embedded config/default.toml is valid (checked by a unit test)")
    }

    /// Layered loading with an explicit environment (for tests).
    pub fn load_with_env(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        Self::from_document(Self::load_document(file, env)?)
    }

    /// Validates a merged configuration document (as [`Config::load_document`] returns it).
    pub fn from_document(doc: toml::Table) -> Result<Config, ConfigError> {
        let raw =
            RawConfig::deserialize(toml::Value::Table(doc)).map_err(|e| ConfigError::Parse {
                origin: "configuration".into(),
                message: e.to_string(),
            })?;
        raw.validate()
    }

    /// The merged document: embedded defaults, then `file`, then the environment; not yet validated.
    pub fn load_document(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<toml::Table, ConfigError> {
        let mut doc: toml::Table =
            toml::from_str(DEFAULT_TOML).map_err(|e| ConfigError::Parse {
                origin: "embedded config/default.toml".into(),
                message: e.to_string(),
            })?;
        if let Some(path) = file {
            let text = crate::lines::read_text_file(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            let overlay: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
                origin: path.display().to_string(),
                message: e.to_string(),
            })?;
            merge(&mut doc, overlay);
        }
        let mut env: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX))
            .collect();
        env.sort();
        for (name, value) in env {
            apply_env(&mut doc, &name, &value)?;
        }
        Ok(doc)
    }
}

/// Deep-merges `overlay` into `base`: tables merge key by key, anything else replaces.
fn merge(base: &mut toml::Table, overlay: toml::Table) {
    for (key, value) in overlay {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(key, v);
            }
        }
    }
}

/// Applies `CLOAKD_A__B__C=value` as key `a.b.c` (lower-cased).
fn apply_env(doc: &mut toml::Table, name: &str, value: &str) -> Result<(), ConfigError> {
    let path: Vec<String> = name[ENV_PREFIX.len()..]
        .split("__")
        .map(|part| part.to_ascii_lowercase())
        .collect();
    if path.iter().any(|p| p.is_empty()) {
        return Err(invalid(
            name,
            "environment override must look like CLOAKD_<SECTION>__<KEY>",
        ));
    }
    let parsed = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(value.to_string()));
    let (last, parents) = path.split_last().expect("path has at least one part");
    let mut table = doc;
    for part in parents {
        let entry = table
            .entry(part.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        table = match entry {
            toml::Value::Table(t) => t,
            _ => return Err(invalid(name, format!("`{part}` is not a section"))),
        };
    }
    table.insert(last.clone(), parsed);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

fn positive_usize(key: &str, v: usize) -> Result<usize, ConfigError> {
    if v == 0 {
        Err(invalid(key, "must be at least 1"))
    } else {
        Ok(v)
    }
}

fn positive_metres(key: &str, v: f64) -> Result<f64, ConfigError> {
    if !v.is_finite() || v <= 0.0 {
        Err(invalid(
            key,
            format!("must be a finite number > 0 (got {v})"),
        ))
    } else {
        Ok(v)
    }
}

/// A spatial tolerance: at least what padding needs (`location::padding::MIN_TOLERANCE_M`).
fn tolerance_metres(key: &str, v: f64) -> Result<f64, ConfigError> {
    let least = crate::location::padding::MIN_TOLERANCE_M;
    if !v.is_finite() || v < least {
        Err(invalid(
            key,
            format!("must be a finite number >= {least} metres, what padding needs (got {v})"),
        ))
    } else {
        Ok(v)
    }
}

fn open_unit(key: &str, v: f64) -> Result<f64, ConfigError> {
    if v.is_finite() && v > 0.0 && v < 1.0 {
        Ok(v)
    } else {
        Err(invalid(key, format!("must lie in (0, 1) (got {v})")))
    }
}

impl RawConfig {
    /// Checks every rule once and produces the typed configuration.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let location = self.location.validate()?;
        let cluster = self.cluster.validate()?;
        // Each engine remembers its own users' sessions; across replicas a user's requests may be
        // cloaked by different cell owners, whose groups nobody intersects: refuse rather than
        // claim a guarantee that does not hold.
        if cluster.enabled() && location.sessions.session_ms > 0 {
            return Err(invalid(
                "location.session_ms",
                "must be 0 with [cluster] nats_url set: memorized anonymity sets are kept per replica, so a user whose requests reach different cell owners would not be protected against query tracking",
            ));
        }
        Ok(Config {
            server: self.server.validate()?,
            auth: self.auth.validate(&location.services)?,
            location,
            transactions: self.transactions.validate()?,
            tables: self.tables.validate()?,
            telemetry: self.telemetry.validate()?,
            cluster,
        })
    }
}

impl RawTelemetry {
    fn validate(self) -> Result<TelemetryConfig, ConfigError> {
        let listen = self.metrics_listen.trim();
        if listen.is_empty() {
            return Ok(TelemetryConfig {
                metrics_listen: None,
            });
        }
        let addr = listen.parse::<SocketAddr>().map_err(|e| {
            invalid(
                "telemetry.metrics_listen",
                format!("must be IP:PORT, like 127.0.0.1:9464, or \"\" to turn metrics off ({e})"),
            )
        })?;
        Ok(TelemetryConfig {
            metrics_listen: Some(addr),
        })
    }
}

impl RawServer {
    fn validate(self) -> Result<ServerConfig, ConfigError> {
        let listen = self.listen.parse::<SocketAddr>().map_err(|e| {
            invalid(
                "server.listen",
                format!("must be IP:PORT, like 127.0.0.1:50051 ({e})"),
            )
        })?;
        if self.max_concurrent_streams == 0 {
            return Err(invalid(
                "server.max_concurrent_streams",
                "must be at least 1",
            ));
        }
        let millis = |key: &str, v: u64| {
            if v == 0 {
                Err(invalid(key, "must be at least 1 (milliseconds)"))
            } else {
                Ok(Duration::from_millis(v))
            }
        };
        let window = |key: &str, v: u32| {
            // HTTP/2 windows lie in [65535, 2^31 - 1] (RFC 9113 §6.9.2).
            if (65_535..=0x7fff_ffff).contains(&v) {
                Ok(v)
            } else {
                Err(invalid(
                    key,
                    format!("must lie in [65535, 2147483647] bytes (got {v})"),
                ))
            }
        };
        if self.max_message_bytes < 1024 {
            return Err(invalid(
                "server.max_message_bytes",
                format!("must be at least 1024 (got {})", self.max_message_bytes),
            ));
        }
        let tls = match self.tls {
            None => None,
            Some(tls) => {
                let file = |key: &str, path: PathBuf| {
                    if path.as_os_str().is_empty() {
                        Err(invalid(key, "must name a PEM file"))
                    } else {
                        Ok(path)
                    }
                };
                Some(TlsConfig {
                    cert_file: file("server.tls.cert_file", tls.cert_file)?,
                    key_file: file("server.tls.key_file", tls.key_file)?,
                    client_ca_file: tls
                        .client_ca_file
                        .map(|p| file("server.tls.client_ca_file", p))
                        .transpose()?,
                })
            }
        };
        Ok(ServerConfig {
            listen,
            max_concurrent_streams: self.max_concurrent_streams,
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
            max_message_bytes: self.max_message_bytes,
            max_connections: positive_usize("server.max_connections", self.max_connections)?,
            handshake_timeout: millis("server.handshake_timeout_ms", self.handshake_timeout_ms)?,
            idle_connection_timeout: millis(
                "server.idle_connection_timeout_ms",
                self.idle_connection_timeout_ms,
            )?,
            keepalive_interval: millis("server.keepalive_interval_ms", self.keepalive_interval_ms)?,
            keepalive_timeout: millis("server.keepalive_timeout_ms", self.keepalive_timeout_ms)?,
            http2_connection_window_bytes: window(
                "server.http2_connection_window_bytes",
                self.http2_connection_window_bytes,
            )?,
            http2_stream_window_bytes: window(
                "server.http2_stream_window_bytes",
                self.http2_stream_window_bytes,
            )?,
            http2_max_pending_accept_reset_streams: positive_usize(
                "server.http2_max_pending_accept_reset_streams",
                self.http2_max_pending_accept_reset_streams,
            )?,
            http2_max_local_error_reset_streams: positive_usize(
                "server.http2_max_local_error_reset_streams",
                self.http2_max_local_error_reset_streams,
            )?,
            allow_insecure: self.allow_insecure,
            tls,
        })
    }
}

impl RawLocation {
    fn validate(self) -> Result<LocationConfig, ConfigError> {
        if self.services.is_empty() {
            return Err(invalid(
                "location.services",
                "must name at least one service",
            ));
        }
        if let Some(bad) = self.services.iter().find(|s| s.trim().is_empty()) {
            return Err(invalid(
                "location.services",
                format!("service names must not be empty (got {bad:?})"),
            ));
        }
        if self.min_k < 1 {
            return Err(invalid("location.min_k", "must be at least 1"));
        }
        if self.max_k < self.min_k {
            return Err(invalid(
                "location.max_k",
                format!("must be >= location.min_k ({})", self.min_k),
            ));
        }
        let largest_group = crate::location::engine::MAX_NEIGHBOURS + 1;
        if self.max_k as usize > largest_group {
            return Err(invalid(
                "location.max_k",
                format!("must be at most {largest_group}, the largest group the engine forms"),
            ));
        }
        if !(self.min_k..=self.max_k).contains(&self.default_k) {
            return Err(invalid(
                "location.default_k",
                format!(
                    "must lie in [min_k, max_k] = [{}, {}]",
                    self.min_k, self.max_k
                ),
            ));
        }
        let max_dx_m = tolerance_metres("location.max_dx_m", self.max_dx_m)?;
        let max_dy_m = tolerance_metres("location.max_dy_m", self.max_dy_m)?;
        let default_dx_m = tolerance_metres("location.default_dx_m", self.default_dx_m)?;
        let default_dy_m = tolerance_metres("location.default_dy_m", self.default_dy_m)?;
        if default_dx_m > max_dx_m {
            return Err(invalid(
                "location.default_dx_m",
                "must be <= location.max_dx_m",
            ));
        }
        if default_dy_m > max_dy_m {
            return Err(invalid(
                "location.default_dy_m",
                "must be <= location.max_dy_m",
            ));
        }
        if self.max_dt_ms == 0 {
            return Err(invalid("location.max_dt_ms", "must be at least 1"));
        }
        if self.default_dt_ms == 0 || self.default_dt_ms > self.max_dt_ms {
            return Err(invalid(
                "location.default_dt_ms",
                "must lie in [1, location.max_dt_ms]",
            ));
        }
        let search = match self.search.as_str() {
            "local-k" => SearchMode::LocalK,
            "nbr-k" => SearchMode::NbrK,
            other => {
                return Err(invalid(
                    "location.search",
                    format!("must be \"local-k\" or \"nbr-k\" (got {other:?})"),
                ));
            }
        };
        let policy = match self.session_policy.as_str() {
            "hold" => SessionPolicy::Hold,
            "expire" => SessionPolicy::Expire,
            other => {
                return Err(invalid(
                    "location.session_policy",
                    format!("must be \"hold\" or \"expire\" (got {other:?})"),
                ));
            }
        };
        let default_model = match self.default_model.as_str() {
            "requests" => CloakModel::Requests,
            "presence" => CloakModel::Presence,
            other => {
                return Err(invalid(
                    "location.default_model",
                    format!("must be \"requests\" or \"presence\" (got {other:?})"),
                ));
            }
        };
        if self.presence_max_age_ms == 0 {
            return Err(invalid(
                "location.presence_max_age_ms",
                "must be at least 1",
            ));
        }
        let presence = PresenceParams {
            max_age_ms: self.presence_max_age_ms,
            max_tracked_users: positive_usize(
                "location.max_tracked_users",
                self.max_tracked_users,
            )?,
            target_side_m: positive_metres("location.presence_target_m", self.presence_target_m)?,
        };
        Ok(LocationConfig {
            services: self.services,
            default_k: self.default_k,
            min_k: self.min_k,
            max_k: self.max_k,
            default_dx_m,
            default_dy_m,
            max_dx_m,
            max_dy_m,
            default_dt_ms: self.default_dt_ms,
            max_dt_ms: self.max_dt_ms,
            max_payload_bytes: self.max_payload_bytes,
            search,
            sessions: SessionSettings {
                session_ms: self.session_ms,
                policy,
            },
            default_model,
            presence,
            max_pending: positive_usize("location.max_pending", self.max_pending)?,
            max_pending_per_stream: positive_usize(
                "location.max_pending_per_stream",
                self.max_pending_per_stream,
            )?,
            max_client_streams: positive_usize(
                "location.max_client_streams",
                self.max_client_streams,
            )?,
            max_provider_streams: positive_usize(
                "location.max_provider_streams",
                self.max_provider_streams,
            )?,
            provider_queue: positive_usize("location.provider_queue", self.provider_queue)?,
            client_queue: positive_usize("location.client_queue", self.client_queue)?,
            answer_ttl_ms: self.answer_ttl_ms,
            provider_ack_ms: match self.provider_ack_ms {
                0 => {
                    return Err(invalid(
                        "location.provider_ack_ms",
                        "must be at least 1 (milliseconds a provider has to acknowledge a request)",
                    ));
                }
                ms => ms,
            },
            provider_window: positive_usize("location.provider_window", self.provider_window)?,
            seed: (self.seed != 0).then_some(self.seed),
            max_provider_streams_per_principal: positive_usize(
                "location.max_provider_streams_per_principal",
                self.max_provider_streams_per_principal,
            )?,
            max_requests_per_s_per_principal: match self.max_requests_per_s_per_principal {
                0.0 => None,
                r if r.is_finite() && r >= 1.0 => Some(r),
                r => {
                    return Err(invalid(
                        "location.max_requests_per_s_per_principal",
                        format!("must be 0 (unlimited) or a finite number >= 1 (got {r})"),
                    ));
                }
            },
            forward_jitter_ms: self.forward_jitter_ms,
        })
    }
}

impl RawStreamSettings {
    fn validate(self, section: &str) -> Result<StreamSettings, ConfigError> {
        let key = |k: &str| format!("{section}.{k}");
        let rho = open_unit(&key("rho"), self.rho)?;
        if self.m < 1 {
            return Err(invalid(&key("m"), "must be at least 1"));
        }
        let mode = match self.mode.as_str() {
            "exact" => Mode::Exact,
            "sampled" => Mode::Sampled {
                epsilon: open_unit(&key("epsilon"), self.epsilon)?,
                delta: open_unit(&key("delta"), self.delta)?,
            },
            other => {
                return Err(invalid(
                    &key("mode"),
                    format!("must be \"exact\" or \"sampled\" (got {other:?})"),
                ));
            }
        };
        if self.window_ms == 0 {
            return Err(invalid(&key("window_ms"), "must be at least 1"));
        }
        Ok(StreamSettings {
            rho,
            m: self.m,
            mode,
            window_records: positive_usize(&key("window_records"), self.window_records)?,
            window: Duration::from_millis(self.window_ms),
        })
    }
}

impl RawTransactions {
    fn validate(self) -> Result<TransactionsConfig, ConfigError> {
        let defaults = self.defaults.clone().validate("transactions.defaults")?;
        let mut streams = BTreeMap::new();
        for (name, o) in self.streams {
            if name.trim().is_empty() {
                return Err(invalid(
                    "transactions.streams",
                    "stream names must not be empty",
                ));
            }
            let d = &self.defaults;
            let merged = RawStreamSettings {
                rho: o.rho.unwrap_or(d.rho),
                mode: o.mode.unwrap_or_else(|| d.mode.clone()),
                m: o.m.unwrap_or(d.m),
                epsilon: o.epsilon.unwrap_or(d.epsilon),
                delta: o.delta.unwrap_or(d.delta),
                window_records: o.window_records.unwrap_or(d.window_records),
                window_ms: o.window_ms.unwrap_or(d.window_ms),
            };
            let settings = merged.validate(&format!("transactions.streams.{name}"))?;
            streams.insert(name, settings);
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("transactions.data_dir", "must not be empty"));
        }
        let budget = self.max_window_antecedents;
        let engine_limit = crate::transactions::MAX_EXACT_ANTECEDENTS;
        if budget == 0 || budget > engine_limit {
            return Err(invalid(
                "transactions.max_window_antecedents",
                format!("must lie in [1, {engine_limit}] (got {budget})"),
            ));
        }
        // A record of max_items_per_record items must fit the budget on its own in every exact stream.
        let exact = std::iter::once(("transactions.defaults".to_string(), &defaults)).chain(
            streams
                .iter()
                .map(|(name, s)| (format!("transactions.streams.{name}"), s)),
        );
        for (section, settings) in exact {
            if settings.mode != Mode::Exact {
                continue;
            }
            let largest =
                crate::transactions::antecedent_count(self.max_items_per_record, settings.m);
            if largest > budget {
                return Err(invalid(
                    "transactions.max_items_per_record",
                    format!(
                        "a record of {} items has {largest} adversary antecedents with m = {} ({section}.m), more than transactions.max_window_antecedents = {budget}: lower max_items_per_record or m, raise the budget, or use sampled mode",
                        self.max_items_per_record, settings.m
                    ),
                ));
            }
        }
        Ok(TransactionsConfig {
            data_dir: self.data_dir,
            max_items_per_record: positive_usize(
                "transactions.max_items_per_record",
                self.max_items_per_record,
            )?,
            max_item_bytes: positive_usize("transactions.max_item_bytes", self.max_item_bytes)?,
            max_open_records: positive_usize(
                "transactions.max_open_records",
                self.max_open_records,
            )?,
            subscriber_queue: positive_usize(
                "transactions.subscriber_queue",
                self.subscriber_queue,
            )?,
            max_window_antecedents: budget,
            max_streams: positive_usize("transactions.max_streams", self.max_streams)?,
            release_workers: match self.release_workers {
                0 => std::thread::available_parallelism().map_or(1, usize::from),
                workers => workers,
            },
            max_unacked_per_publish: positive_usize(
                "transactions.max_unacked_per_publish",
                self.max_unacked_per_publish,
            )?,
            defaults,
            streams,
        })
    }
}

impl RawAuth {
    fn validate(self, location_services: &[String]) -> Result<AuthConfig, ConfigError> {
        use crate::auth::{Principal, Role, StreamPattern};
        let mut principals: Vec<PrincipalConfig> = Vec::new();
        for (i, raw) in self.principals.into_iter().enumerate() {
            let key = |k: &str| format!("auth.principals[{i}].{k}");
            let name = raw.name.trim().to_string();
            if name.is_empty() || name == crate::auth::ANONYMOUS {
                return Err(invalid(
                    &key("name"),
                    format!("must be non-empty and not {:?}", crate::auth::ANONYMOUS),
                ));
            }
            if principals.iter().any(|p| p.principal.name == name) {
                return Err(invalid(&key("name"), format!("{name:?} is used twice")));
            }
            let role = Role::parse(&raw.role).ok_or_else(|| {
                invalid(
                    &key("role"),
                    format!(
                        "must be one of mobile, provider, producer, consumer, analyst, operator (got {:?})",
                        raw.role
                    ),
                )
            })?;
            let token_sha256 = match &raw.token_sha256 {
                None => None,
                Some(text) => {
                    let mut hash = [0u8; 32];
                    hex::decode_to_slice(text.trim(), &mut hash).map_err(|_| {
                        invalid(
                            &key("token_sha256"),
                            "must be 64 hex digits (the output of `cloakd auth hash-token`)",
                        )
                    })?;
                    if principals.iter().any(|p| p.token_sha256 == Some(hash)) {
                        return Err(invalid(
                            &key("token_sha256"),
                            "two principals share this token",
                        ));
                    }
                    Some(hash)
                }
            };
            let cert_dns_name = raw
                .cert_dns_name
                .as_deref()
                .map(|n| {
                    rustls_pki_types::DnsName::try_from(n.to_string()).map_err(|_| {
                        invalid(&key("cert_dns_name"), format!("{n:?} is not a DNS name"))
                    })
                })
                .transpose()?;
            if token_sha256.is_none() && cert_dns_name.is_none() {
                return Err(invalid(
                    &key("token_sha256"),
                    "a principal needs token_sha256 or cert_dns_name",
                ));
            }
            let scope = |field: &str, values: Option<Vec<String>>, for_roles: &[Role]| match (
                values,
                for_roles.contains(&role),
            ) {
                (None, false) => Ok(Vec::new()),
                (Some(_), false) => Err(invalid(
                    &key(field),
                    format!("does not apply to role {role}"),
                )),
                (None, true) => Err(invalid(
                    &key(field),
                    format!("role {role} needs {field} (an empty scope allows nothing)"),
                )),
                (Some(v), true) if v.iter().any(|s| s.trim().is_empty()) => {
                    Err(invalid(&key(field), "entries must not be empty"))
                }
                (Some(v), true) => Ok(v),
            };
            let services = scope("services", raw.services, &[Role::Provider])?;
            if let Some(unknown) = services.iter().find(|s| !location_services.contains(s)) {
                return Err(invalid(
                    &key("services"),
                    format!("{unknown:?} is not in location.services"),
                ));
            }
            let user_ids = scope("user_ids", raw.user_ids, &[Role::Mobile])?;
            let streams = scope("streams", raw.streams, &[Role::Producer, Role::Consumer])?;
            principals.push(PrincipalConfig {
                principal: Principal {
                    name,
                    role: Some(role),
                    services,
                    user_ids: user_ids.into_iter().collect(),
                    streams: streams.iter().map(|s| StreamPattern::parse(s)).collect(),
                },
                token_sha256,
                cert_dns_name,
            });
        }
        if self.required && principals.is_empty() {
            return Err(invalid(
                "auth.principals",
                "auth.required = true needs at least one principal",
            ));
        }
        Ok(AuthConfig {
            required: self.required,
            principals,
        })
    }
}

impl RawTables {
    fn validate(self) -> Result<TablesConfig, ConfigError> {
        Ok(TablesConfig {
            max_rows: positive_usize("tables.max_rows", self.max_rows)?,
            max_bytes: positive_usize("tables.max_bytes", self.max_bytes)?,
            max_concurrent_jobs: positive_usize(
                "tables.max_concurrent_jobs",
                self.max_concurrent_jobs,
            )?,
            rows_per_chunk: positive_usize("tables.rows_per_chunk", self.rows_per_chunk)?,
            max_queries: positive_usize("tables.max_queries", self.max_queries)?,
            upload_idle: if self.upload_idle_ms == 0 {
                return Err(invalid("tables.upload_idle_ms", "must be at least 1"));
            } else {
                Duration::from_millis(self.upload_idle_ms)
            },
            max_job: if self.max_job_ms == 0 {
                return Err(invalid("tables.max_job_ms", "must be at least 1"));
            } else {
                Duration::from_millis(self.max_job_ms)
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn embedded_defaults_are_valid() {
        let cfg = Config::embedded_defaults();
        assert_eq!(cfg.server.listen.port(), 50051);
        assert_eq!(cfg.location.search, SearchMode::NbrK);
        assert_eq!(cfg.transactions.defaults.rho, 0.5);
        assert_eq!(cfg.transactions.defaults.m, 3);
        assert_eq!(cfg.transactions.defaults.window_records, 10_000);
        assert_eq!(cfg.transactions.defaults.window, Duration::from_secs(60));
    }

    #[test]
    fn environment_overrides_keys() {
        let cfg = Config::load_with_env(
            None,
            env(&[
                ("CLOAKD_SERVER__LISTEN", "127.0.0.1:0"),
                ("CLOAKD_LOCATION__DEFAULT_K", "7"),
                ("CLOAKD_LOCATION__SERVICES", "[\"a\", \"b\"]"),
                ("CLOAKD_TRANSACTIONS__STREAMS__CLICKS__RHO", "0.3"),
                ("OTHER", "ignored"),
            ]),
        )
        .unwrap();
        assert_eq!(cfg.server.listen.port(), 0);
        assert_eq!(cfg.location.default_k, 7);
        assert_eq!(cfg.location.services, vec!["a", "b"]);
        assert_eq!(cfg.transactions.settings_for("clicks").rho, 0.3);
        assert_eq!(cfg.transactions.settings_for("other").rho, 0.5);
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = Config::load_with_env(None, env(&[("CLOAKD_LOCATION__DEFALT_K", "3")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("defalt_k"), "{err}");
    }

    #[test]
    fn rules_name_the_key() {
        let cases = [
            ("CLOAKD_LOCATION__MIN_K", "0", "location.min_k"),
            ("CLOAKD_LOCATION__DEFAULT_K", "99", "location.default_k"),
            ("CLOAKD_LOCATION__SEARCH", "\"clique\"", "location.search"),
            ("CLOAKD_SERVER__LISTEN", "nowhere", "server.listen"),
            (
                "CLOAKD_TRANSACTIONS__DEFAULTS__RHO",
                "1.5",
                "transactions.defaults.rho",
            ),
            ("CLOAKD_LOCATION__MAX_DX_M", "-1.0", "location.max_dx_m"),
            ("CLOAKD_LOCATION__MAX_K", "500", "location.max_k"),
            (
                "CLOAKD_LOCATION__DEFAULT_MODEL",
                "\"crowd\"",
                "location.default_model",
            ),
            (
                "CLOAKD_LOCATION__PRESENCE_MAX_AGE_MS",
                "0",
                "location.presence_max_age_ms",
            ),
            (
                "CLOAKD_LOCATION__MAX_TRACKED_USERS",
                "0",
                "location.max_tracked_users",
            ),
            (
                "CLOAKD_LOCATION__PRESENCE_TARGET_M",
                "-5.0",
                "location.presence_target_m",
            ),
        ];
        for (var, value, key) in cases {
            let err = Config::load_with_env(None, env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(err.starts_with(key), "{var}={value}: {err}");
        }
    }

    #[test]
    fn file_overlays_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "[location]\ndefault_k = 3\n").unwrap();
        let cfg = Config::load_with_env(Some(&path), env(&[])).unwrap();
        assert_eq!(cfg.location.default_k, 3);
        assert_eq!(cfg.location.max_k, 50);
        std::fs::write(&path, "[location]\nbogus = 3\n").unwrap();
        assert!(Config::load_with_env(Some(&path), env(&[])).is_err());
    }
}
