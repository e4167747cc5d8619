"""The ``torch.autograd.Function``: the forward saves Q, K, V, O and L; ``loss.backward()`` runs
the GPU backward (FA2's, recomputing P from L) into gradients PyTorch allocates. Built on first
use, so importing flash_attn_rs needs no PyTorch."""

from . import _launch

_function = None


def attention_function():
    """The autograd Function class (created once, on first call)."""
    global _function
    if _function is None:
        _function = _make_function()
    return _function


def _make_function():
    import torch
    from torch.autograd.function import once_differentiable

    class FlashAttention(torch.autograd.Function):
        """O, L = attention(Q, K, V); L is not differentiable (its gradient is ignored)."""

        @staticmethod
        def forward(ctx, q, k, v, layout, dtype, softmax_scale, causal, algorithm, window,
                    softcap):
            o, lse = _launch.forward(q, k, v, layout, dtype, softmax_scale, causal, algorithm,
                                     window=window, softcap=softcap)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.layout, ctx.dtype = layout, dtype
            ctx.window, ctx.softcap = window, softcap
            ctx.softmax_scale, ctx.causal = softmax_scale, causal
            ctx.mark_non_differentiable(lse)
            return o, lse

        @staticmethod
        @once_differentiable
        def backward(ctx, d_o, _d_lse):
            q, k, v, o, lse = ctx.saved_tensors
            dq, dk, dv = _launch.backward(
                q, k, v, o, lse, d_o, ctx.layout, ctx.dtype, ctx.softmax_scale, ctx.causal,
                window=ctx.window, softcap=ctx.softcap,
            )
            return dq, dk, dv, None, None, None, None, None, None, None

    return FlashAttention
