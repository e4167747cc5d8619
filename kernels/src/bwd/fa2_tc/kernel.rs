//! FlashAttention-2 backward (Dao 2023, Algorithm 2) on tensor cores: the main kernel of the
//! scalar [`crate::bwd::fa2`] (its pre-pass, D = rowsum(dO ∘ O) with the dQ accumulator zeroed,
//! and its post-pass, dQ = scale·accumulator, run unchanged around it), with all five products
//! on `mma.sync.m16n8k16` (f16/bf16 in, f32 accumulate). Generic over one config type
//! `C: Fa2TcBackwardConfig`.
//!
//! Grid (⌈seqlen_k / B_c⌉, batch·heads): one block per key block j, K_j and V_j in shared
//! memory for the whole loop, dK_j and dV_j in registers; the inner loop walks the row blocks i
//! that see K_j (causal or a window: from the first whose rows reach the keys to the last, the
//! element-wise mask only where a tile crosses an edge of the window or the sequences' ends),
//! with Q_i, dO_i, L_i, D_i copied by `cp.async` into the other of two stages while row block
//! i − 1 is computed. Per step, each warp, for its 16 keys (the m16 tile it owns; `config`):
//!
//! ```text
//!  Sᵀ  = K_j·Q_iᵀ            16 × B_r, f32 accumulators   (A: K rows, B: Q rows; ldmatrix)
//!  dPᵀ = V_j·dO_iᵀ           16 × B_r                      (A: V rows, B: dO rows)
//!  Pᵀ  = exp2(Sᵀ·scale·log2 e − L_i·log2 e)               (the article's P = exp(S − L))
//!  dSᵀ = Pᵀ ∘ (dPᵀ − D_i)     (with soft-capping, times its slope 1 − tanh²)
//!  dV_j += Pᵀ·dO_i           Pᵀ from registers (the Sᵀ accumulators repacked to 16 bits are
//!  dK_j += dSᵀ·Q_i           the A fragments, as the forward's P̃), dO_i, Q_i by ldmatrix.trans
//!  dSᵀ → shared memory (16-bit), barrier
//!  dQ_i += dS·K_j            every warp one (row tile, column group) of dQ_i, over all B_c keys:
//!                            A = dS by ldmatrix.trans of dSᵀ, B = K_j by ldmatrix.trans; then
//!                            one atomic add per element into the f32 accumulator
//! ```
//!
//! The scale multiplies dK_j at the end and dQ in the post-pass, as in the scalar kernel.
//! Deterministic mode (`dq_semaphore` ≠ 0) orders the adds of dQ_i by key block
//! (`tile::global::RowBlockFlags`), which makes them the same bits on every run. The `local`
//! kernels (`C::LOCAL`) read the window and soft-capping from the parameters, as the forward's
//! `local` form; the others take the causal mask or none as constants. The packed kernels
//! (`C::PACKED`) take each sequence's lengths and first rows from the launch's table.

use super::config::{Fa2TcBackwardConfig, ds_row_stride, shared_row_stride};
use crate::arch::{self, SharedAddress, WARP_SIZE};
use crate::common::alibi::Alibi;
use crate::common::block::BlockInfo;
use crate::common::dropout::Dropout;
use crate::common::element::TensorCoreElement;
use crate::common::mask::AttentionMask;
use crate::common::params::Fa2TcBackwardParams;
use crate::common::softcap::Softcap;
use crate::common::softmax::LOG2_E;
use crate::tile::accumulator::{for_each_fragment_pair, store_key_rows};
use crate::tile::copy::copy_rows_async_padded;
use crate::tile::fragment::{
    LDMATRIX_SIDE, MMA_K, MMA_M, MMA_N, TILE_PAIR, a_fragment_col, a_fragment_row, accumulator_col,
    accumulator_row, key_pair_col, key_pair_row,
};
use crate::tile::global::{HeadAccumulator, HeadRows16, HeadVector, RowBlockFlags};
use crate::tile::sequences::Sequences;
use crate::tile::shared::{SharedTile16, SharedVector};
use crate::tile::transposed_scores::TransposedScores;

/// One stage of the row-block pipeline: Q_i, dO_i, and the rows' L_i and D_i.
#[derive(Clone, Copy)]
struct RowStage {
    q: SharedTile16,
    d_o: SharedTile16,
    logsumexp: SharedVector,
    delta: SharedVector,
}

/// The block's shared memory (sizes: `config::Fa2TcBackwardTiling::shared_bytes`).
#[derive(Clone, Copy)]
struct BackwardTcSram {
    k: SharedTile16,
    v: SharedTile16,
    stages: [RowStage; 2],
    /// dSᵀ of the step: one row per key of K_j, B_r queries.
    ds: SharedTile16,
    /// The S and dP exchange between the two warps of a key tile (`col_split` = 2).
    exchange: SharedVector,
}

impl BackwardTcSram {
    #[inline(always)]
    fn carve<C: Fa2TcBackwardConfig>() -> Self {
        let mut carver = arch::SharedCarver::from_start();
        let row_bytes = shared_row_stride(C::HEAD_DIM_CAPACITY) * 2;
        let (rows, cols) = (C::BLOCK_ROWS, C::BLOCK_COLS);
        let k = SharedTile16::carve(&mut carver, cols, row_bytes);
        let v = SharedTile16::carve(&mut carver, cols, row_bytes);
        let mut stage = || RowStage {
            q: SharedTile16::carve(&mut carver, rows, row_bytes),
            d_o: SharedTile16::carve(&mut carver, rows, row_bytes),
            logsumexp: SharedVector::carve(&mut carver, rows),
            delta: SharedVector::carve(&mut carver, rows),
        };
        let stages = [stage(), stage()];
        let ds = SharedTile16::carve(&mut carver, cols, ds_row_stride(rows) * 2);
        let exchange_floats = if C::COL_SPLIT == 2 {
            C::WARPS * C::TILING.exchange_floats_per_warp()
        } else {
            0
        };
        Self {
            k,
            v,
            stages,
            ds,
            exchange: SharedVector::carve(&mut carver, exchange_floats),
        }
    }
}

impl BackwardTcSram {
    /// Stage `s` (0 or 1) of the row-block pipeline, chosen by value rather than by a runtime
    /// index into the array (which would put it in local memory).
    #[inline(always)]
    fn stage(&self, s: usize) -> RowStage {
        if s == 0 {
            self.stages[0]
        } else {
            self.stages[1]
        }
    }
}

/// What every step of one block reads: the head's tensors, where the block's keys sit, and
/// this warp's part of them.
struct BackwardTcBlock {
    info: BlockInfo,
    q: HeadRows16,
    d_o: HeadRows16,
    logsumexp: HeadVector,
    delta: HeadVector,
    dq: HeadAccumulator,
    /// `Some` in deterministic mode.
    flags: Option<RowBlockFlags>,
    sram: BackwardTcSram,
    mask: AttentionMask,
    softcap: Softcap,
    alibi: Alibi,
    dropout: Dropout,
    key_block: u32,
    key_start: u32,
    head_dim: u32,
    /// scale·log2 e: scores in log2 units, as the forward computed L.
    score_scale: f32,
    /// First key (within K_j) of this warp's m16 key tile.
    warp_key: u32,
    /// First head-dim column of this warp's share of S, dP, dK_j, dV_j.
    warp_col: u32,
}

/// The main kernel for head dims up to `C::HEAD_DIM_CAPACITY` (multiples of 8; the host falls
/// back to the scalar kernel for others). Grid (⌈seqlen_k / B_c⌉, batch·heads),
/// `C::TILING.threads()` threads, `C::TILING.shared_bytes(capacity)` bytes of dynamic shared
/// memory. Needs the pre-pass's D and zeroed accumulator. `packed`: a packed form's sequences
/// (`C::PACKED`: block row y is head y % heads of the launch's sequence y / heads, the grid's
/// seqlens the longest sequence's; L, D and the accumulator span the whole packed tensors),
/// else `PackedTable::NONE` (`tile::sequences`).
#[inline(always)]
pub fn backward<T: TensorCoreElement, C: Fa2TcBackwardConfig>(
    params: &Fa2TcBackwardParams,
    packed: impl Sequences,
) {
    let () = C::CHECKED;
    let p = &params.base;
    let shape = &p.shape;
    let batch_head = arch::block_idx_y();
    let info = packed.block(shape, batch_head, C::PACKED, C::LOCAL);
    let (block_rows, block_cols) = (C::BLOCK_ROWS, C::BLOCK_COLS);
    let capacity = C::HEAD_DIM_CAPACITY;
    let threads = C::WARPS * WARP_SIZE;
    let key_block = arch::block_idx_x();
    let key_start = key_block * block_cols;
    if C::PACKED && key_start >= info.seqlen_k {
        // Past the sequence's keys (the grid is the longest sequence's): nothing to store.
        return;
    }
    let warp = arch::warp_idx();
    // The flags are (batch·heads, row blocks of the longest sequence) in a packed batch.
    let row_blocks_total = shape.seqlen_q.div_ceil(block_rows);
    // Rows from the sequence's first (0 but in a packed batch).
    let rows = |view, head, count| HeadRows16::new(view, info.batch, head, count);
    let query_rows = |view| rows(view, info.head, info.seqlen_q).starting_at(info.q_start);
    let blk = BackwardTcBlock {
        info,
        q: query_rows(&p.operands.q),
        d_o: query_rows(&p.d_o),
        logsumexp: HeadVector::of_block(p.logsumexp, &info, C::PACKED, packed.total_q()),
        delta: HeadVector::of_block(p.delta, &info, C::PACKED, packed.total_q()),
        dq: HeadAccumulator::of_block(
            p.dq_accumulator,
            &info,
            C::PACKED,
            packed.total_q(),
            shape.head_dim,
        ),
        flags: (params.dq_semaphore != 0)
            .then(|| RowBlockFlags::new(params.dq_semaphore, info.batch_head, row_blocks_total)),
        sram: BackwardTcSram::carve::<C>(),
        mask: info.mask(),
        softcap: Softcap::of_form(shape, C::LOCAL),
        alibi: Alibi::of_block(shape, &info, C::LOCAL),
        dropout: Dropout::of_block(shape, info.batch_head, C::LOCAL),
        key_block,
        key_start,
        head_dim: shape.head_dim,
        score_scale: shape.softmax_scale * LOG2_E,
        warp_key: warp / C::COL_SPLIT * MMA_M,
        warp_col: warp % C::COL_SPLIT * (capacity / C::COL_SPLIT),
    };
    let key_rows = |view, head| rows(view, head, info.seqlen_k).starting_at(info.k_start);
    let (k, v) = (
        key_rows(&p.operands.k, info.kv_head),
        key_rows(&p.operands.v, info.kv_head),
    );
    let tile = (block_cols, capacity, shape.head_dim);
    copy_rows_async_padded(&k, key_start, tile, threads, blk.sram.k);
    copy_rows_async_padded(&v, key_start, tile, threads, blk.sram.v);

    let row_blocks = info.row_blocks(key_start, block_cols, block_rows);
    let (first, end) = (row_blocks.first(), row_blocks.end());
    if first < end {
        blk.copy_row_block::<C>(first, 0);
    }
    arch::copy_async_commit();

    let mut dk = [[0.0f32; 4]; C::D_TILES];
    let mut dv = [[0.0f32; 4]; C::D_TILES];
    for i in first..end {
        let stage = ((i - first) % 2) as usize;
        // Row block i has landed (with K_j, V_j the first time), and every warp is done with
        // step i − 1: its stage and the dSᵀ tile may be overwritten.
        arch::copy_async_wait_all();
        arch::sync_threads();
        if i + 1 < end {
            blk.copy_row_block::<C>(i + 1, 1 - stage);
            arch::copy_async_commit();
        }
        if row_blocks.needs_mask(i * block_rows) {
            blk.step::<T, C, true>(i, stage, &mut dk, &mut dv);
        } else {
            blk.step::<T, C, false>(i, stage, &mut dk, &mut dv);
        }
    }
    arch::copy_async_wait_all(); // Nothing may be in flight when the block exits.

    // dK_j = scale·dK_j and dV_j, each stored once (grouped heads: the query head's own rows of
    // the expanded workspace, summed afterwards by `bwd::group_sum`).
    let gradient_head = info.kv_gradient_head(C::GROUPED);
    let (dk_rows, dv_rows) = (
        key_rows(&p.dk, gradient_head),
        key_rows(&p.dv, gradient_head),
    );
    blk.store_key_rows::<T, C>(&dk_rows, &dk, shape.softmax_scale);
    blk.store_key_rows::<T, C>(&dv_rows, &dv, 1.0);
}

impl BackwardTcBlock {
    /// Issues the copies of row block `i` (Q_i, dO_i, L_i, D_i) into `stage`; rows past
    /// seqlen_q and columns past d are zero-filled.
    #[inline(always)]
    fn copy_row_block<C: Fa2TcBackwardConfig>(&self, i: u32, stage: usize) {
        let rows = C::BLOCK_ROWS;
        let threads = C::WARPS * WARP_SIZE;
        let row_start = i * rows;
        let dst = &self.sram.stage(stage);
        let tile = (rows, C::HEAD_DIM_CAPACITY, self.head_dim);
        copy_rows_async_padded(&self.q, row_start, tile, threads, dst.q);
        copy_rows_async_padded(&self.d_o, row_start, tile, threads, dst.d_o);
        // Threads 0..B_r copy L, B_r..2·B_r copy D, one row each.
        let thread = arch::thread_idx_x();
        let (vector, shared, r) = if thread < rows {
            (&self.logsumexp, &dst.logsumexp, thread)
        } else {
            (&self.delta, &dst.delta, thread - rows)
        };
        if r < rows {
            let (source, valid) = vector.copy_source(row_start + r, self.info.seqlen_q);
            // SAFETY: a valid source lies inside the head's L or D (seqlen_q f32 each); the
            // destination is element r of the carved vector.
            unsafe { arch::copy_async_4(shared.address(r), source, valid) };
        }
    }

    /// One step of the inner loop, row block `i` (in `stage`) against K_j, for this warp (see
    /// the module's docs). `MASK`: the tile crosses the causal diagonal or runs past seqlen_q
    /// or seqlen_k, so P is 0 at every pair the mask hides.
    #[inline(always)]
    fn step<T: TensorCoreElement, C: Fa2TcBackwardConfig, const MASK: bool>(
        &self,
        i: u32,
        stage: usize,
        dk: &mut [[f32; 4]; C::D_TILES],
        dv: &mut [[f32; 4]; C::D_TILES],
    ) {
        let rows = &self.sram.stage(stage);
        let mut scores = self.transposed_product::<T, C>(self.sram.k, rows.q);
        let mut d_probs = self.transposed_product::<T, C>(self.sram.v, rows.d_o);
        if C::COL_SPLIT == 2 {
            self.exchange_halves::<C>(&mut scores, &mut d_probs);
        }
        let (p, ds) = self.score_gradients::<T, C, MASK>(i, rows, &scores, &d_probs);
        accumulate_from_registers::<T, C>(&p, rows.d_o, self.warp_col, dv);
        accumulate_from_registers::<T, C>(&ds, rows.q, self.warp_col, dk);
        self.store_ds::<C>(&ds);
        arch::sync_threads(); // dSᵀ of every key before dQ_i reads whole rows of dS.
        self.add_dq::<T, C>(i);
    }

    /// This warp's partial product `a_tile`·`b_tile`ᵀ over its head-dim columns: rows
    /// `warp_key..+16` of `a_tile` (K_j or V_j, as A fragments) against the B_r rows of
    /// `b_tile` (Q_i or dO_i, whose rows are B's columns: no transpose), 16 × B_r f32.
    #[inline(always)]
    fn transposed_product<T: TensorCoreElement, C: Fa2TcBackwardConfig>(
        &self,
        a_tile: SharedTile16,
        b_tile: SharedTile16,
    ) -> [[f32; 4]; C::ROW_TILES] {
        let lane = arch::lane_idx();
        let (a_row, a_col) = (self.warp_key + a_fragment_row(lane), a_fragment_col(lane));
        let (b_row, b_col) = (key_pair_row(lane), key_pair_col(lane));
        let mut acc = [[0.0f32; 4]; C::ROW_TILES];
        for chunk in 0..C::D_CHUNKS {
            let col = self.warp_col + chunk as u32 * MMA_K;
            let a = arch::load_matrix_x4(a_tile.at(a_row, col + a_col));
            for pair in 0..C::ROW_TILES / 2 {
                let b =
                    arch::load_matrix_x4(b_tile.at(pair as u32 * TILE_PAIR + b_row, col + b_col));
                acc[2 * pair] = T::mma(a, [b[0], b[1]], acc[2 * pair]);
                acc[2 * pair + 1] = T::mma(a, [b[2], b[3]], acc[2 * pair + 1]);
            }
        }
        acc
    }

    /// The two warps of a key tile each hold S and dP over their half of d: each writes its
    /// halves and adds the other warp's (a + b = b + a exactly, so both hold the same sums).
    /// The previous step read the exchange before this step's first barrier.
    #[inline(always)]
    fn exchange_halves<C: Fa2TcBackwardConfig>(
        &self,
        scores: &mut [[f32; 4]; C::ROW_TILES],
        d_probs: &mut [[f32; 4]; C::ROW_TILES],
    ) {
        let (warp, lane) = (arch::warp_idx(), arch::lane_idx());
        let per_product = C::TILING.exchange_floats_per_warp() / 2;
        // Lane-major (element e of tile t at (4t + e)·32 + lane): conflict-free.
        let index = |w: u32, product: u32, t: usize, e: usize| {
            (2 * w + product) * per_product + (4 * t as u32 + e as u32) * WARP_SIZE + lane
        };
        let write = |product: u32, acc: &[[f32; 4]; C::ROW_TILES]| {
            for (t, tile) in acc.iter().enumerate() {
                for (e, value) in tile.iter().enumerate() {
                    self.sram.exchange.set(index(warp, product, t, e), *value);
                }
            }
        };
        write(0, scores);
        write(1, d_probs);
        arch::sync_threads();
        let add = |product: u32, acc: &mut [[f32; 4]; C::ROW_TILES]| {
            for (t, tile) in acc.iter_mut().enumerate() {
                for (e, value) in tile.iter_mut().enumerate() {
                    *value += self.sram.exchange.get(index(warp ^ 1, product, t, e));
                }
            }
        };
        add(0, scores);
        add(1, d_probs);
    }

    /// Pᵀ and dSᵀ for the warp's 16 keys × B_r queries ([`TransposedScores::gradients`]),
    /// with L_i and D_i from the stage.
    #[inline(always)]
    fn score_gradients<T: TensorCoreElement, C: Fa2TcBackwardConfig, const MASK: bool>(
        &self,
        i: u32,
        rows: &RowStage,
        scores: &[[f32; 4]; C::ROW_TILES],
        d_probs: &[[f32; 4]; C::ROW_TILES],
    ) -> ([[u32; 4]; C::ROW_CHUNKS], [[u32; 4]; C::ROW_CHUNKS]) {
        let block = TransposedScores {
            lane_key: self.key_start + self.warp_key + accumulator_row(arch::lane_idx()),
            row_start: i * C::BLOCK_ROWS,
            seqlen_q: self.info.seqlen_q,
            seqlen_k: self.info.seqlen_k,
            mask: self.mask,
            score_scale: self.score_scale,
            softcap: self.softcap,
            alibi: self.alibi,
            dropout: self.dropout,
            mask_by_key_ends: false,
        };
        block.gradients::<T, _, _, MASK>(
            scores,
            d_probs,
            |r| rows.logsumexp.get(r),
            |r| rows.delta.get(r),
        )
    }

    /// dSᵀ (packed as A fragments) into the shared tile, one row per key: with two warps per
    /// key tile both hold the same dS, and the first stores it.
    #[inline(always)]
    fn store_ds<C: Fa2TcBackwardConfig>(&self, ds: &[[u32; 4]; C::ROW_CHUNKS]) {
        if !arch::warp_idx().is_multiple_of(C::COL_SPLIT) {
            return;
        }
        for_each_fragment_pair(ds, |row, col, packed| {
            // SAFETY: row < 16 and col + 1 < B_r: inside the carved dSᵀ tile, 4-byte aligned.
            unsafe { arch::store_shared_u32(self.sram.ds.at(self.warp_key + row, col), packed) };
        });
    }

    /// dQ_i += dS·K_j over the block's B_c keys for this warp's row tile and column group, then
    /// one atomic add per element (in key-block order in deterministic mode).
    #[inline(always)]
    fn add_dq<T: TensorCoreElement, C: Fa2TcBackwardConfig>(&self, i: u32) {
        let (warp, lane) = (arch::warp_idx(), arch::lane_idx());
        let groups = C::TILING.dq_col_groups();
        let tile_row = warp / groups * MMA_M;
        let first_col = warp % groups * (C::DQ_TILES as u32 * MMA_N);
        let mut acc = [[0.0f32; 4]; C::DQ_TILES];
        for chunk in 0..C::KEY_CHUNKS {
            let key = chunk as u32 * MMA_K;
            // A = dS (16 queries × 16 keys) from dSᵀ: the x4.trans load names keys as rows.
            let a = arch::load_matrix_x4_transposed(
                self.sram
                    .ds
                    .at(key + key_pair_row(lane), tile_row + key_pair_col(lane)),
            );
            for pair in 0..C::DQ_TILES / 2 {
                let b = arch::load_matrix_x4_transposed(self.sram.k.at(
                    key + a_fragment_row(lane),
                    first_col + pair as u32 * TILE_PAIR + a_fragment_col(lane),
                ));
                acc[2 * pair] = T::mma(a, [b[0], b[1]], acc[2 * pair]);
                acc[2 * pair + 1] = T::mma(a, [b[2], b[3]], acc[2 * pair + 1]);
            }
        }
        if let Some(flags) = &self.flags {
            // The key blocks that see row block i add in ascending order from the first of them
            // (block 0, unless a window's left side hides the earlier ones from all its rows).
            let first = self
                .info
                .key_blocks(i * C::BLOCK_ROWS, C::BLOCK_ROWS, C::BLOCK_COLS)
                .first();
            flags.wait_for_turn(i, self.key_block - first);
        }
        let row = i * C::BLOCK_ROWS + tile_row + accumulator_row(lane);
        for (t, tile) in acc.iter().enumerate() {
            let col = first_col + t as u32 * MMA_N + accumulator_col(lane);
            if col < self.head_dim {
                for (e, value) in tile.iter().enumerate() {
                    let element_row = row + e as u32 / 2 * LDMATRIX_SIDE;
                    self.dq.add(element_row, col + e as u32 % 2, *value);
                }
            }
        }
        if let Some(flags) = &self.flags {
            flags.pass_turn(i);
        }
    }

    /// Stores `scale`·(this warp's rows of dK_j or dV_j) into `dst` ([`store_key_rows`]).
    #[inline(always)]
    fn store_key_rows<T: TensorCoreElement, C: Fa2TcBackwardConfig>(
        &self,
        dst: &HeadRows16,
        acc: &[[f32; 4]; C::D_TILES],
        scale: f32,
    ) {
        let first_key = self.key_start + self.warp_key;
        let (seqlen_k, head_dim) = (self.info.seqlen_k, self.head_dim);
        store_key_rows::<T, _>(
            dst,
            acc,
            first_key,
            seqlen_k,
            self.warp_col,
            head_dim,
            scale,
        );
    }
}

/// `acc` += A·`b_tile`[:, warp_col..] for A = 16 keys × B_r queries from registers (Pᵀ or dSᵀ,
/// packed) and `b_tile` = dO_i or Q_i (B_r × d, row-major: B through `ldmatrix.trans`, as the
/// forward reads V).
#[inline(always)]
fn accumulate_from_registers<T: TensorCoreElement, C: Fa2TcBackwardConfig>(
    a: &[[u32; 4]; C::ROW_CHUNKS],
    b_tile: SharedTile16,
    warp_col: u32,
    acc: &mut [[f32; 4]; C::D_TILES],
) {
    let lane = arch::lane_idx();
    let (row_in_chunk, col_in_pair) = (a_fragment_row(lane), a_fragment_col(lane));
    for (chunk, fragment) in a.iter().enumerate() {
        for pair in 0..C::D_TILES / 2 {
            let address: SharedAddress = b_tile.at(
                chunk as u32 * MMA_K + row_in_chunk,
                warp_col + pair as u32 * TILE_PAIR + col_in_pair,
            );
            let b = arch::load_matrix_x4_transposed(address);
            acc[2 * pair] = T::mma(*fragment, [b[0], b[1]], acc[2 * pair]);
            acc[2 * pair + 1] = T::mma(*fragment, [b[2], b[3]], acc[2 * pair + 1]);
        }
    }
}
