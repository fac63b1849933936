//! The R-tree [`PointIndex`] (`location.index = "rtree"`, the default): an `rstar` R*-tree whose
//! entries are the points' reach boxes (`[lon, lat]` degrees), each carrying its point and slot.
//!
//! Updated one point at a time: an insertion is R* insertion (choose-subtree, forced reinsertion,
//! split), a removal finds the entry (reach box, point and slot) by descending the nodes whose
//! envelope holds its box, takes it out and shrinks the envelopes on its path; emptied nodes are
//! dropped. There is no periodic bulk rebuild and no dead entry: a removed point is gone at once and
//! its slot can be reused. Unlike a fixed grid, the nodes follow the data, so a query costs about the
//! nodes it opens plus the points it returns, whether the box is 20 m in a crowd or 20 km over the
//! countryside.
//!
//! Why the tree holds reach boxes, not points: [`PointIndex::slots_meeting`] (the engine's edge
//! query) wants the points of a box whose own reach box holds the query point. With reaches from
//! metres to kilometres, a 20 km box holds thousands of points of which few reach back. A node's
//! envelope is the union of its entries' reach boxes, and every point lies in its own reach box
//! (the engine's grouping box is centred on its point), so a node is opened only when its envelope
//! holds the query point (some entry may reach it) and meets the query box (some point may lie in
//! it); whole nodes of short-reaching points far from the query point are skipped. Each entry is
//! then tested exactly. Both queries rely on that containment, so an insertion widens a reach box
//! that does not hold its point (the trait asks callers for boxes that do; the engine's do).
//!
//! Queries return slots in an order that depends on the tree's history; the engine sorts neighbours
//! with a total order, so its output does not depend on it.
use rstar::primitives::{GeomWithData, Rectangle};
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

/// What an entry carries besides its reach box: its point and slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Item {
    lon: f64,
    lat: f64,
    slot: u32,
}

/// A reach box (widened to hold its point) with its item; equal when both are.
type Entry = GeomWithData<Rectangle<[f64; 2]>, Item>;

fn entry(lon: f64, lat: f64, reach: &GeoBox, slot: u32) -> Entry {
    let mut held = *reach;
    held.extend(lat, lon);
    Entry::new(
        Rectangle::from_corners([held.min_lon, held.min_lat], [held.max_lon, held.max_lat]),
        Item { lon, lat, slot },
    )
}

/// The R-tree (see the module doc).
#[derive(Debug)]
pub struct RTreeIndex {
    tree: RTree<Entry, NodeParams>,
}

impl Default for RTreeIndex {
    fn default() -> RTreeIndex {
        RTreeIndex {
            tree: RTree::new_with_params(),
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
struct Query<'a> {
    b: &'a GeoBox,
    reached: Option<(f64, f64)>,
}

impl Query<'_> {
    /// Whether a node with this envelope may hold an entry the query selects (see the module doc).
    #[inline]
    fn may_hold(&self, envelope: &AABB<[f64; 2]>) -> bool {
        let (lo, hi) = (envelope.lower(), envelope.upper());
        let b = self.b;
        if lo[0] > b.max_lon || hi[0] < b.min_lon || lo[1] > b.max_lat || hi[1] < b.min_lat {
            return false;
        }
        self.reached
            .is_none_or(|(lon, lat)| lo[0] <= lon && lon <= hi[0] && lo[1] <= lat && lat <= hi[1])
    }

    #[inline]
    fn selects(&self, e: &Entry) -> bool {
        let (item, reach) = (&e.data, e.geom());
        self.b.contains_point(item.lat, item.lon)
            && self.reached.is_none_or(|(x, y)| {
                let (lo, hi) = (reach.lower(), reach.upper());
                lo[0] <= x && x <= hi[0] && lo[1] <= y && y <= hi[1]
            })
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
                    if self.may_hold(&p.envelope()) {
                        self.visit(p, out);
                    }
                }
            }
        }
    }

    fn run(&self, tree: &RTree<Entry, NodeParams>, out: &mut Vec<u32>) {
        let root = tree.root();
        if !root.children().is_empty() && self.may_hold(&root.envelope()) {
            self.visit(root, out);
        }
    }
}

impl PointIndex for RTreeIndex {
    fn len(&self) -> usize {
        self.tree.size()
    }

    fn insert(&mut self, lon: f64, lat: f64, reach: &GeoBox, slot: u32) {
        self.tree.insert(entry(lon, lat, reach, slot));
    }

    fn remove(&mut self, lon: f64, lat: f64, reach: &GeoBox, slot: u32) -> bool {
        self.tree.remove(&entry(lon, lat, reach, slot)).is_some()
    }

    fn slots_in(&self, b: &GeoBox, out: &mut Vec<u32>) {
        Query { b, reached: None }.run(&self.tree, out);
    }

    fn slots_meeting(&self, b: &GeoBox, lon: f64, lat: f64, out: &mut Vec<u32>) {
        Query {
            b,
            reached: Some((lon, lat)),
        }
        .run(&self.tree, out);
    }
}
