"""FlashAttention as pure-Rust GPU kernels, on PyTorch CUDA tensors.

``flash_attn_func`` takes flash-attn's layout (batch, seqlen, heads, head_dim),
``scaled_dot_product_attention`` SDPA's (batch, heads, seqlen, head_dim), and
``flash_attn_varlen_func`` flash-attn's packed batches of sequences of different lengths
(total_tokens, heads, head_dim) with their offsets ``cu_seqlens_q``, ``cu_seqlens_k``; all take
any strides whose last one is 1, without copies, run on PyTorch's current CUDA stream in the
device's primary context, and return outputs that PyTorch allocated. Importing needs neither
PyTorch nor a GPU.

The first two are differentiable: a ``torch.autograd.Function`` (``_autograd``) saves Q, K, V, O
and L, and ``loss.backward()`` runs the GPU backward into gradients PyTorch allocates.
``flash_attn_func`` also takes flash-attn's ``window_size`` and ``softcap``, forward only (the
backward names them). ``flash_attn_varlen_func`` is forward only (its backward raises
NotImplementedError: the library has no packed backward yet).
``flash_attn_rs.transformers_attention.register()`` routes a ``transformers`` model's attention here.

How: this half checks the tensors (``_checks``), allocates outputs and gradients with PyTorch and
passes addresses, dims, strides and the stream to the native half (``_native``, Rust) as plain
integers (``_launch``); the native half checks them again with the host crate's checks, then
launches. CUDA graph capture is refused with a RuntimeError that says why.
"""

import math
import operator

from . import _launch, _native
from ._autograd import attention_function, packed_attention_function
from ._checks import FLASH_ATTN, PACKED, SDPA, check_inputs, check_offsets

__all__ = [
    "ALGORITHMS",
    "PACKED_ALGORITHMS",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "last_backward_plan",
    "last_plan",
    "reset_workspace_peak",
    "scaled_dot_product_attention",
    "workspace_peak_bytes",
]

#: The algorithms ``algorithm=`` takes; None is "auto": fa3 on Hopper, fa2-tc elsewhere, falling
#: back where it cannot run; the plan says why.
ALGORITHMS = tuple(_native.ALGORITHMS)
#: Those that run a packed batch (``flash_attn_varlen_func``); None is "auto" there too.
PACKED_ALGORITHMS = tuple(_native.PACKED_ALGORITHMS)


def last_plan():
    """The plan of the last forward call on this process, one line: the kernels that ran and, for
    a fallback, why (None before the first call)."""
    return _launch.plans["forward"]


def last_backward_plan():
    """The plan of the last backward call on this process, one line (None before the first)."""
    return _launch.plans["backward"]


def workspace_peak_bytes(device=0):
    """The most device memory the library's own workspace (the backward's D and f32 dQ
    accumulator; standard attention's S and P; FA1's accumulator) held at once on CUDA device
    ``device`` (an index) since ``reset_workspace_peak``, in bytes. It comes from the driver's
    stream-ordered pool, not PyTorch's allocator, so ``torch.cuda.max_memory_allocated`` does not
    include it."""
    return _native.workspace_peak_bytes(int(device))


def reset_workspace_peak(device=0):
    """Starts a new ``workspace_peak_bytes`` measurement on CUDA device ``device``."""
    _native.reset_workspace_peak(int(device))


def _check_scores(window_size, softcap):
    """flash-attn's ``window_size`` (two ints, each -1 for unbounded or >= 0) and ``softcap`` (a
    finite float >= 0); returns (window or None for (-1, -1), softcap as a float)."""
    if (not isinstance(window_size, (tuple, list)) or len(window_size) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in window_size)):
        raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
    left, right = window_size
    if left < -1 or right < -1:
        raise ValueError(f"window_size is {tuple(window_size)}; each side is -1 (unbounded) or "
                         "a number of keys >= 0")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if not math.isfinite(softcap) or softcap < 0:
        raise ValueError(f"softcap is {softcap}; allowed: 0 (off) or a finite value > 0")
    window = None if (left, right) == (-1, -1) else (left, right)
    return window, float(softcap)


def _check_options(softmax_scale, causal, algorithm):
    if algorithm is not None and not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a str or None, got {type(algorithm).__name__}")
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm is {algorithm!r}; allowed: None (auto) or one of "
                         f"{', '.join(ALGORITHMS)}")
    if softmax_scale is not None and (
        isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float))
    ):
        raise TypeError(
            f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    return None if softmax_scale is None else float(softmax_scale)


def _check_all_options(softmax_scale, causal, algorithm, window_size, softcap):
    """Every option but the tensors; returns (softmax_scale, window, softcap) as the launches take
    them."""
    softmax_scale = _check_options(softmax_scale, causal, algorithm)
    return (softmax_scale, *_check_scores(window_size, softcap))


def _attention(q, k, v, layout, softmax_scale, causal, algorithm, window_size=(-1, -1),
               softcap=0.0):
    """Checks every argument, then runs the autograd Function; returns (O, L)."""
    dtype = check_inputs(q, k, v, layout)
    softmax_scale, window, softcap = _check_all_options(softmax_scale, causal, algorithm,
                                                        window_size, softcap)
    return attention_function().apply(q, k, v, layout, dtype, softmax_scale, causal, algorithm,
                                      window, softcap)


def _check_max_seqlen(name, value):
    """flash-attn's ``max_seqlen_q`` or ``max_seqlen_k``: an int >= 0 (anything with
    ``__index__``: a numpy int, a one-element integer tensor)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < 0:
        raise ValueError(f"{name} is {value}; allowed: the longest sequence's length or more")
    return value


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    algorithm=None, return_lse=False):
    """Attention on flash-attn's layout: q (batch, seqlen_q, heads, head_dim), k and v
    (batch, seqlen_k, heads, head_dim), CUDA, float16, bfloat16 or float32, any strides with a
    contiguous last dim, read in place. ``softmax_scale`` defaults to 1/sqrt(head_dim);
    ``causal`` aligns the mask to the bottom-right corner (query i sees key j iff
    j <= i + seqlen_k - seqlen_q); ``algorithm`` is one of ``ALGORITHMS`` or None ("auto": fa3
    on Hopper, fa2-tc elsewhere, falling back where it cannot run; the plan says why).

    ``window_size = (left, right)`` is flash-attn's sliding window: query i sees key j iff
    i + off - left <= j <= i + off + right (off = seqlen_k - seqlen_q; -1 leaves a side
    unbounded; with ``causal`` right is 0); ``softcap`` > 0 turns each scaled score s into
    softcap * tanh(s / softcap) (Gemma 2). Both run forward only, on auto, fa3 and fa2-tc
    (float16 and bfloat16); the backward raises a ValueError naming them, so no gradient is
    computed without them. A row that sees no key gets O = 0 and L = -inf.

    Returns O (q's shape, allocated by PyTorch), and with ``return_lse`` also
    L = logsumexp of the scaled scores, float32 (batch, heads, seqlen_q), -inf for a row that sees
    no key. Differentiable in q, k and v (``loss.backward()`` runs the backward on the GPU: FA3's
    on compute capability 9.0) without a window or soft-capping; L is not. Raises TypeError or
    ValueError naming the argument before anything is launched, RuntimeError inside a CUDA graph
    capture.
    """
    o, lse = _attention(q, k, v, FLASH_ATTN, softmax_scale, causal, algorithm, window_size,
                        softcap)
    return (o, lse) if return_lse else o


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           algorithm=None, return_lse=False):
    """flash-attn's varlen call: attention over a packed batch of sequences of different lengths,
    each attending to its own keys only. q is (total_q, heads, head_dim), k and v
    (total_k, heads_kv, head_dim) (heads_kv divides heads: grouped-query heads, read in place),
    every sequence's rows one after the other; CUDA, float16 or bfloat16, any strides with a
    contiguous last dim, read in place. Sequence b's queries are q's rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and its keys and values k's and v's rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``.

    ``cu_seqlens_q``, ``cu_seqlens_k``: batch + 1 offsets each, from 0, never decreasing, the last
    one q's (k's) rows; int32 as in flash-attn, or int64; on q's device or on the CPU. They are
    read on the host (the library launches one grid per table of up to 255 sequences and sizes it
    from them), so offsets on the GPU are copied with ``.tolist()``, which waits for the work
    queued on the current stream: a synchronization per call. Pass CPU offsets to avoid it.

    ``max_seqlen_q``, ``max_seqlen_k``: flash-attn's bounds on the longest sequence, ints. Each is
    checked to be at least the longest sequence its offsets give (a smaller one, which would leave
    rows unwritten in flash-attn, is a ValueError naming it); the grid is sized by the longest
    sequence itself, so a larger bound costs nothing.

    ``softmax_scale``, ``causal``, ``window_size`` and ``softcap`` are ``flash_attn_func``'s,
    applied to each sequence alone: its causal mask and window aligned to its own bottom-right
    corner. ``algorithm`` is None or one of ``PACKED_ALGORITHMS``: "auto" (None; fa3 on Hopper,
    fa2-tc elsewhere; the plan says why), "fa3" (on compute capability 9.0, elsewhere it runs
    fa2-tc and the plan says why) or "fa2-tc". A sequence may
    be empty: without keys its rows get O = 0 and L = -inf, without queries it writes nothing;
    q and k need at least one row each.

    Returns O (q's shape, allocated by PyTorch), and with ``return_lse`` also L = logsumexp of the
    scaled scores, float32 (heads, total_q) as flash-attn's varlen L, -inf for a row that sees no
    key. Forward only: O of inputs that require grad has a grad_fn, but ``backward`` raises
    NotImplementedError (the library has no packed backward yet) rather than return no gradient.
    Raises TypeError or ValueError naming the argument before anything is launched (the offsets'
    values are checked once read), RuntimeError inside a CUDA graph capture (before the offsets
    are copied, so the capture stays valid).
    """
    dtype = check_inputs(q, k, v, PACKED)
    check_offsets("cu_seqlens_q", cu_seqlens_q, q)
    check_offsets("cu_seqlens_k", cu_seqlens_k, q)
    max_seqlens = (_check_max_seqlen("max_seqlen_q", max_seqlen_q),
                   _check_max_seqlen("max_seqlen_k", max_seqlen_k))
    softmax_scale, window, softcap = _check_all_options(softmax_scale, causal, algorithm,
                                                        window_size, softcap)
    o, lse = packed_attention_function().apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlens,
                                               dtype, softmax_scale, causal, algorithm, window,
                                               softcap)
    return (o, lse) if return_lse else o


def scaled_dot_product_attention(q, k, v, is_causal=False, scale=None):
    """Attention on SDPA's layout (batch, heads, seqlen, head_dim), like
    ``torch.nn.functional.scaled_dot_product_attention`` without a mask or dropout, with the
    fastest algorithm for the device; differentiable in q, k and v. One difference: with
    seqlen_q != seqlen_k, ``is_causal`` aligns the mask to the bottom-right corner as
    FlashAttention does (PyTorch's aligns it to the top-left). Returns O (q's shape)."""
    o, _ = _attention(q, k, v, SDPA, scale, is_causal, None)
    return o
