//! The privacy/utility frontier (Li & Li, KDD'09 §5): a family of releases (privacy models ×
//! parameters × release methods), each measured, the *efficient* set among them (no other release has
//! both lower Ploss and lower Uloss), `frontier.csv`, and hand-written SVG plots of the paper's
//! figures: Uloss against Ploss per model (Fig. 2a, generalization), generalization against
//! bucketization for l-diversity and t-closeness (Fig. 2b), and COUNT query error against Ploss per
//! model (Fig. 3a, bucketization), each with the efficient frontier of the plotted points drawn as a
//! dashed polyline. Several algorithms (Mondrian, OLA, KACA) can be swept on the same axes: each
//! series is then split by algorithm.
//!
//! Invariants: the sweep's defaults are the paper's parameter sets; a point is efficient exactly when
//! no other point strictly dominates it on both axes (checked against the quadratic definition in the
//! tests); plots are pure functions of the points (no files, no clock).
use std::fmt::Write as _;
use std::io::Write;

use crate::measures::evaluate::Evaluation;
use crate::relational::Algorithm;
use crate::relational::models::{Distance, LDiversity, PrivacySpec, TCloseness};
use crate::relational::release::ReleaseMethod;

/// A privacy model swept by the frontier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SweptModel {
    /// k-anonymity.
    K,
    /// Probabilistic l-diversity (max_s P(s) <= 1/l), Li & Li's l-diversity.
    L,
    /// t-closeness with the JS divergence, as Li & Li.
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

    /// The privacy requirement of one parameter value.
    pub fn spec(self, parameter: f64) -> PrivacySpec {
        let mut spec = PrivacySpec::default();
        match self {
            SweptModel::K => spec.k = Some(parameter.round().max(1.0) as u64),
            SweptModel::L => spec.l = Some(LDiversity::Probabilistic(parameter)),
            SweptModel::T => {
                spec.t = Some(TCloseness {
                    t: parameter,
                    distance: Distance::Js,
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
}

/// Marks the efficient points: no other point has both lower Ploss and lower Uloss.
pub fn mark_efficient(points: &mut [FrontierPoint]) {
    let coordinates: Vec<(f64, f64)> = points
        .iter()
        .map(|p| (p.evaluation.ploss, p.evaluation.uloss))
        .collect();
    let efficient = efficient_set(&coordinates);
    for (p, e) in points.iter_mut().zip(efficient) {
        p.efficient = e;
    }
}

/// For each (x, y): whether no other point has both a lower x and a lower y.
pub fn efficient_set(points: &[(f64, f64)]) -> Vec<bool> {
    // Sort by x; a point is dominated iff some point with strictly lower x has strictly lower y.
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
        for &p in &order[i..j] {
            efficient[p] = points[p].1 <= best_y || points[p].1.is_nan();
        }
        for &p in &order[i..j] {
            best_y = best_y.min(points[p].1);
        }
        i = j;
    }
    efficient
}

/// Writes `frontier.csv`.
pub fn write_csv(points: &[FrontierPoint], writer: impl Write) -> csv::Result<()> {
    let mut csv = csv::Writer::from_writer(writer);
    csv.write_record([
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
    ])?;
    for p in points {
        let e = &p.evaluation;
        csv.write_record([
            p.item.model.name().to_string(),
            p.item.parameter.to_string(),
            p.item.method.to_string(),
            format!("{:.6}", e.ploss),
            format!("{:.6}", e.uloss),
            format!("{:.6}", e.a_know),
            format!("{:.6}", e.a_acc),
            format!("{:.6}", e.query_error),
            format!("{:.3}", p.seconds),
            p.efficient.to_string(),
            p.item.algorithm.to_string(),
        ])?;
    }
    csv.flush()?;
    Ok(())
}

/// One curve of a plot.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    /// (x, y, label) in sweep order; consecutive points are joined.
    pub points: Vec<(f64, f64, String)>,
}

const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

/// A "nice" step for about `target` ticks over `span`.
fn tick_step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(1e-12);
    let magnitude = 10f64.powf(raw.log10().floor());
    let fraction = raw / magnitude;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

fn marker(shape: usize, x: f64, y: f64, color: &str) -> String {
    match shape % 4 {
        0 => format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="4.5" fill="{color}"/>"#),
        1 => format!(
            r#"<rect x="{:.1}" y="{:.1}" width="9" height="9" fill="{color}"/>"#,
            x - 4.5,
            y - 4.5
        ),
        2 => format!(
            r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{color}"/>"#,
            x,
            y - 5.5,
            x - 5.0,
            y + 4.0,
            x + 5.0,
            y + 4.0
        ),
        _ => format!(
            r#"<polygon points="{:.1},{:.1} {:.1},{:.1} {:.1},{:.1} {:.1},{:.1}" fill="{color}"/>"#,
            x,
            y - 5.5,
            x + 5.5,
            y,
            x,
            y + 5.5,
            x - 5.5,
            y
        ),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A scatter plot with connected series, axes with ticks and labels, a legend, and the efficient
/// frontier of all plotted points (lower-left staircase of non-dominated points) as a dashed line.
pub fn scatter_svg(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let (width, height) = (760.0, 520.0);
    let (left, right, top, bottom) = (80.0, 230.0, 50.0, 60.0);
    let plot_w = width - left - right;
    let plot_h = height - top - bottom;
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| (p.0, p.1)))
        .filter(|p| p.0.is_finite() && p.1.is_finite())
        .collect();
    let x_max = all.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-6) * 1.05;
    let y_max = all.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-6) * 1.1;
    let x_step = tick_step(x_max, 6.0);
    let y_step = tick_step(y_max, 6.0);
    let x_max = (x_max / x_step).ceil() * x_step;
    let y_max = (y_max / y_step).ceil() * y_step;
    let sx = |x: f64| left + x / x_max * plot_w;
    let sy = |y: f64| top + plot_h - y / y_max * plot_h;
    let decimals = |step: f64| ((-step.log10()).ceil().max(0.0)) as usize;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="Helvetica, Arial, sans-serif" font-size="13">
<rect width="100%" height="100%" fill="white"/>
<text x="{:.1}" y="28" text-anchor="middle" font-size="16" font-weight="bold">{}</text>
"#,
        left + plot_w / 2.0,
        escape(title)
    );
    // Grid and ticks.
    let mut t = 0.0;
    while t <= x_max + x_step * 1e-6 {
        let x = sx(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#e5e5e5"/><line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="black"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{:.*}</text>"##,
            top + plot_h,
            top + plot_h,
            top + plot_h + 5.0,
            top + plot_h + 20.0,
            decimals(x_step),
            t
        );
        t += x_step;
    }
    let mut t = 0.0;
    while t <= y_max + y_step * 1e-6 {
        let y = sy(t);
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/><line x1="{:.1}" y1="{y:.1}" x2="{left}" y2="{y:.1}" stroke="black"/><text x="{:.1}" y="{:.1}" text-anchor="end">{:.*}</text>"##,
            left + plot_w,
            left - 5.0,
            left - 8.0,
            y + 4.0,
            decimals(y_step),
            t
        );
        t += y_step;
    }
    let _ = writeln!(
        svg,
        r#"<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>
<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="14">{}</text>
<text x="20" y="{:.1}" text-anchor="middle" font-size="14" transform="rotate(-90 20 {:.1})">{}</text>"#,
        left + plot_w / 2.0,
        height - 15.0,
        escape(x_label),
        top + plot_h / 2.0,
        top + plot_h / 2.0,
        escape(y_label)
    );
    // Efficient frontier of the plotted points.
    let efficient = efficient_set(&all);
    let mut frontier: Vec<(f64, f64)> = all
        .iter()
        .zip(&efficient)
        .filter(|&(_, &e)| e)
        .map(|(&p, _)| p)
        .collect();
    frontier.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
    if frontier.len() > 1 {
        let path: Vec<String> = frontier
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline points="{}" fill="none" stroke="black" stroke-width="2" stroke-dasharray="7,4"/>"#,
            path.join(" ")
        );
    }
    for &(x, y) in &frontier {
        let _ = writeln!(
            svg,
            r#"<circle cx="{:.1}" cy="{:.1}" r="8" fill="none" stroke="black" stroke-width="1.5"/>"#,
            sx(x),
            sy(y)
        );
    }
    // Series.
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let finite: Vec<&(f64, f64, String)> = s
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .collect();
        if finite.len() > 1 {
            let path: Vec<String> = finite
                .iter()
                .map(|p| format!("{:.1},{:.1}", sx(p.0), sy(p.1)))
                .collect();
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="1.5" opacity="0.7"/>"#,
                path.join(" ")
            );
        }
        for p in finite {
            let _ = writeln!(
                svg,
                "{}<title>{} {}: ({:.4}, {:.4})</title>",
                marker(i, sx(p.0), sy(p.1), color),
                escape(&s.name),
                escape(&p.2),
                p.0,
                p.1
            );
        }
        // Legend.
        let ly = top + 10.0 + i as f64 * 24.0;
        let lx = left + plot_w + 20.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="1.5"/>{}<text x="{:.1}" y="{:.1}">{}</text>"#,
            lx + 24.0,
            marker(i, lx + 12.0, ly, color),
            lx + 32.0,
            ly + 4.5,
            escape(&s.name)
        );
    }
    let ly = top + 10.0 + series.len() as f64 * 24.0;
    let lx = left + plot_w + 20.0;
    let _ = writeln!(
        svg,
        r#"<line x1="{lx:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="black" stroke-width="2" stroke-dasharray="7,4"/><circle cx="{:.1}" cy="{ly:.1}" r="6" fill="none" stroke="black"/><text x="{:.1}" y="{:.1}">efficient frontier</text>"#,
        lx + 24.0,
        lx + 12.0,
        lx + 32.0,
        ly + 4.5
    );
    svg.push_str("</svg>\n");
    svg
}

fn series_of(
    points: &[FrontierPoint],
    name: &str,
    keep: impl Fn(&FrontierPoint) -> bool,
    y: impl Fn(&Evaluation) -> f64,
) -> Series {
    Series {
        name: name.to_string(),
        points: points
            .iter()
            .filter(|p| keep(p))
            .map(|p| {
                (
                    p.evaluation.ploss,
                    y(&p.evaluation),
                    format!("{}", p.item.parameter),
                )
            })
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

/// The three plots: (file name, SVG). With more than one algorithm among the points, each series
/// is split by algorithm and named `<series> (<algorithm>)`.
pub fn plots(points: &[FrontierPoint]) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let algorithms = algorithms_of(points);
    let named = |name: &str, algorithm: Algorithm| {
        if algorithms.len() > 1 {
            format!("{name} ({algorithm})")
        } else {
            name.to_string()
        }
    };
    let per_model = |method: ReleaseMethod, y: fn(&Evaluation) -> f64| -> Vec<Series> {
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
    out.push((
        "fig2a-uloss-ploss.svg",
        scatter_svg(
            "Utility loss vs privacy loss (generalization)",
            "Privacy loss Ploss (max JS divergence)",
            "Utility loss Uloss (mean JS divergence)",
            &per_model(ReleaseMethod::Generalization, |e| e.uloss),
        ),
    ));
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
    out.push((
        "fig2b-methods.svg",
        scatter_svg(
            "Generalization vs bucketization",
            "Privacy loss Ploss (max JS divergence)",
            "Utility loss Uloss (mean JS divergence)",
            &methods,
        ),
    ));
    out.push((
        "fig3-query-error.svg",
        scatter_svg(
            "COUNT query error vs privacy loss (bucketization)",
            "Privacy loss Ploss (max JS divergence)",
            "Mean relative error of COUNT queries",
            &per_model(ReleaseMethod::Bucketization, |e| e.query_error),
        ),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efficient_set_matches_the_definition() {
        let points = [
            (0.1, 0.5),
            (0.2, 0.3),
            (0.3, 0.4),
            (0.1, 0.6),
            (0.4, 0.1),
            (0.2, 0.3),
        ];
        let fast = efficient_set(&points);
        for (i, p) in points.iter().enumerate() {
            let dominated = points.iter().any(|q| q.0 < p.0 && q.1 < p.1);
            assert_eq!(fast[i], !dominated, "{p:?}");
        }
        assert_eq!(fast, vec![true, true, false, true, true, true]);
    }

    #[test]
    fn svg_has_axes_legend_and_frontier() {
        let s = Series {
            name: "k-anonymity".into(),
            points: vec![(0.1, 0.02, "10".into()), (0.2, 0.01, "50".into())],
        };
        let svg = scatter_svg("t", "x <label>", "y", &[s]);
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("k-anonymity"));
        assert!(svg.contains("stroke-dasharray"));
        assert!(svg.contains("x &lt;label&gt;"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
