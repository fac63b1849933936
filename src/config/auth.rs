//! `[auth]` and `[[auth.principals]]`: who may call, with which role and scopes, by which credential
//! (a token's sha256 or a client certificate's DNS name). The principal vocabulary ([`Role`],
//! [`StreamPattern`], [`Principal`]) is configuration: it is defined here, and [`crate::auth`] adds
//! the checks a handler asks of a principal.

use std::collections::HashSet;

use serde::Deserialize;

use super::{ConfigError, invalid};

/// What a principal is allowed to do, in the words of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Submits location requests for its `user_ids`.
    Mobile,
    /// Subscribes to and answers cloaked requests of its `services`.
    Provider,
    /// Publishes transactions to its `streams`.
    Producer,
    /// Reads released windows of its `streams`.
    Consumer,
    /// Runs table jobs and evaluations.
    Analyst,
    /// Runs the daemon: table jobs, evaluations and any operator service.
    Operator,
}

impl Role {
    pub const ALL: [Role; 6] = [
        Role::Mobile,
        Role::Provider,
        Role::Producer,
        Role::Consumer,
        Role::Analyst,
        Role::Operator,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Mobile => "mobile",
            Role::Provider => "provider",
            Role::Producer => "producer",
            Role::Consumer => "consumer",
            Role::Analyst => "analyst",
            Role::Operator => "operator",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == text)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stream-name scope: an exact name, or a prefix when written with a trailing `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamPattern {
    Exact(String),
    Prefix(String),
}

impl StreamPattern {
    pub fn parse(text: &str) -> StreamPattern {
        match text.strip_suffix('*') {
            Some(prefix) => StreamPattern::Prefix(prefix.to_string()),
            None => StreamPattern::Exact(text.to_string()),
        }
    }

    pub fn matches(&self, stream: &str) -> bool {
        match self {
            StreamPattern::Exact(name) => name == stream,
            StreamPattern::Prefix(prefix) => stream.starts_with(prefix.as_str()),
        }
    }
}

/// A caller: a configured principal with one role and its scopes, or `anonymous` (no credential,
/// allowed only when `auth.required = false`), which has every role and no scope limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    /// Shows up in logs and metrics; never a token.
    pub name: String,
    /// `None` for the anonymous principal.
    pub role: Option<Role>,
    /// Provider: services it may subscribe to and answer for.
    pub services: Vec<String>,
    /// Mobile: user ids it may submit for.
    pub user_ids: HashSet<String>,
    /// Producer / consumer: stream names it may use.
    pub streams: Vec<StreamPattern>,
}

/// Name of the principal of calls without a credential when `auth.required = false`.
pub const ANONYMOUS: &str = "anonymous";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAuth {
    pub required: bool,
    #[serde(default)]
    pub principals: Vec<RawPrincipal>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrincipal {
    pub name: String,
    pub role: String,
    pub token_sha256: Option<String>,
    pub cert_dns_name: Option<String>,
    pub services: Option<Vec<String>>,
    pub user_ids: Option<Vec<String>>,
    pub streams: Option<Vec<String>>,
}

/// `[auth]`: whether a credential is required, and the principals.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub required: bool,
    pub principals: Vec<PrincipalConfig>,
}

/// One `[[auth.principals]]` entry: the principal and how it proves who it is.
#[derive(Debug, Clone)]
pub struct PrincipalConfig {
    pub principal: Principal,
    pub token_sha256: Option<[u8; 32]>,
    pub cert_dns_name: Option<rustls_pki_types::DnsName<'static>>,
}

impl RawAuth {
    pub(super) fn validate(self, location_services: &[String]) -> Result<AuthConfig, ConfigError> {
        let mut principals: Vec<PrincipalConfig> = Vec::new();
        for (i, raw) in self.principals.into_iter().enumerate() {
            let key = |k: &str| format!("auth.principals[{i}].{k}");
            let name = raw.name.trim().to_string();
            if name.is_empty() || name == ANONYMOUS {
                return Err(invalid(
                    &key("name"),
                    format!("must be non-empty and not {:?}", ANONYMOUS),
                ));
            }
            if principals.iter().any(|p| p.principal.name == name) {
                return Err(invalid(&key("name"), format!("{name:?} is used twice")));
            }
            let role = Role::parse(&raw.role).ok_or_else(|| {
                invalid(
                    &key("role"),
                    format!(
                        "must be one of mobile, provider, producer, consumer, analyst, operator (got {:?})",
                        raw.role
                    ),
                )
            })?;
            let token_sha256 = match &raw.token_sha256 {
                None => None,
                Some(text) => {
                    let mut hash = [0u8; 32];
                    hex::decode_to_slice(text.trim(), &mut hash).map_err(|_| {
                        invalid(
                            &key("token_sha256"),
                            "must be 64 hex digits (the output of `cloakd auth hash-token`)",
                        )
                    })?;
                    if principals.iter().any(|p| p.token_sha256 == Some(hash)) {
                        return Err(invalid(
                            &key("token_sha256"),
                            "two principals share this token",
                        ));
                    }
                    Some(hash)
                }
            };
            let cert_dns_name = raw
                .cert_dns_name
                .as_deref()
                .map(|n| {
                    rustls_pki_types::DnsName::try_from(n.to_string()).map_err(|_| {
                        invalid(&key("cert_dns_name"), format!("{n:?} is not a DNS name"))
                    })
                })
                .transpose()?;
            if token_sha256.is_none() && cert_dns_name.is_none() {
                return Err(invalid(
                    &key("token_sha256"),
                    "a principal needs token_sha256 or cert_dns_name",
                ));
            }
            let scope = |field: &str, values: Option<Vec<String>>, for_roles: &[Role]| match (
                values,
                for_roles.contains(&role),
            ) {
                (None, false) => Ok(Vec::new()),
                (Some(_), false) => Err(invalid(
                    &key(field),
                    format!("does not apply to role {role}"),
                )),
                (None, true) => Err(invalid(
                    &key(field),
                    format!("role {role} needs {field} (an empty scope allows nothing)"),
                )),
                (Some(v), true) if v.iter().any(|s| s.trim().is_empty()) => {
                    Err(invalid(&key(field), "entries must not be empty"))
                }
                (Some(v), true) => Ok(v),
            };
            let services = scope("services", raw.services, &[Role::Provider])?;
            if let Some(unknown) = services.iter().find(|s| !location_services.contains(s)) {
                return Err(invalid(
                    &key("services"),
                    format!("{unknown:?} is not in location.services"),
                ));
            }
            let user_ids = scope("user_ids", raw.user_ids, &[Role::Mobile])?;
            let streams = scope("streams", raw.streams, &[Role::Producer, Role::Consumer])?;
            principals.push(PrincipalConfig {
                principal: Principal {
                    name,
                    role: Some(role),
                    services,
                    user_ids: user_ids.into_iter().collect(),
                    streams: streams.iter().map(|s| StreamPattern::parse(s)).collect(),
                },
                token_sha256,
                cert_dns_name,
            });
        }
        if self.required && principals.is_empty() {
            return Err(invalid(
                "auth.principals",
                "auth.required = true needs at least one principal",
            ));
        }
        Ok(AuthConfig {
            required: self.required,
            principals,
        })
    }
}
