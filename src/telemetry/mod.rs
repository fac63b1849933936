//! Telemetry: Prometheus metrics through the `metrics` facade, exported by
//! `metrics-exporter-prometheus` on a listener of their own (`[telemetry] metrics_listen`,
//! `GET /metrics`, text exposition format).
//!
//! Every metric is defined once in [`catalog`] (name, kind, labels, buckets) and documented in the
//! table of `docs/operations.md`. Latencies and sizes are histograms with explicit buckets (never
//! summaries), so they aggregate across replicas. gRPC calls are counted by one tower layer in front
//! of every service ([`grpc_layer::GrpcMetricsLayer`]); the services and actors record their own domain
//! metrics with the facade's macros, naming them by the catalog's constants.
//!
//! Invariants: the recorder is installed once per process (daemons started by tests in one process
//! share it); no label value is a user id, token, position or pseudonym; the metrics listener serves
//! only `/metrics` and never the gRPC services.
pub mod catalog;
pub mod grpc_layer;
pub mod saturation;

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::Context;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::sync::watch;

use catalog::Kind;

/// How often histograms are compacted (the exporter's upkeep).
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The process-wide Prometheus recorder, installed on first use with the catalog's buckets and
/// descriptions.
pub fn handle() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let mut builder = PrometheusBuilder::new();
        for m in catalog::METRICS
            .iter()
            .filter(|m| m.kind == Kind::Histogram)
        {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(m.name.to_string()), m.buckets)
                .expect("catalog histograms have buckets (checked by a unit test)");
        }
        builder = builder
            .set_buckets(catalog::DEFAULT_BUCKETS)
            .expect("the default buckets are not empty");
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!(
                "another metrics recorder is installed; /metrics shows only what it lets through"
            );
        }
        describe();
        handle
    })
}

/// Registers the catalog's help texts, the build info and the start time.
fn describe() {
    for m in catalog::METRICS {
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, m.help),
            Kind::Gauge => metrics::describe_gauge!(m.name, m.help),
            Kind::Histogram => metrics::describe_histogram!(m.name, m.help),
        }
    }
    metrics::gauge!(catalog::BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    metrics::gauge!(catalog::START_TIME_SECONDS).set(now);
}

/// Counts a table job of `kind` whose computation the engine stopped early (it saw its cancellation
/// flag): from here on the job uses no CPU.
/// Adds `delta` to the bytes held by table jobs (`cloakd_table_job_bytes`): every table job's
/// [`crate::budget::MemoryBudget`] reports its changes here.
pub fn record_table_job_bytes(delta: i64) {
    metrics::gauge!(catalog::TABLE_JOB_BYTES).increment(delta as f64);
}

pub fn record_table_job_stopped(kind: &'static str) {
    metrics::counter!(catalog::TABLE_JOBS_STOPPED, "kind" => kind).increment(1);
}

/// Counts one table job of `kind` by `outcome` and records its time
/// (`cloakd_table_jobs_total`, `cloakd_table_job_seconds`); `crate::jobs::JobRecord` calls it.
pub fn record_table_job(kind: &'static str, outcome: &'static str, elapsed: std::time::Duration) {
    metrics::counter!(catalog::TABLE_JOBS, "kind" => kind, "outcome" => outcome).increment(1);
    metrics::histogram!(catalog::TABLE_JOB_SECONDS, "kind" => kind).record(elapsed.as_secs_f64());
}

/// Counts one request of the workbench's HTTP API (`cloakd_ui_requests_total{route,status}`);
/// `route` is the route's pattern, never its path (which holds ids).
pub fn record_ui_request(route: &'static str, status: u16) {
    metrics::counter!(catalog::UI_REQUESTS, "route" => route, "status" => status.to_string())
        .increment(1);
}

/// Binds the metrics listener (`telemetry.metrics_listen`).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (telemetry.metrics_listen)"))
}

/// Serves `GET /metrics` on `listener` until `stop` turns true, and runs the exporter's upkeep.
pub async fn serve(listener: TcpListener, mut stop: watch::Receiver<bool>) -> anyhow::Result<()> {
    use axum::routing::get;

    let handle = handle();
    let addr = listener.local_addr().ok();
    let router = axum::Router::new()
        .route(
            "/metrics",
            get(|| async {
                let mut text = handle.render();
                text.push_str(&saturation::render(
                    tokio::runtime::Handle::try_current().ok().as_ref(),
                ));
                (
                    [(
                        http::header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    text,
                )
            }),
        )
        .route(
            "/",
            get(|| async { "cloakd metrics exporter: GET /metrics\n" }),
        );
    let upkeep = {
        let mut stop = stop.clone();
        async move {
            let mut tick = tokio::time::interval(UPKEEP_INTERVAL);
            loop {
                tokio::select! {
                    _ = tick.tick() => handle.run_upkeep(),
                    _ = stop.wait_for(|stop| *stop) => break,
                }
            }
        }
    };
    tokio::spawn(upkeep);
    if let Some(addr) = addr {
        tracing::info!(metrics_addr = %addr, "metrics listening (GET /metrics)");
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|stop| *stop).await;
        })
        .await
        .context("metrics listener failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_render_as_buckets() {
        let handle = handle();
        metrics::histogram!(catalog::TX_LOG_FSYNC_SECONDS).record(0.003);
        metrics::histogram!("cloakd_test_uncatalogued_seconds").record(0.2);
        let text = handle.render();
        assert!(
            text.contains("cloakd_transaction_log_fsync_seconds_bucket{le=\"0.005\"}"),
            "{text}"
        );
        assert!(
            text.contains("cloakd_test_uncatalogued_seconds_bucket{le=\"0.5\"}"),
            "{text}"
        );
        assert!(!text.contains("quantile="), "{text}");
        assert!(
            text.contains("# HELP cloakd_transaction_log_fsync_seconds"),
            "{text}"
        );
    }
}
