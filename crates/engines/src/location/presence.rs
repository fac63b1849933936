//! Presence k-anonymity: cloak a request at once into a region that holds the latest known positions of
//! at least k users, and is *reciprocal* (Gruteser & Grunwald 2003; Mokbel et al., Casper, 2006; Kalnis
//! et al., Hilbert Cloak, TKDE 2007).
//!
//! The engine keeps each user's latest position (from position updates, and from its own requests) while
//! it is younger than `max_age_ms`; those positions are the *snapshot*. For an anonymity level k it cuts
//! the users, ordered along the Hilbert curve ([`super::hilbert`]), into consecutive *buckets* of k to
//! 2k − 1 users; a bucket is the anonymity set of each of its users and its minimum bounding rectangle is
//! their cloaking region. Plain Hilbert Cloak cuts fixed buckets of k from the start of the order; here
//! the cut points are chosen by dynamic programming over the order so that the fewest requests are
//! lost: a bucket costs, at tolerances of one, two and four times the target side, the members it
//! could not serve there (all of them when fewer than k members' constraint boxes at that tolerance
//! hold its MBR, since a request is cloaked only if k do), which places boundaries in the gaps between
//! clusters and keeps regions small. Users that fit no small bucket are tried again along Hilbert
//! curves on eleven shifted grids; those still left join a bucket already cut whose region they fit
//! without pushing any member out of the target (so a bucket can exceed 2k − 1 users); the rest are
//! tried at twice and four times the target side, and a last round places the rest. The region
//! is the bucket's MBR padded at random inside its members' padding boxes, with a seed derived from the
//! anonymity set and its positions under a secret key ([`padded_region`]), so it leaks no member's
//! coordinate on its edges and is still the same for every member. A request is `Cloaked` with its
//! bucket's region when that region lies inside its constraint box, and `Expired` at once otherwise (or
//! when fewer than k users are present).
//!
//! Invariants (checked by the independent checker in [`super::presence_checker`]):
//! - a region is the MBR of the latest positions of its anonymity set: at least k distinct present users,
//!   the requester among them; it lies inside the requester's constraint box;
//! - reciprocity by construction: the partition is a deterministic function of (snapshot, k) only (the
//!   positions and user keys present, ordered by Hilbert value then user key; never the requester, the
//!   arrival order or a random draw), so every user of the anonymity set asking with the same k on the
//!   same snapshot gets the same region;
//! - the partition for k is cached and recomputed lazily, when a request with that k finds the snapshot
//!   changed (a user added, moved or forgotten) since it was computed; updates that change nothing
//!   (same position) leave it valid. A recomputation reuses the cut of every segment of the order (runs
//!   of users without a gap wider than twice the round's target) whose content did not change, so its
//!   dynamic programme runs only over the segments that did (the result is the same function of the
//!   snapshot either way);
//! - a request is cloaked only if the constraint boxes of at least k members of its anonymity set, at
//!   the requester's tolerance, hold the region (so that assuming everyone asks with that tolerance
//!   does not narrow the set below k);
//! - the padded region contains the MBR and lies inside every member's padding box; a request whose
//!   tolerance is a step of the padding ladder (`target_side_m * 2^j`) and whose constraint box holds
//!   the MBR also holds the padded region;
//! - at most `max_tracked_users` users are tracked; a new user beyond that is refused, never an older
//!   one evicted; a user silent for longer than `max_age_ms` is forgotten.
//!
//! Pure: time is an argument (taken as non-decreasing; an earlier time is treated as the latest seen),
//! and the padding's key comes from a seeded RNG.

use std::collections::{BTreeMap, HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::UserKey;
use super::geo::{self, GeoBox};
use super::hilbert::{ORDER, grid_cell, xy_to_d};
use super::padding;

mod partition;

use partition::{OrderedSnapshot, OrderedUser, Partition, SHIFTS, partition_snapshot};

/// Entries of `by_age` beyond twice the users before the outdated ones are swept out (the unit
/// tests use a small slack, so that a few users start many sweeps).
#[cfg(not(test))]
const AGE_SLACK: usize = 1024;
#[cfg(test)]
const AGE_SLACK: usize = 16;

/// Entries of `by_age` a sweep looks at per update: more than the one an update may append, so a
/// sweep ends, and few enough that no update stalls the broker (sweeping 20,000 entries at once
/// took 0.1-0.7 ms of one update, 1-1.6 ms in the daemon: docs/performance.md).
const SWEEP_STEP: usize = 4;

/// An in-place sweep of `by_age` in progress, dropping the entries that no longer match their
/// user's `last_ms`: `by_age[..write]` holds the current entries of `by_age[..read]` in their order,
/// `by_age[write..read]` is left over (each entry there outdated, or equal to one kept elsewhere),
/// and `by_age[read..]` is not looked at yet. Every part is oldest first, and an entry before `read`
/// is never newer than one after it.
#[derive(Debug, Clone, Copy)]
struct Sweep {
    read: usize,
    write: usize,
}

/// Limits of the presence engine.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PresenceParams {
    /// A position older than this is forgotten (and its user leaves the snapshot).
    pub max_age_ms: u64,
    /// Most users tracked at once.
    pub max_tracked_users: usize,
    /// The region side (metres) the partition aims for: buckets wider than it, twice it and four times
    /// it cost more (typically the spatial tolerance most requests use).
    pub target_side_m: f64,
}

/// One request under the presence model (already validated by the caller; checked again here).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PresenceRequest {
    pub user: UserKey,
    /// WGS84 degrees; also recorded as the user's latest position.
    pub lat: f64,
    pub lon: f64,
    pub k: u32,
    /// Spatial tolerance in metres (half-widths of the constraint box).
    pub dx_m: f64,
    pub dy_m: f64,
}

impl PresenceRequest {
    pub fn constraint_box(&self) -> GeoBox {
        geo::constraint_box(self.lat, self.lon, self.dx_m, self.dy_m)
    }
}

/// A request cloaked under the presence model.
#[derive(Debug, Clone, PartialEq)]
pub struct PresenceRegion {
    /// The MBR of the anonymity set's latest positions.
    pub cloaking_box: GeoBox,
    /// The users whose region this is (the requester among them), in Hilbert order.
    pub anonymity_set: Vec<UserKey>,
}

/// Why a presence request could not be cloaked (it is never forwarded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiryReason {
    /// Fewer than k users are present at all.
    TooFewUsers { present: usize },
    /// The requester's anonymity set for this k spreads beyond its constraint box.
    OutsideTolerance,
    /// The partition for this k leaves the requester out of every anonymity set (its position is too
    /// far from the others along the Hilbert order to share a small region with k - 1 of them).
    Isolated,
    /// The region fits the requester's constraint box, but the same tolerance around fewer than k
    /// members of its anonymity set holds it: an attacker who assumes every user asks with this
    /// tolerance could narrow the set below k.
    FewFitTolerance,
}

/// What became of a presence request.
#[derive(Debug, Clone, PartialEq)]
pub enum PresenceOutcome {
    Cloaked(PresenceRegion),
    Expired(ExpiryReason),
}

/// Why the engine refused an update or request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PresenceError {
    #[error("{field}: {rule}")]
    Invalid { field: &'static str, rule: String },
    #[error("the broker already tracks {max} users (location.max_tracked_users)")]
    TooManyUsers { max: usize },
}

/// A position with what the partition needs of it, computed once per update.
#[derive(Debug, Clone, Copy)]
struct Placed {
    lat: f64,
    lon: f64,
    /// The position along the Hilbert curve of each grid shift of [`SHIFTS`] (the first is unshifted).
    shifted: [u64; SHIFTS.len()],
    cos_lat: f64,
}

impl Placed {
    fn new(lat: f64, lon: f64) -> (u64, Placed) {
        let (x, y) = grid_cell(lat, lon);
        let placed = Placed {
            lat,
            lon,
            shifted: SHIFTS.map(|(sx, sy)| xy_to_d(ORDER, x.wrapping_add(sx), y.wrapping_add(sy))),
            cos_lat: lat.to_radians().cos().max(0.0),
        };
        (placed.shifted[0], placed)
    }
}

#[derive(Debug, Clone, Copy)]
struct Tracked {
    lat: f64,
    lon: f64,
    /// The Hilbert value of the user's entry in `PresenceEngine::order`, if it has one.
    placed_at: Option<u64>,
    /// The position moved since the entry in `order` was made (the user is in `unplaced`).
    unplaced: bool,
    last_ms: i64,
}

/// The presence engine: latest positions with age-out, and the reciprocal partitions per k.
#[derive(Debug, Clone)]
pub struct PresenceEngine {
    params: PresenceParams,
    /// foldhash: a user key is a keyed hash (or an index), never a value a client chooses.
    users: HashMap<UserKey, Tracked, foldhash::fast::RandomState>,
    /// The snapshot ordered by (Hilbert value, user key), as of the last [`Self::place`]: users
    /// whose position changed since are listed in `unplaced`. Updates only record positions, so
    /// clique requests (every one of which updates its user) do not pay for the order.
    order: BTreeMap<(u64, UserKey), Placed>,
    /// Users whose entry in `order` is missing or stale (each once while `Tracked::unplaced`; a
    /// user forgotten since is skipped).
    unplaced: Vec<UserKey>,
    /// (time of a position, user), oldest first, one entry per update that moved a user's time;
    /// an entry is current while it matches its user's `last_ms` (the others are skipped when they
    /// come up). Once they outnumber the users (twice the users plus [`AGE_SLACK`] entries), a
    /// [`Sweep`] drops them, [`SWEEP_STEP`] entries per update, so it holds at most about 4/3 of
    /// that while the users stay as many. Appending keeps an update O(1) where a sorted set moved it.
    by_age: VecDeque<(i64, UserKey)>,
    sweep: Option<Sweep>,
    now_ms: i64,
    /// Bumped whenever the snapshot's positions change.
    generation: u64,
    ordered: OrderedSnapshot,
    partitions: HashMap<u32, Partition>,
    /// Secret key of the padding seeds (drawn from the seeded RNG at construction).
    pad_key: [u8; 32],
}

impl PresenceEngine {
    pub fn new(params: PresenceParams, seed: u64) -> PresenceEngine {
        let pad_key = ChaCha8Rng::seed_from_u64(seed).random();
        PresenceEngine {
            params,
            users: HashMap::default(),
            order: BTreeMap::new(),
            unplaced: Vec::new(),
            by_age: VecDeque::new(),
            sweep: None,
            now_ms: i64::MIN,
            generation: 0,
            ordered: OrderedSnapshot::default(),
            partitions: HashMap::new(),
            pad_key,
        }
    }

    pub fn params(&self) -> PresenceParams {
        self.params
    }

    /// Users in the snapshot as of the last call (call [`Self::forget_stale`] to age it to a time).
    pub fn tracked_len(&self) -> usize {
        self.users.len()
    }

    /// The latest position of a user, if it is in the snapshot.
    pub fn latest_position(&self, user: UserKey) -> Option<(f64, f64)> {
        self.users.get(&user).map(|t| (t.lat, t.lon))
    }

    /// Records `user`'s latest position at `now_ms`.
    pub fn update(
        &mut self,
        user: UserKey,
        lat: f64,
        lon: f64,
        now_ms: i64,
    ) -> Result<(), PresenceError> {
        check_position(lat, lon)?;
        self.forget_stale(now_ms);
        let now_ms = self.now_ms;
        match self.users.get_mut(&user) {
            Some(tracked) => {
                if tracked.last_ms != now_ms {
                    tracked.last_ms = now_ms;
                    self.by_age.push_back((now_ms, user));
                }
                if tracked.lat != lat || tracked.lon != lon {
                    tracked.lat = lat;
                    tracked.lon = lon;
                    if !std::mem::replace(&mut tracked.unplaced, true) {
                        self.unplaced.push(user);
                    }
                    self.generation += 1;
                }
            }
            None => {
                if self.users.len() >= self.params.max_tracked_users {
                    return Err(PresenceError::TooManyUsers {
                        max: self.params.max_tracked_users,
                    });
                }
                self.users.insert(
                    user,
                    Tracked {
                        lat,
                        lon,
                        placed_at: None,
                        unplaced: true,
                        last_ms: now_ms,
                    },
                );
                self.unplaced.push(user);
                self.by_age.push_back((now_ms, user));
                self.generation += 1;
            }
        }
        // Users forgotten while unplaced leave their entries behind; placing drops them.
        if self.unplaced.len() > 2 * self.users.len() + AGE_SLACK {
            self.place();
        }
        if self.sweep.is_none() && self.by_age.len() > 2 * self.users.len() + AGE_SLACK {
            self.sweep = Some(Sweep { read: 0, write: 0 });
        }
        self.sweep_step();
        Ok(())
    }

    /// Moves the sweep of `by_age` on by up to [`SWEEP_STEP`] entries, and ends it (dropping the
    /// left-over part) once it has looked at every entry.
    fn sweep_step(&mut self) {
        let Some(Sweep {
            mut read,
            mut write,
        }) = self.sweep
        else {
            return;
        };
        let end = (read + SWEEP_STEP).min(self.by_age.len());
        while read < end {
            let (ms, user) = self.by_age[read];
            if self.users.get(&user).is_some_and(|t| t.last_ms == ms) {
                self.by_age[write] = (ms, user);
                write += 1;
            }
            read += 1;
        }
        if read == self.by_age.len() {
            self.by_age.truncate(write);
            self.sweep = None;
        } else {
            self.sweep = Some(Sweep { read, write });
        }
    }

    /// Forgets every position older than `max_age_ms` at `now_ms` (time never goes back: an earlier
    /// `now_ms` than already seen counts as the latest seen).
    pub fn forget_stale(&mut self, now_ms: i64) {
        self.now_ms = self.now_ms.max(now_ms);
        let oldest_kept = self
            .now_ms
            .saturating_sub(i64::try_from(self.params.max_age_ms).unwrap_or(i64::MAX));
        while let Some(&(last_ms, user)) = self.by_age.front() {
            if last_ms >= oldest_kept {
                break;
            }
            self.by_age.pop_front();
            // The sweep's parts move down by one: the entry came off the kept part, else off the
            // left-over part, else off the part not looked at yet.
            if let Some(sweep) = &mut self.sweep {
                if sweep.write > 0 {
                    sweep.write -= 1;
                }
                sweep.read = sweep.read.saturating_sub(1);
            }
            if self.users.get(&user).is_some_and(|t| t.last_ms == last_ms)
                && let Some(tracked) = self.users.remove(&user)
            {
                if let Some(hilbert) = tracked.placed_at {
                    self.order.remove(&(hilbert, user));
                }
                self.generation += 1;
            }
        }
    }

    /// Forgets a user at once (for example when its principal is revoked).
    pub fn forget(&mut self, user: UserKey) {
        if let Some(tracked) = self.users.remove(&user) {
            // Its entries in `by_age` and `unplaced` no longer match a user and are skipped.
            if let Some(hilbert) = tracked.placed_at {
                self.order.remove(&(hilbert, user));
            }
            self.generation += 1;
        }
    }

    /// Brings `order` up to the users' latest positions.
    fn place(&mut self) {
        for user in self.unplaced.drain(..) {
            let Some(tracked) = self.users.get_mut(&user) else {
                continue;
            };
            if !std::mem::replace(&mut tracked.unplaced, false) {
                continue;
            }
            let (hilbert, placed) = Placed::new(tracked.lat, tracked.lon);
            if let Some(old) = tracked.placed_at.replace(hilbert) {
                self.order.remove(&(old, user));
            }
            self.order.insert((hilbert, user), placed);
        }
    }

    /// Cloaks a request at `now_ms`: records its position as the user's latest, then answers with the
    /// region of the user's bucket for `k` when it fits the constraint box.
    pub fn cloak(
        &mut self,
        req: &PresenceRequest,
        now_ms: i64,
    ) -> Result<PresenceOutcome, PresenceError> {
        if req.k == 0 {
            return Err(invalid("k", "must be at least 1"));
        }
        for (field, v) in [("dx_m", req.dx_m), ("dy_m", req.dy_m)] {
            if !v.is_finite() || v <= 0.0 {
                return Err(invalid(
                    field,
                    format!("must be a positive tolerance (got {v})"),
                ));
            }
        }
        self.update(req.user, req.lat, req.lon, now_ms)?;
        let present = self.users.len();
        let k = req.k;
        if present < k as usize {
            return Ok(PresenceOutcome::Expired(ExpiryReason::TooFewUsers {
                present,
            }));
        }
        self.refresh_partition(k);
        let hilbert = self
            .users
            .get(&req.user)
            .and_then(|t| t.placed_at)
            .unwrap_or_default();
        let bucket = self
            .ordered
            .index_of(hilbert, req.user)
            .and_then(|index| self.partitions.get(&k)?.bucket_of.get(index).copied());
        let Some((start, end, mbr)) = bucket.and_then(|b| {
            let partition = self.partitions.get(&k)?;
            partition.buckets.get(b as usize).copied()
        }) else {
            return Ok(PresenceOutcome::Expired(ExpiryReason::Isolated));
        };
        let Some(partition) = self.partitions.get(&k) else {
            return Ok(PresenceOutcome::Expired(ExpiryReason::Isolated));
        };
        let members = &partition.members[start..end];
        let cloaking_box = padded_region(
            &self.ordered.users,
            members,
            &mbr,
            self.params.target_side_m,
            &self.pad_key,
        );
        if !req.constraint_box().contains_box(&cloaking_box) {
            return Ok(PresenceOutcome::Expired(ExpiryReason::OutsideTolerance));
        }
        let fitting = members
            .iter()
            .filter(|&&i| {
                let u = &self.ordered.users[i as usize];
                geo::constraint_box(u.lat, u.lon, req.dx_m, req.dy_m).contains_box(&cloaking_box)
            })
            .count();
        if fitting < k as usize {
            return Ok(PresenceOutcome::Expired(ExpiryReason::FewFitTolerance));
        }
        let anonymity_set = members
            .iter()
            .map(|&i| self.ordered.users[i as usize].user)
            .collect();
        Ok(PresenceOutcome::Cloaked(PresenceRegion {
            cloaking_box,
            anonymity_set,
        }))
    }

    /// Places the users whose positions changed, then brings the ordered snapshot and the partition
    /// for `k` up to the current snapshot.
    fn refresh_partition(&mut self, k: u32) {
        self.place();
        let generation = self.generation;
        if self.ordered.generation != generation || self.ordered.users.len() != self.order.len() {
            self.ordered.generation = generation;
            self.ordered.users.clear();
            self.ordered
                .users
                .extend(self.order.iter().map(|(&(hilbert, user), p)| OrderedUser {
                    hilbert,
                    user,
                    lat: p.lat,
                    lon: p.lon,
                    shifted: p.shifted,
                    cos_lat: p.cos_lat,
                }));
        }
        let partition = self.partitions.entry(k).or_default();
        if partition.generation != generation
            || partition.bucket_of.len() != self.ordered.users.len()
        {
            partition.generation = generation;
            partition_snapshot(
                &self.ordered.users,
                k as usize,
                self.params.target_side_m,
                partition,
            );
        }
    }
}

/// Finest step of the padding ladder below the target side: `target / 2^PAD_LADDER_BELOW`.
const PAD_LADDER_BELOW: i32 = 3;

/// The cloaking region of a bucket: its MBR padded ([`padding::pad_seeded`]) inside the intersection
/// of its members' *padding boxes*, with a seed that is a keyed hash of the members and their
/// positions. Both depend on the anonymity set and the snapshot only (never on the requester), so every
/// member gets the same region, and the key keeps the padding unpredictable to anyone outside the
/// broker.
///
/// A member's padding box is its constraint box of half-width `L`, the least step of the ladder
/// `target_side_m * 2^j` (j >= -[`PAD_LADDER_BELOW`]) whose box holds the MBR. A requester whose
/// tolerance is itself a step of the ladder (the target, twice it, ...) and holds the MBR therefore
/// holds the padded region too: padding never turns such a request away. Other tolerances can lose a
/// request to padding (its padded region is then outside the constraint box, and it expires).
fn padded_region(
    users: &[OrderedUser],
    members: &[u32],
    mbr: &GeoBox,
    target_side_m: f64,
    key: &[u8; 32],
) -> GeoBox {
    use rand::RngCore;
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut limit: Option<GeoBox> = None;
    for &i in members {
        let u = &users[i as usize];
        (u.user, u.lat.to_bits(), u.lon.to_bits()).hash(&mut hasher);
        let mut half_width = target_side_m / f64::from(1u32 << PAD_LADDER_BELOW);
        let mut own = geo::constraint_box(u.lat, u.lon, half_width, half_width);
        // A member's need is at most half the globe: the ladder ends long before 64 steps.
        for _ in 0..64 {
            if own.contains_box(mbr) {
                break;
            }
            half_width *= 2.0;
            own = geo::constraint_box(u.lat, u.lon, half_width, half_width);
        }
        limit = padding::intersection([&limit.unwrap_or(own), &own]);
    }
    let Some(limit) = limit else {
        return *mbr;
    };
    let mut seeds = rand_chacha::ChaCha20Rng::from_seed(*key);
    seeds.set_stream(hasher.finish());
    padding::pad_seeded(mbr, &limit, members.len(), seeds.next_u64())
}

fn invalid(field: &'static str, rule: impl Into<String>) -> PresenceError {
    PresenceError::Invalid {
        field,
        rule: rule.into(),
    }
}

fn check_position(lat: f64, lon: f64) -> Result<(), PresenceError> {
    if !lat.is_finite() || !(-90.0..=90.0).contains(&lat) {
        return Err(invalid(
            "lat",
            format!("must be a finite latitude in [-90, 90] degrees (got {lat})"),
        ));
    }
    if !lon.is_finite() || !(-180.0..=180.0).contains(&lon) {
        return Err(invalid(
            "lon",
            format!("must be a finite longitude in [-180, 180] degrees (got {lon})"),
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::location::presence_checker::PresenceChecker;
    use crate::location::replay::{PeriodicEvent, PeriodicParams, periodic_workload};
    use proptest::prelude::*;
    use rand::Rng;

    const EVERYWHERE_M: f64 = 2.1e7;

    fn params(max_age_ms: u64, max_tracked_users: usize) -> PresenceParams {
        PresenceParams {
            max_age_ms,
            max_tracked_users,
            target_side_m: 500.0,
        }
    }

    fn request(user: UserKey, lat: f64, lon: f64, k: u32, tolerance_m: f64) -> PresenceRequest {
        PresenceRequest {
            user,
            lat,
            lon,
            k,
            dx_m: tolerance_m,
            dy_m: tolerance_m,
        }
    }

    /// Re-cloaks `user` at its latest position with the same k on a copy of the engine (the same
    /// snapshot: its position does not change), with a tolerance that admits any region.
    fn recloak(engine: &mut PresenceEngine, user: UserKey, k: u32, now_ms: i64) -> Option<GeoBox> {
        let (lat, lon) = engine.latest_position(user)?;
        match engine.cloak(&request(user, lat, lon, k, EVERYWHERE_M), now_ms) {
            Ok(PresenceOutcome::Cloaked(region)) => Some(region.cloaking_box),
            _ => None,
        }
    }

    /// Checks one answered request against the checker's model; returns whether it was cloaked.
    fn check_outcome(
        engine: &PresenceEngine,
        checker: &PresenceChecker<UserKey>,
        req: &PresenceRequest,
        outcome: &PresenceOutcome,
        now_ms: i64,
    ) -> Result<bool, String> {
        let present = checker.present(now_ms).len();
        match outcome {
            PresenceOutcome::Cloaked(region) => {
                let found = checker.check_region(
                    &req.user,
                    req.lat,
                    req.lon,
                    req.k,
                    req.dx_m,
                    req.dy_m,
                    &region.cloaking_box,
                    now_ms,
                )?;
                if region.anonymity_set.len() < req.k as usize
                    || !region.anonymity_set.contains(&req.user)
                    || region
                        .anonymity_set
                        .iter()
                        .any(|u| !found.inside.contains(u))
                {
                    return Err(format!("anonymity set {:?} is wrong", region.anonymity_set));
                }
                let fitting = region
                    .anonymity_set
                    .iter()
                    .filter_map(|u| checker.position(u, now_ms))
                    .filter(|&(lat, lon)| {
                        geo::constraint_box(lat, lon, req.dx_m, req.dy_m)
                            .contains_box(&region.cloaking_box)
                    })
                    .count();
                if fitting < req.k as usize {
                    return Err(format!(
                        "only {fitting} members hold the region in tolerance"
                    ));
                }
                let mut copy = engine.clone();
                PresenceChecker::check_reciprocity(
                    &req.user,
                    req.k,
                    &region.cloaking_box,
                    &found.inside,
                    |u| recloak(&mut copy, *u, req.k, now_ms),
                )?;
                Ok(true)
            }
            PresenceOutcome::Expired(ExpiryReason::TooFewUsers { present: p }) => {
                if *p != present || present >= req.k as usize {
                    return Err(format!(
                        "TooFewUsers({p}) with {present} present and k = {}",
                        req.k
                    ));
                }
                Ok(false)
            }
            PresenceOutcome::Expired(ExpiryReason::Isolated) => {
                let mut copy = engine.clone();
                match recloak(&mut copy, req.user, req.k, now_ms) {
                    None => Ok(false),
                    Some(region) => Err(format!("Isolated but re-cloaking gives {region:?}")),
                }
            }
            PresenceOutcome::Expired(ExpiryReason::FewFitTolerance) => {
                // The region fits the requester, but fewer than k of the users who get it again hold
                // it within the same tolerance.
                let mut copy = engine.clone();
                let region = recloak(&mut copy, req.user, req.k, now_ms)
                    .ok_or("FewFitTolerance but no region at any tolerance")?;
                if !req.constraint_box().contains_box(&region) {
                    return Err(format!("FewFitTolerance but {region:?} does not fit"));
                }
                let fitting = checker
                    .present(now_ms)
                    .into_iter()
                    .filter(|(u, lat, lon)| {
                        region.contains_point(*lat, *lon)
                            && geo::constraint_box(*lat, *lon, req.dx_m, req.dy_m)
                                .contains_box(&region)
                            && recloak(&mut copy, *u, req.k, now_ms) == Some(region)
                    })
                    .count();
                if fitting >= req.k as usize {
                    return Err(format!("FewFitTolerance but {fitting} members fit"));
                }
                Ok(false)
            }
            PresenceOutcome::Expired(ExpiryReason::OutsideTolerance) => {
                let mut copy = engine.clone();
                let region = recloak(&mut copy, req.user, req.k, now_ms)
                    .ok_or("OutsideTolerance but no region at any tolerance")?;
                if req.constraint_box().contains_box(&region) {
                    return Err(format!("OutsideTolerance but {region:?} fits"));
                }
                Ok(false)
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Update {
            user: u64,
            lat: f64,
            lon: f64,
        },
        Cloak {
            user: u64,
            lat: f64,
            lon: f64,
            k: u32,
            tolerance_m: f64,
        },
    }

    fn op() -> impl Strategy<Value = (u64, Op)> {
        let position = (53.0..53.02f64, 8.0..8.03f64);
        let update = (0u64..14, position.clone()).prop_map(|(user, (lat, lon))| Op::Update {
            user,
            lat,
            lon,
        });
        let cloak = (0u64..14, position, 1u32..6, 50.0..3000.0f64).prop_map(
            |(user, (lat, lon), k, tolerance_m)| Op::Cloak {
                user,
                lat,
                lon,
                k,
                tolerance_m,
            },
        );
        (0u64..2500, prop_oneof![update, cloak])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn every_region_is_k_anonymous_in_tolerance_and_reciprocal(
            ops in prop::collection::vec(op(), 1..120),
        ) {
            let mut engine = PresenceEngine::new(params(5000, 10), 3);
            let mut checker = PresenceChecker::new(5000);
            let mut now = 1_000_000i64;
            for (advance, op) in ops {
                now += advance as i64;
                let (user, lat, lon) = match &op {
                    Op::Update { user, lat, lon } | Op::Cloak { user, lat, lon, .. } => {
                        (*user, *lat, *lon)
                    }
                };
                let was_present = checker.position(&user, now).is_some();
                let present = checker.present(now).len();
                let result = match &op {
                    Op::Update { .. } => engine.update(user, lat, lon, now).map(|()| None),
                    Op::Cloak { k, tolerance_m, .. } => {
                        let req = request(user, lat, lon, *k, *tolerance_m);
                        engine.cloak(&req, now).map(|o| Some((req, o)))
                    }
                };
                match result {
                    Err(PresenceError::TooManyUsers { max }) => {
                        prop_assert!(!was_present && present >= max, "refused with {present} present");
                    }
                    Err(e) => prop_assert!(false, "{e}"),
                    Ok(answer) => {
                        checker.record(user, lat, lon, now);
                        if let Some((req, outcome)) = answer {
                            let checked = check_outcome(&engine, &checker, &req, &outcome, now);
                            prop_assert!(checked.is_ok(), "{:?}", checked);
                        }
                    }
                }
                prop_assert_eq!(engine.tracked_len(), checker.present(now).len());
            }
        }

        #[test]
        fn the_partition_depends_on_the_snapshot_and_k_only(
            positions in prop::collection::vec((53.0..53.05f64, 8.0..8.05f64), 1..60),
            k in 1u32..8,
            seed in any::<u64>(),
        ) {
            // The same seed, so the same padding key: the region depends on the broker's key too.
            let mut forward = PresenceEngine::new(params(60_000, 1000), 1);
            let mut shuffled = PresenceEngine::new(params(60_000, 1000), 1);
            for (user, &(lat, lon)) in positions.iter().enumerate() {
                forward.update(user as u64, lat, lon, 0).unwrap();
            }
            // The same snapshot reached in another order, through detours.
            let mut order: Vec<usize> = (0..positions.len()).collect();
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            for i in (1..order.len()).rev() {
                order.swap(i, rng.random_range(0..=i));
            }
            for &user in &order {
                shuffled.update(user as u64, 0.0, 0.0, 0).unwrap();
                let _ = shuffled.cloak(&request(user as u64, 0.0, 0.0, k, EVERYWHERE_M), 0);
            }
            for &user in &order {
                let (lat, lon) = positions[user];
                shuffled.update(user as u64, lat, lon, 0).unwrap();
            }
            for user in 0..positions.len() as u64 {
                prop_assert_eq!(recloak(&mut forward, user, k, 0), recloak(&mut shuffled, user, k, 0));
            }
        }
    }

    #[test]
    fn buckets_hold_at_least_k_users_each_user_in_one() {
        let mut engine = PresenceEngine::new(params(60_000, 1000), 1);
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for user in 0..200u64 {
            let lat = 53.0 + rng.random_range(0.0..0.1);
            let lon = 8.0 + rng.random_range(0.0..0.1);
            engine.update(user, lat, lon, 0).unwrap();
        }
        for k in 1..=12u32 {
            engine.refresh_partition(k);
            let partition = &engine.partitions[&k];
            let mut covered = 0;
            let mut seen = [false; 200];
            for &(start, end, mbr) in &partition.buckets {
                assert_eq!(start, covered);
                let len = end - start;
                // k to 2k - 1 as cut, more where users left out joined a bucket.
                assert!(len >= k as usize, "k {k} len {len}");
                for &m in &partition.members[start..end] {
                    assert!(!seen[m as usize], "user in two buckets");
                    seen[m as usize] = true;
                    assert_eq!(
                        partition.bucket_of[m as usize] as usize,
                        partition.buckets.iter().position(|b| b.0 == start).unwrap()
                    );
                    let u = engine.ordered.users[m as usize];
                    assert!(mbr.contains_point(u.lat, u.lon));
                }
                covered = end;
            }
            // Fewer than k users can be left out of every bucket (after the last round).
            assert!(200 - covered < k as usize, "k {k}: {covered} placed");
        }
    }

    #[test]
    fn positions_age_out_and_the_table_is_bounded() {
        let mut engine = PresenceEngine::new(params(1000, 2), 1);
        engine.update(1, 53.0, 8.0, 0).unwrap();
        engine.update(2, 53.0, 8.0, 500).unwrap();
        assert_eq!(
            engine.update(3, 53.0, 8.0, 900),
            Err(PresenceError::TooManyUsers { max: 2 })
        );
        // At 1001 user 1 is 1001 ms old: forgotten, which makes room.
        engine.update(3, 53.0, 8.0, 1001).unwrap();
        assert_eq!(engine.latest_position(1), None);
        assert_eq!(engine.tracked_len(), 2);
        // Time going back counts as the latest time seen.
        engine.update(2, 53.1, 8.0, 10).unwrap();
        engine.forget_stale(2001);
        assert_eq!(engine.tracked_len(), 2);
        engine.forget_stale(2002);
        assert_eq!(engine.tracked_len(), 0);
        assert!(matches!(
            engine.update(4, f64::NAN, 8.0, 2001),
            Err(PresenceError::Invalid { field: "lat", .. })
        ));
        assert!(matches!(
            engine.cloak(&request(4, 53.0, 8.0, 0, 10.0), 2001),
            Err(PresenceError::Invalid { field: "k", .. })
        ));
    }

    #[test]
    fn positions_are_placed_when_a_request_needs_them_and_the_backlog_stays_bounded() {
        // Clique requests only record positions: 40 users move and come and go for a long time
        // without a PRESENCE request, then the order must be what an engine fed only the final
        // positions computes.
        let mut lazy = PresenceEngine::new(params(1_000_000, 100), 1);
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut latest: HashMap<u64, (f64, f64)> = HashMap::new();
        for t in 0..30_000i64 {
            let user = rng.random_range(0..40u64);
            if rng.random_bool(0.1) {
                lazy.forget(user);
                latest.remove(&user);
            } else {
                let position = (
                    53.0 + rng.random_range(0.0..0.05),
                    8.0 + rng.random_range(0.0..0.05),
                );
                lazy.update(user, position.0, position.1, t).unwrap();
                latest.insert(user, position);
            }
            assert!(lazy.unplaced.len() <= 2 * 40 + AGE_SLACK + 1);
        }
        let mut eager = PresenceEngine::new(params(1_000_000, 100), 1);
        let mut users: Vec<u64> = latest.keys().copied().collect();
        users.sort_unstable();
        for &user in &users {
            let (lat, lon) = latest[&user];
            eager.update(user, lat, lon, 30_000).unwrap();
        }
        lazy.forget_stale(30_000);
        for &user in &users {
            assert_eq!(
                recloak(&mut lazy, user, 3, 30_000),
                recloak(&mut eager, user, 3, 30_000)
            );
        }
        assert_eq!(lazy.order.len(), users.len());
        assert!(lazy.unplaced.is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The age queue, swept a few entries per update, forgets exactly the users a plain map of
        /// each user's latest time says are stale, whatever the updates, forgets and agings in
        /// between (long runs of few users, so several sweeps start and end, some cut short by
        /// agings popping entries off the front).
        #[test]
        fn sweeping_the_age_queue_forgets_exactly_the_stale_users(
            ops in prop::collection::vec((0u8..10, 0u64..8, 0i64..4), 500..3000),
        ) {
            // About 45 entries within an age: past the 32 that start a sweep with 8 users, and
            // entries age out at the front while a sweep runs.
            let max_age_ms = 100;
            let mut engine = PresenceEngine::new(params(max_age_ms, 1_000), 3);
            let mut latest: HashMap<UserKey, i64> = HashMap::new();
            let mut now = 0i64;
            let mut sweeps = 0;
            for (kind, user, step) in ops {
                let sweeping = engine.sweep.is_some();
                now += step;
                match kind {
                    0 => {
                        engine.forget(user);
                        latest.remove(&user);
                    }
                    1 => engine.forget_stale(now),
                    _ => {
                        engine.update(user, 53.0, 8.0, now).unwrap();
                        latest.insert(user, now);
                    }
                }
                latest.retain(|_, &mut t| t >= now - max_age_ms as i64);
                engine.forget_stale(now);
                prop_assert_eq!(engine.tracked_len(), latest.len());
                for user in latest.keys() {
                    prop_assert!(engine.latest_position(*user).is_some());
                }
                // Every tracked user's current entry is queued outside a running sweep's
                // left-over part, and that much of the queue is oldest first: a sweep that lost
                // an entry would keep its user past its age. (An entry may be there twice: a user
                // forgotten and back in the same millisecond.)
                let (write, read) = engine.sweep.map_or((0, 0), |sw| (sw.write, sw.read));
                let outside: Vec<(i64, UserKey)> = engine
                    .by_age
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| i < write || i >= read)
                    .map(|(_, &e)| e)
                    .collect();
                prop_assert!(outside.windows(2).all(|w| w[0].0 <= w[1].0));
                for (user, tracked) in &engine.users {
                    let current = (tracked.last_ms, *user);
                    prop_assert!(outside.contains(&current));
                }
                prop_assert!(engine.by_age.len() <= 4 * (2 * 8 + AGE_SLACK + 1) / 3 + 1);
                if !sweeping && engine.sweep.is_some() {
                    sweeps += 1;
                }
            }
            prop_assert!(sweeps >= 2, "only {} sweeps started", sweeps);
        }
    }

    #[test]
    fn the_age_queue_stays_bounded_and_ages_out_the_latest_time() {
        let mut engine = PresenceEngine::new(params(1_000_000, 100), 1);
        // Three users updating every millisecond for a long time.
        for t in 0..20_000i64 {
            engine.update((t % 3) as u64, 53.0, 8.0, t).unwrap();
            // A sweep starts past twice the users plus the slack and, taking SWEEP_STEP entries
            // per update while an update appends one, ends within a third more.
            assert!(engine.by_age.len() <= 4 * (2 * engine.users.len() + AGE_SLACK + 1) / 3 + 1);
        }
        engine.forget(1);
        assert_eq!(engine.tracked_len(), 2);
        // Only each user's latest time counts: user 0 was last seen at 19,998, user 2 at 19,997.
        engine.forget_stale(1_019_997);
        assert_eq!(engine.tracked_len(), 2);
        engine.forget_stale(1_019_998);
        assert_eq!(engine.latest_position(2), None);
        assert_eq!(engine.tracked_len(), 1);
        engine.forget_stale(1_019_999);
        assert_eq!(engine.tracked_len(), 0);
    }

    #[test]
    fn a_far_bucket_expires_and_too_few_users_expire() {
        let mut engine = PresenceEngine::new(params(60_000, 100), 1);
        assert_eq!(
            engine.cloak(&request(1, 53.0, 8.0, 2, 500.0), 0),
            Ok(PresenceOutcome::Expired(ExpiryReason::TooFewUsers {
                present: 1
            }))
        );
        engine.update(2, 53.1, 8.1, 0).unwrap();
        assert_eq!(
            engine.cloak(&request(1, 53.0, 8.0, 2, 500.0), 0),
            Ok(PresenceOutcome::Expired(ExpiryReason::OutsideTolerance))
        );
        let Ok(PresenceOutcome::Cloaked(region)) =
            engine.cloak(&request(1, 53.0, 8.0, 2, 20_000.0), 0)
        else {
            panic!("expected a region")
        };
        assert_eq!(region.anonymity_set.len(), 2);
        assert!(region.cloaking_box.contains_point(53.1, 8.1));
    }

    /// The data directory `shared/data/mobility` beside one of the repository's ancestors, if any.
    pub(crate) fn mobility_file(name: &str) -> Option<std::path::PathBuf> {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .map(|dir| dir.join("shared/data/mobility").join(name))
            .find(|path| path.exists())
    }

    /// The sparse workload of the issue on the real (synthetic road-network) Oldenburg trace: every
    /// region checked, reciprocity included; success at 500 m as the issue demands.
    #[test]
    fn oldenburg_small_regions_are_checked_and_mostly_succeed() {
        let (path, sparse) = match mobility_file("oldenburg_small.csv.gz") {
            Some(path) => (path, true),
            None => (
                crate::test_files::repo("tests/data/oldenburg_60s.csv.gz"),
                false,
            ),
        };
        let points = crate::test_files::read_trace_file(&path, Some(400_000));
        let workload = periodic_workload(
            &points,
            &PeriodicParams {
                update_period_s: 5,
                request_period_s: 30,
                k_min: 2,
                k_max: 10,
                seed: 1,
            },
        );
        let max_age_ms = 10_000;
        let mut engine = PresenceEngine::new(params(max_age_ms, 100_000), 1);
        let mut checker = PresenceChecker::new(max_age_ms);
        let (mut cloaked, mut requests) = (0usize, 0usize);
        for (i, event) in workload.events.iter().enumerate() {
            match *event {
                PeriodicEvent::Update {
                    user,
                    at_ms,
                    lat,
                    lon,
                } => {
                    engine.update(user as u64, lat, lon, at_ms).unwrap();
                    checker.record(user as u64, lat, lon, at_ms);
                }
                PeriodicEvent::Request {
                    user,
                    at_ms,
                    lat,
                    lon,
                    k,
                } => {
                    let req = request(user as u64, lat, lon, k, 500.0);
                    let outcome = engine.cloak(&req, at_ms).unwrap();
                    checker.record(user as u64, lat, lon, at_ms);
                    requests += 1;
                    // Reciprocity re-cloaks on a copy of the engine: check every 7th request in full.
                    let result = if i % 7 == 0 {
                        check_outcome(&engine, &checker, &req, &outcome, at_ms)
                    } else if let PresenceOutcome::Cloaked(region) = &outcome {
                        checker
                            .check_region(
                                &req.user,
                                lat,
                                lon,
                                k,
                                500.0,
                                500.0,
                                &region.cloaking_box,
                                at_ms,
                            )
                            .map(|_| true)
                    } else {
                        Ok(false)
                    };
                    cloaked += usize::from(result.unwrap());
                }
            }
        }
        let success = cloaked as f64 / requests as f64;
        eprintln!(
            "{}: {requests} requests, success {success:.3}",
            path.display()
        );
        assert!(requests > 1000);
        if sparse {
            // The target at 500 m (measured 0.755: padded regions, at least k members holding
            // the region in the same tolerance; deterministic, the workload and engine are seeded).
            assert!(success >= 0.75, "success {success}");
        }
    }
}
