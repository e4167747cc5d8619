//! FlashAttention-2 forward (Dao 2023, Algorithm 1), as the article lays it out.
//!
//! Grid over (row block i, batch·head). Q_i is loaded once; the inner loop walks the K/V blocks j.
//! Split-Q: each warp owns `FA2_ROWS_PER_WARP` rows of Q_i, so warps never exchange partial
//! results. Each lane keeps, in registers, its share of those rows' statistics m and ℓ and of the
//! unnormalised accumulator Õ (columns lane, lane + 32, …); one divide at the end, then O and
//! L = m + log ℓ go to HBM.
//!
//! Causal: K/V blocks past the diagonal are never loaded; the element-wise mask is applied only to
//! blocks that need it (the diagonal and the sequence tail), by the same block step compiled with
//! `MASK = true`.

use crate::element::Element;
use crate::gpu::{self, WARP_SIZE};
use crate::layout::FA2_ROWS_PER_WARP;
use crate::mask::CausalMask;
use crate::params::Fa2Params;
use crate::softmax::{LOG2_E, RowStats, fa2_rescale};
use crate::tile::{HeadRows, HeadVector, SharedTile, load_tile, warp_max, warp_sum};

const ROWS: usize = FA2_ROWS_PER_WARP as usize;

/// The SRAM tiles: Q_i for the whole loop, K_j and V_j per step, and P̃ (each warp its own rows).
struct Fa2Sram {
    q: SharedTile,
    k: SharedTile,
    v: SharedTile,
    p: SharedTile,
}

/// One warp's rows: the running statistics and Õ, in registers (`COLS` = head-dim capacity / 32).
struct WarpRows<const COLS: usize> {
    stats: [RowStats; ROWS],
    acc: [[f32; COLS]; ROWS],
    /// Index in Q_i of this warp's first row.
    first: u32,
}

/// Per-launch constants of one block.
struct Fa2Block {
    mask: CausalMask,
    row_start: u32,
    seqlen_k: u32,
    head_dim: u32,
    score_scale: f32,
}

/// The kernel body. `COLS` = head-dim capacity / 32 (a capacity from
/// `layout::FA2_HEAD_DIM_CAPACITIES`, ≥ head_dim); `KEYS` = B_c / 32. Grid (⌈seqlen_q/B_r⌉,
/// batch·heads), `layout::fa2_threads(B_r)` threads, `layout::fa2_shared_bytes` of dynamic shared
/// memory.
#[inline(always)]
pub fn forward<T: Element, const COLS: usize, const KEYS: usize>(p: &Fa2Params) {
    let shape = &p.shape;
    let batch_head = gpu::block_idx_y();
    let (batch, head) = (batch_head / shape.heads, batch_head % shape.heads);
    let block_rows = p.block_rows;
    let block_cols = KEYS as u32 * WARP_SIZE;
    let head_dim = shape.head_dim;
    let blk = Fa2Block {
        mask: CausalMask::new(shape.causal != 0, shape.seqlen_q, shape.seqlen_k),
        row_start: gpu::block_idx_x() * block_rows,
        seqlen_k: shape.seqlen_k,
        head_dim,
        score_scale: shape.softmax_scale * LOG2_E,
    };
    let q = HeadRows::<T>::new(&p.operands.q, batch, head, shape.seqlen_q);
    let k = HeadRows::<T>::new(&p.operands.k, batch, head, shape.seqlen_k);
    let v = HeadRows::<T>::new(&p.operands.v, batch, head, shape.seqlen_k);
    let mut carver = gpu::SharedCarver::from_start();
    let sram = Fa2Sram {
        q: SharedTile::carve(&mut carver, block_rows, head_dim),
        k: SharedTile::carve(&mut carver, block_cols, head_dim),
        v: SharedTile::carve(&mut carver, block_cols, head_dim),
        p: SharedTile::carve_dense(&mut carver, block_rows, block_cols),
    };

    // Load Q_i once.
    load_tile(&q, blk.row_start, block_rows, head_dim, &sram.q);
    let mut rows = WarpRows::<COLS> {
        stats: [RowStats::EMPTY; ROWS],
        acc: [[0.0; COLS]; ROWS],
        first: gpu::warp_idx() * FA2_ROWS_PER_WARP,
    };

    // Inner loop over K/V blocks; causal blocks past the diagonal of this row block are skipped.
    let key_blocks =
        blk.mask
            .key_blocks_needed(blk.row_start + block_rows, shape.seqlen_k, block_cols);
    for j in 0..key_blocks {
        let key_start = j * block_cols;
        gpu::sync_threads(); // Every warp is done with K_{j−1}, V_{j−1}.
        load_tile(&k, key_start, block_cols, head_dim, &sram.k);
        load_tile(&v, key_start, block_cols, head_dim, &sram.v);
        gpu::sync_threads();
        let tail = key_start + block_cols > shape.seqlen_k;
        if tail
            || blk
                .mask
                .tile_needs_mask(blk.row_start, key_start + block_cols)
        {
            attend_block::<true, COLS, KEYS>(&blk, &sram, &mut rows, key_start);
        } else {
            attend_block::<false, COLS, KEYS>(&blk, &sram, &mut rows, key_start);
        }
    }

    // O_i = diag(ℓ)⁻¹·Õ_i, L_i = m_i + log ℓ_i.
    let o = HeadRows::<T>::new(&p.operands.o, batch, head, shape.seqlen_q);
    let logsumexp = HeadVector::new(p.logsumexp, batch_head, shape.seqlen_q);
    for r in 0..ROWS {
        let row = blk.row_start + rows.first + r as u32;
        let inverse_sum = rows.stats[r].inverse_sum();
        for (t, value) in rows.acc[r].iter().enumerate() {
            let col = gpu::lane_idx() + WARP_SIZE * t as u32;
            if col < head_dim {
                o.write(row, col, value * inverse_sum);
            }
        }
        if gpu::lane_idx() == 0 && row < shape.seqlen_q {
            logsumexp.write(row, rows.stats[r].logsumexp(gpu::log2));
        }
    }
}

/// One step of the inner loop for one warp's rows:
/// S = Q_i·K_jᵀ; m^(j) = max(m^(j−1), rowmax S); P̃ = e^(S − m^(j)); ℓ^(j) = α·ℓ^(j−1) + rowsum P̃;
/// Õ^(j) = α·Õ^(j−1) + P̃·V_j, with α = e^(m^(j−1) − m^(j)). Lane l holds keys l, l + 32, … of S.
#[inline(always)]
fn attend_block<const MASK: bool, const COLS: usize, const KEYS: usize>(
    blk: &Fa2Block,
    sram: &Fa2Sram,
    rows: &mut WarpRows<COLS>,
    key_start: u32,
) {
    let lane = gpu::lane_idx();
    // S = Q_i·K_jᵀ, scaled into log2 units; masked keys are −∞.
    let mut scores = [[0.0f32; KEYS]; ROWS];
    for x in 0..blk.head_dim {
        let mut q = [0.0f32; ROWS];
        for (r, q) in q.iter_mut().enumerate() {
            *q = sram.q.get(rows.first + r as u32, x);
        }
        for u in 0..KEYS {
            let k = sram.k.get(lane + WARP_SIZE * u as u32, x);
            for r in 0..ROWS {
                scores[r][u] += q[r] * k;
            }
        }
    }
    for (r, row_scores) in scores.iter_mut().enumerate() {
        let row = blk.row_start + rows.first + r as u32;
        for (u, score) in row_scores.iter_mut().enumerate() {
            let key = key_start + lane + WARP_SIZE * u as u32;
            let visible = !MASK || (key < blk.seqlen_k && blk.mask.visible(row, key));
            *score = if visible {
                *score * blk.score_scale
            } else {
                f32::NEG_INFINITY
            };
        }
    }

    // Online softmax: only α remains (the running max is updated directly).
    for r in 0..ROWS {
        let block_max = warp_max(scores[r].iter().copied().fold(f32::NEG_INFINITY, f32::max));
        let (stats, alpha) = fa2_rescale(rows.stats[r], block_max, gpu::exp2);
        let base = RowStats::exp_base(stats.max);
        let mut row_sum = 0.0f32;
        for (u, score) in scores[r].iter().enumerate() {
            let p = gpu::exp2(score - base);
            sram.p
                .set(rows.first + r as u32, lane + WARP_SIZE * u as u32, p);
            row_sum += p;
        }
        rows.stats[r] = RowStats {
            max: stats.max,
            sum: stats.sum + warp_sum(row_sum),
        };
        for value in rows.acc[r].iter_mut() {
            *value *= alpha;
        }
    }
    gpu::sync_warp(); // P̃ rows written by all lanes before any lane reads them.

    // Õ += P̃·V_j: lane l accumulates columns l, l + 32, … of its warp's rows.
    for key in 0..(KEYS as u32 * WARP_SIZE) {
        let mut p = [0.0f32; ROWS];
        for (r, p) in p.iter_mut().enumerate() {
            *p = sram.p.get(rows.first + r as u32, key);
        }
        for t in 0..COLS {
            let col = lane + WARP_SIZE * t as u32;
            if col < blk.head_dim {
                let v = sram.v.get(key, col);
                for r in 0..ROWS {
                    rows.acc[r][t] += p[r] * v;
                }
            }
        }
    }
    gpu::sync_warp(); // Every lane has read P̃ before the next step overwrites it.
}
