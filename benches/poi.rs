//! The reference POI provider's engine (`cloakd::poi`) alone, on one thread: candidate-list sizes
//! against the naive superset, and answers per second.
//!
//! `cargo bench --bench poi` (release). POIs: `cloakd::poi::generate` along Brinkhoff's Oldenburg road
//! network (`../shared/data/mobility/oldenburg_{nodes,edges}.csv.gz`, relative to the repository; the
//! bench stops with a message when they are absent), 10,000 POIs (about a real town's count) for the
//! sizes, 1,000,000 for the speed, twice: along the one town's roads (a hundred times a town's
//! density), and as a "country" of 100 towns of 10,000 POIs each, copies of the network side by
//! side with POIs of their own seeds (a town's density; `poi_boxes::country`). Boxes: centred near
//! positions of the in-repo Oldenburg trace slice (`tests/data/oldenburg_60s.csv.gz`; in the
//! country, box i is moved into town i mod 100); for a tolerance d per axis (500 m, or dx and dy
//! each drawn log-uniform in [20 m, 20 km], seeded) each side is uniform in [d, 2d] (a cloaking box
//! lies in every member's constraint box, whose side is 2d) with the point uniformly inside it.
//! Category `cafe` (6 % of the POIs) unless named. Times are the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), so other load
//! on a shared machine slows the wall clock more than these figures.
//!
//! Environment: `CLOAKD_BENCH_MOBILITY` the directory of the road network (for a git worktree whose
//! `../shared` is elsewhere); `CLOAKD_POI_BENCH_SIZE_BOXES` (2,000) and `CLOAKD_POI_BENCH_BOXES`
//! (20,000) the boxes per row of the size and speed tables (the first boxes of the same seeded
//! sequence, so a smaller count measures a prefix of the same boxes). Each speed row is timed after an
//! untimed pass over its first 2,000 boxes (a provider runs warm); the 1,000,000-POI indexes' build
//! times are printed too.
use std::path::Path;

#[path = "common/poi_boxes.rs"]
mod poi_boxes;
#[path = "common/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::thread_cpu_s;

use cloakd::data_files::roads::read_roads;
use cloakd::poi::generate::{Road, generate};
use cloakd::poi::{Limits, PoiIndex, Query};
use poi_boxes::{Tolerance, boxes, country};

/// Where the road network is: `CLOAKD_BENCH_MOBILITY` (a directory), else `../shared/data/mobility`
/// beside the repository (a git worktree elsewhere names it with the variable).
fn mobility_dir() -> std::path::PathBuf {
    match std::env::var_os("CLOAKD_BENCH_MOBILITY") {
        Some(dir) => dir.into(),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/mobility"),
    }
}

/// A count from the environment (`name`), else `default`.
fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn roads() -> Option<Vec<Road>> {
    let dir = mobility_dir();
    let nodes_file = dir.join("oldenburg_nodes.csv.gz");
    if !nodes_file.exists() {
        return None;
    }
    Some(read_roads(&nodes_file, &dir.join("oldenburg_edges.csv.gz")).unwrap())
}

fn percentile(v: &mut [usize], q: f64) -> usize {
    v.sort_unstable();
    v.get(((v.len() as f64 - 1.0) * q).round() as usize)
        .copied()
        .unwrap_or(0)
}

/// Boxes answered untimed before each row of the speed tables.
const WARM_UP_BOXES: usize = 2_000;

fn main() {
    let Some(roads) = roads() else {
        eprintln!(
            "../shared/data/mobility/oldenburg_{{nodes,edges}}.csv.gz not found: nothing measured"
        );
        return;
    };
    let size_boxes = env_count("CLOAKD_POI_BENCH_SIZE_BOXES", 2_000);
    let unlimited = Limits {
        max_candidates: usize::MAX / 16,
        ..Limits::default()
    };
    let town = PoiIndex::new(generate(&roads, 10_000, 1).unwrap());
    println!("candidate-list sizes, 10,000 POIs, category cafe, {size_boxes} boxes per row");
    println!(
        "| tolerance | query | candidates median | p95 | naive superset median | p95 | R-tree superset median | undecided |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, tolerance) in [
        ("500 m", Tolerance::Fixed(500.0)),
        ("log-uniform [20 m, 20 km]", Tolerance::LogUniform),
    ] {
        let boxes = boxes(tolerance, size_boxes, 1, &[(0.0, 0.0)]);
        for query in [
            Query::Nearest { count: 1 },
            Query::Nearest { count: 5 },
            Query::Range { radius_m: 300.0 },
        ] {
            let (mut sizes, mut naive, mut examined, mut undecided) = (vec![], vec![], vec![], 0);
            for b in &boxes {
                let list = town.candidates("cafe", &query, b, &unlimited).unwrap();
                sizes.push(list.pois.len());
                examined.push(list.examined);
                undecided += list.undecided;
                naive.push(town.naive_superset_len("cafe", &query, b));
            }
            println!(
                "| {name} | {query:?} | {} | {} | {} | {} | {} | {undecided} |",
                percentile(&mut sizes, 0.5),
                percentile(&mut sizes, 0.95),
                percentile(&mut naive, 0.5),
                percentile(&mut naive, 0.95),
                percentile(&mut examined, 0.5),
            );
        }
    }

    // The 1,000,000 POIs two ways: all along the one town's roads (100 times a town's
    // density: a 500 m box's nearest-hotel list holds about 170 POIs), and as a country of 100 towns
    // of 10,000 POIs each, side by side (a town's density, as the size table above).
    let speed_boxes = env_count("CLOAKD_POI_BENCH_BOXES", 20_000);
    let city = built(
        "1,000,000 POIs in one town",
        generate(&roads, 1_000_000, 1).unwrap(),
    );
    speed_tables(
        &city,
        "1,000,000 POIs in one town",
        &[(0.0, 0.0)],
        speed_boxes,
    );
    drop(city);
    let (pois, towns) = country(&roads, 100, 10_000);
    let country = built("1,000,000 POIs as 100 towns", pois);
    speed_tables(
        &country,
        "1,000,000 POIs as 100 towns of 10,000 (box i in town i mod 100)",
        &towns,
        speed_boxes,
    );
}

/// The provider's index of `pois` (what `cloakd provider` builds at start and on every reload),
/// with the thread CPU time the build took printed.
fn built(set: &str, pois: Vec<cloakd::poi::Poi>) -> PoiIndex {
    let count = pois.len();
    let start = thread_cpu_s();
    let index = PoiIndex::new(pois);
    let seconds = thread_cpu_s() - start;
    println!(
        "\nindex of {set} built in {seconds:.2} s of thread CPU ({:.0} POIs/s)",
        count as f64 / seconds
    );
    index
}

/// The answers/s tables of one POI set: both tolerances, three categories, three queries.
fn speed_tables(index: &PoiIndex, set: &str, towns: &[(f64, f64)], speed_boxes: usize) {
    let limits = Limits::default();
    let counts: std::collections::HashMap<&str, usize> = index.categories().into_iter().collect();
    for (name, tolerance) in [
        ("500 m", Tolerance::Fixed(500.0)),
        ("log-uniform [20 m, 20 km]", Tolerance::LogUniform),
    ] {
        println!("\nanswers per CPU-second of one thread, {set}, {name}, {speed_boxes} boxes");
        println!("| category (POIs) | query | answers/s | candidates median | refused |");
        println!("|---|---|---|---|---|");
        let boxes = boxes(tolerance, speed_boxes, 2, towns);
        for category in ["hotel", "cafe", "restaurant"] {
            for query in [
                Query::Nearest { count: 1 },
                Query::Nearest { count: 5 },
                Query::Range { radius_m: 300.0 },
            ] {
                // A provider answers for hours: the row is timed warm, after an untimed pass over
                // its first boxes (the walk's per-thread buffers grown, the category's nodes in
                // cache), not from a cold start.
                for b in boxes.iter().take(WARM_UP_BOXES) {
                    let _ = std::hint::black_box(index.candidates(category, &query, b, &limits));
                }
                let mut sizes = Vec::with_capacity(boxes.len());
                let mut refused = 0;
                let start = thread_cpu_s();
                for b in &boxes {
                    match index.candidates(category, &query, b, &limits) {
                        Ok(list) => sizes.push(std::hint::black_box(list).pois.len()),
                        Err(_) => refused += 1,
                    }
                }
                let seconds = thread_cpu_s() - start;
                println!(
                    "| {category} ({}) | {query:?} | {:.0} | {} | {refused} |",
                    counts[category],
                    boxes.len() as f64 / seconds,
                    percentile(&mut sizes, 0.5),
                );
            }
        }
    }
}
