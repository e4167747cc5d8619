"""FlashAttention as pure-Rust GPU kernels, on PyTorch CUDA tensors.

``flash_attn_func`` takes flash-attn's layout (batch, seqlen, heads, head_dim),
``scaled_dot_product_attention`` SDPA's (batch, heads, seqlen, head_dim), and
``flash_attn_varlen_func`` flash-attn's packed batches of sequences of different lengths
(total_tokens, heads, head_dim) with their offsets ``cu_seqlens_q``, ``cu_seqlens_k``; all take
any strides whose last one is 1, without copies, run on PyTorch's current CUDA stream in the
device's primary context, and return outputs that PyTorch allocated. Importing needs neither
PyTorch nor a GPU.

Under ``torch.compile`` every call is a PyTorch custom operator (``_ops``:
``flash_attn_rs::forward``, ``varlen_forward``, ``backward``, ``varlen_backward``, ``kvcache``,
with fake implementations), so it traces without a graph break; eager calls run the same
launches through ``torch.autograd.Function``s (``_autograd``), which cost less host time. The
first two functions are differentiable: the forward saves Q, K, V, O and L, and
``loss.backward()`` runs the GPU backward into gradients PyTorch allocates.
Under ``torch.autocast`` float32 inputs run in the autocast dtype, as SDPA's do.
``flash_attn_func`` and ``flash_attn_varlen_func`` also take flash-attn's ``window_size``,
``softcap``, ``alibi_slopes`` and ``dropout_p``, forward and backward. ``flash_attn_varlen_func`` is
differentiable too: its backward is the packed backward kernels' (one launch for up to 255
sequences).
``flash_attn_rs.transformers_attention.register()`` routes a ``transformers`` model's attention
here.

The flash-attn functions take flash-attn's arguments in flash-attn's order (``dropout_p`` third,
``return_attn_probs`` returning ``(out, softmax_lse, S_dmask)``), so code written for flash-attn
runs by changing its import; so do its packed forms, ``flash_attn_qkvpacked_func``,
``flash_attn_kvpacked_func``, ``flash_attn_varlen_qkvpacked_func`` and
``flash_attn_varlen_kvpacked_func`` (views of the packed tensor, no copies). What the kernels
do not have yet (a paged cache in the varlen call) is refused by name.

How: this half checks the tensors (``_checks``), allocates outputs and gradients with PyTorch and
passes addresses, dims, strides and the stream to the native half (``_native``, Rust) as plain
integers (``_launch``); the native half checks them again with the host crate's checks, then
launches. CUDA graph capture is refused with a RuntimeError that says why.
"""

import importlib.util
import math
import operator

from . import _dropout, _launch, _native
from ._autograd import attention_function, packed_attention_function
from ._ops import ops
from ._checks import (
    FLASH_ATTN, PACKED, SDPA, check_alibi_slopes, check_cache_inputs, check_inputs,
    check_offset_pair, check_offsets,
)

if importlib.util.find_spec("torch") is not None:
    # The operators exist before any call: torch.compile must not trace their definition.
    ops()

__all__ = [
    "ALGORITHMS",
    "PACKED_ALGORITHMS",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_with_kvcache",
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
               softcap=0.0, deterministic=False, alibi_slopes=None, dropout_p=0.0,
               return_attn_probs=False):
    """Checks every argument, then runs the autograd Function; returns (O, L, S_dmask), S_dmask
    None unless ``return_attn_probs`` with dropout (``_attention_probs``)."""
    dtype = check_inputs(q, k, v, layout)
    q, k, v, dtype = _under_autocast(q, k, v, dtype, layout)
    softmax_scale, window, softcap = _check_all_options(softmax_scale, causal, algorithm,
                                                        window_size, softcap)
    _check_bool("deterministic", deterministic)
    alibi_slopes = check_alibi_slopes(alibi_slopes, q, layout, q.shape[0])
    head_dim, unpadded = q.shape[-1], (q, k)
    q, k, v, scale = _padded_for_tensor_cores(q, k, v, dtype, algorithm, softmax_scale)
    if _compiling():
        o, lse, rng_state = ops()[0](q, k, v, layout, dtype, scale, causal, algorithm,
                                     None if window is None else list(window), softcap,
                                     alibi_slopes, dropout_p, deterministic)
    else:
        o, lse, rng_state = attention_function().apply(q, k, v, layout, dtype, scale, causal,
                                                       algorithm, window, softcap, alibi_slopes,
                                                       dropout_p, deterministic)
    probs = None
    if return_attn_probs and dropout_p:
        q, k = (t.transpose(1, 2) if layout == SDPA else t for t in unpadded)
        probs = _dropout.attention_probs(q.detach(), k.detach(), softmax_scale, causal, window,
                                         softcap, alibi_slopes, dropout_p,
                                         *_dropout.from_state_tensor(rng_state))
    return _unpadded(o, head_dim), lse, probs


def _unpadded(o, head_dim):
    """O at the caller's head dim: a padded call's O without its padded columns, copied
    contiguous (flash-attn returns a view; a contiguous O serves every caller a view serves, and
    ``.view`` too)."""
    return o if o.shape[-1] == head_dim else o[..., :head_dim].contiguous()


#: The tensor-core kernels read rows in 16-byte pieces: head dims that are multiples of this.
HEAD_DIM_MULTIPLE = 8


def _tensor_core_head_dim(q, head_dim, algorithm):
    """The head dim the tensor-core kernels run ``head_dim`` at: FA3's (auto or fa3 on compute
    capability 9.0) takes any multiple of 8, fa2-tc's (named, or auto elsewhere) its compiled head
    dims (``_native.FA2_TC_HEAD_DIMS``); None past them all."""
    import torch

    fa3 = (algorithm in (None, "auto", "fa3") and q.device.type == "cuda"
           and torch.cuda.get_device_capability(q.device) == (9, 0))
    if fa3:
        return -(-head_dim // HEAD_DIM_MULTIPLE) * HEAD_DIM_MULTIPLE
    return next((d for d in _native.FA2_TC_HEAD_DIMS if d >= head_dim), None)


def _padded_for_tensor_cores(q, k, v, dtype, algorithm, softmax_scale):
    """flash-attn's rule for a head dim the tensor-core kernels do not take as it is (59 or 111 on
    FA3, which reads rows in 16-byte pieces; 80 or 112 on fa2-tc, compiled for a few head dims):
    q, k and v padded with zeros to the head dim they run (``_tensor_core_head_dim``; zero columns
    add nothing to Q·Kᵀ, and O's padded columns, P·0, are sliced off), the scale kept at the true
    head dim's. The pad is a differentiable copy, so the gradients come back at the true head dim;
    it costs copies of Q, K, V and O (and of dO and the gradients in the backward) beside running
    at the larger head dim. Only for float16 and bfloat16 under the fast algorithms (auto, fa3,
    fa2-tc): fa2, fa1 and standard are the articles' kernels and take any head dim as it is.
    Returns (q, k, v, softmax_scale)."""
    head_dim = q.shape[-1]
    if dtype == "f32" or algorithm not in (None, "auto", "fa3", "fa2-tc"):
        return q, k, v, softmax_scale
    target = _tensor_core_head_dim(q, head_dim, algorithm)
    if target is None or target == head_dim:
        return q, k, v, softmax_scale
    import torch

    pad = [0, target - head_dim]
    q, k, v = (torch.nn.functional.pad(t, pad) for t in (q, k, v))
    return q, k, v, head_dim**-0.5 if softmax_scale is None else softmax_scale


def _compiling():
    """Whether PyTorch is compiling this call (torch.compile, torch.export): then the custom
    operators (``_ops``), whose fake implementations it traces; in eager mode the autograd
    Functions (``_autograd``), the same launches for less host time."""
    import torch

    return torch.compiler.is_compiling()


def _under_autocast(q, k, v, dtype, layout):
    """PyTorch's rule for SDPA under ``torch.autocast``: float32 Q, K and V run in the autocast
    dtype of their device type (float16 or bfloat16: the tensor-core kernels), and O comes back in
    it; the cast is differentiable, so float32 leaves get float32 gradients. Anything else, or
    outside autocast, as it is. Returns (q, k, v, dtype)."""
    if dtype != "f32":
        return q, k, v, dtype
    import torch

    device_type = q.device.type
    if not torch.is_autocast_enabled(device_type):
        return q, k, v, dtype
    cast = torch.get_autocast_dtype(device_type)
    q, k, v = (t.to(cast) for t in (q, k, v))
    return q, k, v, check_inputs(q, k, v, layout)


def _check_bool(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def _check_flash_attn_arguments(dropout_p, alibi_slopes, deterministic, return_attn_probs,
                                return_lse, block_table=None):
    """flash-attn's arguments beyond the tensors and the scores, checked before anything else
    (``alibi_slopes`` is checked against the tensors later: ``check_alibi_slopes``). What the
    kernels do not have yet (in the varlen call a paged KV cache) passes at its off value;
    anything else is refused by name, never ignored. Returns ``dropout_p`` as a float."""
    for name, value in (("deterministic", deterministic),
                        ("return_attn_probs", return_attn_probs), ("return_lse", return_lse)):
        _check_bool(name, value)
    dropout_p = _check_dropout_p(dropout_p)
    if block_table is not None:
        raise ValueError("block_table is given; allowed: None (flash_attn_varlen_func reads no "
                         "paged KV cache here yet)")
    return dropout_p


def _check_dropout_p(dropout_p):
    """flash-attn's ``dropout_p``: a float in [0, 1) (an int 0 too); returned as a float."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p is {dropout_p}; allowed: a probability in [0, 1) (0.0: no "
                         "dropout, as in eval mode)")
    return float(dropout_p)


def _returns(o, lse, probs, return_attn_probs, return_lse):
    """flash-attn's return convention: O, or with ``return_attn_probs`` (O, softmax_lse,
    S_dmask), S_dmask None without dropout (flash-attn fills it only with dropout);
    ``return_lse`` (ours): (O, L)."""
    if return_attn_probs:
        return o, lse, probs
    return (o, lse) if return_lse else o


def _unpack(name, tensor, dim, count):
    """The ``count`` tensors stacked in ``tensor`` along ``dim`` (flash-attn's packed QKV or KV),
    as views: nothing is copied, and gradients flow back into ``tensor``."""
    shape = getattr(tensor, "shape", None)
    if shape is None:
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if len(shape) <= dim or shape[dim] != count:
        raise ValueError(f"{name} has shape {tuple(shape)}; allowed: {count} stacked at dim {dim} "
                         f"({'q, k, v' if count == 3 else 'k, v'}), as flash-attn's")
    return tensor.unbind(dim)


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


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, algorithm=None, return_lse=False):
    """Attention on flash-attn's layout: q (batch, seqlen_q, heads, head_dim), k and v
    (batch, seqlen_k, heads, head_dim), CUDA, float16, bfloat16 or float32, any strides with a
    contiguous last dim, read in place. ``softmax_scale`` defaults to 1/sqrt(head_dim);
    ``causal`` aligns the mask to the bottom-right corner (query i sees key j iff
    j <= i + seqlen_k - seqlen_q); ``algorithm`` is one of ``ALGORITHMS`` or None ("auto": fa3
    on Hopper, fa2-tc elsewhere, falling back where it cannot run; the plan says why).

    ``window_size = (left, right)`` is flash-attn's sliding window: query i sees key j iff
    i + off - left <= j <= i + off + right (off = seqlen_k - seqlen_q; -1 leaves a side
    unbounded; with ``causal`` right is 0); ``softcap`` > 0 turns each scaled score s into
    softcap * tanh(s / softcap) (Gemma 2). Both run on auto, fa3 and fa2-tc (float16 and
    bfloat16), forward and backward (the backward's dS takes the cap's slope 1 - tanh^2; with
    ``deterministic=True`` the backward runs fa2-tc's ordered kernel); elsewhere a ValueError
    names them. A row that sees no key gets O = 0 and L = -inf. Every head dim up to 256 runs
    on the tensor cores: one the kernels do not take as it is (59, 111; on fa2-tc also 80, 112)
    is padded with zeros to the next one they take, as flash-attn pads it (a copy of q, k and v,
    and of O back to the head dim).

    ``alibi_slopes``: flash-attn's ALiBi, a float32 tensor on q's device of shape (heads,) or
    (batch, heads); each scaled score s(i, j) becomes s - slope * |i + seqlen_k - seqlen_q - j|
    (after soft-capping), forward and backward, on auto, fa3 and fa2-tc (float16 and bfloat16;
    float32 on ``algorithm="standard"``'s forward only). The slopes get no gradient.

    ``dropout_p`` in [0, 1): flash-attn's dropout on the attention probabilities,
    O = (P * Z) V / (1 - p) with Z kept with probability 1 - p (p rounded to 1/65536), on auto,
    fa3 and fa2-tc (float16, bfloat16), forward and backward. The mask comes from Philox with the
    seed and offset of PyTorch's CUDA generator (each call advances its offset), so
    ``torch.manual_seed`` repeats a run and ``torch.utils.checkpoint`` recomputes the same mask;
    the backward recomputes it rather than storing it. Pass 0.0 in evaluation, as flash-attn's
    modules do (``dropout_p if self.training else 0.0``).

    flash-attn's signature, argument for argument and in its order, so code written for it runs
    by changing the import; ``deterministic=True`` makes the
    backward's dQ the same bits on every run (dQ's additions in key-block order, on fa3 or
    fa2-tc; the backward's plan says so). ``algorithm`` and ``return_lse`` are ours, keyword-only.

    Returns O (q's shape, allocated by PyTorch); with ``return_attn_probs`` flash-attn's
    (O, softmax_lse, S_dmask): with dropout S_dmask is flash-attn's (batch, heads, seqlen_q and
    seqlen_k rounded up to 128) in q's dtype, each score's probability scaled per key block as
    flash-attn's kernel leaves it and negated where dropout dropped it (computed in PyTorch for
    inspection and tests: ``_dropout.attention_probs``), None without dropout; with
    ``return_lse`` (O, L). L = logsumexp of the scaled scores, float32
    (batch, heads, seqlen_q), -inf for a row that sees no key. Differentiable in q, k and v
    (``loss.backward()`` runs the backward on the GPU: FA3's on compute capability 9.0); L is
    not. Raises TypeError or ValueError naming the argument before
    anything is launched, RuntimeError inside a CUDA graph capture.
    """
    dropout_p = _check_flash_attn_arguments(dropout_p, alibi_slopes, deterministic,
                                            return_attn_probs, return_lse)
    o, lse, probs = _attention(q, k, v, FLASH_ATTN, softmax_scale, causal, algorithm,
                               window_size, softcap, deterministic, alibi_slopes, dropout_p,
                               return_attn_probs)
    return _returns(o, lse, probs, return_attn_probs, return_lse)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *, algorithm=None,
                              return_lse=False):
    """flash-attn's ``flash_attn_qkvpacked_func``: ``flash_attn_func`` on
    qkv (batch, seqlen, 3, heads, head_dim), Q, K and V read in place (views along dim 2, no
    copy); the gradient lands in qkv's. Arguments and returns as ``flash_attn_func``."""
    q, k, v = _unpack("qkv", qkv, 2, 3)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, algorithm=algorithm,
                           return_lse=return_lse)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, algorithm=None,
                             return_lse=False):
    """flash-attn's ``flash_attn_kvpacked_func``: ``flash_attn_func`` on q
    (batch, seqlen_q, heads, head_dim) and kv (batch, seqlen_k, 2, heads_kv, head_dim), K and V
    read in place (views along dim 2); heads_kv divides heads (grouped-query heads). Arguments
    and returns as ``flash_attn_func``."""
    k, v = _unpack("kv", kv, 2, 2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs, algorithm=algorithm,
                           return_lse=return_lse)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, *, algorithm=None,
                           return_lse=False):
    """flash-attn's varlen call: attention over a packed batch of sequences of different lengths,
    each attending to its own keys only. q is (total_q, heads, head_dim), k and v
    (total_k, heads_kv, head_dim) (heads_kv divides heads: grouped-query heads, read in place),
    every sequence's rows one after the other; CUDA, float16 or bfloat16, any strides with a
    contiguous last dim, read in place. Sequence b's queries are q's rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and its keys and values k's and v's rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``.

    ``cu_seqlens_q``, ``cu_seqlens_k``: batch + 1 offsets each, from 0, never decreasing, the last
    one q's (k's) rows; int32 as in flash-attn, or int64; on q's device or on the CPU.
    On the GPU (as flash-attn takes them, and as data collators leave them) they stay there: the
    kernels read them, so the call waits for nothing, and the grid is sized by ``max_seqlen_q``
    and ``max_seqlen_k``, as flash-attn's. Their values are then not checked (that would need a
    synchronization): each sequence's rows are clamped into q and k and its lengths to the
    bounds, so wrong offsets give wrong rows, never an access outside the tensors. On the CPU
    they are read and checked (a ValueError names a bad one) and the grid is sized by the
    longest sequence they give.

    ``max_seqlen_q``, ``max_seqlen_k``: flash-attn's bounds on the longest sequence, ints. With
    CPU offsets each is checked to be at least the longest sequence they give (a smaller one is a
    ValueError naming it). With GPU offsets they size the grid, and a sequence longer than its
    bound is cut to it (flash-attn leaves the rest of its rows unwritten); a tight bound makes
    the fastest grid.

    ``softmax_scale``, ``causal``, ``window_size``, ``softcap`` and ``alibi_slopes`` are
    ``flash_attn_func``'s, applied to each sequence alone: its causal mask, window and ALiBi
    diagonal aligned to its own bottom-right corner; (batch, heads) slopes give sequence b row b. ``algorithm`` is None or one of ``PACKED_ALGORITHMS``: "auto" (None; fa3 on Hopper,
    fa2-tc elsewhere; the plan says why), "fa3" (on compute capability 9.0, elsewhere it runs
    fa2-tc and the plan says why) or "fa2-tc". A sequence may
    be empty: without keys its rows get O = 0 and L = -inf, without queries it writes nothing;
    q and k need at least one row each.

    flash-attn's signature, in its order: ``dropout_p`` is ``flash_attn_func``'s (each sequence's
    mask drawn for its own rows and keys); ``block_table`` must be None (ValueError naming it
    otherwise); ``deterministic`` is the backward's; ``algorithm`` and ``return_lse`` are ours,
    keyword-only.

    Returns O (q's shape, allocated by PyTorch); with ``return_attn_probs`` (O, softmax_lse,
    S_dmask) as flash-attn's (S_dmask (batch, heads, max_seqlen_q and max_seqlen_k rounded up to
    128), each sequence at the top left of its row, with dropout; None without; reading the
    offsets on the host), with ``return_lse`` (O, L). L = logsumexp of the scaled scores,
    float32 (heads, total_q) as flash-attn's varlen L, -inf for a row that sees no key.
    Differentiable in q, k and v, windows, soft-capping and ALiBi included: ``loss.backward()`` runs the
    packed GPU backward (FA3's on Hopper, fa2-tc's elsewhere or in deterministic mode; each
    sequence against its own keys, one launch of its main kernel per 255 sequences) into one
    packed dQ, dK, dV.
    Raises TypeError or ValueError naming the argument before anything is launched, and
    RuntimeError inside a CUDA graph capture.
    """
    dropout_p = _check_flash_attn_arguments(dropout_p, alibi_slopes, deterministic,
                                            return_attn_probs, return_lse, block_table)
    dtype = check_inputs(q, k, v, PACKED)
    q, k, v, dtype = _under_autocast(q, k, v, dtype, PACKED)
    check_offsets("cu_seqlens_q", cu_seqlens_q, q)
    check_offsets("cu_seqlens_k", cu_seqlens_k, q)
    check_offset_pair(cu_seqlens_q, cu_seqlens_k)
    max_seqlens = (_check_max_seqlen("max_seqlen_q", max_seqlen_q),
                   _check_max_seqlen("max_seqlen_k", max_seqlen_k))
    softmax_scale, window, softcap = _check_all_options(softmax_scale, causal, algorithm,
                                                        window_size, softcap)
    alibi_slopes = check_alibi_slopes(alibi_slopes, q, PACKED, cu_seqlens_q.shape[0] - 1)
    head_dim, unpadded = q.shape[-1], (q, k)
    q, k, v, scale = _padded_for_tensor_cores(q, k, v, dtype, algorithm, softmax_scale)
    if _compiling():
        o, lse, rng_state = ops()[1](q, k, v, cu_seqlens_q, cu_seqlens_k, *max_seqlens, dtype,
                                     scale, causal, algorithm,
                                     None if window is None else list(window), softcap,
                                     alibi_slopes, dropout_p, deterministic)
    else:
        o, lse, rng_state = packed_attention_function().apply(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlens, dtype, scale, causal, algorithm,
            window, softcap, alibi_slopes, dropout_p, deterministic)
    probs = None
    if return_attn_probs and dropout_p:
        sequences = (cu_seqlens_q.tolist(), cu_seqlens_k.tolist())
        probs = _dropout.attention_probs(*(t.detach() for t in unpadded), softmax_scale, causal,
                                         window, softcap, alibi_slopes, dropout_p,
                                         *_dropout.from_state_tensor(rng_state),
                                         sequences=sequences)
    return _returns(_unpadded(o, head_dim), lse, probs, return_attn_probs, return_lse)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, algorithm=None,
                                     return_lse=False):
    """flash-attn's ``flash_attn_varlen_qkvpacked_func``: ``flash_attn_varlen_func`` on
    qkv (total, 3, heads, head_dim), Q, K and V read in place (views along dim 1), one table of
    offsets ``cu_seqlens`` and one bound ``max_seqlen`` for both. Arguments and returns as
    ``flash_attn_varlen_func``."""
    q, k, v = _unpack("qkv", qkv, 1, 3)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs,
                                  algorithm=algorithm, return_lse=return_lse)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False,
                                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                    deterministic=False, return_attn_probs=False, *,
                                    algorithm=None, return_lse=False):
    """flash-attn's ``flash_attn_varlen_kvpacked_func``: ``flash_attn_varlen_func`` on q
    (total_q, heads, head_dim) and kv (total_k, 2, heads_kv, head_dim), K and V read in place
    (views along dim 1). Arguments and returns as ``flash_attn_varlen_func``."""
    k, v = _unpack("kv", kv, 1, 2)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs,
                                  algorithm=algorithm, return_lse=return_lse)


def _check_int_tensor(name, value, dims):
    """An int32 or int64 tensor of ``dims`` dims (any device), or a TypeError/ValueError naming
    it."""
    if not (hasattr(value, "tolist") and hasattr(value, "dtype")):
        raise TypeError(f"{name} must be a torch.Tensor of ints, got {type(value).__name__}")
    if str(value.dtype) not in ("torch.int32", "torch.int64"):
        raise TypeError(f"{name} has dtype {value.dtype}; allowed: torch.int32 (flash-attn's) "
                        "or torch.int64")
    if len(value.shape) != dims:
        raise ValueError(f"{name} has shape {tuple(value.shape)}; expected {dims} dims")
    return value


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None,
                            rotary_sin=None, cache_seqlens=None, cache_batch_idx=None,
                            cache_leftpad=None, block_table=None, softmax_scale=None,
                            causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """flash-attn's ``flash_attn_with_kvcache``: decoding, 1-16 query tokens per sequence
    against each sequence's cached keys and values, on the split-KV kernels (f16 and bf16, head
    dims 64 and 128, compute capability 8.0 and newer), inference only (no gradient).

    q (batch, seqlen_q, heads, head_dim); k_cache and v_cache (batch, capacity, heads_kv,
    head_dim), or with ``block_table`` (batch, pages per sequence; int32) a paged cache
    (pages, page_size, heads_kv, head_dim), page_size a multiple of 16; heads_kv divides heads.
    ``k``, ``v`` (batch, seqlen_new, heads_kv, head_dim): written into the caches at each
    sequence's length first (in place), then attended to. ``cache_seqlens``: the keys in each
    sequence's cache before the call, an int or a (batch,) int32/int64 tensor; None: the whole
    capacity (a paged cache's: its table's pages). The lengths and the table are read on the
    host and uploaded with the call: a CUDA tensor is copied with ``tolist()``, a
    synchronization per call (pass CPU tensors or ints to avoid it). ``causal``: the query tokens
    are each sequence's last positions (bottom-right). ``num_splits``: 0 lets the plan choose the
    split-KV count, n > 0 forces it.

    Refused by name, never ignored (the kernels have none of them yet): ``rotary_cos``,
    ``rotary_sin`` (apply the rotary embedding to q and k first), ``cache_batch_idx``,
    ``cache_leftpad``, ``window_size`` other than (-1, -1), ``softcap`` other than 0,
    ``alibi_slopes``. Returns O (q's shape), and with ``return_softmax_lse`` (O, softmax_lse),
    softmax_lse float32 (batch, heads, seqlen_q). Under torch.compile it is the custom operator
    ``flash_attn_rs::kvcache`` (which mutates the caches); CUDA graph capture is refused.
    """
    for name, value in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin),
                        ("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad),
                        ("alibi_slopes", alibi_slopes)):
        if value is not None:
            raise ValueError(f"{name} is given; allowed: None (the decode kernels have no such "
                             "input yet)")
    window, softcap = _check_scores(window_size, softcap)
    if window is not None or softcap:
        name = "window_size" if window is not None else "softcap"
        raise ValueError(f"{name} is set; allowed: (-1, -1) and 0.0 (the decode kernels have no "
                         "window or soft-capping yet)")
    softmax_scale = _check_options(softmax_scale, causal, None)
    _check_bool("return_softmax_lse", return_softmax_lse)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits is {num_splits!r}; allowed: an int >= 0 (0: the plan's)")
    if (k is None) != (v is None):
        raise ValueError("k and v go together (the keys and values to append); got only "
                         f"{'k' if v is None else 'v'}")
    dtype = check_cache_inputs({"q": q, "k_cache": k_cache, "v_cache": v_cache, "k": k, "v": v})
    if block_table is not None:
        _check_int_tensor("block_table", block_table, 2)
    if cache_seqlens is None:
        # The whole cache: its capacity, a paged one's pages in the table.
        cache_seqlens = k_cache.shape[1] * (1 if block_table is None else block_table.shape[1])
    if not isinstance(cache_seqlens, int) or isinstance(cache_seqlens, bool):
        _check_int_tensor("cache_seqlens", cache_seqlens, 1)
    batch, num_splits = q.shape[0], num_splits or None
    if _compiling():
        # The operator reads the lengths and the table itself: tracing reads no tensor's values.
        import torch

        if isinstance(cache_seqlens, int):
            cache_seqlens = torch.full((batch,), cache_seqlens, dtype=torch.int32)
        o, lse = ops()[4](q, k_cache, v_cache, k, v, dtype, softmax_scale, causal, cache_seqlens,
                          block_table, num_splits)
    else:
        # Read on the host: a CUDA tensor's copy is a synchronization.
        lengths = ([cache_seqlens] * batch if isinstance(cache_seqlens, int)
                   else cache_seqlens.tolist())
        table = None if block_table is None else block_table.tolist()
        o, lse = _launch.decode(q, k_cache, v_cache, k, v, dtype, softmax_scale, causal, lengths,
                                table, num_splits)
    return (o, lse) if return_softmax_lse else o


def scaled_dot_product_attention(q, k, v, is_causal=False, scale=None):
    """Attention on SDPA's layout (batch, heads, seqlen, head_dim), like
    ``torch.nn.functional.scaled_dot_product_attention`` without a mask or dropout, with the
    fastest algorithm for the device; differentiable in q, k and v. One difference: with
    seqlen_q != seqlen_k, ``is_causal`` aligns the mask to the bottom-right corner as
    FlashAttention does (PyTorch's aligns it to the top-left). Returns O (q's shape)."""
    o, _, _ = _attention(q, k, v, SDPA, scale, is_causal, None)
    return o
