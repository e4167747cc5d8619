//! FlashAttention-2 backward (Dao 2023, Algorithm 2), as the article lays it out, in three
//! kernels that follow the CPU emulator (`lab/src/model/fa2_backward.rs`) step for step:
//!
//! 1. [`preprocess`], per row block: D_i = rowsum(dO_i ∘ O_i), and the f32 dQ accumulator
//!    zeroed (or [`preprocess_wide`], the same with 16-byte loads and stores, where the dtype,
//!    head dim and views allow: the host's plan decides);
//! 2. [`backward`], grid over (key block j, batch·head): K_j, V_j loaded once, dK_j and dV_j
//!    accumulated in registers; the inner loop walks the row blocks i that see K_j (causal: from
//!    the first one whose rows reach the keys), recomputing S = Q_i·K_jᵀ, P = exp(S − L_i), and
//!    dV_j += Pᵀ·dO_i, dP = dO_i·V_jᵀ, dS = P ∘ (dP − D_i), dK_j += dSᵀ·Q_i, and
//!    dQ_i += dS·K_j by atomic adds into the accumulator (every key block adds to every dQ_i it
//!    sees); then dK_j = scale·dK_j and dV_j stored once (compiled for grouped K/V heads: at the
//!    query head's rows of the expanded workspace, summed afterwards by `bwd::group_sum`);
//! 3. [`postprocess`], per row block: dQ = scale·(the accumulator), in the input dtype (or
//!    [`postprocess_wide`], as for the pre-pass).
//!
//! Split-K: each warp owns `config::KEYS_PER_WARP` keys of K_j and their rows of dK_j, dV_j
//! (lane l: columns l, l + 32, …); for S, P, dP, dS lane l takes rows l, l + 32, … of Q_i
//! against its warp's keys. P and dS go through shared memory: dV_j, dK_j read them down the
//! rows, dQ_i across the keys of every warp.
//!
//! As in the emulator, the scale multiplies dK_j and dQ once at the end instead of every dS.
//!
//! The element-wise passes give each row a warp (lane l: columns l, l + 32, …, one element at a
//! time); the wide ones give each 16-byte chunk (8 columns) a lane: a row's d/8 chunks go to a
//! group of d/8 lanes rounded up to a power of two (d = 128: 16 lanes, two rows per warp; d =
//! 40: 8 lanes, 5 with a chunk, four rows per warp), and each thread covers `WIDE_PASS_STEPS`
//! rows (`tile::row_chunks` draws it).

use super::config::{
    BLOCK_COLS, Fa2BackwardConfig, KEYS_PER_WARP, PASS_ROWS, PASS_THREADS, WIDE_PASS_STEPS,
    WidePassLanes,
};
use crate::arch::{self, WARP_SIZE};
use crate::common::block::BlockInfo;
use crate::common::element::{Element, TensorCoreElement};
use crate::common::params::Fa2BackwardParams;
use crate::common::softmax::{LOG2_E, recomputation_base};
use crate::tile::global::{HeadAccumulator, HeadRows, HeadRows16, HeadVector};
use crate::tile::shared::{SharedTile, SharedVector, for_each_element, load_tile};
use crate::tile::warp::{group_sum, warp_sum};

type const KEYS: usize = const { KEYS_PER_WARP as usize };

/// The pre-pass: D_i = rowsum(dO_i ∘ O_i) for `config::PASS_ROWS` rows, one warp per row, and
/// the same rows of the dQ accumulator set to 0. Grid (⌈seqlen_q / PASS_ROWS⌉, batch·heads),
/// `config::PASS_THREADS` threads, no shared memory.
#[inline(always)]
pub fn preprocess<T: Element>(p: &Fa2BackwardParams) {
    let shape = &p.shape;
    let info = BlockInfo::new(shape, arch::block_idx_y());
    let head_dim = shape.head_dim;
    let o = HeadRows::<T>::new(&p.operands.o, info.batch, info.head, info.seqlen_q);
    let d_o = HeadRows::<T>::new(&p.d_o, info.batch, info.head, info.seqlen_q);
    let delta = HeadVector::new(p.delta, info.batch_head, info.seqlen_q);
    let dq = HeadAccumulator::new(p.dq_accumulator, info.batch_head, info.seqlen_q, head_dim);
    let row_start = arch::block_idx_x() * PASS_ROWS;
    let mut r = arch::warp_idx();
    while r < PASS_ROWS {
        let row = row_start + r;
        // Lane l sums columns l, l + 32, …; rows past seqlen_q read 0 and write nothing.
        let mut sum = 0.0f32;
        let mut col = arch::lane_idx();
        while col < head_dim {
            sum += d_o.read(row, col) * o.read(row, col);
            dq.write(row, col, 0.0);
            col += WARP_SIZE;
        }
        let sum = warp_sum(sum);
        if arch::lane_idx() == 0 && row < info.seqlen_q {
            delta.write(row, sum);
        }
        r += arch::warps_per_block();
    }
}

/// The post-pass: dQ = scale·(the accumulator) for `config::PASS_ROWS` rows, rounded to T.
/// Launched as [`preprocess`].
#[inline(always)]
pub fn postprocess<T: Element>(p: &Fa2BackwardParams) {
    let shape = &p.shape;
    let info = BlockInfo::new(shape, arch::block_idx_y());
    let head_dim = shape.head_dim;
    let accumulated =
        HeadAccumulator::new(p.dq_accumulator, info.batch_head, info.seqlen_q, head_dim);
    let dq = HeadRows::<T>::new(&p.dq, info.batch, info.head, info.seqlen_q);
    let row_start = arch::block_idx_x() * PASS_ROWS;
    for_each_element(PASS_ROWS, head_dim, |r, col| {
        let row = row_start + r;
        dq.write(row, col, shape.softmax_scale * accumulated.read(row, col));
    });
}

/// The pre-pass at full memory width: [`preprocess`]'s D and zeroed accumulator with 16-byte
/// loads of O and dO and 16-byte zero stores, f16/bf16 only. Each thread owns one 16-byte
/// chunk (8 columns) of `config::WIDE_PASS_STEPS` rows; the lanes of a row sum their chunks'
/// products and reduce them by a butterfly over the row's lanes (`tile::row_chunks` has the
/// layout). Grid (⌈seqlen_q / config::wide_pass_rows(d)⌉, batch·heads), `config::PASS_THREADS`
/// threads, no shared memory. The host launches it where `config::wide_passes_take(d)` and O,
/// dO and dQ rows are 16-byte aligned (its plan says which pass runs and why); it is a kernel
/// of its own, not a flag of [`preprocess`], so neither pays for the other's branches and the
/// plan names the one that runs.
#[inline(always)]
pub fn preprocess_wide<T: TensorCoreElement>(p: &Fa2BackwardParams) {
    let shape = &p.shape;
    let info = BlockInfo::new(shape, arch::block_idx_y());
    let head_dim = shape.head_dim;
    let o = HeadRows16::new(&p.operands.o, info.batch, info.head, info.seqlen_q);
    let d_o = HeadRows16::new(&p.d_o, info.batch, info.head, info.seqlen_q);
    let delta = HeadVector::new(p.delta, info.batch_head, info.seqlen_q);
    let dq = HeadAccumulator::new(p.dq_accumulator, info.batch_head, info.seqlen_q, head_dim);
    let lanes = wide_pass_lanes(head_dim);
    let (rows, col, in_row) = (lanes.rows(), lanes.col(), lanes.in_row());
    // Every chunk of O and dO this thread sums, in flight before the first is used; rows past
    // seqlen_q and chunks past d read 0 and write nothing.
    let o_chunks = rows.map(|row| o.load_chunk(row, col, in_row));
    let d_o_chunks = rows.map(|row| d_o.load_chunk(row, col, in_row));
    for step in 0..WIDE_PASS_STEPS {
        let row = rows[step];
        dq.store_chunk(row, col, in_row, [0.0; 8]);
        // D_i = rowsum(dO_i ∘ O_i): this chunk's 8 products, then the row's lanes together.
        let sum = group_sum(
            chunk_dot::<T>(d_o_chunks[step], o_chunks[step]),
            lanes.lanes_per_row(),
        );
        if lanes.leads_row() && row < info.seqlen_q {
            delta.write(row, sum);
        }
    }
}

/// The post-pass at full memory width: [`postprocess`]'s dQ = scale·(the accumulator) with two
/// 16-byte loads of the accumulator and one 16-byte store of dQ per 8 columns, in the chunk
/// layout of [`preprocess_wide`], and launched as it is.
#[inline(always)]
pub fn postprocess_wide<T: TensorCoreElement>(p: &Fa2BackwardParams) {
    let shape = &p.shape;
    let info = BlockInfo::new(shape, arch::block_idx_y());
    let head_dim = shape.head_dim;
    let accumulated =
        HeadAccumulator::new(p.dq_accumulator, info.batch_head, info.seqlen_q, head_dim);
    let dq = HeadRows16::new(&p.dq, info.batch, info.head, info.seqlen_q);
    let lanes = wide_pass_lanes(head_dim);
    let (rows, col, in_row) = (lanes.rows(), lanes.col(), lanes.in_row());
    // Every chunk this thread scales, in flight before the first is stored.
    let sums = rows.map(|row| accumulated.load_chunk(row, col, in_row));
    for step in 0..WIDE_PASS_STEPS {
        let scaled = sums[step].map(|sum| shape.softmax_scale * sum);
        dq.store_chunk(rows[step], col, in_row, pack_chunk::<T>(scaled));
    }
}

/// This thread's chunk and rows in the wide passes' layout, for this block.
#[inline(always)]
fn wide_pass_lanes(head_dim: u32) -> WidePassLanes {
    WidePassLanes::new(
        head_dim,
        PASS_THREADS,
        arch::block_idx_x(),
        arch::thread_idx_x(),
    )
}

/// The dot product of two 16-byte chunks of 8 elements each, in f32.
#[inline(always)]
fn chunk_dot<T: TensorCoreElement>(a: [u32; 4], b: [u32; 4]) -> f32 {
    let mut sum = 0.0f32;
    for i in 0..4 {
        let (x, y) = (T::unpack2(a[i]), T::unpack2(b[i]));
        sum = arch::fma(x[0], y[0], sum);
        sum = arch::fma(x[1], y[1], sum);
    }
    sum
}

/// 8 f32, rounded to T, as one 16-byte chunk.
#[inline(always)]
fn pack_chunk<T: TensorCoreElement>(values: [f32; 8]) -> [u32; 4] {
    core::array::from_fn(|i| T::pack2(values[2 * i], values[2 * i + 1]))
}

/// The SRAM tiles: K_j and V_j for the whole loop; Q_i, dO_i, P, dS and the rows' L_i (as the
/// base the exponent subtracts) and D_i per step.
struct BackwardSram {
    k: SharedTile,
    v: SharedTile,
    q: SharedTile,
    d_o: SharedTile,
    p: SharedTile,
    ds: SharedTile,
    exp_base: SharedVector,
    delta: SharedVector,
}

/// One warp's keys: their rows of dK_j (unscaled) and dV_j, in registers (`C::COLS` =
/// head-dim capacity / 32 columns per lane).
struct WarpKeys<C: Fa2BackwardConfig> {
    dk: [[f32; C::COLS]; KEYS],
    dv: [[f32; C::COLS]; KEYS],
    /// Index in K_j of this warp's first key.
    first: u32,
}

/// Per-launch constants of one block.
struct BackwardBlock {
    info: BlockInfo,
    key_start: u32,
    head_dim: u32,
    /// scale·log2(e): S in log2 units, as the forward computed L.
    score_scale: f32,
}

/// The main kernel for head dims up to `C::HEAD_DIM_CAPACITY`, B_r = `C::BLOCK_ROWS`, B_c =
/// `config::BLOCK_COLS`. Grid (⌈seqlen_k/B_c⌉, batch·heads), `config::main_threads()` threads,
/// `config::shared_bytes(B_r, d)` of dynamic shared memory. Needs the pre-pass's D and zeroed
/// accumulator.
#[inline(always)]
pub fn backward<T: Element, C: Fa2BackwardConfig>(p: &Fa2BackwardParams) {
    let () = C::CHECKED;
    let shape = &p.shape;
    let info = BlockInfo::causal_only(shape, arch::block_idx_y());
    let (block_rows, block_cols, head_dim) = (C::BLOCK_ROWS, BLOCK_COLS, shape.head_dim);
    let blk = BackwardBlock {
        info,
        key_start: arch::block_idx_x() * block_cols,
        head_dim,
        score_scale: shape.softmax_scale * LOG2_E,
    };
    let q = HeadRows::<T>::new(&p.operands.q, info.batch, info.head, info.seqlen_q);
    let k = HeadRows::<T>::new(&p.operands.k, info.batch, info.kv_head, info.seqlen_k);
    let v = HeadRows::<T>::new(&p.operands.v, info.batch, info.kv_head, info.seqlen_k);
    let d_o = HeadRows::<T>::new(&p.d_o, info.batch, info.head, info.seqlen_q);
    let logsumexp = HeadVector::new(p.logsumexp, info.batch_head, info.seqlen_q);
    let delta = HeadVector::new(p.delta, info.batch_head, info.seqlen_q);
    let dq = HeadAccumulator::new(p.dq_accumulator, info.batch_head, info.seqlen_q, head_dim);
    let mut carver = arch::SharedCarver::from_start();
    let sram = BackwardSram {
        k: SharedTile::carve(&mut carver, block_cols, head_dim),
        v: SharedTile::carve(&mut carver, block_cols, head_dim),
        q: SharedTile::carve(&mut carver, block_rows, head_dim),
        d_o: SharedTile::carve(&mut carver, block_rows, head_dim),
        p: SharedTile::carve(&mut carver, block_rows, block_cols),
        ds: SharedTile::carve(&mut carver, block_rows, block_cols),
        exp_base: SharedVector::carve(&mut carver, block_rows),
        delta: SharedVector::carve(&mut carver, block_rows),
    };

    // Load K_j, V_j once; dK_j = dV_j = 0.
    load_tile(&k, blk.key_start, block_cols, head_dim, &sram.k);
    load_tile(&v, blk.key_start, block_cols, head_dim, &sram.v);
    let mut keys = WarpKeys::<C> {
        dk: [[0.0; C::COLS]; KEYS],
        dv: [[0.0; C::COLS]; KEYS],
        first: arch::warp_idx() * KEYS_PER_WARP,
    };

    // Inner loop over the row blocks that see K_j; causal row blocks before them are skipped.
    let row_blocks = info.row_blocks(blk.key_start, block_cols, block_rows);
    for i in row_blocks.first()..row_blocks.end() {
        let row_start = i * block_rows;
        arch::sync_threads(); // Every warp is done with Q_{i−1}, dO_{i−1}, dS_{i−1}.
        load_tile(&q, row_start, block_rows, head_dim, &sram.q);
        load_tile(&d_o, row_start, block_rows, head_dim, &sram.d_o);
        for_each_element(block_rows, 1, |r, _| {
            let row = row_start + r;
            // Rows past seqlen_q are masked; their L and D are never read from HBM.
            let (base, d) = if row < info.seqlen_q {
                (recomputation_base(logsumexp.read(row)), delta.read(row))
            } else {
                (0.0, 0.0)
            };
            sram.exp_base.set(r, base);
            sram.delta.set(r, d);
        });
        arch::sync_threads();
        if row_blocks.needs_mask(row_start) {
            visit_row_block::<true, C>(&blk, &sram, &mut keys, row_start, &dq);
        } else {
            visit_row_block::<false, C>(&blk, &sram, &mut keys, row_start, &dq);
        }
    }

    // dK_j = scale·dK_j and dV_j, each stored once (grouped heads: the query head's own rows of
    // the expanded workspace).
    let gradient_head = info.kv_gradient_head(C::GROUPED);
    let dk = HeadRows::<T>::new(&p.dk, info.batch, gradient_head, info.seqlen_k);
    let dv = HeadRows::<T>::new(&p.dv, info.batch, gradient_head, info.seqlen_k);
    for c in 0..KEYS {
        let key = blk.key_start + keys.first + c as u32;
        for t in 0..C::COLS {
            let col = arch::lane_idx() + WARP_SIZE * t as u32;
            if col < head_dim {
                dk.write(key, col, shape.softmax_scale * keys.dk[c][t]);
                dv.write(key, col, keys.dv[c][t]);
            }
        }
    }
}

/// One step of the inner loop, row block i against K_j:
/// S = Q_i·K_jᵀ, P = exp(S − L_i), dV_j += Pᵀ·dO_i, dP = dO_i·V_jᵀ, dS = P ∘ (dP − D_i),
/// dK_j += dSᵀ·Q_i, dQ_i += dS·K_j. `MASK`: the tile crosses the causal diagonal or runs past
/// seqlen_q or seqlen_k, so P is 0 at every pair the mask hides.
#[inline(always)]
fn visit_row_block<const MASK: bool, C: Fa2BackwardConfig>(
    blk: &BackwardBlock,
    sram: &BackwardSram,
    keys: &mut WarpKeys<C>,
    row_start: u32,
    dq: &HeadAccumulator,
) {
    let lane = arch::lane_idx();
    // S = Q_i·K_jᵀ and dP = dO_i·V_jᵀ: lane l's rows l, l + 32, … against the warp's keys.
    let mut scores = [[0.0f32; KEYS]; C::LANE_ROWS];
    let mut d_probs = [[0.0f32; KEYS]; C::LANE_ROWS];
    for x in 0..blk.head_dim {
        let mut q = [0.0f32; C::LANE_ROWS];
        let mut d_o = [0.0f32; C::LANE_ROWS];
        for t in 0..C::LANE_ROWS {
            let r = lane + WARP_SIZE * t as u32;
            q[t] = sram.q.get(r, x);
            d_o[t] = sram.d_o.get(r, x);
        }
        for c in 0..KEYS {
            let key = keys.first + c as u32;
            let (k, v) = (sram.k.get(key, x), sram.v.get(key, x));
            for t in 0..C::LANE_ROWS {
                scores[t][c] += q[t] * k;
                d_probs[t][c] += d_o[t] * v;
            }
        }
    }

    // P = 2^(S·scale·log2 e − L_i·log2 e) (masked pairs −∞, so 0); dS = P ∘ (dP − D_i).
    for t in 0..C::LANE_ROWS {
        let r = lane + WARP_SIZE * t as u32;
        let row = row_start + r;
        let (base, delta) = (sram.exp_base.get(r), sram.delta.get(r));
        for c in 0..KEYS {
            let local_key = keys.first + c as u32;
            let key = blk.key_start + local_key;
            let info = &blk.info;
            let visible = !MASK
                || (row < info.seqlen_q && key < info.seqlen_k && info.mask().visible(row, key));
            let score = if visible {
                scores[t][c] * blk.score_scale
            } else {
                f32::NEG_INFINITY
            };
            let p = arch::exp2(score - base);
            sram.p.set(r, local_key, p);
            sram.ds.set(r, local_key, p * (d_probs[t][c] - delta));
        }
    }
    arch::sync_warp(); // The warp's keys of P and dS written by all lanes before any lane reads.

    // dV_j += Pᵀ·dO_i and dK_j += dSᵀ·Q_i (unscaled), row by row: lane l accumulates columns
    // l, l + 32, … of its warp's keys.
    for r in 0..C::BLOCK_ROWS {
        let mut p = [0.0f32; KEYS];
        let mut ds = [0.0f32; KEYS];
        for c in 0..KEYS {
            p[c] = sram.p.get(r, keys.first + c as u32);
            ds[c] = sram.ds.get(r, keys.first + c as u32);
        }
        for t in 0..C::COLS {
            let col = lane + WARP_SIZE * t as u32;
            if col < blk.head_dim {
                let (d_o, q) = (sram.d_o.get(r, col), sram.q.get(r, col));
                for c in 0..KEYS {
                    keys.dv[c][t] += p[c] * d_o;
                    keys.dk[c][t] += ds[c] * q;
                }
            }
        }
    }
    arch::sync_threads(); // dS of every warp's keys written before dQ_i reads whole rows.

    // dQ_i += dS·K_j (unscaled), key by key, then one atomic add per element: every key block
    // that sees row block i adds to it.
    for_each_element(C::BLOCK_ROWS, blk.head_dim, |r, col| {
        let mut sum = 0.0f32;
        for key in 0..BLOCK_COLS {
            sum += sram.ds.get(r, key) * sram.k.get(key, col);
        }
        dq.add(row_start + r, col, sum);
    });
}
