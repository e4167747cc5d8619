//! FlashAttention-2 forward on tensor cores: the same algorithm as [`crate::fa2`], with both
//! products on `mma.sync.m16n8k16` (f16/bf16 in, f32 accumulate).
//!
//! Block: `WARPS` warps, each owning `ROW_TILES` m16 tiles of Q (split-Q), so
//! B_r = 16·`WARPS`·`ROW_TILES`; B_c = 8·`KEY_TILES` keys (64, or 32 where S must be smaller
//! for Õ to fit in registers). With two row tiles per warp every K/V fragment read from shared
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
//! `KV_STAGES` = 1 keeps one K and one V buffer instead, on FlashAttention-2's own schedule: V_j is
//! copied behind S = Q_i·K_jᵀ, K_j+1 behind P̃·V_j (two barriers per block, less
//! shared memory, so more of the SM's 256 KiB stays L1 cache).
//!
//! Fragment layouts (PTX ISA, mma.m16n8k16): lane `l` holds, of a 16×8 f32 tile, rows `l/4` and
//! `l/4 + 8` at columns `2·(l%4)` and `+1`. The S tile of keys 16t..16t+16 therefore already is
//! the A fragment of P̃ for the P̃·V product once packed to 16 bits: P never leaves registers.
//!
//! Softmax in the exp2 domain (scale·log2 e folded into one FMA); each thread keeps partial row
//! sums ℓ over its own columns and the quad (4 lanes of a row) adds them once at the end, which is
//! exact because α is the same for the whole row. Up to d = 128 the running max moves only when a
//! block's row max exceeds it by more than `softmax::RESCALE_THRESHOLD` (FlashAttention-4's
//! conditional rescale, decided once per warp by a vote; `layout::fa2_tc_conditional_rescale`):
//! most blocks then skip α and the d/8·4 multiplies of Õ, and the result is the same because Õ
//! and ℓ are sums against the same max.

use crate::element::TensorCoreElement;
use crate::gpu::{self, SharedAddress, WARP_SIZE};
use crate::layout::{FA2_TC_COPY_ELEMENTS, Fa2TcTiling, fa2_tc_conditional_rescale, fa2_tc_stride};
use crate::mask::CausalMask;
use crate::params::{Fa2Params, TensorView};
use crate::softmax::{LOG2_E, RowStats, fa2_rescale, needs_rescale, pairwise};

/// Q fragments stay in registers when they take at most this many (row tiles × d/16 × 4 ≤ 32);
/// otherwise they are re-read from shared memory at every K/V block.
const Q_REGISTER_CHUNKS: usize = 8;

/// One row tile's running state: for the lane's two rows (`l/4` and `l/4 + 8`), m and partial ℓ,
/// and the unnormalised Õ tile (`O_TILES` = d/8 tiles of 16×8).
#[derive(Clone, Copy)]
struct RowTileState<const O_TILES: usize> {
    stats: [RowStats; 2],
    acc: [[f32; 4]; O_TILES],
}

/// Where this block's K/V tiles and Q tile live in shared memory, and the geometry of a tile.
#[derive(Clone, Copy)]
struct SharedTiles {
    q: SharedAddress,
    /// Stage 0's K; stage s's K is `kv + s·2·tile`, its V one tile further.
    kv: SharedAddress,
    /// Bytes per shared row (d + 8 elements).
    row_bytes: u32,
    /// Bytes per K or V tile.
    tile_bytes: u32,
}

impl SharedTiles {
    #[inline(always)]
    fn new(head_dim: u32, block_rows: u32, block_cols: u32) -> Self {
        let row_bytes = fa2_tc_stride(head_dim) * 2;
        let q = SharedAddress::of(gpu::dynamic_shared_f32());
        let tile_bytes = block_cols * row_bytes;
        Self {
            q,
            kv: q.offset(block_rows * row_bytes),
            row_bytes,
            tile_bytes,
        }
    }

    #[inline(always)]
    fn k(&self, stage: u32) -> SharedAddress {
        self.kv.offset(stage * 2 * self.tile_bytes)
    }

    #[inline(always)]
    fn v(&self, stage: u32) -> SharedAddress {
        self.k(stage).offset(self.tile_bytes)
    }

    /// Address of element (row, col) of the tile at `base`.
    #[inline(always)]
    fn at(&self, base: SharedAddress, row: u32, col: u32) -> SharedAddress {
        base.offset(row * self.row_bytes + col * 2)
    }
}

/// One head's rows of a 16-bit tensor in global memory, for 16-byte copies.
#[derive(Clone, Copy)]
struct GlobalRows {
    base: *const u8,
    row_bytes: u64,
    rows: u32,
}

impl GlobalRows {
    #[inline(always)]
    fn new(view: &TensorView, batch: u32, head: u32, rows: u32) -> Self {
        let base =
            (view.addr as *const u8).wrapping_add(view.head_offset(batch, head) as usize * 2);
        Self {
            base,
            row_bytes: view.row_stride * 2,
            rows,
        }
    }

    #[inline(always)]
    fn element(&self, row: u32, col: u32) -> *const u8 {
        self.base
            .wrapping_add((row as u64 * self.row_bytes + col as u64 * 2) as usize)
    }
}

/// Issues the copies of one tile (Q_i, K_j or V_j): rows `[first_row, first_row + rows)` of `src`
/// into the shared tile at `dst`, 16 bytes per `cp.async`; rows past the end are zero-filled.
/// When the block's `threads` cover whole rows per pass (`threads` a multiple of d/8), each
/// thread copies the same column of rows `r₀, r₀ + rows_per_pass, …` and, `rows`, `head_dim`
/// and `threads` being compile-time constants once inlined into `forward`, the passes unroll
/// into straight-line copies. Otherwise (d = 96: 12 copies per row) the threads stride over the
/// tile's copies.
#[inline(always)]
fn copy_tile_async(
    src: &GlobalRows,
    first_row: u32,
    rows: u32,
    head_dim: u32,
    threads: u32,
    tiles: &SharedTiles,
    dst: SharedAddress,
) {
    let chunks_per_row = head_dim / FA2_TC_COPY_ELEMENTS;
    let rows_per_pass = threads / chunks_per_row;
    let thread = gpu::thread_idx_x();
    let copy_chunk = |r: u32, col: u32| {
        let row = first_row + r;
        let valid = row < src.rows;
        let source = if valid {
            src.element(row, col)
        } else {
            src.base
        };
        // SAFETY: valid rows lie inside the tensor (the host checked shapes, and that strides and
        // addresses are multiples of 16 bytes); the destination is inside the carved tile.
        unsafe { gpu::copy_async_16(tiles.at(dst, r, col), source, valid) };
    };
    if threads.is_multiple_of(chunks_per_row) && rows.is_multiple_of(rows_per_pass) {
        let (first_tile_row, col) = (
            thread / chunks_per_row,
            thread % chunks_per_row * FA2_TC_COPY_ELEMENTS,
        );
        for pass in 0..rows / rows_per_pass {
            copy_chunk(first_tile_row + pass * rows_per_pass, col);
        }
    } else {
        let mut chunk = thread;
        while chunk < rows * chunks_per_row {
            copy_chunk(
                chunk / chunks_per_row,
                chunk % chunks_per_row * FA2_TC_COPY_ELEMENTS,
            );
            chunk += threads;
        }
    }
}

/// Shared-memory row of this lane's part of an x4 A-fragment load of row tile `tile`: matrices
/// rows 0–7 / 8–15 (lanes 8–15, 24–31) × columns 0–7 / 8–15 (lanes 16–31).
#[inline(always)]
fn q_fragment_address(tiles: &SharedTiles, first_row: u32, chunk: u32) -> SharedAddress {
    let lane = gpu::lane_idx();
    let row = first_row + lane % 8 + (lane / 8) % 2 * 8;
    tiles.at(tiles.q, row, chunk * 16 + lane / 16 * 8)
}

/// The kernel body: `Q_CHUNKS` = d/16, `O_TILES` = d/8, `KEY_TILES` = B_c/8 (16×8 tiles of S
/// per row tile and K/V block), `KEY_CHUNKS` = B_c/16 (the k-steps of P̃·V).
/// Grid (⌈seqlen_q/B_r⌉, batch·heads),
/// 32·`WARPS` threads, `layout::Fa2TcTiling::shared_bytes(d)` bytes of dynamic shared memory.
#[inline(always)]
pub fn forward<
    T: TensorCoreElement,
    const Q_CHUNKS: usize,
    const O_TILES: usize,
    const WARPS: u32,
    const ROW_TILES: usize,
    const KV_STAGES: u32,
    const KEY_TILES: usize,
    const KEY_CHUNKS: usize,
>(
    p: &Fa2Params,
) {
    const {
        assert!(O_TILES == 2 * Q_CHUNKS && KEY_TILES == 2 * KEY_CHUNKS);
        assert!(KV_STAGES == 1 || KV_STAGES == 2);
    };
    let block_cols = KEY_TILES as u32 * 8;
    let tiling = Fa2TcTiling::new(WARPS, ROW_TILES as u32, KV_STAGES, block_cols);
    let head_dim = Q_CHUNKS as u32 * 16;
    let block_rows = tiling.block_rows();
    let threads = WARPS * WARP_SIZE;
    let shape = &p.shape;
    let batch_head = gpu::block_idx_y();
    let (batch, head) = (batch_head / shape.heads, batch_head % shape.heads);
    // Causal: the last row blocks see the most keys; start them first so the grid's tail is short.
    let row_block = if shape.causal != 0 {
        gpu::grid_dim_x() - 1 - gpu::block_idx_x()
    } else {
        gpu::block_idx_x()
    };
    let row_start = row_block * block_rows;
    let mask = CausalMask::new(shape.causal != 0, shape.seqlen_q, shape.seqlen_k);
    let q = GlobalRows::new(&p.operands.q, batch, head, shape.seqlen_q);
    let k = GlobalRows::new(&p.operands.k, batch, head, shape.seqlen_k);
    let v = GlobalRows::new(&p.operands.v, batch, head, shape.seqlen_k);
    let tiles = SharedTiles::new(head_dim, block_rows, block_cols);
    let copy_block = |rows: &GlobalRows, block: u32, dst: SharedAddress| {
        let first = block * block_cols;
        copy_tile_async(rows, first, block_cols, head_dim, threads, &tiles, dst);
    };

    // Q_i and K_0 (and V_0, with two stages) in flight together.
    copy_tile_async(
        &q, row_start, block_rows, head_dim, threads, &tiles, tiles.q,
    );
    copy_block(&k, 0, tiles.k(0));
    if KV_STAGES == 2 {
        copy_block(&v, 0, tiles.v(0));
    }
    gpu::copy_async_commit();

    let key_blocks = mask.key_blocks_needed(row_start + block_rows, shape.seqlen_k, block_cols);
    let warp_rows = WarpRows::<ROW_TILES> {
        first_row: gpu::warp_idx() * 16 * ROW_TILES as u32,
    };
    let empty = RowTileState::<O_TILES> {
        stats: [RowStats::EMPTY; 2],
        acc: [[0.0; 4]; O_TILES],
    };
    let mut state = [empty; ROW_TILES];
    let mut q_registers = [[[0u32; 4]; Q_CHUNKS]; ROW_TILES];
    let step_base = BlockStep {
        tiles: &tiles,
        stage: 0,
        key_start: 0,
        row_start,
        mask,
        seqlen_k: shape.seqlen_k,
        score_scale: shape.softmax_scale * LOG2_E,
    };
    for j in 0..key_blocks {
        // Block j has landed, and every warp is done with block j − 1, whose stage is reused next.
        gpu::copy_async_wait_all();
        gpu::sync_threads();
        if j == 0 && ROW_TILES * Q_CHUNKS <= Q_REGISTER_CHUNKS {
            for (tile, fragments) in q_registers.iter_mut().enumerate() {
                for (chunk, fragment) in fragments.iter_mut().enumerate() {
                    *fragment = gpu::load_matrix_x4(q_fragment_address(
                        &tiles,
                        warp_rows.tile_row(tile),
                        chunk as u32,
                    ));
                }
            }
        }
        if KV_STAGES == 2 {
            // Block j + 1 into the other stage, in flight while block j is computed.
            if j + 1 < key_blocks {
                let next = (j + 1) % 2;
                copy_block(&k, j + 1, tiles.k(next));
                copy_block(&v, j + 1, tiles.v(next));
                gpu::copy_async_commit();
            }
        } else {
            // One stage (FlashAttention-2's schedule): V_j lands while S = Q_i·K_jᵀ is computed.
            copy_block(&v, j, tiles.v(0));
            gpu::copy_async_commit();
        }
        // With one stage, V_j must have landed, and every warp be done reading K_j, before
        // P̃·V_j; K_j+1 then overwrites K_j while P̃·V_j runs. (Issuing it before the softmax, as
        // FlashAttention-2 does, keeps the copy's addresses live beside S: 108 bytes of spills at
        // d = 128 against 80, and spills at d = 96 and 256 that this order avoids.)
        let before_pv = || {
            if KV_STAGES == 1 {
                gpu::copy_async_wait_all();
                gpu::sync_threads();
                if j + 1 < key_blocks {
                    copy_block(&k, j + 1, tiles.k(0));
                    gpu::copy_async_commit();
                }
            }
        };
        let key_start = j * block_cols;
        let step = BlockStep {
            stage: j % KV_STAGES,
            key_start,
            ..step_base
        };
        if key_start + block_cols > shape.seqlen_k
            || mask.tile_needs_mask(row_start, key_start + block_cols)
        {
            step.run::<T, true, Q_CHUNKS, O_TILES, ROW_TILES, KEY_TILES, KEY_CHUNKS>(
                &warp_rows,
                &q_registers,
                &mut state,
                before_pv,
            );
        } else {
            step.run::<T, false, Q_CHUNKS, O_TILES, ROW_TILES, KEY_TILES, KEY_CHUNKS>(
                &warp_rows,
                &q_registers,
                &mut state,
                before_pv,
            );
        }
    }
    gpu::copy_async_wait_all(); // Nothing may be in flight when the block exits.
    for (tile, tile_state) in state.iter_mut().enumerate() {
        store_output::<T, O_TILES>(
            p,
            batch,
            head,
            batch_head,
            row_start + warp_rows.tile_row(tile),
            tile_state,
        );
    }
}

/// The rows of Q_i one warp owns: `ROW_TILES` consecutive m16 tiles.
struct WarpRows<const ROW_TILES: usize> {
    first_row: u32,
}

impl<const ROW_TILES: usize> WarpRows<ROW_TILES> {
    /// First row (within Q_i) of row tile `tile`.
    #[inline(always)]
    fn tile_row(&self, tile: usize) -> u32 {
        self.first_row + 16 * tile as u32
    }
}

/// One step of the inner loop (one K/V block) for one warp.
#[derive(Clone, Copy)]
struct BlockStep<'a> {
    tiles: &'a SharedTiles,
    stage: u32,
    key_start: u32,
    row_start: u32,
    mask: CausalMask,
    seqlen_k: u32,
    score_scale: f32,
}

impl BlockStep<'_> {
    /// S = Q_i·K_jᵀ; m^(j) = max(m^(j−1), rowmax S) when the max jumps by more than
    /// `RESCALE_THRESHOLD` for some row of the warp (else m^(j) = m^(j−1)); P̃ = exp2(S − m^(j));
    /// ℓ = α·ℓ + rowsum P̃; Õ = α·Õ + P̃·V_j, for each of the warp's row tiles. `MASK`: apply the causal mask and the
    /// seqlen_k tail element-wise. `before_pv` runs between the softmax and P̃·V_j: the
    /// one-stage pipeline waits for V_j and refills K there.
    #[inline(always)]
    fn run<
        T: TensorCoreElement,
        const MASK: bool,
        const Q_CHUNKS: usize,
        const O_TILES: usize,
        const ROW_TILES: usize,
        const KEY_TILES: usize,
        const KEY_CHUNKS: usize,
    >(
        &self,
        rows: &WarpRows<ROW_TILES>,
        q_registers: &[[[u32; 4]; Q_CHUNKS]; ROW_TILES],
        state: &mut [RowTileState<O_TILES>; ROW_TILES],
        before_pv: impl FnOnce(),
    ) {
        let mut scores = self.scores::<T, Q_CHUNKS, ROW_TILES, KEY_TILES>(rows, q_registers);
        let mut block_max = [[0.0f32; 2]; ROW_TILES];
        let mut any_row_needs_rescale = false;
        for (tile, tile_scores) in scores.iter_mut().enumerate() {
            if MASK {
                self.apply_mask(tile_scores, self.row_start + rows.tile_row(tile));
            }
            for (h, max) in block_max[tile].iter_mut().enumerate() {
                *max = self.block_row_max(tile_scores, h);
                any_row_needs_rescale |= needs_rescale(state[tile].stats[h].max, *max);
            }
        }
        // One decision per warp and block: the branches below are warp-uniform. Where the head
        // dim keeps the unconditional rescale, `rescale` is the constant `true` and the vote and
        // branches compile away.
        let rescale = !fa2_tc_conditional_rescale(Q_CHUNKS as u32 * 16)
            || gpu::vote_any(any_row_needs_rescale);
        let mut p = [[[0u32; 4]; KEY_CHUNKS]; ROW_TILES];
        for (tile, (tile_scores, tile_state)) in scores.iter_mut().zip(state.iter_mut()).enumerate()
        {
            p[tile] = self.online_softmax::<T, O_TILES, KEY_TILES, KEY_CHUNKS>(
                tile_scores,
                block_max[tile],
                rescale,
                tile_state,
            );
        }
        before_pv();
        self.accumulate_pv::<T, O_TILES, ROW_TILES, KEY_CHUNKS>(&p, state);
    }

    /// S = Q_i·K_jᵀ for each row tile and the block's B_c keys (`KEY_TILES` tiles of 16×8). Each K fragment
    /// is read once and used by every row tile.
    #[inline(always)]
    fn scores<
        T: TensorCoreElement,
        const Q_CHUNKS: usize,
        const ROW_TILES: usize,
        const KEY_TILES: usize,
    >(
        &self,
        rows: &WarpRows<ROW_TILES>,
        q_registers: &[[[u32; 4]; Q_CHUNKS]; ROW_TILES],
    ) -> [[[f32; 4]; KEY_TILES]; ROW_TILES] {
        let lane = gpu::lane_idx();
        let k_tile = self.tiles.k(self.stage);
        // x4 load of two key tiles × one 16-column chunk: keys +0–7 / +8–15 (lanes 16–31),
        // columns 0–7 / 8–15 (lanes 8–15, 24–31). K's rows are B's columns: no transpose.
        let key_in_pair = lane % 8 + lane / 16 * 8;
        let col_in_chunk = (lane / 8) % 2 * 8;
        let mut scores = [[[0.0f32; 4]; KEY_TILES]; ROW_TILES];
        for chunk in 0..Q_CHUNKS {
            let mut q = [[0u32; 4]; ROW_TILES];
            for tile in 0..ROW_TILES {
                q[tile] = if ROW_TILES * Q_CHUNKS <= Q_REGISTER_CHUNKS {
                    q_registers[tile][chunk]
                } else {
                    gpu::load_matrix_x4(q_fragment_address(
                        self.tiles,
                        rows.tile_row(tile),
                        chunk as u32,
                    ))
                };
            }
            for pair in 0..KEY_TILES / 2 {
                let b = gpu::load_matrix_x4(self.tiles.at(
                    k_tile,
                    pair as u32 * 16 + key_in_pair,
                    chunk as u32 * 16 + col_in_chunk,
                ));
                for tile in 0..ROW_TILES {
                    scores[tile][2 * pair] = T::mma(q[tile], [b[0], b[1]], scores[tile][2 * pair]);
                    scores[tile][2 * pair + 1] =
                        T::mma(q[tile], [b[2], b[3]], scores[tile][2 * pair + 1]);
                }
            }
        }
        scores
    }

    /// −∞ where the key is past seqlen_k or hidden by the causal mask (row tile starting at row
    /// `first_row` of the sequence).
    #[inline(always)]
    fn apply_mask<const KEY_TILES: usize>(
        &self,
        scores: &mut [[f32; 4]; KEY_TILES],
        first_row: u32,
    ) {
        let lane = gpu::lane_idx();
        let lane_row = first_row + lane / 4;
        for (tile, values) in scores.iter_mut().enumerate() {
            for (e, value) in values.iter_mut().enumerate() {
                let row = lane_row + (e as u32 / 2) * 8;
                let key = self.key_start + tile as u32 * 8 + lane % 4 * 2 + e as u32 % 2;
                if key >= self.seqlen_k || !self.mask.visible(row, key) {
                    *value = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// max_k S[row, k] · scale · log2 e for the lane's row `h` of a row tile (`h` = 0: row l/4,
    /// elements 0–1 of each 16×8 tile; `h` = 1: row l/4 + 8, elements 2–3), complete across the
    /// quad (lanes 4g..4g+3 hold the row's B_c keys between them).
    #[inline(always)]
    fn block_row_max<const KEY_TILES: usize>(
        &self,
        scores: &[[f32; 4]; KEY_TILES],
        h: usize,
    ) -> f32 {
        let row_max = row_reduce(scores, h, f32::max);
        let row_max = row_max.max(gpu::shuffle_xor(row_max, 1));
        let row_max = row_max.max(gpu::shuffle_xor(row_max, 2));
        row_max * self.score_scale
    }

    /// The FA2 update for the lane's two rows of one row tile, against the block's row maxima
    /// `block_max`. The running max m moves only when `rescale` (some row of the warp would
    /// otherwise see P̃ > 2^`RESCALE_THRESHOLD`): then m^(j) = max(m^(j−1), rowmax),
    /// ℓ = α·ℓ and Õ = diag(α)·Õ exactly as in FA2; otherwise m stays, α = 1 and no multiply is
    /// issued. Overwrites `scores` with P̃ and returns P̃ packed to 16 bits as the A fragments of
    /// P̃·V (one per 16-key chunk): from here on only half the registers of S stay live. ℓ adds
    /// the f32 values, before rounding.
    #[inline(always)]
    fn online_softmax<
        T: TensorCoreElement,
        const O_TILES: usize,
        const KEY_TILES: usize,
        const KEY_CHUNKS: usize,
    >(
        &self,
        scores: &mut [[f32; 4]; KEY_TILES],
        block_max: [f32; 2],
        rescale: bool,
        state: &mut RowTileState<O_TILES>,
    ) -> [[u32; 4]; KEY_CHUNKS] {
        // The S tile of keys 16c..16c+8 gives fragment registers 0 (row l/4) and 1 (row l/4 + 8)
        // of chunk c; keys 16c+8..16c+16 give registers 2 and 3 (mma.m16n8k16's A layout).
        let mut fragments = [[0u32; 4]; KEY_CHUNKS];
        for h in 0..2 {
            if rescale {
                let (stats, alpha) = fa2_rescale(state.stats[h], block_max[h], gpu::exp2);
                state.stats[h] = stats;
                for tile in state.acc.iter_mut() {
                    tile[2 * h] *= alpha;
                    tile[2 * h + 1] *= alpha;
                }
            }
            let base = RowStats::exp_base(state.stats[h].max);
            for tile in scores.iter_mut() {
                for value in &mut tile[2 * h..2 * h + 2] {
                    // e^(scale·s − m) = 2^(s·scale·log2 e − m′): one FMA and one ex2.
                    *value = gpu::exp2(gpu::fma(*value, self.score_scale, -base));
                }
            }
            state.stats[h].sum += row_reduce(scores, h, |a, b| a + b);
            for (tile, values) in scores.iter().enumerate() {
                fragments[tile / 2][tile % 2 * 2 + h] = T::pack2(values[2 * h], values[2 * h + 1]);
            }
        }
        fragments
    }

    /// Õ += P̃·V_j: P̃ from registers (repacked S tiles), V_j through `ldmatrix.trans`, each V
    /// fragment used by every row tile.
    #[inline(always)]
    fn accumulate_pv<
        T: TensorCoreElement,
        const O_TILES: usize,
        const ROW_TILES: usize,
        const KEY_CHUNKS: usize,
    >(
        &self,
        p: &[[[u32; 4]; KEY_CHUNKS]; ROW_TILES],
        state: &mut [RowTileState<O_TILES>; ROW_TILES],
    ) {
        let lane = gpu::lane_idx();
        let v_tile = self.tiles.v(self.stage);
        // x4.trans load: keys +0–7 / +8–15 (lanes 8–15, 24–31), columns +0–7 / +8–15 (lanes 16–31).
        let key_in_chunk = lane % 8 + (lane / 8) % 2 * 8;
        let col_in_pair = lane / 16 * 8;
        for chunk in 0..KEY_CHUNKS {
            for pair in 0..O_TILES / 2 {
                let b = gpu::load_matrix_x4_transposed(self.tiles.at(
                    v_tile,
                    chunk as u32 * 16 + key_in_chunk,
                    pair as u32 * 16 + col_in_pair,
                ));
                for tile in 0..ROW_TILES {
                    state[tile].acc[2 * pair] =
                        T::mma(p[tile][chunk], [b[0], b[1]], state[tile].acc[2 * pair]);
                    state[tile].acc[2 * pair + 1] =
                        T::mma(p[tile][chunk], [b[2], b[3]], state[tile].acc[2 * pair + 1]);
                }
            }
        }
    }
}

/// Reduces by `op` the lane's values of one row of a row tile's S (or P̃): elements 2h and
/// 2h + 1 of each 16×8 tile (`h` = 0: row l/4; `h` = 1: row l/4 + 8), each tile's pair first,
/// then the tiles as a balanced tree.
#[inline(always)]
fn row_reduce<const KEY_TILES: usize>(
    scores: &[[f32; 4]; KEY_TILES],
    h: usize,
    op: impl Fn(f32, f32) -> f32 + Copy,
) -> f32 {
    let mut per_tile = [0.0; KEY_TILES];
    for (value, tile) in per_tile.iter_mut().zip(scores) {
        *value = op(tile[2 * h], tile[2 * h + 1]);
    }
    pairwise(per_tile, op)
}

/// O = diag(ℓ)⁻¹·Õ in the input dtype (two elements per 4-byte store) and L = m + log ℓ, for the
/// row tile whose first row (in the sequence) is `first_row`.
#[inline(always)]
fn store_output<T: TensorCoreElement, const O_TILES: usize>(
    p: &Fa2Params,
    batch: u32,
    head: u32,
    batch_head: u32,
    first_row: u32,
    state: &mut RowTileState<O_TILES>,
) {
    let lane = gpu::lane_idx();
    let o = GlobalRows::new(&p.operands.o, batch, head, p.shape.seqlen_q);
    let logsumexp =
        (p.logsumexp as *mut f32).wrapping_add(batch_head as usize * p.shape.seqlen_q as usize);
    for h in 0..2 {
        // Complete ℓ: each lane summed its own columns; the quad adds the four partial sums.
        let mut sum = state.stats[h].sum;
        sum += gpu::shuffle_xor(sum, 1);
        sum += gpu::shuffle_xor(sum, 2);
        let stats = RowStats {
            max: state.stats[h].max,
            sum,
        };
        let row = first_row + lane / 4 + h as u32 * 8;
        if row >= p.shape.seqlen_q {
            continue;
        }
        let inverse_sum = stats.inverse_sum();
        for (tile, values) in state.acc.iter().enumerate() {
            let col = tile as u32 * 8 + lane % 4 * 2;
            let packed = T::pack2(values[2 * h] * inverse_sum, values[2 * h + 1] * inverse_sum);
            // SAFETY: row < seqlen_q and col + 1 < d; the host checked the strides are multiples
            // of 8 elements, so the 4-byte store is aligned.
            unsafe { *(o.element(row, col) as *mut u32) = packed };
        }
        if lane.is_multiple_of(4) {
            // SAFETY: row < seqlen_q; the host allocated batch·heads·seqlen_q floats.
            unsafe { *logsumexp.add(row as usize) = stats.logsumexp(gpu::log2) };
        }
    }
}
