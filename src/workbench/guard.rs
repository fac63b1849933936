//! What the workbench checks of every request before it routes it, so that no other web page can
//! read or drive it (DNS rebinding, cross-site requests, `no-cors` "simple" requests):
//!
//! - **Host**: the request's `Host` must name this listener: `localhost`, `127.0.0.1`, `[::1]` or
//!   the listener's own address, with the listener's port (without a port only when that is 80).
//!   Anything else, or no `Host`, is 403 (field `host`): a page of another site that rebinds its
//!   name to 127.0.0.1 still sends its own name.
//! - **Origin**: a state-changing request (`POST`, `PUT`, `PATCH`, `DELETE`) that carries `Origin`
//!   must come from the page itself: `http://` and the request's (allowed) `Host`; any other origin,
//!   `null` included, is 403 (field `origin`). A browser always sends `Origin` on such requests
//!   (same-origin ones too), so a request without one is not a browser's and is let through (curl,
//!   scripts: they hold the token themselves).
//! - **Content type**: a `POST`, `PUT` or `PATCH` under `/api/` must say `Content-Type:
//!   application/json` (parameters allowed) or it is 415 (field `content-type`): a cross-origin page
//!   can send a body only as `text/plain`, form data or url-encoded without a CORS preflight (which
//!   the workbench never answers with CORS headers), so a `no-cors` request cannot create a table or
//!   start a sweep even where `Origin` is missing.
//!
//! Invariants: the checks run before authentication and routing; every refusal is an
//! [`ApiError`]; a refusal's message quotes the refused value through [`crate::text::quote`].
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{Method, header};

use super::error::{ApiError, Code};
use crate::text::quote;

/// The `Host` values (and so origins) that name the workbench's listener.
#[derive(Debug, Clone)]
pub struct Allowed {
    /// Host names and addresses, lowercase, IPv6 in brackets.
    names: Vec<String>,
    port: u16,
}

impl Allowed {
    /// The names of the listener bound to `addr`.
    pub fn new(addr: SocketAddr) -> Allowed {
        let own = match addr.ip() {
            IpAddr::V4(ip) => ip.to_string(),
            IpAddr::V6(ip) => format!("[{ip}]"),
        };
        let mut names: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        if !names.contains(&own) {
            names.push(own);
        }
        Allowed {
            names,
            port: addr.port(),
        }
    }

    /// Whether `authority` (`host[:port]`) names the listener.
    pub fn host(&self, authority: &str) -> bool {
        let authority = authority.to_ascii_lowercase();
        let (name, port) = if let Some(rest) = authority.strip_prefix('[') {
            let Some((inside, after)) = rest.split_once(']') else {
                return false;
            };
            let port = match after {
                "" => None,
                p => match p.strip_prefix(':') {
                    Some(p) => Some(p),
                    None => return false,
                },
            };
            (format!("[{inside}]"), port)
        } else {
            match authority.split_once(':') {
                Some((name, port)) => (name.to_string(), Some(port)),
                None => (authority.clone(), None),
            }
        };
        let port_ok = match port {
            None => self.port == 80,
            Some(p) => p.parse::<u16>().is_ok_and(|p| p == self.port) && !p.starts_with('+'),
        };
        port_ok && self.names.contains(&name)
    }
}

/// Whether `value` (a `Content-Type`) is JSON: `application/json`, any parameters.
fn is_json(value: &str) -> bool {
    value
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// Checks one request's `Host`, `Origin` and content type (see the module documentation).
pub fn check(allowed: &Allowed, request: &Request) -> Result<(), ApiError> {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned());
    let Some(host) = host.clone().filter(|h| allowed.host(h)) else {
        return Err(ApiError::new(
            Code::PermissionDenied,
            Some("host"),
            format!(
                "host: {} does not name this workbench (rule: Host must be localhost, 127.0.0.1, [::1] or the ui.listen address, with its port {}; a name that only resolves here is refused)",
                host.as_deref().map_or("(none)".to_string(), quote),
                allowed.port
            ),
        ));
    };
    let method = request.method();
    let changes = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
    if changes && let Some(origin) = headers.get(header::ORIGIN) {
        let origin = String::from_utf8_lossy(origin.as_bytes());
        if !origin.eq_ignore_ascii_case(&format!("http://{host}")) {
            return Err(ApiError::new(
                Code::PermissionDenied,
                Some("origin"),
                format!(
                    "origin: {} is not this workbench's page (rule: a {method} carrying Origin must come from http://{})",
                    quote(&origin),
                    quote(&host)
                ),
            ));
        }
    }
    let has_body = matches!(*method, Method::POST | Method::PUT | Method::PATCH);
    if has_body && request.uri().path().starts_with("/api/") {
        let content_type = headers
            .get(header::CONTENT_TYPE)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        if !content_type.as_deref().is_some_and(is_json) {
            return Err(ApiError::new(
                Code::UnsupportedMediaType,
                Some("content-type"),
                format!(
                    "content-type: {} is not JSON (rule: a {method} body must be sent as application/json)",
                    content_type.as_deref().map_or("(none)".to_string(), quote)
                ),
            ));
        }
    }
    Ok(())
}

/// The middleware of [`check`].
pub async fn guard(State(allowed): State<Arc<Allowed>>, request: Request, next: Next) -> Response {
    match check(&allowed, &request) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_listeners_names_with_its_port_are_allowed() {
        let a = Allowed::new("127.0.0.1:8080".parse().unwrap());
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST:8080",
            "[::1]:8080",
        ] {
            assert!(a.host(ok), "{ok}");
        }
        for bad in [
            "evil.example:8080",
            "127.0.0.1",
            "localhost",
            "127.0.0.1:8081",
            "127.0.0.1:+8080",
            "localhost.:8080",
            "[::1]8080",
            "[::1",
            "",
            "127.0.0.1:8080:8080",
        ] {
            assert!(!a.host(bad), "{bad}");
        }
        let v6 = Allowed::new("[::1]:80".parse().unwrap());
        assert!(v6.host("[::1]") && v6.host("localhost") && v6.host("[::1]:80"));
        let other = Allowed::new("127.0.0.2:9000".parse().unwrap());
        assert!(other.host("127.0.0.2:9000") && !other.host("127.0.0.3:9000"));
    }

    #[test]
    fn json_is_application_json_with_any_parameters() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/json-seq"));
        assert!(!is_json("text/plain; application/json"));
    }
}
