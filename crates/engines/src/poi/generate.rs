//! A seeded synthetic POI set along a road network (no public POI file ships with cloakd).
//!
//! Each POI sits on a road: an edge drawn with probability proportional to its length times a weight of
//! its road class ([`CLASS_WEIGHT`]: none on class 0, the motorways of Brinkhoff's Oldenburg network;
//! most on class 3, the town streets), at a uniform position along the edge, set back 8 to 40 m to a
//! random side (shops face the street). Categories are drawn from [`CATEGORIES`], shares chosen to
//! resemble the order of frequency of OpenStreetMap amenity and shop tags in a German town (parking,
//! restaurants, fast food, hairdressers, shops and bakeries common; hotels, fuel, schools rare); they
//! are an assumption of this generator, not a measurement. Ids are `p0000001`, ...; names are the
//! category's label and a number. The same network, count and seed give the same file, byte for byte.
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::Poi;
use super::sphere::EARTH_RADIUS_M;

/// (category, label, share in percent).
pub const CATEGORIES: [(&str, &str, u32); 21] = [
    ("parking", "Parking", 14),
    ("restaurant", "Restaurant", 12),
    ("fast_food", "Imbiss", 7),
    ("cafe", "Cafe", 6),
    ("bakery", "Baeckerei", 6),
    ("hairdresser", "Friseur", 6),
    ("clothes", "Mode", 6),
    ("post_box", "Briefkasten", 5),
    ("bar", "Kneipe", 4),
    ("supermarket", "Markt", 4),
    ("doctors", "Praxis", 4),
    ("kindergarten", "Kita", 4),
    ("kiosk", "Kiosk", 3),
    ("dentist", "Zahnarzt", 3),
    ("atm", "Geldautomat", 3),
    ("place_of_worship", "Kirche", 3),
    ("pharmacy", "Apotheke", 2),
    ("bank", "Bank", 2),
    ("fuel", "Tankstelle", 2),
    ("school", "Schule", 2),
    ("hotel", "Hotel", 2),
];

/// Weight of a road class (Brinkhoff's classes 0..=6, fastest first) per metre of road.
pub const CLASS_WEIGHT: [f64; 7] = [0.0, 0.5, 1.0, 2.0, 1.5, 1.0, 0.5];

/// A road: its two end points (degrees) and its class.
#[derive(Debug, Clone, Copy)]
pub struct Road {
    pub from: (f64, f64),
    pub to: (f64, f64),
    pub class: u8,
}

fn metres_between(a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
    let m_per_deg = EARTH_RADIUS_M.to_radians();
    let cos = (0.5 * (a.0 + b.0)).to_radians().cos();
    ((b.1 - a.1) * m_per_deg * cos, (b.0 - a.0) * m_per_deg)
}

/// `count` POIs along the roads, seeded. Fails when no road has a positive weight.
pub fn generate(roads: &[Road], count: usize, seed: u64) -> Result<Vec<Poi>, String> {
    let mut cumulative = Vec::with_capacity(roads.len());
    let mut total = 0.0;
    for r in roads {
        let (east, north) = metres_between(r.from, r.to);
        let weight = CLASS_WEIGHT
            .get(usize::from(r.class))
            .copied()
            .unwrap_or(1.0);
        total += east.hypot(north) * weight;
        cumulative.push(total);
    }
    if total.is_nan() || total <= 0.0 {
        return Err("no road with a positive length and class weight".into());
    }
    let shares: u32 = CATEGORIES.iter().map(|c| c.2).sum();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut serial = [0u32; CATEGORIES.len()];
    let mut pois = Vec::with_capacity(count);
    let m_per_deg = EARTH_RADIUS_M.to_radians();
    for i in 0..count {
        let pick = rng.random_range(0.0..total);
        let road = &roads[cumulative
            .partition_point(|&c| c <= pick)
            .min(roads.len() - 1)];
        let t: f64 = rng.random();
        let (east, north) = metres_between(road.from, road.to);
        let length = east.hypot(north).max(1e-9);
        let setback = rng.random_range(8.0..40.0) * if rng.random::<bool>() { 1.0 } else { -1.0 };
        // Perpendicular to the road (to its left for a positive setback).
        let (off_e, off_n) = (-north / length * setback, east / length * setback);
        let lat = road.from.0 + t * (road.to.0 - road.from.0) + off_n / m_per_deg;
        let cos = lat.to_radians().cos();
        let lon = road.from.1 + t * (road.to.1 - road.from.1) + off_e / (m_per_deg * cos);
        let mut draw = rng.random_range(0..shares);
        let mut c = 0;
        while draw >= CATEGORIES[c].2 {
            draw -= CATEGORIES[c].2;
            c += 1;
        }
        serial[c] += 1;
        pois.push(Poi {
            id: format!("p{:07}", i + 1),
            lat,
            lon,
            category: CATEGORIES[c].0.to_string(),
            name: format!("{} {}", CATEGORIES[c].1, serial[c]),
        });
    }
    Ok(pois)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_near_the_roads_with_the_shares() {
        let roads = [
            Road {
                from: (53.14, 8.20),
                to: (53.15, 8.21),
                class: 3,
            },
            Road {
                from: (53.10, 8.10),
                to: (53.20, 8.30),
                class: 0,
            },
        ];
        let a = generate(&roads, 20_000, 5).unwrap();
        assert_eq!(a, generate(&roads, 20_000, 5).unwrap());
        assert_ne!(a, generate(&roads, 20_000, 6).unwrap());
        for p in &a {
            // All on the class-3 road (the motorway has weight 0), within 40 m of it.
            assert!((53.1395..=53.1505).contains(&p.lat), "{p:?}");
            assert!((8.1993..=8.2107).contains(&p.lon), "{p:?}");
        }
        let parking = a.iter().filter(|p| p.category == "parking").count() as f64;
        assert!((parking / 20_000.0 - 0.14).abs() < 0.01, "{parking}");
    }
}
