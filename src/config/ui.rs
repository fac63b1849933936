//! `[ui]`: the analyst's workbench in the browser (docs/workbench.md): its HTTP listener, the limits
//! of that listener (connections, header and idle timeouts) and how many uploaded tables and sweeps
//! it keeps per principal.
//!
//! Invariants: off unless `listen` is set; a non-loopback `listen` is refused here, so a bearer token
//! never crosses a network in clear (the workbench does not terminate TLS itself: without
//! `[server.tls]` that would be plain HTTP, and with it the UI listener still has no TLS of its own);
//! every count is at least 1 and every timeout at least 1 ms.
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid, positive_usize};

/// Most connections `ui.max_connections` can allow (the workbench serves one analyst's browser).
pub const MAX_UI_CONNECTIONS: usize = 65_536;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUi {
    pub listen: String,
    pub max_tables: usize,
    pub max_sweeps: usize,
    pub max_connections: usize,
    pub header_timeout_ms: u64,
    pub idle_timeout_ms: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct UiConfig {
    /// Address of the workbench's HTTP listener; `None` turns it off.
    pub listen: Option<SocketAddr>,
    /// Most uploaded tables held in memory per principal; its own oldest goes first.
    pub max_tables: usize,
    /// Most sweeps kept per principal; its own oldest finished one goes first.
    pub max_sweeps: usize,
    /// Most open connections of the workbench's listener; one past it is closed at once.
    pub max_connections: usize,
    /// A request's line and headers must arrive within this (also the wait for the next request
    /// on a kept-alive connection).
    pub header_timeout: Duration,
    /// A request body that sends nothing, or a response the client does not read, for this long
    /// closes the connection.
    pub idle_timeout: Duration,
}

impl RawUi {
    /// `tls` is whether `[server.tls]` is configured (it decides the message of a refusal).
    pub(super) fn validate(self, tls: bool) -> Result<UiConfig, ConfigError> {
        let millis = |key: &str, v: u64| {
            if v == 0 {
                Err(invalid(key, "must be at least 1 (milliseconds)"))
            } else {
                Ok(Duration::from_millis(v))
            }
        };
        let max_connections = positive_usize("ui.max_connections", self.max_connections)?;
        if max_connections > MAX_UI_CONNECTIONS {
            return Err(invalid(
                "ui.max_connections",
                format!("must be at most {MAX_UI_CONNECTIONS} (got {max_connections})"),
            ));
        }
        let mut config = UiConfig {
            listen: None,
            max_tables: positive_usize("ui.max_tables", self.max_tables)?,
            max_sweeps: positive_usize("ui.max_sweeps", self.max_sweeps)?,
            max_connections,
            header_timeout: millis("ui.header_timeout_ms", self.header_timeout_ms)?,
            idle_timeout: millis("ui.idle_timeout_ms", self.idle_timeout_ms)?,
        };
        let listen = self.listen.trim();
        if listen.is_empty() {
            return Ok(config);
        }
        let addr = listen.parse::<SocketAddr>().map_err(|e| {
            invalid(
                "ui.listen",
                format!(
                    "must be IP:PORT, like 127.0.0.1:8080, or \"\" to turn the workbench off ({e})"
                ),
            )
        })?;
        if !addr.ip().is_loopback() {
            let rule = if tls {
                "must be a loopback address (rule: the workbench serves plain HTTP only, so a bearer token would cross the network in clear; [server.tls] covers the gRPC port, not the workbench; reach it through an SSH tunnel or a TLS-terminating proxy on this host)"
            } else {
                "must be a loopback address without [server.tls] (rule: a bearer token must not cross a network in clear; the workbench serves plain HTTP only, reach it through an SSH tunnel or a TLS-terminating proxy on this host)"
            };
            return Err(invalid("ui.listen", format!("{addr} {rule}")));
        }
        config.listen = Some(addr);
        Ok(config)
    }
}
