//! The tensor-core FA2 backward's tile configuration: [`Fa2TcBackwardTiling`] (warps, how they
//! split the head dim, B_r, B_c), the shared-memory geometry the host sizes launches with, and
//! [`Fa2TcBackwardConfig`], one type per compiled kernel with the sizes of its per-lane register
//! arrays as associated constants, checked at compile time.
//!
//! One block per key block j (B_c keys). Each warp owns one m16 tile of K_j's keys (split-K, the
//! forward's split-Q turned around) and keeps its rows of dK_j and dV_j in registers. At head-dim
//! capacities up to 128 a warp owns all d columns of its keys (`col_split` = 1, 8 warps, B_c =
//! 128). Above, 2·16 keys × d f32 accumulators would not fit in a lane's 255 registers, so two
//! warps share a key tile (`col_split` = 2, B_c = 64): each computes the partial S and dP over
//! its half of d, they add the halves through shared memory, and each accumulates its half of
//! the columns of dK_j, dV_j.

use crate::common::form::KernelForm;
use crate::common::limits::{
    MAX_REGISTERS_PER_THREAD, MAX_SHARED_BYTES_PER_BLOCK, MAX_THREADS_PER_BLOCK,
};
use crate::tile::fragment::{ACCUMULATORS_PER_TILE, MMA_K, MMA_M, MMA_N};
use crate::tile::layout::COPY_ELEMENTS;

/// Q_i, dO_i (and their L_i, D_i) shared-memory stages: row block i + 1 is copied while row
/// block i is computed.
pub const ROW_STAGES: u32 = 2;

/// How one backward block is laid out: `warps` warps, `col_split` of them (1 or 2) per m16
/// tile of keys, so B_c = 16 · warps / col_split; B_r = `block_rows` rows of Q per inner step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fa2TcBackwardTiling {
    pub warps: u32,
    pub col_split: u32,
    pub block_rows: u32,
}

impl Fa2TcBackwardTiling {
    pub const fn new(warps: u32, col_split: u32, block_rows: u32) -> Self {
        Self {
            warps,
            col_split,
            block_rows,
        }
    }

    /// The tiling compiled for `head_dim_capacity` (see the module's docs): 8 warps, B_r = 64
    /// and B_c = 128 up to 128; two warps per key tile, B_r = 32 and B_c = 64 above, where
    /// Q_i and dO_i of 64 rows in two stages beside K_j, V_j would pass 227 KiB.
    pub const fn for_capacity(head_dim_capacity: u32) -> Self {
        match head_dim_capacity {
            0..=64 => Self::new(8, 1, 64),
            65..=128 => Self::new(8, 1, 32),
            129..=192 => Self::new(8, 2, 32),
            _ => Self::new(8, 2, 16),
        }
    }

    /// B_c.
    pub const fn block_cols(self) -> u32 {
        MMA_M * self.warps / self.col_split
    }

    pub const fn threads(self) -> u32 {
        32 * self.warps
    }

    /// Warps that share one row tile of dQ_i = dS·K_j, each taking 1/`dq_col_groups` of d.
    pub const fn dq_col_groups(self) -> u32 {
        self.warps / (self.block_rows / MMA_M)
    }

    /// f32 of one warp's half of the S and dP exchange (`col_split` = 2): its lanes' partial
    /// S and dP accumulators, 16 keys × B_r each.
    pub const fn exchange_floats_per_warp(self) -> u32 {
        2 * MMA_M * self.block_rows
    }

    /// Dynamic shared memory at head-dim capacity `capacity`: K_j and V_j (B_c rows), Q_i and
    /// dO_i (B_r rows) in [`ROW_STAGES`] stages, all 16-bit at [`shared_row_stride`]; L_i and
    /// D_i (f32) per stage; dSᵀ (B_c × B_r, 16-bit, rows padded by 8); and, with
    /// `col_split` = 2, the S and dP exchange.
    pub const fn shared_bytes(self, capacity: u32) -> u32 {
        let row_bytes = shared_row_stride(capacity) * 2;
        let kv = 2 * self.block_cols() * row_bytes;
        let per_stage = 2 * self.block_rows * row_bytes + 2 * self.block_rows * 4;
        let ds = self.block_cols() * ds_row_stride(self.block_rows) * 2;
        let exchange = if self.col_split == 2 {
            self.warps * self.exchange_floats_per_warp() * 4
        } else {
            0
        };
        kv + ROW_STAGES * per_stage + ds + exchange
    }
}

impl core::fmt::Display for Fa2TcBackwardTiling {
    /// `WxS_rR`, e.g. `8x1r64`: warps, warps per key tile, B_r.
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let Self {
            warps,
            col_split,
            block_rows,
        } = self;
        write!(f, "{warps}x{col_split}r{block_rows}")
    }
}

/// Row stride, in 16-bit elements, of the K, V, Q and dO tiles: 16 bytes of padding per row, so
/// the eight rows one `ldmatrix` reads fall in eight different bank groups (as the forward's).
pub const fn shared_row_stride(capacity: u32) -> u32 {
    capacity + 8
}

/// Row stride, in 16-bit elements, of the dSᵀ tile (one row per key, B_r queries), padded the same
/// way.
pub const fn ds_row_stride(block_rows: u32) -> u32 {
    block_rows + 8
}

/// One compiled tensor-core backward kernel: its head-dim capacity and tiling, and the sizes of
/// its per-lane register arrays. Implemented by [`fa2_tc_backward_config!`] for each kernel of
/// the list (`registry::for_each_kernel!`).
pub trait Fa2TcBackwardConfig {
    /// Largest head dim the kernel computes; smaller ones (multiples of 8) read zeros past d.
    const HEAD_DIM_CAPACITY: u32;
    const TILING: Fa2TcBackwardTiling;
    /// Compiled for grouped K/V heads: dK_j and dV_j stored at the query head's rows of the
    /// expanded workspace (`BlockInfo::kv_gradient_head`), not the K/V head's.
    const GROUPED: bool;
    /// Which calls the kernel serves, as the forward's forms (`common::form::KernelForm`): a
    /// packed batch (`PackedParams`), a sliding window and soft-capping read from the
    /// parameters, both, or the causal mask or none and no capping, as constants.
    const FORM: KernelForm;
    const PACKED: bool = Self::FORM.is_packed();
    const LOCAL: bool = Self::FORM.is_local();
    /// capacity / col_split / MMA_K: the k-steps of a warp's partial S = K_j·Q_iᵀ and dP.
    type const D_CHUNKS: usize;
    /// capacity / col_split / MMA_N: a warp's accumulator tiles of dK_j (and of dV_j).
    type const D_TILES: usize;
    /// B_r / MMA_N: the accumulator tiles of Sᵀ (and dPᵀ) per warp: 16 keys × B_r queries.
    type const ROW_TILES: usize;
    /// B_r / MMA_K: the k-steps of dV_j += Pᵀ·dO_i and dK_j += dSᵀ·Q_i.
    type const ROW_CHUNKS: usize;
    /// B_c / MMA_K: the k-steps of dQ_i = dS·K_j.
    type const KEY_CHUNKS: usize;
    /// capacity / dq_col_groups / MMA_N: a warp's accumulator tiles of dQ_i.
    type const DQ_TILES: usize;

    /// Warps per key tile, as a scalar constant the kernel branches on.
    const COL_SPLIT: u32 = Self::TILING.col_split;
    const BLOCK_ROWS: u32 = Self::TILING.block_rows;
    const BLOCK_COLS: u32 = Self::TILING.block_cols();
    const WARPS: u32 = Self::TILING.warps;
    /// f32 a lane keeps live through a step: dK_j, dV_j, and Sᵀ, dPᵀ.
    const ACCUMULATOR_REGISTERS: u32 =
        (2 * Self::D_TILES as u32 + 2 * Self::ROW_TILES as u32) * ACCUMULATORS_PER_TILE;

    /// Compile-time checks, evaluated where the kernel is instantiated.
    const CHECKED: () = {
        let tiling = Self::TILING;
        let capacity = Self::HEAD_DIM_CAPACITY;
        let warp_cols = capacity / tiling.col_split;
        assert!(tiling.col_split == 1 || tiling.col_split == 2);
        assert!(tiling.warps.is_multiple_of(tiling.col_split));
        assert!(Self::D_CHUNKS * MMA_K as usize == warp_cols as usize);
        assert!(Self::D_TILES * MMA_N as usize == warp_cols as usize);
        assert!(Self::ROW_TILES * MMA_N as usize == tiling.block_rows as usize);
        assert!(Self::ROW_CHUNKS * MMA_K as usize == tiling.block_rows as usize);
        assert!(Self::KEY_CHUNKS * MMA_K as usize == tiling.block_cols() as usize);
        // dQ_i's row tiles and column groups cover the warps exactly, in pairs of n8 tiles.
        assert!(tiling.block_rows.is_multiple_of(MMA_M));
        assert!((tiling.block_rows / MMA_M) * tiling.dq_col_groups() == tiling.warps);
        assert!(Self::DQ_TILES * (MMA_N * tiling.dq_col_groups()) as usize == capacity as usize);
        assert!(Self::DQ_TILES.is_multiple_of(2) && Self::D_TILES.is_multiple_of(2));
        assert!(Self::ROW_TILES.is_multiple_of(2));
        assert!(capacity.is_multiple_of(COPY_ELEMENTS));
        // One thread per element of L_i and of D_i copies them.
        assert!(2 * tiling.block_rows <= tiling.threads());
        assert!(tiling.threads() <= MAX_THREADS_PER_BLOCK);
        assert!(tiling.shared_bytes(capacity) <= MAX_SHARED_BYTES_PER_BLOCK);
        // With room for fragments, addresses and the softmax's operands.
        assert!(Self::ACCUMULATOR_REGISTERS + 48 < MAX_REGISTERS_PER_THREAD);
    };
}

/// `fa2_tc_backward_config!(Name, capacity, warps, col_split, B_r, grouped, form)`: a type
/// implementing [`Fa2TcBackwardConfig`]; the tiling must be
/// [`Fa2TcBackwardTiling::for_capacity`]'s (the host plans with that function); `grouped` a
/// `bool`, `form` a `KernelForm`.
#[macro_export]
macro_rules! fa2_tc_backward_config {
    ($name:ident, $capacity:literal, $warps:literal, $split:literal, $rows:literal,
     $grouped:expr, $form:expr) => {
        struct $name;
        impl $crate::bwd::fa2_tc::config::Fa2TcBackwardConfig for $name {
            const HEAD_DIM_CAPACITY: u32 = $capacity;
            const TILING: $crate::bwd::fa2_tc::config::Fa2TcBackwardTiling =
                $crate::bwd::fa2_tc::config::Fa2TcBackwardTiling::new($warps, $split, $rows);
            const GROUPED: bool = $grouped;
            const FORM: $crate::common::form::KernelForm = $form;
            type const D_CHUNKS: usize = const { $capacity / $split / 16 };
            type const D_TILES: usize = const { $capacity / $split / 8 };
            type const ROW_TILES: usize = const { $rows / 8 };
            type const ROW_CHUNKS: usize = const { $rows / 16 };
            type const KEY_CHUNKS: usize = const { $warps / $split };
            type const DQ_TILES: usize = const { $capacity * ($rows / 16) / $warps / 8 };
        }
        const _: () = assert!(
            $crate::bwd::fa2_tc::config::Fa2TcBackwardTiling::for_capacity($capacity).const_eq(
                $crate::bwd::fa2_tc::config::Fa2TcBackwardTiling::new($warps, $split, $rows)
            )
        );
    };
}

impl Fa2TcBackwardTiling {
    /// Field-by-field equality usable in `const` code.
    pub const fn const_eq(self, other: Self) -> bool {
        self.warps == other.warps
            && self.col_split == other.col_split
            && self.block_rows == other.block_rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_capacity_fits_in_shared_memory() {
        for capacity in [32, 64, 96, 128, 192, 256] {
            let tiling = Fa2TcBackwardTiling::for_capacity(capacity);
            let bytes = tiling.shared_bytes(capacity);
            assert!(bytes <= MAX_SHARED_BYTES_PER_BLOCK, "{capacity}: {bytes}");
            assert_eq!(
                (tiling.block_rows / MMA_M) * tiling.dq_col_groups(),
                tiling.warps
            );
        }
        assert_eq!(Fa2TcBackwardTiling::for_capacity(128).block_cols(), 128);
        assert_eq!(Fa2TcBackwardTiling::for_capacity(256).block_cols(), 64);
    }
}
