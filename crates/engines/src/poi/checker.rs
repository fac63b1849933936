//! The independent brute-force checker of the candidate lists: for random POI sets, boxes and queries,
//! every sampled point of the box (a dense grid, the corners, random points) gets its exact answer
//! from all POIs by haversine distance and id (no R-tree, no unit vectors), which must lie in the
//! candidate list and equal the client's refinement of it (inclusive, 100 %); every candidate's witness
//! must lie in the box and its exact answer must hold the candidate (minimal).
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::sphere::{SphBox, haversine_m};
use super::{Limits, Poi, PoiIndex, Query, query_box, refine};

/// The exact answer of a point by brute force: ids, nearest first.
pub(super) fn brute_force(
    pois: &[Poi],
    category: &str,
    lat: f64,
    lon: f64,
    query: &Query,
) -> Vec<String> {
    let mut all: Vec<(f64, &str)> = pois
        .iter()
        .filter(|p| p.category == category)
        .map(|p| (haversine_m(lat, lon, p.lat, p.lon), p.id.as_str()))
        .collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)));
    match *query {
        Query::Nearest { count } => all.truncate(count as usize),
        Query::Range { radius_m } => all.retain(|a| a.0 <= radius_m),
    }
    all.into_iter().map(|a| a.1.to_string()).collect()
}

/// Random POIs in clusters around (53.14, 8.21), some sharing coordinates, three categories.
pub(super) fn random_pois(rng: &mut ChaCha8Rng, count: usize) -> Vec<Poi> {
    let mut pois: Vec<Poi> = Vec::with_capacity(count);
    let spread = [0.002, 0.01, 0.03][rng.random_range(0..3)];
    for i in 0..count {
        let (lat, lon) = if i > 0 && rng.random_bool(0.03) {
            let twin = &pois[rng.random_range(0..pois.len())];
            (twin.lat, twin.lon)
        } else {
            (
                53.14 + rng.random_range(-spread..spread),
                8.21 + rng.random_range(-spread..spread) * 1.6,
            )
        };
        pois.push(Poi {
            id: format!("{:04}", rng.random_range(0..100_000)),
            lat,
            lon,
            category: ["cafe", "bank", "fuel"][rng.random_range(0..3)].to_string(),
            name: String::new(),
        });
    }
    pois
}

fn random_box(rng: &mut ChaCha8Rng) -> (f64, f64, f64, f64) {
    let w_m = 10f64.powf(rng.random_range(0.5..3.5));
    let h_m = 10f64.powf(rng.random_range(0.5..3.5));
    let dlat = h_m / super::sphere::EARTH_RADIUS_M.to_radians();
    let dlon = w_m / (super::sphere::EARTH_RADIUS_M.to_radians() * 53.14f64.to_radians().cos());
    let lat0 = 53.14 + rng.random_range(-0.02..0.02);
    let lon0 = 8.21 + rng.random_range(-0.03..0.03);
    (lat0, lon0, lat0 + dlat, lon0 + dlon)
}

fn sample_points(rng: &mut ChaCha8Rng, b: (f64, f64, f64, f64)) -> Vec<(f64, f64)> {
    let (lat0, lon0, lat1, lon1) = b;
    let mut points = Vec::new();
    let steps = 24;
    for i in 0..=steps {
        for j in 0..=steps {
            let fi = f64::from(i) / f64::from(steps);
            let fj = f64::from(j) / f64::from(steps);
            points.push((lat0 + fi * (lat1 - lat0), lon0 + fj * (lon1 - lon0)));
        }
    }
    for _ in 0..200 {
        points.push((rng.random_range(lat0..=lat1), rng.random_range(lon0..=lon1)));
    }
    points
}

#[derive(Default, Debug)]
struct Tally {
    lists: usize,
    points: usize,
    candidates: usize,
    undecided: usize,
}

fn check(seed: u64, queries: &[Query]) -> Tally {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tally = Tally::default();
    for _ in 0..6 {
        let count = rng.random_range(20..400);
        let pois = random_pois(&mut rng, count);
        let index = PoiIndex::new(pois.clone());
        for _ in 0..8 {
            let bounds = random_box(&mut rng);
            let b: SphBox =
                query_box(bounds.0, bounds.1, bounds.2, bounds.3, &Limits::default()).unwrap();
            let points = sample_points(&mut rng, bounds);
            for query in queries {
                let category = ["cafe", "bank", "fuel", "none"][rng.random_range(0..4)];
                let list = index
                    .candidates(category, query, &b, &Limits::default())
                    .unwrap();
                let listed: Vec<Poi> = list.pois.iter().map(|&i| index.poi(i).clone()).collect();
                tally.lists += 1;
                tally.candidates += listed.len();
                tally.undecided += list.undecided;
                // Inclusive: every sampled point's exact answer is in the list, and refining the
                // list gives exactly that answer.
                for &(lat, lon) in &points {
                    let exact = brute_force(&pois, category, lat, lon, query);
                    let refined: Vec<String> = refine(&listed, lat, lon, query)
                        .into_iter()
                        .map(|p| p.id)
                        .collect();
                    assert_eq!(
                        refined, exact,
                        "seed {seed} {query:?} {category} box {bounds:?} point ({lat}, {lon})"
                    );
                    tally.points += 1;
                }
                // Minimal: each candidate is in the exact answer of its witness, a point of the box.
                for (poi, witness) in listed.iter().zip(&list.witnesses) {
                    let Some((lat, lon)) = *witness else { continue };
                    let eps = 1e-9;
                    assert!(
                        bounds.0 - eps <= lat
                            && lat <= bounds.2 + eps
                            && bounds.1 - eps <= lon
                            && lon <= bounds.3 + eps,
                        "witness outside the box"
                    );
                    let exact = match *query {
                        Query::Range { radius_m } => {
                            let d = haversine_m(lat, lon, poi.lat, poi.lon);
                            assert!(d <= radius_m + 1e-5, "{poi:?} at {d} m > {radius_m}");
                            continue;
                        }
                        Query::Nearest { .. } => brute_force(&pois, category, lat, lon, query),
                    };
                    assert!(
                        exact.contains(&poi.id),
                        "seed {seed} {query:?}: {poi:?} is not among the nearest of its witness"
                    );
                }
            }
        }
    }
    tally
}

#[test]
fn nearest_lists_are_inclusive_and_minimal() {
    let queries = [1, 2, 3, 5].map(|count| Query::Nearest { count });
    for seed in 0..4 {
        let tally = check(seed, &queries);
        assert!(tally.candidates > 0 && tally.points > 0);
        // Ties finer than TIE_RAD do not occur in random data: every candidate has a witness.
        assert_eq!(tally.undecided, 0, "{tally:?}");
    }
}

#[test]
fn range_lists_are_inclusive_and_minimal() {
    let queries = [20.0, 300.0, 1500.0].map(|radius_m| Query::Range { radius_m });
    for seed in 10..14 {
        let tally = check(seed, &queries);
        assert!(tally.candidates > 0, "{tally:?}");
        assert_eq!(tally.undecided, 0, "{tally:?}");
    }
}

/// Nearest 1 alone (the walk of `candidates/walk.rs`) on more random sets than the test above.
#[test]
fn nearest_one_lists_are_inclusive_and_minimal() {
    let queries = [Query::Nearest { count: 1 }];
    for seed in 20..32 {
        let tally = check(seed, &queries);
        assert!(tally.candidates > 0 && tally.points > 0);
        assert_eq!(tally.undecided, 0, "{tally:?}");
    }
}
