//! The FA1 emulator: FA1's forward pass on the CPU with every HBM access counted.

use std::ops::Range;

use flash_kernels::common::softmax::{LN_2, LOG2_E, RowStats, fa1_merge};
use flash_kernels::fwd::fa1::config::Fa1Blocks;
use ndarray::{Array1, Array2, Array3, Array4, ArrayView4, ArrayViewMut1, ArrayViewMut2, Zip, s};

use flash_attn::dtype::DType;

use crate::model::emulation::{
    HeadInputs, KeyTile, existing_rows, exponentiate, for_each_head, read_rows, round_to, row_max,
    write_rows,
};
use crate::model::traffic::IoCounts;

/// FA1's forward pass on the CPU, step for step as `kernels/src/fa1.rs` runs it, with every HBM
/// access counted. Returns O (rounded to `dtype`, as the kernel stores it), m (natural-log units),
/// ℓ, and the traffic.
///
/// Per (batch, head): line 2 sets the f32 O accumulator to 0, m to −∞ and ℓ to 0 in HBM (and the
/// final O to 0 for rows of row blocks that see no key, which no step will visit); then for each
/// K/V block j (loaded once), for each Q block i not fully masked
/// (`AttentionMask::key_blocks_needed`): read Q_i, O_i, m_i, ℓ_i; m̃ = rowmax(S_ij),
/// P̃ = e^(S_ij − m̃), ℓ̃ = rowsum(P̃); m_new = max(m_i, m̃), α = e^(m_i − m_new),
/// β = e^(m̃ − m_new), ℓ_new = α·ℓ_i + β·ℓ̃ (`fa1_merge`);
/// O_i ← diag(ℓ_new)⁻¹(diag(ℓ_i)·α·O_i + β·P̃·V_j), written to the accumulator, or to O on the
/// last step for the row block; m_i, ℓ_i written back.
///
/// Assumes what the host checks before a launch: Q is (batch, heads, seqlen_q, d), K and V are
/// (batch, heads, seqlen_k, d), every dimension and block size is at least 1, and lengths fit in
/// u32. Panics otherwise.
pub fn emulate_fa1(
    q: ArrayView4<f32>,
    k: ArrayView4<f32>,
    v: ArrayView4<f32>,
    causal: bool,
    scale: f32,
    blocks: Fa1Blocks,
    dtype: DType,
) -> (Array4<f32>, Array3<f32>, Array3<f32>, IoCounts) {
    let (batch, heads, seqlen_q, head_dim) = q.dim();
    // NaN, like the poison the GPU tests write: an element the emulator forgot stays NaN.
    let mut o = Array4::from_elem(q.raw_dim(), f32::NAN);
    let mut row_max = Array3::from_elem((batch, heads, seqlen_q), f32::NAN);
    let mut row_sum = Array3::from_elem((batch, heads, seqlen_q), f32::NAN);
    let mut io = IoCounts::new(dtype);
    for_each_head(q, k, v, causal, scale, |b, h, head| {
        let hbm = Fa1Hbm {
            o: o.slice_mut(s![b, h, .., ..]),
            o_accumulator: Array2::from_elem((seqlen_q, head_dim), f32::NAN),
            row_max: row_max.slice_mut(s![b, h, ..]),
            row_sum: row_sum.slice_mut(s![b, h, ..]),
            output_dtype: dtype,
        };
        emulate_fa1_head(head, blocks, hbm, &mut io);
    });
    (o, row_max, row_sum, io)
}

/// What FA1 keeps in HBM for one head: the final O, the f32 O accumulator, m and ℓ.
struct Fa1Hbm<'a> {
    o: ArrayViewMut2<'a, f32>,
    o_accumulator: Array2<f32>,
    row_max: ArrayViewMut1<'a, f32>,
    row_sum: ArrayViewMut1<'a, f32>,
    /// O is stored in the input dtype.
    output_dtype: DType,
}

/// FA1's kernel body for one (batch, head): initialisation, then outer loop j, inner loop i.
fn emulate_fa1_head(head: HeadInputs, blocks: Fa1Blocks, mut hbm: Fa1Hbm, io: &mut IoCounts) {
    let (seqlen_q, head_dim) = head.q.dim();
    let (block_rows, block_cols) = (blocks.block_rows as usize, blocks.block_cols as usize);
    let row_blocks = seqlen_q.div_ceil(block_rows); // T_r
    let col_blocks = head.seqlen_k().div_ceil(block_cols); // T_c

    // Line 2: O = 0, ℓ = 0, m = −∞ in HBM; and the final O = 0 for rows no step will write.
    let zeros = Array2::zeros((seqlen_q, head_dim));
    write_rows(
        hbm.o_accumulator.view_mut(),
        0,
        zeros.view(),
        &mut io.o_accumulator,
    );
    let minus_infinity = Array1::from_elem(seqlen_q, f32::NEG_INFINITY);
    write_rows(
        hbm.row_max.view_mut(),
        0,
        minus_infinity.view(),
        &mut io.row_max,
    );
    let zero_sums = Array1::zeros(seqlen_q);
    write_rows(hbm.row_sum.view_mut(), 0, zero_sums.view(), &mut io.row_sum);
    for i in 0..row_blocks {
        if head.key_blocks_needed(i, block_rows, block_cols) == 0 {
            let rows = existing_rows(i, block_rows, seqlen_q);
            let zero_rows = zeros.slice(s![rows.clone(), ..]);
            write_rows(hbm.o.view_mut(), rows.start, zero_rows, &mut io.o);
        }
    }

    // Line 5: for 1 ≤ j ≤ T_c; line 6: load K_j, V_j.
    for j in 0..col_blocks {
        let tile = KeyTile::load(&head, j, block_cols, io);
        // Line 7: for 1 ≤ i ≤ T_r, skipping blocks the causal mask hides entirely.
        for i in 0..row_blocks {
            let key_blocks = head
                .key_blocks_needed(i, block_rows, block_cols)
                .min(col_blocks);
            if j >= key_blocks {
                continue;
            }
            let rows = existing_rows(i, block_rows, seqlen_q);
            fa1_update_row_block(&head, &tile, rows, j + 1 == key_blocks, &mut hbm, io);
        }
    }
}

/// Lines 8–13 of FA1 for one (i, j), as `fa1::update_row_block` does them.
fn fa1_update_row_block(
    head: &HeadInputs,
    tile: &KeyTile,
    rows: Range<usize>,
    last_step: bool,
    hbm: &mut Fa1Hbm,
    io: &mut IoCounts,
) {
    // Line 8: load Q_i, O_i, ℓ_i, m_i (every step, the first included: line 2 put them in HBM).
    let q_tile = read_rows(head.q, rows.clone(), &mut io.q);
    let o_tile = read_rows(
        hbm.o_accumulator.view(),
        rows.clone(),
        &mut io.o_accumulator,
    );
    let stored_max = read_rows(hbm.row_max.view(), rows.clone(), &mut io.row_max);
    let stored_sum = read_rows(hbm.row_sum.view(), rows.clone(), &mut io.row_sum);

    let mut new_o = Array2::zeros(o_tile.raw_dim());
    let mut new_max = Array1::zeros(rows.len());
    let mut new_sum = Array1::zeros(rows.len());
    for (r, query) in rows.clone().enumerate() {
        // The kernel keeps m in log2 units on chip and natural-log units in HBM.
        let stored = RowStats {
            max: stored_max[r] * LOG2_E,
            sum: stored_sum[r],
        };
        // Lines 9–10: S_ij, m̃_ij, P̃_ij, ℓ̃_ij.
        let mut probabilities = tile.scores(head, query, q_tile.row(r));
        let block_max = row_max(&probabilities);
        let block_sum = exponentiate(&mut probabilities, RowStats::exp_base(block_max));
        // Line 11: m_new, ℓ_new, α, β.
        let block = RowStats {
            max: block_max,
            sum: block_sum,
        };
        let merge = fa1_merge(stored, block, f32::exp2);
        let inverse_new_sum = merge.merged.inverse_sum();
        let old_weight = stored.sum * merge.alpha * inverse_new_sum;
        let new_weight = merge.beta * inverse_new_sum;
        // Line 12: O_i ← diag(ℓ_new)⁻¹(diag(ℓ_i)·α·O_i + β·P̃_ij·V_j).
        let mut pv = Array1::zeros(o_tile.ncols());
        tile.accumulate_pv(&probabilities, pv.view_mut());
        Zip::from(new_o.row_mut(r))
            .and(o_tile.row(r))
            .and(&pv)
            .for_each(|o, &old, &pv| *o = old_weight * old + new_weight * pv);
        new_max[r] = merge.merged.max * LN_2;
        new_sum[r] = merge.merged.sum;
    }

    // Line 13: write ℓ_i, m_i; line 12's O_i goes to the accumulator, or to O on the last step.
    write_rows(
        hbm.row_max.view_mut(),
        rows.start,
        new_max.view(),
        &mut io.row_max,
    );
    write_rows(
        hbm.row_sum.view_mut(),
        rows.start,
        new_sum.view(),
        &mut io.row_sum,
    );
    if last_step {
        let dtype = hbm.output_dtype;
        let rounded = new_o.mapv(|x| round_to(dtype, x));
        write_rows(hbm.o.view_mut(), rows.start, rounded.view(), &mut io.o);
    } else {
        write_rows(
            hbm.o_accumulator.view_mut(),
            rows.start,
            new_o.view(),
            &mut io.o_accumulator,
        );
    }
}
