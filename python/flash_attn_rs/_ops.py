"""The launches as PyTorch custom operators (``torch.library.custom_op``):
``flash_attn_rs::forward`` (dense batches), ``flash_attn_rs::varlen_forward`` (packed),
``flash_attn_rs::backward``, ``flash_attn_rs::varlen_backward`` and ``flash_attn_rs::kvcache``
(which writes the appended keys and values into its caches: ``mutates_args``), each with a fake
implementation (the outputs' shapes, dtypes and strides, computed without launching), so that
``torch.compile`` traces a model through them without a graph break and ``torch.export`` sees
them. The functions call them while PyTorch
compiles; in eager mode they call the ``torch.autograd.Function``s of ``_autograd``, the same
launches for less host time (with the launches stubbed, on a 2-core machine: a forward and
backward 199–226 µs through the operators, 112–130 µs through the Functions). The forward's
autograd formula is the backward operator on the saved Q, K, V, O and L (the GPU backward
recomputing P from L); L is not differentiable. With dropout the forward operator draws its seed
and offset from PyTorch's generator when it runs (never while tracing) and returns them as
flash-attn's ``rng_state``, which the backward operator takes. The packed forward's formula
is ``flash_attn_rs::varlen_backward`` (``_launch.varlen_backward``: the packed backward
kernels). Defined on first use, so
importing flash_attn_rs needs no PyTorch; the wheel links no libtorch (the registration is
Python)."""

from . import _dropout, _launch
from ._autograd import draw_dropout
from ._checks import FLASH_ATTN, PACKED, dims_and_strides

_defined = None


def ops():
    """The operators (forward, varlen_forward, backward, varlen_backward, kvcache), defined
    once."""
    global _defined
    if _defined is None:
        _defined = _define()
    return _defined


def _dropout_of(dropout_p, rng_state):
    """The launch's dropout (p, seed, offset) from the forward's ``rng_state``; None for p = 0."""
    if not dropout_p:
        return None
    return (dropout_p, *_dropout.from_state_tensor(rng_state))


def _window(window):
    """A window as the schema carries it (a list of two ints, or None) back to the launch's pair."""
    return None if window is None else (int(window[0]), int(window[1]))


def _define():
    from typing import List, Optional, Tuple

    import torch
    from torch import Tensor

    def statistics_like(q, layout):
        """L as the forward returns it: float32 contiguous (batch, heads, seqlen_q), a packed
        batch's (heads, total_q)."""
        rows = dims_and_strides(q, layout)[0][:3]
        return q.new_empty(rows[1:] if layout == PACKED else rows, dtype=torch.float32)

    # The forwards draw dropout's seed and offset when they run: never merged or reordered as
    # pure functions of their inputs (`tags`, where this PyTorch's custom_op takes them).
    import inspect

    seeded = ({"tags": (torch.Tag.nondeterministic_seeded,)}
              if "tags" in inspect.signature(torch.library.custom_op).parameters else {})

    @torch.library.custom_op("flash_attn_rs::forward", mutates_args=(), **seeded)
    def forward(q: Tensor, k: Tensor, v: Tensor, layout: str, dtype: str,
                softmax_scale: Optional[float], causal: bool, algorithm: Optional[str],
                window: Optional[List[int]], softcap: float, alibi_slopes: Optional[Tensor],
                dropout_p: float, deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
        # `deterministic` is the backward's, carried here for the autograd formula.
        dropout, rng_state = draw_dropout(torch, q, dropout_p)
        o, lse = _launch.forward(q, k, v, layout, dtype, softmax_scale, causal, algorithm,
                                 window=_window(window), softcap=softcap,
                                 alibi_slopes=alibi_slopes, dropout=dropout)
        return o, lse, rng_state

    def rng_state_like(dropout_p):
        return torch.empty(2 if dropout_p else 0, dtype=torch.int64, device="cpu")

    @forward.register_fake
    def _(q, k, v, layout, dtype, softmax_scale, causal, algorithm, window, softcap,
          alibi_slopes, dropout_p, deterministic):
        return q.new_empty(q.shape), statistics_like(q, layout), rng_state_like(dropout_p)

    @torch.library.custom_op("flash_attn_rs::varlen_forward", mutates_args=(), **seeded)
    def varlen_forward(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor,
                       cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, dtype: str,
                       softmax_scale: Optional[float], causal: bool, algorithm: Optional[str],
                       window: Optional[List[int]], softcap: float, alibi_slopes: Optional[Tensor],
                       dropout_p: float, deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
        dropout, rng_state = draw_dropout(torch, q, dropout_p)
        o, lse = _launch.forward(q, k, v, PACKED, dtype, softmax_scale, causal, algorithm,
                                 window=_window(window), softcap=softcap,
                                 alibi_slopes=alibi_slopes, dropout=dropout,
                                 packed=(cu_seqlens_q, cu_seqlens_k, (max_seqlen_q, max_seqlen_k)))
        return o, lse, rng_state

    @varlen_forward.register_fake
    def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dtype,
          softmax_scale, causal, algorithm, window, softcap, alibi_slopes, dropout_p,
          deterministic):
        return q.new_empty(q.shape), statistics_like(q, PACKED), rng_state_like(dropout_p)

    @torch.library.custom_op("flash_attn_rs::varlen_backward", mutates_args=())
    def varlen_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, d_o: Tensor,
                        cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                        max_seqlen_k: int, dtype: str, softmax_scale: Optional[float],
                        causal: bool, window: Optional[List[int]], softcap: float,
                        alibi_slopes: Optional[Tensor], deterministic: bool, dropout_p: float,
                        rng_state: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        return _launch.varlen_backward(q, k, v, o, lse, d_o, cu_seqlens_q, cu_seqlens_k,
                                       (max_seqlen_q, max_seqlen_k), dtype, softmax_scale, causal,
                                       window=_window(window), softcap=softcap,
                                       alibi_slopes=alibi_slopes, deterministic=deterministic,
                                       dropout=_dropout_of(dropout_p, rng_state))

    @varlen_backward.register_fake
    def _(q, k, v, o, lse, d_o, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dtype,
          softmax_scale, causal, window, softcap, alibi_slopes, deterministic, dropout_p,
          rng_state):
        return tuple(torch.empty_like(t) for t in (q, k, v))

    @torch.library.custom_op("flash_attn_rs::backward", mutates_args=())
    def backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, d_o: Tensor,
                 layout: str, dtype: str, softmax_scale: Optional[float], causal: bool,
                 window: Optional[List[int]], softcap: float, alibi_slopes: Optional[Tensor],
                 deterministic: bool, dropout_p: float,
                 rng_state: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        return tuple(_launch.backward(q, k, v, o, lse, d_o, layout, dtype, softmax_scale,
                                      causal, window=_window(window), softcap=softcap,
                                      alibi_slopes=alibi_slopes, deterministic=deterministic,
                                      dropout=_dropout_of(dropout_p, rng_state)))

    @backward.register_fake
    def _(q, k, v, o, lse, d_o, layout, dtype, softmax_scale, causal, window, softcap,
          alibi_slopes, deterministic, dropout_p, rng_state):
        return tuple(torch.empty_like(t) for t in (q, k, v))

    def save_forward(ctx, inputs, output):
        q, k, v, layout, dtype, softmax_scale, causal, _, window, softcap, alibi_slopes, \
            dropout_p, deterministic = inputs
        o, lse, rng_state = output
        ctx.save_for_backward(q, k, v, o, lse, rng_state)
        ctx.arguments = (layout, dtype, softmax_scale, causal, window, softcap, alibi_slopes,
                         deterministic, dropout_p)
        ctx.mark_non_differentiable(lse, rng_state)

    def forward_gradient(ctx, d_o, _d_lse, _d_rng_state):
        q, k, v, o, lse, rng_state = ctx.saved_tensors
        dq, dk, dv = backward(q, k, v, o, lse, d_o, *ctx.arguments, rng_state)
        return (dq, dk, dv) + (None,) * 10

    forward.register_autograd(forward_gradient, setup_context=save_forward)

    def save_varlen(ctx, inputs, output):
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dtype, softmax_scale, \
            causal, _, window, softcap, alibi_slopes, dropout_p, deterministic = inputs
        o, lse, rng_state = output
        ctx.save_for_backward(q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, rng_state)
        ctx.arguments = (max_seqlen_q, max_seqlen_k, dtype, softmax_scale, causal, window,
                         softcap, alibi_slopes, deterministic, dropout_p)
        ctx.mark_non_differentiable(lse, rng_state)

    def varlen_gradient(ctx, d_o, _d_lse, _d_rng_state):
        q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, rng_state = ctx.saved_tensors
        dq, dk, dv = varlen_backward(q, k, v, o, lse, d_o, cu_seqlens_q, cu_seqlens_k,
                                     *ctx.arguments, rng_state)
        return (dq, dk, dv) + (None,) * 13

    varlen_forward.register_autograd(varlen_gradient, setup_context=save_varlen)

    @torch.library.custom_op("flash_attn_rs::kvcache", mutates_args=("k_cache", "v_cache"))
    def kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k_new: Optional[Tensor],
                v_new: Optional[Tensor], dtype: str, softmax_scale: Optional[float], causal: bool,
                cache_seqlens: Tensor, block_table: Optional[Tensor],
                num_splits: Optional[int]) -> Tuple[Tensor, Tensor]:
        # The lengths and the table are read on the host here, inside the operator, so that
        # tracing never reads a tensor's values.
        table = None if block_table is None else block_table.tolist()
        return _launch.decode(q, k_cache, v_cache, k_new, v_new, dtype, softmax_scale, causal,
                              cache_seqlens.tolist(), table, num_splits)

    @kvcache.register_fake
    def _(q, k_cache, v_cache, k_new, v_new, dtype, softmax_scale, causal, cache_seqlens,
          block_table, num_splits):
        return q.new_empty(q.shape), statistics_like(q, FLASH_ATTN)

    return forward, varlen_forward, backward, varlen_backward, kvcache
