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
