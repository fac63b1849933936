//! `cloakd publish-load`: publishes records as fast as the daemon acknowledges them and reports the
//! acknowledged records per second, and, with `--pid` (any number: replicas, NATS servers), the CPU
//! seconds each process spent per record and the rate that projects per core.
//!
//! `--producers` Publish streams are spread round-robin over the replicas of `--addr` (comma
//! separated) and over `--streams` transaction streams; each keeps up to `--in-flight` records
//! unacknowledged (so records share group commits). Records hold `--items` items of a vocabulary of
//! 1,000 (Zipf-like: item i with weight 1/(i+1)) and one sensitive item of them. Record ids are fresh
//! per run, so every record is new. The rate counts from the first record sent to the last ack. A
//! Publish stream that fails is opened again from its first unacknowledged record (at most 50 times),
//! and counted.
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Context;
use rand::SeedableRng;
use rand::distr::Distribution;
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::proto::Transaction;
use crate::proto::transaction_ingest_client::TransactionIngestClient;

#[derive(Debug, clap::Args)]
pub struct PublishLoadArgs {
    /// The replicas to publish through, as URLs separated by commas.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    pub addr: String,
    /// Records to publish in all.
    #[arg(long, default_value_t = 200_000)]
    pub records: u64,
    /// Concurrent Publish streams.
    #[arg(long, default_value_t = 8)]
    pub producers: usize,
    /// Transaction streams the records go to (`load-0`, `load-1`, ...).
    #[arg(long, default_value_t = 4)]
    pub streams: usize,
    /// Records a producer keeps unacknowledged.
    #[arg(long, default_value_t = 2_048)]
    pub in_flight: usize,
    /// Items per record.
    #[arg(long, default_value_t = 8)]
    pub items: usize,
    /// Processes whose CPU time to report per record (the replicas, the NATS servers).
    #[arg(long, value_delimiter = ',')]
    pub pid: Vec<u32>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// User plus system CPU seconds `pid` has used, from /proc.
pub(crate) fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces) in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / rustix::param::clock_ticks_per_second() as f64)
}

#[derive(Debug, Default)]
struct Tally {
    acked: AtomicU64,
    duplicates: AtomicU64,
    /// Publish streams that failed and were opened again.
    refusals: AtomicU64,
}

pub fn run(args: PublishLoadArgs) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?
        .block_on(load(args))
}

async fn load(args: PublishLoadArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.producers > 0, "--producers: must be at least 1");
    anyhow::ensure!(args.streams > 0, "--streams: must be at least 1");
    anyhow::ensure!(args.in_flight > 0, "--in-flight: must be at least 1");
    anyhow::ensure!(
        (1..=256).contains(&args.items),
        "--items: must lie in [1, 256]"
    );
    let mut channels = Vec::new();
    for addr in args
        .addr
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
    {
        let channel = tonic::transport::Endpoint::from_shared(addr.to_string())
            .with_context(|| format!("--addr: {addr:?} is not a URL"))?
            .connect()
            .await
            .with_context(|| format!("cannot connect to {addr}"))?;
        channels.push(channel);
    }
    anyhow::ensure!(!channels.is_empty(), "--addr: no replica given");
    let run = format!("{:08x}", rand::random::<u32>());
    let tally = Arc::new(Tally::default());
    let cpu_before: Vec<Option<f64>> = args.pid.iter().map(|&p| cpu_seconds(p)).collect();
    let own_before = cpu_seconds(std::process::id());
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for p in 0..args.producers {
        let share = args.records / args.producers as u64
            + u64::from((p as u64) < args.records % args.producers as u64);
        tasks.spawn(producer(
            TransactionIngestClient::new(channels[p % channels.len()].clone()),
            format!("load-{}", p % args.streams),
            format!("{run}-{p}"),
            share,
            args.in_flight,
            args.items,
            Arc::clone(&tally),
        ));
    }
    while let Some(done) = tasks.join_next().await {
        done.context("a producer panicked")??;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let acked = tally.acked.load(Ordering::Relaxed);
    let cpu: Vec<Option<f64>> = args
        .pid
        .iter()
        .zip(cpu_before)
        .map(|(&p, before)| Some(cpu_seconds(p)? - before?))
        .collect();
    let per_record: Vec<Option<f64>> = cpu
        .iter()
        .map(|c| c.map(|c| c / acked.max(1) as f64))
        .collect();
    // Every --pid together (e.g. all replicas and NATS servers), and this load generator.
    let total: Option<f64> = cpu.iter().copied().sum();
    let own = cpu_seconds(std::process::id())
        .zip(own_before)
        .map(|(a, b)| a - b);
    if args.json {
        let report = serde_json::json!({
            "records_acknowledged": acked,
            "duplicates": tally.duplicates.load(Ordering::Relaxed),
            "streams_reopened": tally.refusals.load(Ordering::Relaxed),
            "seconds": elapsed,
            "records_per_s": acked as f64 / elapsed,
            "cpu_seconds_all_pids": total,
            "cpu_seconds_per_record_all_pids": total.map(|t| t / acked.max(1) as f64),
            "cpu_seconds_load_generator": own,
            "processes": args.pid.iter().zip(&cpu).zip(&per_record).map(|((pid, cpu), per)| serde_json::json!({
                "pid": pid, "cpu_seconds": cpu, "cpu_seconds_per_record": per,
                "records_per_cpu_second": per.map(|p| 1.0 / p),
            })).collect::<Vec<_>>(),
        });
        println!("{report:#}");
    } else {
        println!(
            "records acknowledged {acked} in {elapsed:.2} s: {:.0} records/s ({} duplicates, {} streams reopened after a failure)",
            acked as f64 / elapsed,
            tally.duplicates.load(Ordering::Relaxed),
            tally.refusals.load(Ordering::Relaxed)
        );
        for ((pid, cpu), per) in args.pid.iter().zip(&cpu).zip(&per_record) {
            match (cpu, per) {
                (Some(cpu), Some(per)) => println!(
                    "pid {pid}: {cpu:.2} CPU s, {:.1} us per record, {:.0} records per CPU second",
                    per * 1e6,
                    1.0 / per
                ),
                _ => println!("pid {pid}: CPU time not readable"),
            }
        }
        if let (Some(total), true) = (total, args.pid.len() > 1) {
            println!(
                "all pids: {total:.2} CPU s, {:.1} us per record, {:.0} records per CPU second",
                total / acked.max(1) as f64 * 1e6,
                acked as f64 / total
            );
        }
        if let Some(own) = own {
            println!("load generator: {own:.2} CPU s");
        }
    }
    Ok(())
}

/// Most times a producer opens its stream again after a refusal before it gives up.
const MAX_REOPENS: u32 = 50;

/// Publishes `count` records, at most `in_flight` unacknowledged. A stream that fails (e.g.
/// UNAVAILABLE while a stream's lease moves between replicas) is opened again after a pause, from
/// the first record not acknowledged (records sent after it may then come back as duplicates).
async fn producer(
    mut client: TransactionIngestClient<tonic::transport::Channel>,
    stream: String,
    prefix: String,
    count: u64,
    in_flight: usize,
    items: usize,
    tally: Arc<Tally>,
) -> anyhow::Result<()> {
    let weights: Vec<f64> = (0..1_000).map(|i| 1.0 / (i as f64 + 1.0)).collect();
    let vocabulary =
        Arc::new(rand::distr::weighted::WeightedIndex::new(&weights).expect("positive weights"));
    let mut acknowledged = 0u64;
    let mut reopens = 0;
    while acknowledged < count {
        let (records, outbound) = mpsc::channel(in_flight.min(1024));
        let window = Arc::new(Semaphore::new(in_flight));
        let sender = {
            let (window, vocabulary, stream, prefix) = (
                Arc::clone(&window),
                Arc::clone(&vocabulary),
                stream.clone(),
                prefix.clone(),
            );
            tokio::spawn(async move {
                let mut rng = rand::rngs::SmallRng::from_os_rng();
                for n in acknowledged..count {
                    let Ok(permit) = window.acquire().await else {
                        return;
                    };
                    permit.forget();
                    let mut chosen: Vec<usize> = Vec::with_capacity(items);
                    while chosen.len() < items {
                        let i = vocabulary.sample(&mut rng);
                        if !chosen.contains(&i) {
                            chosen.push(i);
                        }
                    }
                    let transaction = Transaction {
                        stream: stream.clone(),
                        record_id: format!("{prefix}-{n}"),
                        sensitive_items: vec![format!("i{}", chosen[0])],
                        items: chosen.iter().map(|i| format!("i{i}")).collect(),
                    };
                    if records.send(transaction).await.is_err() {
                        return;
                    }
                }
            })
        };
        let failure = match client.publish(ReceiverStream::new(outbound)).await {
            Err(status) => Some(status),
            Ok(response) => {
                let mut acks = response.into_inner();
                loop {
                    if acknowledged == count {
                        break None;
                    }
                    match acks.message().await {
                        Ok(Some(ack)) => {
                            acknowledged += 1;
                            window.add_permits(1);
                            tally.acked.fetch_add(1, Ordering::Relaxed);
                            if ack.duplicate {
                                tally.duplicates.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Ok(None) => {
                            break Some(tonic::Status::unknown(
                                "the acknowledgement stream ended early",
                            ));
                        }
                        Err(status) => break Some(status),
                    }
                }
            }
        };
        sender.abort();
        if let Some(status) = failure {
            reopens += 1;
            tally.refusals.fetch_add(1, Ordering::Relaxed);
            anyhow::ensure!(
                reopens <= MAX_REOPENS,
                "stream {stream:?} failed {reopens} times; the last: {status}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    Ok(())
}
