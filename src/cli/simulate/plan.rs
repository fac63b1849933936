//! The run's workload, planned before anything is sent: one request per trace row (or per user and
//! period), its stream, its send offset, and its k and tolerances drawn from the seeded generator.
//!
//! Invariants: a plan depends only on the arguments and the trace (same seed, same plan); request
//! numbers are the requests' indexes in the plan; send offsets never decrease within a trace second.
use std::collections::HashMap;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{ModelArg, SimulateArgs, ToleranceDist};
use crate::data_files::TracePoint;
use crate::location::replay::{PeriodicEvent, PeriodicParams, log_uniform, periodic_workload};
use crate::proto::{LocationRequest, PositionUpdate};

impl ToleranceDist {
    fn draw(self, rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
        match self {
            ToleranceDist::Uniform => uniform_f(rng, lo, hi),
            ToleranceDist::LogUniform => log_uniform(rng, lo, hi),
        }
    }
}

pub(super) struct Planned {
    pub(super) request: LocationRequest,
    /// Index of the request's user (first appearance order).
    pub(super) user: usize,
    pub(super) stream: usize,
    /// Offset from the start at which to send.
    pub(super) due: Duration,
}

fn uniform_f(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    if hi > lo {
        rng.random_range(lo..=hi)
    } else {
        lo
    }
}

pub(super) fn plan(args: &SimulateArgs, points: &[TracePoint]) -> anyhow::Result<Plan> {
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
            format!("{}{}", args.user_prefix, point.user_id),
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
        // Refused under the box models; with the default model, left to the broker to judge.
        epsilon_per_km: match args.model {
            Some(ModelArg::Requests | ModelArg::Presence) => None,
            Some(ModelArg::GeoInd) | None => args.epsilon_per_km,
        },
        fallback_epsilon_per_km: None,
    }
}

/// The planned run: requests, and position updates with their send offsets.
pub(super) struct Plan {
    pub(super) requests: Vec<Planned>,
    pub(super) updates: Vec<(Duration, PositionUpdate)>,
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
                    user_id: format!("{}{}", args.user_prefix, workload.user_ids[user]),
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
                    format!("{}{}", args.user_prefix, workload.user_ids[user]),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::CloakModel;
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
