//! Grouped bar charts (Brickell & Shmatikov, KDD'08, Figures 1-4): one group per sanitization, one
//! bar per series in each group (the adversary's gain A_acc beside the researcher's gain
//! U_san - U_base per classifier), a zero line, group names under the axis, a legend beside the
//! plot.
//!
//! Invariants: exactly one bar per finite value (a `None` or non-finite value draws nothing and
//! leaves its slot empty, so bars of one series stay aligned across groups); bars grow from 0, up
//! or down; the y range always contains 0 and every drawn value.
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{Draw, FONT, PlotError, Swatch, color, failed, legend};
use crate::measures::figures::Figure;

/// A grouped bar chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Bars {
    pub title: String,
    /// A line under the title (the figure's baselines).
    pub subtitle: Option<String>,
    pub y_label: String,
    /// The groups, left to right.
    pub groups: Vec<String>,
    pub series: Vec<BarSeries>,
}

/// One bar per group.
#[derive(Debug, Clone, PartialEq)]
pub struct BarSeries {
    pub name: String,
    /// One value per group; `None`: not measured, no bar.
    pub values: Vec<Option<f64>>,
}

/// The classifiers' names in the legends.
fn classifier_name(code: &str) -> &str {
    match code {
        "j48" => "J48",
        "rf" => "Random Forest",
        "nb" => "Naive Bayes",
        other => other,
    }
}

impl Bars {
    /// The bar chart of one of Brickell & Shmatikov's figures: per sanitization, the adversary's
    /// A_acc, then U_san − U_base per classifier (empty slots until the utility side is measured).
    pub fn of_figure(figure: &Figure) -> Bars {
        let spec = &figure.spec;
        let dataset = spec.dataset;
        let mut subtitle = format!(
            "Q = ({}), S = {}; trivial sanitization: adversary {:.2} %",
            dataset.quasi().join(", "),
            dataset.sensitive(),
            figure.adversary_baseline * 100.0
        );
        match &figure.researcher_baseline {
            Some((base, by)) => {
                subtitle.push_str(&format!(", researcher {:.2} % ({by})", base * 100.0))
            }
            None => subtitle.push_str(", researcher not measured"),
        }
        let mut series = vec![BarSeries {
            name: "adversary: A_acc".into(),
            values: figure.bars.iter().map(|b| Some(b.a_acc)).collect(),
        }];
        for (i, classifier) in spec.classifiers.iter().enumerate() {
            series.push(BarSeries {
                name: format!("researcher: {}", classifier_name(classifier)),
                values: figure
                    .bars
                    .iter()
                    .map(|b| b.utility_gain.get(i).copied().flatten())
                    .collect(),
            });
        }
        Bars {
            title: format!(
                "Figure {}: \"{}\" dataset, learning {}",
                spec.number,
                dataset.name(),
                spec.workload
            ),
            subtitle: Some(subtitle),
            y_label: "Gain in accuracy (A_acc; U_san − U_base)".into(),
            groups: figure.bars.iter().map(|b| b.label.clone()).collect(),
            series,
        }
    }
}

const LEGEND_WIDTH: u32 = 240;
/// Pixels per bar, and between two groups.
const BAR: u32 = 14;
const GAP: u32 = 22;

impl Draw for Bars {
    fn size(&self) -> (u32, u32) {
        let slots = self.series.len().max(1) as u32;
        let groups = self.groups.len().max(1) as u32;
        let plot = 110 + groups * (slots * BAR + GAP);
        (plot.max(560) + LEGEND_WIDTH, 520)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        let values = || {
            self.series
                .iter()
                .flat_map(|s| s.values.iter().flatten().copied())
                .filter(|v| v.is_finite())
        };
        let low = values().fold(0.0, f64::min);
        let high = values().fold(0.0, f64::max);
        let pad = ((high - low) * 0.1).max(0.01);
        let (low, high) = (if low < 0.0 { low - pad } else { 0.0 }, high + pad);
        let groups = self.groups.len().max(1) as f64;
        let (plot_area, legend_area) = root.split_horizontally(self.size().0 - LEGEND_WIDTH);
        let (title_area, plot_area) =
            plot_area.split_vertically(if self.subtitle.is_some() { 56 } else { 36 });
        title_area
            .draw(&Text::new(
                self.title.clone(),
                ((title_area.dim_in_pixel().0 / 2) as i32, 12),
                (FONT, 17)
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Top)),
            ))
            .map_err(failed)?;
        if let Some(subtitle) = &self.subtitle {
            title_area
                .draw(&Text::new(
                    subtitle.clone(),
                    ((title_area.dim_in_pixel().0 / 2) as i32, 36),
                    (FONT, 12)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Center, VPos::Top)),
                ))
                .map_err(failed)?;
        }
        let mut chart = ChartBuilder::on(&plot_area)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..groups, low..high)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .light_line_style(RGBColor(0xf0, 0xf0, 0xf0))
            .bold_line_style(RGBColor(0xe0, 0xe0, 0xe0))
            .y_desc(self.y_label.as_str())
            .axis_desc_style((FONT, 14))
            .label_style((FONT, 12))
            .y_labels(10)
            .draw()
            .map_err(failed)?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(0.0, 0.0), (groups, 0.0)],
                BLACK.stroke_width(1),
            )))
            .map_err(failed)?;
        // Each group spans one unit: a margin of half a gap on each side, then the bars.
        let slots = self.series.len().max(1) as f64;
        let margin = GAP as f64 / (slots * BAR as f64 + GAP as f64) / 2.0;
        let width = (1.0 - 2.0 * margin) / slots;
        let mut entries = Vec::new();
        for (i, s) in self.series.iter().enumerate() {
            let c = color(i);
            let bars = s
                .values
                .iter()
                .enumerate()
                .take(self.groups.len())
                .filter_map(|(g, v)| v.filter(|v| v.is_finite()).map(|v| (g, v)))
                .map(|(g, v)| {
                    let x0 = g as f64 + margin + i as f64 * width;
                    Rectangle::new([(x0, 0.0), (x0 + width * 0.92, v)], c.filled())
                });
            chart.draw_series(bars).map_err(failed)?;
            entries.push((s.name.clone(), c, Swatch::Box));
        }
        let label = (FONT, 12)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Top));
        for (g, name) in self.groups.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(g as f64 + 0.5, low));
            root.draw(&Text::new(name.clone(), (x, y + 8), label.clone()))
                .map_err(failed)?;
        }
        legend(&legend_area, (12, 70), &entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plots::{Format, render};

    fn bars() -> Bars {
        Bars {
            title: "Figure".into(),
            subtitle: Some("baseline".into()),
            y_label: "gain".into(),
            groups: vec!["k=10".into(), "l=5".into(), "δ=1.2".into()],
            series: vec![
                BarSeries {
                    name: "adversary (A_acc)".into(),
                    values: vec![Some(0.1), Some(0.05), Some(0.0)],
                },
                BarSeries {
                    name: "J48".into(),
                    values: vec![Some(-0.02), None, Some(f64::NAN)],
                },
            ],
        }
    }

    #[test]
    fn one_rect_per_value_plus_the_legend_and_every_label() {
        let svg = String::from_utf8(render(&bars(), Format::Svg).unwrap()).unwrap();
        let rects = |fill: &str| crate::plots::svg::filled(&svg, "rect", fill);
        assert_eq!(rects("#1f77b4"), 3 + 1);
        assert_eq!(rects("#d62728"), 1 + 1);
        let texts = crate::plots::svg::texts(&svg);
        for expected in [
            "Figure",
            "baseline",
            "gain",
            "k=10",
            "l=5",
            "δ=1.2",
            "J48",
            "adversary (A_acc)",
        ] {
            assert!(
                texts.iter().any(|t| t == expected),
                "{expected} in {texts:?}"
            );
        }
    }

    #[test]
    fn the_png_decodes_at_the_chart_size() {
        let chart = bars();
        let bytes = render(&chart, Format::Png).unwrap();
        let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
            .read_info()
            .unwrap();
        let mut pixels = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut pixels).unwrap();
        assert_eq!((info.width, info.height), chart.size());
        let has = |c: RGBColor| pixels.chunks(3).any(|p| p == [c.0, c.1, c.2]);
        assert!(has(color(0)) && has(color(1)));
    }
}
