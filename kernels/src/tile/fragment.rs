//! The tensor-core operand shapes (`mma.sync.m16n8k16`, `ldmatrix.m8n8`), which
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
/// Keys (of K) or columns (of V) one x4 `ldmatrix` of B fragments covers: two accumulator tiles.
pub const TILE_PAIR: u32 = 2 * MMA_N;
/// Rows (and 16-bit columns) of one `ldmatrix` matrix.
pub const LDMATRIX_SIDE: u32 = 8;

// Which shared-memory row each lane names for an x4 `ldmatrix`, and which accumulator elements it
// holds: pure functions of the lane (read once per function by the caller, `arch::lane_idx()`).

/// Tile row (0–15) of this lane's row address in an x4 A-fragment load: matrices rows 0–7 /
/// 8–15 (lanes 8–15, 24–31) × columns 0–7 / 8–15 (lanes 16–31). The same lane order serves an
/// x4.trans load of V (keys +0–7 / +8–15, columns +0–7 / +8–15).
#[inline(always)]
pub const fn a_fragment_row(lane: u32) -> u32 {
    lane % LDMATRIX_SIDE + (lane / LDMATRIX_SIDE) % 2 * LDMATRIX_SIDE
}

/// Column offset (0 or 8) of this lane's row address in an x4 A-fragment load.
#[inline(always)]
pub const fn a_fragment_col(lane: u32) -> u32 {
    lane / 16 * LDMATRIX_SIDE
}

/// Key (0–15) of this lane's row address in an x4 load of two B tiles whose rows are keys (K read
/// as Bᵀ, no transpose): keys +0–7 / +8–15 (lanes 16–31).
#[inline(always)]
pub const fn key_pair_row(lane: u32) -> u32 {
    lane % LDMATRIX_SIDE + lane / 16 * LDMATRIX_SIDE
}

/// Column offset (0 or 8) of this lane's row address in that load: lanes 8–15, 24–31.
#[inline(always)]
pub const fn key_pair_col(lane: u32) -> u32 {
    (lane / LDMATRIX_SIDE) % 2 * LDMATRIX_SIDE
}

/// The row, within an accumulator tile, of this lane's elements 0 and 1 (`l/4`; elements 2 and 3
/// are [`LDMATRIX_SIDE`] rows further).
#[inline(always)]
pub const fn accumulator_row(lane: u32) -> u32 {
    lane / 4
}

/// The column, within an accumulator tile, of this lane's elements 0 and 2 (elements 1 and 3 are
/// the next column).
#[inline(always)]
pub const fn accumulator_col(lane: u32) -> u32 {
    lane % 4 * 2
}

const _: () = assert!(MMA_N == LDMATRIX_SIDE);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_x4_load_names_every_row_of_its_four_matrices_once() {
        let mut a = [[0u32; 2]; 16];
        let mut b = [[0u32; 2]; 16];
        for lane in 0..32 {
            a[a_fragment_row(lane) as usize][(a_fragment_col(lane) / 8) as usize] += 1;
            b[key_pair_row(lane) as usize][(key_pair_col(lane) / 8) as usize] += 1;
        }
        assert!(a.iter().chain(&b).all(|row| *row == [1, 1]));
    }

    #[test]
    fn accumulator_elements_cover_the_tile_once() {
        let mut seen = [[0u32; 8]; 16];
        for lane in 0..32 {
            for e in 0..4u32 {
                let row = accumulator_row(lane) + e / 2 * LDMATRIX_SIDE;
                let col = accumulator_col(lane) + e % 2;
                seen[row as usize][col as usize] += 1;
            }
        }
        assert!(seen.iter().flatten().all(|&n| n == 1));
    }
}
