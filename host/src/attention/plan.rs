//! A checked problem becomes a plan, once per call: which kernels run (and, for a fallback, why),
//! their grids, threads and shared memory, the workspace, and which statistics come back. Every
//! launch is checked against the device before anything runs: threads against the most the
//! kernel can launch with (its registers decide, `cuFuncGetAttribute`), shared memory against the
//! device's opt-in limit. Where a default block does not fit, the plan picks one that does; what
//! no kernel can run is `Error::InvalidArgument`.

use std::fmt;

use flash_kernels::common::params::{Operands, TensorView};
use flash_kernels::fwd::fa1::config::{self as fa1, Fa1Blocks};
use flash_kernels::fwd::fa2::config as fa2;
use flash_kernels::fwd::fa2_tc::config::{COPY_ELEMENTS, Fa2TcTiling};
use flash_kernels::fwd::fa3::config::{self as fa3, Fa3Tiling};
use flash_kernels::fwd::standard::config as standard;
use flash_kernels::registry::{
    ElementType, Family, HOPPER_KERNELS, KERNELS, KernelId, StandardStage,
};

use super::problem::{Algorithm, AttentionOptions, MAX_HEAD_DIM, Problem};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Shared memory per block (opt-in) of the H200 the project measures on, for plans made without
/// a GPU ([`CompiledLimits`]).
pub const H200_SHARED_MEMORY_PER_BLOCK: u32 = 232_448;

/// What the plan checks launches against: the device's shared memory and, per kernel, the most
/// threads a block can have.
pub trait LaunchLimits {
    /// Dynamic shared memory one block may use after opting in, in bytes.
    fn shared_memory_per_block(&self) -> u32;
    /// The most threads a block of `kernel` can launch with on this device: its compiled bound
    /// (`.maxntid`), lowered where its registers per thread leave fewer.
    fn max_threads(&self, kernel: KernelId) -> Result<u32>;
    /// Whether the device runs the Hopper module (FA3): compute capability 9.0.
    fn runs_hopper_module(&self) -> bool;
}

/// Limits known without a GPU: a device's shared memory, and each kernel's compiled thread bound
/// ([`KernelId::max_threads`]). The GPU's own limits ([`crate::Gpu`]) can only be lower.
#[derive(Clone, Copy, Debug)]
pub struct CompiledLimits {
    pub shared_memory_per_block: u32,
    /// Whether the device is compute capability 9.0 (runs the Hopper module).
    pub hopper: bool,
}

impl CompiledLimits {
    /// The H200's shared memory; a 9.0 device.
    pub const H200: Self = Self {
        shared_memory_per_block: H200_SHARED_MEMORY_PER_BLOCK,
        hopper: true,
    };
}

impl LaunchLimits for CompiledLimits {
    fn shared_memory_per_block(&self) -> u32 {
        self.shared_memory_per_block
    }
    fn max_threads(&self, kernel: KernelId) -> Result<u32> {
        Ok(kernel.max_threads())
    }
    fn runs_hopper_module(&self) -> bool {
        self.hopper
    }
}

/// A kernel launch: grid, block and dynamic shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    pub grid: (u32, u32, u32),
    pub threads: u32,
    pub shared_bytes: u32,
}

/// One kernel of the plan and how it is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedLaunch {
    pub kernel: KernelId,
    pub launch: Launch,
}

/// The block sizes the kernels' parameter blocks carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocks {
    Standard,
    /// FA1's M (f32 elements) and the B_r, B_c it gives.
    Fa1 {
        sram_floats: u32,
        blocks: Fa1Blocks,
    },
    /// FA2's B_r, B_c.
    Fa2 {
        block_rows: u32,
        block_cols: u32,
    },
    Fa2Tc(Fa2TcTiling),
    /// FA3's tiling, and the compiled head dim that holds the problem's.
    Fa3 {
        head_dim: u32,
        tiling: Fa3Tiling,
    },
}

/// Which row statistics the algorithm returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatisticsKind {
    /// L = m + log ℓ.
    LogSumExp,
    /// FA1's m and ℓ.
    MaxAndSum,
}

impl StatisticsKind {
    pub fn of(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::Fa1 => StatisticsKind::MaxAndSum,
            Algorithm::Standard | Algorithm::Fa2 | Algorithm::Fa2Tc | Algorithm::Fa3 => {
                StatisticsKind::LogSumExp
            }
        }
    }
}

/// Device memory the kernels need besides inputs and outputs, in elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceSize {
    /// S (f32) and P (the input dtype) each, standard attention.
    pub scores: usize,
    /// FA1's f32 copy of O between outer steps.
    pub o_accumulator: usize,
}

impl WorkspaceSize {
    pub fn of(algorithm: Algorithm, problem: &Problem) -> Self {
        match algorithm {
            Algorithm::Standard => Self {
                scores: problem.rows() * problem.seqlen_k,
                o_accumulator: 0,
            },
            Algorithm::Fa1 => Self {
                scores: 0,
                o_accumulator: problem.rows() * problem.head_dim,
            },
            Algorithm::Fa2 | Algorithm::Fa2Tc | Algorithm::Fa3 => Self::default(),
        }
    }
}

/// Everything one call runs, decided before any launch.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub algorithm: Algorithm,
    pub dtype: DType,
    pub problem: Problem,
    pub blocks: Blocks,
    /// The kernels in launch order.
    pub launches: Vec<PlannedLaunch>,
    /// Why the algorithm asked for runs another family's kernel, as "`fa2-tc` falls back to
    /// `fa2`: …" (FA3 on FA2-TC, FA2-TC on the scalar FA2; both steps, `; `-joined).
    pub fallback: Option<String>,
    pub workspace: WorkspaceSize,
    pub statistics: StatisticsKind,
}

impl Plan {
    /// Plans `algorithm` on `problem` for `dtype` within `limits`. `operands`, when given, are the
    /// tensors' views, whose alignment decides whether the tensor-core kernel can copy them (a
    /// plan without tensors assumes aligned ones).
    pub fn new(
        limits: &dyn LaunchLimits,
        algorithm: Algorithm,
        dtype: DType,
        problem: &Problem,
        options: &AttentionOptions,
        operands: Option<&Operands>,
    ) -> Result<Self> {
        let element = ElementType::from(dtype);
        let shared_limit = limits.shared_memory_per_block();
        let mut plan = Self {
            algorithm,
            dtype,
            problem: *problem,
            blocks: Blocks::Standard,
            launches: Vec::new(),
            fallback: None,
            workspace: WorkspaceSize::of(algorithm, problem),
            statistics: StatisticsKind::of(algorithm),
        };
        match algorithm {
            Algorithm::Standard => plan.launches = standard_launches(problem, element),
            Algorithm::Fa1 => {
                let (sram_floats, blocks) =
                    fa1_blocks(problem.head_dim, shared_limit, options.fa1_sram_floats)?;
                let kernel = KernelId::new(Family::Fa1, element);
                let launch = Launch {
                    grid: (problem.batch_heads() as u32, 1, 1),
                    threads: fa1::THREADS,
                    shared_bytes: blocks.shared_bytes(problem.head_dim as u32) as u32,
                };
                check_threads(limits, kernel, launch.threads, "fa1")?;
                plan.blocks = Blocks::Fa1 {
                    sram_floats,
                    blocks,
                };
                plan.launches = vec![PlannedLaunch { kernel, launch }];
            }
            Algorithm::Fa2Tc => plan.plan_fa2_tc(limits, element, options, operands)?,
            Algorithm::Fa3 => plan.plan_fa3(limits, element, options, operands)?,
            Algorithm::Fa2 => plan.plan_fa2(limits, element, options)?,
        }
        Ok(plan)
    }

    /// FA2 on tensor cores at the problem's head dim, with the requested or default tiling; the
    /// scalar FA2 where no tensor-core kernel can run it ([`tensor_core_fallback`]).
    fn plan_fa2_tc(
        &mut self,
        limits: &dyn LaunchLimits,
        element: ElementType,
        options: &AttentionOptions,
        operands: Option<&Operands>,
    ) -> Result<()> {
        let problem = self.problem;
        if let Some(reason) = tensor_core_fallback(self.dtype, problem.head_dim, operands) {
            self.add_fallback(Algorithm::Fa2Tc, Algorithm::Fa2, reason);
            return self.plan_fa2(limits, element, options);
        }
        let tiling = fa2_tc_tiling(problem.head_dim, options.fa2_tc_tiling)?;
        let kernel = KernelId::new(
            Family::Fa2Tc {
                head_dim: problem.head_dim as u32,
                tiling,
            },
            element,
        );
        let shared_bytes = tiling.shared_bytes(problem.head_dim as u32);
        let rows_and_threads = (tiling.block_rows(), tiling.threads());
        self.blocks = Blocks::Fa2Tc(tiling);
        self.row_block_launch(
            limits,
            kernel,
            "fa2_tc_tiling",
            rows_and_threads,
            shared_bytes,
        )
    }

    /// FA3 on the smallest compiled head dim that holds the problem's, with the requested or
    /// default tiling; FA2-TC where FA3 cannot run it ([`fa3_fallback`]).
    fn plan_fa3(
        &mut self,
        limits: &dyn LaunchLimits,
        element: ElementType,
        options: &AttentionOptions,
        operands: Option<&Operands>,
    ) -> Result<()> {
        let problem = self.problem;
        let head_dim = match fa3_fallback(limits, self.dtype, problem.head_dim, operands) {
            Ok(head_dim) => head_dim,
            Err(reason) => {
                self.add_fallback(Algorithm::Fa3, Algorithm::Fa2Tc, reason);
                return self.plan_fa2_tc(limits, element, options, operands);
            }
        };
        let tiling = fa3_tiling(head_dim, options.fa3_tiling)?;
        let kernel = KernelId::new(Family::Fa3 { head_dim, tiling }, element);
        let shared_bytes = tiling.shared_bytes(head_dim);
        let rows_and_threads = (tiling.block_rows(), tiling.threads());
        self.blocks = Blocks::Fa3 { head_dim, tiling };
        self.row_block_launch(limits, kernel, "fa3_tiling", rows_and_threads, shared_bytes)
    }

    /// The one launch of a kernel on the FA2 grid with `(B_r, threads)` and `shared_bytes`, after
    /// checking both against the device (an error names the tiling option `argument`).
    fn row_block_launch(
        &mut self,
        limits: &dyn LaunchLimits,
        kernel: KernelId,
        argument: &'static str,
        (rows, threads): (u32, u32),
        shared_bytes: u32,
    ) -> Result<()> {
        let tiling = match self.blocks {
            Blocks::Fa2Tc(tiling) => tiling.to_string(),
            Blocks::Fa3 { tiling, .. } => tiling.to_string(),
            other => format!("{other:?}"),
        };
        check_shared(
            limits,
            shared_bytes,
            argument,
            tiling,
            self.problem.head_dim,
        )?;
        check_threads(limits, kernel, threads, argument)?;
        self.launches = vec![fa2_grid(&self.problem, kernel, rows, threads, shared_bytes)];
        Ok(())
    }

    fn add_fallback(&mut self, from: Algorithm, to: Algorithm, reason: String) {
        let step = format!("{from} falls back to {to}: {reason}");
        self.fallback = Some(match self.fallback.take() {
            Some(earlier) => format!("{earlier}; {step}"),
            None => step,
        });
    }

    /// The scalar FA2: the smallest compiled head-dim capacity that holds d, and the largest
    /// (B_r, B_c) whose shared memory and threads fit (or the override, if it does).
    fn plan_fa2(
        &mut self,
        limits: &dyn LaunchLimits,
        element: ElementType,
        options: &AttentionOptions,
    ) -> Result<()> {
        let problem = self.problem;
        let d = problem.head_dim as u32;
        let kernel_for = |block_cols: u32| -> Result<KernelId> {
            fa2_kernel(element, d, block_cols).ok_or_else(|| {
                Error::invalid("head_dim", d, format!("allowed: 1 to {MAX_HEAD_DIM}"))
            })
        };
        let fits = |(r, c): (u32, u32)| -> Result<Option<String>> {
            let shared = fa2::shared_bytes(r, c, d);
            let shared_limit = limits.shared_memory_per_block();
            if shared > shared_limit as u64 {
                return Ok(Some(format!(
                    "needs {shared} bytes of shared memory at d = {d}; the device allows {shared_limit}"
                )));
            }
            let kernel = kernel_for(c)?;
            let max_threads = limits.max_threads(kernel)?;
            Ok((fa2::threads(r) > max_threads).then(|| {
                format!(
                    "needs {} threads per block; `{kernel}` launches with at most {max_threads}",
                    fa2::threads(r)
                )
            }))
        };
        let (block_rows, block_cols) = match options.fa2_blocks {
            Some((r, c)) => {
                if !fa2::BLOCK_CHOICES.contains(&r) || !fa2::BLOCK_CHOICES.contains(&c) {
                    return Err(Error::invalid(
                        "fa2_blocks",
                        format!("({r}, {c})"),
                        "B_r and B_c must each be 64 or 128",
                    ));
                }
                if let Some(why) = fits((r, c))? {
                    return Err(Error::invalid("fa2_blocks", format!("({r}, {c})"), why));
                }
                (r, c)
            }
            None => {
                let mut chosen = None;
                for candidate in FA2_PREFERENCE {
                    if fits(candidate)?.is_none() {
                        chosen = Some(candidate);
                        break;
                    }
                }
                chosen.ok_or_else(|| {
                    Error::invalid(
                        "head_dim",
                        d,
                        "FA2's smallest tiles do not fit in this device's shared memory",
                    )
                })?
            }
        };
        let kernel = kernel_for(block_cols)?;
        self.blocks = Blocks::Fa2 {
            block_rows,
            block_cols,
        };
        let threads = fa2::threads(block_rows);
        let shared_bytes = fa2::shared_bytes(block_rows, block_cols, d) as u32;
        self.launches = vec![fa2_grid(
            &problem,
            kernel,
            block_rows,
            threads,
            shared_bytes,
        )];
        Ok(())
    }

    /// Every kernel's name, in launch order, joined by `+`.
    pub fn kernel_names(&self) -> String {
        let names: Vec<String> = self.launches.iter().map(|l| l.kernel.to_string()).collect();
        names.join("+")
    }
}

impl fmt::Display for Plan {
    /// One line: algorithm, kernel(s), grid, threads, shared memory, and a fallback's reason.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.algorithm)?;
        for (i, PlannedLaunch { kernel, launch }) in self.launches.iter().enumerate() {
            let (x, y, z) = launch.grid;
            let sep = if i == 0 { " " } else { "; " };
            write!(
                f,
                "{sep}{kernel} grid ({x}, {y}, {z}) × {} threads, {} B shared",
                launch.threads, launch.shared_bytes
            )?;
        }
        match self.blocks {
            Blocks::Fa1 {
                sram_floats,
                blocks,
            } => write!(
                f,
                " (M = {sram_floats}: B_r = {}, B_c = {})",
                blocks.block_rows, blocks.block_cols
            )?,
            Blocks::Fa2 {
                block_rows,
                block_cols,
            } => write!(f, " (B_r = {block_rows}, B_c = {block_cols})")?,
            Blocks::Fa2Tc(tiling) => write!(f, " (tiling {tiling})")?,
            Blocks::Fa3 { head_dim, tiling } => {
                write!(f, " (tiling {tiling}, compiled head dim {head_dim})")?
            }
            Blocks::Standard => {}
        }
        if let Some(fallback) = &self.fallback {
            write!(f, "; {fallback}")?;
        }
        Ok(())
    }
}

/// FA2's default (B_r, B_c), most preferred first: larger blocks re-read K/V fewer times.
const FA2_PREFERENCE: [(u32, u32); 4] = [(128, 128), (128, 64), (64, 128), (64, 64)];

/// The compiled FA2 kernel for `element` at head dim `d` with `block_cols`: the smallest
/// head-dim capacity that holds d.
fn fa2_kernel(element: ElementType, d: u32, block_cols: u32) -> Option<KernelId> {
    KERNELS
        .iter()
        .filter(|k| k.dtype == element)
        .filter(|k| matches!(k.family, Family::Fa2 { block_cols: c, .. } if c == block_cols))
        .filter(|k| k.head_dim_capacity().is_some_and(|capacity| capacity >= d))
        .min_by_key(|k| k.head_dim_capacity())
        .copied()
}

/// `kernel` on the FA2 grid (⌈seqlen_q/B_r⌉, batch·heads).
fn fa2_grid(
    problem: &Problem,
    kernel: KernelId,
    block_rows: u32,
    threads: u32,
    shared_bytes: u32,
) -> PlannedLaunch {
    let row_blocks = problem.seqlen_q.div_ceil(block_rows as usize) as u32;
    PlannedLaunch {
        kernel,
        launch: Launch {
            grid: (row_blocks, problem.batch_heads() as u32, 1),
            threads,
            shared_bytes,
        },
    }
}

/// Standard attention's three kernels: S over (key tiles, query tiles, heads), the softmax one
/// warp per row, O over (head-dim tiles, query tiles, heads).
fn standard_launches(problem: &Problem, element: ElementType) -> Vec<PlannedLaunch> {
    let tiles = |n: usize| n.div_ceil(standard::MATMUL_TILE as usize) as u32;
    let heads = problem.batch_heads() as u32;
    let product = |grid| Launch {
        grid,
        threads: standard::THREADS,
        shared_bytes: standard::PRODUCT_SHARED_BYTES,
    };
    let rows_per_block = standard::SOFTMAX_ROWS_PER_BLOCK as usize;
    let launches = [
        (
            StandardStage::Scores,
            product((tiles(problem.seqlen_k), tiles(problem.seqlen_q), heads)),
        ),
        (
            StandardStage::Softmax,
            Launch {
                grid: (problem.seqlen_q.div_ceil(rows_per_block) as u32, heads, 1),
                threads: standard::THREADS,
                shared_bytes: 0,
            },
        ),
        (
            StandardStage::Output,
            product((tiles(problem.head_dim), tiles(problem.seqlen_q), heads)),
        ),
    ];
    launches
        .into_iter()
        .map(|(stage, launch)| PlannedLaunch {
            kernel: KernelId::new(Family::Standard(stage), element),
            launch,
        })
        .collect()
}

/// An error naming `argument` when a tiling's shared memory does not fit the device.
fn check_shared(
    limits: &dyn LaunchLimits,
    shared_bytes: u32,
    argument: &'static str,
    tiling: impl fmt::Display,
    head_dim: usize,
) -> Result<()> {
    let shared_limit = limits.shared_memory_per_block();
    if shared_bytes > shared_limit {
        return Err(Error::invalid(
            argument,
            tiling,
            format!(
                "needs {shared_bytes} bytes of shared memory at head_dim {head_dim}; the device \
                 allows {shared_limit}"
            ),
        ));
    }
    Ok(())
}

/// An error naming `argument` when `kernel` cannot launch `threads` threads on this device.
fn check_threads(
    limits: &dyn LaunchLimits,
    kernel: KernelId,
    threads: u32,
    argument: &'static str,
) -> Result<()> {
    let max_threads = limits.max_threads(kernel)?;
    if threads > max_threads {
        return Err(Error::invalid(
            argument,
            kernel,
            format!(
                "needs {threads} threads per block; this device launches it with at most \
                 {max_threads}"
            ),
        ));
    }
    Ok(())
}

/// FA1's block sizes for this problem on a device with `shared_limit` bytes per block.
pub fn fa1_blocks(
    head_dim: usize,
    shared_limit: u32,
    sram_floats: Option<u32>,
) -> Result<(u32, Fa1Blocks)> {
    let d = head_dim as u32;
    if let Some(m) = sram_floats {
        let blocks = Fa1Blocks::from_sram(m.max(1), d);
        let bytes = blocks.shared_bytes(d);
        if m == 0 || bytes > shared_limit as u64 {
            return Err(Error::invalid(
                "fa1_sram_floats",
                m,
                format!(
                    "≥ 1, with tiles that fit in {shared_limit} bytes of shared memory (this M needs {bytes} bytes at d = {d})"
                ),
            ));
        }
        return Ok((m, blocks));
    }
    // The ceilings in the formula can overshoot M, and S_ij needs B_r·B_c more: step M down one
    // B_c at a time until everything fits.
    let mut m = shared_limit / 4;
    loop {
        let blocks = Fa1Blocks::from_sram(m, d);
        if blocks.shared_bytes(d) <= shared_limit as u64 {
            return Ok((m, blocks));
        }
        if blocks.block_cols <= 1 {
            return Err(Error::invalid(
                "head_dim",
                d,
                format!("FA1's tiles do not fit in {shared_limit} bytes of shared memory"),
            ));
        }
        m = (blocks.block_cols - 1) * 4 * d;
    }
}

/// FA2's (B_r, B_c) for `head_dim` within the compiled kernels' thread bounds and `shared_limit`
/// bytes of shared memory: the override if valid, else the largest that fits.
pub fn fa2_blocks(
    head_dim: usize,
    shared_limit: u32,
    blocks: Option<(u32, u32)>,
) -> Result<(u32, u32)> {
    let problem = Problem::new(
        [1, 1, 1, head_dim],
        [1, 1, 1, head_dim],
        [1, 1, 1, head_dim],
        &AttentionOptions::default(),
    )?;
    let options = AttentionOptions {
        fa2_blocks: blocks,
        ..Default::default()
    };
    let limits = CompiledLimits {
        shared_memory_per_block: shared_limit,
        hopper: false,
    };
    let plan = Plan::new(
        &limits,
        Algorithm::Fa2,
        DType::F32,
        &problem,
        &options,
        None,
    )?;
    match plan.blocks {
        Blocks::Fa2 {
            block_rows,
            block_cols,
        } => Ok((block_rows, block_cols)),
        _ => unreachable!("an FA2 plan has FA2 blocks"),
    }
}

/// FA2-TC's tiling: the override if the kernel is compiled with it at this head dim, else the
/// default for the head dim.
pub fn fa2_tc_tiling(head_dim: usize, tiling: Option<Fa2TcTiling>) -> Result<Fa2TcTiling> {
    let d = head_dim as u32;
    let compiled = |t: Fa2TcTiling| {
        KERNELS.contains(&KernelId::new(
            Family::Fa2Tc {
                head_dim: d,
                tiling: t,
            },
            ElementType::Bf16,
        ))
    };
    match tiling {
        None => Ok(Fa2TcTiling::default_for(d)),
        Some(t) if compiled(t) => Ok(t),
        Some(t) => {
            let allowed: Vec<String> = fa2_tc_tilings(d).iter().map(|t| t.to_string()).collect();
            Err(Error::invalid(
                "fa2_tc_tiling",
                t,
                format!(
                    "allowed at head_dim {head_dim}: {} (warps x row tiles s K/V stages c B_c)",
                    allowed.join(", ")
                ),
            ))
        }
    }
}

/// The tilings FA2-TC is compiled with at head dim `d` (empty if none).
pub fn fa2_tc_tilings(d: u32) -> Vec<Fa2TcTiling> {
    KERNELS
        .iter()
        .filter(|k| k.dtype == ElementType::Bf16)
        .filter_map(|k| match k.family {
            Family::Fa2Tc { head_dim, tiling } if head_dim == d => Some(tiling),
            _ => None,
        })
        .collect()
}

/// The head dims FA2-TC is compiled for, ascending.
pub fn fa2_tc_head_dims() -> Vec<u32> {
    let mut dims: Vec<u32> = KERNELS
        .iter()
        .filter_map(|k| match k.family {
            Family::Fa2Tc { head_dim, .. } => Some(head_dim),
            _ => None,
        })
        .collect();
    dims.sort_unstable();
    dims.dedup();
    dims
}

/// Why [`Algorithm::Fa2Tc`] cannot run on tensor cores for this call, if it cannot: f32 has no
/// tensor-core kernel, the head dim is not compiled, or a row start is not 16-byte aligned (its
/// copies are 16-byte `cp.async`). Then it runs the scalar FA2.
pub fn tensor_core_fallback(
    dtype: DType,
    head_dim: usize,
    operands: Option<&Operands>,
) -> Option<String> {
    if dtype == DType::F32 {
        return Some("f32 has no tensor-core kernel (f16 and bf16 do)".into());
    }
    let dims = fa2_tc_head_dims();
    if !dims.contains(&(head_dim as u32)) {
        return Some(format!(
            "head_dim {head_dim} has no tensor-core kernel (compiled for {dims:?})"
        ));
    }
    misaligned_operand(operands)
}

/// The first operand whose address or strides are not 16-byte aligned (16-bit elements), as the
/// reason a 16-byte copy (cp.async, TMA) cannot read it.
fn misaligned_operand(operands: Option<&Operands>) -> Option<String> {
    let aligned = |view: &TensorView| {
        let step = COPY_ELEMENTS as u64;
        view.addr.is_multiple_of(16)
            && [view.batch_stride, view.head_stride, view.row_stride]
                .iter()
                .all(|s| s.is_multiple_of(step))
    };
    let misaligned = operands.and_then(|o| {
        [("q", &o.q), ("k", &o.k), ("v", &o.v), ("o", &o.o)]
            .into_iter()
            .find(|(_, view)| !aligned(view))
    });
    misaligned.map(|(name, _)| {
        format!(
            "{name}'s rows are not 16-byte aligned (address and strides must be multiples of \
             {COPY_ELEMENTS} elements)"
        )
    })
}

/// The compiled head dim FA3 runs this call on, or why it cannot run it: the device is not
/// compute capability 9.0, f32, an odd head dim (O is stored two elements at a time), or a row
/// start that TMA cannot address. Then it runs FA2-TC.
pub fn fa3_fallback(
    limits: &dyn LaunchLimits,
    dtype: DType,
    head_dim: usize,
    operands: Option<&Operands>,
) -> std::result::Result<u32, String> {
    if !limits.runs_hopper_module() {
        return Err("the device is not compute capability 9.0 (FA3's module is sm_90a)".into());
    }
    if dtype == DType::F32 {
        return Err("f32 has no FA3 kernel (f16 and bf16 do)".into());
    }
    if !head_dim.is_multiple_of(2) {
        return Err(format!(
            "head_dim {head_dim} is odd (FA3 takes even head dims)"
        ));
    }
    if let Some(reason) = misaligned_operand(operands) {
        return Err(reason);
    }
    fa3::HEAD_DIMS
        .into_iter()
        .find(|&d| d as usize >= head_dim)
        .ok_or_else(|| format!("head_dim {head_dim} is past FA3's largest, 256"))
}

/// FA3's tiling at compiled head dim `d`: the override if the kernel is compiled with it, else
/// the default.
pub fn fa3_tiling(d: u32, tiling: Option<Fa3Tiling>) -> Result<Fa3Tiling> {
    let tilings: Vec<Fa3Tiling> = HOPPER_KERNELS
        .iter()
        .filter(|k| k.dtype == ElementType::Bf16)
        .filter_map(|k| match k.family {
            Family::Fa3 { head_dim, tiling } if head_dim == d => Some(tiling),
            _ => None,
        })
        .collect();
    match tiling {
        None => Ok(Fa3Tiling::default_for(d)),
        Some(t) if tilings.contains(&t) => Ok(t),
        Some(t) => {
            let allowed: Vec<String> = tilings.iter().map(|t| t.to_string()).collect();
            Err(Error::invalid(
                "fa3_tiling",
                t,
                format!(
                    "allowed at compiled head dim {d}: {} (consumer warpgroups, B_c)",
                    allowed.join(", ")
                ),
            ))
        }
    }
}
