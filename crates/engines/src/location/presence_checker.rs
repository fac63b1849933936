//! Independent brute-force checker of presence k-anonymity (the guarantees of [`super::presence`]).
//!
//! Written apart from the engine and deliberately naive: it keeps its own model of every user's latest
//! position (a `BTreeMap`, ages compared directly with the definition: a position recorded at t is
//! present at `now` while `now - t <= max_age_ms`), scans all users for each check (no Hilbert order,
//! no partition, no spatial index) and computes constraint boxes from the definition (dy metres are
//! dy / 111,195 m of latitude, dx metres are dx / (111,195 m · cos lat) of longitude). It checks, for a
//! region answered to a request:
//! - the requester is present and inside the region, and at least k distinct present users' latest
//!   positions lie inside it;
//! - the region lies inside the requester's constraint box;
//! - reciprocity: re-cloaking the users inside the region with the same k on the same snapshot (through
//!   a caller-given function: a clone of the engine, or the real daemon) gives exactly this region to at
//!   least k of them, the requester among them.
//!
//! Containment is tested with a tolerance of [`TOLERANCE_DEG`] (about 0.1 mm), for rounding only.
//! Used by the engine's property tests and by the daemon's integration tests on the client side.

use std::collections::BTreeMap;

use super::GeoBox;

/// Slack for floating-point rounding in containment tests, degrees.
pub const TOLERANCE_DEG: f64 = 1e-9;

/// Mean Earth radius (m) times π / 180: metres per degree of latitude, stated here independently.
const METRES_PER_DEG: f64 = 6_371_008.8 * std::f64::consts::PI / 180.0;

/// The checker's own model of the snapshot: each user's latest position and when it was recorded.
#[derive(Debug, Clone)]
pub struct PresenceChecker<U> {
    max_age_ms: u64,
    latest: BTreeMap<U, (f64, f64, i64)>,
}

/// What a region check found.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionCheck<U> {
    /// Present users whose latest position lies inside the region (the requester among them).
    pub inside: Vec<U>,
}

fn inside(region: &GeoBox, lat: f64, lon: f64) -> bool {
    region.min_lat - TOLERANCE_DEG <= lat
        && lat <= region.max_lat + TOLERANCE_DEG
        && region.min_lon - TOLERANCE_DEG <= lon
        && lon <= region.max_lon + TOLERANCE_DEG
}

impl<U: Ord + Clone + std::fmt::Debug> PresenceChecker<U> {
    pub fn new(max_age_ms: u64) -> PresenceChecker<U> {
        PresenceChecker {
            max_age_ms,
            latest: BTreeMap::new(),
        }
    }

    /// Records a user's position (an update, or a request's own position) at `at_ms`.
    pub fn record(&mut self, user: U, lat: f64, lon: f64, at_ms: i64) {
        self.latest.insert(user, (lat, lon, at_ms));
    }

    /// Removes a user from the model (a refused update or request recorded nothing).
    pub fn forget(&mut self, user: &U) {
        self.latest.remove(user);
    }

    /// The present users at `now_ms` with their latest positions.
    pub fn present(&self, now_ms: i64) -> Vec<(U, f64, f64)> {
        self.latest
            .iter()
            .filter(|(_, (_, _, at))| {
                i128::from(now_ms) - i128::from(*at) <= i128::from(self.max_age_ms)
            })
            .map(|(u, (lat, lon, _))| (u.clone(), *lat, *lon))
            .collect()
    }

    /// The latest position of a present user.
    pub fn position(&self, user: &U, now_ms: i64) -> Option<(f64, f64)> {
        let (lat, lon, at) = *self.latest.get(user)?;
        (i128::from(now_ms) - i128::from(at) <= i128::from(self.max_age_ms)).then_some((lat, lon))
    }

    /// Checks a region answered at `now_ms` to `requester` (whose request position is `lat, lon`,
    /// already recorded) with anonymity level k and tolerances dx, dy metres.
    #[allow(clippy::too_many_arguments)]
    pub fn check_region(
        &self,
        requester: &U,
        lat: f64,
        lon: f64,
        k: u32,
        dx_m: f64,
        dy_m: f64,
        region: &GeoBox,
        now_ms: i64,
    ) -> Result<RegionCheck<U>, String> {
        if !(region.min_lat <= region.max_lat && region.min_lon <= region.max_lon) {
            return Err(format!("region {region:?} is not a box"));
        }
        match self.position(requester, now_ms) {
            Some(p) if p == (lat, lon) => {}
            other => {
                return Err(format!(
                    "the requester's latest position is {other:?}, not its request's"
                ));
            }
        }
        if !inside(region, lat, lon) {
            return Err(format!("the requester lies outside its region {region:?}"));
        }
        let dlat = dy_m / METRES_PER_DEG;
        let cos = lat.to_radians().cos();
        let dlon = if cos > 1e-9 {
            (dx_m / (METRES_PER_DEG * cos)).min(180.0)
        } else {
            180.0
        };
        let fits = lat - dlat - TOLERANCE_DEG <= region.min_lat
            && region.max_lat <= lat + dlat + TOLERANCE_DEG
            && lon - dlon - TOLERANCE_DEG <= region.min_lon
            && region.max_lon <= lon + dlon + TOLERANCE_DEG;
        if !fits {
            return Err(format!(
                "region {region:?} exceeds the constraint box of ±{dx_m} m × ±{dy_m} m"
            ));
        }
        let users_inside: Vec<U> = self
            .present(now_ms)
            .into_iter()
            .filter(|(_, la, lo)| inside(region, *la, *lo))
            .map(|(u, _, _)| u)
            .collect();
        if users_inside.len() < k as usize {
            return Err(format!(
                "region {region:?} holds {} present users, fewer than k = {k}",
                users_inside.len()
            ));
        }
        Ok(RegionCheck {
            inside: users_inside,
        })
    }

    /// Reciprocity of `region` for k: `recloak(user)` re-cloaks a user inside the region with the same
    /// k on the same snapshot and returns its region (None when it got none). At least k users inside,
    /// the requester among them, must get exactly `region`. Returns how many did.
    pub fn check_reciprocity(
        requester: &U,
        k: u32,
        region: &GeoBox,
        inside_users: &[U],
        mut recloak: impl FnMut(&U) -> Option<GeoBox>,
    ) -> Result<usize, String> {
        let mut same = 0usize;
        let mut requester_same = false;
        for user in inside_users {
            if recloak(user).as_ref() == Some(region) {
                same += 1;
                requester_same |= user == requester;
            }
        }
        if !requester_same {
            return Err(format!(
                "the requester re-cloaked with k = {k} does not get its region {region:?} again"
            ));
        }
        if same < k as usize {
            return Err(format!(
                "only {same} of the {} users inside region {region:?} get it again with k = {k}",
                inside_users.len()
            ));
        }
        Ok(same)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn square(lat: f64, lon: f64, half: f64) -> GeoBox {
        GeoBox {
            min_lat: lat - half,
            min_lon: lon - half,
            max_lat: lat + half,
            max_lon: lon + half,
        }
    }

    #[test]
    fn finds_too_few_users_and_boxes_outside_tolerance() {
        let mut c = PresenceChecker::new(1000);
        c.record(1u64, 53.0, 8.0, 0);
        c.record(2, 53.0001, 8.0001, 0);
        c.record(3, 53.0002, 8.0002, 0);
        let region = square(53.0001, 8.0001, 0.0001);
        assert_eq!(
            c.check_region(&1, 53.0, 8.0, 3, 500.0, 500.0, &region, 0)
                .unwrap()
                .inside
                .len(),
            3
        );
        assert!(
            c.check_region(&1, 53.0, 8.0, 4, 500.0, 500.0, &region, 0)
                .is_err()
        );
        assert!(
            c.check_region(&1, 53.0, 8.0, 3, 5.0, 5.0, &region, 0)
                .is_err()
        );
        // User 3 ages out: only two remain present.
        c.record(1, 53.0, 8.0, 1500);
        c.record(2, 53.0001, 8.0001, 1500);
        assert!(
            c.check_region(&1, 53.0, 8.0, 3, 500.0, 500.0, &region, 1500)
                .is_err()
        );
        let elsewhere = square(10.0, 10.0, 0.1);
        assert!(
            c.check_region(&1, 53.0, 8.0, 1, 500.0, 500.0, &elsewhere, 1500)
                .is_err()
        );
    }

    #[test]
    fn catches_a_region_centred_on_the_requester() {
        let region = square(0.0, 0.0, 1.0);
        let users = [1u64, 2, 3];
        // Users 2 and 3 would get other regions: an attacker singles out user 1.
        let outcome = PresenceChecker::check_reciprocity(&1, 2, &region, &users, |u| {
            (*u == 1).then_some(region)
        });
        assert!(outcome.is_err());
        let ok = PresenceChecker::check_reciprocity(&1, 2, &region, &users, |u| {
            (*u != 3).then_some(region)
        });
        assert_eq!(ok, Ok(2));
    }
}
