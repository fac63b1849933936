//! `[server]`: the gRPC listener, HTTP/2 and connection limits, TLS.
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, invalid, positive_usize};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    pub listen: String,
    pub max_concurrent_streams: u32,
    pub shutdown_grace_ms: u64,
    pub max_message_bytes: usize,
    pub max_connections: usize,
    pub handshake_timeout_ms: u64,
    pub idle_connection_timeout_ms: u64,
    pub keepalive_interval_ms: u64,
    pub keepalive_timeout_ms: u64,
    pub http2_connection_window_bytes: u32,
    pub http2_stream_window_bytes: u32,
    pub http2_max_pending_accept_reset_streams: usize,
    pub http2_max_local_error_reset_streams: usize,
    pub allow_insecure: bool,
    pub tls: Option<RawTls>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub client_ca_file: Option<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub max_concurrent_streams: u32,
    pub shutdown_grace: Duration,
    /// Largest request message of the streaming services.
    pub max_message_bytes: usize,
    /// Most open TCP connections; further ones are closed at once.
    pub max_connections: usize,
    /// A connection must send its first bytes (HTTP/2 preface or TLS hello) within this.
    pub handshake_timeout: Duration,
    /// A connection with no open stream for this long is closed.
    pub idle_connection_timeout: Duration,
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    pub http2_connection_window_bytes: u32,
    pub http2_stream_window_bytes: u32,
    pub http2_max_pending_accept_reset_streams: usize,
    pub http2_max_local_error_reset_streams: usize,
    /// Serve without TLS or without required authentication on a non-loopback address.
    pub allow_insecure: bool,
    pub tls: Option<TlsConfig>,
}

/// `[server.tls]`: PEM files, read at start and again on SIGHUP.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// With it, clients may authenticate by a certificate this CA issued (mutual TLS).
    pub client_ca_file: Option<PathBuf>,
}

impl RawServer {
    pub(super) fn validate(self) -> Result<ServerConfig, ConfigError> {
        let listen = self.listen.parse::<SocketAddr>().map_err(|e| {
            invalid(
                "server.listen",
                format!("must be IP:PORT, like 127.0.0.1:50051 ({e})"),
            )
        })?;
        if self.max_concurrent_streams == 0 {
            return Err(invalid(
                "server.max_concurrent_streams",
                "must be at least 1",
            ));
        }
        let millis = |key: &str, v: u64| {
            if v == 0 {
                Err(invalid(key, "must be at least 1 (milliseconds)"))
            } else {
                Ok(Duration::from_millis(v))
            }
        };
        let window = |key: &str, v: u32| {
            // HTTP/2 windows lie in [65535, 2^31 - 1] (RFC 9113 §6.9.2).
            if (65_535..=0x7fff_ffff).contains(&v) {
                Ok(v)
            } else {
                Err(invalid(
                    key,
                    format!("must lie in [65535, 2147483647] bytes (got {v})"),
                ))
            }
        };
        if self.max_message_bytes < 1024 {
            return Err(invalid(
                "server.max_message_bytes",
                format!("must be at least 1024 (got {})", self.max_message_bytes),
            ));
        }
        let tls = match self.tls {
            None => None,
            Some(tls) => {
                let file = |key: &str, path: PathBuf| {
                    if path.as_os_str().is_empty() {
                        Err(invalid(key, "must name a PEM file"))
                    } else {
                        Ok(path)
                    }
                };
                Some(TlsConfig {
                    cert_file: file("server.tls.cert_file", tls.cert_file)?,
                    key_file: file("server.tls.key_file", tls.key_file)?,
                    client_ca_file: tls
                        .client_ca_file
                        .map(|p| file("server.tls.client_ca_file", p))
                        .transpose()?,
                })
            }
        };
        Ok(ServerConfig {
            listen,
            max_concurrent_streams: self.max_concurrent_streams,
            shutdown_grace: Duration::from_millis(self.shutdown_grace_ms),
            max_message_bytes: self.max_message_bytes,
            max_connections: positive_usize("server.max_connections", self.max_connections)?,
            handshake_timeout: millis("server.handshake_timeout_ms", self.handshake_timeout_ms)?,
            idle_connection_timeout: millis(
                "server.idle_connection_timeout_ms",
                self.idle_connection_timeout_ms,
            )?,
            keepalive_interval: millis("server.keepalive_interval_ms", self.keepalive_interval_ms)?,
            keepalive_timeout: millis("server.keepalive_timeout_ms", self.keepalive_timeout_ms)?,
            http2_connection_window_bytes: window(
                "server.http2_connection_window_bytes",
                self.http2_connection_window_bytes,
            )?,
            http2_stream_window_bytes: window(
                "server.http2_stream_window_bytes",
                self.http2_stream_window_bytes,
            )?,
            http2_max_pending_accept_reset_streams: positive_usize(
                "server.http2_max_pending_accept_reset_streams",
                self.http2_max_pending_accept_reset_streams,
            )?,
            http2_max_local_error_reset_streams: positive_usize(
                "server.http2_max_local_error_reset_streams",
                self.http2_max_local_error_reset_streams,
            )?,
            allow_insecure: self.allow_insecure,
            tls,
        })
    }
}
