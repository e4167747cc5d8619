"""The ``torch.autograd.Function``s: the forward saves Q, K, V, O and L; ``loss.backward()`` runs
the GPU backward ("auto": FA3's on Hopper, FA2-TC's elsewhere, recomputing P from L) into
gradients PyTorch allocates. The packed
(varlen) forward has no backward yet: its Function raises one clear error when backward reaches
it. Built on first use, so importing flash_attn_rs needs no PyTorch."""

from . import _launch
from ._checks import PACKED

#: Why ``flash_attn_varlen_func`` has no gradient (raised when ``backward`` reaches it).
PACKED_BACKWARD_MISSING = (
    "flash_attn_varlen_func has no backward yet: the packed (varlen) backward is not built in "
    "the Rust library (only its forward is). Call it under torch.no_grad(), on inputs that do not "
    "require grad, or use flash_attn_func (differentiable) per sequence"
)

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
    """The autograd Function class of packed batches (forward only)."""
    return _built(_make_packed_function)


def _make_function():
    import torch
    from torch.autograd.function import once_differentiable

    class FlashAttention(torch.autograd.Function):
        """O, L = attention(Q, K, V); L is not differentiable (its gradient is ignored)."""

        @staticmethod
        def forward(ctx, q, k, v, layout, dtype, softmax_scale, causal, algorithm, window,
                    softcap, deterministic):
            o, lse = _launch.forward(q, k, v, layout, dtype, softmax_scale, causal, algorithm,
                                     window=window, softcap=softcap)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.layout, ctx.dtype = layout, dtype
            ctx.window, ctx.softcap = window, softcap
            ctx.deterministic = deterministic
            ctx.softmax_scale, ctx.causal = softmax_scale, causal
            ctx.mark_non_differentiable(lse)
            return o, lse

        @staticmethod
        @once_differentiable
        def backward(ctx, d_o, _d_lse):
            q, k, v, o, lse = ctx.saved_tensors
            dq, dk, dv = _launch.backward(
                q, k, v, o, lse, d_o, ctx.layout, ctx.dtype, ctx.softmax_scale, ctx.causal,
                window=ctx.window, softcap=ctx.softcap, deterministic=ctx.deterministic,
            )
            return dq, dk, dv, None, None, None, None, None, None, None, None

    return FlashAttention


def _make_packed_function():
    import torch
    from torch.autograd.function import once_differentiable

    class FlashAttentionVarlen(torch.autograd.Function):
        """O, L = attention over packed sequences. A Function (not a plain call) so that O of
        inputs that require grad has a grad_fn, whose backward raises NotImplementedError: never
        a silently missing gradient. It saves nothing, since nothing would use it."""

        @staticmethod
        def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlens, dtype, softmax_scale,
                    causal, algorithm, window, softcap):
            o, lse = _launch.forward(q, k, v, PACKED, dtype, softmax_scale, causal, algorithm,
                                     window=window, softcap=softcap,
                                     packed=(cu_seqlens_q, cu_seqlens_k, max_seqlens))
            ctx.mark_non_differentiable(lse)
            return o, lse

        @staticmethod
        @once_differentiable
        def backward(ctx, d_o, _d_lse):
            raise NotImplementedError(PACKED_BACKWARD_MISSING)

    return FlashAttentionVarlen
