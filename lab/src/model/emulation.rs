//! What the emulators share: one head's inputs as a kernel block sees it, loads and stores that
//! count their HBM traffic, and a K/V tile on chip with the score, P·V, dO·Vᵀ and dS·K steps.

use std::ops::Range;

use flash_kernels::common::mask::AttentionMask;
use flash_kernels::common::softmax::LOG2_E;
use ndarray::{
    ArrayView, ArrayView1, ArrayView2, ArrayView4, ArrayViewMut, ArrayViewMut1, Axis, Dimension,
    Slice, s,
};

use half::{bf16, f16};

use flash_attn::dtype::DType;
use flash_attn::scoring::Scoring;

use crate::model::traffic::{IoCounts, TensorIo};

/// One (batch, head) of the inputs, as one kernel block sees it.
#[derive(Clone, Copy)]
pub(super) struct HeadInputs<'a> {
    pub(super) q: ArrayView2<'a, f32>,
    k: ArrayView2<'a, f32>,
    v: ArrayView2<'a, f32>,
    mask: AttentionMask,
    /// scale·log2 e: the kernels fold log2 e into the scale so that each e^x is one exp2.
    score_scale: f32,
    /// Soft-capping as the kernels run it (`ScoreBlock::apply_softcap`): `Some((scale / softcap,
    /// softcap·log2 e))`, the multiplier inside the tanh and the one after it.
    softcap: Option<(f32, f32)>,
}

impl HeadInputs<'_> {
    pub(super) fn seqlen_q(&self) -> usize {
        self.q.nrows()
    }

    pub(super) fn seqlen_k(&self) -> usize {
        self.k.nrows()
    }

    /// K/V blocks that row block `row_block` needs. Called, as both kernels call it, with the
    /// block's unclipped end (row_start + B_r), even for a tail block.
    pub(super) fn key_blocks_needed(
        &self,
        row_block: usize,
        block_rows: usize,
        block_cols: usize,
    ) -> usize {
        let row_end = (row_block + 1) * block_rows;
        self.mask
            .key_blocks_needed(row_end as u32, self.seqlen_k() as u32, block_cols as u32)
            as usize
    }

    /// The K/V blocks row block `row_block` visits, as `KeyBlocks` gives them to the kernels:
    /// from the first the window reaches to the last, with the block's unclipped end.
    pub(super) fn key_blocks(
        &self,
        row_block: usize,
        block_rows: usize,
        block_cols: usize,
    ) -> Range<usize> {
        let row_start = (row_block * block_rows) as u32;
        let first =
            self.mask
                .first_key_block_needed(row_start, self.seqlen_k() as u32, block_cols as u32)
                as usize;
        first
            ..self
                .key_blocks_needed(row_block, block_rows, block_cols)
                .max(first)
    }

    /// The first row block that key block `key_block` needs (FA2's backward skips the earlier
    /// ones, which are fully masked for it).
    pub(super) fn first_row_block_needed(
        &self,
        key_block: usize,
        block_rows: usize,
        block_cols: usize,
    ) -> usize {
        let key_start = key_block * block_cols;
        self.mask
            .first_row_block_needed(key_start as u32, block_rows as u32) as usize
    }
}

/// Runs `f(batch, head, inputs)` for every (batch, query head): the grid dimension every kernel
/// shares.
pub(super) fn for_each_head(
    q: ArrayView4<f32>,
    k: ArrayView4<f32>,
    v: ArrayView4<f32>,
    scoring: impl Into<Scoring>,
    scale: f32,
    mut f: impl FnMut(usize, usize, HeadInputs<'_>),
) {
    let scoring = scoring.into();
    let (batch, heads, seqlen_q, _) = q.dim();
    let seqlen_k = k.dim().2;
    // Grouped K/V heads (GQA): query head h reads K/V head h / group, as `BlockInfo` maps it.
    let group = heads / k.dim().1.max(1);
    let mask = scoring.mask(seqlen_q, seqlen_k);
    let softcap = (scoring.softcap > 0.0).then(|| {
        let softcap = scoring.softcap as f32;
        (scale / softcap, softcap * LOG2_E)
    });
    for b in 0..batch {
        for h in 0..heads {
            let head = HeadInputs {
                q: q.slice(s![b, h, .., ..]),
                k: k.slice(s![b, h / group, .., ..]),
                v: v.slice(s![b, h / group, .., ..]),
                mask,
                score_scale: scale * LOG2_E,
                softcap,
            };
            f(b, h, head);
        }
    }
}

/// The rows `[block·block_len, (block + 1)·block_len)` that exist in a tensor of `len` rows.
pub(super) fn existing_rows(block: usize, block_len: usize, len: usize) -> Range<usize> {
    let start = block * block_len;
    start..(start + block_len).min(len)
}

/// Loads `rows` (which must exist) of an HBM tensor, counting one read per element.
pub(super) fn read_rows<'a, D: Dimension>(
    hbm: ArrayView<'a, f32, D>,
    rows: Range<usize>,
    io: &mut TensorIo,
) -> ArrayView<'a, f32, D> {
    let tile = hbm.slice_axis_move(Axis(0), Slice::from(rows));
    io.count_read(tile.len());
    tile
}

/// Stores `tile` into an HBM tensor from row `first_row` on, counting one write per element.
pub(super) fn write_rows<D: Dimension>(
    mut hbm: ArrayViewMut<f32, D>,
    first_row: usize,
    tile: ArrayView<f32, D>,
    io: &mut TensorIo,
) {
    let rows = first_row..first_row + tile.len_of(Axis(0));
    hbm.slice_axis_mut(Axis(0), Slice::from(rows)).assign(&tile);
    io.count_written(tile.len());
}

/// f32 → `dtype` → f32: what storing O in the input dtype does (round to nearest even).
pub(super) fn round_to(dtype: DType, value: f32) -> f32 {
    match dtype {
        DType::F32 => value,
        DType::F16 => f16::from_f32(value).to_f32(),
        DType::Bf16 => bf16::from_f32(value).to_f32(),
    }
}

/// K_j and V_j on chip, with the index of their first key.
pub(super) struct KeyTile<'a> {
    first_key: usize,
    keys: ArrayView2<'a, f32>,
    values: ArrayView2<'a, f32>,
}

impl<'a> KeyTile<'a> {
    /// Loads K_j and V_j (their existing rows) from HBM.
    pub(super) fn load(
        head: &HeadInputs<'a>,
        block: usize,
        block_cols: usize,
        io: &mut IoCounts,
    ) -> Self {
        Self::load_counting(head, block, block_cols, &mut io.k, &mut io.v)
    }

    /// [`KeyTile::load`], counting the reads of K and V in `k_io` and `v_io`.
    pub(super) fn load_counting(
        head: &HeadInputs<'a>,
        block: usize,
        block_cols: usize,
        k_io: &mut TensorIo,
        v_io: &mut TensorIo,
    ) -> Self {
        let keys = existing_rows(block, block_cols, head.seqlen_k());
        Self {
            first_key: keys.start,
            keys: read_rows(head.k, keys.clone(), k_io),
            values: read_rows(head.v, keys, v_io),
        }
    }

    /// The tile's keys, from the first.
    pub(super) fn keys(&self) -> Range<usize> {
        self.first_key..self.first_key + self.keys.nrows()
    }

    /// One row of S_ij in log2 units: scale·log2 e·(q·k) (soft-capped: softcap·log2 e·
    /// tanh(q·k·scale / softcap)) for visible keys, −∞ for masked ones. The dot product runs over
    /// d in order, from 0, as in the kernels.
    pub(super) fn scores(
        &self,
        head: &HeadInputs,
        query: usize,
        q_row: ArrayView1<f32>,
    ) -> Vec<f32> {
        self.keys
            .rows()
            .into_iter()
            .enumerate()
            .map(|(c, k_row)| {
                if head.mask.visible(query as u32, (self.first_key + c) as u32) {
                    let dot = dot(q_row, k_row);
                    match head.softcap {
                        Some((inside, outside)) => (dot * inside).tanh() * outside,
                        None => dot * head.score_scale,
                    }
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect()
    }

    /// `out += P̃·V_j` for one row, key by key in order, as both kernels accumulate it.
    pub(super) fn accumulate_pv(&self, probabilities: &[f32], out: ArrayViewMut1<f32>) {
        accumulate_weighted_rows(probabilities, self.values, out);
    }

    /// One row of dP_ij = dO_i·V_jᵀ: dO's row against every value row of the tile.
    pub(super) fn dot_values(&self, d_o_row: ArrayView1<f32>) -> Vec<f32> {
        self.values
            .rows()
            .into_iter()
            .map(|v_row| dot(d_o_row, v_row))
            .collect()
    }

    /// `out += dS·K_j` for one row, key by key in order.
    pub(super) fn accumulate_ds_k(&self, d_scores: &[f32], out: ArrayViewMut1<f32>) {
        accumulate_weighted_rows(d_scores, self.keys, out);
    }
}

/// a·b over d in order, from 0, as the kernels sum it.
pub(super) fn dot(a: ArrayView1<f32>, b: ArrayView1<f32>) -> f32 {
    a.iter().zip(b).fold(0.0f32, |acc, (a, b)| acc + a * b)
}

/// `out += Σ_c weights[c]·rows[c]`, row by row in order.
fn accumulate_weighted_rows(weights: &[f32], rows: ArrayView2<f32>, mut out: ArrayViewMut1<f32>) {
    for (&w, row) in weights.iter().zip(rows.rows()) {
        out.zip_mut_with(&row, |o, &x| *o += w * x);
    }
}

/// rowmax of a row of scores (−∞ when every key is masked).
pub(super) fn row_max(scores: &[f32]) -> f32 {
    scores.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// Replaces each score s by P̃ = 2^(s − base) and returns rowsum P̃.
pub(super) fn exponentiate(scores: &mut [f32], base: f32) -> f32 {
    scores.iter_mut().fold(0.0, |sum, s| {
        *s = (*s - base).exp2();
        sum + *s
    })
}
