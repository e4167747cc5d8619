//! The one front door for every form of attention: a call is described once ([`Attention`]:
//! Q, K, V, the form, the options), checked and planned once ([`Plan`]: which kernels, grids,
//! shared memory, workspace, and why), then run into outputs the caller owns or new ones.
//!
//! - [`call`]: the description and its checks;
//! - [`call_plan`]: the plan of a call (which pass, its kernels, the call it was made for);
//! - [`run`]: planning a call and running its plan (with the conveniences that allocate);
//! - [`tensors`]: the tensors a run takes and the outputs it returns, and the workspace;
//! - [`problem`]: the algorithm, the options and the problem's shape, checked;
//! - [`plan`]: the forward's kernels and launches, checked against the device;
//! - [`backward_plan`], [`backward`], [`backward_gpu`]: the backward's plan, checks, launches;
//! - [`alibi`]: ALiBi's slopes;
//! - [`dropout`]: dropout's probability and generator state;
//! - [`packed`]: packed batches of sequences of different lengths (flash-attn's varlen call);
//! - [`decode`]: decoding against a (paged) KV cache (split-KV, GQA, appended keys);
//! - this file: the forward's parameter blocks and launches.

pub mod alibi;
pub mod backward;
pub mod backward_gpu;
pub mod backward_kernels;
pub mod backward_plan;
pub mod call;
pub mod call_plan;
pub mod decode;
pub mod dropout;
pub mod packed;
pub mod plan;
pub mod problem;
pub mod run;
pub mod tensors;

use cudarc::driver::CudaSlice;
use flash_kernels::common::params::{Fa1Params, Fa2Params, Fa3Params, Operands, StandardParams};
use flash_kernels::fwd::fa3::config::O_STORE_ROWS;
use flash_kernels::registry::ElementType;

pub use alibi::AlibiSlopes;
pub use backward::{BackwardArguments, BackwardProblem, Gradients, TensorSpec};
pub use backward_plan::{BackwardAlgorithm, BackwardPlan};
pub use call::{Attention, Form, KvCache};
pub use call_plan::{PassPlan, Plan};
pub use decode::{BlockTable, CacheSeqlens, DecodePlan};
pub use dropout::Dropout;
pub use packed::{DeviceOffsets, PackedBatch, PackedOffsets};
pub use plan::{
    Blocks, CompiledLimits, ForwardPlan, H200_MULTIPROCESSORS, H200_SHARED_MEMORY_PER_BLOCK,
    Launch, LaunchLimits, PlannedLaunch, StatisticsKind, WorkspaceSize, fa1_blocks, fa2_blocks,
    fa2_tc_head_dims, fa2_tc_tiling, fa2_tc_tilings, fa3_fallback, fa3_tiling,
    tensor_core_fallback,
};
pub use problem::{
    Algorithm, AttentionOptions, MAX_HEAD_DIM, PackedRows, Problem, parse_fa2_tc_tiling,
    parse_fa3_tiling, parse_optional_fa2_tc_tiling,
};
pub use tensors::{
    AttentionOutput, BackwardOutput, BackwardTensors, ForwardTensors, Pass, RowStatistics,
    Statistics, Workspace,
};

use crate::device::Gpu;
use crate::device::tensor_map::{self, MapOperand};
use crate::dtype::Element;
use crate::error::{Error, Result};

/// Where a run's row statistics go (checked by the run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatisticsAddresses {
    /// L = m + log ℓ (every algorithm but FA1).
    LogSumExp(u64),
    /// FA1's m and ℓ.
    MaxAndSum { max: u64, sum: u64 },
}

/// The forward's device memory besides its inputs and outputs: S (f32) and P (the dtype, at
/// most 4 bytes) for standard attention, the f32 O accumulator for FA1, nothing for the rest.
pub(crate) struct ForwardWorkspace {
    scores: Option<CudaSlice<f32>>,
    probs: Option<CudaSlice<u8>>,
    o_accumulator: Option<CudaSlice<f32>>,
}

impl ForwardWorkspace {
    /// Allocates what the most demanding of `plans` needs (an out-of-memory error says how much).
    pub(crate) fn covering(gpu: &Gpu, plans: &[&ForwardPlan]) -> Result<Self> {
        let most =
            |size: fn(&ForwardPlan) -> usize| plans.iter().map(|p| size(p)).max().unwrap_or(0);
        let scores = most(|p| p.workspace.scores);
        let probs = most(|p| p.workspace.scores * p.dtype.size_bytes());
        let o_accumulator = most(|p| p.workspace.o_accumulator);
        let alloc = |len: usize, what| (len > 0).then(|| gpu.alloc::<f32>(len, what)).transpose();
        Ok(Self {
            scores: alloc(scores, "S")?,
            probs: (probs > 0)
                .then(|| gpu.alloc::<u8>(probs, "P"))
                .transpose()?,
            o_accumulator: alloc(o_accumulator, "FA1's O accumulator")?,
        })
    }

    /// A buffer's address, if it holds `len` elements (the plan's need).
    fn address<E>(
        gpu: &Gpu,
        buffer: &Option<CudaSlice<E>>,
        len: usize,
        what: &'static str,
    ) -> Result<u64> {
        match buffer {
            Some(b) if b.len() >= len => Ok(gpu.address(b)),
            _ => Err(Error::invalid(
                "workspace",
                format!("one without {len} elements of {what}"),
                "a workspace made for this plan (Workspace::new)",
            )),
        }
    }
}

/// Runs a forward plan's kernels on the stream, for a checked call whose operands (Q, K, V with
/// `dims`, and O with Q's) and statistics lie at the given addresses.
pub(crate) fn launch_forward<T: Element>(
    gpu: &Gpu,
    plan: &ForwardPlan,
    operands: Operands,
    [q_dims, k_dims, v_dims]: [[usize; 4]; 3],
    stats: StatisticsAddresses,
    workspace: &ForwardWorkspace,
) -> Result<()> {
    let problem = &plan.problem;
    let shape = problem.shape();
    let size = plan.workspace;
    match (plan.blocks, stats) {
        (Blocks::Standard, StatisticsAddresses::LogSumExp(logsumexp)) => {
            let params = StandardParams {
                operands,
                shape,
                scores: ForwardWorkspace::address(gpu, &workspace.scores, size.scores, "S")?,
                probs: ForwardWorkspace::address(
                    gpu,
                    &workspace.probs,
                    size.scores * T::DTYPE.size_bytes(),
                    "P",
                )?,
                logsumexp,
            };
            launch_plan(gpu, plan, params)
        }
        (Blocks::Fa1 { blocks, .. }, StatisticsAddresses::MaxAndSum { max, sum }) => {
            let params = Fa1Params {
                operands,
                shape,
                o_accumulator: ForwardWorkspace::address(
                    gpu,
                    &workspace.o_accumulator,
                    size.o_accumulator,
                    "the O accumulator",
                )?,
                row_max: max,
                row_sum: sum,
                block_rows: blocks.block_rows,
                block_cols: blocks.block_cols,
            };
            launch_plan(gpu, plan, params)
        }
        (Blocks::Fa2 { block_rows, .. }, StatisticsAddresses::LogSumExp(l)) => {
            launch_plan(gpu, plan, fa2_params(operands, problem, l, block_rows))
        }
        (Blocks::Fa2Tc(tiling), StatisticsAddresses::LogSumExp(l)) => {
            let params = fa2_params(operands, problem, l, tiling.block_rows());
            launch_plan(gpu, plan, params)
        }
        (Blocks::Fa3 { tiling, .. }, StatisticsAddresses::LogSumExp(logsumexp)) => {
            let dims = [q_dims, k_dims, v_dims];
            let params = fa3_params::<T>(gpu, &operands, dims, tiling, shape, logsumexp)?;
            launch_plan(gpu, plan, params)
        }
        _ => unreachable!("the run checked the statistics against the plan"),
    }
}

/// FA3's parameter block: the Q, K, V tensor maps encoded for `tiling`'s boxes, and the
/// persistent grid's tile counters.
pub(crate) fn fa3_params<T: Element>(
    gpu: &Gpu,
    operands: &Operands,
    [q_dims, k_dims, v_dims]: [[usize; 4]; 3],
    tiling: flash_kernels::fwd::fa3::config::Fa3Tiling,
    shape: flash_kernels::common::params::AttentionShape,
    logsumexp: u64,
) -> Result<Fa3Params> {
    let element = ElementType::from(T::DTYPE);
    let inputs = [
        MapOperand::new("q", &operands.q, q_dims, tiling.block_rows()),
        MapOperand::new("k", &operands.k, k_dims, tiling.block_cols),
        MapOperand::new("v", &operands.v, v_dims, tiling.block_cols),
    ];
    // The kernels that store O by TMA (`Fa3Tiling::stores_o_by_tma`, which depends on the head
    // dim only through its 64-column panels, the same for the call's d and the compiled one), one
    // warp's rows a copy; O has Q's dims (d_v = d) and, as FA3 runs, 16-byte-aligned rows.
    let output = MapOperand::new("o", &operands.o, q_dims, O_STORE_ROWS);
    let maps = if tiling.stores_o_by_tma(q_dims[3] as u32) {
        let [q, k, v] = inputs;
        tensor_map::encode_call(&[q, k, v, output], element)?
    } else {
        tensor_map::encode_call(&inputs, element)?
    };
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
pub(crate) fn fa2_params(
    operands: Operands,
    problem: &Problem,
    logsumexp: u64,
    block_rows: u32,
) -> Fa2Params {
    Fa2Params {
        operands,
        shape: problem.shape(),
        logsumexp,
        block_rows,
        _pad: 0,
    }
}

/// Launches every kernel of `plan`, in order, with one parameter block.
fn launch_plan<P: crate::device::ParamBlock>(
    gpu: &Gpu,
    plan: &ForwardPlan,
    params: P,
) -> Result<()> {
    for PlannedLaunch { kernel, launch } in &plan.launches {
        gpu.launch(*kernel, *launch, params)?;
    }
    Ok(())
}
