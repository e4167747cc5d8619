//! The backward pass's HBM traffic as formulas: the standard backward (P materialised) and FA2's,
//! element by element per tensor, for a whole problem.
//!
//! Per head, with N_q = seqlen_q, N_k = seqlen_k, T_c = ⌈N_k/B_c⌉, counting each element once per
//! pass over it, as the forward's formulas do (`formulas.rs`):
//!
//! **Standard backward** (the FlashAttention paper's Algorithm 3, non-causal), one kernel per line:
//!
//! 1. dV = Pᵀ·dO: P read (N_q·N_k), dO read (N_q·d), dV written (N_k·d);
//! 2. dP = dO·Vᵀ: dO read (N_q·d), V read (N_k·d), dP written (N_q·N_k);
//! 3. dS = P ∘ (dP − rowsum(P ∘ dP)): P and dP read (N_q·N_k each, a row held on chip for its sum),
//!    dS written (N_q·N_k);
//! 4. dQ = scale·dS·K: dS read (N_q·N_k), K read (N_k·d), dQ written (N_q·d);
//! 5. dK = scale·dSᵀ·Q: dS read (N_q·N_k), Q read (N_q·d), dK written (N_k·d).
//!
//! In all: 2·N_q·d (dO) + N_q·d + 2·N_k·d (Q, K, V) read, 2·N_k·d + N_q·d (dK, dV, dQ) written, and
//! the N × N terms: P read twice, dP written once and read once, dS written once and read twice
//! (7·N_q·N_k elements), which is what FA2 avoids. P is the forward's, kept in HBM.
//!
//! **FA2 backward** ([`emulate_fa2_backward`](crate::model::fa2_backward::emulate_fa2_backward)):
//! let R be the rows the main loop visits over all key blocks, R = Σ_j (N_q − i_j·B_r) where i_j
//! is the first row block that key block j needs: i_j = 0 without a mask (so R = T_c·N_q), and
//! ⌊max(0, j·B_c − (N_k − N_q))/B_r⌋ with the bottom-right causal mask (query q sees key
//! j·B_c iff q ≥ j·B_c − (N_k − N_q)). Tail blocks count only the rows that exist.
//!
//! - pre-pass: O and dO read (N_q·d each), D written (N_q), the dQ accumulator zeroed (N_q·d);
//! - main loop: K and V read once (N_k·d each); per visited row, Q_i and dO_i read (R·d each),
//!   L_i and D_i read (R each), the accumulator's dQ_i read and written (R·d each); dK and dV
//!   written once (N_k·d each);
//! - post-pass: the accumulator read (N_q·d), dQ written (N_q·d).
//!
//! Non-causal, leaving out the N-sized terms as the article does, that is 2·N_k·d (K, V) +
//! 2·T_c·N_q·d (Q, dO) + 2·T_c·N_q·d (dQ accumulator, f32) + 2·N_k·d (dK, dV) + 4·N_q·d (pre- and
//! post-pass) + N_q·d (dQ): the mirror of the forward's 2·T_r·N_k·d, with Q, dO and dQ re-read
//! per key block instead of K and V per row block, and nothing of size N × N.
//!
//! The formulas are per head of an ungrouped problem ([`IoShape`] has one head count). With
//! grouped K/V heads each query head's blocks move the same traffic (K_j and V_j read per query
//! head), plus the group sum: the expanded dK and dV read once and the sums written (the
//! emulator counts it under dK and dV; `tests/gpu/gqa.rs` checks that count).

use flash_attn::dtype::DType;
use flash_attn::error::{Error, Result};

use crate::model::formulas::{block_count, count};
use crate::model::prediction::IoShape;
use crate::model::traffic::{BackwardIoCounts, Traffic};

/// The standard backward's traffic for `shape` in `dtype` (non-causal; see the module
/// documentation): Algorithm 3's five steps.
pub fn standard_backward_formula(shape: IoShape, dtype: DType) -> Result<BackwardIoCounts> {
    shape.check()?;
    let (n_q, n_k, d) = (
        shape.seqlen_q as u64,
        shape.seqlen_k as u64,
        shape.head_dim as u64,
    );
    let square = count(&[n_q, n_k]);
    let mut io = BackwardIoCounts::new(dtype);
    io.q.elements = reads(count(&[n_q, d]));
    io.k.elements = reads(count(&[n_k, d]));
    io.v.elements = reads(count(&[n_k, d]));
    io.d_o.elements = reads(count(&[2, n_q, d]));
    io.probs.elements = reads(count(&[2, square]));
    io.d_probs.elements = Traffic {
        read: square,
        written: square,
    };
    io.d_scores.elements = Traffic {
        read: count(&[2, square]),
        written: square,
    };
    io.dq.elements = writes(count(&[n_q, d]));
    io.dk.elements = writes(count(&[n_k, d]));
    io.dv.elements = writes(count(&[n_k, d]));
    shape.whole_problem(io)
}

/// FA2's backward traffic for `shape` in `dtype` with (B_r, B_c) = `blocks`, causal or not (see
/// the module documentation). Equals what
/// [`emulate_fa2_backward`](crate::model::fa2_backward::emulate_fa2_backward) counts.
pub fn fa2_backward_formula(
    shape: IoShape,
    causal: bool,
    blocks: (u32, u32),
    dtype: DType,
) -> Result<BackwardIoCounts> {
    shape.check()?;
    let (block_rows, block_cols) = blocks;
    if block_rows == 0 || block_cols == 0 {
        return Err(Error::invalid(
            "blocks",
            format!("{blocks:?}"),
            "B_r and B_c must be at least 1",
        ));
    }
    let (n_q, n_k, d) = (
        shape.seqlen_q as u64,
        shape.seqlen_k as u64,
        shape.head_dim as u64,
    );
    let visited_rows = visited_rows(shape, causal, blocks);
    let mut io = BackwardIoCounts::new(dtype);
    io.q.elements = reads(count(&[visited_rows, d]));
    io.k.elements = reads(count(&[n_k, d]));
    io.v.elements = reads(count(&[n_k, d]));
    io.o.elements = reads(count(&[n_q, d]));
    io.d_o.elements = reads(count(&[n_q.saturating_add(visited_rows), d]));
    io.logsumexp.elements = reads(visited_rows);
    io.delta.elements = Traffic {
        read: visited_rows,
        written: n_q,
    };
    // Zeroed and finally read once each (N_q·d), read and written at every visit (R·d).
    let accumulator = count(&[n_q.saturating_add(visited_rows), d]);
    io.dq_accumulator.elements = Traffic {
        read: accumulator,
        written: accumulator,
    };
    io.dq.elements = writes(count(&[n_q, d]));
    io.dk.elements = writes(count(&[n_k, d]));
    io.dv.elements = writes(count(&[n_k, d]));
    shape.whole_problem(io)
}

/// R = Σ_j (N_q − i_j·B_r): the query rows FA2's main loop visits over every key block j.
fn visited_rows(shape: IoShape, causal: bool, (block_rows, block_cols): (u32, u32)) -> u64 {
    let n_q = shape.seqlen_q as u64;
    let key_blocks = block_count(shape.seqlen_k, block_cols);
    if !causal {
        return count(&[key_blocks, n_q]);
    }
    // Bottom-right alignment: query q sees key k iff q ≥ k − (N_k − N_q).
    let offset = shape.seqlen_k as i64 - shape.seqlen_q as i64;
    (0..key_blocks)
        .map(|j| {
            let first_query = (j as i64 * block_cols as i64 - offset).max(0) as u64;
            let first_row_block = first_query / block_rows as u64;
            n_q - first_row_block * block_rows as u64
        })
        .fold(0, u64::saturating_add)
}

fn reads(read: u64) -> Traffic {
    Traffic { read, written: 0 }
}

fn writes(written: u64) -> Traffic {
    Traffic { read: 0, written }
}
