//! The presence engine's bookkeeping on the broker's path: every REQUESTS request records its
//! user's latest position (`PresenceEngine::update`), and one slow update stalls the one broker
//! actor and every request queued behind it. This replays the Oldenburg requests at a fixed rate
//! into a presence engine on the daemon's defaults and prints the distribution of one update's
//! thread CPU time: the count over 100 µs and the longest are the stalls.
//!
//! ```sh
//! cargo run --release --example presence_updates -- ../shared/data/mobility/oldenburg_10k.csv.gz 50000
//! ```
//! Arguments: the trace; the arrival rate per second (default 50,000, as `cloakd simulate --rate`).

#[path = "../benches/common/thread_cpu.rs"]
mod thread_cpu;

use cloakd::location::presence::{PresenceEngine, PresenceParams};
use cloakd::location::replay::{ReplayParams, requests_from_trace};
use thread_cpu::thread_cpu_ns;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .cloned()
        .unwrap_or_else(|| "../shared/data/mobility/oldenburg_10k.csv.gz".into());
    let rate: i64 = args.get(1).map_or(Ok(50_000), |r| r.parse())?;
    let points = cloakd::data_files::read_trace_file(std::path::Path::new(&path), Some(300_000))?;
    let requests = requests_from_trace(&points, &ReplayParams::OLDENBURG);
    // `config/default.toml`: presence_max_age_ms, max_tracked_users, presence_target_m.
    let mut engine = PresenceEngine::new(
        PresenceParams {
            max_age_ms: 30_000,
            max_tracked_users: 100_000,
            target_side_m: 500.0,
        },
        7,
    );
    let mut took = Vec::with_capacity(requests.len());
    for (i, req) in requests.iter().enumerate() {
        let now_ms = i as i64 * 1000 / rate;
        let start = thread_cpu_ns();
        engine.update(req.user, req.lat, req.lon, now_ms)?;
        took.push(thread_cpu_ns() - start);
    }
    let total: u64 = took.iter().sum();
    took.sort_unstable();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize] as f64 / 1e3;
    println!(
        "{} updates at {rate}/s: mean {:.2} µs, p50 {:.2}, p99.99 {:.1}, max {:.1} µs; {} over 100 µs",
        took.len(),
        total as f64 / took.len() as f64 / 1e3,
        at(0.5),
        at(0.9999),
        at(1.0),
        took.iter().filter(|&&ns| ns > 100_000).count(),
    );
    Ok(())
}
