"""The calls into the native half: outputs and gradients allocated by PyTorch, then one launch on
PyTorch's current stream. The arguments have passed ``_checks`` already; the native half checks
the integers again before it launches anything."""

from . import _native
from ._checks import FLASH_ATTN, PACKED, dims_and_strides

#: The plans of the last forward and backward calls on this process (one line each, or None).
plans = {"forward": None, "backward": None}


def _operand(tensor, layout):
    dims, strides = dims_and_strides(tensor, layout)
    return (tensor.data_ptr(), dims, strides)


def operands(layout, **tensors):
    """Each tensor as the native half takes it: (address, dims, strides) in `layout`."""
    return {name: _operand(tensor, layout) for name, tensor in tensors.items()}


def _on_stream(torch, device):
    """Where a native call launches: the device and its current stream."""
    return dict(device=device.index, stream=torch.cuda.current_stream(device).cuda_stream)


def _common(torch, q, k, v, o, layout, dtype):
    """The arguments every native call takes: the dtype, the device and its current stream, and
    Q, K, V, O as (address, dims, strides)."""
    return dict(dtype=dtype, **_on_stream(torch, q.device),
                **operands(layout, q=q, k=k, v=v, o=o))


def scores(softmax_scale, causal, window, softcap, alibi_slopes=None, dropout=None):
    """How every call forms its scores, as the native half's keywords: ALiBi's slopes (checked,
    contiguous float32 on the call's device) as their address and shape, and dropout as
    (p, seed, offset) (``_dropout.generator_state``) or None."""
    slopes = None if alibi_slopes is None else (alibi_slopes.data_ptr(), list(alibi_slopes.shape))
    return dict(softmax_scale=softmax_scale, causal=causal, window=window, softcap=softcap,
                alibi_slopes=slopes, dropout=dropout)


def _refuse_graph_capture(torch):
    """Raises before anything is allocated or launched when the current stream is capturing a
    CUDA graph: the calls cannot be captured (the message says why)."""
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "flash_attn_rs was called while PyTorch's current stream is capturing a CUDA graph; "
            f"it needs {_native.GRAPH_CAPTURE_UNSUPPORTED}"
        )


def offsets_arguments(cu_seqlens_q, cu_seqlens_k, max_seqlens):
    """The native keywords of a packed batch's offsets and bounds. Offsets on the GPU stay there
    (``device_offsets``: their addresses and the number of sequences; int64 ones converted to
    int32 on the GPU, in stream order): the kernels read them, so nothing waits for the device,
    and the grid is sized by ``max_seqlens`` as flash-attn's. Offsets on the CPU are read here
    (``tolist``, no wait) and checked, values and bounds, by the native half."""
    max_seqlen_q, max_seqlen_k = max_seqlens
    bounds = dict(max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k)
    if cu_seqlens_q.device.type == "cpu" and cu_seqlens_k.device.type == "cpu":
        return dict(cu_seqlens_q=cu_seqlens_q.tolist(), cu_seqlens_k=cu_seqlens_k.tolist(),
                    **bounds)
    import torch

    if cu_seqlens_q.device.type == "cpu" or cu_seqlens_k.device.type == "cpu":
        # One on each side: the CPU one goes to the GPU (a copy that waits for nothing).
        device = cu_seqlens_k.device if cu_seqlens_q.device.type == "cpu" else cu_seqlens_q.device
        cu_seqlens_q, cu_seqlens_k = (c.to(device) for c in (cu_seqlens_q, cu_seqlens_k))
    offsets = [c.to(torch.int32).contiguous() for c in (cu_seqlens_q, cu_seqlens_k)]
    # Kept alive until the call returns; PyTorch frees them in stream order after the kernels.
    return dict(device_offsets=(offsets[0].data_ptr(), offsets[1].data_ptr(),
                                offsets[0].numel() - 1), _keep=offsets, **bounds)


def form_arguments(packed):
    """The native forward's keywords for the batch's form: none for a dense batch; for a packed
    one, ``packed = (cu_seqlens_q, cu_seqlens_k, (max_seqlen_q, max_seqlen_k))``
    (``offsets_arguments``)."""
    if packed is None:
        return {}
    cu_seqlens_q, cu_seqlens_k, max_seqlens = packed
    return offsets_arguments(cu_seqlens_q, cu_seqlens_k, max_seqlens)


def statistics(torch, q, layout, algorithm):
    """The row statistics the forward writes, allocated with PyTorch: L, or FA1's m and l; each
    float32 contiguous over q's (batch, heads, seqlen_q), a packed batch's (1, heads, total_q)."""
    rows = dims_and_strides(q, layout)[0][:3]
    count = 2 if algorithm == "fa1" else 1
    return [torch.empty(rows, dtype=torch.float32, device=q.device) for _ in range(count)]


def forward_arguments(q, k, v, o, stats, layout, dtype, softmax_scale, causal, algorithm,
                      window=None, softcap=0.0, packed=None, alibi_slopes=None, dropout=None):
    """The native forward's keywords but the device and the stream: Q, K, V, O as (address,
    dims, strides), the statistics' addresses, the options and the form (``form_arguments``)."""
    return dict(
        dtype=dtype,
        **operands(layout, q=q, k=k, v=v, o=o),
        stats=[s.data_ptr() for s in stats],
        algorithm=algorithm,
        **scores(softmax_scale, causal, window, softcap, alibi_slopes, dropout),
        **form_arguments(packed),
    )


def forward(q, k, v, layout, dtype, softmax_scale, causal, algorithm, window=None, softcap=0.0,
            packed=None, alibi_slopes=None, dropout=None):
    """Allocates O (Q's shape, contiguous) and the row statistics with PyTorch and launches the
    forward on the current stream of Q's device. Returns (O, L): L float32 contiguous,
    (batch, heads, seqlen_q), FA1's m and l turned into L = m + log l. ``window`` is flash-attn's
    ``window_size`` (None: unbounded), ``softcap`` its soft-capping (0: off), ``alibi_slopes``
    its ALiBi slopes (None: off), ``dropout`` (p, seed, offset) its dropout (None: off).

    ``packed = (cu_seqlens_q, cu_seqlens_k, (max_seqlen_q, max_seqlen_k))`` makes it flash-attn's
    varlen forward (``layout`` PACKED): q, k, v (total, heads, head_dim), the offsets on the GPU
    or the CPU (``offsets_arguments``), and L (heads, total_q) as flash-attn's."""
    import torch  # only here: importing flash_attn_rs needs no PyTorch

    with torch.cuda.device(q.device):
        # Before the offsets' copy: waiting for a capturing stream would invalidate its capture.
        _refuse_graph_capture(torch)
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        stats = statistics(torch, q, layout, algorithm)
        arguments = forward_arguments(q, k, v, o, stats, layout, dtype, softmax_scale, causal,
                                      algorithm, window, softcap, packed, alibi_slopes, dropout)
        kept = arguments.pop("_keep", None)  # device offsets converted here: alive until launched
        plans["forward"] = _native.forward(**arguments, **_on_stream(torch, q.device))
        del kept
        if len(stats) == 2:
            m, l = stats
            lse = torch.where(l > 0, m + torch.log(l), torch.full_like(m, float("-inf")))
        else:
            (lse,) = stats
    if layout == PACKED:
        lse = lse[0]  # (1, heads, total_q) -> flash-attn's (heads, total_q)
    return o, lse


def backward(q, k, v, o, lse, d_o, layout, dtype, softmax_scale, causal, window=None,
             softcap=0.0, deterministic=False, alibi_slopes=None, dropout=None):
    """Allocates dQ, dK, dV with PyTorch (each its input's strides where those are dense, else
    contiguous) and launches the backward on the current stream of Q's device. Returns
    (dQ, dK, dV). The forward's ``window``, ``softcap``, ``alibi_slopes`` and ``dropout`` (its p,
    seed and offset: the same mask) go to the native half (the
    tensor-core kernels' `local` form; f32 is refused naming them). ``deterministic``: dQ with
    the same bits on every run (dQ's additions in a fixed order; the plan says which kernel)."""
    import torch

    d_o = _upstream_gradient(d_o, o)
    with torch.cuda.device(q.device):
        _refuse_graph_capture(torch)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        plans["backward"] = _native.backward(
            **_common(torch, q, k, v, o, layout, dtype),
            lse=(lse.data_ptr(), list(lse.shape), list(lse.stride())),
            **operands(layout, d_o=d_o, dq=dq, dk=dk, dv=dv),
            **scores(softmax_scale, causal, window, softcap, alibi_slopes, dropout),
            deterministic=deterministic,
        )
    return dq, dk, dv


def varlen_backward_arguments(q, k, v, o, lse, d_o, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                              max_seqlens, dtype, softmax_scale, causal, window, softcap,
                              deterministic, alibi_slopes=None, dropout=None):
    """The native backward's keywords for a packed batch but the device and the stream: Q, K, V,
    O, dO, dQ, dK, dV (total, heads, head_dim) as (address, dims, strides) of (1, heads, total,
    head_dim) views, L (heads, total_q, contiguous) as (1, heads, total_q), the options, and the
    offsets with the forward's bounds (``offsets_arguments``)."""
    rows = lse[None]  # flash-attn's (heads, total_q) -> (1, heads, total_q)
    return dict(
        dtype=dtype,
        **operands(PACKED, q=q, k=k, v=v, o=o, d_o=d_o, dq=dq, dk=dk, dv=dv),
        lse=(rows.data_ptr(), list(rows.shape), list(rows.stride())),
        **scores(softmax_scale, causal, window, softcap, alibi_slopes, dropout),
        deterministic=deterministic,
        **offsets_arguments(cu_seqlens_q, cu_seqlens_k, max_seqlens),
    )


def _upstream_gradient(d_o, o):
    """dO as the kernels read it: O's dtype and a contiguous head dim. Upstream gradients may
    come broadcast (a sum's: stride 0) or transposed."""
    if d_o.stride(-1) != 1 or d_o.dtype != o.dtype:
        d_o = d_o.to(dtype=o.dtype).contiguous()
    return d_o


def varlen_backward(q, k, v, o, lse, d_o, cu_seqlens_q, cu_seqlens_k, max_seqlens, dtype,
                    softmax_scale, causal, window=None, softcap=0.0, deterministic=False,
                    alibi_slopes=None, dropout=None):
    """The packed batch's dQ, dK, dV (flash-attn's varlen backward): one packed backward on the
    current stream of Q's device, over q, k, v, O, dO (total, heads, head_dim) and L
    (heads, total_q) as the packed forward wrote them, each sequence with its own mask corner
    (``varlen_backward_arguments``); ``max_seqlens`` the forward's bounds."""
    import torch

    d_o = _upstream_gradient(d_o, o)
    with torch.cuda.device(q.device):
        # Before the offsets' copy: waiting for a capturing stream would invalidate its capture.
        _refuse_graph_capture(torch)
        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
        arguments = varlen_backward_arguments(q, k, v, o, lse.contiguous(), d_o, dq, dk, dv,
                                              cu_seqlens_q, cu_seqlens_k, max_seqlens, dtype,
                                              softmax_scale, causal, window, softcap,
                                              deterministic, alibi_slopes, dropout)
        kept = arguments.pop("_keep", None)
        plans["backward"] = _native.backward(**arguments, **_on_stream(torch, q.device))
        del kept
    return dq, dk, dv


def decode_arguments(q, k_cache, v_cache, o, lse, k_new, v_new, dtype, softmax_scale, causal,
                     cache_seqlens, block_table, num_splits):
    """The native forward's keywords for a call against a KV cache but the device and the stream:
    Q, the caches and O as (address, dims, strides) in flash-attn's layout (a paged cache's
    (pages, page_size, heads_kv, d) is (pages, heads_kv, page_size, d) there), L's address, the
    lengths and the block table as lists, K and V to append."""
    appended = operands(FLASH_ATTN, k_new=k_new, v_new=v_new) if k_new is not None else {}
    return dict(
        dtype=dtype,
        **operands(FLASH_ATTN, q=q, k=k_cache, v=v_cache, o=o),
        stats=[lse.data_ptr()],
        **scores(softmax_scale, causal, None, 0.0),
        cache_seqlens=cache_seqlens,
        block_table=block_table,
        num_splits=num_splits,
        **appended,
    )


def decode(q, k_cache, v_cache, k_new, v_new, dtype, softmax_scale, causal, cache_seqlens,
           block_table, num_splits):
    """Allocates O (q's shape) and L (batch, heads, seqlen_q) with PyTorch and runs the call
    against the KV cache on the current stream of q's device (appending K and V into the caches
    first, in place). ``cache_seqlens`` and ``block_table`` are lists (read on the host and
    uploaded with the call). Returns (O, L)."""
    import torch

    with torch.cuda.device(q.device):
        _refuse_graph_capture(torch)
        o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        (lse,) = statistics(torch, q, FLASH_ATTN, None)
        plans["forward"] = _native.forward(
            **decode_arguments(q, k_cache, v_cache, o, lse, k_new, v_new, dtype, softmax_scale,
                               causal, cache_seqlens, block_table, num_splits),
            **_on_stream(torch, q.device),
        )
    return o, lse
