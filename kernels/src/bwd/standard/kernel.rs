//! The standard backward pass, as the FlashAttention-2 article writes it before tiling (its
//! Algorithm 1's backward, or the FlashAttention article's Algorithm 3): every N × N matrix in
//! HBM. The host first recomputes S = scale·Q·Kᵀ and P = softmax(S) with the standard forward's
//! `scores` and `softmax` kernels (P in the input dtype, S in an f32 buffer), then launches:
//!
//! 1. [`probs_gradient`]: dP = dO·Vᵀ, written over S (f32; S is not needed once P is);
//! 2. [`scores_gradient`]: D_i = rowsum(P_i ∘ dP_i), then dS = P ∘ (dP − D) in place;
//! 3. [`query_gradient`]: dQ = scale·dS·K;
//! 4. [`key_value_gradients`]: dK = scale·dSᵀ·Q and dV = Pᵀ·dO.
//!
//! The products are the standard forward's shared-memory tiled product (one 16 × 16 tile of
//! the result per block, one element per thread). Masked keys have P = 0, so dS = 0 there and
//! no mask is needed after the softmax.

use crate::arch;
use crate::common::block::BlockInfo;
use crate::common::element::Element;
use crate::common::params::StandardBackwardParams;
use crate::fwd::standard::config::MATMUL_TILE;
use crate::fwd::standard::kernel::tile_product;
use crate::tile::global::HeadRows;
use crate::tile::warp::warp_sum;

/// This thread's (row, column) inside its block's 16 × 16 output tile.
#[inline(always)]
fn tile_thread() -> (u32, u32) {
    (
        arch::thread_idx_x() / MATMUL_TILE,
        arch::thread_idx_x() % MATMUL_TILE,
    )
}

/// The first (row, column) of this block's output tile: rows from block y, columns from x.
#[inline(always)]
fn tile_origin() -> (u32, u32) {
    (
        arch::block_idx_y() * MATMUL_TILE,
        arch::block_idx_x() * MATMUL_TILE,
    )
}

/// This block's tile of Xᵀ·Y, rows keys and columns head-dim entries, for X (query, key) and
/// Y (query, d) read by `x` and `y`: the inner dimension is the queries. Keys past `seqlen_k`
/// and columns past `head_dim` read as 0 (their elements are dropped on write).
#[inline(always)]
fn key_tile_product(
    seqlen_q: u32,
    seqlen_k: u32,
    head_dim: u32,
    x: impl Fn(u32, u32) -> f32,
    y: impl Fn(u32, u32) -> f32,
) -> f32 {
    let (tile_row, tile_col) = tile_origin();
    tile_product(
        seqlen_q,
        tile_row,
        tile_col,
        false,
        |key, query| if key < seqlen_k { x(query, key) } else { 0.0 },
        |query, d| if d < head_dim { y(query, d) } else { 0.0 },
    )
}

/// Kernel 1: dP = dO·Vᵀ into the f32 buffer that held S. Grid (⌈seqlen_k/16⌉, ⌈seqlen_q/16⌉,
/// batch·heads), 256 threads.
#[inline(always)]
pub fn probs_gradient<T: Element>(p: &StandardBackwardParams) {
    let shape = &p.base.shape;
    let blk = BlockInfo::new(shape, arch::block_idx_z());
    let d_o = HeadRows::<T>::new(&p.d_o, blk.batch, blk.head, blk.seqlen_q);
    let v = HeadRows::<T>::new(&p.base.operands.v, blk.batch, blk.kv_head, blk.seqlen_k);
    let dp = HeadRows::<f32>::contiguous(p.base.scores, blk.batch_head, blk.seqlen_q, blk.seqlen_k);
    let (tile_row, tile_col) = tile_origin();
    let dot = tile_product(
        shape.head_dim,
        tile_row,
        tile_col,
        true,
        |row, d| d_o.read(row, d),
        |d, key| v.read(key, d),
    );
    let (ty, tx) = tile_thread();
    if tile_col + tx < shape.seqlen_k {
        dp.write(tile_row + ty, tile_col + tx, dot);
    }
}

/// Kernel 2: D_i = Σ_j P_ij·dP_ij, then dS_ij = P_ij·(dP_ij − D_i) over dP in place (the
/// FlashAttention article's Algorithm 3, line 3). D from P and dP rather than dO·O: it is the
/// same number in exact arithmetic, and with P stored in the input dtype it keeps Σ_j dS_ij = 0
/// for the P the products use. One warp per query row. Grid (⌈seqlen_q/8⌉, batch·heads),
/// 256 threads.
#[inline(always)]
pub fn scores_gradient<T: Element>(p: &StandardBackwardParams) {
    let shape = &p.base.shape;
    let blk = BlockInfo::new(shape, arch::block_idx_y());
    let row = arch::block_idx_x() * arch::warps_per_block() + arch::warp_idx();
    if row >= blk.seqlen_q {
        return;
    }
    let lanes = arch::WARP_SIZE;
    let ds = HeadRows::<f32>::contiguous(p.base.scores, blk.batch_head, blk.seqlen_q, blk.seqlen_k);
    let probs = HeadRows::<T>::contiguous(p.base.probs, blk.batch_head, blk.seqlen_q, blk.seqlen_k);
    let mut partial = 0.0f32;
    let mut key = arch::lane_idx();
    while key < shape.seqlen_k {
        partial += probs.read(row, key) * ds.read(row, key);
        key += lanes;
    }
    let delta = warp_sum(partial);
    let mut key = arch::lane_idx();
    while key < shape.seqlen_k {
        ds.write(row, key, probs.read(row, key) * (ds.read(row, key) - delta));
        key += lanes;
    }
}

/// Kernel 3: dQ = scale·dS·K. Grid (⌈head_dim/16⌉, ⌈seqlen_q/16⌉, batch·heads), 256 threads.
#[inline(always)]
pub fn query_gradient<T: Element>(p: &StandardBackwardParams) {
    let shape = &p.base.shape;
    let blk = BlockInfo::new(shape, arch::block_idx_z());
    let ds = HeadRows::<f32>::contiguous(p.base.scores, blk.batch_head, blk.seqlen_q, blk.seqlen_k);
    let k = HeadRows::<T>::new(&p.base.operands.k, blk.batch, blk.kv_head, blk.seqlen_k);
    let dq = HeadRows::<T>::new(&p.dq, blk.batch, blk.head, blk.seqlen_q);
    let (tile_row, tile_col) = tile_origin();
    let head_dim = shape.head_dim;
    let value = tile_product(
        shape.seqlen_k,
        tile_row,
        tile_col,
        false,
        |row, key| ds.read(row, key),
        |key, d| if d < head_dim { k.read(key, d) } else { 0.0 },
    );
    let (ty, tx) = tile_thread();
    if tile_col + tx < head_dim {
        dq.write(tile_row + ty, tile_col + tx, value * shape.softmax_scale);
    }
}

/// Kernel 4: dK = scale·dSᵀ·Q and dV = Pᵀ·dO, one tile of each per block (rows are keys).
/// Grid (⌈head_dim/16⌉, ⌈seqlen_k/16⌉, batch·heads), 256 threads. It reads no K or V: for
/// grouped K/V heads the host launches it on the shape with `kv_group` 1, so each query head
/// stores its own rows of the expanded workspace that `bwd::group_sum` sums.
#[inline(always)]
pub fn key_value_gradients<T: Element>(p: &StandardBackwardParams) {
    let shape = &p.base.shape;
    let blk = BlockInfo::new(shape, arch::block_idx_z());
    let (seqlen_q, seqlen_k, head_dim) = (blk.seqlen_q, blk.seqlen_k, shape.head_dim);
    let ds = HeadRows::<f32>::contiguous(p.base.scores, blk.batch_head, seqlen_q, seqlen_k);
    let probs = HeadRows::<T>::contiguous(p.base.probs, blk.batch_head, seqlen_q, seqlen_k);
    let q = HeadRows::<T>::new(&p.base.operands.q, blk.batch, blk.head, seqlen_q);
    let d_o = HeadRows::<T>::new(&p.d_o, blk.batch, blk.head, seqlen_q);
    let dk = HeadRows::<T>::new(&p.dk, blk.batch, blk.kv_head, seqlen_k);
    let dv = HeadRows::<T>::new(&p.dv, blk.batch, blk.kv_head, seqlen_k);
    let (tile_row, tile_col) = tile_origin();
    let dk_value = key_tile_product(
        seqlen_q,
        seqlen_k,
        head_dim,
        |query, key| ds.read(query, key),
        |query, d| q.read(query, d),
    );
    let dv_value = key_tile_product(
        seqlen_q,
        seqlen_k,
        head_dim,
        |query, key| probs.read(query, key),
        |query, d| d_o.read(query, d),
    );
    let (ty, tx) = tile_thread();
    if tile_col + tx < head_dim {
        dk.write(tile_row + ty, tile_col + tx, dk_value * shape.softmax_scale);
        dv.write(tile_row + ty, tile_col + tx, dv_value);
    }
}
