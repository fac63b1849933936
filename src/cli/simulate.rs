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
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::location::geo::METRES_PER_DEGREE_LAT;
use crate::location::replay::{PeriodicEvent, PeriodicParams, log_uniform, periodic_workload};
use crate::location::tracking::{CloakedObservation, SessionAnonymity, session_anonymity};
use crate::proto::lbs_gateway_client::LbsGatewayClient;
use crate::proto::location_broker_client::LocationBrokerClient;
use crate::proto::location_event::Outcome;
use crate::proto::{
    CloakModel, LbsAnswer, LbsSubscription, LocationEvent, LocationRequest, PositionUpdate,
};
use crate::workload::{TracePoint, read_trace_file};

mod poi;

#[derive(Debug, clap::Args)]
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
    /// Also write the report as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// `--dx-dist`, `--dy-dist`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ToleranceDist {
    Uniform,
    LogUniform,
}

impl ToleranceDist {
    fn draw(self, rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
        match self {
            ToleranceDist::Uniform => uniform_f(rng, lo, hi),
            ToleranceDist::LogUniform => log_uniform(rng, lo, hi),
        }
    }
}

/// `--model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ModelArg {
    Requests,
    Presence,
}

impl ModelArg {
    fn proto(self) -> i32 {
        match self {
            ModelArg::Requests => CloakModel::Requests as i32,
            ModelArg::Presence => CloakModel::Presence as i32,
        }
    }
}

/// The measured outcome of a run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SimulationReport {
    pub requests: u64,
    pub cloaked: u64,
    pub expired: u64,
    pub rejected: u64,
    pub undelivered: u64,
    pub missing: u64,
    pub replies: u64,
    pub success_rate: f64,
    pub mean_relative_anonymity: f64,
    pub median_relative_spatial_resolution: f64,
    pub median_relative_temporal_resolution: f64,
    /// From the first send to the last outcome (expiries arrive up to dt after the last send).
    pub seconds: f64,
    /// Requests sent per second while sending.
    pub offered_per_s: f64,
    /// Requests handled per second: cloaked outcomes over the time from the first send to the last
    /// Cloaked event (a group forms on an arrival, so this is the broker's cloaking rate).
    pub throughput_per_s: f64,
    pub cloak_latency_ms: Percentiles,
    pub reply_latency_ms: Percentiles,
    pub broker_overhead_ms: Percentiles,
    /// With `--update-period-s`: position updates sent, and accepted by the broker.
    pub updates_sent: u64,
    pub updates_accepted: u64,
    /// With `--pid`: user plus system CPU seconds those processes used during the run, together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_seconds: Option<f64>,
    /// With `--session-ms`: what intersecting each user's groups over a session leaves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_anonymity: Option<SessionAnonymity>,
    /// With `--pois`: the clients' refined POI answers against their exact answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poi: Option<poi::PoiReport>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Percentiles {
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        Percentiles {
            p50: ms(0.5),
            p90: ms(0.9),
            p99: ms(0.99),
            max: h.max() as f64 / 1000.0,
        }
    }
}

struct Planned {
    request: LocationRequest,
    /// Index of the request's user (first appearance order).
    user: usize,
    stream: usize,
    /// Offset from the start at which to send.
    due: Duration,
}

fn uniform_f(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    if hi > lo {
        rng.random_range(lo..=hi)
    } else {
        lo
    }
}

fn plan(args: &SimulateArgs, points: &[TracePoint]) -> anyhow::Result<Plan> {
    anyhow::ensure!(args.clients >= 1, "--clients: must be at least 1");
    anyhow::ensure!(
        args.k_min >= 1 && args.k_min <= args.k_max,
        "--k-min/--k-max: need 1 <= k_min <= k_max"
    );
    anyhow::ensure!(
        args.speedup > 0.0 && args.speedup.is_finite(),
        "--speedup: must be > 0"
    );
    if let Some(rate) = args.rate {
        anyhow::ensure!(rate > 0.0 && rate.is_finite(), "--rate: must be > 0");
    }
    for (flag, dist, min) in [
        ("--dx-min", args.dx_dist, args.dx_min),
        ("--dy-min", args.dy_dist, args.dy_min),
    ] {
        anyhow::ensure!(
            dist == ToleranceDist::Uniform || (min > 0.0 && min.is_finite()),
            "{flag}: must be > 0 for a log-uniform draw"
        );
    }
    if args.update_period_s.is_some() || args.request_period_s.is_some() {
        return plan_periodic(args, points);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let t0 = points.first().map(|p| p.timestamp).unwrap_or(0);
    let mut streams: HashMap<&str, usize> = HashMap::new();
    let mut user_k: HashMap<&str, u32> = HashMap::new();
    let mut planned = Vec::with_capacity(points.len());
    for (index, point) in points.iter().enumerate() {
        let next = streams.len();
        let user = *streams.entry(point.user_id.as_str()).or_insert(next);
        let stream = user % args.clients;
        let k = if args.k_per_user {
            *user_k
                .entry(point.user_id.as_str())
                .or_insert_with(|| rng.random_range(args.k_min..=args.k_max))
        } else {
            rng.random_range(args.k_min..=args.k_max)
        };
        let due = match args.rate {
            Some(rate) => Duration::from_secs_f64(index as f64 / rate),
            // Spread the rows of one trace second evenly over that second.
            None => Duration::from_secs_f64(((point.timestamp - t0) as f64) / args.speedup),
        };
        let request = planned_request(
            args,
            &mut rng,
            point.user_id.clone(),
            index as u64,
            (point.lat, point.lon),
            k,
        );
        planned.push(Planned {
            request,
            user,
            stream,
            due,
        });
    }
    if args.rate.is_none() {
        // Rows of the same trace second go out evenly spread over the (compressed) second.
        let mut start = 0;
        while start < planned.len() {
            let mut end = start;
            while end < planned.len() && planned[end].due == planned[start].due {
                end += 1;
            }
            let width = Duration::from_secs_f64(1.0 / args.speedup);
            let n = (end - start) as u32;
            for (i, p) in planned[start..end].iter_mut().enumerate() {
                p.due += width * i as u32 / n.max(1);
            }
            start = end;
        }
    }
    Ok(Plan {
        requests: planned,
        updates: Vec::new(),
    })
}

/// One request of the run: tolerances drawn from their ranges (dx, dy, then dt).
fn planned_request(
    args: &SimulateArgs,
    rng: &mut ChaCha8Rng,
    user_id: String,
    request_no: u64,
    (lat, lon): (f64, f64),
    k: u32,
) -> LocationRequest {
    LocationRequest {
        user_id,
        request_no,
        lat,
        lon,
        k: Some(k),
        dx_m: Some(args.dx_dist.draw(rng, args.dx_min, args.dx_max)),
        dy_m: Some(args.dy_dist.draw(rng, args.dy_min, args.dy_max)),
        dt_ms: Some(if args.dt_max_ms > args.dt_min_ms {
            rng.random_range(args.dt_min_ms..=args.dt_max_ms)
        } else {
            args.dt_min_ms
        }),
        payload: b"nearest cafe".to_vec(),
        service: args.service.clone(),
        model: args.model.map(ModelArg::proto),
    }
}

/// The planned run: requests, and position updates with their send offsets.
struct Plan {
    requests: Vec<Planned>,
    updates: Vec<(Duration, PositionUpdate)>,
}

/// `--update-period-s` / `--request-period-s`: the periodic workload of
/// [`crate::location::replay::periodic_workload`] (events of one trace second spread over it).
fn plan_periodic(args: &SimulateArgs, points: &[TracePoint]) -> anyhow::Result<Plan> {
    let request_period_s = args.request_period_s.unwrap_or(1);
    anyhow::ensure!(
        request_period_s >= 1,
        "--request-period-s: must be at least 1"
    );
    anyhow::ensure!(
        args.update_period_s != Some(0),
        "--update-period-s: must be at least 1"
    );
    let workload = periodic_workload(
        points,
        &PeriodicParams {
            update_period_s: args.update_period_s.unwrap_or(0),
            request_period_s,
            k_min: args.k_min,
            k_max: args.k_max,
            seed: args.seed,
        },
    );
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed ^ 0x5eed);
    let mut user_k: HashMap<usize, u32> = HashMap::new();
    let t0_ms = points.first().map(|p| p.timestamp).unwrap_or(0) * 1000;
    let mut plan = Plan {
        requests: Vec::new(),
        updates: Vec::new(),
    };
    for (index, event) in workload.events.iter().enumerate() {
        let due = match args.rate {
            Some(rate) => Duration::from_secs_f64(index as f64 / rate),
            None => Duration::from_secs_f64(
                (event.at_ms() - t0_ms).max(0) as f64 / 1000.0 / args.speedup,
            ),
        };
        match *event {
            PeriodicEvent::Update { user, lat, lon, .. } => plan.updates.push((
                due,
                PositionUpdate {
                    user_id: workload.user_ids[user].clone(),
                    lat,
                    lon,
                },
            )),
            PeriodicEvent::Request {
                user, lat, lon, k, ..
            } => {
                let k = if args.k_per_user {
                    *user_k.entry(user).or_insert(k)
                } else {
                    k
                };
                let request = planned_request(
                    args,
                    &mut rng,
                    workload.user_ids[user].clone(),
                    plan.requests.len() as u64,
                    (lat, lon),
                    k,
                );
                plan.requests.push(Planned {
                    request,
                    user,
                    stream: user % args.clients,
                    due,
                });
            }
        }
    }
    Ok(plan)
}

/// A cloaked group as the clients see it: its shared box (as bits) and interval.
type GroupKey = (u64, u64, u64, u64, i64, i64);
/// Latest send time among the members seen (ns since start), when that member's Cloaked arrived,
/// members seen, group size.
type GroupSeen = (u64, Instant, u32, u32);

/// Events one stream read at once, with the instant they were read (one message to the main loop
/// per batch, so the load generator spends less of the shared machine on waking it).
enum Observation {
    Events(Vec<LocationEvent>, Instant),
}

/// Most events or cloaked requests taken off a stream at once.
const READ_BATCH: usize = 256;

/// Runs the simulation (blocking), printing progress and the report.
pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let points = read_trace_file(&args.trace, args.limit)?;
    anyhow::ensure!(
        !points.is_empty(),
        "{}: the trace has no rows",
        args.trace.display()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(simulate(&args, &points))?;
    print_report(&report);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)
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
        Some(file) => Some(Arc::new(poi::PoiCheck::new(file, &args.poi_query)?)),
        None => None,
    };
    let mut poi_report = poi::PoiReport::default();
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
    // The providers, one per replica: each answers every cloaked request at once.
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
    let cpu_before = cpu_of(&args.pid);
    let start = Instant::now();
    let tokio_start = tokio::time::Instant::now();
    let mut senders = Vec::new();
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
    drop(obs_tx);
    // Position updates: one Report stream, each update at its due time.
    let updates_sent = updates.len() as u64;
    let reporter = if updates.is_empty() {
        None
    } else {
        let mut broker = LocationBrokerClient::new(connect(0).await?);
        let (tx, rx) = mpsc::channel::<PositionUpdate>(4096);
        let report = tokio::spawn(async move { broker.report(ReceiverStream::new(rx)).await });
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
        Some((feeder, report))
    };

    let progress = indicatif::ProgressBar::new(total as u64);
    progress.set_style(
        indicatif::ProgressStyle::with_template(
            "{elapsed_precise} [{bar:40}] {pos}/{len} outcomes ({per_sec}) {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );

    let mut outcome_seen = vec![false; total];
    let mut outcomes = 0usize;
    let (mut cloaked, mut expired, mut rejected, mut undelivered, mut replies) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut anonymity_sum = 0.0;
    let mut spatial = Vec::new();
    let mut temporal = Vec::new();
    let mut cloak_latency = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
    let mut reply_latency = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
    let mut overhead = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)?;
    // Groups: identified by their shared box and interval; value = (latest send ns, its request, recv).
    let mut groups: HashMap<GroupKey, GroupSeen> = HashMap::new();
    let mut group_ids: HashMap<GroupKey, u64> = HashMap::new();
    let mut tracked: Vec<CloakedObservation> = Vec::new();
    let mut last_outcome = start;
    let mut last_cloaked = start;
    let mut senders_done = false;
    let mut replies_expected = 0u64;
    loop {
        if outcomes >= total && replies >= replies_expected {
            break;
        }
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
                    replies += 1;
                    reply_latency.saturating_record(since_send_us);
                    continue;
                }
                Some(Outcome::Undelivered(_)) => {
                    undelivered += 1;
                    replies_expected = replies_expected.saturating_sub(1);
                    continue;
                }
                _ => {}
            }
            if std::mem::replace(&mut outcome_seen[no], true) {
                continue;
            }
            outcomes += 1;
            last_outcome = at;
            progress.inc(1);
            let (k, dx, dy, dt) = requested[no];
            match event.outcome {
                Some(Outcome::Cloaked(c)) => {
                    cloaked += 1;
                    last_cloaked = at;
                    replies_expected += 1;
                    cloak_latency.saturating_record(since_send_us);
                    anonymity_sum += f64::from(c.group_size) / f64::from(k.max(1));
                    if let Some(b) = c.r#box {
                        let centre = 0.5 * (b.min_lat + b.max_lat);
                        let w = ((b.max_lon - b.min_lon)
                            * METRES_PER_DEGREE_LAT
                            * centre.to_radians().cos())
                        .max(1.0);
                        let h = ((b.max_lat - b.min_lat) * METRES_PER_DEGREE_LAT).max(1.0);
                        spatial.push(((4.0 * dx * dy) / (w * h)).sqrt());
                        let interval = ((c.t_end_ms - c.t_start_ms) as f64).max(1.0);
                        temporal.push(2.0 * dt as f64 / interval);
                        let key = (
                            b.min_lat.to_bits(),
                            b.min_lon.to_bits(),
                            b.max_lat.to_bits(),
                            b.max_lon.to_bits(),
                            c.t_start_ms,
                            c.t_end_ms,
                        );
                        let entry = groups.entry(key).or_insert((0, at, 0, c.group_size));
                        entry.2 += 1;
                        if sent_ns >= entry.0 {
                            entry.0 = sent_ns;
                            entry.1 = at;
                        }
                        if args.session_ms.is_some() {
                            let next_id = group_ids.len() as u64;
                            tracked.push(CloakedObservation {
                                user: user_of[no],
                                group: *group_ids.entry(key).or_insert(next_id),
                                formed_at_ms: c.t_end_ms,
                                k,
                            });
                        }
                    }
                }
                Some(Outcome::Expired(_)) => expired += 1,
                Some(Outcome::Rejected(_)) => rejected += 1,
                _ => {}
            }
            if outcomes.is_multiple_of(4096) {
                progress.set_message(format!(
                    "{cloaked} cloaked, {expired} expired, {replies} replies"
                ));
            }
        }
    }
    progress.finish_and_clear();
    let seconds = last_outcome.duration_since(start).as_secs_f64().max(1e-9);
    let cloaking_seconds = last_cloaked.duration_since(start).as_secs_f64().max(1e-9);
    let last_send_ns = sent_at
        .iter()
        .map(|t| t.load(std::sync::atomic::Ordering::Relaxed))
        .filter(|&t| t != u64::MAX)
        .max()
        .unwrap_or(0);
    let sending_seconds = (last_send_ns as f64 / 1e9).max(1e-9);
    for ((..), (latest_ns, at, members, size)) in &groups {
        if members == size {
            let us = at
                .duration_since(start)
                .as_nanos()
                .saturating_sub(u128::from(*latest_ns))
                / 1000;
            overhead.saturating_record(u64::try_from(us).unwrap_or(u64::MAX).max(1));
        }
    }
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
    let median = |v: &mut Vec<f64>| {
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let cpu_seconds = cpu_before.zip(cpu_of(&args.pid)).map(|(a, b)| b - a);
    Ok(SimulationReport {
        cpu_seconds,
        requests: total as u64,
        cloaked,
        expired,
        rejected,
        undelivered,
        missing: (total - outcomes) as u64,
        replies,
        success_rate: cloaked as f64 / total as f64,
        mean_relative_anonymity: if cloaked > 0 {
            anonymity_sum / cloaked as f64
        } else {
            0.0
        },
        median_relative_spatial_resolution: median(&mut spatial),
        median_relative_temporal_resolution: median(&mut temporal),
        seconds,
        offered_per_s: total as f64 / sending_seconds,
        throughput_per_s: cloaked as f64 / cloaking_seconds,
        cloak_latency_ms: Percentiles::of(&cloak_latency),
        reply_latency_ms: Percentiles::of(&reply_latency),
        broker_overhead_ms: Percentiles::of(&overhead),
        updates_sent,
        updates_accepted,
        session_anonymity: args
            .session_ms
            .map(|session_ms| session_anonymity(&tracked, session_ms)),
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

fn print_report(r: &SimulationReport) {
    println!("requests             {}", r.requests);
    println!(
        "outcomes             {} cloaked, {} expired, {} rejected, {} missing ({} undelivered, {} replies)",
        r.cloaked, r.expired, r.rejected, r.missing, r.undelivered, r.replies
    );
    if r.updates_sent > 0 {
        println!(
            "position updates     {} sent, {} accepted",
            r.updates_sent, r.updates_accepted
        );
    }
    println!("success rate         {:.2} %", 100.0 * r.success_rate);
    println!(
        "relative anonymity   {:.3} (mean group size / k)",
        r.mean_relative_anonymity
    );
    println!(
        "rel. spatial res.    {:.3} (median sqrt(area Bcn / area cloak))",
        r.median_relative_spatial_resolution
    );
    println!(
        "rel. temporal res.   {:.3} (median 2 dt / cloak interval)",
        r.median_relative_temporal_resolution
    );
    println!(
        "throughput           {:.0} cloaked requests/s (offered {:.0} requests/s; run {:.2} s incl. expiries)",
        r.throughput_per_s, r.offered_per_s, r.seconds
    );
    for (name, p) in [
        ("cloak latency", &r.cloak_latency_ms),
        ("reply latency", &r.reply_latency_ms),
        ("broker overhead", &r.broker_overhead_ms),
    ] {
        println!(
            "{name:<20} p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            p.p50, p.p90, p.p99, p.max
        );
    }
    if let Some(cpu) = r.cpu_seconds {
        println!(
            "CPU of --pid        {cpu:.2} s, {:.1} us per request, {:.0} requests per CPU second",
            1e6 * cpu / r.requests.max(1) as f64,
            r.requests as f64 / cpu.max(1e-9)
        );
    }
    if let Some(p) = &r.poi {
        println!(
            "POI answers          {} ({}): {} exact after refinement, {} refused; candidates p50 {}, p95 {}",
            p.answers, p.query, p.exact, p.refused, p.candidates_p50, p.candidates_p95
        );
    }
    if let Some(a) = &r.session_anonymity {
        println!(
            "session anonymity    {} sessions of {} ms, {} with >= 2 cloaked requests: common users p10 {}, p50 {}, p90 {}; below k {:.2} %, identified {:.2} %",
            a.sessions,
            a.session_ms,
            a.repeated_sessions,
            a.p10,
            a.p50,
            a.p90,
            100.0 * a.share_below_k,
            100.0 * a.share_identified
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimulateArgs,
    }

    fn args(extra: &[&str]) -> SimulateArgs {
        let mut argv = vec!["simulate", "--trace", "t.csv"];
        argv.extend_from_slice(extra);
        Cli::parse_from(argv).args
    }

    fn points(users: usize, seconds: i64) -> Vec<TracePoint> {
        (0..seconds)
            .flat_map(|t| {
                (0..users).map(move |u| TracePoint {
                    user_id: format!("u{u}"),
                    timestamp: 1_000 + t,
                    lat: 53.0 + u as f64 * 1e-3,
                    lon: 8.0 + t as f64 * 1e-4,
                })
            })
            .collect()
    }

    #[test]
    fn periodic_plan_has_one_request_per_user_and_period_and_the_updates() {
        let a = args(&[
            "--model",
            "presence",
            "--request-period-s",
            "30",
            "--update-period-s",
            "5",
            "--speedup",
            "2",
        ]);
        let plan = plan(&a, &points(4, 60)).unwrap();
        assert_eq!(plan.requests.len(), 4 * 2);
        assert_eq!(plan.updates.len(), 4 * 12);
        for (i, p) in plan.requests.iter().enumerate() {
            assert_eq!(p.request.request_no, i as u64);
            assert_eq!(p.request.model, Some(CloakModel::Presence as i32));
            assert!(p.due <= Duration::from_secs(30), "{:?}", p.due);
        }
        let mut per_user: HashMap<usize, usize> = HashMap::new();
        for p in &plan.requests {
            *per_user.entry(p.user).or_default() += 1;
        }
        assert!(per_user.values().all(|&n| n == 2));
        assert!(plan.updates.windows(2).all(|w| w[0].0 <= w[1].0));
    }

    #[test]
    fn log_uniform_tolerances_cover_every_decade_between_the_bounds() {
        let a = args(&[
            "--dx-dist",
            "log-uniform",
            "--dx-min",
            "20",
            "--dx-max",
            "20000",
        ]);
        let drawn = plan(&a, &points(50, 40)).unwrap();
        let dx: Vec<f64> = drawn
            .requests
            .iter()
            .filter_map(|p| p.request.dx_m)
            .collect();
        assert_eq!(dx.len(), 2_000);
        assert!(dx.iter().all(|d| (20.0..=20_000.0).contains(d)), "{dx:?}");
        // About a third of the draws in each decade [20, 200), [200, 2000), [2000, 20000].
        for (lo, hi) in [(20.0, 200.0), (200.0, 2_000.0), (2_000.0, 20_000.1)] {
            let share = dx.iter().filter(|&&d| d >= lo && d < hi).count() as f64 / 2_000.0;
            assert!((share - 1.0 / 3.0).abs() < 0.05, "[{lo}, {hi}): {share}");
        }
        // dy keeps its default (uniform on [500, 500]).
        assert!(drawn.requests.iter().all(|p| p.request.dy_m == Some(500.0)));
        let bad = args(&["--dy-dist", "log-uniform", "--dy-min", "0"]);
        let err = plan(&bad, &points(2, 2)).err().unwrap().to_string();
        assert!(err.contains("--dy-min"), "{err}");
    }

    #[test]
    fn without_periods_every_row_is_a_request_of_the_default_model() {
        let plan = plan(&args(&[]), &points(3, 10)).unwrap();
        assert_eq!(plan.requests.len(), 30);
        assert!(plan.updates.is_empty());
        assert!(plan.requests.iter().all(|p| p.request.model.is_none()));
        assert!(plan_periodic(&args(&["--update-period-s", "0"]), &points(3, 10)).is_err());
    }
}
