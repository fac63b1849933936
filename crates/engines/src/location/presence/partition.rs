//! The reciprocal partition of the presence snapshot for one k ([`super`]): the users in Hilbert
//! order cut into buckets of k..=2k-1 by dynamic programming over rounds of shifted Hilbert curves
//! and growing targets, with the cuts of unchanged segments reused between computations.
//!
//! Invariants: the partition is a deterministic function of (snapshot, k, target side) only (never
//! the requester, the arrival order or a random draw), which is what makes regions reciprocal; a
//! user is in at most one bucket; a recomputation that reuses cached segment cuts gives the same
//! partition as one from scratch.
use std::collections::HashMap;

use super::super::UserKey;
use super::super::geo::{GeoBox, METRES_PER_DEGREE_LAT};

/// One user of the snapshot in Hilbert order.
#[derive(Debug, Clone, Copy)]
pub(super) struct OrderedUser {
    pub(super) hilbert: u64,
    pub(super) user: UserKey,
    pub(super) lat: f64,
    pub(super) lon: f64,
    /// The position along the Hilbert curve of each grid shift of [`SHIFTS`].
    pub(super) shifted: [u64; SHIFTS.len()],
    /// Cosine of the latitude: metres east per degree of longitude over metres per degree of latitude.
    pub(super) cos_lat: f64,
}

/// The snapshot in Hilbert order, shared by the partitions of every k.
#[derive(Debug, Clone, Default)]
pub(super) struct OrderedSnapshot {
    /// Snapshot generation it was taken at.
    pub(super) generation: u64,
    pub(super) users: Vec<OrderedUser>,
}

impl OrderedSnapshot {
    pub(super) fn index_of(&self, hilbert: u64, user: UserKey) -> Option<usize> {
        self.users
            .binary_search_by(|u| (u.hilbert, u.user).cmp(&(hilbert, user)))
            .ok()
    }
}

/// `Partition::bucket_of` of a user left out of every bucket.
pub(super) const UNASSIGNED: u32 = u32::MAX;

/// The partition of the ordered snapshot for one k.
#[derive(Debug, Clone, Default)]
pub(super) struct Partition {
    /// Snapshot generation it was computed for.
    pub(super) generation: u64,
    /// Bucket index of each user of the ordered snapshot ([`UNASSIGNED`] when in none).
    pub(super) bucket_of: Vec<u32>,
    /// The buckets' members (indices into the ordered snapshot), bucket after bucket.
    pub(super) members: Vec<u32>,
    /// Each bucket's range in `members` and its MBR.
    pub(super) buckets: Vec<(usize, usize, GeoBox)>,
    /// Per round, the cuts of the segments of the latest computation.
    caches: Vec<SegmentCache>,
}

/// Grid shifts of the Hilbert curve (in cells of the 2^32 grid) tried in turn. Shifts of 1/3 and 2/3
/// of the map (and others) move the curve's quadrant boundaries at every level, so users cut apart by
/// one curve meet on the next. Each user's position along every shifted curve is computed once, when
/// its position changes ([`Placed::new`]).
pub(super) const SHIFTS: [(u32, u32); 12] = [
    (0, 0),
    (0x5555_5555, 0x5555_5555),
    (0xAAAA_AAAA, 0x2AAA_AAAA),
    (0x3333_3333, 0x9999_9999),
    (0xCCCC_CCCC, 0x6666_6666),
    (0x1C71_C71C, 0xE38E_38E3),
    (0x7000_0001, 0x1000_0007),
    (0x2492_4924, 0x6DB6_DB6D),
    (0x9249_2492, 0xB6DB_6DB6),
    (0xE000_0003, 0x4CCC_CCCC),
    (0x0F0F_0F0F, 0xF0F0_F0F0),
    (0x5A5A_5A5A, 0xA5A5_A5A5),
];

/// The rounds of the partition: the grid shift (index into [`SHIFTS`]) of the Hilbert curve and the
/// target side (in multiples of `target_side_m`) of each round. Every shift at the target; users that
/// fit no bucket there are tried at twice and four times the target (so a request with a larger
/// tolerance still finds a small region), and the last round places whoever is left. Where the target
/// grows, the users left are first offered to the buckets already cut ([`absorb`]).
///
/// Measured on the sparse Oldenburg workload (`benches/location_presence.rs`, 500 m): six shifts at the
/// target gave 74.9 % success, eight 75.1 %, twelve 75.5 %.
const ROUNDS: [(usize, f64); 19] = [
    (0, 1.0),
    (1, 1.0),
    (2, 1.0),
    (3, 1.0),
    (4, 1.0),
    (5, 1.0),
    (6, 1.0),
    (7, 1.0),
    (8, 1.0),
    (9, 1.0),
    (10, 1.0),
    (11, 1.0),
    (0, 2.0),
    (1, 2.0),
    (2, 2.0),
    (3, 2.0),
    (0, 4.0),
    (1, 4.0),
    (0, 2.0),
];

/// Skip cost of leaving a user out of every bucket of a round (it is tried again in the next round).
const SKIP_COST: f64 = 0.9;

/// Partitions `users` (the snapshot in Hilbert order) for k in rounds: each round orders the users not
/// yet in a bucket along a (shifted) Hilbert curve and cuts that order into buckets of k..=2k-1
/// consecutive users by dynamic programming, leaving out users whose every bucket would be too wide
/// (they are tried in the next round); the last round leaves out nobody it can place. Deterministic:
/// only the users, their positions and keys, k and the target side enter.
///
/// In every round but the last, the order is first split into *segments* wherever two consecutive
/// users are more than twice the round's target apart (no bucket the round would keep spans such a
/// gap), and each segment is cut on its own. A segment's cut depends on its content only (its users,
/// their keys and positions, in order), so it is looked up in `cache` (the cuts of the previous
/// computation for this k) and recomputed only when the segment is new: a position update costs the
/// dynamic programme of the one or two segments it touches, not the whole snapshot's.
pub(super) fn partition_snapshot(
    users: &[OrderedUser],
    k: usize,
    target_side_m: f64,
    out: &mut Partition,
) {
    out.bucket_of.clear();
    out.members.clear();
    out.buckets.clear();
    let n = users.len();
    out.bucket_of.resize(n, UNASSIGNED);
    let rounds = &ROUNDS;
    if out.caches.len() != rounds.len() {
        out.caches = (0..rounds.len()).map(|_| SegmentCache::default()).collect();
    }
    if k == 0 || n < k {
        for cache in &mut out.caches {
            cache.finish_round();
        }
        return;
    }
    let mut pending: Vec<u32> = (0..n as u32).collect();
    let mut left = Vec::new();
    let mut keyed: Vec<(u64, UserKey, u32)> = Vec::new();
    let mut joined: Vec<(u32, u32)> = Vec::new();
    for (round, &(shift, scale)) in rounds.iter().enumerate() {
        if round > 0 && scale != rounds[round - 1].1 {
            absorb(
                users,
                &mut out.buckets,
                &mut pending,
                &mut joined,
                target_side_m * rounds[round - 1].1,
                target_side_m,
            );
        }
        if pending.len() < k {
            out.caches[round].finish_round();
            continue;
        }
        if round > 0 {
            keyed.clear();
            keyed.extend(pending.iter().map(|&i| {
                let u = &users[i as usize];
                (u.shifted[shift], u.user, i)
            }));
            keyed.sort_unstable();
            pending.clear();
            pending.extend(keyed.iter().map(|&(_, _, i)| i));
        }
        let target_m = target_side_m * scale;
        let last_round = round + 1 == rounds.len();
        let skip = if last_round { f64::INFINITY } else { SKIP_COST };
        left.clear();
        let mut start = 0;
        while start < pending.len() {
            let mut end = start + 1;
            if !last_round {
                while end < pending.len()
                    && !too_far(users, pending[end - 1], pending[end], target_m)
                {
                    end += 1;
                }
            } else {
                end = pending.len();
            }
            let segment = &pending[start..end];
            let cut = out.caches[round].cut(users, segment, k, target_m, skip);
            for &(from, to) in &cut.buckets {
                let first = out.members.len();
                let mut mbr = GeoBox::point(
                    users[segment[from as usize] as usize].lat,
                    users[segment[from as usize] as usize].lon,
                );
                for &i in &segment[from as usize..to as usize] {
                    let u = &users[i as usize];
                    mbr.extend(u.lat, u.lon);
                    out.members.push(i);
                }
                out.buckets.push((first, out.members.len(), mbr));
            }
            left.extend(cut.left.iter().map(|&offset| segment[offset as usize]));
            start = end;
        }
        out.caches[round].finish_round();
        std::mem::swap(&mut pending, &mut left);
    }
    if !joined.is_empty() {
        // Each bucket's members, then those that joined it, kept in the snapshot's order.
        joined.sort_unstable();
        let old_members = std::mem::take(&mut out.members);
        let mut e = 0;
        for (b, bucket) in out.buckets.iter_mut().enumerate() {
            let first = out.members.len();
            out.members
                .extend_from_slice(&old_members[bucket.0..bucket.1]);
            while e < joined.len() && joined[e].0 as usize == b {
                out.members.push(joined[e].1);
                e += 1;
            }
            out.members[first..].sort_unstable();
            bucket.0 = first;
            bucket.1 = out.members.len();
        }
    }
    for (index, &(start, end, _)) in out.buckets.iter().enumerate() {
        for &member in &out.members[start..end] {
            out.bucket_of[member as usize] = index as u32;
        }
    }
}

/// Offers each user left out of every bucket so far (in `pending`, in order) to the buckets already cut,
/// before the next rounds try a larger target: a user joins the bucket whose region it would fit best
/// (least larger side, then lowest index) when its own need is within `target_m` and the bucket either
/// holds its position already (the region does not change) or grows to a larger side of at most
/// `base_m` (the partition's target, so every member still fits it). No member of a bucket is ever
/// pushed beyond a tolerance it fitted; buckets may so hold more than 2k - 1 users. Deterministic: a
/// function of the buckets and the users in `pending` order, like the rest of the partition.
fn absorb(
    users: &[OrderedUser],
    buckets: &mut [(usize, usize, GeoBox)],
    pending: &mut Vec<u32>,
    joined: &mut Vec<(u32, u32)>,
    target_m: f64,
    base_m: f64,
) {
    if buckets.is_empty() || pending.is_empty() {
        return;
    }
    // Buckets by the least latitude of their region as cut; a region grows by at most `base_m`.
    let mut by_lat: Vec<(f64, u32)> = buckets
        .iter()
        .enumerate()
        .map(|(b, (_, _, mbr))| (mbr.min_lat, b as u32))
        .collect();
    by_lat.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let tallest = buckets
        .iter()
        .map(|(_, _, mbr)| mbr.max_lat - mbr.min_lat)
        .fold(0.0, f64::max);
    let reach = 2.0 * base_m.max(target_m) / METRES_PER_DEGREE_LAT;
    pending.retain(|&i| {
        let u = &users[i as usize];
        let from = by_lat.partition_point(|&(lat, _)| lat < u.lat - reach - tallest);
        let mut best: Option<(f64, u32, GeoBox)> = None;
        for &(min_lat, b) in &by_lat[from..] {
            if min_lat > u.lat + reach {
                break;
            }
            let mbr = buckets[b as usize].2;
            let mut grown = mbr;
            grown.extend(u.lat, u.lon);
            let side = larger_side_m(&grown, u.cos_lat);
            if grown != mbr && side > base_m {
                continue;
            }
            let need_deg_lat = (u.lat - grown.min_lat).max(grown.max_lat - u.lat);
            let need_deg_lon = (u.lon - grown.min_lon).max(grown.max_lon - u.lon);
            let need = need_deg_lat.max(need_deg_lon * u.cos_lat) * METRES_PER_DEGREE_LAT;
            if need > target_m {
                continue;
            }
            if best.is_none_or(|(s, c, _)| (side, b) < (s, c)) {
                best = Some((side, b, grown));
            }
        }
        match best {
            Some((_, b, grown)) => {
                buckets[b as usize].2 = grown;
                joined.push((b, i));
                false
            }
            None => true,
        }
    });
}

/// Whether two users are too far apart for any bucket of a round with this target to hold both: the
/// larger side of their bounding box exceeds twice the target (see the cut-off in [`cut_segment`]).
fn too_far(users: &[OrderedUser], a: u32, b: u32, target_m: f64) -> bool {
    let (a, b) = (&users[a as usize], &users[b as usize]);
    let mut pair = GeoBox::point(a.lat, a.lon);
    pair.extend(b.lat, b.lon);
    larger_side_m(&pair, a.cos_lat) > 2.0 * target_m
}

/// How one segment is cut: buckets and users left out, as offsets into the segment.
#[derive(Debug, Clone, Default)]
struct SegmentCut {
    /// The segment it was computed for: (user key, latitude bits, longitude bits) in order.
    content: Vec<(UserKey, u64, u64)>,
    /// Each bucket's offset range in the segment.
    buckets: Vec<(u32, u32)>,
    /// Offsets of the users left out, in order.
    left: Vec<u32>,
}

/// The segment cuts of one round for one k: those used by the latest computation (`current`) and those
/// of the one before (`previous`), keyed by a hash of the segment's content (compared in full on a hit).
/// Cuts not used by a computation are dropped at its end, so the cache never holds more than the
/// snapshot's users.
#[derive(Debug, Clone, Default)]
struct SegmentCache {
    current: HashMap<u64, SegmentCut>,
    previous: HashMap<u64, SegmentCut>,
}

impl SegmentCache {
    /// The cut of `segment` (indices into `users`, in curve order), from the cache or computed.
    fn cut(
        &mut self,
        users: &[OrderedUser],
        segment: &[u32],
        k: usize,
        target_m: f64,
        skip: f64,
    ) -> &SegmentCut {
        use std::hash::{Hash, Hasher};
        let entry = |i: &u32| {
            let u = &users[*i as usize];
            (u.user, u.lat.to_bits(), u.lon.to_bits())
        };
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        segment.len().hash(&mut hasher);
        for i in segment {
            entry(i).hash(&mut hasher);
        }
        let key = hasher.finish();
        let same = |cut: &SegmentCut| {
            cut.content.len() == segment.len()
                && cut.content.iter().zip(segment).all(|(c, i)| *c == entry(i))
        };
        let cut = match self.previous.remove(&key) {
            Some(cut) if same(&cut) => cut,
            _ => {
                let (buckets, left) = cut_segment(users, segment, k, target_m, skip);
                SegmentCut {
                    content: segment.iter().map(entry).collect(),
                    buckets,
                    left,
                }
            }
        };
        let slot = self.current.entry(key).insert_entry(cut);
        slot.into_mut()
    }

    /// Ends a computation: the cuts it did not use are dropped.
    fn finish_round(&mut self) {
        self.previous.clear();
        std::mem::swap(&mut self.previous, &mut self.current);
    }
}

/// The tolerance steps, in multiples of the round's target, at which a bucket is costed.
const COST_STEPS: [f64; 3] = [1.0, 2.0, 4.0];

/// Cost of a bucket: at each step `m` of [`COST_STEPS`], the members whose request with tolerance
/// `m × target` the bucket could not serve. A member's need is the Chebyshev half-width in metres of the
/// smallest constraint box centred on it that holds the bucket's MBR; a request is cloaked only if at
/// least k members hold the region in its tolerance, so when fewer than k members' needs are within
/// the step, every member is lost at that step, and otherwise those beyond it. A small term in the MBR's
/// larger side makes smaller regions win ties.
fn bucket_cost(
    users: &[OrderedUser],
    members: &[u32],
    mbr: &GeoBox,
    cos: f64,
    target_m: f64,
    k: usize,
) -> f64 {
    let side = larger_side_m(mbr, cos);
    let size = members.len();
    let mut cost = size as f64 * 1e-3 * side / target_m;
    if side <= target_m {
        return cost;
    }
    if side > 8.0 * target_m {
        // need >= side / 2 > 4 × target for every member.
        return cost + (COST_STEPS.len() * size) as f64;
    }
    // Members a bucket may leave beyond a step while still serving the others at it.
    let spare = size.saturating_sub(k);
    for step in COST_STEPS {
        let step_m = step * target_m;
        if side <= step_m {
            // Every member's need is within the step: nobody is lost at it, nor at a larger one.
            break;
        }
        if side > 2.0 * step_m {
            // need >= side / 2 > step for every member.
            cost += size as f64;
            continue;
        }
        let mut beyond = 0usize;
        for &i in members {
            let u = &users[i as usize];
            let need_deg_lat = (u.lat - mbr.min_lat).max(mbr.max_lat - u.lat);
            let need_deg_lon = (u.lon - mbr.min_lon).max(mbr.max_lon - u.lon);
            let need = need_deg_lat.max(need_deg_lon * cos) * METRES_PER_DEGREE_LAT;
            beyond += usize::from(need > step_m);
            if beyond > spare {
                // Fewer than k within the step: all of them are lost at it.
                break;
            }
        }
        cost += if beyond > spare { size } else { beyond } as f64;
    }
    cost
}

/// Cuts `seq` (indices into `users`, in curve order) into buckets of k..=2k-1 consecutive users, or
/// leaves users out at `skip` each, minimizing the total cost; returns the buckets' offset ranges and
/// the offsets of the users left out, both in order.
fn cut_segment(
    users: &[OrderedUser],
    seq: &[u32],
    k: usize,
    target_m: f64,
    skip: f64,
) -> (Vec<(u32, u32)>, Vec<u32>) {
    let n = seq.len();
    let longest = 2 * k - 1;
    // best[i]: least cost of users seq[..i]; last[i]: size of the last bucket there (0: left out).
    let mut best = vec![f64::INFINITY; n + 1];
    let mut last = vec![0usize; n + 1];
    best[0] = 0.0;
    for end in 1..=n {
        if best[end - 1] + skip < best[end] {
            best[end] = best[end - 1] + skip;
            last[end] = 0;
        }
        if end < k {
            continue;
        }
        let first = &users[seq[end - 1] as usize];
        let cos = first.cos_lat;
        let mut mbr = GeoBox::point(first.lat, first.lon);
        for len in 1..=longest.min(end) {
            let start = end - len;
            if len > 1 {
                let u = &users[seq[start] as usize];
                mbr.extend(u.lat, u.lon);
            }
            if skip.is_finite() && larger_side_m(&mbr, cos) > 2.0 * target_m {
                // Every member's need exceeds the target (need >= side / 2), so each costs at least
                // 1 > `skip`: leaving them all out is cheaper, here and for every longer bucket.
                break;
            }
            if len < k || !best[start].is_finite() {
                continue;
            }
            // The cost is at least its tie term: a bucket that cannot beat the best so far even
            // with it alone is not costed in full.
            let floor = len as f64 * 1e-3 * larger_side_m(&mbr, cos) / target_m;
            if best[start] + floor >= best[end] {
                continue;
            }
            let cost = best[start] + bucket_cost(users, &seq[start..end], &mbr, cos, target_m, k);
            if cost < best[end] {
                best[end] = cost;
                last[end] = len;
            }
        }
    }
    let mut buckets = Vec::new();
    let mut left = Vec::new();
    let mut end = n;
    while end > 0 {
        let len = last[end];
        if len == 0 || !best[end].is_finite() {
            left.push((end - 1) as u32);
            end -= 1;
        } else {
            buckets.push(((end - len) as u32, end as u32));
            end -= len;
        }
    }
    left.reverse();
    buckets.reverse();
    (buckets, left)
}

/// The larger side of a box in metres, longitude scaled by `cos` (the cosine of a latitude in the box:
/// the buckets' boxes span a few kilometres at most where it matters, so the choice barely counts; the
/// region's fit is tested exactly against the constraint box afterwards).
pub(super) fn larger_side_m(b: &GeoBox, cos: f64) -> f64 {
    let w = (b.max_lon - b.min_lon) * cos;
    let h = b.max_lat - b.min_lat;
    w.max(h) * METRES_PER_DEGREE_LAT
}
