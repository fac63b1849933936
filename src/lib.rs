//! cloakd: a privacy broker.
//!
//! Six engines hold the science and nothing else (plain synchronous Rust, time passed in, randomness
//! from a seeded RNG; a crate of their own, `cloakd-engines` in `crates/engines`, re-exported here
//! under the same names with the helpers they share, `text`, `budget` and `lines`): [`location`] (CliqueCloak and presence k-anonymous location cloaking),
//! [`poi`] (the reference provider's exact candidate lists for a cloaked box), [`transactions`]
//! (personalized rho-uncertainty by suppression), [`relational`] (Mondrian, KACA and OLA with
//! k-anonymity, l-diversity, t-closeness, delta-disclosure), the privacy/utility [`measures`] and
//! [`learning`] (the classifiers of the learning workload); [`plots`] draws the measures' charts.
//! Between the engines and the adapters, the stateful actors: [`broker`] (the location broker actor:
//! admission, cloaking and dispatch, delivery and acknowledgements, replica routing) and [`windows`]
//! (the durable window pipeline of the transaction streams: the writer, the releasers, replicas'
//! stream routing), and the privacy budget [`ledger`] (per user and window, the epsilon its
//! GEO_IND answers spent, durable before an answer is released). Around them, thin adapters: [`service`] (gRPC: proto <-> domain, validation, one
//! status mapping per service; the workbench's HTTP API), [`store`] (durable state), [`telemetry`]
//! (Prometheus metrics), [`daemon`] (wiring, shutdown), [`reload`] (SIGHUP configuration reload) and
//! [`cli`] (batch commands).
#![forbid(unsafe_code)]

pub use cloakd_engines::{
    budget, learning, lines, location, measures, poi, relational, risk, text, transactions,
};

pub mod atomic_file;
pub mod auth;
pub mod broker;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod connections;
pub mod daemon;
pub mod data_files;
pub mod jobs;
pub mod ledger;
pub mod plots;
pub mod provider;
pub mod reload;
pub mod service;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod windows;
pub mod workbench;

/// Generated protobuf and gRPC code of package `cloakd.v1`.
pub mod proto {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("cloakd.v1");

    /// Encoded file descriptor set, for server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("cloakd_descriptor");

    /// Package `cloakd.v1.poi`: the POI query and candidate list carried in request and reply
    /// payloads (see `docs/provider.md`).
    pub mod poi {
        tonic::include_proto!("cloakd.v1.poi");
    }
}
