//! The FA2 emulator: FA2's forward pass on the CPU with every HBM access counted.

use flash_kernels::common::softmax::{RowStats, fa2_rescale};
use ndarray::{Array1, Array2, Array3, Array4, ArrayView4, ArrayViewMut1, ArrayViewMut2, s};

use flash_attn::dtype::DType;
use flash_attn::scoring::Scoring;

use crate::model::emulation::{
    HeadInputs, KeyTile, existing_rows, exponentiate, for_each_head, read_rows, round_to, row_max,
    write_rows,
};
use crate::model::traffic::IoCounts;

/// FA2's forward pass on the CPU, as `kernels/src/fa2.rs` runs it, with every HBM access counted.
/// Returns O (rounded to `dtype`), L = m + ln ℓ (−∞ for rows with no visible key), and the traffic.
/// `scoring` (a `bool` for the causal mask or none) may add a sliding window and soft-capping,
/// which `fa2-tc` and `fa3` run with this loop (the scalar FA2 kernel refuses them).
///
/// Per (row block i, batch, head), the kernel's grid: read Q_i once; for each K/V block j the row
/// block needs (`KeyBlocks`: from the first the window reaches to the last): m^(j) = max(m^(j−1), rowmax S),
/// α = e^(m^(j−1) − m^(j)) (`fa2_rescale`), P̃ = e^(S − m^(j)), ℓ^(j) = α·ℓ^(j−1) + rowsum P̃,
/// Õ^(j) = α·Õ^(j−1) + P̃·V_j; then O_i = diag(ℓ)⁻¹·Õ_i and L_i = m_i + log ℓ_i, written once.
///
/// `blocks` is (B_r, B_c), as `attention::fa2_blocks` returns it. The kernel takes B_r, B_c ∈
/// {64, 128}; the emulator takes any block sizes ≥ 1.
/// Assumes valid shapes as [`emulate_fa1`](crate::model::fa1::emulate_fa1) does; panics otherwise.
pub fn emulate_fa2(
    q: ArrayView4<f32>,
    k: ArrayView4<f32>,
    v: ArrayView4<f32>,
    scoring: impl Into<Scoring>,
    scale: f32,
    blocks: (u32, u32),
    dtype: DType,
) -> (Array4<f32>, Array3<f32>, IoCounts) {
    let (batch, heads, seqlen_q, _) = q.dim();
    let mut o = Array4::from_elem(q.raw_dim(), f32::NAN);
    let mut logsumexp = Array3::from_elem((batch, heads, seqlen_q), f32::NAN);
    let mut io = IoCounts::new(dtype);
    let (block_rows, block_cols) = (blocks.0 as usize, blocks.1 as usize);
    for_each_head(q, k, v, scoring, scale, |b, h, head| {
        let mut out = Fa2Outputs {
            o: o.slice_mut(s![b, h, .., ..]),
            logsumexp: logsumexp.slice_mut(s![b, h, ..]),
            output_dtype: dtype,
        };
        // Thread blocks of the grid are independent; their order does not change any count.
        for row_block in 0..seqlen_q.div_ceil(block_rows) {
            emulate_fa2_row_block(head, row_block, block_rows, block_cols, &mut out, &mut io);
        }
    });
    (o, logsumexp, io)
}

/// FA2's outputs for one head.
struct Fa2Outputs<'a> {
    o: ArrayViewMut2<'a, f32>,
    logsumexp: ArrayViewMut1<'a, f32>,
    output_dtype: DType,
}

/// FA2's kernel body for one (row block, batch, head).
fn emulate_fa2_row_block(
    head: HeadInputs,
    row_block: usize,
    block_rows: usize,
    block_cols: usize,
    out: &mut Fa2Outputs,
    io: &mut IoCounts,
) {
    let rows = existing_rows(row_block, block_rows, head.seqlen_q());
    // Q_i, loaded once; m, ℓ and Õ_i live on chip for the whole loop.
    let q_tile = read_rows(head.q, rows.clone(), &mut io.q);
    let mut stats = vec![RowStats::EMPTY; rows.len()];
    let mut acc = Array2::<f32>::zeros(q_tile.raw_dim());
    for j in head.key_blocks(row_block, block_rows, block_cols) {
        let tile = KeyTile::load(&head, j, block_cols, io);
        for (r, query) in rows.clone().enumerate() {
            let mut probabilities = tile.scores(&head, query, q_tile.row(r));
            let (rescaled, alpha) = fa2_rescale(stats[r], row_max(&probabilities), f32::exp2);
            let block_sum = exponentiate(&mut probabilities, RowStats::exp_base(rescaled.max));
            stats[r] = RowStats {
                max: rescaled.max,
                sum: rescaled.sum + block_sum,
            };
            let mut acc_row = acc.row_mut(r);
            acc_row.mapv_inplace(|x| x * alpha);
            tile.accumulate_pv(&probabilities, acc_row);
        }
    }

    // O_i = diag(ℓ)⁻¹·Õ_i and L_i = m_i + log ℓ_i, each written once.
    let dtype = out.output_dtype;
    let mut o_tile = acc;
    for (mut o_row, row_stats) in o_tile.rows_mut().into_iter().zip(&stats) {
        let inverse_sum = row_stats.inverse_sum();
        o_row.mapv_inplace(|x| round_to(dtype, x * inverse_sum));
    }
    let logsumexp: Array1<f32> = stats.iter().map(|s| s.logsumexp(f32::log2)).collect();
    write_rows(out.o.view_mut(), rows.start, o_tile.view(), &mut io.o);
    write_rows(
        out.logsumexp.view_mut(),
        rows.start,
        logsumexp.view(),
        &mut io.logsumexp,
    );
}
