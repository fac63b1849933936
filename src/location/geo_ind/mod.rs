//! Geo-indistinguishability (Andres, Bordenabe, Chatzikokolakis & Palamidessi, CCS 2013): the planar
//! Laplace mechanism, discretized to a grid and truncated to a region, with epsilon corrected for the
//! floating-point implementation (the paper's section 5). See docs/geo-ind.md.
//!
//! Invariants:
//! - pure: no clock, no I/O, no tokio; randomness only from the generator passed in;
//! - every reported point is a point of the absolute grid (it does not depend on the true point) and
//!   lies inside the truncation region;
//! - the noise is drawn with the corrected epsilon, never above the epsilon asked for.

/// The mechanism's fixed parameters (`[location.geo_ind]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeoIndParams {
    /// Grid step u in metres: reported points (and the true point, before the draw) are snapped to the
    /// grid of this step.
    pub grid_step_m: f64,
    /// The truncation region A (degrees): reported points never leave it; true points must lie in it.
    pub region: crate::location::GeoBox,
    /// Probability that the area of retrieval holds the true position, in (0, 1).
    pub confidence: f64,
}
