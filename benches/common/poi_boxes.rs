//! The boxes of `benches/poi.rs` (also used by `examples/poi_rows.rs`, which times its rows): centred
//! near positions of the in-repo Oldenburg trace slice, each side uniform in [d, 2d] for a tolerance d
//! per axis, the point uniformly inside.
use std::path::Path;

use cloakd::poi::sphere::{EARTH_RADIUS_M, SphBox};
use cloakd::poi::{Limits, query_box};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A tolerance per axis: fixed, or each of dx and dy drawn log-uniform in [20 m, 20 km].
#[derive(Clone, Copy)]
pub enum Tolerance {
    Fixed(f64),
    LogUniform,
}

/// `count` boxes of the seeded sequence `seed`.
pub fn boxes(tolerance: Tolerance, count: usize, seed: u64) -> Vec<SphBox> {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/oldenburg_60s.csv.gz");
    let points = cloakd::workload::read_trace_file(&trace, Some(200_000)).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let m_per_deg = EARTH_RADIUS_M.to_radians();
    let limits = Limits::default();
    (0..count)
        .map(|_| {
            let p = &points[rng.random_range(0..points.len())];
            let mut draw = || match tolerance {
                Tolerance::Fixed(d) => d,
                Tolerance::LogUniform => {
                    10f64.powf(rng.random_range(20f64.log10()..20_000f64.log10()))
                }
            };
            let (dx, dy) = (draw(), draw());
            let w = rng.random_range(dx..=2.0 * dx);
            let h = rng.random_range(dy..=2.0 * dy);
            let (fx, fy): (f64, f64) = (rng.random(), rng.random());
            let dlat = h / m_per_deg;
            let dlon = w / (m_per_deg * p.lat.to_radians().cos());
            let lat0 = p.lat - fy * dlat;
            let lon0 = p.lon - fx * dlon;
            query_box(lat0, lon0, lat0 + dlat, lon0 + dlon, &limits).unwrap()
        })
        .collect()
}
