//! The client side: from a candidate list and the client's own point, the exact answer.
//!
//! Nearest n: the n candidates closest to the point (great-circle metres, ties broken by id in byte
//! order), nearest first. Range r: the candidates within r metres, nearest first (ties by id). Given a
//! candidate list of a box that holds the point, this is the answer the point would get from all POIs.
use super::sphere::haversine_m;
use super::{Poi, Query};

/// The exact answer among `candidates` (given as `(lat, lon, id)`) for the point, as indexes into
/// `candidates`, nearest first.
pub fn refine_indexes<'a>(
    candidates: impl IntoIterator<Item = (f64, f64, &'a str)>,
    lat: f64,
    lon: f64,
    query: &Query,
) -> Vec<usize> {
    let mut ranked: Vec<(f64, &str, usize)> = candidates
        .into_iter()
        .enumerate()
        .map(|(i, (plat, plon, id))| (haversine_m(lat, lon, plat, plon), id, i))
        .collect();
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)).then(a.2.cmp(&b.2)));
    match *query {
        Query::Nearest { count } => ranked.truncate(count as usize),
        Query::Range { radius_m } => ranked.retain(|r| r.0 <= radius_m),
    }
    ranked.into_iter().map(|r| r.2).collect()
}

/// The exact answer among `candidates` for the point, nearest first.
pub fn refine(candidates: &[Poi], lat: f64, lon: f64, query: &Query) -> Vec<Poi> {
    refine_indexes(
        candidates.iter().map(|p| (p.lat, p.lon, p.id.as_str())),
        lat,
        lon,
        query,
    )
    .into_iter()
    .map(|i| candidates[i].clone())
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poi(id: &str, lat: f64, lon: f64) -> Poi {
        Poi {
            id: id.into(),
            lat,
            lon,
            category: "cafe".into(),
            name: String::new(),
        }
    }

    #[test]
    fn nearest_first_ties_by_id_and_range_by_radius() {
        let c = [
            poi("b", 53.001, 8.0),
            poi("a", 53.001, 8.0),
            poi("c", 53.0, 8.01),
        ];
        let ids = |v: Vec<Poi>| v.into_iter().map(|p| p.id).collect::<Vec<_>>();
        // a and b are at the same place: a first by id.
        let near = refine(&c, 53.0, 8.0, &Query::Nearest { count: 2 });
        assert_eq!(ids(near), ["a", "b"]);
        let range = refine(&c, 53.0, 8.0, &Query::Range { radius_m: 200.0 });
        assert_eq!(ids(range).len(), 2);
        let all = refine(&c, 53.0, 8.0, &Query::Range { radius_m: 1000.0 });
        assert_eq!(ids(all), ["a", "b", "c"]);
    }
}
