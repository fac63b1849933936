//! `[ui]`: the analyst's workbench in the browser (docs/workbench.md): its HTTP listener and how many
//! uploaded tables it keeps.
//!
//! Invariants: off unless `listen` is set; a non-loopback `listen` is refused here, so a bearer token
//! never crosses a network in clear (the workbench does not terminate TLS itself: without
//! `[server.tls]` that would be plain HTTP, and with it the UI listener still has no TLS of its own).
use std::net::SocketAddr;

use serde::Deserialize;

use super::{ConfigError, invalid, positive_usize};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUi {
    pub listen: String,
    pub max_tables: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct UiConfig {
    /// Address of the workbench's HTTP listener; `None` turns it off.
    pub listen: Option<SocketAddr>,
    /// Most uploaded tables (and most kept sweeps) held in memory; the oldest goes first.
    pub max_tables: usize,
}

impl RawUi {
    /// `tls` is whether `[server.tls]` is configured (it decides the message of a refusal).
    pub(super) fn validate(self, tls: bool) -> Result<UiConfig, ConfigError> {
        let max_tables = positive_usize("ui.max_tables", self.max_tables)?;
        let listen = self.listen.trim();
        if listen.is_empty() {
            return Ok(UiConfig {
                listen: None,
                max_tables,
            });
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
        Ok(UiConfig {
            listen: Some(addr),
            max_tables,
        })
    }
}
