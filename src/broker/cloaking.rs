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
use rand::Rng;

use super::message::{
    AdmittedRequest, AdmittedUpdate, ClientId, Rejection, ReportResult, to_proto_box,
};
use super::{Broker, Delivery, PendingEntry, already_pending};
use crate::location::presence::PresenceError;
use crate::location::{
    CloakRequest, CloakedGroup, Outcome, PresenceOutcome, PresenceRequest, RequestId,
};
use crate::proto::{self, LocationEvent, location_event};

impl Broker {
    /// Feeds a request to this replica's engine.
    pub(super) fn cloak_here(&mut self, client: ClientId, request: AdmittedRequest) {
        let request_no = request.request_no;
        let user = self.user_key(&request.user_id);
        if !self.pending_keys.insert((user, request_no)) {
            return self.reject(client, request_no, &already_pending(request_no));
        }
        // The request's position is its user's latest for the PRESENCE model too; when the presence
        // table is full it is simply not recorded (this request does not depend on it).
        let _ = self
            .presence
            .update(user, request.lat, request.lon, self.clock.now_ms());
        let id = self.next_request_id;
        self.next_request_id += 1;
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
        self.pending.insert(
            id,
            PendingEntry {
                client,
                request_no,
                user,
                service: request.service,
                k: request.k,
                payload: request.payload,
                deadline_ms,
                fallback: request.fallback_epsilon_per_km.map(|epsilon_per_km| {
                    super::geo_ind::Fallback {
                        lat: request.lat,
                        lon: request.lon,
                        epsilon_per_km,
                        budget_user,
                    }
                }),
            },
        );
        if let Some(state) = self.clients.get_mut(&client) {
            state.pending.insert(id);
        }
        let mut outcomes = std::mem::take(&mut self.outcomes);
        let result = self.engine.submit(cloak, &mut outcomes);
        self.dispatch(&mut outcomes);
        self.outcomes = outcomes;
        if let Err(err) = result {
            // The service validated already; the engine's own check is the last line of defence.
            if let Some(entry) = self.take_pending(id) {
                let rejection = Rejection::invalid("request", err.to_string());
                self.reject(entry.client, entry.request_no, &rejection);
            }
        }
    }

    pub(super) fn expire(&mut self) {
        let mut outcomes = std::mem::take(&mut self.outcomes);
        self.engine.expire(self.clock.now_ms(), &mut outcomes);
        self.dispatch(&mut outcomes);
        self.outcomes = outcomes;
    }

    /// Removes a pending request from every table (not from the engine).
    pub(super) fn take_pending(&mut self, id: RequestId) -> Option<PendingEntry> {
        let entry = self.pending.remove(&id)?;
        self.pending_keys.remove(&(entry.user, entry.request_no));
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
                            self.answer_fallback(entry, fallback);
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
            .filter_map(|(id, _)| self.pending.get(id).map(|entry| entry.deadline_ms))
            .min()
            .unwrap_or(now);
        let room = max_jitter.min(earliest_deadline.saturating_sub(now));
        if room <= 0 {
            return self.forward(group);
        }
        let delay = self.jitter_rng.random_range(0..=room);
        if delay == 0 {
            return self.forward(group);
        }
        self.next_delayed += 1;
        self.delayed
            .push(std::cmp::Reverse((now + delay, self.next_delayed)));
        self.delayed_groups.insert(self.next_delayed, group);
    }

    /// Forwards the delayed groups that are due.
    pub(super) fn forward_due(&mut self) {
        let now = self.clock.now_ms();
        while let Some(&std::cmp::Reverse((due, key))) = self.delayed.peek() {
            if due > now {
                break;
            }
            self.delayed.pop();
            if let Some(group) = self.delayed_groups.remove(&key) {
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
        for (id, pseudonym) in group.members {
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
                pseudonym,
                proto::Cloaked {
                    pseudonym: pseudonym.to_string(),
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
        match self.presence.cloak(&req, now) {
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
                    region.pseudonym,
                    proto::Cloaked {
                        pseudonym: region.pseudonym.to_string(),
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
            if let Err(err) = self.presence.update(user, update.lat, update.lon, now) {
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
