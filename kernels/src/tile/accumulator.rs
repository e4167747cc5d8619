//! One warp's 16 rows of an f32 accumulator in the mma.m16n8 layout, as `[[f32; 4]; TILES]`
//! (TILES tiles of 16 × 8 side by side): the S and Õ of `mma.sync` kernels, and also one warp's
//! quarter of a `wgmma` m64 accumulator, which has the same layout per warp. Here: the mask, the
//! row reductions across a quad, the online-softmax update of the articles, and the packing of
//! P̃ into the A fragments of P̃·V, shared by FA2-TC and FA3.
//!
//! ```text
//!  lane l, tile t, elements e = 0..4:  row l/4 + 8·(e/2),  column 8t + 2·(l%4) + e%2
//!  "h" below: the lane's row l/4 (h = 0, elements 0–1) or l/4 + 8 (h = 1, elements 2–3)
//! ```

use crate::arch;
use crate::common::alibi::Alibi;
use crate::common::dropout::Dropout;
use crate::common::element::TensorCoreElement;
use crate::common::mask::AttentionMask;
use crate::common::softcap::Softcap;
use crate::common::softmax::{Exp2Split, RowStats, exp2_polynomial, fa2_rescale, pairwise};
use crate::tile::fragment::{LDMATRIX_SIDE, MMA_N, accumulator_col, accumulator_row};
use crate::tile::global::{HeadRows16, HeadVector};

/// Where a block of scores S = Q_i·K_jᵀ sits and how it becomes probabilities: its first key,
/// the keys that exist, the mask, soft-capping, ALiBi, scale·log2 e (the softmax runs in the
/// exp2 domain), and which of its exponentials run on the FMA units rather than the SFU.
#[derive(Clone, Copy)]
pub struct ScoreBlock {
    pub key_start: u32,
    pub seqlen_k: u32,
    pub mask: AttentionMask,
    pub softcap: Softcap,
    pub alibi: Alibi,
    pub score_scale: f32,
    pub exp2_split: Exp2Split,
}

impl ScoreBlock {
    /// Soft-capping, when on: each raw product x = q·k becomes tanh(x·scale/softcap)·softcap/scale
    /// (one `tanh.approx` per score; `common::softcap`), before the mask. The test is uniform
    /// across the grid, so with capping off it costs one compare per block.
    #[inline(always)]
    pub fn apply_softcap<const TILES: usize>(&self, scores: &mut [[f32; 4]; TILES]) {
        if self.softcap.is_on() {
            for values in scores.iter_mut() {
                for value in values.iter_mut() {
                    *value = self.softcap.apply(*value, arch::tanh);
                }
            }
        }
    }

    /// ALiBi, when on: each raw product gains −(slope / scale)·|row + seqlen_k − seqlen_q − key|
    /// (`common::alibi`), after soft-capping and before the mask, for the warp's 16 rows
    /// starting at row `first_row` of the sequence. Every visited block needs it, masked or
    /// not; the test is uniform, so with ALiBi off it costs one compare per block.
    #[inline(always)]
    pub fn apply_alibi<const TILES: usize>(&self, scores: &mut [[f32; 4]; TILES], first_row: u32) {
        if self.alibi.is_on() {
            let lane = arch::lane_idx();
            let lane_row = first_row + accumulator_row(lane);
            let lane_key = self.key_start + accumulator_col(lane);
            for (tile, values) in scores.iter_mut().enumerate() {
                for (e, value) in values.iter_mut().enumerate() {
                    let row = lane_row + (e as u32 / 2) * LDMATRIX_SIDE;
                    let key = lane_key + tile as u32 * MMA_N + e as u32 % 2;
                    *value += self.alibi.bias(row, key);
                }
            }
        }
    }

    /// −∞ where the key is past seqlen_k or hidden by the mask (causal or a window), for the
    /// warp's 16 rows starting at row `first_row` of the sequence.
    #[inline(always)]
    pub fn apply_mask<const TILES: usize>(&self, scores: &mut [[f32; 4]; TILES], first_row: u32) {
        let lane = arch::lane_idx();
        let lane_row = first_row + accumulator_row(lane);
        for (tile, values) in scores.iter_mut().enumerate() {
            for (e, value) in values.iter_mut().enumerate() {
                let row = lane_row + (e as u32 / 2) * LDMATRIX_SIDE;
                let key =
                    self.key_start + tile as u32 * MMA_N + accumulator_col(lane) + e as u32 % 2;
                // The mask's own test only where it has a bounded side: a block that is masked
                // for the seqlen_k tail alone then compares the key with seqlen_k only.
                if key >= self.seqlen_k || (self.mask.is_bounded() && !self.mask.visible(row, key))
                {
                    *value = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// The same mask as [`apply_mask`](Self::apply_mask), as ends per row: each of the lane's
    /// two rows sees the keys below `visible_key_end` (the causal diagonal or the window's right
    /// edge, clipped to seqlen_k) and, where the window has a left side (a uniform branch), from
    /// its `window_start`, so each element is one compare of its constant column within the
    /// block against an end counted from the lane's first column: two live values, not a key
    /// index per element. The left pass keeps one: the second row's start is the first's + 8.
    ///
    /// FA3 uses this form, FA2-TC the element-wise one: each is the faster in its kernel, timed
    /// against the other in one call (FA3 +3–6% where blocks are masked, call 11; FA2-TC −3–4%,
    /// call 9; docs/perf).
    #[inline(always)]
    pub fn apply_mask_by_row_ends<const TILES: usize>(
        &self,
        scores: &mut [[f32; 4]; TILES],
        first_row: u32,
    ) {
        let lane = arch::lane_idx();
        let lane_row = first_row + accumulator_row(lane);
        let lane_key = (self.key_start + accumulator_col(lane)) as i32;
        let row = |h: usize| lane_row + h as u32 * LDMATRIX_SIDE;
        let end_cols: [i32; 2] = core::array::from_fn(|h| {
            self.mask.visible_key_end(row(h), self.seqlen_k) as i32 - lane_key
        });
        if self.mask.is_left_bounded() {
            let first_col = self.mask.window_start(lane_row) - lane_key;
            let row_shift = |h: usize| (h as u32 * LDMATRIX_SIDE) as i32;
            mask_columns(scores, |col, h| {
                col >= end_cols[h] || col - row_shift(h) < first_col
            });
        } else {
            // A constant branch outside the `local` kernels: their dense twins compare the
            // right end only, as before windows existed.
            mask_columns(scores, |col, h| col >= end_cols[h]);
        }
    }

    /// max_k S[row, k] · scale · log2 e for the lane's row `h`, complete across the quad (lanes
    /// 4g..4g+3 hold the row's keys between them).
    #[inline(always)]
    pub fn row_max<const TILES: usize>(&self, scores: &[[f32; 4]; TILES], h: usize) -> f32 {
        let row_max = row_reduce(scores, h, f32::max);
        let row_max = row_max.max(arch::shuffle_xor(row_max, 1));
        let row_max = row_max.max(arch::shuffle_xor(row_max, 2));
        row_max * self.score_scale
    }

    /// The FA2 update for the lane's two rows against the block's row maxima `block_max`. With
    /// `rescale`, m^(j) = max(m^(j−1), rowmax), ℓ = α·ℓ and Õ = diag(α)·Õ exactly as in FA2;
    /// without, m stays, α = 1 and no multiply is issued (the conditional rescale: the caller
    /// decided that no row's P̃ would pass 2^`RESCALE_THRESHOLD`). Overwrites `scores` with
    /// P̃ = exp2(S·scale·log2 e − m), adds its f32 row sums into the lane's partial ℓ, and returns
    /// P̃ packed to 16 bits as the A fragments of P̃·V, one per 16 keys ([`pack_row`];
    /// mma.m16n8k16's A layout, which wgmma's register A shares), with dropout's zeros where
    /// `kept` ([`forward_keep_bits`]) has them.
    #[inline(always)]
    pub fn online_softmax<
        T: TensorCoreElement,
        const TILES: usize,
        const O_TILES: usize,
        const CHUNKS: usize,
    >(
        &self,
        scores: &mut [[f32; 4]; TILES],
        block_max: [f32; 2],
        rescale: bool,
        stats: &mut [RowStats; 2],
        acc: &mut [[f32; 4]; O_TILES],
        kept: Option<u128>,
    ) -> [[u32; 4]; CHUNKS] {
        let mut fragments = [[0u32; 4]; CHUNKS];
        // One softmax either way (a second copy of it made the row-tile loops of FA2-TC too
        // large to unroll, and its arrays went to local memory); only the packing differs.
        self.softmax_rows(
            scores,
            block_max,
            rescale,
            stats,
            |h, alpha| scale_row(acc, h, alpha),
            |h, probabilities| match kept {
                Some(bits) => {
                    pack_kept_row::<T, TILES, CHUNKS>(probabilities, h, bits, &mut fragments)
                }
                None => pack_row::<T, TILES, CHUNKS>(probabilities, h, &mut fragments),
            },
        );
        fragments
    }

    /// [`ScoreBlock::online_softmax`] with Õ's rescale left to `on_rescale(h, α)` (called per
    /// row when `rescale`) and the packing of P̃ to `on_row(h, P̃)` (called per row once its P̃
    /// is final): a pipelined kernel records α, and leaves P̃ in f32, while the previous block's
    /// P̃·V still runs, then rescales Õ ([`scale_row`]) and packs P̃ ([`pack_row`]) once that
    /// product has landed.
    #[inline(always)]
    pub fn softmax_rows<const TILES: usize>(
        &self,
        scores: &mut [[f32; 4]; TILES],
        block_max: [f32; 2],
        rescale: bool,
        stats: &mut [RowStats; 2],
        mut on_rescale: impl FnMut(usize, f32),
        mut on_row: impl FnMut(usize, &[[f32; 4]; TILES]),
    ) {
        for h in 0..2 {
            if rescale {
                let (rescaled, alpha) = fa2_rescale(stats[h], block_max[h], arch::exp2);
                stats[h] = rescaled;
                on_rescale(h, alpha);
            }
            let base = RowStats::exp_base(stats[h].max);
            for (t, tile) in scores.iter_mut().enumerate() {
                for value in &mut tile[2 * h..2 * h + 2] {
                    // e^(scale·s − m) = 2^(s·scale·log2 e − m′): one FMA and one ex2.
                    let x = arch::fma(*value, self.score_scale, -base);
                    *value = if self.exp2_split.on_fma(t) {
                        exp2_polynomial(x, arch::fma)
                    } else {
                        arch::exp2(x)
                    };
                }
            }
            stats[h].sum += row_reduce(scores, h, |a, b| a + b);
            on_row(h, scores);
        }
    }
}

/// −∞ at each element whose column within the block (`tile`·8 + its place in the lane's pair)
/// and row (`h`, of the lane's two) `hidden` picks.
#[inline(always)]
fn mask_columns<const TILES: usize>(
    scores: &mut [[f32; 4]; TILES],
    hidden: impl Fn(i32, usize) -> bool,
) {
    for (tile, values) in scores.iter_mut().enumerate() {
        for (e, value) in values.iter_mut().enumerate() {
            let col = (tile as u32 * MMA_N + e as u32 % 2) as i32;
            if hidden(col, e / 2) {
                *value = f32::NEG_INFINITY;
            }
        }
    }
}

/// P̃'s row `h` packed to 16 bits into the A fragments of P̃·V: keys 16c..16c+8 give registers
/// 0 (row l/4) and 1 (row l/4 + 8) of chunk c, keys 16c+8..16c+16 registers 2 and 3.
#[inline(always)]
pub fn pack_row<T: TensorCoreElement, const TILES: usize, const CHUNKS: usize>(
    probabilities: &[[f32; 4]; TILES],
    h: usize,
    fragments: &mut [[u32; 4]; CHUNKS],
) {
    for (tile, values) in probabilities.iter().enumerate() {
        fragments[tile / 2][tile % 2 * 2 + h] = T::pack2(values[2 * h], values[2 * h + 1]);
    }
}

/// Dropout on one warp's P̃: the probabilities whose bit in `kept` ([`forward_keep_bits`]) is 0
/// become 0, after ℓ took them (ℓ normalizes the softmax before dropout) and before P̃·V. The
/// 1 / (1 − p) of the kept ones is applied to O at the end ([`scale_rows`]).
#[inline(always)]
pub fn drop_probabilities<const TILES: usize>(probabilities: &mut [[f32; 4]; TILES], kept: u128) {
    for (t, values) in probabilities.iter_mut().enumerate() {
        for (e, value) in values.iter_mut().enumerate() {
            if kept >> (4 * t + e) & 1 == 0 {
                *value = 0.0;
            }
        }
    }
}

/// Which of one warp's scores dropout keeps in the forward's layout (16 rows from sequence row
/// `first_row`, the block's keys from `key_start`, both multiples of 16), bit 4·tile + element
/// (`common::dropout`): lane l's scores of a pair of key tiles are draw l of their 16 × 16 tile,
/// all eight its own. `None` without dropout. The kernels compute it while the block's S runs
/// on the tensor cores, before the arrays of the softmax are live. The draws' loop may stay
/// rolled (each step is a Philox call): it indexes no array by its counter, only shifts its
/// eight bits into place.
#[inline(always)]
pub fn forward_keep_bits<const TILES: usize>(
    dropout: &Dropout,
    first_row: u32,
    key_start: u32,
) -> Option<u128> {
    if !dropout.is_on() {
        return None;
    }
    const { assert!(TILES.is_multiple_of(2) && TILES * 4 <= 128) };
    let lane = arch::lane_idx();
    let mut bits = 0u128;
    for pair in 0..TILES / 2 {
        let words = dropout.draw(first_row / 16, key_start / 16 + pair as u32, lane);
        let mut pair_bits = 0u32;
        for tile in 0..2 {
            for e in 0..4 {
                // Element e: row +8·(e/2) (the word pair), key +e%2 (the half); the tile's
                // place in its pair picks the word within the pair.
                if dropout.keeps(words[2 * (e / 2) + tile], e as u32 % 2) {
                    pair_bits |= 1 << (4 * tile + e);
                }
            }
        }
        bits |= (pair_bits as u128) << (8 * pair);
    }
    Some(bits)
}

/// Both of the lane's rows of Õ times `factor` (dropout's 1 / (1 − p) before O is stored).
#[inline(always)]
pub fn scale_rows<const O_TILES: usize>(acc: &mut [[f32; 4]; O_TILES], factor: f32) {
    scale_row(acc, 0, factor);
    scale_row(acc, 1, factor);
}

/// [`pack_row`] with dropout: the probabilities whose bit in `kept` ([`forward_keep_bits`]) is 0
/// packed as 0.
#[inline(always)]
pub fn pack_kept_row<T: TensorCoreElement, const TILES: usize, const CHUNKS: usize>(
    probabilities: &[[f32; 4]; TILES],
    h: usize,
    kept: u128,
    fragments: &mut [[u32; 4]; CHUNKS],
) {
    for (tile, values) in probabilities.iter().enumerate() {
        let kept_value = |e: usize| {
            if kept >> (4 * tile + e) & 1 != 0 {
                values[e]
            } else {
                0.0
            }
        };
        fragments[tile / 2][tile % 2 * 2 + h] = T::pack2(kept_value(2 * h), kept_value(2 * h + 1));
    }
}

/// Õ's row `h` (of the lane's two) times α: Õ = diag(α)·Õ.
#[inline(always)]
pub fn scale_row<const O_TILES: usize>(acc: &mut [[f32; 4]; O_TILES], h: usize, alpha: f32) {
    for tile in acc.iter_mut() {
        tile[2 * h] *= alpha;
        tile[2 * h + 1] *= alpha;
    }
}

/// Reduces by `op` the lane's values of its row `h`: elements 2h and 2h + 1 of each tile, each
/// tile's pair first, then the tiles as a balanced tree.
#[inline(always)]
pub fn row_reduce<const TILES: usize>(
    scores: &[[f32; 4]; TILES],
    h: usize,
    op: impl Fn(f32, f32) -> f32 + Copy,
) -> f32 {
    let mut per_tile = [0.0; TILES];
    for (value, tile) in per_tile.iter_mut().zip(scores) {
        *value = op(tile[2 * h], tile[2 * h + 1]);
    }
    pairwise(per_tile, op)
}

/// O = diag(ℓ)⁻¹·Õ in the input dtype (two elements per 4-byte store) and L = m + log ℓ, for the
/// warp's 16 rows starting at row `first_row` of the sequence: rows past `o`'s end and columns
/// from `cols` on are not stored. `stats` hold each lane's partial ℓ; the quad completes them.
#[inline(always)]
pub fn store_rows<T: TensorCoreElement, const O_TILES: usize>(
    o: &HeadRows16,
    logsumexp: &HeadVector,
    first_row: u32,
    seqlen_q: u32,
    cols: u32,
    stats: &[RowStats; 2],
    acc: &[[f32; 4]; O_TILES],
) {
    finish_rows::<T, O_TILES>(
        logsumexp,
        first_row,
        seqlen_q,
        stats,
        acc,
        |row, col, packed| {
            if col < cols {
                o.store_pair(row, col, packed);
            }
        },
    );
}

/// The lane's part of O = diag(ℓ)⁻¹·Õ in the input dtype, two elements at a time, for the warp's
/// 16 rows starting at sequence row `first_row`: `store(row, col, packed)` for every pair of the
/// lane's rows before seqlen_q (every column of the accumulator: the caller drops those from d
/// on), and L = m + log ℓ for those rows. `stats` hold each lane's partial ℓ; the quad completes
/// them.
#[inline(always)]
pub fn finish_rows<T: TensorCoreElement, const O_TILES: usize>(
    logsumexp: &HeadVector,
    first_row: u32,
    seqlen_q: u32,
    stats: &[RowStats; 2],
    acc: &[[f32; 4]; O_TILES],
    mut store: impl FnMut(u32, u32, u32),
) {
    let lane = arch::lane_idx();
    for h in 0..2 {
        // Complete ℓ: each lane summed its own columns; the quad adds the four partial sums.
        let mut sum = stats[h].sum;
        sum += arch::shuffle_xor(sum, 1);
        sum += arch::shuffle_xor(sum, 2);
        let row_stats = RowStats {
            max: stats[h].max,
            sum,
        };
        let row = first_row + accumulator_row(lane) + h as u32 * LDMATRIX_SIDE;
        if row >= seqlen_q {
            continue;
        }
        let inverse_sum = row_stats.inverse_sum();
        for (tile, values) in acc.iter().enumerate() {
            let col = tile as u32 * MMA_N + accumulator_col(lane);
            let packed = T::pack2(values[2 * h] * inverse_sum, values[2 * h + 1] * inverse_sum);
            store(row, col, packed);
        }
        if lane.is_multiple_of(4) {
            logsumexp.write(row, row_stats.logsumexp(arch::log2));
        }
    }
}

/// Calls `store(row, col, packed)` for each 4-byte register of A fragments packed by
/// [`pack_row`] (a warp's 16 rows × 16·CHUNKS columns, two 16-bit elements per register): row and
/// col are within the warp's tile, col even. Register r of chunk c: row +8 for odd r, columns
/// 16c (+8 for r ≥ 2).
#[inline(always)]
pub fn for_each_fragment_pair<const CHUNKS: usize>(
    fragments: &[[u32; 4]; CHUNKS],
    mut store: impl FnMut(u32, u32, u32),
) {
    let lane = arch::lane_idx();
    for (chunk, fragment) in fragments.iter().enumerate() {
        for (register, packed) in fragment.iter().enumerate() {
            let row = accumulator_row(lane) + register as u32 % 2 * LDMATRIX_SIDE;
            let col = chunk as u32 * 16 + register as u32 / 2 * MMA_N + accumulator_col(lane);
            store(row, col, *packed);
        }
    }
}

/// Stores `scale`·`acc` (a warp's 16 key rows of dK_j or dV_j, from sequence key `first_key`,
/// columns from `first_col`) into `dst` in the input dtype: keys from `seqlen_k` on and columns
/// from `head_dim` on are dropped.
#[inline(always)]
pub fn store_key_rows<T: TensorCoreElement, const TILES: usize>(
    dst: &HeadRows16,
    acc: &[[f32; 4]; TILES],
    first_key: u32,
    seqlen_k: u32,
    first_col: u32,
    head_dim: u32,
    scale: f32,
) {
    let lane = arch::lane_idx();
    let key = first_key + accumulator_row(lane);
    for h in 0..2 {
        let key = key + h as u32 * LDMATRIX_SIDE;
        if key >= seqlen_k {
            continue;
        }
        for (t, values) in acc.iter().enumerate() {
            let col = first_col + t as u32 * MMA_N + accumulator_col(lane);
            if col < head_dim {
                let packed = T::pack2(scale * values[2 * h], scale * values[2 * h + 1]);
                dst.store_pair(key, col, packed);
            }
        }
    }
}
