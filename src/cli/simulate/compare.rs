//! `cloakd simulate --compare requests,presence,geo-ind --epsilons 0.5,1,2,5`: one yardstick for the
//! cloaking models. The same trace and workload (same seed) is replayed against the daemon of `--addr`
//! once per model, GEO_IND once per epsilon, one run after the other; each run's users get their own
//! prefix (`<run>-<user>`) so that no run sees another's peers, positions or budget.
//!
//! Per run: success rate; cloak and reply latency; quality loss (mean over answers of the distance
//! from the true position to the reported point, or for a box the expected distance to a uniform point
//! of it, and the box's mean area); the Bayesian adversary's expected error (Shokri et al., S&P 2011,
//! [`crate::location::yardstick`]: its prior is the density of the trace's positions on cells of
//! `--grid-m`, averaged over at most `--adversary-sample` answers evenly spread over the run); with
//! `--pois`, the share of answers whose refined candidate list is the exact answer and the list sizes;
//! and the requests refused with RESOURCE_EXHAUSTED (a spent privacy budget). Printed as a table,
//! written as JSON with `--json` and drawn with `--chart`.
//!
//! Invariants: the runs differ only in model, epsilon and user prefix; an unanswered model (no answer
//! at all) reports its adversary error and quality loss as absent, never as 0.
use std::path::Path;

use anyhow::Context;

use super::{ModelArg, SimulateArgs, simulate};
use crate::data_files::TracePoint;
use crate::location::yardstick::{Grid, Observed, box_area_m2, quality_loss};
use crate::plots::tradeoff::{Series, Tradeoff};
use crate::plots::{Format, render};

/// Most cells of the adversary's grid.
const MAX_CELLS: usize = 4_000_000;

/// One run of the comparison.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ComparedRun {
    /// `requests`, `presence` or `geo-ind eps=E`.
    pub run: String,
    pub model: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epsilon_per_km: Option<f64>,
    pub requests: u64,
    pub answered: u64,
    pub success_rate: f64,
    pub cloak_latency_p50_ms: f64,
    pub cloak_latency_p99_ms: f64,
    pub reply_latency_p50_ms: f64,
    /// Mean metres from the true position to the reported point (GEO_IND) or, for a box, the mean of
    /// the expected distance to a uniform point of the box.
    pub quality_loss_m: Option<f64>,
    /// Mean area of the box the provider saw, km² (REQUESTS, PRESENCE; none for GEO_IND).
    pub box_area_km2: Option<f64>,
    /// The Bayesian adversary's mean expected error, metres.
    pub adversary_error_m: Option<f64>,
    /// Answers the adversary was evaluated on.
    pub adversary_answers: usize,
    /// With --pois: replies that carried a candidate list (the simulated provider answers as fast
    /// as it can; a run may end before it answered them all).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poi_answers: Option<u64>,
    /// With --pois: refined answers equal to the exact answer, over POI answers (a refused list
    /// counts as not exact); none when no list came back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poi_exact_share: Option<f64>,
    /// With --pois: answers the provider refused (`PoiCandidates.error`, e.g. a list too long for one
    /// answer), over POI answers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poi_refused_share: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poi_candidates_p50: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poi_candidates_p95: Option<usize>,
    pub budget_exhausted: u64,
}

/// The whole comparison.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Comparison {
    pub trace_rows: usize,
    pub grid_m: f64,
    pub runs: Vec<ComparedRun>,
}

/// The runs `--compare` asks for, in its order: (label, model, epsilon).
fn runs(args: &SimulateArgs) -> anyhow::Result<Vec<(String, ModelArg, Option<f64>)>> {
    let mut out = Vec::new();
    for &model in &args.compare {
        if model == ModelArg::GeoInd {
            anyhow::ensure!(
                !args.epsilons.is_empty(),
                "--epsilons: geo-ind needs at least one"
            );
            for &e in &args.epsilons {
                anyhow::ensure!(
                    e.is_finite() && e > 0.0,
                    "--epsilons: each must be a number > 0"
                );
                out.push((format!("geo-ind eps={e}"), model, Some(e)));
            }
        } else {
            out.push((model.name().to_string(), model, None));
        }
    }
    Ok(out)
}

/// Runs the comparison and prints, writes and draws it.
pub(super) async fn run(args: &SimulateArgs, points: &[TracePoint]) -> anyhow::Result<()> {
    let comparison = compare(args, points).await?;
    print_table(&comparison);
    if let Some(path) = &args.json {
        cloakd::atomic_file::write(path, &serde_json::to_vec_pretty(&comparison)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.chart {
        draw(&comparison, path)?;
    }
    Ok(())
}

/// Replays the trace once per run and measures each.
pub async fn compare(args: &SimulateArgs, points: &[TracePoint]) -> anyhow::Result<Comparison> {
    let runs = runs(args)?;
    let positions: Vec<(f64, f64)> = points.iter().map(|p| (p.lat, p.lon)).collect();
    let grid = Grid::from_positions(&positions, args.grid_m, MAX_CELLS)
        .map_err(|e| anyhow::anyhow!("--grid-m: {e}"))?;
    let mut out = Vec::new();
    for (i, (label, model, epsilon)) in runs.into_iter().enumerate() {
        eprintln!("run {}: {label}", i + 1);
        let mut run_args = args.clone();
        run_args.compare.clear();
        run_args.model = Some(model);
        run_args.epsilon_per_km = epsilon;
        run_args.user_prefix = format!("r{}-", i + 1);
        run_args.observe = true;
        let report = simulate(&run_args, points).await?;
        let observed = &report.observed;
        let mean = |values: Vec<f64>| {
            (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
        };
        let quality = mean(
            observed
                .iter()
                .filter_map(|(truth, seen)| quality_loss(seen, *truth))
                .collect(),
        );
        let areas = mean(
            observed
                .iter()
                .filter_map(|(_, seen)| match *seen {
                    Observed::Box {
                        min_lat,
                        min_lon,
                        max_lat,
                        max_lon,
                    } => Some(box_area_m2(min_lat, min_lon, max_lat, max_lon) / 1e6),
                    Observed::Laplace { .. } => None,
                })
                .collect(),
        );
        let step = observed.len().div_ceil(args.adversary_sample.max(1)).max(1);
        let errors: Vec<f64> = observed
            .iter()
            .step_by(step)
            .filter_map(|(truth, seen)| grid.adversary_error(seen, *truth))
            .collect();
        let adversary_answers = errors.len();
        // Shares and sizes only over lists that came back (none: "-", not 0 %).
        let lists = report.poi.as_ref().filter(|p| p.answers > 0);
        out.push(ComparedRun {
            run: label,
            model: model.name(),
            epsilon_per_km: epsilon,
            requests: report.requests,
            answered: report.cloaked,
            success_rate: report.success_rate,
            cloak_latency_p50_ms: report.cloak_latency_ms.p50,
            cloak_latency_p99_ms: report.cloak_latency_ms.p99,
            reply_latency_p50_ms: report.reply_latency_ms.p50,
            quality_loss_m: quality,
            box_area_km2: areas,
            adversary_error_m: mean(errors),
            adversary_answers,
            poi_answers: report.poi.as_ref().map(|p| p.answers),
            poi_exact_share: lists.map(|p| p.exact as f64 / p.answers as f64),
            poi_refused_share: lists.map(|p| p.refused as f64 / p.answers as f64),
            poi_candidates_p50: lists.map(|p| p.candidates_p50),
            poi_candidates_p95: lists.map(|p| p.candidates_p95),
            budget_exhausted: report.budget_exhausted,
        });
    }
    Ok(Comparison {
        trace_rows: points.len(),
        grid_m: args.grid_m,
        runs: out,
    })
}

fn or_dash(v: Option<f64>, precision: usize) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.precision$}"))
}

/// The comparison as a Markdown table.
pub fn table(c: &Comparison) -> String {
    let mut out = String::from(
        "| run | success | cloak latency p50 / p99 (ms) | quality loss (m) | box area (km²) | adversary error (m) | exact POI answers | candidates p50 / p95 | budget exhausted |\n|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in &c.runs {
        out.push_str(&format!(
            "| {} | {:.1} % | {:.2} / {:.2} | {} | {} | {} | {} | {} | {} |\n",
            r.run,
            100.0 * r.success_rate,
            r.cloak_latency_p50_ms,
            r.cloak_latency_p99_ms,
            or_dash(r.quality_loss_m, 0),
            or_dash(r.box_area_km2, 3),
            or_dash(r.adversary_error_m, 0),
            match (r.poi_exact_share, r.poi_refused_share, r.poi_answers) {
                (Some(s), Some(refused), Some(n)) if refused > 0.0 => format!(
                    "{:.1} % of {n} ({:.1} % refused)",
                    100.0 * s,
                    100.0 * refused
                ),
                (Some(s), _, Some(n)) => format!("{:.1} % of {n}", 100.0 * s),
                (None, _, Some(0)) => "none came back".to_string(),
                _ => "-".to_string(),
            },
            match (r.poi_candidates_p50, r.poi_candidates_p95) {
                (Some(a), Some(b)) => format!("{a} / {b}"),
                _ => "-".to_string(),
            },
            r.budget_exhausted
        ));
    }
    out
}

fn print_table(c: &Comparison) {
    println!(
        "{} trace rows; adversary prior on {} m cells",
        c.trace_rows, c.grid_m
    );
    print!("{}", table(c));
}

/// The trade-off chart: quality loss across, adversary error up, one series per model.
pub fn chart(c: &Comparison) -> Tradeoff {
    let mut series: Vec<Series> = Vec::new();
    for r in &c.runs {
        let point = (
            r.quality_loss_m.unwrap_or(f64::NAN),
            r.adversary_error_m.unwrap_or(f64::NAN),
            r.epsilon_per_km
                .map_or(format!("{:.0} %", 100.0 * r.success_rate), |e| {
                    format!("ε={e}")
                }),
        );
        match series.iter_mut().find(|s| s.0 == r.model) {
            Some(s) => s.1.push(point),
            None => series.push((r.model.to_string(), vec![point])),
        }
    }
    Tradeoff {
        title: "Privacy against quality per cloaking model".into(),
        x_label: "quality loss (m)".into(),
        y_label: "adversary's expected error (m)".into(),
        series,
    }
}

fn draw(c: &Comparison, path: &Path) -> anyhow::Result<()> {
    let format: Format = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .parse()
        .map_err(|e| anyhow::anyhow!("--chart: {e}"))?;
    let bytes = render(&chart(c), format)?;
    cloakd::atomic_file::write(path, &bytes).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(poi_answers: Option<u64>, exact: Option<f64>) -> ComparedRun {
        ComparedRun {
            run: "geo-ind eps=5".into(),
            model: "geo-ind",
            epsilon_per_km: Some(5.0),
            requests: 10,
            answered: 10,
            success_rate: 1.0,
            cloak_latency_p50_ms: 0.5,
            cloak_latency_p99_ms: 1.0,
            reply_latency_p50_ms: 0.7,
            quality_loss_m: Some(380.0),
            box_area_km2: None,
            adversary_error_m: Some(510.0),
            adversary_answers: 10,
            poi_answers,
            poi_exact_share: exact,
            poi_refused_share: exact.map(|_| 0.0),
            poi_candidates_p50: exact.map(|_| 31),
            poi_candidates_p95: exact.map(|_| 48),
            budget_exhausted: 0,
        }
    }

    #[test]
    fn a_run_whose_provider_answered_no_list_shows_none_not_zero_exact() {
        let c = Comparison {
            trace_rows: 10,
            grid_m: 100.0,
            runs: vec![
                run(Some(8), Some(0.875)),
                run(Some(0), None),
                run(None, None),
            ],
        };
        let text = table(&c);
        let rows: Vec<&str> = text.lines().skip(2).collect();
        assert!(rows[0].contains("| 87.5 % of 8 | 31 / 48 |"), "{}", rows[0]);
        assert!(rows[1].contains("| none came back | - |"), "{}", rows[1]);
        assert!(rows[2].contains("| - | - |"), "{}", rows[2]);
        let json = serde_json::to_value(&c.runs[1]).unwrap();
        assert_eq!(json["poi_answers"], 0);
        assert!(json.get("poi_exact_share").is_none(), "{json}");
    }
}
