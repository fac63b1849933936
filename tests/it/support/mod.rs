//! Everything the integration tests share, defined once: the real daemon in the test's runtime
//! ([`daemon`]) or as the real `cloakd` binary ([`process`]), real clients ([`clients`], [`raw`],
//! [`security`]), real `nats-server` processes ([`nats`]), the per-area harnesses ([`store`],
//! [`transactions`], [`learning`], [`workbench`]) and the independent checkers
//! ([`relational_checker`], [`rho_checker`]), plus the repository's path, the `cloakd` binary and
//! free loopback ports.
//!
//! Invariants: nothing here is process-global beyond what a test may share with every other test of
//! the binary (the port counter of [`free_port`], the metrics recorder every in-process daemon
//! shares): no environment variable, working directory or global subscriber is set.
pub mod clients;
pub mod daemon;
pub mod learning;
pub mod nats;
pub mod process;
pub mod raw;
pub mod relational_checker;
#[allow(
    dead_code,
    reason = "the sampled-mode checks serve the engine's unit tests, which include this file too"
)]
pub mod rho_checker;
pub mod security;
pub mod store;
pub mod transactions;
pub mod workbench;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

// The relational checker (shared with the engine's unit tests) and the workbench harness name the
// privacy models through `super::`.
use cloakd::relational::models::{Distance, LDiversity, PrivacySpec, TCloseness};
// For `rho_checker`, which takes the engine's record type from its includer.
use cloakd::transactions::Record;

pub use clients::{
    MobileClient, evaluate_once_a_slot_frees, next_cloaked, released_windows, request_at,
    subscribe_provider,
};
pub use daemon::{TestDaemon, config_with};
pub use raw::raw_streaming_call;

/// The repository's root (where `Cargo.toml`, `examples/` and `tests/data/` are).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `cloakd` binary cargo built with the tests.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_cloakd"))
}

/// A command running the `cloakd` binary.
pub fn bin() -> Command {
    Command::new(binary())
}

/// Runs `cloakd ARGS` to completion with no stdin, its stdout and stderr captured.
pub fn cloakd(args: &[&str]) -> Output {
    bin()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run cloakd")
}

/// A loopback port for a server to listen on. Ports come from below the kernel's ephemeral range
/// (`ip_local_port_range`, 32768.. by default), so no outgoing connection of a concurrent test can
/// take one between this probe and the server's bind, and each is handed out once per test
/// process (the start differs per process), whichever test asks. A port some other program holds is
/// skipped. A bind can still lose a race with an unrelated program; a [`nats::NatsCluster`] then
/// retries its start.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 20_000;
    let high = u32::from(ephemeral_low()).clamp(LOW + 1_000, 65_535);
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = high - LOW;
    let _ = NEXT.compare_exchange(
        u32::MAX,
        (std::process::id().wrapping_mul(7_919)) % span,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    loop {
        let offset = NEXT.fetch_add(1, Ordering::SeqCst) % span;
        let port = (LOW + offset) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// First port of the kernel's ephemeral range (32768 when it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}
