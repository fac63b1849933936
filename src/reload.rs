//! Live configuration: SIGHUP re-reads the configuration the daemon was started with and applies
//! what can change while it runs.
//!
//! The daemon keeps its [`ConfigSource`] (the `--config` file, the `CLOAKD_*` environment as it was
//! at start, and the command-line overrides) and the merged document it runs on. On SIGHUP the
//! [`Reloader`] loads the source again and validates it with the same rules as a start; then it
//! compares the new document with the running one key by key (dotted names, lists compared whole).
//!
//! Invariants:
//! - An invalid file changes nothing: the error is logged (naming the key) and the running
//!   configuration stays.
//! - A change to a key that is not in [`RELOADABLE`] (listen addresses, the data directory, TLS file
//!   paths, the metrics listener, `[auth]`, `[tables]`, `[cluster]`, the engines' construction
//!   parameters, ...) refuses the *whole* reload: a log line names every such key, nothing is
//!   applied, and the running configuration stays until the file is reverted or the daemon is
//!   restarted. Refusing the whole file keeps the running configuration equal to one file the
//!   operator wrote, never a mix of two. Keys are restart-only unless listed, so a key added later
//!   is safe by default.
//! - An accepted reload hands each service its new section at once ([`ReloadTarget`]); the services
//!   read it per request (location) or per record and window (transactions). Requests already
//!   admitted keep the parameters they were admitted with; a window already closed keeps the
//!   parameters it was closed with (they are in its close marker).
//! - Every attempt is counted by outcome in `cloakd_config_reloads_total`; a successful one logs the
//!   names of the changed keys (never their values, so no secret reaches the log).
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use crate::config::{Config, ConfigError, ENV_PREFIX};
use crate::telemetry::catalog;

/// Keys (dotted, or a section prefix ending in `.`) that a reload may change; every other key is
/// restart-only. `config/default.toml` and docs/configuration.md say the same per key.
pub const RELOADABLE: &[&str] = &[
    "location.services",
    "location.default_k",
    "location.min_k",
    "location.max_k",
    "location.default_dx_m",
    "location.default_dy_m",
    "location.max_dx_m",
    "location.max_dy_m",
    "location.default_dt_ms",
    "location.max_dt_ms",
    "location.max_payload_bytes",
    "location.default_model",
    "location.max_pending",
    "location.max_pending_per_stream",
    "location.client_queue",
    "location.answer_ttl_ms",
    "location.max_requests_per_s_per_principal",
    "location.forward_jitter_ms",
    "transactions.defaults.",
    "transactions.streams.",
    "transactions.max_items_per_record",
    "transactions.max_item_bytes",
    "transactions.max_open_records",
    "transactions.max_window_antecedents",
    "transactions.max_streams",
    "transactions.max_unacked_per_publish",
    "transactions.subscriber_queue",
];

/// Whether `key` (dotted) may change on a reload.
pub fn is_reloadable(key: &str) -> bool {
    RELOADABLE
        .iter()
        .any(|reloadable| match reloadable.strip_suffix('.') {
            Some(section) => key
                .strip_prefix(section)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.')),
            None => key == *reloadable,
        })
}

/// Where the running configuration came from, so a reload reads the same sources the same way.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    /// The `--config` file, if any.
    pub file: Option<PathBuf>,
    /// The `CLOAKD_*` environment variables as they were at start.
    pub env: Vec<(String, String)>,
    /// `--listen`, which overrides `server.listen`.
    pub listen: Option<SocketAddr>,
    /// `--ui`, which overrides `ui.listen`.
    pub ui: Option<SocketAddr>,
}

impl ConfigSource {
    /// The file and overrides of this process, with its `CLOAKD_*` environment captured now.
    pub fn of_process(
        file: Option<PathBuf>,
        listen: Option<SocketAddr>,
        ui: Option<SocketAddr>,
    ) -> ConfigSource {
        ConfigSource {
            file,
            env: std::env::vars()
                .filter(|(name, _)| name.starts_with(ENV_PREFIX))
                .collect(),
            listen,
            ui,
        }
    }

    /// The merged, not yet validated document: defaults, file, environment, command line.
    pub fn document(&self) -> Result<toml::Table, ConfigError> {
        let mut doc = Config::load_document(self.file.as_deref(), self.env.iter().cloned())?;
        if let Some(listen) = self.listen
            && let Some(toml::Value::Table(server)) = doc.get_mut("server")
        {
            server.insert("listen".into(), toml::Value::String(listen.to_string()));
        }
        if let Some(ui) = self.ui
            && let Some(toml::Value::Table(section)) = doc.get_mut("ui")
        {
            section.insert("listen".into(), toml::Value::String(ui.to_string()));
        }
        Ok(doc)
    }

    /// Loads and validates the configuration: the document and the typed configuration.
    pub fn load(&self) -> Result<(toml::Table, Config), ConfigError> {
        let doc = self.document()?;
        let config = Config::from_document(doc.clone())?;
        Ok((doc, config))
    }
}

/// The dotted names of every key whose value differs between `old` and `new` (present in one only
/// counts as a change). Tables are walked; any other value, lists included, is compared whole.
pub fn changed_keys(old: &toml::Table, new: &toml::Table) -> Vec<String> {
    /// A table present on one side only is walked against an empty one, so every key in it is
    /// named.
    fn walk<'a>(
        prefix: &str,
        old: Option<&'a toml::Value>,
        new: Option<&'a toml::Value>,
        out: &mut Vec<String>,
    ) {
        let empty = toml::Table::new();
        let table = |value: Option<&'a toml::Value>| match value {
            Some(toml::Value::Table(t)) => Some(t),
            None => Some(&empty),
            Some(_) => None,
        };
        match (table(old), table(new)) {
            (Some(o), Some(n)) if old.is_some() || new.is_some() => {
                let keys: std::collections::BTreeSet<&String> = o.keys().chain(n.keys()).collect();
                for key in keys {
                    let name = if prefix.is_empty() {
                        key.clone()
                    } else {
                        format!("{prefix}.{key}")
                    };
                    walk(&name, o.get(key), n.get(key), out);
                }
            }
            _ if old == new => {}
            _ => out.push(prefix.to_string()),
        }
    }
    let mut out = Vec::new();
    walk(
        "",
        Some(&toml::Value::Table(old.clone())),
        Some(&toml::Value::Table(new.clone())),
        &mut out,
    );
    out
}

/// What one reload attempt did.
#[derive(Debug, Clone, PartialEq)]
pub enum ReloadOutcome {
    /// The new configuration is in force; the keys that changed.
    Applied { changed: Vec<String> },
    /// The file says what is already running.
    Unchanged,
    /// Restart-only keys changed; nothing was applied.
    Refused { restart_only: Vec<String> },
    /// The configuration does not load or validate; nothing was applied.
    Invalid { error: String },
}

impl ReloadOutcome {
    /// The `outcome` label of `cloakd_config_reloads_total`.
    pub fn label(&self) -> &'static str {
        match self {
            ReloadOutcome::Applied { .. } => "applied",
            ReloadOutcome::Unchanged => "unchanged",
            ReloadOutcome::Refused { .. } => "refused",
            ReloadOutcome::Invalid { .. } => "invalid",
        }
    }
}

/// A part of the daemon that takes a new configuration on reload (it reads only its own section).
pub trait ReloadTarget: Send + Sync {
    fn apply(&self, config: &Config);
}

/// Re-reads the configuration and hands an accepted one to the targets.
pub struct Reloader {
    source: ConfigSource,
    running: toml::Table,
    targets: Vec<Arc<dyn ReloadTarget>>,
}

impl Reloader {
    /// `running` is the document the daemon started with (from `source`).
    pub fn new(source: ConfigSource, running: toml::Table) -> Reloader {
        Reloader {
            source,
            running,
            targets: Vec::new(),
        }
    }

    pub fn with_target(mut self, target: Arc<dyn ReloadTarget>) -> Reloader {
        self.targets.push(target);
        self
    }

    /// One reload attempt: load, validate, compare, apply or refuse; logged and counted.
    pub fn reload(&mut self) -> ReloadOutcome {
        let outcome = self.attempt();
        metrics::counter!(catalog::CONFIG_RELOADS, "outcome" => outcome.label()).increment(1);
        let file = self
            .source
            .file
            .as_ref()
            .map(|f| f.display().to_string())
            .unwrap_or_else(|| "(no --config file)".into());
        match &outcome {
            ReloadOutcome::Applied { changed } => {
                metrics::gauge!(catalog::CONFIG_LAST_RELOAD_SUCCESSFUL).set(1.0);
                tracing::info!(
                    %file,
                    changed = %changed.join(","),
                    "configuration reloaded"
                );
            }
            ReloadOutcome::Unchanged => {
                metrics::gauge!(catalog::CONFIG_LAST_RELOAD_SUCCESSFUL).set(1.0);
                tracing::info!(%file, "configuration reloaded; no key changed");
            }
            ReloadOutcome::Refused { restart_only } => {
                metrics::gauge!(catalog::CONFIG_LAST_RELOAD_SUCCESSFUL).set(0.0);
                tracing::error!(
                    %file,
                    keys = %restart_only.join(","),
                    "configuration not reloaded: {} only take(s) effect at a restart; the running configuration stays (revert the key(s), or restart the daemon)",
                    restart_only.join(", ")
                );
            }
            ReloadOutcome::Invalid { error } => {
                metrics::gauge!(catalog::CONFIG_LAST_RELOAD_SUCCESSFUL).set(0.0);
                tracing::error!(
                    %file,
                    %error,
                    "configuration not reloaded: invalid; the running configuration stays"
                );
            }
        }
        outcome
    }

    fn attempt(&mut self) -> ReloadOutcome {
        let (doc, config) = match self.source.load() {
            Ok(loaded) => loaded,
            Err(err) => {
                return ReloadOutcome::Invalid {
                    error: err.to_string(),
                };
            }
        };
        let changed = changed_keys(&self.running, &doc);
        if changed.is_empty() {
            return ReloadOutcome::Unchanged;
        }
        let restart_only: Vec<String> = changed
            .iter()
            .filter(|key| !is_reloadable(key))
            .cloned()
            .collect();
        if !restart_only.is_empty() {
            return ReloadOutcome::Refused { restart_only };
        }
        for target in &self.targets {
            target.apply(&config);
        }
        self.running = doc;
        ReloadOutcome::Applied { changed }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(text: &str) -> toml::Table {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn changed_keys_walks_tables_and_compares_lists_whole() {
        let old = doc("[a]\nx = 1\ny = [1, 2]\n[a.b]\nz = \"s\"\n[c]\nw = 1\n");
        let new = doc("[a]\nx = 1\ny = [1, 3]\n[a.b]\nz = \"t\"\nv = 2\n");
        assert_eq!(
            changed_keys(&old, &new),
            vec!["a.b.v", "a.b.z", "a.y", "c.w"]
        );
        let with_list = doc("[c]\nw = [1]\n");
        assert_eq!(
            changed_keys(&old, &with_list),
            vec!["a.b.z", "a.x", "a.y", "c.w"]
        );
        assert!(changed_keys(&old, &old).is_empty());
    }

    #[test]
    fn only_listed_keys_are_reloadable() {
        assert!(is_reloadable("location.max_k"));
        assert!(is_reloadable("transactions.defaults.rho"));
        assert!(is_reloadable("transactions.streams.clicks.window_ms"));
        assert!(is_reloadable("transactions.streams"));
        assert!(!is_reloadable("transactions.streams_x"));
        assert!(!is_reloadable("location.max_k_extra"));
        for key in [
            "server.listen",
            "server.tls.cert_file",
            "transactions.data_dir",
            "telemetry.metrics_listen",
            "auth.principals",
            "location.seed",
            "location.search",
            "location.index",
            "location.provider_queue",
            "cluster.nats_url",
        ] {
            assert!(!is_reloadable(key), "{key}");
        }
    }

    /// Every reloadable key exists in the embedded defaults (a section only documented there, like
    /// `[transactions.streams.NAME]`, at least in its comments), and config/default.toml marks every
    /// key of its own as reloadable or restart-only in agreement with [`RELOADABLE`].
    #[test]
    fn default_toml_marks_every_key() {
        let text = crate::config::DEFAULT_TOML;
        let defaults = doc(text);
        let keys = changed_keys(&toml::Table::new(), &defaults);
        for reloadable in RELOADABLE {
            let found = match reloadable.strip_suffix('.') {
                Some(section) => text.contains(&format!("[{section}")),
                None => keys.iter().any(|k| k == reloadable),
            };
            assert!(found, "{reloadable} is not in config/default.toml");
        }
        let marks = reload_marks(crate::config::DEFAULT_TOML);
        for key in &keys {
            let mark = marks
                .get(key.as_str())
                .unwrap_or_else(|| panic!("config/default.toml does not mark {key}"));
            assert_eq!(
                *mark,
                is_reloadable(key),
                "config/default.toml marks {key} as {}",
                if *mark { "reloadable" } else { "restart-only" }
            );
        }
    }

    /// Each key line of `text` mapped to its trailing mark: `# reloadable` (true) or
    /// `# restart-only` (false).
    fn reload_marks(text: &str) -> std::collections::BTreeMap<String, bool> {
        let mut section = String::new();
        let mut marks = std::collections::BTreeMap::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('#') || line.is_empty() {
                continue;
            }
            if let Some(header) = line.strip_prefix('[') {
                section = header.trim_end_matches(']').to_string();
                continue;
            }
            let Some((key, rest)) = line.split_once('=') else {
                continue;
            };
            let mark = if rest.contains("# reloadable") {
                true
            } else if rest.contains("# restart-only") {
                false
            } else {
                continue;
            };
            marks.insert(format!("{section}.{}", key.trim()), mark);
        }
        marks
    }

    struct Recorder(std::sync::Mutex<Vec<u32>>);
    impl ReloadTarget for Recorder {
        fn apply(&self, config: &Config) {
            self.0.lock().unwrap().push(config.location.max_k);
        }
    }

    #[test]
    fn reload_applies_refuses_or_keeps() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[location]\nmax_k = 20\n").unwrap();
        let source = ConfigSource {
            file: Some(file.clone()),
            env: vec![("CLOAKD_LOCATION__DEFAULT_K".into(), "4".into())],
            listen: Some("127.0.0.1:0".parse().unwrap()),
            ui: None,
        };
        let (running, config) = source.load().unwrap();
        assert_eq!(config.location.default_k, 4);
        assert_eq!(config.server.listen.port(), 0);
        let recorder = Arc::new(Recorder(Default::default()));
        let mut reloader = Reloader::new(source, running).with_target(recorder.clone());

        assert_eq!(reloader.reload(), ReloadOutcome::Unchanged);
        std::fs::write(&file, "[location]\nmax_k = 30\n").unwrap();
        assert_eq!(
            reloader.reload(),
            ReloadOutcome::Applied {
                changed: vec!["location.max_k".into()]
            }
        );
        // The environment (default_k = 4) and --listen still apply: no restart-only change.
        std::fs::write(
            &file,
            "[location]\nmax_k = 30\nseed = 7\n[server]\nlisten = \"127.0.0.1:1\"\n",
        )
        .unwrap();
        let refused = reloader.reload();
        assert_eq!(refused.label(), "refused");
        assert!(
            matches!(&refused, ReloadOutcome::Refused { restart_only } if restart_only == &["location.seed".to_string()]),
            "{refused:?}"
        );
        std::fs::write(&file, "[location]\nmax_k = 2\n").unwrap();
        let invalid = reloader.reload();
        assert!(
            matches!(&invalid, ReloadOutcome::Invalid { error } if error.contains("location.")),
            "{invalid:?}"
        );
        std::fs::write(&file, "[location]\nmax_k = 40\n").unwrap();
        assert_eq!(reloader.reload().label(), "applied");
        assert_eq!(*recorder.0.lock().unwrap(), vec![30, 40]);
    }
}
