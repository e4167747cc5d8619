"""Tests that need neither a GPU nor PyTorch: the import, the native checks called with plain
integers, and the tensor checks on stand-in tensors (duck-typed like torch.Tensor)."""

import pytest

import flash_attn_rs
from flash_attn_rs import _native
from flash_attn_rs._checks import (
    FLASH_ATTN, PACKED, SDPA, check_inputs, check_offsets, dims_and_strides,
)

BASE = 0x7F00_0000_0000


def test_import_without_a_gpu_or_torch():
    assert callable(flash_attn_rs.flash_attn_func)
    assert callable(flash_attn_rs.scaled_dot_product_attention)
    assert "auto" in flash_attn_rs.ALGORITHMS and "fa3" in flash_attn_rs.ALGORITHMS
    assert _native.DEFAULT_ALGORITHM == "auto"
    assert flash_attn_rs.last_plan() is None


def test_native_has_one_forward_and_one_backward():
    launches = {name for name in dir(_native)
                if not name.startswith("_") and callable(getattr(_native, name))}
    assert launches == {"forward", "backward", "workspace_peak_bytes", "reset_workspace_peak"}


# -- the native half, with plain integers ---------------------------------------------------


def sdpa(i, dims=(1, 2, 16, 64)):
    b, h, s, d = dims
    return (BASE + (i << 30), list(dims), [h * s * d, s * d, d, 1])


def native_check(dtype="bf16", dims=(1, 2, 16, 64), stats=None, **kwargs):
    stats = [BASE + (4 << 30)] if stats is None else stats
    t = [sdpa(i, dims) for i in range(4)]
    return _native.forward(dtype=dtype, q=t[0], k=t[1], v=t[2], o=t[3], stats=stats, **kwargs)


def test_native_accepts_a_valid_call():
    assert native_check() is None  # checked, nothing launched
    native_check(dtype="f32", algorithm="fa1", stats=[BASE, BASE + 4096], causal=True)


@pytest.mark.parametrize("algorithm", flash_attn_rs.ALGORITHMS)
def test_native_takes_every_algorithm(algorithm):
    stats = [BASE, BASE + 4096] if algorithm == "fa1" else None
    native_check(dtype="f16", algorithm=algorithm, stats=stats)


def test_native_dtype_is_a_type_error():
    with pytest.raises(TypeError, match="dtype"):
        native_check(dtype="f64")


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(dims=(1, 2, 16, 300)), "head_dim"),
        (dict(softmax_scale=float("nan")), "softmax_scale"),
        (dict(softmax_scale=-1.0), "softmax_scale"),
        (dict(algorithm="fa4"), "algorithm"),
        (dict(algorithm="fa1"), "stats"),
        (dict(stats=[0]), "lse"),
    ],
)
def test_native_value_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        native_check(**kwargs)


def test_native_names_the_tensor():
    q, k, v, o = (sdpa(i) for i in range(4))
    k_strided = (k[0], k[1], [*k[2][:3], 2])
    with pytest.raises(ValueError, match="`k`.*stride 1"):
        _native.forward(dtype="f16", q=q, k=k_strided, v=v, o=o, stats=[BASE])
    with pytest.raises(ValueError, match="`o`"):
        _native.forward(dtype="f16", q=q, k=k, v=v, o=(o[0], [1, 2, 8, 64], o[2]), stats=[BASE])


def test_native_forward_checks_before_it_opens_a_device():
    # A bad argument raises ValueError even on a machine without a GPU: checked first.
    t = [sdpa(i, (1, 1, 8, 300)) for i in range(4)]
    with pytest.raises(ValueError, match="head_dim"):
        _native.forward(dtype="f16", device=0, stream=0, q=t[0], k=t[1], v=t[2], o=t[3],
                        stats=[BASE])


# -- the Python half, on stand-in tensors ---------------------------------------------------


class Device:
    def __init__(self, kind="cuda", index=0):
        self.type, self.index = kind, index

    def __eq__(self, other):
        return (self.type, self.index) == (other.type, other.index)

    def __str__(self):
        return self.type if self.type == "cpu" else f"{self.type}:{self.index}"


class FakeTensor:
    """What the checks read of a torch.Tensor."""

    def __init__(self, shape, strides=None, dtype="torch.bfloat16", device=None):
        self.shape = tuple(shape)
        if strides is None:
            strides, step = [], 1
            for n in reversed(shape):
                strides.insert(0, step)
                step *= n
        self._strides = tuple(strides)
        self.dtype = dtype
        self.device = device or Device()

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]

    def data_ptr(self):
        return BASE


def qkv(shape=(2, 128, 8, 64), **k_overrides):
    return FakeTensor(shape), FakeTensor(shape, **k_overrides), FakeTensor(shape)


def test_checks_accept_and_permute_flash_attn_layout():
    q, k, v = qkv()
    assert check_inputs(q, k, v, FLASH_ATTN) == "bf16"
    dims, strides = dims_and_strides(q, FLASH_ATTN)
    assert dims == [2, 8, 128, 64]
    assert strides == [128 * 8 * 64, 64, 8 * 64, 1]
    assert dims_and_strides(q, SDPA)[0] == [2, 128, 8, 64]


def test_checks_accept_any_strides_with_a_contiguous_last_dim():
    # A slice of a packed (batch, seqlen, 3, heads, head_dim) QKV tensor.
    b, s, h, d = 2, 128, 8, 64
    packed = [s * 3 * h * d, 3 * h * d, d, 1]
    q, k, v = (FakeTensor((b, s, h, d), packed) for _ in range(3))
    assert check_inputs(q, k, v, FLASH_ATTN) == "bf16"


def test_cpu_tensor_is_a_value_error_naming_it():
    q, k, v = qkv(device=Device("cpu"))
    with pytest.raises(ValueError, match="^k is on cpu"):
        check_inputs(q, k, v, FLASH_ATTN)


def test_unsupported_dtype_is_a_type_error():
    q, k, v = qkv(dtype="torch.float64")
    with pytest.raises(TypeError, match="^k has dtype torch.float64; allowed"):
        check_inputs(q, k, v, FLASH_ATTN)


def test_mixed_dtypes_are_a_type_error():
    q, k, v = qkv(dtype="torch.float16")
    with pytest.raises(TypeError, match="^k has dtype torch.float16 but q has"):
        check_inputs(q, k, v, SDPA)


def test_not_a_tensor_is_a_type_error():
    q, _, v = qkv()
    with pytest.raises(TypeError, match="^k must be a torch.Tensor, got list"):
        check_inputs(q, [1, 2], v, SDPA)


def test_different_devices_are_a_value_error():
    q, k, v = qkv(device=Device("cuda", 1))
    with pytest.raises(ValueError, match="^k is on cuda:1 but q is on cuda:0"):
        check_inputs(q, k, v, FLASH_ATTN)


def test_non_contiguous_last_dim_is_a_value_error():
    q, k, v = qkv(strides=(128 * 8 * 128, 8 * 128, 128, 2))
    with pytest.raises(ValueError, match="^k has strides .*last dim"):
        check_inputs(q, k, v, FLASH_ATTN)


def test_not_4d_is_a_value_error():
    q = FakeTensor((2, 128, 64))
    _, k, v = qkv()
    with pytest.raises(ValueError, match=r"^q has shape \(2, 128, 64\); expected 4 dims"):
        check_inputs(q, k, v, FLASH_ATTN)


@pytest.mark.parametrize(
    "layout, k_shape, v_shape, message",
    [
        (FLASH_ATTN, (2, 128, 3, 64), (2, 128, 3, 64), r"^k .* heads \(3\) must divide q's \(8\)"),
        (FLASH_ATTN, (2, 128, 16, 64), (2, 128, 16, 64), "^k .* must divide q's"),
        (FLASH_ATTN, (2, 128, 4, 64), (2, 128, 8, 64), "^v .* heads must be equal"),
        (FLASH_ATTN, (1, 128, 8, 64), (2, 128, 8, 64), "^k .* batch must be equal"),
        (FLASH_ATTN, (2, 128, 8, 64), (2, 128, 8, 32), "^v .* head_dim must be equal"),
        (FLASH_ATTN, (2, 100, 8, 64), (2, 99, 8, 64), "^v .* seqlen must be equal"),
        (SDPA, (2, 5, 128, 64), (2, 5, 128, 64), "^k .* must divide q's"),
    ],
)
def test_shapes_that_disagree_are_value_errors(layout, k_shape, v_shape, message):
    q = FakeTensor((2, 128, 8, 64) if layout == FLASH_ATTN else (2, 8, 128, 64))
    with pytest.raises(ValueError, match=message):
        check_inputs(q, FakeTensor(k_shape), FakeTensor(v_shape), layout)


@pytest.mark.parametrize("heads_kv", [4, 2, 1])
def test_k_and_v_may_have_fewer_heads_a_divisor_of_qs(heads_kv):
    q = FakeTensor((2, 128, 8, 64))
    k = v = FakeTensor((2, 100, heads_kv, 64))
    assert check_inputs(q, k, v, FLASH_ATTN) == "bf16"


def test_seqlen_k_may_differ_from_seqlen_q():
    q = FakeTensor((2, 128, 8, 64))
    k = v = FakeTensor((2, 300, 8, 64))
    assert check_inputs(q, k, v, FLASH_ATTN) == "bf16"


def native_backward(dims_q=(1, 2, 16, 64), dims_kv=(1, 2, 24, 64), lse=None, **edits):
    """The backward's native checks (no device): q, k, v, o, d_o, dq, dk, dv and L."""
    names = ["q", "k", "v", "o", "d_o", "dq", "dk", "dv"]
    dims = [dims_q, dims_kv, dims_kv, dims_q, dims_q, dims_q, dims_kv, dims_kv]
    tensors = {n: sdpa(i, d) for i, (n, d) in enumerate(zip(names, dims))}
    tensors.update(edits)
    b, h, s, _ = dims_q
    lse = lse or (BASE + (9 << 30), [b, h, s], [h * s, s, 1])
    return _native.backward(dtype="bf16", lse=lse, causal=True, **tensors)


def test_native_backward_checks_without_a_device():
    assert native_backward() is None  # checked, nothing launched
    with pytest.raises(ValueError, match="`dk`"):
        native_backward(dk=sdpa(6, (1, 2, 16, 64)))
    with pytest.raises(ValueError, match="`d_o`.*stride 1"):
        d_o = sdpa(4)
        native_backward(d_o=(d_o[0], d_o[1], [*d_o[2][:3], 2]))
    with pytest.raises(ValueError, match="`logsumexp`"):
        native_backward(lse=(BASE, [1, 2, 24], [48, 24, 1]))


def test_native_backward_takes_its_algorithm_and_determinism():
    for algorithm in (None, "auto", "fa3", "fa2-tc", "fa2", "standard"):
        assert native_backward(algorithm=algorithm) is None
    assert native_backward(algorithm="fa2-tc", deterministic=True) is None
    with pytest.raises(ValueError, match="`backward_algorithm`"):
        native_backward(algorithm="fa1")  # no backward
    with pytest.raises(ValueError, match="`algorithm`"):
        native_backward(algorithm="fa4")


def test_native_backward_takes_grouped_kv_heads():
    """One K/V head for both query heads (MQA): dK and dV have K's one head."""
    assert native_backward(dims_kv=(1, 1, 24, 64)) is None
    with pytest.raises(ValueError, match="`dk`"):
        native_backward(dims_kv=(1, 1, 24, 64), dk=sdpa(6, (1, 2, 24, 64)))


# -- packed batches (flash_attn_varlen_func): the native checks, then the Python half's -----


def packed(i, total, heads, d=64):
    """(total, heads, d) storage as the native half takes it: (1, heads, total, d)."""
    return (BASE + (i << 30), [1, heads, total, d], [total * heads * d, d, heads * d, 1])


OMIT = object()  # a packed keyword left out


def native_packed(cu_seqlens_q=(0, 5, 5, 16), cu_seqlens_k=(0, 7, 10, 19), max_seqlen_q=11,
                  max_seqlen_k=9, heads_kv=2, dtype="bf16", stats=None, **kwargs):
    """The native forward of a packed batch: three sequences (5, 0 and 11 queries on 7, 3 and 9
    keys), 4 query heads on `heads_kv`. OMIT leaves a packed keyword out."""
    total_q, total_k = 16, 19
    form = dict(cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                max_seqlen_k=max_seqlen_k)
    form = {name: list(value) if isinstance(value, tuple) else value
            for name, value in form.items() if value is not OMIT}
    return _native.forward(
        dtype=dtype, q=packed(0, total_q, 4), k=packed(1, total_k, heads_kv),
        v=packed(2, total_k, heads_kv), o=packed(3, total_q, 4),
        stats=[BASE + (4 << 30)] if stats is None else stats, **form, **kwargs,
    )


def test_native_packed_accepts_a_valid_call():
    assert native_packed() is None  # checked, nothing launched
    assert native_packed(algorithm="fa2-tc", causal=True, window=(8, 0), softcap=30.0) is None
    # max_seqlen is an upper bound, as in flash-attn: a larger one is fine.
    assert native_packed(max_seqlen_q=4096, max_seqlen_k=4096, heads_kv=1) is None
    assert flash_attn_rs.PACKED_ALGORITHMS == ("auto", "fa3", "fa2-tc")
    for algorithm in flash_attn_rs.PACKED_ALGORITHMS:
        assert native_packed(algorithm=algorithm) is None


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(cu_seqlens_q=(1, 5, 5, 16)), "cu_seqlens_q"),  # not from 0
        (dict(cu_seqlens_q=(0, 6, 5, 16)), "cu_seqlens_q"),  # decreasing
        (dict(cu_seqlens_q=(0, 5, 5, 15)), "cu_seqlens_q"),  # last != q's rows
        (dict(cu_seqlens_q=(0, -1, 5, 16)), "cu_seqlens_q"),  # negative
        (dict(cu_seqlens_q=(0,)), "cu_seqlens_q"),  # no sequence
        (dict(cu_seqlens_k=(0, 7, 10, 20)), "cu_seqlens_k"),  # last != k's rows
        (dict(cu_seqlens_k=(0, 19)), "cu_seqlens_k"),  # not one per query sequence
        (dict(cu_seqlens_q=OMIT), "cu_seqlens_q"),  # the four keywords come together
        (dict(cu_seqlens_k=OMIT), "cu_seqlens_k"),
        (dict(max_seqlen_q=OMIT), "max_seqlen_q"),
        (dict(max_seqlen_k=OMIT), "max_seqlen_k"),
        (dict(max_seqlen_q=10), "max_seqlen_q"),  # below the longest (11)
        (dict(max_seqlen_k=8), "max_seqlen_k"),
        (dict(heads_kv=3), "k"),  # does not divide 4
        (dict(algorithm="fa2"), "algorithm"),  # no packed kernels
        (dict(algorithm="standard"), "algorithm"),
        (dict(algorithm="fa1", stats=[BASE, BASE + 4096]), "algorithm"),
        (dict(stats=[0]), "lse"),
        (dict(window=(-2, 0)), "window"),
        (dict(softcap=-1.0), "softcap"),
        (dict(softmax_scale=float("nan")), "softmax_scale"),
    ],
)
def test_native_packed_value_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`"):
        native_packed(**kwargs)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_native_packed_needs_half_precision(dtype):
    with pytest.raises(TypeError, match="`dtype`"):
        native_packed(dtype=dtype)


def test_native_packed_checks_before_it_opens_a_device():
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        native_packed(cu_seqlens_q=(0, 6, 5, 16), device=0, stream=0)


class FakeOffsets:
    """What the checks read of an offsets tensor."""

    def __init__(self, values, dtype="torch.int32", device=None, shape=None):
        self.values, self.dtype, self.device = list(values), dtype, device or Device()
        self.shape = (len(self.values),) if shape is None else shape

    def tolist(self):
        return self.values


def test_packed_layout_is_batch_one_of_flash_attns():
    q = FakeTensor((100, 8, 64))
    dims, strides = dims_and_strides(q, PACKED)
    assert dims == [1, 8, 100, 64]
    assert strides == [100 * 8 * 64, 64, 8 * 64, 1]
    # Grouped K/V heads, other rows: only heads and head_dim are compared with q's.
    k = v = FakeTensor((37, 2, 64))
    assert check_inputs(q, k, v, PACKED) == "bf16"


@pytest.mark.parametrize(
    "q_shape, k_shape, v_shape, message",
    [
        ((100, 8, 64), (37, 3, 64), (37, 3, 64), r"^k .* heads \(3\) must divide q's \(8\)"),
        ((100, 8, 64), (37, 2, 32), (37, 2, 32), "^k .* head_dim must be equal"),
        ((100, 8, 64), (37, 2, 64), (36, 2, 64), "^v .* seqlen must be equal"),
        ((1, 100, 8, 64), (37, 2, 64), (37, 2, 64), r"^q has shape .*; expected 3 dims"),
    ],
)
def test_packed_shapes_that_disagree_are_value_errors(q_shape, k_shape, v_shape, message):
    with pytest.raises(ValueError, match=message):
        check_inputs(FakeTensor(q_shape), FakeTensor(k_shape), FakeTensor(v_shape), PACKED)


def test_offsets_may_be_int32_or_int64_on_qs_device_or_the_cpu():
    q = FakeTensor((16, 4, 64))
    for dtype in ("torch.int32", "torch.int64"):
        check_offsets("cu_seqlens_q", FakeOffsets([0, 16], dtype), q)
    check_offsets("cu_seqlens_q", FakeOffsets([0, 16], device=Device("cpu")), q)


@pytest.mark.parametrize(
    "offsets, error, message",
    [
        ([0, 16], TypeError, "^cu_seqlens_k must be a torch.Tensor of int32 offsets, got list"),
        (FakeOffsets([0, 16], "torch.float32"), TypeError,
         "^cu_seqlens_k has dtype torch.float32; allowed: torch.int32"),
        (FakeOffsets([0, 16], "torch.int16"), TypeError, "^cu_seqlens_k has dtype torch.int16"),
        (FakeOffsets([0, 16], shape=(1, 2)), ValueError,
         r"^cu_seqlens_k has shape \(1, 2\); expected 1 dim"),
        (FakeOffsets([0, 16], device=Device("cuda", 1)), ValueError,
         "^cu_seqlens_k is on cuda:1 but q is on cuda:0"),
    ],
)
def test_bad_offsets_tensors_are_named(offsets, error, message):
    with pytest.raises(error, match=message):
        check_offsets("cu_seqlens_k", offsets, FakeTensor((16, 4, 64)))


# -- flash-attn's signatures ------------------------------------------------------------------

#: flash-attn 2's public functions and their parameters, in order (flash_attn_interface.py):
#: code written for flash-attn passes some positionally (dropout_p third, as its own tests do).
FLASH_ATTN_SIGNATURES = {
    "flash_attn_func": ["q", "k", "v", "dropout_p", "softmax_scale", "causal", "window_size",
                        "softcap", "alibi_slopes", "deterministic", "return_attn_probs"],
    "flash_attn_qkvpacked_func": ["qkv", "dropout_p", "softmax_scale", "causal", "window_size",
                                  "softcap", "alibi_slopes", "deterministic",
                                  "return_attn_probs"],
    "flash_attn_kvpacked_func": ["q", "kv", "dropout_p", "softmax_scale", "causal",
                                 "window_size", "softcap", "alibi_slopes", "deterministic",
                                 "return_attn_probs"],
    "flash_attn_varlen_func": ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                               "max_seqlen_k", "dropout_p", "softmax_scale", "causal",
                               "window_size", "softcap", "alibi_slopes", "deterministic",
                               "return_attn_probs", "block_table"],
    "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen", "dropout_p",
                                         "softmax_scale", "causal", "window_size", "softcap",
                                         "alibi_slopes", "deterministic", "return_attn_probs"],
    "flash_attn_with_kvcache": ["q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin",
                                "cache_seqlens", "cache_batch_idx", "cache_leftpad",
                                "block_table", "softmax_scale", "causal", "window_size",
                                "softcap", "rotary_interleaved", "alibi_slopes", "num_splits",
                                "return_softmax_lse"],
    "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_q", "cu_seqlens_k",
                                        "max_seqlen_q", "max_seqlen_k", "dropout_p",
                                        "softmax_scale", "causal", "window_size", "softcap",
                                        "alibi_slopes", "deterministic", "return_attn_probs"],
}


@pytest.mark.parametrize("name", sorted(FLASH_ATTN_SIGNATURES))
def test_signatures_are_flash_attns_in_its_order(name):
    import inspect

    parameters = inspect.signature(getattr(flash_attn_rs, name)).parameters.values()
    positional = [p.name for p in parameters if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == FLASH_ATTN_SIGNATURES[name]
    # Ours come after, keyword-only, so no flash-attn call can reach them by position.
    ours = set() if name == "flash_attn_with_kvcache" else {"algorithm", "return_lse"}
    assert {p.name for p in parameters if p.kind == p.KEYWORD_ONLY} == ours
    assert name in flash_attn_rs.__all__


@pytest.mark.parametrize("kwargs, error, name", [
    ({"dropout_p": 1.0}, ValueError, "dropout_p"),
    ({"dropout_p": -0.5}, ValueError, "dropout_p"),
    ({"dropout_p": "0"}, TypeError, "dropout_p"),
    ({"deterministic": 1}, TypeError, "deterministic"),
    ({"return_attn_probs": None}, TypeError, "return_attn_probs"),
])
def test_bad_flash_attn_arguments_are_refused_by_name_before_the_tensors(kwargs, error, name):
    """Checked before anything touches the tensors (here not even tensors)."""
    with pytest.raises(error, match=name):
        flash_attn_rs.flash_attn_func(None, None, None, **kwargs)


def test_varlen_refuses_a_block_table_by_name():
    with pytest.raises(ValueError, match="block_table"):
        flash_attn_rs.flash_attn_varlen_func(None, None, None, None, None, 1, 1,
                                             block_table=object())


@pytest.mark.parametrize("func, args, message", [
    ("flash_attn_qkvpacked_func", ("qkv",), "qkv must be a torch.Tensor"),
    ("flash_attn_kvpacked_func", (None, "kv"), "kv must be a torch.Tensor"),
])
def test_packed_forms_name_a_non_tensor(func, args, message):
    with pytest.raises(TypeError, match=message):
        getattr(flash_attn_rs, func)(*args)


# -- the native half's KV-cache form -----------------------------------------------------------


def native_decode(dtype="bf16", paged=False, **kwargs):
    """A call against a KV cache with plain integers: q (2, 8, 3, 64) in SDPA order, caches
    (2, 2, 40, 64) of lengths 10 and 0, or 6 pages of 16 keys and a table."""
    cache = (6, 2, 16, 64) if paged else (2, 2, 40, 64)
    arguments = dict(dtype=dtype, q=sdpa(0, (2, 8, 3, 64)), k=sdpa(1, cache), v=sdpa(2, cache),
                     o=sdpa(3, (2, 8, 3, 64)), stats=[BASE + (4 << 30)], causal=True,
                     cache_seqlens=[10, 0])
    if paged:
        arguments["block_table"] = [[0, 1, 2], [3, 4, 5]]
    arguments.update(kwargs)
    return _native.forward(**arguments)


def test_native_decode_accepts_a_valid_call():
    assert native_decode() is None
    assert native_decode(paged=True, cache_seqlens=[20, 48], num_splits=2) is None
    assert native_decode(k_new=sdpa(5, (2, 2, 3, 64)), v_new=sdpa(6, (2, 2, 3, 64))) is None


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(cache_seqlens=[10, -1]), ValueError, "cache_seqlens"),
    (dict(cache_seqlens=[41, 0]), ValueError, "cache_seqlens"),
    (dict(dtype="f32"), TypeError, "dtype"),
    (dict(max_seqlen_q=3), ValueError, "max_seqlen_q"),
    (dict(k_new=sdpa(5, (2, 2, 3, 64))), ValueError, "v_new"),
    (dict(paged=True, block_table=[[0, 1, 2], [3, 4]]), ValueError, "block_table"),
    (dict(paged=True, block_table=[[0, 1, 2], [3, 4, 6]], cache_seqlens=[48, 48]), ValueError,
     "block_table"),
])
def test_native_decode_errors_name_the_argument(kwargs, error, name):
    with pytest.raises(error, match=f"`{name}`"):
        native_decode(**kwargs)


def test_native_decode_checks_before_it_opens_a_device():
    with pytest.raises(ValueError, match="cache_seqlens"):
        native_decode(cache_seqlens=[99, 0], device=0, stream=0)


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(rotary_cos=object()), ValueError, "rotary_cos"),
    (dict(cache_batch_idx=object()), ValueError, "cache_batch_idx"),
    (dict(cache_leftpad=object()), ValueError, "cache_leftpad"),
    (dict(alibi_slopes=object()), ValueError, "alibi_slopes"),
    (dict(window_size=(4, 0)), ValueError, "window_size"),
    (dict(softcap=5.0), ValueError, "softcap"),
    (dict(num_splits=-1), ValueError, "num_splits"),
    (dict(k=object()), ValueError, "k and v go together"),
])
def test_kvcache_refusals_are_named_before_the_tensors(kwargs, error, name):
    with pytest.raises(error, match=name):
        flash_attn_rs.flash_attn_with_kvcache(None, None, None, **kwargs)
