//! The markdown tables of a benchmark run, and reading records back from JSON.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Error, Result};
use crate::tools::bench::BenchRecord;

/// The markdown table of every record, one row per shape, TFLOP/s per implementation, then the
/// ratio of each of ours to each PyTorch backend present.
pub fn merged_table(records: &[BenchRecord]) -> String {
    let mut implementations: Vec<&str> = Vec::new();
    let mut by_shape: BTreeMap<(usize, bool, usize), BTreeMap<&str, &BenchRecord>> =
        BTreeMap::new();
    for r in records {
        if !implementations.contains(&r.implementation.as_str()) {
            implementations.push(&r.implementation);
        }
        by_shape
            .entry((r.shape.head_dim, r.shape.causal, r.shape.seqlen))
            .or_default()
            .insert(&r.implementation, r);
    }
    let ours: Vec<&str> = implementations
        .iter()
        .copied()
        .filter(|i| !i.starts_with("torch-"))
        .collect();
    let torch: Vec<&str> = implementations
        .iter()
        .copied()
        .filter(|i| i.starts_with("torch-"))
        .collect();
    let mut header = vec![
        "d".to_string(),
        "causal".into(),
        "N".into(),
        "B".into(),
        "H".into(),
    ];
    header.extend(implementations.iter().map(|i| format!("{i} TFLOP/s")));
    for o in &ours {
        for t in &torch {
            header.push(format!("{o}/{}", t.trim_start_matches("torch-")));
        }
    }
    let mut table = format!(
        "| {} |\n|{}\n",
        header.join(" | "),
        "---|".repeat(header.len())
    );
    for ((d, causal, n), row) in &by_shape {
        let any = row.values().next().map(|r| r.shape);
        let (b, h) = any.map(|s| (s.batch, s.heads)).unwrap_or_default();
        let mut cells = vec![
            d.to_string(),
            if *causal { "yes" } else { "no" }.into(),
            n.to_string(),
            b.to_string(),
            h.to_string(),
        ];
        let tflops = |i: &str| row.get(i).and_then(|r| r.tflops);
        cells.extend(implementations.iter().map(|i| match row.get(i) {
            Some(r) if r.tflops.is_some() => format!("{:.1}", r.tflops.unwrap_or_default()),
            Some(r) if r.error.as_deref().is_some_and(|e| e.contains("out of")) => "OOM".into(),
            _ => "—".into(),
        }));
        for o in &ours {
            for t in &torch {
                cells.push(match (tflops(o), tflops(t)) {
                    (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
                    _ => "—".into(),
                });
            }
        }
        table.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    table
}

/// Peak memory per implementation and shape, as a markdown table (GiB).
pub fn memory_table(records: &[BenchRecord]) -> String {
    let mut table = String::from(
        "| implementation | d | causal | N | B | H | peak memory (GiB) |\n|---|---|---|---|---|---|---|\n",
    );
    for r in records.iter().filter(|r| r.peak_memory_bytes.is_some()) {
        let s = r.shape;
        table.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {:.3} |\n",
            r.implementation,
            s.head_dim,
            if s.causal { "yes" } else { "no" },
            s.seqlen,
            s.batch,
            s.heads,
            r.peak_memory_bytes.unwrap_or_default() as f64 / 1073741824.0
        ));
    }
    table
}

/// Reads records written by `scripts/torch_sdpa_bench.py` (or by a previous `bench --json`).
pub fn read_records(path: &Path) -> Result<Vec<BenchRecord>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::File(format!("cannot read {}: {e}", path.display())))?;
    #[derive(serde::Deserialize)]
    struct RecordsFile {
        records: Vec<BenchRecord>,
    }
    serde_json::from_str::<RecordsFile>(&text)
        .map(|f| f.records)
        .map_err(|e| {
            Error::File(format!(
                "{} is not a benchmark JSON file ({{\"records\": [...]}}): {e}",
                path.display()
            ))
        })
}
