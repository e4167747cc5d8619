//! The split-KV combine: each query row's splits merged by their (m, ℓ), FA1's merge of seed
//! 000 (m = max(m_a, m_b), α = e^(m_a − m), β = e^(m_b − m), ℓ = α·ℓ_a + β·ℓ_b,
//! Õ = α·Õ_a + β·Õ_b), then O = Õ/ℓ and L = m + log ℓ. One warp per row; lane l holds columns
//! l, l + 32, … (coalesced reads of each split's Õ).

use super::config::{COMBINE_ROWS, DecodeConfig, SplitPlan};
use crate::arch::{self, WARP_SIZE};
use crate::common::element::Element;
use crate::common::params::DecodeParams;
use crate::common::softmax::{RowStats, fa1_merge};
use crate::tile::global::{HeadRows, HeadVector};
use crate::tile::partials::Partials;

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
    let splits = plan.splits_covering(cached + p.new_tokens);
    let partials = Partials::new(p);
    let lane = arch::lane_idx();
    let mut stats = RowStats::EMPTY;
    let mut acc = [0.0f32; C::LANE_COLS];
    for split in 0..splits {
        let merge = fa1_merge(stats, partials.stats(split, row_id), arch::exp2);
        for (i, value) in acc.iter_mut().enumerate() {
            let col = lane + i as u32 * WARP_SIZE;
            *value = merge.alpha * *value + merge.beta * partials.o(split, row_id, col);
        }
        stats = merge.merged;
    }
    let output = HeadRows::<T>::new(&p.o, batch, head, p.q_tokens);
    let inverse_sum = stats.inverse_sum();
    for (i, value) in acc.iter().enumerate() {
        output.write(token, lane + i as u32 * WARP_SIZE, value * inverse_sum);
    }
    if lane == 0 {
        HeadVector::new(p.logsumexp, 0, 0).write(row_id, stats.logsumexp(arch::log2));
    }
}
