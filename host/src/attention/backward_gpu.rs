//! The backward on the GPU: its plan (checked against the device before any runs: FA2's three
//! launches with the main kernel on tensor cores or scalar, [`BackwardAlgorithm`], with a
//! fallback's reason, deterministic or not, [`BackwardOptions`]; or the standard backward's six,
//! every N × N matrix in HBM) and
//! [`attention_backward_into`], which checks every argument with [`BackwardProblem`],
//! allocates the workspace (D, the f32 dQ accumulator, deterministic mode's flags), launches
//! the pre-pass, the main kernel and the post-pass, and writes dQ, dK, dV into the caller's
//! tensors; [`attention_backward`] allocates them.
//!
//! Grouped K/V heads (GQA/MQA): each K/V head's dK and dV are the sums over the query heads of
//! its group. The plan then runs the main kernels compiled for grouped heads (the standard
//! backward's dK/dV kernel as it is, on the problem taken as ungrouped), which store each query
//! head's dK and dV in an expanded workspace (batch, heads_q, seqlen_k, d) in the dtype, and
//! ends with `bwd::group_sum`, which adds each group's rows in f32 into the caller's dK and dV
//! (a fixed order: deterministic). Ungrouped calls run exactly the kernels they ran before.

use std::fmt;

use cudarc::driver::CudaSlice;

use flash_kernels::bwd::fa2::config as fa2_backward;
use flash_kernels::bwd::fa2_tc::config::Fa2TcBackwardTiling;
use flash_kernels::bwd::group_sum::config as group_sum;
use flash_kernels::common::params::{
    AttentionShape, Fa2BackwardParams, Fa2TcBackwardParams, GroupSumParams, Operands,
    StandardBackwardParams, StandardParams, TensorView,
};
use flash_kernels::fwd::standard::config as standard;
use flash_kernels::registry::{
    BackwardStage, ElementType, Family, KERNELS, KernelId, StandardBackwardStage,
};

use super::backward::{BackwardArguments, BackwardProblem, Gradients, TensorSpec};
use super::plan::{
    Launch, LaunchLimits, PlannedLaunch, check_shared, check_threads, kernel_names,
    misaligned_view, standard_launches, standard_product, standard_rows, standard_tiles,
    write_launches,
};
use super::problem::{AttentionOptions, MAX_HEAD_DIM, Problem};
use super::{AttentionOutput, RowStatistics};
use crate::device::Gpu;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::tensor::{DeviceTensor, Layout};

/// Which main kernel computes the backward pass (the pre- and post-pass are the same for both).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BackwardAlgorithm {
    /// FlashAttention-2's backward, scalar FP32 (`bwd::fa2`): every dtype and head dim.
    Fa2,
    /// The same on tensor cores (`bwd::fa2_tc`): f16/bf16, head dims that are multiples of 8
    /// (each on the smallest compiled capacity that holds it: 64, 96, 128, 192, 256), rows
    /// 16-byte aligned; anything else runs [`BackwardAlgorithm::Fa2`], and the plan says why.
    /// The default.
    #[default]
    Fa2Tc,
    /// The standard backward (`bwd::standard`): S and P recomputed into HBM by the standard
    /// forward's kernels, then dP, dS (HBM), dQ, dK, dV by tiled products; O(N²) workspace per
    /// head (f32 S/dP/dS and P in the input dtype), the baseline for memory and time. Every dtype
    /// and head dim; deterministic by construction (no atomic adds).
    Standard,
}

impl BackwardAlgorithm {
    pub const ALL: [BackwardAlgorithm; 3] = [
        BackwardAlgorithm::Standard,
        BackwardAlgorithm::Fa2,
        BackwardAlgorithm::Fa2Tc,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BackwardAlgorithm::Fa2 => "fa2",
            BackwardAlgorithm::Fa2Tc => "fa2-tc",
            BackwardAlgorithm::Standard => "standard",
        }
    }
}

impl fmt::Display for BackwardAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for BackwardAlgorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        BackwardAlgorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                Error::invalid("backward algorithm", s, "allowed: standard, fa2, fa2-tc")
            })
    }
}

/// What a backward call may choose beyond the forward's options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackwardOptions {
    /// The main kernel asked for (default: [`BackwardAlgorithm::Fa2Tc`], the fastest, which
    /// falls back to the scalar one where it cannot run).
    pub algorithm: BackwardAlgorithm,
    /// dQ the same bits on every run: the key blocks add to each row block's dQ in a fixed
    /// order (one flag per row block, `tile::global::RowBlockFlags`) instead of as their atomic
    /// adds land. Costs a u32 per (batch·head, row block) and the waits for the turn.
    pub deterministic: bool,
}

/// Everything one backward call runs, decided before any launch.
#[derive(Clone, Debug, PartialEq)]
pub struct BackwardPlan {
    pub problem: Problem,
    pub dtype: DType,
    /// The main kernel's family that runs (after any fallback).
    pub algorithm: BackwardAlgorithm,
    /// Why the algorithm asked for does not run, as "`fa2-tc` falls back to `fa2`: …".
    pub fallback: Option<String>,
    pub deterministic: bool,
    /// The main kernel's B_r and B_c.
    pub block_rows: u32,
    pub block_cols: u32,
    /// FA2: pre-pass, main kernel, post-pass. Standard: the standard forward's scores and
    /// softmax (S and P recomputed), then dP, dS, dQ and dK with dV. Grouped K/V heads: then
    /// the group sum.
    pub launches: Vec<PlannedLaunch>,
    /// f32 elements of the dQ accumulator, (batch·heads, seqlen_q, head_dim); 0 for standard.
    pub dq_accumulator: usize,
    /// f32 elements of D, (batch·heads, seqlen_q) (FA2); for standard, of the recomputed L.
    pub delta: usize,
    /// u32 flags of deterministic mode, (batch·heads, ⌈seqlen_q / B_r⌉); 0 otherwise.
    pub dq_flags: usize,
    /// Standard only: f32 elements of S (then dP, then dS), (batch·heads, seqlen_q, seqlen_k).
    pub scores: usize,
    /// Standard only: elements of P in the input dtype, S's shape.
    pub probs: usize,
    /// Grouped K/V heads only: elements of each of the expanded dK and dV, in the input dtype,
    /// (batch·heads_q, seqlen_k, head_dim); 0 otherwise.
    pub expanded_kv_gradients: usize,
}

/// The device views the tensor-core kernel copies from or stores pairs to, for its alignment
/// check (a plan made without tensors assumes aligned ones).
#[derive(Clone, Copy, Debug)]
pub struct BackwardViews {
    pub q: TensorView,
    pub k: TensorView,
    pub v: TensorView,
    pub d_o: TensorView,
    pub dk: TensorView,
    pub dv: TensorView,
}

impl BackwardPlan {
    /// Plans the backward of `problem` for `dtype` within `limits`: the main kernel `options`
    /// asks for where it can run (else the scalar one, with the reason), of the smallest
    /// compiled head-dim capacity that holds d, its shared memory and threads checked.
    pub fn new(
        limits: &dyn LaunchLimits,
        dtype: DType,
        problem: &Problem,
        options: &BackwardOptions,
        views: Option<&BackwardViews>,
    ) -> Result<Self> {
        if options.algorithm == BackwardAlgorithm::Standard {
            return Self::standard(limits, dtype, problem, options);
        }
        let element = ElementType::from(dtype);
        let d = problem.head_dim as u32;
        let grouped = problem.is_grouped();
        let mut fallback = None;
        let tensor_core = match options.algorithm {
            // (Standard was planned above.)
            BackwardAlgorithm::Fa2 | BackwardAlgorithm::Standard => None,
            BackwardAlgorithm::Fa2Tc => match tensor_core_main_kernel(dtype, d, grouped, views) {
                Ok(kernel) => Some(kernel),
                Err(reason) => {
                    fallback = Some(format!(
                        "{} falls back to {}: {reason}",
                        BackwardAlgorithm::Fa2Tc,
                        BackwardAlgorithm::Fa2
                    ));
                    None
                }
            },
        };
        let (algorithm, main, block_rows, block_cols, threads, shared_bytes, tiling) =
            match tensor_core {
                Some(kernel) => {
                    let capacity = kernel.head_dim_capacity().expect("a capacity");
                    let tiling = Fa2TcBackwardTiling::for_capacity(capacity);
                    let name = format!("fa2-tc backward {tiling} (capacity {capacity})");
                    (
                        BackwardAlgorithm::Fa2Tc,
                        kernel,
                        tiling.block_rows,
                        tiling.block_cols(),
                        tiling.threads(),
                        tiling.shared_bytes(capacity),
                        name,
                    )
                }
                None => {
                    let kernel = main_kernel(element, d, grouped).ok_or_else(|| {
                        Error::invalid("head_dim", d, format!("allowed: 1 to {MAX_HEAD_DIM}"))
                    })?;
                    let capacity = kernel.head_dim_capacity().expect("a capacity");
                    let block_rows = fa2_backward::block_rows(capacity);
                    let block_cols = fa2_backward::BLOCK_COLS;
                    (
                        BackwardAlgorithm::Fa2,
                        kernel,
                        block_rows,
                        block_cols,
                        fa2_backward::main_threads(),
                        fa2_backward::shared_bytes(block_rows, d) as u32,
                        format!("fa2-backward B_r = {block_rows}, B_c = {block_cols}"),
                    )
                }
            };
        if options.deterministic && algorithm != BackwardAlgorithm::Fa2Tc {
            return Err(Error::invalid(
                "deterministic",
                true,
                format!(
                    "only the tensor-core backward (fa2-tc: f16/bf16, head dims that are \
                     multiples of 8, 16-byte-aligned rows) orders dQ's adds, and the standard \
                     backward has none{}",
                    fallback
                        .as_ref()
                        .map(|f| format!("; here {f}"))
                        .unwrap_or_default()
                ),
            ));
        }
        check_shared(limits, shared_bytes, "head_dim", tiling, problem.head_dim)?;
        check_threads(limits, main, threads, "head_dim")?;
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
                threads,
                shared_bytes,
            },
        };
        let row_blocks = problem.seqlen_q.div_ceil(block_rows as usize);
        let mut launches = vec![pre, main, post];
        launches.extend(group_sum_launch(limits, element, problem)?);
        Ok(Self {
            problem: *problem,
            dtype,
            algorithm,
            fallback,
            deterministic: options.deterministic,
            block_rows,
            block_cols,
            launches,
            dq_accumulator: problem.rows() * problem.head_dim,
            delta: problem.rows(),
            dq_flags: if options.deterministic {
                problem.batch_heads() * row_blocks
            } else {
                0
            },
            scores: 0,
            probs: 0,
            expanded_kv_gradients: expanded_kv_gradients(problem),
        })
    }

    /// The standard backward's plan: the standard forward's scores and softmax kernels (S and P
    /// recomputed into HBM), then dP = dO·Vᵀ over (key tiles, query tiles, heads), dS one warp
    /// per query row, dQ over (head-dim tiles, query tiles, heads), dK and dV over (head-dim
    /// tiles, key tiles, heads); the workspace S (f32) and P (dtype), each batch·heads·N_q·N_k.
    fn standard(
        limits: &dyn LaunchLimits,
        dtype: DType,
        problem: &Problem,
        options: &BackwardOptions,
    ) -> Result<Self> {
        let element = ElementType::from(dtype);
        let heads = problem.batch_heads() as u32;
        let (q_tiles, k_tiles, d_tiles) = (
            standard_tiles(problem.seqlen_q),
            standard_tiles(problem.seqlen_k),
            standard_tiles(problem.head_dim),
        );
        let own = [
            (
                StandardBackwardStage::ProbsGradient,
                standard_product((k_tiles, q_tiles, heads)),
            ),
            (
                StandardBackwardStage::ScoresGradient,
                standard_rows(problem),
            ),
            (
                StandardBackwardStage::QueryGradient,
                standard_product((d_tiles, q_tiles, heads)),
            ),
            (
                StandardBackwardStage::KeyValueGradients,
                standard_product((d_tiles, k_tiles, heads)),
            ),
        ];
        // The forward's scores and softmax recompute S and P (its third kernel, O = P·V, is not
        // needed: O is the forward's).
        let mut launches = standard_launches(problem, element);
        launches.truncate(2);
        launches.extend(own.into_iter().map(|(stage, launch)| PlannedLaunch {
            kernel: KernelId::new(Family::StandardBackward(stage), element),
            launch,
        }));
        for planned in &launches {
            check_threads(limits, planned.kernel, planned.launch.threads, "head_dim")?;
            check_shared(
                limits,
                planned.launch.shared_bytes,
                "head_dim",
                planned.kernel,
                problem.head_dim,
            )?;
        }
        launches.extend(group_sum_launch(limits, element, problem)?);
        let matrix = problem.batch_heads() * problem.seqlen_q * problem.seqlen_k;
        Ok(Self {
            problem: *problem,
            dtype,
            algorithm: BackwardAlgorithm::Standard,
            fallback: None,
            deterministic: options.deterministic,
            block_rows: standard::MATMUL_TILE,
            block_cols: standard::MATMUL_TILE,
            launches,
            dq_accumulator: 0,
            delta: problem.rows(),
            dq_flags: 0,
            scores: matrix,
            probs: matrix,
            expanded_kv_gradients: expanded_kv_gradients(problem),
        })
    }

    /// Bytes of device memory the call allocates beside its tensors (D or L, the dQ
    /// accumulator, the flags; for standard S/dP/dS and P; for grouped K/V heads the expanded
    /// dK and dV).
    pub fn workspace_bytes(&self) -> usize {
        4 * (self.delta + self.dq_accumulator + self.dq_flags + self.scores)
            + (self.probs + 2 * self.expanded_kv_gradients) * self.dtype.size_bytes()
    }

    /// The group sum's launch, for grouped K/V heads (the last launch).
    fn group_sum(&self) -> Option<PlannedLaunch> {
        self.launches
            .last()
            .filter(|planned| planned.kernel.family == Family::GroupSum)
            .copied()
    }

    /// Every kernel's name, in launch order, joined by `+`.
    pub fn kernel_names(&self) -> String {
        kernel_names(&self.launches)
    }
}

impl fmt::Display for BackwardPlan {
    /// One line: algorithm, kernels, grids, threads, shared memory, B_r × B_c, the mode, and a
    /// fallback's reason.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} backward:", self.algorithm)?;
        write_launches(f, &self.launches)?;
        write!(f, " (B_r = {}, B_c = {}", self.block_rows, self.block_cols)?;
        if self.deterministic {
            write!(f, ", deterministic: {} row-block flags", self.dq_flags)?;
        }
        if self.problem.is_grouped() {
            write!(
                f,
                ", grouped: dK, dV summed over {} query heads per K/V head",
                self.problem.kv_group()
            )?;
        }
        write!(f, ", workspace {} bytes)", self.workspace_bytes())?;
        if let Some(fallback) = &self.fallback {
            write!(f, "; {fallback}")?;
        }
        Ok(())
    }
}

/// The compiled scalar main kernel for `element` at head dim `d` (for grouped K/V heads or not):
/// the smallest capacity that holds d.
fn main_kernel(element: ElementType, d: u32, grouped: bool) -> Option<KernelId> {
    smallest_capacity(
        element,
        d,
        |family| matches!(family, Family::Fa2Backward(BackwardStage::Main { grouped: g, .. }) if g == grouped),
    )
}

/// Elements of each of the expanded dK and dV of a grouped problem, (batch·heads_q, seqlen_k,
/// head_dim); 0 when ungrouped.
fn expanded_kv_gradients(problem: &Problem) -> usize {
    if problem.is_grouped() {
        problem.batch_heads() * problem.seqlen_k * problem.head_dim
    } else {
        0
    }
}

/// The group sum's launch for a grouped problem (none when ungrouped): grid (⌈seqlen_k /
/// ROWS⌉, batch·heads_kv, dK and dV), its threads checked.
fn group_sum_launch(
    limits: &dyn LaunchLimits,
    element: ElementType,
    problem: &Problem,
) -> Result<Option<PlannedLaunch>> {
    if !problem.is_grouped() {
        return Ok(None);
    }
    let planned = PlannedLaunch {
        kernel: KernelId::new(Family::GroupSum, element),
        launch: Launch {
            grid: (
                problem.seqlen_k.div_ceil(group_sum::ROWS as usize) as u32,
                (problem.batch * problem.heads_kv) as u32,
                group_sum::GRADIENTS,
            ),
            threads: group_sum::THREADS,
            shared_bytes: 0,
        },
    };
    check_threads(limits, planned.kernel, planned.launch.threads, "head_dim")?;
    Ok(Some(planned))
}

/// The compiled kernel of `element` whose family passes `is_family`, of the smallest head-dim
/// capacity that holds d.
fn smallest_capacity(
    element: ElementType,
    d: u32,
    is_family: impl Fn(Family) -> bool,
) -> Option<KernelId> {
    KERNELS
        .iter()
        .filter(|k| k.dtype == element && is_family(k.family))
        .filter(|k| k.head_dim_capacity().is_some_and(|capacity| capacity >= d))
        .min_by_key(|k| k.head_dim_capacity())
        .copied()
}

/// The tensor-core main kernel for this call (for grouped K/V heads or not), or why there is
/// none: f32, a head dim that is not a multiple of 8 (rows are copied in 16-byte chunks), or a
/// tensor whose rows are not 16-byte aligned (grouped, the kernel stores into the expanded
/// workspace, not into dK and dV, which the group sum writes element by element).
fn tensor_core_main_kernel(
    dtype: DType,
    d: u32,
    grouped: bool,
    views: Option<&BackwardViews>,
) -> std::result::Result<KernelId, String> {
    if dtype == DType::F32 {
        return Err("f32 has no tensor-core kernel (f16 and bf16 do)".into());
    }
    if !d.is_multiple_of(8) {
        return Err(format!(
            "head_dim {d} is not a multiple of 8 (the tensor-core kernel copies rows in 16-byte \
             chunks)"
        ));
    }
    if let Some(v) = views {
        let views = [
            ("q", &v.q),
            ("k", &v.k),
            ("v", &v.v),
            ("d_o", &v.d_o),
            ("dk", &v.dk),
            ("dv", &v.dv),
        ];
        // Grouped, the kernel stores into the expanded workspace: dK and dV are the group sum's.
        let copied_or_stored = if grouped { &views[..4] } else { &views[..] };
        if let Some(reason) = misaligned_view(copied_or_stored) {
            return Err(reason);
        }
    }
    smallest_capacity(
        ElementType::from(dtype),
        d,
        |family| matches!(family, Family::Fa2TcBackward { grouped: g, .. } if g == grouped),
    )
    .ok_or_else(|| format!("head_dim {d} is past the tensor-core kernels' largest capacity"))
}

/// [`attention_backward_into`] into new gradient tensors in `layout`; returns them and the plan.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<T: Element>(
    gpu: &Gpu,
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    v: &DeviceTensor<T>,
    forward: &AttentionOutput<T>,
    d_o: &DeviceTensor<T>,
    options: &AttentionOptions,
    backward: &BackwardOptions,
    layout: Layout,
) -> Result<(Gradients<DeviceTensor<T>>, BackwardPlan)> {
    // The shapes are checked (again, with the rest) by the call below; these only size buffers.
    let problem = Problem::new(q.dims(), k.dims(), v.dims(), options)?;
    let q_dims = [
        problem.batch,
        problem.heads,
        problem.seqlen_q,
        problem.head_dim,
    ];
    let kv_dims = problem.kv_dims();
    let zeros = |dims| DeviceTensor::filled(gpu, dims, layout, T::from_f64(0.0));
    let mut gradients = Gradients {
        dq: zeros(q_dims)?,
        dk: zeros(kv_dims)?,
        dv: zeros(kv_dims)?,
    };
    let plan = attention_backward_into(
        gpu,
        q,
        k,
        v,
        forward,
        d_o,
        &mut gradients,
        options,
        backward,
    )?;
    Ok((gradients, plan))
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
    backward: &BackwardOptions,
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
    let call = BackwardCall {
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
    launch_backward(gpu, &checked, call, backward)
}

/// Where one backward call's tensors are on the device: Q, K, V, O, dO, dQ, dK, dV and L.
pub(super) struct BackwardCall {
    pub operands: Operands,
    pub d_o: TensorView,
    pub gradients: Gradients<TensorView>,
    pub logsumexp: u64,
}

/// Plans a checked backward problem against the device (`backward`'s algorithm and mode, the
/// tensor-core kernel's alignment checked on `call`'s views), allocates its workspace (D, the dQ
/// accumulator and deterministic mode's flags, freed in stream order after the kernels) and
/// launches the pre-pass, the main kernel and the post-pass on `gpu`'s stream. Shared by
/// [`attention_backward_into`] and the call on borrowed memory (`borrowed_backward`).
pub(super) fn launch_backward(
    gpu: &Gpu,
    checked: &BackwardProblem,
    call: BackwardCall,
    backward: &BackwardOptions,
) -> Result<BackwardPlan> {
    let views = BackwardViews {
        q: call.operands.q,
        k: call.operands.k,
        v: call.operands.v,
        d_o: call.d_o,
        dk: call.gradients.dk,
        dv: call.gradients.dv,
    };
    let plan = BackwardPlan::new(gpu, checked.dtype, &checked.problem, backward, Some(&views))?;
    // Grouped K/V heads: the main kernels store dK and dV per query head into the expanded
    // workspace, which the group sum adds into the caller's dK and dV at the end.
    // Dropped at the end of this call: freed in stream order, after the kernels that use it.
    let expanded = ExpandedGradients::alloc(gpu, &plan)?;
    let stored = match &expanded {
        Some(expanded) => expanded.stored(gpu, &checked.problem, call.gradients.dq),
        None => call.gradients.clone(),
    };
    if plan.algorithm == BackwardAlgorithm::Standard {
        launch_standard_backward(gpu, checked, &call, &stored, &plan)?;
    } else {
        launch_fa2_backward(gpu, checked, &call, &stored, &plan)?;
    }
    if let (Some(expanded), Some(planned)) = (&expanded, plan.group_sum()) {
        let params = GroupSumParams {
            shape: checked.problem.shape(),
            expanded_dk: gpu.address(&expanded.dk),
            expanded_dv: gpu.address(&expanded.dv),
            dk: call.gradients.dk,
            dv: call.gradients.dv,
        };
        gpu.launch(planned.kernel, planned.launch, params)?;
    }
    Ok(plan)
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
    checked: &BackwardProblem,
    call: &BackwardCall,
    stored: &Gradients<TensorView>,
    plan: &BackwardPlan,
) -> Result<()> {
    // Dropped at the end of this call: freed in stream order, after the kernels that use them.
    let delta = gpu.alloc::<f32>(plan.delta, "the backward's D")?;
    let dq_accumulator = gpu.alloc::<f32>(plan.dq_accumulator, "the backward's dQ accumulator")?;
    // The flags are u32 words; +0.0 is their zero.
    let mut dq_flags = gpu.alloc::<f32>(plan.dq_flags, "the deterministic backward's flags")?;
    if plan.deterministic {
        gpu.fill(&mut dq_flags, 0.0)?;
    }
    let params = Fa2BackwardParams {
        operands: call.operands,
        shape: checked.problem.shape(),
        d_o: call.d_o,
        dq: stored.dq,
        dk: stored.dk,
        dv: stored.dv,
        logsumexp: call.logsumexp,
        delta: gpu.address(&delta),
        dq_accumulator: gpu.address(&dq_accumulator),
    };
    let [pre, main, post, ..] = plan.launches[..] else {
        unreachable!("an FA2 backward plan starts with three launches")
    };
    gpu.launch(pre.kernel, pre.launch, params)?;
    match plan.algorithm {
        BackwardAlgorithm::Fa2 => gpu.launch(main.kernel, main.launch, params)?,
        BackwardAlgorithm::Standard => unreachable!("the standard backward launched above"),
        BackwardAlgorithm::Fa2Tc => {
            let main_params = Fa2TcBackwardParams {
                base: params,
                dq_semaphore: if plan.deterministic {
                    gpu.address(&dq_flags)
                } else {
                    0
                },
            };
            gpu.launch(main.kernel, main.launch, main_params)?
        }
    }
    gpu.launch(post.kernel, post.launch, params)?;
    Ok(())
}

/// The standard backward's launches: its workspace allocated first (S/dP/dS in f32, P in the
/// dtype, the recomputed L; an out-of-memory error names the bytes and the buffer), then the
/// standard forward's scores and softmax and the four backward kernels, in stream order, dK
/// and dV stored into `stored`.
fn launch_standard_backward(
    gpu: &Gpu,
    checked: &BackwardProblem,
    call: &BackwardCall,
    stored: &Gradients<TensorView>,
    plan: &BackwardPlan,
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
        shape: checked.problem.shape(),
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
