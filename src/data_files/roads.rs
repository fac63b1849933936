//! Reading a road network: Brinkhoff's Oldenburg network files (`oldenburg_nodes.csv.gz`:
//! `node_id,lat,lon,...`; `oldenburg_edges.csv.gz`: `edge_id,from,to,class,...`) or any network in
//! that format, plain or gzip, through the bounded reader [`crate::lines`]; the roads
//! `cloakd poi generate` ([`crate::poi::generate`]), `benches/poi.rs` and `examples/poi_rows.rs`
//! place POIs along.
use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;

use crate::poi::generate::Road;

/// The roads of a network given as a nodes CSV (`node_id,lat,lon`) and an edges CSV
/// (`edge_id,from,to,class`), as in `../shared/data/mobility/` (gzip or plain); an error names the
/// file, the line and the field.
pub fn read_roads(nodes_file: &Path, edges_file: &Path) -> anyhow::Result<Vec<Road>> {
    let mut nodes: HashMap<u64, (f64, f64)> = HashMap::new();
    for (line, r) in rows(nodes_file, 3)? {
        let id = field(nodes_file, line, &r, 0, "node_id")?;
        let lat: f64 = field(nodes_file, line, &r, 1, "lat")?;
        let lon: f64 = field(nodes_file, line, &r, 2, "lon")?;
        anyhow::ensure!(
            lat.abs() <= 90.0 && lon.abs() <= 180.0,
            "{} line {line}: lat/lon out of range",
            nodes_file.display()
        );
        nodes.insert(id, (lat, lon));
    }
    let mut roads = Vec::new();
    for (line, r) in rows(edges_file, 4)? {
        let node = |i: usize, name: &str| -> anyhow::Result<(f64, f64)> {
            let id: u64 = field(edges_file, line, &r, i, name)?;
            nodes.get(&id).copied().ok_or_else(|| {
                anyhow::anyhow!("{} line {line}: {name}: no node {id}", edges_file.display())
            })
        };
        roads.push(Road {
            from: node(1, "from")?,
            to: node(2, "to")?,
            class: field(edges_file, line, &r, 3, "class")?,
        });
    }
    Ok(roads)
}

/// The rows of a CSV file after its header, each checked to have at least `columns` fields.
fn rows(path: &Path, columns: usize) -> anyhow::Result<Vec<(u64, csv::StringRecord)>> {
    let file = crate::data_files::open_maybe_gz(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    let bounded = crate::lines::BoundedLines::new(file, crate::lines::Records::Csv);
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(bounded);
    let mut out = Vec::new();
    for record in reader.records() {
        let record = record.with_context(|| path.display().to_string())?;
        let line = record.position().map_or(0, |p| p.line());
        anyhow::ensure!(
            record.len() >= columns,
            "{} line {line}: has {} fields, needs at least {columns}",
            path.display(),
            record.len()
        );
        out.push((line, record));
    }
    Ok(out)
}

fn field<T: std::str::FromStr>(
    path: &Path,
    line: u64,
    record: &csv::StringRecord,
    i: usize,
    name: &str,
) -> anyhow::Result<T> {
    record[i].trim().parse().map_err(|_| {
        anyhow::anyhow!(
            "{} line {line}: {name}: cannot parse {}",
            path.display(),
            crate::text::quote(&record[i])
        )
    })
}
