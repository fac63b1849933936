//! Nearest n = 1: the box's boundary walked through the Voronoi cells it crosses.
//!
//! For n = 1 the candidates are the POIs inside the box (each unless an earlier-id twin sits at the
//! same place) and the owners of the boundary's points: a cell is star-shaped around its POI, so an
//! outside POI's cell meets the box exactly when it meets the boundary. Each of the four edges
//! (a meridian or a parallel arc with parameter `t`, latitude or longitude) is walked from its start:
//! the owner there is the nearest POI (ties by id), then repeatedly the exit point where a rival q
//! becomes as close as the owner p and q takes over, until the end of the edge. With unit vectors,
//! `g(t) = x(t) · (q − p)` is positive exactly where q is closer, and along either kind of edge it is
//! `a cos t + b sin t + c` (c = 0 on a meridian), so q's first upward crossing after t is
//! `atan2(b, a) − acos(−c / hypot(a, b))`; a rival without one before the current best exit is
//! skipped from the signs of g and g′ at the two ends, without trigonometry.
//!
//! Invariants:
//! - **complete rivals**: one R-tree query per box fetches every POI within the chord `reach` of the
//!   box (its 3D envelope grown by it); each edge keeps those within `reach` of its circle (a band),
//!   sorted by their coordinate along the edge's chord (monotone along the edge). Where the owner p
//!   is within M of every point of the stretch [t, t′] being decided, only POIs whose coordinate lies
//!   within M of the stretch's can be closer somewhere on it, so only those are tried, nearest in
//!   coordinate first, and every better exit shrinks t′ and M. The first reach is twice the largest
//!   distance from a corner to its nearest POI. When some stretch's M exceeds it, the walk still
//!   goes on over the POIs at hand (the nearest of a subset is never nearer than the nearest of all,
//!   so the largest M it meets bounds every boundary point's nearest distance) and the box is
//!   fetched once more with that reach; the list comes only from a walk whose every M is within
//!   its reach.
//! - **inside**: a POI is inside when it is on the inner side of the four edges' linear tests
//!   ([`Edge::offset`]); within [`SIDE_MARGIN`] of a side its degrees decide, as
//!   `SphBox::contains` does for the general search.
//! - **exact or general**: every tie that the walk would have to break by rounding goes to the
//!   general search (`PoiIndex::nearest`), which keeps undecided POIs rather than dropping them: a
//!   rival tied with the owner at the current point (within [`TIE_RAD`]), two exits closer than
//!   [`EXIT_GAP_RAD`], an exit within that gap of an edge's end, a nearly tangent crossing (the rival
//!   closer only on an arc shorter than [`TANGENT_RAD`] either side of its peak, where the root is
//!   ill-conditioned), a POI with another within [`super::CROWD_CHORD`], a box beyond
//!   [`LAT_LIMIT_RAD`] of latitude, or a walk past its step or fetch budget. So the list is the
//!   general search's list; `tests::walk_matches_the_general_search` checks it box by box.
//! - **witnesses**: an inside POI's own place; an owner's, the middle of a stretch it owns.
use std::f64::consts::{PI, TAU};

use rstar::RTree;

use super::super::sphere::{self, SphBox, Vec3};
use super::super::{Entry, Limits, PoiIndex, QueryError};
use super::{Candidates, TIE_RAD, deg, expand, too_many};

/// Two exits closer than this (radians of arc, about 6 mm) are a tie the walk does not break.
pub const EXIT_GAP_RAD: f64 = 1e-9;
/// A rival closer than the owner only within this (radians, about 6 m) of its peak advantage is a
/// nearly tangent crossing, whose root rounding could misplace: the box goes to the general search.
pub const TANGENT_RAD: f64 = 1e-6;
/// Boxes reaching beyond this latitude (80°) go to the general search (parallels near a pole bend
/// too much for the coordinate windows' bounds to stay tight).
pub const LAT_LIMIT_RAD: f64 = 80.0 * PI / 180.0;
/// Fetches per box before the general search takes over (the second one reaches far enough unless
/// an edge found no POI at all in the first).
const MAX_FETCHES: usize = 6;
/// `PoiIndex::walk_class` of a POI with another one within [`super::CROWD_CHORD`]: the general search.
pub const WALK_CROWDED: u8 = 2;
/// `PoiIndex::walk_class` of a POI preceded by a twin (same place, earlier id): never the nearest.
pub const WALK_TWIN: u8 = 1;
/// Within this of a box's side (in the linear tests of [`Edge::offset`]), whether a POI is inside is
/// decided from its degrees as `SphBox::contains` does.
const SIDE_MARGIN: f64 = 1e-12;
/// Exits per edge before the general search takes over.
const MAX_STEPS: usize = 1 << 16;

/// What a walk came to.
enum Walk {
    Done,
    /// A tie or a budget (which): the general search decides the box.
    General(&'static str),
}

/// What one fetch and walk came to.
enum Fetched {
    List(Candidates),
    General(&'static str),
    /// A reach this large is needed.
    Farther(f64),
    TooMany,
}

/// One edge: a meridian (fixed longitude, `t` the latitude) or a parallel (fixed latitude, `t` the
/// longitude) from `t0` to `t1`.
struct Edge {
    meridian: bool,
    fixed: f64,
    /// The fixed angle's (cos, sin).
    fixed_cs: (f64, f64),
    t0: f64,
    t1: f64,
    /// The unit chord direction from start to end (any unit vector for a point).
    axis: Vec3,
}

impl Edge {
    fn new(meridian: bool, fixed: f64, t0: f64, t1: f64) -> Edge {
        let (sin, cos) = fixed.sin_cos();
        let mut edge = Edge {
            meridian,
            fixed,
            fixed_cs: (cos, sin),
            t0,
            t1,
            axis: [1.0, 0.0, 0.0],
        };
        let d = sphere::sub(&edge.at(t1).0, &edge.at(t0).0);
        let len = sphere::norm(&d);
        if len > 0.0 {
            edge.axis = [d[0] / len, d[1] / len, d[2] / len];
        }
        edge
    }

    /// `(a, b, c)` with `x(t) · w = a cos t + b sin t + c`.
    fn coeffs(&self, w: &Vec3) -> (f64, f64, f64) {
        let (cf, sf) = self.fixed_cs;
        if self.meridian {
            (w[0] * cf + w[1] * sf, w[2], 0.0)
        } else {
            (cf * w[0], cf * w[1], sf * w[2])
        }
    }

    /// The unit vector at `t`, with `(cos t, sin t)`.
    fn at(&self, t: f64) -> (Vec3, (f64, f64)) {
        let (st, ct) = t.sin_cos();
        let (cf, sf) = self.fixed_cs;
        let x = if self.meridian {
            [ct * cf, ct * sf, st]
        } else {
            [cf * ct, cf * st, sf]
        };
        (x, (ct, st))
    }

    /// (latitude, longitude) in radians at `t`.
    fn latlon(&self, t: f64) -> (f64, f64) {
        if self.meridian {
            (t, self.fixed)
        } else {
            (self.fixed, t)
        }
    }

    /// The signed offset of u from the edge's circle in a linear test: for a meridian its distance
    /// to the meridian's plane (`cos φ sin(λ − fixed)`, positive east of it), for a parallel its z
    /// minus the parallel's (positive north of it). Either is at most the chord from u to any point
    /// of the edge, and its sign says on which side of the edge u lies.
    fn offset(&self, u: &Vec3) -> f64 {
        let (cf, sf) = self.fixed_cs;
        if self.meridian {
            u[1] * cf - u[0] * sf
        } else {
            u[2] - sf
        }
    }
}

/// The walk's working lists, kept per thread between boxes so that a box allocates only its
/// answer instead of growing four bands and a list afresh (measured: about 6 % more nearest-1
/// answers per second, docs/provider.md).
#[derive(Default)]
struct Scratch {
    /// Per edge, the POIs within the reach of its circle.
    bands: [Vec<Banded>; 4],
    /// The POIs listed so far, with their witnesses.
    listed: Vec<(u32, Option<(f64, f64)>)>,
}

impl Scratch {
    /// Entries a list keeps room for between boxes; a larger one (a box of many kilometres in a
    /// dense town) gives its memory back.
    const KEPT: usize = 4096;

    fn release_if_large(&mut self) {
        for band in &mut self.bands {
            if band.capacity() > Self::KEPT {
                *band = Vec::new();
            }
        }
        if self.listed.capacity() > Self::KEPT {
            self.listed = Vec::new();
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// A POI of an edge's band: its coordinate along the edge, its offset from the edge's circle
/// ([`Edge::offset`]), its unit vector and index.
struct Banded {
    key: f64,
    off: f64,
    unit: Vec3,
    poi: u32,
}

/// A point of the walk: its parameter, unit vector and (cos t, sin t).
#[derive(Clone, Copy)]
struct Point {
    t: f64,
    x: Vec3,
    cs: (f64, f64),
}

impl Point {
    fn new(edge: &Edge, t: f64) -> Point {
        let (x, cs) = edge.at(t);
        Point { t, x, cs }
    }
}

fn chord(a: &Vec3, b: &Vec3) -> f64 {
    sphere::norm(&sphere::sub(a, b))
}

impl PoiIndex {
    /// The nearest-1 list by the walk, or `None` when the general search must decide the box.
    pub(super) fn nearest_one(
        &self,
        tree: &RTree<Entry>,
        b: &SphBox,
        limits: &Limits,
    ) -> Option<Result<Candidates, QueryError>> {
        self.walk_one(tree, b, limits).ok()
    }

    /// The walk's list, or why the general search must decide the box.
    fn walk_one(
        &self,
        tree: &RTree<Entry>,
        b: &SphBox,
        limits: &Limits,
    ) -> Result<Result<Candidates, QueryError>, &'static str> {
        if tree.size() <= 1 || b.lat0 < -LAT_LIMIT_RAD || b.lat1 > LAT_LIMIT_RAD {
            return Err("pole or a single POI");
        }
        // A first reach from the corners' nearest POIs: twice the largest distance.
        let mut reach: f64 = 0.0;
        for (lat, lon) in b.corners() {
            let corner = sphere::unit_of_rad(lat, lon);
            let nearest = tree.nearest_neighbor(corner).ok_or("empty")?;
            reach = reach.max(chord(nearest.geom(), &corner));
        }
        reach = 2.0 * reach + 1e-9;
        for _ in 0..MAX_FETCHES {
            match self.walk_box(tree, b, limits, reach) {
                Fetched::List(list) => return Ok(Ok(list)),
                Fetched::General(why) => return Err(why),
                Fetched::Farther(farther) => reach = farther,
                Fetched::TooMany => return Ok(Err(too_many(limits))),
            }
        }
        Err("fetch budget")
    }

    /// One fetch and walk. When a stretch's owner is farther than
    /// `reach`, the walk goes on with the POIs at hand: the nearest of a subset is never nearer than
    /// the nearest of all, so the largest distance it meets bounds the reach a second fetch needs.
    fn walk_box(&self, tree: &RTree<Entry>, b: &SphBox, limits: &Limits, reach: f64) -> Fetched {
        SCRATCH.with_borrow_mut(|scratch| {
            for band in &mut scratch.bands {
                band.clear();
            }
            scratch.listed.clear();
            let fetched = self.walk_box_in(tree, b, limits, reach, scratch);
            scratch.release_if_large();
            fetched
        })
    }

    fn walk_box_in(
        &self,
        tree: &RTree<Entry>,
        b: &SphBox,
        limits: &Limits,
        reach: f64,
        scratch: &mut Scratch,
    ) -> Fetched {
        // South, north, west, east: inside is north of the first, south of the second, and so on.
        let edges = [
            Edge::new(false, b.lat0, b.lon0, b.lon1),
            Edge::new(false, b.lat1, b.lon0, b.lon1),
            Edge::new(true, b.lon0, b.lat0, b.lat1),
            Edge::new(true, b.lon1, b.lat0, b.lat1),
        ];
        let Scratch { bands, listed } = scratch;
        let mut examined = 0;
        for entry in tree.locate_in_envelope_intersecting(expand(b.envelope(), reach + 1e-12)) {
            examined += 1;
            let p = entry.data;
            match self.walk_class[p as usize] {
                WALK_CROWDED => return Fetched::General("crowded"),
                // Preceded by its twin everywhere: never the nearest.
                WALK_TWIN => continue,
                _ => {}
            }
            let u = entry.geom();
            let offsets = edges.each_ref().map(|edge| edge.offset(u));
            let sides = [offsets[0], -offsets[1], offsets[2], -offsets[3]];
            let inside = if sides.iter().all(|&s| s > SIDE_MARGIN) {
                true
            } else if sides.iter().any(|&s| s < -SIDE_MARGIN) {
                false
            } else {
                let (lat, lon) = self.place(p);
                b.contains(lat.to_radians(), lon.to_radians())
            };
            if inside {
                listed.push((p, Some(self.place(p))));
                if listed.len() > limits.max_candidates {
                    return Fetched::TooMany;
                }
            }
            for ((band, edge), off) in bands.iter_mut().zip(&edges).zip(offsets) {
                if off.abs() <= reach {
                    band.push(Banded {
                        key: sphere::dot(u, &edge.axis),
                        off,
                        unit: *u,
                        poi: p,
                    });
                }
            }
        }
        let mut need: f64 = 0.0;
        for (band, edge) in bands.iter_mut().zip(&edges) {
            band.sort_unstable_by(|x, y| {
                x.key
                    .total_cmp(&y.key)
                    .then_with(|| self.input_of(x.poi).cmp(&self.input_of(y.poi)))
            });
            if band.is_empty() {
                need = need.max(2.0 * reach);
                continue;
            }
            match self.walk_edge(edge, band, &mut need, listed) {
                Walk::Done => {}
                Walk::General(why) => return Fetched::General(why),
            }
        }
        if need > reach {
            return Fetched::Farther(need * (1.0 + 1e-6) + 1e-12);
        }
        // Inside POIs first: the stable sort keeps their own places as witnesses.
        listed.sort_by_key(|l| l.0);
        listed.dedup_by_key(|l| l.0);
        if listed.len() > limits.max_candidates {
            return Fetched::TooMany;
        }
        let mut out = Candidates {
            examined,
            ..Candidates::default()
        };
        out.pois.reserve_exact(listed.len());
        out.witnesses.reserve_exact(listed.len());
        for &(p, witness) in listed.iter() {
            out.push(p, witness);
        }
        Fetched::List(out)
    }

    /// Walks one edge through the cells it crosses, pushing each owner with a witness.
    fn walk_edge(
        &self,
        edge: &Edge,
        band: &[Banded],
        need: &mut f64,
        listed: &mut Vec<(u32, Option<(f64, f64)>)>,
    ) -> Walk {
        let end = Point::new(edge, edge.t1);
        let mut here = Point::new(edge, edge.t0);
        // The owner at the start: the nearest of the band, ties by id (a near tie is caught below).
        let Some(mut p) = band
            .iter()
            .map(|q| {
                let d = sphere::sub(&q.unit, &here.x);
                (sphere::dot(&d, &d), q.poi)
            })
            .min_by(|x, y| {
                x.0.total_cmp(&y.0)
                    .then(self.id_rank[x.1 as usize].cmp(&self.id_rank[y.1 as usize]))
            })
            .map(|m| m.1)
        else {
            return Walk::Done;
        };
        let mut prev: Option<u32> = None;
        let tie2 = TIE_RAD * TIE_RAD;
        for _ in 0..MAX_STEPS {
            let pu = self.units[p as usize];
            let (ap, bp, cp) = edge.coeffs(&pu);
            // Where on the circle p is farthest: inside a stretch, the stretch's largest distance.
            let trough = bp.atan2(ap) + PI;
            let trough_chord = (2.0 - 2.0 * (cp - ap.hypot(bp))).max(0.0).sqrt();
            let radius = |a: &Point, b: &Point| {
                let m = if (trough - a.t).rem_euclid(TAU) <= b.t - a.t {
                    trough_chord
                } else {
                    chord(&a.x, &pu).max(chord(&b.x, &pu))
                };
                m * (1.0 + 1e-9) + 1e-12
            };
            let key_here = sphere::dot(&here.x, &edge.axis);
            let mut exit = end;
            let mut m = radius(&here, &exit);
            let mut lo = key_here - m;
            let mut hi = sphere::dot(&exit.x, &edge.axis) + m;
            let mut next: Option<u32> = None;
            let mut tied = false;
            let start = band.partition_point(|e| e.key < key_here);
            let (mut up, mut down) = (start, start);
            loop {
                let up_ok = up < band.len() && band[up].key <= hi;
                let down_ok = down > 0 && band[down - 1].key >= lo;
                let i = match (up_ok, down_ok) {
                    (false, false) => break,
                    (true, false) => up,
                    (false, true) => down - 1,
                    (true, true) => {
                        if band[up].key - key_here <= key_here - band[down - 1].key {
                            up
                        } else {
                            down - 1
                        }
                    }
                };
                if i == up {
                    up += 1;
                } else {
                    down -= 1;
                }
                let rival = &band[i];
                // Farther than m from the edge's circle: farther than p from every point here.
                if rival.off.abs() > m || rival.poi == p {
                    continue;
                }
                let q = rival.poi;
                let w = sphere::sub(&rival.unit, &pu);
                let w2 = sphere::dot(&w, &w);
                if w2 == 0.0 {
                    return Walk::General("twins at one place");
                }
                let (a, bq, c) = edge.coeffs(&w);
                let (ct, st) = here.cs;
                let g_here = a * ct + bq * st + c;
                // Closer than p here, or tied within TIE_RAD: only the previous owner may be.
                if Some(q) != prev && (g_here >= 0.0 || g_here * g_here <= tie2 * w2) {
                    return Walk::General("tie at the current point");
                }
                // Whether q may reach p's distance before the current exit: at the exit, or at a
                // peak between (g′ rising here and falling there), within TIE_RAD.
                let (ce, se) = exit.cs;
                let g_exit = a * ce + bq * se + c;
                let r = a.hypot(bq);
                let near_tie = |g: f64| g >= 0.0 || g * g <= tie2 * w2;
                let peak_between = (-a * st + bq * ct) > 0.0 && (-a * se + bq * ce) < 0.0;
                if !(near_tie(g_exit) || (peak_between && near_tie(c + r))) {
                    continue;
                }
                if r == 0.0 {
                    return Walk::General("constant rival");
                }
                let ratio = -c / r;
                if ratio <= -1.0 {
                    // q at least as close everywhere on the circle: a tie at best.
                    return Walk::General("rival closer everywhere");
                }
                let half = if ratio >= 1.0 { 0.0 } else { ratio.acos() };
                if half < TANGENT_RAD {
                    return Walk::General("tangent crossing");
                }
                // The upward crossing, brought to the first one after here.
                let delta = (bq.atan2(a) - half - here.t).rem_euclid(TAU);
                if !(EXIT_GAP_RAD..=TAU - EXIT_GAP_RAD).contains(&delta) {
                    return Walk::General("exit at the current point");
                }
                let at = here.t + delta;
                if at < exit.t - EXIT_GAP_RAD {
                    exit = Point::new(edge, at);
                    next = Some(q);
                    tied = false;
                    m = radius(&here, &exit);
                    lo = key_here - m;
                    hi = sphere::dot(&exit.x, &edge.axis) + m;
                } else if at <= exit.t + EXIT_GAP_RAD {
                    // Two rivals (or a rival and the edge's end) at one point.
                    tied = true;
                }
            }
            if tied {
                return Walk::General("tie of two exits");
            }
            *need = need.max(m);
            let (lat, lon) = edge.latlon(0.5 * (here.t + exit.t));
            listed.push((p, Some(deg(lat, lon))));
            let Some(q) = next else {
                return Walk::Done;
            };
            prev = Some(p);
            p = q;
            here = exit;
        }
        Walk::General("step budget")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Read;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::super::super::generate::{Road, generate};
    use super::super::super::sphere::{EARTH_RADIUS_M, SphBox};
    use super::super::super::{Limits, Poi, PoiIndex, query_box};

    fn unlimited() -> Limits {
        Limits {
            max_candidates: usize::MAX / 16,
            ..Limits::default()
        }
    }

    /// The box with its south-west corner at (lat0, lon0), w_m wide and h_m high.
    fn box_m(lat0: f64, lon0: f64, w_m: f64, h_m: f64) -> SphBox {
        let m_per_deg = EARTH_RADIUS_M.to_radians();
        let dlat = h_m / m_per_deg;
        let dlon = w_m / (m_per_deg * lat0.to_radians().cos());
        query_box(lat0, lon0, lat0 + dlat, lon0 + dlon, &unlimited()).unwrap()
    }

    /// Whether the walk answers the box (else why not), and then with the general search's list.
    fn same_list(index: &PoiIndex, category: &str, b: &SphBox) -> Result<(), &'static str> {
        let limits = unlimited();
        let exact = index.nearest(category, 1, b, &limits).unwrap();
        let list = index.walk_one(&index.trees[category], b, &limits)?.unwrap();
        assert_eq!(list.pois, exact.pois, "{category} box {b:?}");
        assert_eq!((list.undecided, exact.undecided), (0, 0), "box {b:?}");
        Ok(())
    }

    /// Counts the boxes the walk answered and, by reason, those it declined.
    #[derive(Default, Debug)]
    struct Tally {
        walked: usize,
        declined: HashMap<&'static str, usize>,
    }

    impl Tally {
        fn add(&mut self, outcome: Result<(), &'static str>) {
            match outcome {
                Ok(()) => self.walked += 1,
                Err(why) => *self.declined.entry(why).or_default() += 1,
            }
        }

        fn declined(&self) -> usize {
            self.declined.values().sum()
        }
    }

    /// POIs in clusters of varied spread, some sharing coordinates, some on a coarse lattice (rounded
    /// coordinates make exact ties), one category.
    fn pois(rng: &mut ChaCha8Rng) -> Vec<Poi> {
        let count = rng.random_range(2..2_500);
        let spread = [0.0005, 0.005, 0.05][rng.random_range(0..3)];
        let lattice = rng.random_bool(0.25);
        let mut pois: Vec<Poi> = Vec::with_capacity(count);
        for i in 0..count {
            let (mut lat, mut lon) = if i > 0 && rng.random_bool(0.05) {
                let twin = &pois[rng.random_range(0..pois.len())];
                (twin.lat, twin.lon)
            } else {
                let centre = [(53.14, 8.21), (53.15, 8.23)][rng.random_range(0..2)];
                (
                    centre.0 + rng.random_range(-spread..spread),
                    centre.1 + rng.random_range(-spread..spread) * 1.6,
                )
            };
            if lattice && rng.random_bool(0.5) {
                lat = (lat * 1e4).round() / 1e4;
                lon = (lon * 1e4).round() / 1e4;
            }
            pois.push(Poi {
                id: format!("{:05}", rng.random_range(0..100_000)),
                lat,
                lon,
                category: "cafe".to_string(),
                name: String::new(),
            });
        }
        pois
    }

    /// The walk's list is the general search's, POI for POI (and neither has undecided POIs where the
    /// walk answers), on random POI sets and boxes from a metre to 10 km; most boxes are walked.
    #[test]
    fn walk_matches_the_general_search() {
        let mut tally = Tally::default();
        for seed in 0..40 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let index = PoiIndex::new(pois(&mut rng));
            for _ in 0..25 {
                let w_m = 10f64.powf(rng.random_range(0.0..4.0));
                let h_m = 10f64.powf(rng.random_range(0.0..4.0));
                let lat0 = 53.14 + rng.random_range(-0.05..0.05);
                let lon0 = 8.21 + rng.random_range(-0.08..0.08);
                tally.add(same_list(&index, "cafe", &box_m(lat0, lon0, w_m, h_m)));
            }
        }
        assert!(tally.walked > 10 * tally.declined(), "{tally:?}");
    }

    /// The same on the bench's data (`benches/poi.rs`): 1,000,000 POIs generated along the
    /// Oldenburg roads (`../shared/data/mobility`, or the directory `CLOAKD_BENCH_MOBILITY`), boxes
    /// around positions of the in-repo trace slice, 500 m tolerance for hotels and cafés and
    /// log-uniform in [20 m, 20 km] for hotels. `cargo test --release --lib walk -- --ignored`.
    #[test]
    #[ignore = "needs ../shared/data/mobility and a minute or two"]
    fn walk_matches_the_general_search_on_the_bench_data() {
        let dir = std::env::var_os("CLOAKD_BENCH_MOBILITY")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| crate::test_files::repo("../shared/data/mobility"));
        let rows = |name: &str| -> Vec<Vec<String>> {
            let mut text = String::new();
            let path = dir.join(name);
            std::fs::File::open(&path)
                .and_then(|file| flate2::read::MultiGzDecoder::new(file).read_to_string(&mut text))
                .unwrap_or_else(|e| {
                    panic!(
                        "{}: {e} (set CLOAKD_BENCH_MOBILITY to the shared data/mobility folder)",
                        path.display()
                    )
                });
            text.lines()
                .skip(1)
                .map(|l| l.split(',').map(str::to_string).collect())
                .collect()
        };
        let nodes: HashMap<String, (f64, f64)> = rows("oldenburg_nodes.csv.gz")
            .into_iter()
            .map(|r| (r[0].clone(), (r[1].parse().unwrap(), r[2].parse().unwrap())))
            .collect();
        let roads: Vec<Road> = rows("oldenburg_edges.csv.gz")
            .into_iter()
            .map(|r| Road {
                from: nodes[&r[1]],
                to: nodes[&r[2]],
                class: r[3].parse().unwrap(),
            })
            .collect();
        let index = PoiIndex::new(generate(&roads, 1_000_000, 1).unwrap());
        let trace = crate::test_files::repo("tests/data/oldenburg_60s.csv.gz");
        let points = crate::test_files::read_trace_file(&trace, Some(200_000));
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let mut tally = Tally::default();
        for (category, log_uniform) in [("hotel", false), ("cafe", false), ("hotel", true)] {
            for _ in 0..150 {
                let p = &points[rng.random_range(0..points.len())];
                let mut draw = || {
                    if log_uniform {
                        10f64.powf(rng.random_range(20f64.log10()..20_000f64.log10()))
                    } else {
                        500.0
                    }
                };
                let (dx, dy) = (draw(), draw());
                let w = rng.random_range(dx..=2.0 * dx);
                let h = rng.random_range(dy..=2.0 * dy);
                let (fx, fy): (f64, f64) = (rng.random(), rng.random());
                let lat0 = p.lat - fy * h / EARTH_RADIUS_M.to_radians();
                let lon0 =
                    p.lon - fx * w / (EARTH_RADIUS_M.to_radians() * p.lat.to_radians().cos());
                tally.add(same_list(&index, category, &box_m(lat0, lon0, w, h)));
            }
        }
        eprintln!("{tally:?}");
        assert!(tally.walked > 10 * tally.declined(), "{tally:?}");
    }
}
