//! Split-KV decoding (flash-decoding): a few query tokens against a long KV cache. The keys of
//! each sequence are split into ranges, one block per (split, 16 query rows, batch·KV head); each
//! block runs FA2's online softmax over its range and writes its unnormalised Õ with (m, ℓ) to
//! the workspace, and the combine kernel merges the splits ([`super::combine`]). With one split
//! the block writes O and L itself. The one-launch form (`ONE_LAUNCH`) needs no combine kernel:
//! after storing its partial results each block arrives at its group's counter
//! (`tile::global::SplitArrivals`: an acquire-release atomic add, its release cumulative over the
//! block's stores before a barrier), and the block that arrives last sees every other split's
//! partial results, merges them ([`super::combine::combine_row`]) and resets the counter.
//!
//! Decoding reads each key once and does 2·rows·d multiply-adds with it, so the kernel is a
//! stream of K/V bytes: each warp loads its step's 16 keys and values straight into mma
//! fragments with 16-byte loads (`tile::kv_cache`), 8 KiB per step at d = 128, with nothing
//! staged in shared memory. Both products run on `mma.sync.m16n8k16` with the group's query
//! rows as M (all query heads of the KV head in one tile: GQA reads K/V once).
//!
//! ```text
//!  block (split s, row tile, batch·KV head)        warp w: steps w, w + 4, w + 8, … of the split
//!  ┌──────────────────────────────┐                 S = Q·Kᵀ   16 rows × 16 keys (2 n-tiles)
//!  │ keys [s·split_keys, …)       │  ← 16-byte       P̃ = exp2(S·scale·log2 e − m)   (registers)
//!  │   warp 0: keys 0..16, 64..80 │    loads         Õ += P̃·V   16 rows × d
//!  │   warp 1: keys 16..32, …     │                 end: the 4 warps' (m, ℓ, Õ) merged in shared
//!  └──────────────────────────────┘                 memory by FA1's rule (seed 000)
//! ```

use super::combine::combine_row;
use super::config::{DecodeConfig, STEP_KEYS, SplitPlan, TILE_ROWS, WARPS};
use crate::arch;
use crate::common::alibi::Alibi;
use crate::common::decode_block::{DecodeBlock, DecodeRow};
use crate::common::element::TensorCoreElement;
use crate::common::params::DecodeParams;
use crate::common::softcap::Softcap;
use crate::common::softmax::{Exp2Split, LOG2_E, RowStats, fa1_merge, needs_rescale};
use crate::tile::accumulator::ScoreBlock;
use crate::tile::fragment::{LDMATRIX_SIDE, MMA_N, accumulator_col};
use crate::tile::global::{HeadRows16, HeadVector, SplitArrivals};
use crate::tile::kv_cache::{
    CacheRows, key_fragments, lane_coordinates, output_col, query_fragments, value_fragment,
    value_rows,
};
use crate::tile::partials::Partials;
use crate::tile::shared::{SharedTile, SharedVector};

/// One warp's running state for the lane's two rows (g and g + 8): m, partial ℓ, and Õ.
struct WarpState<C: DecodeConfig> {
    stats: [RowStats; 2],
    acc: [[f32; 4]; C::O_TILES],
}

/// What every step of a warp reads: the cache, Q's fragments, the rows' tokens and the mask.
struct StepInputs<'a, C: DecodeConfig> {
    keys: &'a CacheRows<{ C::PAGED }>,
    values: &'a CacheRows<{ C::PAGED }>,
    query: &'a [[u32; 4]; C::Q_STEPS],
    /// The token of the lane's rows g and g + 8 (for the causal mask).
    tokens: [u32; 2],
    block: &'a DecodeBlock,
    score_scale: f32,
}

/// The kernel body: grid (splits, row tiles, batch·heads_kv), [`super::config::THREADS`]
/// threads, [`super::config::shared_bytes`]`(d)` bytes of dynamic shared memory. `ONE_LAUNCH`:
/// the last block of each (batch·KV head, row tile) merges the splits, with the counters at
/// `p.split_counters`.
#[inline(always)]
pub fn split_kv<T: TensorCoreElement, C: DecodeConfig, const ONE_LAUNCH: bool>(p: &DecodeParams) {
    let () = C::CHECKED;
    let batch = arch::block_idx_z() / p.heads_kv;
    // SAFETY: the host allocated `batch` lengths; z < batch·heads_kv.
    let cached =
        unsafe { arch::load((p.cache_seqlens as *const u32).wrapping_add(batch as usize)) };
    let block = DecodeBlock::new(
        p,
        arch::block_idx_x(),
        arch::block_idx_y(),
        arch::block_idx_z(),
        cached + p.new_tokens,
    );
    // The splits that hold keys; the merge takes those only. One launch counts at least one, so
    // that split 0 writes O = 0 and L = −∞ for an empty sequence.
    let plan = SplitPlan {
        splits: p.splits,
        split_keys: p.split_keys,
    };
    let arrivals = plan.splits_covering(block.seqlen).max(1);
    let direct = p.splits == 1 || (ONE_LAUNCH && arrivals == 1);
    // A split past the sequence's end has nothing to add. With one split the block still writes
    // O = 0 and L = −∞ for an empty cache.
    if (ONE_LAUNCH && block.split >= arrivals) || (!direct && block.key_start >= block.seqlen) {
        return;
    }
    let (g, _) = lane_coordinates();
    let tile_rows = [g, g + LDMATRIX_SIDE].map(|r| block.row(block.first_row + r));
    let query_rows = tile_rows.map(|row| {
        row.map(|row| {
            let rows = HeadRows16::new(&p.q, block.batch, row.head, p.q_tokens);
            rows.copy_source(row.token, 0, true).0
        })
    });
    let query: [[u32; 4]; C::Q_STEPS] = query_fragments(query_rows);
    let cache = |view| {
        CacheRows::<{ C::PAGED }>::new(
            view,
            block.batch,
            block.kv_head,
            p.block_table,
            p.table_stride,
            p.page_size,
        )
    };
    let (keys, values) = (cache(&p.k_cache), cache(&p.v_cache));
    let inputs = StepInputs::<C> {
        keys: &keys,
        values: &values,
        query: &query,
        tokens: tile_rows.map(|row| row.map_or(0, |row| row.token)),
        block: &block,
        score_scale: p.softmax_scale * LOG2_E,
    };
    let mut state = WarpState::<C> {
        stats: [RowStats::EMPTY; 2],
        acc: [[0.0; 4]; C::O_TILES],
    };
    let mut key_start = block.key_start + arch::warp_idx() * STEP_KEYS;
    while key_start < block.key_end {
        if block.step_needs_mask(key_start, STEP_KEYS) {
            step::<T, C, true>(&inputs, key_start, &mut state);
        } else {
            step::<T, C, false>(&inputs, key_start, &mut state);
        }
        key_start += WARPS * STEP_KEYS;
    }
    let sram = MergeSram::carve(C::HEAD_DIM);
    merge_warps::<T, C>(p, &block, &sram, state, direct);
    if ONE_LAUNCH && !direct {
        merge_splits_if_last::<T, C>(p, &block, &sram, arrivals);
    }
}

/// After the block's partial stores: it arrives at its group's counter, and if it is the last of
/// the group's `arrivals`, merges the splits of each of its rows (one warp per row) as the
/// combine kernel would.
#[inline(always)]
fn merge_splits_if_last<T: TensorCoreElement, C: DecodeConfig>(
    p: &DecodeParams,
    block: &DecodeBlock,
    sram: &MergeSram,
    arrivals: u32,
) {
    // Every thread's partial stores come before thread 0's release (and the merge's shared
    // reads before the flag's write).
    arch::sync_threads();
    if arch::thread_idx_x() == 0 {
        let group = arch::block_idx_z() * arch::grid_dim_y() + arch::block_idx_y();
        let last = SplitArrivals::new(p.split_counters, group).arrive_last(arrivals);
        sram.last_arrival.set(0, if last { 1.0 } else { 0.0 });
    }
    // Thread 0's acquire comes before every thread's reads of the other splits' results.
    arch::sync_threads();
    if sram.last_arrival.get(0) == 0.0 {
        return;
    }
    let mut r = arch::warp_idx();
    while r < TILE_ROWS {
        if let Some(row) = block.row(block.first_row + r) {
            combine_row::<T, C>(p, block.batch, row, arrivals);
        }
        r += WARPS;
    }
}

/// One step of 16 keys from `key_start`: S = Q·Kᵀ, the online softmax (FA2's update, the max
/// moved only when it jumps, as FA2-TC does), Õ += P̃·V. `MASK`: keys past the sequence and
/// above the causal diagonal become −∞ (and are never loaded).
#[inline(always)]
fn step<T: TensorCoreElement, C: DecodeConfig, const MASK: bool>(
    inputs: &StepInputs<C>,
    key_start: u32,
    state: &mut WarpState<C>,
) {
    let block = inputs.block;
    let valid = |row: u32| !MASK || key_start + row < block.seqlen;
    let key_rows = inputs.keys.rows_from(key_start);
    let value_rows_of_step = inputs.values.rows_from(key_start);
    let k: [[[u32; 4]; C::KEY_PASSES]; 2] = key_fragments(&key_rows, valid);
    let v: [[[u32; 4]; 4]; C::VALUE_PASSES] = value_rows(&value_rows_of_step, valid);

    let mut scores = [[0.0f32; 4]; 2];
    for (tile, fragments) in k.iter().enumerate() {
        for (pass, b) in fragments.iter().enumerate() {
            let s = T::mma(inputs.query[2 * pass], [b[0], b[1]], scores[tile]);
            scores[tile] = T::mma(inputs.query[2 * pass + 1], [b[2], b[3]], s);
        }
    }
    let score = ScoreBlock {
        key_start,
        seqlen_k: block.seqlen,
        mask: block.mask(),
        // Decoding takes no soft-capping or ALiBi (yet).
        softcap: Softcap::OFF,
        alibi: Alibi::OFF,
        score_scale: inputs.score_scale,
        exp2_split: Exp2Split::SFU_ONLY,
    };
    if MASK {
        let lane_col = accumulator_col(arch::lane_idx());
        for (tile, values) in scores.iter_mut().enumerate() {
            for (e, value) in values.iter_mut().enumerate() {
                let key = key_start + tile as u32 * MMA_N + lane_col + e as u32 % 2;
                let token = inputs.tokens[e / 2];
                if key >= block.seqlen || !score.mask.visible(token, key) {
                    *value = f32::NEG_INFINITY;
                }
            }
        }
    }
    let block_max = [score.row_max(&scores, 0), score.row_max(&scores, 1)];
    let rescale = arch::vote_any(
        needs_rescale(state.stats[0].max, block_max[0])
            || needs_rescale(state.stats[1].max, block_max[1]),
    );
    let [probabilities] = score.online_softmax::<T, 2, _, 1>(
        &mut scores,
        block_max,
        rescale,
        &mut state.stats,
        &mut state.acc,
        None,
    );
    for (pass, rows) in v.iter().enumerate() {
        for j in 0..8 {
            let tile = pass * 8 + j;
            state.acc[tile] = T::mma(probabilities, value_fragment(rows, j), state.acc[tile]);
        }
    }
}

/// The block's shared memory for the warps' merge: each warp's m and ℓ per row, and its Õ.
struct MergeSram {
    max: SharedVector,
    sum: SharedVector,
    /// `WARPS × 16` rows of d floats: warp w's row r is row `w·16 + r`.
    o: SharedTile,
    /// One word: 1 when this block arrived last at its group's counter (one launch).
    last_arrival: SharedVector,
}

impl MergeSram {
    /// The block's dynamic shared memory, [`super::config::shared_floats`] floats.
    #[inline(always)]
    fn carve(head_dim: u32) -> Self {
        let mut carver = arch::SharedCarver::from_start();
        let rows = WARPS * TILE_ROWS;
        Self {
            max: SharedVector::carve(&mut carver, rows),
            sum: SharedVector::carve(&mut carver, rows),
            o: SharedTile::carve(&mut carver, rows, head_dim),
            last_arrival: SharedVector::carve(&mut carver, 1),
        }
    }

    /// Row `r`'s (m, ℓ) over the block's warps (after the barrier that follows their stores).
    #[inline(always)]
    fn merged_stats(&self, r: u32) -> RowStats {
        let mut merged = RowStats::EMPTY;
        for w in 0..WARPS {
            let row = w * TILE_ROWS + r;
            let warp_stats = RowStats {
                max: self.max.get(row),
                sum: self.sum.get(row),
            };
            merged = fa1_merge(merged, warp_stats, arch::exp2).merged;
        }
        merged
    }
}

/// The warps' partial results merged (FA1's merge of seed 000: m = max(m_a, m_b),
/// ℓ = e^(m_a − m)·ℓ_a + e^(m_b − m)·ℓ_b, Õ likewise), then stored: O = Õ/ℓ and L when the
/// call has one split, else Õ, m, ℓ into the workspace for the combine.
#[inline(always)]
fn merge_warps<T: TensorCoreElement, C: DecodeConfig>(
    p: &DecodeParams,
    block: &DecodeBlock,
    sram: &MergeSram,
    mut state: WarpState<C>,
    direct: bool,
) {
    let (g, t) = lane_coordinates();
    let warp_row = |h: usize| arch::warp_idx() * TILE_ROWS + g + h as u32 * LDMATRIX_SIDE;
    for h in 0..2 {
        // Complete ℓ: each lane summed its own keys; the quad adds the four partial sums.
        let stats = &mut state.stats[h];
        stats.sum += arch::shuffle_xor(stats.sum, 1);
        stats.sum += arch::shuffle_xor(stats.sum, 2);
        if t == 0 {
            sram.max.set(warp_row(h), stats.max);
            sram.sum.set(warp_row(h), stats.sum);
        }
    }
    arch::sync_threads();
    for h in 0..2 {
        let merged = sram.merged_stats(g + h as u32 * LDMATRIX_SIDE);
        let factor = arch::exp2(state.stats[h].max - RowStats::exp_base(merged.max));
        for (tile, values) in state.acc.iter().enumerate() {
            for e in 2 * h..2 * h + 2 {
                sram.o.set(
                    warp_row(h),
                    output_col(tile as u32, e as u32),
                    values[e] * factor,
                );
            }
        }
    }
    arch::sync_threads();

    // 8 threads per row, 4 consecutive columns each per 32-column pass. Threads of rows past
    // the group store nothing but stay for the one-launch kernel's barriers.
    let thread = arch::thread_idx_x();
    let (r, part) = (thread / 8, thread % 8);
    if let Some(row) = block.row(block.first_row + r) {
        store_merged::<T, C>(p, block, sram, row, r, part, direct);
    }
}

/// Thread `part` of the 8 of row `r`: the warps' Õ of its columns summed, then O = Õ/ℓ and L
/// (one split) or Õ, m and ℓ into the workspace.
#[inline(always)]
fn store_merged<T: TensorCoreElement, C: DecodeConfig>(
    p: &DecodeParams,
    block: &DecodeBlock,
    sram: &MergeSram,
    row: DecodeRow,
    r: u32,
    part: u32,
    direct: bool,
) {
    let head_dim = C::HEAD_DIM;
    let merged = sram.merged_stats(r);
    let output = HeadRows16::new(&p.o, block.batch, row.head, p.q_tokens);
    let partials = Partials::new(p);
    let inverse_sum = merged.inverse_sum();
    for pass in 0..head_dim / 32 {
        let col = pass * 32 + part * 4;
        let values: [f32; 4] = core::array::from_fn(|i| {
            let mut total = 0.0;
            for w in 0..WARPS {
                total += sram.o.get(w * TILE_ROWS + r, col + i as u32);
            }
            total
        });
        if direct {
            for pair in 0..2 {
                let (low, high) = (values[2 * pair], values[2 * pair + 1]);
                let packed = T::pack2(low * inverse_sum, high * inverse_sum);
                output.store_pair(row.token, col + 2 * pair as u32, packed);
            }
        } else {
            partials.store_o4(block.split, row.row_id, col, values);
        }
    }
    if part == 0 {
        if direct {
            HeadVector::new(p.logsumexp, 0, 0).write(row.row_id, merged.logsumexp(arch::log2));
        } else {
            partials.store_stats(block.split, row.row_id, merged);
        }
    }
}
