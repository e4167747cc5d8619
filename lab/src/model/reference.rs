//! Exact attention on the CPU, in f64: the reference every kernel is checked against.

use ndarray::{Array3, Array4, ArrayView4, s};
use rayon::prelude::*;

use flash_attn::attention::PackedBatch;
use flash_attn::dtype::Element;
use flash_attn::scoring::Scoring;

/// O and the per-row logsumexp L.
pub struct Reference {
    /// (batch, heads, seqlen_q, head_dim).
    pub o: Array4<f64>,
    /// (batch, heads, seqlen_q); −∞ for rows with no visible key.
    pub logsumexp: Array3<f64>,
}

/// softmax(mask(cap(scale·Q·Kᵀ)))·V in f64 under `scoring` (a `bool` is the causal mask or none):
/// soft-capping, then the causal or sliding-window mask aligned to the bottom-right (query q sees
/// key k iff q + offset − left ≤ k ≤ q + offset + right, offset = seqlen_k − seqlen_q; causal is
/// (unbounded, 0)). Rows with no visible key give O = 0 and L = −∞, as flash-attn returns them.
/// K and V may have fewer heads than Q (GQA/MQA): query head h reads K/V head
/// h / (heads_q / heads_kv).
///
/// # Panics
/// If K's heads do not divide Q's ([`flash_attn::Problem::new`] refuses such shapes first).
pub fn attention_reference(
    q: ArrayView4<f64>,
    k: ArrayView4<f64>,
    v: ArrayView4<f64>,
    scoring: impl Into<Scoring>,
    scale: f64,
) -> Reference {
    let all: Vec<usize> = (0..q.dim().2).collect();
    attention_reference_rows(q, k, v, scoring, scale, &all)
}

/// [`attention_reference`] of a packed batch: Q (1, heads, total_q, d), K and V (1, heads_kv,
/// total_k, d), each sequence of `batch` attending to its own keys under `scoring` (its causal
/// mask or window aligned to its own bottom-right corner). O is (1, heads, total_q, d) and L
/// (1, heads, total_q), flash-attn's varlen layout; a sequence without keys gives O = 0 and
/// L = −∞.
pub fn packed_attention_reference(
    q: ArrayView4<f64>,
    k: ArrayView4<f64>,
    v: ArrayView4<f64>,
    batch: &PackedBatch,
    scoring: impl Into<Scoring>,
    scale: f64,
) -> Reference {
    let scoring = scoring.into();
    let (heads, total_q, head_dim) = (q.dim().1, q.dim().2, q.dim().3);
    let mut o = Array4::zeros((1, heads, total_q, head_dim));
    let mut logsumexp = Array3::from_elem((1, heads, total_q), f64::NEG_INFINITY);
    for b in 0..batch.sequences() {
        let (queries, keys) = batch.rows(b);
        if queries.is_empty() || keys.is_empty() {
            continue;
        }
        let part = attention_reference(
            q.slice(s![.., .., queries.clone(), ..]),
            k.slice(s![.., .., keys.clone(), ..]),
            v.slice(s![.., .., keys, ..]),
            scoring,
            scale,
        );
        o.slice_mut(s![.., .., queries.clone(), ..]).assign(&part.o);
        logsumexp
            .slice_mut(s![.., .., queries])
            .assign(&part.logsumexp);
    }
    Reference { o, logsumexp }
}

/// [`attention_reference`] for the query rows `rows` only (row indices into seqlen_q, which the
/// causal mask needs); O is (batch, heads, rows.len(), head_dim), L (batch, heads, rows.len()).
pub fn attention_reference_rows(
    q: ArrayView4<f64>,
    k: ArrayView4<f64>,
    v: ArrayView4<f64>,
    scoring: impl Into<Scoring>,
    scale: f64,
    rows: &[usize],
) -> Reference {
    attention_with_rounding(q, k, v, scoring.into(), scale, rows, |p| p, |o| o)
}

/// Standard attention as it would run in `T`: the inputs are `T` values, P is rounded to `T`
/// before P·V and O to `T` at the end (FlashAttention's test suite's baseline for its tolerance).
/// Computed for the query rows `rows`, as [`attention_reference_rows`].
pub fn attention_in_dtype<T: Element>(
    q: ArrayView4<f64>,
    k: ArrayView4<f64>,
    v: ArrayView4<f64>,
    scoring: impl Into<Scoring>,
    scale: f64,
    rows: &[usize],
) -> Array4<f64> {
    attention_with_rounding(q, k, v, scoring.into(), scale, rows, T::round, T::round).o
}

#[allow(clippy::too_many_arguments)]
fn attention_with_rounding(
    q: ArrayView4<f64>,
    k: ArrayView4<f64>,
    v: ArrayView4<f64>,
    scoring: Scoring,
    scale: f64,
    query_rows: &[usize],
    round_prob: impl Fn(f64) -> f64 + Sync,
    round_out: impl Fn(f64) -> f64 + Sync,
) -> Reference {
    let (batch, heads, seqlen_q, head_dim) = q.dim();
    let (heads_kv, seqlen_k) = (k.dim().1, k.dim().2);
    assert!(
        heads_kv > 0 && heads.is_multiple_of(heads_kv),
        "K's heads ({heads_kv}) must divide Q's ({heads})"
    );
    let group = heads / heads_kv;
    let n_rows = query_rows.len();
    // One task per query row, spread over the machine's cores.
    let rows: Vec<(Vec<f64>, f64)> = (0..batch * heads * n_rows)
        .into_par_iter()
        .map(|flat| {
            let (b, h, i) = (
                flat / (heads * n_rows),
                flat / n_rows % heads,
                query_rows[flat % n_rows],
            );
            // The window is one range of keys: [start, end), empty for a row that sees none.
            let visible = scoring.visible_keys(i, seqlen_q, seqlen_k);
            if visible.is_empty() {
                return (vec![round_out(0.0); head_dim], f64::NEG_INFINITY);
            }
            let qi = q.slice(s![b, h, i, ..]);
            let kv_head = h / group;
            let scores: Vec<f64> = visible
                .clone()
                .map(|j| scoring.cap(scale * qi.dot(&k.slice(s![b, kv_head, j, ..]))))
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            let mut acc = vec![0.0f64; head_dim];
            for (j, s) in visible.zip(&scores) {
                let p = round_prob((s - max).exp() / sum);
                for (a, x) in acc.iter_mut().zip(v.slice(s![b, kv_head, j, ..])) {
                    *a += p * x;
                }
            }
            (acc.into_iter().map(&round_out).collect(), max + sum.ln())
        })
        .collect();
    let o = Array4::from_shape_fn((batch, heads, n_rows, head_dim), |(b, h, i, x)| {
        rows[(b * heads + h) * n_rows + i].0[x]
    });
    let logsumexp = Array3::from_shape_fn((batch, heads, n_rows), |(b, h, i)| {
        rows[(b * heads + h) * n_rows + i].1
    });
    Reference { o, logsumexp }
}
