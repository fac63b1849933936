//! Points of interest answered under cloaking: the engine of the reference LBS provider
//! (`cloakd provider`) and of the client-side refinement.
//!
//! A provider behind cloakd sees a box, never a point. For a query about "my" position it returns a
//! **candidate list** (Casper's privacy-aware query processing, Mokbel, Chow & Aref, VLDB 2006) that
//! holds the exact answer for every point of the box; the client, which knows its point, picks the
//! exact answer from it ([`refine`]).
//!
//! Queries (distances are great-circle metres, [`sphere`]; ties in distance are broken by id, byte
//! order, so "the n nearest" of a point is one well-defined set):
//! - *nearest* (category, n): the candidates are the POIs of the category that are among the n nearest
//!   of at least one point of the box;
//! - *range* (category, r): the POIs of the category within r of at least one point of the box.
//!
//! Invariants (checked against brute force in `checker.rs`):
//! - **inclusive**: for every point of the box, its exact answer is a subset of the candidates;
//! - **minimal**: every candidate comes with a witness, a point of the box for which it is part of the
//!   exact answer ([`Candidates::witnesses`]), except candidates kept because deciding them depends on a
//!   distance tie finer than [`candidates::TIE_RAD`] or exhausted the search budget: those are kept (to
//!   stay inclusive) and counted in [`Candidates::undecided`]. For range, the witness is the point of
//!   the box closest to the POI, and the slack is [`candidates::RANGE_SLACK_M`].
//!
//! A geo-indistinguishable request shows the provider a disc (its area of retrieval) instead of a box:
//! [`PoiIndex::disc_candidates`] gives the same two lists for the disc, with the same invariants
//! (checked in `disc_checker.rs`), never longer than its bounding box's lists.
//!
//! The engine is pure: no I/O, no clock; the CSV reader takes any reader ([`pois_csv`]).
use std::collections::HashMap;

use rstar::RTree;
use rstar::primitives::GeomWithData;

pub mod candidates;
#[cfg(test)]
mod checker;
#[cfg(test)]
mod disc_checker;
pub mod generate;
pub mod pois_csv;
pub mod refine;
pub mod sphere;

pub use candidates::{Candidates, Disc, query_disc};
pub use refine::refine;

/// One point of interest (degrees WGS84).
#[derive(Debug, Clone, PartialEq)]
pub struct Poi {
    pub id: String,
    pub lat: f64,
    pub lon: f64,
    pub category: String,
    pub name: String,
}

/// What is asked about a category.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Query {
    /// The `count` nearest POIs.
    Nearest { count: u32 },
    /// Every POI within `radius_m` metres.
    Range { radius_m: f64 },
}

/// The bounds a provider puts on queries and boxes, checked before any work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Largest `count` of a nearest query.
    pub max_count: u32,
    /// Largest `radius_m` of a range query.
    pub max_radius_m: f64,
    /// Largest side of a box, in metres.
    pub max_box_m: f64,
    /// Most candidates in one list: a longer list is refused (it would not fit an answer anyway),
    /// and the nearest search gives up once its superset exceeds 8 times this.
    pub max_candidates: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_count: 64,
            max_radius_m: 50_000.0,
            max_box_m: 200_000.0,
            max_candidates: 2_000,
        }
    }
}

/// A refused query or box: the field and the rule it broke (never a position).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {rule}")]
pub struct QueryError {
    pub field: &'static str,
    pub rule: String,
}

fn refuse(field: &'static str, rule: impl Into<String>) -> QueryError {
    QueryError {
        field,
        rule: rule.into(),
    }
}

impl Query {
    /// Checks the query against the limits.
    pub fn validate(&self, limits: &Limits) -> Result<(), QueryError> {
        match *self {
            Query::Nearest { count } => {
                if count == 0 || count > limits.max_count {
                    return Err(refuse(
                        "nearest.count",
                        format!("must be between 1 and {}", limits.max_count),
                    ));
                }
            }
            Query::Range { radius_m } => {
                if !(radius_m.is_finite() && radius_m > 0.0 && radius_m <= limits.max_radius_m) {
                    return Err(refuse(
                        "range.radius_m",
                        format!(
                            "must be a number > 0 and at most {} metres",
                            limits.max_radius_m
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A validated box of degrees: finite, latitudes in [−90, 90], longitudes in [−180, 180], min <= max,
/// each side at most `limits.max_box_m` (and under 180 degrees of longitude).
pub fn query_box(
    min_lat: f64,
    min_lon: f64,
    max_lat: f64,
    max_lon: f64,
    limits: &Limits,
) -> Result<sphere::SphBox, QueryError> {
    for (field, v, bound) in [
        ("box.min_lat", min_lat, 90.0),
        ("box.max_lat", max_lat, 90.0),
        ("box.min_lon", min_lon, 180.0),
        ("box.max_lon", max_lon, 180.0),
    ] {
        if !(v.is_finite() && v.abs() <= bound) {
            return Err(refuse(
                field,
                format!("must be a number in [-{bound}, {bound}]"),
            ));
        }
    }
    if min_lat > max_lat {
        return Err(refuse("box", "min_lat must not exceed max_lat"));
    }
    if min_lon > max_lon {
        return Err(refuse("box", "min_lon must not exceed max_lon"));
    }
    let b = sphere::SphBox::from_degrees(min_lat, min_lon, max_lat, max_lon);
    let side_m = b.extent() * sphere::EARTH_RADIUS_M;
    if side_m > limits.max_box_m || max_lon - min_lon >= 180.0 {
        return Err(refuse(
            "box",
            format!("each side must be at most {} metres", limits.max_box_m),
        ));
    }
    Ok(b)
}

type Entry = GeomWithData<sphere::Vec3, u32>;

/// The POIs, one R-tree of unit vectors per category.
///
/// Inside the index, POIs are numbered in the index's own order: category by category (by name),
/// each in its R-tree's leaf order, so POIs near each other are near each other in every per-POI
/// array and a query's reads of the POIs it fetches stay in few cache lines. Callers see only the
/// input order: [`PoiIndex::poi`], [`Candidates::pois`] and [`PoiIndex::answer_at`] use a POI's
/// position in the `Vec` given to [`PoiIndex::new`] (`input` and `own` map between the two).
pub struct PoiIndex {
    pois: Vec<Poi>,
    /// Per POI, its (latitude, longitude) in degrees, packed apart from the strings.
    places: Vec<(f64, f64)>,
    units: Vec<sphere::Vec3>,
    /// Rank of each POI's id in byte order (equal ids by input position): the tie-break of equal
    /// distances.
    id_rank: Vec<u32>,
    /// Per POI: how many POIs of its category have the same unit vector and precede it by id (they
    /// precede it at every point).
    twins_before: Vec<u32>,
    /// Per POI: whether another POI of its category lies within [`candidates::CROWD_CHORD`] without
    /// being at the same place (then its rank at its own place is decided by a search).
    crowded: Vec<bool>,
    /// Per POI, the two facts above in one byte for the nearest-1 walk, which reads them for every
    /// POI it fetches: [`candidates::WALK_CROWDED`], [`candidates::WALK_TWIN`] (preceded by a twin)
    /// or 0.
    walk_class: Vec<u8>,
    /// Per POI (index order): its position in the input.
    input: Vec<u32>,
    /// Per input position: the POI's number in the index.
    own: Vec<u32>,
    trees: HashMap<String, RTree<Entry>>,
}

impl PoiIndex {
    /// Indexes the POIs (bulk-loaded R-trees). Ids should be unique; equal ids tie-break by position.
    pub fn new(pois: Vec<Poi>) -> PoiIndex {
        let mut by_category: HashMap<String, Vec<Entry>> = HashMap::new();
        for (i, p) in pois.iter().enumerate() {
            by_category
                .entry(p.category.clone())
                .or_default()
                .push(Entry::new(sphere::unit(p.lat, p.lon), i as u32));
        }
        let mut trees: HashMap<String, RTree<Entry>> = by_category
            .into_iter()
            .map(|(category, entries)| (category, RTree::bulk_load(entries)))
            .collect();
        // The index's own numbering: category by category, each tree's leaves in order (the
        // entries keep their places in the tree; only their numbers change).
        let mut names: Vec<String> = trees.keys().cloned().collect();
        names.sort_unstable();
        let mut input: Vec<u32> = Vec::with_capacity(pois.len());
        let mut units: Vec<sphere::Vec3> = Vec::with_capacity(pois.len());
        for name in &names {
            if let Some(tree) = trees.get_mut(name) {
                for entry in tree.iter_mut() {
                    units.push(*entry.geom());
                    input.push(entry.data);
                    entry.data = (input.len() - 1) as u32;
                }
            }
        }
        let mut own = vec![0u32; pois.len()];
        for (k, &i) in input.iter().enumerate() {
            own[i as usize] = k as u32;
        }
        let mut tagged: Vec<(u32, Poi)> = pois
            .into_iter()
            .enumerate()
            .map(|(i, p)| (own[i], p))
            .collect();
        tagged.sort_unstable_by_key(|t| t.0);
        let pois: Vec<Poi> = tagged.into_iter().map(|t| t.1).collect();
        let places: Vec<(f64, f64)> = pois.iter().map(|p| (p.lat, p.lon)).collect();
        let mut order: Vec<u32> = (0..pois.len() as u32).collect();
        order.sort_by(|&a, &b| {
            pois[a as usize]
                .id
                .cmp(&pois[b as usize].id)
                .then(input[a as usize].cmp(&input[b as usize]))
        });
        let mut id_rank = vec![0; pois.len()];
        for (rank, &i) in order.iter().enumerate() {
            id_rank[i as usize] = rank as u32;
        }
        let mut twins_before = vec![0; pois.len()];
        let mut crowded = vec![false; pois.len()];
        let reach = candidates::CROWD_CHORD * candidates::CROWD_CHORD;
        for tree in trees.values() {
            for entry in tree.iter() {
                let p = entry.data as usize;
                for near in tree.locate_within_distance(units[p], reach) {
                    let q = near.data as usize;
                    if q == p {
                        continue;
                    }
                    if units[q] != units[p] {
                        crowded[p] = true;
                    } else if id_rank[q] < id_rank[p] {
                        twins_before[p] += 1;
                    }
                }
            }
        }
        let walk_class = crowded
            .iter()
            .zip(&twins_before)
            .map(|(&crowded, &twins)| match (crowded, twins) {
                (true, _) => candidates::WALK_CROWDED,
                (false, 0) => 0,
                (false, _) => candidates::WALK_TWIN,
            })
            .collect();
        PoiIndex {
            pois,
            places,
            units,
            id_rank,
            twins_before,
            crowded,
            walk_class,
            input,
            own,
            trees,
        }
    }

    /// A POI's place (degrees), by the index's number.
    fn place(&self, p: u32) -> (f64, f64) {
        self.places[p as usize]
    }

    /// A POI's input position, by the index's number.
    fn input_of(&self, p: u32) -> u32 {
        self.input[p as usize]
    }

    pub fn len(&self) -> usize {
        self.pois.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pois.is_empty()
    }

    /// The POI at input position `i` (as in [`Candidates::pois`] and [`PoiIndex::answer_at`]).
    pub fn poi(&self, i: u32) -> &Poi {
        &self.pois[self.own[i as usize] as usize]
    }

    /// The exact answer of one point (what a client would get without cloaking), by the R-tree from
    /// the point and [`refine::refine_indexes`]: POIs' input positions, nearest first.
    pub fn answer_at(&self, category: &str, query: &Query, lat: f64, lon: f64) -> Vec<u32> {
        let Some(tree) = self.trees.get(category) else {
            return Vec::new();
        };
        let x = sphere::unit(lat, lon);
        let mut near: Vec<u32> = Vec::new();
        match *query {
            Query::Nearest { count } => {
                let mut nth = f64::INFINITY;
                for (entry, d2) in tree.nearest_neighbor_iter_with_distance_2(x) {
                    // Past the n-th distance (with room for ties and rounding), nothing can be in.
                    if near.len() >= count as usize && d2 > nth * (1.0 + 1e-9) + 1e-24 {
                        break;
                    }
                    near.push(entry.data);
                    if near.len() == count as usize {
                        nth = d2;
                    }
                }
            }
            Query::Range { radius_m } => {
                let chord = sphere::chord_of_m(radius_m);
                let reach = chord * chord * (1.0 + 1e-9) + 1e-24;
                near.extend(tree.locate_within_distance(x, reach).map(|e| e.data));
            }
        }
        let pois = &self.pois;
        refine::refine_indexes(
            near.iter().map(|&i| {
                let p = &pois[i as usize];
                (p.lat, p.lon, p.id.as_str())
            }),
            lat,
            lon,
            query,
        )
        .into_iter()
        .map(|i| self.input_of(near[i]))
        .collect()
    }

    /// Whether any POI has this category.
    pub fn has_category(&self, category: &str) -> bool {
        self.trees.contains_key(category)
    }

    /// The categories and how many POIs each has, most frequent first.
    pub fn categories(&self) -> Vec<(&str, usize)> {
        let mut out: Vec<(&str, usize)> = self
            .trees
            .iter()
            .map(|(c, t)| (c.as_str(), t.size()))
            .collect();
        out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        out
    }
}
