//! Geo-indistinguishability (Andres, Bordenabe, Chatzikokolakis & Palamidessi, CCS 2013): the planar
//! Laplace mechanism, discretized to a grid and truncated to a region, with epsilon corrected for the
//! floating-point implementation (the paper's section 5). docs/geo-ind.md states the guarantee.
//!
//! One draw for a true position x at privacy level epsilon (per metre):
//! 1. x is snapped to the fixed grid of step u inside the region A ([`grid`]): the mechanism only ever
//!    sees grid points, so two distinct inputs are at least u apart;
//! 2. an angle theta uniform in [0, 2 pi) and t = eps' * r from Gamma(2, 1) by the inverse CDF
//!    ([`radial`]: Lambert W_{-1} in a cancellation-free form, with full-precision uniforms), where
//!    eps' is the corrected epsilon ([`corrected_epsilon_per_m`]);
//! 3. the offset (r cos theta east, r sin theta north) is applied in the equirectangular frame at the
//!    snapped point's latitude;
//! 4. the result is moved to the nearest grid point inside A (truncation).
//!
//! Invariants:
//! - pure: no clock, no I/O, no tokio; randomness only from the generator passed in, which must be a
//!   cryptographically secure one (the `CryptoRng` bound);
//! - every reported point is a point of the absolute grid (it does not depend on the true point) and
//!   lies inside A;
//! - the noise is drawn with eps' <= eps, where eps' + ln((1 + a)/(1 - a))/u <= eps;
//! - nothing here panics on any input; non-finite inputs are moved into A like any other.

pub mod grid;
pub mod radial;

use rand::{CryptoRng, RngCore};

use crate::location::GeoBox;
use crate::location::geo::METRES_PER_DEGREE_LAT;
use grid::Grid;

pub mod predictive;

/// The mechanism's fixed parameters (`[location.geo_ind]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeoIndParams {
    /// Grid step u in metres: reported points (and the true point, before the draw) are snapped to the
    /// grid of this step.
    pub grid_step_m: f64,
    /// The truncation region A (degrees): reported points never leave it; true points must lie in it.
    pub region: GeoBox,
    /// Probability that the area of retrieval holds the true position, in (0, 1).
    pub confidence: f64,
}

/// Why a mechanism cannot be built: the parameter and the rule it breaks.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {rule}")]
pub struct ParamError {
    pub field: &'static str,
    pub rule: String,
}

/// A reported point, WGS84 degrees (a grid point inside the region).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reported {
    pub lat: f64,
    pub lon: f64,
}

/// Bound on the distance, in metres, between the point the implementation computes before snapping
/// and the exact one for the same uniforms' real values (docs/geo-ind.md "Floating point"): each step
/// (the uniforms' 52-bit mantissas, the Newton solution to a few ulps, sin/cos, the degree conversion)
/// is off by a few units in the last place of a value at most t_max/eps' metres (or 180 degrees), so
/// 2^-44 of that, plus a nanometre-scale floor for the degree conversion, holds with a wide margin.
pub fn float_error_m(epsilon_per_m: f64) -> f64 {
    let far = radial::T_MAX / epsilon_per_m;
    far * 2f64.powi(-44) + 1e-8
}

/// The epsilon the implemented, discretized mechanism guarantees when it draws with `eps_prime`:
/// eps' + ln((1 + a)/(1 - a)) / u with a = (4 eta / u) e^(2 eps' u), eta = [`float_error_m`].
/// `None` when a >= 1 (the grid is too fine for the arithmetic).
pub fn guaranteed_epsilon_per_m(eps_prime: f64, grid_step_m: f64) -> Option<f64> {
    let u = grid_step_m;
    let a = 4.0 * float_error_m(eps_prime) / u * (2.0 * eps_prime * u).exp();
    if !(a.is_finite() && a < 1.0) {
        return None;
    }
    Some(eps_prime + ((1.0 + a) / (1.0 - a)).ln() / u)
}

/// The largest eps' (found by a fixed-point iteration, then checked) whose guaranteed epsilon is at
/// most `epsilon_per_m`.
pub fn corrected_epsilon_per_m(epsilon_per_m: f64, grid_step_m: f64) -> Result<f64, ParamError> {
    if !(epsilon_per_m.is_finite() && epsilon_per_m > 0.0) {
        return Err(ParamError {
            field: "epsilon_per_km",
            rule: format!(
                "must be a finite number > 0 (got {})",
                epsilon_per_m * 1000.0
            ),
        });
    }
    let too_fine = || ParamError {
        field: "location.geo_ind.grid_step_m",
        rule: "too small for the floating-point correction at this epsilon".to_string(),
    };
    let mut eps_prime = epsilon_per_m;
    for _ in 0..20 {
        let guaranteed = guaranteed_epsilon_per_m(eps_prime, grid_step_m).ok_or_else(too_fine)?;
        let next = epsilon_per_m - (guaranteed - eps_prime);
        if next.is_nan() || next <= 0.0 {
            return Err(too_fine());
        }
        eps_prime = next;
    }
    // Shave until the bound holds exactly in floating point.
    for _ in 0..64 {
        match guaranteed_epsilon_per_m(eps_prime, grid_step_m) {
            Some(g) if g <= epsilon_per_m => return Ok(eps_prime),
            Some(_) => eps_prime *= 1.0 - 1e-12,
            None => return Err(too_fine()),
        }
    }
    Err(too_fine())
}

/// Radius in metres of the area of retrieval: the r with P(distance <= r) = confidence under
/// Gamma(2, 1/eps) (inverse of 1 - (1 + eps r) e^(-eps r)), plus the grid's diagonal u sqrt(2) (half
/// a diagonal for snapping the true point, half for the reported one), so the confidence still holds
/// for the discretized, truncated mechanism (truncation only moves points closer to the snapped
/// true point).
pub fn retrieval_radius_m(epsilon_per_m: f64, confidence: f64, grid_step_m: f64) -> f64 {
    radial::inverse_cdf(confidence) / epsilon_per_m + grid_step_m * std::f64::consts::SQRT_2
}

/// The bounding box (degrees) of the circle of `radius_m` around (lat, lon), clamped to the globe.
pub fn circle_bbox(lat: f64, lon: f64, radius_m: f64) -> GeoBox {
    let (half_lat, half_lon) = crate::location::geo::half_widths_deg(lat, radius_m, radius_m);
    GeoBox {
        min_lat: (lat - half_lat).max(-90.0),
        min_lon: (lon - half_lon).max(-180.0),
        max_lat: (lat + half_lat).min(90.0),
        max_lon: (lon + half_lon).min(180.0),
    }
}

/// The planar Laplace mechanism at one privacy level.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mechanism {
    epsilon_per_m: f64,
    corrected_per_m: f64,
    grid: Grid,
    confidence: f64,
}

impl Mechanism {
    /// A mechanism guaranteeing `epsilon_per_m` (per metre) with the given grid, region and confidence.
    pub fn new(epsilon_per_m: f64, params: &GeoIndParams) -> Result<Mechanism, ParamError> {
        let grid = Grid::new(params.grid_step_m, params.region).ok_or_else(|| ParamError {
            field: "location.geo_ind.region",
            rule: "must hold at least two grid steps in each direction".to_string(),
        })?;
        if !(params.confidence > 0.0 && params.confidence < 1.0) {
            return Err(ParamError {
                field: "location.geo_ind.confidence",
                rule: format!("must lie in (0, 1) (got {})", params.confidence),
            });
        }
        let corrected_per_m = corrected_epsilon_per_m(epsilon_per_m, params.grid_step_m)?;
        Ok(Mechanism {
            epsilon_per_m,
            corrected_per_m,
            grid,
            confidence: params.confidence,
        })
    }

    /// The epsilon promised (per metre).
    pub fn epsilon_per_m(&self) -> f64 {
        self.epsilon_per_m
    }

    /// The epsilon the noise is drawn with (per metre), after the floating-point correction.
    pub fn corrected_epsilon_per_m(&self) -> f64 {
        self.corrected_per_m
    }

    /// This mechanism's area of retrieval radius ([`retrieval_radius_m`] at the corrected epsilon).
    pub fn retrieval_radius_m(&self) -> f64 {
        retrieval_radius_m(self.corrected_per_m, self.confidence, self.grid.step_m())
    }

    /// The grid point the mechanism treats a true position as (inside the region).
    pub fn snap(&self, lat: f64, lon: f64) -> (f64, f64) {
        self.grid.snap_inside(lat, lon)
    }

    /// One draw for the true position (lat, lon).
    pub fn draw<R: RngCore + CryptoRng + ?Sized>(
        &self,
        rng: &mut R,
        lat: f64,
        lon: f64,
    ) -> Reported {
        let (x_lat, x_lon) = self.grid.snap_inside(lat, lon);
        let theta = std::f64::consts::TAU * ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64);
        let r = radial::draw_t(rng) / self.corrected_per_m;
        let (sin, cos) = theta.sin_cos();
        let north = r * sin;
        let east = r * cos;
        let cos_lat = x_lat.to_radians().cos().max(1e-6);
        let lat = x_lat + north / METRES_PER_DEGREE_LAT;
        let lon = x_lon + east / (METRES_PER_DEGREE_LAT * cos_lat);
        let (lat, lon) = self.grid.snap_inside(lat, lon);
        Reported { lat, lon }
    }
}

#[cfg(test)]
mod tests;
