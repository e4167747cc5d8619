//! The backward's launches: a checked call's plan (`backward_plan`) run with its workspace (D,
//! the f32 dQ accumulator, deterministic mode's flags, grouped heads' expanded dK and dV),
//! writing dQ, dK, dV into the run's tensors.
//!
//! Grouped K/V heads (GQA/MQA): each K/V head's dK and dV are the sums over the query heads of
//! its group. The plan then runs the main kernels compiled for grouped heads (the standard
//! backward's dK/dV kernel as it is, on the problem taken as ungrouped), which store each query
//! head's dK and dV in an expanded workspace (batch, heads_q, seqlen_k, d) in the dtype, and
//! ends with `bwd::group_sum`, which adds each group's rows in f32 into the caller's dK and dV
//! (a fixed order: deterministic). Ungrouped calls run exactly the kernels they ran before.

use cudarc::driver::CudaSlice;

use flash_kernels::common::params::{
    AttentionShape, Fa2BackwardParams, Fa2TcBackwardParams, Fa3BackwardParams, GroupSumParams,
    Operands, StandardBackwardParams, StandardParams, TensorView,
};
use flash_kernels::registry::{ElementType, Family, StandardBackwardStage};

use super::backward::Gradients;
use super::backward_plan::{BackwardAlgorithm, BackwardPlan};
use super::packed::{PackedOffsets, launch_sequences};
use super::plan::PlannedLaunch;
use super::problem::Problem;
use crate::device::tensor_map::{self, MapOperand, TENSOR_MAP_WORDS};
use crate::device::{Gpu, ParamBlock};
use crate::error::Result;

/// Where one backward call's tensors are on the device: Q, K, V, O, dO, dQ, dK, dV and L; and
/// a packed batch's sequences.
pub(crate) struct BackwardCall<'a> {
    pub operands: Operands,
    pub d_o: TensorView,
    pub gradients: Gradients<TensorView>,
    pub logsumexp: u64,
    pub packed: Option<PackedOffsets<'a>>,
}

/// Launches a backward plan on `gpu`'s stream for a checked call at `call`'s addresses: its
/// workspace (D, the dQ accumulator and deterministic mode's flags, grouped heads' expanded dK
/// and dV; freed in stream order after the kernels), the pre-pass, the main kernel, the
/// post-pass, and the group sum.
pub(crate) fn launch_backward(gpu: &Gpu, plan: &BackwardPlan, call: BackwardCall) -> Result<()> {
    // The passes, the group sum and the workspaces cover the tensors' rows: a packed batch's
    // all at once.
    let problem = &plan.problem.whole();
    // Grouped K/V heads: the main kernels store dK and dV per query head into the expanded
    // workspace, which the group sum adds into the caller's dK and dV at the end.
    // Dropped at the end of this call: freed in stream order, after the kernels that use it.
    let expanded = ExpandedGradients::alloc(gpu, plan)?;
    let stored = match &expanded {
        Some(expanded) => expanded.stored(gpu, problem, call.gradients.dq),
        None => call.gradients,
    };
    if plan.algorithm == BackwardAlgorithm::Standard {
        launch_standard_backward(gpu, plan, &call, &stored)?;
    } else {
        launch_fa2_backward(gpu, plan, &call, &stored)?;
    }
    if let (Some(expanded), Some(planned)) = (&expanded, plan.group_sum()) {
        let params = GroupSumParams {
            shape: problem.shape(),
            expanded_dk: gpu.address(&expanded.dk),
            expanded_dv: gpu.address(&expanded.dv),
            dk: call.gradients.dk,
            dv: call.gradients.dv,
        };
        gpu.launch(planned.kernel, planned.launch, params)?;
    }
    Ok(())
}

/// The expanded dK and dV of a grouped call: one head per query head, (batch·heads_q,
/// seqlen_k, head_dim) contiguous, in the dtype (bytes).
struct ExpandedGradients {
    dk: CudaSlice<u8>,
    dv: CudaSlice<u8>,
}

impl ExpandedGradients {
    /// The plan's expanded dK and dV, or none for an ungrouped call; an out-of-memory error
    /// names the buffer and the bytes.
    fn alloc(gpu: &Gpu, plan: &BackwardPlan) -> Result<Option<Self>> {
        if plan.expanded_kv_gradients == 0 {
            return Ok(None);
        }
        let bytes = plan.expanded_kv_gradients * plan.dtype.size_bytes();
        Ok(Some(Self {
            dk: gpu.alloc::<u8>(bytes, "the grouped backward's expanded dK")?,
            dv: gpu.alloc::<u8>(bytes, "the grouped backward's expanded dV")?,
        }))
    }

    /// Where the main kernels store: `dq` itself, and the expanded dK and dV as (batch,
    /// heads_q, seqlen_k, head_dim) views (strides in elements).
    fn stored(&self, gpu: &Gpu, problem: &Problem, dq: TensorView) -> Gradients<TensorView> {
        let row = problem.head_dim as u64;
        let head = problem.seqlen_k as u64 * row;
        let view = |buffer| TensorView {
            addr: gpu.address(buffer),
            batch_stride: problem.heads as u64 * head,
            head_stride: head,
            row_stride: row,
        };
        Gradients {
            dq,
            dk: view(&self.dk),
            dv: view(&self.dv),
        }
    }
}

/// FA2's three launches (pre-pass, main kernel, post-pass) with their workspace (D, the dQ
/// accumulator, deterministic mode's flags), dK and dV stored into `stored`.
fn launch_fa2_backward(
    gpu: &Gpu,
    plan: &BackwardPlan,
    call: &BackwardCall,
    stored: &Gradients<TensorView>,
) -> Result<()> {
    // Dropped at the end of this call: freed in stream order, after the kernels that use them.
    let problem = &plan.problem;
    let delta = gpu.alloc::<f32>(plan.delta, "the backward's D")?;
    let dq_accumulator = gpu.alloc::<f32>(plan.dq_accumulator, "the backward's dQ accumulator")?;
    // The flags are u32 words; +0.0 is their zero.
    let mut dq_flags = gpu.alloc::<f32>(plan.dq_flags, "the deterministic backward's flags")?;
    if plan.deterministic {
        gpu.fill(&mut dq_flags, 0.0)?;
    }
    // The passes walk the tensors' rows (a packed batch's all at once); the main kernel
    // attends, each packed sequence to its own keys.
    let params = Fa2BackwardParams {
        operands: call.operands,
        shape: problem.whole().shape(),
        d_o: call.d_o,
        dq: stored.dq,
        dk: stored.dk,
        dv: stored.dv,
        logsumexp: call.logsumexp,
        delta: gpu.address(&delta),
        dq_accumulator: gpu.address(&dq_accumulator),
    };
    // Deterministic mode's flags, or 0: the main kernels' adds in any order.
    let dq_semaphore = if plan.deterministic {
        gpu.address(&dq_flags)
    } else {
        0
    };
    let [pre, main, post, ..] = plan.launches[..] else {
        unreachable!("an FA2 backward plan starts with three launches")
    };
    let base = Fa2BackwardParams {
        shape: problem.shape(),
        ..params
    };
    gpu.launch(pre.kernel, pre.launch, params)?;
    match plan.algorithm {
        BackwardAlgorithm::Fa2 => gpu.launch(main.kernel, main.launch, base)?,
        BackwardAlgorithm::Standard => unreachable!("the standard backward launched above"),
        BackwardAlgorithm::Fa3 => {
            let main_params = Fa3BackwardParams {
                base,
                tensor_maps: fa3_tensor_maps(gpu, call, plan, params.dq_accumulator)?,
                dq_semaphore,
            };
            launch_main(gpu, plan, main, call.packed, main_params, |p| {
                (&mut p.base.shape, &mut p.dq_semaphore)
            })?
        }
        BackwardAlgorithm::Fa2Tc => {
            let main_params = Fa2TcBackwardParams { base, dq_semaphore };
            launch_main(gpu, plan, main, call.packed, main_params, |p| {
                (&mut p.base.shape, &mut p.dq_semaphore)
            })?
        }
    }
    gpu.launch(post.kernel, post.launch, params)?;
    Ok(())
}

/// The tensor-core main kernel's launch: once, or for a packed batch once per table of its
/// sequences, each launch's shape counting its own sequences and its deterministic flags
/// (`fields` reaches the shape and the flags' address) starting at its first sequence's.
fn launch_main<P: ParamBlock>(
    gpu: &Gpu,
    plan: &BackwardPlan,
    main: PlannedLaunch,
    packed: Option<PackedOffsets>,
    family: P,
    fields: impl Fn(&mut P) -> (&mut AttentionShape, &mut u64),
) -> Result<()> {
    let Some(batch) = packed else {
        return gpu.launch(main.kernel, main.launch, family);
    };
    let problem = &plan.problem;
    let flags_per_sequence = problem.heads * problem.seqlen_q.div_ceil(plan.block_rows as usize);
    launch_sequences(gpu, &[main], problem, batch, family, |p, first, n| {
        let (shape, flags) = fields(p);
        problem.shape_for_launch(shape, first, n);
        if *flags != 0 {
            *flags += (first as usize * flags_per_sequence * std::mem::size_of::<u32>()) as u64;
        }
    })
}

/// The FA3 backward's tensor maps (`device::tensor_map`) in the device ring: Q, K, V, dO, boxes
/// of 64 columns × the plan's B_r rows (Q, dO) or B_c rows (K, V), then the f32 dQ accumulator
/// at `dq_accumulator`, boxes of 32 columns × B_r rows.
fn fa3_tensor_maps(
    gpu: &Gpu,
    call: &BackwardCall,
    plan: &BackwardPlan,
    dq_accumulator: u64,
) -> Result<u64> {
    // A packed batch's maps span its whole tensors.
    let whole = plan.problem.whole();
    let (q_dims, kv_dims) = (whole.q_dims(), whole.kv_dims());
    let (rows, keys) = (plan.block_rows, plan.block_cols);
    let mut maps = tensor_map::encode_call(
        &[
            MapOperand::new("q", &call.operands.q, q_dims, rows),
            MapOperand::new("k", &call.operands.k, kv_dims, keys),
            MapOperand::new("v", &call.operands.v, kv_dims, keys),
            MapOperand::new("d_o", &call.d_o, q_dims, rows),
        ],
        ElementType::from(plan.dtype),
    )?;
    let accumulator = tensor_map::encode_accumulator(dq_accumulator, q_dims, rows)?;
    maps[4 * TENSOR_MAP_WORDS..].copy_from_slice(&accumulator);
    gpu.tensor_maps(maps)
}

/// The standard backward's launches: its workspace allocated first (S/dP/dS in f32, P in the
/// dtype, the recomputed L; an out-of-memory error names the bytes and the buffer), then the
/// standard forward's scores and softmax and the four backward kernels, in stream order, dK
/// and dV stored into `stored`.
fn launch_standard_backward(
    gpu: &Gpu,
    plan: &BackwardPlan,
    call: &BackwardCall,
    stored: &Gradients<TensorView>,
) -> Result<()> {
    // Dropped at the end of this call: freed in stream order, after the kernels that use them.
    let scores = gpu.alloc::<f32>(plan.scores, "the standard backward's S, dP and dS")?;
    let probs = gpu.alloc::<u8>(
        plan.probs * plan.dtype.size_bytes(),
        "the standard backward's P",
    )?;
    let logsumexp = gpu.alloc::<f32>(plan.delta, "the standard backward's recomputed L")?;
    let base = StandardParams {
        operands: call.operands,
        shape: plan.problem.shape(),
        scores: gpu.address(&scores),
        probs: gpu.address(&probs),
        logsumexp: gpu.address(&logsumexp),
    };
    let params = StandardBackwardParams {
        base,
        d_o: call.d_o,
        dq: stored.dq,
        dk: stored.dk,
        dv: stored.dv,
    };
    // dK and dV: the kernel reads no K or V, so for grouped heads it runs on the problem taken
    // as ungrouped, each query head storing its own rows of the expanded workspace.
    let key_value_params = StandardBackwardParams {
        base: StandardParams {
            shape: AttentionShape {
                kv_group: 1,
                ..base.shape
            },
            ..base
        },
        ..params
    };
    for planned in &plan.launches {
        match planned.kernel.family {
            Family::Standard(_) => gpu.launch(planned.kernel, planned.launch, base)?,
            Family::StandardBackward(StandardBackwardStage::KeyValueGradients) => {
                gpu.launch(planned.kernel, planned.launch, key_value_params)?
            }
            Family::StandardBackward(_) => gpu.launch(planned.kernel, planned.launch, params)?,
            // The group sum runs after, in `launch_backward`.
            _ => {}
        }
    }
    Ok(())
}
