//! Padding of a cloaking box, so that the forwarded box leaks nothing beyond the group.
//!
//! The minimum bounding rectangle (MBR) of a group's points has a member on each of its four edges: an
//! attacker who controls k-1 members (a Sybil) reads the victim's coordinates off the edges the
//! attacker's own points do not explain. Padding pushes each side outward by a random amount, within
//! `limit` (the intersection of the members' constraint boxes, which contains the MBR because every
//! member's point lies in every other member's constraint box).
//!
//! Per axis, the padded box is drawn as if the members were uniform draws from it:
//! - its width is `w / R`, with `w` the MBR's extent and `R ~ Beta(n-1, 3)`: the span of n of n+1
//!   uniform points in a unit interval. (The span of n uniform points alone, `Beta(n-1, 2)`, gives
//!   members a mean offset from the centre of 0.27-0.28 of the side on the Oldenburg slice rather
//!   than a uniform point's 0.25, because groups that span nearly their whole tolerance cannot be
//!   padded; the wider draw brings the mean to 0.266.) At least [`MIN_WIDTH_SHARE`] of the limit (an
//!   axis on which the members nearly coincide still gets a box), at most the limit;
//! - its position is uniform among the placements that contain the MBR and lie inside the limit,
//!   keeping each side at least [`MIN_PAD_M`] metres from the outermost member. The engine groups
//!   requests by their constraint boxes less that margin ([`super::CloakRequest::grouping_box`]), so
//!   the limit always leaves room for it.
//!
//! Measured on the Oldenburg slice (`oldenburg_boxes_leak_no_member_on_an_edge`): no box has an edge
//! within 1 m of a member's coordinate (the bare MBR: every box), members' mean offset from the centre
//! 0.266 (MBR 0.37), at the cost of the mean relative spatial resolution falling from 3.89 to 1.97
//! (boxes about 3.9 times the area of the MBR).
//!
//! Invariants (checked by the brute-force checker and the tests): the padded box contains the MBR
//! (hence every member's point) and lies inside `limit`; it is a function of the inputs and the RNG
//! only, so an RNG seeded the same way yields the same box (see [`pad_seeded`]: the presence model
//! gives every member of an anonymity set the same region this way).
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use rand_distr::{Beta, Distribution};

use super::GeoBox;
use super::geo::METRES_PER_DEGREE_LAT;

/// The least share of the limit's extent a padded box spans on each axis.
pub const MIN_WIDTH_SHARE: f64 = 0.25;

/// The least outward push of a side, in metres, where the limit leaves room for it.
pub const MIN_PAD_M: f64 = 2.0;

/// The tolerance used for grouping: `tolerance - MIN_PAD_M`, but at least half the tolerance.
pub fn grouping_tolerance(tolerance_m: f64) -> f64 {
    (tolerance_m - MIN_PAD_M).max(0.5 * tolerance_m)
}

/// Pads `mbr` (the bounding box of `members` points) inside `limit`, drawing from `rng`.
///
/// `limit` must contain `mbr`; if it does not (which a correct caller never does), the MBR is returned
/// unchanged rather than a box that would leave some member's constraint box.
pub fn pad<R: Rng + ?Sized>(mbr: &GeoBox, limit: &GeoBox, members: usize, rng: &mut R) -> GeoBox {
    if !limit.contains_box(mbr) {
        return *mbr;
    }
    let centre_lat = 0.5 * (mbr.min_lat + mbr.max_lat);
    let metres_per_degree_lon = METRES_PER_DEGREE_LAT * centre_lat.to_radians().cos().max(1e-9);
    let (min_lat, max_lat) = pad_axis(
        (mbr.min_lat, mbr.max_lat),
        (limit.min_lat, limit.max_lat),
        members,
        MIN_PAD_M / METRES_PER_DEGREE_LAT,
        rng,
    );
    let (min_lon, max_lon) = pad_axis(
        (mbr.min_lon, mbr.max_lon),
        (limit.min_lon, limit.max_lon),
        members,
        MIN_PAD_M / metres_per_degree_lon,
        rng,
    );
    GeoBox {
        min_lat,
        min_lon,
        max_lat,
        max_lon,
    }
}

/// [`pad`] with an RNG seeded from `seed`: equal inputs and seed give the identical box.
pub fn pad_seeded(mbr: &GeoBox, limit: &GeoBox, members: usize, seed: u64) -> GeoBox {
    pad(mbr, limit, members, &mut ChaCha20Rng::seed_from_u64(seed))
}

/// The intersection of constraint boxes (`None` for no boxes).
pub fn intersection<'a>(boxes: impl IntoIterator<Item = &'a GeoBox>) -> Option<GeoBox> {
    boxes.into_iter().fold(None, |acc: Option<GeoBox>, b| {
        Some(match acc {
            None => *b,
            Some(a) => GeoBox {
                min_lat: a.min_lat.max(b.min_lat),
                min_lon: a.min_lon.max(b.min_lon),
                max_lat: a.max_lat.min(b.max_lat),
                max_lon: a.max_lon.min(b.max_lon),
            },
        })
    })
}

/// One axis: `(lo, hi)` of the members inside `(limit_lo, limit_hi)`; `margin` is [`MIN_PAD_M`] in
/// this axis' degrees.
fn pad_axis<R: Rng + ?Sized>(
    (lo, hi): (f64, f64),
    (limit_lo, limit_hi): (f64, f64),
    members: usize,
    margin: f64,
    rng: &mut R,
) -> (f64, f64) {
    let extent = hi - lo;
    let room = limit_hi - limit_lo;
    if !extent.is_finite() || !room.is_finite() || room <= extent {
        return (lo, hi);
    }
    // Span of n of n+1 uniform points in a unit interval: Beta(n - 1, 3) (a lone point: Beta(1, 3)).
    let alpha = members.saturating_sub(1).max(1) as f64;
    let range: f64 = Beta::new(alpha, 3.0)
        .map(|beta| beta.sample(rng))
        .unwrap_or(1.0);
    let width = if range > 0.0 { extent / range } else { room };
    let width = width.max(MIN_WIDTH_SHARE * room).max(extent).min(room);
    // Lower edges that keep the box around the members and inside the limit ...
    let low = limit_lo.max(hi - width);
    let high = lo.min(limit_hi - width);
    // ... and, where there is room, `margin` away from the outermost members on both sides.
    let (low, high) = match (low.max(hi + margin - width), high.min(lo - margin)) {
        (l, h) if l <= h => (l, h),
        _ => (low, high),
    };
    let start = if high > low {
        rng.random_range(low..=high)
    } else {
        low
    };
    // Rounding must not cut a member off or leave the limit.
    let new_lo = start.min(lo).max(limit_lo);
    let new_hi = (start + width).max(hi).min(limit_hi);
    (new_lo, new_hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boxed(min_lat: f64, min_lon: f64, max_lat: f64, max_lon: f64) -> GeoBox {
        GeoBox {
            min_lat,
            min_lon,
            max_lat,
            max_lon,
        }
    }

    #[test]
    fn padded_box_contains_the_members_and_lies_in_the_limit() {
        let mbr = boxed(53.1400, 8.2100, 53.1420, 8.2130);
        let limit = boxed(53.1380, 8.2080, 53.1440, 8.2160);
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let mut grew = 0;
        for _ in 0..1000 {
            let b = pad(&mbr, &limit, 5, &mut rng);
            assert!(b.contains_box(&mbr), "{b:?}");
            assert!(limit.contains_box(&b), "{b:?}");
            if b.min_lat < mbr.min_lat && b.max_lon > mbr.max_lon {
                grew += 1;
            }
        }
        assert!(grew > 900, "{grew}");
    }

    #[test]
    fn a_tight_limit_leaves_the_box_alone() {
        let mbr = boxed(1.0, 1.0, 2.0, 2.0);
        assert_eq!(pad_seeded(&mbr, &mbr, 3, 1), mbr);
        // A limit that does not contain the MBR is a caller bug: nothing is padded.
        let smaller = boxed(1.1, 1.1, 2.0, 2.0);
        assert_eq!(pad_seeded(&mbr, &smaller, 3, 1), mbr);
    }

    #[test]
    fn the_same_seed_gives_the_same_region() {
        let mbr = boxed(53.14, 8.21, 53.141, 8.212);
        let limit = boxed(53.13, 8.20, 53.15, 8.22);
        assert_eq!(
            pad_seeded(&mbr, &limit, 4, 99),
            pad_seeded(&mbr, &limit, 4, 99)
        );
        assert_ne!(
            pad_seeded(&mbr, &limit, 4, 99),
            pad_seeded(&mbr, &limit, 4, 100)
        );
    }

    #[test]
    fn intersection_of_boxes() {
        let a = boxed(0.0, 0.0, 2.0, 2.0);
        let b = boxed(1.0, -1.0, 3.0, 1.5);
        assert_eq!(intersection([&a, &b]), Some(boxed(1.0, 0.0, 2.0, 1.5)));
        assert_eq!(intersection(std::iter::empty()), None);
    }

    /// Edge and centre statistics of the cloaking boxes the engine forwards for the Oldenburg slice.
    #[derive(Debug, Default)]
    struct BoxStatistics {
        groups: usize,
        /// Groups whose box has an edge within 1 m of a member's coordinate.
        edge_within_1m: usize,
        /// Sum and count of members' |coordinate - centre| / side, per axis.
        offset_sum: f64,
        offsets: usize,
        /// Sums of relative spatial resolution over members: padded box, and the bare MBR.
        resolution_padded: f64,
        resolution_mbr: f64,
        members: usize,
    }

    fn oldenburg_statistics() -> BoxStatistics {
        use crate::location::replay::{oldenburg_slice, relative_spatial_resolution};
        use crate::location::{Engine, Outcome, SearchMode};
        let requests = oldenburg_slice();
        let mut engine = Engine::new(SearchMode::NbrK, 17);
        let mut outcomes = Vec::new();
        for request in &requests {
            engine.submit(request.clone(), &mut outcomes).unwrap();
        }
        engine.expire(i64::MAX, &mut outcomes);
        let mut stats = BoxStatistics::default();
        for outcome in &outcomes {
            let Outcome::Cloaked(group) = outcome else {
                continue;
            };
            let members: Vec<_> = group
                .members
                .iter()
                .map(|(id, _)| requests[*id as usize].clone())
                .collect();
            let b = &group.cloaking_box;
            crate::location::checker::check_padded_box(b, &members).unwrap();
            let mut mbr = GeoBox::point(members[0].lat, members[0].lon);
            for m in &members {
                mbr.extend(m.lat, m.lon);
            }
            stats.groups += 1;
            let metres_lon =
                METRES_PER_DEGREE_LAT * (0.5 * (b.min_lat + b.max_lat)).to_radians().cos();
            let near = members.iter().any(|m| {
                [b.min_lat, b.max_lat]
                    .iter()
                    .any(|e| (e - m.lat).abs() * METRES_PER_DEGREE_LAT < 1.0)
                    || [b.min_lon, b.max_lon]
                        .iter()
                        .any(|e| (e - m.lon).abs() * metres_lon < 1.0)
            });
            stats.edge_within_1m += usize::from(near);
            for m in &members {
                for (x, lo, hi) in [(m.lat, b.min_lat, b.max_lat), (m.lon, b.min_lon, b.max_lon)] {
                    if hi > lo {
                        stats.offset_sum += (x - 0.5 * (lo + hi)).abs() / (hi - lo);
                        stats.offsets += 1;
                    }
                }
                stats.resolution_padded += relative_spatial_resolution(&m.constraint_box(), b);
                stats.resolution_mbr += relative_spatial_resolution(&m.constraint_box(), &mbr);
                stats.members += 1;
            }
        }
        stats
    }

    /// The targets over the Oldenburg slice: at most 1 % of boxes with an edge within 1 m of
    /// a member's coordinate, and the members' mean offset from the centre within 0.02 of a uniform
    /// point's 0.25 (the bare MBR: 0.37, with a member on every edge).
    #[test]
    fn oldenburg_boxes_leak_no_member_on_an_edge() {
        let stats = oldenburg_statistics();
        let edge_share = stats.edge_within_1m as f64 / stats.groups as f64;
        let mean_offset = stats.offset_sum / stats.offsets as f64;
        let padded = stats.resolution_padded / stats.members as f64;
        let mbr = stats.resolution_mbr / stats.members as f64;
        eprintln!(
            "groups {}, edge within 1 m {:.4}, mean offset from centre {mean_offset:.4}, relative spatial resolution padded {padded:.3} vs MBR {mbr:.3}",
            stats.groups, edge_share
        );
        assert!(stats.groups >= 1_000, "{stats:?}");
        assert!(edge_share <= 0.01, "{stats:?}");
        assert!(
            (mean_offset - 0.25).abs() <= 0.02,
            "mean offset {mean_offset}"
        );
    }

    mod properties {
        use proptest::prelude::*;

        use super::super::*;
        use crate::location::CloakRequest;
        use crate::location::checker::check_padded_box;

        /// Random groups that CliqueCloak could form: every point inside every member's
        /// constraint box.
        fn group() -> impl Strategy<Value = Vec<CloakRequest>> {
            (
                -60.0f64..60.0,
                -179.0f64..179.0,
                1.0f64..2000.0,
                proptest::collection::vec(
                    (0.0f64..1.0, 0.0f64..1.0, 1.0f64..3.0, 1.0f64..3.0),
                    1..20,
                ),
            )
                .prop_map(|(lat, lon, spread_m, members)| {
                    members
                        .into_iter()
                        .enumerate()
                        .map(|(i, (u, v, fx, fy))| {
                            let (dlat, dlon) =
                                crate::location::geo::half_widths_deg(lat, spread_m, spread_m);
                            CloakRequest {
                                id: i as u64,
                                user: i as u64,
                                lat: lat + (u - 0.5) * dlat,
                                lon: lon + (v - 0.5) * dlon,
                                k: 2,
                                // At least the spread, so every point lies in every box.
                                dx_m: spread_m * fx,
                                dy_m: spread_m * fy,
                                dt_ms: 1000,
                                arrival_ms: 0,
                            }
                        })
                        .collect::<Vec<_>>()
                })
                .prop_filter("every point inside every constraint box", |members| {
                    members.iter().all(|a| {
                        members
                            .iter()
                            .all(|b| a.constraint_box().contains_point(b.lat, b.lon))
                    })
                })
        }

        proptest! {
            #[test]
            fn padded_boxes_hold_every_member_inside_every_constraint_box(
                members in group(),
                seed in any::<u64>(),
            ) {
                let mut mbr = GeoBox::point(members[0].lat, members[0].lon);
                for m in &members {
                    mbr.extend(m.lat, m.lon);
                }
                let boxes: Vec<GeoBox> = members.iter().map(CloakRequest::constraint_box).collect();
                let limit = intersection(&boxes).unwrap();
                let padded = pad_seeded(&mbr, &limit, members.len(), seed);
                if let Err(e) = check_padded_box(&padded, &members) {
                    prop_assert!(false, "{}", e);
                }
                prop_assert_eq!(padded, pad_seeded(&mbr, &limit, members.len(), seed));
            }
        }
    }
}
