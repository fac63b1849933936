//! Batch relational anonymization: the `table` CLI, gRPC table jobs, evaluation, frontier, figures,
//! cancellation.

mod cancellation;
mod cli;
mod evaluate;
mod evaluate_limits;
mod evaluate_risk;
mod evaluate_workload;
mod figures;
mod frontier;
mod grpc;
mod grpc_algorithms;
mod kaca;
mod ola;
mod risk;
mod risk_bounds;
mod risk_population;
mod workload;
