//! Saturation: how busy the threads doing the daemon's work are, so an operator sees which one runs
//! out first. Two places do the work: the tokio runtime's worker threads (gRPC, TLS, validation,
//! encoding) and the location broker actor (one thread per replica: CliqueCloak and the routing of
//! every request and answer).
//!
//! These series are read when `/metrics` is scraped and rendered here, not through the `metrics`
//! facade: busy time is a counter of seconds with a fraction, which the facade's integer counters
//! cannot hold. Their names, kinds and help texts are in [`super::catalog`] like every other metric.
//!
//! Invariant: the counters only grow (busy time of all broker actors of the process, and of the
//! workers of the runtime serving the scrape).
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::catalog::{self, Kind};

/// Nanoseconds the location broker actors of this process spent working.
static BROKER_BUSY_NANOS: AtomicU64 = AtomicU64::new(0);

/// Counts `busy` as time a broker actor spent working (from its wake-up to its next wait).
pub fn record_broker_busy(busy: Duration) {
    let nanos = u64::try_from(busy.as_nanos()).unwrap_or(u64::MAX);
    BROKER_BUSY_NANOS.fetch_add(nanos, Ordering::Relaxed);
}

/// The saturation series in the text exposition format: the broker's busy time, and the runtime's
/// workers when `runtime` is given (the runtime serving the scrape, which serves gRPC too).
pub fn render(runtime: Option<&tokio::runtime::Handle>) -> String {
    let mut out = String::new();
    let broker = Duration::from_nanos(BROKER_BUSY_NANOS.load(Ordering::Relaxed));
    series(
        &mut out,
        catalog::LOCATION_BROKER_BUSY,
        broker.as_secs_f64(),
    );
    if let Some(runtime) = runtime {
        let m = runtime.metrics();
        let workers = m.num_workers();
        let busy: Duration = (0..workers).map(|w| m.worker_total_busy_duration(w)).sum();
        series(&mut out, catalog::RUNTIME_WORKERS, workers as f64);
        series(&mut out, catalog::RUNTIME_WORKER_BUSY, busy.as_secs_f64());
        series(
            &mut out,
            catalog::RUNTIME_GLOBAL_QUEUE_DEPTH,
            m.global_queue_depth() as f64,
        );
        series(
            &mut out,
            catalog::RUNTIME_ALIVE_TASKS,
            m.num_alive_tasks() as f64,
        );
    }
    out
}

/// Appends one unlabelled series with its HELP and TYPE lines from the catalog.
fn series(out: &mut String, name: &str, value: f64) {
    let (help, kind) = catalog::find(name).map_or(("", "untyped"), |m| {
        (
            m.help,
            match m.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            },
        )
    });
    let help = help.replace('\\', "\\\\").replace('\n', "\\n");
    let _ = write!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}\n\n"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_time_grows_and_renders_as_counters() {
        let before = render(None);
        record_broker_busy(Duration::from_millis(1500));
        let after = render(None);
        let value = |text: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{} ", catalog::LOCATION_BROKER_BUSY)))
                .and_then(|v| v.parse().ok())
                .unwrap_or(-1.0)
        };
        assert!(value(&after) >= value(&before) + 1.5, "{before}\n{after}");
        assert!(
            after.contains(&format!("# TYPE {} counter", catalog::LOCATION_BROKER_BUSY)),
            "{after}"
        );
    }

    #[test]
    fn the_runtime_series_are_rendered_with_their_kinds() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        let text = render(Some(runtime.handle()));
        for (name, kind) in [
            (catalog::RUNTIME_WORKERS, "gauge"),
            (catalog::RUNTIME_WORKER_BUSY, "counter"),
            (catalog::RUNTIME_GLOBAL_QUEUE_DEPTH, "gauge"),
            (catalog::RUNTIME_ALIVE_TASKS, "gauge"),
        ] {
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{text}");
        }
        assert!(
            text.contains(&format!("\n{} 2\n", catalog::RUNTIME_WORKERS)),
            "{text}"
        );
    }
}
