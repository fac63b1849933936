//! `cloakd simulate`: a load generator that replays a mobility trace against a running daemon as many
//! mobile clients, and acts as the LBS provider that answers every cloaked request.
//!
//! Each trace row becomes one request of its user (users are spread over `--clients` Submit streams),
//! sent at its trace time divided by `--speedup`, or at a fixed `--rate`. k is drawn uniformly from
//! [`--k-min`, `--k-max`], tolerances from uniform ranges. It reports Gedik & Liu's measures: success rate,
//! relative anonymity (group size / k), relative spatial resolution sqrt(area(Bcn) / area(cloaking box))
//! and relative temporal resolution (2 dt / cloaking interval), both with each side of the cloak floored at
//! 1 m / 1 ms; throughput; latency percentiles from send to Cloaked and to the provider's reply; and the
//! broker overhead, which excludes the wait for peers: for each group, the time from sending the member
//! that completed the group (the last one sent) to receiving its Cloaked event.
//!
//! With `--session-ms` it also reports session anonymity ([`crate::location::tracking`]): for each
//! user's cloaked requests within a session, the users common to all their groups (groups are told
//! apart by their shared box and interval; a session's time is the broker's formation time, the end of
//! the cloaking interval).
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::data_files::{TracePoint, read_trace_file};
use crate::proto::lbs_gateway_client::LbsGatewayClient;
use crate::proto::location_broker_client::LocationBrokerClient;
use crate::proto::location_event::Outcome;
use crate::proto::{
    CloakModel, LbsAnswer, LbsSubscription, LocationEvent, LocationRequest, PositionUpdate,
};

pub mod compare;
mod plan;
mod poi_answers;
mod tally;

use plan::{Plan, plan};
pub use tally::SimulationReport;
use tally::{RunFacts, Tally, print_report};

#[derive(Debug, Clone, clap::Args)]
pub struct SimulateArgs {
    /// The daemon to load, as a URL; several replicas of a cluster as a comma-separated list
    /// (client streams are spread over them in turn, and one provider subscribes on each).
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// Subscribe the provider on only the first N addresses of `--addr` (the other replicas relay
    /// their groups to them); default: on every one.
    #[arg(long)]
    pub providers: Option<usize>,
    /// Processes whose CPU time to report per request (the daemon or its replicas, NATS servers).
    #[arg(long, value_delimiter = ',')]
    pub pid: Vec<u32>,
    /// Trace file (`user_id,timestamp_unix,lat,lon[,...]`, optionally .gz), e.g. from shared/data/mobility/.
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// Replay at most this many trace rows.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Number of concurrent Submit streams the users are spread over.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Time compression: trace seconds per wall-clock second.
    #[arg(long, default_value_t = 1.0, conflicts_with = "rate")]
    pub speedup: f64,
    /// Send at this fixed rate (requests/s) instead of trace time.
    #[arg(long)]
    pub rate: Option<f64>,
    /// k is drawn uniformly from [k_min, k_max].
    #[arg(long, default_value_t = 2)]
    pub k_min: u32,
    #[arg(long, default_value_t = 10)]
    pub k_max: u32,
    /// Spatial tolerances in metres, drawn from [min, max] (equal bounds: a constant) by the
    /// distribution of `--dx-dist` / `--dy-dist`.
    #[arg(long, default_value_t = 500.0)]
    pub dx_min: f64,
    #[arg(long, default_value_t = 500.0)]
    pub dx_max: f64,
    #[arg(long, default_value_t = 500.0)]
    pub dy_min: f64,
    #[arg(long, default_value_t = 500.0)]
    pub dy_max: f64,
    /// How dx is drawn from [dx_min, dx_max]: `uniform`, or `log-uniform` (every factor of ten
    /// equally likely, e.g. `--dx-min 20 --dx-max 20000` for 20 m to 20 km; needs dx_min > 0).
    #[arg(long, value_enum, default_value_t = ToleranceDist::Uniform)]
    pub dx_dist: ToleranceDist,
    /// How dy is drawn from [dy_min, dy_max] (as `--dx-dist`).
    #[arg(long, value_enum, default_value_t = ToleranceDist::Uniform)]
    pub dy_dist: ToleranceDist,
    /// Temporal tolerance in milliseconds, drawn uniformly from [min, max].
    #[arg(long, default_value_t = 10_000)]
    pub dt_min_ms: u64,
    #[arg(long, default_value_t = 10_000)]
    pub dt_max_ms: u64,
    /// Service the requests address (and the simulated provider serves).
    #[arg(long, default_value = "poi")]
    pub service: String,
    /// Seed of the k and tolerance draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Stop waiting for outstanding outcomes this long after the last request was sent.
    #[arg(long, default_value_t = 30)]
    pub drain_secs: u64,
    /// Worker threads of the simulator's own runtime. One keeps the load generator's share of a
    /// machine it shares with the daemon small (at 50,000 requests/s on 2 cores it took 9.1-10.1 µs
    /// per request against 10.4-11.6 with two, docs/performance.md); it still offered 100,000
    /// requests/s there. Raise it when the simulator warns that its requests went out late and its
    /// own CPU (the report's last line) is near a core per thread.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,
    /// Draw k once per user (a user's privacy setting) instead of once per request.
    #[arg(long)]
    pub k_per_user: bool,
    /// Report session anonymity over sessions of this many milliseconds (query tracking).
    #[arg(long, value_name = "MS")]
    pub session_ms: Option<u64>,
    /// Cloaking model the requests ask for; unset leaves it to the broker's location.default_model.
    #[arg(long, value_enum)]
    pub model: Option<ModelArg>,
    /// Each user also reports its position (LocationBroker.Report) every P seconds of the trace, with a
    /// random phase per user (seeded).
    #[arg(long, value_name = "P")]
    pub update_period_s: Option<u32>,
    /// One request per user every P seconds of the trace (random phase per user, seeded) instead of one
    /// per trace row.
    #[arg(long, value_name = "P")]
    pub request_period_s: Option<u32>,
    /// POI file (CSV `id,lat,lon,category,name`): every request carries `--poi-query`, the provider
    /// answers with the reference provider's candidate list, and each reply is refined with the
    /// client's true point and checked against its exact answer (docs/provider.md).
    #[arg(long, value_name = "FILE")]
    pub pois: Option<PathBuf>,
    /// With --pois: `nearest:CATEGORY:N` or `range:CATEGORY:METRES`.
    #[arg(long, default_value = "nearest:cafe:1")]
    pub poi_query: String,
    /// Also write the report as JSON (with --compare: the comparison).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// GEO_IND: the privacy level per km the requests ask for; unset leaves it to the broker's
    /// location.geo_ind.default_epsilon_per_km.
    #[arg(long, value_name = "E")]
    pub epsilon_per_km: Option<f64>,
    /// Replay the trace once per model listed (geo-ind once per --epsilons value) and report them side
    /// by side: success, latency, quality loss, the Bayesian adversary's expected error, exact POI
    /// answers, budget exhaustion ([`compare`]).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "MODELS")]
    pub compare: Vec<ModelArg>,
    /// With --compare: the epsilons (per km) geo-ind is replayed at.
    #[arg(long, value_delimiter = ',', default_value = "0.5,1,2,5")]
    pub epsilons: Vec<f64>,
    /// With --compare: the side in metres of the cells of the adversary's prior (the trace's own
    /// position density).
    #[arg(long, default_value_t = 100.0)]
    pub grid_m: f64,
    /// With --compare: the adversary's error is averaged over at most this many answers per run
    /// (evenly spread over the run).
    #[arg(long, default_value_t = 5_000)]
    pub adversary_sample: usize,
    /// With --compare: also draw the trade-off chart (quality loss across, adversary error up) to
    /// this file, SVG or PNG by its extension.
    #[arg(long, value_name = "FILE")]
    pub chart: Option<PathBuf>,
    /// Prefix of every user id (set per run by --compare, so the runs share no user state).
    #[arg(skip)]
    pub user_prefix: String,
    /// Keep what the provider saw of each answer, with the true position (set by --compare).
    #[arg(skip)]
    pub observe: bool,
}

/// `--dx-dist`, `--dy-dist`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToleranceDist {
    Uniform,
    LogUniform,
}

/// `--model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelArg {
    Requests,
    Presence,
    GeoInd,
}

impl ModelArg {
    fn proto(self) -> i32 {
        match self {
            ModelArg::Requests => CloakModel::Requests as i32,
            ModelArg::Presence => CloakModel::Presence as i32,
            ModelArg::GeoInd => CloakModel::GeoInd as i32,
        }
    }

    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ModelArg::Requests => "requests",
            ModelArg::Presence => "presence",
            ModelArg::GeoInd => "geo-ind",
        }
    }
}

/// Events one stream read at once, with the instant they were read (one message to the main loop
/// per batch, so the load generator spends less of the shared machine on waking it).
enum Observation {
    Events(Vec<LocationEvent>, Instant),
}

/// Most events or cloaked requests taken off a stream at once.
const READ_BATCH: usize = 256;

/// How late the last request may go out before the simulator says it did not keep its schedule
/// (also at least 5 % of the planned sending time): the timer fires once a millisecond, and a
/// machine shared with the daemon delays a wake-up by a few now and then.
const SEND_LAG_MS: f64 = 20.0;

/// Runs the simulation (blocking), printing progress and the report.
pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let points = read_trace_file(&args.trace, args.limit)?;
    anyhow::ensure!(
        !points.is_empty(),
        "{}: the trace has no rows",
        args.trace.display()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(args.threads))
        .enable_all()
        .build()?;
    // The run is a task of the runtime, not the main thread's future: its streams' readers wake it
    // many thousand times a second, and waking a task on a worker needs no system call.
    if !args.compare.is_empty() {
        let run = runtime.spawn(async move { compare::run(&args, &points).await });
        return runtime
            .block_on(run)
            .context("the comparison task failed")?;
    }
    let run = runtime.spawn(async move {
        let report = simulate(&args, &points).await;
        (args, report)
    });
    let (args, report) = runtime
        .block_on(run)
        .context("the simulation task failed")?;
    let report = report?;
    print_report(&report);
    if report.send_lag_ms > (0.05 * report.planned_sending_seconds * 1e3).max(SEND_LAG_MS) {
        eprintln!(
            "simulate: the last request went out {:.0} ms after its due time ({:.2} s of sending planned): either the simulator could not send that fast (--threads {}; raise it) or the daemon did not read that fast (HTTP/2 flow control held the streams back)",
            report.send_lag_ms, report.planned_sending_seconds, args.threads
        );
    }
    if let Some(path) = &args.json {
        cloakd::atomic_file::write(path, &serde_json::to_vec_pretty(&report)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

async fn simulate(args: &SimulateArgs, points: &[TracePoint]) -> anyhow::Result<SimulationReport> {
    let Plan {
        requests: mut planned,
        updates,
    } = plan(args, points)?;
    let poi_check = match &args.pois {
        Some(file) => Some(Arc::new(poi_answers::PoiCheck::new(file, &args.poi_query)?)),
        None => None,
    };
    let mut poi_report = poi_answers::PoiReport::default();
    for p in planned.iter_mut().filter(|_| poi_check.is_some()) {
        p.request.payload = poi_check.as_ref().map(|c| c.payload()).unwrap_or_default();
    }
    let total = planned.len();
    anyhow::ensure!(total > 0, "the workload has no requests");
    // Each simulated client stream gets its own connection, as phones would, to the replicas in
    // turn; each replica's provider one more.
    let mut endpoints = Vec::new();
    for addr in args
        .addr
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        let endpoint = tonic::transport::Endpoint::from_shared(addr.to_string())
            .with_context(|| format!("--addr: {addr:?} is not a URL"))?
            .tcp_nodelay(true)
            .http2_adaptive_window(true);
        endpoints.push((addr.to_string(), endpoint));
    }
    anyhow::ensure!(!endpoints.is_empty(), "--addr: no daemon given");
    let connect = |i: usize| {
        let (addr, endpoint) = endpoints[i % endpoints.len()].clone();
        async move {
            endpoint
                .connect()
                .await
                .with_context(|| format!("cannot connect to {addr}"))
        }
    };
    // The providers, one per replica: each answers every cloaked request at once. A request cloaked
    // before this run began was left on the daemon's queue by an earlier run (of `--compare`, or
    // another simulator) whose provider fell behind: it is acknowledged without an answer, so this
    // run's provider does not spend its time on answers nobody waits for.
    let run_began_ms = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(i64::MAX);
    let mut provider_tasks = Vec::new();
    let providers = args.providers.unwrap_or(endpoints.len());
    anyhow::ensure!(
        (1..=endpoints.len()).contains(&providers),
        "--providers: {providers} is not between 1 and the {} addresses of --addr",
        endpoints.len()
    );
    for i in 0..providers {
        let mut gateway = LbsGatewayClient::new(connect(i).await?);
        let mut cloaked_feed = gateway
            .subscribe(LbsSubscription {
                service: args.service.clone(),
            })
            .await
            .context("Subscribe")?
            .into_inner();
        let (answer_tx, answer_rx) = mpsc::channel::<LbsAnswer>(65_536);
        provider_tasks.push(tokio::spawn(async move {
            gateway.answer(ReceiverStream::new(answer_rx)).await
        }));
        let poi_provider = poi_check.as_ref().map(|c| Arc::clone(&c.provider));
        provider_tasks.push(tokio::spawn(async move {
            while let Ok(Some(cloaked)) = cloaked_feed.message().await {
                if cloaked.t_end_ms < run_began_ms {
                    let ack = LbsAnswer {
                        pseudonym: cloaked.pseudonym,
                        payload: Vec::new(),
                        ack: true,
                    };
                    if answer_tx.send(ack).await.is_err() {
                        break;
                    }
                    continue;
                }
                let payload = match &poi_provider {
                    Some(provider) => provider.answer(&cloaked),
                    None => b"cafe at the corner".to_vec(),
                };
                let answer = LbsAnswer {
                    pseudonym: cloaked.pseudonym,
                    payload,
                    ack: false,
                };
                if answer_tx.send(answer).await.is_err() {
                    break;
                }
            }
            Ok(tonic::Response::new(crate::proto::AnswerSummary::default()))
        }));
    }

    // Per-stream request lists; the send instants are recorded per request_no.
    let mut per_stream: Vec<Vec<(Duration, LocationRequest)>> = vec![Vec::new(); args.clients];
    let mut requested = Vec::with_capacity(total);
    let mut user_of = Vec::with_capacity(total);
    let mut position_of = Vec::with_capacity(total);
    for p in planned {
        user_of.push(p.user as u64);
        position_of.push((p.request.lat, p.request.lon));
        requested.push((
            p.request.k.unwrap_or(1),
            p.request.dx_m.unwrap_or(0.0),
            p.request.dy_m.unwrap_or(0.0),
            p.request.dt_ms.unwrap_or(0),
        ));
        per_stream[p.stream].push((p.due, p.request));
    }
    let sent_at: Arc<Vec<std::sync::atomic::AtomicU64>> = Arc::new(
        (0..total)
            .map(|_| std::sync::atomic::AtomicU64::new(u64::MAX))
            .collect(),
    );
    let (obs_tx, mut obs_rx) = mpsc::channel::<Observation>(65_536);
    // Every stream is connected and opened before the clock starts, so the schedule (and the
    // offered rate) does not include connection setup: with 32 streams that would make the first
    // requests of the last streams late.
    let mut streams = Vec::new();
    for (i, requests) in per_stream.into_iter().filter(|r| !r.is_empty()).enumerate() {
        let mut broker = LocationBrokerClient::new(connect(i).await?);
        let (tx, rx) = mpsc::channel::<LocationRequest>(4096);
        let mut events = broker
            .submit(ReceiverStream::new(rx))
            .await
            .context("Submit")?
            .into_inner()
            .ready_chunks(READ_BATCH);
        let obs = obs_tx.clone();
        tokio::spawn(async move {
            while let Some(chunk) = events.next().await {
                let at = Instant::now();
                let read = chunk.len();
                let batch: Vec<LocationEvent> = chunk.into_iter().map_while(Result::ok).collect();
                let failed = batch.len() < read;
                if !batch.is_empty() && obs.send(Observation::Events(batch, at)).await.is_err() {
                    break;
                }
                if failed {
                    break;
                }
            }
        });
        streams.push((requests, tx));
    }
    drop(obs_tx);
    // Position updates: one Report stream, each update at its due time.
    let updates_sent = updates.len() as u64;
    let report_stream = if updates.is_empty() {
        None
    } else {
        let mut broker = LocationBrokerClient::new(connect(0).await?);
        let (tx, rx) = mpsc::channel::<PositionUpdate>(4096);
        let report = tokio::spawn(async move { broker.report(ReceiverStream::new(rx)).await });
        Some((report, tx))
    };

    // The last request's due time: how late it went out tells whether the schedule was kept.
    let last_due = streams
        .iter()
        .flat_map(|(requests, _)| requests.iter().map(|(due, _)| *due))
        .max()
        .unwrap_or_default();
    let cpu_before = cpu_of(&args.pid);
    let own_cpu_before = super::publish_load::cpu_seconds(std::process::id());
    let start = Instant::now();
    let tokio_start = tokio::time::Instant::now();
    let mut senders = Vec::new();
    for (requests, tx) in streams {
        let sent_at = Arc::clone(&sent_at);
        senders.push(tokio::spawn(async move {
            for (due, request) in requests {
                let now = tokio::time::Instant::now();
                if tokio_start + due > now + Duration::from_millis(1) {
                    tokio::time::sleep_until(tokio_start + due).await;
                }
                let no = request.request_no as usize;
                sent_at[no].store(
                    start.elapsed().as_nanos() as u64,
                    std::sync::atomic::Ordering::Relaxed,
                );
                if tx.send(request).await.is_err() {
                    break;
                }
            }
            // Keep the stream open (replies still come) until the run ends.
            tx
        }));
    }
    let reporter = report_stream.map(|(report, tx)| {
        let feeder = tokio::spawn(async move {
            for (due, update) in updates {
                if tokio_start + due > tokio::time::Instant::now() + Duration::from_millis(1) {
                    tokio::time::sleep_until(tokio_start + due).await;
                }
                if tx.send(update).await.is_err() {
                    break;
                }
            }
        });
        (feeder, report)
    });

    let progress = indicatif::ProgressBar::new(total as u64);
    progress.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} outcomes ({per_sec}) {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );

    let mut tally = Tally::new(start, requested, user_of, args.session_ms.is_some())?;
    if args.observe {
        tally.keep_observations(position_of.clone(), args.epsilon_per_km.unwrap_or(0.0));
    }
    let mut senders_done = false;
    while !tally.complete() {
        let wait = if senders_done {
            Duration::from_secs(args.drain_secs)
        } else {
            Duration::from_secs(3600)
        };
        let observation = match tokio::time::timeout(wait, obs_rx.recv()).await {
            Ok(Some(o)) => o,
            Ok(None) | Err(_) => break,
        };
        if !senders_done && senders.iter().all(|s| s.is_finished()) {
            senders_done = true;
        }
        let Observation::Events(events, at) = observation;
        for event in events {
            let no = event.request_no as usize;
            if no >= total {
                continue;
            }
            let sent_ns = sent_at[no].load(std::sync::atomic::Ordering::Relaxed);
            let since_send_us = at
                .duration_since(start)
                .as_nanos()
                .saturating_sub(sent_ns as u128)
                / 1000;
            let since_send_us = u64::try_from(since_send_us).unwrap_or(u64::MAX).max(1);
            match event.outcome {
                Some(Outcome::Reply(reply)) => {
                    if let Some(check) = &poi_check {
                        let (lat, lon) = position_of[no];
                        check.check(&reply.payload, lat, lon, &mut poi_report);
                    }
                    tally.reply(since_send_us);
                }
                Some(Outcome::Undelivered(_)) => tally.undelivered(),
                outcome => {
                    if tally.outcome(no, outcome, at, sent_ns, since_send_us) {
                        progress.inc(1);
                        if tally.outcomes().is_multiple_of(4096) {
                            progress.set_message(tally.summary());
                        }
                    }
                }
            }
        }
    }
    progress.finish_and_clear();
    let last_send_ns = sent_at
        .iter()
        .map(|t| t.load(std::sync::atomic::Ordering::Relaxed))
        .filter(|&t| t != u64::MAX)
        .max()
        .unwrap_or(0);
    let sending_seconds = (last_send_ns as f64 / 1e9).max(1e-9);
    let send_lag = Duration::from_nanos(last_send_ns).saturating_sub(last_due);
    for s in senders {
        drop(s.await);
    }
    for task in provider_tasks {
        task.abort();
    }
    let updates_accepted = match reporter {
        None => 0,
        Some((feeder, report)) => {
            let _ = feeder.await;
            match report.await {
                Ok(Ok(summary)) => summary.into_inner().accepted,
                Ok(Err(status)) => {
                    anyhow::bail!("Report failed: {} {}", status.code(), status.message())
                }
                Err(e) => anyhow::bail!("Report task failed: {e}"),
            }
        }
    };
    tally.report(RunFacts {
        sending_seconds,
        planned_sending_seconds: last_due.as_secs_f64(),
        send_lag_ms: send_lag.as_secs_f64() * 1e3,
        cpu_seconds: cpu_before.zip(cpu_of(&args.pid)).map(|(a, b)| b - a),
        simulator_cpu_seconds: own_cpu_before
            .zip(super::publish_load::cpu_seconds(std::process::id()))
            .map(|(a, b)| b - a),
        updates_sent,
        updates_accepted,
        session_ms: args.session_ms,
        poi: poi_check.map(|check| check.finish(poi_report)),
    })
}

/// CPU seconds `pids` used so far, together; `None` without pids or when one is unreadable.
fn cpu_of(pids: &[u32]) -> Option<f64> {
    if pids.is_empty() {
        return None;
    }
    pids.iter()
        .map(|&pid| super::publish_load::cpu_seconds(pid))
        .sum()
}
