//! The privacy/utility frontier (Li & Li, KDD'09 §5): a family of releases (privacy models ×
//! parameters × release methods), each measured, the *efficient* set among them (no other release has
//! both lower Ploss and lower Uloss), `frontier.csv`, and the data of the paper's figures
//! ([`charts`], drawn by `crate::plots`): Uloss against Ploss per model (Fig. 2a, generalization),
//! generalization against bucketization for l-diversity and t-closeness (Fig. 2b), and COUNT query
//! error against Ploss per model (Fig. 3a, bucketization); the plots draw the efficient frontier of
//! the plotted points ([`efficient_set`]) as a dashed line. Several algorithms (Mondrian, OLA, KACA) can be swept on the same axes: each
//! series is then split by algorithm. With a learning workload ([`crate::measures::workload`]) each
//! point also carries Brickell & Shmatikov's researcher side, `frontier.csv` gains U_base and
//! U_san − U_base per classifier, and a fourth chart plots the best classifier's gain against the
//! adversary's A_acc (their Figures 1-4 as a sweep).
//!
//! Invariants: the sweep's defaults are the paper's parameter sets; a point is efficient exactly when
//! no other point strictly dominates it on both axes (checked against the quadratic definition in the
//! tests); the charts are pure functions of the points (no files, no clock).
use std::io::Write;

use crate::measures::evaluate::Evaluation;
use crate::measures::workload::{Classifier, WorkloadEvaluation};
use crate::relational::Algorithm;
use crate::relational::distortion::Distortion;
use crate::relational::models::{Distance, LDiversity, PrivacySpec, TCloseness};
use crate::relational::release::ReleaseMethod;

/// A privacy model swept by the frontier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SweptModel {
    /// k-anonymity.
    K,
    /// Probabilistic l-diversity (max_s P(s) <= 1/l), Li & Li's l-diversity.
    L,
    /// t-closeness with the JS divergence, as Li & Li (or the EMD: [`SweptModel::spec_with`]).
    T,
    /// delta-disclosure (Brickell & Shmatikov's semantic privacy).
    Delta,
}

impl SweptModel {
    pub const ALL: [SweptModel; 4] = [
        SweptModel::K,
        SweptModel::L,
        SweptModel::T,
        SweptModel::Delta,
    ];

    /// The name used in `frontier.csv` and the legends.
    pub fn name(self) -> &'static str {
        match self {
            SweptModel::K => "k-anonymity",
            SweptModel::L => "l-diversity",
            SweptModel::T => "t-closeness",
            SweptModel::Delta => "delta-disclosure",
        }
    }

    /// Li & Li's parameter set.
    pub fn default_parameters(self) -> Vec<f64> {
        match self {
            SweptModel::K => vec![10.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0],
            SweptModel::L => vec![3.0, 3.5, 4.0, 4.25, 4.5, 4.75, 5.0, 5.5],
            SweptModel::T => vec![0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4],
            SweptModel::Delta => vec![1.0, 1.2, 1.4, 1.5, 1.7, 1.9, 2.0, 2.1],
        }
    }

    /// The privacy requirement of one parameter value (t-closeness with the JS divergence).
    pub fn spec(self, parameter: f64) -> PrivacySpec {
        self.spec_with(parameter, Distance::Js)
    }

    /// The privacy requirement of one parameter value, t-closeness measured by `t_distance`.
    pub fn spec_with(self, parameter: f64, t_distance: Distance) -> PrivacySpec {
        let mut spec = PrivacySpec::default();
        match self {
            SweptModel::K => spec.k = Some(parameter.round().max(1.0) as u64),
            SweptModel::L => spec.l = Some(LDiversity::Probabilistic(parameter)),
            SweptModel::T => {
                spec.t = Some(TCloseness {
                    t: parameter,
                    distance: t_distance,
                })
            }
            SweptModel::Delta => spec.delta = Some(parameter),
        }
        spec
    }
}

/// One release of the sweep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SweepItem {
    pub model: SweptModel,
    pub parameter: f64,
    pub method: ReleaseMethod,
    /// The algorithm that forms the classes (one series per algorithm in the plots).
    pub algorithm: Algorithm,
}

/// Every (model, parameter, method, algorithm) of the sweep, models in [`SweptModel::ALL`] order,
/// leaving out the pairs of method and algorithm `valid` refuses (KACA and OLA generalize only).
pub fn sweep(
    parameters: &[(SweptModel, Vec<f64>)],
    methods: &[ReleaseMethod],
    algorithms: &[Algorithm],
    valid: impl Fn(ReleaseMethod, Algorithm) -> bool,
) -> Vec<SweepItem> {
    let mut items = Vec::new();
    for (model, values) in parameters {
        for &parameter in values {
            for &method in methods {
                for &algorithm in algorithms {
                    if valid(method, algorithm) {
                        items.push(SweepItem {
                            model: *model,
                            parameter,
                            method,
                            algorithm,
                        });
                    }
                }
            }
        }
    }
    items
}

/// A measured release.
#[derive(Debug, Clone, PartialEq)]
pub struct FrontierPoint {
    pub item: SweepItem,
    pub evaluation: Evaluation,
    /// Anonymization and measurement time.
    pub seconds: f64,
    pub efficient: bool,
    /// The learning workload on the release, when the sweep learns one.
    pub workload: Option<WorkloadEvaluation>,
    /// The release's distortion (its report's): `whd` (uniform weights) and `dm` in frontier.csv.
    pub distortion: Option<Distortion>,
    /// The release's prosecutor risk on its released quasi-identifiers (docs/risk.md), when measured.
    pub risk: Option<ReleaseRisk>,
}

/// A release's prosecutor risk, as the risk engine's profile measures it (outliers left out):
/// `risk_highest`, `risk_average` and `risk_records_at_risk` in frontier.csv.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReleaseRisk {
    pub highest: f64,
    pub average: f64,
    /// The share of records whose risk is above the threshold (0.2).
    pub records_at_risk: f64,
}

impl FrontierPoint {
    /// U_san − U_base of the best classifier run: what the release is worth to a miner.
    pub fn workload_gain(&self) -> Option<f64> {
        self.workload.as_ref().and_then(|w| {
            w.classifiers
                .iter()
                .map(|c| c.u_san_minus_u_base)
                .max_by(f64::total_cmp)
        })
    }
}

/// Marks the efficient (Pareto-optimal) points: no other point is at least as good on both Ploss and
/// Uloss and better on one. A point without Uloss cannot be compared and stays marked.
pub fn mark_efficient(points: &mut [FrontierPoint]) {
    let coordinates: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.evaluation.ploss, p.evaluation.uloss.unwrap_or(f64::NAN)))
        .collect();
    let efficient = efficient_set(&coordinates);
    for (p, e) in points.iter_mut().zip(efficient) {
        p.efficient = e;
    }
}

/// For each (x, y): whether no other point dominates it, that is has x and y no greater and one of
/// them smaller. Equal points do not dominate each other; a point whose y is NaN is kept.
pub fn efficient_set(points: &[(f64, f64)]) -> Vec<bool> {
    // Sort by x. A point is dominated iff some point with strictly lower x has y no greater, or some
    // point with the same x has strictly lower y.
    let mut order: Vec<usize> = (0..points.len()).collect();
    order.sort_by(|&a, &b| points[a].0.total_cmp(&points[b].0));
    let mut efficient = vec![true; points.len()];
    let mut best_y = f64::INFINITY; // min y over points with strictly smaller x
    let mut i = 0;
    while i < order.len() {
        let x = points[order[i]].0;
        let mut j = i;
        while j < order.len() && points[order[j]].0 == x {
            j += 1;
        }
        let group_min = order[i..j]
            .iter()
            .map(|&p| points[p].1)
            .filter(|y| !y.is_nan())
            .fold(f64::INFINITY, f64::min);
        for &p in &order[i..j] {
            let y = points[p].1;
            efficient[p] = y.is_nan() || (y < best_y && y <= group_min);
        }
        best_y = best_y.min(group_min);
        i = j;
    }
    efficient
}

/// The header of `frontier.csv`: the names of [`csv_record`]'s fields (the workbench's points carry
/// the same names).
pub fn csv_header() -> Vec<String> {
    let mut header: Vec<String> = [
        "model",
        "parameter",
        "method",
        "ploss",
        "uloss",
        "a_know",
        "a_acc",
        "query_error",
        "seconds",
        "efficient",
        "algorithm",
        "u_base",
    ]
    .map(String::from)
    .to_vec();
    header.extend(Classifier::ALL.map(|c| format!("gain_{}", c.name())));
    header.extend(
        [
            "whd",
            "dm",
            "risk_highest",
            "risk_average",
            "risk_records_at_risk",
        ]
        .map(String::from),
    );
    header
}

/// One line of `frontier.csv`, as text: the workload columns (`u_base`, `gain_<classifier>`) are
/// empty for a classifier not run or a sweep without a workload; `whd` (uniform weights) and `dm`
/// (discernibility) are the release's distortion; `risk_highest`, `risk_average`,
/// `risk_records_at_risk` its prosecutor risk (empty when it has no records outside suppression).
pub fn csv_record(p: &FrontierPoint) -> Vec<String> {
    let e = &p.evaluation;
    let mut record = vec![
        p.item.model.name().to_string(),
        p.item.parameter.to_string(),
        p.item.method.to_string(),
        format!("{:.6}", e.ploss),
        e.uloss.map(|u| format!("{u:.6}")).unwrap_or_default(),
        format!("{:.6}", e.a_know),
        format!("{:.6}", e.a_acc),
        format!("{:.6}", e.query_error),
        format!("{:.3}", p.seconds),
        p.efficient.to_string(),
        p.item.algorithm.to_string(),
        p.workload
            .as_ref()
            .map(|w| format!("{:.6}", w.u_base))
            .unwrap_or_default(),
    ];
    for c in Classifier::ALL {
        record.push(
            p.workload
                .as_ref()
                .and_then(|w| w.classifiers.iter().find(|x| x.classifier == c))
                .map(|x| format!("{:.6}", x.u_san_minus_u_base))
                .unwrap_or_default(),
        );
    }
    let distortion = p.distortion.as_ref();
    record.push(distortion.map_or_else(String::new, |d| format!("{:.6}", d.whd_uniform)));
    record.push(distortion.map_or_else(String::new, |d| format!("{:.1}", d.discernibility)));
    let risk = p.risk.as_ref();
    record.push(risk.map_or_else(String::new, |r| format!("{:.6}", r.highest)));
    record.push(risk.map_or_else(String::new, |r| format!("{:.6}", r.average)));
    record.push(risk.map_or_else(String::new, |r| format!("{:.6}", r.records_at_risk)));
    record
}

/// Writes `frontier.csv`: [`csv_header`], then [`csv_record`] per point.
pub fn write_csv(points: &[FrontierPoint], writer: impl Write) -> csv::Result<()> {
    let mut csv = csv::Writer::from_writer(writer);
    csv.write_record(csv_header())?;
    for p in points {
        csv.write_record(csv_record(p))?;
    }
    csv.flush()?;
    Ok(())
}

/// One curve of a plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    /// (x, y, label) in sweep order; consecutive points are joined.
    pub points: Vec<(f64, f64, String)>,
}

fn series_of(
    points: &[FrontierPoint],
    name: &str,
    keep: impl Fn(&FrontierPoint) -> bool,
    y: impl Fn(&Evaluation) -> Option<f64>,
) -> Series {
    xy_series(points, name, keep, |p| {
        y(&p.evaluation).map(|y| (p.evaluation.ploss, y))
    })
}

/// The points `keep` selects that have coordinates `xy`.
fn xy_series(
    points: &[FrontierPoint],
    name: &str,
    keep: impl Fn(&FrontierPoint) -> bool,
    xy: impl Fn(&FrontierPoint) -> Option<(f64, f64)>,
) -> Series {
    Series {
        name: name.to_string(),
        points: points
            .iter()
            .filter(|p| keep(p))
            .filter_map(|p| xy(p).map(|(x, y)| (x, y, format!("{}", p.item.parameter))))
            .collect(),
    }
}

/// The algorithms of the points, in first-seen order.
fn algorithms_of(points: &[FrontierPoint]) -> Vec<Algorithm> {
    let mut algorithms = Vec::new();
    for p in points {
        if !algorithms.contains(&p.item.algorithm) {
            algorithms.push(p.item.algorithm);
        }
    }
    algorithms
}

/// A scatter plot of connected series, with the efficient frontier of all its points.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    /// The file name without its extension (`fig2a-uloss-ploss`).
    pub stem: &'static str,
    pub title: &'static str,
    pub x_label: &'static str,
    pub y_label: String,
    pub series: Vec<Series>,
}

/// The three charts of Li & Li, the workload chart when the points carry a workload, and the risk chart
/// (Uloss against average prosecutor risk) when they carry a risk. With more than one
/// algorithm among the points, each series is split by algorithm and named `<series> (<algorithm>)`;
/// a series without points is left out.
pub fn charts(points: &[FrontierPoint]) -> Vec<Chart> {
    let mut out = Vec::new();
    let algorithms = algorithms_of(points);
    let named = |name: &str, algorithm: Algorithm| {
        if algorithms.len() > 1 {
            format!("{name} ({algorithm})")
        } else {
            name.to_string()
        }
    };
    let per_model = |method: ReleaseMethod, y: fn(&Evaluation) -> Option<f64>| -> Vec<Series> {
        SweptModel::ALL
            .iter()
            .flat_map(|&model| algorithms.iter().map(move |&a| (model, a)))
            .map(|(model, algorithm)| {
                series_of(
                    points,
                    &named(model.name(), algorithm),
                    |p| {
                        p.item.model == model
                            && p.item.method == method
                            && p.item.algorithm == algorithm
                    },
                    y,
                )
            })
            .filter(|s| !s.points.is_empty())
            .collect()
    };
    out.push(Chart {
        stem: "fig2a-uloss-ploss",
        title: "Utility loss vs privacy loss (generalization)",
        x_label: PLOSS,
        y_label: ULOSS.into(),
        series: per_model(ReleaseMethod::Generalization, |e| e.uloss),
    });
    let mut methods = Vec::new();
    for model in [SweptModel::L, SweptModel::T] {
        for method in [ReleaseMethod::Generalization, ReleaseMethod::Bucketization] {
            for &algorithm in &algorithms {
                let s = series_of(
                    points,
                    &named(&format!("{method} ({})", model.name()), algorithm),
                    |p| {
                        p.item.model == model
                            && p.item.method == method
                            && p.item.algorithm == algorithm
                    },
                    |e| e.uloss,
                );
                if !s.points.is_empty() {
                    methods.push(s);
                }
            }
        }
    }
    out.push(Chart {
        stem: "fig2b-methods",
        title: "Generalization vs bucketization",
        x_label: PLOSS,
        y_label: ULOSS.into(),
        series: methods,
    });
    out.push(Chart {
        stem: "fig3-query-error",
        title: "COUNT query error vs privacy loss (bucketization)",
        x_label: PLOSS,
        y_label: "Mean relative error of COUNT queries".into(),
        series: per_model(ReleaseMethod::Bucketization, |e| Some(e.query_error)),
    });
    // One series per model, method and algorithm, on the axes `xy` gives.
    let per_model_and_method = |xy: fn(&FrontierPoint) -> Option<(f64, f64)>| -> Vec<Series> {
        let mut series = Vec::new();
        for model in SweptModel::ALL {
            for method in [ReleaseMethod::Generalization, ReleaseMethod::Bucketization] {
                for &algorithm in &algorithms {
                    let s = xy_series(
                        points,
                        &named(&format!("{} ({method})", model.name()), algorithm),
                        |p| {
                            p.item.model == model
                                && p.item.method == method
                                && p.item.algorithm == algorithm
                        },
                        xy,
                    );
                    if !s.points.is_empty() {
                        series.push(s);
                    }
                }
            }
        }
        series
    };
    if let Some(attribute) = points
        .iter()
        .find_map(|p| p.workload.as_ref().map(|w| w.attribute.clone()))
    {
        let series = per_model_and_method(|p| p.workload_gain().map(|g| (p.evaluation.a_acc, g)));
        out.push(Chart {
            stem: "fig4-workload-gain",
            title: "Researcher's gain vs adversary's gain (Brickell & Shmatikov)",
            x_label: "Adversary's gain A_acc",
            y_label: format!("U_san − U_base learning {attribute} (best classifier)"),
            series,
        });
    }
    if points.iter().any(|p| p.risk.is_some()) {
        let series =
            per_model_and_method(|p| p.risk.zip(p.evaluation.uloss).map(|(r, u)| (r.average, u)));
        out.push(Chart {
            stem: "fig5-risk-uloss",
            title: "Utility loss vs re-identification risk",
            x_label: "Average prosecutor risk (mean of 1/|class| over records)",
            y_label: ULOSS.into(),
            series,
        });
    }
    out
}

const PLOSS: &str = "Privacy loss Ploss (max JS divergence)";
const ULOSS: &str = "Utility loss Uloss (mean JS divergence)";

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition, checked pair by pair.
    fn dominated(points: &[(f64, f64)], p: (f64, f64)) -> bool {
        !p.1.is_nan()
            && points
                .iter()
                .any(|q| q.0 <= p.0 && q.1 <= p.1 && (q.0 < p.0 || q.1 < p.1))
    }

    #[test]
    fn efficient_set_matches_the_definition() {
        let points = [
            (0.1, 0.5),
            (0.2, 0.3),
            (0.3, 0.4),
            (0.1, 0.6),
            (0.4, 0.1),
            (0.2, 0.3),
            (0.4, 0.2),
            (0.5, 0.1),
            (0.6, f64::NAN),
        ];
        let fast = efficient_set(&points);
        for (i, p) in points.iter().enumerate() {
            assert_eq!(fast[i], !dominated(&points, *p), "{p:?}");
        }
        // (0.1, 0.6) loses to (0.1, 0.5) at equal Ploss; (0.4, 0.2) to (0.4, 0.1); (0.5, 0.1) to
        // (0.4, 0.1) at equal Uloss; the two (0.2, 0.3) do not beat each other.
        assert_eq!(
            fast,
            vec![true, true, false, false, true, true, false, false, true]
        );
    }

    #[test]
    fn efficient_set_matches_the_definition_on_random_points_with_ties() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..500 {
            let n = rng.random_range(0..12);
            // Few distinct values, so that ties on either axis are common.
            let points: Vec<(f64, f64)> = (0..n)
                .map(|_| {
                    (
                        f64::from(rng.random_range(0..4u8)),
                        f64::from(rng.random_range(0..4u8)),
                    )
                })
                .collect();
            let fast = efficient_set(&points);
            for (i, p) in points.iter().enumerate() {
                assert_eq!(fast[i], !dominated(&points, *p), "{points:?} at {p:?}");
            }
        }
    }
}
