//! FlashAttention-2 backward's tile configuration: the compile-time part (head-dim capacity, B_r,
//! B_c) as one type per main kernel, [`Fa2BackwardConfig`], and the launch geometry of the three
//! kernels (and of the wide pre- and post-pass) as plain functions the host's plan and the
//! kernels share.
//!
//! The main kernel is split-K, the forward's split-Q turned around: each warp owns
//! [`KEYS_PER_WARP`] keys of K_j, V_j and keeps their rows of dK_j, dV_j in registers; each lane
//! computes S, P, dP and dS for its rows of Q_i (lane, lane + 32, …) against its warp's keys.

use crate::common::limits::{
    MAX_REGISTERS_PER_THREAD, MAX_SHARED_BYTES_PER_BLOCK, MAX_THREADS_PER_BLOCK, REGISTERS_PER_SM,
};
use crate::tile::layout::conflict_free_stride;
use crate::tile::row_chunks::{CHUNK_ELEMENTS, ChunkLanes, MAX_HEAD_DIM as MAX_CHUNKED_HEAD_DIM};

/// Keys of K_j (rows of dK_j and dV_j) owned by one warp of the main kernel.
pub const KEYS_PER_WARP: u32 = 4;
/// B_c, every capacity: 16 warps of [`KEYS_PER_WARP`] keys.
pub const BLOCK_COLS: u32 = 64;
/// Threads of the pre- and post-pass, element-wise and wide.
pub const PASS_THREADS: u32 = 256;
/// Rows of Q (of D, of the dQ accumulator) one block of the element-wise pre- and post-pass
/// covers (one warp per row, 8 rows at a time).
pub const PASS_ROWS: u32 = 64;
/// Rows of each 16-byte chunk a thread of the wide pre- and post-pass covers (`ChunkLanes`'
/// steps): their loads are all in flight before the first is used.
pub type const WIDE_PASS_STEPS: usize = 2;

/// One thread's chunks in the wide pre- and post-pass (`tile::row_chunks`).
pub type WidePassLanes = ChunkLanes<WIDE_PASS_STEPS>;

/// Whether the wide pre- and post-pass take head dim `head_dim`: whole 16-byte chunks of 16-bit
/// elements, at most one per lane of a warp (d a multiple of 8, up to 256). The host also needs
/// f16/bf16 and O, dO, dQ views whose address and strides are multiples of 8 elements.
pub const fn wide_passes_take(head_dim: u32) -> bool {
    head_dim > 0 && head_dim.is_multiple_of(CHUNK_ELEMENTS) && head_dim <= MAX_CHUNKED_HEAD_DIM
}

/// Rows of Q one block of the wide pre- and post-pass covers at `head_dim`: 16 (d > 128) to 512
/// (d = 8).
pub const fn wide_pass_rows(head_dim: u32) -> u32 {
    WidePassLanes::rows_per_block(head_dim, PASS_THREADS)
}

/// B_r of the main kernel for `head_dim_capacity`: 64, or 32 at capacity 256, where Q_i, dO_i
/// of 64 rows beside K_j, V_j would need 263 KiB of shared memory (227 KiB allowed).
pub const fn block_rows(head_dim_capacity: u32) -> u32 {
    if head_dim_capacity > 128 { 32 } else { 64 }
}

/// Threads of the main kernel: one warp per [`KEYS_PER_WARP`] keys of B_c.
pub const fn main_threads() -> u32 {
    BLOCK_COLS / KEYS_PER_WARP * 32
}

/// Shared memory of the main kernel at head dim `head_dim`: K_j and V_j (B_c × d), Q_i and dO_i
/// (B_r × d), P and dS (B_r × B_c), L_i and D_i (B_r), all f32, tiles at bank-conflict-free
/// strides.
pub const fn shared_bytes(block_rows: u32, head_dim: u32) -> u64 {
    let stride = conflict_free_stride(head_dim) as u64;
    let score_stride = conflict_free_stride(BLOCK_COLS) as u64;
    let (rows, cols) = (block_rows as u64, BLOCK_COLS as u64);
    (2 * cols * stride + 2 * rows * stride + 2 * rows * score_stride + 2 * rows) * 4
}

/// One compiled main kernel's tile shape. Implemented by [`fa2_backward_config!`] for each
/// kernel of the list (`registry::for_each_kernel!`).
pub trait Fa2BackwardConfig {
    /// Largest head dim the kernel computes: each lane keeps `HEAD_DIM_CAPACITY / 32` columns of
    /// its warp's rows of dK_j and dV_j in registers.
    const HEAD_DIM_CAPACITY: u32;
    /// B_r: [`block_rows`] of the capacity.
    const BLOCK_ROWS: u32;
    /// Compiled for grouped K/V heads: dK_j and dV_j stored at the query head's rows of the
    /// expanded workspace (`BlockInfo::kv_gradient_head`), not the K/V head's.
    const GROUPED: bool;
    /// HEAD_DIM_CAPACITY / 32: columns of dK_j, dV_j per lane.
    type const COLS: usize;
    /// B_r / 32: rows of Q_i (of S, P, dS) per lane.
    type const LANE_ROWS: usize;

    /// Compile-time checks, evaluated where the kernel is instantiated.
    const CHECKED: () = {
        assert!(Self::COLS * 32 == Self::HEAD_DIM_CAPACITY as usize);
        assert!(Self::BLOCK_ROWS == block_rows(Self::HEAD_DIM_CAPACITY));
        assert!(Self::LANE_ROWS * 32 == Self::BLOCK_ROWS as usize);
        assert!(BLOCK_COLS.is_multiple_of(KEYS_PER_WARP));
        assert!(main_threads() <= MAX_THREADS_PER_BLOCK);
        // dK_j, dV_j of a warp's keys and the lane's S, dP fit in the registers 512 threads
        // leave each thread.
        let budget = REGISTERS_PER_SM / main_threads();
        let budget = if budget < MAX_REGISTERS_PER_THREAD {
            budget
        } else {
            MAX_REGISTERS_PER_THREAD
        };
        let accumulators = 2 * KEYS_PER_WARP as usize * Self::COLS;
        let scores = 2 * KEYS_PER_WARP as usize * Self::LANE_ROWS;
        assert!(accumulators + scores < budget as usize);
        // The largest head dim of this capacity fits.
        assert!(
            shared_bytes(Self::BLOCK_ROWS, Self::HEAD_DIM_CAPACITY)
                <= MAX_SHARED_BYTES_PER_BLOCK as u64
        );
    };
}

/// `fa2_backward_config!(Name, capacity, B_r, grouped)`: a type implementing
/// [`Fa2BackwardConfig`] (B_r must be [`block_rows`] of the capacity; `CHECKED` asserts it;
/// `grouped` a `bool`).
#[macro_export]
macro_rules! fa2_backward_config {
    ($name:ident, $capacity:literal, $block_rows:literal, $grouped:expr) => {
        struct $name;
        impl $crate::bwd::fa2::config::Fa2BackwardConfig for $name {
            const HEAD_DIM_CAPACITY: u32 = $capacity;
            const BLOCK_ROWS: u32 = $block_rows;
            const GROUPED: bool = $grouped;
            type const COLS: usize = const { $capacity / 32 };
            type const LANE_ROWS: usize = const { $block_rows / 32 };
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_capacity_fits_in_shared_memory_and_threads() {
        for capacity in [32, 64, 128, 256] {
            let bytes = shared_bytes(block_rows(capacity), capacity);
            assert!(
                bytes <= MAX_SHARED_BYTES_PER_BLOCK as u64,
                "{capacity}: {bytes}"
            );
        }
        assert_eq!(main_threads(), 512);
        assert_eq!(block_rows(256), 32);
    }

    #[test]
    fn the_wide_passes_take_multiples_of_8_up_to_256() {
        let taken: std::vec::Vec<u32> = (0..=300).filter(|&d| wide_passes_take(d)).collect();
        assert_eq!(taken, (1..=32).map(|c| 8 * c).collect::<std::vec::Vec<_>>());
        assert_eq!(wide_pass_rows(128), 32);
        assert_eq!(wide_pass_rows(200), 16);
    }
}
