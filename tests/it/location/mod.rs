//! Location cloaking against the real daemon: k-anonymous boxes, providers, sessions, presence,
//! edges, replicas.

mod cloaking;
mod cluster;
mod compare;
mod edges;
mod expiry;
mod geo_budget;
mod geo_ind;
mod jitter;
mod presence;
mod provider;
mod provider_ack;
mod rejection;
mod sessions;
mod shutdown;
mod trace;
