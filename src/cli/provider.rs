//! `cloakd provider`: the flags and the process of the reference LBS provider of points of interest
//! ([`crate::provider`], docs/provider.md): it loads and indexes the POI file, starts the worker pool
//! and serves the broker until SIGINT/SIGTERM.
//!
//! The process exits only on SIGINT/SIGTERM (0) or an error retrying cannot cure: a bad POI file or
//! flag, the broker refusing the credential or the service.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::poi::{Limits, PoiIndex};
use crate::provider::{Bearer, PoiProvider, Target, connection, load_pois, pool};

#[derive(Debug, clap::Args)]
pub struct ProviderArgs {
    /// POI file: CSV with the header `id,lat,lon,category,name` (optionally gzip'd); see
    /// docs/provider.md for generating one or exporting one from OpenStreetMap.
    #[arg(long, value_name = "FILE")]
    pub pois: PathBuf,
    /// The service to serve (one of the broker's location.services).
    #[arg(long, default_value = "poi")]
    pub service: String,
    /// The broker, as a URL (`https://...` with --ca for TLS).
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// File holding the provider's bearer token (default: $CLOAKD_TOKEN; none: no credential).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// PEM file of the CA that issued the broker's certificate (TLS).
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
    /// Name to verify in the broker's certificate, if not the host of --addr.
    #[arg(long)]
    pub server_name: Option<String>,
    /// Largest `count` of a nearest query.
    #[arg(long, default_value_t = Limits::default().max_count)]
    pub max_count: u32,
    /// Largest `radius_m` of a range query, in metres.
    #[arg(long, default_value_t = Limits::default().max_radius_m)]
    pub max_radius_m: f64,
    /// Largest side of a cloaking box answered, in metres.
    #[arg(long, default_value_t = Limits::default().max_box_m)]
    pub max_box_m: f64,
    /// Most POIs in one candidate list (longer lists are refused with an error).
    #[arg(long, default_value_t = Limits::default().max_candidates)]
    pub max_candidates: usize,
    /// Largest answer payload in bytes: the broker's location.max_payload_bytes.
    #[arg(long, default_value_t = 16_384)]
    pub max_payload_bytes: usize,
    /// Worker threads computing answers, 1 to 1,024 (default: the available cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Requests waiting for a worker, 1 to 1,000,000; a request that finds the queue full is
    /// answered at once with the overloaded answer.
    #[arg(long, value_name = "N", default_value_t = 1_024)]
    pub queue: usize,
    /// Longest wait between two attempts to reconnect to the broker, in milliseconds (the wait
    /// starts at 100 ms and doubles per failed attempt, with jitter), 1 to 3,600,000.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    pub reconnect_max_ms: u64,
}

fn read_token(path: Option<&std::path::Path>) -> anyhow::Result<Option<String>> {
    let token = match path {
        Some(path) => crate::data_files::read_text_file(path)
            .with_context(|| format!("--token-file: cannot read {}", path.display()))?,
        None => std::env::var("CLOAKD_TOKEN").unwrap_or_default(),
    };
    let token = token.trim();
    Ok((!token.is_empty()).then(|| token.to_string()))
}

fn in_range<T: PartialOrd + std::fmt::Display>(
    flag: &str,
    v: T,
    min: T,
    max: T,
) -> anyhow::Result<T> {
    anyhow::ensure!(
        v >= min && v <= max,
        "{flag}: must be between {min} and {max} (got {v})"
    );
    Ok(v)
}

pub fn run(args: ProviderArgs) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = in_range("--threads", args.threads.unwrap_or(cores), 1, 1_024)?;
    let queue = in_range("--queue", args.queue, 1, 1_000_000)?;
    let reconnect_max_ms = in_range("--reconnect-max-ms", args.reconnect_max_ms, 1, 3_600_000)?;
    let limits = Limits {
        max_count: args.max_count,
        max_radius_m: args.max_radius_m,
        max_box_m: args.max_box_m,
        max_candidates: args.max_candidates,
    };
    let target = Target {
        endpoint: connection::endpoint(
            &args.addr,
            args.ca.as_deref(),
            args.server_name.as_deref(),
        )?,
        bearer: Bearer::new(read_token(args.token_file.as_deref())?.as_deref())?,
        service: args.service.clone(),
        max_backoff: Duration::from_millis(reconnect_max_ms),
    };
    let pois = load_pois(&args.pois)?;
    anyhow::ensure!(!pois.is_empty(), "{}: no POIs", args.pois.display());
    let index = PoiIndex::new(pois);
    tracing::info!(
        pois = index.len(),
        categories = index.categories().len(),
        service = %args.service,
        threads,
        queue,
        "POIs indexed"
    );
    let provider = Arc::new(PoiProvider {
        index,
        limits,
        max_payload_bytes: args.max_payload_bytes,
    });
    let pool =
        Arc::new(pool::Pool::new(threads, queue).context("cannot start the worker threads")?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let tally = runtime.block_on(async {
        let (signals, stop) = tokio::sync::watch::channel(0u32);
        tokio::spawn(async move {
            loop {
                crate::daemon::shutdown_signal().await;
                signals.send_modify(|count| *count += 1);
            }
        });
        tracing::info!(addr = %args.addr, "connecting");
        connection::serve(provider, pool, target, stop).await
    })?;
    tracing::info!(
        received = tally.received,
        shed = tally.shed,
        sessions = tally.sessions,
        "stopped"
    );
    // The runtime's tasks end with it; the workers' queue was drained (or a second signal asked to
    // stop at once), so nothing waits for them.
    runtime.shutdown_background();
    Ok(())
}
