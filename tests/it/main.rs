//! The integration tests, as one test binary: one module per area, each file one behaviour against
//! the real daemon (`daemon::serve` on 127.0.0.1:0 in the test's runtime, or the real `cloakd`
//! binary), the real CLI, or real `nats-server` processes; [`support`] holds everything they share.
//!
//! One binary links the crate once instead of once per file. Its tests run on parallel threads of
//! one process, so a test must not touch process-wide state: no `std::env::set_var`, no
//! `set_current_dir` (give a child process its own `current_dir` instead), no global metrics
//! recorder or tracing subscriber of its own, no fixed port (ports come from
//! [`support::free_port`] or a listener bound to 127.0.0.1:0). A test that cannot avoid one of
//! these gets its own `[[test]]` target in `Cargo.toml` instead: only
//! `tests/transactions_many_streams.rs`, which counts its process's threads.
//!
//! A new test file: `tests/it/<area>/<behaviour>.rs` opening with `//!` (what it checks), declared
//! as `mod <behaviour>;` in `tests/it/<area>/mod.rs` (a new area: a folder with such a `mod.rs`,
//! declared below); shared helpers come from `crate::support` (`use crate::support::{TestDaemon,
//! config_with};`), never copied into the file.
//!
//! Run one area or one file with a filter: `scripts/test --test it location::`,
//! `scripts/test --test it table::kaca::`.
#![forbid(unsafe_code)]

mod support;

mod architecture;
mod cluster;
mod learning;
mod location;
mod poi;
mod server;
mod store;
mod table;
mod transactions;
mod workbench;
