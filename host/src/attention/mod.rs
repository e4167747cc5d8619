//! The one entry point for every algorithm: check the problem, plan the call, then launch.
//!
//! - [`problem`]: the algorithm, the options and the problem's shape, checked;
//! - [`backward`]: the backward pass's arguments, checked, and its CPU emulation on host tensors;
//! - [`backward_plan`]: the backward's plan (algorithm, fallback, kernels, workspace);
//! - [`backward_gpu`]: the backward's calls and launches on the GPU;
//! - [`decode`]: decoding against a KV cache (split-KV, GQA, paged caches), its own API;
//! - [`borrowed`]: the same call on device memory another library owns (PyTorch's tensors);
//! - [`borrowed_backward`]: the backward on such memory (the Python bridge's autograd);
//! - [`packed`]: packed batches of sequences of different lengths (flash-attn's varlen call);
//! - [`plan`]: which kernels run with which launches, checked against the device;
//! - this file: the API (allocate outputs and workspace, build parameter blocks, launch the plan).

pub mod backward;
pub mod backward_gpu;
pub mod backward_plan;
pub mod borrowed;
pub mod borrowed_backward;
pub mod borrowed_packed;
pub mod decode;
pub mod packed;
pub mod plan;
pub mod problem;

use cudarc::driver::CudaSlice;
use flash_kernels::common::params::{Fa1Params, Fa2Params, Fa3Params, Operands, StandardParams};
use flash_kernels::registry::ElementType;
use ndarray::Array3;

pub use backward::{BackwardArguments, BackwardProblem, Gradients, TensorSpec};
pub use backward_gpu::{attention_backward, attention_backward_into};
pub use backward_plan::{BackwardAlgorithm, BackwardOptions, BackwardPlan, BackwardViews};
pub use borrowed::{BorrowedArguments, BorrowedTensor, StatisticsAddresses, attention_borrowed};
pub use borrowed_backward::{BorrowedBackwardArguments, BorrowedRows, attention_backward_borrowed};
pub use borrowed_packed::attention_packed_borrowed;
pub use packed::{
    PackedBatch, PackedOutput, attention_packed, attention_packed_into, new_packed_output,
};
pub use plan::{
    Blocks, CompiledLimits, H200_MULTIPROCESSORS, H200_SHARED_MEMORY_PER_BLOCK, Launch,
    LaunchLimits, Plan, PlannedLaunch, StatisticsKind, WorkspaceSize, fa1_blocks, fa2_blocks,
    fa2_tc_head_dims, fa2_tc_tiling, fa2_tc_tilings, fa3_fallback, fa3_tiling,
    tensor_core_fallback,
};
pub use problem::{
    Algorithm, AttentionOptions, MAX_HEAD_DIM, Problem, parse_fa2_tc_tiling, parse_fa3_tiling,
    parse_optional_fa2_tc_tiling,
};

use crate::device::Gpu;
use crate::device::tensor_map::{self, MapOperand};
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::tensor::{DeviceTensor, Layout};

/// The per-row statistics an algorithm returns, on the device, (batch·heads, seqlen_q) each.
pub enum RowStatistics {
    /// L = m + log ℓ (standard attention, FA2). −∞ for a row with no visible key.
    LogSumExp(CudaSlice<f32>),
    /// FA1's m (natural-log units) and ℓ.
    MaxAndSum {
        max: CudaSlice<f32>,
        sum: CudaSlice<f32>,
    },
}

impl RowStatistics {
    /// L as a (batch, heads, seqlen_q) array: downloaded, or m + ln ℓ for FA1.
    pub fn logsumexp(&self, gpu: &Gpu, dims: [usize; 3]) -> Result<Array3<f32>> {
        let values = match self {
            RowStatistics::LogSumExp(l) => gpu.download(l)?,
            RowStatistics::MaxAndSum { max, sum } => {
                let (m, l) = (gpu.download(max)?, gpu.download(sum)?);
                m.iter()
                    .zip(&l)
                    .map(|(m, l)| {
                        if *l > 0.0 {
                            m + l.ln()
                        } else {
                            f32::NEG_INFINITY
                        }
                    })
                    .collect()
            }
        };
        Array3::from_shape_vec(dims, values).map_err(|e| Error::File(e.to_string()))
    }
}

/// O, the row statistics, and the plan of the call that wrote them (`None` before one has).
pub struct AttentionOutput<T> {
    pub o: DeviceTensor<T>,
    pub stats: RowStatistics,
    /// Which kernels ran, with which launches (and, for a fallback, why).
    pub plan: Option<Plan>,
}

/// Runs `algorithm` on Q, K, V and returns O (in Q's layout), the row statistics and the plan.
pub fn attention<T: Element>(
    gpu: &Gpu,
    algorithm: Algorithm,
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    v: &DeviceTensor<T>,
    options: &AttentionOptions,
) -> Result<AttentionOutput<T>> {
    let mut output = new_output(gpu, algorithm, q, k, v, options)?;
    attention_into(gpu, algorithm, q, k, v, &mut output, options)?;
    Ok(output)
}

/// Checks the arguments and allocates what [`attention_into`] writes: O (Q's dims and layout,
/// zeroed) and the algorithm's row statistics.
pub fn new_output<T: Element>(
    gpu: &Gpu,
    algorithm: Algorithm,
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    v: &DeviceTensor<T>,
    options: &AttentionOptions,
) -> Result<AttentionOutput<T>> {
    let problem = Problem::new(q.dims(), k.dims(), v.dims(), options)?;
    let layout = q.layout().unwrap_or(Layout::BatchHeadSeqDim);
    let o = DeviceTensor::filled(gpu, q.dims(), layout, T::default())?;
    Ok(AttentionOutput {
        o,
        stats: new_statistics(gpu, algorithm, &problem)?,
        plan: None,
    })
}

/// Allocates the row statistics `algorithm` returns for `problem` (uninitialised).
pub fn new_statistics(gpu: &Gpu, algorithm: Algorithm, problem: &Problem) -> Result<RowStatistics> {
    Ok(match StatisticsKind::of(algorithm) {
        StatisticsKind::LogSumExp => RowStatistics::LogSumExp(gpu.alloc(problem.rows(), "L")?),
        StatisticsKind::MaxAndSum => RowStatistics::MaxAndSum {
            max: gpu.alloc(problem.rows(), "m")?,
            sum: gpu.alloc(problem.rows(), "ℓ")?,
        },
    })
}

/// Device memory an algorithm needs besides its inputs and outputs: S and P for standard
/// attention, the f32 O accumulator for FA1, nothing for FA2.
pub struct Workspace<T> {
    scores: Option<CudaSlice<f32>>,
    probs: Option<CudaSlice<T>>,
    o_accumulator: Option<CudaSlice<f32>>,
}

impl<T: Element> Workspace<T> {
    /// Allocates what `algorithm` needs for `problem` (an out-of-memory error says how much).
    pub fn new(gpu: &Gpu, algorithm: Algorithm, problem: &Problem) -> Result<Self> {
        let size = WorkspaceSize::of(algorithm, problem);
        let some = |len: usize| len > 0;
        Ok(Self {
            scores: some(size.scores)
                .then(|| gpu.alloc(size.scores, "S"))
                .transpose()?,
            probs: some(size.scores)
                .then(|| gpu.alloc(size.scores, "P"))
                .transpose()?,
            o_accumulator: some(size.o_accumulator)
                .then(|| gpu.alloc(size.o_accumulator, "FA1's O accumulator"))
                .transpose()?,
        })
    }

    fn address<E>(gpu: &Gpu, buffer: &Option<CudaSlice<E>>, what: &'static str) -> Result<u64> {
        buffer.as_ref().map(|b| gpu.address(b)).ok_or_else(|| {
            Error::invalid(
                "workspace",
                format!("one without {what}"),
                "a workspace allocated for this algorithm",
            )
        })
    }
}

/// Like [`attention`], writing into an existing output (whose O has Q's dims and whose statistics
/// match the algorithm), so callers can poison it first or reuse it across runs. Allocates the
/// workspace for this call (see [`attention_with_workspace`] to reuse one). Returns the plan.
pub fn attention_into<T: Element>(
    gpu: &Gpu,
    algorithm: Algorithm,
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    v: &DeviceTensor<T>,
    output: &mut AttentionOutput<T>,
    options: &AttentionOptions,
) -> Result<Plan> {
    let problem = Problem::new(q.dims(), k.dims(), v.dims(), options)?;
    // Dropped at the end of this call: freed in stream order, after the kernels that use it.
    let workspace = Workspace::new(gpu, algorithm, &problem)?;
    attention_with_workspace(gpu, algorithm, q, k, v, output, &workspace, options)
}

/// The launch itself: checks every argument and plans the call, then runs the plan's kernels on
/// the stream. Returns the plan (also stored in `output.plan`).
#[allow(clippy::too_many_arguments)]
pub fn attention_with_workspace<T: Element>(
    gpu: &Gpu,
    algorithm: Algorithm,
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    v: &DeviceTensor<T>,
    output: &mut AttentionOutput<T>,
    workspace: &Workspace<T>,
    options: &AttentionOptions,
) -> Result<Plan> {
    let problem = Problem::new(q.dims(), k.dims(), v.dims(), options)?;
    if output.o.dims() != q.dims() {
        return Err(Error::invalid(
            "output.o",
            format!("shape {:?}", output.o.dims()),
            format!("must equal q's shape {:?}", q.dims()),
        ));
    }
    let operands = Operands {
        q: q.view(gpu),
        k: k.view(gpu),
        v: v.view(gpu),
        o: output.o.view(gpu),
    };
    let stats = match &output.stats {
        RowStatistics::LogSumExp(l) => StatisticsAddresses::LogSumExp(gpu.address(l)),
        RowStatistics::MaxAndSum { max, sum } => StatisticsAddresses::MaxAndSum {
            max: gpu.address(max),
            sum: gpu.address(sum),
        },
    };
    let dims = [q.dims(), k.dims(), v.dims()];
    let plan = launch_checked(
        gpu, algorithm, &problem, operands, dims, stats, workspace, options,
    )?;
    output.plan = Some(plan.clone());
    Ok(plan)
}

/// Plans the call and runs the plan's kernels on the stream, for a checked `problem` whose
/// operands (Q, K, V with `dims`, and O with Q's) and statistics lie at the given addresses.
#[allow(clippy::too_many_arguments)]
fn launch_checked<T: Element>(
    gpu: &Gpu,
    algorithm: Algorithm,
    problem: &Problem,
    operands: Operands,
    [q_dims, k_dims, v_dims]: [[usize; 4]; 3],
    stats: StatisticsAddresses,
    workspace: &Workspace<T>,
    options: &AttentionOptions,
) -> Result<Plan> {
    let plan = Plan::new(gpu, algorithm, T::DTYPE, problem, options, Some(&operands))?;
    let shape = problem.shape();
    match (plan.blocks, stats) {
        (Blocks::Standard, StatisticsAddresses::LogSumExp(logsumexp)) => {
            let params = StandardParams {
                operands,
                shape,
                scores: Workspace::<T>::address(gpu, &workspace.scores, "S")?,
                probs: Workspace::<T>::address(gpu, &workspace.probs, "P")?,
                logsumexp,
            };
            launch_plan(gpu, &plan, params)?;
        }
        (Blocks::Fa1 { blocks, .. }, StatisticsAddresses::MaxAndSum { max, sum }) => {
            let params = Fa1Params {
                operands,
                shape,
                o_accumulator: Workspace::<T>::address(
                    gpu,
                    &workspace.o_accumulator,
                    "the O accumulator",
                )?,
                row_max: max,
                row_sum: sum,
                block_rows: blocks.block_rows,
                block_cols: blocks.block_cols,
            };
            launch_plan(gpu, &plan, params)?;
        }
        (Blocks::Fa2 { block_rows, .. }, StatisticsAddresses::LogSumExp(l)) => {
            launch_plan(gpu, &plan, fa2_params(operands, problem, l, block_rows))?;
        }
        (Blocks::Fa2Tc(tiling), StatisticsAddresses::LogSumExp(l)) => {
            let params = fa2_params(operands, problem, l, tiling.block_rows());
            launch_plan(gpu, &plan, params)?;
        }
        (Blocks::Fa3 { tiling, .. }, StatisticsAddresses::LogSumExp(logsumexp)) => {
            let dims = [q_dims, k_dims, v_dims];
            let params = fa3_params::<T>(gpu, &operands, dims, tiling, shape, logsumexp)?;
            launch_plan(gpu, &plan, params)?;
        }
        _ => {
            return Err(Error::invalid(
                "output.stats",
                "statistics of another algorithm",
                format!("use `new_statistics` for {algorithm}"),
            ));
        }
    }
    Ok(plan)
}

/// FA3's parameter block: the Q, K, V tensor maps encoded for `tiling`'s boxes, and the
/// persistent grid's tile counters.
fn fa3_params<T: Element>(
    gpu: &Gpu,
    operands: &Operands,
    [q_dims, k_dims, v_dims]: [[usize; 4]; 3],
    tiling: flash_kernels::fwd::fa3::config::Fa3Tiling,
    shape: flash_kernels::common::params::AttentionShape,
    logsumexp: u64,
) -> Result<Fa3Params> {
    let element = ElementType::from(T::DTYPE);
    let maps = tensor_map::encode_call(
        &[
            MapOperand::new("q", &operands.q, q_dims, tiling.block_rows()),
            MapOperand::new("k", &operands.k, k_dims, tiling.block_cols),
            MapOperand::new("v", &operands.v, v_dims, tiling.block_cols),
        ],
        element,
    )?;
    Ok(Fa3Params {
        shape,
        o: operands.o,
        logsumexp,
        tensor_maps: gpu.tensor_maps(maps)?,
        tile_counters: if tiling.persistent {
            gpu.tile_counters()?
        } else {
            0
        },
    })
}

/// The FA2 family's parameter block (both kernels take it; B_r is the plan's).
fn fa2_params(operands: Operands, problem: &Problem, logsumexp: u64, block_rows: u32) -> Fa2Params {
    Fa2Params {
        operands,
        shape: problem.shape(),
        logsumexp,
        block_rows,
        _pad: 0,
    }
}

/// Launches every kernel of `plan`, in order, with one parameter block.
fn launch_plan<P: crate::device::ParamBlock>(gpu: &Gpu, plan: &Plan, params: P) -> Result<()> {
    for PlannedLaunch { kernel, launch } in &plan.launches {
        gpu.launch(*kernel, *launch, params)?;
    }
    Ok(())
}
