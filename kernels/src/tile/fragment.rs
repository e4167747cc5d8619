//! The tensor-core operand shapes (`mma.sync.m16n8k16`, `ldmatrix.m8n8`) and, on the GPU, which
//! shared-memory row each lane names for an `ldmatrix`, and which elements of a 16 × 8
//! accumulator tile it holds.
//!
//! Fragment layouts (PTX ISA, mma.m16n8k16): lane `l` holds, of a 16×8 f32 tile, rows `l/4` and
//! `l/4 + 8` at columns `2·(l%4)` and `+1`:
//!
//! ```text
//!            cols 0-1   2-3   4-5   6-7
//!  row 0      l0    l1    l2    l3        elements 0, 1 of the lane's 4
//!  row 1      l4    l5    l6    l7
//!   …
//!  row 8      l0    l1    l2    l3        elements 2, 3
//!   …
//! ```

/// Rows of an mma tile (the M of m16n8k16): one row tile of Q.
pub const MMA_M: u32 = 16;
/// Columns of an mma accumulator tile (N): keys of S, or columns of Õ, per tile.
pub const MMA_N: u32 = 8;
/// Depth of one mma (K): head-dim columns of Q·Kᵀ, or keys of P̃·V, per step.
pub const MMA_K: u32 = 16;
/// f32 accumulators a lane holds of one MMA_M × MMA_N tile.
pub const ACCUMULATORS_PER_TILE: u32 = MMA_M * MMA_N / 32;
/// Rows (and 16-bit columns) of one `ldmatrix` matrix.
pub const LDMATRIX_SIDE: u32 = 8;

#[cfg(target_arch = "nvptx64")]
mod lanes {
    use super::{LDMATRIX_SIDE, MMA_N};
    use crate::arch;

    /// Tile row (0–15) of this lane's row address in an x4 A-fragment load: matrices rows 0–7 /
    /// 8–15 (lanes 8–15, 24–31) × columns 0–7 / 8–15 (lanes 16–31).
    #[inline(always)]
    pub fn a_fragment_row() -> u32 {
        let lane = arch::lane_idx();
        lane % LDMATRIX_SIDE + (lane / LDMATRIX_SIDE) % 2 * LDMATRIX_SIDE
    }

    /// Column offset (0 or 8) of this lane's row address in an x4 A-fragment load.
    #[inline(always)]
    pub fn a_fragment_col() -> u32 {
        arch::lane_idx() / 16 * LDMATRIX_SIDE
    }

    /// Key (0–15) of this lane's row address in an x4 load of two B tiles whose rows are keys
    /// (K read as Bᵀ, no transpose): keys +0–7 / +8–15 (lanes 16–31).
    #[inline(always)]
    pub fn key_pair_row() -> u32 {
        let lane = arch::lane_idx();
        lane % LDMATRIX_SIDE + lane / 16 * LDMATRIX_SIDE
    }

    /// Column offset (0 or 8) of this lane's row address in that load: lanes 8–15, 24–31.
    #[inline(always)]
    pub fn key_pair_col() -> u32 {
        (arch::lane_idx() / LDMATRIX_SIDE) % 2 * LDMATRIX_SIDE
    }

    /// The row, within an accumulator tile, of element `e` (0–3) of this lane: `l/4`, or
    /// `l/4 + 8` for elements 2 and 3.
    #[inline(always)]
    pub fn accumulator_row(e: u32) -> u32 {
        arch::lane_idx() / 4 + (e / 2) * LDMATRIX_SIDE
    }

    /// The column, within an accumulator tile, of element `e` (0–3) of this lane.
    #[inline(always)]
    pub fn accumulator_col(e: u32) -> u32 {
        arch::lane_idx() % 4 * 2 + e % 2
    }

    const _: () = assert!(MMA_N == LDMATRIX_SIDE);
}

#[cfg(target_arch = "nvptx64")]
pub use lanes::*;
