//! The backward pass's plan, decided and checked against the device before anything runs:
//! FA2's three launches with the main kernel on tensor cores or scalar ([`BackwardAlgorithm`],
//! with a fallback's reason), deterministic or not ([`BackwardOptions`]), or the standard
//! backward's six (every N × N matrix in HBM); for grouped K/V heads (GQA/MQA) the main kernels
//! compiled for them and `bwd::group_sum` after them, with the expanded dK, dV workspace
//! (`backward_kernels` says which main kernel can run, `backward_gpu` has the calls and
//! launches).

use std::fmt;

use flash_kernels::bwd::fa2::config as fa2_backward;
use flash_kernels::bwd::fa2_tc::config::Fa2TcBackwardTiling;
use flash_kernels::bwd::fa3::config::Fa3BackwardTiling;
use flash_kernels::bwd::group_sum::config as group_sum;
use flash_kernels::common::params::{MAX_SEQUENCES_PER_LAUNCH, TensorView};
use flash_kernels::fwd::standard::config as standard;
use flash_kernels::registry::{
    BackwardStage, ElementType, Family, KernelId, StandardBackwardStage,
};

use super::backward_kernels::{
    fa3_main_kernel, main_kernel, tensor_core_main_kernel, wide_passes_refused,
};
use super::plan::{
    Launch, LaunchLimits, PlannedLaunch, check_shared, check_threads, kernel_names,
    standard_launches, standard_product, standard_rows, standard_tiles, write_launches,
};
use super::problem::{MAX_HEAD_DIM, Problem};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Which main kernel computes the backward pass (the FA2 family's share the pre- and post-pass,
/// wide or element-wise: [`BackwardPlan::element_wise_passes`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BackwardAlgorithm {
    /// FlashAttention-2's backward, scalar FP32 (`bwd::fa2`): every dtype and head dim.
    Fa2,
    /// The same on tensor cores (`bwd::fa2_tc`): f16/bf16, head dims that are multiples of 8
    /// (each on the smallest compiled capacity that holds it: 64, 128, 192, 256), rows
    /// 16-byte aligned; anything else runs [`BackwardAlgorithm::Fa2`], and the plan says why.
    Fa2Tc,
    /// FlashAttention-3's backward on Hopper (`bwd::fa3`): the same pre- and post-pass around a
    /// main kernel on wgmma and TMA. Compute capability 9.0, f16/bf16, head dims that are
    /// multiples of 8 up to 128 (each on the smallest compiled one: 64, 96, 128), rows 16-byte
    /// aligned, deterministic or not; anything else runs [`BackwardAlgorithm::Fa2Tc`] (or what
    /// that falls back to), and the plan says why. The default: its second version measured
    /// 223–307 TFLOP/s against fa2-tc's 156–197 and PyTorch flash's 198–301 (call 23, docs/perf).
    #[default]
    Fa3,
    /// The standard backward (`bwd::standard`): S and P recomputed into HBM by the standard
    /// forward's kernels, then dP, dS (HBM), dQ, dK, dV by tiled products; O(N²) workspace per
    /// head (f32 S/dP/dS and P in the input dtype), the baseline for memory and time. Every dtype
    /// and head dim; deterministic by construction (no atomic adds).
    Standard,
}

impl BackwardAlgorithm {
    pub const ALL: [BackwardAlgorithm; 4] = [
        BackwardAlgorithm::Standard,
        BackwardAlgorithm::Fa2,
        BackwardAlgorithm::Fa2Tc,
        BackwardAlgorithm::Fa3,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BackwardAlgorithm::Fa2 => "fa2",
            BackwardAlgorithm::Fa2Tc => "fa2-tc",
            BackwardAlgorithm::Fa3 => "fa3",
            BackwardAlgorithm::Standard => "standard",
        }
    }
}

impl From<BackwardAlgorithm> for super::problem::Algorithm {
    fn from(algorithm: BackwardAlgorithm) -> Self {
        use super::problem::Algorithm;
        match algorithm {
            BackwardAlgorithm::Fa2 => Algorithm::Fa2,
            BackwardAlgorithm::Fa2Tc => Algorithm::Fa2Tc,
            BackwardAlgorithm::Fa3 => Algorithm::Fa3,
            BackwardAlgorithm::Standard => Algorithm::Standard,
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
                Error::invalid(
                    "backward algorithm",
                    s,
                    "allowed: standard, fa2, fa2-tc, fa3",
                )
            })
    }
}

/// What a backward call may choose beyond the forward's options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackwardOptions {
    /// The main kernel asked for (default: [`BackwardAlgorithm::Fa3`], which falls back to
    /// fa2-tc, and that to the scalar one, where it cannot run).
    pub algorithm: BackwardAlgorithm,
    /// dQ the same bits on every run: the key blocks add to each row block's dQ in a fixed
    /// order (one flag per row block, `tile::global::RowBlockFlags`) instead of as their adds
    /// land. Costs a u32 per (batch·head, row block) and the waits for the turn. fa3 and fa2-tc
    /// take it; the scalar backwards refuse it.
    pub deterministic: bool,
}

/// Everything one backward call runs, decided before any launch.
#[derive(Clone, Debug, PartialEq)]
pub struct BackwardPlan {
    pub problem: Problem,
    pub dtype: DType,
    /// The main kernel's family that runs (after any fallback).
    pub algorithm: BackwardAlgorithm,
    /// Why the algorithm asked for does not run, as "`fa2-tc` falls back to `fa2`: …" (with
    /// fa3 asked for, each step of the chain, joined by "; ").
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
    /// FA2 family: why the element-wise pre- and post-pass run instead of the wide ones (16-byte
    /// loads and stores; f32, a head dim that is not a multiple of 8, or O, dO or dQ rows that
    /// are not 16-byte aligned); `None` where the wide ones run, and for standard.
    pub element_wise_passes: Option<String>,
}

/// The device views the tensor-core kernel copies from or stores pairs to, and the wide pre-
/// and post-pass read (O, dO) and write (dQ) 16 bytes at a time, for their alignment checks (a
/// plan made without tensors assumes aligned ones).
#[derive(Clone, Copy, Debug)]
pub struct BackwardViews {
    pub q: TensorView,
    pub k: TensorView,
    pub v: TensorView,
    pub o: TensorView,
    pub d_o: TensorView,
    pub dq: TensorView,
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
            if problem.is_packed() {
                return Err(packed_refused("the standard backward was asked for"));
            }
            if let Some((name, value)) = problem.local_option() {
                // Its dS kernel has no soft-cap slope, and its window and ALiBi were never
                // checked.
                return Err(Error::invalid(
                    name,
                    value,
                    "the standard backward takes no window, soft-capping, ALiBi or dropout; fa3 \
                     and fa2-tc do (f16/bf16, head dims that are multiples of 8 up to 256)",
                ));
            }
            return Self::standard(limits, dtype, problem, options);
        }
        let element = ElementType::from(dtype);
        let d = problem.head_dim as u32;
        let grouped = problem.is_grouped();
        // A packed batch, a window or soft-capping runs the tensor-core kernels' form for them.
        let form = problem.kernel_form();
        // The chain fa3 → fa2-tc → fa2, from the algorithm asked for, each step with its reason.
        // (Standard was planned above.)
        let mut fallbacks = Vec::new();
        let mut asked = options.algorithm;
        let mut hopper = None;
        if asked == BackwardAlgorithm::Fa3 {
            let kernel = fa3_main_kernel(limits, dtype, d, grouped, form, options, views);
            match kernel {
                Ok(kernel) => hopper = Some(kernel),
                Err(reason) => {
                    fallbacks.push(format!(
                        "{} falls back to {}: {reason}",
                        BackwardAlgorithm::Fa3,
                        BackwardAlgorithm::Fa2Tc
                    ));
                    asked = BackwardAlgorithm::Fa2Tc;
                }
            }
        }
        let mut tensor_core = None;
        if asked == BackwardAlgorithm::Fa2Tc {
            match tensor_core_main_kernel(dtype, d, grouped, form, views) {
                Ok(kernel) => tensor_core = Some(kernel),
                Err(reason) => fallbacks.push(format!(
                    "{} falls back to {}: {reason}",
                    BackwardAlgorithm::Fa2Tc,
                    BackwardAlgorithm::Fa2
                )),
            }
        }
        let fallback = (!fallbacks.is_empty()).then(|| fallbacks.join("; "));
        let (algorithm, main, block_rows, block_cols, threads, shared_bytes, tiling) = match (
            hopper,
            tensor_core,
        ) {
            (Some(kernel), _) => {
                let head_dim = kernel.head_dim_capacity().expect("a head dim");
                let tiling = Fa3BackwardTiling::for_head_dim(head_dim);
                let name = format!("fa3 backward {tiling} (head dim {head_dim})");
                (
                    BackwardAlgorithm::Fa3,
                    kernel,
                    tiling.block_rows(),
                    tiling.block_cols(),
                    tiling.threads(),
                    tiling.shared_bytes(head_dim),
                    name,
                )
            }
            (None, Some(kernel)) => {
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
            (None, None) => {
                if problem.is_packed() {
                    return Err(packed_refused(
                        fallback
                            .as_deref()
                            .unwrap_or("the scalar fa2 was asked for"),
                    ));
                }
                if let Some((name, value)) = problem.local_option() {
                    return Err(Error::invalid(
                        name,
                        value,
                        format!(
                            "the backward with a window, soft-capping, ALiBi or dropout runs on the \
                                 tensor-core kernels only (fa3, fa2-tc: f16/bf16, head dims that \
                                 are multiples of 8 up to 256, 16-byte-aligned rows); here {}",
                            fallback
                                .as_deref()
                                .unwrap_or("the scalar fa2 was asked for")
                        ),
                    ));
                }
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
        let orders_dq_adds = matches!(algorithm, BackwardAlgorithm::Fa2Tc | BackwardAlgorithm::Fa3);
        if options.deterministic && !orders_dq_adds {
            return Err(Error::invalid(
                "deterministic",
                true,
                format!(
                    "only the tensor-core backwards (fa3 and fa2-tc: f16/bf16, head dims that \
                     are multiples of 8, 16-byte-aligned rows) order dQ's adds, and the \
                     standard backward has none{}",
                    fallback
                        .as_ref()
                        .map(|f| format!("; here {f}"))
                        .unwrap_or_default()
                ),
            ));
        }
        check_shared(limits, shared_bytes, "head_dim", tiling, problem.head_dim)?;
        check_threads(limits, main, threads, "head_dim")?;
        // The passes walk the tensors' rows: a packed batch's all at once.
        let whole = problem.whole();
        // The pre- and post-pass: wide (16-byte loads and stores) where the dtype, head dim and
        // views allow, else element-wise, with the reason.
        let element_wise_passes = wide_passes_refused(dtype, d, views).err();
        let (stages, pass_rows) = match element_wise_passes {
            None => (
                [
                    BackwardStage::PreprocessWide,
                    BackwardStage::PostprocessWide,
                ],
                fa2_backward::wide_pass_rows(d),
            ),
            Some(_) => (
                [BackwardStage::Preprocess, BackwardStage::Postprocess],
                fa2_backward::PASS_ROWS,
            ),
        };
        let [pre, post] = stages.map(|stage| PlannedLaunch {
            kernel: KernelId::new(Family::Fa2Backward(stage), element),
            launch: Launch {
                grid: (
                    whole.seqlen_q.div_ceil(pass_rows as usize) as u32,
                    whole.batch_heads() as u32,
                    1,
                ),
                threads: fa2_backward::PASS_THREADS,
                shared_bytes: 0,
            },
        });
        for planned in [pre, post] {
            check_threads(limits, planned.kernel, planned.launch.threads, "head_dim")?;
        }
        // A packed batch: the longest sequence's key blocks, and each launch's sequences' heads
        // (`packed::launch_sequences`).
        let key_blocks = problem.seqlen_k.div_ceil(block_cols as usize) as u32;
        let main = PlannedLaunch {
            kernel: main,
            launch: Launch {
                grid: (key_blocks, problem.batch_heads() as u32, 1),
                threads,
                shared_bytes,
            },
        };
        let row_blocks = problem.seqlen_q.div_ceil(block_rows as usize);
        let mut launches = vec![pre, main, post];
        launches.extend(group_sum_launch(limits, element, &whole)?);
        Ok(Self {
            problem: *problem,
            dtype,
            algorithm,
            fallback,
            deterministic: options.deterministic,
            block_rows,
            block_cols,
            launches,
            dq_accumulator: whole.rows() * problem.head_dim,
            delta: whole.rows(),
            // A packed batch's: (sequences·heads, the longest sequence's row blocks).
            dq_flags: if options.deterministic {
                problem.batch_heads() * row_blocks
            } else {
                0
            },
            scores: 0,
            probs: 0,
            expanded_kv_gradients: expanded_kv_gradients(&whole),
            element_wise_passes,
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
            element_wise_passes: None,
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
    pub(super) fn group_sum(&self) -> Option<PlannedLaunch> {
        self.launches
            .last()
            .filter(|planned| planned.kernel.family == Family::GroupSum)
            .copied()
    }

    /// Every kernel's name, in launch order, joined by `+`.
    /// Whether the main kernel copies rows 16 bytes at a time (cp.async, TMA; fa2-tc, fa3), so
    /// that dO, dK and dV with unaligned rows cannot take this plan.
    pub fn needs_aligned_rows(&self) -> bool {
        matches!(
            self.algorithm,
            BackwardAlgorithm::Fa2Tc | BackwardAlgorithm::Fa3
        )
    }

    /// Whether the pre- and post-pass are the wide ones, which read O and dO and write dQ 16
    /// bytes at a time, so that those tensors with unaligned rows cannot take this plan.
    pub fn has_wide_passes(&self) -> bool {
        self.launches.iter().any(|planned| {
            matches!(planned.kernel.family, Family::Fa2Backward(stage) if stage.is_wide())
        })
    }

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
        if self.problem.is_packed() {
            write!(
                f,
                ", packed: {} sequences, the main kernel once per {MAX_SEQUENCES_PER_LAUNCH}",
                self.problem.batch
            )?;
        }
        write!(f, ", workspace {} bytes)", self.workspace_bytes())?;
        if let Some(fallback) = &self.fallback {
            write!(f, "; {fallback}")?;
        }
        if let Some(reason) = &self.element_wise_passes {
            write!(f, "; element-wise pre- and post-pass: {reason}")?;
        }
        Ok(())
    }
}

/// The refusal of a packed batch's backward where no tensor-core kernel runs it (`why`: the
/// fallback chain's reasons, or the algorithm asked for).
fn packed_refused(why: &str) -> Error {
    Error::invalid(
        "form",
        "a packed batch",
        format!(
            "the packed backward runs on the tensor-core kernels only (fa3, fa2-tc: f16/bf16, \
             head dims that are multiples of 8 up to 256, 16-byte-aligned rows); here {why}"
        ),
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
