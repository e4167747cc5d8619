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

/// What the backward pass subtracts, in log2 units, to recompute P from the forward's
/// L = m + log ℓ (natural-log units): P_ij = exp(S_ij − L_i) (the article's L equation,
/// `000_…`: exp(S_ij − m_i − log ℓ_i) = exp(S_ij − m_i)/ℓ_i), i.e. 2^(S_ij·log2 e − L_i·log2 e)
/// with the scores already in log2 units. P comes out normalised, so neither m nor ℓ is kept.
/// 0 for a row with no visible key (L = −∞): its scores are all −∞, and 2^(−∞ − 0) = 0 where
/// 2^(−∞ + ∞) would be NaN.
#[inline(always)]
pub fn recomputation_base(logsumexp: f32) -> f32 {
    RowStats::exp_base(logsumexp * LOG2_E)
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

/// How far (in log2 units) a block's row max may exceed the running max before the running max
/// moves (FlashAttention-4's conditional rescale). Until then the exponentials are taken against
/// the stale max, so P̃ = 2^(s − m) ≤ 2^2: no overflow in f32 or in the 16-bit P̃, and Õ and ℓ
/// stay consistent because both are sums against the same m; the final O = Õ/ℓ and
/// L = m + log ℓ are exact for any m the row actually used.
///
/// Why 2 and not FlashAttention-4's 8: P̃ is rounded to 16 bits before P̃·V, and a row's
/// largest P̃ is exactly 1 only when m is that row's true max. With a stale max the largest
/// weights are rounded too; at 8 that raised the bf16 error by about 12% on average (a simulated
/// tolerance ratio of 0.47 against 0.42 for the exact update, over 50 random 1024 × 1023, d = 64
/// problems) and failed one tiling-test case at 1.04× the bound. At 2 the error is within 3% of
/// the exact update's, and N(0, 1) inputs move the max in about one warp-block in ten
/// (docs/perf, FA2-TC v6).
pub const RESCALE_THRESHOLD: f32 = 2.0;

/// Whether a row must move its running max to take a block whose row max is `block_max`: the
/// block would otherwise produce P̃ > 2^[`RESCALE_THRESHOLD`]. Always true for the first visible
/// block (m = −∞); never for a fully masked or NaN block max.
#[inline(always)]
pub fn needs_rescale(running_max: f32, block_max: f32) -> bool {
    // Written out, not through `needs_rescale_past`: LLVM then canonicalizes the comparison as
    // it did before that existed, and the dense kernels' SASS stays the same instruction for
    // instruction.
    block_max > running_max + RESCALE_THRESHOLD
}

/// [`needs_rescale`] against a threshold held in a register: [`RESCALE_THRESHOLD`] for a row
/// that takes part in its warp's decision, +∞ for one that must not move it (no block max
/// passes it, and against a running max of −∞ the sum is NaN, which none passes either). A
/// kernel computes the threshold once per row before its loop, so the rule costs its loop
/// nothing beside the dense kernel's test.
#[inline(always)]
pub fn needs_rescale_past(running_max: f32, block_max: f32, threshold: f32) -> bool {
    block_max > running_max + threshold
}

/// The threshold [`needs_rescale_past`] takes for a row that votes, or one that does not.
#[inline(always)]
pub fn rescale_threshold(votes: bool) -> f32 {
    if votes {
        RESCALE_THRESHOLD
    } else {
        f32::INFINITY
    }
}

/// 2^x for x ≤ 2^22 by a cubic on the FMA units instead of the SFU's `ex2.approx`
/// (FlashAttention-4's exponential emulation): x = n + f with n = round(x) and |f| ≤ 1/2, 2^f by a
/// minimax cubic (relative error 7.5·10⁻⁵, a twenty-sixth of bf16's and a sixth of f16's half
/// unit in the last place, below the rounding of P̃ to 16 bits), and 2^n added to its exponent
/// bits. Below −125 it returns 0 (−∞ included; the SFU's flush-to-zero form does below −126). At d = 64 an
/// SM's 16 exponentials per cycle take as long as the block's two products on the tensor cores;
/// moving some of them to the 128-per-cycle FMA pipe shortens the softmax between them.
#[inline(always)]
pub fn exp2_polynomial(x: f32, fma: impl Fn(f32, f32, f32) -> f32) -> f32 {
    // 1.5·2^23: adding it rounds x to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    // 2^f ≈ c0 + c1·f + c2·f² + c3·f³ on [−1/2, 1/2], fitted for the relative error.
    const C: [f32; 4] = [0.999_928_06, 0.693_261, 0.242_611_17, 0.055_171_628];
    let shifted = x + ROUND;
    let f = x - (shifted - ROUND);
    let power = fma(fma(fma(C[3], f, C[2]), f, C[1]), f, C[0]);
    // n·2^23 added to 2^f's bits multiplies it by 2^n (the low bits of `shifted` are n).
    let bits = power.to_bits().wrapping_add(shifted.to_bits() << 23);
    if x < -125.0 {
        0.0
    } else {
        f32::from_bits(bits)
    }
}

/// Which of a block's exponentials run on the FMA units ([`exp2_polynomial`]) rather than the
/// SFU: every `polynomial_every`-th 8-key tile of S (0: none), so the two pipes share the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exp2Split {
    pub polynomial_every: usize,
}

impl Exp2Split {
    /// Every exponential on the SFU.
    pub const SFU_ONLY: Self = Self {
        polynomial_every: 0,
    };

    /// Whether tile `tile`'s exponentials take the polynomial.
    #[inline(always)]
    pub const fn on_fma(self, tile: usize) -> bool {
        self.polynomial_every != 0 && tile % self.polynomial_every == self.polynomial_every - 1
    }
}

/// Reduces `values` by `op` as a balanced tree: ⌈log2 N⌉ dependent steps instead of N − 1, so a
/// warp's row max and row sum do not serialise on the ALU latency. Each step folds the upper half
/// onto the lower (the middle element of an odd width waits a step). For max the order does not
/// change the result; for the sum it is the (more accurate) pairwise sum.
#[inline(always)]
pub fn pairwise<const N: usize>(mut values: [f32; N], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = N;
    while width > 1 {
        let half = width / 2;
        for i in 0..half {
            values[i] = op(values[i], values[i + width - half]);
        }
        width -= half;
    }
    values[0]
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
    fn exp2_polynomial_is_within_its_error_bound() {
        let fma = |a: f32, b: f32, c: f32| a.mul_add(b, c);
        let mut worst = 0.0f64;
        for i in 0..=1_300_000 {
            let x = -125.0 + i as f32 * 1e-4;
            let exact = (x as f64).exp2();
            worst = worst.max((exp2_polynomial(x, fma) as f64 / exact - 1.0).abs());
        }
        assert!(worst < 7.6e-5, "relative error {worst}");
        for x in [f32::NEG_INFINITY, -1e30, -200.0, -125.5] {
            assert_eq!(exp2_polynomial(x, fma), 0.0, "2^{x}");
        }
        let split = Exp2Split {
            polynomial_every: 4,
        };
        let tiles: [bool; 8] = core::array::from_fn(|t| split.on_fma(t));
        assert_eq!(
            tiles,
            [false, false, false, true, false, false, false, true]
        );
        assert!(!(0..16).any(|t| Exp2Split::SFU_ONLY.on_fma(t)));
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

    /// The scheme the tensor-core kernel runs: the running max moves (by the exact FA2 update)
    /// only when some row needs it; otherwise the block is exponentiated against the stale max.
    /// Õ/ℓ and L must equal the exact online softmax, and P̃ must stay ≤ 2^threshold.
    #[test]
    fn threshold_rescale_matches_the_exact_update() {
        // Row maxima that creep up by less than the threshold, jump past it, and fall back.
        let t = RESCALE_THRESHOLD;
        let blocks: [[f32; 3]; 6] = [
            [-3.0, 1.0, 0.5],
            [2.0, 1.0 + 0.9 * t, 0.0],
            [1.0 + 0.95 * t, -20.0, 3.0],
            [1.0 + 2.0 * t, 1.0 + 1.5 * t, 1.0 + 1.9 * t],
            [-100.0, f32::NEG_INFINITY, 0.0],
            [1.0 + 3.5 * t, 1.0 + 3.0 * t, 1.0 + 2.5 * t],
        ];
        let values: [f32; 3] = [1.0, -2.0, 0.25];
        let (mut lazy, mut lazy_acc) = (RowStats::EMPTY, 0.0f32);
        let (mut exact, mut exact_acc) = (RowStats::EMPTY, 0.0f32);
        let mut moves = 0;
        for block in &blocks {
            let block_max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if needs_rescale(lazy.max, block_max) {
                moves += 1;
                let (stats, alpha) = fa2_rescale(lazy, block_max, exp2);
                lazy = stats;
                lazy_acc *= alpha;
            }
            let (stats, alpha) = fa2_rescale(exact, block_max, exp2);
            exact = stats;
            exact_acc *= alpha;
            for (s, v) in block.iter().zip(values) {
                let lazy_p = (s - RowStats::exp_base(lazy.max)).exp2();
                assert!(
                    lazy_p <= RESCALE_THRESHOLD.exp2(),
                    "P̃ = {lazy_p} past 2^threshold"
                );
                lazy.sum += lazy_p;
                lazy_acc += lazy_p * v;
                let exact_p = (s - exact.max).exp2();
                exact.sum += exact_p;
                exact_acc += exact_p * v;
            }
        }
        // The first block and the two jumps (not the creep below the threshold).
        assert_eq!(moves, 3);
        let (lazy_out, exact_out) = (lazy_acc / lazy.sum, exact_acc / exact.sum);
        assert!(
            (lazy_out - exact_out).abs() <= 1e-6 * exact_out.abs(),
            "{lazy_out} vs {exact_out}"
        );
        let (lazy_l, exact_l) = (lazy.logsumexp(f32::log2), exact.logsumexp(f32::log2));
        assert!(
            (lazy_l - exact_l).abs() <= 1e-5 * exact_l.abs(),
            "{lazy_l} vs {exact_l}"
        );
        assert!(!needs_rescale(RowStats::EMPTY.max, f32::NEG_INFINITY));
        assert!(!needs_rescale(0.0, f32::NAN));
        // A row that does not vote never moves the decision, whatever its maxima.
        let abstain = rescale_threshold(false);
        assert!(!needs_rescale_past(RowStats::EMPTY.max, 1e30, abstain));
        assert!(!needs_rescale_past(-1e30, f32::MAX, abstain));
        assert!(needs_rescale_past(0.0, 2.5, rescale_threshold(true)));
    }

    /// Every element enters the tree exactly once, for widths that are and are not powers of two
    /// (B_c = 48 gives 6 tiles per row): distinct powers of two sum exactly.
    #[test]
    fn pairwise_reduces_every_element_once() {
        fn check<const N: usize>() {
            let values: [f32; N] = core::array::from_fn(|i| (i as f32).exp2());
            assert_eq!(
                pairwise(values, |a, b| a + b),
                (N as f32).exp2() - 1.0,
                "N = {N}"
            );
            assert_eq!(
                pairwise(values, f32::max),
                ((N - 1) as f32).exp2(),
                "N = {N}"
            );
        }
        check::<1>();
        check::<2>();
        check::<3>();
        check::<4>();
        check::<6>();
        check::<8>();
        check::<16>();
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
    fn p_recomputed_from_logsumexp_is_normalised() {
        let scores = [0.5f32, -1.0, 2.0, 0.0];
        let logsumexp = reference_stats(&scores).logsumexp(f32::log2);
        let base = recomputation_base(logsumexp);
        let total: f32 = scores.iter().map(|s| (s - base).exp2()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        // A row with no visible key: every P is 0, none NaN.
        let base = recomputation_base(f32::NEG_INFINITY);
        assert_eq!((f32::NEG_INFINITY - base).exp2(), 0.0);
    }

    #[test]
    fn logsumexp_is_in_natural_units() {
        // Scores 0 and ln 3 in natural units → log2 units: 0 and log2 3.
        let stats = reference_stats(&[0.0, 3.0f32.log2()]);
        assert!((stats.logsumexp(f32::log2) - 4.0f32.ln()).abs() < 1e-6);
    }
}
