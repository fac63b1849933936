//! Times rows of `benches/poi.rs` on the 1,000,000-POI set (thread CPU time) and prints a digest of
//! every candidate list (ids, order, witnesses, undecided and examined counts), so two builds can be compared side by
//! side: `cargo run --release --example poi_rows -- [BOXES] [ROW...]`, rows like `hotel/n1`,
//! `cafe/n5`, `restaurant/r300` (default: the nine rows of the bench's 500 m table);
//! `POI_ROWS_TOLERANCE=log-uniform` takes the bench's log-uniform boxes, `POI_ROWS_SET=country` the
//! bench's 100 towns of 10,000 POIs instead of 1,000,000 in one town, `POI_ROWS_REPEAT` repeats
//! each row (for a profiler).
use std::hash::{Hash, Hasher};
use std::path::Path;

#[path = "../benches/common/poi_boxes.rs"]
mod poi_boxes;
#[path = "../benches/common/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::thread_cpu_s;

use cloakd::data_files::roads::read_roads;
use cloakd::poi::generate::generate;
use cloakd::poi::{Limits, PoiIndex, Query};
use poi_boxes::{Tolerance, boxes, country};

fn main() {
    let mut args = std::env::args().skip(1);
    let count: usize = args.next().map(|a| a.parse().unwrap()).unwrap_or(2_000);
    let mut rows: Vec<String> = args.collect();
    if rows.is_empty() {
        for c in ["hotel", "cafe", "restaurant"] {
            for q in ["n1", "n5", "r300"] {
                rows.push(format!("{c}/{q}"));
            }
        }
    }
    let dir = std::env::var_os("CLOAKD_BENCH_MOBILITY")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/mobility"));
    let roads = read_roads(
        &dir.join("oldenburg_nodes.csv.gz"),
        &dir.join("oldenburg_edges.csv.gz"),
    )
    .unwrap();
    let t = thread_cpu_s();
    let (pois, towns) = match std::env::var("POI_ROWS_SET").as_deref() {
        Ok("country") => country(&roads, 100, 10_000),
        _ => (generate(&roads, 1_000_000, 1).unwrap(), vec![(0.0, 0.0)]),
    };
    let city = PoiIndex::new(pois);
    eprintln!("built in {:.2} s", thread_cpu_s() - t);
    let tolerance = match std::env::var("POI_ROWS_TOLERANCE").as_deref() {
        Ok("log-uniform") => Tolerance::LogUniform,
        _ => Tolerance::Fixed(500.0),
    };
    let boxes = boxes(tolerance, count, 2, &towns);
    let limits = Limits::default();
    let repeat: usize = std::env::var("POI_ROWS_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    for row in rows {
        let (category, q) = row.split_once('/').unwrap();
        let query = match q {
            "n1" => Query::Nearest { count: 1 },
            "n5" => Query::Nearest { count: 5 },
            "r300" => Query::Range { radius_m: 300.0 },
            _ => panic!("row {row}"),
        };
        let mut digest = std::collections::hash_map::DefaultHasher::new();
        let (mut sizes, mut refused) = (0usize, 0usize);
        let start = thread_cpu_s();
        for _ in 0..repeat {
            for b in &boxes {
                match city.candidates(category, &query, b, &limits) {
                    Ok(list) => {
                        sizes += list.pois.len();
                        for (p, w) in list.pois.iter().zip(&list.witnesses) {
                            city.poi(*p).id.hash(&mut digest);
                            w.map(|(a, b)| (a.to_bits(), b.to_bits())).hash(&mut digest);
                        }
                        (list.undecided, list.examined).hash(&mut digest);
                    }
                    Err(_) => refused += 1,
                }
            }
        }
        let seconds = thread_cpu_s() - start;
        println!(
            "{row}: {:.0} answers/s, {} candidates, {refused} refused, digest {:016x}",
            (count * repeat) as f64 / seconds,
            sizes,
            digest.finish()
        );
    }
}
