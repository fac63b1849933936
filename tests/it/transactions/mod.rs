//! Transaction streams: rho-uncertainty of releases, admission, ingest and feed, crashes, replicas,
//! the CLI.

mod admission;
mod cli;
mod cluster;
mod crash;
mod stream;
