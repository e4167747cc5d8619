//! The tensor-core FA2's tile configuration: [`Fa2TcTiling`] (how B_r splits over warps and row
//! tiles, B_c, the K/V pipeline depth), the shared-memory geometry the host sizes launches with,
//! and [`Fa2TcConfig`], one type per compiled kernel with every size the kernel's register arrays
//! need as associated constants, checked at compile time.

use crate::common::limits::{
    MAX_REGISTERS_PER_THREAD, MAX_SHARED_BYTES_PER_BLOCK, MAX_THREADS_PER_BLOCK,
};
use crate::tile::fragment::{ACCUMULATORS_PER_TILE, MMA_K, MMA_M, MMA_N};
pub use crate::tile::layout::COPY_ELEMENTS;

/// How the tensor-core FA2 (`fa2_tc`) splits a block's rows, how many keys a K/V block holds, and
/// how deep its K/V pipeline is: `warps` warps, each owning `row_tiles` m16 tiles of Q
/// (split-Q), so B_r = 16 · warps · row_tiles; B_c = `block_cols` keys; `kv_stages`
/// shared-memory buffers for K_j and V_j (2: block j + 1 is copied while block j is computed;
/// 1: FlashAttention-2's own schedule, V_j copied behind S = Q_i·K_jᵀ and K_j+1 behind P̃·V_j,
/// in less shared memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

/// The B_c a tiling has when its name leaves it out (`4x2s1` is `4x2s1c64`).
pub const DEFAULT_BLOCK_COLS: u32 = 64;

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
        MMA_M * self.warps * self.row_tiles
    }

    /// Field-by-field equality usable in `const` code.
    pub const fn const_eq(self, other: Self) -> bool {
        self.warps == other.warps
            && self.row_tiles == other.row_tiles
            && self.kv_stages == other.kv_stages
            && self.block_cols == other.block_cols
    }

    pub const fn threads(self) -> u32 {
        32 * self.warps
    }

    /// Shared memory: Q_i, and K_j, V_j in `kv_stages` buffers each, 16-bit elements.
    pub const fn shared_bytes(self, head_dim: u32) -> u32 {
        (self.block_rows() + self.kv_stages * 2 * self.block_cols) * shared_row_stride(head_dim) * 2
    }

    /// The tiling the host picks, measured on the H200 (docs/perf, FA2-TC v3 and v5): 4 warps × 2
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
/// block (v5). Measured on the H200 (docs/perf, FA2-TC v6): +7 to +13% at d = 64 to 128, but 3–5%
/// slower at d = 256, where v5's unconditional rescale stays.
pub const fn conditional_rescale(head_dim: u32) -> bool {
    head_dim <= 128
}

/// Row stride, in 16-bit elements, of the tensor-core kernel's shared tiles: 16 bytes of padding
/// per row shift consecutive rows by four banks, so the eight rows one `ldmatrix` reads land in
/// eight different bank groups.
pub const fn shared_row_stride(head_dim: u32) -> u32 {
    head_dim + 8
}

/// Q fragments stay in registers when they take at most this many (row tiles × d/16 x4 loads,
/// 4 registers each: 32 registers); otherwise they are re-read from shared memory at every K/V
/// block.
pub const Q_REGISTER_CHUNKS: u32 = 8;

/// One compiled FA2-TC kernel: its head dim and tiling, and the sizes of its per-lane register
/// arrays. Implemented by [`fa2_tc_config!`] for each kernel of the list
/// (`registry::for_each_kernel!`); the kernel body is generic over this one type.
pub trait Fa2TcConfig {
    const HEAD_DIM: u32;
    const TILING: Fa2TcTiling;
    /// d / MMA_K: the k-steps of S = Q_i·K_jᵀ (and Q's A fragments per row tile).
    type const Q_CHUNKS: usize;
    /// d / MMA_N: Õ's accumulator tiles per row tile.
    type const O_TILES: usize;
    /// MMA_M-row tiles of Q per warp.
    type const ROW_TILES: usize;
    /// B_c / MMA_N: S's accumulator tiles per row tile and K/V block.
    type const KEY_TILES: usize;
    /// B_c / MMA_K: the k-steps of P̃·V_j.
    type const KEY_CHUNKS: usize;

    /// K/V shared-memory stages (1 or 2), as a scalar constant: the kernel branches on it, and a
    /// scalar constant folds as early as a const generic would (a field of `TILING` only after
    /// SROA, which changes LLVM's inlining and block layout).
    const KV_STAGES: u32 = Self::TILING.kv_stages;

    /// Whether Q's fragments are loaded once into registers (else re-read per block).
    const Q_IN_REGISTERS: bool =
        Self::TILING.row_tiles * Self::HEAD_DIM / MMA_K <= Q_REGISTER_CHUNKS;
    /// Whether the running max moves only when it jumps (see [`conditional_rescale`]).
    const CONDITIONAL_RESCALE: bool = conditional_rescale(Self::HEAD_DIM);
    /// f32 accumulators a lane keeps live across a block step: Õ and S for each row tile.
    const ACCUMULATOR_REGISTERS: u32 =
        Self::TILING.row_tiles * (Self::HEAD_DIM + Self::TILING.block_cols) / MMA_N
            * ACCUMULATORS_PER_TILE;

    /// Compile-time checks, evaluated where the kernel is instantiated.
    const CHECKED: () = {
        let tiling = Self::TILING;
        assert!(Self::Q_CHUNKS * MMA_K as usize == Self::HEAD_DIM as usize);
        assert!(Self::O_TILES * MMA_N as usize == Self::HEAD_DIM as usize);
        assert!(Self::ROW_TILES == tiling.row_tiles as usize);
        assert!(Self::KEY_TILES * MMA_N as usize == tiling.block_cols as usize);
        assert!(Self::KEY_CHUNKS * MMA_K as usize == tiling.block_cols as usize);
        assert!(tiling.kv_stages == 1 || tiling.kv_stages == 2);
        assert!(Self::HEAD_DIM.is_multiple_of(COPY_ELEMENTS));
        assert!(tiling.threads() <= MAX_THREADS_PER_BLOCK);
        assert!(tiling.shared_bytes(Self::HEAD_DIM) <= MAX_SHARED_BYTES_PER_BLOCK);
        // Õ and S of every row tile must fit in a lane's registers, with room for addresses and
        // statistics (at d = 256 two row tiles would need 320).
        assert!(Self::ACCUMULATOR_REGISTERS < MAX_REGISTERS_PER_THREAD);
    };
}

/// `fa2_tc_config!(Name, d, warps, row tiles, K/V stages, B_c)`: a type implementing
/// [`Fa2TcConfig`].
#[macro_export]
macro_rules! fa2_tc_config {
    ($name:ident, $d:literal, $warps:literal, $rows:literal, $stages:literal, $cols:literal) => {
        struct $name;
        impl $crate::fwd::fa2_tc::config::Fa2TcConfig for $name {
            const HEAD_DIM: u32 = $d;
            const TILING: $crate::fwd::fa2_tc::config::Fa2TcTiling =
                $crate::fwd::fa2_tc::config::Fa2TcTiling::new($warps, $rows, $stages, $cols);
            type const Q_CHUNKS: usize = const { $d / 16 };
            type const O_TILES: usize = const { $d / 8 };
            type const ROW_TILES: usize = $rows;
            type const KEY_TILES: usize = const { $cols / 8 };
            type const KEY_CHUNKS: usize = const { $cols / 16 };
        }
    };
}
