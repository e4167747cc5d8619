//! The split-KV combine: each query row's splits merged by their (m, ℓ), FA1's merge of seed
//! 000 (m = max(m_a, m_b), α = e^(m_a − m), β = e^(m_b − m), ℓ = α·ℓ_a + β·ℓ_b,
//! Õ = α·Õ_a + β·Õ_b), then O = Õ/ℓ and L = m + log ℓ. One warp per row; lane l holds columns
//! l, l + 32, … (coalesced reads of each split's Õ). [`combine_row`] is the merge of one row,
//! which the combine kernel runs and so does the one-launch split-KV kernel's last block of
//! each group (`super::split_kv`).

use super::config::{COMBINE_ROWS, DecodeConfig, SplitPlan};
use crate::arch::{self, WARP_SIZE};
use crate::common::decode_block::DecodeRow;
use crate::common::element::Element;
use crate::common::params::DecodeParams;
use crate::common::softmax::{RowStats, fa1_merge};
use crate::tile::global::{HeadRows, HeadVector};
use crate::tile::partials::Partials;

/// Splits whose partial results a lane loads together before merging them in order: the
/// merge's chain of dependent L2 round trips is ⌈splits / 8⌉ long instead of one per split.
type const SPLITS_PER_ROUND: usize = 8;

/// The kernel body: grid (⌈rows / COMBINE_ROWS⌉), [`super::config::COMBINE_THREADS`] threads.
#[inline(always)]
pub fn combine<T: Element, C: DecodeConfig>(p: &DecodeParams) {
    let () = C::CHECKED;
    let row_id = arch::block_idx_x() * COMBINE_ROWS + arch::warp_idx();
    if row_id >= p.batch * p.heads_q * p.q_tokens {
        return;
    }
    let token = row_id % p.q_tokens;
    let head = row_id / p.q_tokens % p.heads_q;
    let batch = row_id / (p.q_tokens * p.heads_q);
    // SAFETY: the host allocated `batch` lengths.
    let cached =
        unsafe { arch::load((p.cache_seqlens as *const u32).wrapping_add(batch as usize)) };
    let plan = SplitPlan {
        splits: p.splits,
        split_keys: p.split_keys,
    };
    let row = DecodeRow {
        head,
        token,
        row_id,
    };
    combine_row::<T, C>(p, batch, row, plan.splits_covering(cached + p.new_tokens));
}

/// One warp merges the first `splits` splits' partial results of `row` (of sequence `batch`)
/// in split order and stores its O and L. With no split (an empty sequence) O = 0, L = −∞.
#[inline(always)]
pub fn combine_row<T: Element, C: DecodeConfig>(
    p: &DecodeParams,
    batch: u32,
    row: DecodeRow,
    splits: u32,
) {
    let partials = Partials::new(p);
    let lane = arch::lane_idx();
    let mut stats = RowStats::EMPTY;
    let mut acc = [0.0f32; C::LANE_COLS];
    let mut first = 0;
    while first < splits {
        // A split past the last merges as (m = −∞, ℓ = 0, Õ = 0): α = 1, β = 0, a no-op. Plain
        // arrays over constant ranges, so that they live in registers, not on the stack.
        let mut round_stats = [RowStats::EMPTY; SPLITS_PER_ROUND];
        let mut round_o = [[0.0f32; C::LANE_COLS]; SPLITS_PER_ROUND];
        for i in 0..SPLITS_PER_ROUND {
            let split = first + i as u32;
            if split < splits {
                round_stats[i] = partials.stats(split, row.row_id);
                for (c, o) in round_o[i].iter_mut().enumerate() {
                    *o = partials.o(split, row.row_id, lane + c as u32 * WARP_SIZE);
                }
            }
        }
        for i in 0..SPLITS_PER_ROUND {
            let merge = fa1_merge(stats, round_stats[i], arch::exp2);
            for c in 0..C::LANE_COLS {
                acc[c] = merge.alpha * acc[c] + merge.beta * round_o[i][c];
            }
            stats = merge.merged;
        }
        first += SPLITS_PER_ROUND as u32;
    }
    let output = HeadRows::<T>::new(&p.o, batch, row.head, p.q_tokens);
    let inverse_sum = stats.inverse_sum();
    for (i, value) in acc.iter().enumerate() {
        output.write(row.token, lane + i as u32 * WARP_SIZE, value * inverse_sum);
    }
    if lane == 0 {
        HeadVector::new(p.logsumexp, 0, 0).write(row.row_id, stats.logsumexp(arch::log2));
    }
}
