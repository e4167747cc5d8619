//! FlashAttention-2 forward (Dao 2023, Algorithm 1), as the article lays it out.
//!
//! Grid over (row block i, batch·head). Q_i is loaded once; the inner loop walks the K/V blocks j.
//! Split-Q: each warp owns `config::ROWS_PER_WARP` rows of Q_i, so warps never exchange partial
//! results. Each lane keeps, in registers, its share of those rows' statistics m and ℓ and of the
//! unnormalised accumulator Õ (columns lane, lane + 32, …); one divide at the end, then O and
//! L = m + log ℓ go to HBM.
//!
//! Causal: K/V blocks past the diagonal are never loaded; the element-wise mask is applied only to
//! blocks that need it (the diagonal and the sequence tail), by the same block step compiled with
//! `MASK = true`.

use super::config::{Fa2Config, ROWS_PER_WARP};
use crate::arch::{self, WARP_SIZE};
use crate::common::block::BlockInfo;
use crate::common::element::Element;
use crate::common::params::Fa2Params;
use crate::common::softmax::{LOG2_E, RowStats, fa2_rescale};
use crate::tile::global::{HeadRows, HeadVector};
use crate::tile::shared::{SharedTile, load_tile};
use crate::tile::warp::{warp_max, warp_sum};

type const ROWS: usize = const { ROWS_PER_WARP as usize };

/// The SRAM tiles: Q_i for the whole loop, K_j and V_j per step, and P̃ (each warp its own rows).
struct Fa2Sram {
    q: SharedTile,
    k: SharedTile,
    v: SharedTile,
    p: SharedTile,
}

/// One warp's rows: the running statistics and Õ, in registers (`C::COLS` = head-dim capacity
/// / 32 columns per lane).
struct WarpRows<C: Fa2Config> {
    stats: [RowStats; ROWS],
    acc: [[f32; C::COLS]; ROWS],
    /// Index in Q_i of this warp's first row.
    first: u32,
}

/// Per-launch constants of one block.
struct Fa2Block {
    info: BlockInfo,
    row_start: u32,
    head_dim: u32,
    score_scale: f32,
}

/// The kernel body for head dims up to `C::HEAD_DIM_CAPACITY` and B_c = `C::BLOCK_COLS`. Grid
/// (⌈seqlen_q/B_r⌉, batch·heads), `config::threads(B_r)` threads, `config::shared_bytes` of
/// dynamic shared memory.
#[inline(always)]
pub fn forward<T: Element, C: Fa2Config>(p: &Fa2Params) {
    let () = C::CHECKED;
    let shape = &p.shape;
    let info = BlockInfo::causal_only(shape, arch::block_idx_y());
    let block_rows = p.block_rows;
    let block_cols = C::BLOCK_COLS;
    let head_dim = shape.head_dim;
    let blk = Fa2Block {
        info,
        row_start: arch::block_idx_x() * block_rows,
        head_dim,
        score_scale: shape.softmax_scale * LOG2_E,
    };
    let q = HeadRows::<T>::new(&p.operands.q, info.batch, info.head, info.seqlen_q);
    let k = HeadRows::<T>::new(&p.operands.k, info.batch, info.kv_head, info.seqlen_k);
    let v = HeadRows::<T>::new(&p.operands.v, info.batch, info.kv_head, info.seqlen_k);
    let mut carver = arch::SharedCarver::from_start();
    let sram = Fa2Sram {
        q: SharedTile::carve(&mut carver, block_rows, head_dim),
        k: SharedTile::carve(&mut carver, block_cols, head_dim),
        v: SharedTile::carve(&mut carver, block_cols, head_dim),
        p: SharedTile::carve_dense(&mut carver, block_rows, block_cols),
    };

    // Load Q_i once.
    load_tile(&q, blk.row_start, block_rows, head_dim, &sram.q);
    let mut rows = WarpRows::<C> {
        stats: [RowStats::EMPTY; ROWS],
        acc: [[0.0; C::COLS]; ROWS],
        first: arch::warp_idx() * ROWS_PER_WARP,
    };

    // Inner loop over K/V blocks; causal blocks past the diagonal of this row block are skipped.
    let key_blocks = info.key_blocks(blk.row_start, block_rows, block_cols);
    for j in 0..key_blocks.count() {
        let key_start = j * block_cols;
        arch::sync_threads(); // Every warp is done with K_{j−1}, V_{j−1}.
        load_tile(&k, key_start, block_cols, head_dim, &sram.k);
        load_tile(&v, key_start, block_cols, head_dim, &sram.v);
        arch::sync_threads();
        if key_blocks.needs_mask(key_start) {
            attend_block::<true, C>(&blk, &sram, &mut rows, key_start);
        } else {
            attend_block::<false, C>(&blk, &sram, &mut rows, key_start);
        }
    }

    // O_i = diag(ℓ)⁻¹·Õ_i, L_i = m_i + log ℓ_i.
    let o = HeadRows::<T>::new(&p.operands.o, info.batch, info.head, info.seqlen_q);
    let logsumexp = HeadVector::new(p.logsumexp, info.batch_head, info.seqlen_q);
    for r in 0..ROWS {
        let row = blk.row_start + rows.first + r as u32;
        let inverse_sum = rows.stats[r].inverse_sum();
        for (t, value) in rows.acc[r].iter().enumerate() {
            let col = arch::lane_idx() + WARP_SIZE * t as u32;
            if col < head_dim {
                o.write(row, col, value * inverse_sum);
            }
        }
        if arch::lane_idx() == 0 && row < info.seqlen_q {
            logsumexp.write(row, rows.stats[r].logsumexp(arch::log2));
        }
    }
}

/// One step of the inner loop for one warp's rows:
/// S = Q_i·K_jᵀ; m^(j) = max(m^(j−1), rowmax S); P̃ = e^(S − m^(j)); ℓ^(j) = α·ℓ^(j−1) + rowsum P̃;
/// Õ^(j) = α·Õ^(j−1) + P̃·V_j, with α = e^(m^(j−1) − m^(j)). Lane l holds keys l, l + 32, … of S.
#[inline(always)]
fn attend_block<const MASK: bool, C: Fa2Config>(
    blk: &Fa2Block,
    sram: &Fa2Sram,
    rows: &mut WarpRows<C>,
    key_start: u32,
) {
    let lane = arch::lane_idx();
    // S = Q_i·K_jᵀ, scaled into log2 units; masked keys are −∞.
    let mut scores = [[0.0f32; C::KEYS]; ROWS];
    for x in 0..blk.head_dim {
        let mut q = [0.0f32; ROWS];
        for (r, q) in q.iter_mut().enumerate() {
            *q = sram.q.get(rows.first + r as u32, x);
        }
        for u in 0..C::KEYS {
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
            let visible = !MASK || (key < blk.info.seqlen_k && blk.info.mask().visible(row, key));
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
        let (stats, alpha) = fa2_rescale(rows.stats[r], block_max, arch::exp2);
        let base = RowStats::exp_base(stats.max);
        let mut row_sum = 0.0f32;
        for (u, score) in scores[r].iter().enumerate() {
            let p = arch::exp2(score - base);
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
    arch::sync_warp(); // P̃ rows written by all lanes before any lane reads them.

    // Õ += P̃·V_j: lane l accumulates columns l, l + 32, … of its warp's rows.
    for key in 0..C::BLOCK_COLS {
        let mut p = [0.0f32; ROWS];
        for (r, p) in p.iter_mut().enumerate() {
            *p = sram.p.get(rows.first + r as u32, key);
        }
        for t in 0..C::COLS {
            let col = lane + WARP_SIZE * t as u32;
            if col < blk.head_dim {
                let v = sram.v.get(key, col);
                for r in 0..ROWS {
                    rows.acc[r][t] += p[r] * v;
                }
            }
        }
    }
    arch::sync_warp(); // Every lane has read P̃ before the next step overwrites it.
}
