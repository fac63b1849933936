//! The grid of location cells by which cloaking is sharded across replicas, and an engine-level
//! simulation of what sharding costs.
//!
//! A cell is a band of `cell_size_m` metres of latitude (row) cut into pieces `cell_size_m` metres
//! wide along the band's centre latitude (column). Every point lies in exactly one cell: its row is
//! `floor(lat · METRES_PER_DEGREE_LAT / size)`, its column `floor(lon · METRES_PER_DEGREE_LAT ·
//! cos(centre latitude of the row) / size)`. The function is pure, so every replica maps a request to
//! the same cell.
//!
//! Border rule: a request belongs to the cell of its own position, and is cloaked by the engine of
//! that cell's owner. Every replica runs one engine for all the cells it owns, so requests of two
//! neighbouring cells that one replica owns still meet; two requests whose cells have different
//! owners cannot be grouped (each engine sees only its own), although their constraint boxes may
//! overlap across the border. That is the whole cost of sharding; the engine's invariants (every
//! member's point in the cloaking box, the cloaking box inside every member's constraint box) are
//! untouched. [`replay_sharded`] measures it.
use std::collections::HashMap;

use super::geo::METRES_PER_DEGREE_LAT;
use super::replay::CloakingQuality;
use super::{CloakRequest, Engine, Outcome, SearchMode};

/// One cell of the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cell {
    pub row: i64,
    pub col: i64,
}

impl Cell {
    /// The cell's name as a NATS subject token pair and key-value key suffix: `<row>.<col>`.
    pub fn key(&self) -> String {
        format!("{}.{}", self.row, self.col)
    }
}

/// The grid of square cells of a given side.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CellGrid {
    cell_size_m: f64,
}

impl CellGrid {
    /// `cell_size_m` must be finite and positive (the configuration checks it).
    pub fn new(cell_size_m: f64) -> CellGrid {
        CellGrid { cell_size_m }
    }

    pub fn cell_size_m(&self) -> f64 {
        self.cell_size_m
    }

    /// The cell holding a position (WGS84 degrees).
    pub fn cell_of(&self, lat: f64, lon: f64) -> Cell {
        let size = self.cell_size_m;
        let row = (lat * METRES_PER_DEGREE_LAT / size).floor();
        let centre_lat = (row + 0.5) * size / METRES_PER_DEGREE_LAT;
        let cos = centre_lat.to_radians().cos().max(1e-6);
        let col = (lon * METRES_PER_DEGREE_LAT * cos / size).floor();
        Cell {
            row: row as i64,
            col: col as i64,
        }
    }
}

/// Assigns cells to `owners` replicas the way leases end up spread over time: a fixed pseudo-random
/// owner per cell (so neighbouring cells usually have different owners, the unfavourable case).
pub fn simulated_owner(cell: Cell, owners: usize) -> usize {
    let mut h = (cell.row as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (cell.col as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    h ^= h >> 31;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 29;
    (h % owners.max(1) as u64) as usize
}

/// Replays `requests` (in arrival order) through one CliqueCloak engine per owner, each request
/// going to the owner of its cell, and measures the cloaking quality over all of them. With one
/// owner this is exactly a single engine.
pub fn replay_sharded(
    requests: &[CloakRequest],
    grid: CellGrid,
    owners: usize,
    mode: SearchMode,
    seed: u64,
) -> CloakingQuality {
    let owners = owners.max(1);
    let mut engines: Vec<Engine> = (0..owners)
        .map(|i| Engine::new(mode, seed.wrapping_add(i as u64)))
        .collect();
    let mut owner_of: HashMap<Cell, usize> = HashMap::new();
    let mut out: Vec<Outcome> = Vec::new();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for req in requests {
        let cell = grid.cell_of(req.lat, req.lon);
        let owner = *owner_of
            .entry(cell)
            .or_insert_with(|| simulated_owner(cell, owners));
        // Every engine sees time pass, so expiries happen at the same moments as in one engine.
        for (i, engine) in engines.iter_mut().enumerate() {
            if i != owner {
                engine.expire(req.arrival_ms, &mut out);
            }
        }
        let _ = engines[owner].submit(req.clone(), &mut out);
        outcomes.append(&mut out);
    }
    for engine in &mut engines {
        engine.expire(i64::MAX, &mut out);
        outcomes.append(&mut out);
    }
    let mut quality = CloakingQuality::default();
    quality.add(&outcomes, |id| {
        usize::try_from(id)
            .ok()
            .and_then(|i| requests.get(i))
            .cloned()
    });
    quality
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_point_lies_in_its_cell_and_cells_have_the_asked_size() {
        let grid = CellGrid::new(2000.0);
        let a = grid.cell_of(53.1400, 8.2100);
        let b = grid.cell_of(53.1401, 8.2101);
        assert_eq!(a, b, "points 15 m apart away from a border share a cell");
        // 2 km north is the next row; 2 km east the next column.
        let north = grid.cell_of(53.1400 + 2000.0 / METRES_PER_DEGREE_LAT, 8.2100);
        assert_eq!(north.row, a.row + 1);
        let east = grid.cell_of(
            53.1400,
            8.2100 + 2000.0 / (METRES_PER_DEGREE_LAT * 53.1400_f64.to_radians().cos()),
        );
        assert!((east.col - a.col - 1).abs() <= 1, "{east:?} vs {a:?}");
        assert_eq!(grid.cell_of(-33.9, -70.6).key(), {
            let c = grid.cell_of(-33.9, -70.6);
            format!("{}.{}", c.row, c.col)
        });
        assert!(grid.cell_of(-33.9, -70.6).row < 0);
    }

    #[test]
    fn one_owner_is_a_single_engine() {
        let requests: Vec<CloakRequest> = (0..200)
            .map(|i| CloakRequest {
                id: i,
                user: i % 37,
                lat: 53.14 + (i % 13) as f64 * 0.004,
                lon: 8.21 + (i % 7) as f64 * 0.006,
                k: 2 + (i % 4) as u32,
                dx_m: 500.0,
                dy_m: 500.0,
                dt_ms: 5_000,
                arrival_ms: i as i64 * 50,
            })
            .collect();
        let grid = CellGrid::new(500.0);
        let sharded = replay_sharded(&requests, grid, 1, SearchMode::NbrK, 7);
        let mut engine = Engine::new(SearchMode::NbrK, 7);
        let mut out = Vec::new();
        for r in &requests {
            let _ = engine.submit(r.clone(), &mut out);
        }
        engine.expire(i64::MAX, &mut out);
        let mut single = CloakingQuality::default();
        single.add(&out, |id| requests.get(id as usize).cloned());
        assert_eq!(sharded.cloaked, single.cloaked);
        assert_eq!(sharded.expired, single.expired);
        // Sharded, every request still gets exactly one outcome.
        let four = replay_sharded(&requests, grid, 4, SearchMode::NbrK, 7);
        assert_eq!(four.cloaked + four.expired, requests.len());
    }
}
