//! FlashAttention-2 forward on tensor cores: the same algorithm as [`crate::fwd::fa2`], with both
//! products on `mma.sync.m16n8k16` (f16/bf16 in, f32 accumulate). Generic over one config type
//! `C: Fa2TcConfig` (head dim, tiling, and the sizes of the per-lane register arrays).
//!
//! Block: `C::TILING.warps` warps, each owning `C::ROW_TILES` m16 tiles of Q (split-Q), so
//! B_r = 16·warps·row tiles; B_c = 8·`C::KEY_TILES` keys (64, or 32 and 48 where S must be
//! smaller for Õ to fit in registers). With two row tiles per warp every K/V fragment read from shared
//! memory feeds two MMAs, halving shared-memory traffic per FLOP. Causal grids run the heaviest
//! row blocks (the last) first.
//!
//! ```text
//!  shared memory (16-bit elements, rows padded by 8)      registers of one warp, per row tile
//!  ┌──────────────┐                                       Q_i fragments   16 × d   (kept when they
//!  │ Q_i B_r × d  │  cp.async, once                                        fit in 32 registers)
//!  ├──────────────┤                                       S = Q_i·K_jᵀ    16 × B_c (f32 accum.)
//!  │ K_j, V_j     │  stage j % 2   ← ldmatrix            P̃ = exp2(S − m) repacked as A fragments
//!  │              │                                       Õ              16 × d   (f32 accum.)
//!  │ K_j+1, V_j+1 │  stage (j+1) % 2 ← cp.async in flight while block j is computed
//!  └──────────────┘
//! ```
//!
//! `C::KV_STAGES` = 1 keeps one K and one V buffer instead, on FlashAttention-2's own schedule: V_j is
//! copied behind S = Q_i·K_jᵀ, K_j+1 behind P̃·V_j (two barriers per block, less
//! shared memory, so more of the SM's 256 KiB stays L1 cache).
//!
//! Fragment layouts (`tile::fragment`; PTX ISA, mma.m16n8k16): lane `l` holds, of a 16×8 f32 tile, rows `l/4` and
//! `l/4 + 8` at columns `2·(l%4)` and `+1`. The S tile of keys 16t..16t+16 therefore already is
//! the A fragment of P̃ for the P̃·V product once packed to 16 bits: P never leaves registers.
//!
//! Softmax in the exp2 domain (scale·log2 e folded into one FMA); each thread keeps partial row
//! sums ℓ over its own columns and the quad (4 lanes of a row) adds them once at the end, which is
//! exact because α is the same for the whole row. Up to d = 128 the running max moves only when a
//! block's row max exceeds it by more than `softmax::RESCALE_THRESHOLD` (FlashAttention-4's
//! conditional rescale, decided once per warp by a vote; `config::conditional_rescale`):
//! most blocks then skip α and the d/8·4 multiplies of Õ, and the result is the same because Õ
//! and ℓ are sums against the same max.

use super::config::{Fa2TcConfig, shared_row_stride as fa2_tc_stride};
use crate::arch::{self, SharedAddress, WARP_SIZE};
use crate::common::alibi::Alibi;
use crate::common::block::BlockInfo;
use crate::common::dropout::Dropout;
use crate::common::element::TensorCoreElement;
use crate::common::mask::AttentionMask;
use crate::common::params::Fa2Params;
use crate::common::softcap::Softcap;
use crate::common::softmax::{Exp2Split, LOG2_E, RowStats, needs_rescale};
use crate::tile::accumulator::{ScoreBlock, forward_keep_bits, scale_rows, store_rows};
use crate::tile::copy::copy_rows_async;
use crate::tile::fragment::{
    LDMATRIX_SIDE, MMA_K, MMA_M, MMA_N, TILE_PAIR, a_fragment_col, a_fragment_row, key_pair_col,
    key_pair_row,
};
use crate::tile::global::{HeadRows16, HeadVector};
use crate::tile::sequences::Sequences;
use crate::tile::shared::SharedTile16;

/// One row tile's running state: for the lane's two rows (`l/4` and `l/4 + 8`), m and partial ℓ,
/// and the unnormalised Õ tile (`C::O_TILES` = d/8 tiles of 16×8).
struct RowTileState<C: Fa2TcConfig> {
    stats: [RowStats; 2],
    acc: [[f32; 4]; C::O_TILES],
}

impl<C: Fa2TcConfig> Clone for RowTileState<C> {
    #[inline(always)]
    fn clone(&self) -> Self {
        *self
    }
}
impl<C: Fa2TcConfig> Copy for RowTileState<C> {}

/// The block's shared memory: Q_i, then `kv_stages` pairs of K_j, V_j tiles.
#[derive(Clone, Copy)]
struct Fa2TcSram {
    q: SharedTile16,
    /// Stage 0's K; stage s's K is two K/V tiles further, its V one tile after its K.
    kv: SharedTile16,
    /// Bytes of one K or V tile (B_c rows).
    tile_bytes: u32,
}

impl Fa2TcSram {
    #[inline(always)]
    fn new(head_dim: u32, block_rows: u32, block_cols: u32) -> Self {
        let q = SharedTile16::at_start(fa2_tc_stride(head_dim) * 2);
        Self {
            q,
            kv: q.bytes_after(q.bytes_of_rows(block_rows)),
            tile_bytes: q.bytes_of_rows(block_cols),
        }
    }

    #[inline(always)]
    fn k(&self, stage: u32) -> SharedTile16 {
        self.kv.bytes_after(stage * 2 * self.tile_bytes)
    }

    #[inline(always)]
    fn v(&self, stage: u32) -> SharedTile16 {
        self.k(stage).bytes_after(self.tile_bytes)
    }
}

/// Shared-memory row of this lane's part of an x4 A-fragment load of row tile `tile`: matrices
/// rows 0–7 / 8–15 (lanes 8–15, 24–31) × columns 0–7 / 8–15 (lanes 16–31).
#[inline(always)]
fn q_fragment_address(q: SharedTile16, first_row: u32, chunk: u32) -> SharedAddress {
    let lane = arch::lane_idx();
    // `fragment::a_fragment_row` summed term by term: the association order decides the register
    // allocation at d = 256, where Q is re-read at every block.
    let row = first_row + lane % LDMATRIX_SIDE + (lane / LDMATRIX_SIDE) % 2 * LDMATRIX_SIDE;
    q.at(row, chunk * MMA_K + a_fragment_col(lane))
}

/// The kernel body for one config `C` (head dim, tiling, and the register arrays' sizes:
/// `C::Q_CHUNKS` = d/16, `C::O_TILES` = d/8, `C::KEY_TILES` = B_c/8 tiles of S per row tile and
/// K/V block, `C::KEY_CHUNKS` = B_c/16 k-steps of P̃·V). Grid (⌈seqlen_q/B_r⌉, batch·heads),
/// `C::TILING.threads()` threads, `C::TILING.shared_bytes(d)` bytes of dynamic shared memory.
/// `PACKED`: a packed batch of sequences of different lengths (`PackedSequences`, the launch's
/// table in `packed`; [`PackedTable::NONE` (`tile::sequences`)] otherwise): each block reads its sequence's rows, and the row blocks past its length return at once (the grid is the
/// longest sequence's). `LOCAL`: a sliding window and soft-capping, read from the parameters
/// (else the causal mask or none, and no capping, as constants: `common::form::KernelForm`).
#[inline(always)]
pub fn forward<T: TensorCoreElement, C: Fa2TcConfig, const PACKED: bool, const LOCAL: bool>(
    p: &Fa2Params,
    packed: impl Sequences,
) {
    let () = C::CHECKED;
    let block_cols = C::KEY_TILES as u32 * MMA_N; // B_c: KEY_TILES tiles of MMA_N keys
    let head_dim = C::HEAD_DIM;
    let block_rows = C::TILING.block_rows();
    let threads = C::TILING.warps * WARP_SIZE;
    let shape = &p.shape;
    let batch_head = arch::block_idx_y();
    let info = packed.block(shape, batch_head, PACKED, LOCAL);
    // Causal or windowed: the last row blocks see the most keys; start them first so the grid's
    // tail is short.
    let row_block = if info.heaviest_rows_last() {
        arch::grid_dim_x() - 1 - arch::block_idx_x()
    } else {
        arch::block_idx_x()
    };
    let row_start = row_block * block_rows;
    if PACKED && row_start >= info.seqlen_q {
        return; // Past this sequence's queries (before any barrier: the whole block returns).
    }
    // A dense batch's own seqlen_k is the shape's, read from it as the measured kernel did.
    let seqlen_k = if PACKED {
        info.seqlen_k
    } else {
        shape.seqlen_k
    };
    let blocks = info.key_blocks(row_start, block_rows, block_cols);
    let q = HeadRows16::new(&p.operands.q, info.batch, info.head, info.seqlen_q)
        .starting_at(info.q_start);
    let k = HeadRows16::new(&p.operands.k, info.batch, info.kv_head, info.seqlen_k)
        .starting_at(info.k_start);
    let v = HeadRows16::new(&p.operands.v, info.batch, info.kv_head, info.seqlen_k)
        .starting_at(info.k_start);
    let tiles = Fa2TcSram::new(head_dim, block_rows, block_cols);
    let copy_block = |rows: &HeadRows16, block: u32, dst: SharedTile16| {
        let first = block * block_cols;
        copy_rows_async(rows, first, block_cols, head_dim, threads, dst);
    };

    // The window's blocks: `key_blocks` of them from block `first_block` (0 unless the window
    // has a left side); step j computes block first_block + j.
    let (first_block, key_blocks) = (blocks.first(), blocks.count());
    // Q_i and the first K (and V, with two stages) in flight together.
    copy_rows_async(&q, row_start, block_rows, head_dim, threads, tiles.q);
    copy_block(&k, first_block, tiles.k(0));
    if C::KV_STAGES == 2 {
        copy_block(&v, first_block, tiles.v(0));
    }
    arch::copy_async_commit();

    let warp_rows = WarpRows {
        first_row: arch::warp_idx() * MMA_M * C::ROW_TILES as u32,
    };
    let empty = RowTileState::<C> {
        stats: [RowStats::EMPTY; 2],
        acc: [[0.0; 4]; C::O_TILES],
    };
    let mut state = [empty; C::ROW_TILES];
    let mut q_registers = [[[0u32; 4]; C::Q_CHUNKS]; C::ROW_TILES];
    let step_base = BlockStep {
        tiles: &tiles,
        stage: 0,
        key_start: 0,
        row_start,
        mask: blocks.mask(),
        softcap: Softcap::of_form(shape, LOCAL),
        alibi: Alibi::of_block(shape, &info, LOCAL),
        dropout: Dropout::of_block(shape, info.batch_head, LOCAL),
        seqlen_k: info.seqlen_k,
        score_scale: shape.softmax_scale * LOG2_E,
    };
    for j in 0..key_blocks {
        // Block j has landed, and every warp is done with block j − 1, whose stage is reused next.
        arch::copy_async_wait_all();
        arch::sync_threads();
        if j == 0 && C::Q_IN_REGISTERS {
            for (tile, fragments) in q_registers.iter_mut().enumerate() {
                for (chunk, fragment) in fragments.iter_mut().enumerate() {
                    *fragment = arch::load_matrix_x4(q_fragment_address(
                        tiles.q,
                        warp_rows.tile_row(tile),
                        chunk as u32,
                    ));
                }
            }
        }
        if C::KV_STAGES == 2 {
            // Block j + 1 into the other stage, in flight while block j is computed.
            if j + 1 < key_blocks {
                let next = (j + 1) % 2;
                copy_block(&k, first_block + j + 1, tiles.k(next));
                copy_block(&v, first_block + j + 1, tiles.v(next));
                arch::copy_async_commit();
            }
        } else {
            // One stage (FlashAttention-2's schedule): V_j lands while S = Q_i·K_jᵀ is computed.
            copy_block(&v, first_block + j, tiles.v(0));
            arch::copy_async_commit();
        }
        // With one stage, V_j must have landed, and every warp be done reading K_j, before
        // P̃·V_j; K_j+1 then overwrites K_j while P̃·V_j runs. (Issuing it before the softmax, as
        // FlashAttention-2 does, keeps the copy's addresses live beside S: 108 bytes of spills at
        // d = 128 against 80, and spills at d = 96 and 256 that this order avoids.)
        let before_pv = || {
            if C::KV_STAGES == 1 {
                arch::copy_async_wait_all();
                arch::sync_threads();
                if j + 1 < key_blocks {
                    copy_block(&k, first_block + j + 1, tiles.k(0));
                    arch::copy_async_commit();
                }
            }
        };
        let key_start = (first_block + j) * block_cols;
        let step = BlockStep {
            stage: j % C::KV_STAGES,
            key_start,
            ..step_base
        };
        // `blocks.needs_mask(key_start)`, written out from this function's own values: read
        // through `KeyBlocks`, the same test changes this kernel's machine code (docs/perf, the
        // house refactor), which is kept identical to the measured v6.
        if key_start + block_cols > seqlen_k
            || blocks.mask().tile_needs_mask(
                row_start,
                row_start + block_rows,
                key_start,
                key_start + block_cols,
            )
        {
            step.run::<T, C, true>(&warp_rows, &q_registers, &mut state, before_pv);
        } else {
            step.run::<T, C, false>(&warp_rows, &q_registers, &mut state, before_pv);
        }
    }
    arch::copy_async_wait_all(); // Nothing may be in flight when the block exits.
    if step_base.dropout.is_on() {
        for tile_state in state.iter_mut() {
            scale_rows(&mut tile_state.acc, step_base.dropout.keep_scale());
        }
    }
    for (tile, tile_state) in state.iter_mut().enumerate() {
        store_output::<T, C, PACKED>(
            p,
            packed,
            &info,
            row_start + warp_rows.tile_row(tile),
            tile_state,
        );
    }
}

/// The rows of Q_i one warp owns: `C::ROW_TILES` consecutive m16 tiles.
struct WarpRows {
    first_row: u32,
}

impl WarpRows {
    /// First row (within Q_i) of row tile `tile`.
    #[inline(always)]
    fn tile_row(&self, tile: usize) -> u32 {
        self.first_row + MMA_M * tile as u32
    }
}

/// One step of the inner loop (one K/V block) for one warp.
#[derive(Clone, Copy)]
struct BlockStep<'a> {
    tiles: &'a Fa2TcSram,
    stage: u32,
    key_start: u32,
    row_start: u32,
    mask: AttentionMask,
    softcap: Softcap,
    alibi: Alibi,
    dropout: Dropout,
    seqlen_k: u32,
    score_scale: f32,
}

impl BlockStep<'_> {
    /// S = Q_i·K_jᵀ; m^(j) = max(m^(j−1), rowmax S) when the max jumps by more than
    /// `RESCALE_THRESHOLD` for some row of the warp (else m^(j) = m^(j−1)); P̃ = exp2(S − m^(j));
    /// ℓ = α·ℓ + rowsum P̃; Õ = α·Õ + P̃·V_j, for each of the warp's row tiles, S soft-capped first
    /// when capping is on, then ALiBi's bias; dropout zeroes P̃'s dropped values after ℓ took them. `MASK`: apply the mask (causal or a window) and the seqlen_k tail
    /// element-wise. `before_pv` runs between the softmax and P̃·V_j: the
    /// one-stage pipeline waits for V_j and refills K there.
    #[inline(always)]
    fn run<T: TensorCoreElement, C: Fa2TcConfig, const MASK: bool>(
        &self,
        rows: &WarpRows,
        q_registers: &[[[u32; 4]; C::Q_CHUNKS]; C::ROW_TILES],
        state: &mut [RowTileState<C>; C::ROW_TILES],
        before_pv: impl FnOnce(),
    ) {
        // Dropout's keep bits of each row tile first, before S's registers are live.
        let kept: [Option<u128>; C::ROW_TILES] = core::array::from_fn(|tile| {
            let first_row = self.row_start + rows.tile_row(tile);
            forward_keep_bits::<{ C::KEY_TILES }>(&self.dropout, first_row, self.key_start)
        });
        let mut scores = self.scores::<T, C>(rows, q_registers);
        let block = ScoreBlock {
            key_start: self.key_start,
            seqlen_k: self.seqlen_k,
            mask: self.mask,
            softcap: self.softcap,
            alibi: self.alibi,
            score_scale: self.score_scale,
            exp2_split: Exp2Split::SFU_ONLY,
        };
        let mut block_max = [[0.0f32; 2]; C::ROW_TILES];
        let mut any_row_needs_rescale = false;
        for (tile, tile_scores) in scores.iter_mut().enumerate() {
            let first_row = self.row_start + rows.tile_row(tile);
            block.apply_softcap(tile_scores);
            block.apply_alibi(tile_scores, first_row);
            if MASK {
                block.apply_mask(tile_scores, first_row);
            }
            for (h, max) in block_max[tile].iter_mut().enumerate() {
                *max = block.row_max(tile_scores, h);
                any_row_needs_rescale |= needs_rescale(state[tile].stats[h].max, *max);
            }
        }
        // One decision per warp and block: the branches below are warp-uniform. Where the head
        // dim keeps the unconditional rescale, `rescale` is the constant `true` and the vote and
        // branches compile away.
        let rescale = !C::CONDITIONAL_RESCALE || arch::vote_any(any_row_needs_rescale);
        let mut p = [[[0u32; 4]; C::KEY_CHUNKS]; C::ROW_TILES];
        for (tile, (tile_scores, tile_state)) in scores.iter_mut().zip(state.iter_mut()).enumerate()
        {
            let (stats, acc) = (&mut tile_state.stats, &mut tile_state.acc);
            p[tile] = block.online_softmax::<T, _, _, _>(
                tile_scores,
                block_max[tile],
                rescale,
                stats,
                acc,
                kept[tile],
            );
        }
        before_pv();
        self.accumulate_pv::<T, C>(&p, state);
    }

    /// S = Q_i·K_jᵀ for each row tile and the block's B_c keys (`KEY_TILES` tiles of 16×8). Each K fragment
    /// is read once and used by every row tile.
    #[inline(always)]
    fn scores<T: TensorCoreElement, C: Fa2TcConfig>(
        &self,
        rows: &WarpRows,
        q_registers: &[[[u32; 4]; C::Q_CHUNKS]; C::ROW_TILES],
    ) -> [[[f32; 4]; C::KEY_TILES]; C::ROW_TILES] {
        let lane = arch::lane_idx();
        let k_tile = self.tiles.k(self.stage);
        // x4 load of two key tiles × one 16-column chunk: keys +0–7 / +8–15 (lanes 16–31),
        // columns 0–7 / 8–15 (lanes 8–15, 24–31). K's rows are B's columns: no transpose.
        let (key_in_pair, col_in_chunk) = (key_pair_row(lane), key_pair_col(lane));
        let mut scores = [[[0.0f32; 4]; C::KEY_TILES]; C::ROW_TILES];
        for chunk in 0..C::Q_CHUNKS {
            let mut q = [[0u32; 4]; C::ROW_TILES];
            for tile in 0..C::ROW_TILES {
                q[tile] = if C::Q_IN_REGISTERS {
                    q_registers[tile][chunk]
                } else {
                    arch::load_matrix_x4(q_fragment_address(
                        self.tiles.q,
                        rows.tile_row(tile),
                        chunk as u32,
                    ))
                };
            }
            for pair in 0..C::KEY_TILES / 2 {
                let b = arch::load_matrix_x4(k_tile.at(
                    pair as u32 * TILE_PAIR + key_in_pair,
                    chunk as u32 * MMA_K + col_in_chunk,
                ));
                for tile in 0..C::ROW_TILES {
                    scores[tile][2 * pair] = T::mma(q[tile], [b[0], b[1]], scores[tile][2 * pair]);
                    scores[tile][2 * pair + 1] =
                        T::mma(q[tile], [b[2], b[3]], scores[tile][2 * pair + 1]);
                }
            }
        }
        scores
    }

    /// Õ += P̃·V_j: P̃ from registers (repacked S tiles), V_j through `ldmatrix.trans`, each V
    /// fragment used by every row tile.
    #[inline(always)]
    fn accumulate_pv<T: TensorCoreElement, C: Fa2TcConfig>(
        &self,
        p: &[[[u32; 4]; C::KEY_CHUNKS]; C::ROW_TILES],
        state: &mut [RowTileState<C>; C::ROW_TILES],
    ) {
        let lane = arch::lane_idx();
        let v_tile = self.tiles.v(self.stage);
        // x4.trans load: keys +0–7 / +8–15 (lanes 8–15, 24–31), columns +0–7 / +8–15 (lanes 16–31).
        let (key_in_chunk, col_in_pair) = (a_fragment_row(lane), a_fragment_col(lane));
        for chunk in 0..C::KEY_CHUNKS {
            for pair in 0..C::O_TILES / 2 {
                let b = arch::load_matrix_x4_transposed(v_tile.at(
                    chunk as u32 * MMA_K + key_in_chunk,
                    pair as u32 * TILE_PAIR + col_in_pair,
                ));
                for tile in 0..C::ROW_TILES {
                    state[tile].acc[2 * pair] =
                        T::mma(p[tile][chunk], [b[0], b[1]], state[tile].acc[2 * pair]);
                    state[tile].acc[2 * pair + 1] =
                        T::mma(p[tile][chunk], [b[2], b[3]], state[tile].acc[2 * pair + 1]);
                }
            }
        }
    }
}

/// O = diag(ℓ)⁻¹·Õ and L = m + log ℓ for the row tile whose first row (in the sequence) is
/// `first_row`.
#[inline(always)]
fn store_output<T: TensorCoreElement, C: Fa2TcConfig, const PACKED: bool>(
    p: &Fa2Params,
    packed: impl Sequences,
    info: &BlockInfo,
    first_row: u32,
    state: &RowTileState<C>,
) {
    let o = HeadRows16::new(&p.operands.o, info.batch, info.head, info.seqlen_q)
        .starting_at(info.q_start);
    let logsumexp = if PACKED {
        HeadVector::packed(p.logsumexp, info.head, packed.total_q(), info.q_start)
    } else {
        HeadVector::new(p.logsumexp, info.batch_head, info.seqlen_q)
    };
    let (seqlen_q, cols) = (info.seqlen_q, C::HEAD_DIM);
    store_rows::<T, _>(
        &o,
        &logsumexp,
        first_row,
        seqlen_q,
        cols,
        &state.stats,
        &state.acc,
    );
}
