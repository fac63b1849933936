//! Candidate lists of a box: exact filters on the R-tree's superset.
//!
//! *Range r*: a POI is a candidate exactly when its distance to the box (to the box's closest point)
//! is at most r; that closest point is its witness (the POI itself inside the box; straight north or
//! south of it when its longitude is within the box's; else [`SphBox::closest_point_m`]). The R-tree
//! is asked for the box's 3D envelope grown by the chord of r, a superset.
//!
//! *Nearest n*: the region where p is among the n nearest (ties by id) is star-shaped around p: if a
//! POI q precedes p at a point y on the arc from p to x, then `d(x, q) <= d(x, y) + d(y, q) <=
//! d(x, p)`, so q precedes p at x too. Hence:
//! - a POI inside the box is a candidate exactly when fewer than n POIs precede it at its own place:
//!   only its *twins* (the same unit vector, earlier id, counted once when the index is built) are at
//!   distance 0; a POI with another one within [`CROWD_CHORD`] is searched from its place in the tree;
//! - a POI outside the box is a candidate exactly when its region meets the box's boundary (the arc
//!   from it to any point of the box crosses the boundary). The four edges are split into segments
//!   until a segment's radius bound `far` (centre to any point, [`EdgePiece::radius_rad`]) is at most
//!   d_n(c), the distance from the segment's centre c to its n-th nearest POI. Every point x of the
//!   segment has its n nearest within d_n(c) + d(x, c) of x, so within d_n(c) + 2 far of c: that ball,
//!   N, holds the n nearest of every point of the segment, and counting within N decides exactly.
//!   d_n(c) and N come from the edge's *neighbourhood*, every POI within a chord `reach` of the edge
//!   (one R-tree query per edge, sorted along the edge): for c on the edge, every POI within `reach`
//!   of c is in it, so a d_n(c) or a ball no larger than `reach` is exact there, and a larger one is
//!   asked of the R-tree. Segments are [`EdgePiece`]s (a meridian or a parallel arc), whose extremes
//!   of a linear function need no trigonometry. Each p of N outside the box is decided on the
//!   segment: with unit vectors, "x is closer to q than to p" is `x · (p − q) < 0`, linear in x; first
//!   over the whole segment (p is out there at once when n POIs of N are closer everywhere on it),
//!   then at the segment's point closest to p (a witness when fewer than n of N may precede p there),
//!   then by a branch and bound over sub-segments: per sub-segment a cheap bound (`c · w ± |w| far`)
//!   settles most q, and the exact extremes over the sub-segment ([`EdgePiece::linear_range`]) the
//!   rest. The q closer than p everywhere (by more than [`TIE_RAD`]) are counted (p is out there once
//!   they reach n) and those whose bisector with p crosses it kept
//!   (the centre is a witness when both together stay below n). p is out of the list when it is out on
//!   every segment whose ball holds it.
//!
//! *Nearest 1* takes a faster exact path first ([`walk`]): the POIs inside the box (each unless an
//! earlier-id twin sits at the same place) and the owners of the Voronoi cells the boundary crosses,
//! found by walking each edge from its start to its end, one exit point per cell, with the rivals
//! from one R-tree fetch per box. Every tie it would have to break by rounding (and crowded POIs,
//! boxes beyond 80° of latitude) sends the box to the search above, so the list is that search's
//! list, box for box (`walk::tests::walk_matches_the_general_search`).
use std::collections::HashMap;

use super::sphere::{self, EdgePiece, SphBox, Vec3};
use super::{Limits, PoiIndex, Query, QueryError};

mod disc;
mod walk;
pub use disc::{Disc, query_disc};
pub use walk::{WALK_CROWDED, WALK_TWIN};

/// Ties finer than this angle (radians, about 0.06 mm on the Earth) between a point and the bisector of
/// two POIs are not decided; a POI whose membership depends only on such ties is kept.
pub const TIE_RAD: f64 = 1e-11;
/// A range candidate may lie this much (metres) beyond the radius, for rounding.
pub const RANGE_SLACK_M: f64 = 1e-6;
/// Sub-boxes smaller than this (radians of arc, about 0.6 mm) are not split further.
const MIN_EXTENT_RAD: f64 = 1e-10;
/// Sub-boxes examined per POI before it is kept undecided.
const NODE_BUDGET: usize = 4096;
/// Within this chord (about 6 mm) of each other, two POIs at different places make the rank of a POI
/// at its own place a search instead of a count of its twins.
pub const CROWD_CHORD: f64 = 1e-9;
/// Boundary segments are not split below this half-length (metres).
const MIN_SEGMENT_M: f64 = 1.0;
/// Most boundary segments per nearest query (past it, segments stay longer and hold more POIs).
const SEGMENT_BUDGET: usize = 4096;

/// A candidate list: the POIs' input positions (ascending; see [`PoiIndex`]), with a witness point (degrees) per candidate where one
/// was found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Candidates {
    pub pois: Vec<u32>,
    /// `witnesses[i]` is a point of the box whose exact answer holds `pois[i]`, or `None` when the
    /// candidate was kept undecided.
    pub witnesses: Vec<Option<(f64, f64)>>,
    /// Candidates kept without a witness.
    pub undecided: usize,
    /// Size of the superset the exact filter examined.
    pub examined: usize,
}

impl Candidates {
    fn push(&mut self, poi: u32, witness: Option<(f64, f64)>) {
        self.pois.push(poi);
        self.undecided += usize::from(witness.is_none());
        self.witnesses.push(witness);
    }
}

enum Relation {
    /// q is closer than p at every point of the sub-box (or ties it there and precedes it by id).
    Before,
    /// q is never closer than p in the sub-box.
    After,
    /// The bisector of p and q crosses the sub-box (within [`TIE_RAD`]).
    Crossing,
}

fn deg(lat: f64, lon: f64) -> (f64, f64) {
    (lat.to_degrees(), lon.to_degrees())
}

fn expand(envelope: (Vec3, Vec3), by: f64) -> rstar::AABB<Vec3> {
    let (lo, hi) = envelope;
    rstar::AABB::from_corners(
        [lo[0] - by, lo[1] - by, lo[2] - by],
        [hi[0] + by, hi[1] + by, hi[2] + by],
    )
}

impl PoiIndex {
    /// The candidate list of a query over a box (the query validated by the caller). An unknown
    /// category has no POIs, so its list is empty. A list longer than `limits.max_candidates` is
    /// refused (`query`), as soon as that is known.
    pub fn candidates(
        &self,
        category: &str,
        query: &Query,
        b: &SphBox,
        limits: &Limits,
    ) -> Result<Candidates, QueryError> {
        let list = match *query {
            Query::Nearest { count: 1 } => {
                let walked = self
                    .trees
                    .get(category)
                    .and_then(|tree| self.nearest_one(tree, b, limits));
                match walked {
                    Some(list) => list?,
                    None => self.nearest(category, 1, b, limits)?,
                }
            }
            Query::Nearest { count } => self.nearest(category, count as usize, b, limits)?,
            Query::Range { radius_m } => self.range(category, radius_m, b, limits)?,
        };
        if list.pois.len() > limits.max_candidates {
            return Err(too_many(limits));
        }
        Ok(self.in_input_order(list))
    }

    /// The list with the POIs' input positions, ascending, in place of the index's numbers.
    fn in_input_order(&self, mut list: Candidates) -> Candidates {
        let mut pairs: Vec<(u32, Option<(f64, f64)>)> = list
            .pois
            .iter()
            .map(|&p| self.input_of(p))
            .zip(list.witnesses.iter().copied())
            .collect();
        pairs.sort_unstable_by_key(|pair| pair.0);
        list.pois.clear();
        list.witnesses.clear();
        for (p, witness) in pairs {
            list.pois.push(p);
            list.witnesses.push(witness);
        }
        list
    }

    fn range(
        &self,
        category: &str,
        radius_m: f64,
        b: &SphBox,
        limits: &Limits,
    ) -> Result<Candidates, QueryError> {
        let mut out = Candidates::default();
        let Some(tree) = self.trees.get(category) else {
            return Ok(out);
        };
        let envelope = expand(b.envelope(), sphere::chord_of_m(radius_m) + 1e-12);
        let mut found: Vec<(u32, (f64, f64))> = Vec::new();
        for entry in tree.locate_in_envelope_intersecting(envelope) {
            out.examined += 1;
            let (lat_deg, lon_deg) = self.place(entry.data);
            let (lat, lon) = (lat_deg.to_radians(), lon_deg.to_radians());
            let (d, at) = if b.contains(lat, lon) {
                (0.0, (lat_deg, lon_deg))
            } else if b.contains(lat.clamp(b.lat0, b.lat1), lon) {
                // North or south of the box: the closest point is on the same meridian.
                let edge = lat.clamp(b.lat0, b.lat1);
                (
                    (lat - edge).abs() * sphere::EARTH_RADIUS_M,
                    (edge.to_degrees(), lon_deg),
                )
            } else {
                b.closest_point_m(entry.geom(), (lat_deg, lon_deg))
            };
            if d <= radius_m + RANGE_SLACK_M {
                found.push((entry.data, at));
                if found.len() > limits.max_candidates {
                    return Err(too_many(limits));
                }
            }
        }
        found.sort_by_key(|f| f.0);
        for (poi, at) in found {
            out.push(poi, Some(at));
        }
        Ok(out)
    }

    /// The verdict on a POI inside the box: the box holds the POI's own place, where only POIs at the
    /// same place (or within [`CROWD_CHORD`]) can precede it.
    fn inside_verdict(&self, tree: &rstar::RTree<super::Entry>, p: u32, n: usize) -> Decision {
        let place = self.place(p);
        let twins = self.twins_before[p as usize] as usize;
        if !self.crowded[p as usize] {
            // Only the twins are at distance 0; every other POI is farther.
            return if twins < n {
                Decision::Witness(place)
            } else {
                Decision::Out
            };
        }
        if self.among_nearest_at(tree, p, n, &self.units[p as usize]) {
            Decision::Witness(place)
        } else if twins >= n {
            // n POIs at the same place precede it by id everywhere.
            Decision::Out
        } else {
            Decision::Undecided
        }
    }

    fn nearest(
        &self,
        category: &str,
        n: usize,
        b: &SphBox,
        limits: &Limits,
    ) -> Result<Candidates, QueryError> {
        let mut out = Candidates::default();
        let Some(tree) = self.trees.get(category) else {
            return Ok(out);
        };
        if tree.size() <= n {
            // Every POI of the category is among the n nearest of every point.
            let mut all: Vec<u32> = tree.iter().map(|e| e.data).collect();
            all.sort_unstable();
            out.examined = all.len();
            let (clat, clon) = b.centre();
            for poi in all {
                out.push(poi, Some(deg(clat, clon)));
            }
            return Ok(out);
        }
        // The POIs inside the box, each decided at its own place.
        let mut verdicts: HashMap<u32, Decision, foldhash::fast::FixedState> = HashMap::default();
        let mut kept = 0;
        for entry in tree.locate_in_envelope_intersecting(expand(b.envelope(), 1e-12)) {
            let (lat, lon) = self.place(entry.data);
            if !b.contains(lat.to_radians(), lon.to_radians()) {
                continue;
            }
            let verdict = self.inside_verdict(tree, entry.data, n);
            if !matches!(verdict, Decision::Out) {
                kept += 1;
                if kept > limits.max_candidates {
                    return Err(too_many(limits));
                }
            }
            verdicts.insert(entry.data, verdict);
        }
        // The POIs outside: decided on the boundary, segment by segment, edge by edge.
        let edges = [
            EdgePiece::parallel(b.lat0, b.lon0, b.lon1),
            EdgePiece::parallel(b.lat1, b.lon0, b.lon1),
            EdgePiece::meridian(b.lon0, b.lat0, b.lat1),
            EdgePiece::meridian(b.lon1, b.lat0, b.lat1),
        ];
        let mut segments = 0;
        // The ball of the segment, nearest to its centre first.
        let mut near: Vec<u32> = Vec::new();
        let mut scratch: Vec<(f64, u32)> = Vec::new();
        for (e, edge) in edges.iter().enumerate() {
            let hood = Neighbourhood::new(self, tree, edge, n);
            let mut stack = vec![*edge];
            while let Some(segment) = stack.pop() {
                let (clat, clon) = segment.centre();
                let centre = sphere::unit_of_rad(clat, clon);
                let far_m = segment.radius_rad() * sphere::EARTH_RADIUS_M;
                let Some(d_n2) = hood.nth_nearest_2(&centre, n, &mut scratch).or_else(|| {
                    tree.nearest_neighbor_iter_with_distance_2(centre)
                        .nth(n - 1)
                        .map(|(_, d2)| d2)
                }) else {
                    continue;
                };
                let d_n = sphere::m_of_chord(d_n2.sqrt());
                let pending = segments + stack.len() + (edges.len() - e) + 1;
                if far_m > d_n && far_m > MIN_SEGMENT_M && pending <= SEGMENT_BUDGET {
                    stack.extend(segment.split());
                    continue;
                }
                // Every point x of the segment has its n nearest within d_n + far of x, so
                // within d_n + 2 far of the centre.
                let reach = sphere::chord_of_m(d_n + 2.0 * far_m + 1e-6) + 1e-12;
                if !hood.within(&centre, reach, &self.input, &mut scratch) {
                    scratch.clear();
                    for (entry, d2) in tree.nearest_neighbor_iter_with_distance_2(centre) {
                        if d2 > reach * reach {
                            break;
                        }
                        scratch.push((d2, entry.data));
                    }
                }
                near.clear();
                near.extend(scratch.iter().map(|s| s.1));
                segments += 1;
                for &p in &near {
                    let known = verdicts.get(&p);
                    if matches!(known, Some(Decision::Witness(_)))
                        || (known.is_some() && {
                            let (lat, lon) = self.place(p);
                            b.contains(lat.to_radians(), lon.to_radians())
                        })
                    {
                        continue;
                    }
                    let verdict = self.decide_on(p, &near, n, &segment);
                    match (verdict, known) {
                        (Decision::Witness(at), _) => {
                            verdicts.insert(p, Decision::Witness(at));
                        }
                        (Decision::Undecided, _) => {
                            verdicts.insert(p, Decision::Undecided);
                        }
                        (Decision::Out, None) => {
                            verdicts.insert(p, Decision::Out);
                        }
                        (Decision::Out, Some(_)) => {}
                    }
                }
            }
        }
        out.examined = verdicts.len();
        let mut listed: Vec<(u32, Option<(f64, f64)>)> = verdicts
            .into_iter()
            .filter_map(|(p, verdict)| match verdict {
                Decision::Witness(at) => Some((p, Some(at))),
                Decision::Undecided => Some((p, None)),
                Decision::Out => None,
            })
            .collect();
        if listed.len() > limits.max_candidates {
            return Err(too_many(limits));
        }
        listed.sort_unstable_by_key(|l| l.0);
        for (p, witness) in listed {
            out.push(p, witness);
        }
        Ok(out)
    }

    fn relation(&self, p: u32, q: u32, cell: &Cell) -> Relation {
        let (pu, qu) = (&self.units[p as usize], &self.units[q as usize]);
        if pu == qu {
            return if self.id_rank[q as usize] < self.id_rank[p as usize] {
                Relation::Before
            } else {
                Relation::After
            };
        }
        // x · w > 0 exactly where x is closer to p.
        let w = sphere::sub(pu, qu);
        let norm = sphere::norm(&w);
        let tie = TIE_RAD * norm;
        // First the cheap bound: x · w = c · w + (x − c) · w with |x − c| <= the cell's radius.
        let at_centre = sphere::dot(&cell.centre, &w);
        let spread = norm * cell.radius;
        if at_centre + spread < -tie {
            return Relation::Before;
        }
        if at_centre - spread > tie {
            return Relation::After;
        }
        let (min, max) = cell.piece.linear_range(&w);
        if max < -tie {
            Relation::Before
        } else if min > tie {
            Relation::After
        } else {
            Relation::Crossing
        }
    }

    /// Whether q may precede p at the point x (unit vector): closer, tied within [`TIE_RAD`], or
    /// equal and before it by id. Counting these is conservative for a witness.
    fn may_precede(&self, p: u32, q: u32, x: &Vec3) -> bool {
        let (pu, qu) = (&self.units[p as usize], &self.units[q as usize]);
        if pu == qu {
            return self.id_rank[q as usize] < self.id_rank[p as usize];
        }
        let w = sphere::sub(pu, qu);
        // x · w <= TIE_RAD |w|, without the square root.
        let d = sphere::dot(x, &w);
        d <= 0.0 || d * d <= TIE_RAD * TIE_RAD * sphere::dot(&w, &w)
    }

    /// Whether fewer than n POIs may precede p at x, walking the R-tree outwards from x until
    /// past p's distance.
    fn among_nearest_at(
        &self,
        tree: &rstar::RTree<super::Entry>,
        p: u32,
        n: usize,
        x: &Vec3,
    ) -> bool {
        let pu = &self.units[p as usize];
        let d2_p = {
            let d = sphere::sub(pu, x);
            sphere::dot(&d, &d)
        };
        let mut before = 0;
        for (entry, d2) in tree.nearest_neighbor_iter_with_distance_2(*x) {
            // |x − q|² − |x − p|² = 2 x · (p − q) and |p − q| <= |x − p| + |x − q|: past this,
            // no q (nor any farther one) may precede p even within the tie tolerance.
            if d2 > d2_p + 2.0 * TIE_RAD * (d2_p.sqrt() + d2.sqrt()) + 1e-24 {
                return true;
            }
            if entry.data != p && self.may_precede(p, entry.data, x) {
                before += 1;
                if before >= n {
                    return false;
                }
            }
        }
        true
    }

    /// Decides p on a segment of the box's boundary given `near`, a set that holds the n nearest
    /// POIs of every point of the segment (p may be in it; it is skipped).
    fn decide_on(&self, p: u32, near: &[u32], n: usize, segment: &EdgePiece) -> Decision {
        let pu = self.units[p as usize];
        // First the whole segment: most POIs of the ball have n others closer everywhere on it (the
        // ball is nearest to the centre first, so those come first). No allocation on that path.
        let root = Cell::new(*segment);
        let mut before = 0;
        let mut crossing = Vec::new();
        for &q in near {
            if q == p {
                continue;
            }
            match self.relation(p, q, &root) {
                Relation::Before => {
                    before += 1;
                    if before >= n {
                        return Decision::Out;
                    }
                }
                Relation::After => {}
                Relation::Crossing => crossing.push(q),
            }
        }
        if before + crossing.len() < n {
            let (clat, clon) = root.piece.centre();
            return Decision::Witness(deg(clat, clon));
        }
        // The point of the segment closest to p: p's best chance. The POIs before p on the whole
        // segment precede it there, those after it never do.
        let (lat, lon) = segment.closest_to(&pu);
        let at = deg(lat, lon);
        let x = sphere::unit(at.0, at.1);
        let preceding = before
            + crossing
                .iter()
                .filter(|&&q| self.may_precede(p, q, &x))
                .take(n - before)
                .count();
        if preceding < n {
            return Decision::Witness(at);
        }
        let mut stack = vec![(root, crossing, before)];
        let mut nodes = 0;
        let mut undecided = false;
        while let Some((cell, crossing, before)) = stack.pop() {
            nodes += 1;
            let mut before = before;
            let mut still = Vec::with_capacity(crossing.len());
            for q in crossing {
                match self.relation(p, q, &cell) {
                    Relation::Before => before += 1,
                    Relation::After => {}
                    Relation::Crossing => still.push(q),
                }
                if before >= n {
                    break;
                }
            }
            if before >= n {
                continue;
            }
            let (clat, clon) = cell.piece.centre();
            if before + still.len() < n {
                return Decision::Witness(deg(clat, clon));
            }
            let at_centre = before
                + still
                    .iter()
                    .filter(|&&q| self.may_precede(p, q, &cell.centre))
                    .take(n - before)
                    .count();
            if at_centre < n {
                return Decision::Witness(deg(clat, clon));
            }
            if cell.piece.extent() < MIN_EXTENT_RAD || nodes >= NODE_BUDGET {
                undecided = true;
                continue;
            }
            // Depth first, the half nearer p first (pushed last).
            let [a, c] = cell.piece.split().map(Cell::new);
            let (near, far) = if sphere::dot(&a.centre, &pu) >= sphere::dot(&c.centre, &pu) {
                (a, c)
            } else {
                (c, a)
            };
            stack.push((far, still.clone(), before));
            stack.push((near, still, before));
        }
        if undecided {
            Decision::Undecided
        } else {
            Decision::Out
        }
    }

    /// The naive superset the candidate lists are measured against: every POI of the category inside
    /// the box grown on each side by D (a lat/lon rectangle), where D is r for range and, for
    /// nearest n, the largest distance from a corner to its n-th nearest POI plus the box's diagonal.
    pub fn naive_superset_len(&self, category: &str, query: &Query, b: &SphBox) -> usize {
        let Some(tree) = self.trees.get(category) else {
            return 0;
        };
        let grow_m = match *query {
            Query::Range { radius_m } => radius_m,
            Query::Nearest { count } => {
                let n = count as usize;
                let mut largest: f64 = 0.0;
                for (lat, lon) in b.corners() {
                    let corner = sphere::unit_of_rad(lat, lon);
                    match tree
                        .nearest_neighbor_iter_with_distance_2(corner)
                        .nth(n - 1)
                    {
                        Some((_, d2)) => largest = largest.max(sphere::m_of_chord(d2.sqrt())),
                        None => return tree.size(),
                    }
                }
                let diagonal = sphere::haversine_m(
                    b.lat0.to_degrees(),
                    b.lon0.to_degrees(),
                    b.lat1.to_degrees(),
                    b.lon1.to_degrees(),
                );
                largest + diagonal
            }
        };
        let dlat = grow_m / sphere::EARTH_RADIUS_M;
        let lat0 = (b.lat0 - dlat).max(-std::f64::consts::FRAC_PI_2);
        let lat1 = (b.lat1 + dlat).min(std::f64::consts::FRAC_PI_2);
        let cos = lat0.cos().min(lat1.cos()).max(1e-9);
        let dlon = (dlat / cos).min(std::f64::consts::PI);
        let grown = SphBox {
            lat0,
            lat1,
            lon0: b.lon0 - dlon,
            lon1: b.lon1 + dlon,
        };
        let envelope = expand(grown.envelope(), 1e-12);
        tree.locate_in_envelope_intersecting(envelope)
            .filter(|e| {
                let (lat, lon) = self.place(e.data);
                grown.contains(lat.to_radians(), lon.to_radians())
            })
            .count()
    }
}

fn too_many(limits: &Limits) -> QueryError {
    QueryError {
        field: "query",
        rule: format!(
            "the candidate list would hold more than {} POIs; ask with a smaller count, radius or tolerance",
            limits.max_candidates
        ),
    }
}

/// A piece of a segment with its centre's unit vector and a bound of its radius, for the cheap test.
struct Cell {
    piece: EdgePiece,
    centre: Vec3,
    radius: f64,
}

impl Cell {
    fn new(piece: EdgePiece) -> Cell {
        let (clat, clon) = piece.centre();
        Cell {
            piece,
            centre: sphere::unit_of_rad(clat, clon),
            radius: piece.radius_rad(),
        }
    }
}

/// The POIs near one edge of the box, fetched from the R-tree once for all of the edge's segments:
/// every POI of the category within the chord `reach` of the edge (the edge's 3D envelope grown by
/// it), sorted by their coordinate along `axis`, a unit vector. The POIs within a chord r of a point
/// x are among those whose coordinate is within r of x's (`|(q − x) · axis| <= |q − x|`), and for x on
/// the edge and r <= `reach` they are all here; past `reach` the caller asks the R-tree.
struct Neighbourhood {
    axis: Vec3,
    reach: f64,
    /// (coordinate along `axis`, unit vector, POI), ascending.
    pois: Vec<(f64, Vec3, u32)>,
}

impl Neighbourhood {
    /// How far the neighbourhood reaches, in units of the distance from the edge's middle to its
    /// n-th nearest POI (a segment's ball reaches about 3 of its own).
    const SPAN: f64 = 4.0;

    fn new(
        index: &PoiIndex,
        tree: &rstar::RTree<super::Entry>,
        edge: &EdgePiece,
        n: usize,
    ) -> Self {
        let axis = edge.axis();
        let (clat, clon) = edge.centre();
        let centre = sphere::unit_of_rad(clat, clon);
        let reach = match tree
            .nearest_neighbor_iter_with_distance_2(centre)
            .nth(n - 1)
        {
            Some((_, d2)) => Self::SPAN * d2.sqrt(),
            None => 0.0,
        };
        let mut pois: Vec<(f64, Vec3, u32)> = tree
            .locate_in_envelope_intersecting(expand(edge.as_box().envelope(), reach + 1e-12))
            .map(|e| {
                let u = index.units[e.data as usize];
                (sphere::dot(&u, &axis), u, e.data)
            })
            .collect();
        pois.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        Neighbourhood { axis, reach, pois }
    }

    /// The range of `pois` whose coordinate is within `r` of x's.
    fn window(&self, x: &Vec3, r: f64) -> &[(f64, Vec3, u32)] {
        let key = sphere::dot(x, &self.axis);
        let lo = self.pois.partition_point(|p| p.0 < key - r);
        let hi = self.pois.partition_point(|p| p.0 <= key + r);
        &self.pois[lo..hi.max(lo)]
    }

    /// The squared chord from x (a point of the edge) to its n-th nearest POI, when that POI is
    /// within `reach` (else `None`: farther POIs are not all here). `scratch` is overwritten.
    fn nth_nearest_2(&self, x: &Vec3, n: usize, scratch: &mut Vec<(f64, u32)>) -> Option<f64> {
        let reach2 = self.reach * self.reach;
        // The n smallest squared chords within reach, ascending (n is small).
        scratch.clear();
        for (_, u, q) in self.window(x, self.reach) {
            let d = sphere::sub(u, x);
            let d2 = sphere::dot(&d, &d);
            let bound = if scratch.len() == n {
                scratch[n - 1].0
            } else {
                reach2
            };
            if d2 > bound {
                continue;
            }
            let at = scratch.partition_point(|s| s.0 <= d2);
            if at >= n {
                continue;
            }
            if scratch.len() == n {
                scratch.pop();
            }
            scratch.insert(at, (d2, *q));
        }
        (scratch.len() == n).then(|| scratch[n - 1].0)
    }

    /// Whether every POI within the chord r of x (a point of the edge) is here; if so, `scratch`
    /// gets them (squared chord, POI), nearest first (equal ones by input position, `input`).
    fn within(&self, x: &Vec3, r: f64, input: &[u32], scratch: &mut Vec<(f64, u32)>) -> bool {
        if r > self.reach {
            return false;
        }
        scratch.clear();
        for (_, u, q) in self.window(x, r) {
            let d = sphere::sub(u, x);
            let d2 = sphere::dot(&d, &d);
            if d2 <= r * r {
                scratch.push((d2, *q));
            }
        }
        scratch.sort_unstable_by(|a, b| {
            a.0.total_cmp(&b.0)
                .then_with(|| input[a.1 as usize].cmp(&input[b.1 as usize]))
        });
        true
    }
}

enum Decision {
    Witness((f64, f64)),
    Undecided,
    Out,
}
