//! `cloakd soak`: holds many concurrent streams against a running daemon for a while and reports what
//! went wrong and how the daemon's memory and threads moved.
//!
//! The streams are spread over `--connections` HTTP/2 connections: Submit streams (each sends a pair
//! of requests of two users every `--interval-ms`, so they cloak with k = 2), Publish streams (a small
//! record per interval), ReleaseFeed subscribers, and one provider (Subscribe + Answer) answering every
//! cloaked request. Every event and status is counted; a stream that fails is reopened, and its status
//! is counted by code. With `--pid` (the daemon's process id) the daemon's RSS, threads and open file
//! descriptors are sampled from /proc before the load, every second under it, and once the streams
//! have closed.
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::{Mutex, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::proto::lbs_gateway_client::LbsGatewayClient;
use crate::proto::location_broker_client::LocationBrokerClient;
use crate::proto::location_event::Outcome;
use crate::proto::release_feed_client::ReleaseFeedClient;
use crate::proto::transaction_ingest_client::TransactionIngestClient;
use crate::proto::{LbsAnswer, LbsSubscription, LocationRequest, ReleaseSubscription, Transaction};

#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// The daemon to load, as a URL.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// Concurrent streams in all (Submit, Publish and ReleaseFeed; plus the provider's two).
    #[arg(long, default_value_t = 2_000)]
    pub streams: usize,
    /// HTTP/2 connections the streams are spread over.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// How long to hold the load, in seconds.
    #[arg(long, default_value_t = 60)]
    pub duration_s: u64,
    /// Pause between two messages of one stream, in milliseconds.
    #[arg(long, default_value_t = 1_000)]
    pub interval_ms: u64,
    /// Service of the location requests (and of the provider).
    #[arg(long, default_value = "poi")]
    pub service: String,
    /// The daemon's process id, to sample its RSS and threads from /proc.
    #[arg(long)]
    pub pid: Option<u32>,
}

/// Counts of everything the streams saw.
#[derive(Debug, Default)]
struct Tally {
    sent: AtomicU64,
    cloaked: AtomicU64,
    expired: AtomicU64,
    rejected: AtomicU64,
    replies: AtomicU64,
    undelivered: AtomicU64,
    acks: AtomicU64,
    windows: AtomicU64,
    /// Streams that ended with a non-OK status, by code (and connection failures).
    failures: Mutex<BTreeMap<String, u64>>,
}

impl Tally {
    async fn failed(&self, what: &str, status: &tonic::Status) {
        let key = format!("{what}: {:?}", status.code());
        *self.failures.lock().await.entry(key).or_default() += 1;
    }
}

/// What the daemon's process holds at one moment, read from /proc.
#[derive(Debug, Clone, Copy)]
struct Sample {
    rss_kib: u64,
    threads: u64,
    fds: u64,
}

/// RSS (KiB), threads and open file descriptors of `pid`, read from /proc.
fn sample(pid: u32) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some(Sample {
        rss_kib: field("VmRSS:")?,
        threads: field("Threads:")?,
        fds,
    })
}

/// One line of the report: a figure before the load, its maximum under it and after it.
fn figure(
    name: &str,
    before: Option<Sample>,
    during: &[Sample],
    after: Option<Sample>,
    value: impl Fn(&Sample) -> u64,
) -> String {
    let show = |s: Option<u64>| s.map_or_else(|| "-".to_string(), |v| v.to_string());
    format!(
        "daemon {name}: {} before, max {} under load, {} at its end, {} after the streams closed",
        show(before.as_ref().map(&value)),
        show(during.iter().map(&value).max()),
        show(during.last().map(&value)),
        show(after.as_ref().map(&value)),
    )
}

pub fn run(args: SoakArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.streams >= 3, "--streams: must be at least 3");
    anyhow::ensure!(args.connections >= 1, "--connections: must be at least 1");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(soak(args))
}

async fn soak(args: SoakArgs) -> anyhow::Result<()> {
    let endpoint = tonic::transport::Endpoint::from_shared(args.addr.clone())
        .context("--addr: not a URL")?
        .tcp_nodelay(true);
    let before = args.pid.and_then(sample);
    let mut channels = Vec::with_capacity(args.connections);
    for _ in 0..args.connections {
        channels.push(
            endpoint
                .connect()
                .await
                .with_context(|| format!("cannot connect to {}", args.addr))?,
        );
    }
    let tally = Arc::new(Tally::default());
    let (stop_tx, stop) = watch::channel(false);
    let interval = Duration::from_millis(args.interval_ms.max(1));
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(provider(
        channels[0].clone(),
        args.service.clone(),
        Arc::clone(&tally),
        stop.clone(),
    ));
    // 80 % Submit, 15 % Publish, 5 % ReleaseFeed subscribers.
    let publishers = (args.streams * 15 / 100).max(1);
    let subscribers = (args.streams * 5 / 100).max(1);
    let submitters = args.streams.saturating_sub(publishers + subscribers).max(1);
    for i in 0..args.streams {
        let channel = channels[i % channels.len()].clone();
        let (tally, stop) = (Arc::clone(&tally), stop.clone());
        if i < submitters {
            tasks.spawn(submitter(
                channel,
                i,
                args.service.clone(),
                interval,
                tally,
                stop,
            ));
        } else if i < submitters + publishers {
            tasks.spawn(publisher(channel, i, interval, tally, stop));
        } else {
            tasks.spawn(subscriber(channel, i % publishers.max(1), tally, stop));
        }
    }
    println!(
        "soak: {submitters} Submit, {publishers} Publish, {subscribers} ReleaseFeed streams and one provider over {} connections for {} s",
        args.connections, args.duration_s
    );
    let start = Instant::now();
    let mut during = Vec::new();
    while start.elapsed() < Duration::from_secs(args.duration_s) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Some(s) = args.pid.and_then(sample) {
            during.push(s);
        }
        if start.elapsed().as_secs().is_multiple_of(10) {
            println!(
                "  {:>3} s: sent {}, cloaked {}, replies {}, acks {}{}",
                start.elapsed().as_secs(),
                tally.sent.load(Ordering::Relaxed),
                tally.cloaked.load(Ordering::Relaxed),
                tally.replies.load(Ordering::Relaxed),
                tally.acks.load(Ordering::Relaxed),
                during
                    .last()
                    .map(|s| format!(", daemon RSS {} MiB", s.rss_kib / 1024))
                    .unwrap_or_default(),
            );
        }
    }
    stop_tx.send_replace(true);
    let draining = tokio::time::timeout(Duration::from_secs(15), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if draining.is_err() {
        tasks.abort_all();
    }
    drop(channels);
    // Give the daemon a moment to notice the closed connections before the last sample.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = args.pid.and_then(sample);
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    println!(
        "requests sent {}: cloaked {}, expired {}, rejected {}, replies {}, undelivered {}",
        load(&tally.sent),
        load(&tally.cloaked),
        load(&tally.expired),
        load(&tally.rejected),
        load(&tally.replies),
        load(&tally.undelivered)
    );
    println!(
        "records acknowledged {}, released windows read {}",
        load(&tally.acks),
        load(&tally.windows)
    );
    let failures = tally.failures.lock().await;
    if failures.is_empty() {
        println!("stream failures: none");
    } else {
        for (what, n) in failures.iter() {
            println!("stream failures: {what}: {n}");
        }
    }
    if args.pid.is_some() {
        println!(
            "{} (MiB)",
            figure("RSS", before, &during, after, |s| s.rss_kib / 1024)
        );
        println!(
            "{}",
            figure("threads", before, &during, after, |s| s.threads)
        );
        println!("{}", figure("open fds", before, &during, after, |s| s.fds));
    }
    Ok(())
}

/// Whether the soak is over.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// One Submit stream: a pair of requests of two users every interval; reopened when it fails.
async fn submitter(
    channel: Channel,
    index: usize,
    service: String,
    interval: Duration,
    tally: Arc<Tally>,
    mut stop: watch::Receiver<bool>,
) {
    let mut client = LocationBrokerClient::new(channel);
    // Request numbers go on across reopened streams.
    let next_no = Arc::new(AtomicU64::new(0));
    // Spread the streams over a small city so pairs meet.
    let (lat, lon) = (
        53.10 + (index % 100) as f64 * 0.001,
        8.20 + (index / 100 % 100) as f64 * 0.001,
    );
    while !*stop.borrow() {
        let (requests, outbound) = mpsc::channel(64);
        let mut events = match client.submit(ReceiverStream::new(outbound)).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                tally.failed("Submit", &status).await;
                tokio::time::sleep(interval).await;
                continue;
            }
        };
        let sender = {
            let (tally, mut stop, service) = (Arc::clone(&tally), stop.clone(), service.clone());
            let next_no = Arc::clone(&next_no);
            tokio::spawn(async move {
                loop {
                    let no = next_no.fetch_add(1, Ordering::Relaxed);
                    for member in 0..2 {
                        let request = LocationRequest {
                            user_id: format!("soak-{index}-{member}"),
                            request_no: no,
                            lat,
                            lon,
                            k: Some(2),
                            dx_m: Some(500.0),
                            dy_m: Some(500.0),
                            dt_ms: Some(5_000),
                            payload: b"soak".to_vec(),
                            service: service.clone(),
                            model: None,
                            epsilon_per_km: None,
                            fallback_epsilon_per_km: None,
                        };
                        if requests.send(request).await.is_err() {
                            return;
                        }
                        tally.sent.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::select! {
                        _ = stopped(&mut stop) => return,
                        _ = tokio::time::sleep(interval) => {}
                    }
                }
            })
        };
        loop {
            match events.message().await {
                Ok(Some(event)) => {
                    let counter = match event.outcome {
                        Some(Outcome::Cloaked(_)) => &tally.cloaked,
                        Some(Outcome::Expired(_)) => &tally.expired,
                        Some(Outcome::Rejected(_)) => &tally.rejected,
                        Some(Outcome::Reply(_)) => &tally.replies,
                        Some(Outcome::Undelivered(_)) => &tally.undelivered,
                        None => continue,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None) => break,
                Err(status) => {
                    if !*stop.borrow() {
                        tally.failed("Submit", &status).await;
                    }
                    break;
                }
            }
        }
        sender.abort();
        if *stop.borrow() {
            return;
        }
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// One Publish stream: a small record per interval on its own stream name; reopened when it fails.
async fn publisher(
    channel: Channel,
    index: usize,
    interval: Duration,
    tally: Arc<Tally>,
    mut stop: watch::Receiver<bool>,
) {
    let mut client = TransactionIngestClient::new(channel);
    let next_record = Arc::new(AtomicU64::new(0));
    let run = format!("{:x}", rand::random::<u32>());
    while !*stop.borrow() {
        let (records, outbound) = mpsc::channel(64);
        let mut acks = match client.publish(ReceiverStream::new(outbound)).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                tally.failed("Publish", &status).await;
                tokio::time::sleep(interval).await;
                continue;
            }
        };
        let sender = {
            let (run, mut stop) = (run.clone(), stop.clone());
            let next_record = Arc::clone(&next_record);
            tokio::spawn(async move {
                loop {
                    let n = next_record.fetch_add(1, Ordering::Relaxed);
                    let transaction = Transaction {
                        stream: format!("soak-{}", index % 100),
                        record_id: format!("{run}-{index}-{n}"),
                        items: vec![format!("item{}", n % 7), format!("item{}", n % 3 + 7)],
                        sensitive_items: vec![format!("item{}", n % 5)],
                    };
                    if records.send(transaction).await.is_err() {
                        return;
                    }
                    tokio::select! {
                        _ = stopped(&mut stop) => return,
                        _ = tokio::time::sleep(interval) => {}
                    }
                }
            })
        };
        loop {
            match acks.message().await {
                Ok(Some(_)) => {
                    tally.acks.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None) => break,
                Err(status) => {
                    if !*stop.borrow() {
                        tally.failed("Publish", &status).await;
                    }
                    break;
                }
            }
            if *stop.borrow() {
                break;
            }
        }
        sender.abort();
        if *stop.borrow() {
            return;
        }
        tokio::select! {
            _ = stopped(&mut stop) => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// One ReleaseFeed subscriber of a publisher's stream; resubscribes when the stream is not there yet.
async fn subscriber(
    channel: Channel,
    stream: usize,
    tally: Arc<Tally>,
    mut stop: watch::Receiver<bool>,
) {
    let mut client = ReleaseFeedClient::new(channel);
    let mut from_window = 0;
    while !*stop.borrow() {
        let subscription = ReleaseSubscription {
            stream: format!("soak-{}", stream % 100),
            from_window,
        };
        let mut feed = match client.subscribe(subscription).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                // NOT_FOUND until its stream's first record: not a failure.
                if status.code() != tonic::Code::NotFound {
                    tally.failed("ReleaseFeed", &status).await;
                }
                tokio::select! {
                    _ = stopped(&mut stop) => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            }
        };
        loop {
            let next = tokio::select! {
                _ = stopped(&mut stop) => return,
                next = feed.message() => next,
            };
            match next {
                Ok(Some(window)) => {
                    from_window = window.window_id + 1;
                    tally.windows.fetch_add(1, Ordering::Relaxed);
                }
                Ok(None) => break,
                Err(status) => {
                    tally.failed("ReleaseFeed", &status).await;
                    break;
                }
            }
        }
    }
}

/// The provider: answers every cloaked request at once (an answer is its acknowledgement).
async fn provider(
    channel: Channel,
    service: String,
    tally: Arc<Tally>,
    mut stop: watch::Receiver<bool>,
) {
    let mut gateway = LbsGatewayClient::new(channel);
    while !*stop.borrow() {
        let mut feed = match gateway
            .subscribe(LbsSubscription {
                service: service.clone(),
            })
            .await
        {
            Ok(response) => response.into_inner(),
            Err(status) => {
                tally.failed("LbsGateway.Subscribe", &status).await;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let (answers, outbound) = mpsc::channel(4096);
        let mut answering = gateway.clone();
        let answer_call =
            tokio::spawn(async move { answering.answer(ReceiverStream::new(outbound)).await });
        loop {
            let next = tokio::select! {
                _ = stopped(&mut stop) => break,
                next = feed.message() => next,
            };
            match next {
                Ok(Some(cloaked)) => {
                    let answer = LbsAnswer {
                        pseudonym: cloaked.pseudonym,
                        payload: b"soak answer".to_vec(),
                        ack: false,
                    };
                    if answers.send(answer).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(status) => {
                    tally.failed("LbsGateway.Subscribe", &status).await;
                    break;
                }
            }
        }
        drop(answers);
        if let Ok(Err(status)) = answer_call.await {
            tally.failed("LbsGateway.Answer", &status).await;
        }
    }
}
