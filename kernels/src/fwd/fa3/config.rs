//! FA3's tile configuration: [`Fa3Tiling`] (consumer warpgroups, B_c), the shared-memory layout
//! the host sizes launches with, and [`Fa3Config`], one type per compiled kernel with the sizes
//! of its register arrays, checked at compile time.

use crate::common::form::KernelForm;
use crate::common::limits::{MAX_SHARED_BYTES_PER_BLOCK, MAX_THREADS_PER_BLOCK, REGISTERS_PER_SM};
use crate::common::softmax::Exp2Split;

/// Threads of a warpgroup: the 4 warps that issue one `wgmma` together.
pub const WARPGROUP_THREADS: u32 = 128;
/// Rows of Q one consumer warpgroup owns: the M of `wgmma.m64nNk16`.
pub const WARPGROUP_ROWS: u32 = 64;
/// Depth of one wgmma step (K) for 16-bit inputs.
pub const WGMMA_K: u32 = 16;
/// 16-bit columns of one 128-byte-swizzled panel of a shared tile (one TMA box's width).
pub const PANEL_COLS: u32 = 64;
/// Bytes of one panel row.
pub const PANEL_ROW_BYTES: u32 = 2 * PANEL_COLS;
/// Columns of an f32 tile's TMA box under the same 128-byte swizzle (the backward's dQ_i
/// staging): one swizzle row of f32.
pub const F32_BOX_COLS: u32 = PANEL_ROW_BYTES / 4;
/// Shared tiles start on a 1024-byte boundary (the 128-byte swizzle's period, which TMA and
/// wgmma both apply to the address bits). The dynamic shared window is aligned up to it at run
/// time, so a launch asks for this much slack.
pub const TILE_ALIGNMENT: u32 = 1024;
/// Rows of one TMA store of O: one warp's rows of the m64 accumulator (the O map's box).
pub const O_STORE_ROWS: u32 = 16;
/// K/V ring depth: block j + 1 (and the start of j + 2) lands while block j is computed.
pub const KV_STAGES: u32 = 2;
/// Q tiles a persistent block holds at most: the next tile's Q_i lands while the current tile
/// is computed (cuDNN's Hopper kernel keeps two).
pub const MAX_Q_STAGES: u32 = 2;
/// mbarriers: Q full and Q empty per Q stage; K full, V full, K empty, V empty per K/V stage.
pub const BARRIERS: u32 = 2 * MAX_Q_STAGES + 4 * KV_STAGES;

/// How an FA3 block splits: `consumers` warpgroups of 64 query rows each (B_r = 64·consumers)
/// beside one producer warpgroup, and `block_cols` keys per K/V block (B_c); and its grid: one
/// block per tile (a tile is B_r rows of one head), or `persistent`: one block per SM, each
/// taking tiles from a counter until none is left (FlashAttention-3's dynamic persistent
/// scheduler), so the next tile's Q and first K/V blocks load while the current one finishes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fa3Tiling {
    pub consumers: u32,
    pub block_cols: u32,
    pub persistent: bool,
}

impl core::fmt::Display for Fa3Tiling {
    /// `wWcC`, e.g. `w2c128`: consumer warpgroups, B_c; `p` after it for the persistent grid.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let grid = if self.persistent { "p" } else { "" };
        write!(f, "w{}c{}{grid}", self.consumers, self.block_cols)
    }
}

impl Fa3Tiling {
    /// One block per tile.
    pub const fn new(consumers: u32, block_cols: u32) -> Self {
        Self {
            consumers,
            block_cols,
            persistent: false,
        }
    }

    /// The same split on the persistent grid.
    pub const fn on_persistent_grid(self) -> Self {
        Self {
            persistent: true,
            ..self
        }
    }

    /// B_r.
    pub const fn block_rows(self) -> u32 {
        WARPGROUP_ROWS * self.consumers
    }

    /// The producer warpgroup and the consumers.
    pub const fn threads(self) -> u32 {
        WARPGROUP_THREADS * (1 + self.consumers)
    }

    pub const fn const_eq(self, other: Self) -> bool {
        self.consumers == other.consumers
            && self.block_cols == other.block_cols
            && self.persistent == other.persistent
    }

    /// Registers per thread of the producer and of the consumers after `setmaxnreg`
    /// ([`warpgroup_registers`]).
    pub const fn registers(self) -> (u32, u32) {
        warpgroup_registers(self.consumers)
    }

    /// Bytes of the Q tile's panels (B_r rows each).
    pub const fn q_bytes(self, head_dim: u32) -> u32 {
        panels(head_dim) * self.block_rows() * PANEL_ROW_BYTES
    }

    /// Bytes of one K or V tile (B_c rows, every panel).
    pub const fn kv_bytes(self, head_dim: u32) -> u32 {
        panels(head_dim) * self.block_cols * PANEL_ROW_BYTES
    }

    /// Q tiles in shared memory: two on the persistent grid where they fit beside the K/V ring
    /// (d ≤ 128), so the producer loads the next tile's Q_i while the consumers finish the
    /// current one; else one.
    pub const fn q_stages(self, head_dim: u32) -> u32 {
        if self.persistent
            && self.shared_bytes_with(head_dim, MAX_Q_STAGES, 0) <= MAX_SHARED_BYTES_PER_BLOCK
        {
            MAX_Q_STAGES
        } else {
            1
        }
    }

    /// Whether the consumers store O through a shared tile by TMA (each warp its 16 rows, cuDNN's
    /// epilogue), which the persistent grid's next tile overlaps; where the tile fits beside the
    /// Q stages and the ring (d ≤ 128) and the consumers have 240 registers (with three
    /// consumers' 160 the d = 64 kernel spilled 88 bytes, 51 local accesses in its tile loop).
    /// Elsewhere each lane stores its pairs from registers.
    pub const fn stores_o_by_tma(self, head_dim: u32) -> bool {
        let q_stages = self.q_stages(head_dim);
        self.persistent
            && self.consumers <= 2
            && self.shared_bytes_with(head_dim, q_stages, 1) <= MAX_SHARED_BYTES_PER_BLOCK
    }

    /// Dynamic shared memory: the alignment slack, the Q stages, the K and V ring, the O tile
    /// (where O leaves by TMA), the barriers, and each Q stage's tile number (the persistent
    /// grid's; 8 bytes each, for alignment).
    pub const fn shared_bytes(self, head_dim: u32) -> u32 {
        let o_tiles = if self.stores_o_by_tma(head_dim) { 1 } else { 0 };
        self.shared_bytes_with(head_dim, self.q_stages(head_dim), o_tiles)
    }

    const fn shared_bytes_with(self, head_dim: u32, q_stages: u32, o_tiles: u32) -> u32 {
        TILE_ALIGNMENT
            + (q_stages + o_tiles) * self.q_bytes(head_dim)
            + 2 * KV_STAGES * self.kv_bytes(head_dim)
            + 8 * BARRIERS
            + 8 * MAX_Q_STAGES
    }

    /// The tiling the host picks at a compiled head dim: B_c as large as shared memory and the
    /// consumers' registers allow (FlashAttention-3's sizes, `hopper/tile_size.h`, within the
    /// two-consumer design); on the persistent grid where it measured faster (docs/perf, "FA3 on
    /// Hopper": call 9 at d = 64 and 128; nineteenth session at d = 96, 192 and 256), which is
    /// where tiles are short (the next tile's Q, first K/V blocks and, at d ≤ 128, its O store
    /// overlap the current one), and at d = 128 without the mask at every length.
    pub const fn default_for(head_dim: u32, causal: bool, seqlen_k: u32) -> Self {
        let split = match head_dim {
            0..=64 => Fa3Tiling::new(3, 128),
            65..=128 => Fa3Tiling::new(2, 128),
            129..=192 => Fa3Tiling::new(2, 112),
            _ => Fa3Tiling::new(2, 80),
        };
        let persistent = match head_dim {
            64 => seqlen_k <= 2048,
            96 => seqlen_k <= 1024 || (causal && seqlen_k <= 2048),
            128 => seqlen_k <= 2048 || !causal,
            192 => seqlen_k <= 1024,
            256 => causal && seqlen_k <= 1024,
            _ => false,
        };
        if persistent {
            split.on_persistent_grid()
        } else {
            split
        }
    }
}

/// Registers per thread of the producer warpgroup and of each of `consumers` consumer
/// warpgroups after `setmaxnreg` (FlashAttention-3's split, forward and backward): the producer
/// only issues copies.
pub const fn warpgroup_registers(consumers: u32) -> (u32, u32) {
    match consumers {
        1 => (56, 256),
        2 => (24, 240),
        _ => (32, 160),
    }
}

/// 64-column panels of a tile `head_dim` wide (the last one zero-filled past head_dim by TMA).
pub const fn panels(head_dim: u32) -> u32 {
    head_dim.div_ceil(PANEL_COLS)
}

/// The exponentials a kernel at `head_dim` moves to the FMA units
/// ([`exp2_polynomial`](crate::common::softmax::exp2_polynomial)): at d = 64 the SFU's 16
/// exponentials per cycle take as long as a K/V block's two products on the tensor cores, at
/// d ≥ 128 half as long or less. None until the split is timed (docs/perf, "FA3 on Hopper", v6):
/// for that A/B, a PTX build with `FLASH_ATTN_FA3_EXP2_POLYNOMIAL_EVERY=n` in its environment
/// moves every n-th 8-key tile's exponentials at d ≤ 64.
pub const fn exp2_split(head_dim: u32) -> Exp2Split {
    match option_env!("FLASH_ATTN_FA3_EXP2_POLYNOMIAL_EVERY") {
        Some(every) if head_dim <= 64 => Exp2Split {
            polynomial_every: parse_count(every),
        },
        _ => Exp2Split::SFU_ONLY,
    }
}

/// A decimal count from a build-time setting; anything else fails the build.
const fn parse_count(text: &str) -> usize {
    let bytes = text.as_bytes();
    assert!(!bytes.is_empty(), "an empty count");
    let mut value = 0;
    let mut i = 0;
    while i < bytes.len() {
        assert!(bytes[i].is_ascii_digit(), "a count must be decimal digits");
        value = value * 10 + (bytes[i] - b'0') as usize;
        i += 1;
    }
    value
}

/// The head dims FA3 is compiled for; a problem runs on the smallest that holds its head dim.
pub const HEAD_DIMS: [u32; 5] = [64, 96, 128, 192, 256];

/// One compiled FA3 kernel: its head dim and tiling, and the sizes of its per-lane register
/// arrays. Implemented by [`fa3_config!`] for each kernel of the list.
pub trait Fa3Config {
    const HEAD_DIM: u32;
    const TILING: Fa3Tiling;
    /// B_c / 8: the 16 × 8 tiles of one warp's rows of S.
    type const S_TILES: usize;
    /// d / 8: the tiles of one warp's rows of Õ.
    type const O_TILES: usize;
    /// B_c / 16: the k-steps of P̃·V_j (P̃'s A fragments).
    type const P_CHUNKS: usize;

    const BLOCK_ROWS: u32 = Self::TILING.block_rows();
    /// Whether the block walks tiles from the counter (the persistent grid) or computes the one
    /// tile its block index names.
    const PERSISTENT: bool = Self::TILING.persistent;
    /// Which calls the kernel serves ([`KernelForm`]): a packed batch of sequences of
    /// different lengths (`common::params::PackedSequences`), or a sliding window and
    /// soft-capping; both on the one-tile grid only.
    const FORM: KernelForm;
    const PACKED: bool = Self::FORM.is_packed();
    const LOCAL: bool = Self::FORM.is_local();
    const BLOCK_COLS: u32 = Self::TILING.block_cols;
    const PANELS: u32 = panels(Self::HEAD_DIM);
    /// k-steps of S = Q_i·K_jᵀ.
    const Q_STEPS: u32 = Self::HEAD_DIM / WGMMA_K;
    const Q_BYTES: u32 = Self::TILING.q_bytes(Self::HEAD_DIM);
    /// Q tiles in shared memory ([`Fa3Tiling::q_stages`]).
    const Q_STAGES: u32 = Self::TILING.q_stages(Self::HEAD_DIM);
    /// Whether O leaves through shared memory by TMA ([`Fa3Tiling::stores_o_by_tma`]).
    const O_BY_TMA: bool = Self::TILING.stores_o_by_tma(Self::HEAD_DIM);
    const KV_BYTES: u32 = Self::TILING.kv_bytes(Self::HEAD_DIM);
    /// Whether the consumer warpgroups take turns to issue their products (ping-pong, see
    /// `kernel::GemmTurns`), so one's softmax overlaps another's products.
    const PING_PONG: bool = true;
    /// Which of P̃'s exponentials run as a polynomial on the FMA units instead of on the SFU
    /// ([`exp2_split`]).
    const EXP2_SPLIT: Exp2Split = exp2_split(Self::HEAD_DIM);
    /// `TILING.registers()`, as constants `setmaxnreg` takes as immediates.
    type const PRODUCER_REGISTERS: u32;
    type const CONSUMER_REGISTERS: u32;

    /// Compile-time checks, evaluated where the kernel is instantiated.
    const CHECKED: () = {
        let tiling = Self::TILING;
        assert!(Self::S_TILES * 8 == tiling.block_cols as usize);
        assert!(Self::P_CHUNKS * WGMMA_K as usize == tiling.block_cols as usize);
        assert!(Self::O_TILES * 8 == Self::HEAD_DIM as usize);
        assert!(Self::HEAD_DIM.is_multiple_of(WGMMA_K));
        // TMA boxes are at most 256 rows; K/V tiles start on swizzle atoms (8 rows).
        assert!(tiling.block_cols <= 256 && tiling.block_cols.is_multiple_of(16));
        assert!(tiling.consumers >= 1 && tiling.consumers <= 3);
        // A packed block reads its one tile's sequence before its barriers exist; the persistent
        // grid is compiled dense only.
        assert!(!(Self::PACKED && tiling.persistent));
        assert!(!(Self::LOCAL && tiling.persistent));
        assert!(tiling.threads() <= MAX_THREADS_PER_BLOCK);
        assert!(tiling.shared_bytes(Self::HEAD_DIM) <= MAX_SHARED_BYTES_PER_BLOCK);
        // The register split must fit the SM's register file.
        let (producer, consumer) = tiling.registers();
        assert!(producer == Self::PRODUCER_REGISTERS && consumer == Self::CONSUMER_REGISTERS);
        assert!(WARPGROUP_THREADS * (producer + tiling.consumers * consumer) <= REGISTERS_PER_SM);
        // Õ and S of the warp's 16 rows, 4 f32 per tile, under the consumers' budget.
        assert!(4 * (Self::O_TILES + Self::S_TILES) as u32 + 32 < consumer);
    };
}

/// `fa3_tiling!(consumers, B_c)` or `fa3_tiling!(consumers, B_c, persistent)`: the tiling of
/// one entry of the kernel list.
#[macro_export]
macro_rules! fa3_tiling {
    ($consumers:literal, $cols:literal) => {
        $crate::fwd::fa3::config::Fa3Tiling::new($consumers, $cols)
    };
    ($consumers:literal, $cols:literal, persistent) => {
        $crate::fwd::fa3::config::Fa3Tiling::new($consumers, $cols).on_persistent_grid()
    };
    // A packed batch's or a window's kernel: one tile per block.
    ($consumers:literal, $cols:literal, $form:ident) => {
        $crate::fwd::fa3::config::Fa3Tiling::new($consumers, $cols)
    };
}

/// The kernel-name suffix of a list entry's grid and form: `p` for `persistent`, `_varlen` for
/// a packed batch's kernel, `_local` for a window's.
#[macro_export]
macro_rules! fa3_grid_suffix {
    (persistent) => {
        "p"
    };
    ($($form:ident)?) => {
        $crate::kernel_form_suffix!($($form)?)
    };
}

/// `fa3_config!(Name, d, consumers, B_c [, persistent | varlen | local])`: a type implementing
/// [`Fa3Config`] (`varlen`: for packed batches; `local`: for windows and soft-capping).
#[macro_export]
macro_rules! fa3_config {
    ($name:ident, $d:literal, $consumers:literal, $cols:literal $(, $grid:ident)?) => {
        struct $name;
        impl $crate::fwd::fa3::config::Fa3Config for $name {
            const HEAD_DIM: u32 = $d;
            const FORM: $crate::common::form::KernelForm = $crate::kernel_form!($($grid)?);
            const TILING: $crate::fwd::fa3::config::Fa3Tiling =
                $crate::fa3_tiling!($consumers, $cols $(, $grid)?);
            type const S_TILES: usize = const { $cols / 8 };
            type const O_TILES: usize = const { $d / 8 };
            type const P_CHUNKS: usize = const { $cols / 16 };
            type const PRODUCER_REGISTERS: u32 = const {
                $crate::fwd::fa3::config::Fa3Tiling::new($consumers, $cols)
                    .registers()
                    .0
            };
            type const CONSUMER_REGISTERS: u32 = const {
                $crate::fwd::fa3::config::Fa3Tiling::new($consumers, $cols)
                    .registers()
                    .1
            };
        }
    };
}
