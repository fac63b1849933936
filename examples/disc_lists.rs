//! Times exact candidate lists of GEO_IND areas of retrieval (discs) against a POI file: discs of a
//! given radius centred on the first positions of a trace, one query, the best of a few rounds.
//!
//!   cargo run --release --example disc_lists -- POIS.csv TRACE.csv.gz RADIUS_M [QUERY] [DISCS]
//!   (QUERY as `simulate --poi-query`, default nearest:cafe:1; DISCS default 200)
use std::path::Path;
use std::time::Instant;

use cloakd::poi::pois_csv::{TableLimits, read_pois};
use cloakd::poi::{Limits, PoiIndex, Query, query_disc};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [pois, trace, radius, rest @ ..] = args.as_slice() else {
        anyhow::bail!("usage: disc_lists POIS.csv TRACE.csv.gz RADIUS_M [QUERY] [DISCS]");
    };
    let radius_m: f64 = radius.parse()?;
    let spec = rest.first().map_or("nearest:cafe:1", String::as_str);
    let discs: usize = rest.get(1).map_or(Ok(200), |s| s.parse())?;
    let mut parts = spec.split(':');
    let (kind, category, arg) = (
        parts.next().unwrap_or(""),
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("1"),
    );
    let query = match kind {
        "nearest" => Query::Nearest {
            count: arg.parse()?,
        },
        "range" => Query::Range {
            radius_m: arg.parse()?,
        },
        other => anyhow::bail!("query kind {other:?}: nearest or range"),
    };
    let index = PoiIndex::new(read_pois(
        std::fs::File::open(pois)?,
        &TableLimits::default(),
    )?);
    let points = cloakd::data_files::read_trace_file(Path::new(trace), Some(discs))?;
    let limits = Limits::default();
    let discs: Vec<_> = points
        .iter()
        .map(|p| query_disc(p.lat, p.lon, radius_m, &limits))
        .collect::<Result<_, _>>()?;
    let mut best = f64::INFINITY;
    let mut sizes = Vec::new();
    for _ in 0..3 {
        sizes.clear();
        let start = Instant::now();
        for disc in &discs {
            let list = index.disc_candidates(&category, &query, disc, &limits);
            sizes.push(list.map_or(0, |l| l.pois.len()));
        }
        best = best.min(start.elapsed().as_secs_f64());
    }
    sizes.sort_unstable();
    println!(
        "{} discs of {radius_m} m, {spec}: {:.3} ms per list (best of 3), candidates p50 {} / max {}",
        discs.len(),
        1e3 * best / discs.len() as f64,
        sizes[sizes.len() / 2],
        sizes.last().copied().unwrap_or(0)
    );
    Ok(())
}
