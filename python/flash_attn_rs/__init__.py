"""FlashAttention as pure-Rust GPU kernels, on PyTorch CUDA tensors.

``flash_attn_func`` takes flash-attn's layout (batch, seqlen, heads, head_dim),
``scaled_dot_product_attention`` SDPA's (batch, heads, seqlen, head_dim); both take any strides
whose last one is 1, without copies, run on PyTorch's current CUDA stream in the device's primary
context, and return outputs that PyTorch allocated. Importing needs neither PyTorch nor a GPU.

How: this half checks the tensors (``_checks``), allocates the outputs with ``torch.empty`` and
passes addresses, dims, strides and the stream to the native half (``_native``, Rust) as plain
integers; the native half checks them again with the host crate's checks, then launches.
"""

from . import _native
from ._checks import FLASH_ATTN, SDPA, check_inputs, dims_and_strides

__all__ = ["ALGORITHMS", "flash_attn_func", "last_plan", "scaled_dot_product_attention"]

#: The algorithms ``algorithm=`` takes; None is the fastest (FA3, falling back as the plan says).
ALGORITHMS = tuple(_native.ALGORITHMS)

_last_plan = None


def last_plan():
    """The plan of the last call on this process, one line: the kernels that ran and, for a
    fallback, why (None before the first call)."""
    return _last_plan


def _attention(q, k, v, layout, softmax_scale, causal, algorithm):
    """Checks, allocates O (Q's shape, contiguous) and the statistics, launches; returns (O, L)."""
    dtype = check_inputs(q, k, v, layout)
    if algorithm is not None and not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a str or None, got {type(algorithm).__name__}")
    if softmax_scale is not None and not isinstance(softmax_scale, (int, float)):
        raise TypeError(
            f"softmax_scale must be a float or None, got {type(softmax_scale).__name__}"
        )
    import torch  # only here: importing flash_attn_rs needs no PyTorch

    batch, heads, seqlen_q, _ = dims_and_strides(q, layout)[0]
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    rows = (batch, heads, seqlen_q)
    fa1 = algorithm == "fa1"
    stats = [torch.empty(rows, dtype=torch.float32, device=q.device) for _ in range(2 if fa1 else 1)]

    def operand(tensor):
        dims, strides = dims_and_strides(tensor, layout)
        return (tensor.data_ptr(), dims, strides)

    global _last_plan
    # The device's primary context becomes current for the launch; torch.cuda.device restores
    # PyTorch's current device afterwards.
    with torch.cuda.device(q.device):
        _last_plan = _native.forward(
            dtype=dtype,
            device=q.device.index,
            stream=torch.cuda.current_stream(q.device).cuda_stream,
            q=operand(q),
            k=operand(k),
            v=operand(v),
            o=operand(o),
            stats=[s.data_ptr() for s in stats],
            algorithm=algorithm,
            softmax_scale=None if softmax_scale is None else float(softmax_scale),
            causal=bool(causal),
        )
    if fa1:
        m, l = stats
        lse = torch.where(l > 0, m + torch.log(l), torch.full_like(m, float("-inf")))
    else:
        (lse,) = stats
    return o, lse


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, algorithm=None, return_lse=False):
    """Attention on flash-attn's layout: q (batch, seqlen_q, heads, head_dim), k and v
    (batch, seqlen_k, heads, head_dim), CUDA, float16, bfloat16 or float32, any strides with a
    contiguous last dim. ``softmax_scale`` defaults to 1/sqrt(head_dim); ``causal`` aligns the mask
    to the bottom-right corner; ``algorithm`` is one of ``ALGORITHMS`` or None (the fastest).

    Returns O (q's shape), and with ``return_lse`` also L = logsumexp of the scaled scores,
    float32 (batch, heads, seqlen_q). Raises TypeError or ValueError naming the argument before
    anything is launched.
    """
    o, lse = _attention(q, k, v, FLASH_ATTN, softmax_scale, causal, algorithm)
    return (o, lse) if return_lse else o


def scaled_dot_product_attention(q, k, v, is_causal=False, scale=None):
    """Attention on SDPA's layout (batch, heads, seqlen, head_dim), like
    ``torch.nn.functional.scaled_dot_product_attention`` without a mask or dropout; the fastest
    algorithm for the device. Returns O (q's shape)."""
    o, _ = _attention(q, k, v, SDPA, scale, is_causal, None)
    return o
