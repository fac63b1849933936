//! The yardstick's measures of one answered request, the same for every cloaking model: Shokri et
//! al.'s Bayesian adversary ("Quantifying location privacy", S&P 2011) and the quality loss.
//!
//! The adversary's prior is the trace's own position density on a grid ([`Grid::from_positions`]:
//! square cells of `cell_m` metres in a local equirectangular frame, each cell's share of the
//! positions). From what the provider saw it forms a posterior over the cells and its expected error
//! is `sum over cells of posterior(cell) * distance(cell centre, true position)`:
//! - a box (REQUESTS, PRESENCE): the prior restricted to the box, each cell weighted by the share of
//!   its area inside the box (positions uniform within a cell); a box that meets no cell of positive
//!   prior gives the cells it overlaps equal weight;
//! - a reported point z of geo-indistinguishability at epsilon per metre: prior(cell) times the
//!   planar Laplace likelihood `exp(-epsilon * d(cell centre, z))` (the continuous mechanism; cells
//!   whose likelihood is below e^-30 of the best are left out, which moves the result by < 1e-13 per
//!   cell).
//!
//! Quality loss: for a reported point, the distance from the true position to it; for a box, the
//! expected distance from the true position to a uniformly drawn point of the box (midpoint rule on
//! [`BOX_STEPS`] x [`BOX_STEPS`] sub-cells), and its area.
//!
//! Invariants: pure (no clock, no I/O); nothing panics on input (non-finite or out-of-grid input gives
//! an error or falls back as stated); a grid never has more than the caller's `max_cells` cells
//! (checked before allocation). Tested against brute-force sums over every cell.
use super::geo::METRES_PER_DEGREE_LAT;

/// Sub-cells per side of the midpoint rule of a box's quality loss.
pub const BOX_STEPS: usize = 64;
/// Likelihoods below e^-CUTOFF of the best cell's are left out of a Laplace posterior.
const CUTOFF: f64 = 30.0;

/// What the provider saw of one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Observed {
    /// A cloaking box, degrees.
    Box {
        min_lat: f64,
        min_lon: f64,
        max_lat: f64,
        max_lon: f64,
    },
    /// A geo-indistinguishable reported point (degrees) drawn at `epsilon_per_km`.
    Laplace {
        lat: f64,
        lon: f64,
        epsilon_per_km: f64,
    },
}

/// A grid that cannot be built: the field and the rule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {rule}")]
pub struct YardstickError {
    pub field: &'static str,
    pub rule: String,
}

/// The adversary's prior: a grid of square cells over the positions' bounding box.
#[derive(Debug, Clone)]
pub struct Grid {
    lat0: f64,
    lon0: f64,
    /// Metres per degree of longitude at `lat0`.
    m_per_lon: f64,
    cell_m: f64,
    cols: usize,
    rows: usize,
    /// Per cell (row-major), its share of the positions.
    prior: Vec<f64>,
}

impl Grid {
    /// The prior of `positions` (degrees) on cells of `cell_m` metres; refused when there are no
    /// finite positions, `cell_m` is not a number > 0, or the grid would exceed `max_cells`.
    pub fn from_positions(
        positions: &[(f64, f64)],
        cell_m: f64,
        max_cells: usize,
    ) -> Result<Grid, YardstickError> {
        let refuse = |field, rule: String| YardstickError { field, rule };
        if !(cell_m.is_finite() && cell_m > 0.0) {
            return Err(refuse("cell_m", "must be a number > 0".into()));
        }
        let finite = || {
            positions
                .iter()
                .filter(|(a, b)| a.is_finite() && b.is_finite() && a.abs() < 89.0)
        };
        let (mut lat0, mut lon0, mut lat1, mut lon1) = (f64::MAX, f64::MAX, f64::MIN, f64::MIN);
        for &(lat, lon) in finite() {
            (lat0, lon0) = (lat0.min(lat), lon0.min(lon));
            (lat1, lon1) = (lat1.max(lat), lon1.max(lon));
        }
        if lat0 > lat1 {
            return Err(refuse("positions", "must hold a finite position".into()));
        }
        let m_per_lon = METRES_PER_DEGREE_LAT * lat0.to_radians().cos();
        let cols = ((lon1 - lon0) * m_per_lon / cell_m).floor() + 1.0;
        let rows = ((lat1 - lat0) * METRES_PER_DEGREE_LAT / cell_m).floor() + 1.0;
        if cols * rows > max_cells as f64 {
            return Err(refuse(
                "cell_m",
                format!("the grid would have more than {max_cells} cells; choose larger cells"),
            ));
        }
        let mut grid = Grid {
            lat0,
            lon0,
            m_per_lon,
            cell_m,
            cols: cols as usize,
            rows: rows as usize,
            prior: vec![0.0; cols as usize * rows as usize],
        };
        let mut total = 0.0;
        for &(lat, lon) in finite() {
            let (x, y) = grid.xy(lat, lon);
            let col = ((x / cell_m) as usize).min(grid.cols - 1);
            let row = ((y / cell_m) as usize).min(grid.rows - 1);
            grid.prior[row * grid.cols + col] += 1.0;
            total += 1.0;
        }
        for p in &mut grid.prior {
            *p /= total;
        }
        Ok(grid)
    }

    /// Local metres (east, north) of the grid's south-west corner to a point.
    pub fn xy(&self, lat: f64, lon: f64) -> (f64, f64) {
        (
            (lon - self.lon0) * self.m_per_lon,
            (lat - self.lat0) * METRES_PER_DEGREE_LAT,
        )
    }

    pub fn cells(&self) -> usize {
        self.prior.len()
    }

    /// The centre (local metres) of the cell at (row, col).
    fn centre(&self, row: usize, col: usize) -> (f64, f64) {
        (
            (col as f64 + 0.5) * self.cell_m,
            (row as f64 + 0.5) * self.cell_m,
        )
    }

    /// The adversary's expected error (metres) for a request at `truth` (degrees) of which the
    /// provider saw `observed`; `None` when the observation is not finite.
    pub fn adversary_error(&self, observed: &Observed, truth: (f64, f64)) -> Option<f64> {
        let t = self.xy(truth.0, truth.1);
        match *observed {
            Observed::Box {
                min_lat,
                min_lon,
                max_lat,
                max_lon,
            } => {
                let (x0, y0) = self.xy(min_lat, min_lon);
                let (x1, y1) = self.xy(max_lat, max_lon);
                if ![x0, y0, x1, y1].iter().all(|v| v.is_finite()) || x0 > x1 || y0 > y1 {
                    return None;
                }
                self.box_error((x0, y0, x1, y1), t)
            }
            Observed::Laplace {
                lat,
                lon,
                epsilon_per_km,
            } => {
                let z = self.xy(lat, lon);
                let eps = epsilon_per_km / 1000.0;
                if !(z.0.is_finite() && z.1.is_finite() && eps.is_finite() && eps > 0.0) {
                    return None;
                }
                Some(self.laplace_error(z, eps, t))
            }
        }
    }

    /// Cells overlapping [x0, x1] (clamped to the grid): the index range of columns or rows.
    fn span(&self, lo: f64, hi: f64, n: usize) -> (usize, usize) {
        let a = (lo / self.cell_m).floor().clamp(0.0, n as f64) as usize;
        let b = (hi / self.cell_m).ceil().clamp(0.0, n as f64) as usize;
        (a, b)
    }

    fn box_error(&self, (x0, y0, x1, y1): (f64, f64, f64, f64), t: (f64, f64)) -> Option<f64> {
        let (c0, c1) = self.span(x0, x1, self.cols);
        let (r0, r1) = self.span(y0, y1, self.rows);
        let overlap = |lo: f64, hi: f64, i: usize| {
            let (a, b) = (i as f64 * self.cell_m, (i + 1) as f64 * self.cell_m);
            (hi.min(b) - lo.max(a)).max(0.0) / self.cell_m
        };
        let mut sums = [(0.0, 0.0); 2];
        for row in r0..r1 {
            let fy = overlap(y0, y1, row);
            for col in c0..c1 {
                let share = fy * overlap(x0, x1, col);
                let d = dist(self.centre(row, col), t);
                let with_prior = self.prior[row * self.cols + col] * share;
                sums[0].0 += with_prior;
                sums[0].1 += with_prior * d;
                sums[1].0 += share;
                sums[1].1 += share * d;
            }
        }
        // A box of zero width or height still names the cells it lies in.
        if sums[1].0 == 0.0 {
            let col = ((0.5 * (x0 + x1)) / self.cell_m).floor();
            let row = ((0.5 * (y0 + y1)) / self.cell_m).floor();
            if col < 0.0 || row < 0.0 || col >= self.cols as f64 || row >= self.rows as f64 {
                return Some(dist((0.5 * (x0 + x1), 0.5 * (y0 + y1)), t));
            }
            return Some(dist(self.centre(row as usize, col as usize), t));
        }
        let (w, s) = if sums[0].0 > 0.0 { sums[0] } else { sums[1] };
        Some(s / w)
    }

    fn laplace_error(&self, z: (f64, f64), eps: f64, t: (f64, f64)) -> f64 {
        // Cells farther from z than the nearest cell of positive prior by more than CUTOFF / eps
        // carry less than e^-CUTOFF of its weight: find that nearest cell within CUTOFF / eps of z
        // (else anywhere), then sum over the cells within its distance plus CUTOFF / eps.
        let window = CUTOFF / eps;
        let nearest = |reach: f64| {
            let (c0, c1) = self.span(z.0 - reach, z.0 + reach, self.cols);
            let (r0, r1) = self.span(z.1 - reach, z.1 + reach, self.rows);
            let mut best = f64::INFINITY;
            for row in r0..r1 {
                for col in c0..c1 {
                    if self.prior[row * self.cols + col] > 0.0 {
                        best = best.min(dist(self.centre(row, col), z));
                    }
                }
            }
            best
        };
        let mut best = nearest(window);
        if best > window {
            best = nearest(f64::INFINITY);
        }
        if !best.is_finite() {
            return dist(z, t);
        }
        let reach = best + window;
        let (c0, c1) = self.span(z.0 - reach, z.0 + reach, self.cols);
        let (r0, r1) = self.span(z.1 - reach, z.1 + reach, self.rows);
        let (mut w, mut s) = (0.0, 0.0);
        for row in r0..r1 {
            for col in c0..c1 {
                let p = self.prior[row * self.cols + col];
                if p == 0.0 {
                    continue;
                }
                let c = self.centre(row, col);
                let weight = p * (-eps * (dist(c, z) - best)).exp();
                w += weight;
                s += weight * dist(c, t);
            }
        }
        if w > 0.0 { s / w } else { dist(z, t) }
    }
}

fn dist(a: (f64, f64), b: (f64, f64)) -> f64 {
    (a.0 - b.0).hypot(a.1 - b.1)
}

/// The quality loss of one answer: metres from the true position (degrees) to the reported point, or
/// the expected metres to a uniform point of the box; `None` when not finite.
pub fn quality_loss(observed: &Observed, truth: (f64, f64)) -> Option<f64> {
    let m_per_lon = METRES_PER_DEGREE_LAT * truth.0.to_radians().cos();
    let xy = |lat: f64, lon: f64| {
        (
            (lon - truth.1) * m_per_lon,
            (lat - truth.0) * METRES_PER_DEGREE_LAT,
        )
    };
    let loss = match *observed {
        Observed::Laplace { lat, lon, .. } => dist(xy(lat, lon), (0.0, 0.0)),
        Observed::Box {
            min_lat,
            min_lon,
            max_lat,
            max_lon,
        } => {
            let (x0, y0) = xy(min_lat, min_lon);
            let (x1, y1) = xy(max_lat, max_lon);
            let n = BOX_STEPS as f64;
            let mut sum = 0.0;
            for i in 0..BOX_STEPS {
                let x = x0 + (x1 - x0) * (i as f64 + 0.5) / n;
                for j in 0..BOX_STEPS {
                    let y = y0 + (y1 - y0) * (j as f64 + 0.5) / n;
                    sum += x.hypot(y);
                }
            }
            sum / (n * n)
        }
    };
    loss.is_finite().then_some(loss)
}

/// The area of a box in square metres (local planar frame at its centre).
pub fn box_area_m2(min_lat: f64, min_lon: f64, max_lat: f64, max_lon: f64) -> f64 {
    let m_per_lon = METRES_PER_DEGREE_LAT * (0.5 * (min_lat + max_lat)).to_radians().cos();
    ((max_lon - min_lon) * m_per_lon).abs() * ((max_lat - min_lat) * METRES_PER_DEGREE_LAT).abs()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn positions(rng: &mut ChaCha8Rng, n: usize) -> Vec<(f64, f64)> {
        (0..n)
            .map(|_| {
                // Two clusters and a sprinkle, so the prior is far from uniform.
                let (lat, lon, s) = match rng.random_range(0..3) {
                    0 => (53.10, 8.20, 0.004),
                    1 => (53.13, 8.25, 0.01),
                    _ => (53.12, 8.22, 0.03),
                };
                (
                    lat + rng.random_range(-s..s),
                    lon + rng.random_range(-s..s) * 1.6,
                )
            })
            .collect()
    }

    /// The adversary by brute force: every cell, its overlap with the box computed from the cell's
    /// own corners, the Laplace weights without cut-off or shift.
    fn brute(grid: &Grid, observed: &Observed, truth: (f64, f64)) -> f64 {
        let t = grid.xy(truth.0, truth.1);
        let (mut w, mut s, mut w_any, mut s_any) = (0.0, 0.0, 0.0, 0.0);
        for row in 0..grid.rows {
            for col in 0..grid.cols {
                let p = grid.prior[row * grid.cols + col];
                let (cx, cy) = grid.centre(row, col);
                let half = grid.cell_m / 2.0;
                let weight = match *observed {
                    Observed::Box {
                        min_lat,
                        min_lon,
                        max_lat,
                        max_lon,
                    } => {
                        let (x0, y0) = grid.xy(min_lat, min_lon);
                        let (x1, y1) = grid.xy(max_lat, max_lon);
                        let ox = ((cx + half).min(x1) - (cx - half).max(x0)).max(0.0);
                        let oy = ((cy + half).min(y1) - (cy - half).max(y0)).max(0.0);
                        let area = ox * oy / (grid.cell_m * grid.cell_m);
                        w_any += area;
                        s_any += area * ((cx - t.0).powi(2) + (cy - t.1).powi(2)).sqrt();
                        p * area
                    }
                    Observed::Laplace {
                        lat,
                        lon,
                        epsilon_per_km,
                    } => {
                        let z = grid.xy(lat, lon);
                        let d = ((cx - z.0).powi(2) + (cy - z.1).powi(2)).sqrt();
                        p * (-epsilon_per_km / 1000.0 * d).exp()
                    }
                };
                w += weight;
                s += weight * ((cx - t.0).powi(2) + (cy - t.1).powi(2)).sqrt();
            }
        }
        if w > 0.0 { s / w } else { s_any / w_any }
    }

    #[test]
    fn the_adversary_matches_brute_force() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let pts = positions(&mut rng, 3_000);
        let grid = Grid::from_positions(&pts, 150.0, 100_000).unwrap();
        assert!(grid.cells() > 100);
        for i in 0..300 {
            let truth = pts[rng.random_range(0..pts.len())];
            let observed = if i % 2 == 0 {
                let (w, h) = (
                    rng.random_range(0.0002..0.02),
                    rng.random_range(0.0002..0.02),
                );
                let (a, b) = (rng.random_range(0.0..1.0), rng.random_range(0.0..1.0));
                Observed::Box {
                    min_lat: truth.0 - a * h,
                    min_lon: truth.1 - b * w,
                    max_lat: truth.0 + (1.0 - a) * h,
                    max_lon: truth.1 + (1.0 - b) * w,
                }
            } else {
                Observed::Laplace {
                    lat: truth.0 + rng.random_range(-0.01..0.01),
                    lon: truth.1 + rng.random_range(-0.01..0.01),
                    epsilon_per_km: [0.5, 1.0, 2.0, 5.0, 20.0][rng.random_range(0..5)],
                }
            };
            let fast = grid.adversary_error(&observed, truth).unwrap();
            let slow = brute(&grid, &observed, truth);
            assert!(
                (fast - slow).abs() <= 1e-6 * slow.max(1.0),
                "{observed:?}: {fast} vs brute force {slow}"
            );
            assert!(fast > 0.0);
        }
    }

    #[test]
    fn a_sharper_mechanism_leaves_the_adversary_a_smaller_error() {
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let pts = positions(&mut rng, 2_000);
        let grid = Grid::from_positions(&pts, 100.0, 100_000).unwrap();
        let truth = pts[0];
        let at = |eps| Observed::Laplace {
            lat: truth.0,
            lon: truth.1,
            epsilon_per_km: eps,
        };
        let loose = grid.adversary_error(&at(0.2), truth).unwrap();
        let sharp = grid.adversary_error(&at(50.0), truth).unwrap();
        assert!(sharp < 100.0 && loose > 4.0 * sharp, "{sharp} {loose}");
        // A box outside every position falls back to the cells it overlaps.
        let far = Observed::Box {
            min_lat: 60.0,
            min_lon: 8.0,
            max_lat: 60.1,
            max_lon: 8.1,
        };
        assert!(grid.adversary_error(&far, truth).unwrap() > 0.0);
        let bad = Observed::Laplace {
            lat: f64::NAN,
            lon: 8.0,
            epsilon_per_km: 1.0,
        };
        assert_eq!(grid.adversary_error(&bad, truth), None);
        assert!(Grid::from_positions(&pts, 1.0, 1_000).is_err());
        assert!(Grid::from_positions(&[], 100.0, 1_000).is_err());
    }

    #[test]
    fn the_quality_loss_of_a_square_around_the_point_is_its_mean_distance() {
        // Mean distance from the centre of a square of side a to its points: a (sqrt 2 + ln(1 +
        // sqrt 2)) / 6.
        let (lat, lon): (f64, f64) = (53.1, 8.2);
        let side = 1_000.0;
        let dlat = side / METRES_PER_DEGREE_LAT;
        let dlon = side / (METRES_PER_DEGREE_LAT * lat.to_radians().cos());
        let b = Observed::Box {
            min_lat: lat - dlat / 2.0,
            min_lon: lon - dlon / 2.0,
            max_lat: lat + dlat / 2.0,
            max_lon: lon + dlon / 2.0,
        };
        let expected = side * (2f64.sqrt() + (1.0 + 2f64.sqrt()).ln()) / 6.0;
        let got = quality_loss(&b, (lat, lon)).unwrap();
        assert!(
            (got - expected).abs() < 1e-3 * expected,
            "{got} vs {expected}"
        );
        let p = Observed::Laplace {
            lat: lat + dlat,
            lon,
            epsilon_per_km: 1.0,
        };
        assert!((quality_loss(&p, (lat, lon)).unwrap() - side).abs() < 1e-6);
        let area = box_area_m2(
            lat - dlat / 2.0,
            lon - dlon / 2.0,
            lat + dlat / 2.0,
            lon + dlon / 2.0,
        );
        assert!((area - side * side).abs() < 1e-3 * side * side, "{area}");
    }
}
