"""The f64 reference and the project's tolerance rule, in PyTorch, mirroring the Rust tests
(`lab/src/tools/check.rs`, `lab/src/model/reference.rs`, `tests/gpu/backward.rs`,
`lab/src/model/reference_backward.rs`):

- forward O: f32 within 1e-5 of max |O_ref|; f16/bf16 within 2 × (the error of standard
  attention computed in that dtype: inputs in the dtype, P and O rounded to it) + 1e-5;
- L within 1e-4 where the reference is finite, and -inf where it is -inf;
- dQ, dK, dV: f32 within 1e-4 × max(max |ref|, 1); f16/bf16 within 2 × (the error of the
  backward computed in that dtype: O rounded before D, P rounded before dV, dS rounded before dQ
  and dK, the gradients rounded) + one unit in the dtype's last place at max |ref| (flash-attn's
  absolute slack; a flat 1e-5 failed f32-accumulated gradients that were right, docs/perf).

Tensors here are in SDPA's layout (batch, heads, seqlen, head_dim); the exact reference is
float64 PyTorch math (its gradients by autograd), with FlashAttention's bottom-right causal mask.
Dropout enters as ``dropout = (keep, scale)``: the kept scores (bool, broadcast to
(batch, heads, seqlen_q, seqlen_k)) and 1 / (1 - p); O = (P * keep * scale) V, L undropped.
K and V may have fewer heads than Q (grouped-query attention): they are repeated per query head
(query head h reads K/V head h // group), so autograd sums dK and dV over each group; in the
dtype, each query head's part is rounded before the group's sum, and the sum rounded again.
"""

import math

import torch

F32_RELATIVE_TOLERANCE = 1e-5
HALF_ABSOLUTE_SLACK = 1e-5
LOGSUMEXP_TOLERANCE = 1e-4
BACKWARD_F32_RELATIVE_TOLERANCE = 1e-4
#: Stored fraction bits of each kernel dtype.
FRACTION_BITS = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7}


def repeat_kv(t, heads):
    """K or V with each of its heads repeated for the query heads that read it."""
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _group_sum(per_query_head, heads_kv, dtype):
    """dK or dV of one head per query head summed over each group, rounded to `dtype`."""
    b, h, n, d = per_query_head.shape
    if h == heads_kv:
        return per_query_head
    return _round(per_query_head.reshape(b, heads_kv, h // heads_kv, n, d).sum(2), dtype)


def window_mask(seqlen_q, seqlen_k, causal, window, device):
    """flash-attn's rule: query i sees key j iff i + off - left <= j <= i + off + right, with
    off = seqlen_k - seqlen_q (bottom-right aligned), -1 an unbounded side, and right = 0 when
    causal; no window (None) is (-1, -1)."""
    left, right = window if window is not None else (-1, -1)
    if causal:
        right = 0
    i = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= i - left
    if right >= 0:
        mask &= j <= i + right
    return mask


def alibi_bias(alibi, seqlen_q, seqlen_k, device):
    """flash-attn's ALiBi bias, -slope * |i + seqlen_k - seqlen_q - j|, float64, broadcast to
    (batch or 1, heads, seqlen_q, seqlen_k) from slopes (heads,) or (batch, heads)."""
    slopes = alibi.to(device=device, dtype=torch.float64)
    slopes = slopes[None] if slopes.dim() == 1 else slopes
    i = torch.arange(seqlen_q, device=device)[:, None] + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device)[None, :]
    return -slopes[:, :, None, None] * (i - j).abs().to(torch.float64)


def _probabilities(q, k, causal, scale, window=None, softcap=0.0, alibi=None):
    """P (exact softmax, 0 on rows that see no key), L (-inf there) and the visibility mask;
    soft-capping (softcap * tanh(s / softcap)) before the mask when `softcap` > 0, then ALiBi's
    bias when `alibi` (the slopes) is given."""
    k = repeat_kv(k, q.shape[1])
    s = scale * (q @ k.transpose(-1, -2))
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    seqlen_q, seqlen_k = q.shape[-2], k.shape[-2]
    if alibi is not None:
        s = s + alibi_bias(alibi, seqlen_q, seqlen_k, q.device)
    mask = window_mask(seqlen_q, seqlen_k, causal, window, q.device)
    visible = mask.any(-1)[:, None]  # (seqlen_q, 1)
    # Rows with no visible key get finite scores (discarded below), so nothing turns NaN.
    s = torch.where(mask, s, torch.where(visible, -math.inf, 0.0))
    p = torch.where(visible, torch.softmax(s, dim=-1), 0.0)
    lse = torch.where(visible[:, 0], torch.logsumexp(s, dim=-1), -math.inf)
    return p, lse


def dropped(p, dropout):
    """P with dropout's zeros and 1 / (1 - p) (``dropout = (keep, scale)``), or P itself."""
    if dropout is None:
        return p
    keep, keep_scale = dropout
    return p * keep.to(p.dtype) * keep_scale


def attention64(q, k, v, causal, scale, window=None, softcap=0.0, alibi=None, dropout=None):
    """O and L in float64 (inputs: float64, SDPA layout); differentiable in q, k, v."""
    p, lse = _probabilities(q, k, causal, scale, window, softcap, alibi)
    return dropped(p, dropout) @ repeat_kv(v, q.shape[1]), lse


def _per_sequence(attend, q, k, v, cu_seqlens_q, cu_seqlens_k, alibi=None):
    """``attend`` on each sequence of a packed batch (flash-attn's varlen layout: q (total_q,
    heads, d), k and v (total_k, heads_kv, d), the offsets as lists), each given in SDPA layout
    (1, heads, seqlen, d), with the sequence's ALiBi slopes (row b of (batch, heads) slopes,
    (heads,) slopes as they are, or None)."""
    def as_sdpa(t):
        return t.transpose(0, 1)[None]

    bounds = zip(cu_seqlens_q, cu_seqlens_q[1:], cu_seqlens_k, cu_seqlens_k[1:])
    return [attend(as_sdpa(q[q0:q1]), as_sdpa(k[k0:k1]), as_sdpa(v[k0:k1]),
                   alibi if alibi is None or alibi.dim() == 1 else alibi[b])
            for b, (q0, q1, k0, k1) in enumerate(bounds)]


def _packed_rows(per_sequence_o):
    """Each sequence's O (1, heads, seqlen, d) back into one (total_q, heads, d)."""
    return torch.cat([o[0].transpose(0, 1) for o in per_sequence_o])


def packed_attention64(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, window=None,
                       softcap=0.0, alibi=None, dropout=None):
    """O (total_q, heads, d) and L (heads, total_q) of a packed batch in float64, sequence by
    sequence (each its own mask corner; no keys: O = 0, L = -inf); ``dropout(b, seqlen_q,
    seqlen_k)`` gives sequence b's ``(keep, scale)`` (None: no dropout)."""
    lengths = iter(list(zip(range(len(cu_seqlens_q) - 1),
                            (b - a for a, b in zip(cu_seqlens_q, cu_seqlens_q[1:])),
                            (b - a for a, b in zip(cu_seqlens_k, cu_seqlens_k[1:])))))

    def attend(q, k, v, slopes):
        sequence = next(lengths)
        drop = None if dropout is None else dropout(*sequence)
        return attention64(q, k, v, causal, scale, window, softcap, slopes, drop)

    results = _per_sequence(attend, q, k, v, cu_seqlens_q, cu_seqlens_k, alibi)
    return (_packed_rows(o for o, _ in results),
            torch.cat([lse[0] for _, lse in results], dim=1))


def packed_attention_in_dtype(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, dtype,
                              window=None, softcap=0.0, alibi=None):
    """``attention_in_dtype`` (the forward baseline) of a packed batch, sequence by sequence."""
    return _packed_rows(_per_sequence(
        lambda q, k, v, slopes: attention_in_dtype(q, k, v, causal, scale, dtype, window,
                                                   softcap, slopes),
        q, k, v, cu_seqlens_q, cu_seqlens_k, alibi,
    ))


def _round(x, dtype):
    return x.to(dtype).to(torch.float64)


def attention_in_dtype(q, k, v, causal, scale, dtype, window=None, softcap=0.0, alibi=None,
                       dropout=None):
    """Standard attention as it would run in `dtype`: P and O rounded (the forward baseline)."""
    p, _ = _probabilities(q, k, causal, scale, window, softcap, alibi)
    return _round(_round(dropped(p, dropout), dtype) @ repeat_kv(v, q.shape[1]), dtype)


def _cap_slope(q, k, scale, softcap):
    """dS/ds of soft-capping at each pair, 1 - tanh(s / softcap)^2 (1 without capping): the
    backward multiplies P * (dP - D) by it."""
    if softcap <= 0:
        return 1.0
    s = scale * (q @ repeat_kv(k, q.shape[1]).transpose(-1, -2))
    return 1.0 - torch.tanh(s / softcap) ** 2


def backward_in_dtype(q, k, v, d_o, causal, scale, dtype, window=None, softcap=0.0,
                      alibi=None, dropout=None):
    """The backward as a kernel in `dtype` rounds it (the backward baseline)."""
    heads_kv = k.shape[1]
    p, _ = _probabilities(q, k, causal, scale, window, softcap, alibi)
    slope = _cap_slope(q, k, scale, softcap)
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    p_dropped = dropped(p, dropout)
    o = p_dropped @ v
    delta = (_round(o, dtype) * d_o).sum(-1, keepdim=True)
    d_p = dropped(d_o @ v.transpose(-1, -2), dropout)
    d_s = _round(p * (d_p - delta) * slope, dtype)
    dv = _round(_round(p_dropped, dtype).transpose(-1, -2) @ d_o, dtype)
    dq = _round(scale * (d_s @ k), dtype)
    dk = _round(scale * (d_s.transpose(-1, -2) @ q), dtype)
    return dq, _group_sum(dk, heads_kv, dtype), _group_sum(dv, heads_kv, dtype)


def gradients64(q, k, v, d_o, causal, scale, window=None, softcap=0.0, alibi=None,
                dropout=None):
    """dQ, dK, dV of float64 attention by autograd."""
    with torch.enable_grad():  # also inside a custom Function's backward
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        o, _ = attention64(*leaves, causal, scale, window, softcap, alibi, dropout)
        return torch.autograd.grad(o, leaves, d_o)


def gradients64_by_formula(q, k, v, d_o, causal, scale, window=None, softcap=0.0, alibi=None,
                           dropout=None):
    """``gradients64`` without autograd, by the backward's formulas (Dao 2023, Algorithm 2):
    dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P ∘ (dP − rowsum(dO ∘ O)) (times the soft-cap's slope),
    dQ = scale·dS·K, dK = scale·dSᵀ·Q, dK and dV summed over each group of query heads; with
    dropout dV = P̃ᵀ·dO and dP is dropped as P̃ is. For code that runs where autograd records
    nothing (inside a custom operator's implementation)."""
    heads, heads_kv = q.shape[1], k.shape[1]
    p, _ = _probabilities(q, k, causal, scale, window, softcap, alibi)
    slope = _cap_slope(q, k, scale, softcap)
    k_e, v_e = repeat_kv(k, heads), repeat_kv(v, heads)
    p_dropped = dropped(p, dropout)
    o = p_dropped @ v_e
    d_p = dropped(d_o @ v_e.transpose(-1, -2), dropout)
    d_s = p * (d_p - (d_o * o).sum(-1, keepdim=True)) * slope
    d_q = scale * d_s @ k_e
    d_k = scale * d_s.transpose(-1, -2) @ q
    d_v = p_dropped.transpose(-1, -2) @ d_o

    def group_sum(t):
        b, _, n, d = t.shape
        return t.reshape(b, heads_kv, heads // heads_kv, n, d).sum(2)

    return d_q, group_sum(d_k), group_sum(d_v)


def max_error(got, want):
    """max |got - want| in float64, and whether every element of `got` is finite."""
    got = got.to(torch.float64)
    return (got - want).abs().max().item(), bool(torch.isfinite(got).all())


def forward_bound(o_ref, o_in_dtype, dtype):
    if dtype == torch.float32:
        return F32_RELATIVE_TOLERANCE * max(o_ref.abs().max().item(), 1e-300)
    return 2.0 * max_error(o_in_dtype, o_ref)[0] + HALF_ABSOLUTE_SLACK


def unit_in_last_place(dtype, magnitude):
    """The spacing of `dtype`'s values around `magnitude` (the spacing at 1 for 0), as the Rust
    `DType::unit_in_last_place`."""
    exponent = math.floor(math.log2(magnitude)) if magnitude > 0 else 0
    return 2.0 ** (exponent - FRACTION_BITS[dtype])


def backward_bound(g_ref, g_in_dtype, dtype):
    largest = g_ref.abs().max().item()
    if dtype == torch.float32:
        return BACKWARD_F32_RELATIVE_TOLERANCE * max(largest, 1.0)
    return 2.0 * max_error(g_in_dtype, g_ref)[0] + unit_in_last_place(dtype, largest)


def logsumexp_error(lse, lse_ref):
    """The largest |L - L_ref| where L_ref is finite; inf where L_ref is -inf and L is not."""
    lse = lse.to(torch.float64)
    finite = torch.isfinite(lse_ref)
    error = (lse - lse_ref).abs().where(finite, 0.0).max().item() if finite.any() else 0.0
    if not torch.equal(lse[~finite], lse_ref[~finite]):
        return math.inf
    return error if not math.isnan(error) else math.inf
