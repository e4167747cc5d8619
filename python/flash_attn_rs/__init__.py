"""FlashAttention as pure-Rust GPU kernels, on PyTorch CUDA tensors.

``flash_attn_func`` takes flash-attn's layout (batch, seqlen, heads, head_dim),
``scaled_dot_product_attention`` SDPA's (batch, heads, seqlen, head_dim); both take any strides
whose last one is 1, without copies, run on PyTorch's current CUDA stream in the device's primary
context, and return outputs that PyTorch allocated. Importing needs neither PyTorch nor a GPU.

Both are differentiable: a ``torch.autograd.Function`` (``_autograd``) saves Q, K, V, O and L,
and ``loss.backward()`` runs the GPU backward into gradients PyTorch allocates. ``flash_attn_func``
also takes flash-attn's ``window_size`` and ``softcap``, forward only (the backward names them).
``flash_attn_rs.transformers_attention.register()`` routes a ``transformers`` model's attention here.

How: this half checks the tensors (``_checks``), allocates outputs and gradients with PyTorch and
passes addresses, dims, strides and the stream to the native half (``_native``, Rust) as plain
integers (``_launch``); the native half checks them again with the host crate's checks, then
launches. CUDA graph capture is refused with a RuntimeError that says why.
"""

import math

from . import _launch, _native
from ._autograd import attention_function
from ._checks import FLASH_ATTN, SDPA, check_inputs

__all__ = [
    "ALGORITHMS",
    "flash_attn_func",
    "last_backward_plan",
    "last_plan",
    "reset_workspace_peak",
    "scaled_dot_product_attention",
    "workspace_peak_bytes",
]

#: The algorithms ``algorithm=`` takes; None is the fastest (FA3, falling back as the plan says).
ALGORITHMS = tuple(_native.ALGORITHMS)


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
        raise ValueError(f"algorithm is {algorithm!r}; allowed: None (the fastest) or one of "
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


def _attention(q, k, v, layout, softmax_scale, causal, algorithm, window_size=(-1, -1),
               softcap=0.0):
    """Checks every argument, then runs the autograd Function; returns (O, L)."""
    dtype = check_inputs(q, k, v, layout)
    softmax_scale = _check_options(softmax_scale, causal, algorithm)
    window, softcap = _check_scores(window_size, softcap)
    return attention_function().apply(q, k, v, layout, dtype, softmax_scale, causal, algorithm,
                                      window, softcap)


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    algorithm=None, return_lse=False):
    """Attention on flash-attn's layout: q (batch, seqlen_q, heads, head_dim), k and v
    (batch, seqlen_k, heads, head_dim), CUDA, float16, bfloat16 or float32, any strides with a
    contiguous last dim, read in place. ``softmax_scale`` defaults to 1/sqrt(head_dim);
    ``causal`` aligns the mask to the bottom-right corner (query i sees key j iff
    j <= i + seqlen_k - seqlen_q); ``algorithm`` is one of ``ALGORITHMS`` or None (the fastest
    for the device: FA3, which falls back to FA2-TC and FA2 where it cannot run).

    ``window_size = (left, right)`` is flash-attn's sliding window: query i sees key j iff
    i + off - left <= j <= i + off + right (off = seqlen_k - seqlen_q; -1 leaves a side
    unbounded; with ``causal`` right is 0); ``softcap`` > 0 turns each scaled score s into
    softcap * tanh(s / softcap) (Gemma 2). Both run forward only, on fa3 and fa2-tc (float16 and
    bfloat16); the backward raises a ValueError naming them, so no gradient is computed without
    them. A row that sees no key gets O = 0 and L = -inf.

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


def scaled_dot_product_attention(q, k, v, is_causal=False, scale=None):
    """Attention on SDPA's layout (batch, heads, seqlen, head_dim), like
    ``torch.nn.functional.scaled_dot_product_attention`` without a mask or dropout, with the
    fastest algorithm for the device; differentiable in q, k and v. One difference: with
    seqlen_q != seqlen_k, ``is_causal`` aligns the mask to the bottom-right corner as
    FlashAttention does (PyTorch's aligns it to the top-left). Returns O (q's shape)."""
    o, _ = _attention(q, k, v, SDPA, scale, is_causal, None)
    return o
