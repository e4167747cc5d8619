//! The group sum's launch geometry, shared by the kernel and the host's plan: grid
//! (⌈seqlen_k / [`ROWS`]⌉, batch·heads_kv, 2), z = 0 for dK and 1 for dV, [`THREADS`] threads,
//! no shared memory.

/// Threads per block: each takes elements (row, column) of its block's rows in turn, columns
/// fastest, so a warp reads 32 consecutive elements of a row.
pub const THREADS: u32 = 256;
/// Rows of dK (or dV) one block sums.
pub const ROWS: u32 = 16;
/// The grid's z extent: dK and dV.
pub const GRADIENTS: u32 = 2;
