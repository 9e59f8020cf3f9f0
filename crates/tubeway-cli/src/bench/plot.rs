//! `--plot FILE.svg`: throughput against payload size, and latency
//! percentile curves, side by side in one SVG.

use std::path::Path;

use plotters::prelude::*;

use super::args::Group;
use super::figures::size_label;
use super::report::{Report, Section};
use super::table::num;

/// Width and height of the whole picture, in pixels.
const SIZE: (u32, u32) = (1400, 560);
/// The highest percentile drawn, in nines (99.999%).
const MAX_NINES: f64 = 5.0;

/// A named line of points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) points, x ascending.
    pub points: Vec<(f64, f64)>,
}

/// Throughput (MB/s) against payload (bytes), one series per transport and
/// mode, and the memcpy bandwidth of the same sizes.
pub fn throughput_series(r: &Report) -> Vec<Series> {
    let mut out = Vec::new();
    let mut memcpy: Vec<(f64, f64)> = Vec::new();
    for s in r.sections.iter().filter(|s| s.mode.is_some()) {
        let mut points = Vec::new();
        for f in s.figures.iter().filter(|f| f.group == Some(Group::Size)) {
            if let Some(mb) = &f.mb_per_sec {
                points.push((f.payload as f64, mb.median));
            }
            let copy = f
                .baselines
                .iter()
                .find(|b| b.name.starts_with("memcpy"))
                .and_then(|b| b.value.as_ref());
            if let Some(c) = copy {
                if !memcpy.iter().any(|(x, _)| *x == f.payload as f64) {
                    memcpy.push((f.payload as f64, c.median));
                }
            }
        }
        if !points.is_empty() {
            out.push(Series {
                name: name(s),
                points,
            });
        }
    }
    if !memcpy.is_empty() {
        memcpy.sort_by(|a, b| a.0.total_cmp(&b.0));
        out.push(Series {
            name: "memcpy".to_owned(),
            points: memcpy,
        });
    }
    out
}

/// Latency (µs) against percentile, in nines (1 = 90%, 2 = 99%, ...), one
/// series per latency figure.
pub fn latency_series(r: &Report) -> Vec<Series> {
    let mut out = Vec::new();
    for s in r.sections.iter().filter(|s| s.mode.is_some()) {
        for f in &s.figures {
            let Some(l) = &f.latency else { continue };
            let points: Vec<(f64, f64)> = l
                .curve
                .iter()
                .map(|p| (nines(p.percentile), p.us))
                .collect();
            if points.is_empty() {
                continue;
            }
            let what = match f.group {
                Some(Group::Rate) => format!("{} msg/s", l.offered_rate.unwrap_or(0)),
                _ => "round trip".to_owned(),
            };
            out.push(Series {
                name: format!("{} {what}", name(s)),
                points,
            });
        }
    }
    out
}

/// A percentile as nines: 0 → 0, 90 → 1, 99 → 2, 99.9 → 3; 100 is drawn
/// at the right edge.
pub fn nines(percentile: f64) -> f64 {
    let rest = 1.0 - percentile / 100.0;
    if rest <= 0.0 {
        MAX_NINES
    } else {
        (-rest.log10()).clamp(0.0, MAX_NINES)
    }
}

fn name(s: &Section) -> String {
    let mode = s.mode.unwrap_or("limits");
    if s.wait == "default" {
        format!("{} {mode}", s.transport)
    } else {
        format!("{} {mode} ({})", s.transport, s.wait)
    }
}

/// The range of a log axis holding every value, a little wider.
fn log_range(values: impl Iterator<Item = f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo.is_finite() && hi.is_finite() {
        (lo / 2.0)..(hi * 2.0)
    } else {
        1.0..10.0
    }
}

/// Draws the report to `path`.
pub fn draw(r: &Report, path: &Path) -> anyhow::Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("cannot draw {}: {e}", path.display());
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);

    let tput = throughput_series(r);
    let xs = log_range(tput.iter().flat_map(|s| s.points.iter().map(|p| p.0)));
    let ys = log_range(tput.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let mut chart = ChartBuilder::on(&left)
        .caption(
            "throughput by payload size (1 connection)",
            ("sans-serif", 20),
        )
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(xs.log_scale(), ys.log_scale())
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("payload")
        .y_desc("MB/s")
        .x_label_formatter(&|x| size_label(x.round() as usize))
        .y_label_formatter(&|y| num(*y))
        .draw()
        .map_err(|e| err(&e))?;
    // Throughput rises with the payload: the lower right stays empty.
    lines(&mut chart, &tput, SeriesLabelPosition::LowerRight).map_err(|e| err(&e))?;

    let lat = latency_series(r);
    let ys = log_range(lat.iter().flat_map(|s| s.points.iter().map(|p| p.1)));
    let mut chart = ChartBuilder::on(&right)
        .caption("latency by percentile", ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..MAX_NINES, ys.log_scale())
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("percentile (1 = 90%, 2 = 99%, 3 = 99.9%, ...)")
        .y_desc("µs")
        .y_label_formatter(&|y| num(*y))
        .draw()
        .map_err(|e| err(&e))?;
    // Latency rises with the percentile: the upper left stays empty.
    lines(&mut chart, &lat, SeriesLabelPosition::UpperLeft).map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

type Chart<'a, X, Y> = ChartContext<'a, SVGBackend<'a>, Cartesian2d<X, Y>>;

fn lines<'a, X, Y>(
    chart: &mut Chart<'a, X, Y>,
    series: &[Series],
    legend_at: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>>
where
    X: plotters::coord::ranged1d::Ranged<ValueType = f64>,
    Y: plotters::coord::ranged1d::Ranged<ValueType = f64>,
{
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(s.name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    if !series.is_empty() {
        chart
            .configure_series_labels()
            .position(legend_at)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_as_nines() {
        assert_eq!(nines(0.0), 0.0);
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9) - 3.0).abs() < 1e-9);
        assert_eq!(nines(100.0), MAX_NINES);
        assert_eq!(nines(99.999_999), MAX_NINES);
    }

    #[test]
    fn ranges() {
        let r = log_range([10.0, 1000.0, 0.0, f64::NAN].into_iter());
        assert_eq!(r, 5.0..2000.0);
        assert_eq!(log_range(std::iter::empty()), 1.0..10.0);
    }
}
