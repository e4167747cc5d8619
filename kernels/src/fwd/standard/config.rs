//! Standard attention's launch geometry: three kernels over 16 × 16 output tiles (the two matrix
//! products) and one warp per row (the softmax).

use crate::common::limits::MAX_SHARED_BYTES_PER_BLOCK;
use crate::tile::layout::conflict_free_stride;

/// Threads per block of all three kernels.
pub const THREADS: u32 = 256;

/// Side of the square output tile of the two matrix products (S = Q·Kᵀ and O = P·V).
pub const MATMUL_TILE: u32 = 16;
/// Depth of one shared-memory step of those products.
pub const MATMUL_DEPTH: u32 = 16;

/// Shared memory of a product kernel: one MATMUL_TILE × MATMUL_DEPTH tile of each operand, f32,
/// at a bank-conflict-free stride.
pub const PRODUCT_SHARED_BYTES: u32 = 2 * MATMUL_TILE * conflict_free_stride(MATMUL_DEPTH) * 4;

/// Rows of S one softmax block normalises: one per warp.
pub const SOFTMAX_ROWS_PER_BLOCK: u32 = THREADS / 32;

const _: () = {
    // Each thread of a product block owns one element of the output tile.
    assert!(THREADS == MATMUL_TILE * MATMUL_TILE);
    assert!(MATMUL_DEPTH == MATMUL_TILE);
    assert!(PRODUCT_SHARED_BYTES <= MAX_SHARED_BYTES_PER_BLOCK);
};
