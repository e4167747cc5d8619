//! Dropout on the attention probabilities (flash-attn's `dropout_p`): O = (P ∘ Z)·V / (1 − p),
//! Z_ij ∈ {0, 1} kept with probability 1 − p, drawn from a counter-based generator so the
//! backward recomputes the same Z instead of storing it (FlashAttention-2, §3.1 and
//! Algorithm 2's Z; Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", 2011, for
//! Philox4x32-10).
//!
//! **Which random number decides which score.** The scores of one (sequence, query head) split
//! into 16 × 16 tiles (query row block I = i / 16, key block J = j / 16). Within a tile, the
//! rows r = i % 16 and keys c = j % 16 form 32 *draws* of 8 scores each: draw
//! d = 4·(r % 8) + (c % 8) / 2 holds rows {r % 8, r % 8 + 8} × keys {c', c' + 1, c' + 8, c' + 9}
//! (c' = 2·((c % 8) / 2)). One Philox4x32-10 call per draw, with
//!
//! ```text
//!   counter = (32·J + d, I, global head, offset_lo)     key = (seed_lo, seed_hi ^ offset_hi)
//! ```
//!
//! gives four 32-bit words; the score (r, c) takes the 16-bit half `c % 2` of word
//! 2·(r / 8) + (c / 8), and is kept when that half is at least `drop_below`
//! (p rounded to 1/65536). The global head is sequence·heads + query head (the batch index, or
//! the sequence's index in a packed batch).
//!
//! That grouping is the one both layouts of the mma accumulators share: in the forward's
//! (rows = queries) lane l holds rows l/4 (+8) and keys 2·(l%4), +1 (+8 per tile), so its draw of
//! a tile pair is d = l, all 8 scores its own; in the backward's transposed accumulators
//! (rows = keys) lane l holds keys l/4 (+8) and queries 2·(l%4), +1, so lanes l and l ^ 4 need
//! the same two draws, and each computes one and hands the other its half (two shuffles).
//! Each score costs an eighth of a Philox call in both passes.
//!
//! The Python package computes the same mask from the same definition for `return_attn_probs`
//! (flash-attn's `S_dmask`), and its tests compare the kernels' output with a reference that
//! uses that mask.

use crate::common::params::AttentionShape;

/// Philox4x32's round multipliers and key increments (the Weyl sequence of the golden ratio and
/// √3 − 1), Salmon et al. Table 2.
const PHILOX_M: [u32; 2] = [0xD251_1F53, 0xCD9E_8D57];
const PHILOX_W: [u32; 2] = [0x9E37_79B9, 0xBB67_AE85];

/// Philox4x32-10: four random words from a 128-bit counter and a 64-bit key (the Random123
/// reference's round and key schedule; its known-answer vectors are the tests below).
#[inline(always)]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k = [
                k[0].wrapping_add(PHILOX_W[0]),
                k[1].wrapping_add(PHILOX_W[1]),
            ];
        }
        let product_0 = PHILOX_M[0] as u64 * c[0] as u64;
        let product_1 = PHILOX_M[1] as u64 * c[2] as u64;
        c = [
            (product_1 >> 32) as u32 ^ c[1] ^ k[0],
            product_1 as u32,
            (product_0 >> 32) as u32 ^ c[3] ^ k[1],
            product_0 as u32,
        ];
    }
    c
}

/// The smallest 16-bit value kept for a dropout probability `p` in [0, 1): p rounded to
/// 1/65536 (65536 drops everything; 0 is dropout off).
pub fn drop_below(p: f32) -> u32 {
    ((p as f64 * 65536.0 + 0.5) as u32).min(65536)
}

/// One (sequence, head)'s dropout: the generator's key and counter words, and the threshold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// Philox's key: the seed, its high word XOR the offset's high word.
    pub key: [u32; 2],
    /// The offset's low word (the counter's last).
    pub offset: u32,
    /// The global head: sequence·heads + query head.
    pub head: u32,
    /// A score is kept when its 16-bit random value is at least this; 0 when dropout is off.
    pub drop_below: u32,
}

impl Dropout {
    /// No dropout.
    pub const OFF: Self = Self {
        key: [0, 0],
        offset: 0,
        head: 0,
        drop_below: 0,
    };

    /// The dropout of global head `head` from a parameter block's seed, offset and threshold.
    #[inline(always)]
    pub fn new(seed: u64, offset: u64, drop_below: u32, head: u32) -> Self {
        Self {
            key: [seed as u32, (seed >> 32) as u32 ^ (offset >> 32) as u32],
            offset: offset as u32,
            head,
            drop_below,
        }
    }

    /// The dropout of a tensor-core kernel's block of head `batch_head` (its launch's sequence
    /// times heads plus its head): the parameter block's in the `local` form, else
    /// [`Dropout::OFF`] as a constant, so the dropout compiles away.
    #[inline(always)]
    pub fn of_block(shape: &AttentionShape, batch_head: u32, local: bool) -> Self {
        if !local || shape.dropout_drop_below == 0 {
            return Self::OFF;
        }
        Self::new(
            shape.dropout_seed,
            shape.dropout_offset,
            shape.dropout_drop_below,
            shape.dropout_first_head + batch_head,
        )
    }

    /// Whether scores are dropped (a uniform value).
    #[inline(always)]
    pub fn is_on(&self) -> bool {
        self.drop_below != 0
    }

    /// 1 / (1 − p) for p as rounded: kept probabilities are scaled by it, so E[O] is the
    /// attention without dropout.
    #[inline(always)]
    pub fn keep_scale(&self) -> f32 {
        if self.drop_below >= 65536 {
            // Everything dropped: O = 0 whatever the scale.
            1.0
        } else {
            65536.0 / (65536 - self.drop_below) as f32
        }
    }

    /// The four words of draw `draw` (0..32) of the tile (`row_block`, `key_block`).
    #[inline(always)]
    pub fn draw(&self, row_block: u32, key_block: u32, draw: u32) -> [u32; 4] {
        philox4x32_10(
            [key_block * 32 + draw, row_block, self.head, self.offset],
            self.key,
        )
    }

    /// Whether the score whose 16-bit value is `half` of `word` (0: low, 1: high) is kept.
    #[inline(always)]
    pub fn keeps(&self, word: u32, half: u32) -> bool {
        (word >> (16 * half)) & 0xFFFF >= self.drop_below
    }

    /// Whether the score (`query`, `key`) of this head is kept, by the definition above (one
    /// Philox call per score: the host's tests and models, not the kernels).
    pub fn keeps_score(&self, query: u32, key: u32) -> bool {
        let (r, c) = (query % 16, key % 16);
        let words = self.draw(query / 16, key / 16, 4 * (r % 8) + (c % 8) / 2);
        self.keeps(words[(2 * (r / 8) + c / 8) as usize], c % 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::vec::Vec;

    /// Random123's known-answer vectors for philox4x32 10 (kat_vectors).
    #[test]
    fn philox_matches_the_reference_vectors() {
        let cases = [
            (
                [0u32; 4],
                [0u32; 2],
                [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8],
            ),
            (
                [u32::MAX; 4],
                [u32::MAX; 2],
                [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd],
            ),
            (
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0],
                [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1],
            ),
        ];
        for (counter, key, expected) in cases {
            assert_eq!(philox4x32_10(counter, key), expected);
        }
    }

    /// The kept fraction is 1 − p within sampling noise, and rows, keys, heads, seeds and offsets
    /// each change the mask.
    #[test]
    fn the_mask_keeps_one_minus_p_and_depends_on_every_coordinate() {
        let p = 0.17f32;
        let dropout = Dropout::new(0x1234_5678_9abc_def0, 8, drop_below(p), 3);
        let n = 256u32;
        let kept = (0..n)
            .flat_map(|i| (0..n).map(move |j| (i, j)))
            .filter(|&(i, j)| dropout.keeps_score(i, j))
            .count();
        let fraction = kept as f64 / (n * n) as f64;
        // 65536 samples: the standard deviation is 0.0015.
        assert!((fraction - (1.0 - p as f64)).abs() < 0.008, "{fraction}");
        let mask = |d: &Dropout| -> Vec<bool> {
            (0..64)
                .flat_map(|i| (0..64).map(move |j| (i, j)))
                .map(|(i, j)| d.keeps_score(i, j))
                .collect()
        };
        let base = mask(&dropout);
        for other in [
            Dropout::new(0x1234_5678_9abc_def1, 8, drop_below(p), 3),
            Dropout::new(0x1234_5678_9abc_def0, 12, drop_below(p), 3),
            Dropout::new(0x1234_5678_9abc_def0, 8 + (1 << 32), drop_below(p), 3),
            Dropout::new(0x1234_5678_9abc_def0, 8, drop_below(p), 4),
        ] {
            assert_ne!(mask(&other), base, "{other:?}");
        }
        // Transposing the coordinates gives another mask (rows and keys are not symmetric).
        let transposed: Vec<bool> = (0..64)
            .flat_map(|i| (0..64).map(move |j| (j, i)))
            .map(|(i, j)| dropout.keeps_score(i, j))
            .collect();
        assert_ne!(transposed, base);
    }

    /// Rows 0, 17 and 39 of a 40 × 40 mask as bits (key j at bit j): the Python package's
    /// `_dropout.keep_mask` asserts the same words (`test_dropout_cpu.py`), so both sides compute
    /// one mask.
    #[test]
    fn the_mask_is_the_one_the_python_package_computes() {
        let dropout = Dropout::new(0x0123_4567_89ab_cdef, (5 << 32) + 8, drop_below(0.3), 7);
        let row = |i: u32| -> u64 {
            (0..40u32)
                .filter(|&j| dropout.keeps_score(i, j))
                .map(|j| 1u64 << j)
                .sum()
        };
        assert_eq!(
            [row(0), row(17), row(39)],
            [1024348875339, 676384630991, 1047837794102]
        );
    }

    #[test]
    fn thresholds_and_scale() {
        assert_eq!(drop_below(0.0), 0);
        assert_eq!(drop_below(0.5), 32768);
        assert_eq!(drop_below(0.99999999), 65536);
        let half = Dropout::new(1, 0, drop_below(0.5), 0);
        assert_eq!(half.keep_scale(), 2.0);
        assert!(half.keeps(0x8000_0000, 1) && !half.keeps(0x8000_7fff, 0));
        assert!(!Dropout::OFF.is_on());
    }
}
