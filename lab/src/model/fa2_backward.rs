//! The FA2 backward emulator: FA2's backward pass on the CPU with every HBM access counted.
//!
//! The backward pass keeps only L = m + log ℓ from the forward, not P, and recomputes each block
//! of P it needs as P = exp(S − L) (the article's L equation, `000_…`). Three passes, as
//! FlashAttention-2 runs them:
//!
//! 1. pre-pass, per row block: D_i = rowsum(dO_i ∘ O_i), and the f32 dQ accumulator set to 0;
//! 2. main loop, one thread block per (key block j, batch, head): K_j, V_j loaded once, dK_j and
//!    dV_j accumulated on chip; for each row block i the causal mask does not hide from it
//!    (`AttentionMask::first_row_block_needed`): load Q_i, dO_i, L_i, D_i;
//!    S = Q_i·K_jᵀ, P = exp(S − L_i), dV_j += Pᵀ·dO_i, dP = dO_i·V_jᵀ, dS = P ∘ (dP − D_i),
//!    dK_j += dSᵀ·Q_i, and dQ_i += dS·K_j into the accumulator in HBM (read and written per
//!    visit; atomic adds on the GPU, since every key block adds to every dQ_i);
//!    then dK_j = scale·dK_j and dV_j written once;
//! 3. post-pass, per row block: dQ = scale·(the accumulator), in the input dtype.
//!
//! The scale multiplies dK_j and dQ once at the end instead of every dS block: the same value
//! up to rounding, with a multiply per output element instead of one per (i, j) visit.
//!
//! Grouped K/V heads (GQA/MQA), as the GPU runs them: each query head's block reads its K/V
//! head (h / group) and writes its dK_j, dV_j, rounded to the input dtype, into an expanded
//! (batch, heads_q, seqlen_k, d) workspace; a last pass (the group sum) adds each K/V head's
//! group of them in f32, in the order of the query heads, and rounds the sums. Its traffic is
//! counted under dK and dV: the workspace written and read once, the sums written.
//!
//! [`backward_on_host`] runs it on host tensors of any element type, behind the library's
//! argument checks ([`BackwardProblem::new`]).

use std::ops::Range;

use flash_kernels::common::softmax::recomputation_base;
use ndarray::{
    Array1, Array2, Array3, Array4, ArrayView1, ArrayView2, ArrayView3, ArrayView4, ArrayViewMut1,
    ArrayViewMut2, s,
};

use flash_attn::attention::backward::{BackwardArguments, BackwardProblem, Gradients, TensorSpec};
use flash_attn::attention::{AttentionOptions, Problem};
use flash_attn::dtype::{DType, Element};
use flash_attn::error::{Error, Result};

use crate::model::emulation::{
    HeadInputs, KeyTile, dot, existing_rows, exponentiate, for_each_head, read_rows, round_to,
    write_rows,
};
use crate::model::traffic::{BackwardIoCounts, TensorIo};

/// What the backward pass reads: the forward's inputs Q, K, V, its outputs O and L, and dO; all
/// but L (always f32) of element type `T` (the emulator's arithmetic is f32).
#[derive(Clone, Copy)]
pub struct BackwardInputs<'a, T = f32> {
    /// (batch, heads, seqlen_q, head_dim).
    pub q: ArrayView4<'a, T>,
    /// (batch, heads, seqlen_k, head_dim).
    pub k: ArrayView4<'a, T>,
    /// K's shape.
    pub v: ArrayView4<'a, T>,
    /// Q's shape, as the forward stored it.
    pub o: ArrayView4<'a, T>,
    /// dO, O's shape.
    pub d_o: ArrayView4<'a, T>,
    /// L, (batch, heads, seqlen_q) in natural-log units; −∞ for rows with no visible key.
    pub logsumexp: ArrayView3<'a, f32>,
}

/// What the emulator returns: the gradients (rounded to the input dtype, as the kernel stores
/// them), the pre-pass's D, and the HBM traffic.
pub struct EmulatedBackward {
    pub gradients: Gradients<Array4<f32>>,
    /// D = rowsum(dO ∘ O), (batch, heads, seqlen_q), in f32.
    pub delta: Array3<f32>,
    pub io: BackwardIoCounts,
}

/// FA2's backward pass on the CPU (see the module documentation), with every HBM access counted.
///
/// `blocks` is (B_r, B_c), as for [`emulate_fa2`](crate::model::fa2::emulate_fa2): B_r rows per
/// row block of the inner loop, B_c keys per key block of the outer loop, any sizes ≥ 1.
/// Assumes shapes the host has checked ([`BackwardProblem`]):
/// Q and dO and O (batch, heads, seqlen_q, d), K and V (batch, heads_kv, seqlen_k, d) with
/// heads_kv a divisor of heads (grouped K/V heads: see the module documentation), L
/// (batch, heads, seqlen_q). Panics otherwise.
pub fn emulate_fa2_backward(
    inputs: BackwardInputs,
    causal: bool,
    scale: f32,
    blocks: (u32, u32),
    dtype: DType,
) -> EmulatedBackward {
    let BackwardInputs { q, k, v, .. } = inputs;
    let (batch, heads, seqlen_q, head_dim) = q.dim();
    let (heads_kv, seqlen_k) = (k.dim().1, k.dim().2);
    // NaN, like the poison the GPU tests write: an element the emulator forgot stays NaN.
    let unwritten = |dims| Array4::from_elem(dims, f32::NAN);
    // dK and dV as the main loop stores them: one head per query head (K's shape when
    // ungrouped, the expanded workspace when grouped).
    let per_query_head = ndarray::Dim([batch, heads, seqlen_k, head_dim]);
    let mut gradients = Gradients {
        dq: unwritten(q.raw_dim()),
        dk: unwritten(per_query_head),
        dv: unwritten(per_query_head),
    };
    let mut delta = Array3::from_elem((batch, heads, seqlen_q), f32::NAN);
    let mut io = BackwardIoCounts::new(dtype);
    let (block_rows, block_cols) = (blocks.0 as usize, blocks.1 as usize);
    for_each_head(q, k, v, causal, scale, |b, h, head| {
        let saved = SavedHead {
            o: inputs.o.slice(s![b, h, .., ..]),
            d_o: inputs.d_o.slice(s![b, h, .., ..]),
            logsumexp: inputs.logsumexp.slice(s![b, h, ..]),
        };
        let mut hbm = BackwardHbm {
            dq: gradients.dq.slice_mut(s![b, h, .., ..]),
            dk: gradients.dk.slice_mut(s![b, h, .., ..]),
            dv: gradients.dv.slice_mut(s![b, h, .., ..]),
            delta: delta.slice_mut(s![b, h, ..]),
            dq_accumulator: Array2::from_elem((seqlen_q, head_dim), f32::NAN),
            output_dtype: dtype,
            scale,
        };
        let row_blocks = seqlen_q.div_ceil(block_rows);
        for row_block in 0..row_blocks {
            let rows = existing_rows(row_block, block_rows, seqlen_q);
            preprocess_row_block(&saved, rows, &mut hbm, &mut io);
        }
        // Thread blocks of the main loop's grid are independent but for their atomic adds to
        // dQ, whose order changes no count.
        for key_block in 0..head.seqlen_k().div_ceil(block_cols) {
            let mut block = KeyBlock::load(&head, &saved, key_block, block_cols, &mut io);
            let first_row_block = head.first_row_block_needed(key_block, block_rows, block_cols);
            for row_block in first_row_block..row_blocks {
                let rows = existing_rows(row_block, block_rows, seqlen_q);
                block.visit(rows, &mut hbm, &mut io);
            }
            block.write(&mut hbm, &mut io);
        }
        for row_block in 0..row_blocks {
            let rows = existing_rows(row_block, block_rows, seqlen_q);
            postprocess_row_block(rows, &mut hbm, &mut io);
        }
    });
    if heads_kv != heads {
        gradients.dk = group_sum(gradients.dk.view(), heads_kv, dtype, &mut io.dk);
        gradients.dv = group_sum(gradients.dv.view(), heads_kv, dtype, &mut io.dv);
    }
    EmulatedBackward {
        gradients,
        delta,
        io,
    }
}

/// FA2's backward pass on the CPU ([`emulate_fa2_backward`]) with (B_r, B_c) = `blocks`, after
/// the checks of [`BackwardProblem::new`] (`forward`: the problem the forward solved, if known).
/// Returns dQ, dK, dV in `T` and the HBM traffic the kernel would move.
pub fn backward_on_host<T: Element>(
    inputs: &BackwardInputs<T>,
    forward: Option<&Problem>,
    options: &AttentionOptions,
    blocks: (u32, u32),
) -> Result<(Gradients<Array4<T>>, BackwardIoCounts)> {
    let arguments = BackwardArguments {
        q: TensorSpec::of_array(&inputs.q),
        k: TensorSpec::of_array(&inputs.k),
        v: TensorSpec::of_array(&inputs.v),
        o: TensorSpec::of_array(&inputs.o),
        d_o: TensorSpec::of_array(&inputs.d_o),
        logsumexp: inputs.logsumexp.dim().into(),
        forward: forward.copied(),
    };
    let checked = BackwardProblem::new(&arguments, options)?;
    if blocks.0 == 0 || blocks.1 == 0 {
        return Err(Error::invalid(
            "blocks",
            format!("{blocks:?}"),
            "B_r and B_c must be at least 1",
        ));
    }
    let wide = |a: &ArrayView4<T>| a.mapv(|x| x.to_f64() as f32);
    let (q, k, v, o, d_o) = (
        wide(&inputs.q),
        wide(&inputs.k),
        wide(&inputs.v),
        wide(&inputs.o),
        wide(&inputs.d_o),
    );
    let emulated = emulate_fa2_backward(
        BackwardInputs {
            q: q.view(),
            k: k.view(),
            v: v.view(),
            o: o.view(),
            d_o: d_o.view(),
            logsumexp: inputs.logsumexp.view(),
        },
        checked.problem.causal,
        checked.problem.softmax_scale,
        blocks,
        checked.dtype,
    );
    // Exact: the emulator has already rounded every gradient to `T`.
    let narrow = |a: &Array4<f32>| a.mapv(|x| T::from_f64(f64::from(x)));
    let g = &emulated.gradients;
    Ok((
        Gradients {
            dq: narrow(&g.dq),
            dk: narrow(&g.dk),
            dv: narrow(&g.dv),
        },
        emulated.io,
    ))
}

/// The group sum (`bwd::group_sum`): K/V head k's gradient = Σ_m `expanded`\[b, k·group + m\],
/// added in f32 in the order of m and rounded to `dtype`; the expanded workspace read once and
/// the sums written, counted in `io`.
fn group_sum(
    expanded: ArrayView4<f32>,
    heads_kv: usize,
    dtype: DType,
    io: &mut TensorIo,
) -> Array4<f32> {
    let (batch, heads, seqlen_k, head_dim) = expanded.dim();
    let group = heads / heads_kv;
    let sums = Array4::from_shape_fn((batch, heads_kv, seqlen_k, head_dim), |(b, kv, j, x)| {
        let members = (0..group).map(|m| expanded[[b, kv * group + m, j, x]]);
        round_to(dtype, members.fold(0.0f32, |sum, term| sum + term))
    });
    io.elements.read += expanded.len() as u64;
    io.elements.written += sums.len() as u64;
    sums
}

/// The forward's O and L and the dO of one head.
struct SavedHead<'a> {
    o: ArrayView2<'a, f32>,
    d_o: ArrayView2<'a, f32>,
    logsumexp: ArrayView1<'a, f32>,
}

/// What the backward pass writes to HBM for one head: the gradients, D, and the f32 dQ
/// accumulator.
struct BackwardHbm<'a> {
    dq: ArrayViewMut2<'a, f32>,
    dk: ArrayViewMut2<'a, f32>,
    dv: ArrayViewMut2<'a, f32>,
    delta: ArrayViewMut1<'a, f32>,
    dq_accumulator: Array2<f32>,
    /// The gradients are stored in the input dtype.
    output_dtype: DType,
    /// The softmax scale, applied to dK and dQ once at the end.
    scale: f32,
}

/// Pre-pass for rows `rows`: D_i = rowsum(dO_i ∘ O_i) written once, the dQ accumulator zeroed.
fn preprocess_row_block(
    saved: &SavedHead,
    rows: Range<usize>,
    hbm: &mut BackwardHbm,
    io: &mut BackwardIoCounts,
) {
    let o_tile = read_rows(saved.o, rows.clone(), &mut io.o);
    let d_o_tile = read_rows(saved.d_o, rows.clone(), &mut io.d_o);
    let delta: Array1<f32> = o_tile
        .rows()
        .into_iter()
        .zip(d_o_tile.rows())
        .map(|(o, d_o)| dot(d_o, o))
        .collect();
    write_rows(
        hbm.delta.view_mut(),
        rows.start,
        delta.view(),
        &mut io.delta,
    );
    let zeros = Array2::zeros((rows.len(), hbm.dq_accumulator.ncols()));
    write_rows(
        hbm.dq_accumulator.view_mut(),
        rows.start,
        zeros.view(),
        &mut io.dq_accumulator,
    );
}

/// Post-pass for rows `rows`: dQ = scale·(the accumulator), rounded to the input dtype.
fn postprocess_row_block(rows: Range<usize>, hbm: &mut BackwardHbm, io: &mut BackwardIoCounts) {
    let (dtype, scale) = (hbm.output_dtype, hbm.scale);
    let accumulated = read_rows(
        hbm.dq_accumulator.view(),
        rows.clone(),
        &mut io.dq_accumulator,
    );
    let dq = accumulated.mapv(|x| round_to(dtype, scale * x));
    write_rows(hbm.dq.view_mut(), rows.start, dq.view(), &mut io.dq);
}

/// One thread block of the main loop: K_j and V_j on chip, with dK_j and dV_j accumulated over
/// the row blocks it visits.
struct KeyBlock<'h, 'a, 's> {
    head: &'h HeadInputs<'a>,
    saved: &'h SavedHead<'s>,
    tile: KeyTile<'a>,
    /// dSᵀ·Q summed over the visits, unscaled until [`KeyBlock::write`].
    dk: Array2<f32>,
    dv: Array2<f32>,
}

impl<'h, 'a, 's> KeyBlock<'h, 'a, 's> {
    /// Loads K_j and V_j once; dK_j = dV_j = 0.
    fn load(
        head: &'h HeadInputs<'a>,
        saved: &'h SavedHead<'s>,
        key_block: usize,
        block_cols: usize,
        io: &mut BackwardIoCounts,
    ) -> Self {
        let tile = KeyTile::load_counting(head, key_block, block_cols, &mut io.k, &mut io.v);
        let zeros = Array2::zeros((tile.keys().len(), head.q.ncols()));
        Self {
            head,
            saved,
            tile,
            dk: zeros.clone(),
            dv: zeros,
        }
    }

    /// One visit of row block `rows`: Q_i, dO_i, L_i, D_i and the accumulator's dQ_i loaded, P
    /// recomputed, dV_j, dK_j updated on chip and dQ_i written back.
    fn visit(&mut self, rows: Range<usize>, hbm: &mut BackwardHbm, io: &mut BackwardIoCounts) {
        let q_tile = read_rows(self.head.q, rows.clone(), &mut io.q);
        let d_o_tile = read_rows(self.saved.d_o, rows.clone(), &mut io.d_o);
        let logsumexp = read_rows(self.saved.logsumexp, rows.clone(), &mut io.logsumexp);
        let delta = read_rows(hbm.delta.view(), rows.clone(), &mut io.delta);
        let accumulated = read_rows(
            hbm.dq_accumulator.view(),
            rows.clone(),
            &mut io.dq_accumulator,
        );
        let mut dq_tile = accumulated.to_owned();
        for (r, query) in rows.clone().enumerate() {
            let (q_row, d_o_row) = (q_tile.row(r), d_o_tile.row(r));
            // S = Q_i·K_jᵀ in log2 units (−∞ where masked), then P = exp(S − L_i) in place.
            let mut probabilities = self.tile.scores(self.head, query, q_row);
            exponentiate(&mut probabilities, recomputation_base(logsumexp[r]));
            // dV_j += Pᵀ·dO_i.
            accumulate_outer(&mut self.dv, &probabilities, d_o_row);
            // dP = dO_i·V_jᵀ; dS = P ∘ (dP − D_i).
            let d_scores: Vec<f32> = probabilities
                .iter()
                .zip(self.tile.dot_values(d_o_row))
                .map(|(p, d_p)| p * (d_p - delta[r]))
                .collect();
            // dK_j += dSᵀ·Q_i and dQ_i += dS·K_j, both unscaled until the end.
            accumulate_outer(&mut self.dk, &d_scores, q_row);
            self.tile.accumulate_ds_k(&d_scores, dq_tile.row_mut(r));
        }
        write_rows(
            hbm.dq_accumulator.view_mut(),
            rows.start,
            dq_tile.view(),
            &mut io.dq_accumulator,
        );
    }

    /// dK_j = scale·dK_j and dV_j, rounded to the input dtype, each written once.
    fn write(self, hbm: &mut BackwardHbm, io: &mut BackwardIoCounts) {
        let (dtype, scale) = (hbm.output_dtype, hbm.scale);
        let dk = self.dk.mapv(|x| round_to(dtype, scale * x));
        let dv = self.dv.mapv(|x| round_to(dtype, x));
        let first_key = self.tile.keys().start;
        write_rows(hbm.dk.view_mut(), first_key, dk.view(), &mut io.dk);
        write_rows(hbm.dv.view_mut(), first_key, dv.view(), &mut io.dv);
    }
}

/// `tile += weightsᵀ·row` for one row of the inner block: row c of the tile gains weights[c]·row
/// (dV_j += Pᵀ·dO_i and dK_j += dSᵀ·Q_i, one query row at a time).
fn accumulate_outer(tile: &mut Array2<f32>, weights: &[f32], row: ArrayView1<f32>) {
    for (mut tile_row, &w) in tile.rows_mut().into_iter().zip(weights) {
        tile_row.scaled_add(w, &row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: [usize; 4] = [2, 3, 5, 8];
    const KV: [usize; 4] = [2, 3, 7, 8];

    #[test]
    fn the_host_entry_point_checks_before_it_runs() {
        let q = Array4::<f32>::zeros(Q);
        let kv = Array4::<f32>::zeros(KV);
        let logsumexp = ndarray::Array3::<f32>::zeros((2, 3, 5));
        let short_d_o = Array4::<f32>::zeros([2, 3, 4, 8]);
        let inputs = BackwardInputs {
            q: q.view(),
            k: kv.view(),
            v: kv.view(),
            o: q.view(),
            d_o: short_d_o.view(),
            logsumexp: logsumexp.view(),
        };
        let options = AttentionOptions::default();
        let error = backward_on_host(&inputs, None, &options, (4, 4)).unwrap_err();
        assert!(
            matches!(error, Error::InvalidArgument { name: "d_o", .. }),
            "{error}"
        );
        let inputs = BackwardInputs {
            d_o: q.view(),
            ..inputs
        };
        let error = backward_on_host(&inputs, None, &options, (0, 4)).unwrap_err();
        assert!(
            matches!(error, Error::InvalidArgument { name: "blocks", .. }),
            "{error}"
        );
        // A transposed view: head_dim no longer contiguous.
        let transposed = q.view().reversed_axes();
        let contiguous = Array4::<f32>::zeros([8, 5, 3, 2]);
        let logsumexp = ndarray::Array3::<f32>::zeros((8, 5, 3));
        let inputs = BackwardInputs {
            q: contiguous.view(),
            k: contiguous.view(),
            v: contiguous.view(),
            o: contiguous.view(),
            d_o: transposed,
            logsumexp: logsumexp.view(),
        };
        let error = backward_on_host(&inputs, None, &options, (4, 4)).unwrap_err();
        assert!(
            matches!(error, Error::InvalidArgument { name: "d_o", .. }),
            "{error}"
        );
    }
}
