//! Criterion benchmark of the transaction engine (personalized rho-uncertainty, rho = 0.5) on the
//! real data in `../shared/data/transactions/` (relative to the repository root), with
//! "personalized+" constraints. Skips with a message when the data is absent.
//!
//! - `exact_m3_window_10k`: the first 10,000 records of BMS-WebView-1' (a daemon-sized window), 40%.
//! - `exact_m3_bms_webview_1_le5`: all of BMS-WebView-1' (54,736 records), 40% sensitive items.
//! - `sampled_m5_bms_webview_2`: all of BMS-WebView-2 (77,512 records), 10% sensitive items,
//!   (eps, delta) = (0.05, 0.05).
//! - `sampled_m5_retail`: all of retail (88,162 records), 1% sensitive items, same parameters.
//!
//! Each data set's utility report (rounds, util_info, util_dist, util_mining) is printed once
//! before it is timed. The sampled runs take seconds each: `cargo bench --bench transactions --
//! --quick` (or a name filter) keeps the whole bench short.
use std::hint::black_box;
use std::io::Read;
use std::path::PathBuf;

use cloakd::transactions::{Mode, Params, PersonalizedPlus, Record, anonymize};

/// Prints one run's report: what the timed runs release.
fn print_report(name: &str, records: &[Record], params: &Params) {
    if let Ok(anonymized) = anonymize(records, params, 1) {
        let r = &anonymized.report;
        eprintln!(
            "{name}: rounds {}, util_info {:.4}, util_dist {:.5}, util_mining {:.3} ({} -> {} rules), restored {}",
            r.rounds,
            r.util_info,
            r.util_dist,
            r.util_mining,
            r.rules_before,
            r.rules_after,
            r.restored
        );
    }
}
use criterion::{Criterion, criterion_group, criterion_main};
use rand::SeedableRng;

fn data_file(name: &str) -> Option<PathBuf> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/data/transactions")
        .join(name);
    if path.exists() {
        Some(path)
    } else {
        eprintln!("skipping: {} not found", path.display());
        None
    }
}

/// Reads up to `limit` records and draws personalized+ constraints with the given share.
fn window(name: &str, limit: usize, share: f64) -> Option<Vec<Record>> {
    let path = data_file(name)?;
    let mut text = String::new();
    flate2::read::MultiGzDecoder::new(std::fs::File::open(path).ok()?)
        .read_to_string(&mut text)
        .ok()?;
    let items: Vec<Vec<u32>> = text
        .lines()
        .take(limit)
        .map(|l| {
            let mut r: Vec<u32> = l
                .split_whitespace()
                .filter_map(|t| t.parse().ok())
                .collect();
            r.sort_unstable();
            r.dedup();
            r
        })
        .filter(|r| !r.is_empty())
        .collect();
    let mut universe: Vec<u32> = items.iter().flatten().copied().collect();
    universe.sort_unstable();
    universe.dedup();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let sensitive = PersonalizedPlus::paper(share).generate(&universe, items.len(), &mut rng);
    Some(
        items
            .into_iter()
            .zip(sensitive)
            .map(|(items, sensitive)| Record { items, sensitive })
            .collect(),
    )
}

fn bench_exact(c: &mut Criterion) {
    let exact_m3 = Params {
        rho: 0.5,
        m: 3,
        mode: Mode::Exact,
    };
    let mut group = c.benchmark_group("transactions");
    group.sample_size(10);
    if let Some(records) = window("bms-webview-1-le5.txt.gz", 10_000, 0.4) {
        group.bench_function("exact_m3_window_10k", |b| {
            b.iter(|| anonymize(black_box(&records), &exact_m3, 1).map(|a| a.report.suppressed))
        });
    }
    if let Some(records) = window("bms-webview-1-le5.txt.gz", usize::MAX, 0.4) {
        print_report("exact_m3_bms_webview_1_le5", &records, &exact_m3);
        group.bench_function("exact_m3_bms_webview_1_le5", |b| {
            b.iter(|| anonymize(black_box(&records), &exact_m3, 1).map(|a| a.report.suppressed))
        });
    }
    group.finish();
}

fn bench_sampled(c: &mut Criterion) {
    let sampled_m5 = Params {
        rho: 0.5,
        m: 5,
        mode: Mode::Sampled {
            epsilon: 0.05,
            delta: 0.05,
        },
    };
    let mut group = c.benchmark_group("transactions");
    group.sample_size(10);
    for (name, file, share) in [
        ("sampled_m5_bms_webview_2", "bms-webview-2.txt.gz", 0.1),
        ("sampled_m5_retail", "retail.txt.gz", 0.01),
    ] {
        if let Some(records) = window(file, usize::MAX, share) {
            print_report(name, &records, &sampled_m5);
            group.bench_function(name, |b| {
                b.iter(|| {
                    anonymize(black_box(&records), &sampled_m5, 1).map(|a| a.report.suppressed)
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_exact, bench_sampled);
criterion_main!(benches);
