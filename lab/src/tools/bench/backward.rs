//! The backward benchmark (`flash-attn bench --backward`): for each of our backward variants
//! ([`BackwardVariant`]) at the sweep's shapes, the backward alone and forward + backward, timed
//! on the GPU (median), TFLOP/s = 2.5 × the forward's FLOPs / backward time and 3.5 × / forward +
//! backward time; records in one JSON schema with `lab/scripts/torch_backward_bench.py` (PyTorch's
//! flash and cuDNN backward), merged into two markdown tables by [`backward_tables`] (the
//! forward's [`merged_table`] on each number).
//!
//! The memory mode ([`memory_rows`], `--memory`): at batch 1, one head dim, N from 1k up, the
//! peak device memory of each variant's backward (Q, K, V, O, L, dO, the gradients and its
//! workspace: O(N²) for the standard backward, O(N) for FlashAttention's), and where each runs
//! out of memory (the error is caught and reported).

use std::path::Path;

use rand::Rng;

use flash_attn::attention::{
    Algorithm, Attention, AttentionOptions, AttentionOutput, BackwardTensors, Gradients, Plan,
    RowStatistics,
};
use flash_attn::device::Gpu;
use flash_attn::dtype::{DType, Element};
use flash_attn::error::{Error, Result};
use flash_attn::tensor::{DeviceTensor, Layout};
use flash_attn::with_element;

use crate::tools::bench::report::merged_table;
use crate::tools::bench::{BenchRecord, BenchShape};
use crate::tools::check::random_tensor;

/// One of our backward configurations the benchmark times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardVariant {
    /// The backward's algorithm (`AttentionOptions::backward_algorithm`).
    pub algorithm: Algorithm,
    pub deterministic: bool,
}

impl BackwardVariant {
    /// fa2-tc, fa2 (scalar), fa2-tc deterministic, standard (S, P, dP, dS in HBM), fa3 (the
    /// default: FlashAttention-3's backward on compute capability 9.0, elsewhere what it falls
    /// back to, fa2-tc) and fa3 deterministic.
    pub const ALL: [BackwardVariant; 6] = [
        BackwardVariant::new(Algorithm::Fa2Tc, false),
        BackwardVariant::new(Algorithm::Fa2, false),
        BackwardVariant::new(Algorithm::Fa2Tc, true),
        BackwardVariant::new(Algorithm::Standard, false),
        BackwardVariant::new(Algorithm::Fa3, false),
        BackwardVariant::new(Algorithm::Fa3, true),
    ];
    /// What `bench --backward` times by default: the FlashAttention backward's variants (the
    /// standard one takes seconds per call at the sweep's longer N; ask for it by name).
    pub const TIMED: [BackwardVariant; 4] =
        [Self::ALL[4], Self::ALL[0], Self::ALL[1], Self::ALL[2]];
    /// What the memory table compares by default: the standard backward and fa2-tc.
    pub const MEMORY: [BackwardVariant; 2] = [Self::ALL[3], Self::ALL[0]];

    pub const fn new(algorithm: Algorithm, deterministic: bool) -> Self {
        Self {
            algorithm,
            deterministic,
        }
    }

    /// The record name: `fa2-tc`, `fa2`, `fa2-tc-deterministic`, `fa3-deterministic`, ….
    pub fn name(&self) -> String {
        let algorithm = self.algorithm.name();
        if self.deterministic {
            format!("{algorithm}-deterministic")
        } else {
            algorithm.to_string()
        }
    }
}

impl std::str::FromStr for BackwardVariant {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|v| v.name() == s)
            .ok_or_else(|| {
                Error::invalid(
                    "backward variant",
                    s,
                    "allowed: fa2-tc, fa2, fa2-tc-deterministic, standard, fa3, \
                     fa3-deterministic",
                )
            })
    }
}

/// One backward measurement: ours or a PyTorch backend's (`lab/scripts/torch_backward_bench.py`
/// writes the same schema).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct BackwardRecord {
    /// `fa3`, `fa2-tc`, `fa2`, `fa2-tc-deterministic`, `fa3-deterministic`, `standard`, or
    /// `torch-flash`,
    /// `torch-cudnn`.
    pub implementation: String,
    #[serde(with = "crate::names")]
    pub dtype: DType,
    pub shape: BenchShape,
    pub backward_ms: Option<f64>,
    /// 2.5 × the forward's FLOPs over `backward_ms`.
    pub backward_tflops: Option<f64>,
    pub forward_backward_ms: Option<f64>,
    /// 3.5 × the forward's FLOPs over `forward_backward_ms`.
    pub forward_backward_tflops: Option<f64>,
    /// Device memory held at the peak of one forward + backward, inputs and gradients included.
    pub peak_memory_bytes: Option<u64>,
    /// Our backward plan (which kernels ran, a fallback's reason).
    #[serde(default)]
    pub plan: Option<String>,
    /// Why there is no time (out of memory, unsupported, …).
    pub error: Option<String>,
}

/// The backward's FLOPs as a multiple of the forward's (FlashAttention-2's count).
pub const BACKWARD_FLOPS_FACTOR: f64 = 2.5;
/// Forward + backward.
pub const FORWARD_BACKWARD_FLOPS_FACTOR: f64 = 3.5;

/// How the benchmark times each case.
#[derive(Clone, Copy, Debug)]
pub struct BackwardBenchConfig {
    pub dtype: DType,
    /// The forward that the backward follows (its O and L), and that forward + backward times.
    pub forward: Algorithm,
    /// Timed repeats of each number (the median is kept).
    pub repeats: usize,
}

impl BackwardRecord {
    fn failed(name: String, dtype: DType, shape: BenchShape, error: &Error) -> Self {
        Self {
            implementation: name,
            dtype,
            shape,
            backward_ms: None,
            backward_tflops: None,
            forward_backward_ms: None,
            forward_backward_tflops: None,
            peak_memory_bytes: None,
            plan: None,
            error: Some(error.to_string()),
        }
    }

    /// The record as the forward's table takes it: `tflops` and `median_ms` from the backward
    /// alone, or with `forward_backward` from forward + backward.
    pub fn as_bench_record(&self, forward_backward: bool) -> BenchRecord {
        let (median_ms, tflops) = if forward_backward {
            (self.forward_backward_ms, self.forward_backward_tflops)
        } else {
            (self.backward_ms, self.backward_tflops)
        };
        BenchRecord {
            implementation: self.implementation.clone(),
            dtype: self.dtype,
            shape: self.shape,
            median_ms,
            tflops,
            bandwidth_gbs: None,
            peak_memory_bytes: self.peak_memory_bytes,
            error: self.error.clone(),
        }
    }
}

/// Times `variant` on `shape`; an error (out of memory, a refused mode) becomes a record with
/// no time.
pub fn time_backward(
    gpu: &Gpu,
    variant: BackwardVariant,
    shape: BenchShape,
    config: &BackwardBenchConfig,
    rng: &mut impl Rng,
) -> BackwardRecord {
    let result = with_element!(config.dtype, T => {
        time_backward_typed::<T>(gpu, variant, shape, config, rng)
    });
    // The failed case's buffers are freed (in stream order) by now; wait so the next case
    // starts from an empty pool.
    let _ = gpu.synchronize();
    result.unwrap_or_else(|e| BackwardRecord::failed(variant.name(), config.dtype, shape, &e))
}

/// Q, K, V, dO, the forward's output and the gradients of one case, on the device.
struct Case<T> {
    q: DeviceTensor<T>,
    k: DeviceTensor<T>,
    v: DeviceTensor<T>,
    d_o: DeviceTensor<T>,
    out: AttentionOutput<T>,
    gradients: Gradients<DeviceTensor<T>>,
    options: AttentionOptions,
}

impl<T: Element> Case<T> {
    /// Every buffer of one forward + backward at `shape` (inputs from `rng`, or zeros when
    /// `rng` is `None`: the memory mode computes nothing it reads).
    fn allocate(
        gpu: &Gpu,
        forward: Algorithm,
        shape: BenchShape,
        rng: Option<&mut impl Rng>,
    ) -> Result<Self> {
        let dims = shape.dims();
        let layout = Layout::BatchHeadSeqDim;
        let mut tensors = Vec::with_capacity(4);
        match rng {
            Some(rng) => {
                for _ in 0..4 {
                    let host = random_tensor::<T>(dims, rng);
                    tensors.push(DeviceTensor::from_array(gpu, host.view(), layout)?);
                }
            }
            None => {
                for _ in 0..4 {
                    tensors.push(DeviceTensor::filled(gpu, dims, layout, T::default())?);
                }
            }
        }
        let [q, k, v, d_o]: [DeviceTensor<T>; 4] = tensors
            .try_into()
            .map_err(|_| Error::File("four tensors".into()))?;
        let options = AttentionOptions {
            algorithm: forward,
            causal: shape.causal,
            ..Default::default()
        };
        let out = Attention::new(&q, &k, &v).options(options).forward(gpu)?;
        let zeros = || DeviceTensor::filled(gpu, dims, layout, T::default());
        let gradients = Gradients {
            dq: zeros()?,
            dk: zeros()?,
            dv: zeros()?,
        };
        Ok(Self {
            q,
            k,
            v,
            d_o,
            out,
            gradients,
            options,
        })
    }

    fn forward(&mut self, gpu: &Gpu) -> Result<()> {
        Attention::new(&self.q, &self.k, &self.v)
            .options(self.options)
            .forward_into(gpu, self.out.tensors())
            .map(|_| ())
    }

    fn backward(&mut self, gpu: &Gpu, variant: &BackwardVariant) -> Result<Plan> {
        let RowStatistics::LogSumExp(logsumexp) = &self.out.stats else {
            return Err(Error::invalid(
                "forward",
                "fa1",
                "a forward that returns L (any algorithm but fa1)",
            ));
        };
        let options = AttentionOptions {
            backward_algorithm: variant.algorithm,
            deterministic: variant.deterministic,
            ..self.options
        };
        let Gradients { dq, dk, dv } = &mut self.gradients;
        Attention::new(&self.q, &self.k, &self.v)
            .options(options)
            .backward_into(
                gpu,
                BackwardTensors {
                    o: (&self.out.o).into(),
                    logsumexp: logsumexp.into(),
                    d_o: (&self.d_o).into(),
                    gradients: Gradients {
                        dq: dq.into(),
                        dk: dk.into(),
                        dv: dv.into(),
                    },
                },
            )
    }
}

fn time_backward_typed<T: Element>(
    gpu: &Gpu,
    variant: BackwardVariant,
    shape: BenchShape,
    config: &BackwardBenchConfig,
    rng: &mut impl Rng,
) -> Result<BackwardRecord> {
    gpu.synchronize()?;
    gpu.reset_peak_memory()?;
    let mut case = Case::<T>::allocate(gpu, config.forward, shape, Some(rng))?;
    case.forward(gpu)?;
    let plan = case.backward(gpu, &variant)?;
    gpu.synchronize()?;
    let peak_memory_bytes = gpu.peak_memory()?;
    let repeats = config.repeats.max(1);
    // The first of each series is a warm-up, left out of the median.
    let median = |times: Vec<f32>| {
        let mut times = times[1..].to_vec();
        times.sort_by(f32::total_cmp);
        f64::from(times[times.len() / 2])
    };
    let backward_ms =
        median(gpu.time_each_ms(repeats + 1, |_| case.backward(gpu, &variant).map(|_| ()))?);
    let forward_backward_ms = median(gpu.time_each_ms(repeats + 1, |_| {
        case.forward(gpu)?;
        case.backward(gpu, &variant).map(|_| ())
    })?);
    let flops = shape.flops();
    let tflops = |factor: f64, ms: f64| factor * flops / (ms * 1e-3) / 1e12;
    Ok(BackwardRecord {
        implementation: variant.name(),
        dtype: T::DTYPE,
        shape,
        backward_ms: Some(backward_ms),
        backward_tflops: Some(tflops(BACKWARD_FLOPS_FACTOR, backward_ms)),
        forward_backward_ms: Some(forward_backward_ms),
        forward_backward_tflops: Some(tflops(FORWARD_BACKWARD_FLOPS_FACTOR, forward_backward_ms)),
        peak_memory_bytes: Some(peak_memory_bytes),
        plan: Some(plan.to_string()),
        error: None,
    })
}

/// The two markdown tables of a backward run: TFLOP/s of the backward alone, then of forward +
/// backward, each one row per shape with our fastest and its ratios to PyTorch's (as the forward
/// sweep's table).
pub fn backward_tables(records: &[BackwardRecord], forward: Algorithm) -> String {
    let table = |forward_backward| {
        let records: Vec<BenchRecord> = records
            .iter()
            .map(|r| r.as_bench_record(forward_backward))
            .collect();
        merged_table(&records)
    };
    format!(
        "### Backward (TFLOP/s = 2.5 × forward FLOPs / backward time)\n\n{}\n\
         ### Forward + backward (TFLOP/s = 3.5 × forward FLOPs / time; our forward: {forward})\n\n{}",
        table(false),
        table(true)
    )
}

/// Reads records written by `lab/scripts/torch_backward_bench.py --out`.
pub fn read_backward_records(path: &Path) -> Result<Vec<BackwardRecord>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::File(format!("cannot read {}: {e}", path.display())))?;
    #[derive(serde::Deserialize)]
    struct RecordsFile {
        records: Vec<BackwardRecord>,
    }
    serde_json::from_str::<RecordsFile>(&text)
        .map(|f| f.records)
        .map_err(|e| {
            Error::File(format!(
                "{} is not a backward benchmark JSON file ({{\"records\": [...]}}, as \
                 lab/scripts/torch_backward_bench.py --out writes it): {e}",
                path.display()
            ))
        })
}

/// One cell of the memory table: the peak of one forward + backward, or the error that stopped
/// it (out of memory, most often).
#[derive(Clone, Debug, serde::Serialize)]
pub struct MemoryCell {
    pub implementation: String,
    pub seqlen: usize,
    /// The backward's peak: every tensor (Q, K, V, O, L, dO, dQ, dK, dV) and its workspace.
    pub peak_memory_bytes: Option<u64>,
    /// The plan's workspace (`BackwardPlan::workspace_bytes`).
    pub workspace_bytes: Option<u64>,
    pub error: Option<String>,
}

/// The memory mode's sequence lengths: 1k, 2k, …, doubling up to `max_seqlen`.
pub fn memory_seqlens(max_seqlen: usize) -> Vec<usize> {
    std::iter::successors(Some(1024usize), |n| Some(n * 2))
        .take_while(|&n| n <= max_seqlen)
        .collect()
}

/// The peak device memory of the backward of `variant` (after its forward) at batch 1, `heads` ×
/// `head_dim`, for each of `seqlens` (zero inputs: the kernels run, nothing is checked); once a
/// length fails (out of memory) the longer ones are not tried and say so.
pub fn memory_rows(
    gpu: &Gpu,
    variant: BackwardVariant,
    config: &BackwardBenchConfig,
    heads: usize,
    head_dim: usize,
    seqlens: &[usize],
) -> Result<Vec<MemoryCell>> {
    let mut cells = Vec::new();
    let mut failed_at: Option<usize> = None;
    for &seqlen in seqlens {
        let cell = |measured: Option<(u64, u64)>, error| MemoryCell {
            implementation: variant.name(),
            seqlen,
            peak_memory_bytes: measured.map(|m| m.0),
            workspace_bytes: measured.map(|m| m.1),
            error,
        };
        if let Some(n) = failed_at {
            cells.push(cell(None, Some(format!("not tried (failed at N = {n})"))));
            continue;
        }
        let shape = BenchShape {
            batch: 1,
            heads,
            seqlen,
            head_dim,
            causal: false,
        };
        let outcome = with_element!(config.dtype, T => {
            measure_memory::<T>(gpu, variant, config.forward, shape)
        });
        gpu.synchronize()?;
        match outcome {
            Ok(measured) => cells.push(cell(Some(measured), None)),
            Err(e @ (Error::OutOfMemory { .. } | Error::InvalidArgument { .. })) => {
                failed_at = Some(seqlen);
                cells.push(cell(None, Some(e.to_string())));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(cells)
}

/// One forward, then the backward at `shape`: the pool's high-water mark over the backward
/// (the tensors it finds allocated and its workspace; the forward's workspace is freed by then),
/// and the plan's workspace.
fn measure_memory<T: Element>(
    gpu: &Gpu,
    variant: BackwardVariant,
    forward: Algorithm,
    shape: BenchShape,
) -> Result<(u64, u64)> {
    gpu.synchronize()?;
    let mut case = Case::<T>::allocate(gpu, forward, shape, None::<&mut rand::rngs::StdRng>)?;
    case.forward(gpu)?;
    gpu.synchronize()?;
    gpu.reset_peak_memory()?;
    let plan = case.backward(gpu, &variant)?;
    gpu.synchronize()?;
    Ok((gpu.peak_memory()?, plan.workspace_bytes() as u64))
}

/// The memory table: one row per N, one column per variant, the peak in GiB with the workspace
/// in brackets, or the failure (`OOM`, the error with the bytes asked for in a note under the
/// table).
pub fn memory_table(cells: &[MemoryCell], heads: usize, head_dim: usize) -> String {
    let mut names: Vec<&str> = Vec::new();
    let mut seqlens: Vec<usize> = Vec::new();
    for c in cells {
        if !names.contains(&c.implementation.as_str()) {
            names.push(&c.implementation);
        }
        if !seqlens.contains(&c.seqlen) {
            seqlens.push(c.seqlen);
        }
    }
    let mut table = format!(
        "| N (batch 1, {heads} heads, d = {head_dim}) | {} |\n|---|{}\n",
        names
            .iter()
            .map(|n| format!("{n} peak (workspace), GiB"))
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(names.len())
    );
    let mut notes = Vec::new();
    for &n in &seqlens {
        let row: Vec<String> = names
            .iter()
            .map(|name| {
                let cell = cells
                    .iter()
                    .find(|c| c.seqlen == n && c.implementation == *name);
                match cell {
                    Some(MemoryCell {
                        peak_memory_bytes: Some(bytes),
                        workspace_bytes,
                        ..
                    }) => format!(
                        "{:.3} ({:.3})",
                        *bytes as f64 / 1073741824.0,
                        workspace_bytes.unwrap_or_default() as f64 / 1073741824.0
                    ),
                    Some(MemoryCell {
                        error: Some(error), ..
                    }) if error.starts_with("not tried") => "—".into(),
                    Some(MemoryCell {
                        error: Some(error), ..
                    }) => {
                        notes.push(format!("- {name} at N = {n}: {error}"));
                        if error.contains("out of device memory") {
                            "OOM".into()
                        } else {
                            "failed".into()
                        }
                    }
                    _ => "—".into(),
                }
            })
            .collect();
        table.push_str(&format!("| {n} | {} |\n", row.join(" | ")));
    }
    if !notes.is_empty() {
        table.push('\n');
        table.push_str(&notes.join("\n"));
        table.push('\n');
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::bench::test_records::shape;

    fn record(name: &str, seqlen: usize, backward: f64, forward_backward: f64) -> BackwardRecord {
        let s = shape(128, false, seqlen);
        BackwardRecord {
            implementation: name.into(),
            dtype: DType::Bf16,
            shape: s,
            backward_ms: Some(BACKWARD_FLOPS_FACTOR * s.flops() / (backward * 1e12) * 1e3),
            backward_tflops: Some(backward),
            forward_backward_ms: Some(
                FORWARD_BACKWARD_FLOPS_FACTOR * s.flops() / (forward_backward * 1e12) * 1e3,
            ),
            forward_backward_tflops: Some(forward_backward),
            peak_memory_bytes: Some(1 << 30),
            plan: None,
            error: None,
        }
    }

    #[test]
    fn the_two_tables_put_ours_beside_torch_for_each_number() {
        let records = [
            record("fa2-tc", 4096, 200.0, 300.0),
            record("fa2", 4096, 50.0, 100.0),
            record("torch-flash", 4096, 250.0, 320.0),
        ];
        let tables = backward_tables(&records, Algorithm::Fa3);
        let backward = "| 128 | no | 4096 | 4 | 16 | 200.0 | 50.0 | 250.0 | fa2-tc 200.0 | 0.80× flash | 0.80× |";
        let forward_backward = "| 128 | no | 4096 | 4 | 16 | 300.0 | 100.0 | 320.0 | fa2-tc 300.0 | 0.94× flash | 0.94× |";
        let (first, second) = tables
            .split_once("### Forward + backward")
            .expect("two tables");
        assert!(first.contains(backward), "{tables}");
        assert!(second.contains(forward_backward), "{tables}");
        assert!(second.contains("our forward: fa3"), "{tables}");
    }

    #[test]
    fn torch_records_in_the_scripts_schema_read_back() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("torch.json");
        // As lab/scripts/torch_backward_bench.py writes them: one timed, one failed.
        let json = r#"{"device": "NVIDIA H200", "torch": "2.9", "records": [
            {"implementation": "torch-flash", "dtype": "bf16",
             "shape": {"batch": 4, "heads": 16, "seqlen": 4096, "head_dim": 128, "causal": false},
             "backward_ms": 5.5, "backward_tflops": 250.0, "forward_backward_ms": 7.5,
             "forward_backward_tflops": 320.0, "peak_memory_bytes": 1000, "plan": null,
             "error": null},
            {"implementation": "torch-cudnn", "dtype": "bf16",
             "shape": {"batch": 4, "heads": 16, "seqlen": 4096, "head_dim": 128, "causal": false},
             "backward_ms": null, "backward_tflops": null, "forward_backward_ms": null,
             "forward_backward_tflops": null, "peak_memory_bytes": null, "plan": null,
             "error": "CUDA out of memory"}]}"#;
        std::fs::write(&path, json).expect("writing");
        let records = read_backward_records(&path).expect("the script's schema");
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].backward_tflops, Some(250.0));
        assert_eq!(records[0].shape, shape(128, false, 4096));
        assert!(records[1].error.is_some());
        let tables = backward_tables(&records, Algorithm::Fa3);
        assert!(tables.contains("| 250.0 | OOM |"), "{tables}");
        std::fs::write(&path, "[]").expect("writing");
        let error = read_backward_records(&path)
            .expect_err("a bare list")
            .to_string();
        assert!(error.contains("torch_backward_bench.py"), "{error}");
    }

    #[test]
    fn variants_parse_by_name() {
        for variant in BackwardVariant::ALL {
            assert_eq!(
                variant.name().parse::<BackwardVariant>().ok(),
                Some(variant)
            );
        }
        assert!("fa2-deterministic".parse::<BackwardVariant>().is_err());
    }

    #[test]
    fn the_memory_table_marks_out_of_memory_and_names_the_bytes() {
        let oom = "out of device memory: asked for 68719476736 bytes for the backward's dQ \
                   accumulator, 1 of 2 bytes free";
        let cell = |name: &str, seqlen, peak: Option<u64>, error: Option<&str>| MemoryCell {
            implementation: name.into(),
            seqlen,
            peak_memory_bytes: peak,
            workspace_bytes: peak.map(|p| p / 4),
            error: error.map(String::from),
        };
        let cells = [
            cell("fa2-tc", 1024, Some(1 << 30), None),
            cell("fa2-tc", 2048, None, Some(oom)),
            cell("fa2-tc", 4096, None, Some("not tried (failed at N = 2048)")),
            cell("fa2", 1024, Some(1 << 29), None),
            cell("fa2", 2048, Some(1 << 30), None),
            cell("fa2", 4096, Some(1 << 31), None),
        ];
        assert_eq!(
            memory_table(&cells, 16, 128),
            format!(
                "\
| N (batch 1, 16 heads, d = 128) | fa2-tc peak (workspace), GiB | fa2 peak (workspace), GiB |
|---|---|---|
| 1024 | 1.000 (0.250) | 0.500 (0.125) |
| 2048 | OOM | 1.000 (0.250) |
| 4096 | — | 2.000 (0.500) |

- fa2-tc at N = 2048: {oom}
"
            )
        );
        assert_eq!(memory_seqlens(131072).len(), 8);
        assert_eq!(memory_seqlens(131072).last(), Some(&131072));
    }
}
