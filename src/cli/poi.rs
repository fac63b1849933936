//! `cloakd poi generate`: a seeded synthetic POI file along a road network ([`crate::poi::generate`]),
//! from Brinkhoff's Oldenburg network files (`oldenburg_nodes.csv.gz`: `node_id,lat,lon,...`;
//! `oldenburg_edges.csv.gz`: `edge_id,from,to,class,...`) or any network in that format, read by
//! [`crate::data_files::roads`].
use std::path::PathBuf;

use anyhow::Context;

use crate::data_files::roads::read_roads;
use crate::poi::generate::generate;

#[derive(Debug, clap::Args)]
pub struct PoiArgs {
    #[command(subcommand)]
    pub command: PoiCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum PoiCommand {
    /// Write `--count` POIs (CSV `id,lat,lon,category,name`) along the roads of a network, seeded.
    Generate(GenerateArgs),
}

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// Nodes: CSV `node_id,lat,lon[,...]` with a header (optionally gzip'd).
    #[arg(long, value_name = "FILE")]
    pub nodes: PathBuf,
    /// Edges: CSV `edge_id,from,to,class[,...]` with a header (optionally gzip'd).
    #[arg(long, value_name = "FILE")]
    pub edges: PathBuf,
    /// How many POIs (at most 100,000,000).
    #[arg(long, default_value_t = 10_000)]
    pub count: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output CSV file.
    #[arg(long, value_name = "FILE")]
    pub output: PathBuf,
}

pub fn run(args: PoiArgs) -> anyhow::Result<()> {
    match args.command {
        PoiCommand::Generate(args) => run_generate(args),
    }
}

fn run_generate(args: GenerateArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.count <= 100_000_000,
        "--count: at most 100,000,000 POIs"
    );
    let roads = read_roads(&args.nodes, &args.edges)?;
    let pois = generate(&roads, args.count, args.seed).map_err(anyhow::Error::msg)?;
    let file = std::fs::File::create(&args.output)
        .with_context(|| format!("cannot create {}", args.output.display()))?;
    crate::poi::pois_csv::write_pois(std::io::BufWriter::new(file), &pois)
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!(
        "{} POIs along {} roads written to {}",
        pois.len(),
        roads.len(),
        args.output.display()
    );
    Ok(())
}
