//! Geometry of constraint and cloaking boxes.
//!
//! Tolerances are metres; positions and boxes are WGS84 degrees. A constraint box is computed in the
//! request's local tangent plane (equirectangular projection at its own latitude): dy metres north-south
//! are `dy / METRES_PER_DEGREE_LAT` degrees of latitude, dx metres east-west are
//! `dx / (METRES_PER_DEGREE_LAT * cos(lat))` degrees of longitude. That is exact to well under a metre
//! for the tolerances the broker accepts (at most tens of kilometres) away from the poles; near a pole
//! the longitude half-width is capped at 180 degrees.

/// Metres per degree of latitude (mean Earth radius 6,371,008.8 m).
pub const METRES_PER_DEGREE_LAT: f64 = 6_371_008.8 * std::f64::consts::PI / 180.0;

/// An axis-aligned box in degrees (closed on all sides).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GeoBox {
    pub min_lat: f64,
    pub min_lon: f64,
    pub max_lat: f64,
    pub max_lon: f64,
}

impl GeoBox {
    /// The degenerate box of one point.
    pub fn point(lat: f64, lon: f64) -> GeoBox {
        GeoBox {
            min_lat: lat,
            min_lon: lon,
            max_lat: lat,
            max_lon: lon,
        }
    }

    /// Grows the box to contain the point.
    pub fn extend(&mut self, lat: f64, lon: f64) {
        self.min_lat = self.min_lat.min(lat);
        self.max_lat = self.max_lat.max(lat);
        self.min_lon = self.min_lon.min(lon);
        self.max_lon = self.max_lon.max(lon);
    }

    pub fn contains_point(&self, lat: f64, lon: f64) -> bool {
        self.min_lat <= lat && lat <= self.max_lat && self.min_lon <= lon && lon <= self.max_lon
    }

    pub fn contains_box(&self, other: &GeoBox) -> bool {
        self.min_lat <= other.min_lat
            && other.max_lat <= self.max_lat
            && self.min_lon <= other.min_lon
            && other.max_lon <= self.max_lon
    }

    /// Width (east-west) and height (north-south) in metres, measured at the box's centre latitude.
    pub fn size_m(&self) -> (f64, f64) {
        let centre_lat = 0.5 * (self.min_lat + self.max_lat);
        let w = (self.max_lon - self.min_lon)
            * METRES_PER_DEGREE_LAT
            * centre_lat.to_radians().cos().max(0.0);
        let h = (self.max_lat - self.min_lat) * METRES_PER_DEGREE_LAT;
        (w, h)
    }

    /// Area in square metres.
    pub fn area_m2(&self) -> f64 {
        let (w, h) = self.size_m();
        w * h
    }
}

/// Half-widths in degrees (latitude, longitude) of a dx × dy metre tolerance at latitude `lat`.
pub fn half_widths_deg(lat: f64, dx_m: f64, dy_m: f64) -> (f64, f64) {
    let dlat = dy_m / METRES_PER_DEGREE_LAT;
    let cos = lat.to_radians().cos();
    let dlon = if cos > 1e-9 {
        (dx_m / (METRES_PER_DEGREE_LAT * cos)).min(180.0)
    } else {
        180.0
    };
    (dlat, dlon)
}

/// The spatial constraint box Bcn of a request at (lat, lon) with tolerances dx, dy metres.
pub fn constraint_box(lat: f64, lon: f64, dx_m: f64, dy_m: f64) -> GeoBox {
    let (dlat, dlon) = half_widths_deg(lat, dx_m, dy_m);
    GeoBox {
        min_lat: lat - dlat,
        min_lon: lon - dlon,
        max_lat: lat + dlat,
        max_lon: lon + dlon,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraint_box_has_the_asked_size() {
        let b = constraint_box(53.14, 8.21, 500.0, 250.0);
        let (w, h) = b.size_m();
        assert!((w - 1000.0).abs() < 1.0, "{w}");
        assert!((h - 500.0).abs() < 1e-6, "{h}");
        assert!(b.contains_point(53.14, 8.21));
    }

    #[test]
    fn extend_makes_a_bounding_box() {
        let mut b = GeoBox::point(1.0, 2.0);
        b.extend(-1.0, 3.0);
        assert_eq!(
            b,
            GeoBox {
                min_lat: -1.0,
                min_lon: 2.0,
                max_lat: 1.0,
                max_lon: 3.0
            }
        );
        assert!(b.contains_box(&GeoBox::point(0.0, 2.5)));
    }
}
