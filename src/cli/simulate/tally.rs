//! What a run measured: the tally of the outcomes the clients saw, and the report made from it.
//!
//! Invariants: each request counts once, at its first outcome (Cloaked, Expired or Rejected);
//! replies and undelivered notices are counted apart and never count as outcomes; a group (told apart
//! by its shared box and interval) gets a broker-overhead figure only once all its members were seen.
use std::collections::HashMap;
use std::time::Instant;

use hdrhistogram::Histogram;

use super::poi_answers;
use crate::location::geo::METRES_PER_DEGREE_LAT;
use crate::location::tracking::{CloakedObservation, SessionAnonymity, session_anonymity};
use crate::location::yardstick::Observed;
use crate::proto::location_event::Outcome;

/// The measured outcome of a run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SimulationReport {
    pub requests: u64,
    pub cloaked: u64,
    pub expired: u64,
    pub rejected: u64,
    pub undelivered: u64,
    pub missing: u64,
    pub replies: u64,
    pub success_rate: f64,
    pub mean_relative_anonymity: f64,
    pub median_relative_spatial_resolution: f64,
    pub median_relative_temporal_resolution: f64,
    /// From the first send to the last outcome (expiries arrive up to dt after the last send).
    pub seconds: f64,
    /// Requests sent per second while sending.
    pub offered_per_s: f64,
    /// The schedule's sending time: the last request's due time after the start.
    pub planned_sending_seconds: f64,
    /// How late the last request went out against its due time: about the timer's millisecond
    /// when the simulator kept its schedule, more when it fell behind.
    pub send_lag_ms: f64,
    /// Requests handled per second: cloaked outcomes over the time from the first send to the last
    /// Cloaked event (a group forms on an arrival, so this is the broker's cloaking rate).
    pub throughput_per_s: f64,
    pub cloak_latency_ms: Percentiles,
    pub reply_latency_ms: Percentiles,
    pub broker_overhead_ms: Percentiles,
    /// With `--update-period-s`: position updates sent, and accepted by the broker.
    pub updates_sent: u64,
    pub updates_accepted: u64,
    /// With `--pid`: user plus system CPU seconds those processes used during the run, together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// The simulator's own user plus system CPU seconds over the same span: the load generator's
    /// share of a machine it shares with the daemon.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulator_cpu_seconds: Option<f64>,
    /// With `--session-ms`: what intersecting each user's groups over a session leaves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_anonymity: Option<SessionAnonymity>,
    /// With `--pois`: the clients' refined POI answers against their exact answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poi: Option<poi_answers::PoiReport>,
    /// Rejected with RESOURCE_EXHAUSTED (the user's privacy budget spent).
    pub budget_exhausted: u64,
    /// With `observe` (`--compare`): per answer, the true position and what the provider saw.
    #[serde(skip)]
    pub observed: Vec<((f64, f64), Observed)>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Percentiles {
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        Percentiles {
            p50: ms(0.5),
            p90: ms(0.9),
            p99: ms(0.99),
            max: h.max() as f64 / 1000.0,
        }
    }
}

/// What a request asked for: k, dx and dy (metres), dt (ms).
pub(super) type Requested = (u32, f64, f64, u64);

/// A cloaked group as the clients see it: its shared box (as bits) and interval.
type GroupKey = (u64, u64, u64, u64, i64, i64);
/// Latest send time among the members seen (ns since start), when that member's Cloaked arrived,
/// members seen, group size.
type GroupSeen = (u64, Instant, u32, u32);

/// The outcomes seen so far.
pub(super) struct Tally {
    start: Instant,
    requested: Vec<Requested>,
    user_of: Vec<u64>,
    track_sessions: bool,
    outcome_seen: Vec<bool>,
    outcomes: usize,
    cloaked: u64,
    expired: u64,
    rejected: u64,
    undelivered: u64,
    replies: u64,
    replies_expected: u64,
    anonymity_sum: f64,
    spatial: Vec<f64>,
    temporal: Vec<f64>,
    cloak_latency: Histogram<u64>,
    reply_latency: Histogram<u64>,
    groups: HashMap<GroupKey, GroupSeen>,
    group_ids: HashMap<GroupKey, u64>,
    tracked: Vec<CloakedObservation>,
    last_outcome: Instant,
    last_cloaked: Instant,
    budget_exhausted: u64,
    /// With [`Tally::keep_observations`]: the requests' true positions and epsilon per km, and per
    /// answer what the provider saw.
    positions: Option<(Vec<(f64, f64)>, f64)>,
    observed: Vec<((f64, f64), Observed)>,
}

/// What the tally cannot see: how sending went, and what the caller measured beside it.
pub(super) struct RunFacts {
    /// From the first to the last send.
    pub(super) sending_seconds: f64,
    pub(super) planned_sending_seconds: f64,
    pub(super) send_lag_ms: f64,
    pub(super) cpu_seconds: Option<f64>,
    pub(super) simulator_cpu_seconds: Option<f64>,
    pub(super) updates_sent: u64,
    pub(super) updates_accepted: u64,
    pub(super) session_ms: Option<u64>,
    pub(super) poi: Option<poi_answers::PoiReport>,
}

fn latency_histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?)
}

impl Tally {
    /// A tally of the requests `requested` (indexed by request number), sent by the users `user_of`
    /// from `start`; with `track_sessions`, the cloaked requests are kept for session anonymity.
    pub(super) fn new(
        start: Instant,
        requested: Vec<Requested>,
        user_of: Vec<u64>,
        track_sessions: bool,
    ) -> anyhow::Result<Tally> {
        Ok(Tally {
            start,
            outcome_seen: vec![false; requested.len()],
            requested,
            user_of,
            track_sessions,
            outcomes: 0,
            cloaked: 0,
            expired: 0,
            rejected: 0,
            undelivered: 0,
            replies: 0,
            replies_expected: 0,
            anonymity_sum: 0.0,
            spatial: Vec::new(),
            temporal: Vec::new(),
            cloak_latency: latency_histogram()?,
            reply_latency: latency_histogram()?,
            groups: HashMap::new(),
            group_ids: HashMap::new(),
            tracked: Vec::new(),
            last_outcome: start,
            last_cloaked: start,
            budget_exhausted: 0,
            positions: None,
            observed: Vec::new(),
        })
    }

    /// Keep, per answer, the true position (from `positions`, by request number) and what the provider
    /// saw (a geo-indistinguishable point is taken as drawn at `epsilon_per_km`).
    pub(super) fn keep_observations(&mut self, positions: Vec<(f64, f64)>, epsilon_per_km: f64) {
        self.positions = Some((positions, epsilon_per_km));
    }

    /// Every request has its outcome and every cloaked one its reply (or an undelivered notice).
    pub(super) fn complete(&self) -> bool {
        self.outcomes >= self.requested.len() && self.replies >= self.replies_expected
    }

    pub(super) fn outcomes(&self) -> usize {
        self.outcomes
    }

    /// A progress line.
    pub(super) fn summary(&self) -> String {
        format!(
            "{} cloaked, {} expired, {} replies",
            self.cloaked, self.expired, self.replies
        )
    }

    /// The provider's reply to a cloaked request reached its client.
    pub(super) fn reply(&mut self, since_send_us: u64) {
        self.replies += 1;
        self.reply_latency.saturating_record(since_send_us);
    }

    /// The broker could not deliver the provider's reply: none is expected any more.
    pub(super) fn undelivered(&mut self) {
        self.undelivered += 1;
        self.replies_expected = self.replies_expected.saturating_sub(1);
    }

    /// Request `no` (sent `sent_ns` after the start) got `outcome`, read at `at`. Returns whether it
    /// was its first outcome (later ones, from a replayed stream, are ignored).
    pub(super) fn outcome(
        &mut self,
        no: usize,
        outcome: Option<Outcome>,
        at: Instant,
        sent_ns: u64,
        since_send_us: u64,
    ) -> bool {
        if std::mem::replace(&mut self.outcome_seen[no], true) {
            return false;
        }
        self.outcomes += 1;
        self.last_outcome = at;
        let (k, dx, dy, dt) = self.requested[no];
        match outcome {
            Some(Outcome::Cloaked(c)) => {
                self.cloaked += 1;
                self.last_cloaked = at;
                self.replies_expected += 1;
                self.cloak_latency.saturating_record(since_send_us);
                self.anonymity_sum += f64::from(c.group_size) / f64::from(k.max(1));
                if let Some((positions, epsilon_per_km)) = &self.positions
                    && let Some(seen) = observed(&c, *epsilon_per_km)
                {
                    self.observed.push((positions[no], seen));
                }
                if let Some(b) = c.r#box {
                    let centre = 0.5 * (b.min_lat + b.max_lat);
                    let w = ((b.max_lon - b.min_lon)
                        * METRES_PER_DEGREE_LAT
                        * centre.to_radians().cos())
                    .max(1.0);
                    let h = ((b.max_lat - b.min_lat) * METRES_PER_DEGREE_LAT).max(1.0);
                    self.spatial.push(((4.0 * dx * dy) / (w * h)).sqrt());
                    let interval = ((c.t_end_ms - c.t_start_ms) as f64).max(1.0);
                    self.temporal.push(2.0 * dt as f64 / interval);
                    let key = (
                        b.min_lat.to_bits(),
                        b.min_lon.to_bits(),
                        b.max_lat.to_bits(),
                        b.max_lon.to_bits(),
                        c.t_start_ms,
                        c.t_end_ms,
                    );
                    let entry = self.groups.entry(key).or_insert((0, at, 0, c.group_size));
                    entry.2 += 1;
                    if sent_ns >= entry.0 {
                        entry.0 = sent_ns;
                        entry.1 = at;
                    }
                    if self.track_sessions {
                        let next_id = self.group_ids.len() as u64;
                        self.tracked.push(CloakedObservation {
                            user: self.user_of[no],
                            group: *self.group_ids.entry(key).or_insert(next_id),
                            formed_at_ms: c.t_end_ms,
                            k,
                        });
                    }
                }
            }
            Some(Outcome::Expired(_)) => self.expired += 1,
            Some(Outcome::Rejected(r)) => {
                self.rejected += 1;
                if r.code == tonic::Code::ResourceExhausted as i32 {
                    self.budget_exhausted += 1;
                }
            }
            _ => {}
        }
        true
    }

    /// The report of the run.
    pub(super) fn report(mut self, facts: RunFacts) -> anyhow::Result<SimulationReport> {
        let start = self.start;
        let seconds = self
            .last_outcome
            .duration_since(start)
            .as_secs_f64()
            .max(1e-9);
        let cloaking_seconds = self
            .last_cloaked
            .duration_since(start)
            .as_secs_f64()
            .max(1e-9);
        let mut overhead = latency_histogram()?;
        for (latest_ns, at, members, size) in self.groups.values() {
            if members == size {
                let us = at
                    .duration_since(start)
                    .as_nanos()
                    .saturating_sub(u128::from(*latest_ns))
                    / 1000;
                overhead.saturating_record(u64::try_from(us).unwrap_or(u64::MAX).max(1));
            }
        }
        let median = |v: &mut Vec<f64>| {
            if v.is_empty() {
                return 0.0;
            }
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let total = self.requested.len();
        let cloaked = self.cloaked;
        Ok(SimulationReport {
            cpu_seconds: facts.cpu_seconds,
            simulator_cpu_seconds: facts.simulator_cpu_seconds,
            requests: total as u64,
            cloaked,
            expired: self.expired,
            rejected: self.rejected,
            undelivered: self.undelivered,
            missing: (total - self.outcomes) as u64,
            replies: self.replies,
            success_rate: cloaked as f64 / total as f64,
            mean_relative_anonymity: if cloaked > 0 {
                self.anonymity_sum / cloaked as f64
            } else {
                0.0
            },
            median_relative_spatial_resolution: median(&mut self.spatial),
            median_relative_temporal_resolution: median(&mut self.temporal),
            seconds,
            offered_per_s: total as f64 / facts.sending_seconds,
            planned_sending_seconds: facts.planned_sending_seconds,
            send_lag_ms: facts.send_lag_ms,
            throughput_per_s: cloaked as f64 / cloaking_seconds,
            cloak_latency_ms: Percentiles::of(&self.cloak_latency),
            reply_latency_ms: Percentiles::of(&self.reply_latency),
            broker_overhead_ms: Percentiles::of(&overhead),
            updates_sent: facts.updates_sent,
            updates_accepted: facts.updates_accepted,
            session_anonymity: facts
                .session_ms
                .map(|session_ms| session_anonymity(&self.tracked, session_ms)),
            poi: facts.poi,
            budget_exhausted: self.budget_exhausted,
            observed: self.observed,
        })
    }
}

/// What the provider saw of a cloaked request: the reported point (GEO_IND, taken as drawn at
/// `epsilon_per_km`), else its box (REQUESTS, PRESENCE).
fn observed(c: &crate::proto::Cloaked, epsilon_per_km: f64) -> Option<Observed> {
    if let Some(p) = c.reported {
        return Some(Observed::Laplace {
            lat: p.lat,
            lon: p.lon,
            epsilon_per_km,
        });
    }
    let b = c.r#box?;
    Some(Observed::Box {
        min_lat: b.min_lat,
        min_lon: b.min_lon,
        max_lat: b.max_lat,
        max_lon: b.max_lon,
    })
}

/// Prints the report for a person.
pub(super) fn print_report(r: &SimulationReport) {
    println!("requests             {}", r.requests);
    println!(
        "outcomes             {} cloaked, {} expired, {} rejected, {} missing ({} undelivered, {} replies)",
        r.cloaked, r.expired, r.rejected, r.missing, r.undelivered, r.replies
    );
    if r.updates_sent > 0 {
        println!(
            "position updates     {} sent, {} accepted",
            r.updates_sent, r.updates_accepted
        );
    }
    println!("success rate         {:.2} %", 100.0 * r.success_rate);
    println!(
        "relative anonymity   {:.3} (mean group size / k)",
        r.mean_relative_anonymity
    );
    println!(
        "rel. spatial res.    {:.3} (median sqrt(area Bcn / area cloak))",
        r.median_relative_spatial_resolution
    );
    println!(
        "rel. temporal res.   {:.3} (median 2 dt / cloak interval)",
        r.median_relative_temporal_resolution
    );
    println!(
        "throughput           {:.0} cloaked requests/s (offered {:.0} requests/s, the last {:.1} ms after its due time; run {:.2} s incl. expiries)",
        r.throughput_per_s, r.offered_per_s, r.send_lag_ms, r.seconds
    );
    for (name, p) in [
        ("cloak latency", &r.cloak_latency_ms),
        ("reply latency", &r.reply_latency_ms),
        ("broker overhead", &r.broker_overhead_ms),
    ] {
        println!(
            "{name:<20} p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            p.p50, p.p90, p.p99, p.max
        );
    }
    if r.budget_exhausted > 0 {
        println!("budget exhausted     {} requests", r.budget_exhausted);
    }
    if let Some(cpu) = r.cpu_seconds {
        println!(
            "CPU of --pid        {cpu:.2} s, {:.1} us per request, {:.0} requests per CPU second",
            1e6 * cpu / r.requests.max(1) as f64,
            r.requests as f64 / cpu.max(1e-9)
        );
    }
    if let Some(cpu) = r.simulator_cpu_seconds {
        println!(
            "CPU of simulate     {cpu:.2} s, {:.1} us per request",
            1e6 * cpu / r.requests.max(1) as f64,
        );
    }
    if let Some(p) = &r.poi {
        println!(
            "POI answers          {} ({}): {} exact after refinement, {} refused; candidates p50 {}, p95 {}",
            p.answers, p.query, p.exact, p.refused, p.candidates_p50, p.candidates_p95
        );
    }
    if let Some(a) = &r.session_anonymity {
        println!(
            "session anonymity    {} sessions of {} ms, {} with >= 2 cloaked requests: common users p10 {}, p50 {}, p90 {}; below k {:.2} %, identified {:.2} %",
            a.sessions,
            a.session_ms,
            a.repeated_sessions,
            a.p10,
            a.p50,
            a.p90,
            100.0 * a.share_below_k,
            100.0 * a.share_identified
        );
    }
}
