//! Resolving a credential to a [`Principal`]: bearer tokens by their sha256 (compared in constant
//! time against every configured hash, so neither a match nor its position leaks through timing), and
//! client certificates under mutual TLS by the DNS names in the (already chain-verified) certificate's
//! subject alternative names (`cert_dns_name`).
//!
//! A certificate's identity is matched exactly: a SAN DNS name names a principal only if it equals that
//! principal's `cert_dns_name` (ASCII case-insensitively, as DNS names compare). A wildcard SAN such as
//! `*.example.org` is not expanded and so names no principal. A certificate whose SANs name more than
//! one configured principal is refused ([`AuthFailure::AmbiguousCertificate`]), never resolved by the
//! order of the configuration.
use std::sync::Arc;

use http::HeaderMap;
use rustls_pki_types::{CertificateDer, DnsName};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::Status;

use super::{Principal, authentication_failed};
use crate::config::AuthConfig;

/// The hex sha256 of a token, as `token_sha256` in `[[auth.principals]]` expects it.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

struct Entry {
    principal: Arc<Principal>,
    token_sha256: Option<[u8; 32]>,
    cert_dns_name: Option<DnsName<'static>>,
}

/// Why a caller could not be authenticated: a short label (a metrics label) and the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    Missing,
    Malformed,
    UnknownToken,
    UnknownCertificate,
    AmbiguousCertificate,
}

impl AuthFailure {
    pub fn reason(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing_credential",
            AuthFailure::Malformed => "malformed_authorization",
            AuthFailure::UnknownToken => "unknown_token",
            AuthFailure::UnknownCertificate => "unknown_certificate",
            AuthFailure::AmbiguousCertificate => "ambiguous_certificate",
        }
    }

    pub fn to_status(self) -> Status {
        let message = match self {
            AuthFailure::Missing => {
                "authorization: a credential is required (metadata `authorization: Bearer <token>` or a client certificate; auth.required = true)"
            }
            AuthFailure::Malformed => "authorization: must be `Bearer <token>`",
            AuthFailure::UnknownToken => "authorization: the token matches no configured principal",
            AuthFailure::UnknownCertificate => {
                "client certificate: no subject alternative name equals a configured principal's cert_dns_name (names are matched exactly; wildcards are not expanded)"
            }
            AuthFailure::AmbiguousCertificate => {
                "client certificate: its subject alternative names name several configured principals' cert_dns_name; a client certificate must name exactly one principal"
            }
        };
        Status::unauthenticated(message)
    }
}

/// Resolves credentials against the configured principals.
pub struct Authenticator {
    required: bool,
    entries: Vec<Entry>,
    anonymous: Arc<Principal>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("required", &self.required)
            .field("principals", &self.entries.len())
            .finish()
    }
}

impl Authenticator {
    pub fn new(config: &AuthConfig) -> Authenticator {
        let entries = config
            .principals
            .iter()
            .map(|p| Entry {
                principal: Arc::new(p.principal.clone()),
                token_sha256: p.token_sha256,
                cert_dns_name: p.cert_dns_name.clone(),
            })
            .collect();
        Authenticator {
            required: config.required,
            entries,
            anonymous: Arc::new(Principal::anonymous()),
        }
    }

    pub fn required(&self) -> bool {
        self.required
    }

    /// Resolves the caller from the `authorization` header, else from the peer's certificate chain
    /// (leaf first), else the anonymous principal when authentication is optional.
    pub fn authenticate(
        &self,
        headers: &HeaderMap,
        peer_certs: Option<&[CertificateDer<'static>]>,
        peer: Option<std::net::SocketAddr>,
    ) -> Result<Arc<Principal>, AuthFailure> {
        let result = self.resolve(headers, peer_certs);
        if let Err(failure) = result {
            authentication_failed(failure.reason(), peer);
        }
        result
    }

    fn resolve(
        &self,
        headers: &HeaderMap,
        peer_certs: Option<&[CertificateDer<'static>]>,
    ) -> Result<Arc<Principal>, AuthFailure> {
        if let Some(value) = headers.get(http::header::AUTHORIZATION) {
            let token = value
                .to_str()
                .ok()
                .and_then(bearer_token)
                .ok_or(AuthFailure::Malformed)?;
            return self.by_token(token).ok_or(AuthFailure::UnknownToken);
        }
        if let Some(leaf) = peer_certs.and_then(|chain| chain.first()) {
            return self.by_certificate(leaf);
        }
        if self.required {
            Err(AuthFailure::Missing)
        } else {
            Ok(Arc::clone(&self.anonymous))
        }
    }

    fn by_token(&self, token: &str) -> Option<Arc<Principal>> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        // Every entry is compared, whatever matched first.
        let mut found = None;
        for entry in &self.entries {
            if let Some(hash) = &entry.token_sha256 {
                let equal: bool = hash.ct_eq(&presented).into();
                if equal && found.is_none() {
                    found = Some(Arc::clone(&entry.principal));
                }
            }
        }
        found
    }

    fn by_certificate(
        &self,
        leaf: &CertificateDer<'static>,
    ) -> Result<Arc<Principal>, AuthFailure> {
        let cert =
            webpki::EndEntityCert::try_from(leaf).map_err(|_| AuthFailure::UnknownCertificate)?;
        let presented: Vec<&str> = cert.valid_dns_names().collect();
        principal_named_by(&self.entries, &presented)
    }
}

/// The one principal whose `cert_dns_name` equals one of the certificate's SAN DNS names `presented`
/// (exactly, ASCII case-insensitively; a wildcard SAN is compared as the literal string it is, and a
/// configured name cannot be a wildcard, so it matches nothing). Several principals named: refused.
fn principal_named_by(
    entries: &[Entry],
    presented: &[&str],
) -> Result<Arc<Principal>, AuthFailure> {
    let mut named = entries.iter().filter(|entry| {
        entry.cert_dns_name.as_ref().is_some_and(|name| {
            let name: &str = name.as_ref();
            presented.iter().any(|san| {
                !san.starts_with('*')
                    && san
                        .trim_end_matches('.')
                        .eq_ignore_ascii_case(name.trim_end_matches('.'))
            })
        })
    });
    let first = named.next().ok_or(AuthFailure::UnknownCertificate)?;
    if named.any(|other| other.principal.name != first.principal.name) {
        return Err(AuthFailure::AmbiguousCertificate);
    }
    Ok(Arc::clone(&first.principal))
}

/// The token of an `authorization` value `Bearer <token>` (scheme case-insensitive).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Role;
    use crate::config::PrincipalConfig;

    fn config(required: bool) -> AuthConfig {
        let hash: [u8; 32] = Sha256::digest(b"s3cret").into();
        AuthConfig {
            required,
            principals: vec![PrincipalConfig {
                principal: Principal {
                    name: "lbs-poi".into(),
                    role: Some(Role::Provider),
                    services: vec!["poi".into()],
                    user_ids: Default::default(),
                    streams: vec![],
                },
                token_sha256: Some(hash),
                cert_dns_name: None,
            }],
        }
    }

    fn headers(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(http::header::AUTHORIZATION, value.parse().unwrap());
        h
    }

    #[test]
    fn tokens_resolve_by_hash() {
        let auth = Authenticator::new(&config(true));
        let p = auth
            .authenticate(&headers("Bearer s3cret"), None, None)
            .unwrap();
        assert_eq!(p.name, "lbs-poi");
        assert_eq!(
            auth.authenticate(&headers("bearer  s3cret "), None, None)
                .unwrap()
                .name,
            "lbs-poi"
        );
        assert_eq!(
            auth.authenticate(&headers("Bearer wrong"), None, None),
            Err(AuthFailure::UnknownToken)
        );
        assert_eq!(
            auth.authenticate(&headers("Basic abc"), None, None),
            Err(AuthFailure::Malformed)
        );
        assert_eq!(
            auth.authenticate(&HeaderMap::new(), None, None),
            Err(AuthFailure::Missing)
        );
    }

    #[test]
    fn optional_auth_is_anonymous_without_credential_only() {
        let auth = Authenticator::new(&config(false));
        assert!(
            auth.authenticate(&HeaderMap::new(), None, None)
                .unwrap()
                .is_anonymous()
        );
        assert_eq!(
            auth.authenticate(&headers("Bearer wrong"), None, None),
            Err(AuthFailure::UnknownToken)
        );
    }

    #[test]
    fn hash_token_is_hex_sha256() {
        assert_eq!(
            hash_token("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }

    fn cert_entries(names: &[(&str, &str)]) -> Vec<Entry> {
        names
            .iter()
            .map(|(principal, dns)| Entry {
                principal: Arc::new(Principal {
                    name: (*principal).into(),
                    role: Some(Role::Provider),
                    services: vec!["poi".into()],
                    user_ids: Default::default(),
                    streams: vec![],
                }),
                token_sha256: None,
                cert_dns_name: Some(dns.to_string().try_into().unwrap()),
            })
            .collect()
    }

    #[test]
    fn certificate_names_match_exactly_and_only_one_principal() {
        let entries = cert_entries(&[("a", "a.example.org"), ("b", "b.example.org")]);
        let name = |sans: &[&str]| principal_named_by(&entries, sans).map(|p| p.name.clone());
        assert_eq!(name(&["a.example.org"]), Ok("a".to_string()));
        assert_eq!(name(&["B.Example.Org."]), Ok("b".to_string()));
        assert_eq!(
            name(&["*.example.org"]),
            Err(AuthFailure::UnknownCertificate)
        );
        assert_eq!(name(&["example.org"]), Err(AuthFailure::UnknownCertificate));
        assert_eq!(
            name(&["xa.example.org"]),
            Err(AuthFailure::UnknownCertificate)
        );
        assert_eq!(name(&[]), Err(AuthFailure::UnknownCertificate));
        assert_eq!(
            name(&["b.example.org", "a.example.org"]),
            Err(AuthFailure::AmbiguousCertificate)
        );
        assert_eq!(
            name(&["a.example.org", "other.example.net"]),
            Ok("a".to_string())
        );
    }
}
