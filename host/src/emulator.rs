//! CPU emulators of the FA1 and FA2 kernels that count every HBM read and write, and the article's
//! HBM-traffic formulas they are checked against.
//!
//! The article (`000_…`, its FA1/FA2 comparison table) counts the HBM traffic per head, "roughly,
//! leaving out terms of size N such as the statistics", with T_c = ⌈N_k/B_c⌉ and T_r = ⌈N_q/B_r⌉:
//!
//! - FA1 ≈ 2Nd (K, V read once) + T_c·Nd (Q read T_c times) + 2·T_c·Nd (O_i read T_c times and
//!   written T_c times): the outer loop walks K/V, so every Q_i and O_i makes a round trip per
//!   outer step.
//! - FA2 ≈ Nd (Q read once) + 2·T_r·Nd (K, V read T_r times) + Nd (O read 0 times, written once):
//!   the outer loop walks Q, so Q_i and Õ_i stay on chip and K/V are re-read per row block.
//!
//! The emulators run the kernels' tiling, loop order, causal block skipping and update equations
//! (the shared [`flash_kernels::softmax`] and [`flash_kernels::mask`] code, with `f32::exp2` for
//! the GPU's `ex2`), and count, element by element, what each kernel loads from and stores to
//! device memory. Like the kernels' `HeadRows`, they count only rows that exist: a tail block's
//! missing rows are zeros made on chip, not reads.
//!
//! Where the kernels' exact counts differ from the article's approximations (the `predicted_*`
//! functions add exactly these terms, for non-causal attention):
//!
//! - FA1 initialises O (its f32 accumulator), m and ℓ in HBM (Algorithm 1, line 2): N_q·d + 2·N_q
//!   writes the article leaves out. Because of that, every step reads O_i, m_i, ℓ_i, the first
//!   included, so O is read exactly T_c times as the article says; and O is written T_c times by
//!   the steps (T_c − 1 to the accumulator, the last as the final O) plus once by line 2.
//! - FA1 reads and writes m and ℓ at every step: T_c·N_q reads and T_c·N_q writes each, after
//!   line 2's N_q writes (the N-sized terms the article leaves out).
//! - FA2 writes L = m + log ℓ once (N_q, left out likewise).
//! - The standard attention's formula counts what the article counts, each element of Q, K, V, S,
//!   P and O once per pass over it; its tiled matrix products re-read Q, K, V and P once per
//!   16-wide tile of their result, mostly from L2, which this level of counting does not see.

use std::ops::Range;

use flash_kernels::layout::Fa1Blocks;
use flash_kernels::mask::CausalMask;
use flash_kernels::softmax::{LN_2, LOG2_E, RowStats, fa1_merge, fa2_rescale};
use half::{bf16, f16};
use ndarray::{
    Array1, Array2, Array3, Array4, ArrayView, ArrayView1, ArrayView2, ArrayView4, ArrayViewMut,
    ArrayViewMut1, ArrayViewMut2, Axis, Dimension, Slice, Zip, s,
};

use crate::attention::{Algorithm, AttentionOptions, Problem, fa1_blocks, fa2_blocks};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The H200's opt-in shared memory per block, in bytes: the default budget of [`io_table`].
pub const H200_SHARED_MEMORY_PER_BLOCK: u32 = 232_448;

/// Bytes of an f32: FA1's O accumulator, m, ℓ, L and the standard attention's S.
const F32_BYTES: u64 = 4;

/// Elements of one tensor moved between HBM and the chip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub read: u64,
    pub written: u64,
}

impl Traffic {
    /// Both counts times `factor` (e.g. per head → whole problem), `None` on overflow.
    fn checked_scale(self, factor: u64) -> Option<Self> {
        Some(Self {
            read: self.read.checked_mul(factor)?,
            written: self.written.checked_mul(factor)?,
        })
    }
}

/// The HBM traffic of one tensor: its element counts and the size of its elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorIo {
    pub element_bytes: u64,
    pub elements: Traffic,
}

impl TensorIo {
    fn new(element_bytes: u64) -> Self {
        Self {
            element_bytes,
            elements: Traffic::default(),
        }
    }

    /// Bytes read (saturating at `u64::MAX`).
    pub fn bytes_read(&self) -> u64 {
        self.elements.read.saturating_mul(self.element_bytes)
    }

    /// Bytes written (saturating at `u64::MAX`).
    pub fn bytes_written(&self) -> u64 {
        self.elements.written.saturating_mul(self.element_bytes)
    }

    fn count_read(&mut self, elements: usize) {
        self.elements.read += elements as u64;
    }

    fn count_written(&mut self, elements: usize) {
        self.elements.written += elements as u64;
    }
}

/// HBM traffic per tensor. Q, K, V, O are in the input dtype; everything else is f32. A tensor an
/// algorithm does not have stays at zero (the emulators never touch S and P).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoCounts {
    pub q: TensorIo,
    pub k: TensorIo,
    pub v: TensorIo,
    /// The final output O.
    pub o: TensorIo,
    /// FA1's f32 copy of O between outer steps (kept normalised, Algorithm 1 line 12).
    pub o_accumulator: TensorIo,
    /// FA1's running row max m (natural-log units).
    pub row_max: TensorIo,
    /// FA1's running row sum ℓ.
    pub row_sum: TensorIo,
    /// L = m + log ℓ (FA2 and the standard attention).
    pub logsumexp: TensorIo,
    /// The standard attention's S = scale·Q·Kᵀ (f32).
    pub scores: TensorIo,
    /// The standard attention's P = softmax(S) (input dtype).
    pub probs: TensorIo,
}

impl IoCounts {
    /// All counts zero, with element sizes for inputs of `dtype`.
    pub fn new(dtype: DType) -> Self {
        let input = dtype.size_bytes() as u64;
        let f32_tensor = TensorIo::new(F32_BYTES);
        Self {
            q: TensorIo::new(input),
            k: TensorIo::new(input),
            v: TensorIo::new(input),
            o: TensorIo::new(input),
            o_accumulator: f32_tensor,
            row_max: f32_tensor,
            row_sum: f32_tensor,
            logsumexp: f32_tensor,
            scores: f32_tensor,
            probs: TensorIo::new(input),
        }
    }

    /// Every tensor with its name, for reports.
    pub fn tensors(&self) -> [(&'static str, TensorIo); 10] {
        [
            ("Q", self.q),
            ("K", self.k),
            ("V", self.v),
            ("O", self.o),
            ("O accumulator", self.o_accumulator),
            ("m", self.row_max),
            ("ℓ", self.row_sum),
            ("L", self.logsumexp),
            ("S", self.scores),
            ("P", self.probs),
        ]
    }

    /// Bytes read from HBM over all tensors (saturating at `u64::MAX`).
    pub fn bytes_read(&self) -> u64 {
        self.checked_total(|t| t.elements.read).unwrap_or(u64::MAX)
    }

    /// Bytes written to HBM over all tensors (saturating at `u64::MAX`).
    pub fn bytes_written(&self) -> u64 {
        self.checked_total(|t| t.elements.written)
            .unwrap_or(u64::MAX)
    }

    /// Σ elements·element_bytes over the tensors, `None` on overflow.
    fn checked_total(&self, elements: impl Fn(&TensorIo) -> u64) -> Option<u64> {
        self.tensors().iter().try_fold(0u64, |total, (_, tensor)| {
            total.checked_add(elements(tensor).checked_mul(tensor.element_bytes)?)
        })
    }

    /// Every count times `factor`, `None` if a count or a byte total overflows.
    fn checked_scale(&self, factor: u64) -> Option<Self> {
        let scale = |t: TensorIo| -> Option<TensorIo> {
            Some(TensorIo {
                element_bytes: t.element_bytes,
                elements: t.elements.checked_scale(factor)?,
            })
        };
        let scaled = Self {
            q: scale(self.q)?,
            k: scale(self.k)?,
            v: scale(self.v)?,
            o: scale(self.o)?,
            o_accumulator: scale(self.o_accumulator)?,
            row_max: scale(self.row_max)?,
            row_sum: scale(self.row_sum)?,
            logsumexp: scale(self.logsumexp)?,
            scores: scale(self.scores)?,
            probs: scale(self.probs)?,
        };
        scaled.checked_total(|t| t.elements.read)?;
        scaled.checked_total(|t| t.elements.written)?;
        Some(scaled)
    }
}

// ---------------------------------------------------------------------------------------------
// The emulators
// ---------------------------------------------------------------------------------------------

/// FA1's forward pass on the CPU, step for step as `kernels/src/fa1.rs` runs it, with every HBM
/// access counted. Returns O (rounded to `dtype`, as the kernel stores it), m (natural-log units),
/// ℓ, and the traffic.
///
/// Per (batch, head): line 2 sets the f32 O accumulator to 0, m to −∞ and ℓ to 0 in HBM (and the
/// final O to 0 for rows of row blocks that see no key, which no step will visit); then for each
/// K/V block j (loaded once), for each Q block i not fully masked
/// (`CausalMask::key_blocks_needed`): read Q_i, O_i, m_i, ℓ_i; m̃ = rowmax(S_ij),
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

/// FA2's forward pass on the CPU, as `kernels/src/fa2.rs` runs it, with every HBM access counted.
/// Returns O (rounded to `dtype`), L = m + ln ℓ (−∞ for rows with no visible key), and the traffic.
///
/// Per (row block i, batch, head), the kernel's grid: read Q_i once; for each K/V block j the row
/// block needs (`CausalMask::key_blocks_needed`): m^(j) = max(m^(j−1), rowmax S),
/// α = e^(m^(j−1) − m^(j)) (`fa2_rescale`), P̃ = e^(S − m^(j)), ℓ^(j) = α·ℓ^(j−1) + rowsum P̃,
/// Õ^(j) = α·Õ^(j−1) + P̃·V_j; then O_i = diag(ℓ)⁻¹·Õ_i and L_i = m_i + log ℓ_i, written once.
///
/// `blocks` is (B_r, B_c), as `attention::fa2_blocks` returns it. The kernel takes B_r, B_c ∈
/// {64, 128}; the emulator takes any block sizes ≥ 1.
/// Assumes valid shapes as [`emulate_fa1`] does; panics otherwise.
pub fn emulate_fa2(
    q: ArrayView4<f32>,
    k: ArrayView4<f32>,
    v: ArrayView4<f32>,
    causal: bool,
    scale: f32,
    blocks: (u32, u32),
    dtype: DType,
) -> (Array4<f32>, Array3<f32>, IoCounts) {
    let (batch, heads, seqlen_q, _) = q.dim();
    let mut o = Array4::from_elem(q.raw_dim(), f32::NAN);
    let mut logsumexp = Array3::from_elem((batch, heads, seqlen_q), f32::NAN);
    let mut io = IoCounts::new(dtype);
    let (block_rows, block_cols) = (blocks.0 as usize, blocks.1 as usize);
    for_each_head(q, k, v, causal, scale, |b, h, head| {
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

/// One (batch, head) of the inputs, as one kernel block sees it.
#[derive(Clone, Copy)]
struct HeadInputs<'a> {
    q: ArrayView2<'a, f32>,
    k: ArrayView2<'a, f32>,
    v: ArrayView2<'a, f32>,
    mask: CausalMask,
    /// scale·log2 e: the kernels fold log2 e into the scale so that each e^x is one exp2.
    score_scale: f32,
}

impl HeadInputs<'_> {
    fn seqlen_q(&self) -> usize {
        self.q.nrows()
    }

    fn seqlen_k(&self) -> usize {
        self.k.nrows()
    }

    /// K/V blocks that row block `row_block` needs. Called, as both kernels call it, with the
    /// block's unclipped end (row_start + B_r), even for a tail block.
    fn key_blocks_needed(&self, row_block: usize, block_rows: usize, block_cols: usize) -> usize {
        let row_end = (row_block + 1) * block_rows;
        self.mask
            .key_blocks_needed(row_end as u32, self.seqlen_k() as u32, block_cols as u32)
            as usize
    }
}

/// Runs `f(batch, head, inputs)` for every (batch, head): the grid dimension both kernels share.
fn for_each_head(
    q: ArrayView4<f32>,
    k: ArrayView4<f32>,
    v: ArrayView4<f32>,
    causal: bool,
    scale: f32,
    mut f: impl FnMut(usize, usize, HeadInputs<'_>),
) {
    let (batch, heads, seqlen_q, _) = q.dim();
    let seqlen_k = k.dim().2;
    let mask = CausalMask::new(causal, seqlen_q as u32, seqlen_k as u32);
    for b in 0..batch {
        for h in 0..heads {
            let head = HeadInputs {
                q: q.slice(s![b, h, .., ..]),
                k: k.slice(s![b, h, .., ..]),
                v: v.slice(s![b, h, .., ..]),
                mask,
                score_scale: scale * LOG2_E,
            };
            f(b, h, head);
        }
    }
}

/// The rows `[block·block_len, (block + 1)·block_len)` that exist in a tensor of `len` rows.
fn existing_rows(block: usize, block_len: usize, len: usize) -> Range<usize> {
    let start = block * block_len;
    start..(start + block_len).min(len)
}

/// Loads `rows` (which must exist) of an HBM tensor, counting one read per element.
fn read_rows<'a, D: Dimension>(
    hbm: ArrayView<'a, f32, D>,
    rows: Range<usize>,
    io: &mut TensorIo,
) -> ArrayView<'a, f32, D> {
    let tile = hbm.slice_axis_move(Axis(0), Slice::from(rows));
    io.count_read(tile.len());
    tile
}

/// Stores `tile` into an HBM tensor from row `first_row` on, counting one write per element.
fn write_rows<D: Dimension>(
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
fn round_to(dtype: DType, value: f32) -> f32 {
    match dtype {
        DType::F32 => value,
        DType::F16 => f16::from_f32(value).to_f32(),
        DType::Bf16 => bf16::from_f32(value).to_f32(),
    }
}

/// K_j and V_j on chip, with the index of their first key.
struct KeyTile<'a> {
    first_key: usize,
    keys: ArrayView2<'a, f32>,
    values: ArrayView2<'a, f32>,
}

impl<'a> KeyTile<'a> {
    /// Loads K_j and V_j (their existing rows) from HBM.
    fn load(head: &HeadInputs<'a>, block: usize, block_cols: usize, io: &mut IoCounts) -> Self {
        let keys = existing_rows(block, block_cols, head.seqlen_k());
        Self {
            first_key: keys.start,
            keys: read_rows(head.k, keys.clone(), &mut io.k),
            values: read_rows(head.v, keys, &mut io.v),
        }
    }

    /// One row of S_ij in log2 units: scale·log2 e·(q·k) for visible keys, −∞ for masked ones.
    /// The dot product runs over d in order, from 0, as in both kernels.
    fn scores(&self, head: &HeadInputs, query: usize, q_row: ArrayView1<f32>) -> Vec<f32> {
        self.keys
            .rows()
            .into_iter()
            .enumerate()
            .map(|(c, k_row)| {
                if head.mask.visible(query as u32, (self.first_key + c) as u32) {
                    let dot = q_row
                        .iter()
                        .zip(k_row)
                        .fold(0.0f32, |acc, (q, k)| acc + q * k);
                    dot * head.score_scale
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect()
    }

    /// `out += P̃·V_j` for one row, key by key in order, as both kernels accumulate it.
    fn accumulate_pv(&self, probabilities: &[f32], mut out: ArrayViewMut1<f32>) {
        for (&p, v_row) in probabilities.iter().zip(self.values.rows()) {
            out.zip_mut_with(&v_row, |o, &v| *o += p * v);
        }
    }
}

/// rowmax of a row of scores (−∞ when every key is masked).
fn row_max(scores: &[f32]) -> f32 {
    scores.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

/// Replaces each score s by P̃ = 2^(s − base) and returns rowsum P̃.
fn exponentiate(scores: &mut [f32], base: f32) -> f32 {
    scores.iter_mut().fold(0.0, |sum, s| {
        *s = (*s - base).exp2();
        sum + *s
    })
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
    for j in 0..head.key_blocks_needed(row_block, block_rows, block_cols) {
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

// ---------------------------------------------------------------------------------------------
// The article's formulas and the kernels' exact counts derived from them
// ---------------------------------------------------------------------------------------------

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
fn count(factors: &[u64]) -> u64 {
    factors
        .iter()
        .fold(1u64, |product, &f| product.saturating_mul(f))
}

/// ⌈len / block⌉; a zero block size counts as `u64::MAX` blocks (so the counts saturate).
fn block_count(len: usize, block: u32) -> u64 {
    if block == 0 {
        u64::MAX
    } else {
        (len as u64).div_ceil(block as u64)
    }
}

/// The article's FA1 traffic per head: K and V read once (N_k·d each), Q read T_c times
/// (T_c·N_q·d), O read T_c times and written T_c times (T_c·N_q·d each), T_c = ⌈N_k/B_c⌉.
///
/// The kernel's exact counts (see [`predicted_fa1_io`]): O's T_c reads all come from the f32
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
/// The kernel's exact counts add L = m + log ℓ, written once (N_q); see [`predicted_fa2_io`].
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

/// The dimensions the traffic depends on (no causal mask: the formulas are for full attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct IoShape {
    pub batch: usize,
    pub heads: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
}

impl IoShape {
    /// seqlen_q = seqlen_k = `seqlen`.
    pub fn square(batch: usize, heads: usize, seqlen: usize, head_dim: usize) -> Self {
        Self {
            batch,
            heads,
            seqlen_q: seqlen,
            seqlen_k: seqlen,
            head_dim,
        }
    }

    /// Checks the shape as the host checks a launch (`Problem::new`): no zero dimension, head dim
    /// at most 256, lengths and grid within the kernels' limits.
    fn check(&self) -> Result<()> {
        let q = [self.batch, self.heads, self.seqlen_q, self.head_dim];
        let kv = [self.batch, self.heads, self.seqlen_k, self.head_dim];
        Problem::new(q, kv, kv, &AttentionOptions::default()).map(|_| ())
    }

    /// Per-head counts times batch·heads; an error if any total overflows 64 bits.
    fn whole_problem(&self, per_head: IoCounts) -> Result<IoCounts> {
        let heads = (self.batch as u64).saturating_mul(self.heads as u64);
        per_head.checked_scale(heads).ok_or_else(|| {
            Error::invalid(
                "shape",
                format!("{self:?}"),
                "its HBM traffic in bytes must fit in 64 bits",
            )
        })
    }
}

/// Per-head [`IoCounts`] holding a formula's Q, K, V, O, S and P counts.
fn formula_io(formula: &FormulaCounts, dtype: DType) -> IoCounts {
    let mut io = IoCounts::new(dtype);
    io.q.elements = formula.q;
    io.k.elements = formula.k;
    io.v.elements = formula.v;
    io.o.elements = formula.o;
    io.scores.elements = formula.scores;
    io.probs.elements = formula.probs;
    io
}

/// The standard attention's traffic for `shape`: [`standard_formula`] plus L written once.
pub fn predicted_standard_io(shape: IoShape, dtype: DType) -> Result<IoCounts> {
    shape.check()?;
    let formula = standard_formula(shape.seqlen_q, shape.seqlen_k, shape.head_dim);
    let mut io = formula_io(&formula, dtype);
    io.logsumexp.elements.written = shape.seqlen_q as u64;
    shape.whole_problem(io)
}

/// The FA1 kernel's exact non-causal traffic for `shape` with `blocks`: [`fa1_formula`], with O's
/// reads and all but the last of its writes in the f32 accumulator, plus line 2's writes (O
/// accumulator N_q·d, m and ℓ N_q each) and m, ℓ read and written T_c·N_q times each. Equals what
/// [`emulate_fa1`] counts.
pub fn predicted_fa1_io(shape: IoShape, blocks: Fa1Blocks, dtype: DType) -> Result<IoCounts> {
    shape.check()?;
    if blocks.block_rows == 0 || blocks.block_cols == 0 {
        return Err(Error::invalid(
            "blocks",
            format!("{blocks:?}"),
            "B_r and B_c must be at least 1",
        ));
    }
    let (n_q, d) = (shape.seqlen_q as u64, shape.head_dim as u64);
    let t_c = block_count(shape.seqlen_k, blocks.block_cols);
    let formula = fa1_formula(shape.seqlen_q, shape.seqlen_k, shape.head_dim, blocks);
    let mut io = formula_io(&formula, dtype);
    // O's T_c writes: the last goes to O, the other T_c − 1 to the accumulator, which line 2
    // also writes once: (T_c − 1)·N_q·d + N_q·d = T_c·N_q·d, the formula's count.
    io.o.elements = Traffic {
        read: 0,
        written: count(&[n_q, d]),
    };
    io.o_accumulator.elements = formula.o;
    let statistics = Traffic {
        read: count(&[t_c, n_q]),
        written: count(&[t_c.saturating_add(1), n_q]),
    };
    io.row_max.elements = statistics;
    io.row_sum.elements = statistics;
    shape.whole_problem(io)
}

/// The FA2 kernel's exact non-causal traffic for `shape` with `block_rows` (B_c does not matter
/// without a mask): [`fa2_formula`] plus L written once. Equals what [`emulate_fa2`] counts.
pub fn predicted_fa2_io(shape: IoShape, block_rows: u32, dtype: DType) -> Result<IoCounts> {
    shape.check()?;
    if block_rows == 0 {
        return Err(Error::invalid("block_rows", 0, "must be at least 1"));
    }
    let formula = fa2_formula(shape.seqlen_q, shape.seqlen_k, shape.head_dim, block_rows);
    let mut io = formula_io(&formula, dtype);
    io.logsumexp.elements.written = shape.seqlen_q as u64;
    shape.whole_problem(io)
}

/// One line of the predicted-traffic table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoTableRow {
    pub shape: IoShape,
    pub dtype: DType,
    pub algorithm: Algorithm,
    /// (B_r, B_c) as the host would pick them; `None` for the standard attention.
    pub blocks: Option<(u32, u32)>,
    pub io: IoCounts,
}

/// Predicted HBM traffic of the standard attention, FA1, FA2 and, where it runs on tensor cores,
/// FA2-TC (in that order) for `shape` in
/// `dtype`, non-causal, with block sizes picked as the host picks them for a device with
/// `shared_memory_bytes` per block ([`H200_SHARED_MEMORY_PER_BLOCK`] on an H200). Computed from
/// the formulas, so it is instant for any length; an error for shapes the host would reject.
pub fn io_table(shape: IoShape, dtype: DType, shared_memory_bytes: u32) -> Result<Vec<IoTableRow>> {
    shape.check()?;
    let (_, fa1) = fa1_blocks(shape.head_dim, shared_memory_bytes, None)?;
    let (fa2_rows, fa2_cols) = fa2_blocks(shape.head_dim, shared_memory_bytes, None)?;
    let row = |algorithm, blocks, io| IoTableRow {
        shape,
        dtype,
        algorithm,
        blocks,
        io,
    };
    let mut rows = vec![
        row(
            Algorithm::Standard,
            None,
            predicted_standard_io(shape, dtype)?,
        ),
        row(
            Algorithm::Fa1,
            Some((fa1.block_rows, fa1.block_cols)),
            predicted_fa1_io(shape, fa1, dtype)?,
        ),
        row(
            Algorithm::Fa2,
            Some((fa2_rows, fa2_cols)),
            predicted_fa2_io(shape, fa2_rows, dtype)?,
        ),
    ];
    // FA2 on tensor cores moves the same tensors as FA2, with its own B_r; where it falls back
    // to the scalar FA2 (f32, other head dims) its row would repeat FA2's.
    let tc = flash_kernels::layout::FA2_TC_HEAD_DIMS.contains(&(shape.head_dim as u32));
    if dtype != DType::F32 && tc {
        let tiling = flash_kernels::layout::Fa2TcTiling::default_for(shape.head_dim as u32);
        let (tc_rows, tc_cols) = (tiling.block_rows(), tiling.block_cols);
        rows.push(row(
            Algorithm::Fa2Tc,
            Some((tc_rows, tc_cols)),
            predicted_fa2_io(shape, tc_rows, dtype)?,
        ));
    }
    Ok(rows)
}

/// The rows as a markdown table: shape, dtype, algorithm, blocks, bytes read, written and total.
pub fn io_table_markdown(rows: &[IoTableRow]) -> String {
    let mut table = String::from(
        "| batch × heads × N_q × N_k × d | dtype | algorithm | B_r × B_c | HBM read | HBM written | total |\n\
         |---|---|---|---|---:|---:|---:|\n",
    );
    for row in rows {
        let s = row.shape;
        let blocks = row
            .blocks
            .map_or_else(|| "–".to_string(), |(r, c)| format!("{r} × {c}"));
        let (read, written) = (row.io.bytes_read(), row.io.bytes_written());
        table.push_str(&format!(
            "| {} × {} × {} × {} × {} | {} | {} | {} | {} | {} | {} |\n",
            s.batch,
            s.heads,
            s.seqlen_q,
            s.seqlen_k,
            s.head_dim,
            row.dtype,
            row.algorithm,
            blocks,
            format_bytes(read),
            format_bytes(written),
            format_bytes(read.saturating_add(written)),
        ));
    }
    table
}

/// `bytes` in binary units with three significant digits or so: "512 B", "1.50 MiB".
fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}
