//! Throughput of the CliqueCloak engine alone (one core), replaying the Oldenburg 10k trace
//! (`../shared/data/mobility/oldenburg_10k.csv.gz`, relative to the repository; falls back to the
//! in-repo slice `tests/data/oldenburg_60s.csv.gz` when absent; `CLOAKD_BENCH_TRACE=FILE` names
//! another trace, e.g. from a git worktree whose `../shared` is elsewhere) as location requests: each point a
//! request at its timestamp (spread within the second), k uniform in [2, 10] (seeded), dt = 10 s,
//! under three workloads:
//! - `500m`: dx = dy = 500 m for everyone (the standard workload);
//! - `log_uniform`: each request's dx and dy drawn log-uniformly from [20 m, 20 km] (seeded);
//! - `hot_spot`: the `log_uniform` requests with every position squeezed into 1 km².
//!
//! Each workload runs with both spatial indexes (`rtree`, `grid`: `location.index`) and both search
//! modes. One iteration = a fresh engine fed the first `PREFIX` requests, then a final expiry. Prints,
//! once per run of the bench, the cloaking quality (success rate, mean relative anonymity, mean
//! relative spatial resolution) per workload and mode, after checking that both indexes give the
//! same outcomes.
//!
//! Two measurements: wall-clock time (criterion's default, group `location_engine`) and the CPU time
//! of the benchmarking thread (group `location_engine_cpu`, `common/thread_cpu.rs`), which stays meaningful when other processes compete for the cores. Run one group with
//! `cargo bench --bench location_engine -- location_engine_cpu`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cloakd::location::replay::{
    CloakingQuality, ReplayParams, requests_from_trace, workloads as workloads_of,
};
use cloakd::location::{CloakRequest, Engine, IndexKind, Outcome, SearchMode};
use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};

#[path = "common/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::thread_cpu_ns;

/// Requests per iteration (about 55 s of the 10k trace).
const PREFIX: usize = 300_000;

fn trace_path() -> PathBuf {
    if let Some(path) = std::env::var_os("CLOAKD_BENCH_TRACE") {
        return PathBuf::from(path);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let full = root.join("../shared/data/mobility/oldenburg_10k.csv.gz");
    if full.exists() {
        full
    } else {
        root.join("tests/data/oldenburg_60s.csv.gz")
    }
}

fn engine(mode: SearchMode, index: IndexKind) -> Engine {
    Engine::new(mode, 7).with_index(index)
}

fn replay(mode: SearchMode, index: IndexKind, requests: &[CloakRequest]) -> usize {
    let mut engine = engine(mode, index);
    let mut out = Vec::with_capacity(64);
    let mut outcomes = 0;
    for req in requests {
        if engine.submit(req.clone(), &mut out).is_ok() {
            outcomes += out.len();
        }
        out.clear();
    }
    engine.expire(i64::MAX, &mut out);
    outcomes + out.len()
}

fn outcomes(mode: SearchMode, index: IndexKind, requests: &[CloakRequest]) -> Vec<Outcome> {
    let mut engine = engine(mode, index);
    let mut out = Vec::new();
    for req in requests {
        let _ = engine.submit(req.clone(), &mut out);
    }
    engine.expire(i64::MAX, &mut out);
    out
}

fn quality(out: &[Outcome], requests: &[CloakRequest]) -> CloakingQuality {
    let mut quality = CloakingQuality::default();
    quality.add(out, |id| {
        usize::try_from(id)
            .ok()
            .and_then(|i| requests.get(i))
            .cloned()
    });
    quality
}

/// The three workloads (see the module doc), or `None` when the trace cannot be read.
fn workloads() -> Option<Vec<(&'static str, Vec<CloakRequest>)>> {
    let path = trace_path();
    let points = match cloakd::data_files::read_trace_file(&path, Some(PREFIX)) {
        Ok(points) => points,
        Err(e) => {
            eprintln!(
                "location_engine: cannot read {}: {e}; skipping",
                path.display()
            );
            return None;
        }
    };
    eprintln!(
        "location_engine: {} requests from {} ({} s of trace)",
        points.len(),
        path.display(),
        points.last().map_or(0, |p| p.timestamp) - points.first().map_or(0, |p| p.timestamp) + 1
    );
    Some(workloads_of(requests_from_trace(
        &points,
        &ReplayParams::OLDENBURG,
    )))
}

const MODES: [(&str, SearchMode); 2] =
    [("local_k", SearchMode::LocalK), ("nbr_k", SearchMode::NbrK)];

/// Set once the cloaking quality has been printed (by whichever group runs first).
static QUALITY_PRINTED: AtomicBool = AtomicBool::new(false);

fn bench_group<M: Measurement>(c: &mut Criterion<M>, name: &str) {
    let Some(workloads) = workloads() else { return };
    let print_quality = !QUALITY_PRINTED.swap(true, Ordering::Relaxed);
    let mut group = c.benchmark_group(name);
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    // An iteration takes about a second: ten of them, not criterion's linear ramp of 55.
    group.sampling_mode(SamplingMode::Flat);
    for (workload, requests) in &workloads {
        group.throughput(Throughput::Elements(requests.len() as u64));
        for (mode_name, mode) in MODES {
            if print_quality {
                let runs: Vec<Vec<Outcome>> = IndexKind::ALL
                    .into_iter()
                    .map(|index| outcomes(mode, index, requests))
                    .collect();
                let same = runs.iter().all(|run| run == &runs[0]);
                let q = quality(&runs[0], requests);
                eprintln!(
                    "location_engine/{workload}/{mode_name}: success rate {:.4} ({} cloaked, {} expired), mean relative anonymity {:.3}, mean relative spatial resolution {:.3}; outcomes of rtree and grid identical: {same}",
                    q.success_rate(),
                    q.cloaked,
                    q.expired,
                    q.mean_relative_anonymity(),
                    q.mean_relative_spatial_resolution()
                );
                assert!(same, "{workload}/{mode_name}: the indexes disagree");
            }
            for index in IndexKind::ALL {
                group.bench_function(format!("{workload}/{}/{mode_name}", index.name()), |b| {
                    b.iter(|| black_box(replay(mode, index, requests)))
                });
            }
        }
    }
    group.finish();
}

fn wall(c: &mut Criterion) {
    bench_group(c, "location_engine");
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    bench_group(c, "location_engine_cpu");
}

/// CPU time consumed by the calling thread, in nanoseconds.
struct ThreadCpuTime;

impl Measurement for ThreadCpuTime {
    type Intermediate = f64;
    type Value = f64;
    fn start(&self) -> f64 {
        thread_cpu_ns() as f64
    }
    fn end(&self, start: f64) -> f64 {
        thread_cpu_ns() as f64 - start
    }
    fn add(&self, a: &f64, b: &f64) -> f64 {
        a + b
    }
    fn zero(&self) -> f64 {
        0.0
    }
    fn to_f64(&self, value: &f64) -> f64 {
        *value
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, typical_ns: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = if typical_ns >= 1e9 {
            (1e-9, "s cpu")
        } else if typical_ns >= 1e6 {
            (1e-6, "ms cpu")
        } else {
            (1e-3, "us cpu")
        };
        values.iter_mut().for_each(|v| *v *= factor);
        unit
    }
    fn scale_throughputs(
        &self,
        _typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let elements = match throughput {
            Throughput::Elements(n) => *n as f64,
            _ => 1.0,
        };
        values
            .iter_mut()
            .for_each(|v| *v = elements * 1e9 / *v / 1e3);
        "Kelem/s (cpu)"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

criterion_group!(wall_time, wall);
criterion_group! {
    name = cpu_time;
    config = Criterion::default().with_measurement(ThreadCpuTime);
    targets = cpu
}
criterion_main!(wall_time, cpu_time);
