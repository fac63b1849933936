//! Times the re-identification risk profile (`cloakd::risk`) on a table: sample and population
//! risk, then SUDA up to a maximum size. Not a test: prints the best of a few runs.
//!
//! `cargo run --release --example risk_timing -- JOB.toml [SUDA_MAX_SIZE] [POPULATION]`
use std::path::Path;
use std::time::Instant;

use cloakd::jobs::files::{load_table, read_job};
use cloakd::risk::classes::of_table;
use cloakd::risk::{Population, RiskOptions, profile};

fn best(runs: usize, mut f: impl FnMut()) -> f64 {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let job_path = Path::new(
        args.get(1)
            .map_or("examples/adult-ola.toml", String::as_str),
    );
    let suda: usize = args.get(2).map_or(Ok(4), |s| s.parse())?;
    let population: f64 = args.get(3).map_or(Ok(318_900_000.0), |s| s.parse())?;
    let job = read_job(job_path)?;
    let table = load_table(&job, job_path, None)?;
    let q = of_table(&table);
    let without_suda = RiskOptions {
        population: Some(Population::Size(population)),
        suda: false,
        ..RiskOptions::default()
    };
    let with_suda = RiskOptions {
        suda: true,
        suda_max_size: Some(suda),
        ..without_suda.clone()
    };
    let sample_population = best(5, || {
        profile(&q, &without_suda, None).expect("profile");
    });
    let whole = best(3, || {
        profile(&q, &with_suda, None).expect("profile");
    });
    println!(
        "{} records x {} QIs: sample+population risk {:.1} ms; with SUDA up to size {suda}: {:.1} ms (SUDA alone {:.1} ms)",
        q.rows,
        q.len(),
        1e3 * sample_population,
        1e3 * whole,
        1e3 * (whole - sample_population)
    );
    Ok(())
}
