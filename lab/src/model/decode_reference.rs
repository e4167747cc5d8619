//! The f64 reference for decoding: each sequence's keys and values gathered from the cache
//! (contiguous or through the block table), the KV head of each query head repeated by the GQA
//! mapping (query head h reads KV head h / (heads_q / heads_kv)), then the dense reference
//! ([`super::reference`]) with the bottom-right causal mask.

use ndarray::{Array4, ArrayView2, ArrayView4, Axis, s};

use flash_attn::dtype::Element;

use super::reference::{Reference, attention_in_dtype, attention_reference};

/// A decode problem on host arrays (f64 values of the dtype's inputs).
pub struct DecodeCase<'a> {
    /// (batch, heads_q, q_tokens, d).
    pub q: ArrayView4<'a, f64>,
    /// (batch, heads_kv, capacity, d), or (pages, heads_kv, page_size, d) with `block_table`.
    pub k_cache: ArrayView4<'a, f64>,
    pub v_cache: ArrayView4<'a, f64>,
    /// Keys each sequence attends to (after any append).
    pub seqlens: &'a [usize],
    pub block_table: Option<ArrayView2<'a, u32>>,
    pub causal: bool,
    pub scale: f64,
}

impl DecodeCase<'_> {
    /// Sequence b's (1, heads_q, seqlen, d) keys or values, KV heads repeated per query head.
    fn gathered(&self, cache: ArrayView4<f64>, b: usize) -> Array4<f64> {
        let (heads_q, head_dim) = (self.q.dim().1, self.q.dim().3);
        let group = heads_q / cache.dim().1;
        let seqlen = self.seqlens[b];
        Array4::from_shape_fn((1, heads_q, seqlen, head_dim), |(_, h, key, x)| {
            let kv_head = h / group;
            match self.block_table {
                None => cache[[b, kv_head, key, x]],
                Some(table) => {
                    let page_size = cache.dim().2;
                    let page = table[[b, key / page_size]] as usize;
                    cache[[page, kv_head, key % page_size, x]]
                }
            }
        })
    }

    /// Runs `attend` on each sequence's gathered problem and stacks O (and L).
    fn per_sequence(
        &self,
        attend: impl Fn(ArrayView4<f64>, ArrayView4<f64>, ArrayView4<f64>) -> Reference,
    ) -> Reference {
        let (batch, heads_q, q_tokens, head_dim) = self.q.dim();
        let mut o = Array4::zeros((batch, heads_q, q_tokens, head_dim));
        let mut logsumexp = ndarray::Array3::zeros((batch, heads_q, q_tokens));
        for b in 0..batch {
            let k = self.gathered(self.k_cache, b);
            let v = self.gathered(self.v_cache, b);
            let q = self.q.slice(s![b..b + 1, .., .., ..]);
            let result = attend(q, k.view(), v.view());
            o.index_axis_mut(Axis(0), b)
                .assign(&result.o.index_axis(Axis(0), 0));
            logsumexp
                .index_axis_mut(Axis(0), b)
                .assign(&result.logsumexp.index_axis(Axis(0), 0));
        }
        Reference { o, logsumexp }
    }
}

/// O and L in f64. A sequence with no keys, or a token that sees none, gives O = 0, L = −∞.
pub fn decode_reference(case: &DecodeCase) -> Reference {
    case.per_sequence(|q, k, v| attention_reference(q, k, v, case.causal, case.scale))
}

/// Standard attention computed in `T` (P and O rounded to it) on the same gathered problem: the
/// baseline of the half-precision tolerance.
pub fn decode_in_dtype<T: Element>(case: &DecodeCase) -> Array4<f64> {
    case.per_sequence(|q, k, v| {
        let rows: Vec<usize> = (0..q.dim().2).collect();
        let o = attention_in_dtype::<T>(q, k, v, case.causal, case.scale, &rows);
        let logsumexp = ndarray::Array3::zeros((1, q.dim().1, q.dim().2));
        Reference { o, logsumexp }
    })
    .o
}
