"""Argument checks on PyTorch tensors, before anything is allocated or launched.

Duck-typed on purpose (``.device.type``, ``str(.dtype)``, ``.shape``, ``.stride()``): the checks
need no ``import torch``, so they run, and are tested, where PyTorch is not installed.
"""

# PyTorch's dtypes by their ``str``, and the host crate's names for them.
DTYPES = {"torch.float16": "f16", "torch.bfloat16": "bf16", "torch.float32": "f32"}
ALLOWED_DTYPES = "torch.float16, torch.bfloat16 or torch.float32"

# The device types the kernels run on (a test of the wiring widens it, with the launches faked).
DEVICE_TYPES = ("cuda",)

# Each layout's axis order, and where batch, heads, seqlen and head_dim sit in it.
FLASH_ATTN = "(batch, seqlen, heads, head_dim)"
SDPA = "(batch, heads, seqlen, head_dim)"
AXES = {FLASH_ATTN: (0, 2, 1, 3), SDPA: (0, 1, 2, 3)}
# flash-attn's varlen layout: every sequence's rows in one tensor, which the native half takes as
# flash-attn's layout at batch 1 (the offsets say where each sequence starts).
PACKED = "(total_tokens, heads, head_dim)"
NDIMS = {FLASH_ATTN: 4, SDPA: 4, PACKED: 3}

# The dtypes of the offsets (cu_seqlens): flash-attn's int32, and int64 (torch.cumsum's default).
OFFSET_DTYPES = ("torch.int32", "torch.int64")


def _check_one(name, tensor, layout):
    """One tensor alone: a CUDA tensor of a supported dtype, with the layout's dims (4, or 3 for
    packed sequences), last dim contiguous."""
    if not all(hasattr(tensor, a) for a in ("device", "dtype", "shape", "stride", "data_ptr")):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.device.type not in DEVICE_TYPES:
        raise ValueError(
            f"{name} is on {tensor.device}; flash_attn_rs needs CUDA tensors "
            f"(move it with {name}.cuda())"
        )
    if str(tensor.dtype) not in DTYPES:
        raise TypeError(f"{name} has dtype {tensor.dtype}; allowed: {ALLOWED_DTYPES}")
    if len(tensor.shape) != NDIMS[layout]:
        raise ValueError(
            f"{name} has shape {tuple(tensor.shape)}; expected {NDIMS[layout]} dims {layout}"
        )
    if tensor.stride(-1) != 1:
        raise ValueError(
            f"{name} has strides {tuple(tensor.stride())}; its last dim (head_dim) must be "
            f"contiguous (stride 1): pass {name}.contiguous()"
        )


def dims_and_strides(tensor, layout):
    """(batch, heads, seqlen, head_dim) dims and strides (in elements) of a tensor in `layout`;
    a packed (total_tokens, heads, head_dim) tensor is batch 1 of flash-attn's layout."""
    shape, strides = tuple(tensor.shape), tuple(tensor.stride())
    if layout == PACKED:
        shape, strides, layout = (1, *shape), (shape[0] * strides[0], *strides), FLASH_ATTN
    axes = AXES[layout]
    return [shape[a] for a in axes], [strides[a] for a in axes]


def check_inputs(q, k, v, layout):
    """Checks Q, K, V in `layout` and returns the host crate's dtype name ("f16", "bf16", "f32").

    Raises TypeError for a non-tensor or a dtype that is not allowed or not shared, ValueError for
    a CPU tensor, tensors on different devices, a non-contiguous last dim or shapes that disagree.
    """
    tensors = {"q": q, "k": k, "v": v}
    for name, tensor in tensors.items():
        _check_one(name, tensor, layout)
    for name in ("k", "v"):
        tensor = tensors[name]
        if str(tensor.dtype) != str(q.dtype):
            raise TypeError(
                f"{name} has dtype {tensor.dtype} but q has {q.dtype}; q, k and v must share one"
            )
        if tensor.device != q.device:
            raise ValueError(
                f"{name} is on {tensor.device} but q is on {q.device}; q, k and v must be on "
                "one device"
            )
    q_dims, _ = dims_and_strides(q, layout)
    k_dims, _ = dims_and_strides(k, layout)
    v_dims, _ = dims_and_strides(v, layout)
    for axis, axis_name in [(0, "batch"), (3, "head_dim")]:
        for name, dims, tensor in [("k", k_dims, k), ("v", v_dims, v)]:
            if dims[axis] != q_dims[axis]:
                raise ValueError(
                    f"{name} has shape {tuple(tensor.shape)} and q {tuple(q.shape)}: their "
                    f"{axis_name} must be equal (layout {layout})"
                )
    # Grouped-query attention: K and V may have fewer heads than Q, a divisor of Q's (query
    # head h reads K/V head h // (heads_q // heads_kv)); the backward sums dK, dV per group.
    if k_dims[1] == 0 or q_dims[1] % k_dims[1] != 0:
        raise ValueError(
            f"k has shape {tuple(k.shape)} and q {tuple(q.shape)}: k's heads ({k_dims[1]}) must "
            f"divide q's ({q_dims[1]}) (layout {layout})"
        )
    for axis, axis_name in [(1, "heads"), (2, "seqlen")]:
        if v_dims[axis] != k_dims[axis]:
            raise ValueError(
                f"v has shape {tuple(v.shape)} and k {tuple(k.shape)}: their {axis_name} must be "
                f"equal (layout {layout})"
            )
    return DTYPES[str(q.dtype)]


def check_offsets(name, offsets, q):
    """flash-attn's cumulative offsets ``cu_seqlens_q`` or ``cu_seqlens_k``: a 1-D int32 (or int64)
    tensor on q's device or on the CPU, of batch + 1 >= 2 entries. Their values (from 0, never
    decreasing, the last one the rows of q or k) are the native half's to check when they are
    on the CPU; on the GPU nobody reads them but the kernels."""
    if not all(hasattr(offsets, a) for a in ("device", "dtype", "shape", "tolist")):
        raise TypeError(f"{name} must be a torch.Tensor of int32 offsets, got "
                        f"{type(offsets).__name__}")
    if str(offsets.dtype) not in OFFSET_DTYPES:
        raise TypeError(f"{name} has dtype {offsets.dtype}; allowed: torch.int32 (flash-attn's) "
                        "or torch.int64")
    if len(offsets.shape) != 1:
        raise ValueError(f"{name} has shape {tuple(offsets.shape)}; expected 1 dim (batch + 1,)")
    if offsets.device != q.device and offsets.device.type != "cpu":
        raise ValueError(f"{name} is on {offsets.device} but q is on {q.device}; the offsets must "
                         "be on q's device or on the CPU")
    if offsets.shape[0] < 2:
        raise ValueError(f"{name} has {offsets.shape[0]} entries; expected batch + 1 >= 2 offsets: "
                         "0, then where each sequence ends")


def check_offset_pair(cu_seqlens_q, cu_seqlens_k):
    """One sequence of keys per sequence of queries: as many offsets in each (read on the GPU,
    their values are not checked, so their count is checked here)."""
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        raise ValueError(f"cu_seqlens_k has {cu_seqlens_k.shape[0]} entries; expected as many as "
                         f"cu_seqlens_q ({cu_seqlens_q.shape[0]}): one sequence of keys per "
                         "sequence of queries")


def check_alibi_slopes(alibi_slopes, q, layout, batch):
    """flash-attn's ``alibi_slopes``: None, or a float32 tensor on q's device of shape (heads,)
    (one slope per query head) or (batch, heads) (per sequence and head; a packed batch's batch
    is its number of sequences). Returns it contiguous (a copy only if it is not), or None."""
    if alibi_slopes is None:
        return None
    if not all(hasattr(alibi_slopes, a) for a in ("device", "dtype", "shape", "contiguous")):
        raise TypeError(f"alibi_slopes must be a torch.Tensor or None, got "
                        f"{type(alibi_slopes).__name__}")
    if str(alibi_slopes.dtype) != "torch.float32":
        raise TypeError(f"alibi_slopes has dtype {alibi_slopes.dtype}; allowed: torch.float32 "
                        "(flash-attn's)")
    heads = dims_and_strides(q, layout)[0][1]
    if tuple(alibi_slopes.shape) not in ((heads,), (batch, heads)):
        raise ValueError(f"alibi_slopes has shape {tuple(alibi_slopes.shape)}; allowed: "
                         f"(heads,) = ({heads},) or (batch, heads) = ({batch}, {heads})")
    if alibi_slopes.device != q.device:
        raise ValueError(f"alibi_slopes is on {alibi_slopes.device} but q is on {q.device}; the "
                         "slopes must be on q's device")
    return alibi_slopes.contiguous()


def check_cache_inputs(tensors):
    """The tensors of a call against a KV cache (``tensors``: name -> tensor or None for the
    optional ones), each in flash-attn's layout, checked alone and for one dtype and device with
    q's; how their shapes fit together (a paged cache has pages, not sequences, in its first
    dim) is the native half's check, which names them. Returns the dtype's name."""
    q = tensors["q"]
    for name, tensor in tensors.items():
        if tensor is None:
            continue
        _check_one(name, tensor, FLASH_ATTN)
        if str(tensor.dtype) != str(q.dtype):
            raise TypeError(f"{name} has dtype {tensor.dtype} but q has {q.dtype}; they must "
                            "share one")
        if tensor.device != q.device:
            raise ValueError(f"{name} is on {tensor.device} but q is on {q.device}; they must be "
                             "on one device")
    return DTYPES[str(q.dtype)]
