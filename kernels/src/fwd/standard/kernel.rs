//! Standard attention, as the articles describe it before FlashAttention: three kernels that
//! communicate through device memory.
//!
//! 1. [`scores`]:  S = scale·Q·Kᵀ, written to HBM (f32).
//! 2. [`softmax`]: P = softmax(S) row by row (with the causal mask), read S, write P (input dtype)
//!    and each row's logsumexp L.
//! 3. [`output`]:  O = P·V, read P, write O.
//!
//! Both products are the textbook shared-memory tiled matrix product: each block computes a
//! 16 × 16 tile of the result, one element per thread, stepping through the inner dimension
//! 16 at a time.

use super::config::{MATMUL_DEPTH, MATMUL_TILE};
use crate::arch;
use crate::common::alibi::Alibi;
use crate::common::block::BlockInfo;
use crate::common::element::Element;
use crate::common::params::StandardParams;
use crate::common::softcap::{Softcap, tanh_precise};
use crate::common::softmax::{LOG2_E, RowStats, fa1_merge};
use crate::tile::global::{HeadRows, HeadVector};
use crate::tile::shared::SharedTile;
use crate::tile::warp::warp_max;

/// One 16 × 16 tile of C = A·B with C[r][c] = Σ_k a(r, k)·b(k, c), for r, c inside the block's
/// tile, k < depth. `b_rows_are_columns` says that `b` reads a row-major matrix transposed (B = Kᵀ),
/// so the load walks k fastest to stay coalesced. Returns this thread's element of the tile.
#[inline(always)]
pub(crate) fn tile_product(
    depth: u32,
    tile_row: u32,
    tile_col: u32,
    b_rows_are_columns: bool,
    a: impl Fn(u32, u32) -> f32,
    b: impl Fn(u32, u32) -> f32,
) -> f32 {
    let mut carver = arch::SharedCarver::from_start();
    let a_tile = SharedTile::carve(&mut carver, MATMUL_TILE, MATMUL_DEPTH);
    let b_tile = SharedTile::carve(&mut carver, MATMUL_DEPTH, MATMUL_TILE);
    let (ty, tx) = (
        arch::thread_idx_x() / MATMUL_TILE,
        arch::thread_idx_x() % MATMUL_TILE,
    );
    let mut acc = 0.0f32;
    let mut k0 = 0;
    while k0 < depth {
        let k_in = |k: u32| k0 + k < depth;
        a_tile.set(
            ty,
            tx,
            if k_in(tx) {
                a(tile_row + ty, k0 + tx)
            } else {
                0.0
            },
        );
        // B's tile is B[k][col]; loading it transposed (thread x walks k) keeps B = Kᵀ coalesced.
        let (k, col) = if b_rows_are_columns {
            (tx, ty)
        } else {
            (ty, tx)
        };
        b_tile.set(
            k,
            col,
            if k_in(k) {
                b(k0 + k, tile_col + col)
            } else {
                0.0
            },
        );
        arch::sync_threads();
        for k in 0..MATMUL_DEPTH {
            acc += a_tile.get(ty, k) * b_tile.get(k, tx);
        }
        arch::sync_threads();
        k0 += MATMUL_DEPTH;
    }
    acc
}

/// Kernel 1: S = scale·Q·Kᵀ, soft-capped when capping is on (softcap·tanh(S / softcap),
/// computed as `common::softcap` does), then ALiBi's bias when it is on. Grid (⌈seqlen_k/16⌉, ⌈seqlen_q/16⌉, batch·heads), 256 threads.
#[inline(always)]
pub fn scores<T: Element>(p: &StandardParams) {
    let shape = &p.shape;
    let blk = BlockInfo::new(shape, arch::block_idx_z());
    let q = HeadRows::<T>::new(&p.operands.q, blk.batch, blk.head, blk.seqlen_q);
    let k = HeadRows::<T>::new(&p.operands.k, blk.batch, blk.kv_head, blk.seqlen_k);
    let s = HeadRows::<f32>::contiguous(p.scores, blk.batch_head, blk.seqlen_q, blk.seqlen_k);
    let (tile_row, tile_col) = (
        arch::block_idx_y() * MATMUL_TILE,
        arch::block_idx_x() * MATMUL_TILE,
    );
    let dot = tile_product(
        shape.head_dim,
        tile_row,
        tile_col,
        true,
        |row, d| q.read(row, d),
        |d, key| k.read(key, d),
    );
    let (ty, tx) = (
        arch::thread_idx_x() / MATMUL_TILE,
        arch::thread_idx_x() % MATMUL_TILE,
    );
    if tile_col + tx < shape.seqlen_k {
        let softcap = Softcap::of(shape);
        let dot = if softcap.is_on() {
            softcap.apply(dot, |x| tanh_precise(x, arch::exp2))
        } else {
            dot
        };
        let alibi = Alibi::of_block(shape, &blk, true);
        let dot = if alibi.is_on() {
            dot + alibi.bias(tile_row + ty, tile_col + tx)
        } else {
            dot
        };
        s.write(tile_row + ty, tile_col + tx, dot * shape.softmax_scale);
    }
}

/// Kernel 2: P = softmax(S) with the mask (causal or a window: each row's keys are one range), and L = logsumexp of each row. One warp per row:
/// a first pass keeps per-lane online-softmax statistics and merges them across the warp, a second
/// writes P. Grid (⌈seqlen_q/8⌉, batch·heads), 256 threads.
#[inline(always)]
pub fn softmax<T: Element>(p: &StandardParams) {
    let shape = &p.shape;
    let blk = BlockInfo::new(shape, arch::block_idx_y());
    let row = arch::block_idx_x() * arch::warps_per_block() + arch::warp_idx();
    if row >= blk.seqlen_q {
        return;
    }
    let s = HeadRows::<f32>::contiguous(p.scores, blk.batch_head, blk.seqlen_q, blk.seqlen_k);
    let probs = HeadRows::<T>::contiguous(p.probs, blk.batch_head, blk.seqlen_q, blk.seqlen_k);
    let mask = blk.mask();
    let visible =
        mask.visible_key_start(row, blk.seqlen_k)..mask.visible_key_end(row, blk.seqlen_k);
    let lanes = arch::WARP_SIZE;

    // Pass 1: per-lane (m, ℓ) over the lane's keys, then the warp's merge of the 32 partial rows.
    let mut lane_stats = RowStats::EMPTY;
    let mut key = visible.start + arch::lane_idx();
    while key < visible.end {
        let score = s.read(row, key) * LOG2_E;
        lane_stats = fa1_merge(
            lane_stats,
            RowStats {
                max: score,
                sum: 1.0,
            },
            arch::exp2,
        )
        .merged;
        key += lanes;
    }
    let row_max = warp_max(lane_stats.max);
    let rescaled = lane_stats.sum * arch::exp2(lane_stats.max - RowStats::exp_base(row_max));
    let row_stats = RowStats {
        max: row_max,
        sum: crate::tile::warp::warp_sum(rescaled),
    };

    // Pass 2: P = e^(S − m)/ℓ on visible keys, 0 on masked ones.
    let inverse_sum = row_stats.inverse_sum();
    let base = RowStats::exp_base(row_max);
    let mut key = arch::lane_idx();
    while key < shape.seqlen_k {
        let prob = if visible.contains(&key) {
            arch::exp2(s.read(row, key) * LOG2_E - base) * inverse_sum
        } else {
            0.0
        };
        probs.write(row, key, prob);
        key += lanes;
    }
    if arch::lane_idx() == 0 {
        HeadVector::new(p.logsumexp, blk.batch_head, blk.seqlen_q)
            .write(row, row_stats.logsumexp(arch::log2));
    }
}

/// Kernel 3: O = P·V. Grid (⌈head_dim/16⌉, ⌈seqlen_q/16⌉, batch·heads), 256 threads.
#[inline(always)]
pub fn output<T: Element>(p: &StandardParams) {
    let shape = &p.shape;
    let blk = BlockInfo::new(shape, arch::block_idx_z());
    let probs = HeadRows::<T>::contiguous(p.probs, blk.batch_head, blk.seqlen_q, blk.seqlen_k);
    let v = HeadRows::<T>::new(&p.operands.v, blk.batch, blk.kv_head, blk.seqlen_k);
    let o = HeadRows::<T>::new(&p.operands.o, blk.batch, blk.head, blk.seqlen_q);
    let (tile_row, tile_col) = (
        arch::block_idx_y() * MATMUL_TILE,
        arch::block_idx_x() * MATMUL_TILE,
    );
    let head_dim = shape.head_dim;
    let value = tile_product(
        shape.seqlen_k,
        tile_row,
        tile_col,
        false,
        |row, key| probs.read(row, key),
        |key, d| if d < head_dim { v.read(key, d) } else { 0.0 },
    );
    let (ty, tx) = (
        arch::thread_idx_x() / MATMUL_TILE,
        arch::thread_idx_x() % MATMUL_TILE,
    );
    if tile_col + tx < head_dim {
        o.write(tile_row + ty, tile_col + tx, value);
    }
}
