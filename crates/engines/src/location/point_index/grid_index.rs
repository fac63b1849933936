//! The uniform-grid [`PointIndex`] (`location.index = "grid"`): a grid of [`CELL_DEGREES`] ×
//! [`CELL_DEGREES`] cells (about 560 m of latitude by 330 m of longitude at Oldenburg's 53° N), each
//! holding the points that fall in it.
//!
//! Each point carries its reach box (the engine's grouping box), tested point by point by
//! [`PointIndex::slots_meeting`]. Insertion and removal touch one cell (O(points in it)); a range query visits the cells the box
//! overlaps and tests each point against the box, or, when the box overlaps more cells than are
//! occupied, walks the occupied cells instead, so a huge box costs no more than a scan. It needs no
//! rebalancing: a removed point is gone at once and its slot can be reused. Cells once used keep
//! their (possibly empty) buffer, so a steady workload allocates nothing; their number is bounded by
//! the area the requests ever covered. The fixed cell size suits boxes of about a cell; a box much
//! smaller in a dense cell still tests every point of the cell, a box much larger visits many cells
//! ([`super::rtree`] adapts to both).
//!
//! Queries return slots in an order that depends on the grid's history; the engine sorts neighbours
//! with a total order, so its output does not depend on it.
use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::{IdHasher, PointIndex};
use crate::location::geo::GeoBox;

/// Side of a cell in degrees of latitude and of longitude.
pub const CELL_DEGREES: f64 = 0.005;

/// One indexed point with its reach box.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    lon: f64,
    lat: f64,
    slot: u32,
    reach: GeoBox,
}

/// The grid (see the module doc).
#[derive(Debug, Default)]
pub struct GridIndex {
    cells: HashMap<u64, Vec<Entry>, BuildHasherDefault<IdHasher>>,
    len: usize,
}

/// The cell number of a coordinate (degrees), clamped so that every finite coordinate has one.
fn cell_of(degrees: f64) -> i32 {
    (degrees / CELL_DEGREES).floor().clamp(-40_000.0, 40_000.0) as i32
}

fn key(row: i32, col: i32) -> u64 {
    (u64::from(row as u32) << 32) | u64::from(col as u32)
}

impl GridIndex {
    pub fn new() -> GridIndex {
        GridIndex::default()
    }
}

impl PointIndex for GridIndex {
    fn len(&self) -> usize {
        self.len
    }

    fn insert(&mut self, lon: f64, lat: f64, reach: &GeoBox, slot: u32) {
        self.cells
            .entry(key(cell_of(lat), cell_of(lon)))
            .or_default()
            .push(Entry {
                lon,
                lat,
                slot,
                reach: *reach,
            });
        self.len += 1;
    }

    fn remove(&mut self, lon: f64, lat: f64, _reach: &GeoBox, slot: u32) -> bool {
        let Some(cell) = self.cells.get_mut(&key(cell_of(lat), cell_of(lon))) else {
            return false;
        };
        match cell.iter().position(|e| e.slot == slot) {
            Some(i) => {
                cell.swap_remove(i);
                self.len -= 1;
                true
            }
            None => false,
        }
    }

    fn slots_in(&self, b: &GeoBox, out: &mut Vec<u32>) {
        self.select(b, |_| true, out);
    }

    fn slots_meeting(&self, b: &GeoBox, lon: f64, lat: f64, out: &mut Vec<u32>) {
        self.select(b, |e| e.reach.contains_point(lat, lon), out);
    }
}

impl GridIndex {
    /// Appends the slots of the points inside `b` that `also` accepts.
    fn select(&self, b: &GeoBox, also: impl Fn(&Entry) -> bool, out: &mut Vec<u32>) {
        let (min_lon, min_lat, max_lon, max_lat) = (b.min_lon, b.min_lat, b.max_lon, b.max_lat);
        let inside = |e: &&Entry| {
            e.lon >= min_lon && e.lon <= max_lon && e.lat >= min_lat && e.lat <= max_lat && also(e)
        };
        let (row0, row1) = (cell_of(min_lat), cell_of(max_lat));
        let (col0, col1) = (cell_of(min_lon), cell_of(max_lon));
        let overlapped = (i64::from(row1) - i64::from(row0) + 1).max(0)
            * (i64::from(col1) - i64::from(col0) + 1).max(0);
        if overlapped > self.cells.len() as i64 {
            for cell in self.cells.values() {
                out.extend(cell.iter().filter(inside).map(|e| e.slot));
            }
            return;
        }
        for row in row0..=row1 {
            for col in col0..=col1 {
                if let Some(cell) = self.cells.get(&key(row, col)) {
                    out.extend(cell.iter().filter(inside).map(|e| e.slot));
                }
            }
        }
    }
}
