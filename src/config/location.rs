//! `[location]`: the location broker's defaults and limits (k, tolerances, models, queues, sessions).

use serde::Deserialize;

use super::{ConfigError, invalid, positive_metres, positive_usize};

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
    pub index: String,
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
    pub geo_ind: super::RawGeoInd,
}

pub use crate::location::{IndexKind, SearchMode};

pub use crate::location::presence::PresenceParams;

/// How a location request is made k-anonymous (the `model` field of a request, or its default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloakModel {
    /// CliqueCloak: wait for k requests of k users that meet in space and time.
    Requests,
    /// k users present: a reciprocal region of at least k users' latest positions, at once.
    Presence,
    /// Geo-indistinguishability: a point drawn by the planar Laplace mechanism, at once, alone.
    GeoInd,
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
    /// The spatial index of the CliqueCloak engine's pending requests.
    pub index: IndexKind,
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
    /// The geo-indistinguishability model (`[location.geo_ind]`).
    pub geo_ind: super::GeoIndConfig,
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

impl RawLocation {
    pub(super) fn validate(self) -> Result<LocationConfig, ConfigError> {
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
        let index = IndexKind::from_name(&self.index).ok_or_else(|| {
            invalid(
                "location.index",
                format!("must be \"rtree\" or \"grid\" (got {:?})", self.index),
            )
        })?;
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
            "geo-ind" => CloakModel::GeoInd,
            other => {
                return Err(invalid(
                    "location.default_model",
                    format!("must be \"requests\", \"presence\" or \"geo-ind\" (got {other:?})"),
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
            index,
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
            geo_ind: self.geo_ind.validate()?,
        })
    }
}
