//! The benchmark runner: speed, memory and the longest sequence that fits, for every algorithm,
//! over the FlashAttention papers' sweep (batch·N = 16384 tokens, heads·d = 2048).
//!
//! Records share one JSON schema with `scripts/torch_sdpa_bench.py`, which times PyTorch's SDPA
//! backends on the same shapes, so [`merged_table`] can put ours and theirs side by side as
//! ratios measured in the same run.

use std::collections::BTreeMap;
use std::path::Path;

use half::{bf16, f16};
use rand::Rng;

use crate::attention::{
    Algorithm, AttentionOptions, Problem, Workspace, attention_with_workspace, new_output,
};
use crate::check::random_tensor;
use crate::device::Gpu;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::tensor::{DeviceTensor, Layout};

/// What to sweep.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct SweepConfig {
    pub seqlens: Vec<usize>,
    pub head_dims: Vec<usize>,
    pub causal: Vec<bool>,
    pub dtype: DType,
    pub algorithms: Vec<Algorithm>,
    /// batch · seqlen (the papers: 16384).
    pub tokens: usize,
    /// heads · head_dim (the papers: 2048).
    pub hidden: usize,
    /// Timed launches per case at least, and at most.
    pub min_repeats: usize,
    pub max_repeats: usize,
    /// Stop repeating once this much GPU time has been measured.
    pub target_ms: f64,
    /// FA2-TC's tiling (as `attention::parse_fa2_tc_tiling` reads it, e.g. `4x2s1c64`); `None`:
    /// the library's default. Records of an override are named `fa2-tc-<tiling>`, so runs with
    /// different values merge into one table.
    #[serde(default)]
    pub fa2_tc_tiling: Option<String>,
}

impl SweepConfig {
    /// The papers' sweep: N from 512 to 16k, d 64 and 128, causal off and on.
    pub fn full(dtype: DType) -> Self {
        Self {
            seqlens: vec![512, 1024, 2048, 4096, 8192, 16384],
            head_dims: vec![64, 128],
            causal: vec![false, true],
            dtype,
            algorithms: Algorithm::ALL.to_vec(),
            tokens: 16384,
            hidden: 2048,
            min_repeats: 5,
            max_repeats: 50,
            target_ms: 300.0,
            fa2_tc_tiling: None,
        }
    }

    /// A subset that runs in well under a minute.
    pub fn quick(dtype: DType) -> Self {
        Self {
            seqlens: vec![1024, 4096],
            min_repeats: 3,
            max_repeats: 10,
            target_ms: 50.0,
            ..Self::full(dtype)
        }
    }

    /// Every case of the sweep, in order.
    pub fn shapes(&self) -> Vec<BenchShape> {
        let mut shapes = Vec::new();
        for &head_dim in &self.head_dims {
            for &causal in &self.causal {
                for &seqlen in &self.seqlens {
                    let batch = (self.tokens / seqlen).max(1);
                    let heads = (self.hidden / head_dim).max(1);
                    shapes.push(BenchShape {
                        batch,
                        heads,
                        seqlen,
                        head_dim,
                        causal,
                    });
                }
            }
        }
        shapes
    }
}

/// One benchmark shape (self-attention: seqlen_q = seqlen_k).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BenchShape {
    pub batch: usize,
    pub heads: usize,
    pub seqlen: usize,
    pub head_dim: usize,
    pub causal: bool,
}

impl BenchShape {
    /// 4·B·H·N²·d, halved for causal (the FlashAttention papers' count).
    pub fn flops(&self) -> f64 {
        let full = 4.0
            * (self.batch * self.heads) as f64
            * (self.seqlen as f64).powi(2)
            * self.head_dim as f64;
        if self.causal { full / 2.0 } else { full }
    }

    /// The fewest bytes any algorithm must move: Q, K, V read once, O written once.
    pub fn minimum_bytes(&self, dtype: DType) -> f64 {
        4.0 * (self.batch * self.heads * self.seqlen * self.head_dim * dtype.size_bytes()) as f64
    }

    fn dims(&self) -> [usize; 4] {
        [self.batch, self.heads, self.seqlen, self.head_dim]
    }
}

/// One measurement: ours or a PyTorch backend's (same schema in both JSON files).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct BenchRecord {
    /// `standard`, `fa1`, `fa2`, or `torch-flash`, `torch-cudnn`, `torch-efficient`, `torch-math`.
    pub implementation: String,
    pub dtype: DType,
    pub shape: BenchShape,
    pub median_ms: Option<f64>,
    pub tflops: Option<f64>,
    /// Minimum bytes (Q, K, V in, O out) over the median time, GB/s.
    pub bandwidth_gbs: Option<f64>,
    /// Device memory the call held at its peak, inputs and outputs included, bytes.
    pub peak_memory_bytes: Option<u64>,
    /// Why there is no time (out of memory, unsupported, …).
    pub error: Option<String>,
}

/// The longest sequence an algorithm's buffers fit at batch 1.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct MaxSeqlen {
    pub implementation: String,
    pub head_dim: usize,
    pub heads: usize,
    /// Largest N (a multiple of 1024) whose inputs, outputs and workspace were all allocated.
    pub seqlen: usize,
    /// The out-of-memory error at the next size tried.
    pub limit: String,
}

/// Everything one `bench` run produces.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct BenchReport {
    pub device: String,
    pub config: SweepConfig,
    pub records: Vec<BenchRecord>,
    pub max_seqlen: Vec<MaxSeqlen>,
}

impl BenchRecord {
    fn failed(implementation: &str, dtype: DType, shape: BenchShape, error: &Error) -> Self {
        Self {
            implementation: implementation.to_string(),
            dtype,
            shape,
            median_ms: None,
            tflops: None,
            bandwidth_gbs: None,
            peak_memory_bytes: None,
            error: Some(error.to_string()),
        }
    }
}

/// Times `algorithm` on `shape`; an error (out of memory, say) becomes a record with no time.
pub fn run_case(
    gpu: &Gpu,
    algorithm: Algorithm,
    shape: BenchShape,
    config: &SweepConfig,
    rng: &mut impl Rng,
) -> BenchRecord {
    let result = match config.dtype {
        DType::F32 => time_case::<f32>(gpu, algorithm, shape, config, rng),
        DType::F16 => time_case::<f16>(gpu, algorithm, shape, config, rng),
        DType::Bf16 => time_case::<bf16>(gpu, algorithm, shape, config, rng),
    };
    result.unwrap_or_else(|e| {
        BenchRecord::failed(
            &implementation_name(algorithm, config),
            config.dtype,
            shape,
            &e,
        )
    })
}

/// The record name: the algorithm's, with FA2-TC's tiling override appended.
fn implementation_name(algorithm: Algorithm, config: &SweepConfig) -> String {
    match (algorithm, &config.fa2_tc_tiling) {
        (Algorithm::Fa2Tc, Some(tiling)) => format!("{algorithm}-{tiling}"),
        _ => algorithm.name().to_string(),
    }
}

/// Q, K and V on the device, fresh N(0, 1) values.
struct Inputs<T> {
    q: DeviceTensor<T>,
    k: DeviceTensor<T>,
    v: DeviceTensor<T>,
}

fn time_case<T: Element>(
    gpu: &Gpu,
    algorithm: Algorithm,
    shape: BenchShape,
    config: &SweepConfig,
    rng: &mut impl Rng,
) -> Result<BenchRecord> {
    let options = AttentionOptions {
        causal: shape.causal,
        fa2_tc_tiling: crate::attention::parse_optional_fa2_tc_tiling(
            config.fa2_tc_tiling.as_deref(),
        )?,
        ..Default::default()
    };
    let dims = shape.dims();
    let problem = Problem::new(dims, dims, dims, &options)?;

    // Fresh N(0, 1) inputs, drawn once per case; every set of device buffers holds them.
    let host = [(); 3].map(|_| random_tensor::<T>(dims, rng));
    let upload_set = || -> Result<Inputs<T>> {
        let upload = |a: &ndarray::Array4<T>| {
            DeviceTensor::from_array(gpu, a.view(), Layout::BatchHeadSeqDim)
        };
        Ok(Inputs {
            q: upload(&host[0])?,
            k: upload(&host[1])?,
            v: upload(&host[2])?,
        })
    };

    // Peak memory of one call, from an empty pool: its inputs, output and workspace.
    gpu.synchronize()?;
    gpu.reset_peak_memory()?;
    let mut inputs = vec![upload_set()?];
    let mut output = new_output(
        gpu,
        algorithm,
        &inputs[0].q,
        &inputs[0].k,
        &inputs[0].v,
        &options,
    )?;
    let workspace = Workspace::<T>::new(gpu, algorithm, &problem)?;
    let first = &inputs[0];
    attention_with_workspace(
        gpu,
        algorithm,
        &first.q,
        &first.k,
        &first.v,
        &mut output,
        &workspace,
        &options,
    )?;
    gpu.synchronize()?;
    let peak_memory_bytes = gpu.peak_memory()?;

    // Rotate through enough sets of buffers (same values, different addresses) that they cannot
    // all sit in L2.
    let set_bytes = 3 * dims.iter().product::<usize>() * T::DTYPE.size_bytes();
    let sets = (4 * gpu.info().l2_cache_bytes)
        .div_ceil(set_bytes.max(1))
        .clamp(2, 16);
    for _ in 1..sets {
        inputs.push(upload_set()?);
    }
    let mut launch = |i: usize| {
        let set = &inputs[i % inputs.len()];
        attention_with_workspace(
            gpu,
            algorithm,
            &set.q,
            &set.k,
            &set.v,
            &mut output,
            &workspace,
            &options,
        )
    };
    // Warm-up: one launch per input set, then an estimate of how many repeats fit the target.
    let warm = gpu.time_each_ms(sets, &mut launch)?;
    let estimate = warm.iter().copied().fold(f32::INFINITY, f32::min).max(1e-3) as f64;
    let repeats =
        ((config.target_ms / estimate) as usize).clamp(config.min_repeats, config.max_repeats);
    let mut times = gpu.time_each_ms(repeats, &mut launch)?;
    times.sort_by(f32::total_cmp);
    let median_ms = times[times.len() / 2] as f64;
    Ok(BenchRecord {
        implementation: implementation_name(algorithm, config),
        dtype: T::DTYPE,
        shape,
        median_ms: Some(median_ms),
        tflops: Some(shape.flops() / (median_ms * 1e-3) / 1e12),
        bandwidth_gbs: Some(shape.minimum_bytes(T::DTYPE) / (median_ms * 1e-3) / 1e9),
        peak_memory_bytes: Some(peak_memory_bytes),
        error: None,
    })
}

/// The longest N (multiple of 1024) at batch 1 whose buffers `algorithm` can allocate, found by
/// doubling and then bisecting; out-of-memory errors are expected and handled.
pub fn max_seqlen(
    gpu: &Gpu,
    algorithm: Algorithm,
    dtype: DType,
    head_dim: usize,
    hidden: usize,
) -> Result<MaxSeqlen> {
    let heads = (hidden / head_dim).max(1);
    let fits = |seqlen: usize| -> Result<std::result::Result<(), String>> {
        let outcome = match dtype {
            DType::F32 => allocate_call::<f32>(gpu, algorithm, [1, heads, seqlen, head_dim]),
            DType::F16 => allocate_call::<f16>(gpu, algorithm, [1, heads, seqlen, head_dim]),
            DType::Bf16 => allocate_call::<bf16>(gpu, algorithm, [1, heads, seqlen, head_dim]),
        };
        gpu.synchronize()?;
        match outcome {
            Ok(()) => Ok(Ok(())),
            Err(e @ (Error::OutOfMemory { .. } | Error::InvalidArgument { .. })) => {
                Ok(Err(e.to_string()))
            }
            Err(e) => Err(e),
        }
    };
    const STEP: usize = 1024;
    // Double until a size fails, then bisect between the last fit and that failure.
    let (mut good, mut bad) = (0usize, STEP);
    let mut limit = loop {
        match fits(bad)? {
            Ok(()) => (good, bad) = (bad, bad * 2),
            Err(e) => break e,
        }
    };
    while bad - good > STEP {
        let mid = (good + bad) / 2 / STEP * STEP;
        match fits(mid)? {
            Ok(()) => good = mid,
            Err(e) => (bad, limit) = (mid, e),
        }
    }
    Ok(MaxSeqlen {
        implementation: algorithm.name().to_string(),
        head_dim,
        heads,
        seqlen: good,
        limit,
    })
}

/// Allocates everything one call needs (zero-filled inputs: nothing is computed or timed on them).
fn allocate_call<T: Element>(gpu: &Gpu, algorithm: Algorithm, dims: [usize; 4]) -> Result<()> {
    let problem = Problem::new(dims, dims, dims, &AttentionOptions::default())?;
    // Zero-filled on the device (a memset): nothing is computed on them.
    let q = DeviceTensor::<T>::filled(gpu, dims, Layout::BatchHeadSeqDim, T::default())?;
    let k = DeviceTensor::<T>::filled(gpu, dims, Layout::BatchHeadSeqDim, T::default())?;
    let v = DeviceTensor::<T>::filled(gpu, dims, Layout::BatchHeadSeqDim, T::default())?;
    let _output = new_output(gpu, algorithm, &q, &k, &v, &AttentionOptions::default())?;
    let _workspace = Workspace::<T>::new(gpu, algorithm, &problem)?;
    Ok(())
}

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
