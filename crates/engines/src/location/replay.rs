//! Replaying a mobility trace as location requests, and the cloaking quality measures of Gedik & Liu
//! (success rate, relative anonymity, relative spatial resolution), for the engine benchmark and the
//! realistic tests.
//!
//! Each trace point becomes one request at its timestamp; the points of one timestamp are spread evenly
//! over that second (`arrival = timestamp * 1000 + i * 1000 / n` for the i-th of n points), in trace
//! order. k is drawn uniformly from `k_min..=k_max` with a seeded RNG; tolerances are fixed, or
//! redrawn log-uniformly per request ([`log_uniform_tolerances`]); [`squeeze_into_square`] turns a
//! trace into a hot spot.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{CloakRequest, GeoBox, Outcome, RequestId};

pub use super::trace::TracePoint;

/// How trace points are turned into requests.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayParams {
    pub k_min: u32,
    pub k_max: u32,
    pub dx_m: f64,
    pub dy_m: f64,
    pub dt_ms: u64,
    pub seed: u64,
}

impl ReplayParams {
    /// The workload the issues and benchmarks measure the Oldenburg traces with: k uniform in
    /// [2, 10], dx = dy = 500 m, dt = 10 s, seed 2024.
    pub const OLDENBURG: ReplayParams = ReplayParams {
        k_min: 2,
        k_max: 10,
        dx_m: 500.0,
        dy_m: 500.0,
        dt_ms: 10_000,
        seed: 2024,
    };
}

/// The requests of a trace, in trace order, with ids 0, 1, 2, ... and one user key per trace user id.
pub fn requests_from_trace(points: &[TracePoint], params: &ReplayParams) -> Vec<CloakRequest> {
    let mut rng = ChaCha8Rng::seed_from_u64(params.seed);
    let mut user_keys: BTreeMap<&str, u64> = BTreeMap::new();
    let mut requests = Vec::with_capacity(points.len());
    let mut start = 0;
    while start < points.len() {
        let timestamp = points[start].timestamp;
        let end = start
            + points[start..]
                .iter()
                .take_while(|p| p.timestamp == timestamp)
                .count();
        let n = (end - start) as i64;
        for (i, point) in points[start..end].iter().enumerate() {
            let next_key = user_keys.len() as u64;
            let user = *user_keys.entry(point.user_id.as_str()).or_insert(next_key);
            let k_max = params.k_max.max(params.k_min);
            requests.push(CloakRequest {
                id: requests.len() as RequestId,
                user,
                lat: point.lat,
                lon: point.lon,
                k: rng.random_range(params.k_min..=k_max),
                dx_m: params.dx_m,
                dy_m: params.dy_m,
                dt_ms: params.dt_ms,
                arrival_ms: timestamp.saturating_mul(1000) + (i as i64) * 1000 / n,
            });
        }
        start = end;
    }
    requests
}

/// A draw from the log-uniform distribution on [`min`, `max`] (ln of it uniform): every factor of
/// ten between the bounds is equally likely, as tolerances from tens of metres in a city centre to
/// tens of kilometres in the countryside are. `min` when `max <= min`; both must be positive.
pub fn log_uniform(rng: &mut impl Rng, min: f64, max: f64) -> f64 {
    if max > min {
        (min.ln() + rng.random::<f64>() * (max.ln() - min.ln()))
            .exp()
            .clamp(min, max)
    } else {
        min
    }
}

/// Redraws each request's dx and then dy log-uniformly from [`min_m`, `max_m`] ([`log_uniform`]),
/// with a seeded RNG, in request order.
pub fn log_uniform_tolerances(requests: &mut [CloakRequest], min_m: f64, max_m: f64, seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for req in requests {
        req.dx_m = log_uniform(&mut rng, min_m, max_m);
        req.dy_m = log_uniform(&mut rng, min_m, max_m);
    }
}

/// A hot spot: maps the requests' bounding box linearly onto a square of `side_m` metres around its
/// centre (each axis scaled on its own), so that every position lies in that square and the
/// relative layout (who is north or east of whom) is kept.
pub fn squeeze_into_square(requests: &mut [CloakRequest], side_m: f64) {
    let Some(first) = requests.first() else {
        return;
    };
    let mut bounds = GeoBox::point(first.lat, first.lon);
    for req in requests.iter() {
        bounds.extend(req.lat, req.lon);
    }
    let centre_lat = 0.5 * (bounds.min_lat + bounds.max_lat);
    let centre_lon = 0.5 * (bounds.min_lon + bounds.max_lon);
    let side_lat = side_m / super::geo::METRES_PER_DEGREE_LAT;
    let side_lon = side_lat / centre_lat.to_radians().cos().max(1e-6);
    let scale = |extent: f64, side: f64| if extent > 0.0 { side / extent } else { 0.0 };
    let scale_lat = scale(bounds.max_lat - bounds.min_lat, side_lat);
    let scale_lon = scale(bounds.max_lon - bounds.min_lon, side_lon);
    for req in requests {
        req.lat = centre_lat + (req.lat - centre_lat) * scale_lat;
        req.lon = centre_lon + (req.lon - centre_lon) * scale_lon;
    }
}

/// The three workloads of the engine benchmark (`benches/location_engine.rs`) from the requests of
/// a trace: `500m` (the requests as given), `log_uniform` (dx and dy redrawn log-uniformly from
/// [20 m, 20 km], seed 2025) and `hot_spot` (the latter squeezed into 1 km²).
pub fn workloads(fixed: Vec<CloakRequest>) -> Vec<(&'static str, Vec<CloakRequest>)> {
    let mut varied = fixed.clone();
    log_uniform_tolerances(&mut varied, 20.0, 20_000.0, 2025);
    let mut hot = varied.clone();
    squeeze_into_square(&mut hot, 1_000.0);
    vec![("500m", fixed), ("log_uniform", varied), ("hot_spot", hot)]
}

/// Relative spatial resolution sqrt(area(Bcn) / area(cloaking box)) (Gedik & Liu); each side of the
/// cloaking box is counted as at least 1 m so that groups of (nearly) co-located points stay finite.
pub fn relative_spatial_resolution(constraint_box: &GeoBox, cloaking_box: &GeoBox) -> f64 {
    let (cw, ch) = constraint_box.size_m();
    let (w, h) = cloaking_box.size_m();
    ((cw * ch) / (w.max(1.0) * h.max(1.0))).sqrt()
}

/// Accumulates the quality measures over the outcomes of a replay.
#[derive(Debug, Clone, Default)]
pub struct CloakingQuality {
    pub cloaked: usize,
    pub expired: usize,
    sum_relative_anonymity: f64,
    sum_relative_spatial_resolution: f64,
}

impl CloakingQuality {
    /// Adds outcomes; `request` looks a request up by id (the ids of [`requests_from_trace`] are
    /// indices, so a slice works).
    pub fn add(
        &mut self,
        outcomes: &[Outcome],
        request: impl Fn(RequestId) -> Option<CloakRequest>,
    ) {
        for outcome in outcomes {
            match outcome {
                Outcome::Expired { .. } => self.expired += 1,
                Outcome::Cloaked(group) => {
                    let size = group.members.len() as f64;
                    for id in &group.members {
                        let Some(req) = request(*id) else { continue };
                        self.cloaked += 1;
                        self.sum_relative_anonymity += size / f64::from(req.k.max(1));
                        self.sum_relative_spatial_resolution +=
                            relative_spatial_resolution(&req.constraint_box(), &group.cloaking_box);
                    }
                }
            }
        }
    }

    /// Cloaked / (cloaked + expired).
    pub fn success_rate(&self) -> f64 {
        ratio(self.cloaked as f64, (self.cloaked + self.expired) as f64)
    }

    /// Mean over cloaked requests of group size / k.
    pub fn mean_relative_anonymity(&self) -> f64 {
        ratio(self.sum_relative_anonymity, self.cloaked as f64)
    }

    /// Mean over cloaked requests of [`relative_spatial_resolution`].
    pub fn mean_relative_spatial_resolution(&self) -> f64 {
        ratio(self.sum_relative_spatial_resolution, self.cloaked as f64)
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// The sparse workload of the presence model: each user reports its position every
/// `update_period_s` seconds of the trace and asks one request every `request_period_s` seconds, each
/// with a random phase per user (seeded); k uniform in `k_min..=k_max`.
#[derive(Debug, Clone, PartialEq)]
pub struct PeriodicParams {
    /// 0: no position updates (requests only).
    pub update_period_s: u32,
    /// At least 1.
    pub request_period_s: u32,
    pub k_min: u32,
    pub k_max: u32,
    pub seed: u64,
}

/// One event of a periodic workload; `user` indexes the workload's user ids.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PeriodicEvent {
    Update {
        user: usize,
        at_ms: i64,
        lat: f64,
        lon: f64,
    },
    Request {
        user: usize,
        at_ms: i64,
        lat: f64,
        lon: f64,
        k: u32,
    },
}

impl PeriodicEvent {
    pub fn at_ms(&self) -> i64 {
        match self {
            PeriodicEvent::Update { at_ms, .. } | PeriodicEvent::Request { at_ms, .. } => *at_ms,
        }
    }
}

/// A periodic workload: the user ids (in order of first appearance) and the events in time order.
#[derive(Debug, Clone, PartialEq)]
pub struct PeriodicWorkload {
    pub user_ids: Vec<String>,
    pub events: Vec<PeriodicEvent>,
}

impl PeriodicWorkload {
    pub fn requests(&self) -> usize {
        self.events
            .iter()
            .filter(|e| matches!(e, PeriodicEvent::Request { .. }))
            .count()
    }
}

/// Builds the periodic workload of a trace (sorted by timestamp): the row of user u at second t is a
/// request when `(t - t0 + request_phase(u)) % request_period_s == 0` and an update when
/// `(t - t0 + update_phase(u)) % update_period_s == 0` (an update goes before a request of the same
/// row). The events of one trace second are spread evenly over it, in trace order.
pub fn periodic_workload(points: &[TracePoint], params: &PeriodicParams) -> PeriodicWorkload {
    let mut rng = ChaCha8Rng::seed_from_u64(params.seed);
    let request_period = i64::from(params.request_period_s.max(1));
    let update_period = i64::from(params.update_period_s);
    let k_max = params.k_max.max(params.k_min);
    let t0 = points.first().map(|p| p.timestamp).unwrap_or(0);
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    let mut user_ids = Vec::new();
    // Per user: (request phase, update phase).
    let mut phases: Vec<(i64, i64)> = Vec::new();
    let mut events = Vec::new();
    let mut start = 0;
    while start < points.len() {
        let timestamp = points[start].timestamp;
        let end = start
            + points[start..]
                .iter()
                .take_while(|p| p.timestamp == timestamp)
                .count();
        let second_start = events.len();
        for point in &points[start..end] {
            let user = *index.entry(point.user_id.as_str()).or_insert_with(|| {
                user_ids.push(point.user_id.clone());
                let request_phase = rng.random_range(0..request_period);
                let update_phase = if update_period > 0 {
                    rng.random_range(0..update_period)
                } else {
                    0
                };
                phases.push((request_phase, update_phase));
                user_ids.len() - 1
            });
            let (request_phase, update_phase) = phases[user];
            let since = timestamp - t0;
            if update_period > 0 && (since + update_phase) % update_period == 0 {
                events.push(PeriodicEvent::Update {
                    user,
                    at_ms: 0,
                    lat: point.lat,
                    lon: point.lon,
                });
            }
            if (since + request_phase) % request_period == 0 {
                events.push(PeriodicEvent::Request {
                    user,
                    at_ms: 0,
                    lat: point.lat,
                    lon: point.lon,
                    k: rng.random_range(params.k_min..=k_max),
                });
            }
        }
        let n = (events.len() - second_start) as i64;
        for (i, event) in events[second_start..].iter_mut().enumerate() {
            let at = timestamp.saturating_mul(1000) + (i as i64) * 1000 / n.max(1);
            match event {
                PeriodicEvent::Update { at_ms, .. } | PeriodicEvent::Request { at_ms, .. } => {
                    *at_ms = at
                }
            }
        }
        start = end;
    }
    PeriodicWorkload { user_ids, events }
}

/// The median of some values (NaNs sort last); 0 for none.
pub fn median(values: &mut [f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(|a, b| a.total_cmp(b));
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        0.5 * (values[mid - 1] + values[mid])
    }
}

/// The Oldenburg slice shipped with the tests (`tests/data/oldenburg_60s.csv.gz`: 60 s of the
/// Oldenburg 10k trace) as requests: k uniform in [2, 10], dx = dy = 500 m, dt = 10 s.
#[cfg(test)]
pub(crate) fn oldenburg_slice() -> Vec<CloakRequest> {
    let path = crate::test_files::repo("tests/data/oldenburg_60s.csv.gz");
    let points = crate::test_files::read_trace_file(&path, None);
    requests_from_trace(&points, &ReplayParams::OLDENBURG)
}
