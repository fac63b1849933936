//! The frontier's scatter plots (Li & Li, Fig. 2a, 2b, 3a): each series a connected line with one
//! marker shape per series, axes from 0 with ticks, labels and a light grid, a legend beside the
//! plot, and the efficient frontier of all plotted points (the non-dominated ones, in x order)
//! drawn as a dashed black line through rings.
//!
//! Invariants: points with a non-finite coordinate are left out of the lines, the markers, the
//! axis ranges and the frontier; one marker per finite point; series keep their order and colour.
use plotters::coord::Shift;
use plotters::prelude::*;

use super::{Draw, FONT, PlotError, Swatch, color, failed, legend, marker};
use crate::measures::frontier::{Chart, efficient_set};

/// Width of the legend column right of the plot.
const LEGEND_WIDTH: u32 = 230;

impl Draw for Chart {
    fn size(&self) -> (u32, u32) {
        (760, 520)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError> {
        let finite = |s: &crate::measures::frontier::Series| -> Vec<(f64, f64)> {
            s.points
                .iter()
                .map(|p| (p.0, p.1))
                .filter(|p| p.0.is_finite() && p.1.is_finite())
                .collect()
        };
        let all: Vec<(f64, f64)> = self.series.iter().flat_map(finite).collect();
        let x_max = all.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-6) * 1.05;
        let y_max = all.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-6) * 1.1;
        let (plot_area, legend_area) = root.split_horizontally(self.size().0 - LEGEND_WIDTH);
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(self.title, (FONT, 17))
            .margin(12)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, 0.0..y_max)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .light_line_style(RGBColor(0xf0, 0xf0, 0xf0))
            .bold_line_style(RGBColor(0xe0, 0xe0, 0xe0))
            .x_desc(self.x_label)
            .y_desc(self.y_label.as_str())
            .axis_desc_style((FONT, 14))
            .label_style((FONT, 12))
            .x_labels(8)
            .y_labels(8)
            .draw()
            .map_err(failed)?;
        // The efficient frontier of the plotted points, under the series.
        let efficient = efficient_set(&all);
        let mut frontier: Vec<(f64, f64)> = all
            .iter()
            .zip(&efficient)
            .filter(|&(_, &e)| e)
            .map(|(&p, _)| p)
            .collect();
        frontier.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        if frontier.len() > 1 {
            chart
                .draw_series(DashedLineSeries::new(
                    frontier.iter().copied(),
                    7,
                    4,
                    BLACK.stroke_width(2),
                ))
                .map_err(failed)?;
        }
        chart
            .draw_series(
                frontier
                    .iter()
                    .map(|&p| Circle::new(p, 9, BLACK.stroke_width(1))),
            )
            .map_err(failed)?;
        let mut entries = Vec::new();
        for (i, s) in self.series.iter().enumerate() {
            let c = color(i);
            let points = finite(s);
            if points.len() > 1 {
                chart
                    .draw_series(LineSeries::new(
                        points.iter().copied(),
                        c.mix(0.7).stroke_width(2),
                    ))
                    .map_err(failed)?;
            }
            for p in points {
                marker(root, i, chart.backend_coord(&p), c)?;
            }
            entries.push((
                s.name.clone(),
                c,
                Swatch::Line {
                    shape: Some(i),
                    dashed: false,
                },
            ));
        }
        entries.push((
            "efficient frontier".to_string(),
            BLACK,
            Swatch::Line {
                shape: None,
                dashed: true,
            },
        ));
        legend(&legend_area, (16, 60), &entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measures::frontier::Series;
    use crate::plots::{Format, render};

    fn chart() -> Chart {
        Chart {
            stem: "t",
            title: "a <title> & more",
            x_label: "x",
            y_label: "y".into(),
            series: vec![
                Series {
                    name: "k-anonymity".into(),
                    points: vec![
                        (0.1, 0.02, "10".into()),
                        (0.2, 0.01, "50".into()),
                        (f64::NAN, 0.5, "nan".into()),
                    ],
                },
                Series {
                    name: "t-closeness".into(),
                    points: vec![(0.05, 0.03, "0.1".into())],
                },
            ],
        }
    }

    #[test]
    fn the_svg_is_xml_with_title_legend_and_one_marker_per_finite_point() {
        let svg = String::from_utf8(render(&chart(), Format::Svg).unwrap()).unwrap();
        let texts = crate::plots::svg::texts(&svg);
        for expected in [
            "a <title> & more",
            "k-anonymity",
            "t-closeness",
            "efficient frontier",
        ] {
            assert!(
                texts.iter().any(|t| t == expected),
                "{expected} in {texts:?}"
            );
        }
        // Series 0 (circles): two finite points and the legend's; series 1 (squares): one and the
        // legend's.
        let filled = |tag: &str, fill: &str| crate::plots::svg::filled(&svg, tag, fill);
        assert_eq!(filled("circle", "#1f77b4"), 3);
        assert_eq!(filled("rect", "#d62728"), 2);
    }

    #[test]
    fn the_png_decodes_at_the_chart_size() {
        let bytes = render(&chart(), Format::Png).unwrap();
        let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
        let mut reader = decoder.read_info().unwrap();
        let mut pixels = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut pixels).unwrap();
        assert_eq!((info.width, info.height), (760, 520));
        // Something was drawn in each series' colour.
        let has = |c: RGBColor| pixels.chunks(3).any(|p| p == [c.0, c.1, c.2]);
        assert!(has(color(0)) && has(color(1)));
    }
}
