//! Cloaking and dispatch: the actor's side of the engines. An admitted request becomes a pending
//! entry and a [`CloakRequest`] for the CliqueCloak [`Engine`](crate::location::Engine), or is
//! answered at once by the [`PresenceEngine`](crate::location::PresenceEngine); the engine's
//! outcomes are dispatched: `Expired` to the client, a cloaked group forwarded to delivery
//! ([`super::delivery`]) now or after its forwarding jitter (`location.forward_jitter_ms`).
//!
//! Invariants: a request is pending in exactly one entry until it is forwarded, expired, rejected,
//! withdrawn or answered at shutdown; a delayed group is forwarded no later than its earliest
//! member's deadline; jitter draws come from their own seeded stream, so they never shift the
//! engine's.
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::Broker;
use super::delivery::Delivery;
use super::geo_ind::Fallback;
use super::message::{
    AdmittedRequest, AdmittedUpdate, ClientId, Rejection, ReportResult, to_proto_box,
};
use crate::config::LocationConfig;
use crate::location::presence::PresenceError;
use crate::location::{
    CloakRequest, CloakedGroup, Engine, Outcome, PresenceEngine, PresenceOutcome, PresenceRequest,
    RequestId, UserKey,
};
use crate::proto::{self, LocationEvent, location_event};

/// Cloaking's state: the engines, the requests pending in the CliqueCloak engine and the groups
/// waiting out their forwarding jitter.
pub(super) struct CloakingState {
    pub(super) engine: Engine,
    /// Latest positions and reciprocal anonymity sets of the PRESENCE model.
    presence: PresenceEngine,
    next_request_id: RequestId,
    /// By the broker's own sequential id (foldhash: no key here is a client's choice).
    pub(super) pending: HashMap<RequestId, PendingEntry, foldhash::fast::RandomState>,
    outcomes: Vec<Outcome>,
    /// Groups waiting out their forwarding jitter, by (due Unix ms, key).
    delayed: BinaryHeap<Reverse<(i64, u64)>>,
    delayed_groups: HashMap<u64, CloakedGroup>,
    next_delayed: u64,
    jitter_rng: ChaCha20Rng,
}

impl CloakingState {
    pub(super) fn new(cfg: &LocationConfig, seed: u64) -> CloakingState {
        CloakingState {
            engine: Engine::new(cfg.search, seed)
                .with_index(cfg.index)
                .with_sessions(cfg.sessions),
            presence: PresenceEngine::new(
                cfg.presence,
                seed.rotate_left(32) ^ 0x9e37_79b9_7f4a_7c15,
            ),
            next_request_id: 0,
            pending: HashMap::default(),
            outcomes: Vec::new(),
            delayed: BinaryHeap::new(),
            delayed_groups: HashMap::new(),
            next_delayed: 0,
            // Its own stream from the broker's seed, so jitter does not shift the engine's draws.
            jitter_rng: ChaCha20Rng::seed_from_u64(seed ^ 0x6a09_e667_f3bc_c908),
        }
    }

    /// When the next delayed group is due (Unix ms).
    pub(super) fn next_forward(&self) -> Option<i64> {
        self.delayed.peek().map(|Reverse((due, _))| *due)
    }
}

/// A request waiting in the engine for its group.
pub(super) struct PendingEntry {
    /// The request's deadline (Unix ms): a group is forwarded no later than it, jitter included.
    pub(super) deadline_ms: i64,
    pub(super) client: ClientId,
    pub(super) request_no: u64,
    pub(super) user: UserKey,
    pub(super) service: usize,
    pub(super) k: u32,
    pub(super) payload: Vec<u8>,
    /// REQUESTS with fallback_epsilon_per_km: answered under GEO_IND at its deadline.
    pub(super) fallback: Option<Fallback>,
}

impl Broker {
    /// Feeds an admitted request, its key held ([`super::admission`]), to this replica's engine.
    pub(super) fn cloak_here(&mut self, client: ClientId, user: UserKey, request: AdmittedRequest) {
        let request_no = request.request_no;
        // The request's position is its user's latest for the PRESENCE model too; when the presence
        // table is full it is simply not recorded (this request does not depend on it).
        let _ = self
            .cloaking
            .presence
            .update(user, request.lat, request.lon, self.clock.now_ms());
        let id = self.cloaking.next_request_id;
        self.cloaking.next_request_id += 1;
        let cloak = CloakRequest {
            id,
            user,
            lat: request.lat,
            lon: request.lon,
            k: request.k,
            dx_m: request.dx_m,
            dy_m: request.dy_m,
            dt_ms: request.dt_ms,
            arrival_ms: self.clock.now_ms(),
        };
        let deadline_ms = cloak.deadline_ms();
        let budget_user = request
            .fallback_epsilon_per_km
            .and_then(|_| self.budget_user(&request.user_id));
        self.cloaking.pending.insert(
            id,
            PendingEntry {
                client,
                request_no,
                user,
                service: request.service,
                k: request.k,
                payload: request.payload,
                deadline_ms,
                fallback: request
                    .fallback_epsilon_per_km
                    .map(|epsilon_per_km| Fallback {
                        lat: request.lat,
                        lon: request.lon,
                        epsilon_per_km,
                        budget_user,
                    }),
            },
        );
        if let Some(state) = self.clients.get_mut(&client) {
            state.pending.insert(id);
        }
        let mut outcomes = std::mem::take(&mut self.cloaking.outcomes);
        let result = self.cloaking.engine.submit(cloak, &mut outcomes);
        self.dispatch(&mut outcomes);
        self.cloaking.outcomes = outcomes;
        if let Err(err) = result {
            // The service validated already; the engine's own check is the last line of defence.
            if let Some(entry) = self.take_pending(id) {
                let rejection = Rejection::invalid("request", err.to_string());
                self.reject(entry.client, entry.request_no, &rejection);
            }
        }
    }

    pub(super) fn expire(&mut self) {
        let mut outcomes = std::mem::take(&mut self.cloaking.outcomes);
        self.cloaking
            .engine
            .expire(self.clock.now_ms(), &mut outcomes);
        self.dispatch(&mut outcomes);
        self.cloaking.outcomes = outcomes;
    }

    /// Removes a pending request from every table (not from the engine).
    pub(super) fn take_pending(&mut self, id: RequestId) -> Option<PendingEntry> {
        let entry = self.cloaking.pending.remove(&id)?;
        self.admission.release(entry.user, entry.request_no);
        if let Some(state) = self.clients.get_mut(&entry.client) {
            state.pending.remove(&id);
        }
        Some(entry)
    }

    pub(super) fn dispatch(&mut self, outcomes: &mut Vec<Outcome>) {
        for outcome in outcomes.drain(..) {
            match outcome {
                Outcome::Cloaked(group) => self.forward_after_jitter(group),
                Outcome::Expired { id, deadline_ms } => {
                    if let Some(mut entry) = self.take_pending(id) {
                        if let Some(fallback) = entry.fallback.take() {
                            self.answer_fallback(entry.into_delivery(), fallback);
                            continue;
                        }
                        self.metrics.expired.increment(1);
                        let event = LocationEvent {
                            request_no: entry.request_no,
                            outcome: Some(location_event::Outcome::Expired(proto::Expired {
                                deadline_ms,
                            })),
                        };
                        let client = entry.client;
                        self.send(client, event);
                        self.maybe_close(client);
                    }
                }
            }
        }
    }

    /// Forwards `group` now, or (with `location.forward_jitter_ms`) after a random delay that ends
    /// no later than any member's deadline. Members stay pending (and answerable by shutdown or
    /// cancellation) until then.
    pub(super) fn forward_after_jitter(&mut self, group: CloakedGroup) {
        let now = self.clock.now_ms();
        let max_jitter = i64::try_from(self.cfg.forward_jitter_ms).unwrap_or(i64::MAX);
        let earliest_deadline = group
            .members
            .iter()
            .filter_map(|id| self.cloaking.pending.get(id).map(|entry| entry.deadline_ms))
            .min()
            .unwrap_or(now);
        let room = max_jitter.min(earliest_deadline.saturating_sub(now));
        if room <= 0 {
            return self.forward(group);
        }
        let delay = self.cloaking.jitter_rng.random_range(0..=room);
        if delay == 0 {
            return self.forward(group);
        }
        self.cloaking.next_delayed += 1;
        self.cloaking
            .delayed
            .push(std::cmp::Reverse((now + delay, self.cloaking.next_delayed)));
        self.cloaking
            .delayed_groups
            .insert(self.cloaking.next_delayed, group);
    }

    /// Forwards the delayed groups that are due.
    pub(super) fn forward_due(&mut self) {
        let now = self.clock.now_ms();
        while let Some(&std::cmp::Reverse((due, key))) = self.cloaking.delayed.peek() {
            if due > now {
                break;
            }
            self.cloaking.delayed.pop();
            if let Some(group) = self.cloaking.delayed_groups.remove(&key) {
                self.forward(group);
            }
        }
    }

    pub(super) fn forward(&mut self, group: CloakedGroup) {
        let cloaking_box = to_proto_box(&group.cloaking_box);
        let group_size = u32::try_from(group.members.len()).unwrap_or(u32::MAX);
        self.metrics
            .requests
            .group_size
            .record(f64::from(group_size));
        for id in group.members {
            let Some(entry) = self.take_pending(id) else {
                continue;
            };
            self.metrics
                .requests
                .relative_anonymity
                .record(f64::from(group_size) / f64::from(entry.k.max(1)));
            self.deliver(
                Delivery {
                    client: entry.client,
                    request_no: entry.request_no,
                    user: entry.user,
                    service: entry.service,
                    payload: entry.payload,
                },
                proto::Cloaked {
                    // Named by the route table.
                    pseudonym: String::new(),
                    r#box: Some(cloaking_box),
                    t_start_ms: group.t_start_ms,
                    t_end_ms: group.t_end_ms,
                    group_size,
                    reported: None,
                    retrieval_radius_m: 0.0,
                    budget_left: None,
                },
            );
        }
    }

    /// A PRESENCE request: cloaked at once into its anonymity set's region, or expired at once.
    pub(super) fn submit_presence(&mut self, client: ClientId, request: AdmittedRequest) {
        let request_no = request.request_no;
        let now = self.clock.now_ms();
        let user = self.user_key(&request.user_id);
        let req = PresenceRequest {
            user,
            lat: request.lat,
            lon: request.lon,
            k: request.k,
            dx_m: request.dx_m,
            dy_m: request.dy_m,
        };
        match self.cloaking.presence.cloak(&req, now) {
            Ok(PresenceOutcome::Cloaked(region)) => {
                let group_size = u32::try_from(region.anonymity_set.len()).unwrap_or(u32::MAX);
                // The anonymity set is the presence model's group.
                let presence = &self.metrics.presence;
                presence.group_size.record(f64::from(group_size));
                presence
                    .relative_anonymity
                    .record(f64::from(group_size) / f64::from(request.k.max(1)));
                self.deliver(
                    Delivery {
                        client,
                        request_no,
                        user,
                        service: request.service,
                        payload: request.payload,
                    },
                    proto::Cloaked {
                        // Named by the route table.
                        pseudonym: String::new(),
                        r#box: Some(to_proto_box(&region.cloaking_box)),
                        t_start_ms: now,
                        t_end_ms: now,
                        group_size,
                        reported: None,
                        retrieval_radius_m: 0.0,
                        budget_left: None,
                    },
                );
            }
            Ok(PresenceOutcome::Expired(_)) => {
                self.send(
                    client,
                    LocationEvent {
                        request_no,
                        outcome: Some(location_event::Outcome::Expired(proto::Expired {
                            deadline_ms: now,
                        })),
                    },
                );
                self.maybe_close(client);
            }
            Err(err) => {
                let rejection = presence_rejection(err);
                self.send(client, rejection.to_event(request_no));
                self.maybe_close(client);
            }
        }
    }

    /// Position updates of one Report batch, applied in order; stops at the first refused one.
    pub(super) fn report(&mut self, updates: Vec<AdmittedUpdate>) -> ReportResult {
        let now = self.clock.now_ms();
        for (applied, update) in updates.into_iter().enumerate() {
            let user = self.user_key(&update.user_id);
            if let Err(err) = self
                .cloaking
                .presence
                .update(user, update.lat, update.lon, now)
            {
                return ReportResult {
                    applied,
                    refused: Some(presence_rejection(err)),
                };
            }
        }
        ReportResult {
            applied: usize::MAX,
            refused: None,
        }
    }
}

/// A refusal of the presence engine as the client sees it.
pub(super) fn presence_rejection(err: PresenceError) -> Rejection {
    match err {
        PresenceError::Invalid { field, rule } => Rejection::invalid(field, rule),
        err @ PresenceError::TooManyUsers { .. } => {
            Rejection::exhausted("user_id", err.to_string())
        }
    }
}

impl PendingEntry {
    /// Where the request goes when it is answered on its own (its GEO_IND fallback).
    fn into_delivery(self) -> Delivery {
        Delivery {
            client: self.client,
            request_no: self.request_no,
            user: self.user,
            service: self.service,
            payload: self.payload,
        }
    }
}
