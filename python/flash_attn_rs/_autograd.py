"""The ``torch.autograd.Function``s that eager calls run (``torch.compile`` runs the same launches
as the custom operators of ``_ops``): the forward saves Q, K, V, O and L; ``loss.backward()``
runs the GPU backward ("auto": FA3's on Hopper, FA2-TC's elsewhere, recomputing P from L) into
gradients PyTorch allocates; the packed forward's backward is ``_launch.varlen_backward`` (the
packed backward kernels, each sequence against its own keys). With dropout the forward takes its
seed and offset from PyTorch's generator (``_dropout.generator_state``) and the backward
recomputes the same mask from them. Built on first use, so
importing flash_attn_rs needs no PyTorch."""

from . import _dropout, _launch
from ._checks import PACKED

_functions = {}


def _built(make):
    """The Function class ``make`` creates (once, on first call)."""
    if make not in _functions:
        _functions[make] = make()
    return _functions[make]


def attention_function():
    """The autograd Function class of dense batches."""
    return _built(_make_function)


def packed_attention_function():
    """The autograd Function class of packed batches."""
    return _built(_make_packed_function)


def _make_function():
    import torch
    from torch.autograd.function import once_differentiable

    class FlashAttention(torch.autograd.Function):
        """O, L, rng_state = attention(Q, K, V); L and rng_state (dropout's seed and offset, an
        int64 CPU tensor; empty without dropout) are not differentiable."""

        @staticmethod
        def forward(ctx, q, k, v, layout, dtype, softmax_scale, causal, algorithm, window,
                    softcap, alibi_slopes, dropout_p, deterministic):
            dropout, rng_state = draw_dropout(torch, q, dropout_p)
            o, lse = _launch.forward(q, k, v, layout, dtype, softmax_scale, causal, algorithm,
                                     window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                     dropout=dropout)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.layout, ctx.dtype = layout, dtype
            ctx.window, ctx.softcap, ctx.alibi_slopes = window, softcap, alibi_slopes
            ctx.dropout, ctx.deterministic = dropout, deterministic
            ctx.softmax_scale, ctx.causal = softmax_scale, causal
            ctx.mark_non_differentiable(lse, rng_state)
            return o, lse, rng_state

        @staticmethod
        @once_differentiable
        def backward(ctx, d_o, _d_lse, _d_rng_state):
            q, k, v, o, lse = ctx.saved_tensors
            dq, dk, dv = _launch.backward(
                q, k, v, o, lse, d_o, ctx.layout, ctx.dtype, ctx.softmax_scale, ctx.causal,
                window=ctx.window, softcap=ctx.softcap, alibi_slopes=ctx.alibi_slopes,
                deterministic=ctx.deterministic, dropout=ctx.dropout,
            )
            return (dq, dk, dv) + (None,) * 10

    return FlashAttention


def _make_packed_function():
    import torch
    from torch.autograd.function import once_differentiable

    class FlashAttentionVarlen(torch.autograd.Function):
        """O, L, rng_state = attention over packed sequences; L and rng_state are not
        differentiable."""

        @staticmethod
        def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlens, dtype, softmax_scale,
                    causal, algorithm, window, softcap, alibi_slopes, dropout_p, deterministic):
            dropout, rng_state = draw_dropout(torch, q, dropout_p)
            o, lse = _launch.forward(q, k, v, PACKED, dtype, softmax_scale, causal, algorithm,
                                     window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                                     packed=(cu_seqlens_q, cu_seqlens_k, max_seqlens),
                                     dropout=dropout)
            ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k)
            ctx.arguments = (max_seqlens, dtype, softmax_scale, causal, window, softcap,
                             alibi_slopes, deterministic, dropout)
            ctx.mark_non_differentiable(lse, rng_state)
            return o, lse, rng_state

        @staticmethod
        @once_differentiable
        def backward(ctx, d_o, _d_lse, _d_rng_state):
            q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
            max_seqlens, dtype, softmax_scale, causal, window, softcap, alibi_slopes, \
                deterministic, dropout = ctx.arguments
            dq, dk, dv = _launch.varlen_backward(
                q, k, v, o, lse, d_o, cu_seqlens_q, cu_seqlens_k, max_seqlens, dtype,
                softmax_scale, causal, window=window, softcap=softcap, alibi_slopes=alibi_slopes,
                deterministic=deterministic, dropout=dropout,
            )
            return (dq, dk, dv) + (None,) * 12

    return FlashAttentionVarlen


def draw_dropout(torch, q, dropout_p):
    """Dropout's launch argument (p, seed, offset) for one forward on q's device, drawn from
    PyTorch's generator, and flash-attn's ``rng_state`` (int64 (seed, offset) on the CPU); None
    and an empty ``rng_state`` for p = 0."""
    if not dropout_p:
        return None, torch.empty(0, dtype=torch.int64)
    seed, offset = _dropout.generator_state(q.device)
    return (dropout_p, seed, offset), _dropout.state_tensor(seed, offset)
