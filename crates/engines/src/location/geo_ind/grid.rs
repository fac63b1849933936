//! The fixed grid of the mechanism and its truncation region.
//!
//! Rows are latitudes i * dlat with dlat = u / METRES_PER_DEGREE_LAT; the columns of row i are
//! longitudes j * dlon_i with dlon_i = u / (METRES_PER_DEGREE_LAT * cos(row latitude)), so
//! neighbouring grid points are u metres apart in every row and between rows. The grid depends only on
//! u: never on a true position (a grid centred on the true point would give its offset away).
//!
//! Invariants: `snap_inside` returns a grid point inside the region for every finite or infinite input
//! (NaN coordinates are treated as the region's minimum); the region holds at least one grid point in
//! each row it spans (checked by [`Grid::new`]).

use crate::location::GeoBox;
use crate::location::geo::METRES_PER_DEGREE_LAT;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    step_m: f64,
    dlat: f64,
    region: GeoBox,
    first_row: i64,
    last_row: i64,
}

impl Grid {
    /// `None` when the region holds no grid row, or a row of it no grid column.
    pub fn new(step_m: f64, region: GeoBox) -> Option<Grid> {
        let finite = [
            region.min_lat,
            region.min_lon,
            region.max_lat,
            region.max_lon,
        ]
        .iter()
        .all(|v| v.is_finite());
        if !(step_m.is_finite() && step_m > 0.0 && finite)
            || region.min_lat >= region.max_lat
            || region.min_lon >= region.max_lon
        {
            return None;
        }
        let dlat = step_m / METRES_PER_DEGREE_LAT;
        let first_row = (region.min_lat / dlat).ceil() as i64;
        let last_row = (region.max_lat / dlat).floor() as i64;
        if first_row > last_row {
            return None;
        }
        let grid = Grid {
            step_m,
            dlat,
            region,
            first_row,
            last_row,
        };
        // The widest longitude step is in the row farthest from the equator.
        let widest = grid.dlon(first_row).max(grid.dlon(last_row));
        if (region.max_lon - region.min_lon) < 2.0 * widest {
            return None;
        }
        Some(grid)
    }

    pub fn step_m(&self) -> f64 {
        self.step_m
    }

    pub fn region(&self) -> &GeoBox {
        &self.region
    }

    fn row_lat(&self, row: i64) -> f64 {
        row as f64 * self.dlat
    }

    fn dlon(&self, row: i64) -> f64 {
        let cos = self.row_lat(row).to_radians().cos().max(1e-6);
        self.step_m / (METRES_PER_DEGREE_LAT * cos)
    }

    /// The grid point nearest to (lat, lon) among those inside the region: the point is first moved
    /// to the nearest point of the region (clamped), then to the nearest row inside it and the
    /// nearest column of that row inside it. Distance moved beyond the clamp: at most u/sqrt(2).
    pub fn snap_inside(&self, lat: f64, lon: f64) -> (f64, f64) {
        let r = &self.region;
        let lat = if lat.is_nan() {
            r.min_lat
        } else {
            lat.clamp(r.min_lat, r.max_lat)
        };
        let lon = if lon.is_nan() {
            r.min_lon
        } else {
            lon.clamp(r.min_lon, r.max_lon)
        };
        let row = ((lat / self.dlat).round() as i64).clamp(self.first_row, self.last_row);
        let dlon = self.dlon(row);
        let first_col = (r.min_lon / dlon).ceil() as i64;
        let last_col = (r.max_lon / dlon).floor() as i64;
        let col = ((lon / dlon).round() as i64).clamp(first_col, last_col.max(first_col));
        (self.row_lat(row), col as f64 * dlon)
    }
}
