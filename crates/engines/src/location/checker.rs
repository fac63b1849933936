//! Brute-force checker of the location cloaking guarantees (test-only).
//!
//! Written separately from the engine and deliberately naive: it replays the recorded calls and their
//! outcomes against its own model (a `BTreeMap` of pending requests, pairwise checks by direct
//! comparisons, no spatial index, nothing from `engine.rs`). It only uses the public definitions of a
//! request (`CloakRequest::constraint_box`, `CloakRequest::grouping_box`, `CloakRequest::deadline_ms`). It checks:
//! - every accepted request gets exactly one outcome (a group membership or `Expired`), unless it was
//!   cancelled while pending; invalid requests and duplicate pending ids are refused, valid ones accepted;
//! - a group's members are pending, distinct requests of distinct users, pairwise adjacent in the
//!   constraint graph, at least as many as every member's k;
//! - the cloaking box holds the MBR of the members' points (so it contains each of them) and lies
//!   inside every member's constraint box (their intersection), lies inside [-90, 90] x [-180, 180]
//!   and keeps every edge at least `padding::MIN_PAD_M` off every member's coordinate (east-west at
//!   the member's latitude) ([`check_padded_box`], which checks one padded box these ways);
//! - invalid requests include tolerances below `padding::MIN_TOLERANCE_M` and constraint boxes beyond
//!   latitude +-`padding::MAX_ABS_LAT` or across the antimeridian;
//! - the interval is [earliest arrival, latest arrival], lies in every member's temporal constraint
//!   [t - dt, t + dt], and the group is forwarded (at the triggering arrival) no later than any member's
//!   deadline and not before any member arrived;
//! - `Expired` is reported only for requests whose deadline is before the call's time, and after each
//!   call no pending request is past its deadline (expiry is complete);
//! - `next_deadline` and `pending_len` match the model after every call (pseudonyms are the
//!   broker's, checked with its route table);
//! - with sessions ([`check_sessions`]): for every user and session (from the formation of his first
//!   group until `session_ms` later), the users common to all the session's groups holding a request of
//!   his number at least the largest k among those requests. [`check_with`] then also accepts an
//!   `Expired` for the request just submitted, reported before its deadline (it is never forwarded).

use std::collections::{BTreeMap, BTreeSet};

use super::{CloakRequest, GeoBox, Outcome, RequestId, SubmitError};

/// One recorded engine call with what it returned and pushed, and the engine's state afterwards.
#[derive(Debug, Clone)]
pub struct Observation {
    pub call: Call,
    pub next_deadline: Option<i64>,
    pub pending_len: usize,
}

#[derive(Debug, Clone)]
pub enum Call {
    Submit {
        req: CloakRequest,
        result: Result<(), SubmitError>,
        outcomes: Vec<Outcome>,
    },
    Expire {
        now_ms: i64,
        outcomes: Vec<Outcome>,
    },
    Cancel {
        id: RequestId,
        was_pending: bool,
    },
}

/// Counts over a checked run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Summary {
    pub accepted: usize,
    pub rejected: usize,
    pub cloaked: usize,
    pub expired: usize,
    pub cancelled: usize,
    pub groups: usize,
}

impl Summary {
    /// Cloaked / (cloaked + expired).
    pub fn success_rate(&self) -> f64 {
        let finished = self.cloaked + self.expired;
        if finished == 0 {
            0.0
        } else {
            self.cloaked as f64 / finished as f64
        }
    }
}

fn is_valid(req: &CloakRequest) -> bool {
    req.lat.is_finite()
        && req.lat >= -90.0
        && req.lat <= 90.0
        && req.lon.is_finite()
        && req.lon >= -180.0
        && req.lon <= 180.0
        && req.k >= 1
        && req.dx_m.is_finite()
        && req.dx_m >= super::padding::MIN_TOLERANCE_M
        && req.dy_m.is_finite()
        && req.dy_m >= super::padding::MIN_TOLERANCE_M
        && within_served_world(&req.constraint_box())
}

/// The constraint box within latitudes +-`padding::MAX_ABS_LAT` and longitudes [-180, 180].
fn within_served_world(b: &GeoBox) -> bool {
    let max_lat = super::padding::MAX_ABS_LAT;
    -max_lat <= b.min_lat && b.max_lat <= max_lat && -180.0 <= b.min_lon && b.max_lon <= 180.0
}

fn point_inside(b: &GeoBox, lat: f64, lon: f64) -> bool {
    b.min_lat <= lat && lat <= b.max_lat && b.min_lon <= lon && lon <= b.max_lon
}

fn box_inside(inner: &GeoBox, outer: &GeoBox) -> bool {
    outer.min_lat <= inner.min_lat
        && inner.max_lat <= outer.max_lat
        && outer.min_lon <= inner.min_lon
        && inner.max_lon <= outer.max_lon
}

/// The constraint-graph edge, straight from the definition (grouping boxes: the constraint boxes
/// less the padding margin).
fn edge(a: &CloakRequest, b: &CloakRequest) -> bool {
    let time_gap = (i128::from(a.arrival_ms) - i128::from(b.arrival_ms)).abs();
    let time_tolerance = i128::from(a.dt_ms.min(b.dt_ms));
    a.user != b.user
        && point_inside(&a.grouping_box(), b.lat, b.lon)
        && point_inside(&b.grouping_box(), a.lat, a.lon)
        && time_gap <= time_tolerance
}

struct Model {
    pending: BTreeMap<RequestId, CloakRequest>,
    /// The pending requests ordered by (deadline, id).
    by_deadline: BTreeSet<(i64, RequestId)>,
    summary: Summary,
}

impl Model {
    fn insert(&mut self, req: &CloakRequest) {
        self.by_deadline.insert((req.deadline_ms(), req.id));
        self.pending.insert(req.id, req.clone());
    }

    fn remove(&mut self, id: RequestId) -> Option<CloakRequest> {
        let req = self.pending.remove(&id)?;
        self.by_deadline.remove(&(req.deadline_ms(), id));
        Some(req)
    }

    fn expired(&mut self, id: RequestId, deadline_ms: i64, now_ms: i64) -> Result<(), String> {
        let req = self
            .remove(id)
            .ok_or_else(|| format!("Expired for request {id} which is not pending"))?;
        if req.deadline_ms() != deadline_ms {
            return Err(format!(
                "Expired {id}: deadline {deadline_ms} but request's is {}",
                req.deadline_ms()
            ));
        }
        if deadline_ms >= now_ms {
            return Err(format!(
                "request {id} expired at {now_ms} but its deadline is {deadline_ms}"
            ));
        }
        self.summary.expired += 1;
        Ok(())
    }

    fn expiry_complete(&self, now_ms: i64) -> Result<(), String> {
        match self.by_deadline.first() {
            Some(&(deadline_ms, id)) if deadline_ms < now_ms => Err(format!(
                "request {id} still pending at {now_ms} past its deadline {deadline_ms}"
            )),
            _ => Ok(()),
        }
    }

    fn group(&mut self, group: &super::CloakedGroup, forwarded_at_ms: i64) -> Result<(), String> {
        let mut members: Vec<CloakRequest> = Vec::new();
        for id in &group.members {
            let req = self
                .remove(*id)
                .ok_or_else(|| format!("group member {id} is not pending (or listed twice)"))?;
            members.push(req);
        }
        if members.is_empty() {
            return Err("empty group".into());
        }
        let ids: Vec<_> = members.iter().map(|m| m.id).collect();
        let users: BTreeSet<_> = members.iter().map(|m| m.user).collect();
        if users.len() != members.len() {
            return Err(format!("group {ids:?} has two requests of one user"));
        }
        for m in &members {
            if (members.len() as u64) < u64::from(m.k) {
                return Err(format!(
                    "group {ids:?} of size {} < k = {} of {}",
                    members.len(),
                    m.k,
                    m.id
                ));
            }
        }
        for (i, a) in members.iter().enumerate() {
            for b in &members[i + 1..] {
                if !edge(a, b) {
                    return Err(format!("{} and {} are not adjacent ({ids:?})", a.id, b.id));
                }
            }
        }
        let b = &group.cloaking_box;
        let mbr = GeoBox {
            min_lat: members.iter().map(|m| m.lat).fold(f64::INFINITY, f64::min),
            max_lat: members
                .iter()
                .map(|m| m.lat)
                .fold(f64::NEG_INFINITY, f64::max),
            min_lon: members.iter().map(|m| m.lon).fold(f64::INFINITY, f64::min),
            max_lon: members
                .iter()
                .map(|m| m.lon)
                .fold(f64::NEG_INFINITY, f64::max),
        };
        // Padded: it holds the MBR and lies inside the intersection of the constraint boxes,
        // computed here by direct comparisons.
        if !box_inside(&mbr, b) {
            return Err(format!(
                "cloaking box {b:?} does not hold the MBR {mbr:?} of {ids:?}"
            ));
        }
        let limit = GeoBox {
            min_lat: members
                .iter()
                .map(|m| m.constraint_box().min_lat)
                .fold(f64::NEG_INFINITY, f64::max),
            max_lat: members
                .iter()
                .map(|m| m.constraint_box().max_lat)
                .fold(f64::INFINITY, f64::min),
            min_lon: members
                .iter()
                .map(|m| m.constraint_box().min_lon)
                .fold(f64::NEG_INFINITY, f64::max),
            max_lon: members
                .iter()
                .map(|m| m.constraint_box().max_lon)
                .fold(f64::INFINITY, f64::min),
        };
        if !box_inside(b, &limit) {
            return Err(format!(
                "cloaking box {b:?} leaves the intersection {limit:?} of the constraint boxes of {ids:?}"
            ));
        }
        // In the world, and every edge at least the padding margin off every member.
        check_padded_box(b, &members).map_err(|e| format!("{e} ({ids:?})"))?;
        let t_start = members.iter().map(|m| m.arrival_ms).min().unwrap_or(0);
        let t_end = members.iter().map(|m| m.arrival_ms).max().unwrap_or(0);
        if (group.t_start_ms, group.t_end_ms) != (t_start, t_end) {
            return Err(format!(
                "interval [{}, {}] is not [{t_start}, {t_end}] of {ids:?}",
                group.t_start_ms, group.t_end_ms
            ));
        }
        for m in &members {
            if !point_inside(b, m.lat, m.lon) {
                return Err(format!("{} outside cloaking box", m.id));
            }
            if !box_inside(b, &m.constraint_box()) {
                return Err(format!(
                    "cloaking box not inside constraint box of {}",
                    m.id
                ));
            }
            let dt = i128::from(m.dt_ms);
            let t = i128::from(m.arrival_ms);
            if i128::from(t_start) < t - dt || i128::from(t_end) > t + dt {
                return Err(format!("interval outside temporal constraint of {}", m.id));
            }
            if t_end > m.deadline_ms() || forwarded_at_ms > m.deadline_ms() {
                return Err(format!(
                    "{} forwarded at {forwarded_at_ms} (t_end {t_end}) after its deadline {}",
                    m.id,
                    m.deadline_ms()
                ));
            }
            if m.arrival_ms > forwarded_at_ms {
                return Err(format!("{} forwarded before it arrived", m.id));
            }
        }
        self.summary.cloaked += members.len();
        self.summary.groups += 1;
        Ok(())
    }
}

/// Slack of the margin check, in metres: the rounding of degrees, far below the margin itself.
const MARGIN_SLACK_M: f64 = 1e-3;

/// Checks one padded box against the members' points and constraint boxes, by direct comparisons:
/// the box lies inside [-90, 90] x [-180, 180]; every point inside `padded` with each edge at least
/// `padding::MIN_PAD_M` (less a millimetre of rounding) from it, east-west measured at the member's
/// own latitude (so no edge lies on a member's coordinate); and `padded` inside every constraint box.
pub fn check_padded_box(padded: &GeoBox, members: &[CloakRequest]) -> Result<(), String> {
    if !(padded.min_lat >= -90.0
        && padded.max_lat <= 90.0
        && padded.min_lon >= -180.0
        && padded.max_lon <= 180.0)
    {
        return Err(format!(
            "padded box {padded:?} leaves [-90, 90] x [-180, 180]"
        ));
    }
    // Metres per degree, from the mean Earth radius, written out independently of `geo`.
    let metres_per_degree = 6_371_008.8 * std::f64::consts::PI / 180.0;
    let need = super::padding::MIN_PAD_M - MARGIN_SLACK_M;
    for m in members {
        if !point_inside(padded, m.lat, m.lon) {
            return Err(format!("member {} outside padded box {padded:?}", m.id));
        }
        let per_degree_lon = metres_per_degree * m.lat.to_radians().cos();
        let gaps = [
            (m.lat - padded.min_lat) * metres_per_degree,
            (padded.max_lat - m.lat) * metres_per_degree,
            (m.lon - padded.min_lon) * per_degree_lon,
            (padded.max_lon - m.lon) * per_degree_lon,
        ];
        if let Some(gap) = gaps.iter().find(|&&gap| gap.is_nan() || gap < need) {
            return Err(format!(
                "an edge of padded box {padded:?} is {gap} m from member {}, less than {} m",
                m.id,
                super::padding::MIN_PAD_M
            ));
        }
        if !box_inside(padded, &m.constraint_box()) {
            return Err(format!(
                "padded box {padded:?} leaves the constraint box of member {}",
                m.id
            ));
        }
    }
    Ok(())
}

/// Checks a recorded run. The run should end with an `Expire` call late enough to flush every pending
/// request, so that "exactly one outcome" can be checked.
pub fn check(observations: &[Observation]) -> Result<Summary, String> {
    check_with(observations, false)
}

/// [`check`], also accepting (when `early_expiry`) an `Expired` for the request just submitted before
/// its deadline, as an engine with sessions reports a request it cannot cloak in its session.
pub fn check_with(observations: &[Observation], early_expiry: bool) -> Result<Summary, String> {
    let mut model = Model {
        pending: BTreeMap::new(),
        by_deadline: BTreeSet::new(),
        summary: Summary::default(),
    };
    for (step, observation) in observations.iter().enumerate() {
        let at = |e: String| format!("call {step}: {e}");
        match &observation.call {
            Call::Submit {
                req,
                result,
                outcomes,
            } => {
                let should_accept = is_valid(req) && !model.pending.contains_key(&req.id);
                match (result, should_accept) {
                    (Ok(()), true) => {}
                    (Err(e), false) => {
                        let duplicate = model.pending.contains_key(&req.id);
                        let right_kind = match e {
                            SubmitError::DuplicateId(id) => *id == req.id && duplicate,
                            SubmitError::Invalid { .. } => !is_valid(req),
                        };
                        if !right_kind || !outcomes.is_empty() {
                            return Err(at(format!("wrong refusal {e:?} of {req:?}")));
                        }
                        model.summary.rejected += 1;
                    }
                    (r, _) => return Err(at(format!("{req:?}: engine said {r:?}"))),
                }
                if result.is_ok() {
                    model.summary.accepted += 1;
                    let now = req.arrival_ms;
                    let mut inserted = false;
                    let mut expired_at_once = false;
                    for outcome in outcomes {
                        match outcome {
                            Outcome::Expired { id, deadline_ms }
                                if early_expiry && *id == req.id && !inserted =>
                            {
                                if *deadline_ms != req.deadline_ms() || expired_at_once {
                                    return Err(at(format!("bad early Expired of {id}")));
                                }
                                model.expiry_complete(now).map_err(at)?;
                                expired_at_once = true;
                                model.summary.expired += 1;
                            }
                            Outcome::Expired { id, deadline_ms } => {
                                if inserted {
                                    return Err(at("Expired after a group".into()));
                                }
                                model.expired(*id, *deadline_ms, now).map_err(at)?;
                            }
                            Outcome::Cloaked(group) => {
                                if expired_at_once {
                                    return Err(at("a group after the request expired".into()));
                                }
                                if !inserted {
                                    model.expiry_complete(now).map_err(at)?;
                                    model.insert(req);
                                    inserted = true;
                                }
                                model.group(group, now).map_err(at)?;
                            }
                        }
                    }
                    if !inserted && !expired_at_once {
                        model.expiry_complete(now).map_err(at)?;
                        model.insert(req);
                    }
                }
            }
            Call::Expire { now_ms, outcomes } => {
                for outcome in outcomes {
                    match outcome {
                        Outcome::Expired { id, deadline_ms } => {
                            model.expired(*id, *deadline_ms, *now_ms).map_err(at)?
                        }
                        Outcome::Cloaked(_) => return Err(at("group formed by expire".into())),
                    }
                }
                model.expiry_complete(*now_ms).map_err(at)?;
            }
            Call::Cancel { id, was_pending } => {
                let pending = model.remove(*id).is_some();
                if pending != *was_pending {
                    return Err(at(format!("cancel({id}) said {was_pending}")));
                }
                if pending {
                    model.summary.cancelled += 1;
                }
            }
        }
        let next_deadline = model
            .by_deadline
            .first()
            .map(|&(deadline_ms, _)| deadline_ms);
        if observation.next_deadline != next_deadline {
            return Err(at(format!(
                "next_deadline {:?}, expected {next_deadline:?}",
                observation.next_deadline
            )));
        }
        if observation.pending_len != model.pending.len() {
            return Err(at(format!(
                "pending_len {}, expected {}",
                observation.pending_len,
                model.pending.len()
            )));
        }
    }
    if let Some(r) = model.pending.values().next() {
        return Err(format!("request {} never got an outcome", r.id));
    }
    Ok(model.summary)
}

/// What [`check_sessions`] saw: sessions with at least two groups, and the smallest intersection.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionSummary {
    pub sessions: usize,
    pub repeated_sessions: usize,
    pub smallest_repeated_intersection: Option<usize>,
}

/// Checks the memorized-anonymity-set guarantee over a recorded run, from the groups alone: sessions
/// start at a user's first group formation and last `session_ms`; within one, the intersection of the
/// user sets of his groups must hold at least the largest k of his requests in them.
pub fn check_sessions(
    observations: &[Observation],
    session_ms: i64,
) -> Result<SessionSummary, String> {
    struct Session {
        start: i64,
        common: BTreeSet<u64>,
        largest_k: u32,
        groups: usize,
    }
    let mut requests: BTreeMap<RequestId, CloakRequest> = BTreeMap::new();
    let mut sessions: BTreeMap<u64, Session> = BTreeMap::new();
    let mut summary = SessionSummary::default();
    let finish = |s: &Session, summary: &mut SessionSummary| {
        summary.sessions += 1;
        if s.groups >= 2 {
            summary.repeated_sessions += 1;
            let n = s.common.len();
            summary.smallest_repeated_intersection = Some(
                summary
                    .smallest_repeated_intersection
                    .map_or(n, |m| m.min(n)),
            );
        }
    };
    for (step, observation) in observations.iter().enumerate() {
        let Call::Submit {
            req,
            result,
            outcomes,
        } = &observation.call
        else {
            continue;
        };
        if result.is_ok() {
            requests.insert(req.id, req.clone());
        }
        let formed_at = req.arrival_ms;
        for outcome in outcomes {
            let Outcome::Cloaked(group) = outcome else {
                continue;
            };
            let members: Vec<&CloakRequest> = group
                .members
                .iter()
                .map(|id| {
                    requests
                        .get(id)
                        .ok_or(format!("call {step}: unknown member {id}"))
                })
                .collect::<Result<_, _>>()?;
            let users: BTreeSet<u64> = members.iter().map(|m| m.user).collect();
            for m in &members {
                let live = sessions
                    .get(&m.user)
                    .is_some_and(|s| formed_at < s.start + session_ms);
                if !live {
                    if let Some(old) = sessions.remove(&m.user) {
                        finish(&old, &mut summary);
                    }
                    sessions.insert(
                        m.user,
                        Session {
                            start: formed_at,
                            common: users.clone(),
                            largest_k: m.k,
                            groups: 1,
                        },
                    );
                    continue;
                }
                let Some(s) = sessions.get_mut(&m.user) else {
                    continue;
                };
                s.common = s.common.intersection(&users).copied().collect();
                s.largest_k = s.largest_k.max(m.k);
                s.groups += 1;
                if s.common.len() < s.largest_k as usize {
                    return Err(format!(
                        "call {step}: user {}'s session since {} keeps {} common users < k = {}",
                        m.user,
                        s.start,
                        s.common.len(),
                        s.largest_k
                    ));
                }
            }
        }
    }
    for s in sessions.values() {
        finish(s, &mut summary);
    }
    Ok(summary)
}
