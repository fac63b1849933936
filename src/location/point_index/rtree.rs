//! The R-tree [`PointIndex`] (`location.index = "rtree"`, the default): `rstar` R*-trees of the
//! points (`[lon, lat]` degrees), one tree per *reach class*, each entry carrying its reach box and
//! slot.
//!
//! Invariants: every live point is in exactly one tree, the tree of its reach class (below), and
//! nowhere else; an entry is (point, reach box widened to hold the point, slot), and a removal takes
//! out exactly that entry. A point's reach class bounds how far its reach box extends from it:
//! class `(cx, cy)` holds the points whose reach box extends at most [`class_extent`]`(cx)` degrees
//! east or west of the point and at most `class_extent(cy)` north or south (the last class of an
//! axis is unbounded). `len` is the number of live entries over all trees.
//!
//! Updated one point at a time: an insertion is R* insertion (choose-subtree, forced reinsertion,
//! split) into one tree, a removal finds the entry by descending the nodes whose envelope holds its
//! point, takes it out and shrinks the envelopes on its path; emptied nodes are dropped. There is no
//! periodic bulk rebuild and no dead entry: a removed point is gone at once and its slot can be
//! reused. Unlike a fixed grid, the nodes follow the data, so a query costs about the nodes it opens
//! plus the points it returns, whether the box is 20 m in a crowd or 20 km over the countryside.
//!
//! Why points in reach classes (measured, `cargo bench --bench location_engine`, docs/performance.md):
//! [`PointIndex::slots_meeting`] (the engine's edge query) wants the points of a box `b` whose own
//! reach box holds the query point `q`. With reaches from 20 m to 20 km, a 20 km box holds thousands
//! of points of which few reach back. A single tree of reach boxes prunes badly (its node envelopes,
//! unions of boxes of every size, overlap heavily: a query opens most nodes, and a removal descends
//! every node whose envelope holds the box); a single tree of points cannot prune by reach at all.
//! Within a reach class every point that reaches `q` lies within the class's extent of `q`, so the
//! class's tree is asked only for `b` ∩ (`q` ± extent): short-reaching points are looked for only
//! next to `q`, long-reaching ones in the whole of `b`, and each candidate is then tested exactly.
//! The trees hold points, so their envelopes are tight and a removal descends about one path.
//!
//! Queries return slots in an order that depends on the trees' history; the engine sorts neighbours
//! with a total order, so its output does not depend on it.
use rstar::primitives::GeomWithData;
use rstar::{AABB, ParentNode, RStarInsertionStrategy, RTree, RTreeNode, RTreeParams};

use super::PointIndex;
use crate::location::geo::GeoBox;

/// Node sizes: wider nodes than rstar's default (3..=6) make insertions cheaper (fewer splits) and
/// the queries of ~1 km boxes over a few thousand points no slower (measured with
/// `cargo bench --bench location_engine`).
#[derive(Debug)]
pub struct NodeParams;

impl RTreeParams for NodeParams {
    const MIN_SIZE: usize = 5;
    const MAX_SIZE: usize = 12;
    const REINSERTION_COUNT: usize = 3;
    type DefaultInsertionStrategy = RStarInsertionStrategy;
}

/// Reach classes per axis: class `c < CLASSES_PER_AXIS - 1` holds extents up to
/// [`class_extent`]`(c)`, the last one any extent. Five classes a factor of four apart (25 trees)
/// beat eight a factor of 2.5 apart (64 trees) on the log-uniform workload (a query opens at least
/// about a leaf in every tree that may hold a point reaching the query point, so more trees cost a
/// floor per query) and tie on the others, in a replay of the bench's workloads.
pub const CLASSES_PER_AXIS: usize = 5;

/// The classes' bounds in degrees: the smallest about 67 m of longitude and 111 m of latitude at
/// 53° N, each four times the previous one, the last unbounded.
const EXTENTS: [f64; CLASSES_PER_AXIS] = [0.001, 0.004, 0.016, 0.064, f64::INFINITY];

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

/// What an entry carries besides its point: its reach box (holding the point) and slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Item {
    reach: GeoBox,
    slot: u32,
}

/// A point (`[lon, lat]`) with its item; equal when both are.
type Entry = GeomWithData<[f64; 2], Item>;

/// The entry of a point and the tree (class) it belongs in.
fn entry(lon: f64, lat: f64, reach: &GeoBox, slot: u32) -> (usize, Entry) {
    let mut held = *reach;
    held.extend(lat, lon);
    let cx = class_of((lon - held.min_lon).max(held.max_lon - lon));
    let cy = class_of((lat - held.min_lat).max(held.max_lat - lat));
    (
        cx * CLASSES_PER_AXIS + cy,
        Entry::new([lon, lat], Item { reach: held, slot }),
    )
}

/// The R-trees (see the module doc).
#[derive(Debug)]
pub struct RTreeIndex {
    /// Tree `cx * CLASSES_PER_AXIS + cy` holds reach class `(cx, cy)`.
    trees: Vec<RTree<Entry, NodeParams>>,
    len: usize,
}

impl Default for RTreeIndex {
    fn default() -> RTreeIndex {
        RTreeIndex {
            trees: (0..CLASSES_PER_AXIS * CLASSES_PER_AXIS)
                .map(|_| RTree::new_with_params())
                .collect(),
            len: 0,
        }
    }
}

impl RTreeIndex {
    pub fn new() -> RTreeIndex {
        RTreeIndex::default()
    }
}

/// A query: the box the points must lie in and, for [`PointIndex::slots_meeting`], the point their
/// reach boxes must hold.
struct Query {
    min: [f64; 2],
    max: [f64; 2],
    reached: Option<[f64; 2]>,
}

impl Query {
    #[inline]
    fn meets(&self, envelope: &AABB<[f64; 2]>) -> bool {
        let (lo, hi) = (envelope.lower(), envelope.upper());
        lo[0] <= self.max[0] && hi[0] >= self.min[0] && lo[1] <= self.max[1] && hi[1] >= self.min[1]
    }

    #[inline]
    fn selects(&self, e: &Entry) -> bool {
        let p = e.geom();
        p[0] >= self.min[0]
            && p[0] <= self.max[0]
            && p[1] >= self.min[1]
            && p[1] <= self.max[1]
            && self
                .reached
                .is_none_or(|[x, y]| e.data.reach.contains_point(y, x))
    }

    fn visit(&self, node: &ParentNode<Entry>, out: &mut Vec<u32>) {
        for child in node.children() {
            match child {
                RTreeNode::Leaf(e) => {
                    if self.selects(e) {
                        out.push(e.data.slot);
                    }
                }
                RTreeNode::Parent(p) => {
                    if self.meets(&p.envelope()) {
                        self.visit(p, out);
                    }
                }
            }
        }
    }

    fn run(&self, tree: &RTree<Entry, NodeParams>, out: &mut Vec<u32>) {
        let root = tree.root();
        if !root.children().is_empty() && self.meets(&root.envelope()) {
            self.visit(root, out);
        }
    }
}

impl PointIndex for RTreeIndex {
    fn len(&self) -> usize {
        self.len
    }

    fn insert(&mut self, lon: f64, lat: f64, reach: &GeoBox, slot: u32) {
        let (tree, e) = entry(lon, lat, reach, slot);
        self.trees[tree].insert(e);
        self.len += 1;
    }

    fn remove(&mut self, lon: f64, lat: f64, reach: &GeoBox, slot: u32) -> bool {
        let (tree, e) = entry(lon, lat, reach, slot);
        let removed = self.trees[tree].remove(&e).is_some();
        self.len -= usize::from(removed);
        removed
    }

    fn slots_in(&self, b: &GeoBox, out: &mut Vec<u32>) {
        let query = Query {
            min: [b.min_lon, b.min_lat],
            max: [b.max_lon, b.max_lat],
            reached: None,
        };
        for tree in &self.trees {
            query.run(tree, out);
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
                if tree.size() == 0 {
                    continue;
                }
                let ey = class_extent(cy);
                let (min_lat, max_lat) = (b.min_lat.max(lat - ey), b.max_lat.min(lat + ey));
                if min_lat > max_lat {
                    continue;
                }
                Query {
                    min: [min_lon, min_lat],
                    max: [max_lon, max_lat],
                    reached: Some([lon, lat]),
                }
                .run(tree, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
