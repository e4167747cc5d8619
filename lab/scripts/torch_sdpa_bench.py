#!/usr/bin/env python3
"""Times PyTorch's SDPA backends on the benchmark's shapes and writes JSON in the schema of
`flash-attn bench` (lab/src/tools/bench/mod.rs: BenchRecord), so the runner can merge both into one table.

Backends: flash (FlashAttention-2), cudnn, efficient (memory-efficient), math (materialises S and P).
Median of triton.testing.do_bench (which clears L2 between repetitions), fresh torch.randn inputs.

    python3 lab/scripts/torch_sdpa_bench.py --out torch.json [--quick] [--dtype bf16]
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import triton.testing

BACKENDS = {
    "torch-flash": SDPBackend.FLASH_ATTENTION,
    "torch-cudnn": SDPBackend.CUDNN_ATTENTION,
    "torch-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "torch-math": SDPBackend.MATH,
}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
# The math backend materialises S and P in HBM; past this length it takes minutes for no insight.
MATH_MAX_SEQLEN = 4096


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="N = 1024 and 4096 only")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--seqlens", default=None, help="comma-separated (default 512..16384)")
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--causal", default="both", choices=["off", "on", "both"])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated subset of " + ", ".join(BACKENDS))
    args = parser.parse_args()

    seqlens = [1024, 4096] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]
    if args.seqlens:
        seqlens = [int(n) for n in args.seqlens.split(",")]
    head_dims = [int(d) for d in args.head_dims.split(",")]
    causals = {"off": [False], "on": [True], "both": [False, True]}[args.causal]
    dtype = DTYPES[args.dtype]
    size = torch.tensor([], dtype=dtype).element_size()

    backends = {}
    for name in args.backends.split(","):
        if name not in BACKENDS:
            parser.error(f"--backends: unknown backend {name!r}; allowed: {', '.join(BACKENDS)}")
        backends[name] = BACKENDS[name]

    records = []
    for d in head_dims:
        for causal in causals:
            for n in seqlens:
                b, h = max(args.tokens // n, 1), max(args.hidden // d, 1)
                shape = {"batch": b, "heads": h, "seqlen": n, "head_dim": d, "causal": causal}
                flops = 4.0 * b * h * n * n * d / (2.0 if causal else 1.0)
                min_bytes = 4.0 * b * h * n * d * size
                q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=dtype) for _ in range(3))
                for name, backend in backends.items():
                    record = {"implementation": name, "dtype": args.dtype, "shape": shape, "median_ms": None,
                              "tflops": None, "bandwidth_gbs": None, "peak_memory_bytes": None, "error": None}
                    if backend == SDPBackend.MATH and n > MATH_MAX_SEQLEN:
                        record["error"] = f"skipped: math backend above N = {MATH_MAX_SEQLEN}"
                        records.append(record)
                        continue
                    try:
                        with sdpa_kernel(backend):
                            call = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                            torch.cuda.synchronize()
                            torch.cuda.reset_peak_memory_stats()
                            call()
                            torch.cuda.synchronize()
                            record["peak_memory_bytes"] = torch.cuda.max_memory_allocated()
                            ms = triton.testing.do_bench(call, warmup=25, rep=100, return_mode="median")
                        record.update(median_ms=ms, tflops=flops / (ms * 1e-3) / 1e12,
                                      bandwidth_gbs=min_bytes / (ms * 1e-3) / 1e9)
                    except (RuntimeError, torch.OutOfMemoryError) as e:
                        record["error"] = str(e).splitlines()[0][:200]
                        torch.cuda.empty_cache()
                    records.append(record)
                    print(f"{name:16} d={d:<3} causal={causal!s:5} N={n:<5} "
                          + (f"{record['tflops']:.1f} TFLOP/s" if record["tflops"] else record["error"]),
                          file=sys.stderr, flush=True)
                del q, k, v
                torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "records": records}, f, indent=1)


if __name__ == "__main__":
    main()
