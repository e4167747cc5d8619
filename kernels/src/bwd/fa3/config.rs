//! The FA3 backward's tile configuration: [`Fa3BackwardTiling`] (consumer warpgroups, B_r,
//! B_c), the shared-memory layout the host sizes launches with, and [`Fa3BackwardConfig`], one
//! type per compiled kernel with the sizes of its register arrays, checked at compile time.
//!
//! One block per key block j: each consumer warpgroup owns 64 of its keys (the M of
//! `wgmma.m64`) and keeps their dK_j, dV_j rows in registers (d/8 tiles of 16 × 8 per warp,
//! twice); per row block of B_r = 64 queries it holds Sᵀ and dPᵀ (64 keys × 64 queries: 8 tiles
//! each), then Pᵀ's and dSᵀ's 16-bit fragments and, at the steps whose dQ_i it owns, one
//! 64-column part of dQ_i over all B_c keys (8 tiles). At
//! d = 128 that peaks at 64 + 64 + 64 registers per thread, under the 240 `setmaxnreg` gives
//! two consumers.

use crate::common::form::KernelForm;
use crate::common::limits::{MAX_SHARED_BYTES_PER_BLOCK, MAX_THREADS_PER_BLOCK, REGISTERS_PER_SM};
use crate::fwd::fa3::config::{
    PANEL_COLS, PANEL_ROW_BYTES, TILE_ALIGNMENT, WARPGROUP_ROWS, WARPGROUP_THREADS, WGMMA_K,
    panels, warpgroup_registers,
};

/// Q_i, dO_i stages: row block i + 1 lands while row block i is computed.
pub const ROW_STAGES: u32 = 2;
/// dSᵀ buffers, by step parity: one consumer writes step i + 1's while the other (dQ_i's owner)
/// still reads step i's.
pub const DS_BUFFERS: u32 = 2;
/// mbarriers: K_j and V_j full; Q_i/dO_i full and empty per stage.
pub const BARRIERS: u32 = 1 + 2 * ROW_STAGES;
/// Query rows per step (the N of Sᵀ = K_j·Q_iᵀ and the K of dK_j += dSᵀ·Q_i): one 64-column panel
/// of dSᵀ, so dQ_i = dS·K_j reads dS from dSᵀ as one MN-major A operand.
pub const BLOCK_ROWS: u32 = PANEL_COLS;
/// The 16 × 8 tiles of one warp's rows of a 64-column dQ_i part (one panel of K_j as B).
pub type const DQ_PART_TILES: usize = 8;
const _: () = assert!(DQ_PART_TILES * 8 == PANEL_COLS as usize);

/// How an FA3 backward block splits: `consumers` warpgroups of 64 keys each (B_c =
/// 64·consumers) beside one producer warpgroup, B_r = [`BLOCK_ROWS`] queries per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fa3BackwardTiling {
    pub consumers: u32,
}

impl core::fmt::Display for Fa3BackwardTiling {
    /// `wWr64c128`: consumer warpgroups, B_r, B_c.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(
            f,
            "w{}r{}c{}",
            self.consumers,
            self.block_rows(),
            self.block_cols()
        )
    }
}

impl Fa3BackwardTiling {
    /// The tiling compiled at every head dim: two consumer warpgroups (B_c = 128, as
    /// FlashAttention-3's backward at d = 64 and 128), B_r = 64.
    pub const fn for_head_dim(_head_dim: u32) -> Self {
        Self { consumers: 2 }
    }

    pub const fn block_rows(self) -> u32 {
        BLOCK_ROWS
    }

    /// B_c.
    pub const fn block_cols(self) -> u32 {
        WARPGROUP_ROWS * self.consumers
    }

    /// The producer warpgroup and the consumers.
    pub const fn threads(self) -> u32 {
        WARPGROUP_THREADS * (1 + self.consumers)
    }

    /// Registers per thread of the producer and of the consumers after `setmaxnreg`, as the
    /// forward's.
    pub const fn registers(self) -> (u32, u32) {
        warpgroup_registers(self.consumers)
    }

    /// Bytes of one K_j or V_j tile (B_c rows, every panel).
    pub const fn kv_bytes(self, head_dim: u32) -> u32 {
        panels(head_dim) * self.block_cols() * PANEL_ROW_BYTES
    }

    /// Bytes of one Q_i or dO_i tile (B_r rows, every panel).
    pub const fn row_bytes(self, head_dim: u32) -> u32 {
        panels(head_dim) * self.block_rows() * PANEL_ROW_BYTES
    }

    /// Bytes of one dSᵀ buffer: one row per key, B_r = 64 queries (one panel).
    pub const fn ds_bytes(self) -> u32 {
        self.block_cols() * PANEL_ROW_BYTES
    }

    /// Bytes of one consumer's dQ_i staging tile: B_r rows × every panel's 64 columns, f32, in
    /// boxes of 32 columns (`tile::swizzled::SwizzledF32Tile`), added to the accumulator by
    /// one bulk reduction per box.
    pub const fn dq_staging_bytes(self, head_dim: u32) -> u32 {
        self.block_rows() * panels(head_dim) * PANEL_COLS * 4
    }

    /// Bytes of each consumer's L_i and D_i (B_r f32 each).
    pub const fn statistics_bytes(self) -> u32 {
        self.consumers * 2 * self.block_rows() * 4
    }

    /// Dynamic shared memory: the alignment slack, K_j and V_j, the Q_i/dO_i ring, dSᵀ's
    /// buffers, each consumer's dQ_i staging tile, the consumers' L_i and D_i, the barriers.
    pub const fn shared_bytes(self, head_dim: u32) -> u32 {
        TILE_ALIGNMENT
            + 2 * self.kv_bytes(head_dim)
            + 2 * ROW_STAGES * self.row_bytes(head_dim)
            + DS_BUFFERS * self.ds_bytes()
            + self.consumers * self.dq_staging_bytes(head_dim)
            + self.statistics_bytes()
            + 8 * BARRIERS
    }

    pub const fn const_eq(self, other: Self) -> bool {
        self.consumers == other.consumers
    }
}

/// The head dims the FA3 backward is compiled for; a problem runs on the smallest that holds
/// its head dim. Above 128 dK_j and dV_j of 64 keys (2·d/2 f32 per thread) leave too few of the
/// 240 registers for Sᵀ, dPᵀ and dQ_i.
pub const HEAD_DIMS: [u32; 3] = [64, 96, 128];

/// One compiled FA3 backward kernel. Implemented by [`fa3_backward_config!`] for each kernel of
/// the list (`registry::for_each_hopper_kernel!`).
pub trait Fa3BackwardConfig {
    const HEAD_DIM: u32;
    const TILING: Fa3BackwardTiling;
    /// Compiled for grouped K/V heads: dK_j and dV_j stored at the query head's rows of the
    /// expanded workspace (`BlockInfo::kv_gradient_head`).
    const GROUPED: bool;
    /// Compiled for deterministic mode: each row block's dQ reductions in a fixed order
    /// (`Fa3BackwardParams::dq_semaphore`, which must then be set). A constant, not a test of
    /// the address: the flag's wait and completion inside the row loop made ptxas spill at
    /// d = 128 (176 bytes) in every call.
    const DETERMINISTIC: bool;
    /// Which calls the kernel serves (`common::form::KernelForm`, the forward's forms): a packed
    /// batch (its sequences' offsets in the parameter block, `PackedParams`), a sliding window
    /// and soft-capping read from the parameters, both, or the causal mask or none and no
    /// capping, as constants.
    const FORM: KernelForm;
    const PACKED: bool = Self::FORM.is_packed();
    const LOCAL: bool = Self::FORM.is_local();
    /// The dQ_i reductions issued by a writer warp of the producer warpgroup (`dq_writer`)
    /// rather than by the owner warpgroup's first thread: in deterministic mode (the turn and the
    /// completion wait off the consumers: 1.3–1.45× faster on an H100) and at d ≤ 64 (2–6%
    /// faster); at d = 128 the owner's thread was 1–4% faster on the same H100 (twentieth
    /// session, docs/perf/fa3-backward.md).
    const DQ_WRITER: bool = Self::DETERMINISTIC || Self::HEAD_DIM <= 64;
    /// d/8: a warp's tiles of dK_j (and of dV_j), the N of dV_j += Pᵀ·dO_i.
    type const D_TILES: usize;
    /// B_r/8: a warp's tiles of Sᵀ (and dPᵀ): 16 keys × B_r queries.
    type const ROW_TILES: usize;
    /// B_r/16: the k-steps (A fragments) of dV_j += Pᵀ·dO_i and dK_j += dSᵀ·Q_i.
    type const ROW_CHUNKS: usize;
    type const PRODUCER_REGISTERS: u32;
    type const CONSUMER_REGISTERS: u32;

    const BLOCK_ROWS: u32 = Self::TILING.block_rows();
    const BLOCK_COLS: u32 = Self::TILING.block_cols();
    const PANELS: u32 = panels(Self::HEAD_DIM);
    /// k-steps of Sᵀ = K_j·Q_iᵀ and dPᵀ = V_j·dO_iᵀ.
    const D_STEPS: u32 = Self::HEAD_DIM / WGMMA_K;
    /// k-steps of a dQ_i part: every key of the block (both warpgroups' dSᵀ).
    const KEY_STEPS: u32 = Self::TILING.block_cols() / WGMMA_K;
    const KV_BYTES: u32 = Self::TILING.kv_bytes(Self::HEAD_DIM);
    const ROW_BYTES: u32 = Self::TILING.row_bytes(Self::HEAD_DIM);

    /// Compile-time checks, evaluated where the kernel is instantiated.
    const CHECKED: () = {
        let tiling = Self::TILING;
        assert!(Self::D_TILES * 8 == Self::HEAD_DIM as usize);
        assert!(Self::ROW_TILES * 8 == tiling.block_rows() as usize);
        assert!(Self::ROW_CHUNKS * WGMMA_K as usize == tiling.block_rows() as usize);
        assert!(Self::HEAD_DIM.is_multiple_of(WGMMA_K));
        // Deterministic mode's turns are taken in the writer warp.
        assert!(Self::DQ_WRITER || !Self::DETERMINISTIC);
        // Deterministic mode's order is compiled for the dense form (`KeyBlock::dq_turn`).
        assert!(!Self::DETERMINISTIC || matches!(Self::FORM, KernelForm::Dense));
        // dQ_i's ownership alternates between two consumers by step parity.
        assert!(tiling.consumers == DS_BUFFERS);
        // TMA boxes are at most 256 rows.
        assert!(tiling.block_cols() <= 256);
        assert!(tiling.threads() <= MAX_THREADS_PER_BLOCK);
        assert!(tiling.shared_bytes(Self::HEAD_DIM) <= MAX_SHARED_BYTES_PER_BLOCK);
        let (producer, consumer) = tiling.registers();
        assert!(producer == Self::PRODUCER_REGISTERS && consumer == Self::CONSUMER_REGISTERS);
        assert!(WARPGROUP_THREADS * (producer + tiling.consumers * consumer) <= REGISTERS_PER_SM);
        // dK_j and dV_j, beside either Sᵀ and dPᵀ or (once they are packed) Pᵀ's and dSᵀ's
        // fragments and a dQ_i part, 4 registers per tile or fragment, under the consumers'
        // budget with room for addresses.
        let scores = 2 * Self::ROW_TILES;
        let after_scores = 2 * Self::ROW_CHUNKS + DQ_PART_TILES;
        let peak = 2 * Self::D_TILES
            + if scores > after_scores {
                scores
            } else {
                after_scores
            };
        assert!(4 * peak as u32 + 32 < consumer);
    };
}

/// `fa3_backward_config!(Name, d, grouped, deterministic, form)`: a type implementing
/// [`Fa3BackwardConfig`] at head dim d with [`Fa3BackwardTiling::for_head_dim`]'s tiling;
/// `grouped` and `deterministic` `bool`s, `form` a `KernelForm`.
#[macro_export]
macro_rules! fa3_backward_config {
    ($name:ident, $d:literal, $grouped:expr, $deterministic:expr, $form:expr) => {
        struct $name;
        impl $crate::bwd::fa3::config::Fa3BackwardConfig for $name {
            const HEAD_DIM: u32 = $d;
            const TILING: $crate::bwd::fa3::config::Fa3BackwardTiling =
                $crate::bwd::fa3::config::Fa3BackwardTiling::for_head_dim($d);
            const GROUPED: bool = $grouped;
            const DETERMINISTIC: bool = $deterministic;
            const FORM: $crate::common::form::KernelForm = $form;
            type const D_TILES: usize = const { $d / 8 };
            type const ROW_TILES: usize =
                const { $crate::bwd::fa3::config::BLOCK_ROWS as usize / 8 };
            type const ROW_CHUNKS: usize =
                const { $crate::bwd::fa3::config::BLOCK_ROWS as usize / 16 };
            type const PRODUCER_REGISTERS: u32 = const {
                $crate::bwd::fa3::config::Fa3BackwardTiling::for_head_dim($d)
                    .registers()
                    .0
            };
            type const CONSUMER_REGISTERS: u32 = const {
                $crate::bwd::fa3::config::Fa3BackwardTiling::for_head_dim($d)
                    .registers()
                    .1
            };
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_head_dim_fits_in_shared_memory() {
        for d in HEAD_DIMS {
            let tiling = Fa3BackwardTiling::for_head_dim(d);
            let bytes = tiling.shared_bytes(d);
            assert!(bytes <= MAX_SHARED_BYTES_PER_BLOCK, "{d}: {bytes}");
        }
        // d = 128: K, V 32 KiB each, Q, dO 16 KiB × 2 stages each, dSᵀ 16 KiB × 2, the dQ_i
        // staging tiles 32 KiB × 2, L and D 1 KiB: 984 bytes under the limit.
        assert_eq!(
            Fa3BackwardTiling::for_head_dim(128).shared_bytes(128),
            1024 + 65536 + 65536 + 2 * 16384 + 2 * 32768 + 1024 + 40
        );
        assert_eq!(
            MAX_SHARED_BYTES_PER_BLOCK - Fa3BackwardTiling::for_head_dim(128).shared_bytes(128),
            984
        );
        let tiling = Fa3BackwardTiling::for_head_dim(64);
        assert_eq!((tiling.block_rows(), tiling.block_cols()), (64, 128));
        assert_eq!(tiling.threads(), 384);
    }
}
