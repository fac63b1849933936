//! Authentication and authorization: one layer in front of every gRPC service
//! (docs/architecture.md#layers, #trust).
//!
//! Every call except `grpc.health.v1.Health` is made by a [`Principal`]: the layer ([`AuthLayer`])
//! resolves the caller's credential (a bearer token in `authorization: Bearer <token>`, or the client
//! certificate under mutual TLS) against `[[auth.principals]]`, checks that the principal's role may
//! call the service at all, and puts the principal into the request's extensions as a [`Caller`].
//! Handlers never look at credentials: they ask the principal for *scope* checks only
//! ([`Principal::check_user_id`], [`Principal::check_service`], [`Principal::check_stream`]).
//!
//! Invariants:
//! - no or an unknown credential is UNAUTHENTICATED (unless `auth.required = false` and no credential
//!   was offered at all: then the caller is the unrestricted `anonymous` principal; a wrong credential
//!   is refused even then);
//! - outside the role or its scopes is PERMISSION_DENIED naming the rule (the configuration key);
//! - tokens are never stored or compared in the clear: the configuration holds their sha256 and the
//!   presented token's hash is compared in constant time with every configured hash;
//! - no token, user id or position appears in a log line or status message. Security events
//!   (authentication failures, permission denials, rate limiting) are logged with target
//!   `cloakd::security`, naming the principal, and counted with the `metrics` facade
//!   (`cloakd_auth_failures_total{reason}`, `cloakd_permission_denials_total{principal,rule}`,
//!   `cloakd_rate_limited_total{principal}`).
mod credentials;
mod layer;

use std::collections::HashSet;
use std::sync::Arc;

use tonic::Status;

/// The principal vocabulary is configuration ([`crate::config::auth`]); this module adds the checks.
pub use crate::config::auth::{ANONYMOUS, Principal, Role, StreamPattern};
pub use credentials::AuthFailure;
pub use credentials::{Authenticator, hash_token};
pub use layer::{ANALYSTS, AuthLayer, AuthService, SERVED, role_denial};

/// The principal of a call, as the auth layer put it into the request's extensions.
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<Principal>);

impl Caller {
    /// The caller of `request`. Fails closed: a request that did not pass the auth layer has none.
    #[allow(clippy::result_large_err)]
    pub fn of<T>(request: &tonic::Request<T>) -> Result<Arc<Principal>, Status> {
        request
            .extensions()
            .get::<Caller>()
            .map(|caller| Arc::clone(&caller.0))
            .ok_or_else(|| Status::unauthenticated("no authenticated principal for this call"))
    }
}

/// A refused scope or role: the principal, the rule (configuration key) and what was refused. Its
/// message never holds a user id, token or position.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: principal {principal:?} may not {action} ({rule})")]
pub struct Denial {
    pub principal: String,
    /// The request field the decision is about.
    pub field: &'static str,
    /// Short label of the rule (a metrics label: role, services, user_ids, streams, answer_binding).
    pub label: &'static str,
    /// The configuration key or contract rule.
    pub rule: String,
    pub action: String,
}

impl Denial {
    /// Logs and counts the denial, and turns it into PERMISSION_DENIED.
    pub fn into_status(self) -> Status {
        self.record();
        Status::permission_denied(self.to_string())
    }

    /// Logs and counts the denial (for denials answered in-stream rather than as a status).
    pub fn record(&self) {
        permission_denied(&self.principal, self.label, &self.rule);
    }
}

impl Principal {
    pub fn anonymous() -> Principal {
        Principal {
            name: ANONYMOUS.to_string(),
            role: None,
            services: Vec::new(),
            user_ids: HashSet::new(),
            streams: Vec::new(),
        }
    }

    pub fn is_anonymous(&self) -> bool {
        self.role.is_none()
    }

    /// Whether the principal holds one of `roles` (the anonymous principal holds all).
    pub fn has_role(&self, roles: &[Role]) -> bool {
        match self.role {
            None => true,
            Some(role) => roles.contains(&role),
        }
    }

    fn denial(&self, field: &'static str, label: &'static str, action: String) -> Denial {
        Denial {
            principal: self.name.clone(),
            field,
            label,
            rule: format!("auth.principals.{label} of {:?}", self.name),
            action,
        }
    }

    /// A mobile principal submits only for its `user_ids`. The denial does not repeat the user id.
    pub fn check_user_id(&self, user_id: &str) -> Result<(), Denial> {
        if self.is_anonymous() || self.user_ids.contains(user_id) {
            Ok(())
        } else {
            Err(self.denial(
                "user_id",
                "user_ids",
                "submit for a user id outside its user_ids".into(),
            ))
        }
    }

    /// A provider subscribes to and answers for its `services` only.
    pub fn check_service(&self, service: &str) -> Result<(), Denial> {
        if self.is_anonymous() || self.services.iter().any(|s| s == service) {
            Ok(())
        } else {
            Err(self.denial("service", "services", format!("serve service {service:?}")))
        }
    }

    /// A producer or consumer uses its `streams` only.
    pub fn check_stream(&self, stream: &str) -> Result<(), Denial> {
        if self.is_anonymous() || self.streams.iter().any(|p| p.matches(stream)) {
            Ok(())
        } else {
            Err(self.denial("stream", "streams", format!("use stream {stream:?}")))
        }
    }
}

/// Target of security event log lines.
pub const SECURITY_TARGET: &str = "cloakd::security";

/// A caller was refused before any principal was resolved. `reason` is a short fixed label.
pub fn authentication_failed(reason: &'static str, peer: Option<std::net::SocketAddr>) {
    tracing::warn!(
        target: SECURITY_TARGET,
        event = "authentication_failed",
        reason,
        peer = peer.map(|p| p.to_string()).unwrap_or_default(),
        "authentication failed"
    );
    metrics::counter!("cloakd_auth_failures_total", "reason" => reason).increment(1);
}

/// A principal was refused by a role or scope rule.
pub fn permission_denied(principal: &str, label: &'static str, rule: &str) {
    tracing::warn!(
        target: SECURITY_TARGET,
        event = "permission_denied",
        principal,
        rule,
        "permission denied"
    );
    metrics::counter!(
        "cloakd_permission_denials_total",
        "principal" => principal.to_string(),
        "rule" => label
    )
    .increment(1);
}

/// A principal went past its request rate: every refused request is counted; the log line is
/// written for the first refusal of a burst (`first`), so an abusive client cannot flood the log.
pub fn rate_limited_request(principal: &str, limit_key: &'static str, first: bool) {
    if first {
        tracing::warn!(
            target: SECURITY_TARGET,
            event = "rate_limited",
            principal,
            limit = limit_key,
            "rate limited (further refusals of this burst are counted, not logged)"
        );
    }
    metrics::counter!("cloakd_rate_limited_total", "principal" => principal.to_string())
        .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mobile() -> Principal {
        Principal {
            name: "app".into(),
            role: Some(Role::Mobile),
            services: vec![],
            user_ids: ["alice".to_string()].into_iter().collect(),
            streams: vec![],
        }
    }

    #[test]
    fn scopes_bind_user_ids_services_and_streams() {
        let m = mobile();
        assert!(m.check_user_id("alice").is_ok());
        let denial = m.check_user_id("mallory").unwrap_err();
        assert!(!denial.to_string().contains("mallory"), "{denial}");
        assert!(denial.to_string().contains("auth.principals.user_ids"));
        let p = Principal {
            name: "lbs".into(),
            role: Some(Role::Provider),
            services: vec!["poi".into()],
            user_ids: HashSet::new(),
            streams: vec![StreamPattern::parse("orders*"), StreamPattern::parse("x")],
        };
        assert!(p.check_service("poi").is_ok());
        assert!(p.check_service("traffic").is_err());
        assert!(p.check_stream("orders-eu").is_ok());
        assert!(p.check_stream("x").is_ok());
        assert!(p.check_stream("xy").is_err());
        let anonymous = Principal::anonymous();
        assert!(anonymous.check_user_id("anyone").is_ok());
        assert!(anonymous.has_role(&[Role::Analyst]));
        assert!(!p.has_role(&[Role::Mobile]));
    }

    #[test]
    fn roles_round_trip() {
        for role in Role::ALL {
            assert_eq!(Role::parse(role.as_str()), Some(role));
        }
        assert_eq!(Role::parse("root"), None);
    }
}
