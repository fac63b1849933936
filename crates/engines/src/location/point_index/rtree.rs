//! The R-tree [`PointIndex`] (`location.index = "rtree"`, the default): R-trees of the points
//! (longitude, latitude in degrees), one tree per *reach class*, each entry carrying its reach box
//! and slot; the trees are [`arena::Tree`]s, hand-written R-trees in an arena of fixed-size nodes.
//!
//! Invariants: every live point is in exactly one tree, the tree of its reach class (below), and
//! nowhere else; a slot holds at most one point, and the slot map names its tree, leaf and position;
//! an entry is (point, reach box widened to hold the point, slot), and a removal takes out exactly
//! that entry (a removal naming another point or reach for the slot removes nothing). A point's reach
//! class bounds how far its reach box extends from it: class `(cx, cy)` holds the points whose reach
//! box extends at most [`class_extent`]`(cx)` degrees east or west of the point and at most
//! `class_extent(cy)` north or south (the last class of an axis is unbounded). `len` is the number of
//! live entries over all trees. The trees' own invariants are in [`tree`].
//!
//! Updated one point at a time: an insertion descends one tree by least enlargement and splits full
//! nodes (R*'s split); a removal finds its leaf from the slot map (no descent), swap-removes the
//! entry and shrinks the boxes on the path, reinserting the points of a node that falls below its
//! minimum fill. There is no periodic bulk rebuild and no dead entry: a removed point is gone at
//! once and its slot can be reused. Unlike a fixed grid, the nodes follow the data, so a query costs
//! about the nodes it opens plus the points it returns, whether the box is 20 m in a crowd or 20 km
//! over the countryside.
//!
//! Why points in reach classes (measured, `cargo bench --bench location_engine`, docs/performance.md):
//! [`PointIndex::slots_meeting`] (the engine's edge query) wants the points of a box `b` whose own
//! reach box holds the query point `q`. With reaches from 20 m to 20 km, a 20 km box holds thousands
//! of points of which few reach back. A single tree of reach boxes prunes badly (its node envelopes,
//! unions of boxes of every size, overlap heavily); a single tree of points cannot prune by reach
//! well, as almost every node holds some far-reaching point. Within a reach class every point that
//! reaches `q` lies within the class's extent of `q`, so the class's tree is asked only for `b` ∩
//! (`q` ± extent): short-reaching points are looked for only next to `q`, long-reaching ones in the
//! whole of `b`, and each candidate is then tested exactly. Each node also keeps the union of its
//! points' reach boxes, so a subtree none of whose points reaches `q` is skipped.
//!
//! Why hand-written and not `rstar` (which the POI provider uses, and which this index used before):
//! measured side by side in a replay of the bench's workloads (docs/performance.md, "Spatial index"),
//! see there for the figures. `rstar`'s nodes are a heap allocation each (a query's node visits are
//! cache misses), its removal descends every node whose envelope holds the point (here: one slot
//! map lookup), and it cannot keep a per-node union of reach boxes to prune by.
//!
//! Queries return slots in an order that depends on the trees' history; the engine sorts neighbours
//! with a total order, so its output does not depend on it.
mod arena;

use self::arena::{Entry, Loc, Locs, Tree};
use super::PointIndex;
use crate::location::geo::GeoBox;

/// Reach classes per axis: class `c < CLASSES_PER_AXIS - 1` holds extents up to
/// [`class_extent`]`(c)`, the last one any extent. Three classes a factor of twelve apart (9 trees)
/// beat five a factor of four apart (25 trees) on the log-uniform workload now that each node also
/// prunes by the union of its points' reach boxes (a query opens at least a path in every tree that
/// may hold a point reaching the query point, so more trees cost a floor per query), and one class
/// (a single tree) is slower there (measured in a replay of the bench's workloads,
/// docs/performance.md).
pub const CLASSES_PER_AXIS: usize = 3;

/// The classes' bounds in degrees: about 130 m of longitude and 220 m of latitude at 53° N, then
/// twelve times that, then unbounded.
const EXTENTS: [f64; CLASSES_PER_AXIS] = [0.002, 0.024, f64::INFINITY];

/// The largest extent (degrees) a point of class `c` may reach from it on that axis.
pub fn class_extent(c: usize) -> f64 {
    EXTENTS[c.min(CLASSES_PER_AXIS - 1)]
}

/// The class of an axis's extent (degrees, >= 0): the smallest class whose bound holds it.
fn class_of(extent: f64) -> usize {
    (0..CLASSES_PER_AXIS - 1)
        .find(|&c| extent <= class_extent(c))
        .unwrap_or(CLASSES_PER_AXIS - 1)
}

/// The entry of a point and the tree (class) it belongs in.
fn entry(lon: f64, lat: f64, reach: &GeoBox, slot: u32) -> (usize, Entry) {
    let mut held = *reach;
    held.extend(lat, lon);
    let cx = class_of((lon - held.min_lon).max(held.max_lon - lon));
    let cy = class_of((lat - held.min_lat).max(held.max_lat - lat));
    (
        cx * CLASSES_PER_AXIS + cy,
        Entry {
            rect: [lon, lat, lon, lat],
            reach: [held.min_lon, held.min_lat, held.max_lon, held.max_lat],
            child: slot,
        },
    )
}

/// The R-trees (see the module doc).
#[derive(Debug)]
pub struct RTreeIndex {
    /// Tree `cx * CLASSES_PER_AXIS + cy` holds reach class `(cx, cy)`.
    trees: Vec<Tree>,
    /// Slot -> its tree, leaf and position.
    locs: Locs,
    len: usize,
}

impl Default for RTreeIndex {
    fn default() -> RTreeIndex {
        RTreeIndex {
            trees: (0..CLASSES_PER_AXIS * CLASSES_PER_AXIS)
                .map(|id| Tree::new(id as u32))
                .collect(),
            locs: Vec::new(),
            len: 0,
        }
    }
}

impl RTreeIndex {
    pub fn new() -> RTreeIndex {
        RTreeIndex::default()
    }

    /// Checks every tree's invariants and that the slot map names only points in a tree.
    #[cfg(test)]
    pub fn check(&self) {
        for tree in &self.trees {
            tree.check(&self.locs);
        }
        let placed = self.locs.iter().filter(|l| **l != Loc::NOWHERE).count();
        assert_eq!(
            placed, self.len,
            "the slot map places exactly the live points"
        );
        assert_eq!(self.trees.iter().map(Tree::len).sum::<usize>(), self.len);
    }
}

impl PointIndex for RTreeIndex {
    fn len(&self) -> usize {
        self.len
    }

    fn insert(&mut self, lon: f64, lat: f64, reach: &GeoBox, slot: u32) {
        let (tree, e) = entry(lon, lat, reach, slot);
        let at = slot as usize;
        if at >= self.locs.len() {
            self.locs.resize(at + 1, Loc::NOWHERE);
        }
        if self.locs[at] != Loc::NOWHERE {
            // The slot is taken: its old point goes first (a slot holds one point).
            let old = self.locs[at];
            self.trees[old.tree as usize].remove(old, &mut self.locs);
            self.len -= 1;
        }
        self.trees[tree].insert(e, &mut self.locs);
        self.len += 1;
    }

    fn remove(&mut self, lon: f64, lat: f64, reach: &GeoBox, slot: u32) -> bool {
        let (tree, e) = entry(lon, lat, reach, slot);
        let Some(&loc) = self.locs.get(slot as usize) else {
            return false;
        };
        if loc.tree as usize != tree || self.trees[tree].entry(loc) != e {
            return false;
        }
        self.trees[tree].remove(loc, &mut self.locs);
        self.len -= 1;
        true
    }

    fn slots_in(&self, b: &GeoBox, out: &mut Vec<u32>) {
        let rect = [b.min_lon, b.min_lat, b.max_lon, b.max_lat];
        for tree in &self.trees {
            tree.query(&rect, None, out);
        }
    }

    fn slots_meeting(&self, b: &GeoBox, lon: f64, lat: f64, out: &mut Vec<u32>) {
        for cx in 0..CLASSES_PER_AXIS {
            // A point of this class that reaches (lon, lat) lies within the class's extent of it.
            let ex = class_extent(cx);
            let (min_lon, max_lon) = (b.min_lon.max(lon - ex), b.max_lon.min(lon + ex));
            if min_lon > max_lon {
                continue;
            }
            for cy in 0..CLASSES_PER_AXIS {
                let tree = &self.trees[cx * CLASSES_PER_AXIS + cy];
                if tree.len() == 0 {
                    continue;
                }
                let ey = class_extent(cy);
                let (min_lat, max_lat) = (b.min_lat.max(lat - ey), b.max_lat.min(lat + ey));
                if min_lat > max_lat {
                    continue;
                }
                tree.query(&[min_lon, min_lat, max_lon, max_lat], Some([lon, lat]), out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// The trees' invariants (every inner entry covers its child exactly, the slot map finds every
    /// point, fills within MIN_FILL..=MAX_FILL but the root, leaves at one depth) hold through a long
    /// history like the engine's: slots reused as soon as they are free, points clustered so that
    /// many coincide, bursts of removals that empty whole subtrees, and every answer matches a scan.
    #[test]
    fn trees_keep_their_invariants_through_a_long_history() {
        let mut rng = ChaCha8Rng::seed_from_u64(24);
        let mut index = RTreeIndex::new();
        let mut live: Vec<Option<(f64, f64, GeoBox)>> = Vec::new();
        let mut free: Vec<u32> = Vec::new();
        let mut tallest = 0;
        for step in 0..60_000u32 {
            // Phases: grow, then drain to a handful, then grow again.
            let grow = (step / 10_000) % 2 == 0;
            let insert = if grow {
                rng.random_bool(0.7)
            } else {
                rng.random_bool(0.2)
            };
            if insert {
                let (lon, lat) = if rng.random_bool(0.3) {
                    // A few spots shared by many points.
                    let spot = f64::from(rng.random_range(0..4u32));
                    (8.2 + spot * 0.001, 53.1)
                } else {
                    (
                        8.0 + rng.random::<f64>() * 0.5,
                        53.0 + rng.random::<f64>() * 0.3,
                    )
                };
                let ex = 10f64.powf(rng.random_range(-3.5..-2.0));
                let ey = 10f64.powf(rng.random_range(-3.5..-2.0));
                let reach = GeoBox {
                    min_lat: lat - ey,
                    min_lon: lon - ex,
                    max_lat: lat + ey,
                    max_lon: lon + ex,
                };
                let slot = free.pop().unwrap_or(live.len() as u32);
                if slot as usize == live.len() {
                    live.push(None);
                }
                index.insert(lon, lat, &reach, slot);
                live[slot as usize] = Some((lon, lat, reach));
            } else {
                let taken: Vec<u32> = (0..live.len() as u32)
                    .filter(|&s| live[s as usize].is_some())
                    .collect();
                if taken.is_empty() {
                    continue;
                }
                let slot = taken[rng.random_range(0..taken.len())];
                let (lon, lat, reach) = live[slot as usize].take().unwrap();
                assert!(
                    !index.remove(lon + 1.0, lat, &reach, slot),
                    "a wrong point is not removed"
                );
                assert!(index.remove(lon, lat, &reach, slot));
                assert!(!index.remove(lon, lat, &reach, slot), "removed once");
                free.push(slot);
            }
            if step % 499 == 0 {
                index.check();
                tallest = tallest.max(index.trees.iter().map(Tree::height).max().unwrap_or(0));
                let (lon, lat) = (
                    8.0 + rng.random::<f64>() * 0.5,
                    53.0 + rng.random::<f64>() * 0.3,
                );
                let (w, h) = (rng.random::<f64>() * 0.1, rng.random::<f64>() * 0.1);
                let b = GeoBox {
                    min_lat: lat - h,
                    min_lon: lon - w,
                    max_lat: lat + h,
                    max_lon: lon + w,
                };
                let mut got = Vec::new();
                index.slots_meeting(&b, lon, lat, &mut got);
                got.sort_unstable();
                let want: Vec<u32> = (0..live.len() as u32)
                    .filter(|&s| {
                        live[s as usize].is_some_and(|(x, y, r)| {
                            b.contains_point(y, x) && r.contains_point(lat, lon)
                        })
                    })
                    .collect();
                assert_eq!(got, want, "step {step}");
            }
        }
        index.check();
        assert_eq!(index.len(), live.iter().flatten().count());
        assert!(
            tallest >= 2,
            "the history grows trees of three levels ({tallest})"
        );
    }

    #[test]
    fn classes_bound_their_extents_and_grow() {
        for c in 0..CLASSES_PER_AXIS {
            assert_eq!(class_of(class_extent(c)), c);
            if c > 0 {
                assert!(class_extent(c) > class_extent(c - 1));
                assert_eq!(class_of(class_extent(c - 1) * 1.000_001), c);
            }
        }
        assert_eq!(class_of(0.0), 0);
        assert_eq!(class_of(360.0), CLASSES_PER_AXIS - 1);
    }
}
