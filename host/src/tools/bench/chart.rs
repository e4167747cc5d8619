//! The SVG chart of a benchmark run.

use std::path::Path;

use crate::error::{Error, Result};
use crate::tools::bench::BenchRecord;

/// An SVG chart of TFLOP/s against N per implementation, one panel per (head dim, causal).
pub fn chart_svg(records: &[BenchRecord], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let draw_error =
        |e: &dyn std::fmt::Display| Error::File(format!("cannot draw {}: {e}", path.display()));
    let mut panels: Vec<(usize, bool)> = records
        .iter()
        .map(|r| (r.shape.head_dim, r.shape.causal))
        .collect();
    panels.sort();
    panels.dedup();
    let mut implementations: Vec<&str> =
        records.iter().map(|r| r.implementation.as_str()).collect();
    implementations.sort();
    implementations.dedup();
    let columns = 2.min(panels.len()).max(1);
    let rows = panels.len().div_ceil(columns).max(1);
    let root = SVGBackend::new(path, (640 * columns as u32, 420 * rows as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_error(&e))?;
    let max_tflops = records
        .iter()
        .filter_map(|r| r.tflops)
        .fold(1.0f64, f64::max)
        * 1.1;
    let (min_n, max_n) = records.iter().fold((usize::MAX, 1usize), |(lo, hi), r| {
        (lo.min(r.shape.seqlen), hi.max(r.shape.seqlen))
    });
    for (area, (d, causal)) in root.split_evenly((rows, columns)).iter().zip(&panels) {
        let caption = format!("d = {d}, {}", if *causal { "causal" } else { "non-causal" });
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(50)
            .build_cartesian_2d(
                (min_n.min(max_n) as f64..max_n as f64 * 1.05).log_scale(),
                0.0..max_tflops,
            )
            .map_err(|e| draw_error(&e))?;
        chart
            .configure_mesh()
            .x_desc("sequence length N")
            .y_desc("TFLOP/s")
            .x_label_formatter(&|n| format!("{}", *n as usize))
            .draw()
            .map_err(|e| draw_error(&e))?;
        for (i, implementation) in implementations.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let mut points: Vec<(f64, f64)> = records
                .iter()
                .filter(|r| {
                    r.implementation == *implementation
                        && r.shape.head_dim == *d
                        && r.shape.causal == *causal
                })
                .filter_map(|r| r.tflops.map(|t| (r.shape.seqlen as f64, t)))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|e| draw_error(&e))?
                .label(*implementation)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                .map_err(|e| draw_error(&e))?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|e| draw_error(&e))?;
    }
    root.present().map_err(|e| draw_error(&e))
}
