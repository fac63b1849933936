//! Points of interest: `cloakd poi generate` and the real `cloakd provider` answering through the
//! broker.

mod generate;
mod provider;
