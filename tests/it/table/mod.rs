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
mod grpc_jobs;
mod grpc_risk_bounds;
mod kaca;
mod ola;
mod risk;
mod risk_bounds;
mod risk_options;
mod risk_population;
mod workload;

/// The quasi-identifiers of the shipped Adult sample's job (`tests/data/adult-sample/job.toml`).
const ADULT_SAMPLE_QIS: [&str; 6] = [
    "age",
    "workclass",
    "education",
    "marital-status",
    "race",
    "sex",
];

/// The shipped Adult sample's job file.
fn adult_sample_job() -> String {
    crate::support::repo()
        .join("tests/data/adult-sample/job.toml")
        .display()
        .to_string()
}

/// A JSON report a table command wrote.
fn read_report(path: &std::path::Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}
