"""What every GPU test module imports first: PyTorch with a CUDA device, or the module is skipped
(with the reason). With FLASH_ATTN_REQUIRE_GPU=1 (the bundle's script sets it) a missing
PyTorch or GPU fails the run instead of skipping it."""

import os

import pytest

REQUIRED = os.environ.get("FLASH_ATTN_REQUIRE_GPU") == "1"


def _unavailable(reason):
    if REQUIRED:
        pytest.fail(f"FLASH_ATTN_REQUIRE_GPU=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


try:
    import torch
except ImportError:
    torch = None
    _unavailable("PyTorch is not installed")

if torch is not None and not torch.cuda.is_available():
    _unavailable("no CUDA device (torch.cuda.is_available() is False)")

DEVICE = "cuda"


def randn(shape, dtype, generator):
    """N(0, 1) draws (in f32, then rounded to `dtype`) on the GPU."""
    return torch.randn(*shape, device=DEVICE, generator=generator).to(dtype)


def generator(seed):
    g = torch.Generator(device=DEVICE)
    g.manual_seed(seed)
    return g
