//! What sharding location cloaking by grid cell costs, at engine level: the Oldenburg trace replayed
//! as location requests (k uniform in [2, 10], dx = dy = 500 m, dt = 10 s, as the engine benchmark)
//! through one CliqueCloak engine per owner, each request going to the owner of its cell
//! ([`cloakd::location::cells::replay_sharded`]; cells spread over owners pseudo-randomly, so
//! neighbouring cells usually have different owners). One owner is exactly a single node.
//!
//! ```sh
//! cargo run --release --example location_sharding -- ../shared/data/mobility/oldenburg_10k.csv.gz 300000
//! ```
//! Arguments: the trace (CSV or .csv.gz, `user_id,timestamp,lat,lon`), how many rows to replay
//! (default 300000), and optionally cell sizes in metres (default 2000,5000,10000).
use cloakd::location::SearchMode;
use cloakd::location::cells::{CellGrid, replay_sharded};
use cloakd::location::replay::{ReplayParams, requests_from_trace};

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or_else(|| "../shared/data/mobility/oldenburg_10k.csv.gz".to_string());
    let limit: usize = args.next().map_or(Ok(300_000), |s| s.parse())?;
    let sizes: Vec<f64> = args
        .next()
        .unwrap_or_else(|| "2000,5000,10000".to_string())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let points = cloakd::data_files::read_trace_file(std::path::Path::new(&path), Some(limit))?;
    let requests = requests_from_trace(&points, &ReplayParams::OLDENBURG);
    println!("{} requests from {path}", requests.len());
    println!(
        "| cell size | owners | cells | success rate | relative anonymity | relative spatial resolution |"
    );
    println!("|---|---|---|---|---|---|");
    for size in sizes {
        let grid = CellGrid::new(size);
        let cells: std::collections::HashSet<_> = requests
            .iter()
            .map(|r| grid.cell_of(r.lat, r.lon))
            .collect();
        for owners in [1, 2, 4] {
            let q = replay_sharded(&requests, grid, owners, SearchMode::NbrK, 7);
            let label = if owners == 1 {
                "1 (single node)".to_string()
            } else {
                owners.to_string()
            };
            println!(
                "| {size} m | {label} | {} | {:.4} | {:.3} | {:.3} |",
                cells.len(),
                q.success_rate(),
                q.mean_relative_anonymity(),
                q.mean_relative_spatial_resolution()
            );
        }
    }
    Ok(())
}
