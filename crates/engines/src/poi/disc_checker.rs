//! The brute-force checker of the disc candidate lists ([`super::PoiIndex::disc_candidates`]): for
//! random POI sets, discs and queries, sampled points of the disc (its centre, points of its circle,
//! random points inside) get their exact answer from all POIs by haversine distance and id (the
//! checker of `checker.rs`), which must equal the client's refinement of the list (inclusive, 100 %);
//! every witness must lie in the disc and its exact answer hold the candidate (minimal); and the list
//! is never longer than the list of the disc's bounding box, and shorter in total.
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::checker::{brute_force, random_pois};
use super::sphere::{EARTH_RADIUS_M, haversine_m};
use super::{Limits, Poi, PoiIndex, Query, query_box, query_disc, refine};

/// The point (degrees) at `metres` from (lat, lon) on the bearing `bearing` (radians from north).
fn destination(lat: f64, lon: f64, metres: f64, bearing: f64) -> (f64, f64) {
    let (phi, lambda) = (lat.to_radians(), lon.to_radians());
    let a = metres / EARTH_RADIUS_M;
    let phi2 = (phi.sin() * a.cos() + phi.cos() * a.sin() * bearing.cos()).asin();
    let lambda2 =
        lambda + (bearing.sin() * a.sin() * phi.cos()).atan2(a.cos() - phi.sin() * phi2.sin());
    (phi2.to_degrees(), lambda2.to_degrees())
}

fn sample_points(rng: &mut ChaCha8Rng, lat: f64, lon: f64, radius_m: f64) -> Vec<(f64, f64)> {
    let mut points = vec![(lat, lon)];
    for i in 0..96 {
        let bearing = std::f64::consts::TAU * f64::from(i) / 96.0;
        points.push(destination(lat, lon, radius_m * (1.0 - 1e-9), bearing));
    }
    for _ in 0..300 {
        let r = radius_m * rng.random::<f64>().sqrt();
        points.push(destination(
            lat,
            lon,
            r,
            rng.random_range(0.0..std::f64::consts::TAU),
        ));
    }
    points
}

#[derive(Default, Debug)]
struct Tally {
    lists: usize,
    points: usize,
    candidates: usize,
    box_candidates: usize,
    undecided: usize,
}

fn check(seed: u64, queries: &[Query]) -> Tally {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tally = Tally::default();
    let limits = Limits::default();
    for _ in 0..6 {
        let count = rng.random_range(20..400);
        let pois = random_pois(&mut rng, count);
        let index = PoiIndex::new(pois.clone());
        for _ in 0..8 {
            let radius_m = 10f64.powf(rng.random_range(0.5..3.3));
            let lat = 53.14 + rng.random_range(-0.02..0.02);
            let lon = 8.21 + rng.random_range(-0.03..0.03);
            let disc = query_disc(lat, lon, radius_m, &limits).unwrap();
            let (b0, b1, b2, b3) = disc.bounding_box();
            let b = query_box(b0, b1, b2, b3, &limits).unwrap();
            let points = sample_points(&mut rng, lat, lon, radius_m);
            for query in queries {
                let category = ["cafe", "bank", "fuel", "none"][rng.random_range(0..4)];
                let list = index
                    .disc_candidates(category, query, &disc, &limits)
                    .unwrap();
                let boxed = index.candidates(category, query, &b, &limits).unwrap();
                assert!(
                    list.pois.iter().all(|p| boxed.pois.contains(p)),
                    "seed {seed} {query:?}: a disc candidate outside the bounding box's list"
                );
                let listed: Vec<Poi> = list.pois.iter().map(|&i| index.poi(i).clone()).collect();
                tally.lists += 1;
                tally.candidates += listed.len();
                tally.box_candidates += boxed.pois.len();
                tally.undecided += list.undecided;
                for &(plat, plon) in &points {
                    let exact = brute_force(&pois, category, plat, plon, query);
                    let refined: Vec<String> = refine(&listed, plat, plon, query)
                        .into_iter()
                        .map(|p| p.id)
                        .collect();
                    assert_eq!(
                        refined, exact,
                        "seed {seed} {query:?} {category} disc ({lat}, {lon}, {radius_m}) point ({plat}, {plon})"
                    );
                    tally.points += 1;
                }
                for (poi, witness) in listed.iter().zip(&list.witnesses) {
                    let Some((wlat, wlon)) = *witness else {
                        continue;
                    };
                    let off = haversine_m(lat, lon, wlat, wlon);
                    assert!(
                        off <= radius_m * (1.0 + 1e-9) + 1e-6,
                        "witness {off} m from the centre of a {radius_m} m disc"
                    );
                    match *query {
                        Query::Range { radius_m: r } => {
                            let d = haversine_m(wlat, wlon, poi.lat, poi.lon);
                            assert!(d <= r + 1e-5, "{poi:?} at {d} m > {r}");
                        }
                        Query::Nearest { .. } => {
                            let exact = brute_force(&pois, category, wlat, wlon, query);
                            assert!(
                                exact.contains(&poi.id),
                                "seed {seed} {query:?}: {poi:?} is not among the nearest of its witness"
                            );
                        }
                    }
                }
            }
        }
    }
    tally
}

#[test]
fn disc_nearest_lists_are_inclusive_minimal_and_tighter_than_the_box() {
    let queries = [1, 2, 3, 5].map(|count| Query::Nearest { count });
    for seed in 0..4 {
        let tally = check(seed, &queries);
        assert!(tally.candidates > 0 && tally.points > 0, "{tally:?}");
        // Unlike the box lists' boundary search, the disc's branch and bound over the plane may run
        // out of squares on a thin sliver and keep a POI undecided (inclusive, without a witness):
        // seen once in 1,100 candidates with a budget of 4,096 squares.
        assert!(100 * tally.undecided <= tally.candidates, "{tally:?}");
        assert!(tally.candidates < tally.box_candidates, "{tally:?}");
    }
}

#[test]
fn disc_range_lists_are_inclusive_minimal_and_tighter_than_the_box() {
    let queries = [20.0, 300.0, 1500.0].map(|radius_m| Query::Range { radius_m });
    for seed in 10..14 {
        let tally = check(seed, &queries);
        assert!(tally.candidates > 0, "{tally:?}");
        assert_eq!(tally.undecided, 0, "{tally:?}");
        assert!(tally.candidates < tally.box_candidates, "{tally:?}");
    }
}

#[test]
fn discs_out_of_bounds_are_refused_naming_the_field() {
    let limits = Limits::default();
    let err = query_disc(53.0, 8.0, f64::NAN, &limits).unwrap_err();
    assert_eq!(err.field, "retrieval_radius_m");
    let err = query_disc(53.0, 8.0, limits.max_box_m, &limits).unwrap_err();
    assert_eq!(err.field, "retrieval_radius_m");
    let err = query_disc(91.0, 8.0, 10.0, &limits).unwrap_err();
    assert_eq!(err.field, "reported.lat");
    let err = query_disc(53.0, f64::INFINITY, 10.0, &limits).unwrap_err();
    assert_eq!(err.field, "reported.lon");
    assert!(query_disc(53.0, 8.0, 0.0, &limits).is_ok());
}
