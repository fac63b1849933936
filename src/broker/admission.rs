//! Admission: whether a request the handlers validated may enter the actor. A principal past
//! `max_requests_per_s_per_principal` (token bucket on tokio's clock), a broker holding
//! `max_pending` requests, or a stream holding `max_pending_per_stream` gets `Rejected` with
//! RESOURCE_EXHAUSTED naming the key; a user with the same request number pending gets
//! ALREADY_EXISTS. An admitted request is cloaked here or at its cell's owner ([`super::remote`]).
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

