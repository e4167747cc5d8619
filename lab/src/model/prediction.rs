//! The kernels' exact non-causal HBM traffic for a whole problem, from the article's formulas
//! plus the terms the article leaves out.
//!
//! Where the kernels' exact counts differ from the article's approximations (the `predicted_*`
//! functions add exactly these terms):
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

use flash_kernels::fwd::fa1::config::Fa1Blocks;

use flash_attn::attention::{AttentionOptions, Problem};
use flash_attn::dtype::DType;
use flash_attn::error::{Error, Result};

use crate::model::formulas::{
    FormulaCounts, block_count, count, fa1_formula, fa2_formula, standard_formula,
};
use crate::model::traffic::{CheckedScale, IoCounts, Traffic};

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
    pub(super) fn check(&self) -> Result<()> {
        let q = [self.batch, self.heads, self.seqlen_q, self.head_dim];
        let kv = [self.batch, self.heads, self.seqlen_k, self.head_dim];
        Problem::new(q, kv, kv, &AttentionOptions::default()).map(|_| ())
    }

    /// Per-head counts times batch·heads; an error if any total overflows 64 bits.
    pub(super) fn whole_problem<C: CheckedScale>(&self, per_head: C) -> Result<C> {
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
/// [`emulate_fa1`](crate::model::fa1::emulate_fa1) counts.
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
/// without a mask): [`fa2_formula`] plus L written once. Equals what [`emulate_fa2`](crate::model::fa2::emulate_fa2) counts.
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
