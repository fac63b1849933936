//! Great-circle geometry of points and latitude/longitude boxes on a sphere.
//!
//! Points are also used as unit vectors in 3D (`x = (cos φ cos λ, cos φ sin λ, sin φ)`): the chord
//! between two unit vectors grows with their great-circle distance, so an R-tree over the vectors
//! answers nearest-neighbour and within-distance queries in great-circle order exactly, and "x is
//! closer to p than to q" is the linear test `x · (p − q) > 0`.
//!
//! A [`SphBox`] is the set of points with latitude in `[lat0, lat1]` and longitude in `[lon0, lon1]`
//! (radians, `lon1 − lon0` in `[0, π)`, latitudes in `[−π/2, π/2]`). [`SphBox::linear_extremes`]
//! gives the exact minimum and maximum of a linear function `w · x` over such a box, with the points
//! where they are reached: for a fixed latitude the function is `cos φ · ρ cos(λ − α) + w_z sin φ`, so
//! its extremes over λ are at `α`, `α + π` or an edge whatever φ is, and over φ it is a sinusoid whose
//! extremes are at its critical point or an edge. Distances are metres on a sphere of radius
//! [`EARTH_RADIUS_M`].
use std::f64::consts::{PI, TAU};

/// Mean Earth radius in metres (the same sphere as the location engine's `METRES_PER_DEGREE_LAT`).
pub const EARTH_RADIUS_M: f64 = 6_371_008.8;

pub type Vec3 = [f64; 3];

/// The unit vector of a point given in degrees.
pub fn unit(lat_deg: f64, lon_deg: f64) -> Vec3 {
    unit_rad(lat_deg.to_radians(), lon_deg.to_radians())
}

fn unit_rad(lat: f64, lon: f64) -> Vec3 {
    let (sin_lat, cos_lat) = lat.sin_cos();
    let (sin_lon, cos_lon) = lon.sin_cos();
    [cos_lat * cos_lon, cos_lat * sin_lon, sin_lat]
}

pub fn dot(a: &Vec3, b: &Vec3) -> f64 {
    a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
}

pub fn sub(a: &Vec3, b: &Vec3) -> Vec3 {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2]]
}

pub fn norm(a: &Vec3) -> f64 {
    dot(a, a).sqrt()
}

/// Great-circle distance in metres between two points given in degrees (haversine; accurate to well
/// under a micrometre at the distances a cloaking box spans).
pub fn haversine_m(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    let (p1, p2) = (lat1.to_radians(), lat2.to_radians());
    let dp = p2 - p1;
    let dl = (lon2 - lon1).to_radians();
    let a = (0.5 * dp).sin().powi(2) + p1.cos() * p2.cos() * (0.5 * dl).sin().powi(2);
    2.0 * EARTH_RADIUS_M * a.sqrt().min(1.0).asin()
}

/// The chord (3D distance between unit vectors) of a great-circle distance in metres; distances of
/// half the circumference or more give the diameter, 2.
pub fn chord_of_m(metres: f64) -> f64 {
    let angle = (metres / EARTH_RADIUS_M).min(PI);
    2.0 * (0.5 * angle).sin()
}

/// The great-circle distance in metres of a chord.
pub fn m_of_chord(chord: f64) -> f64 {
    2.0 * EARTH_RADIUS_M * (0.5 * chord).clamp(0.0, 1.0).asin()
}

/// A latitude/longitude box in radians (see the module documentation for its rules).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SphBox {
    pub lat0: f64,
    pub lat1: f64,
    pub lon0: f64,
    pub lon1: f64,
}

/// One extreme of a linear function over a box: its value and a point of the box (radians) reaching it.
#[derive(Debug, Clone, Copy)]
pub struct Extreme {
    pub value: f64,
    pub lat: f64,
    pub lon: f64,
}

/// Whether angle `a` lies in `[lo, hi]` modulo 2π (`hi − lo < 2π`).
fn angle_in(a: f64, lo: f64, hi: f64) -> bool {
    let shifted = (a - lo).rem_euclid(TAU);
    shifted <= hi - lo
}

impl SphBox {
    /// The box of a degree box: `min_lat <= max_lat` in [−90, 90], `min_lon <= max_lon` with a width
    /// under 180 degrees (callers validate; see `super::QueryBox`).
    pub fn from_degrees(min_lat: f64, min_lon: f64, max_lat: f64, max_lon: f64) -> SphBox {
        SphBox {
            lat0: min_lat.to_radians(),
            lat1: max_lat.to_radians(),
            lon0: min_lon.to_radians(),
            lon1: max_lon.to_radians(),
        }
    }

    pub fn contains(&self, lat: f64, lon: f64) -> bool {
        self.lat0 <= lat && lat <= self.lat1 && angle_in(lon, self.lon0, self.lon1)
    }

    /// The two halves of the box split across its longer side (measured in radians of arc).
    pub fn split(&self) -> [SphBox; 2] {
        let mid_cos = (0.5 * (self.lat0 + self.lat1)).cos();
        if (self.lon1 - self.lon0) * mid_cos > self.lat1 - self.lat0 {
            let mid = 0.5 * (self.lon0 + self.lon1);
            [SphBox { lon1: mid, ..*self }, SphBox { lon0: mid, ..*self }]
        } else {
            let mid = 0.5 * (self.lat0 + self.lat1);
            [SphBox { lat1: mid, ..*self }, SphBox { lat0: mid, ..*self }]
        }
    }

    /// The larger side in radians of arc (an upper bound of the diameter's order).
    pub fn extent(&self) -> f64 {
        let cos = self.lat0.cos().max(self.lat1.cos());
        (self.lat1 - self.lat0).max((self.lon1 - self.lon0) * cos)
    }

    /// An upper bound of the great-circle angle (radians) from the centre to any point of the box:
    /// a point is at most its latitude offset along the meridian plus its longitude offset along its
    /// parallel (at most the largest cos φ of the box times the offset) from the centre. Cheap (two
    /// cosines), for conservative tests; it also bounds the chord.
    pub fn radius_rad(&self) -> f64 {
        let max_cos = if self.lat0 <= 0.0 && 0.0 <= self.lat1 {
            1.0
        } else {
            self.lat0.cos().max(self.lat1.cos())
        };
        let arc = 0.5 * (self.lat1 - self.lat0) + 0.5 * (self.lon1 - self.lon0) * max_cos;
        arc * (1.0 + 1e-9) + 1e-15
    }

    /// The centre (latitude, longitude) in radians.
    pub fn centre(&self) -> (f64, f64) {
        (0.5 * (self.lat0 + self.lat1), 0.5 * (self.lon0 + self.lon1))
    }

    /// Exact (up to rounding) minimum and maximum of `w · x` over the points `x` of the box.
    pub fn linear_extremes(&self, w: &Vec3) -> (Extreme, Extreme) {
        let rho = w[0].hypot(w[1]);
        let alpha = w[1].atan2(w[0]);
        let h = |lon: f64| rho * (lon - alpha).cos();
        // Extremes over longitude (the same for every latitude, since cos φ >= 0).
        let (mut h_max, mut lon_max) = (h(self.lon0), self.lon0);
        let (mut h_min, mut lon_min) = (h_max, self.lon0);
        let v = h(self.lon1);
        if v > h_max {
            (h_max, lon_max) = (v, self.lon1);
        }
        if v < h_min {
            (h_min, lon_min) = (v, self.lon1);
        }
        if rho > 0.0 && angle_in(alpha, self.lon0, self.lon1) {
            (h_max, lon_max) = (rho, self.lon0 + (alpha - self.lon0).rem_euclid(TAU));
        }
        if rho > 0.0 && angle_in(alpha + PI, self.lon0, self.lon1) {
            (h_min, lon_min) = (-rho, self.lon0 + (alpha + PI - self.lon0).rem_euclid(TAU));
        }
        let max = self.sinusoid_extreme(h_max, w[2], true);
        let min = self.sinusoid_extreme(h_min, w[2], false);
        (
            Extreme {
                value: min.0,
                lat: min.1,
                lon: lon_min,
            },
            Extreme {
                value: max.0,
                lat: max.1,
                lon: lon_max,
            },
        )
    }

    /// The largest (or smallest) value of `a cos φ + b sin φ` over `[lat0, lat1]`, and where.
    fn sinusoid_extreme(&self, a: f64, b: f64, largest: bool) -> (f64, f64) {
        let f = |lat: f64| a * lat.cos() + b * lat.sin();
        let better = |x: f64, y: f64| if largest { x > y } else { x < y };
        let (mut best, mut at) = (f(self.lat0), self.lat0);
        let v = f(self.lat1);
        if better(v, best) {
            (best, at) = (v, self.lat1);
        }
        // Critical points: the maximum at atan2(b, a), the minimum opposite it.
        let amplitude = a.hypot(b);
        if amplitude > 0.0 {
            let mut critical = b.atan2(a);
            if !largest {
                critical += PI;
            }
            // Bring it into (−π, π] and test the interval (latitudes lie in [−π/2, π/2]).
            let critical = (critical + PI).rem_euclid(TAU) - PI;
            if (self.lat0..=self.lat1).contains(&critical) {
                let v = if largest { amplitude } else { -amplitude };
                if better(v, best) || v == best {
                    (best, at) = (v, critical);
                }
            }
        }
        (best, at)
    }

    /// The point of the box closest to `p` (a unit vector) and its great-circle distance in metres
    /// (0 inside the box), measured with [`haversine_m`] at that point.
    pub fn closest_point_m(&self, p: &Vec3, p_deg: (f64, f64)) -> (f64, (f64, f64)) {
        let (_, max) = self.linear_extremes(p);
        let (lat, lon) = (max.lat.to_degrees(), max.lon.to_degrees());
        (haversine_m(p_deg.0, p_deg.1, lat, lon), (lat, lon))
    }

    /// The great-circle distance in metres from `p` to the farthest point of the box.
    pub fn farthest_m(&self, p: &Vec3) -> f64 {
        let (min, _) = self.linear_extremes(p);
        EARTH_RADIUS_M * min.value.clamp(-1.0, 1.0).acos()
    }

    /// The axis-aligned 3D envelope of the box's unit vectors: `(lower, upper)` corners.
    pub fn envelope(&self) -> (Vec3, Vec3) {
        let mut lower = [0.0; 3];
        let mut upper = [0.0; 3];
        for axis in 0..3 {
            let mut w = [0.0; 3];
            w[axis] = 1.0;
            let (min, max) = self.linear_extremes(&w);
            lower[axis] = min.value;
            upper[axis] = max.value;
        }
        (lower, upper)
    }

    /// The four corners (latitude, longitude) in radians.
    pub fn corners(&self) -> [(f64, f64); 4] {
        [
            (self.lat0, self.lon0),
            (self.lat0, self.lon1),
            (self.lat1, self.lon0),
            (self.lat1, self.lon1),
        ]
    }

    /// The quarter of the box that has the corner `i` of [`SphBox::corners`] (split at the centre).
    pub fn quarter(&self, i: usize) -> SphBox {
        let (clat, clon) = self.centre();
        let (lat0, lat1) = if i < 2 {
            (self.lat0, clat)
        } else {
            (clat, self.lat1)
        };
        let (lon0, lon1) = if i.is_multiple_of(2) {
            (self.lon0, clon)
        } else {
            (clon, self.lon1)
        };
        SphBox {
            lat0,
            lat1,
            lon0,
            lon1,
        }
    }
}

/// The unit vector of a point given in radians.
pub fn unit_of_rad(lat: f64, lon: f64) -> Vec3 {
    unit_rad(lat, lon)
}

/// A piece of a box's edge: a meridian arc (fixed longitude, latitude `t` in `[t0, t1]`) or a parallel
/// arc (fixed latitude, longitude `t` in `[t0, t1]`), `t1 − t0` in `[0, π)`. It keeps its end points'
/// unit vectors and the directions in which `t` grows there, so [`EdgePiece::linear_range`] and
/// [`EdgePiece::closest_to`] need no trigonometry beyond one `hypot` or `atan2`: along a meridian `w · x`
/// is `a cos φ + b sin φ`, along a parallel `cos φ ρ cos(λ − α) + w_z sin φ`, both sinusoids of `t`
/// over less than half a period, so each has at most one critical point inside, where its slope
/// changes sign between the ends, and it is a maximum when the slope goes from positive to negative.
#[derive(Debug, Clone, Copy)]
pub struct EdgePiece {
    meridian: bool,
    /// The fixed angle's (cos, sin).
    fixed_cs: (f64, f64),
    fixed: f64,
    t0: f64,
    t1: f64,
    ends: [Vec3; 2],
    slopes: [Vec3; 2],
}

impl EdgePiece {
    /// The meridian arc at longitude `lon` from `lat0` to `lat1` (radians, `lat0 <= lat1`).
    pub fn meridian(lon: f64, lat0: f64, lat1: f64) -> EdgePiece {
        Self::new(true, lon, lat0, lat1)
    }

    /// The parallel arc at latitude `lat` from `lon0` to `lon1` (radians, `lon0 <= lon1`).
    pub fn parallel(lat: f64, lon0: f64, lon1: f64) -> EdgePiece {
        Self::new(false, lat, lon0, lon1)
    }

    fn new(meridian: bool, fixed: f64, t0: f64, t1: f64) -> EdgePiece {
        let (sin, cos) = fixed.sin_cos();
        let mut piece = EdgePiece {
            meridian,
            fixed_cs: (cos, sin),
            fixed,
            t0,
            t1,
            ends: [[0.0; 3]; 2],
            slopes: [[0.0; 3]; 2],
        };
        let (e0, s0) = piece.at(t0);
        let (e1, s1) = piece.at(t1);
        piece.ends = [e0, e1];
        piece.slopes = [s0, s1];
        piece
    }

    /// The unit vector at parameter `t` and the direction in which `t` grows there.
    fn at(&self, t: f64) -> (Vec3, Vec3) {
        let (sin_t, cos_t) = t.sin_cos();
        let (cos_f, sin_f) = self.fixed_cs;
        if self.meridian {
            (
                [cos_t * cos_f, cos_t * sin_f, sin_t],
                [-sin_t * cos_f, -sin_t * sin_f, cos_t],
            )
        } else {
            ([cos_f * cos_t, cos_f * sin_t, sin_f], [-sin_t, cos_t, 0.0])
        }
    }

    /// The point (latitude, longitude) in radians at parameter `t`.
    fn point(&self, t: f64) -> (f64, f64) {
        if self.meridian {
            (t, self.fixed)
        } else {
            (self.fixed, t)
        }
    }

    /// A unit vector along the piece (from its start to its end; any unit vector when it is a point).
    pub fn axis(&self) -> Vec3 {
        let d = sub(&self.ends[1], &self.ends[0]);
        let len = norm(&d);
        if len > 0.0 {
            [d[0] / len, d[1] / len, d[2] / len]
        } else {
            [1.0, 0.0, 0.0]
        }
    }

    /// The two halves (the middle's vectors computed once).
    pub fn split(&self) -> [EdgePiece; 2] {
        let mid = 0.5 * (self.t0 + self.t1);
        let (e, s) = self.at(mid);
        [
            EdgePiece {
                t1: mid,
                ends: [self.ends[0], e],
                slopes: [self.slopes[0], s],
                ..*self
            },
            EdgePiece {
                t0: mid,
                ends: [e, self.ends[1]],
                slopes: [s, self.slopes[1]],
                ..*self
            },
        ]
    }

    /// The middle point (latitude, longitude) in radians.
    pub fn centre(&self) -> (f64, f64) {
        self.point(0.5 * (self.t0 + self.t1))
    }

    /// The piece as a (degenerate) box.
    pub fn as_box(&self) -> SphBox {
        let (lat0, lat1, lon0, lon1) = if self.meridian {
            (self.t0, self.t1, self.fixed, self.fixed)
        } else {
            (self.fixed, self.fixed, self.t0, self.t1)
        };
        SphBox {
            lat0,
            lat1,
            lon0,
            lon1,
        }
    }

    /// An upper bound of the great-circle angle (and the chord) from the middle point to any point of
    /// the piece: half its length along the edge.
    pub fn radius_rad(&self) -> f64 {
        0.5 * self.extent() * (1.0 + 1e-9) + 1e-15
    }

    /// The length of the parameter interval in radians of arc (an upper bound of the diameter).
    pub fn extent(&self) -> f64 {
        let scale = if self.meridian { 1.0 } else { self.fixed_cs.0 };
        (self.t1 - self.t0) * scale
    }

    /// The minimum and maximum of `w · x` over the points `x` of the piece.
    pub fn linear_range(&self, w: &Vec3) -> (f64, f64) {
        let v0 = dot(w, &self.ends[0]);
        let v1 = dot(w, &self.ends[1]);
        let s0 = dot(w, &self.slopes[0]);
        let s1 = dot(w, &self.slopes[1]);
        let (mut min, mut max) = if v0 <= v1 { (v0, v1) } else { (v1, v0) };
        if (s0 > 0.0 && s1 < 0.0) || (s0 < 0.0 && s1 > 0.0) {
            let (cos_f, sin_f) = self.fixed_cs;
            let extreme = |sign: f64| {
                if self.meridian {
                    sign * (w[0] * cos_f + w[1] * sin_f).hypot(w[2])
                } else {
                    sign * cos_f * w[0].hypot(w[1]) + w[2] * sin_f
                }
            };
            if s0 > 0.0 {
                max = max.max(extreme(1.0));
            } else {
                min = min.min(extreme(-1.0));
            }
        }
        (min, max)
    }

    /// The point (latitude, longitude, radians) of the piece where `w · x` is largest: for a unit
    /// vector `w`, the point of the piece closest to it.
    pub fn closest_to(&self, w: &Vec3) -> (f64, f64) {
        let s0 = dot(w, &self.slopes[0]);
        let s1 = dot(w, &self.slopes[1]);
        if s0 > 0.0 && s1 < 0.0 {
            let (cos_f, sin_f) = self.fixed_cs;
            let t = if self.meridian {
                w[2].atan2(w[0] * cos_f + w[1] * sin_f)
            } else {
                // The longitude of w, brought next to the piece.
                let alpha = w[1].atan2(w[0]);
                self.t0 + (alpha - self.t0).rem_euclid(TAU)
            };
            return self.point(t.clamp(self.t0, self.t1));
        }
        if dot(w, &self.ends[0]) >= dot(w, &self.ends[1]) {
            self.point(self.t0)
        } else {
            self.point(self.t1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// The extremes agree with a dense sample of the box, and no sampled point beats them.
    #[test]
    fn linear_extremes_match_dense_sampling() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..300 {
            let lat0: f64 = rng.random_range(-80.0..79.0);
            let lon0: f64 = rng.random_range(-180.0..170.0);
            let b = SphBox::from_degrees(
                lat0,
                lon0,
                lat0 + rng.random_range(0.0..1.0),
                lon0 + rng.random_range(0.0..9.0),
            );
            let w = [
                rng.random_range(-1.0..1.0),
                rng.random_range(-1.0..1.0),
                rng.random_range(-1.0..1.0),
            ];
            let (min, max) = b.linear_extremes(&w);
            assert!(b.contains(max.lat, max.lon) && b.contains(min.lat, min.lon));
            let at = |lat, lon| dot(&w, &unit_rad(lat, lon));
            assert!((at(max.lat, max.lon) - max.value).abs() < 1e-12);
            assert!((at(min.lat, min.lon) - min.value).abs() < 1e-12);
            for i in 0..=40 {
                for j in 0..=40 {
                    let lat = b.lat0 + (b.lat1 - b.lat0) * f64::from(i) / 40.0;
                    let lon = b.lon0 + (b.lon1 - b.lon0) * f64::from(j) / 40.0;
                    let v = at(lat, lon);
                    assert!(v <= max.value + 1e-12 && v >= min.value - 1e-12);
                }
            }
        }
    }

    /// The edge pieces' extremes and closest points agree with a dense sampling of the piece.
    #[test]
    fn edge_pieces_match_dense_sampling() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        for round in 0..600 {
            let lat0: f64 = rng.random_range(-1.4..1.3);
            let lon0: f64 = rng.random_range(-3.1..3.0);
            let span: f64 = rng.random_range(0.0..[1e-5, 1e-3, 0.5][round % 3]);
            let piece = if round % 2 == 0 {
                EdgePiece::meridian(lon0, lat0, lat0 + span)
            } else {
                EdgePiece::parallel(lat0, lon0, lon0 + span)
            };
            // Split once or twice so the cached middle vectors are exercised too.
            let piece = match round % 4 {
                0 | 1 => piece,
                2 => piece.split()[0],
                _ => piece.split()[1].split()[0],
            };
            let b = piece.as_box();
            let w: Vec3 = if round % 5 == 0 {
                let (lat, lon) = (
                    rng.random_range(b.lat0 - 0.01..b.lat1 + 0.01),
                    rng.random_range(b.lon0 - 0.01..b.lon1 + 0.01),
                );
                unit_rad(lat.clamp(-1.5, 1.5), lon)
            } else {
                [
                    rng.random_range(-1.0..1.0),
                    rng.random_range(-1.0..1.0),
                    rng.random_range(-1.0..1.0),
                ]
            };
            let (min, max) = piece.linear_range(&w);
            let (emin, emax) = b.linear_extremes(&w);
            assert!((min - emin.value).abs() < 1e-12, "{round} {min} {emin:?}");
            assert!((max - emax.value).abs() < 1e-12, "{round} {max} {emax:?}");
            let (lat, lon) = piece.closest_to(&w);
            assert!(b.contains(lat, lon), "{round}");
            assert!(
                (dot(&w, &unit_rad(lat, lon)) - max).abs() < 1e-12,
                "{round}"
            );
            for i in 0..=200 {
                let f = f64::from(i) / 200.0;
                let v = dot(
                    &w,
                    &unit_rad(
                        b.lat0 + f * (b.lat1 - b.lat0),
                        b.lon0 + f * (b.lon1 - b.lon0),
                    ),
                );
                assert!(v <= max + 1e-12 && v >= min - 1e-12, "{round}");
            }
        }
    }

    #[test]
    fn chords_and_metres_round_trip() {
        for m in [0.0, 1.0, 300.0, 20_000.0, 1e6] {
            assert!((m_of_chord(chord_of_m(m)) - m).abs() < 1e-6 * m.max(1.0));
        }
        // One degree of latitude.
        let d = haversine_m(53.0, 8.0, 54.0, 8.0);
        assert!((d - EARTH_RADIUS_M * PI / 180.0).abs() < 1e-6);
    }
}
