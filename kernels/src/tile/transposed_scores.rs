//! The backward's transposed scores: one warp's 16 keys × B_r queries of Sᵀ = K_j·Q_iᵀ and
//! dPᵀ = V_j·dO_iᵀ in the mma.m16n8 accumulator layout (`accumulator`'s, keys as rows), and how
//! they become Pᵀ and dSᵀ (FlashAttention-2, Algorithm 2, lines 13–14 and 16–17), with the mask,
//! soft-capping, ALiBi and dropout, shared by FA2-TC's and FA3's backward.

use crate::arch;
use crate::common::alibi::Alibi;
use crate::common::dropout::Dropout;
use crate::common::element::TensorCoreElement;
use crate::common::mask::AttentionMask;
use crate::common::softcap::Softcap;
use crate::common::softmax::recomputation_base;
use crate::tile::accumulator::pack_row;
use crate::tile::fragment::{LDMATRIX_SIDE, MMA_N, accumulator_col, accumulator_row};

/// One warp's 16 keys × B_r queries of the backward's transposed scores Sᵀ = K_j·Q_iᵀ and
/// dPᵀ = V_j·dO_iᵀ (keys are the accumulator's rows, queries its columns), and how they become
/// Pᵀ and dSᵀ (FlashAttention-2, Algorithm 2, lines 13–14 and 16–17): `lane_key` is the sequence
/// key of the lane's row l/4, `row_start` the sequence row of the block's first query.
#[derive(Clone, Copy)]
pub struct TransposedScores {
    pub lane_key: u32,
    pub row_start: u32,
    pub seqlen_q: u32,
    pub seqlen_k: u32,
    pub mask: AttentionMask,
    /// scale·log2 e: scores in log2 units, as the forward computed L.
    pub score_scale: f32,
    /// Soft-capping of the raw products ([`Softcap::OFF`] as a constant in the kernels compiled
    /// without it, so the cap and its slope compile away).
    pub softcap: Softcap,
    /// ALiBi's bias ([`Alibi::OFF`] as a constant in the kernels compiled without it).
    pub alibi: Alibi,
    /// Dropout ([`Dropout::OFF`] as a constant in the kernels compiled without it).
    pub dropout: Dropout,
    /// The mask as two query ends per key of the lane (each element one compare of its constant
    /// column against them, as `accumulator::ScoreBlock::apply_mask_by_row_ends`), or element by element
    /// from the query and key indices. A constant at each call site: FA3's backward takes the
    /// ends (the element-wise form's 16 column indices per lane, hoisted out of its row loop,
    /// made ptxas spill at d = 128), FA2-TC's the element-wise form it was timed with.
    pub mask_by_key_ends: bool,
}

impl TransposedScores {
    /// The queries that see each of the lane's two keys (l/4 and l/4 + 8), as a half-open range
    /// of columns counted from the lane's first column of the block: from the first query the
    /// window's right side lets see the key to one past the last its left side lets see (or
    /// seqlen_q), and none for a key past seqlen_k.
    #[inline(always)]
    fn visible_cols(&self) -> [[i32; 2]; 2] {
        let base = (self.row_start + accumulator_col(arch::lane_idx())) as i32;
        core::array::from_fn(|h| {
            let key = self.lane_key + h as u32 * LDMATRIX_SIDE;
            let end = if key < self.seqlen_k {
                self.mask.query_end_seeing(key, self.seqlen_q)
            } else {
                0
            };
            [
                self.mask.first_query_seeing(key) as i32 - base,
                end as i32 - base,
            ]
        })
    }

    /// Pᵀ = 2^(Sᵀ·scale·log2 e − L·log2 e) (the article's P = exp(S − L)) and
    /// dSᵀ = Pᵀ ∘ (dPᵀ − D) ([`Self::probabilities`], then [`Self::score_gradients`]).
    #[inline(always)]
    pub fn gradients<
        T: TensorCoreElement,
        const TILES: usize,
        const CHUNKS: usize,
        const MASK: bool,
    >(
        &self,
        scores: &[[f32; 4]; TILES],
        d_probs: &[[f32; 4]; TILES],
        logsumexp: impl Fn(u32) -> f32,
        delta: impl Fn(u32) -> f32,
    ) -> ([[u32; 4]; CHUNKS], [[u32; 4]; CHUNKS]) {
        let kept = self.dropout_keep::<TILES>();
        let p = self.probabilities::<TILES, MASK>(scores, logsumexp, kept);
        Self::score_gradients::<T, TILES, CHUNKS>(&p, d_probs, delta)
    }

    /// Pᵀ = 2^(Sᵀ·scale·log2 e − L·log2 e) (the article's P = exp(S − L)), 0 where `MASK` hides
    /// the pair (past seqlen_q or seqlen_k, or outside the window); `logsumexp(r)` gives L of
    /// the block's query r. With soft-capping Sᵀ is the capped product, and the cap's slope at
    /// each pair is kept for dSᵀ, and dropout's `kept` ([`Self::dropout_keep`]). Needs only
    /// Sᵀ, so it can run while dPᵀ is still being computed.
    #[inline(always)]
    pub fn probabilities<const TILES: usize, const MASK: bool>(
        &self,
        scores: &[[f32; 4]; TILES],
        logsumexp: impl Fn(u32) -> f32,
        kept: Option<(u64, f32)>,
    ) -> Probabilities<TILES> {
        Probabilities {
            kept,
            ..self.probabilities_of::<TILES, MASK>(scores, logsumexp)
        }
    }

    /// Which of the lane's scores dropout keeps ([`Self::keep_bits`]) and 1 / (1 − p), for
    /// [`Self::probabilities`]; `None` without dropout. FA3's backward computes it while Sᵀ and
    /// dPᵀ run on the tensor cores.
    #[inline(always)]
    pub fn dropout_keep<const TILES: usize>(&self) -> Option<(u64, f32)> {
        self.dropout
            .is_on()
            .then(|| (self.keep_bits::<TILES>(), self.dropout.keep_scale()))
    }

    /// Which of the lane's scores dropout keeps, bit 4·tile + element (`common::dropout`): for
    /// each pair of query tiles, lanes l and l ^ 4 (keys l/4 and l/4 ^ 1, which share their draws)
    /// each compute the draw of the queries 2·(l%4) + (l/4)%2 (+8) and hand the other the half it
    /// needs, so each score costs an eighth of a Philox call, as in the forward.
    #[inline(always)]
    fn keep_bits<const TILES: usize>(&self) -> u64 {
        const { assert!(TILES.is_multiple_of(2) && TILES * 4 <= 64) };
        let lane = arch::lane_idx();
        let (key_class, query_pair) = (accumulator_row(lane), lane % 4);
        let own_half = key_class % 2;
        // The draw of rows {x, x + 8} and this lane's key pair: x = 2·(l%4) + own_half.
        let draw = 4 * (2 * query_pair + own_half) + key_class / 2;
        let half = |word: u32, which: u32| (word >> (16 * which)) & 0xFFFF;
        let mut bits = 0u64;
        // As the forward's: the loop over pairs indexes no array by its counter.
        for pair in 0..TILES / 2 {
            let own =
                self.dropout
                    .draw(self.row_start / 16 + pair as u32, self.lane_key / 16, draw);
            let sent = |w: usize| half(own[w], 1 - own_half) | half(own[w + 1], 1 - own_half) << 16;
            let received = [
                arch::shuffle_xor(f32::from_bits(sent(0)), 4).to_bits(),
                arch::shuffle_xor(f32::from_bits(sent(2)), 4).to_bits(),
            ];
            let mut pair_bits = 0u32;
            for tile in 0..2 {
                for e in 0..4 {
                    // Element e: query +e%2 (this lane's draw when it is the draw's row class),
                    // key +8·(e/2) (the word within the pair); the tile's place in its pair
                    // picks the pair of words.
                    let w = 2 * tile + e / 2;
                    let value = if e as u32 % 2 == own_half {
                        half(own[w], own_half)
                    } else {
                        half(received[w / 2], w as u32 % 2)
                    };
                    if value >= self.dropout.drop_below {
                        pair_bits |= 1 << (4 * tile + e);
                    }
                }
            }
            bits |= (pair_bits as u64) << (8 * pair);
        }
        bits
    }

    /// [`Self::probabilities`] before dropout.
    #[inline(always)]
    fn probabilities_of<const TILES: usize, const MASK: bool>(
        &self,
        scores: &[[f32; 4]; TILES],
        logsumexp: impl Fn(u32) -> f32,
    ) -> Probabilities<TILES> {
        // One branch for the whole tile, not a select per element: LLVM speculated the per-pair
        // test, so the `local` kernels paid a tanh per pair without capping (12–16% of the
        // backward on an H100, call 3 of the twenty-first session). ALiBi likewise.
        match (self.softcap.is_on(), self.alibi.is_on()) {
            (false, false) => {
                self.probabilities_scored::<TILES, MASK, false, false>(scores, logsumexp)
            }
            (true, false) => {
                self.probabilities_scored::<TILES, MASK, true, false>(scores, logsumexp)
            }
            (false, true) => {
                self.probabilities_scored::<TILES, MASK, false, true>(scores, logsumexp)
            }
            (true, true) => self.probabilities_scored::<TILES, MASK, true, true>(scores, logsumexp),
        }
    }

    /// [`Self::probabilities`] with soft-capping (`CAPPED`) or without, and with ALiBi's bias
    /// (`BIASED`) or without, as constants.
    #[inline(always)]
    fn probabilities_scored<
        const TILES: usize,
        const MASK: bool,
        const CAPPED: bool,
        const BIASED: bool,
    >(
        &self,
        scores: &[[f32; 4]; TILES],
        logsumexp: impl Fn(u32) -> f32,
    ) -> Probabilities<TILES> {
        let lane = arch::lane_idx();
        let visible_cols = self.visible_cols();
        let mut p = [[0.0f32; 4]; TILES];
        let mut cap_slope = [[1.0f32; 4]; TILES];
        for t in 0..TILES {
            for e in 0..4 {
                // Element e: key row l/4 (+8 for e ≥ 2), query column 2·(l%4) (+1 for odd e).
                let col = t as u32 * MMA_N + e as u32 % 2;
                let local_row = col + accumulator_col(lane);
                let key = self.lane_key + e as u32 / 2 * LDMATRIX_SIDE;
                let row = self.row_start + local_row;
                let visible = !MASK
                    || if self.mask_by_key_ends {
                        let [first, end] = visible_cols[e / 2];
                        (first..end).contains(&(col as i32))
                    } else {
                        row < self.seqlen_q && key < self.seqlen_k && self.mask.visible(row, key)
                    };
                let base = recomputation_base(logsumexp(local_row));
                let (score, slope) = if CAPPED {
                    self.softcap.apply_with_slope(scores[t][e], arch::tanh)
                } else {
                    (scores[t][e], 1.0)
                };
                // The bias does not depend on Q or K: dSᵀ is unchanged, only P moves.
                let score = if BIASED {
                    score + self.alibi.bias(row, key)
                } else {
                    score
                };
                let probability = arch::exp2(arch::fma(score, self.score_scale, -base));
                p[t][e] = if visible { probability } else { 0.0 };
                cap_slope[t][e] = slope;
            }
        }
        Probabilities {
            p,
            cap_slope,
            kept: None,
        }
    }

    /// dSᵀ = Pᵀ ∘ (dPᵀ − D) from [`Self::probabilities`]' Pᵀ, times the cap's slope 1 − tanh²
    /// with soft-capping (the gradient with respect to the raw product, which dQ and dK take);
    /// `delta(r)` gives D of the block's query r. With dropout, the forward multiplied V by
    /// P̃ = Z ∘ P / (1 − p), so dV takes P̃ᵀ and dS = P ∘ (Z ∘ dP / (1 − p) − D), with D = rowsum(dO ∘ O)
    /// as before (FlashAttention-2, Algorithm 2 with Z). Returns Pᵀ (P̃ᵀ) and dSᵀ packed to 16
    /// bits as the A fragments of Pᵀ·dO_i and dSᵀ·Q_i: the accumulator layout of a 16 × 16 pair of
    /// tiles is the A layout ([`pack_row`]).
    #[inline(always)]
    pub fn score_gradients<T: TensorCoreElement, const TILES: usize, const CHUNKS: usize>(
        probabilities: &Probabilities<TILES>,
        d_probs: &[[f32; 4]; TILES],
        delta: impl Fn(u32) -> f32,
    ) -> ([[u32; 4]; CHUNKS], [[u32; 4]; CHUNKS]) {
        // A uniform branch: the kernels without dropout compile the first arm alone.
        match probabilities.kept {
            None => Self::score_gradients_kept::<T, TILES, CHUNKS, false>(
                probabilities,
                (0, 1.0),
                d_probs,
                delta,
            ),
            Some(kept) => Self::score_gradients_kept::<T, TILES, CHUNKS, true>(
                probabilities,
                kept,
                d_probs,
                delta,
            ),
        }
    }

    /// [`Self::score_gradients`] with dropout's keep bits and 1 / (1 − p) (`DROPPED`) or without.
    #[inline(always)]
    fn score_gradients_kept<
        T: TensorCoreElement,
        const TILES: usize,
        const CHUNKS: usize,
        const DROPPED: bool,
    >(
        probabilities: &Probabilities<TILES>,
        (keep_bits, keep_scale): (u64, f32),
        d_probs: &[[f32; 4]; TILES],
        delta: impl Fn(u32) -> f32,
    ) -> ([[u32; 4]; CHUNKS], [[u32; 4]; CHUNKS]) {
        let lane = arch::lane_idx();
        let Probabilities { p, cap_slope, .. } = probabilities;
        let mut kept = *p;
        let mut ds = [[0.0f32; 4]; TILES];
        for t in 0..TILES {
            for e in 0..4 {
                let local_row = t as u32 * MMA_N + e as u32 % 2 + accumulator_col(lane);
                ds[t][e] = if DROPPED {
                    kept[t][e] = if keep_bits >> (4 * t + e) & 1 != 0 {
                        p[t][e] * keep_scale
                    } else {
                        0.0
                    };
                    (kept[t][e] * d_probs[t][e] - p[t][e] * delta(local_row)) * cap_slope[t][e]
                } else {
                    p[t][e] * (d_probs[t][e] - delta(local_row)) * cap_slope[t][e]
                };
            }
        }
        let mut p_fragments = [[0u32; 4]; CHUNKS];
        let mut ds_fragments = [[0u32; 4]; CHUNKS];
        for h in 0..2 {
            pack_row::<T, _, _>(&kept, h, &mut p_fragments);
            pack_row::<T, _, _>(&ds, h, &mut ds_fragments);
        }
        (p_fragments, ds_fragments)
    }
}

/// One warp's Pᵀ ([`TransposedScores::probabilities`]) and, per pair, the slope of the
/// soft-cap (1 − tanh² of the scaled product over softcap; 1 without capping, a constant the
/// multiply folds away).
#[derive(Clone, Copy)]
pub struct Probabilities<const TILES: usize> {
    pub p: [[f32; 4]; TILES],
    pub cap_slope: [[f32; 4]; TILES],
    /// With dropout: which scores it keeps (bit 4·tile + element) and 1 / (1 − p).
    pub kept: Option<(u64, f32)>,
}
