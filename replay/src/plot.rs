//! PNG plots of a replay: WAF over time and the victim-utilisation histogram.
//! Text is drawn with DejaVu Sans (Debian package fonts-dejavu-core), loaded at run time.

use crate::sim::SimReport;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::path::Path;

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

fn load_font() -> Result<(), String> {
    let bytes = std::fs::read(FONT)
        .map_err(|e| format!("cannot read {FONT} ({e}); install fonts-dejavu-core"))?;
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| format!("{FONT} is not a usable font"))
}

/// Writes a 1200x450 PNG with both panels; `title` heads the WAF panel.
pub fn plot(report: &SimReport, title: &str, path: &Path) -> Result<(), String> {
    load_font()?;
    let root = BitMapBackend::new(path, (1200, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (left, right) = root.split_horizontally(700);
    let max_x = report.waf_series.last().map_or(1, |p| p.0).max(1);
    let max_y = report.waf_series.iter().map(|p| p.1).fold(1.0f64, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&left)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0u64..max_x, 0f64..max_y)
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("user blocks written")
        .y_desc("cumulative WAF")
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(report.waf_series.iter().copied(), &BLUE))
        .map_err(|e| e.to_string())?;
    let h = &report.victim_utilization_histogram;
    let max_h = h.iter().copied().max().unwrap_or(1).max(1);
    let mut hist = ChartBuilder::on(&right)
        .caption("victim utilisation at cleaning", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((0u32..9u32).into_segmented(), 0u64..max_h + max_h / 10 + 1)
        .map_err(|e| e.to_string())?;
    hist.configure_mesh()
        .x_desc("utilisation (tens of %)")
        .y_desc("victims")
        .draw()
        .map_err(|e| e.to_string())?;
    hist.draw_series(
        Histogram::vertical(&hist)
            .style(RED.filled())
            .data(h.iter().enumerate().map(|(i, &n)| (i as u32, n))),
    )
    .map_err(|e| e.to_string())?;
    root.present()
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// One point of a benchmark's course over time (see [`plot_timeline`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct TimePoint {
    /// Seconds since the run started.
    pub t: f64,
    /// Operations completed per second over the interval ending at `t`.
    pub iops: f64,
    /// 99th percentile and maximum latency of those operations, in milliseconds.
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// A labelled run for [`plot_timeline`].
#[derive(Debug, Clone)]
pub struct Timeline {
    pub label: String,
    pub points: Vec<TimePoint>,
}

/// Writes a 1200x800 PNG: IOPS over time (top) and p99 and max latency on a log scale
/// (bottom, max in the lighter shade), one colour per run.
pub fn plot_timeline(title: &str, runs: &[Timeline], path: &Path) -> Result<(), String> {
    load_font()?;
    let root = BitMapBackend::new(path, (1200, 800)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (top, bottom) = root.split_vertically(400);
    let points = || runs.iter().flat_map(|r| r.points.iter());
    let max_t = points().map(|p| p.t).fold(1.0f64, f64::max);
    // The first interval of a run (writes into free space) can be ten times the rest:
    // scale to the 98th percentile so the steady state stays readable.
    let mut all: Vec<f64> = points().map(|p| p.iops).collect();
    all.sort_by(f64::total_cmp);
    let max_iops = all
        .get(all.len().saturating_sub(1) * 98 / 100)
        .copied()
        .unwrap_or(1.0)
        .max(1.0)
        * 1.3;
    let max_ms = points().map(|p| p.max_ms).fold(1.0f64, f64::max) * 1.5;
    let min_ms = points()
        .map(|p| p.p99_ms)
        .filter(|&v| v > 0.0)
        .fold(max_ms, f64::min)
        .max(1e-3)
        / 1.5;
    let colour = |i: usize| Palette99::pick(i).to_rgba();
    let mut iops = ChartBuilder::on(&top)
        .caption(title, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..max_t, 0f64..max_iops)
        .map_err(|e| e.to_string())?;
    iops.configure_mesh()
        .x_desc("seconds")
        .y_desc("IOPS")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, r) in runs.iter().enumerate() {
        let c = colour(i);
        iops.draw_series(LineSeries::new(
            r.points.iter().map(|p| (p.t, p.iops.min(max_iops))),
            c,
        ))
        .map_err(|e| e.to_string())?
        .label(r.label.as_str())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
    }
    iops.configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    let mut lat = ChartBuilder::on(&bottom)
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..max_t, (min_ms..max_ms).log_scale())
        .map_err(|e| e.to_string())?;
    lat.configure_mesh()
        .x_desc("seconds")
        .y_desc("latency, ms (p99; max lighter)")
        .draw()
        .map_err(|e| e.to_string())?;
    for (i, r) in runs.iter().enumerate() {
        let c = colour(i);
        lat.draw_series(LineSeries::new(
            r.points.iter().map(|p| (p.t, p.p99_ms.max(min_ms))),
            c,
        ))
        .map_err(|e| e.to_string())?;
        lat.draw_series(LineSeries::new(
            r.points.iter().map(|p| (p.t, p.max_ms.max(min_ms))),
            c.mix(0.35),
        ))
        .map_err(|e| e.to_string())?;
    }
    root.present()
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
