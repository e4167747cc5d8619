//! Online softmax (Milakov & Gimelshein 2018), in the exp2 domain.
//!
//! Kernels multiply the scores by `scale · log2(e)` once, so every exponential is a single `exp2`
//! instruction: e^(x − m) = 2^(x·log2 e − m·log2 e). The statistics below are therefore in log2
//! units until [`RowStats::logsumexp`] converts them back to natural-log units.
//!
//! The exponential is a parameter (`exp2`) so that the same update runs in the kernels (the GPU's
//! `ex2.approx`) and in the host's emulators (`f32::exp2`).

/// log2(e): folds e^x into 2^(x·log2 e).
pub const LOG2_E: f32 = core::f32::consts::LOG2_E;
/// ln(2): converts log2-domain statistics back to natural-log units.
pub const LN_2: f32 = core::f32::consts::LN_2;

/// Running max `m` and sum `ℓ = Σ 2^(s − m)` of one row over the scores seen so far.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowStats {
    pub max: f32,
    pub sum: f32,
}

impl RowStats {
    /// No score seen: m = −∞, ℓ = 0.
    pub const EMPTY: Self = Self {
        max: f32::NEG_INFINITY,
        sum: 0.0,
    };

    /// What to subtract before exponentiating: m, or 0 while m = −∞ (a row that has seen only
    /// masked scores), so that 2^(−∞ − m) is 0 instead of NaN.
    #[inline(always)]
    pub fn exp_base(max: f32) -> f32 {
        if max == f32::NEG_INFINITY { 0.0 } else { max }
    }

    /// 1/ℓ for the final normalisation O = diag(ℓ)⁻¹·Õ; 0 for a row with no visible key, whose O
    /// is then 0.
    #[inline(always)]
    pub fn inverse_sum(&self) -> f32 {
        if self.sum > 0.0 { 1.0 / self.sum } else { 0.0 }
    }

    /// L = m + log ℓ in natural-log units (FA2's output); −∞ for a row with no visible key.
    #[inline(always)]
    pub fn logsumexp(&self, log2: impl Fn(f32) -> f32) -> f32 {
        if self.sum > 0.0 {
            (self.max + log2(self.sum)) * LN_2
        } else {
            f32::NEG_INFINITY
        }
    }
}

/// FA1's merge of a row's stored statistics with one block's:
/// m_new = max(m_i, m̃_ij), α = e^(m_i − m_new), β = e^(m̃_ij − m_new), ℓ_new = α·ℓ_i + β·ℓ̃_ij.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fa1Merge {
    pub merged: RowStats,
    pub alpha: f32,
    pub beta: f32,
}

/// See [`Fa1Merge`]. `block` holds the block's own max m̃_ij and sum ℓ̃_ij = rowsum(e^(S_ij − m̃_ij)).
#[inline(always)]
pub fn fa1_merge(stored: RowStats, block: RowStats, exp2: impl Fn(f32) -> f32) -> Fa1Merge {
    let max = stored.max.max(block.max);
    let base = RowStats::exp_base(max);
    let alpha = exp2(stored.max - base);
    let beta = exp2(block.max - base);
    Fa1Merge {
        merged: RowStats {
            max,
            sum: alpha * stored.sum + beta * block.sum,
        },
        alpha,
        beta,
    }
}

/// FA2's update of the running max against a block's row max, which leaves only α:
/// m^(j) = max(m^(j−1), rowmax(S^(j))), α = e^(m^(j−1) − m^(j)).
/// Returns the statistics with ℓ already scaled by α (the caller adds rowsum(P̃^(j))) and α, by
/// which the caller scales Õ.
#[inline(always)]
pub fn fa2_rescale(
    running: RowStats,
    block_max: f32,
    exp2: impl Fn(f32) -> f32,
) -> (RowStats, f32) {
    let max = running.max.max(block_max);
    let alpha = exp2(running.max - RowStats::exp_base(max));
    (
        RowStats {
            max,
            sum: alpha * running.sum,
        },
        alpha,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp2(x: f32) -> f32 {
        x.exp2()
    }

    fn reference_stats(scores: &[f32]) -> RowStats {
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        RowStats {
            max,
            sum: scores.iter().map(|s| (s - max).exp2()).sum(),
        }
    }

    #[test]
    fn fa1_merge_of_two_blocks_equals_the_whole_row() {
        let row = [0.5f32, 3.0, -1.0, 2.0, 7.5, -4.0];
        let (a, b) = row.split_at(2);
        let merged = fa1_merge(reference_stats(a), reference_stats(b), exp2).merged;
        let whole = reference_stats(&row);
        assert_eq!(merged.max, whole.max);
        assert!((merged.sum - whole.sum).abs() < 1e-6 * whole.sum);
    }

    #[test]
    fn fa2_rescale_then_add_equals_the_whole_row() {
        let row = [1.0f32, -2.0, 9.0, 0.0];
        let first = reference_stats(&row[..2]);
        let (mut stats, alpha) = fa2_rescale(first, 9.0, exp2);
        assert_eq!(alpha, (1.0f32 - 9.0).exp2());
        stats.sum += row[2..].iter().map(|s| (s - stats.max).exp2()).sum::<f32>();
        let whole = reference_stats(&row);
        assert!((stats.sum - whole.sum).abs() < 1e-6 * whole.sum);
    }

    #[test]
    fn fully_masked_rows_stay_empty_without_nan() {
        let masked = RowStats::EMPTY;
        let m = fa1_merge(masked, masked, exp2);
        assert_eq!(m.merged, RowStats::EMPTY);
        assert!(!m.alpha.is_nan() && !m.beta.is_nan());
        let (stats, alpha) = fa2_rescale(masked, f32::NEG_INFINITY, exp2);
        assert_eq!(stats, RowStats::EMPTY);
        assert!(!alpha.is_nan());
        assert_eq!(stats.inverse_sum(), 0.0);
        assert_eq!(stats.logsumexp(f32::log2), f32::NEG_INFINITY);
    }

    #[test]
    fn logsumexp_is_in_natural_units() {
        // Scores 0 and ln 3 in natural units → log2 units: 0 and log2 3.
        let stats = reference_stats(&[0.0, 3.0f32.log2()]);
        assert!((stats.logsumexp(f32::log2) - 4.0f32.ln()).abs() < 1e-6);
    }
}
