//! The yardstick's chart (`cloakd simulate --compare`): one point per model and setting, the quality
//! loss across and the adversary's expected error up (higher is more private), each series a line
//! through its settings with one marker shape per series and each point labelled with its setting.
//!
//! Invariants: points with a non-finite coordinate are left out of lines, markers and axis ranges;
//! one marker per finite point; series keep their order and colour.
use plotters::coord::Shift;
use plotters::prelude::*;

use super::{Draw, FONT, PlotError, Swatch, color, failed, legend, marker};

/// Width of the legend column right of the plot.
const LEGEND_WIDTH: u32 = 230;

/// A named series of (x, y, label) points.
pub type Series = (String, Vec<(f64, f64, String)>);

/// Series of (x, y, label) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Tradeoff {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
}

impl Draw for Tradeoff {
    fn size(&self) -> (u32, u32) {
        (760, 520)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        let finite = |points: &[(f64, f64, String)]| -> Vec<(f64, f64, String)> {
            points
                .iter()
                .filter(|p| p.0.is_finite() && p.1.is_finite())
                .cloned()
                .collect()
        };
        let all: Vec<(f64, f64, String)> = self.series.iter().flat_map(|s| finite(&s.1)).collect();
        let x_max = all.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-6) * 1.12;
        let y_max = all.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-6) * 1.12;
        let (plot_area, legend_area) = root.split_horizontally(self.size().0 - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(self.title.as_str(), (FONT, 17))
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .light_line_style(RGBColor(0xf0, 0xf0, 0xf0))
            .bold_line_style(RGBColor(0xe0, 0xe0, 0xe0))
            .x_desc(self.x_label.as_str())
            .y_desc(self.y_label.as_str())
            .axis_desc_style((FONT, 14))
            .label_style((FONT, 12))
            .x_labels(8)
            .y_labels(8)
            .draw()
            .map_err(failed)?;
        let mut entries = Vec::new();
        for (i, (name, points)) in self.series.iter().enumerate() {
            let c = color(i);
            let points = finite(points);
            if points.len() > 1 {
                chart
                    .draw_series(LineSeries::new(
                        points.iter().map(|p| (p.0, p.1)),
                        c.mix(0.7).stroke_width(2),
                    ))
                    .map_err(failed)?;
            }
            for p in &points {
                marker(root, i, chart.backend_coord(&(p.0, p.1)), c)?;
                if !p.2.is_empty() {
                    chart
                        .draw_series(std::iter::once(Text::new(
                            p.2.clone(),
                            (p.0, p.1),
                            (FONT, 12).into_font().color(&c),
                        )))
                        .map_err(failed)?;
                }
            }
            entries.push((
                name.clone(),
                c,
                Swatch::Line {
                    shape: Some(i),
                    dashed: false,
                },
            ));
        }
        legend(&legend_area, (16, 60), &entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plots::{Format, render};

    #[test]
    fn the_svg_has_title_legend_labels_and_one_marker_per_finite_point() {
        let chart = Tradeoff {
            title: "models".into(),
            x_label: "quality loss (m)".into(),
            y_label: "adversary error (m)".into(),
            series: vec![
                (
                    "geo-ind".into(),
                    vec![
                        (100.0, 80.0, "eps 5".into()),
                        (400.0, 300.0, "eps 1".into()),
                        (f64::NAN, 1.0, "nan".into()),
                    ],
                ),
                ("requests".into(), vec![(250.0, 200.0, String::new())]),
            ],
        };
        let svg = String::from_utf8(render(&chart, Format::Svg).unwrap()).unwrap();
        let texts = crate::plots::svg::texts(&svg);
        for expected in ["models", "geo-ind", "requests", "eps 5", "eps 1"] {
            assert!(
                texts.iter().any(|t| t == expected),
                "{expected} in {texts:?}"
            );
        }
        assert!(!texts.iter().any(|t| t == "nan"));
        let filled = |tag: &str, fill: &str| crate::plots::svg::filled(&svg, tag, fill);
        assert_eq!(filled("circle", "#1f77b4"), 3);
        assert_eq!(filled("rect", "#d62728"), 2);
    }
}
