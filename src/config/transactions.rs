//! `[transactions]`: record limits, the window pipeline's limits and each stream's settings (rho, m,
//! mode, window sizes), with `[transactions.defaults]` and per-stream overrides.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid, open_unit, positive_usize};

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

/// Anonymization mode of a transaction stream: the engine's own type, from config to store to engine.
pub use crate::transactions::Mode;

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

impl RawStreamSettings {
    pub(super) fn validate(self, section: &str) -> Result<StreamSettings, ConfigError> {
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
    pub(super) fn validate(self) -> Result<TransactionsConfig, ConfigError> {
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
