//! The Hilbert space-filling curve over the globe, the user order of Hilbert Cloak (Kalnis et al.,
//! "Preventing Location-Based Identity Inference in Anonymous Spatial Queries", TKDE 2007).
//!
//! A WGS84 position is projected with spherical Web Mercator (conformal, so a grid cell is locally a
//! square on the ground; latitudes beyond ±85.0511° are clamped), quantized to a 2^32 × 2^32 grid (cells
//! of about 9 mm at the equator) and mapped to its distance along the Hilbert curve of order 32, a `u64`.
//! Positions close along the curve are close on the ground (the converse does not always hold).
//!
//! Invariants: [`xy_to_d`] and [`d_to_xy`] are inverse bijections between the grid of side 2^order and
//! `0..4^order`; consecutive distances are neighbouring cells; [`hilbert_value`] is a pure function of
//! (lat, lon).

/// Bits per grid coordinate of [`hilbert_value`].
pub const ORDER: u32 = 32;

/// Largest latitude Web Mercator represents (the projection of a square world map).
const MAX_MERCATOR_LAT: f64 = 85.051_128_779_806_59;

/// Distance along the Hilbert curve of order [`ORDER`] of a WGS84 position (degrees). Out-of-range or
/// non-finite inputs are clamped to the map's edge (callers validate positions before).
pub fn hilbert_value(lat: f64, lon: f64) -> u64 {
    let (x, y) = grid_cell(lat, lon);
    xy_to_d(ORDER, x, y)
}

/// The Web Mercator grid cell (x east, y north) of a position, each coordinate in `0..2^32`.
pub fn grid_cell(lat: f64, lon: f64) -> (u32, u32) {
    let lon = if lon.is_finite() {
        lon.clamp(-180.0, 180.0)
    } else {
        0.0
    };
    let lat = if lat.is_finite() {
        lat.clamp(-MAX_MERCATOR_LAT, MAX_MERCATOR_LAT)
    } else {
        0.0
    };
    let fx = (lon + 180.0) / 360.0;
    let mercator_y = (std::f64::consts::FRAC_PI_4 + lat.to_radians() / 2.0)
        .tan()
        .ln();
    let fy = (mercator_y + std::f64::consts::PI) / (2.0 * std::f64::consts::PI);
    (quantize(fx), quantize(fy))
}

fn quantize(f: f64) -> u32 {
    // `as` saturates, and NaN cannot occur here (inputs are clamped and finite).
    (f.clamp(0.0, 1.0) * f64::from(u32::MAX)).round() as u32
}

/// Distance along the Hilbert curve of the given order (1..=32) of grid cell (x, y); only the low
/// `order` bits of x and y are used.
pub fn xy_to_d(order: u32, x: u32, y: u32) -> u64 {
    let order = order.clamp(1, 32);
    let mask = if order == 32 {
        u32::MAX
    } else {
        (1u32 << order) - 1
    };
    let (mut x, mut y) = (x & mask, y & mask);
    let mut d: u64 = 0;
    let mut s: u32 = 1 << (order - 1);
    while s > 0 {
        let rx = u64::from(x & s != 0);
        let ry = u64::from(y & s != 0);
        d += u64::from(s) * u64::from(s) * ((3 * rx) ^ ry);
        // Rotate the quadrant so the sub-curve has the canonical orientation.
        if ry == 0 {
            if rx == 1 {
                x = mask - x;
                y = mask - y;
            }
            std::mem::swap(&mut x, &mut y);
        }
        s >>= 1;
    }
    d
}

/// The grid cell at distance `d` along the Hilbert curve of the given order (1..=32); the inverse of
/// [`xy_to_d`].
pub fn d_to_xy(order: u32, d: u64) -> (u32, u32) {
    let order = order.clamp(1, 32);
    let (mut x, mut y): (u64, u64) = (0, 0);
    let mut t = d;
    let mut s: u64 = 1;
    while s < (1u64 << order) {
        let rx = 1 & (t / 2);
        let ry = 1 & (t ^ rx);
        if ry == 0 {
            if rx == 1 {
                x = s - 1 - x;
                y = s - 1 - y;
            }
            std::mem::swap(&mut x, &mut y);
        }
        x += s * rx;
        y += s * ry;
        t /= 4;
        s <<= 1;
    }
    // x, y < 2^order <= 2^32.
    (x as u32, y as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_curves_are_bijective_and_continuous() {
        for order in 1..=5u32 {
            let side = 1u32 << order;
            let cells = u64::from(side) * u64::from(side);
            let mut seen = vec![false; cells as usize];
            let mut previous: Option<(u32, u32)> = None;
            for d in 0..cells {
                let (x, y) = d_to_xy(order, d);
                assert!(x < side && y < side);
                assert_eq!(xy_to_d(order, x, y), d, "order {order} d {d}");
                assert!(!seen[d as usize]);
                seen[d as usize] = true;
                if let Some((px, py)) = previous {
                    assert_eq!(px.abs_diff(x) + py.abs_diff(y), 1, "order {order} d {d}");
                }
                previous = Some((x, y));
            }
        }
    }

    proptest! {
        #[test]
        fn order_32_round_trips(x in any::<u32>(), y in any::<u32>()) {
            let d = xy_to_d(32, x, y);
            prop_assert_eq!(d_to_xy(32, d), (x, y));
        }

        #[test]
        fn neighbours_along_the_curve_are_adjacent(d in 0u64..u64::MAX) {
            let (x0, y0) = d_to_xy(32, d);
            let (x1, y1) = d_to_xy(32, d + 1);
            prop_assert_eq!(x0.abs_diff(x1) + y0.abs_diff(y1), 1);
        }
    }

    #[test]
    fn positions_map_inside_the_grid_and_clamp() {
        assert_eq!(grid_cell(0.0, -180.0).0, 0);
        assert_eq!(grid_cell(0.0, 180.0).0, u32::MAX);
        assert_eq!(grid_cell(90.0, 0.0).1, u32::MAX);
        assert_eq!(grid_cell(-90.0, 0.0).1, 0);
        assert_eq!(grid_cell(f64::NAN, f64::INFINITY), grid_cell(0.0, 0.0));
        // Nearby points get nearby values more often than not; identical points identical values.
        assert_eq!(hilbert_value(53.14, 8.21), hilbert_value(53.14, 8.21));
    }
}
