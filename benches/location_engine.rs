//! Throughput of the CliqueCloak engine alone (one core), replaying the Oldenburg 10k trace
//! (`../shared/data/mobility/oldenburg_10k.csv.gz`, relative to the repository; falls back to the
//! in-repo slice `tests/data/oldenburg_60s.csv.gz` when absent) as location requests: each point a
//! request at its timestamp (spread within the second), k uniform in [2, 10] (seeded), dx = dy = 500 m,
//! dt = 10 s. One iteration = a fresh engine fed the first `PREFIX` requests, then a final expiry.
//! Prints the cloaking quality of one run (success rate, mean relative anonymity, mean relative
//! spatial resolution) once per search mode.

use std::hint::black_box;
use std::path::{Path, PathBuf};

use cloakd::location::replay::{CloakingQuality, ReplayParams, requests_from_trace};
use cloakd::location::{CloakRequest, Engine, SearchMode};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

/// Requests per iteration (about 55 s of the 10k trace).
const PREFIX: usize = 300_000;

fn trace_path() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let full = root.join("../shared/data/mobility/oldenburg_10k.csv.gz");
    if full.exists() {
        full
    } else {
        root.join("tests/data/oldenburg_60s.csv.gz")
    }
}

fn replay(mode: SearchMode, requests: &[CloakRequest]) -> usize {
    let mut engine = Engine::new(mode, 7);
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

fn quality(mode: SearchMode, requests: &[CloakRequest]) -> CloakingQuality {
    let mut engine = Engine::new(mode, 7);
    let mut out = Vec::new();
    for req in requests {
        let _ = engine.submit(req.clone(), &mut out);
    }
    engine.expire(i64::MAX, &mut out);
    let mut quality = CloakingQuality::default();
    quality.add(&out, |id| {
        usize::try_from(id)
            .ok()
            .and_then(|i| requests.get(i))
            .cloned()
    });
    quality
}

fn bench(c: &mut Criterion) {
    let path = trace_path();
    let points = match cloakd::workload::read_trace_file(&path, Some(PREFIX)) {
        Ok(points) => points,
        Err(e) => {
            eprintln!(
                "location_engine: cannot read {}: {e}; skipping",
                path.display()
            );
            return;
        }
    };
    let requests = requests_from_trace(
        &points,
        &ReplayParams {
            k_min: 2,
            k_max: 10,
            dx_m: 500.0,
            dy_m: 500.0,
            dt_ms: 10_000,
            seed: 2024,
        },
    );
    eprintln!(
        "location_engine: {} requests from {} ({} s of trace)",
        requests.len(),
        path.display(),
        points.last().map_or(0, |p| p.timestamp) - points.first().map_or(0, |p| p.timestamp) + 1
    );
    let mut group = c.benchmark_group("location_engine");
    group.sample_size(10);
    group.throughput(Throughput::Elements(requests.len() as u64));
    for (name, mode) in [("local_k", SearchMode::LocalK), ("nbr_k", SearchMode::NbrK)] {
        let q = quality(mode, &requests);
        eprintln!(
            "location_engine/{name}: success rate {:.4} ({} cloaked, {} expired), mean relative anonymity {:.3}, mean relative spatial resolution {:.3}",
            q.success_rate(),
            q.cloaked,
            q.expired,
            q.mean_relative_anonymity(),
            q.mean_relative_spatial_resolution()
        );
        group.bench_function(name, |b| b.iter(|| black_box(replay(mode, &requests))));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
