//! The tower layer in front of every service: resolves the caller (see [`Authenticator`]), applies the
//! role rule of the called service, and hands the principal to the handler as a [`Caller`] extension.
//!
//! Role rules, by gRPC service (the first path segment):
//! - `grpc.health.v1.Health`: open, no credential needed (probes);
//! - server reflection: any authenticated principal (it only describes the public contract);
//! - `LocationBroker`: mobile; `LbsGateway`: provider; `TransactionIngest`: producer;
//!   `ReleaseFeed`: consumer; `TableAnonymizer`, `TableEvaluator`: analyst or operator;
//! - any other service: operator only.
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use super::{Authenticator, Caller, Denial, Principal, Role};
use crate::proto;

/// Who may call a service.
#[derive(Debug, Clone, PartialEq)]
enum Rule {
    Open,
    AnyPrincipal,
    Roles(&'static [Role]),
}

/// The roles of table work (TableAnonymizer, TableEvaluator and the workbench's API).
pub const ANALYSTS: &[Role] = &[Role::Analyst, Role::Operator];

/// The cloakd services the daemon serves (health and reflection aside), each with the roles that
/// may call it: the one list, which the daemon also reports health for. Names come from the
/// generated server modules, so no service type is needed to read them.
pub const SERVED: &[(&str, &[Role])] = &[
    (proto::location_broker_server::SERVICE_NAME, &[Role::Mobile]),
    (proto::lbs_gateway_server::SERVICE_NAME, &[Role::Provider]),
    (
        proto::transaction_ingest_server::SERVICE_NAME,
        &[Role::Producer],
    ),
    (proto::release_feed_server::SERVICE_NAME, &[Role::Consumer]),
    (proto::table_anonymizer_server::SERVICE_NAME, ANALYSTS),
    (proto::table_evaluator_server::SERVICE_NAME, ANALYSTS),
];

fn rule_for(service: &str) -> Rule {
    match service {
        "grpc.health.v1.Health" => Rule::Open,
        "grpc.reflection.v1.ServerReflection" | "grpc.reflection.v1alpha.ServerReflection" => {
            Rule::AnyPrincipal
        }
        s => match SERVED.iter().find(|(name, _)| *name == s) {
            Some((_, roles)) => Rule::Roles(roles),
            None => Rule::Roles(&[Role::Operator]),
        },
    }
}

/// Applies authentication and the role rules to every call.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    authenticator: Arc<Authenticator>,
}

impl AuthLayer {
    pub fn new(authenticator: Arc<Authenticator>) -> AuthLayer {
        AuthLayer { authenticator }
    }
}

impl<S> tower::Layer<S> for AuthLayer {
    type Service = AuthService<S>;
    fn layer(&self, inner: S) -> AuthService<S> {
        AuthService {
            inner,
            authenticator: Arc::clone(&self.authenticator),
        }
    }
}

/// The service [`AuthLayer`] wraps around the router.
#[derive(Debug, Clone)]
pub struct AuthService<S> {
    inner: S,
    authenticator: Arc<Authenticator>,
}

type BoxFuture<T, E> = Pin<Box<dyn std::future::Future<Output = Result<T, E>> + Send>>;

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for AuthService<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<ReqBody>) -> Self::Future {
        // The clone that was driven to readiness serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let service = request
            .uri()
            .path()
            .trim_start_matches('/')
            .split('/')
            .next()
            .unwrap_or("");
        let rule = rule_for(service);
        if rule == Rule::Open {
            return Box::pin(inner.call(request));
        }
        let (peer, certs) = connection_of(&request);
        let principal = match self.authenticator.authenticate(
            request.headers(),
            certs.as_deref().map(Vec::as_slice),
            peer,
        ) {
            Ok(principal) => principal,
            Err(failure) => {
                let response = failure.to_status().into_http();
                return Box::pin(async move { Ok(response) });
            }
        };
        if let Rule::Roles(roles) = rule
            && !principal.has_role(roles)
        {
            let response = role_denial(&principal, service, roles)
                .into_status()
                .into_http();
            return Box::pin(async move { Ok(response) });
        }
        request.extensions_mut().insert(Caller(principal));
        Box::pin(inner.call(request))
    }
}

type PeerCerts = Arc<Vec<rustls_pki_types::CertificateDer<'static>>>;

/// The peer address and, under TLS, its certificate chain.
fn connection_of<B>(
    request: &http::Request<B>,
) -> (Option<std::net::SocketAddr>, Option<PeerCerts>) {
    let extensions = request.extensions();
    if let Some(tls) = extensions.get::<TlsConnectInfo<TcpConnectInfo>>() {
        return (tls.get_ref().remote_addr(), tls.peer_certs());
    }
    let peer = extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr);
    (peer, None)
}

/// The denial of a principal outside `roles` calling `service`.
pub fn role_denial(principal: &Principal, service: &str, roles: &[Role]) -> Denial {
    let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
    Denial {
        principal: principal.name.clone(),
        field: "role",
        label: "role",
        rule: format!(
            "auth.principals.role: {service} needs role {}",
            names.join(" or ")
        ),
        action: format!(
            "call {service} as role {}",
            principal.role.map(Role::as_str).unwrap_or("anonymous")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_service_has_its_roles() {
        assert_eq!(rule_for("grpc.health.v1.Health"), Rule::Open);
        assert_eq!(
            rule_for("cloakd.v1.LocationBroker"),
            Rule::Roles(&[Role::Mobile])
        );
        assert_eq!(
            rule_for("cloakd.v1.LbsGateway"),
            Rule::Roles(&[Role::Provider])
        );
        assert_eq!(
            rule_for("cloakd.v1.TransactionIngest"),
            Rule::Roles(&[Role::Producer])
        );
        assert_eq!(
            rule_for("cloakd.v1.ReleaseFeed"),
            Rule::Roles(&[Role::Consumer])
        );
        assert_eq!(
            rule_for("cloakd.v1.TableAnonymizer"),
            Rule::Roles(&[Role::Analyst, Role::Operator])
        );
        assert_eq!(
            rule_for("cloakd.v1.TableEvaluator"),
            Rule::Roles(&[Role::Analyst, Role::Operator])
        );
        assert_eq!(rule_for("something.Else"), Rule::Roles(&[Role::Operator]));
    }
}
