//! FlashAttention-2's tile configuration: the compile-time part (head-dim capacity, B_c) as one
//! type per kernel, [`Fa2Config`], and the launch-time part (B_r) as plain functions the host's
//! plan and the kernel share.

use crate::common::limits::{
    MAX_REGISTERS_PER_THREAD, MAX_SHARED_BYTES_PER_BLOCK, MAX_THREADS_PER_BLOCK, REGISTERS_PER_SM,
};
use crate::tile::layout::conflict_free_stride;

/// Candidate B_r and B_c (the article: tuned from {64, 128} × {64, 128}).
pub const BLOCK_CHOICES: [u32; 2] = [64, 128];
/// Rows of Q owned by one warp (split-Q: warps never exchange partial results).
pub const ROWS_PER_WARP: u32 = 8;

/// Shared memory the kernel needs: Q_i (B_r × d), K_j and V_j (B_c × d), and P̃ (B_r × B_c),
/// all f32.
pub const fn shared_bytes(block_rows: u32, block_cols: u32, head_dim: u32) -> u64 {
    let stride = conflict_free_stride(head_dim) as u64;
    let (rows, cols) = (block_rows as u64, block_cols as u64);
    (rows * stride + 2 * cols * stride + rows * cols) * 4
}

/// Threads per block for `block_rows`: one warp per [`ROWS_PER_WARP`] rows.
pub const fn threads(block_rows: u32) -> u32 {
    block_rows / ROWS_PER_WARP * 32
}

/// The largest B_r a kernel of `head_dim_capacity` is compiled to launch with. At capacity 256
/// each lane keeps 8 rows × 8 columns of Õ beside its scores, more than the 128 registers per
/// thread that 512 threads (B_r = 128) leave of an SM's 65,536: B_r = 64 only.
pub const fn max_block_rows(head_dim_capacity: u32) -> u32 {
    if head_dim_capacity > 128 { 64 } else { 128 }
}

/// One compiled FA2 kernel's tile shape. Implemented by [`fa2_config!`] for each kernel of the
/// list (`registry::for_each_kernel!`).
pub trait Fa2Config {
    /// Largest head dim the kernel computes: each lane keeps `HEAD_DIM_CAPACITY / 32` columns of
    /// its rows of Õ in registers, so the capacity is a compile-time constant.
    const HEAD_DIM_CAPACITY: u32;
    /// B_c.
    const BLOCK_COLS: u32;
    /// HEAD_DIM_CAPACITY / 32: columns of Õ per lane.
    type const COLS: usize;
    /// B_c / 32: keys of S per lane and block.
    type const KEYS: usize;

    /// Compile-time checks, evaluated where the kernel is instantiated.
    const CHECKED: () = {
        assert!(Self::COLS * 32 == Self::HEAD_DIM_CAPACITY as usize);
        assert!(Self::KEYS * 32 == Self::BLOCK_COLS as usize);
        let rows = max_block_rows(Self::HEAD_DIM_CAPACITY);
        assert!(threads(rows) <= MAX_THREADS_PER_BLOCK);
        // Õ and S of a lane's rows fit in the registers its block size leaves each thread.
        let budget = REGISTERS_PER_SM / threads(rows);
        let budget = if budget < MAX_REGISTERS_PER_THREAD {
            budget
        } else {
            MAX_REGISTERS_PER_THREAD
        };
        assert!(((Self::COLS + Self::KEYS) * ROWS_PER_WARP as usize) < budget as usize);
        // The smallest B_r fits at the smallest head dim this capacity serves (capacities double:
        // 32, 64, 128, 256); the host's plan checks each call's own B_r and d.
        assert!(
            shared_bytes(
                BLOCK_CHOICES[0],
                Self::BLOCK_COLS,
                Self::HEAD_DIM_CAPACITY / 2 + 1
            ) <= MAX_SHARED_BYTES_PER_BLOCK as u64
        );
    };
}

/// `fa2_config!(Name, capacity, B_c)`: a type implementing [`Fa2Config`].
#[macro_export]
macro_rules! fa2_config {
    ($name:ident, $capacity:literal, $block_cols:literal) => {
        struct $name;
        impl $crate::fwd::fa2::config::Fa2Config for $name {
            const HEAD_DIM_CAPACITY: u32 = $capacity;
            const BLOCK_COLS: u32 = $block_cols;
            type const COLS: usize = const { $capacity / 32 };
            type const KEYS: usize = const { $block_cols / 32 };
        }
    };
}
