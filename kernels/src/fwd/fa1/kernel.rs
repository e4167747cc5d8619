//! FlashAttention-1 forward (Dao et al. 2022, Algorithm 1), as the article lays it out.
//!
//! One thread block per (batch, head). The outer loop walks the K/V blocks j, staging K_j and V_j in
//! shared memory; the inner loop walks every Q block i and, for each, reads O_i, ℓ_i and m_i from
//! HBM, folds in block (i, j) and writes them back. O_i is kept normalised in HBM between steps.
//!
//! Block sizes: B_c = ⌈M/4d⌉, B_r = min(⌈M/4d⌉, d) (`config::Fa1Blocks`), chosen by the host.
//! Scores are kept in log2 units (scale·log2 e folded in), so each e^x is one `exp2`; m is stored
//! in HBM in natural-log units, as the article defines it.
//!
//! O_i between steps lives in an f32 buffer (`o_accumulator`): accumulation is in f32 whatever the
//! input dtype. The last step that touches a row block writes O in the output dtype instead.

use super::config::ROW_VECTORS;
use crate::arch;
use crate::common::block::BlockInfo;
use crate::common::element::Element;
use crate::common::params::Fa1Params;
use crate::common::softmax::{LN_2, LOG2_E, RowStats, fa1_merge};
use crate::tile::global::{HeadRows, HeadVector};
use crate::tile::layout::{QUAD, QUAD_LEN, quad_padded};
use crate::tile::register::{dot_block, product_block};
use crate::tile::shared::{QuadTile, SharedVector, for_each_element, load_tile};
use crate::tile::warp::{warp_max, warp_sum};

/// What one block needs to know about its head.
struct Fa1Head<T> {
    q: HeadRows<T>,
    k: HeadRows<T>,
    v: HeadRows<T>,
    o: HeadRows<T>,
    o_accumulator: HeadRows<f32>,
    row_max: HeadVector,
    row_sum: HeadVector,
    block: BlockInfo,
    head_dim: u32,
    /// scale·log2 e: turns Q·Kᵀ into log2-domain scores.
    score_scale: f32,
    block_rows: u32,
    block_cols: u32,
}

/// The SRAM tiles of Algorithm 1: Q_i, O_i, K_j, V_j, S_ij, and per-row m_i, ℓ_i and the two
/// coefficients of the O update.
///
/// The two matrix products (lines 9 and 12) give each thread a 4 × 4 block of results in
/// registers, fed by 16-byte reads of `QuadTile`s: eight shared-memory reads per 64 multiply-adds
/// instead of 128. Fewer, wider reads make the kernel faster, and they are what makes
/// compute-sanitizer's racecheck, which instruments every shared-memory access, finish at
/// seqlen 1000: this kernel runs one block per head, so one SM does all of a head's work.
struct Fa1Sram {
    q: QuadTile,
    o: QuadTile,
    k: QuadTile,
    v: QuadTile,
    /// S_ij, overwritten in place by P̃_ij; B_c rounded up to whole quads, the extra columns
    /// −∞ in S and so 0 in P̃.
    s: QuadTile,
    m: SharedVector,
    l: SharedVector,
    /// ℓ_i·α/ℓ_new: multiplies the stored (normalised) O_i.
    old_weight: SharedVector,
    /// β/ℓ_new: multiplies P̃_ij·V_j.
    new_weight: SharedVector,
}

impl Fa1Sram {
    fn carve(block_rows: u32, block_cols: u32, head_dim: u32) -> Self {
        let mut carver = arch::SharedCarver::from_start();
        let sram = Self {
            q: QuadTile::carve(&mut carver, block_rows, head_dim),
            o: QuadTile::carve(&mut carver, block_rows, head_dim),
            k: QuadTile::carve(&mut carver, block_cols, head_dim),
            v: QuadTile::carve(&mut carver, block_cols, head_dim),
            s: QuadTile::carve(&mut carver, block_rows, block_cols),
            m: SharedVector::carve(&mut carver, block_rows),
            l: SharedVector::carve(&mut carver, block_rows),
            old_weight: SharedVector::carve(&mut carver, block_rows),
            new_weight: SharedVector::carve(&mut carver, block_rows),
        };
        // Keep `config::Fa1Blocks::shared_bytes` honest: it counts exactly these four vectors.
        const _: () = assert!(ROW_VECTORS == 4);
        sram
    }

    /// Zeros the five tiles, padding included (see `QuadTile`).
    #[inline(always)]
    fn zero_tiles(&self) {
        self.q.zero();
        self.o.zero();
        self.k.zero();
        self.v.zero();
        self.s.zero();
    }
}

/// The kernel body. Grid (batch·heads), `config::THREADS` threads,
/// `Fa1Blocks::shared_bytes` of dynamic shared memory.
#[inline(always)]
pub fn forward<T: Element>(p: &Fa1Params) {
    let shape = &p.shape;
    let blk = BlockInfo::causal_only(shape, arch::block_idx_x());
    let h = Fa1Head::<T> {
        q: HeadRows::new(&p.operands.q, blk.batch, blk.head, blk.seqlen_q),
        k: HeadRows::new(&p.operands.k, blk.batch, blk.kv_head, blk.seqlen_k),
        v: HeadRows::new(&p.operands.v, blk.batch, blk.kv_head, blk.seqlen_k),
        o: HeadRows::new(&p.operands.o, blk.batch, blk.head, blk.seqlen_q),
        o_accumulator: HeadRows::contiguous(
            p.o_accumulator,
            blk.batch_head,
            blk.seqlen_q,
            shape.head_dim,
        ),
        row_max: HeadVector::new(p.row_max, blk.batch_head, blk.seqlen_q),
        row_sum: HeadVector::new(p.row_sum, blk.batch_head, blk.seqlen_q),
        block: blk,
        head_dim: shape.head_dim,
        score_scale: shape.softmax_scale * LOG2_E,
        block_rows: p.block_rows,
        block_cols: p.block_cols,
    };
    let sram = Fa1Sram::carve(h.block_rows, h.block_cols, h.head_dim);
    let row_blocks = h.block.seqlen_q.div_ceil(h.block_rows); // T_r
    let col_blocks = h.block.seqlen_k.div_ceil(h.block_cols); // T_c

    // Line 2: O = 0, ℓ = 0, m = −∞ in HBM. The SRAM tiles start at 0 too: their padding is read
    // as data by the 4 × 4 products and never written again.
    initialize(&h);
    sram.zero_tiles();
    arch::sync_threads();

    // Line 5: for 1 ≤ j ≤ T_c.
    for j in 0..col_blocks {
        // Line 6: load K_j, V_j from HBM to SRAM.
        let key_start = j * h.block_cols;
        load_tile(&h.k, key_start, h.block_cols, h.head_dim, &sram.k);
        load_tile(&h.v, key_start, h.block_cols, h.head_dim, &sram.v);
        arch::sync_threads();
        // Line 7: for 1 ≤ i ≤ T_r.
        for i in 0..row_blocks {
            let row_start = i * h.block_rows;
            let key_blocks = h
                .block
                .key_blocks(row_start, h.block_rows, h.block_cols)
                .count();
            if j >= key_blocks.min(col_blocks) {
                continue; // Causal: block (i, j) is masked for every row; nothing to fold in.
            }
            let last_step_for_rows = j + 1 == key_blocks.min(col_blocks);
            update_row_block(&h, &sram, row_start, key_start, last_step_for_rows);
        }
        arch::sync_threads();
    }
}

/// Algorithm 1, line 2, plus the rows that no step will touch: causal rows with no visible key
/// (seqlen_q > seqlen_k) get their final O = 0 here.
#[inline(always)]
fn initialize<T: Element>(h: &Fa1Head<T>) {
    for_each_element(h.block.seqlen_q, h.head_dim, |row, col| {
        h.o_accumulator.write(row, col, 0.0);
        if h.block.mask().visible_key_end(row, h.block.seqlen_k) == 0
            && row_block_is_never_visited(h, row)
        {
            h.o.write(row, col, 0.0);
        }
    });
    for_each_element(1, h.block.seqlen_q, |_, row| {
        h.row_max.write(row, f32::NEG_INFINITY);
        h.row_sum.write(row, 0.0);
    });
}

/// Whether the row block holding `row` sees no key at all (so the K/V loop skips it entirely).
#[inline(always)]
fn row_block_is_never_visited<T>(h: &Fa1Head<T>, row: u32) -> bool {
    let block_start = row / h.block_rows * h.block_rows;
    h.block
        .key_blocks(block_start, h.block_rows, h.block_cols)
        .count()
        == 0
}

/// Lines 8–13 for one (i, j): load Q_i, O_i, ℓ_i, m_i; S_ij = Q_i·K_jᵀ; block statistics; merge;
/// O_i ← diag(ℓ_new)⁻¹(diag(ℓ_i)·α·O_i + β·P̃_ij·V_j); write O_i, ℓ_i, m_i back.
#[inline(always)]
fn update_row_block<T: Element>(
    h: &Fa1Head<T>,
    sram: &Fa1Sram,
    row_start: u32,
    key_start: u32,
    last_step: bool,
) {
    let (rows, cols, d) = (h.block_rows, h.block_cols, h.head_dim);
    // Line 8: load Q_i, O_i, ℓ_i, m_i from HBM to SRAM.
    load_tile(&h.q, row_start, rows, d, &sram.q);
    load_tile(&h.o_accumulator, row_start, rows, d, &sram.o);
    for_each_element(1, rows, |_, r| {
        let row = row_start + r;
        let (m, l) = if row < h.block.seqlen_q {
            (h.row_max.read(row), h.row_sum.read(row))
        } else {
            (f32::NEG_INFINITY, 0.0)
        };
        sram.m.set(r, m * LOG2_E);
        sram.l.set(r, l);
    });
    arch::sync_threads();

    // Line 9: S_ij = Q_i·K_jᵀ (scaled, log2 units); masked and out-of-range keys are −∞. A thread
    // owns rows 4g..4g+4 and keys j, j + G, j + 2G, j + 3G (G = key groups): consecutive lanes
    // read consecutive rows of K_j, which the odd quad stride spreads over the banks.
    let keys_in_block = (h.block.seqlen_k - key_start).min(cols);
    let key_groups = cols.div_ceil(QUAD);
    for_each_element(rows.div_ceil(QUAD), key_groups, |group, first_key| {
        let tile_rows = rows_of_group(group);
        let tile_keys = core::array::from_fn(|k| first_key + k as u32 * key_groups);
        let dots = dot_block(&sram.q, tile_rows, &sram.k, tile_keys, d.div_ceil(QUAD));
        for (&r, dots) in tile_rows.iter().zip(&dots) {
            for (&c, &dot) in tile_keys.iter().zip(dots) {
                let (row, key) = (row_start + r, key_start + c);
                let visible = c < keys_in_block && h.block.mask().visible(row, key);
                if r < rows {
                    let score = if visible {
                        dot * h.score_scale
                    } else {
                        f32::NEG_INFINITY
                    };
                    sram.s.set(r, c, score);
                }
            }
        }
    });
    arch::sync_threads();

    // Lines 10–11, one warp per row: m̃_ij, P̃_ij = e^(S_ij − m̃_ij), ℓ̃_ij; then m_new, ℓ_new, α, β.
    let mut r = arch::warp_idx();
    while r < rows {
        let block = block_row_statistics(sram, r, quad_padded(cols));
        let stored = RowStats {
            max: sram.m.get(r),
            sum: sram.l.get(r),
        };
        let merge = fa1_merge(stored, block, arch::exp2);
        if arch::lane_idx() == 0 {
            let new = merge.merged;
            let inverse_new_sum = new.inverse_sum();
            sram.old_weight
                .set(r, stored.sum * merge.alpha * inverse_new_sum);
            sram.new_weight.set(r, merge.beta * inverse_new_sum);
            // Line 13: write ℓ_i ← ℓ_new, m_i ← m_new to HBM.
            let row = row_start + r;
            if row < h.block.seqlen_q {
                h.row_max.write(row, new.max * LN_2);
                h.row_sum.write(row, new.sum);
            }
        }
        r += arch::warps_per_block();
    }
    arch::sync_threads();

    // Line 12: O_i ← diag(ℓ_new)⁻¹(diag(ℓ_i)·α·O_i + β·P̃_ij·V_j), written to HBM. A thread
    // owns rows 4g..4g+4 and columns 4q..4q+4. The sum runs over whole quads of keys: past
    // `keys_in_block`, P̃ is 0 and V_j's rows are zeros (past seqlen_k) or padding.
    for_each_element(
        rows.div_ceil(QUAD),
        d.div_ceil(QUAD),
        |group, column_quad| {
            let tile_rows = rows_of_group(group);
            let pv = product_block(
                &sram.s,
                tile_rows,
                &sram.v,
                column_quad,
                keys_in_block.div_ceil(QUAD),
            );
            for (&r, pv) in tile_rows.iter().zip(&pv) {
                for (x, &pv) in (column_quad * QUAD..).zip(pv) {
                    if r < rows && x < d {
                        let o =
                            sram.old_weight.get(r) * sram.o.get(r, x) + sram.new_weight.get(r) * pv;
                        if last_step {
                            h.o.write(row_start + r, x, o);
                        } else {
                            h.o_accumulator.write(row_start + r, x, o);
                        }
                    }
                }
            }
        },
    );
    arch::sync_threads();
}

/// Rows 4·`group` .. 4·`group` + 4 of a block: one thread's rows in the 4 × 4 products.
#[inline(always)]
fn rows_of_group(group: u32) -> [u32; QUAD_LEN] {
    core::array::from_fn(|i| group * QUAD + i as u32)
}

/// m̃_ij = rowmax(S_ij), P̃_ij = e^(S_ij − m̃_ij) (written over S_ij), ℓ̃_ij = rowsum(P̃_ij), for row
/// `r` of the block, by one warp.
#[inline(always)]
fn block_row_statistics(sram: &Fa1Sram, r: u32, cols: u32) -> RowStats {
    let lane = arch::lane_idx();
    let mut max = f32::NEG_INFINITY;
    let mut c = lane;
    while c < cols {
        max = max.max(sram.s.get(r, c));
        c += arch::WARP_SIZE;
    }
    let max = warp_max(max);
    let base = RowStats::exp_base(max);
    let mut sum = 0.0f32;
    let mut c = lane;
    while c < cols {
        let p = arch::exp2(sram.s.get(r, c) - base);
        sram.s.set(r, c, p);
        sum += p;
        c += arch::WARP_SIZE;
    }
    RowStats {
        max,
        sum: warp_sum(sum),
    }
}
