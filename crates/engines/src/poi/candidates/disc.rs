//! Candidate lists of a disc: the area of retrieval of a geo-indistinguishable request (the reported
//! point and a radius), a spherical cap of the Earth.
//!
//! *Range r*: the distance from a POI to the cap is `max(0, d(c, p) − ρ)` (c the centre, ρ the
//! radius), so a POI is a candidate exactly when it lies within `r + ρ` of the centre; its witness is
//! the POI itself inside the disc, else the point of the circle on the arc from the centre to it.
//!
//! *Nearest n*: in the gnomonic projection around the centre (`x = (c + u e + v n) / |…|`, e and n the
//! east and north unit vectors at c) the cap is the Euclidean disc `u² + v² <= tan²(ρ / R)` and "x is
//! closer to q than to p", `x · (q − p) > 0`, is a half-plane: `g(u, v) = c·w + u e·w + v n·w > 0` with
//! `w = q − p`. Every point x of the disc has its n nearest within `d_n(c) + ρ` of x, so within
//! `d_n(c) + 2ρ` of c: that ball, N, holds every candidate, and at any x, p is out exactly when n POIs of
//! N precede it there. Each p of N is decided by a branch and bound over squares of the projected plane
//! that meet the disc: over a square's part inside the disc a linear g takes its extremes at corners,
//! on the circle where an edge crosses it, or on the circle in the gradient's direction
//! ([`Rival::range_on`]), so each q is exactly *before* p everywhere there (min g above the tie band),
//! *after* it everywhere (max g below it) or its bisector *crosses* that part. p is out on a square once n are before; it is a candidate, with the
//! square's point closest to the centre as witness, once before and crossing together stay below n;
//! else the square is split. Squares below [`MIN_SQUARE`] or past [`NODE_BUDGET`] keep p undecided
//! (inclusive). Ties are broken by id as in the box lists; twins (the same unit vector) precede by id.
//!
//! Invariants (checked against brute force in `disc_checker.rs`): inclusive (every point of the disc has
//! its exact answer in the list) and, but for undecided POIs, minimal (a witness of the disc per
//! candidate); so the list is never longer than the list of the disc's bounding box.
use super::super::sphere::{self, Vec3};
use super::{Candidates, RANGE_SLACK_M, TIE_RAD, too_many};
use crate::poi::{Limits, PoiIndex, Query, QueryError, refuse};

/// Squares of the projected plane smaller than this (about 0.6 mm on the Earth) are not split.
const MIN_SQUARE: f64 = 1e-10;
/// Squares examined per POI before it is kept undecided.
const NODE_BUDGET: usize = 16_384;
/// Floor of the tie band of `g` (rounding of `q − p` for POIs very close to each other).
const TIE_FLOOR: f64 = 4e-16;

/// A validated disc: centre (degrees and unit vector), radius, and the projection's frame.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Disc {
    pub lat: f64,
    pub lon: f64,
    pub radius_m: f64,
    centre: Vec3,
    east: Vec3,
    north: Vec3,
    /// Radius of the projected disc, tan(ρ / R).
    reach: f64,
}

/// A validated disc: centre finite within [−90, 90] x [−180, 180], radius a finite number >= 0 whose
/// diameter is at most `limits.max_box_m`, and the whole disc short of the poles.
pub fn query_disc(lat: f64, lon: f64, radius_m: f64, limits: &Limits) -> Result<Disc, QueryError> {
    for (field, v, bound) in [("reported.lat", lat, 90.0), ("reported.lon", lon, 180.0)] {
        if !(v.is_finite() && v.abs() <= bound) {
            return Err(refuse(
                field,
                format!("must be a number in [-{bound}, {bound}]"),
            ));
        }
    }
    if !(radius_m.is_finite() && radius_m >= 0.0 && 2.0 * radius_m <= limits.max_box_m) {
        return Err(refuse(
            "retrieval_radius_m",
            format!(
                "must be a number >= 0 and at most {} metres",
                limits.max_box_m / 2.0
            ),
        ));
    }
    let angle = radius_m / sphere::EARTH_RADIUS_M;
    if lat.abs().to_radians() + angle >= 89f64.to_radians() {
        return Err(refuse(
            "reported.lat",
            "the area of retrieval must stay south of 89 degrees north and north of 89 south",
        ));
    }
    let (phi, lambda) = (lat.to_radians(), lon.to_radians());
    Ok(Disc {
        lat,
        lon,
        radius_m,
        centre: sphere::unit(lat, lon),
        east: [-lambda.sin(), lambda.cos(), 0.0],
        north: [
            -phi.sin() * lambda.cos(),
            -phi.sin() * lambda.sin(),
            phi.cos(),
        ],
        reach: angle.tan(),
    })
}

impl Disc {
    /// The bounding box of the disc in degrees: (min_lat, min_lon, max_lat, max_lon).
    pub fn bounding_box(&self) -> (f64, f64, f64, f64) {
        let angle = self.radius_m / sphere::EARTH_RADIUS_M;
        let dlat = angle.to_degrees();
        let dlon = (angle.sin() / self.lat.to_radians().cos())
            .clamp(-1.0, 1.0)
            .asin()
            .to_degrees();
        (
            self.lat - dlat,
            self.lon - dlon,
            self.lat + dlat,
            self.lon + dlon,
        )
    }

    /// The point (degrees) of the projected plane at (u, v).
    fn point(&self, u: f64, v: f64) -> (f64, f64) {
        let x = [0, 1, 2].map(|i| self.centre[i] + u * self.east[i] + v * self.north[i]);
        let len = sphere::norm(&x);
        let (z, h) = (x[2] / len, (x[0] * x[0] + x[1] * x[1]).sqrt() / len);
        (z.atan2(h).to_degrees(), x[1].atan2(x[0]).to_degrees())
    }

    /// The point (degrees) at angle `a` from the centre towards the unit vector p.
    fn towards(&self, p: &Vec3, a: f64) -> (f64, f64) {
        let along = sphere::dot(p, &self.centre);
        let t = [0, 1, 2].map(|i| p[i] - along * self.centre[i]);
        let len = sphere::norm(&t);
        if len == 0.0 {
            return (self.lat, self.lon);
        }
        let (s, c) = a.sin_cos();
        let x = [0, 1, 2].map(|i| c * self.centre[i] + s * t[i] / len);
        (
            x[2].clamp(-1.0, 1.0).asin().to_degrees(),
            x[1].atan2(x[0]).to_degrees(),
        )
    }
}

/// A square of the projected plane: [u0, u1] x [v0, v1].
#[derive(Clone, Copy)]
struct Square {
    u0: f64,
    u1: f64,
    v0: f64,
    v1: f64,
}

impl Square {
    /// The square's point closest to the origin (the disc's centre).
    fn closest_to_centre(&self) -> (f64, f64) {
        (0f64.clamp(self.u0, self.u1), 0f64.clamp(self.v0, self.v1))
    }

    fn meets_disc(&self, reach: f64) -> bool {
        let (u, v) = self.closest_to_centre();
        u * u + v * v <= reach * reach * (1.0 + 1e-12)
    }

    fn quarters(&self) -> [Square; 4] {
        let (um, vm) = (0.5 * (self.u0 + self.u1), 0.5 * (self.v0 + self.v1));
        [
            Square {
                u1: um,
                v1: vm,
                ..*self
            },
            Square {
                u0: um,
                v1: vm,
                ..*self
            },
            Square {
                u1: um,
                v0: vm,
                ..*self
            },
            Square {
                u0: um,
                v0: vm,
                ..*self
            },
        ]
    }
}

/// A rival q of p in the projected plane: `g = a0 + a1 u + a2 v` (q closer where g > 0), its tie band,
/// and whether it precedes p on a tie (smaller id).
#[derive(Clone, Copy)]
struct Rival {
    a: [f64; 3],
    tie: f64,
    first_on_tie: bool,
}

enum Side {
    Before,
    After,
    Crossing,
}

impl Rival {
    /// The exact extremes of g over the square's part inside the disc (radius `reach`): over a convex
    /// set a linear function's extremes lie at corners inside the disc, at the circle's points where
    /// an edge crosses it, or at the circle's points in the direction of g's gradient.
    fn range_on(&self, s: &Square, reach: f64) -> (f64, f64) {
        // At most 4 corners, 8 edge crossings and 2 gradient points.
        let mut points = [(0.0, 0.0); 14];
        let mut count = 0;
        let mut add = |u: f64, v: f64| {
            points[count] = (u, v);
            count += 1;
        };
        let r2 = reach * reach;
        let corners = [(s.u0, s.v0), (s.u0, s.v1), (s.u1, s.v0), (s.u1, s.v1)];
        for (u, v) in corners {
            if u * u + v * v <= r2 {
                add(u, v);
            }
        }
        for (fixed, lo_edge, hi_edge, vertical) in [
            (s.u0, s.v0, s.v1, true),
            (s.u1, s.v0, s.v1, true),
            (s.v0, s.u0, s.u1, false),
            (s.v1, s.u0, s.u1, false),
        ] {
            let rest = r2 - fixed * fixed;
            if rest < 0.0 {
                continue;
            }
            let other = rest.sqrt();
            for o in [-other, other] {
                if lo_edge <= o && o <= hi_edge {
                    if vertical {
                        add(fixed, o);
                    } else {
                        add(o, fixed);
                    }
                }
            }
        }
        let grad = self.a[1].hypot(self.a[2]);
        if grad > 0.0 {
            let (du, dv) = (reach * self.a[1] / grad, reach * self.a[2] / grad);
            for (u, v) in [(du, dv), (-du, -dv)] {
                if s.u0 <= u && u <= s.u1 && s.v0 <= v && v <= s.v1 {
                    add(u, v);
                }
            }
        }
        // Rounding may leave no point (a square that only touches the disc): the corners bound it.
        let points: &[(f64, f64)] = if count == 0 {
            &corners
        } else {
            &points[..count]
        };
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for &(u, v) in points {
            let value = self.a[0] + self.a[1] * u + self.a[2] * v;
            lo = lo.min(value);
            hi = hi.max(value);
        }
        (lo, hi)
    }

    fn side(&self, s: &Square, reach: f64) -> Side {
        if self.a == [0.0; 3] {
            return if self.first_on_tie {
                Side::Before
            } else {
                Side::After
            };
        }
        let (lo, hi) = self.range_on(s, reach);
        if lo > self.tie {
            Side::Before
        } else if hi < -self.tie {
            Side::After
        } else {
            Side::Crossing
        }
    }
}

impl PoiIndex {
    /// The candidate list of a query over a disc (the query validated by the caller); as
    /// [`PoiIndex::candidates`] for a box: an unknown category gives an empty list, a list longer than
    /// `limits.max_candidates` is refused.
    pub fn disc_candidates(
        &self,
        category: &str,
        query: &Query,
        disc: &Disc,
        limits: &Limits,
    ) -> Result<Candidates, QueryError> {
        let list = match *query {
            Query::Nearest { count } => {
                self.disc_nearest(category, count as usize, disc, limits)?
            }
            Query::Range { radius_m } => self.disc_range(category, radius_m, disc, limits)?,
        };
        if list.pois.len() > limits.max_candidates {
            return Err(too_many(limits));
        }
        Ok(self.in_input_order(list))
    }

    /// The POIs of the category within `metres` of the centre (by chord, with room for rounding),
    /// each with its distance; more than `cap` of them is refused.
    fn disc_ball(
        &self,
        category: &str,
        disc: &Disc,
        metres: f64,
        cap: usize,
        limits: &Limits,
    ) -> Result<Vec<(u32, f64)>, QueryError> {
        let Some(tree) = self.trees.get(category) else {
            return Ok(Vec::new());
        };
        let chord = sphere::chord_of_m(metres);
        let mut found = Vec::new();
        for entry in tree.locate_within_distance(disc.centre, chord * chord * (1.0 + 1e-9) + 1e-24)
        {
            let (lat, lon) = self.place(entry.data);
            found.push((
                entry.data,
                sphere::haversine_m(disc.lat, disc.lon, lat, lon),
            ));
            if found.len() > cap {
                return Err(too_many(limits));
            }
        }
        Ok(found)
    }

    fn disc_range(
        &self,
        category: &str,
        radius_m: f64,
        disc: &Disc,
        limits: &Limits,
    ) -> Result<Candidates, QueryError> {
        let reach = radius_m + disc.radius_m;
        let mut out = Candidates::default();
        let mut found = Vec::new();
        for (p, d) in self.disc_ball(category, disc, reach + RANGE_SLACK_M, usize::MAX, limits)? {
            out.examined += 1;
            if d > reach + RANGE_SLACK_M {
                continue;
            }
            let witness = if d <= disc.radius_m {
                self.place(p)
            } else {
                disc.towards(
                    &self.units[p as usize],
                    disc.radius_m / sphere::EARTH_RADIUS_M,
                )
            };
            found.push((p, witness));
            if found.len() > limits.max_candidates {
                return Err(too_many(limits));
            }
        }
        found.sort_by_key(|f| f.0);
        for (p, witness) in found {
            out.push(p, Some(witness));
        }
        Ok(out)
    }

    fn disc_nearest(
        &self,
        category: &str,
        n: usize,
        disc: &Disc,
        limits: &Limits,
    ) -> Result<Candidates, QueryError> {
        let mut out = Candidates::default();
        let Some(tree) = self.trees.get(category) else {
            return Ok(out);
        };
        // d_n(c): the distance from the centre to its n-th nearest POI.
        let Some((_, nth2)) = tree
            .nearest_neighbor_iter_with_distance_2(disc.centre)
            .take(n)
            .last()
        else {
            return Ok(out);
        };
        let ball_m = sphere::m_of_chord(nth2.sqrt()) + 2.0 * disc.radius_m;
        let ball = self.disc_ball(
            category,
            disc,
            ball_m * (1.0 + 1e-9) + 1e-6,
            limits.max_candidates.saturating_mul(8),
            limits,
        )?;
        out.examined = ball.len();
        let mut rivals: Vec<Rival> = Vec::with_capacity(ball.len());
        for &(p, _) in &ball {
            let pu = self.units[p as usize];
            rivals.clear();
            for &(q, _) in &ball {
                if q == p {
                    continue;
                }
                let w = sphere::sub(&self.units[q as usize], &pu);
                rivals.push(Rival {
                    a: [
                        sphere::dot(&disc.centre, &w),
                        sphere::dot(&disc.east, &w),
                        sphere::dot(&disc.north, &w),
                    ],
                    tie: (TIE_RAD * sphere::norm(&w)).max(TIE_FLOOR)
                        * (1.0 + disc.reach * disc.reach).sqrt(),
                    first_on_tie: self.id_rank[q as usize] < self.id_rank[p as usize],
                });
            }
            match decide(&rivals, n, disc.reach) {
                Some(Some((u, v))) => out.push(p, Some(disc.point(u, v))),
                Some(None) => out.push(p, None),
                None => {}
            }
            if out.pois.len() > limits.max_candidates {
                return Err(too_many(limits));
            }
        }
        Ok(out)
    }
}

/// The branch and bound of one POI against its rivals over the projected disc of radius `reach`:
/// `None` when it is out everywhere, `Some(Some(witness))` with a point (u, v) where it is among the
/// n nearest, `Some(None)` when undecided.
fn decide(rivals: &[Rival], n: usize, reach: f64) -> Option<Option<(f64, f64)>> {
    let root = Square {
        u0: -reach,
        u1: reach,
        v0: -reach,
        v1: reach,
    };
    let all: Vec<u32> = (0..rivals.len() as u32).collect();
    let mut stack: Vec<(Square, usize, Vec<u32>)> = vec![(root, 0, all)];
    let mut nodes = 0;
    let mut undecided = false;
    while let Some((square, before_above, open)) = stack.pop() {
        if !square.meets_disc(reach) {
            continue;
        }
        nodes += 1;
        let mut before = before_above;
        let mut crossing = Vec::with_capacity(open.len());
        for &q in &open {
            match rivals[q as usize].side(&square, reach) {
                Side::Before => before += 1,
                Side::After => {}
                Side::Crossing => crossing.push(q),
            }
            if before >= n {
                break;
            }
        }
        if before >= n {
            continue;
        }
        if before + crossing.len() < n {
            return Some(Some(square.closest_to_centre()));
        }
        if square.u1 - square.u0 < MIN_SQUARE || nodes >= NODE_BUDGET {
            undecided = true;
            continue;
        }
        for quarter in square.quarters() {
            stack.push((quarter, before, crossing.clone()));
        }
    }
    undecided.then_some(None)
}
