//! Exact attention gradients on the CPU, in f64: the reference the backward pass is checked
//! against.
//!
//! For O = P·V, P = softmax(S), S = scale·Q·Kᵀ (the mask, causal or a window, bottom-right
//! aligned, as in [`attention_reference`](crate::model::reference::attention_reference)) and the
//! gradient dO of a loss with respect to O, per head (FlashAttention-2's backward, issue #15):
//!
//! - dV = Pᵀ·dO;
//! - dP = dO·Vᵀ;
//! - D_i = rowsum(dO_i ∘ O_i), which equals Σ_j P_ij·dP_ij (softmax's Jacobian needs it);
//! - dS = P ∘ (dP − D) (D broadcast along each row);
//! - dQ = scale·dS·K and dK = scale·dSᵀ·Q.
//!
//! With soft-capping, S_ij = c·tanh(s_ij / c) of the scaled product s_ij, and the chain rule
//! multiplies dS_ij by dS_ij/ds_ij = 1 − tanh²(s_ij / c) before dQ and dK.
//!
//! A row with no visible key has P = 0, so its dQ and D are 0 and it adds nothing to dK, dV.
//!
//! Grouped K/V heads (GQA/MQA: K and V have heads_kv heads, a divisor of Q's, and query head h
//! reads K/V head h / (heads / heads_kv)): each query head's dK and dV are computed as above
//! against its K/V head, and K/V head k's gradient is their sum over the query heads that read
//! it, the chain rule through a K/V head shared by several query heads.
//!
//! The computation walks rows and keys, not N × N matrices, so memory stays O(N·d) per head
//! however long the sequences: one parallel pass per query row gives L_i = log Σ_j e^(S_ij) and
//! D_i, then P_ij = e^(S_ij − L_i) and dS_ij are recomputed where dQ (per row) and dK, dV (per
//! key) need them, as the FA2 backward itself recomputes P from L.

use std::ops::Range;

use ndarray::{Array2, Array3, Array4, ArrayView2, ArrayView4, s};
use rayon::prelude::*;

use flash_attn::attention::backward::Gradients;
use flash_attn::dtype::Element;
use flash_attn::scoring::Scoring;

/// dQ, dK, dV, and D = rowsum(dO ∘ O).
pub struct ReferenceBackward {
    /// Each (batch, heads, seqlen, head_dim) like the input it is the gradient of.
    pub gradients: Gradients<Array4<f64>>,
    /// D, (batch, heads, seqlen_q); 0 for rows with no visible key.
    pub delta: Array3<f64>,
}

/// The exact gradients of softmax(scale·Q·Kᵀ, capped and masked by `scoring`)·V with respect to
/// Q, K and V, given dO (same shape as Q); a `bool` is the causal mask or none. K and V may have
/// fewer heads than Q (a divisor of Q's: GQA/MQA).
///
/// # Panics
/// If K's heads do not divide Q's ([`flash_attn::Problem::new`] refuses such shapes first).
pub fn attention_backward_reference(
    q: ArrayView4<f64>,
    k: ArrayView4<f64>,
    v: ArrayView4<f64>,
    d_o: ArrayView4<f64>,
    scoring: impl Into<Scoring>,
    scale: f64,
) -> ReferenceBackward {
    backward_with_rounding(q, k, v, d_o, scoring.into(), scale, |x| x)
}

/// The backward pass as a kernel working in `T` would round it: O rounded to `T` before D (the
/// forward stored it in `T`), P rounded to `T` before dV = Pᵀ·dO and dS rounded to `T` before
/// dQ = dS·K and dK = dSᵀ·Q (the operands of those products, as on tensor cores), and the
/// gradients rounded to `T` at the end; everything else in f64. The inputs should be `T` values.
/// With grouped K/V heads, each query head's dK and dV are rounded to `T` before the sum over
/// its group, and the sum rounded again (the GPU's expanded workspace in the dtype, then the
/// group sum; PyTorch's same-dtype GQA through repeated K and V rounds the same way).
/// The baseline of a GPU tolerance: a kernel's error against [`attention_backward_reference`]
/// compared with this computation's.
pub fn attention_backward_in_dtype<T: Element>(
    q: ArrayView4<f64>,
    k: ArrayView4<f64>,
    v: ArrayView4<f64>,
    d_o: ArrayView4<f64>,
    scoring: impl Into<Scoring>,
    scale: f64,
) -> ReferenceBackward {
    backward_with_rounding(q, k, v, d_o, scoring.into(), scale, T::round)
}

fn backward_with_rounding(
    q: ArrayView4<f64>,
    k: ArrayView4<f64>,
    v: ArrayView4<f64>,
    d_o: ArrayView4<f64>,
    scoring: Scoring,
    scale: f64,
    round: impl Fn(f64) -> f64 + Sync,
) -> ReferenceBackward {
    let (batch, heads, seqlen_q, _) = q.dim();
    let heads_kv = k.dim().1;
    assert!(
        heads_kv > 0 && heads.is_multiple_of(heads_kv),
        "K's heads ({heads_kv}) must divide Q's ({heads})"
    );
    let group = heads / heads_kv;
    let per_head: Vec<HeadGradients> = (0..batch * heads)
        .into_par_iter()
        .map(|flat| {
            let (b, h) = (flat / heads, flat % heads);
            let head = Head {
                q: q.slice(s![b, h, .., ..]),
                k: k.slice(s![b, h / group, .., ..]),
                v: v.slice(s![b, h / group, .., ..]),
                d_o: d_o.slice(s![b, h, .., ..]),
                scoring,
                scale,
            };
            head.gradients(&round)
        })
        .collect();
    // Query head h's part goes to head h / group: dQ's own head, or the K/V head it read, where
    // a group's parts add up (in the order of h) and the sum is rounded again.
    let gather = |dims, group: usize, part: fn(&HeadGradients) -> &Array2<f64>| {
        let mut out = Array4::zeros(dims);
        for (flat, head) in per_head.iter().enumerate() {
            let mut target = out.slice_mut(s![flat / heads, flat % heads / group, .., ..]);
            target += part(head);
        }
        if group > 1 {
            out.mapv_inplace(&round);
        }
        out
    };
    ReferenceBackward {
        gradients: Gradients {
            dq: gather(q.raw_dim(), 1, |g| &g.dq),
            dk: gather(k.raw_dim(), group, |g| &g.dk),
            dv: gather(v.raw_dim(), group, |g| &g.dv),
        },
        delta: Array3::from_shape_fn((batch, heads, seqlen_q), |(b, h, i)| {
            per_head[b * heads + h].rows[i].delta
        }),
    }
}

/// One (batch, head) of the inputs.
struct Head<'a> {
    q: ArrayView2<'a, f64>,
    k: ArrayView2<'a, f64>,
    v: ArrayView2<'a, f64>,
    d_o: ArrayView2<'a, f64>,
    scoring: Scoring,
    scale: f64,
}

/// What the backward pass keeps per query row: L = log Σ_j e^(S_ij) and D = rowsum(dO ∘ O).
#[derive(Clone, Copy)]
struct RowTerms {
    logsumexp: f64,
    delta: f64,
}

struct HeadGradients {
    dq: Array2<f64>,
    dk: Array2<f64>,
    dv: Array2<f64>,
    rows: Vec<RowTerms>,
}

impl Head<'_> {
    /// The keys query `i` sees (flash-attn's rule, `Scoring::visible_keys`).
    fn visible_keys(&self, i: usize) -> Range<usize> {
        self.scoring.visible_keys(i, self.q.nrows(), self.k.nrows())
    }

    /// The queries that see key `j`: a range, since both edges of a query's window move right
    /// with the query; found from the rule itself, query by query.
    fn queries_seeing(&self, j: usize) -> Range<usize> {
        let seqlen_q = self.q.nrows();
        let sees = |i: &usize| self.visible_keys(*i).contains(&j);
        let Some(first) = (0..seqlen_q).find(sees) else {
            return 0..0;
        };
        let end = (first..seqlen_q).find(|i| !sees(i)).unwrap_or(seqlen_q);
        first..end
    }

    /// The scaled product s_ij = scale·q_i·k_j.
    fn scaled_product(&self, i: usize, j: usize) -> f64 {
        self.scale * self.q.row(i).dot(&self.k.row(j))
    }

    /// S_ij: the scaled product, soft-capped where the call caps it.
    fn score(&self, i: usize, j: usize) -> f64 {
        self.scoring.cap(self.scaled_product(i, j))
    }

    /// dS_ij/ds_ij: 1 − tanh²(s_ij / c) with soft-capping, else 1.
    fn cap_slope(&self, i: usize, j: usize) -> f64 {
        let softcap = self.scoring.softcap;
        if softcap > 0.0 {
            1.0 - (self.scaled_product(i, j) / softcap).tanh().powi(2)
        } else {
            1.0
        }
    }

    /// L_i and D_i = dO_i·O_i, with O_i = Σ_j P_ij·V_j computed here (rounded by `round`, as a
    /// kernel reads the O the forward stored). −∞ and 0 for a row with no visible key.
    fn row_terms(&self, i: usize, round: &impl Fn(f64) -> f64) -> RowTerms {
        let keys = self.visible_keys(i);
        if keys.is_empty() {
            return RowTerms {
                logsumexp: f64::NEG_INFINITY,
                delta: 0.0,
            };
        }
        let scores: Vec<f64> = keys.clone().map(|j| self.score(i, j)).collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let logsumexp = max + scores.iter().map(|s| (s - max).exp()).sum::<f64>().ln();
        let mut o = vec![0.0f64; self.q.ncols()];
        for (j, s) in keys.zip(&scores) {
            let p = (s - logsumexp).exp();
            for (o, v) in o.iter_mut().zip(self.v.row(j)) {
                *o += p * v;
            }
        }
        let delta = o
            .iter()
            .zip(self.d_o.row(i))
            .map(|(o, g)| round(*o) * g)
            .sum();
        RowTerms { logsumexp, delta }
    }

    /// P_ij = e^(S_ij − L_i) and dS_ij = P_ij·(dP_ij − D_i), dP_ij = dO_i·V_j (times the cap's
    /// slope with soft-capping: the gradient with respect to the scaled product), each rounded
    /// by `round` where a kernel would round it (dS from the unrounded P).
    fn probability_and_score_gradient(
        &self,
        i: usize,
        j: usize,
        row: RowTerms,
        round: &impl Fn(f64) -> f64,
    ) -> (f64, f64) {
        let p = (self.score(i, j) - row.logsumexp).exp();
        let d_p = self.d_o.row(i).dot(&self.v.row(j));
        (
            round(p),
            round(p * (d_p - row.delta) * self.cap_slope(i, j)),
        )
    }

    fn gradients(&self, round: &(impl Fn(f64) -> f64 + Sync)) -> HeadGradients {
        let (seqlen_q, head_dim) = self.q.dim();
        let seqlen_k = self.k.nrows();
        let rows: Vec<RowTerms> = (0..seqlen_q)
            .into_par_iter()
            .map(|i| self.row_terms(i, round))
            .collect();
        // dQ_i = scale·Σ_j dS_ij·K_j, one task per query row.
        let dq: Vec<Vec<f64>> = (0..seqlen_q)
            .into_par_iter()
            .map(|i| {
                let mut dq = vec![0.0f64; head_dim];
                for j in self.visible_keys(i) {
                    let (_, d_s) = self.probability_and_score_gradient(i, j, rows[i], round);
                    for (a, k) in dq.iter_mut().zip(self.k.row(j)) {
                        *a += d_s * k;
                    }
                }
                dq.into_iter().map(|x| round(self.scale * x)).collect()
            })
            .collect();
        // dV_j = Σ_i P_ij·dO_i and dK_j = scale·Σ_i dS_ij·Q_i, one task per key.
        let dk_dv: Vec<(Vec<f64>, Vec<f64>)> = (0..seqlen_k)
            .into_par_iter()
            .map(|j| {
                let (mut dk, mut dv) = (vec![0.0f64; head_dim], vec![0.0f64; head_dim]);
                for i in self.queries_seeing(j) {
                    let (p, d_s) = self.probability_and_score_gradient(i, j, rows[i], round);
                    let inputs = self.q.row(i).into_iter().zip(self.d_o.row(i));
                    for ((dk, dv), (q, g)) in dk.iter_mut().zip(dv.iter_mut()).zip(inputs) {
                        *dk += d_s * q;
                        *dv += p * g;
                    }
                }
                (
                    dk.into_iter().map(|x| round(self.scale * x)).collect(),
                    dv.into_iter().map(round).collect(),
                )
            })
            .collect();
        HeadGradients {
            dq: Array2::from_shape_fn((seqlen_q, head_dim), |(i, x)| dq[i][x]),
            dk: Array2::from_shape_fn((seqlen_k, head_dim), |(j, x)| dk_dv[j].0[x]),
            dv: Array2::from_shape_fn((seqlen_k, head_dim), |(j, x)| dk_dv[j].1[x]),
            rows,
        }
    }
}
