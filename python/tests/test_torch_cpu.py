"""The public functions on real PyTorch tensors, without a GPU: every check raises before
anything is allocated on a device. Skipped where PyTorch is not installed."""

import pytest

torch = pytest.importorskip("torch")

from flash_attn_rs import (  # noqa: E402
    flash_attn_func, flash_attn_varlen_func, scaled_dot_product_attention,
)


def test_cpu_tensors_are_rejected_naming_the_argument():
    q = torch.randn(1, 16, 2, 64, dtype=torch.float16)
    with pytest.raises(ValueError, match="^q is on cpu"):
        flash_attn_func(q, q, q)
    with pytest.raises(ValueError, match="^q is on cpu"):
        scaled_dot_product_attention(q, q, q)
    packed, offsets = q[0], torch.tensor([0, 16], dtype=torch.int32)
    with pytest.raises(ValueError, match="^q is on cpu"):
        flash_attn_varlen_func(packed, packed, packed, offsets, offsets, 16, 16)


def test_meta_tensors_are_not_cuda():
    q = torch.empty(1, 16, 2, 64, dtype=torch.float16, device="meta")
    with pytest.raises(ValueError, match="^q is on meta"):
        flash_attn_func(q, q, q)


def test_non_tensor_is_a_type_error():
    # q is checked first, whole: a CPU q would be reported before a bad k.
    k = torch.randn(1, 16, 2, 64)
    with pytest.raises(TypeError, match="^q must be a torch.Tensor, got str"):
        flash_attn_func("q", k, k)
