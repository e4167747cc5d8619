//! `flash-attn io`: HBM traffic of each algorithm, predicted by the articles' formulas (and the CPU
//! emulators, which count the same) beside what `ncu` measured on the GPU.
//!
//! On the GPU machine (bundle/run-bench.sh does this):
//!
//! ```sh
//! ncu --csv --print-units base --clock-control none \
//!     --metrics dram__bytes_read.sum,dram__bytes_write.sum flash-attn io > ncu.csv
//! flash-attn io --ncu ncu.csv
//! ```

use flash_kernels::registry::Family;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use flash_attn::{Algorithm, DType, DeviceTensor, Error, Gpu, Layout, with_element};
use flash_attn_lab::model::io_table::{H200_SHARED_MEMORY_PER_BLOCK, io_table, io_table_markdown};
use flash_attn_lab::model::prediction::IoShape;
use flash_attn_lab::tools::bench::SweepConfig;

#[derive(clap::Args)]
pub struct IoArgs {
    /// ncu's CSV output for a previous `flash-attn io` run: print predicted beside measured.
    #[arg(long)]
    ncu: Option<PathBuf>,
    /// The shape, large against the 50 MB L2 so that writes reach HBM before the kernel ends.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    #[arg(long, default_value_t = 16)]
    heads: usize,
    #[arg(long, default_value_t = 8192)]
    seqlen: usize,
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
    #[arg(long, default_value = "bf16")]
    dtype: String,
}

/// The predicted traffic for every shape of a benchmark sweep (non-causal), as markdown.
pub fn predicted_table_markdown(config: &SweepConfig) -> String {
    let mut rows = Vec::new();
    for shape in config.shapes().iter().filter(|s| !s.causal) {
        let io_shape = IoShape::square(shape.batch, shape.heads, shape.seqlen, shape.head_dim);
        match io_table(io_shape, config.dtype, H200_SHARED_MEMORY_PER_BLOCK) {
            Ok(r) => rows.extend(r),
            Err(e) => return format!("cannot predict {io_shape:?}: {e}"),
        }
    }
    io_table_markdown(&rows)
}

pub fn main(device: usize, args: &IoArgs) -> flash_attn::Result<ExitCode> {
    let dtype: DType = args.dtype.parse()?;
    let shape = IoShape::square(args.batch, args.heads, args.seqlen, args.head_dim);
    let shared = match Gpu::open(device) {
        Ok(gpu) => gpu.info().shared_memory_per_block,
        Err(_) => H200_SHARED_MEMORY_PER_BLOCK,
    };
    let predicted = io_table(shape, dtype, shared)?;
    let Some(path) = &args.ncu else {
        // Run each algorithm once for ncu to measure, then show what the formulas predict.
        let gpu = Gpu::open(device)?;
        run_each_once(
            &gpu,
            dtype,
            [args.batch, args.heads, args.seqlen, args.head_dim],
        )?;
        println!("{}", io_table_markdown(&predicted));
        return Ok(ExitCode::SUCCESS);
    };
    let measured = read_ncu_csv(path)?;
    println!(
        "HBM traffic, {:?}, {dtype}, non-causal: predicted (formulas = emulators) vs measured (ncu)\n",
        shape
    );
    println!(
        "| algorithm | predicted read | measured read | predicted written | measured written | measured/predicted (total) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for row in &predicted {
        let (read, written) = measured
            .get(row.algorithm.name())
            .copied()
            .unwrap_or((0.0, 0.0));
        let (p_read, p_written) = (row.io.bytes_read() as f64, row.io.bytes_written() as f64);
        println!(
            "| {} | {:.3} GB | {:.3} GB | {:.3} GB | {:.3} GB | {:.3} |",
            row.algorithm,
            p_read / 1e9,
            read / 1e9,
            p_written / 1e9,
            written / 1e9,
            (read + written) / (p_read + p_written)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// One launch of every algorithm (FA2 on tensor cores too), on random-free but non-zero inputs.
fn run_each_once(gpu: &Gpu, dtype: DType, dims: [usize; 4]) -> flash_attn::Result<()> {
    with_element!(dtype, T => run_each_once_typed::<T>(gpu, dims))
}

fn run_each_once_typed<T: flash_attn::Element>(
    gpu: &Gpu,
    dims: [usize; 4],
) -> flash_attn::Result<()> {
    let mut rng = rand::rng();
    let mut upload = || {
        DeviceTensor::from_array(
            gpu,
            flash_attn_lab::tools::check::random_tensor::<T>(dims, &mut rng).view(),
            Layout::BatchHeadSeqDim,
        )
    };
    let (q, k, v) = (upload()?, upload()?, upload()?);
    for algorithm in Algorithm::FAMILIES {
        flash_attn::Attention::new(&q, &k, &v)
            .algorithm(algorithm)
            .forward(gpu)?;
        gpu.synchronize()?;
    }
    Ok(())
}

/// Sums ncu's `dram__bytes_read.sum` and `dram__bytes_write.sum` over each algorithm's kernels
/// (by the family of the kernel the name reads back as), in bytes (`--print-units base`).
fn read_ncu_csv(path: &PathBuf) -> flash_attn::Result<BTreeMap<&'static str, (f64, f64)>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::File(format!("cannot read {}: {e}", path.display())))?;
    let rows: Vec<Vec<String>> = text
        .lines()
        .filter(|l| l.starts_with('"'))
        .map(split_csv)
        .collect();
    let header = rows
        .iter()
        .find(|r| r.iter().any(|c| c == "Kernel Name"))
        .ok_or_else(|| {
            Error::File(format!(
                "{}: no ncu CSV header (run ncu with --csv)",
                path.display()
            ))
        })?;
    let column = |name: &str| header.iter().position(|c| c == name);
    let (Some(kernel), Some(metric), Some(value)) = (
        column("Kernel Name"),
        column("Metric Name"),
        column("Metric Value"),
    ) else {
        return Err(Error::File(format!(
            "{}: missing Kernel Name / Metric Name / Metric Value columns",
            path.display()
        )));
    };
    let mut totals: BTreeMap<&'static str, (f64, f64)> = BTreeMap::new();
    for row in &rows {
        let (Some(name), Some(metric), Some(value)) =
            (row.get(kernel), row.get(metric), row.get(value))
        else {
            continue;
        };
        // ncu may print a kernel's name with its parameter list: the entry name is before it.
        let entry = name.split('(').next().unwrap_or(name);
        let Ok(id) = entry.parse::<flash_kernels::registry::KernelId>() else {
            continue;
        };
        let algorithm = match id.family {
            Family::Standard(_) => "standard",
            Family::Fa1 => "fa1",
            Family::Fa2 { .. } => "fa2",
            Family::Fa2Tc { .. } => "fa2-tc",
            Family::Fa3 { .. } => "fa3",
            Family::Fa2Backward(_) => "fa2-backward",
            Family::Fa2TcBackward { .. } => "fa2-tc-backward",
            Family::Fa3Backward { .. } => "fa3-backward",
            Family::StandardBackward(_) => "standard-backward",
            Family::GroupSum => "backward-group-sum",
            Family::Decode { .. } | Family::DecodeCombine { .. } | Family::KvAppend { .. } => {
                "decode"
            }
        };
        let Ok(bytes) = value.replace(',', "").parse::<f64>() else {
            continue;
        };
        let entry = totals.entry(algorithm).or_default();
        match metric.as_str() {
            "dram__bytes_read.sum" => entry.0 += bytes,
            "dram__bytes_write.sum" => entry.1 += bytes,
            _ => {}
        }
    }
    Ok(totals)
}

/// Splits one line of ncu's CSV (every field quoted; values may contain commas).
fn split_csv(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    for c in line.chars() {
        match (c, quoted) {
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    fields.push(field);
    fields
}
