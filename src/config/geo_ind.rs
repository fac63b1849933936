//! `[location.geo_ind]`: the geo-indistinguishability model's privacy levels and mechanism parameters.
//!
//! Invariants after validation: 0 < min_epsilon_per_km <= default_epsilon_per_km <= max_epsilon_per_km,
//! all finite; confidence in (0, 1); grid_step_m finite, > 0 and small against 1/max epsilon (at most a
//! tenth of it); the region a proper box inside lat [-85, 85], lon [-180, 180].

use serde::Deserialize;

use super::{ConfigError, invalid};
use crate::location::GeoBox;
use crate::location::geo_ind::GeoIndParams;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawGeoInd {
    pub default_epsilon_per_km: f64,
    pub min_epsilon_per_km: f64,
    pub max_epsilon_per_km: f64,
    pub confidence: f64,
    pub grid_step_m: f64,
    /// [min_lat, min_lon, max_lat, max_lon]
    pub region: [f64; 4],
    // The privacy budget (`super::geo_budget`).
    pub budget: f64,
    pub budget_window_ms: u64,
    pub budget_reserve_share: f64,
    pub reuse_test_epsilon_per_km: f64,
    pub reuse_threshold_m: f64,
    pub ledger_queue: usize,
    pub ledger_max_batch: usize,
}

/// The validated `[location.geo_ind]`.
#[derive(Debug, Clone, PartialEq)]
pub struct GeoIndConfig {
    /// Epsilon (per km) of a GEO_IND request that leaves `epsilon_per_km` unset.
    pub default_epsilon_per_km: f64,
    /// The range a request's `epsilon_per_km` (and `fallback_epsilon_per_km`) must lie in.
    pub min_epsilon_per_km: f64,
    pub max_epsilon_per_km: f64,
    /// What the mechanism needs: grid, truncation region, confidence of the area of retrieval.
    pub params: GeoIndParams,
    /// The privacy budget per user (`None`: `budget = 0`, none kept).
    pub budget: Option<super::geo_budget::GeoBudgetConfig>,
}

fn positive_finite(key: &str, v: f64) -> Result<f64, ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(invalid(
            key,
            format!("must be a finite number > 0 (got {v})"),
        ))
    }
}

impl RawGeoInd {
    pub(super) fn validate(self) -> Result<GeoIndConfig, ConfigError> {
        let min = positive_finite(
            "location.geo_ind.min_epsilon_per_km",
            self.min_epsilon_per_km,
        )?;
        let max = positive_finite(
            "location.geo_ind.max_epsilon_per_km",
            self.max_epsilon_per_km,
        )?;
        if max < min {
            return Err(invalid(
                "location.geo_ind.max_epsilon_per_km",
                format!("must be >= location.geo_ind.min_epsilon_per_km ({min})"),
            ));
        }
        let default = self.default_epsilon_per_km;
        if !(default.is_finite() && min <= default && default <= max) {
            return Err(invalid(
                "location.geo_ind.default_epsilon_per_km",
                format!(
                    "must lie in [min_epsilon_per_km, max_epsilon_per_km] = [{min}, {max}] (got {default})"
                ),
            ));
        }
        let confidence = self.confidence;
        if !(confidence.is_finite() && confidence > 0.0 && confidence < 1.0) {
            return Err(invalid(
                "location.geo_ind.confidence",
                format!("must lie in (0, 1) (got {confidence})"),
            ));
        }
        let step = positive_finite("location.geo_ind.grid_step_m", self.grid_step_m)?;
        // The grid must be fine against the noise (1/epsilon metres) for the mechanism to stay close
        // to the continuous one and the correction small (docs/geo-ind.md).
        let finest_noise_m = 1000.0 / max;
        if step > finest_noise_m / 10.0 {
            return Err(invalid(
                "location.geo_ind.grid_step_m",
                format!(
                    "must be at most a tenth of 1/max_epsilon_per_km, {} m (got {step})",
                    finest_noise_m / 10.0
                ),
            ));
        }
        let [min_lat, min_lon, max_lat, max_lon] = self.region;
        let inside = |v: f64, bound: f64| v.is_finite() && (-bound..=bound).contains(&v);
        if !(inside(min_lat, 85.0)
            && inside(max_lat, 85.0)
            && inside(min_lon, 180.0)
            && inside(max_lon, 180.0)
            && min_lat < max_lat
            && min_lon < max_lon)
        {
            return Err(invalid(
                "location.geo_ind.region",
                format!(
                    "must be [min_lat, min_lon, max_lat, max_lon] with min < max, lat in [-85, 85] and lon in [-180, 180] (got {:?})",
                    self.region
                ),
            ));
        }
        let budget = super::geo_budget::RawGeoBudget {
            budget: self.budget,
            budget_window_ms: self.budget_window_ms,
            budget_reserve_share: self.budget_reserve_share,
            reuse_test_epsilon_per_km: self.reuse_test_epsilon_per_km,
            reuse_threshold_m: self.reuse_threshold_m,
            ledger_queue: self.ledger_queue,
            ledger_max_batch: self.ledger_max_batch,
        }
        .validate(default)?;
        Ok(GeoIndConfig {
            budget,
            default_epsilon_per_km: default,
            min_epsilon_per_km: min,
            max_epsilon_per_km: max,
            params: GeoIndParams {
                grid_step_m: step,
                region: GeoBox {
                    min_lat,
                    min_lon,
                    max_lat,
                    max_lon,
                },
                confidence,
            },
        })
    }
}
