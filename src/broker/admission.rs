//! Admission: the one place that decides whether a request the handlers validated may enter the
//! actor, here or, in a cluster, at the replica owning its cell. A principal past
//! `max_requests_per_s_per_principal` (token bucket on tokio's clock), a broker holding
//! `max_pending` requests, or a stream holding `max_pending_per_stream` gets `Rejected` with
//! RESOURCE_EXHAUSTED naming the key (a request another replica is to cloak is also held to the
//! stream's requests there and to the `max_pending` requests the broker waits for from other
//! replicas); a user with the same request number pending here or at another replica gets
//! ALREADY_EXISTS. An admitted request holds its (user, request number) key until it leaves, and is
//! cloaked here ([`super::cloaking`]) or at its cell's owner ([`super::replicas`]), where a
//! forwarded request is admitted again through [`Broker::submit`]. PRESENCE and GEO_IND requests
//! are answered at once, so only the rate limit applies to them.
//!
//! Not here: the field rules (the handlers' validation), and what a replica checks before handing
//! its broker a request another replica sent it (cell ownership, service, room on the command
//! channel: `replicas/mod.rs`; room on a provider queue for a relayed request: `relay_broker.rs`).
//!
//! Invariant: a refused request leaves no state behind (no pending entry, no engine call).
use std::collections::HashSet;
use std::sync::Arc;

use tonic::Code;

use super::Broker;
use super::message::{AdmittedRequest, ClientId, Rejection};
use super::rate::{RateLimiter, Take};
use crate::config::CloakModel;
use crate::location::UserKey;
use crate::telemetry::catalog;

/// Admission's state: the principals' rate buckets, the key of each user id, and the
/// (user, request number) pairs held by requests pending here or at their cell's owner.
#[derive(Default)]
pub(super) struct AdmissionState {
    rate_limiter: RateLimiter,
    /// Keyed hash (random key per broker) giving each user id the same key for the broker's lifetime,
    /// also while he has nothing pending, as memorized anonymity sets need.
    user_keys: std::hash::RandomState,
    /// foldhash: the user key is a keyed hash the client cannot predict.
    pending_keys: HashSet<(UserKey, u64), foldhash::fast::RandomState>,
}

impl AdmissionState {
    /// Lets a second request of `user` numbered `request_no` be admitted again (the first one
    /// left: forwarded, expired, rejected, withdrawn, or cloaked at its cell's owner).
    pub(super) fn release(&mut self, user: UserKey, request_no: u64) {
        self.pending_keys.remove(&(user, request_no));
    }
}

impl Broker {
    pub(super) fn submit(&mut self, client: ClientId, request: AdmittedRequest) {
        let request_no = request.request_no;
        let Some(state) = self.clients.get(&client) else {
            return;
        };
        if let Some(rate) = self.cfg.max_requests_per_s_per_principal
            && state.rate_limited
        {
            let now = tokio::time::Instant::now();
            if let Take::Refused { first } =
                self.admission
                    .rate_limiter
                    .take(&state.principal, rate, now)
            {
                let principal = Arc::clone(&state.principal);
                crate::auth::rate_limited_request(
                    &principal,
                    "location.max_requests_per_s_per_principal",
                    first,
                );
                let rejection = Rejection::exhausted(
                    "request_no",
                    format!(
                        "principal {principal:?} is past its {rate} requests/s (location.max_requests_per_s_per_principal)"
                    ),
                );
                return self.send(client, rejection.to_event(request_no));
            }
        }
        if request.model == CloakModel::Presence {
            return self.submit_presence(client, request);
        }
        if request.model == CloakModel::GeoInd {
            return self.submit_geo_ind(client, request);
        }
        if self.cloaking.pending.len() >= self.cfg.max_pending {
            let rejection = Rejection::exhausted(
                "request_no",
                format!(
                    "the broker already holds {} pending requests (location.max_pending)",
                    self.cloaking.pending.len()
                ),
            );
            return self.reject(client, request_no, &rejection);
        }
        if state.pending.len() >= self.cfg.max_pending_per_stream {
            let rejection = Rejection::exhausted(
                "request_no",
                format!(
                    "this stream already has {} pending requests (location.max_pending_per_stream)",
                    state.pending.len()
                ),
            );
            return self.reject(client, request_no, &rejection);
        }
        // Cloaked here, or by the replica owning the request's cell ([`super::replicas`]), which
        // is held to the limits of the requests other replicas cloak too.
        let elsewhere = self.replicas.link.as_ref().and_then(|link| {
            let forwarded_here = self
                .clients
                .get(&client)
                .is_none_or(|state| state.events.is_replica());
            link.owner_elsewhere(forwarded_here, request.lat, request.lon)
        });
        if elsewhere.is_some()
            && let Some(rejection) = self.remote_limits(client)
        {
            return self.reject(client, request_no, &rejection);
        }
        let user = self.user_key(&request.user_id);
        if !self.admission.pending_keys.insert((user, request_no)) {
            return self.reject(client, request_no, &already_pending(request_no));
        }
        match elsewhere {
            Some(owner) => self.send_remote(client, user, request, owner),
            None => self.cloak_here(client, user, request),
        }
    }

    /// The limits of a request another replica is to cloak: the stream's requests held here and
    /// there against `max_pending_per_stream`, and those the broker waits for from other replicas
    /// against `max_pending`.
    fn remote_limits(&self, client: ClientId) -> Option<Rejection> {
        let held = self.replicas.remote.awaited(client)
            + self.clients.get(&client).map_or(0, |s| s.pending.len());
        if held >= self.cfg.max_pending_per_stream {
            return Some(Rejection::exhausted(
                "request_no",
                format!(
                    "this stream already has {held} pending requests (location.max_pending_per_stream)"
                ),
            ));
        }
        if self.replicas.remote.len() >= self.cfg.max_pending {
            return Some(Rejection::exhausted(
                "request_no",
                format!(
                    "the broker already waits for {} requests other replicas cloak (location.max_pending)",
                    self.replicas.remote.len()
                ),
            ));
        }
        None
    }

    /// Answers a request with `Rejected`, counting it by field and code.
    pub(super) fn reject(&mut self, client: ClientId, request_no: u64, rejection: &Rejection) {
        self.count_rejection(rejection);
        self.send(client, rejection.to_event(request_no));
    }

    /// Counts a rejection by field and code (every `Rejected` the broker sends).
    pub(super) fn count_rejection(&self, rejection: &Rejection) {
        self.metrics.rejected.increment(1);
        metrics::counter!(
            catalog::LOCATION_REJECTIONS,
            "field" => rejection.field,
            "code" => crate::telemetry::grpc_layer::code_name(rejection.code),
        )
        .increment(1);
    }

    /// The broker-lifetime key of a user id (a keyed hash, so no table of user ids is kept for it).
    pub(super) fn user_key(&self, user_id: &str) -> UserKey {
        std::hash::BuildHasher::hash_one(&self.admission.user_keys, user_id)
    }
}

/// The refusal of a request whose user has one of the same number pending (here or, forwarded,
/// at its cell's owner).
fn already_pending(request_no: u64) -> Rejection {
    Rejection {
        field: "request_no",
        reason: format!("the user already has request {request_no} pending"),
        code: Code::AlreadyExists,
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::super::testing::{Events, Fixture, config, drain, request};
    use crate::proto::location_event::Outcome;

    /// More users than any test here submits: nothing is cloaked, every admitted request stays pending.
    const K: u32 = 20;

    /// The one rejection a stream got: (field, code, reason).
    fn one_rejection(events: &mut Events) -> (String, Code, String) {
        let (outcomes, ended) = drain(events);
        assert!(ended.is_none(), "the stream goes on after a rejection");
        match outcomes.as_slice() {
            [Outcome::Rejected(r)] => (r.field.clone(), Code::from(r.code), r.reason.clone()),
            other => panic!("expected one rejection, got {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_rate_limited_principal_past_its_rate_is_refused_until_the_bucket_refills() {
        let mut cfg = config();
        cfg.max_requests_per_s_per_principal = Some(2.0);
        let mut f = Fixture::new(cfg);
        let mut limited = f.open(1, "app", true);
        let mut exempt = f.open(2, "app", false);
        for n in 0..3 {
            f.submit(1, request(&format!("u{n}"), n, K));
            f.submit(2, request(&format!("v{n}"), n, K));
        }
        let (field, code, reason) = one_rejection(&mut limited);
        assert_eq!(
            (field.as_str(), code),
            ("request_no", Code::ResourceExhausted)
        );
        assert!(
            reason.contains("location.max_requests_per_s_per_principal"),
            "{reason}"
        );
        assert!(
            drain(&mut exempt).0.is_empty(),
            "a stream not held to the rate"
        );
        // The refused request left nothing behind.
        assert_eq!(f.broker.cloaking.pending.len(), 5);
        assert_eq!(f.broker.clients[&1].pending.len(), 2);

        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        f.submit(1, request("u3", 3, K));
        assert!(drain(&mut limited).0.is_empty(), "the bucket refilled");
        assert_eq!(f.broker.cloaking.pending.len(), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn the_broker_and_each_stream_hold_at_most_their_pending_limits() {
        let mut cfg = config();
        cfg.max_pending = 3;
        cfg.max_pending_per_stream = 2;
        let mut f = Fixture::new(cfg);
        let mut a = f.open(1, "app", false);
        let mut b = f.open(2, "app", false);
        for n in 0..3 {
            f.submit(1, request(&format!("a{n}"), n, K));
        }
        let (field, code, reason) = one_rejection(&mut a);
        assert_eq!(
            (field.as_str(), code),
            ("request_no", Code::ResourceExhausted)
        );
        assert!(
            reason.contains("(location.max_pending_per_stream)"),
            "{reason}"
        );

        f.submit(2, request("b0", 0, K));
        f.submit(2, request("b1", 1, K));
        let (_, code, reason) = one_rejection(&mut b);
        assert_eq!(code, Code::ResourceExhausted);
        assert!(
            reason.contains("3 pending requests (location.max_pending)"),
            "{reason}"
        );
        assert_eq!(f.broker.cloaking.pending.len(), 3);
        assert_eq!(f.broker.admission.pending_keys.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_user_with_that_request_number_pending_is_refused_already_exists() {
        let mut f = Fixture::new(config());
        let mut first = f.open(1, "app", false);
        let mut second = f.open(2, "app", false);
        f.submit(1, request("u", 4, K));
        f.submit(2, request("u", 4, K));
        let (field, code, reason) = one_rejection(&mut second);
        assert_eq!((field.as_str(), code), ("request_no", Code::AlreadyExists));
        assert_eq!(reason, "the user already has request 4 pending");
        // Another number of the same user, or the same number of another user, is admitted.
        f.submit(2, request("u", 5, K));
        f.submit(2, request("w", 4, K));
        assert!(drain(&mut first).0.is_empty());
        assert!(drain(&mut second).0.is_empty());
        assert_eq!(f.broker.cloaking.pending.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_of_a_stream_that_is_gone_is_not_admitted() {
        let mut f = Fixture::new(config());
        f.submit(9, request("u", 1, K));
        assert!(f.broker.cloaking.pending.is_empty());
        assert!(f.broker.admission.pending_keys.is_empty());
    }
}
