//! The one entry point for every algorithm: check everything, then launch.

use cudarc::driver::CudaSlice;
use flash_kernels::layout::{
    self as kernel_layout, FA2_BLOCK_CHOICES, FA2_ROWS_PER_WARP, Fa1Blocks, Fa2TcTiling,
    MATMUL_DEPTH, MATMUL_TILE, THREADS_PER_BLOCK,
};
use flash_kernels::params::{AttentionShape, Fa1Params, Fa2Params, Operands, StandardParams};
use ndarray::Array3;

use crate::device::{Gpu, Launch};
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::tensor::{DeviceTensor, Layout};

/// Largest head dim any algorithm takes.
pub const MAX_HEAD_DIM: usize = 256;
/// CUDA's limit on grid dimensions y and z.
const MAX_GRID_YZ: usize = 65_535;

/// Which kernel(s) compute the attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Algorithm {
    /// S and P materialised in HBM, three kernels.
    Standard,
    /// FlashAttention-1 forward: outer loop over K/V blocks; returns m and ℓ.
    Fa1,
    /// FlashAttention-2 forward: outer loop over Q blocks; returns L.
    Fa2,
    /// FlashAttention-2 forward on tensor cores (mma.sync, ldmatrix, cp.async), f16/bf16 with
    /// head dim 64 or 128 and 16-byte-aligned rows; anything else runs [`Algorithm::Fa2`].
    #[serde(rename = "fa2-tc")]
    Fa2Tc,
}

impl Algorithm {
    pub const ALL: [Algorithm; 4] = [
        Algorithm::Standard,
        Algorithm::Fa1,
        Algorithm::Fa2,
        Algorithm::Fa2Tc,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Standard => "standard",
            Algorithm::Fa1 => "fa1",
            Algorithm::Fa2 => "fa2",
            Algorithm::Fa2Tc => "fa2-tc",
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Algorithm {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| Error::invalid("algorithm", s, "allowed: standard, fa1, fa2, fa2-tc"))
    }
}

/// Options shared by every algorithm; the block-size overrides apply to one algorithm each.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionOptions {
    /// Causal mask, aligned to the bottom-right corner (see `flash_kernels::mask`).
    pub causal: bool,
    /// Multiplies Q·Kᵀ; default 1/√head_dim.
    pub softmax_scale: Option<f32>,
    /// FA1's SRAM budget M in f32 elements (B_c = ⌈M/4d⌉, B_r = min(B_c, d)); default: the largest
    /// M whose tiles fit in the device's shared memory per block.
    pub fa1_sram_floats: Option<u32>,
    /// FA2's (B_r, B_c), each 64 or 128; default: the largest that fits in shared memory.
    pub fa2_blocks: Option<(u32, u32)>,
    /// FA2-TC's split of B_r over warps and row tiles, K/V pipeline depth and B_c
    /// (`layout::FA2_TC_TILINGS`); default: measured per head dim.
    pub fa2_tc_tiling: Option<Fa2TcTiling>,
}

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

/// O and the row statistics.
pub struct AttentionOutput<T> {
    pub o: DeviceTensor<T>,
    pub stats: RowStatistics,
}

/// A checked problem: what every kernel's parameter block is built from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Problem {
    pub batch: usize,
    pub heads: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
    pub softmax_scale: f32,
    pub causal: bool,
}

impl Problem {
    /// Checks that Q (batch, heads, seqlen_q, d), K and V (batch, heads, seqlen_k, d) agree and
    /// that the options are valid.
    pub fn new(
        q: [usize; 4],
        k: [usize; 4],
        v: [usize; 4],
        options: &AttentionOptions,
    ) -> Result<Self> {
        for (name, dims) in [("q", q), ("k", k), ("v", v)] {
            if dims.contains(&0) {
                return Err(Error::invalid(
                    name,
                    format!("shape {dims:?}"),
                    "every dimension (batch, heads, seqlen, head_dim) must be at least 1",
                ));
            }
        }
        let names = ["batch", "heads", "seqlen", "head_dim"];
        for axis in [0, 1, 3] {
            for (name, dims) in [("k", k), ("v", v)] {
                if dims[axis] != q[axis] {
                    return Err(Error::invalid(
                        name,
                        format!("shape {dims:?}"),
                        format!(
                            "its {} must equal q's ({}; q is {q:?})",
                            names[axis], q[axis]
                        ),
                    ));
                }
            }
        }
        if v[2] != k[2] {
            return Err(Error::invalid(
                "v",
                format!("shape {v:?}"),
                format!("its seqlen must equal k's ({}; k is {k:?})", k[2]),
            ));
        }
        let head_dim = q[3];
        if head_dim > MAX_HEAD_DIM {
            return Err(Error::invalid(
                "head_dim",
                head_dim,
                format!("allowed: 1 to {MAX_HEAD_DIM}"),
            ));
        }
        let softmax_scale = options
            .softmax_scale
            .unwrap_or(1.0 / (head_dim as f32).sqrt());
        if !softmax_scale.is_finite() || softmax_scale <= 0.0 {
            return Err(Error::invalid(
                "softmax_scale",
                softmax_scale,
                "must be finite and > 0",
            ));
        }
        let problem = Self {
            batch: q[0],
            heads: q[1],
            seqlen_q: q[2],
            seqlen_k: k[2],
            head_dim,
            softmax_scale,
            causal: options.causal,
        };
        problem.check_index_ranges()?;
        Ok(problem)
    }

    /// The kernels index rows and columns with u32 and a head's rows with u32 counts; grids are
    /// limited to 65 535 in y and z.
    fn check_index_ranges(&self) -> Result<()> {
        let u32_max = u32::MAX as usize;
        for (name, value) in [("seqlen_q", self.seqlen_q), ("seqlen_k", self.seqlen_k)] {
            if value
                .checked_mul(self.head_dim.max(MATMUL_TILE as usize))
                .is_none_or(|n| n > u32_max)
            {
                return Err(Error::invalid(
                    name,
                    value,
                    format!("seqlen × max(head_dim, 16) must fit in 32 bits (≤ {u32_max})"),
                ));
            }
        }
        if self.seqlen_q.div_ceil(MATMUL_TILE as usize) > MAX_GRID_YZ {
            return Err(Error::invalid(
                "seqlen_q",
                self.seqlen_q,
                format!(
                    "at most {} (grid limit)",
                    MAX_GRID_YZ * MATMUL_TILE as usize
                ),
            ));
        }
        if self.batch_heads() > MAX_GRID_YZ {
            return Err(Error::invalid(
                "batch × heads",
                self.batch_heads(),
                format!("at most {MAX_GRID_YZ} (grid limit)"),
            ));
        }
        Ok(())
    }

    pub fn batch_heads(&self) -> usize {
        self.batch * self.heads
    }

    fn shape(&self) -> AttentionShape {
        AttentionShape {
            batch: self.batch as u32,
            heads: self.heads as u32,
            seqlen_q: self.seqlen_q as u32,
            seqlen_k: self.seqlen_k as u32,
            head_dim: self.head_dim as u32,
            softmax_scale: self.softmax_scale,
            causal: self.causal as u32,
            _pad: 0,
        }
    }

    /// Elements of a per-row statistics vector: batch·heads·seqlen_q.
    fn rows(&self) -> usize {
        self.batch_heads() * self.seqlen_q
    }
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

/// FA2's (B_r, B_c) for this problem: the override if valid, else the largest choice that fits.
pub fn fa2_blocks(
    head_dim: usize,
    shared_limit: u32,
    blocks: Option<(u32, u32)>,
) -> Result<(u32, u32)> {
    let d = head_dim as u32;
    let fits = |(r, c): (u32, u32)| kernel_layout::fa2_shared_bytes(r, c, d) <= shared_limit as u64;
    if let Some((r, c)) = blocks {
        if !FA2_BLOCK_CHOICES.contains(&r) || !FA2_BLOCK_CHOICES.contains(&c) {
            return Err(Error::invalid(
                "fa2_blocks",
                format!("({r}, {c})"),
                "B_r and B_c must each be 64 or 128",
            ));
        }
        if !fits((r, c)) {
            return Err(Error::invalid(
                "fa2_blocks",
                format!("({r}, {c})"),
                format!(
                    "needs {} bytes of shared memory at d = {d}; the device allows {shared_limit}",
                    kernel_layout::fa2_shared_bytes(r, c, d)
                ),
            ));
        }
        return Ok((r, c));
    }
    [(128, 128), (128, 64), (64, 128), (64, 64)]
        .into_iter()
        .find(|&b| fits(b))
        .ok_or_else(|| {
            Error::invalid(
                "head_dim",
                d,
                format!("FA2's smallest tiles do not fit in {shared_limit} bytes of shared memory"),
            )
        })
}

/// Runs `algorithm` on Q, K, V and returns O (in Q's layout) and the row statistics.
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
    })
}

/// Allocates the row statistics `algorithm` returns for `problem` (uninitialised).
pub fn new_statistics(gpu: &Gpu, algorithm: Algorithm, problem: &Problem) -> Result<RowStatistics> {
    Ok(match algorithm {
        Algorithm::Standard | Algorithm::Fa2 | Algorithm::Fa2Tc => {
            RowStatistics::LogSumExp(gpu.alloc(problem.rows(), "L")?)
        }
        Algorithm::Fa1 => RowStatistics::MaxAndSum {
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
        let scores_len = problem.rows() * problem.seqlen_k;
        Ok(match algorithm {
            Algorithm::Standard => Self {
                scores: Some(gpu.alloc(scores_len, "S")?),
                probs: Some(gpu.alloc(scores_len, "P")?),
                o_accumulator: None,
            },
            Algorithm::Fa1 => Self {
                scores: None,
                probs: None,
                o_accumulator: Some(
                    gpu.alloc(problem.rows() * problem.head_dim, "FA1's O accumulator")?,
                ),
            },
            Algorithm::Fa2 | Algorithm::Fa2Tc => Self {
                scores: None,
                probs: None,
                o_accumulator: None,
            },
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
/// workspace for this call (see [`attention_with_workspace`] to reuse one).
pub fn attention_into<T: Element>(
    gpu: &Gpu,
    algorithm: Algorithm,
    q: &DeviceTensor<T>,
    k: &DeviceTensor<T>,
    v: &DeviceTensor<T>,
    output: &mut AttentionOutput<T>,
    options: &AttentionOptions,
) -> Result<()> {
    let problem = Problem::new(q.dims(), k.dims(), v.dims(), options)?;
    // Dropped at the end of this call: freed in stream order, after the kernels that use it.
    let workspace = Workspace::new(gpu, algorithm, &problem)?;
    attention_with_workspace(gpu, algorithm, q, k, v, output, &workspace, options)
}

/// The launch itself: checks every argument, then runs `algorithm`'s kernels on the stream.
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
) -> Result<()> {
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
    let shared_limit = gpu.info().shared_memory_per_block;
    let dtype = T::DTYPE;
    match (algorithm, &output.stats) {
        (Algorithm::Standard, RowStatistics::LogSumExp(l)) => {
            let params = StandardParams {
                operands,
                shape: problem.shape(),
                scores: Workspace::<T>::address(gpu, &workspace.scores, "S")?,
                probs: Workspace::<T>::address(gpu, &workspace.probs, "P")?,
                logsumexp: gpu.address(l),
            };
            run_standard(gpu, &problem, dtype, params)
        }
        (Algorithm::Fa1, RowStatistics::MaxAndSum { max, sum }) => {
            let (_, blocks) = fa1_blocks(problem.head_dim, shared_limit, options.fa1_sram_floats)?;
            let params = Fa1Params {
                operands,
                shape: problem.shape(),
                o_accumulator: Workspace::<T>::address(
                    gpu,
                    &workspace.o_accumulator,
                    "the O accumulator",
                )?,
                row_max: gpu.address(max),
                row_sum: gpu.address(sum),
                block_rows: blocks.block_rows,
                block_cols: blocks.block_cols,
            };
            let launch = Launch {
                grid: (problem.batch_heads() as u32, 1, 1),
                threads: THREADS_PER_BLOCK,
                shared_bytes: blocks.shared_bytes(problem.head_dim as u32) as u32,
            };
            gpu.launch(&format!("fa1_forward_{dtype}"), launch, params)
        }
        (Algorithm::Fa2Tc, RowStatistics::LogSumExp(l))
            if uses_tensor_cores(dtype, problem.head_dim, &operands) =>
        {
            let tiling = fa2_tc_tiling(problem.head_dim, options.fa2_tc_tiling)?;
            let (d, warps, row_tiles) = (problem.head_dim, tiling.warps, tiling.row_tiles);
            let (stages, cols) = (tiling.kv_stages, tiling.block_cols);
            let kernel = format!("fa2tc_forward_{dtype}_d{d}_w{warps}r{row_tiles}s{stages}c{cols}");
            let shared_bytes = tiling.shared_bytes(d as u32);
            let rows = (tiling.block_rows(), tiling.threads());
            launch_fa2_grid(gpu, &kernel, &problem, operands, l, rows, shared_bytes)
        }
        (Algorithm::Fa2 | Algorithm::Fa2Tc, RowStatistics::LogSumExp(l)) => {
            let (block_rows, block_cols) =
                fa2_blocks(problem.head_dim, shared_limit, options.fa2_blocks)?;
            let d = problem.head_dim as u32;
            let capacity = kernel_layout::fa2_head_dim_capacity(d).ok_or_else(|| {
                Error::invalid("head_dim", d, format!("allowed: 1 to {MAX_HEAD_DIM}"))
            })?;
            debug_assert_eq!(block_rows % FA2_ROWS_PER_WARP, 0);
            let kernel = format!("fa2_forward_{dtype}_d{capacity}_bc{block_cols}");
            let shared_bytes = kernel_layout::fa2_shared_bytes(block_rows, block_cols, d) as u32;
            let rows = (block_rows, kernel_layout::fa2_threads(block_rows));
            launch_fa2_grid(gpu, &kernel, &problem, operands, l, rows, shared_bytes)
        }
        _ => Err(Error::invalid(
            "output.stats",
            "statistics of another algorithm",
            format!("use `new_statistics` for {algorithm}"),
        )),
    }
}

/// Launches an FA2-family kernel over its grid (⌈seqlen_q/B_r⌉, batch·heads); `rows` is
/// (B_r, threads per block).
fn launch_fa2_grid(
    gpu: &Gpu,
    kernel: &str,
    problem: &Problem,
    operands: Operands,
    logsumexp: &CudaSlice<f32>,
    (block_rows, threads): (u32, u32),
    shared_bytes: u32,
) -> Result<()> {
    let params = Fa2Params {
        operands,
        shape: problem.shape(),
        logsumexp: gpu.address(logsumexp),
        block_rows,
        _pad: 0,
    };
    let row_blocks = problem.seqlen_q.div_ceil(block_rows as usize) as u32;
    let grid = (row_blocks, problem.batch_heads() as u32, 1);
    gpu.launch(
        kernel,
        Launch {
            grid,
            threads,
            shared_bytes,
        },
        params,
    )
}

/// The three kernels of standard attention, with S and P in device memory.
fn run_standard(gpu: &Gpu, problem: &Problem, dtype: DType, params: StandardParams) -> Result<()> {
    let tiles = |n: usize| n.div_ceil(MATMUL_TILE as usize) as u32;
    let bh = problem.batch_heads() as u32;
    let product_shared =
        2 * MATMUL_TILE * kernel_layout::conflict_free_stride(MATMUL_DEPTH.max(MATMUL_TILE)) * 4;
    let warps = THREADS_PER_BLOCK / 32;
    let product = |grid| Launch {
        grid,
        threads: THREADS_PER_BLOCK,
        shared_bytes: product_shared,
    };
    gpu.launch(
        &format!("standard_scores_{dtype}"),
        product((tiles(problem.seqlen_k), tiles(problem.seqlen_q), bh)),
        params,
    )?;
    let softmax = Launch {
        grid: (problem.seqlen_q.div_ceil(warps as usize) as u32, bh, 1),
        threads: THREADS_PER_BLOCK,
        shared_bytes: 0,
    };
    gpu.launch(&format!("standard_softmax_{dtype}"), softmax, params)?;
    gpu.launch(
        &format!("standard_output_{dtype}"),
        product((tiles(problem.head_dim), tiles(problem.seqlen_q), bh)),
        params,
    )
}

/// FA2-TC's tiling: the override if the kernel is compiled with it at this head dim, else the
/// default for the head dim.
pub fn fa2_tc_tiling(head_dim: usize, tiling: Option<Fa2TcTiling>) -> Result<Fa2TcTiling> {
    let d = head_dim as u32;
    match tiling {
        None => Ok(Fa2TcTiling::default_for(d)),
        Some(t) if t.is_compiled_for(d) => Ok(t),
        Some(t) => {
            let allowed: Vec<String> = kernel_layout::FA2_TC_TILINGS
                .iter()
                .filter(|t| t.is_compiled_for(d))
                .map(|t| t.to_string())
                .collect();
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

/// Parses an FA2-TC tiling: `WxR`, optionally followed by `sS` and `cC` (warps, row tiles per
/// warp, K/V stages, B_c), e.g. `4x2`, `4x2s1`, `4x2s1c32`; the stages default to 2 and B_c to
/// 64. Whether the kernel is compiled with it is checked per head dim by [`fa2_tc_tiling`].
pub fn parse_fa2_tc_tiling(text: &str) -> Result<Fa2TcTiling> {
    let invalid = || {
        Error::invalid(
            "fa2-tc-tiling",
            text,
            "WARPSxROW_TILES, optionally followed by sSTAGES and cB_C, e.g. 4x2, 4x2s1 or 4x2s1c32",
        )
    };
    let number = |s: &str| s.parse::<u32>().map_err(|_| invalid());
    let optional = |value: Option<&str>, default: u32| value.map_or(Ok(default), number);
    // The optional fields, last first: the text before the tag, and the tag's value if present.
    let (warps, rest) = text.split_once('x').ok_or_else(invalid)?;
    let (rest, cols) = rest
        .split_once('c')
        .map_or((rest, None), |(r, c)| (r, Some(c)));
    let (row_tiles, stages) = rest
        .split_once('s')
        .map_or((rest, None), |(r, s)| (r, Some(s)));
    Ok(Fa2TcTiling::new(
        number(warps)?,
        number(row_tiles)?,
        optional(stages, 2)?,
        optional(cols, kernel_layout::FA2_TC_DEFAULT_BLOCK_COLS)?,
    ))
}

/// [`parse_fa2_tc_tiling`] of an optional override: `None` (the default per head dim) stays `None`.
pub fn parse_optional_fa2_tc_tiling(text: Option<&str>) -> Result<Option<Fa2TcTiling>> {
    text.map(parse_fa2_tc_tiling).transpose()
}

/// Whether [`Algorithm::Fa2Tc`] runs on tensor cores for this call: f16 or bf16, a head dim in
/// `FA2_TC_HEAD_DIMS`, and every row start 16-byte aligned (its copies are 16-byte `cp.async`).
/// Otherwise it runs the scalar FA2.
pub fn uses_tensor_cores(dtype: DType, head_dim: usize, operands: &Operands) -> bool {
    let aligned = |view: &flash_kernels::params::TensorView| {
        let step = kernel_layout::FA2_TC_COPY_ELEMENTS as u64;
        view.addr.is_multiple_of(16)
            && [view.batch_stride, view.head_stride, view.row_stride]
                .iter()
                .all(|s| s.is_multiple_of(step))
    };
    dtype != DType::F32
        && kernel_layout::FA2_TC_HEAD_DIMS.contains(&(head_dim as u32))
        && [&operands.q, &operands.k, &operands.v, &operands.o]
            .into_iter()
            .all(aligned)
}
