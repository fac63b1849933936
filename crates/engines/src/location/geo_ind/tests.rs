//! Statistical checks of the implemented mechanism (discretized, truncated, corrected), seeded so
//! they are deterministic; each states the false-alarm rate its threshold would have on fresh seeds.

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;

use super::*;

const OLDENBURG: (f64, f64) = (53.143, 8.214);

fn params() -> GeoIndParams {
    GeoIndParams {
        grid_step_m: 1.0,
        region: GeoBox {
            min_lat: -85.0,
            min_lon: -180.0,
            max_lat: 85.0,
            max_lon: 180.0,
        },
        confidence: 0.95,
    }
}

/// (east, north) metres of (lat, lon) from (lat0, lon0), in the frame at lat0.
fn offset_m(lat0: f64, lon0: f64, lat: f64, lon: f64) -> (f64, f64) {
    let north = (lat - lat0) * METRES_PER_DEGREE_LAT;
    let east = (lon - lon0) * METRES_PER_DEGREE_LAT * lat0.to_radians().cos();
    (east, north)
}

/// Kolmogorov-Smirnov statistic of `sample` against the CDF `cdf`.
fn ks(mut sample: Vec<f64>, cdf: impl Fn(f64) -> f64) -> f64 {
    sample.sort_by(f64::total_cmp);
    let n = sample.len() as f64;
    sample
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let c = cdf(x);
            (c - i as f64 / n).abs().max(((i + 1) as f64 / n - c).abs())
        })
        .fold(0.0, f64::max)
}

/// Critical KS distance at significance 0.001 (asymptotic, sqrt(-ln(0.0005)/2) = 1.949).
fn ks_critical(n: usize) -> f64 {
    1.949 / (n as f64).sqrt()
}

fn draws(eps_per_km: f64, n: usize, seed: u64) -> (Mechanism, Vec<(f64, f64)>) {
    let m = Mechanism::new(eps_per_km / 1000.0, &params()).unwrap();
    let (x_lat, x_lon) = m.snap(OLDENBURG.0, OLDENBURG.1);
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let out = (0..n)
        .map(|_| {
            let r = m.draw(&mut rng, OLDENBURG.0, OLDENBURG.1);
            offset_m(x_lat, x_lon, r.lat, r.lon)
        })
        .collect();
    (m, out)
}

/// Released radii follow Gamma(2, 1/eps'): KS at level 0.001 (false alarm 0.1 % per fresh seed).
/// The grid (1 m) against the scale 1/eps' (200 m) moves the CDF by at most (eps'/e) * 0.71 m < 0.002,
/// far below the critical distance (0.0138 at n = 20,000).
#[test]
fn radii_follow_gamma_2() {
    let n = 20_000;
    let (m, out) = draws(5.0, n, 11);
    let eps = m.corrected_epsilon_per_m();
    let radii: Vec<f64> = out.iter().map(|(e, n)| e.hypot(*n)).collect();
    let d = ks(radii, |r| radial::cdf(eps * r));
    assert!(d < ks_critical(n), "KS distance {d} >= {}", ks_critical(n));
    // Power: the same radii against Gamma(2) at 1.1 eps are rejected.
    let (_, out) = draws(5.0, n, 11);
    let radii: Vec<f64> = out.iter().map(|(e, n)| e.hypot(*n)).collect();
    assert!(ks(radii, |r| radial::cdf(1.1 * eps * r)) > ks_critical(n));
}

/// Angles are uniform on [0, 2 pi): KS at level 0.001 (false alarm 0.1 %). Points within 20 m of the
/// true one (probability C(0.1) < 0.5 %) are left out: there the grid quantizes the angle.
#[test]
fn angles_are_uniform() {
    let (_, out) = draws(5.0, 20_000, 12);
    let angles: Vec<f64> = out
        .iter()
        .filter(|(e, n)| e.hypot(*n) > 20.0)
        .map(|(e, n)| n.atan2(*e).rem_euclid(std::f64::consts::TAU))
        .collect();
    let n = angles.len();
    let d = ks(angles, |a| a / std::f64::consts::TAU);
    assert!(d < ks_critical(n), "KS distance {d}");
}

/// The audit: for true positions x and x' = x + d north, the counts of reported points per band of
/// northing (a post-processing, so the bands' true probabilities obey the bound) satisfy
/// ln(n_x / n_x') <= eps d up to sampling error. The log of a ratio of two Poisson-like counts has
/// standard deviation sqrt(1/n_x + 1/n_x'); the tolerance is 4.5 of those, one-sided, per band, for
/// bands with at least 200 counts on both sides: false alarm < 3.4e-6 per band, < 1e-4 over the <= 30
/// bands and both directions (Bonferroni). The same audit must flag a claim of eps/2 (its power).
#[test]
fn output_ratios_stay_within_e_to_the_eps_d() {
    let eps_per_km = 5.0;
    let d_m = 200.0;
    let n = 200_000;
    let m = Mechanism::new(eps_per_km / 1000.0, &params()).unwrap();
    let x = m.snap(OLDENBURG.0, OLDENBURG.1);
    let x2 = m.snap(x.0 + d_m / METRES_PER_DEGREE_LAT, x.1);
    let d = offset_m(x.0, x.1, x2.0, x2.1).1;
    assert!((d - d_m).abs() < 1.0, "{d}");
    let band = |seed: u64, from: (f64, f64)| {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut counts = vec![0u64; 40];
        for _ in 0..n {
            let r = m.draw(&mut rng, from.0, from.1);
            let north = offset_m(x.0, x.1, r.lat, r.lon).1;
            let b = ((north + 2000.0) / 100.0).floor();
            if (0.0..40.0).contains(&b) {
                counts[b as usize] += 1;
            }
        }
        counts
    };
    let a = band(21, x);
    let b = band(22, x2);
    let worst_excess = |claimed_eps_per_m: f64| {
        a.iter()
            .zip(&b)
            .filter(|(p, q)| **p >= 200 && **q >= 200)
            .map(|(&p, &q)| {
                let (p, q) = (p as f64, q as f64);
                let sd = (1.0 / p + 1.0 / q).sqrt();
                let bound = claimed_eps_per_m * d;
                // Positive when a band's ratio (either way) passes the bound by more than 4.5 sd.
                ((p / q).ln().abs() - bound) / sd - 4.5
            })
            .fold(f64::NEG_INFINITY, f64::max)
    };
    let eps = m.epsilon_per_m();
    assert!(
        worst_excess(eps) <= 0.0,
        "ratio past e^(eps d): {}",
        worst_excess(eps)
    );
    assert!(
        worst_excess(eps / 2.0) > 0.0,
        "the audit cannot tell eps from eps/2"
    );
}

#[test]
fn reported_points_are_grid_points_inside_the_region() {
    let mut p = params();
    p.region = GeoBox {
        min_lat: 53.14,
        min_lon: 8.21,
        max_lat: 53.15,
        max_lon: 8.22,
    };
    let m = Mechanism::new(0.5 / 1000.0, &p).unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(3);
    let mut at_edge = 0;
    for _ in 0..2_000 {
        let r = m.draw(&mut rng, 53.145, 8.215);
        assert!(p.region.contains_point(r.lat, r.lon), "{r:?}");
        assert_eq!(
            m.snap(r.lat, r.lon),
            (r.lat, r.lon),
            "not a grid point: {r:?}"
        );
        if r.lat == m.snap(53.15, 8.215).0 {
            at_edge += 1;
        }
    }
    // At 0.5/km most draws leave a 1 km box: truncation put them on its edges.
    assert!(at_edge > 100, "{at_edge}");
    // Inputs outside the region or not finite are moved into it, never a panic.
    for (lat, lon) in [(0.0, 0.0), (f64::NAN, f64::INFINITY), (90.0, -180.0)] {
        let r = m.draw(&mut rng, lat, lon);
        assert!(p.region.contains_point(r.lat, r.lon));
    }
}

#[test]
fn correction_is_small_and_below_epsilon() {
    for eps_per_km in [0.5, 5.0, 50.0] {
        let eps = eps_per_km / 1000.0;
        let c = corrected_epsilon_per_m(eps, 1.0).unwrap();
        let g = guaranteed_epsilon_per_m(c, 1.0).unwrap();
        assert!(c < eps && g <= eps, "{eps_per_km}: {c} {g}");
        assert!(
            (eps - c) / eps < 0.01,
            "{eps_per_km}: correction {}",
            (eps - c) / eps
        );
    }
    assert!(corrected_epsilon_per_m(0.005, 1e-9).is_err());
    assert!(corrected_epsilon_per_m(-1.0, 1.0).is_err());
}

/// The area of retrieval holds the true position with at least the confidence: binomial check at
/// 4.5 sd below 0.95 (false alarm < 3.4e-6).
#[test]
fn retrieval_radius_holds_the_confidence() {
    let n = 20_000;
    let (m, out) = draws(5.0, n, 13);
    let radius = m.retrieval_radius_m();
    // 4.7439 / eps' + sqrt(2) m
    assert!(
        (radius - (4.7439 / m.corrected_epsilon_per_m() + 1.414)).abs() < 1.0,
        "{radius}"
    );
    // Distances from the true (unsnapped) position.
    let (x_lat, x_lon) = m.snap(OLDENBURG.0, OLDENBURG.1);
    let (dx, dy) = offset_m(OLDENBURG.0, OLDENBURG.1, x_lat, x_lon);
    let inside = out
        .iter()
        .filter(|(e, n)| (e + dx).hypot(n + dy) <= radius)
        .count() as f64;
    let sd = (0.95 * 0.05 / n as f64).sqrt();
    assert!(
        inside / n as f64 >= 0.95 - 4.5 * sd,
        "{}",
        inside / n as f64
    );
}
