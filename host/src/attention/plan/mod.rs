//! A checked problem becomes a plan, once per call: which kernels run (and, for a fallback, why),
//! their grids, threads and shared memory, the workspace, and which statistics come back. Every
//! launch is checked against the device before anything runs: threads against the most the
//! kernel can launch with (its registers decide, `cuFuncGetAttribute`), shared memory against the
//! device's opt-in limit. Where a default block does not fit, the plan picks one that does; what
//! no kernel can run is `Error::InvalidArgument`.
//!
//! - [`limits`]: the device's limits, and the checks against them;
//! - [`choices`]: per family, the compiled kernel and block sizes for a head dim, and the
//!   reasons for a fallback;
//! - this file: the plan itself (its types, one planning step per family, its one-line summary).

mod choices;
mod limits;

pub(crate) use choices::misaligned_view;
use choices::{FA2_PREFERENCE, fa2_kernel};
pub use choices::{
    fa1_blocks, fa2_blocks, fa2_tc_head_dims, fa2_tc_tiling, fa2_tc_tilings, fa3_fallback,
    fa3_tiling, tensor_core_fallback,
};
pub use limits::{
    CompiledLimits, H200_MULTIPROCESSORS, H200_SHARED_MEMORY_PER_BLOCK, LaunchLimits,
};
pub(crate) use limits::{check_shared, check_threads};

use std::fmt;

use flash_kernels::common::block::BlockInfo;
use flash_kernels::common::params::Operands;
use flash_kernels::fwd::fa1::config::{self as fa1, Fa1Blocks};
use flash_kernels::fwd::fa2::config as fa2;
use flash_kernels::fwd::fa2_tc::config::Fa2TcTiling;
use flash_kernels::fwd::fa3::config::Fa3Tiling;
use flash_kernels::fwd::standard::config as standard;
use flash_kernels::registry::{ElementType, Family, KernelId, StandardStage};

use super::problem::{Algorithm, AttentionOptions, MAX_HEAD_DIM, Problem};
use crate::dtype::DType;
use crate::error::{Error, Result};

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
    /// FA3's tiling (with its grid), and the compiled head dim that holds the problem's.
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
            _ => StatisticsKind::LogSumExp,
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
            Algorithm::Auto | Algorithm::Fa2 | Algorithm::Fa2Tc | Algorithm::Fa3 => Self::default(),
        }
    }
}

/// Everything one call runs, decided before any launch.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardPlan {
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

impl ForwardPlan {
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
        if problem.is_packed()
            && !matches!(
                algorithm,
                Algorithm::Auto | Algorithm::Fa2Tc | Algorithm::Fa3
            )
        {
            return Err(Error::invalid(
                "algorithm",
                algorithm,
                "allowed for a packed batch of sequences: auto, fa3 (which runs fa2-tc where it \
                 cannot), fa2-tc",
            ));
        }
        match algorithm {
            Algorithm::Standard => {
                if let Some(dropout) = problem.dropout {
                    return Err(Error::invalid(
                        "dropout_p",
                        dropout.p(),
                        "`standard` takes no dropout; `fa2-tc` and `fa3` (f16/bf16 at their \
                         compiled head dims) do",
                    ));
                }
                plan.launches = standard_launches(problem, element)
            }
            Algorithm::Fa1 => {
                plan.refuse_local_options(Algorithm::Fa1)?;
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
            // Auto is FA3's chain: FA3 on compute capability 9.0, else FA2-TC, else FA2.
            Algorithm::Auto | Algorithm::Fa3 => {
                plan.plan_fa3(limits, element, options, operands)?
            }
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
            if problem.is_packed() {
                // The scalar FA2 takes no packed batch: nothing to fall back to. The error names
                // what stops the tensor cores: the dtype, or the tensor whose rows are misaligned.
                let name = if self.dtype == DType::F32 {
                    "dtype"
                } else {
                    ["q", "k", "v", "o"]
                        .into_iter()
                        .find(|name| reason.starts_with(&format!("{name}'s rows")))
                        .unwrap_or("head_dim")
                };
                return Err(Error::invalid(
                    name,
                    format!(
                        "a packed batch of {} at head_dim {}",
                        self.dtype, problem.head_dim
                    ),
                    format!(
                        "packed batches run on FA2-TC's tensor cores only, which cannot: {reason}"
                    ),
                ));
            }
            self.add_fallback(Algorithm::Fa2Tc, Algorithm::Fa2, reason);
            return self.plan_fa2(limits, element, options);
        }
        let form = problem.kernel_form();
        let tiling = fa2_tc_tiling(problem.head_dim, options.fa2_tc_tiling, form)?;
        let kernel = KernelId::new(
            Family::Fa2Tc {
                head_dim: problem.head_dim as u32,
                tiling,
                form,
            },
            element,
        );
        let shared_bytes = tiling.shared_bytes(problem.head_dim as u32);
        let rows_and_threads = (tiling.block_rows(), tiling.threads());
        self.blocks = Blocks::Fa2Tc(tiling);
        self.row_block_launch(
            limits,
            kernel,
            ("fa2_tc_tiling", &tiling),
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
        let tiling = fa3_tiling(head_dim, options.fa3_tiling, &problem)?;
        let kernel = KernelId::new(
            Family::Fa3 {
                head_dim,
                tiling,
                form: problem.kernel_form(),
            },
            element,
        );
        let shared_bytes = tiling.shared_bytes(head_dim);
        let rows_and_threads = (tiling.block_rows(), tiling.threads());
        self.blocks = Blocks::Fa3 { head_dim, tiling };
        self.row_block_launch(
            limits,
            kernel,
            ("fa3_tiling", &tiling),
            rows_and_threads,
            shared_bytes,
        )?;
        if tiling.persistent {
            // One block per SM, each taking tiles until none is left (`fwd::fa3::scheduler`).
            let launch = &mut self.launches[0].launch;
            let tiles = launch.grid.0 * launch.grid.1;
            launch.grid = (tiles.min(limits.multiprocessors()).max(1), 1, 1);
        }
        Ok(())
    }

    /// The one launch of a kernel on the FA2 grid with `(B_r, threads)` and `shared_bytes`, after
    /// checking both against the device (an error names the tiling option and its value).
    fn row_block_launch(
        &mut self,
        limits: &dyn LaunchLimits,
        kernel: KernelId,
        (argument, tiling): (&'static str, &dyn fmt::Display),
        (rows, threads): (u32, u32),
        shared_bytes: u32,
    ) -> Result<()> {
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

    /// The faithful kernels (`fa1`, `fa2`) run the articles' algorithms as written: no window,
    /// no soft-capping, no ALiBi, no dropout. An error naming the option, and the fallback that
    /// led here if one did.
    fn refuse_local_options(&self, family: Algorithm) -> Result<()> {
        let Some((name, value)) = self.problem.local_option() else {
            return Ok(());
        };
        let route = self.fallback.as_deref().map_or(String::new(), |reason| {
            format!(" (reached as the fallback: {reason})")
        });
        Err(Error::invalid(
            name,
            value,
            format!(
                "`{family}` takes no window, soft-capping, ALiBi or dropout{route}; `fa2-tc` and \
                 `fa3` (f16/bf16 at their compiled head dims) take all four, and `standard` all \
                 but dropout"
            ),
        ))
    }

    /// The K/V blocks the row blocks of one head visit, of all (row blocks × key blocks), for
    /// the tiled families that skip blocks (`fa2`, `fa2-tc`, `fa3`; `KeyBlocks`, the kernels'
    /// own count): the causal mask and a window skip the rest.
    pub fn key_blocks_visited(&self) -> Option<(u64, u64)> {
        let (block_rows, block_cols) = match self.blocks {
            Blocks::Fa2 {
                block_rows,
                block_cols,
            } => (block_rows, block_cols),
            Blocks::Fa2Tc(tiling) => (tiling.block_rows(), tiling.block_cols),
            Blocks::Fa3 { tiling, .. } => (tiling.block_rows(), tiling.block_cols),
            Blocks::Standard | Blocks::Fa1 { .. } => return None,
        };
        let shape = self.problem.shape();
        let info = BlockInfo::new(&shape, 0);
        let row_blocks = shape.seqlen_q.div_ceil(block_rows);
        let visited = (0..row_blocks)
            .map(|r| {
                info.key_blocks(r * block_rows, block_rows, block_cols)
                    .count() as u64
            })
            .sum();
        let all = row_blocks as u64 * shape.seqlen_k.div_ceil(block_cols) as u64;
        Some((visited, all))
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
        self.refuse_local_options(Algorithm::Fa2)?;
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
        kernel_names(&self.launches)
    }

    /// Whether the planned kernels copy rows 16 bytes at a time (cp.async, TMA), so that an
    /// output with unaligned rows cannot take this plan.
    pub fn needs_aligned_rows(&self) -> bool {
        matches!(self.blocks, Blocks::Fa2Tc(_) | Blocks::Fa3 { .. })
    }
}

/// The names of `launches`' kernels, in launch order, joined by `+`.
pub(crate) fn kernel_names(launches: &[PlannedLaunch]) -> String {
    let names: Vec<String> = launches.iter().map(|l| l.kernel.to_string()).collect();
    names.join("+")
}

/// `launches` as a plan's one-line summary lists them: kernel, grid, threads, shared memory.
pub(crate) fn write_launches(
    f: &mut fmt::Formatter<'_>,
    launches: &[PlannedLaunch],
) -> fmt::Result {
    for (i, PlannedLaunch { kernel, launch }) in launches.iter().enumerate() {
        let (x, y, z) = launch.grid;
        let sep = if i == 0 { " " } else { "; " };
        write!(
            f,
            "{sep}{kernel} grid ({x}, {y}, {z}) × {} threads, {} B shared",
            launch.threads, launch.shared_bytes
        )?;
    }
    Ok(())
}

impl fmt::Display for ForwardPlan {
    /// One line: algorithm, kernel(s), grid, threads, shared memory, and a fallback's reason.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.algorithm)?;
        write_launches(f, &self.launches)?;
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
                let grid = if tiling.persistent {
                    ", persistent grid"
                } else {
                    ""
                };
                write!(f, " (tiling {tiling}, compiled head dim {head_dim}{grid})")?
            }
            Blocks::Standard => {}
        }
        if let Some(fallback) = &self.fallback {
            write!(f, "; {fallback}")?;
        }
        Ok(())
    }
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

/// 16 × 16 output tiles of the standard kernels' products along a dimension of `n`.
pub(crate) fn standard_tiles(n: usize) -> u32 {
    n.div_ceil(standard::MATMUL_TILE as usize) as u32
}

/// A launch of one of the standard kernels' tiled products (forward or backward) over `grid`.
pub(crate) fn standard_product(grid: (u32, u32, u32)) -> Launch {
    Launch {
        grid,
        threads: standard::THREADS,
        shared_bytes: standard::PRODUCT_SHARED_BYTES,
    }
}

/// A launch of one of the standard kernels that take one warp per query row (the softmax and
/// the backward's dS) over (row blocks, heads).
pub(crate) fn standard_rows(problem: &Problem) -> Launch {
    let rows_per_block = standard::SOFTMAX_ROWS_PER_BLOCK as usize;
    Launch {
        grid: (
            problem.seqlen_q.div_ceil(rows_per_block) as u32,
            problem.batch_heads() as u32,
            1,
        ),
        threads: standard::THREADS,
        shared_bytes: 0,
    }
}

/// Standard attention's three kernels: S over (key tiles, query tiles, heads), the softmax one
/// warp per row, O over (head-dim tiles, query tiles, heads).
pub(crate) fn standard_launches(problem: &Problem, element: ElementType) -> Vec<PlannedLaunch> {
    let tiles = standard_tiles;
    let heads = problem.batch_heads() as u32;
    let launches = [
        (
            StandardStage::Scores,
            standard_product((tiles(problem.seqlen_k), tiles(problem.seqlen_q), heads)),
        ),
        (StandardStage::Softmax, standard_rows(problem)),
        (
            StandardStage::Output,
            standard_product((tiles(problem.head_dim), tiles(problem.seqlen_q), heads)),
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
