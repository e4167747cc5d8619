//! The article's HBM-traffic formulas, per head and non-causal.
//!
//! The article (`000_…`, its FA1/FA2 comparison table) counts the HBM traffic per head, "roughly,
//! leaving out terms of size N such as the statistics", with T_c = ⌈N_k/B_c⌉ and T_r = ⌈N_q/B_r⌉:
//!
//! - FA1 ≈ 2Nd (K, V read once) + T_c·Nd (Q read T_c times) + 2·T_c·Nd (O_i read T_c times and
//!   written T_c times): the outer loop walks K/V, so every Q_i and O_i makes a round trip per
//!   outer step.
//! - FA2 ≈ Nd (Q read once) + 2·T_r·Nd (K, V read T_r times) + Nd (O read 0 times, written once):
//!   the outer loop walks Q, so Q_i and Õ_i stay on chip and K/V are re-read per row block.

use flash_kernels::fwd::fa1::config::Fa1Blocks;

use crate::model::traffic::Traffic;

/// Element counts per head, per tensor, as the article's formulas give them (non-causal). `o`
/// counts O however the algorithm stores it (for FA1: the accumulator and the final O together).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FormulaCounts {
    pub q: Traffic,
    pub k: Traffic,
    pub v: Traffic,
    pub o: Traffic,
    /// S (standard attention only).
    pub scores: Traffic,
    /// P (standard attention only).
    pub probs: Traffic,
}

/// The product of `factors`, saturating at `u64::MAX` instead of overflowing.
pub(super) fn count(factors: &[u64]) -> u64 {
    factors
        .iter()
        .fold(1u64, |product, &f| product.saturating_mul(f))
}

/// ⌈len / block⌉; a zero block size counts as `u64::MAX` blocks (so the counts saturate).
pub(super) fn block_count(len: usize, block: u32) -> u64 {
    if block == 0 {
        u64::MAX
    } else {
        (len as u64).div_ceil(block as u64)
    }
}

/// The article's FA1 traffic per head: K and V read once (N_k·d each), Q read T_c times
/// (T_c·N_q·d), O read T_c times and written T_c times (T_c·N_q·d each), T_c = ⌈N_k/B_c⌉.
///
/// The kernel's exact counts (see [`predicted_fa1_io`](crate::model::prediction::predicted_fa1_io)): O's T_c reads all come from the f32
/// accumulator; of its T_c writes, T_c − 1 go to the accumulator and the last to the final O;
/// line 2's initialisation adds one more N_q·d write to the accumulator, and m, ℓ add 2·N_q writes
/// at line 2 plus T_c·N_q reads and T_c·N_q writes each.
pub fn fa1_formula(
    seqlen_q: usize,
    seqlen_k: usize,
    head_dim: usize,
    blocks: Fa1Blocks,
) -> FormulaCounts {
    let (n_q, n_k, d) = (seqlen_q as u64, seqlen_k as u64, head_dim as u64);
    let t_c = block_count(seqlen_k, blocks.block_cols);
    let once = |n: u64| Traffic {
        read: count(&[n, d]),
        written: 0,
    };
    FormulaCounts {
        q: Traffic {
            read: count(&[t_c, n_q, d]),
            written: 0,
        },
        k: once(n_k),
        v: once(n_k),
        o: Traffic {
            read: count(&[t_c, n_q, d]),
            written: count(&[t_c, n_q, d]),
        },
        ..FormulaCounts::default()
    }
}

/// The article's FA2 traffic per head: Q read once (N_q·d), K and V read T_r times (T_r·N_k·d
/// each), O written once (N_q·d), T_r = ⌈N_q/B_r⌉. B_c does not enter: without a causal mask every
/// row block reads every K/V block.
///
/// The kernel's exact counts add L = m + log ℓ, written once (N_q); see [`predicted_fa2_io`](crate::model::prediction::predicted_fa2_io).
pub fn fa2_formula(
    seqlen_q: usize,
    seqlen_k: usize,
    head_dim: usize,
    block_rows: u32,
) -> FormulaCounts {
    let (n_q, n_k, d) = (seqlen_q as u64, seqlen_k as u64, head_dim as u64);
    let t_r = block_count(seqlen_q, block_rows);
    let per_row_block = |n: u64| Traffic {
        read: count(&[t_r, n, d]),
        written: 0,
    };
    FormulaCounts {
        q: Traffic {
            read: count(&[n_q, d]),
            written: 0,
        },
        k: per_row_block(n_k),
        v: per_row_block(n_k),
        o: Traffic {
            read: 0,
            written: count(&[n_q, d]),
        },
        ..FormulaCounts::default()
    }
}

/// The standard attention's traffic per head, counting each element once per pass over it, as the
/// article counts it (`kernels/src/standard.rs`):
///
/// - scores kernel: Q and K read once, S = scale·Q·Kᵀ written once (N_q·N_k, f32);
/// - softmax kernel: S read twice (pass 1: row statistics; pass 2: P), P written once;
/// - output kernel: P and V read once, O written once.
///
/// With a causal mask the softmax kernel reads only the visible part of S; this formula is the
/// non-causal count. The tiled products read Q once per 16-key tile of S, K once per 16-row tile,
/// and P and V once per 16-column tile of O; those re-reads mostly hit L2 and are not counted.
pub fn standard_formula(seqlen_q: usize, seqlen_k: usize, head_dim: usize) -> FormulaCounts {
    let (n_q, n_k, d) = (seqlen_q as u64, seqlen_k as u64, head_dim as u64);
    let read = |elements: u64| Traffic {
        read: elements,
        written: 0,
    };
    let n_q_by_n_k = count(&[n_q, n_k]);
    FormulaCounts {
        q: read(count(&[n_q, d])),
        k: read(count(&[n_k, d])),
        v: read(count(&[n_k, d])),
        o: Traffic {
            read: 0,
            written: count(&[n_q, d]),
        },
        scores: Traffic {
            read: count(&[2, n_q_by_n_k]),
            written: n_q_by_n_k,
        },
        probs: Traffic {
            read: n_q_by_n_k,
            written: n_q_by_n_k,
        },
    }
}
