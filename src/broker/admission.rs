//! Admission: whether a request the handlers validated may enter the actor. A principal past
//! `max_requests_per_s_per_principal` (token bucket on tokio's clock), a broker holding
//! `max_pending` requests, or a stream holding `max_pending_per_stream` gets `Rejected` with
//! RESOURCE_EXHAUSTED naming the key; a user with the same request number pending gets
//! ALREADY_EXISTS. An admitted request is cloaked here or at its cell's owner ([`super::replicas`]).
//!
//! Invariant: a refused request leaves no state behind (no pending entry, no engine call).
use std::sync::Arc;

use tonic::Code;

use super::Broker;
use super::message::{AdmittedRequest, ClientId, Rejection};
use super::rate::Take;
use crate::config::CloakModel;
use crate::location::UserKey;
use crate::telemetry::catalog;

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
            if let Take::Refused { first } = self.rate_limiter.take(&state.principal, rate, now) {
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
        if self.pending.len() >= self.cfg.max_pending {
            let rejection = Rejection::exhausted(
                "request_no",
                format!(
                    "the broker already holds {} pending requests (location.max_pending)",
                    self.pending.len()
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
        let Some(request) = self.route_to_owner(client, request) else {
            return;
        };
        self.cloak_here(client, request);
    }

    /// Answers a request with `Rejected`, counting it by field and code.
    pub(super) fn reject(&mut self, client: ClientId, request_no: u64, rejection: &Rejection) {
        self.metrics.rejected.increment(1);
        metrics::counter!(
            catalog::LOCATION_REJECTIONS,
            "field" => rejection.field,
            "code" => crate::telemetry::grpc::code_name(rejection.code),
        )
        .increment(1);
        self.send(client, rejection.to_event(request_no));
    }

    /// The broker-lifetime key of a user id (a keyed hash, so no table of user ids is kept for it).
    pub(super) fn user_key(&self, user_id: &str) -> UserKey {
        std::hash::BuildHasher::hash_one(&self.user_keys, user_id)
    }
}

/// The refusal of a request whose user has one of the same number pending (here or, forwarded,
/// at its cell's owner).
pub(super) fn already_pending(request_no: u64) -> Rejection {
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
        assert_eq!(f.broker.pending.len(), 5);
        assert_eq!(f.broker.clients[&1].pending.len(), 2);

        tokio::time::advance(std::time::Duration::from_secs(1)).await;
        f.submit(1, request("u3", 3, K));
        assert!(drain(&mut limited).0.is_empty(), "the bucket refilled");
        assert_eq!(f.broker.pending.len(), 6);
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
        assert_eq!(f.broker.pending.len(), 3);
        assert_eq!(f.broker.pending_keys.len(), 3);
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
        assert_eq!(f.broker.pending.len(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_of_a_stream_that_is_gone_is_not_admitted() {
        let mut f = Fixture::new(config());
        f.submit(9, request("u", 1, K));
        assert!(f.broker.pending.is_empty());
        assert!(f.broker.pending_keys.is_empty());
    }
}
