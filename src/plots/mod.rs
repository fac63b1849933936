//! Drawing: the frontier's scatter plots ([`scatter`]), Brickell & Shmatikov's grouped bar charts
//! ([`bars`]) and the yardstick's trade-off of privacy and quality ([`tradeoff`]) through the
//! `plotters` crate, as SVG or PNG, into memory (no files, no clock: the command line writes the
//! bytes).
//!
//! Invariants: the output is a pure function of the chart and the format, identical on every
//! machine: text is laid out with `ab_glyph` over DejaVu Sans embedded in the binary (the `dejavu`
//! crate; Bitstream Vera licence and public domain), never with the system's fonts. SVG names the
//! font family `sans-serif` and leaves the glyphs to the viewer; PNG is 8-bit RGB.
pub mod bars;
pub mod scatter;
pub mod tradeoff;

use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

pub use bars::{BarSeries, Bars};

/// An output format of the plots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    /// The file extension (and the name on the command line).
    pub fn extension(self) -> &'static str {
        match self {
            Format::Svg => "svg",
            Format::Png => "png",
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "svg" => Ok(Format::Svg),
            "png" => Ok(Format::Png),
            other => Err(format!(
                "unknown format {} (known: svg, png)",
                crate::text::quote(other)
            )),
        }
    }
}

/// Why a plot could not be drawn (a font or backend failure; not expected with the embedded font).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("cannot draw the plot: {0}")]
pub struct PlotError(pub String);

fn failed(e: impl std::fmt::Display) -> PlotError {
    PlotError(e.to_string())
}

/// The font family every text of the plots uses.
const FONT: &str = "sans-serif";

/// Registers the embedded font under [`FONT`], once per process.
fn register_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(PlotError("the embedded font does not parse".into()))
    }
}

/// Series colours (matplotlib's first six), in series order.
const COLORS: [RGBColor; 6] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// The colour of series `i`.
pub fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// A chart that draws itself on any plotters backend.
pub trait Draw {
    /// Width and height in pixels.
    fn size(&self) -> (u32, u32);
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), PlotError>;
}

/// Renders a chart in a format: an SVG document or a PNG file, as bytes.
pub fn render(chart: &impl Draw, format: Format) -> Result<Vec<u8>, PlotError> {
    register_font()?;
    let (width, height) = chart.size();
    match format {
        Format::Svg => {
            let mut svg = String::new();
            {
                let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
                root.fill(&WHITE).map_err(failed)?;
                chart.draw(&root)?;
                root.present().map_err(failed)?;
            }
            Ok(svg.into_bytes())
        }
        Format::Png => {
            let mut rgb = vec![0u8; width as usize * height as usize * 3];
            {
                let root =
                    BitMapBackend::with_buffer(&mut rgb, (width, height)).into_drawing_area();
                root.fill(&WHITE).map_err(failed)?;
                chart.draw(&root)?;
                root.present().map_err(failed)?;
            }
            encode_png(&rgb, width, height)
        }
    }
}

/// Encodes 8-bit RGB pixels as a PNG file.
fn encode_png(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, PlotError> {
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, width, height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(failed)?;
        writer.write_image_data(rgb).map_err(failed)?;
        writer.finish().map_err(failed)?;
    }
    Ok(out)
}

/// A legend entry's swatch.
enum Swatch {
    /// A line with the series' marker (scatter plots); `dashed` for the frontier.
    Line { shape: Option<usize>, dashed: bool },
    /// A filled box (bar charts).
    Box,
}

/// Draws a legend, one entry per line from `(x, y)` downwards, on a pixel area.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    (x, y): (i32, i32),
    entries: &[(String, RGBColor, Swatch)],
) -> Result<(), PlotError> {
    let style = (FONT, 13).into_font().color(&BLACK);
    for (i, (name, color, swatch)) in entries.iter().enumerate() {
        let ly = y + i as i32 * 24;
        match swatch {
            Swatch::Line { shape, dashed } => {
                if *dashed {
                    for dash in 0..3 {
                        let x0 = x + dash * 9;
                        area.draw(&PathElement::new(
                            vec![(x0, ly), (x0 + 6, ly)],
                            color.stroke_width(2),
                        ))
                        .map_err(failed)?;
                    }
                } else {
                    area.draw(&PathElement::new(
                        vec![(x, ly), (x + 24, ly)],
                        color.stroke_width(2),
                    ))
                    .map_err(failed)?;
                }
                if let Some(shape) = shape {
                    marker(area, *shape, (x + 12, ly), *color)?;
                }
            }
            Swatch::Box => {
                area.draw(&Rectangle::new(
                    [(x + 4, ly - 7), (x + 20, ly + 7)],
                    color.filled(),
                ))
                .map_err(failed)?;
            }
        }
        area.draw(&Text::new(
            name.clone(),
            (x + 32, ly),
            style.pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(failed)?;
    }
    Ok(())
}

/// Draws marker `shape` (circle, square, triangle, diamond, cycling) at a pixel.
fn marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    shape: usize,
    (x, y): (i32, i32),
    color: RGBColor,
) -> Result<(), PlotError> {
    let style = color.filled();
    match shape % 4 {
        0 => area.draw(&Circle::new((x, y), 5, style)),
        1 => area.draw(&Rectangle::new([(x - 4, y - 4), (x + 5, y + 5)], style)),
        2 => area.draw(&Polygon::new(
            vec![(x, y - 6), (x - 5, y + 4), (x + 5, y + 4)],
            style,
        )),
        _ => area.draw(&Polygon::new(
            vec![(x, y - 6), (x + 6, y), (x, y + 6), (x - 6, y)],
            style,
        )),
    }
    .map_err(failed)
}

/// What the plot tests read from an SVG document.
#[cfg(test)]
pub(crate) mod svg {
    /// The texts, trimmed.
    pub fn texts(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).unwrap();
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text().map(|t| t.trim().to_string()))
            .collect()
    }

    /// How many `tag` elements are filled with `fill` (`#rrggbb`, any case).
    pub fn filled(svg: &str, tag: &str, fill: &str) -> usize {
        let doc = roxmltree::Document::parse(svg).unwrap();
        doc.descendants()
            .filter(|n| n.has_tag_name(tag))
            .filter(|n| {
                n.attribute("fill")
                    .is_some_and(|f| f.eq_ignore_ascii_case(fill))
            })
            .count()
    }
}
