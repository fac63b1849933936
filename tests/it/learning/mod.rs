//! The learning workload's classifiers on the paper's Adult table, Weka 3.6 as the reference where
//! installed.

mod classifiers;
mod forest;
mod weka;
