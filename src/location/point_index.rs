//! The spatial index of the CliqueCloak engine's pending requests: a uniform grid of
//! [`CELL_DEGREES`] × [`CELL_DEGREES`] cells (about 560 m of latitude by 330 m of longitude at
//! Oldenburg's 53° N), each holding the points that fall in it.
//!
//! Insertion and removal touch one cell (O(points in it)); a range query visits the cells the box
//! overlaps and tests each point against the box, or, when the box overlaps more cells than are
//! occupied, walks the occupied cells instead, so a huge box costs no more than a scan. Unlike an
//! R-tree it needs no rebalancing and no rebuilds: a removed point is gone at once and its slot can
//! be reused. Cells once used keep their (possibly empty) buffer, so a steady workload allocates
//! nothing; their number is bounded by the area the requests ever covered.
//!
//! Queries return slots in an order that depends on the grid's history; the engine sorts neighbours
//! with a total order, so its output does not depend on it.
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Side of a cell in degrees of latitude and of longitude.
pub const CELL_DEGREES: f64 = 0.005;

/// Fixed multiplicative hash for keys the engine assigns itself (request ids, cell numbers): no
/// per-process random state, so the engine stays deterministic, and no attacker-chosen keys.
#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, i: u64) {
        // splitmix64 finaliser
        let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.0 = z ^ (z >> 31);
    }
}

/// One indexed point.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    lon: f64,
    lat: f64,
    slot: u32,
}

/// The grid (see the module doc).
#[derive(Debug, Default)]
pub struct PointIndex {
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

impl PointIndex {
    pub fn new() -> PointIndex {
        PointIndex::default()
    }

    /// Number of points indexed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn insert(&mut self, lon: f64, lat: f64, slot: u32) {
        self.cells
            .entry(key(cell_of(lat), cell_of(lon)))
            .or_default()
            .push(Entry { lon, lat, slot });
        self.len += 1;
    }

    /// Removes the point of `slot` inserted at (`lon`, `lat`); false if there is none.
    pub fn remove(&mut self, lon: f64, lat: f64, slot: u32) -> bool {
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

    /// Appends to `out` the slot of every point inside the closed box.
    pub fn slots_in(
        &self,
        min_lon: f64,
        min_lat: f64,
        max_lon: f64,
        max_lat: f64,
        out: &mut Vec<u32>,
    ) {
        let inside = |e: &&Entry| {
            e.lon >= min_lon && e.lon <= max_lon && e.lat >= min_lat && e.lat <= max_lat
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The grid answers every box query as a scan of the live points does, through inserts and
        /// removals, for boxes small and large, anywhere on the globe.
        #[test]
        fn queries_match_a_scan(
            points in prop::collection::vec((-179.9f64..179.9, -89.9f64..89.9), 1..60),
            spread in prop_oneof![Just(0.001f64), Just(0.05), Just(5.0)],
            removals in prop::collection::vec(any::<prop::sample::Index>(), 0..30),
            queries in prop::collection::vec((any::<prop::sample::Index>(), 0.0f64..1.0, 0.0f64..1.0), 1..20),
        ) {
            // Points cluster around the first one, so that queries find some.
            let (lon0, lat0) = points[0];
            let points: Vec<(f64, f64)> = points
                .iter()
                .map(|&(lon, lat)| {
                    (
                        (lon0 + (lon / 180.0) * spread).clamp(-180.0, 180.0),
                        (lat0 + (lat / 90.0) * spread).clamp(-90.0, 90.0),
                    )
                })
                .collect();
            let mut index = PointIndex::new();
            let mut live: Vec<(f64, f64, u32)> = Vec::new();
            for (slot, &(lon, lat)) in points.iter().enumerate() {
                index.insert(lon, lat, slot as u32);
                live.push((lon, lat, slot as u32));
            }
            for r in removals {
                if live.is_empty() {
                    break;
                }
                let (lon, lat, slot) = live.swap_remove(r.index(live.len()));
                prop_assert!(index.remove(lon, lat, slot));
                prop_assert!(!index.remove(lon, lat, slot));
            }
            prop_assert_eq!(index.len(), live.len());
            for (centre, w, h) in queries {
                let (lon, lat) = points[centre.index(points.len())];
                let (w, h) = (w * spread, h * spread);
                let (a, b, c, d) = (lon - w, lat - h, lon + w, lat + h);
                let mut got = Vec::new();
                index.slots_in(a, b, c, d, &mut got);
                got.sort_unstable();
                let mut want: Vec<u32> = live
                    .iter()
                    .filter(|&&(x, y, _)| x >= a && x <= c && y >= b && y <= d)
                    .map(|&(_, _, s)| s)
                    .collect();
                want.sort_unstable();
                prop_assert_eq!(got, want);
            }
        }
    }
}
