//! Configuration: `config/default.toml` (embedded in the binary) is the single place where defaults live.
//!
//! Loading is layered: the embedded defaults, then an operator's file deep-merged over them, then
//! environment variables `CLOAKD_<SECTION>__<KEY>` (nested keys joined by `__`). The merged document is
//! deserialized into raw structs that reject unknown keys, and [`RawConfig::validate`] turns it into the
//! typed [`Config`] with messages that name the key and the rule.
//!
//! One file per section: [`server`], [`location`], [`transactions`], [`tables`], [`telemetry`],
//! [`auth`], [`cluster`] and [`ui`]; each holds its raw struct (as written), its typed struct and the
//! `validate` between them. This file holds the loading and [`RawConfig::validate`], which calls
//! each section's and checks the rules that span sections.
pub mod auth;
pub mod cluster;
pub mod geo_budget;
pub mod geo_ind;
pub mod location;
pub mod server;
pub mod tables;
pub mod telemetry;
pub mod transactions;
pub mod ui;

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use auth::{
    ANONYMOUS, AuthConfig, Principal, PrincipalConfig, RawAuth, RawPrincipal, Role, StreamPattern,
};
pub use cluster::{ClusterConfig, NatsConfig, RawCluster};
pub use geo_budget::GeoBudgetConfig;
pub use geo_ind::{GeoIndConfig, RawGeoInd};
pub use location::{
    CloakModel, LocationConfig, PresenceParams, RawLocation, SearchMode, SessionPolicy,
    SessionSettings,
};
pub use server::{RawServer, RawTls, ServerConfig, TlsConfig};
pub use tables::{RawTables, TablesConfig};
pub use telemetry::{RawTelemetry, TelemetryConfig};
pub use transactions::{
    Mode, RawStreamOverride, RawStreamSettings, RawTransactions, StreamSettings, TransactionsConfig,
};
pub use ui::{RawUi, UiConfig};

/// The embedded default configuration (the file `config/default.toml`).
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub server: RawServer,
    pub location: RawLocation,
    pub transactions: RawTransactions,
    pub tables: RawTables,
    pub telemetry: RawTelemetry,
    pub auth: RawAuth,
    pub cluster: RawCluster,
    pub ui: RawUi,
}

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
    pub cluster: ClusterConfig,
    /// `[ui]`: the workbench's HTTP listener.
    pub ui: UiConfig,
}

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
            let text =
                crate::data_files::read_text_file(path).map_err(|source| ConfigError::Read {
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
        let server = self.server.validate()?;
        Ok(Config {
            ui: self.ui.validate(server.tls.is_some())?,
            server,
            auth: self.auth.validate(&location.services)?,
            location,
            transactions: self.transactions.validate()?,
            tables: self.tables.validate()?,
            telemetry: self.telemetry.validate()?,
            cluster,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
        assert_eq!(cfg.location.index, crate::location::IndexKind::RTree);
        assert_eq!(cfg.transactions.defaults.rho, 0.5);
        assert_eq!(cfg.transactions.defaults.m, 3);
        assert_eq!(cfg.transactions.defaults.window_records, 10_000);
        assert_eq!(cfg.transactions.defaults.window, Duration::from_secs(60));
    }

    #[test]
    fn geo_ind_defaults_and_default_model() {
        let cfg = Config::embedded_defaults();
        let geo = &cfg.location.geo_ind;
        assert_eq!(geo.default_epsilon_per_km, 5.0);
        assert_eq!(geo.params.confidence, 0.95);
        assert_eq!(geo.params.grid_step_m, 1.0);
        let cfg = Config::load_with_env(
            None,
            env(&[("CLOAKD_LOCATION__DEFAULT_MODEL", "\"geo-ind\"")]),
        )
        .unwrap();
        assert_eq!(cfg.location.default_model, CloakModel::GeoInd);
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
            ("CLOAKD_LOCATION__INDEX", "\"quadtree\"", "location.index"),
            ("CLOAKD_SERVER__LISTEN", "nowhere", "server.listen"),
            (
                "CLOAKD_TRANSACTIONS__DEFAULTS__RHO",
                "1.5",
                "transactions.defaults.rho",
            ),
            ("CLOAKD_LOCATION__MAX_DX_M", "-1.0", "location.max_dx_m"),
            (
                "CLOAKD_LOCATION__DEFAULT_DY_M",
                "5.0",
                "location.default_dy_m",
            ),
            ("CLOAKD_LOCATION__MAX_K", "500", "location.max_k"),
            (
                "CLOAKD_LOCATION__DEFAULT_MODEL",
                "\"crowd\"",
                "location.default_model",
            ),
            (
                "CLOAKD_LOCATION__DEFAULT_MODEL",
                "\"geo_ind\"",
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
            (
                "CLOAKD_LOCATION__GEO_IND__MIN_EPSILON_PER_KM",
                "0.0",
                "location.geo_ind.min_epsilon_per_km",
            ),
            (
                "CLOAKD_LOCATION__GEO_IND__MAX_EPSILON_PER_KM",
                "0.1",
                "location.geo_ind.max_epsilon_per_km",
            ),
            (
                "CLOAKD_LOCATION__GEO_IND__DEFAULT_EPSILON_PER_KM",
                "500.0",
                "location.geo_ind.default_epsilon_per_km",
            ),
            (
                "CLOAKD_LOCATION__GEO_IND__CONFIDENCE",
                "1.0",
                "location.geo_ind.confidence",
            ),
            (
                "CLOAKD_LOCATION__GEO_IND__GRID_STEP_M",
                "5.0",
                "location.geo_ind.grid_step_m",
            ),
            (
                "CLOAKD_LOCATION__GEO_IND__REGION",
                "[10.0, 0.0, 5.0, 1.0]",
                "location.geo_ind.region",
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
