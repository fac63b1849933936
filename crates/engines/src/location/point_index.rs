//! The spatial index of the CliqueCloak engine's pending requests: points (WGS84 degrees) with the
//! engine's slot numbers and reach boxes (the requests' grouping boxes), updated one point at a
//! time, answering "which slots lie in this box" and "which slots lie in this box and reach back to
//! this point" (the candidates of the constraint graph's edges of a new request).
//!
//! One small trait, [`PointIndex`], and two implementations chosen by `location.index`:
//! [`rtree::RTreeIndex`] (R-trees of the points by reach class in arenas of nodes, the default) and
//! [`grid_index::GridIndex`] (a uniform grid of 0.005° cells). [`SpatialIndex`] is the engine's choice
//! between them, an enum so that the hot path is a branch, not a virtual call.
//!
//! Invariants every implementation keeps (checked against a linear scan in the tests below): a
//! query returns exactly the slots of the live points inside the closed box (and, for
//! [`PointIndex::slots_meeting`], whose closed reach box holds the query point), each once, in some
//! order; a removal takes out exactly the entry (point, reach box, slot) that was inserted, and says whether
//! there was one; no query or update depends on a clock or on randomness. The order of a query's
//! answer may depend on the history; the engine sorts neighbours with a total order, so its groups
//! are the same under every implementation, seed for seed.
use std::hash::Hasher;

use super::geo::GeoBox;

pub mod grid_index;
pub mod rtree;

pub use grid_index::GridIndex;
pub use rtree::RTreeIndex;

/// Points with slots, updated one at a time (see the module doc).
pub trait PointIndex {
    /// Number of points indexed.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds the point of `slot` at (`lon`, `lat`) with its reach box (finite degrees; the box holds
    /// the point). `slot` is not in the index (the engine's slots are dense and unique among its
    /// pending requests).
    fn insert(&mut self, lon: f64, lat: f64, reach: &GeoBox, slot: u32);

    /// Removes the point of `slot` inserted at (`lon`, `lat`) with this reach box; false if there
    /// is none.
    fn remove(&mut self, lon: f64, lat: f64, reach: &GeoBox, slot: u32) -> bool;

    /// Appends to `out` the slot of every point inside the closed box (`min <= max` on both axes).
    fn slots_in(&self, b: &GeoBox, out: &mut Vec<u32>);

    /// Appends to `out` the slot of every point inside the closed box `b` whose closed reach box
    /// holds (`lon`, `lat`).
    fn slots_meeting(&self, b: &GeoBox, lon: f64, lat: f64, out: &mut Vec<u32>);
}

/// Which index the engine keeps its pending requests in (`location.index`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IndexKind {
    /// R-trees of the points, one per reach class: adapt to any tolerance and density.
    #[default]
    RTree,
    /// A uniform grid of 0.005° cells: fastest when boxes are about a cell wide.
    Grid,
}

impl IndexKind {
    pub const ALL: [IndexKind; 2] = [IndexKind::RTree, IndexKind::Grid];

    /// The configuration's name of the index.
    pub fn name(self) -> &'static str {
        match self {
            IndexKind::RTree => "rtree",
            IndexKind::Grid => "grid",
        }
    }

    /// The index of a configuration name (`"rtree"` or `"grid"`).
    pub fn from_name(name: &str) -> Option<IndexKind> {
        IndexKind::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// The engine's index: one of the implementations, dispatched statically.
#[derive(Debug)]
pub enum SpatialIndex {
    RTree(RTreeIndex),
    Grid(GridIndex),
}

impl SpatialIndex {
    pub fn new(kind: IndexKind) -> SpatialIndex {
        match kind {
            IndexKind::RTree => SpatialIndex::RTree(RTreeIndex::new()),
            IndexKind::Grid => SpatialIndex::Grid(GridIndex::new()),
        }
    }

    pub fn kind(&self) -> IndexKind {
        match self {
            SpatialIndex::RTree(_) => IndexKind::RTree,
            SpatialIndex::Grid(_) => IndexKind::Grid,
        }
    }
}

impl PointIndex for SpatialIndex {
    #[inline]
    fn len(&self) -> usize {
        match self {
            SpatialIndex::RTree(i) => i.len(),
            SpatialIndex::Grid(i) => i.len(),
        }
    }

    #[inline]
    fn insert(&mut self, lon: f64, lat: f64, reach: &GeoBox, slot: u32) {
        match self {
            SpatialIndex::RTree(i) => i.insert(lon, lat, reach, slot),
            SpatialIndex::Grid(i) => i.insert(lon, lat, reach, slot),
        }
    }

    #[inline]
    fn remove(&mut self, lon: f64, lat: f64, reach: &GeoBox, slot: u32) -> bool {
        match self {
            SpatialIndex::RTree(i) => i.remove(lon, lat, reach, slot),
            SpatialIndex::Grid(i) => i.remove(lon, lat, reach, slot),
        }
    }

    #[inline]
    fn slots_in(&self, b: &GeoBox, out: &mut Vec<u32>) {
        match self {
            SpatialIndex::RTree(i) => i.slots_in(b, out),
            SpatialIndex::Grid(i) => i.slots_in(b, out),
        }
    }

    #[inline]
    fn slots_meeting(&self, b: &GeoBox, lon: f64, lat: f64, out: &mut Vec<u32>) {
        match self {
            SpatialIndex::RTree(i) => i.slots_meeting(b, lon, lat, out),
            SpatialIndex::Grid(i) => i.slots_meeting(b, lon, lat, out),
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One step of a random history: insert a new point with a reach box (half-widths as shares
    /// of the spread, from far below to far above it), remove a live one (or try one twice), or
    /// query a box around a point.
    #[derive(Debug, Clone)]
    enum Step {
        Insert(f64, f64, f64, f64),
        Remove(prop::sample::Index),
        Query(prop::sample::Index, f64, f64),
    }

    fn step() -> impl Strategy<Value = Step> {
        let reach = prop_oneof![0.0f64..0.05, 0.05f64..1.0, 1.0f64..20.0];
        prop_oneof![
            4 => (-1.0f64..1.0, -1.0f64..1.0, reach.clone(), reach)
                .prop_map(|(x, y, rx, ry)| Step::Insert(x, y, rx, ry)),
            2 => any::<prop::sample::Index>().prop_map(Step::Remove),
            2 => (any::<prop::sample::Index>(), 0.0f64..1.0, 0.0f64..1.0)
                .prop_map(|(i, w, h)| Step::Query(i, w, h)),
        ]
    }

    /// A point with its reach box and slot.
    type Live = (f64, f64, GeoBox, u32);

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Every implementation answers every box query (with and without the reach condition) as
        /// a linear scan of the live points does, through interleaved inserts and removals (enough
        /// to split and empty R-tree nodes), for boxes and reaches from far below a grid cell to far
        /// above one, anywhere on the globe, including duplicate points and points on a box's
        /// edge; the query point is a live point (on the edges of reach boxes of equal points) or
        /// the origin.
        #[test]
        fn every_index_matches_a_linear_scan(
            (lon0, lat0) in (-179.0f64..179.0, -89.0f64..89.0),
            spread in prop_oneof![Just(0.0001f64), Just(0.002), Just(0.05), Just(1.0)],
            duplicates in any::<bool>(),
            steps in prop::collection::vec(step(), 1..400),
        ) {
            for kind in IndexKind::ALL {
                let mut index = SpatialIndex::new(kind);
                prop_assert_eq!(index.kind(), kind);
                let mut live: Vec<Live> = Vec::new();
                let mut removed: Vec<Live> = Vec::new();
                let mut next_slot = 0u32;
                for step in &steps {
                    match *step {
                        Step::Insert(x, y, rx, ry) => {
                            let (x, y) = if duplicates { (x.round(), y.round()) } else { (x, y) };
                            let lon = (lon0 + x * spread).clamp(-180.0, 180.0);
                            let lat = (lat0 + y * spread).clamp(-90.0, 90.0);
                            let (rx, ry) = if duplicates { (rx.round(), ry.round()) } else { (rx, ry) };
                            let reach = GeoBox {
                                min_lat: lat - ry * spread,
                                min_lon: lon - rx * spread,
                                max_lat: lat + ry * spread,
                                max_lon: lon + rx * spread,
                            };
                            index.insert(lon, lat, &reach, next_slot);
                            live.push((lon, lat, reach, next_slot));
                            next_slot += 1;
                        }
                        Step::Remove(i) => {
                            if i.index(4) == 0 && !removed.is_empty() {
                                let (lon, lat, reach, slot) = removed[i.index(removed.len())];
                                prop_assert!(!index.remove(lon, lat, &reach, slot), "{:?}: removed twice", kind);
                            } else if !live.is_empty() {
                                let gone = live.swap_remove(i.index(live.len()));
                                prop_assert!(index.remove(gone.0, gone.1, &gone.2, gone.3), "{:?}", kind);
                                removed.push(gone);
                            }
                        }
                        Step::Query(i, w, h) => {
                            // Around a live point (or the origin); the box's edge may pass through it.
                            let (lon, lat) = live
                                .get(i.index(live.len().max(1)))
                                .map_or((lon0, lat0), |&(x, y, _, _)| (x, y));
                            let (w, h) = (w * spread, h * spread);
                            let b = GeoBox {
                                min_lat: lat - h,
                                min_lon: lon - w,
                                max_lat: lat + if i.index(3) == 0 { 0.0 } else { h },
                                max_lon: lon + w,
                            };
                            let inside = |&&(x, y, _, _): &&Live| {
                                x >= b.min_lon && x <= b.max_lon && y >= b.min_lat && y <= b.max_lat
                            };
                            let mut got = Vec::new();
                            index.slots_in(&b, &mut got);
                            got.sort_unstable();
                            let mut want: Vec<u32> =
                                live.iter().filter(inside).map(|&(_, _, _, s)| s).collect();
                            want.sort_unstable();
                            prop_assert_eq!(got, want, "{:?}", kind);

                            let mut got = Vec::new();
                            index.slots_meeting(&b, lon, lat, &mut got);
                            got.sort_unstable();
                            let mut want: Vec<u32> = live
                                .iter()
                                .filter(inside)
                                .filter(|(_, _, reach, _)| reach.contains_point(lat, lon))
                                .map(|&(_, _, _, s)| s)
                                .collect();
                            want.sort_unstable();
                            prop_assert_eq!(got, want, "{:?} (meeting)", kind);
                        }
                    }
                    prop_assert_eq!(index.len(), live.len(), "{:?}", kind);
                    if let SpatialIndex::RTree(tree) = &index {
                        tree.check();
                    }
                }
                // Everything left comes out.
                let mut all = Vec::new();
                index.slots_in(
                    &GeoBox { min_lat: -90.0, min_lon: -180.0, max_lat: 90.0, max_lon: 180.0 },
                    &mut all,
                );
                prop_assert_eq!(all.len(), live.len(), "{:?}", kind);
            }
        }
    }

    #[test]
    fn index_names_round_trip() {
        for kind in IndexKind::ALL {
            assert_eq!(IndexKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(IndexKind::from_name("quadtree"), None);
        assert_eq!(IndexKind::default(), IndexKind::RTree);
    }
}
