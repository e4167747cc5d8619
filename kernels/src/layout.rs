//! Tile sizes and shared-memory layouts, shared by the kernels (which carve shared memory) and the
//! host (which sizes the launch). One source of truth, so the two cannot disagree.

/// Row stride, in floats, of a shared-memory tile whose rows hold `head_dim` values.
///
/// Kernels read a column of such a tile with one row per lane; an odd stride puts the 32 lanes in
/// 32 different banks (4-byte banks, 32 of them), so an even `head_dim` gets one float of padding.
#[inline(always)]
pub const fn conflict_free_stride(head_dim: u32) -> u32 {
    head_dim | 1
}

/// Floats in one 16-byte shared-memory access (`tile::QuadTile`).
pub const QUAD: u32 = 4;

/// Row stride, in floats, of a `tile::QuadTile` whose rows hold `row_len` values: whole quads (so
/// every quad is 16-byte aligned), an odd number of them. A 16-byte load is served in four phases
/// of eight lanes; eight lanes reading one quad each from eight consecutive rows then hit eight
/// different quad-bank groups, which an odd quad stride guarantees.
#[inline(always)]
pub const fn quad_stride(row_len: u32) -> u32 {
    QUAD * (row_len.div_ceil(QUAD) | 1)
}

/// `n` rounded up to whole quads.
#[inline(always)]
pub const fn quad_padded(n: u32) -> u32 {
    n.div_ceil(QUAD) * QUAD
}

/// Threads per block of the standard-attention and FA1 kernels.
pub const THREADS_PER_BLOCK: u32 = 256;

/// Side of the square output tile of the standard attention's two matrix products.
pub const MATMUL_TILE: u32 = 16;
/// Depth of one shared-memory step of those products.
pub const MATMUL_DEPTH: u32 = 16;

/// FA1's block sizes from the article: B_c = ⌈M/4d⌉ and B_r = min(⌈M/4d⌉, d), where M is the
/// on-chip memory, in f32 elements, given to the four blocks Q_i, K_j, V_j, O_i.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fa1Blocks {
    pub block_rows: u32,
    pub block_cols: u32,
}

impl Fa1Blocks {
    /// The article's formula for an SRAM budget of `sram_floats` (M) and head dim `head_dim` (d).
    pub const fn from_sram(sram_floats: u32, head_dim: u32) -> Self {
        let block_cols = sram_floats.div_ceil(4 * head_dim);
        let block_rows = if block_cols < head_dim {
            block_cols
        } else {
            head_dim
        };
        Self {
            block_rows,
            block_cols,
        }
    }

    /// Shared memory the FA1 kernel needs with these blocks: Q_i, O_i (B_r × d), K_j, V_j
    /// (B_c × d), S_ij (B_r × B_c), and four per-row vectors (m_i, ℓ_i, α, β), all f32. The
    /// tiles are `QuadTile`s: rows rounded up to whole quads, at `quad_stride`.
    pub const fn shared_bytes(&self, head_dim: u32) -> u64 {
        let stride = quad_stride(head_dim) as u64;
        let rows = quad_padded(self.block_rows) as u64;
        let cols = quad_padded(self.block_cols) as u64;
        let score_stride = quad_stride(self.block_cols) as u64;
        let floats = 2 * rows * stride
            + 2 * cols * stride
            + rows * score_stride
            + FA1_ROW_VECTORS * self.block_rows as u64;
        floats * 4
    }
}

/// Per-row vectors the FA1 kernel keeps in shared memory: m_i, ℓ_i, α and β (ℓ_new/ℓ_i folded).
pub const FA1_ROW_VECTORS: u64 = 4;

/// FA2's candidate block sizes (the article: tuned from {64, 128} × {64, 128}).
pub const FA2_BLOCK_CHOICES: [u32; 2] = [64, 128];
/// Rows of Q owned by one warp in the FA2 kernel (split-Q: warps never exchange partial results).
pub const FA2_ROWS_PER_WARP: u32 = 8;
/// Head-dim capacities the FA2 kernel is compiled for: each thread keeps `capacity / 32` columns of
/// its rows of Õ in registers, so the capacity must be known at compile time.
pub const FA2_HEAD_DIM_CAPACITIES: [u32; 4] = [32, 64, 128, 256];

/// Smallest compiled head-dim capacity that holds `head_dim`, if any.
pub const fn fa2_head_dim_capacity(head_dim: u32) -> Option<u32> {
    let mut i = 0;
    while i < FA2_HEAD_DIM_CAPACITIES.len() {
        if head_dim <= FA2_HEAD_DIM_CAPACITIES[i] {
            return Some(FA2_HEAD_DIM_CAPACITIES[i]);
        }
        i += 1;
    }
    None
}

/// Shared memory the FA2 kernel needs: Q_i (B_r × d), K_j and V_j (B_c × d), and P̃ (B_r × B_c),
/// all f32.
pub const fn fa2_shared_bytes(block_rows: u32, block_cols: u32, head_dim: u32) -> u64 {
    let stride = conflict_free_stride(head_dim) as u64;
    let (rows, cols) = (block_rows as u64, block_cols as u64);
    (rows * stride + 2 * cols * stride + rows * cols) * 4
}

/// FA2 threads per block for `block_rows`: one warp per [`FA2_ROWS_PER_WARP`] rows.
pub const fn fa2_threads(block_rows: u32) -> u32 {
    block_rows / FA2_ROWS_PER_WARP * 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fa1_formula_matches_the_article() {
        // M = 16384 floats, d = 64: B_c = ⌈16384/256⌉ = 64, B_r = min(64, 64) = 64.
        assert_eq!(
            Fa1Blocks::from_sram(16384, 64),
            Fa1Blocks {
                block_rows: 64,
                block_cols: 64
            }
        );
        // d = 128: B_c = 32, B_r = min(32, 128) = 32.
        assert_eq!(
            Fa1Blocks::from_sram(16384, 128),
            Fa1Blocks {
                block_rows: 32,
                block_cols: 32
            }
        );
        // d = 16: B_c = 256, B_r = min(256, 16) = 16; a ceiling, not a floor.
        assert_eq!(
            Fa1Blocks::from_sram(16385, 16),
            Fa1Blocks {
                block_rows: 16,
                block_cols: 257
            }
        );
    }

    #[test]
    fn quad_stride_is_whole_and_odd_quads() {
        for row_len in 1..=300 {
            let stride = quad_stride(row_len);
            assert!(
                stride >= row_len && stride < row_len + 2 * QUAD,
                "{row_len}: {stride}"
            );
            assert_eq!(stride % QUAD, 0, "{row_len}");
            assert_eq!((stride / QUAD) % 2, 1, "{row_len}");
        }
        assert_eq!(quad_stride(40), 44);
        assert_eq!(quad_stride(128), 132);
        assert_eq!(quad_padded(57), 60);
    }

    #[test]
    fn fa1_shared_bytes_count_the_padded_tiles() {
        // d = 40, B_r = 40, B_c = 363: Q, O 40 × 44; K, V 364 × 44; S 40 × 364 (91 quads, odd);
        // four vectors of 40.
        let blocks = Fa1Blocks {
            block_rows: 40,
            block_cols: 363,
        };
        let floats = 2 * 40 * 44 + 2 * 364 * 44 + 40 * 364 + 4 * 40;
        assert_eq!(blocks.shared_bytes(40), floats * 4);
    }

    #[test]
    fn fa2_capacity_is_the_smallest_that_fits() {
        assert_eq!(fa2_head_dim_capacity(1), Some(32));
        assert_eq!(fa2_head_dim_capacity(59), Some(64));
        assert_eq!(fa2_head_dim_capacity(128), Some(128));
        assert_eq!(fa2_head_dim_capacity(129), Some(256));
        assert_eq!(fa2_head_dim_capacity(257), None);
    }
}

/// The most threads a block of kernel `name` is launched with. `ptx-build` writes it into the PTX
/// as `.maxntid`, so ptxas budgets registers for that many threads (at 512 threads, 128 registers
/// each) instead of assuming the worst, and the host checks launches against it.
pub fn kernel_max_threads(name: &str) -> u32 {
    if name.starts_with("fa2tc_forward_") {
        // `fa2tc_forward_<dtype>_d<d>_w<warps>r<row tiles>s<stages>c<B_c>`.
        let warps = name
            .rsplit("_w")
            .next()
            .and_then(|w| w.split('r').next())
            .and_then(|w| w.parse::<u32>().ok());
        return warps.unwrap_or(8) * 32;
    }
    if let Some(rest) = name.strip_prefix("fa2_forward_") {
        // At head dim 256 only B_r = 64 fits in shared memory; smaller dims may use B_r = 128.
        let largest_rows = if rest.contains("_d256_") { 64 } else { 128 };
        fa2_threads(largest_rows)
    } else {
        THREADS_PER_BLOCK
    }
}

/// How the tensor-core FA2 (`fa2_tc`) splits a block's rows, how many keys a K/V block holds, and
/// how deep its K/V pipeline is: `warps` warps, each owning `row_tiles` m16 tiles of Q
/// (split-Q), so B_r = 16 · warps · row_tiles; B_c = `block_cols` keys; `kv_stages`
/// shared-memory buffers for K_j and V_j (2: block j + 1 is copied while block j is computed;
/// 1: FlashAttention-2's own schedule, V_j copied behind S = Q_i·K_jᵀ and K_j+1 behind P̃·V_j,
/// in less shared memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fa2TcTiling {
    pub warps: u32,
    pub row_tiles: u32,
    pub kv_stages: u32,
    pub block_cols: u32,
}

impl core::fmt::Display for Fa2TcTiling {
    /// `WxRsScC`, e.g. `4x2s2c64`: warps, row tiles per warp, K/V stages, B_c.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let Self {
            warps,
            row_tiles,
            kv_stages,
            block_cols,
        } = self;
        write!(f, "{warps}x{row_tiles}s{kv_stages}c{block_cols}")
    }
}

/// The tilings the tensor-core kernel is compiled for (at d = 256 the single-row-tile ones only;
/// see [`Fa2TcTiling::is_compiled_for`]). B_c = 32 and 48 only with two row tiles: that is where
/// the 16 × B_c S tiles of both row tiles, beside Õ, press on the 255-register limit (at
/// d = 128, `4x2s1c64` spills 92 bytes; `4x2s2c48` and the `c32` tilings spill none).
pub const FA2_TC_TILINGS: [Fa2TcTiling; 9] = [
    Fa2TcTiling::new(4, 1, 2, 64),
    Fa2TcTiling::new(8, 1, 2, 64),
    Fa2TcTiling::new(4, 2, 2, 64),
    Fa2TcTiling::new(4, 1, 1, 64),
    Fa2TcTiling::new(8, 1, 1, 64),
    Fa2TcTiling::new(4, 2, 1, 64),
    Fa2TcTiling::new(4, 2, 2, 32),
    Fa2TcTiling::new(4, 2, 1, 32),
    Fa2TcTiling::new(4, 2, 2, 48),
];
/// The B_c a tiling has when its name leaves it out (`4x2s1` is `4x2s1c64`).
pub const FA2_TC_DEFAULT_BLOCK_COLS: u32 = 64;
/// Head dims the tensor-core kernel is compiled for; others use the scalar FA2.
pub const FA2_TC_HEAD_DIMS: [u32; 5] = [32, 64, 96, 128, 256];

impl Fa2TcTiling {
    pub const fn new(warps: u32, row_tiles: u32, kv_stages: u32, block_cols: u32) -> Self {
        Self {
            warps,
            row_tiles,
            kv_stages,
            block_cols,
        }
    }

    /// B_r.
    pub const fn block_rows(self) -> u32 {
        16 * self.warps * self.row_tiles
    }

    pub const fn threads(self) -> u32 {
        32 * self.warps
    }

    /// Shared memory: Q_i, and K_j, V_j in `kv_stages` buffers each, 16-bit elements.
    pub const fn shared_bytes(self, head_dim: u32) -> u32 {
        (self.block_rows() + self.kv_stages * 2 * self.block_cols) * fa2_tc_stride(head_dim) * 2
    }

    /// Whether the kernel is compiled with this tiling at `head_dim`. At d = 256 two row tiles
    /// would hold 2·256 f32 accumulators per lane, past the 255-register limit: single row tiles
    /// only.
    pub const fn is_compiled_for(self, head_dim: u32) -> bool {
        let mut i = 0;
        let mut listed = false;
        while i < FA2_TC_TILINGS.len() {
            let t = FA2_TC_TILINGS[i];
            listed |= t.warps == self.warps
                && t.row_tiles == self.row_tiles
                && t.kv_stages == self.kv_stages
                && t.block_cols == self.block_cols;
            i += 1;
        }
        listed && (head_dim <= 128 || self.row_tiles == 1)
    }

    /// The tiling the host picks, measured on the H200 (PERF.md, FA2-TC v3 and v5): 4 warps × 2
    /// row tiles (B_r = 128), with two K/V stages at d ≤ 64 and one (FlashAttention-2's
    /// schedule, 2–5% faster there) at d = 96 and 128; at d = 256, 4 warps × 1 row tile with one
    /// stage (B_r = 64: 8% faster than 8 × 1).
    pub const fn default_for(head_dim: u32) -> Self {
        match head_dim {
            0..=64 => Fa2TcTiling::new(4, 2, 2, 64),
            65..=128 => Fa2TcTiling::new(4, 2, 1, 64),
            _ => Fa2TcTiling::new(4, 1, 1, 64),
        }
    }
}

/// Whether the tensor-core kernel at `head_dim` moves a row's running max only when it jumps past
/// `softmax::RESCALE_THRESHOLD` (one warp vote per K/V block, FA2-TC v6) instead of at every
/// block (v5). Measured on the H200 (PERF.md, FA2-TC v6): +7 to +13% at d = 64 to 128, but 3–5%
/// slower at d = 256, where v5's unconditional rescale stays.
pub const fn fa2_tc_conditional_rescale(head_dim: u32) -> bool {
    head_dim <= 128
}

/// Elements of the global-memory rows a tensor-core kernel copies with one 16-byte `cp.async`;
/// strides must be multiples of it.
pub const FA2_TC_COPY_ELEMENTS: u32 = 8;

/// Row stride, in 16-bit elements, of the tensor-core kernel's shared tiles: 16 bytes of padding
/// per row shift consecutive rows by four banks, so the eight rows one `ldmatrix` reads land in
/// eight different bank groups.
pub const fn fa2_tc_stride(head_dim: u32) -> u32 {
    head_dim + 8
}
