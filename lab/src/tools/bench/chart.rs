//! The SVG chart of a benchmark run.

use std::path::Path;

use flash_attn::error::{Error, Result};

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
    // Ticks only at the measured lengths: the log axis's own ticks crowd between 4k and 16k.
    let mut seqlens: Vec<usize> = records.iter().map(|r| r.shape.seqlen).collect();
    seqlens.sort_unstable();
    seqlens.dedup();
    let min_n = seqlens.first().copied().unwrap_or(1);
    let max_n = seqlens.last().copied().unwrap_or(1).max(1);
    let ticks: Vec<f64> = seqlens.iter().map(|&n| n as f64).collect();
    for (area, (d, causal)) in root.split_evenly((rows, columns)).iter().zip(&panels) {
        let caption = format!("d = {d}, {}", if *causal { "causal" } else { "non-causal" });
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(50)
            .build_cartesian_2d(
                (min_n.min(max_n) as f64..max_n as f64 * 1.05)
                    .log_scale()
                    .with_key_points(ticks.clone()),
                0.0..max_tflops,
            )
            .map_err(|e| draw_error(&e))?;
        chart
            .configure_mesh()
            .x_desc("sequence length N")
            .y_desc("TFLOP/s")
            .x_label_formatter(&|n| seqlen_label(n.round() as usize))
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

/// A sequence length as the papers write it: 512, 1k, 2k, …, 16k.
fn seqlen_label(n: usize) -> String {
    if n >= 1024 && n.is_multiple_of(1024) {
        format!("{}k", n / 1024)
    } else {
        n.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::chart_svg;
    use crate::tools::bench::test_records::timed;

    /// The text of every `<text>` element of an SVG, trimmed.
    fn texts(svg: &str) -> Vec<&str> {
        svg.split("<text")
            .skip(1)
            .filter_map(|element| {
                let (_, rest) = element.split_once('>')?;
                let (text, _) = rest.split_once("</text>")?;
                Some(text.trim())
            })
            .collect()
    }

    #[test]
    fn chart_labels_the_seqlen_axis_at_the_measured_lengths_only() {
        let records: Vec<_> = [512, 1024, 4096, 16384]
            .into_iter()
            .flat_map(|n| {
                [
                    timed("fa2", 64, false, n, 100.0),
                    timed("fa2-tc", 64, true, n, 300.0),
                ]
            })
            .collect();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("bench.svg");
        chart_svg(&records, &path).expect("the chart draws");
        let svg = std::fs::read_to_string(&path).expect("the chart was written");
        let texts = texts(&svg);
        for label in ["512", "1k", "4k", "16k"] {
            // One tick label per panel (non-causal and causal).
            let count = texts.iter().filter(|t| **t == label).count();
            assert_eq!(count, 2, "{label} in {texts:?}");
        }
        for unmeasured in ["2k", "8k", "1000", "2000", "5000", "10000"] {
            assert!(!texts.contains(&unmeasured), "{unmeasured} in {texts:?}");
        }
    }
}
