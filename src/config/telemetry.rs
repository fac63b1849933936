//! `[telemetry]`: the Prometheus `/metrics` listener.
use std::net::SocketAddr;

use serde::Deserialize;

use super::{ConfigError, invalid};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTelemetry {
    pub metrics_listen: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// Address of the Prometheus `/metrics` listener; `None` turns it off.
    pub metrics_listen: Option<SocketAddr>,
}

impl RawTelemetry {
    pub(super) fn validate(self) -> Result<TelemetryConfig, ConfigError> {
        let listen = self.metrics_listen.trim();
        if listen.is_empty() {
            return Ok(TelemetryConfig {
                metrics_listen: None,
            });
        }
        let addr = listen.parse::<SocketAddr>().map_err(|e| {
            invalid(
                "telemetry.metrics_listen",
                format!("must be IP:PORT, like 127.0.0.1:9464, or \"\" to turn metrics off ({e})"),
            )
        })?;
        Ok(TelemetryConfig {
            metrics_listen: Some(addr),
        })
    }
}
