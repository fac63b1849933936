//! Resolving a credential to a [`Principal`]: bearer tokens by their sha256 (compared in constant
//! time against every configured hash, so neither a match nor its position leaks through timing), and
//! client certificates under mutual TLS by a DNS name the (already chain-verified) certificate is valid
//! for (`cert_dns_name`).
use std::sync::Arc;

use http::HeaderMap;
use rustls_pki_types::{CertificateDer, DnsName, ServerName};
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
}

impl AuthFailure {
    pub fn reason(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing_credential",
            AuthFailure::Malformed => "malformed_authorization",
            AuthFailure::UnknownToken => "unknown_token",
            AuthFailure::UnknownCertificate => "unknown_certificate",
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
                "client certificate: valid for no configured principal's cert_dns_name"
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
        self.entries
            .iter()
            .find(|entry| {
                entry.cert_dns_name.as_ref().is_some_and(|name| {
                    cert.verify_is_valid_for_subject_name(&ServerName::DnsName(name.clone()))
                        .is_ok()
                })
            })
            .map(|entry| Arc::clone(&entry.principal))
            .ok_or(AuthFailure::UnknownCertificate)
    }
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
}
