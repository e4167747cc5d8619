//! The FA2 backward on the GPU: its plan (three launches, checked against the device before
//! any runs) and [`attention_backward_into`], which checks every argument with
//! [`BackwardProblem`], allocates the workspace (D and the f32 dQ accumulator), launches the
//! pre-pass, the main kernel and the post-pass, and writes dQ, dK, dV into the caller's tensors.

use flash_kernels::bwd::fa2::config as fa2_backward;
use flash_kernels::common::params::{Fa2BackwardParams, Operands, TensorView};
use flash_kernels::registry::{BackwardStage, ElementType, Family, KERNELS, KernelId};

use super::backward::{BackwardArguments, BackwardProblem, Gradients, TensorSpec};
use super::plan::{
    Launch, LaunchLimits, PlannedLaunch, check_shared, check_threads, write_launches,
};
use super::problem::{AttentionOptions, MAX_HEAD_DIM, Problem};
use super::{AttentionOutput, RowStatistics};
use crate::device::Gpu;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::tensor::DeviceTensor;

/// Everything one backward call runs, decided before any launch.
#[derive(Clone, Debug, PartialEq)]
pub struct BackwardPlan {
    pub problem: Problem,
    pub dtype: DType,
    /// The main kernel's B_r and B_c.
    pub block_rows: u32,
    pub block_cols: u32,
    /// Pre-pass, main kernel, post-pass.
    pub launches: [PlannedLaunch; 3],
    /// f32 elements of the dQ accumulator, (batch·heads, seqlen_q, head_dim).
    pub dq_accumulator: usize,
    /// f32 elements of D, (batch·heads, seqlen_q).
    pub delta: usize,
}

impl BackwardPlan {
    /// Plans the backward of `problem` for `dtype` within `limits`: the main kernel of the
    /// smallest compiled head-dim capacity that holds d, its shared memory and threads checked.
    pub fn new(limits: &dyn LaunchLimits, dtype: DType, problem: &Problem) -> Result<Self> {
        let element = ElementType::from(dtype);
        let d = problem.head_dim as u32;
        let main = main_kernel(element, d).ok_or_else(|| {
            Error::invalid("head_dim", d, format!("allowed: 1 to {MAX_HEAD_DIM}"))
        })?;
        let capacity = main
            .head_dim_capacity()
            .expect("a main kernel has a capacity");
        let block_rows = fa2_backward::block_rows(capacity);
        let block_cols = fa2_backward::BLOCK_COLS;
        let shared_bytes = fa2_backward::shared_bytes(block_rows, d) as u32;
        let tiling = format!("fa2-backward B_r = {block_rows}, B_c = {block_cols}");
        check_shared(limits, shared_bytes, "head_dim", tiling, problem.head_dim)?;
        check_threads(limits, main, fa2_backward::main_threads(), "head_dim")?;
        let heads = problem.batch_heads() as u32;
        let pass = |stage| {
            let kernel = KernelId::new(Family::Fa2Backward(stage), element);
            let row_blocks = problem.seqlen_q.div_ceil(fa2_backward::PASS_ROWS as usize) as u32;
            PlannedLaunch {
                kernel,
                launch: Launch {
                    grid: (row_blocks, heads, 1),
                    threads: fa2_backward::PASS_THREADS,
                    shared_bytes: 0,
                },
            }
        };
        let (pre, post) = (
            pass(BackwardStage::Preprocess),
            pass(BackwardStage::Postprocess),
        );
        for planned in [pre, post] {
            check_threads(limits, planned.kernel, planned.launch.threads, "head_dim")?;
        }
        let key_blocks = problem.seqlen_k.div_ceil(block_cols as usize) as u32;
        let main = PlannedLaunch {
            kernel: main,
            launch: Launch {
                grid: (key_blocks, heads, 1),
                threads: fa2_backward::main_threads(),
                shared_bytes,
            },
        };
        Ok(Self {
            problem: *problem,
            dtype,
            block_rows,
            block_cols,
            launches: [pre, main, post],
            dq_accumulator: problem.rows() * problem.head_dim,
            delta: problem.rows(),
        })
    }
}

impl std::fmt::Display for BackwardPlan {
    /// One line, as [`Plan`](super::Plan)'s: each launch's kernel, grid, threads and shared memory,
    /// then the main kernel's blocks.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fa2-backward:")?;
        write_launches(f, &self.launches)?;
        write!(f, " (B_r = {}, B_c = {})", self.block_rows, self.block_cols)
    }
}

/// The compiled main kernel for `element` at head dim `d`: the smallest capacity that holds d.
fn main_kernel(element: ElementType, d: u32) -> Option<KernelId> {
    KERNELS
        .iter()
        .filter(|k| k.dtype == element)
        .filter(|k| matches!(k.family, Family::Fa2Backward(BackwardStage::Main { .. })))
        .filter(|k| k.head_dim_capacity().is_some_and(|capacity| capacity >= d))
        .min_by_key(|k| k.head_dim_capacity())
        .copied()
}

/// The FA2 backward on the GPU: dQ, dK, dV of softmax(scale·Q·Kᵀ \[causal\])·V given dO, written
/// into `gradients` (dQ Q's shape, dK and dV K's, each any strides with a contiguous head dim).
///
/// `forward` is the forward's output for these Q, K, V and `options` (its O and L; a plan it
/// carries must be this problem's): L = m + log ℓ, as FA2, FA2-TC, FA3 and standard attention
/// return it (FA1's m and ℓ are refused). Checks every argument before any launch; returns the
/// plan. The workspace (D and the dQ accumulator) is allocated for this call and freed in stream
/// order after its kernels.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_into<T: Element>(
    gpu: &Gpu,
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    v: &DeviceTensor<T>,
    forward: &AttentionOutput<T>,
    d_o: &DeviceTensor<T>,
    gradients: &mut Gradients<DeviceTensor<T>>,
    options: &AttentionOptions,
) -> Result<BackwardPlan> {
    let RowStatistics::LogSumExp(logsumexp) = &forward.stats else {
        return Err(Error::invalid(
            "forward.stats",
            "FA1's m and ℓ",
            "L = m + log ℓ (run the forward with fa2, fa2-tc, fa3 or standard)",
        ));
    };
    let problem = Problem::new(q.dims(), k.dims(), v.dims(), options)?;
    let arguments = BackwardArguments {
        q: TensorSpec::of_device(q),
        k: TensorSpec::of_device(k),
        v: TensorSpec::of_device(v),
        o: TensorSpec::of_device(&forward.o),
        d_o: TensorSpec::of_device(d_o),
        logsumexp: if logsumexp.len() == problem.rows() {
            [problem.batch, problem.heads, problem.seqlen_q]
        } else {
            [logsumexp.len(), 1, 1]
        },
        forward: forward.plan.as_ref().map(|plan| plan.problem),
    };
    let checked = BackwardProblem::new(&arguments, options)?;
    checked.check_gradients(&Gradients {
        dq: TensorSpec::of_device(&gradients.dq),
        dk: TensorSpec::of_device(&gradients.dk),
        dv: TensorSpec::of_device(&gradients.dv),
    })?;
    let views = BackwardViews {
        operands: Operands {
            q: q.view(gpu),
            k: k.view(gpu),
            v: v.view(gpu),
            o: forward.o.view(gpu),
        },
        d_o: d_o.view(gpu),
        gradients: Gradients {
            dq: gradients.dq.view(gpu),
            dk: gradients.dk.view(gpu),
            dv: gradients.dv.view(gpu),
        },
        logsumexp: gpu.address(logsumexp),
    };
    launch_backward(gpu, &checked, views)
}

/// Where one backward call's tensors are on the device: Q, K, V, O, dO, dQ, dK, dV and L.
pub(super) struct BackwardViews {
    pub operands: Operands,
    pub d_o: TensorView,
    pub gradients: Gradients<TensorView>,
    pub logsumexp: u64,
}

/// Plans a checked backward problem against the device, allocates its workspace (D and the dQ
/// accumulator, freed in stream order after the kernels) and launches the pre-pass, the main
/// kernel and the post-pass on `gpu`'s stream. Shared by [`attention_backward_into`] and the
/// call on borrowed memory (`borrowed_backward`).
pub(super) fn launch_backward(
    gpu: &Gpu,
    checked: &BackwardProblem,
    views: BackwardViews,
) -> Result<BackwardPlan> {
    let plan = BackwardPlan::new(gpu, checked.dtype, &checked.problem)?;
    let delta = gpu.alloc::<f32>(plan.delta, "the backward's D")?;
    let dq_accumulator = gpu.alloc::<f32>(plan.dq_accumulator, "the backward's dQ accumulator")?;
    let params = Fa2BackwardParams {
        operands: views.operands,
        shape: checked.problem.shape(),
        d_o: views.d_o,
        dq: views.gradients.dq,
        dk: views.gradients.dk,
        dv: views.gradients.dv,
        logsumexp: views.logsumexp,
        delta: gpu.address(&delta),
        dq_accumulator: gpu.address(&dq_accumulator),
    };
    for PlannedLaunch { kernel, launch } in &plan.launches {
        gpu.launch(*kernel, *launch, params)?;
    }
    Ok(plan)
}
