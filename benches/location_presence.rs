//! The presence engine alone (one core): position updates ingested per second, and the cloak latency
//! and cloaking quality of the sparse periodic workload, on the Oldenburg trace
//! (`shared/data/mobility/oldenburg_small.csv.gz` beside an ancestor of the repository; falls back to
//! the in-repo slice `tests/data/oldenburg_60s.csv.gz`).
//!
//! Printed once before the criterion groups, for the workload "one request per user every 30 s (random
//! phase per user), position updates every 5 s, k uniform in [2, 10], positions kept 10 s": success rate
//! at 500 m and 1,000 m tolerances (1,000 m both with the default `presence_target_m` of 500 m and
//! with it set to 1,000 m), median relative spatial resolution, cloak latency percentiles (each
//! `cloak` call, wall clock and the thread's CPU time) and the expiry reasons; and, on the same requests, CliqueCloak's (the requests model, dt = 10 s) success and resolution.
//! Criterion group `presence_updates`: a fresh engine fed every trace row as a position update.
//!
//! Run: `cargo bench --bench location_presence`.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Instant;

use cloakd::data_files::{TracePoint, read_trace_file};
use cloakd::location::presence::ExpiryReason;
use cloakd::location::replay::{
    PeriodicEvent, PeriodicParams, PeriodicWorkload, median, periodic_workload,
    relative_spatial_resolution,
};
use cloakd::location::{
    CloakRequest, Engine, Outcome, PresenceEngine, PresenceOutcome, PresenceParams,
    PresenceRequest, SearchMode,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use hdrhistogram::Histogram;

#[path = "common/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::thread_cpu_ns;

const MAX_AGE_MS: u64 = 10_000;

fn trace_path() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    root.ancestors()
        .map(|dir| dir.join("shared/data/mobility/oldenburg_small.csv.gz"))
        .find(|path| path.exists())
        .unwrap_or_else(|| root.join("tests/data/oldenburg_60s.csv.gz"))
}

/// The engine's limits, with `presence_target_m` = `target_side_m`.
fn params(target_side_m: f64) -> PresenceParams {
    PresenceParams {
        max_age_ms: MAX_AGE_MS,
        max_tracked_users: 1_000_000,
        target_side_m,
    }
}

fn presence_quality(workload: &PeriodicWorkload, tolerance_m: f64, target_side_m: f64) {
    let mut engine = PresenceEngine::new(params(target_side_m), 1);
    let mut latency = Histogram::<u64>::new(3).expect("histogram");
    let mut cpu = Histogram::<u64>::new(3).expect("histogram");
    let (mut requests, mut cloaked) = (0usize, 0usize);
    let mut resolutions = Vec::new();
    let mut expired = std::collections::BTreeMap::new();
    for event in &workload.events {
        match *event {
            PeriodicEvent::Update {
                user,
                at_ms,
                lat,
                lon,
            } => {
                let _ = engine.update(user as u64, lat, lon, at_ms);
            }
            PeriodicEvent::Request {
                user,
                at_ms,
                lat,
                lon,
                k,
            } => {
                let req = PresenceRequest {
                    user: user as u64,
                    lat,
                    lon,
                    k,
                    dx_m: tolerance_m,
                    dy_m: tolerance_m,
                };
                let start = Instant::now();
                let cpu_start = thread_cpu_ns();
                let outcome = engine.cloak(&req, at_ms);
                let _ = cpu.record(thread_cpu_ns().saturating_sub(cpu_start));
                let _ = latency.record(start.elapsed().as_nanos() as u64);
                requests += 1;
                match outcome {
                    Ok(PresenceOutcome::Cloaked(region)) => {
                        cloaked += 1;
                        resolutions.push(relative_spatial_resolution(
                            &req.constraint_box(),
                            &region.cloaking_box,
                        ));
                    }
                    Ok(PresenceOutcome::Expired(reason)) => {
                        let name = match reason {
                            ExpiryReason::TooFewUsers { .. } => "too few users",
                            ExpiryReason::OutsideTolerance => "outside tolerance",
                            ExpiryReason::Isolated => "isolated",
                            ExpiryReason::FewFitTolerance => "few fit tolerance",
                        };
                        *expired.entry(name).or_insert(0usize) += 1;
                    }
                    Err(_) => *expired.entry("refused").or_insert(0usize) += 1,
                }
            }
        }
    }
    let us = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
    let cpu_us = |q: f64| cpu.value_at_quantile(q) as f64 / 1000.0;
    eprintln!(
        "presence {tolerance_m} m (target {target_side_m} m): {requests} requests, success {:.4}, median relative spatial resolution {:.3}, cloak latency (wall) p50 {:.1} us p99 {:.1} us max {:.1} us, (thread CPU) p50 {:.1} us p99 {:.1} us max {:.1} us; expired: {expired:?}",
        cloaked as f64 / requests.max(1) as f64,
        median(&mut resolutions),
        us(0.5),
        us(0.99),
        latency.max() as f64 / 1000.0,
        cpu_us(0.5),
        cpu_us(0.99),
        cpu.max() as f64 / 1000.0,
    );
}

fn requests_model_quality(workload: &PeriodicWorkload, tolerance_m: f64) {
    let mut engine = Engine::new(SearchMode::NbrK, 1);
    let mut requests = Vec::new();
    let mut out = Vec::new();
    for event in &workload.events {
        if let PeriodicEvent::Request {
            user,
            at_ms,
            lat,
            lon,
            k,
        } = *event
        {
            let req = CloakRequest {
                id: requests.len() as u64,
                user: user as u64,
                lat,
                lon,
                k,
                dx_m: tolerance_m,
                dy_m: tolerance_m,
                dt_ms: 10_000,
                arrival_ms: at_ms,
            };
            requests.push(req.clone());
            let _ = engine.submit(req, &mut out);
        }
    }
    engine.expire(i64::MAX, &mut out);
    let mut cloaked = 0usize;
    let mut resolutions = Vec::new();
    for outcome in &out {
        if let Outcome::Cloaked(group) = outcome {
            for id in &group.members {
                cloaked += 1;
                let req = &requests[*id as usize];
                resolutions.push(relative_spatial_resolution(
                    &req.constraint_box(),
                    &group.cloaking_box,
                ));
            }
        }
    }
    eprintln!(
        "requests (CliqueCloak nbr-k, dt 10 s) {tolerance_m} m: {} requests, success {:.4}, median relative spatial resolution {:.3}",
        requests.len(),
        cloaked as f64 / requests.len().max(1) as f64,
        median(&mut resolutions),
    );
}

fn load() -> Option<Vec<TracePoint>> {
    let path = trace_path();
    match read_trace_file(&path, None) {
        Ok(points) => {
            eprintln!(
                "location_presence: {} rows from {}",
                points.len(),
                path.display()
            );
            Some(points)
        }
        Err(e) => {
            eprintln!(
                "location_presence: cannot read {}: {e}; skipping",
                path.display()
            );
            None
        }
    }
}

fn bench(c: &mut Criterion) {
    let Some(points) = load() else { return };
    let workload = periodic_workload(
        &points,
        &PeriodicParams {
            update_period_s: 5,
            request_period_s: 30,
            k_min: 2,
            k_max: 10,
            seed: 1,
        },
    );
    // The partition aims at `presence_target_m` (500 m by default, the default tolerance): each
    // tolerance with the default target, and 1,000 m also with the target set to it.
    for (tolerance_m, target_side_m) in [(500.0, 500.0), (1000.0, 500.0), (1000.0, 1000.0)] {
        presence_quality(&workload, tolerance_m, target_side_m);
    }
    for tolerance_m in [500.0, 1000.0] {
        requests_model_quality(&workload, tolerance_m);
    }
    // Every row an update, in trace order, spread evenly within its second.
    let updates = periodic_workload(
        &points,
        &PeriodicParams {
            update_period_s: 1,
            request_period_s: u32::MAX,
            k_min: 2,
            k_max: 2,
            seed: 1,
        },
    );
    let updates: Vec<(u64, i64, f64, f64)> = updates
        .events
        .iter()
        .filter_map(|e| match *e {
            PeriodicEvent::Update {
                user,
                at_ms,
                lat,
                lon,
            } => Some((user as u64, at_ms, lat, lon)),
            PeriodicEvent::Request { .. } => None,
        })
        .collect();
    let mut group = c.benchmark_group("presence_updates");
    group.sample_size(10);
    group.throughput(Throughput::Elements(updates.len() as u64));
    group.bench_function("ingest", |b| {
        b.iter(|| {
            let mut engine = PresenceEngine::new(params(500.0), 1);
            for &(user, at_ms, lat, lon) in &updates {
                let _ = engine.update(user, lat, lon, at_ms);
            }
            black_box(engine.tracked_len())
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
