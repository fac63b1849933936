//! The boxes of `benches/poi.rs` (also used by `examples/poi_rows.rs`, which times its rows): centred
//! near positions of the in-repo Oldenburg trace slice, each side uniform in [d, 2d] for a tolerance d
//! per axis, the point uniformly inside; and the bench's "country", many towns side by side.
use std::path::Path;

use cloakd::poi::generate::{Road, generate};
use cloakd::poi::sphere::{EARTH_RADIUS_M, SphBox};
use cloakd::poi::{Limits, Poi, query_box};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A tolerance per axis: fixed, or each of dx and dy drawn log-uniform in [20 m, 20 km].
#[derive(Clone, Copy)]
pub enum Tolerance {
    Fixed(f64),
    LogUniform,
}

/// A country's worth of POIs at a town's density: `towns` copies of the road network on a square
/// grid of tiles (each the network's extent plus 0.05° apart, northwards and eastwards), each with
/// `per_town` POIs drawn with its own seed (town t: seed t + 1, ids prefixed `t<t>-`, so town 0 is
/// `generate(roads, per_town, 1)` with other ids); and each town's offset (degrees of latitude,
/// longitude) for [`boxes`].
pub fn country(roads: &[Road], towns: usize, per_town: usize) -> (Vec<Poi>, Vec<(f64, f64)>) {
    let (mut lat0, mut lat1, mut lon0, mut lon1) = (90.0f64, -90.0f64, 180.0f64, -180.0f64);
    for r in roads {
        for (lat, lon) in [r.from, r.to] {
            (lat0, lat1) = (lat0.min(lat), lat1.max(lat));
            (lon0, lon1) = (lon0.min(lon), lon1.max(lon));
        }
    }
    let side = (towns as f64).sqrt().ceil() as usize;
    let offsets: Vec<(f64, f64)> = (0..towns)
        .map(|t| {
            (
                (t / side) as f64 * (lat1 - lat0 + 0.05),
                (t % side) as f64 * (lon1 - lon0 + 0.05),
            )
        })
        .collect();
    let mut pois = Vec::with_capacity(towns * per_town);
    for (t, (dlat, dlon)) in offsets.iter().enumerate() {
        for mut poi in generate(roads, per_town, t as u64 + 1).unwrap() {
            poi.id = format!("t{t}-{}", poi.id);
            poi.lat += dlat;
            poi.lon += dlon;
            pois.push(poi);
        }
    }
    (pois, offsets)
}

/// `count` boxes of the seeded sequence `seed`, box i moved by `offsets[i % offsets.len()]`
/// (degrees of latitude, longitude): `&[(0.0, 0.0)]` for the town itself, or the offsets of
/// [`country`]'s towns (each box into the next town).
pub fn boxes(tolerance: Tolerance, count: usize, seed: u64, offsets: &[(f64, f64)]) -> Vec<SphBox> {
    let trace = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/oldenburg_60s.csv.gz");
    let points = cloakd::data_files::read_trace_file(&trace, Some(200_000)).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let m_per_deg = EARTH_RADIUS_M.to_radians();
    let limits = Limits::default();
    (0..count)
        .map(|i| {
            let (move_lat, move_lon) = offsets[i % offsets.len()];
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
            let dlon = w / (m_per_deg * (p.lat + move_lat).to_radians().cos());
            let lat0 = p.lat + move_lat - fy * dlat;
            let lon0 = p.lon + move_lon - fx * dlon;
            query_box(lat0, lon0, lat0 + dlat, lon0 + dlon, &limits).unwrap()
        })
        .collect()
}
