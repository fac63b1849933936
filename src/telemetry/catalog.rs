//! The catalog of every metric cloakd exports: name, kind, labels, help text and (for histograms) the
//! bucket bounds. It is the one place a metric is defined; `docs/operations.md` holds the same table
//! for operators, and a unit test keeps the two in step.
//!
//! Names follow the Prometheus conventions: base units (`_seconds`, `_bytes`), counters end in
//! `_total`, and the gRPC metrics use the names of go-grpc-prometheus so existing dashboards and
//! alerts work unchanged. Labels take values from bounded sets (configured services and streams, gRPC
//! methods of the served protos, fixed outcome names); no label ever holds a user id, a token, a
//! position or a pseudonym.

/// What kind of Prometheus metric a catalog entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One exported metric.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    pub name: &'static str,
    pub kind: Kind,
    pub labels: &'static [&'static str],
    pub help: &'static str,
    /// Upper bounds of the histogram buckets (histograms only).
    pub buckets: &'static [f64],
}

const fn counter(
    name: &'static str,
    labels: &'static [&'static str],
    help: &'static str,
) -> MetricDef {
    MetricDef {
        name,
        kind: Kind::Counter,
        labels,
        help,
        buckets: &[],
    }
}

const fn gauge(
    name: &'static str,
    labels: &'static [&'static str],
    help: &'static str,
) -> MetricDef {
    MetricDef {
        name,
        kind: Kind::Gauge,
        labels,
        help,
        buckets: &[],
    }
}

const fn histogram(
    name: &'static str,
    labels: &'static [&'static str],
    help: &'static str,
    buckets: &'static [f64],
) -> MetricDef {
    MetricDef {
        name,
        kind: Kind::Histogram,
        labels,
        help,
        buckets,
    }
}

/// Buckets for latencies of one in-memory step (seconds).
const FAST_SECONDS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
/// Buckets for disk syncs (seconds).
const FSYNC_SECONDS: &[f64] = &[
    0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];
/// Buckets for whole calls and jobs, from a health check to an hour-long stream (seconds).
const CALL_SECONDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0,
];
/// Buckets for window work and lags (seconds).
const WINDOW_SECONDS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];
/// Buckets for group sizes (members).
const GROUP_SIZES: &[f64] = &[
    2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0, 30.0, 50.0, 100.0,
];
/// Buckets for the charges of one ledger commit.
const BATCH_SIZES: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];
/// Buckets for relative anonymity (group size / k).
const RELATIVE_ANONYMITY: &[f64] = &[1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0];

/// Buckets for any histogram not in the catalog, so nothing is ever exported as a summary.
pub const DEFAULT_BUCKETS: &[f64] = CALL_SECONDS;

pub const GRPC_STARTED: &str = "grpc_server_started_total";
pub const GRPC_HANDLED: &str = "grpc_server_handled_total";
pub const GRPC_HANDLING_SECONDS: &str = "grpc_server_handling_seconds";

pub const LOCATION_REQUESTS: &str = "cloakd_location_requests_total";
pub const LOCATION_REJECTIONS: &str = "cloakd_location_rejections_total";
pub const LOCATION_GEO_IND_ANSWERS: &str = "cloakd_location_geo_ind_answers_total";
pub const LOCATION_PENDING: &str = "cloakd_location_pending_requests";
pub const LOCATION_GROUP_SIZE: &str = "cloakd_location_group_size";
pub const LOCATION_RELATIVE_ANONYMITY: &str = "cloakd_location_relative_anonymity";
pub const LOCATION_BROKER_OVERHEAD: &str = "cloakd_location_broker_overhead_seconds";
pub const LOCATION_PROVIDER_QUEUE_DEPTH: &str = "cloakd_location_provider_queue_depth";
pub const LOCATION_UNDELIVERED: &str = "cloakd_location_undelivered_total";
pub const LOCATION_REHANDED: &str = "cloakd_location_rehanded_total";
pub const LOCATION_RELAYED: &str = "cloakd_location_relayed_total";
pub const LOCATION_BROKER_BUSY: &str = "cloakd_location_broker_busy_seconds_total";
pub const LOCATION_COMMAND_QUEUE_DEPTH: &str = "cloakd_location_command_queue_depth";
pub const LBS_ANSWERS: &str = "cloakd_lbs_answers_total";

pub const TX_RECORDS: &str = "cloakd_transaction_records_total";
pub const TX_RECORDS_REFUSED: &str = "cloakd_transaction_records_refused_total";
pub const TX_RECORDS_FORWARDED: &str = "cloakd_transaction_records_forwarded_total";
pub const CLUSTER_LEASES_HELD: &str = "cloakd_cluster_leases_held";
pub const TX_OPEN_RECORDS: &str = "cloakd_transaction_open_records";
pub const TX_LOG_FSYNC_SECONDS: &str = "cloakd_transaction_log_fsync_seconds";
pub const TX_LOG_BYTES: &str = "cloakd_transaction_log_bytes";
pub const TX_WINDOWS_CLOSED: &str = "cloakd_transaction_windows_closed_total";
pub const TX_WINDOWS_RELEASED: &str = "cloakd_transaction_windows_released_total";
pub const TX_WINDOWS_FAILED: &str = "cloakd_transaction_windows_failed_total";
pub const TX_WINDOWS_UNRELEASED: &str = "cloakd_transaction_windows_unreleased";
pub const TX_ANONYMIZATION_SECONDS: &str = "cloakd_transaction_window_anonymization_seconds";
pub const TX_SUPPRESSED_ITEMS: &str = "cloakd_transaction_suppressed_items_total";
pub const TX_RELEASE_LAG_SECONDS: &str = "cloakd_transaction_release_lag_seconds";
pub const TX_DATA_LOSS: &str = "cloakd_transaction_data_loss_total";

pub const GEO_BUDGET_CHARGES: &str = "cloakd_geo_budget_charges_total";
pub const GEO_BUDGET_ANSWERS: &str = "cloakd_geo_budget_answers_total";
pub const GEO_BUDGET_BATCH_SIZE: &str = "cloakd_geo_budget_commit_batch_size";
pub const GEO_BUDGET_COMMIT_SECONDS: &str = "cloakd_geo_budget_commit_seconds";

pub const TABLE_JOBS: &str = "cloakd_table_jobs_total";
pub const TABLE_JOB_SECONDS: &str = "cloakd_table_job_seconds";
pub const TABLE_JOBS_RUNNING: &str = "cloakd_table_jobs_running";
pub const TABLE_JOB_BYTES: &str = "cloakd_table_job_bytes";
pub const TABLE_JOBS_STOPPED: &str = "cloakd_table_jobs_stopped_total";
pub const UI_REQUESTS: &str = "cloakd_ui_requests_total";

pub const AUTH_FAILURES: &str = "cloakd_auth_failures_total";
pub const PERMISSION_DENIALS: &str = "cloakd_permission_denials_total";
pub const RATE_LIMITED: &str = "cloakd_rate_limited_total";

pub const CONFIG_RELOADS: &str = "cloakd_config_reloads_total";
pub const CONFIG_LAST_RELOAD_SUCCESSFUL: &str = "cloakd_config_last_reload_successful";

pub const RUNTIME_WORKERS: &str = "cloakd_runtime_workers";
pub const RUNTIME_WORKER_BUSY: &str = "cloakd_runtime_worker_busy_seconds_total";
pub const RUNTIME_GLOBAL_QUEUE_DEPTH: &str = "cloakd_runtime_global_queue_depth";
pub const RUNTIME_ALIVE_TASKS: &str = "cloakd_runtime_alive_tasks";

pub const BUILD_INFO: &str = "cloakd_build_info";
pub const START_TIME_SECONDS: &str = "cloakd_start_time_seconds";

/// Every metric cloakd exports.
pub const METRICS: &[MetricDef] = &[
    counter(
        GRPC_STARTED,
        &["grpc_service", "grpc_method"],
        "gRPC calls started.",
    ),
    counter(
        GRPC_HANDLED,
        &["grpc_service", "grpc_method", "grpc_code"],
        "gRPC calls completed, by status code (a stream counts when it ends; Canceled when the client went away).",
    ),
    histogram(
        GRPC_HANDLING_SECONDS,
        &["grpc_service", "grpc_method"],
        "Time from a call's start to its status (the whole life of a stream).",
        CALL_SECONDS,
    ),
    counter(
        LOCATION_REQUESTS,
        &["outcome"],
        "Location requests read from Submit streams, by final outcome: cloaked, expired, rejected, or withdrawn (the client left while it was pending).",
    ),
    counter(
        LOCATION_GEO_IND_ANSWERS,
        &["path"],
        "Location requests answered under GEO_IND (a point drawn by the planar Laplace mechanism), by path: direct (model GEO_IND) or fallback (a REQUESTS request that found no group by its deadline and named fallback_epsilon_per_km).",
    ),
    counter(
        LOCATION_REJECTIONS,
        &["field", "code"],
        "Rejected location requests by the field named in the rejection and the gRPC code.",
    ),
    gauge(
        LOCATION_PENDING,
        &[],
        "Location requests waiting for peers in the broker.",
    ),
    histogram(
        LOCATION_GROUP_SIZE,
        &["model"],
        "Members of each cloaked group, by model: requests (a CliqueCloak group, once per group) or presence (the anonymity set of each cloaked PRESENCE request).",
        GROUP_SIZES,
    ),
    histogram(
        LOCATION_RELATIVE_ANONYMITY,
        &["model"],
        "Relative anonymity (group size / requested k) of each cloaked request, by model (requests or presence).",
        RELATIVE_ANONYMITY,
    ),
    histogram(
        LOCATION_BROKER_OVERHEAD,
        &[],
        "Broker overhead per request: from reading it off its stream to the broker having handled it (queueing, validation, clique search, events queued), without the wait for peers.",
        FAST_SECONDS,
    ),
    counter(
        LOCATION_BROKER_BUSY,
        &[],
        "Time the location broker actor (one thread per replica: clique search and the routing of requests and answers) spent working; its rate is the actor's utilisation, and near 1 requests queue before it (cloakd_location_command_queue_depth grows).",
    ),
    gauge(
        LOCATION_COMMAND_QUEUE_DEPTH,
        &[],
        "Requests, answers and other commands waiting for the location broker actor.",
    ),
    gauge(
        LOCATION_PROVIDER_QUEUE_DEPTH,
        &["service"],
        "Cloaked requests waiting in a service's provider queue.",
    ),
    counter(
        LOCATION_UNDELIVERED,
        &["service", "reason"],
        "Cloaked requests no provider took (reason queue_full, shutting_down, no_provider: its provider stalled or left and no other was subscribed, or with [cluster] no replica has a provider of the service, relay_failed: the replica it was relayed to did not take it, expired: unacknowledged at answer_ttl_ms); the client got Undelivered.",
    ),
    counter(
        LOCATION_RELAYED,
        &["result"],
        "Cloaked requests this replica relayed to a replica with a provider of their service ([cluster], no such provider here), by result: accepted, no_provider (no replica has one), refused (that replica was overloaded) or failed (no answer).",
    ),
    counter(
        LOCATION_REHANDED,
        &["service"],
        "Cloaked requests handed to another provider because the provider stream holding them did not acknowledge within provider_ack_ms or ended.",
    ),
    counter(
        LBS_ANSWERS,
        &["result"],
        "Provider answers by result: delivered to the client, or undeliverable (unknown or expired pseudonym, client gone).",
    ),
    counter(
        TX_RECORDS,
        &["stream", "result"],
        "Published records acknowledged, by result: stored (new, durable) or duplicate (already stored).",
    ),
    counter(
        TX_RECORDS_REFUSED,
        &["reason"],
        "Published records refused: invalid, too_many_open (transactions.max_open_records), unavailable (store error), not_writer (the stream's lease moved to another replica) or window_released (the open window already has a release: the store is inconsistent, see `cloakd store check`).",
    ),
    counter(
        TX_RECORDS_FORWARDED,
        &["result"],
        "Records this replica forwarded to the replica sealing their stream ([cluster]), by result: stored, duplicate, refused (by that replica), failed (no answer; the record waits for the stream's writer), retried (this replica's own writer did not store it, its store unavailable or its lease gone; the record waits likewise) or no_writer (refused: nobody took it within cluster.failover_wait_ms).",
    ),
    gauge(
        CLUSTER_LEASES_HELD,
        &["kind"],
        "Leases this replica holds ([cluster]), by kind: stream (it seals the stream's windows) or cell (it cloaks the cell's requests).",
    ),
    gauge(
        TX_OPEN_RECORDS,
        &["stream"],
        "Records accepted and not yet released, per stream.",
    ),
    histogram(
        TX_LOG_FSYNC_SECONDS,
        &[],
        "Time of one append to the transaction log (write and fsync of one group commit, then the append and fsync of its entry in the journal of acknowledged batches `transactions.acks`).",
        FSYNC_SECONDS,
    ),
    gauge(
        TX_LOG_BYTES,
        &[],
        "Durable size of the transaction log file.",
    ),
    counter(
        TX_WINDOWS_CLOSED,
        &["stream"],
        "Windows closed (their close marker durable).",
    ),
    counter(
        TX_WINDOWS_RELEASED,
        &["stream"],
        "Windows anonymized and released (the release durable).",
    ),
    counter(
        TX_WINDOWS_FAILED,
        &["stream"],
        "Windows that could not be made rho-uncertain and were not released.",
    ),
    gauge(
        TX_WINDOWS_UNRELEASED,
        &["stream"],
        "Closed windows waiting for their outcome (anonymization and durable write).",
    ),
    histogram(
        TX_ANONYMIZATION_SECONDS,
        &[],
        "Time to anonymize one closed window.",
        WINDOW_SECONDS,
    ),
    counter(
        TX_SUPPRESSED_ITEMS,
        &["stream"],
        "Item occurrences suppressed in released windows.",
    ),
    histogram(
        TX_RELEASE_LAG_SECONDS,
        &[],
        "Time from a window's close to its outcome being durable (released or failed).",
        WINDOW_SECONDS,
    ),
    counter(
        TX_DATA_LOSS,
        &["stream", "reason"],
        "Windows a subscriber was sent DATA_LOSS for, by reason: damaged (its stored outcome fails its checksum or format) or missing (announced as stored, no longer there).",
    ),
    counter(
        GEO_BUDGET_CHARGES,
        &["outcome"],
        "Charges to the privacy budget ledger, by outcome: granted (made durable), refused (past the budget) or failed (the ledger could not make it durable).",
    ),
    counter(
        GEO_BUDGET_ANSWERS,
        &["outcome"],
        "GEO_IND requests by what the budget allowed: fresh (a new draw, charged), reused (the predictive test passed and the last report was sent again), refused (RESOURCE_EXHAUSTED: past the budget) or failed (the ledger failed; UNAVAILABLE).",
    ),
    histogram(
        GEO_BUDGET_BATCH_SIZE,
        &[],
        "Charges made durable together by one group commit of the budget ledger.",
        BATCH_SIZES,
    ),
    histogram(
        GEO_BUDGET_COMMIT_SECONDS,
        &[],
        "Time of one group commit of the budget ledger (file: one append and fdatasync; key-value bucket: the revision-checked updates of the batch's users).",
        FSYNC_SECONDS,
    ),
    counter(
        TABLE_JOBS,
        &["kind", "outcome"],
        "Table jobs (kind anonymize or evaluate over gRPC; upload, risk, sweep or release from the workbench) by outcome: ok, invalid, exhausted, cancelled (the caller went away, its deadline or tables.max_job_ms passed), failed.",
    ),
    gauge(
        TABLE_JOBS_RUNNING,
        &[],
        "Places of tables.max_concurrent_jobs in use: table jobs uploading or computing (a cancelled job's place is freed when its computation has stopped).",
    ),
    gauge(
        TABLE_JOB_BYTES,
        &[],
        "Bytes the running table jobs hold in their heavy allocations, as charged to their budgets (each at most tables.max_job_bytes).",
    ),
    counter(
        TABLE_JOBS_STOPPED,
        &["kind"],
        "Table job computations the engine stopped before their end because the caller went away or a deadline (the caller's or tables.max_job_ms) passed.",
    ),
    histogram(
        TABLE_JOB_SECONDS,
        &["kind"],
        "Time of one table job, from its first message to its result.",
        CALL_SECONDS,
    ),
    counter(
        UI_REQUESTS,
        &["route", "status"],
        "Requests of the workbench's HTTP listener ([ui] listen) by route pattern (like /api/v1/sweeps/{id}) and HTTP status.",
    ),
    counter(
        AUTH_FAILURES,
        &["reason"],
        "Calls refused before reaching a service because the caller could not be authenticated.",
    ),
    counter(
        PERMISSION_DENIALS,
        &["principal", "rule"],
        "Authenticated calls refused by an authorization rule.",
    ),
    counter(
        RATE_LIMITED,
        &["principal"],
        "Calls refused because the principal exceeded its rate limit.",
    ),
    counter(
        CONFIG_RELOADS,
        &["outcome"],
        "Configuration reloads (SIGHUP) by outcome: applied, unchanged, refused (a restart-only key changed; nothing applied) or invalid (nothing applied).",
    ),
    gauge(
        CONFIG_LAST_RELOAD_SUCCESSFUL,
        &[],
        "1 if the last configuration reload was applied (or changed nothing), 0 if it was refused or invalid; absent before the first reload.",
    ),
    gauge(
        RUNTIME_WORKERS,
        &[],
        "Worker threads of the tokio runtime serving gRPC (TLS, validation, encoding, the streams' tasks).",
    ),
    counter(
        RUNTIME_WORKER_BUSY,
        &[],
        "Time the runtime's worker threads spent running tasks, summed over the workers; its rate divided by cloakd_runtime_workers is their utilisation.",
    ),
    gauge(
        RUNTIME_GLOBAL_QUEUE_DEPTH,
        &[],
        "Tasks waiting in the runtime's global queue (it grows when the workers cannot keep up).",
    ),
    gauge(
        RUNTIME_ALIVE_TASKS,
        &[],
        "Tasks alive in the runtime: about one per open call or stream, plus the daemon's own.",
    ),
    gauge(
        BUILD_INFO,
        &["version"],
        "Always 1; the label carries the running version.",
    ),
    gauge(
        START_TIME_SECONDS,
        &[],
        "Unix time at which the daemon started.",
    ),
];

/// The catalog entry of `name`.
pub fn find(name: &str) -> Option<&'static MetricDef> {
    METRICS.iter().find(|m| m.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_conventions() {
        let mut seen = std::collections::HashSet::new();
        for m in METRICS {
            assert!(seen.insert(m.name), "{} defined twice", m.name);
            assert!(
                m.name.starts_with("cloakd_") || m.name.starts_with("grpc_server_"),
                "{}",
                m.name
            );
            match m.kind {
                Kind::Counter => assert!(m.name.ends_with("_total"), "{}", m.name),
                Kind::Gauge => assert!(!m.name.ends_with("_total"), "{}", m.name),
                Kind::Histogram => {
                    assert!(!m.name.ends_with("_total"), "{}", m.name);
                    assert!(!m.buckets.is_empty(), "{} has no buckets", m.name);
                    assert!(
                        m.buckets.windows(2).all(|w| w[0] < w[1]),
                        "{} buckets not increasing",
                        m.name
                    );
                }
            }
            for forbidden in ["user", "pseudonym", "token", "lat", "lon"] {
                assert!(
                    !m.labels.iter().any(|l| l.contains(forbidden)),
                    "{} has a label that could leak: {:?}",
                    m.name,
                    m.labels
                );
            }
        }
    }

    /// docs/operations.md documents exactly the metrics of the catalog, with their labels.
    #[test]
    fn the_operations_guide_documents_every_metric() {
        let guide = include_str!("../../docs/operations.md");
        let documented: std::collections::BTreeSet<&str> = guide
            .lines()
            .filter_map(|line| line.strip_prefix("| `"))
            .filter_map(|rest| rest.split('`').next())
            .filter(|name| name.starts_with("cloakd_") || name.starts_with("grpc_server_"))
            .collect();
        let defined: std::collections::BTreeSet<&str> = METRICS.iter().map(|m| m.name).collect();
        assert_eq!(documented, defined, "docs/operations.md metric table");
        for m in METRICS {
            let row = guide
                .lines()
                .find(|line| line.starts_with(&format!("| `{}`", m.name)))
                .unwrap_or_default();
            for label in m.labels {
                assert!(
                    row.contains(label),
                    "{}: label {label} not documented",
                    m.name
                );
            }
        }
    }

    /// The alert rules and the dashboard only query metrics the daemon exports.
    #[test]
    fn alerts_and_dashboard_use_catalogued_metrics() {
        for (file, text) in [
            (
                "deploy/prometheus/alerts.yml",
                include_str!("../../deploy/prometheus/alerts.yml"),
            ),
            (
                "deploy/grafana/cloakd.json",
                include_str!("../../deploy/grafana/cloakd.json"),
            ),
        ] {
            let mut used = 0;
            for (start, _) in text
                .match_indices("cloakd_")
                .chain(text.match_indices("grpc_server_"))
            {
                // Skip recording-rule names (`cloakd:...`) and words inside other identifiers.
                if start > 0 && text.as_bytes()[start - 1].is_ascii_alphanumeric() {
                    continue;
                }
                let name: String = text[start..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|suffix| name.strip_suffix(suffix).filter(|b| find(b).is_some()))
                    .unwrap_or(&name);
                assert!(
                    find(base).is_some(),
                    "{file} uses {name}, which cloakd does not export"
                );
                used += 1;
            }
            assert!(used > 5, "{file} queries no cloakd metric");
        }
    }
}
