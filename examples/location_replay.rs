//! One workload of the location engine benchmark replayed in a loop, for profiling (`perf record`)
//! and for before/after comparisons of two builds side by side: what one iteration of
//! `cargo bench --bench location_engine` does (a fresh engine fed the first 300,000 requests of the
//! trace, then a final expiry), timed in thread CPU time, with a hash of every outcome so that two
//! builds or two indexes can be seen to behave identically.
//!
//! ```sh
//! cargo run --release --example location_replay -- ../shared/data/mobility/oldenburg_10k.csv.gz \
//!     500m rtree local_k 3
//! cargo run --release --example location_replay -- ../shared/data/mobility/oldenburg_10k.csv.gz all
//! ```
//! Arguments: the trace; the workload (`500m`, `log_uniform`, `hot_spot`, `500m_at_50k` (the 500m
//! requests arriving at 50,000/s, as in `cloakd simulate --rate 50000`), or `all` for one run of
//! every workload, index and mode printing only the quality and the hash); the index (`rtree`,
//! `grid`); the mode (`local_k`, `nbr_k`); the number of iterations (the best is reported). A second
//! line counts the work per arrival ([`cloakd::location::SearchStats`]): pending requests, what the
//! index returned and what was kept, and the clique searches' branches and adjacency rows.
use std::hash::{DefaultHasher, Hash, Hasher};

use cloakd::location::replay::{CloakingQuality, ReplayParams, requests_from_trace, workloads};
use cloakd::location::{CloakRequest, Engine, IndexKind, Outcome, SearchMode, SearchStats};

#[path = "../benches/common/thread_cpu.rs"]
mod thread_cpu;
use thread_cpu::thread_cpu_ns;

/// Requests per iteration, as the benchmark.
const PREFIX: usize = 300_000;

fn replay(
    mode: SearchMode,
    index: IndexKind,
    requests: &[CloakRequest],
) -> (Vec<Outcome>, SearchStats) {
    let mut engine = Engine::new(mode, 7).with_index(index);
    let mut out = Vec::new();
    for req in requests {
        let _ = engine.submit(req.clone(), &mut out);
    }
    engine.expire(i64::MAX, &mut out);
    (out, engine.search_stats())
}

/// The work per arrival: what the index returned, what qualified and was kept, and what the clique
/// searches cost (mean branches and adjacency rows per search).
fn work(s: &SearchStats) -> String {
    let per = |n: u64, d: u64| n as f64 / d.max(1) as f64;
    let searches = s.found + s.exhausted + s.out_of_budget;
    format!(
        "per arrival: {:.0} pending, {:.1} candidates, {:.1} qualified, {:.1} kept; {searches} searches \
         ({} found, {} exhausted, {} out of budget), {:.1} branches and {:.1} rows each",
        per(s.pending, s.arrivals),
        per(s.candidates, s.arrivals),
        per(s.qualified, s.arrivals),
        per(s.kept, s.arrivals),
        s.found,
        s.exhausted,
        s.out_of_budget,
        per(s.branches, searches),
        per(s.rows, searches),
    )
}

/// A hash of the outcomes' debug form (std's fixed-key hasher, so equal for runs that gave the
/// same outcomes, across builds made with the same toolchain).
fn outcome_hash(out: &[Outcome]) -> u64 {
    let mut h = DefaultHasher::new();
    for o in out {
        format!("{o:?}").hash(&mut h);
    }
    h.finish()
}

fn summary(out: &[Outcome], requests: &[CloakRequest]) -> String {
    let mut q = CloakingQuality::default();
    q.add(out, |id| requests.get(usize::try_from(id).ok()?).cloned());
    format!(
        "success {:.4}, resolution {:.3}, hash {:016x}",
        q.success_rate(),
        q.mean_relative_spatial_resolution(),
        outcome_hash(out)
    )
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or_else(|| default.into());
    let path = arg(0, "../shared/data/mobility/oldenburg_10k.csv.gz");
    let points = cloakd::data_files::read_trace_file(std::path::Path::new(&path), Some(PREFIX))?;
    let mut all = workloads(requests_from_trace(&points, &ReplayParams::OLDENBURG));
    // Issue 44's daemon run: the 500m requests in trace order, arriving at 50,000/s (`cloakd
    // simulate --rate 50000`), so ten seconds of tolerance hold the whole run.
    let mut at_rate = all[0].1.clone();
    for (i, req) in at_rate.iter_mut().enumerate() {
        req.arrival_ms = i as i64 / 50;
    }
    all.push(("500m_at_50k", at_rate));
    let modes = [("local_k", SearchMode::LocalK), ("nbr_k", SearchMode::NbrK)];
    let workload = arg(1, "500m");
    if workload == "all" {
        for (name, requests) in &all {
            for (mode_name, mode) in modes {
                for index in IndexKind::ALL {
                    let (out, _) = replay(mode, index, requests);
                    println!(
                        "{name} {} {mode_name}: {}",
                        index.name(),
                        summary(&out, requests)
                    );
                }
            }
        }
        return Ok(());
    }
    let requests = &all
        .iter()
        .find(|(name, _)| *name == workload)
        .ok_or_else(|| anyhow::anyhow!("no workload {workload}"))?
        .1;
    let index = IndexKind::from_name(&arg(2, "rtree"))
        .ok_or_else(|| anyhow::anyhow!("the index is rtree or grid"))?;
    let mode = modes
        .iter()
        .find(|(name, _)| *name == arg(3, "local_k"))
        .ok_or_else(|| anyhow::anyhow!("the mode is local_k or nbr_k"))?
        .1;
    let iterations: usize = arg(4, "3").parse()?;
    let mut best = u64::MAX;
    let mut last = (Vec::new(), SearchStats::default());
    for _ in 0..iterations.max(1) {
        let start = thread_cpu_ns();
        last = replay(mode, index, requests);
        best = best.min(thread_cpu_ns() - start);
    }
    println!(
        "{workload} {} {}: {:.1}k requests/s (best of {iterations}, thread CPU), {}",
        index.name(),
        arg(3, "local_k"),
        requests.len() as f64 / (best as f64 * 1e-9) / 1e3,
        summary(&last.0, requests)
    );
    println!("{}", work(&last.1));
    Ok(())
}
