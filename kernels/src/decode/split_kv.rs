//! Split-KV decoding (flash-decoding): a few query tokens against a long KV cache. The keys of
//! each sequence are split into ranges, one block per (split, 16 query rows, batch·KV head); each
//! block runs FA2's online softmax over its range and writes its unnormalised Õ with (m, ℓ) to
//! the workspace, and the combine kernel merges the splits ([`super::combine`]). With one split
//! the block writes O and L itself.
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

use super::config::{DecodeConfig, STEP_KEYS, TILE_ROWS, WARPS};
use crate::arch;
use crate::common::block::DecodeBlock;
use crate::common::element::TensorCoreElement;
use crate::common::params::DecodeParams;
use crate::common::softcap::Softcap;
use crate::common::softmax::{Exp2Split, LOG2_E, RowStats, fa1_merge, needs_rescale};
use crate::tile::accumulator::ScoreBlock;
use crate::tile::fragment::{LDMATRIX_SIDE, MMA_N, accumulator_col};
use crate::tile::global::{HeadRows16, HeadVector};
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
/// threads, [`super::config::shared_bytes`]`(d)` bytes of dynamic shared memory.
#[inline(always)]
pub fn split_kv<T: TensorCoreElement, C: DecodeConfig>(p: &DecodeParams) {
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
    let direct = p.splits == 1;
    // A split past the sequence's end has nothing to add: the combine merges only the splits
    // that hold keys. With one split the block still writes O = 0 and L = −∞ for an empty cache.
    if !direct && block.key_start >= block.seqlen {
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
    merge_warps::<T, C>(p, &block, state, direct);
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
        // Decoding takes no soft-capping (yet).
        softcap: Softcap::OFF,
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
}

/// The warps' partial results merged (FA1's merge of seed 000: m = max(m_a, m_b),
/// ℓ = e^(m_a − m)·ℓ_a + e^(m_b − m)·ℓ_b, Õ likewise), then stored: O = Õ/ℓ and L when the
/// call has one split, else Õ, m, ℓ into the workspace for the combine.
#[inline(always)]
fn merge_warps<T: TensorCoreElement, C: DecodeConfig>(
    p: &DecodeParams,
    block: &DecodeBlock,
    mut state: WarpState<C>,
    direct: bool,
) {
    let head_dim = C::HEAD_DIM;
    let mut carver = arch::SharedCarver::from_start();
    let rows = WARPS * TILE_ROWS;
    let sram = MergeSram {
        max: SharedVector::carve(&mut carver, rows),
        sum: SharedVector::carve(&mut carver, rows),
        o: SharedTile::carve(&mut carver, rows, head_dim),
    };
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
    let merged_row = |r: u32| {
        let mut merged = RowStats::EMPTY;
        for w in 0..WARPS {
            let row = w * TILE_ROWS + r;
            let warp_stats = RowStats {
                max: sram.max.get(row),
                sum: sram.sum.get(row),
            };
            merged = fa1_merge(merged, warp_stats, arch::exp2).merged;
        }
        merged
    };
    for h in 0..2 {
        let merged = merged_row(g + h as u32 * LDMATRIX_SIDE);
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

    // 8 threads per row, 4 consecutive columns each per 32-column pass.
    let thread = arch::thread_idx_x();
    let (r, part) = (thread / 8, thread % 8);
    let Some(row) = block.row(block.first_row + r) else {
        return;
    };
    let merged = merged_row(r);
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
