//! cloakd's engines: the science of the privacy broker and nothing else. Plain synchronous Rust:
//! no runtime, network, file or clock (this crate depends on none; time is passed in, randomness comes
//! from a seeded or caller-given RNG), so each engine can be tested alone and the daemon
//! (the `cloakd` crate) re-exports them under the same names.
//!
//! The engines: [`location`] (CliqueCloak and presence k-anonymous location cloaking,
//! geo-indistinguishability and the trace yardstick), [`poi`] (the reference provider's exact
//! candidate lists for a cloaked box or an area of retrieval), [`transactions`] (personalized
//! rho-uncertainty by suppression), [`relational`] (Mondrian, KACA and OLA with k-anonymity,
//! l-diversity, t-closeness, delta-disclosure), [`risk`] (re-identification risk models), the
//! privacy/utility [`measures`] and [`learning`] (the classifiers of the learning workload). Beside
//! them, the plain helpers they share: [`text`] (quoting inputs in error messages), [`budget`] (a
//! table job's memory budget) and [`lines`] (the bounded line reader).
#![forbid(unsafe_code)]

pub mod budget;
pub mod learning;
pub mod lines;
pub mod location;
pub mod measures;
pub mod poi;
pub mod relational;
pub mod risk;
pub mod text;
pub mod transactions;

#[cfg(test)]
mod test_files;
