//! The server as a whole: authentication and TLS, malformed frames, timeouts, health, metrics,
//! logs, reload, the `serve` CLI.

mod auth_roles;
mod bad_frames;
mod cli_line_limits;
mod config_reload;
mod fuzz_frames;
mod health_reflection;
mod log_privacy;
mod metrics_scrape;
mod one_connection;
mod serve_cli;
mod serve_exposure;
mod timeouts;
mod tls;
