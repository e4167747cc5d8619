//! The markdown tables of a benchmark run, and reading records back from JSON.

use std::collections::BTreeMap;
use std::path::Path;

use flash_attn::error::{Error, Result};

use crate::tools::bench::BenchRecord;

/// Records of PyTorch's SDPA backends are named `torch-<backend>`; every other record is ours.
const TORCH_PREFIX: &str = "torch-";
/// PyTorch's FlashAttention backend: the one our kernels implement the algorithm of.
const TORCH_FLASH: &str = "torch-flash";

fn is_torch(implementation: &str) -> bool {
    implementation.starts_with(TORCH_PREFIX)
}

/// The records of one shape, by implementation.
type Row<'a> = BTreeMap<&'a str, &'a BenchRecord>;

/// The markdown table a person reads: one row per shape, TFLOP/s per implementation, then our
/// fastest implementation of the row, its ratio to the row's fastest PyTorch backend and its
/// ratio to PyTorch's flash backend (the last two only when the records have PyTorch's).
pub fn merged_table(records: &[BenchRecord]) -> String {
    let mut implementations: Vec<&str> = Vec::new();
    let mut by_shape: BTreeMap<(usize, bool, usize), Row> = BTreeMap::new();
    for r in records {
        if !implementations.contains(&r.implementation.as_str()) {
            implementations.push(&r.implementation);
        }
        by_shape
            .entry((r.shape.head_dim, r.shape.causal, r.shape.seqlen))
            .or_default()
            .insert(&r.implementation, r);
    }
    let with_torch = implementations.iter().any(|i| is_torch(i));
    let with_flash = implementations.contains(&TORCH_FLASH);
    let mut header = vec![
        "d".to_string(),
        "causal".into(),
        "N".into(),
        "B".into(),
        "H".into(),
    ];
    header.extend(implementations.iter().map(|i| format!("{i} TFLOP/s")));
    header.push("best ours TFLOP/s".into());
    if with_torch {
        header.push("vs fastest torch".into());
    }
    if with_flash {
        header.push("vs flash".into());
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
        cells.extend(
            implementations
                .iter()
                .map(|i| tflops_cell(row.get(i).copied())),
        );
        let ours = fastest(row, |i| !is_torch(i));
        cells.push(ours.map_or_else(|| "—".into(), |(name, t)| format!("{name} {t:.1}")));
        if with_torch {
            cells.push(match (ours, fastest(row, is_torch)) {
                (Some((_, a)), Some((torch, b))) => {
                    format!("{} {}", ratio(a, b), torch.trim_start_matches(TORCH_PREFIX))
                }
                _ => "—".into(),
            });
        }
        if with_flash {
            let flash = row.get(TORCH_FLASH).and_then(|r| r.tflops);
            cells.push(match (ours, flash) {
                (Some((_, a)), Some(b)) => ratio(a, b),
                _ => "—".into(),
            });
        }
        table.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    table
}

/// TFLOP/s with one decimal; `OOM` for a record that ran out of memory, `—` for none or another
/// failure.
fn tflops_cell(record: Option<&BenchRecord>) -> String {
    match record {
        Some(BenchRecord {
            tflops: Some(t), ..
        }) => format!("{t:.1}"),
        Some(BenchRecord { error: Some(e), .. }) if e.contains("out of") => "OOM".into(),
        _ => "—".into(),
    }
}

/// The implementation with the most TFLOP/s among those `include` picks, with its TFLOP/s; `None`
/// when none of them has a positive time.
fn fastest<'a>(row: &Row<'a>, include: impl Fn(&str) -> bool) -> Option<(&'a str, f64)> {
    row.iter()
        .filter(|(name, _)| include(name))
        .filter_map(|(&name, r)| r.tflops.filter(|t| *t > 0.0).map(|t| (name, t)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

/// `a / b` as a speed ratio, e.g. `0.63×`.
fn ratio(a: f64, b: f64) -> String {
    format!("{:.2}×", a / b)
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

/// Reads records written by `lab/scripts/torch_sdpa_bench.py` (or by a previous `bench --json`).
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

#[cfg(test)]
mod tests {
    use super::merged_table;
    use crate::tools::bench::test_records::{failed, timed};

    #[test]
    fn merged_table_names_our_fastest_and_its_ratios_to_the_fastest_torch_and_to_flash() {
        let oom = "CUDA out of memory. Tried to allocate 8.00 GiB";
        let records = [
            // d = 64, N = 1024: cuDNN is PyTorch's fastest, FA2-TC ours.
            timed("fa2", 64, false, 1024, 100.0),
            timed("fa2-tc", 64, false, 1024, 300.0),
            timed("torch-flash", 64, false, 1024, 400.0),
            timed("torch-cudnn", 64, false, 1024, 500.0),
            // d = 64, N = 16384: flash out of memory, cuDNN missing; efficient is the fastest.
            timed("fa2", 64, false, 16384, 50.0),
            timed("fa2-tc", 64, false, 16384, 350.0),
            failed("torch-flash", 64, false, 16384, oom),
            timed("torch-efficient", 64, false, 16384, 200.0),
            // d = 128, causal, N = 2048: FA2-TC failed, so FA2 is ours; no PyTorch timed.
            timed("fa2", 128, true, 2048, 80.0),
            failed("fa2-tc", 128, true, 2048, "unsupported tiling"),
            failed("torch-flash", 128, true, 2048, oom),
        ];
        assert_eq!(
            merged_table(&records),
            "\
| d | causal | N | B | H | fa2 TFLOP/s | fa2-tc TFLOP/s | torch-flash TFLOP/s | torch-cudnn TFLOP/s | torch-efficient TFLOP/s | best ours TFLOP/s | vs fastest torch | vs flash |
|---|---|---|---|---|---|---|---|---|---|---|---|---|
| 64 | no | 1024 | 16 | 32 | 100.0 | 300.0 | 400.0 | 500.0 | — | fa2-tc 300.0 | 0.60× cudnn | 0.75× |
| 64 | no | 16384 | 1 | 32 | 50.0 | 350.0 | OOM | — | 200.0 | fa2-tc 350.0 | 1.75× efficient | — |
| 128 | yes | 2048 | 8 | 16 | 80.0 | — | OOM | — | — | fa2 80.0 | — | — |
"
        );
    }

    #[test]
    fn merged_table_without_torch_records_has_no_ratio_columns() {
        let records = [
            timed("fa1", 64, false, 512, 20.0),
            timed("fa2", 64, false, 512, 90.0),
        ];
        assert_eq!(
            merged_table(&records),
            "\
| d | causal | N | B | H | fa1 TFLOP/s | fa2 TFLOP/s | best ours TFLOP/s |
|---|---|---|---|---|---|---|---|
| 64 | no | 512 | 32 | 32 | 20.0 | 90.0 | fa2 90.0 |
"
        );
    }
}
